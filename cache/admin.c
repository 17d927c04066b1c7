/* Managing the on-disk cache as a whole: walking its entries, LRU eviction, clearing,
 * temporary files, and the settings read from the environment (docs/cache.md). */
#include "cache/internal.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const kc_kind kinds[] = {KC_CUBIN, KC_PROGRAM};
enum { NKINDS = 2 };

static bool is_hex(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

static int hexval(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

/* "<32 hex><ext>" whose first two digits are sub's: an entry's file name; fills *key. */
static bool entry_name(const char *name, const char *sub, kc_kind kind, kc_key *key) {
    const char *ext = kc_kind_ext(kind);
    if (strlen(name) != 32 + strlen(ext) || strcmp(name + 32, ext) != 0 || !is_hex(name, 32) ||
        memcmp(name, sub, 2) != 0)
        return false;
    for (int i = 0; i < 16; i++) key->b[i] = (uint8_t)(hexval(name[2 * i]) << 4 | hexval(name[2 * i + 1]));
    return true;
}

static bool is_tmp(const char *name) { return strncmp(name, KC_TMP_PREFIX, strlen(KC_TMP_PREFIX)) == 0; }

static int64_t mtime_ns(const struct stat *st) {
    return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

/* ---- visiting every file ---------------------------------------------------------------------- */

/* Called for each regular file in DIR/<kind dir>/<xx>/: dir is that directory's path. */
typedef kiln_status (*file_fn)(void *user, kc_kind kind, const char *dir, const char *sub, const char *name,
                               const struct stat *st);

static kiln_status each_in_sub(kc_kind kind, const char *dir, const char *sub, file_fn fn, void *user) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? NULL : kb_error(KILN_ERR_IO, "cache: %s: cannot list: %s", dir, strerror(errno));
    kiln_status st = NULL;
    struct dirent *e;
    while (!st && (e = readdir(d)) != NULL) {
        struct stat fs;
        if (e->d_name[0] == '.' && !is_tmp(e->d_name)) continue;
        if (fstatat(dirfd(d), e->d_name, &fs, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(fs.st_mode)) continue;
        st = fn(user, kind, dir, sub, e->d_name, &fs);
    }
    closedir(d);
    return st;
}

/* Visits every regular file of every entry directory (any name: callers filter). With
 * rmdir_empty, removes each two-digit directory that is empty afterwards. */
static kiln_status each_file(const kc_cache *c, file_fn fn, void *user, bool rmdir_empty) {
    if (!c || !c->dir) return kb_error(KILN_ERR_INVALID, "cache: no cache directory");
    kiln_status st = NULL;
    for (int k = 0; k < NKINDS && !st; k++) {
        kb_str b = {0};
        kb_str_addf(&b, "%s/%s", c->dir, kc_kind_dir(kinds[k]));
        char *top = kb_str_take(&b);
        if (!top) return kb_oom();
        DIR *d = opendir(top);
        if (!d && errno != ENOENT) st = kb_error(KILN_ERR_IO, "cache: %s: cannot list: %s", top, strerror(errno));
        struct dirent *e;
        while (d && !st && (e = readdir(d)) != NULL) {
            if (strlen(e->d_name) != 2 || !is_hex(e->d_name, 2)) continue;
            kb_str_addf(&b, "%s/%s", top, e->d_name);
            char *sub = kb_str_take(&b);
            if (!sub) st = kb_oom();
            if (!st) st = each_in_sub(kinds[k], sub, e->d_name, fn, user);
            if (!st && rmdir_empty) (void)rmdir(sub); /* fails, harmlessly, when not empty */
            free(sub);
        }
        if (d) closedir(d);
        free(top);
    }
    return st;
}

static char *path_in(const char *dir, const char *name) {
    kb_str b = {0};
    kb_str_addf(&b, "%s/%s", dir, name);
    return kb_str_take(&b);
}

/* ---- listing entries ---------------------------------------------------------------------------- */

typedef struct {
    kc_kind  kind;
    kc_key   key;
    char    *path;
    uint64_t bytes;
    int64_t  mtime_ns;
    dev_t    dev;
    ino_t    ino;
} scan_entry;

typedef struct {
    scan_entry *v;
    int         n, cap;
} scan_list;

static kiln_status add_entry(void *user, kc_kind kind, const char *dir, const char *sub, const char *name,
                             const struct stat *st) {
    scan_list *l = user;
    kc_key key;
    if (!entry_name(name, sub, kind, &key)) return NULL;
    if (l->n == l->cap) {
        int ncap = l->cap ? 2 * l->cap : 64;
        scan_entry *nv = realloc(l->v, (size_t)ncap * sizeof *nv);
        if (!nv) return kb_oom();
        l->v = nv;
        l->cap = ncap;
    }
    scan_entry *e = &l->v[l->n];
    *e = (scan_entry){.kind = kind, .key = key, .bytes = (uint64_t)st->st_size, .mtime_ns = mtime_ns(st),
                      .dev = st->st_dev, .ino = st->st_ino};
    if (!(e->path = path_in(dir, name))) return kb_oom();
    l->n++;
    return NULL;
}

static int by_kind_key(const void *a, const void *b) {
    const scan_entry *x = a, *y = b;
    if (x->kind != y->kind) return x->kind < y->kind ? -1 : 1;
    return memcmp(x->key.b, y->key.b, 16);
}

static void scan_free(scan_list *l) {
    for (int i = 0; i < l->n; i++) free(l->v[i].path);
    free(l->v);
    *l = (scan_list){0};
}

/* Every entry file, sorted by kind, then key. */
static kiln_status scan(const kc_cache *c, scan_list *l) {
    *l = (scan_list){0};
    kiln_status st = each_file(c, add_entry, l, false);
    if (st) scan_free(l);
    else if (l->n) qsort(l->v, (size_t)l->n, sizeof *l->v, by_kind_key);
    return st;
}

/* Reads and checks one entry for kc_walk: sets e->version and gives the entry's meta text, or
 * why it is bad, in *text (allocated; NULL for an entry of another format version), *bad
 * telling which. Returns 1 when the file has vanished since it was listed (no longer an
 * entry), -1 when out of memory, else 0. */
static int verify_entry(const scan_entry *s, kc_entry *e, char **text, bool *bad) {
    uint8_t *buf;
    size_t len;
    struct stat fst;
    kiln_status st = kc_load(s->path, "cache", &buf, &len, &fst, NULL);
    kb_str b = {0};
    *text = NULL;
    *bad = true;
    if (st) { /* unreadable (permissions, I/O): as bad as corrupt for verify */
        kb_str_add(&b, kiln_status_msg(st));
        kiln_status_free(st);
    } else if (!buf) {
        return 1;
    } else {
        char rbuf[160];
        const char *reason;
        kc_parsed p;
        kc_verdict v = kc_check(buf, len, s->kind, s->key, &p, &reason, rbuf, sizeof rbuf);
        e->version = p.version;
        *bad = v == KC_CORRUPT;
        if (v == KC_CORRUPT) kb_str_add(&b, reason);
        if (v == KC_VALID) kb_str_addn(&b, (const char *)p.meta, p.meta_len);
        free(buf);
        if (v == KC_OTHER_VERSION) return 0; /* neither meta nor a fault */
    }
    return (*text = kb_str_take(&b)) ? 0 : -1;
}

kiln_status kc_walk(const kc_cache *c, bool with_meta, int (*fn)(void *user, const kc_entry *e), void *user) {
    if (!fn) return kb_error(KILN_ERR_INVALID, "kc_walk: NULL callback");
    scan_list l;
    kiln_status st = scan(c, &l);
    for (int i = 0; !st && i < l.n; i++) {
        const scan_entry *s = &l.v[i];
        kc_entry e = {.kind = s->kind, .key = s->key, .path = s->path, .bytes = s->bytes, .mtime_ns = s->mtime_ns};
        kc_key_hex(s->key, e.key_hex);
        char *text = NULL;
        bool bad = false;
        int r = with_meta ? verify_entry(s, &e, &text, &bad) : 0;
        if (r < 0) st = kb_oom();
        if (bad) e.corrupt = text;
        else e.meta = text;
        int stop = r == 0 && fn(user, &e);
        free(text);
        if (stop) break;
    }
    scan_free(&l);
    return st;
}

/* ---- eviction ------------------------------------------------------------------------------------ */

static int by_age(const void *a, const void *b) {
    const scan_entry *x = a, *y = b;
    if (x->mtime_ns != y->mtime_ns) return x->mtime_ns < y->mtime_ns ? -1 : 1;
    return by_kind_key(a, b);
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Removes s's file if it is still the file that was listed and has not been used since;
 * returns whether the file is gone (removed by us or by someone else). */
static bool remove_if_unchanged(const scan_entry *s, bool *by_us) {
    struct stat now;
    *by_us = false;
    if (lstat(s->path, &now) != 0) return errno == ENOENT;
    if (now.st_dev != s->dev || now.st_ino != s->ino || mtime_ns(&now) != s->mtime_ns) return false;
    if (unlink(s->path) == 0) return (*by_us = true);
    return errno == ENOENT;
}

kiln_status kc_evict(const kc_cache *c, uint64_t max_bytes, int *removed, uint64_t *total_after) {
    if (removed) *removed = 0;
    if (total_after) *total_after = 0;
    kiln_status st = kc_tmp_files(c, KC_STALE_TMP_S, true, NULL, NULL);
    scan_list l;
    if (st || (st = scan(c, &l))) return st;
    uint64_t total = 0;
    for (int i = 0; i < l.n; i++) total += l.v[i].bytes;
    if (max_bytes && total > max_bytes) {
        if (l.n) qsort(l.v, (size_t)l.n, sizeof *l.v, by_age);
        int64_t young = now_ns() - (int64_t)KC_EVICT_GRACE_S * 1000000000;
        bool *done = calloc((size_t)l.n + 1, 1);
        if (!done) st = kb_oom();
        /* Pass 0 spares entries used in the last few seconds: a process that has just stored or
         * hit them is likely to want them again at once. Pass 1 takes them too if it must. */
        for (int pass = 0; !st && pass < 2 && total > max_bytes; pass++)
            for (int i = 0; i < l.n && total > max_bytes; i++) {
                if (done[i] || (pass == 0 && l.v[i].mtime_ns > young)) continue;
                done[i] = true;
                bool by_us;
                if (remove_if_unchanged(&l.v[i], &by_us)) total -= l.v[i].bytes;
                if (by_us && removed) (*removed)++;
            }
        free(done);
    }
    if (total_after) *total_after = total;
    scan_free(&l);
    return st;
}

/* ---- clearing and temporary files ----------------------------------------------------------------- */

typedef struct {
    bool     entries;   /* entry files (clear) */
    bool     tmp;       /* temporary files */
    bool     remove;
    time_t   older_than; /* temporary files with mtime <= this */
    int      count;
    uint64_t bytes;
} sweep;

static kiln_status sweep_file(void *user, kc_kind kind, const char *dir, const char *sub, const char *name,
                              const struct stat *st) {
    sweep *s = user;
    kc_key key;
    bool match = s->tmp && is_tmp(name) ? st->st_mtime <= s->older_than
                                        : s->entries && entry_name(name, sub, kind, &key);
    if (!match) return NULL;
    char *path = path_in(dir, name);
    if (!path) return kb_oom();
    kiln_status err = NULL;
    if (!s->remove || unlink(path) == 0) {
        if (!s->entries || !is_tmp(name)) { /* clear counts entries, a temporary-file sweep those */
            s->count++;
            s->bytes += (uint64_t)st->st_size;
        }
    } else if (errno != ENOENT) {
        err = kb_error(KILN_ERR_IO, "cache: %s: cannot remove: %s", path, strerror(errno));
    }
    free(path);
    return err;
}

/* An mtime bound no file reaches: every temporary file, whatever its stamp. */
#define ANY_AGE ((time_t)INT64_MAX)

kiln_status kc_clear(const kc_cache *c, int *removed) {
    if (removed) *removed = 0;
    sweep s = {.entries = true, .tmp = true, .remove = true, .older_than = ANY_AGE};
    kiln_status st = each_file(c, sweep_file, &s, true);
    if (removed) *removed = s.count;
    return st;
}

kiln_status kc_tmp_files(const kc_cache *c, int64_t min_age_s, bool remove, int *count, uint64_t *bytes) {
    /* 0 must mean every file, not "mtime <= now": the kernel may stamp a file just written
     * with a fine-grained time that is a second ahead of the coarse clock time() reads. */
    time_t older_than = min_age_s > 0 ? time(NULL) - (time_t)min_age_s : ANY_AGE;
    sweep s = {.tmp = true, .remove = remove, .older_than = older_than};
    kiln_status st = each_file(c, sweep_file, &s, false);
    if (count) *count = s.count;
    if (bytes) *bytes = s.bytes;
    return st;
}

/* ---- settings ------------------------------------------------------------------------------------ */

kiln_status kc_parse_size(const char *text, uint64_t *bytes) {
    *bytes = 0;
    const char *p = text ? text : "";
    uint64_t v = 0;
    if (!isdigit((unsigned char)*p)) goto bad;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10) goto big;
        v = v * 10 + d;
    }
    int shift = 0;
    switch (tolower((unsigned char)*p)) {
    case 'k': shift = 10; break;
    case 'm': shift = 20; break;
    case 'g': shift = 30; break;
    case 't': shift = 40; break;
    }
    if (shift) p++;
    if (shift && tolower((unsigned char)p[0]) == 'i' && tolower((unsigned char)p[1]) == 'b') p += 2;
    else if (tolower((unsigned char)*p) == 'b') p++;
    if (*p) goto bad;
    if (shift && v > (UINT64_MAX >> shift)) goto big;
    *bytes = v << shift;
    return NULL;
bad:
    return kb_error(KILN_ERR_INVALID, "invalid size '%s': expected a whole number of bytes with an optional "
                                      "K, M, G or T suffix (binary: 512M, 2G, 2GiB)", text ? text : "");
big:
    return kb_error(KILN_ERR_INVALID, "invalid size '%s': too large", text);
}

kiln_status kc_max_bytes(uint64_t *bytes) {
    const char *e = getenv("KILN_CACHE_MAX");
    *bytes = KC_DEFAULT_MAX_BYTES;
    if (!e || !*e) return NULL;
    kiln_status st = kc_parse_size(e, bytes);
    if (st) *bytes = KC_DEFAULT_MAX_BYTES;
    return st ? kb_wrap(st, "KILN_CACHE_MAX") : NULL;
}

kiln_status kc_parse_mode(const char *text, kiln_cache_mode *mode) {
    static const struct {
        const char     *name;
        kiln_cache_mode mode;
    } modes[] = {{"on", KILN_CACHE_ON}, {"off", KILN_CACHE_OFF}, {"readonly", KILN_CACHE_READONLY},
                 {"refresh", KILN_CACHE_REFRESH}};
    for (size_t i = 0; text && i < sizeof modes / sizeof modes[0]; i++)
        if (!strcmp(text, modes[i].name)) {
            *mode = modes[i].mode;
            return NULL;
        }
    return kb_error(KILN_ERR_INVALID, "unknown cache mode '%s' (expected on, off, readonly or refresh)",
                    text ? text : "");
}

kiln_status kc_env_mode(kiln_cache_mode fallback, kiln_cache_mode *mode) {
    const char *e = getenv("KILN_CACHE");
    *mode = fallback;
    if (!e || !*e) return NULL;
    kiln_status st = kc_parse_mode(e, mode);
    if (st) *mode = fallback;
    return st ? kb_wrap(st, "KILN_CACHE") : NULL;
}
