/* The on-disk kernel cache: directory resolution, entry files, lookup and atomic store
 * (docs/cache.md). */
#include "cache/cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define KC_HEADER_SIZE 64
#define KC_FORMAT_VERSION 1u
#define KC_KIND_CUBIN 1u
#define KC_TMP_PREFIX ".tmp."
#define KC_STALE_TMP_SECONDS 3600 /* temp files older than this were left by a dead writer */

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

static void make_header(uint8_t h[KC_HEADER_SIZE], kc_key key, const void *data, size_t size) {
    memset(h, 0, KC_HEADER_SIZE);
    memcpy(h, kc_magic, 8);
    wr32(h + 8, KC_FORMAT_VERSION);
    wr32(h + 12, KC_KIND_CUBIN);
    memcpy(h + 16, key.b, 16);
    wr64(h + 32, (uint64_t)size);
    wr64(h + 40, XXH3_64bits(size ? data : "", size));
    wr64(h + 48, XXH3_64bits(h, 48));
    /* h[56..63] reserved, zero */
}

/* NULL when buf holds a valid entry for key (payload length in *plen); else the reason,
 * written into reason. */
static const char *validate(const uint8_t *buf, size_t len, kc_key key, size_t *plen,
                            char *reason, size_t rcap) {
    if (len < KC_HEADER_SIZE) {
        snprintf(reason, rcap, "truncated: %zu bytes, header needs %d", len, KC_HEADER_SIZE);
        return reason;
    }
    if (memcmp(buf, kc_magic, 8) != 0) return "bad magic";
    uint32_t ver = rd32(buf + 8), kind = rd32(buf + 12);
    if (ver != KC_FORMAT_VERSION) {
        snprintf(reason, rcap, "unsupported format version %u", (unsigned)ver);
        return reason;
    }
    if (kind != KC_KIND_CUBIN) {
        snprintf(reason, rcap, "unknown payload kind %u", (unsigned)kind);
        return reason;
    }
    if (memcmp(buf + 16, key.b, 16) != 0) return "key mismatch";
    if (XXH3_64bits(buf, 48) != rd64(buf + 48)) return "header checksum mismatch";
    for (int i = 56; i < KC_HEADER_SIZE; i++)
        if (buf[i]) return "reserved header bytes not zero";
    uint64_t want = rd64(buf + 32);
    if (want != (uint64_t)(len - KC_HEADER_SIZE)) {
        snprintf(reason, rcap, "payload length %llu but %zu bytes follow the header",
                 (unsigned long long)want, len - KC_HEADER_SIZE);
        return reason;
    }
    if (XXH3_64bits(buf + KC_HEADER_SIZE, len - KC_HEADER_SIZE) != rd64(buf + 40))
        return "payload checksum mismatch";
    *plen = len - KC_HEADER_SIZE;
    return NULL;
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

char *kc_entry_path(const kc_cache *c, kc_key key) {
    if (!c || !c->dir) return NULL;
    char hex[33];
    kc_key_hex(key, hex);
    kb_str b = {0};
    kb_str_add(&b, c->dir);
    kb_str_add(&b, "/kernels/");
    kb_str_addn(&b, hex, 2);
    kb_str_add(&b, "/");
    kb_str_add(&b, hex);
    kb_str_add(&b, ".cubin");
    return kb_str_take(&b);
}

/* ---- logging -------------------------------------------------------------------------------- */

static void log_line(const kc_cache *c, const char *line) {
    if (c->log) c->log(c->log_user, line);
    else fprintf(stderr, "%s\n", line);
}

/* ---- lookup --------------------------------------------------------------------------------- */

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

kiln_status kc_get(const kc_cache *c, kc_key key, void **data, size_t *size, int *corrupt) {
    if (data) *data = NULL;
    if (size) *size = 0;
    if (!c || !data || !size) return kb_error(KILN_ERR_INVALID, "kc_get: NULL argument");
    if (c->mode == KILN_CACHE_OFF || c->mode == KILN_CACHE_REFRESH) return NULL;
    if (!c->dir) return kb_error(KILN_ERR_INVALID, "kc_get: no cache directory");
    char *path = kc_entry_path(c, key);
    if (!path) return kb_oom();

    /* O_NONBLOCK: a FIFO planted at the path must not hang us; no effect on regular files. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int err = errno;
        kiln_status st = NULL;
        if (err != ENOENT)
            st = kb_error(KILN_ERR_IO, "kernel cache: %s: cannot open: %s", path, strerror(err));
        free(path);
        return st; /* ENOENT: a plain miss */
    }
    struct stat fst;
    kiln_status st = NULL;
    if (fstat(fd, &fst) != 0)
        st = kb_error(KILN_ERR_IO, "kernel cache: %s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(fst.st_mode))
        st = kb_error(KILN_ERR_CACHE, "kernel cache: %s: not a regular file", path);
    if (st) {
        close(fd);
        free(path);
        return st;
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    int err = read_all(fd, fst.st_size > 0 ? (size_t)fst.st_size : 0, &buf, &len);
    close(fd);
    if (err) {
        st = err == ENOMEM ? kb_oom()
                           : kb_error(KILN_ERR_IO, "kernel cache: %s: read error: %s",
                                      path, strerror(err));
        free(path);
        return st;
    }

    char rbuf[128];
    size_t plen = 0;
    const char *reason = validate(buf, len, key, &plen, rbuf, sizeof rbuf);
    if (reason) {
        free(buf);
        kb_str msg = {0};
        kb_str_addf(&msg, "kiln: cache entry %s is corrupt (%s); ", path, reason);
        if (c->mode == KILN_CACHE_READONLY) kb_str_add(&msg, "not removed (read-only cache), rebuilding");
        else remove_corrupt(path, &fst, &msg);
        char *line = kb_str_take(&msg);
        log_line(c, line ? line : "kiln: a kernel cache entry is corrupt; rebuilding");
        free(line);
        free(path);
        if (corrupt) (*corrupt)++;
        return NULL;
    }
    free(path);
    memmove(buf, buf + KC_HEADER_SIZE, plen); /* buf stays non-NULL even for an empty payload */
    *data = buf;
    *size = plen;
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

static uint64_t tmp_nonce(void) {
    static uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t in[4] = {(uint64_t)getpid(), (uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec, ++counter};
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
        if (now - st.st_mtime > KC_STALE_TMP_SECONDS) unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
}

kiln_status kc_put(const kc_cache *c, kc_key key, const void *data, size_t size) {
    if (!c) return kb_error(KILN_ERR_INVALID, "kc_put: NULL cache");
    if (c->mode == KILN_CACHE_OFF || c->mode == KILN_CACHE_READONLY) return NULL;
    if (!c->dir) return kb_error(KILN_ERR_INVALID, "kc_put: no cache directory");
    if (!data && size) return kb_error(KILN_ERR_INVALID, "kc_put: NULL data");

    char *path = kc_entry_path(c, key);
    if (!path) return kb_oom();
    size_t dlen = (size_t)(strrchr(path, '/') - path);
    kb_str b = {0};
    kb_str_addn(&b, path, dlen);
    char *dir = kb_str_take(&b);
    if (!dir) {
        free(path);
        return kb_oom();
    }
    kiln_status st = kb_mkdirs(dir);
    if (st) {
        st = kb_wrap(st, "kernel cache");
        free(dir);
        free(path);
        return st;
    }

    char *tmp = NULL;
    int fd = -1;
    for (int tries = 0; tries < 64 && fd < 0; tries++) {
        free(tmp);
        kb_str_addf(&b, "%s/" KC_TMP_PREFIX "%ld.%016llx", dir, (long)getpid(),
                    (unsigned long long)tmp_nonce());
        tmp = kb_str_take(&b);
        if (!tmp) {
            free(dir);
            free(path);
            return kb_oom();
        }
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        st = kb_error(KILN_ERR_IO, "kernel cache: %s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        free(dir);
        free(path);
        return st;
    }

    uint8_t hdr[KC_HEADER_SIZE];
    make_header(hdr, key, data, size);
    int err = write_all(fd, hdr, sizeof hdr);
    if (!err && size) err = write_all(fd, data, size);
    if (close(fd) != 0 && !err) err = errno;
    if (err) {
        st = kb_error(KILN_ERR_IO, "kernel cache: %s: write failed: %s", tmp, strerror(err));
    } else if (rename(tmp, path) != 0) {
        st = kb_error(KILN_ERR_IO, "kernel cache: cannot rename %s to %s: %s", tmp, path,
                      strerror(errno));
    }
    if (st) unlink(tmp);
    else sweep_stale_tmp(dir);
    free(tmp);
    free(dir);
    free(path);
    return st;
}
