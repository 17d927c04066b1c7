/* The on-disk cache's entries: directory resolution, the entry format (version 2), lookup and
 * atomic store (docs/cache.md). */
#include "cache/internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* Every format version from 2 on keeps magic, version and header size at these offsets and
 * ends its header with an XXH3-64 of the bytes before it, so that a reader of any version can
 * tell another build's entry (kept) from a damaged one (removed). */
#define KC_MAX_OTHER_HEADER 65536u

static const char kc_magic[8] = {'K', 'I', 'L', 'N', 'C', 'A', 'C', 'H'};

/* ---- little-endian helpers ------------------------------------------------------------------ */

static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void wr64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t rd32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint64_t rd64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* ---- kinds ---------------------------------------------------------------------------------- */

const char *kc_kind_dir(kc_kind kind) {
    return kind == KC_CUBIN ? "kernels" : kind == KC_PROGRAM ? "programs" : NULL;
}

const char *kc_kind_ext(kc_kind kind) {
    return kind == KC_CUBIN ? ".cubin" : kind == KC_PROGRAM ? ".prog" : NULL;
}

static const char *what_of(kc_kind kind) { return kind == KC_PROGRAM ? "program cache" : "kernel cache"; }

/* ---- the entry format ----------------------------------------------------------------------- */

/* Header layout (docs/cache.md, "Entry format"):
 *   0 magic[8]  8 version u32  12 header size u32  16 kind u32  20 reserved u32  24 key[16]
 *  40 meta length u64  48 payload length u64  56 XXH3(meta)  64 XXH3(payload)  72 XXH3(0..71) */
static void make_header(uint8_t h[KC_HEADER_SIZE], kc_kind kind, kc_key key, const char *meta,
                        size_t mlen, const void *data, size_t size) {
    memset(h, 0, KC_HEADER_SIZE);
    memcpy(h, kc_magic, 8);
    wr32(h + 8, KC_FORMAT_VERSION);
    wr32(h + 12, KC_HEADER_SIZE);
    wr32(h + 16, (uint32_t)kind);
    memcpy(h + 24, key.b, 16);
    wr64(h + 40, (uint64_t)mlen);
    wr64(h + 48, (uint64_t)size);
    wr64(h + 56, XXH3_64bits(mlen ? meta : "", mlen));
    wr64(h + 64, XXH3_64bits(size ? data : "", size));
    wr64(h + 72, XXH3_64bits(h, 72));
}

/* Whether a file of format version ver (not ours) has a well-formed header: version 1's layout
 * (checksum of bytes 0..47 at 48), or for 3 and later the rule version 2 set for all its
 * successors. A bit flip in our own version field fails this (the checksum covers it), so it
 * is reported as corruption, not mistaken for another build's entry. */
static bool other_version_header(const uint8_t *buf, size_t len, uint32_t ver) {
    if (ver == 1) return len >= 64 && XXH3_64bits(buf, 48) == rd64(buf + 48);
    if (ver < KC_FORMAT_VERSION || len < 16) return false;
    uint32_t hs = rd32(buf + 12);
    return hs >= 24 && hs % 8 == 0 && hs <= KC_MAX_OTHER_HEADER && hs <= len &&
           XXH3_64bits(buf, hs - 8) == rd64(buf + hs - 8);
}

/* The header's own fields, once it is known to be ours and intact. */
static const char *check_header(const uint8_t *buf, kc_kind kind, kc_key key, char *rbuf, size_t rcap) {
    if (rd32(buf + 12) != KC_HEADER_SIZE) return "bad header size";
    if (XXH3_64bits(buf, 72) != rd64(buf + 72)) return "header checksum mismatch";
    if (rd32(buf + 20) != 0) return "reserved header bytes not zero";
    uint32_t k = rd32(buf + 16);
    if (!kc_kind_dir((kc_kind)k)) {
        snprintf(rbuf, rcap, "unknown payload kind %u", (unsigned)k);
        return rbuf;
    }
    if (k != (uint32_t)kind) {
        snprintf(rbuf, rcap, "kind mismatch: a %s entry where a %s belongs", kc_kind_ext((kc_kind)k) + 1,
                 kc_kind_ext(kind) + 1);
        return rbuf;
    }
    if (memcmp(buf + 24, key.b, 16) != 0) return "key mismatch";
    return NULL;
}

/* Lengths and checksums of the meta and payload behind a valid header. */
static const char *check_body(const uint8_t *buf, size_t len, kc_parsed *p, char *rbuf, size_t rcap) {
    uint64_t mlen = rd64(buf + 40), plen = rd64(buf + 48), have = len - KC_HEADER_SIZE;
    if (mlen > have || plen != have - mlen) {
        snprintf(rbuf, rcap, "payload length %llu and meta length %llu but %llu bytes follow the header",
                 (unsigned long long)plen, (unsigned long long)mlen, (unsigned long long)have);
        return rbuf;
    }
    p->meta = buf + KC_HEADER_SIZE;
    p->meta_len = (size_t)mlen;
    p->payload = p->meta + mlen;
    p->payload_len = (size_t)plen;
    if (XXH3_64bits(p->meta, p->meta_len) != rd64(buf + 56)) return "meta checksum mismatch";
    if (memchr(p->meta, 0, p->meta_len)) return "meta contains a NUL byte";
    if (XXH3_64bits(p->payload, p->payload_len) != rd64(buf + 64)) return "payload checksum mismatch";
    return NULL;
}

kc_verdict kc_check(const uint8_t *buf, size_t len, kc_kind kind, kc_key key, kc_parsed *p,
                    const char **reason, char *rbuf, size_t rcap) {
    memset(p, 0, sizeof *p);
    *reason = NULL;
    if (len < 12) {
        snprintf(rbuf, rcap, "truncated: %zu bytes, header needs %d", len, KC_HEADER_SIZE);
        *reason = rbuf;
        return KC_CORRUPT;
    }
    if (memcmp(buf, kc_magic, 8) != 0) {
        *reason = "bad magic";
        return KC_CORRUPT;
    }
    uint32_t ver = rd32(buf + 8);
    if (ver != KC_FORMAT_VERSION) {
        if (other_version_header(buf, len, ver)) {
            p->version = ver;
            return KC_OTHER_VERSION;
        }
        snprintf(rbuf, rcap, "unsupported format version %u (header inconsistent)", (unsigned)ver);
        *reason = rbuf;
        return KC_CORRUPT;
    }
    p->version = ver;
    if (len < KC_HEADER_SIZE) {
        snprintf(rbuf, rcap, "truncated: %zu bytes, header needs %d", len, KC_HEADER_SIZE);
        *reason = rbuf;
    } else if (!(*reason = check_header(buf, kind, key, rbuf, rcap))) {
        *reason = check_body(buf, len, p, rbuf, rcap);
    }
    return *reason ? KC_CORRUPT : KC_VALID;
}

/* ---- paths ---------------------------------------------------------------------------------- */

static char *join(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    char *s = malloc(na + nb + 1);
    if (!s) return NULL;
    memcpy(s, a, na);
    memcpy(s + na, b, nb + 1);
    return s;
}

kiln_status kc_default_dir(const char *explicit_dir, char **out) {
    *out = NULL;
    const char *e;
    char *s;
    if (explicit_dir && *explicit_dir) s = join(explicit_dir, "");
    else if ((e = getenv("KILN_CACHE_DIR")) && *e) s = join(e, "");
    else if ((e = getenv("XDG_CACHE_HOME")) && e[0] == '/') s = join(e, "/kiln"); /* XDG: absolute only */
    else if ((e = getenv("HOME")) && *e) s = join(e, "/.cache/kiln");
    else
        return kb_error(KILN_ERR_CACHE, "cannot locate the kernel cache directory: set "
                                        "KILN_CACHE_DIR, XDG_CACHE_HOME or HOME");
    if (!s) return kb_oom();
    size_t n = strlen(s);
    while (n > 1 && s[n - 1] == '/') s[--n] = 0; /* "a/b/" -> "a/b", "/" stays */
    *out = s;
    return NULL;
}

char *kc_entry_path(const kc_cache *c, kc_kind kind, kc_key key) {
    if (!c || !c->dir || !kc_kind_dir(kind)) return NULL;
    char hex[33];
    kc_key_hex(key, hex);
    kb_str b = {0};
    kb_str_addf(&b, "%s/%s/%.2s/%s%s", c->dir, kc_kind_dir(kind), hex, hex, kc_kind_ext(kind));
    return kb_str_take(&b);
}

/* ---- logging and the write-failure warning ---------------------------------------------------- */

void kc_log(const kc_cache *c, const char *line) {
    if (c->log) c->log(c->log_user, line);
    else fprintf(stderr, "%s\n", line);
}

/* Whether this process has printed line on stderr before (and records it if not): the table
 * of kc_write_failed's stderr lines, so that a command compiling several programs warns once.
 * When full, lines are printed again rather than forgotten. */
static bool said_before(const char *line) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static uint64_t        said[32];
    static int             nsaid;
    uint64_t               h = XXH3_64bits(line, strlen(line));
    bool                   seen = false;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nsaid && !seen; i++) seen = said[i] == h;
    if (!seen && nsaid < (int)(sizeof said / sizeof *said)) said[nsaid++] = h;
    pthread_mutex_unlock(&lock);
    return seen;
}

void kc_write_failed(kc_cache *c, int err, const char *reason) {
    if (!err) err = EIO;
    int none = 0;
    /* The first failure wins; writers failing at the same moment on other threads lose. */
    if (!atomic_compare_exchange_strong(&c->write_errno, &none, err)) return;
    kb_str m = {0};
    kb_str_addf(&m, "kiln: warning: cannot write the cache %s (%s); continuing without it", c->dir ? c->dir : "?",
                reason ? reason : strerror(err));
    char *line = kb_str_take(&m);
    const char *text = line ? line : "kiln: warning: cannot write the cache; continuing without it";
    if (c->log) c->log(c->log_user, text);
    else if (!said_before(text)) fprintf(stderr, "%s\n", text);
    free(line);
}

/* ---- test hook: failing writes -------------------------------------------------------------- */

static _Atomic int fail_step = -1, fail_err;

void kc_test_fail_writes(kc_write_step step, int err) {
    atomic_store(&fail_step, (int)step);
    atomic_store(&fail_err, err);
}

/* The errno a test wants write step `step` to fail with, else 0. */
static int injected(kc_write_step step) {
    int err = atomic_load(&fail_err);
    return err && atomic_load(&fail_step) == (int)step ? err : 0;
}

/* ---- reading -------------------------------------------------------------------------------- */

/* Reads all of fd into a new buffer (at least 1 byte allocated). Returns 0 or an errno. */
static int read_all(int fd, size_t hint, uint8_t **out, size_t *len) {
    size_t cap = hint + 1, n = 0;
    if (cap < KC_HEADER_SIZE + 1) cap = KC_HEADER_SIZE + 1;
    uint8_t *buf = malloc(cap);
    if (!buf) return ENOMEM;
    for (;;) {
        if (n == cap) {
            size_t ncap = cap * 2;
            uint8_t *nb = ncap > cap ? realloc(buf, ncap) : NULL;
            if (!nb) {
                free(buf);
                return ENOMEM;
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0) {
            if (errno == EINTR) continue;
            int err = errno;
            free(buf);
            return err;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    *out = buf;
    *len = n;
    return 0;
}

kiln_status kc_load(const char *path, const char *what, uint8_t **buf, size_t *len, struct stat *st, int *fdp) {
    *buf = NULL;
    *len = 0;
    if (fdp) *fdp = -1;
    /* O_NONBLOCK: a FIFO planted at the path must not hang us; no effect on regular files. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        /* A plain miss: no such file, or a directory on the way is a file (a cache root that is
         * a file holds no entries; writing it fails, and kc_put says so). */
        if (errno == ENOENT || errno == ENOTDIR) return NULL;
        return kb_error(KILN_ERR_IO, "%s: %s: cannot open: %s", what, path, strerror(errno));
    }
    kiln_status err = NULL;
    if (fstat(fd, st) != 0) err = kb_error(KILN_ERR_IO, "%s: %s: cannot stat: %s", what, path, strerror(errno));
    else if (!S_ISREG(st->st_mode)) err = kb_error(KILN_ERR_CACHE, "%s: %s: not a regular file", what, path);
    int e = err ? 0 : read_all(fd, st->st_size > 0 ? (size_t)st->st_size : 0, buf, len);
    if (e) err = e == ENOMEM ? kb_oom() : kb_error(KILN_ERR_IO, "%s: %s: read error: %s", what, path, strerror(e));
    if (err || !fdp) close(fd);
    else *fdp = fd;
    return err;
}

/* Removes a corrupt entry, unless it has already been replaced by another writer (same path,
 * different file): that one is new and possibly valid. Appends what happened to msg. */
static void remove_corrupt(const char *path, const struct stat *was, kb_str *msg) {
    struct stat now;
    if (stat(path, &now) != 0) {
        kb_str_add(msg, "already removed, rebuilding");
        return;
    }
    if (now.st_dev != was->st_dev || now.st_ino != was->st_ino) {
        kb_str_add(msg, "already replaced, rebuilding");
        return;
    }
    if (unlink(path) == 0 || errno == ENOENT) kb_str_add(msg, "removed, rebuilding");
    else kb_str_addf(msg, "could not remove it (%s), rebuilding", strerror(errno));
}

static void report_corrupt(const kc_cache *c, const char *path, const struct stat *st, const char *reason) {
    kb_str msg = {0};
    kb_str_addf(&msg, "kiln: cache entry %s is corrupt (%s); ", path, reason);
    if (c->mode == KILN_CACHE_READONLY) kb_str_add(&msg, "not removed (read-only cache), rebuilding");
    else remove_corrupt(path, st, &msg);
    char *line = kb_str_take(&msg);
    kc_log(c, line ? line : "kiln: a cache entry is corrupt; rebuilding");
    free(line);
}

kiln_status kc_get(const kc_cache *c, kc_kind kind, kc_key key, void **data, size_t *size, int *corrupt) {
    if (data) *data = NULL;
    if (size) *size = 0;
    if (!c || !data || !size) return kb_error(KILN_ERR_INVALID, "kc_get: NULL argument");
    if (!kc_kind_dir(kind)) return kb_error(KILN_ERR_INVALID, "kc_get: unknown entry kind %d", (int)kind);
    if (c->mode == KILN_CACHE_OFF || c->mode == KILN_CACHE_REFRESH) return NULL;
    if (!c->dir) return kb_error(KILN_ERR_INVALID, "kc_get: no cache directory");
    char *path = kc_entry_path(c, kind, key);
    if (!path) return kb_oom();

    uint8_t *buf = NULL;
    size_t len = 0;
    struct stat fst;
    int fd = -1;
    kiln_status st = kc_load(path, what_of(kind), &buf, &len, &fst, &fd);
    if (st || !buf) {
        free(path);
        return st;
    }
    char rbuf[160];
    const char *reason;
    kc_parsed p;
    kc_verdict v = kc_check(buf, len, kind, key, &p, &reason, rbuf, sizeof rbuf);
    /* LRU: a hit is a use. The fd is the file we read, so a concurrent replacement is not
     * touched by mistake; failures (read-only media, another owner) only cost LRU accuracy. */
    if (v == KC_VALID && c->mode != KILN_CACHE_READONLY) (void)futimens(fd, NULL);
    close(fd);
    if (v == KC_CORRUPT) {
        report_corrupt(c, path, &fst, reason);
        if (corrupt) (*corrupt)++;
    }
    free(path);
    if (v != KC_VALID) { /* another format version: a plain miss, the file stays */
        free(buf);
        return NULL;
    }
    memmove(buf, p.payload, p.payload_len); /* buf stays non-NULL even for an empty payload */
    *data = buf;
    *size = p.payload_len;
    return NULL;
}

/* ---- store ---------------------------------------------------------------------------------- */

static int write_all(int fd, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (w == 0) return EIO;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Unique per put: compile threads write entries at the same time, so the counter is atomic
 * (a plain ++ gave two threads one name in the same nanosecond; ThreadSanitizer found it). */
static uint64_t tmp_nonce(void) {
    static _Atomic uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t in[4] = {(uint64_t)getpid(), (uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec, atomic_fetch_add(&counter, 1) + 1};
    return XXH3_64bits(in, sizeof in);
}

/* Best effort: removes temporary files in dir that a writer which died mid-put left behind. */
static void sweep_stale_tmp(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    time_t now = time(NULL);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, KC_TMP_PREFIX, strlen(KC_TMP_PREFIX)) != 0) continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (now - st.st_mtime > KC_STALE_TMP_S) unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
}

/* mkdir -p dir, or the failure a test injects. Returns 0 or an errno. */
static int make_dirs(const char *dir) {
    int err = injected(KC_STEP_MKDIR);
    return err ? err : kb_mkdirs_errno(dir);
}

/* Creates a new temporary file in dir; *tmp gets its name (caller frees). Returns the fd, or -1
 * with errno set. */
static int create_tmp(const char *dir, char **tmp) {
    int fd = -1;
    *tmp = NULL;
    for (int tries = 0; tries < 64 && fd < 0; tries++) {
        free(*tmp);
        kb_str b = {0};
        kb_str_addf(&b, "%s/" KC_TMP_PREFIX "%ld.%016llx", dir, (long)getpid(), (unsigned long long)tmp_nonce());
        if (!(*tmp = kb_str_take(&b))) {
            errno = ENOMEM;
            return -1;
        }
        fd = open(*tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    return fd;
}

/* Header, meta and payload into fd; returns 0 or an errno. */
static int write_entry(int fd, const uint8_t *hdr, const char *meta, size_t mlen, const void *data, size_t size) {
    int err = write_all(fd, hdr, KC_HEADER_SIZE);
    if (!err) err = injected(KC_STEP_WRITE); /* after the header: a half-written file to clean up */
    if (!err && mlen) err = write_all(fd, meta, mlen);
    if (!err && size) err = write_all(fd, data, size);
    return err;
}

/* One attempt: mkdir -p, write a temporary file, rename it over path. Returns 0 or the errno of
 * the step that failed (ENOMEM: out of memory); the temporary file is gone either way. *gone
 * is set when it failed because a file or directory vanished under it (a concurrent `kiln
 * cache clear`), so that the caller may try again. */
static int put_once(const char *path, const uint8_t *hdr, const char *meta, size_t mlen, const void *data,
                    size_t size, bool *gone) {
    char *dir = strndup(path, (size_t)(strrchr(path, '/') - path)), *tmp = NULL;
    if (!dir) return ENOMEM;
    int err = make_dirs(dir), fd = -1;
    if (!err) err = injected(KC_STEP_CREATE);
    if (!err && (fd = create_tmp(dir, &tmp)) < 0) err = errno;
    if (fd >= 0) {
        err = write_entry(fd, hdr, meta, mlen, data, size);
        int cerr = close(fd) != 0 ? errno : injected(KC_STEP_CLOSE);
        if (!err) err = cerr;
        if (!err) err = injected(KC_STEP_RENAME);
        if (!err && rename(tmp, path) != 0) err = errno;
        if (err) unlink(tmp);
        else sweep_stale_tmp(dir);
    }
    *gone = err == ENOENT; /* only the directories, the temporary file or path can be missing */
    free(tmp);
    free(dir);
    return err;
}

kiln_status kc_put(kc_cache *c, kc_kind kind, kc_key key, const char *meta, const void *data, size_t size) {
    if (!c) return kb_error(KILN_ERR_INVALID, "kc_put: NULL cache");
    if (!kc_kind_dir(kind)) return kb_error(KILN_ERR_INVALID, "kc_put: unknown entry kind %d", (int)kind);
    if (c->mode == KILN_CACHE_OFF || c->mode == KILN_CACHE_READONLY) return NULL;
    if (!c->dir) return kb_error(KILN_ERR_INVALID, "kc_put: no cache directory");
    if (!data && size) return kb_error(KILN_ERR_INVALID, "kc_put: NULL data");
    if (atomic_load(&c->write_errno)) return NULL; /* failed before: don't try every kernel */
    size_t mlen = meta ? strlen(meta) : 0;
    uint8_t hdr[KC_HEADER_SIZE];
    make_header(hdr, kind, key, meta, mlen, data, size);
    char *path = kc_entry_path(c, kind, key);
    if (!path) return kb_oom();
    int err = 0;
    bool gone = true;
    /* A clear running at the same moment may remove our directory or temporary file; the entry
     * is still worth storing, so try again a few times. */
    for (int attempt = 0; attempt < 4 && gone; attempt++) err = put_once(path, hdr, meta, mlen, data, size, &gone);
    free(path);
    if (err == ENOMEM) return kb_oom();
    if (err) kc_write_failed(c, err, NULL);
    return NULL;
}
