/* Tests of cache/: key derivation, entry format, modes, corruption handling, directory
 * resolution and concurrent writers. */
#include "tests/support.h"

#include "base/base.h"
#include "cache/cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* ---- helpers -------------------------------------------------------------------------------- */

typedef struct {
    int  lines;
    char last[8192];
} log_capture;

static void capture_log(void *user, const char *line) {
    log_capture *lc = user;
    lc->lines++;
    snprintf(lc->last, sizeof lc->last, "%s", line);
}

static kc_key key_n(int n) {
    char src[64];
    snprintf(src, sizeof src, "__global__ void k%d() {}", n);
    const char *opts[] = {"--std=c++17", "-default-device"};
    return kc_kernel_key(src, opts, 2, "sm_90a", 12, 4, 1);
}

static int key_eq(kc_key a, kc_key b) { return memcmp(a.b, b.b, 16) == 0; }

static void fill_payload(uint8_t *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (uint8_t)(seed >> 56);
    }
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static void expect_hit(const kc_cache *c, kc_key k, const void *want, size_t n) {
    void *data = NULL;
    size_t size = 123;
    int corrupt = 0;
    TS_OK(kc_get(c, k, &data, &size, &corrupt));
    ck_assert_msg(data != NULL, "expected a cache hit");
    ck_assert_uint_eq(size, n);
    ck_assert_int_eq(corrupt, 0);
    ck_assert(n == 0 || memcmp(data, want, n) == 0);
    free(data);
}

static void expect_miss(const kc_cache *c, kc_key k, int want_corrupt) {
    void *data = (void *)1;
    size_t size = 123;
    int corrupt = 0;
    TS_OK(kc_get(c, k, &data, &size, &corrupt));
    ck_assert_ptr_null(data);
    ck_assert_uint_eq(size, 0);
    ck_assert_int_eq(corrupt, want_corrupt);
}

/* Counts files named *.cubin and .tmp.* under dir/kernels/xx/. */
static void count_entries(const char *dir, int *cubins, int *tmps) {
    *cubins = *tmps = 0;
    kb_str b = {0};
    kb_str_addf(&b, "%s/kernels", dir);
    char *kdir = kb_str_take(&b);
    DIR *d = opendir(kdir);
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        kb_str_addf(&b, "%s/%s", kdir, e->d_name);
        char *sub = kb_str_take(&b);
        DIR *s = opendir(sub);
        ck_assert_ptr_nonnull(s);
        struct dirent *f;
        while ((f = readdir(s)) != NULL) {
            if (strncmp(f->d_name, ".tmp.", 5) == 0) (*tmps)++;
            size_t n = strlen(f->d_name);
            if (n > 6 && strcmp(f->d_name + n - 6, ".cubin") == 0) (*cubins)++;
        }
        closedir(s);
        free(sub);
    }
    closedir(d);
    free(kdir);
}

/* ---- keys ----------------------------------------------------------------------------------- */

START_TEST(key_deterministic) {
    const char *opts[] = {"-arch=sm_90a", "--use_fast_math"};
    kc_key a = kc_kernel_key("src", opts, 2, "sm_90a", 12, 4, 3);
    kc_key b = kc_kernel_key("src", opts, 2, "sm_90a", 12, 4, 3);
    ck_assert(key_eq(a, b));
    char ha[33], hb[33];
    kc_key_hex(a, ha);
    kc_key_hex(b, hb);
    ck_assert_str_eq(ha, hb);
    /* Copies of the strings (different addresses) give the same key. */
    char s2[] = "src", o0[] = "-arch=sm_90a", o1[] = "--use_fast_math", ar[] = "sm_90a";
    const char *opts2[] = {o0, o1};
    ck_assert(key_eq(a, kc_kernel_key(s2, opts2, 2, ar, 12, 4, 3)));
}
END_TEST

/* Rebuilds the documented byte stream (docs/cache.md) independently and hashes it. */
static void frame(kb_str *b, const char *tag, const void *p, size_t n) {
    kb_str_addn(b, tag, 4);
    for (int i = 0; i < 8; i++) {
        char c = (char)(uint8_t)((uint64_t)n >> (8 * i));
        kb_str_addn(b, &c, 1);
    }
    kb_str_addn(b, p, n);
}
static void frame_int(kb_str *b, const char *tag, int64_t v) {
    char le[8];
    for (int i = 0; i < 8; i++) le[i] = (char)(uint8_t)((uint64_t)v >> (8 * i));
    frame(b, tag, le, 8);
}

START_TEST(key_matches_documented_format) {
    const char *opts[] = {"--std=c++17", "", "-lineinfo"};
    const char *src = "extern \"C\" __global__ void k(float *x) { x[0] = 1; }";
    kb_str b = {0};
    frame(&b, "KVER", KILN_VERSION, strlen(KILN_VERSION));
    frame_int(&b, "CGEN", 7);
    frame_int(&b, "NVMA", 12);
    frame_int(&b, "NVMI", 8);
    frame(&b, "ARCH", "sm_80", 5);
    frame_int(&b, "NOPT", 3);
    for (int i = 0; i < 3; i++) frame(&b, "OPT ", opts[i], strlen(opts[i]));
    frame(&b, "SRC ", src, strlen(src));
    ck_assert(!b.oom);
    XXH128_hash_t h = XXH3_128bits(b.s, b.len);
    kb_str_free(&b);
    char want[33];
    snprintf(want, sizeof want, "%016llx%016llx", (unsigned long long)h.high64,
             (unsigned long long)h.low64);
    char got[33];
    kc_key_hex(kc_kernel_key(src, opts, 3, "sm_80", 12, 8, 7), got);
    ck_assert_str_eq(got, want);
}
END_TEST

START_TEST(key_sensitivity) {
    const char *base_opts[] = {"-a", "-b"};
    const char *opt_changed[] = {"-a", "-c"};
    const char *opt_swapped[] = {"-b", "-a"};
    const char *opt_more[] = {"-a", "-b", ""};
    const char *fr1[] = {"ab", "c"};
    const char *fr2[] = {"a", "bc"};
    const char *fr3[] = {"abc"};
    kc_key k[] = {
        kc_kernel_key("S", base_opts, 2, "sm_90a", 12, 4, 1),   /* 0 base */
        kc_kernel_key("T", base_opts, 2, "sm_90a", 12, 4, 1),   /* source */
        kc_kernel_key("S ", base_opts, 2, "sm_90a", 12, 4, 1),  /* source, trailing space */
        kc_kernel_key("S", opt_changed, 2, "sm_90a", 12, 4, 1), /* an option */
        kc_kernel_key("S", opt_swapped, 2, "sm_90a", 12, 4, 1), /* option order */
        kc_kernel_key("S", opt_more, 3, "sm_90a", 12, 4, 1),    /* an extra empty option */
        kc_kernel_key("S", base_opts, 1, "sm_90a", 12, 4, 1),   /* fewer options */
        kc_kernel_key("S", base_opts, 2, "sm_80", 12, 4, 1),    /* arch */
        kc_kernel_key("S", base_opts, 2, "sm_90a", 11, 4, 1),   /* nvrtc major */
        kc_kernel_key("S", base_opts, 2, "sm_90a", 12, 5, 1),   /* nvrtc minor */
        kc_kernel_key("S", base_opts, 2, "sm_90a", 12, 4, 2),   /* codegen version */
        kc_kernel_key("S", fr1, 2, "sm_90a", 12, 4, 1),         /* framing */
        kc_kernel_key("S", fr2, 2, "sm_90a", 12, 4, 1),
        kc_kernel_key("S", fr3, 1, "sm_90a", 12, 4, 1),
        kc_kernel_key("S", NULL, 0, "sm_90a", 12, 4, 1),
        kc_kernel_key("S-a-b", NULL, 0, "sm_90a", 12, 4, 1),   /* source/option boundary */
        kc_kernel_key("", NULL, 0, "", 0, 0, 0),
        kc_kernel_key("", NULL, 0, "", 1, 0, 0),
        kc_kernel_key("", NULL, 0, "", 0, 1, 0),
    };
    int n = (int)(sizeof k / sizeof k[0]);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) ck_assert_msg(!key_eq(k[i], k[j]), "keys %d and %d collide", i, j);
    /* major/minor are separate fields: (1, 23) and (12, 3) differ. */
    ck_assert(!key_eq(kc_kernel_key("S", NULL, 0, "x", 1, 23, 0), kc_kernel_key("S", NULL, 0, "x", 12, 3, 0)));
    /* NULL source/arch behave as empty strings, and never crash. */
    ck_assert(key_eq(kc_kernel_key(NULL, NULL, 0, NULL, 0, 0, 0), kc_kernel_key("", NULL, 0, "", 0, 0, 0)));
}
END_TEST

START_TEST(key_hex_format) {
    kc_key k;
    for (int i = 0; i < 16; i++) k.b[i] = (uint8_t)(i * 17 + 0x0a);
    char h[33];
    memset(h, 'Z', sizeof h);
    kc_key_hex(k, h);
    ck_assert_str_eq(h, "0a1b2c3d4e5f708192a3b4c5d6e7f809");
    kc_key r = key_n(1);
    kc_key_hex(r, h);
    ck_assert_uint_eq(strlen(h), 32);
    for (int i = 0; i < 32; i++) ck_assert_msg(strchr("0123456789abcdef", h[i]) != NULL, "bad digit in %s", h);
}
END_TEST

/* ---- store and lookup ----------------------------------------------------------------------- */

START_TEST(put_get_roundtrip) {
    char *dir = ts_tmpdir();
    kc_cache c = {.dir = dir, .mode = KILN_CACHE_ON};
    kc_key k = key_n(42);
    uint8_t payload[5000];
    fill_payload(payload, sizeof payload, 1);
    TS_OK(kc_put(&c, k, payload, sizeof payload));

    char hex[33];
    kc_key_hex(k, hex);
    char *path = kc_entry_path(&c, k);
    char want[4200];
    snprintf(want, sizeof want, "%s/kernels/%.2s/%s.cubin", dir, hex, hex);
    ck_assert_str_eq(path, want);
    ck_assert_int_eq(file_size(path), 64 + (long)sizeof payload);

    /* Header layout. */
    char *raw;
    size_t len;
    TS_OK(kb_read_file(path, &raw, &len));
    const uint8_t *h = (const uint8_t *)raw;
    ck_assert(memcmp(h, "KILNCACH", 8) == 0);
    ck_assert(h[8] == 1 && h[9] == 0 && h[10] == 0 && h[11] == 0);
    ck_assert(h[12] == 1 && h[13] == 0 && h[14] == 0 && h[15] == 0);
    ck_assert(memcmp(h + 16, k.b, 16) == 0);
    uint64_t plen = 0, pck = 0, hck = 0;
    for (int i = 7; i >= 0; i--) {
        plen = plen << 8 | h[32 + i];
        pck = pck << 8 | h[40 + i];
        hck = hck << 8 | h[48 + i];
    }
    ck_assert_uint_eq(plen, sizeof payload);
    ck_assert_uint_eq(pck, XXH3_64bits(payload, sizeof payload));
    ck_assert_uint_eq(hck, XXH3_64bits(h, 48));
    for (int i = 56; i < 64; i++) ck_assert_int_eq(h[i], 0);
    ck_assert(memcmp(h + 64, payload, sizeof payload) == 0);
    free(raw);

    expect_hit(&c, k, payload, sizeof payload);
    expect_miss(&c, key_n(43), 0);

    /* Overwrite with another payload; empty payloads are hits too. */
    TS_OK(kc_put(&c, k, "abc", 3));
    expect_hit(&c, k, "abc", 3);
    TS_OK(kc_put(&c, k, NULL, 0));
    expect_hit(&c, k, NULL, 0);

    int cubins, tmps;
    count_entries(dir, &cubins, &tmps);
    ck_assert_int_eq(cubins, 1);
    ck_assert_int_eq(tmps, 0);
    free(path);
    ts_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(miss_on_absent) {
    char *dir = ts_tmpdir();
    kc_cache c = {.dir = dir, .mode = KILN_CACHE_ON};
    expect_miss(&c, key_n(1), 0); /* kernels/ does not even exist */
    TS_OK(kc_put(&c, key_n(2), "x", 1));
    expect_miss(&c, key_n(1), 0);
    /* A cache root that does not exist yet is created by put. */
    kb_str b = {0};
    kb_str_addf(&b, "%s/deep/er/root", dir);
    char *deep = kb_str_take(&b);
    kc_cache d = {.dir = deep, .mode = KILN_CACHE_ON};
    expect_miss(&d, key_n(1), 0);
    TS_OK(kc_put(&d, key_n(1), "y", 1));
    expect_hit(&d, key_n(1), "y", 1);
    free(deep);
    ts_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(modes) {
    char *dir = ts_tmpdir();
    kc_key k = key_n(7);
    kc_cache on = {.dir = dir, .mode = KILN_CACHE_ON};
    kc_cache off = {.dir = dir, .mode = KILN_CACHE_OFF};
    kc_cache ro = {.dir = dir, .mode = KILN_CACHE_READONLY};
    kc_cache refresh = {.dir = dir, .mode = KILN_CACHE_REFRESH};
    char *path = kc_entry_path(&on, k);

    /* off and readonly never write. */
    TS_OK(kc_put(&off, k, "off", 3));
    ck_assert(!file_exists(path));
    TS_OK(kc_put(&ro, k, "ro", 2));
    ck_assert(!file_exists(path));

    TS_OK(kc_put(&on, k, "one", 3));
    expect_hit(&on, k, "one", 3);
    expect_hit(&ro, k, "one", 3); /* readonly reads */
    expect_miss(&off, k, 0);      /* off never reads */
    expect_miss(&refresh, k, 0);  /* refresh never reads... */
    TS_OK(kc_put(&refresh, k, "two", 3)); /* ...but writes */
    expect_hit(&on, k, "two", 3);
    TS_OK(kc_put(&ro, k, "three", 5));
    TS_OK(kc_put(&off, k, "three", 5));
    expect_hit(&on, k, "two", 3);

    free(path);
    ts_rmtree(dir);
    free(dir);
}
END_TEST

/* ---- corruption ----------------------------------------------------------------------------- */

enum { PAYLOAD_N = 300 };

/* Puts a fresh entry for k and returns its file contents (caller frees). */
static uint8_t *fresh_entry(const kc_cache *c, kc_key k, const uint8_t *payload, size_t *len) {
    TS_OK(kc_put(c, k, payload, PAYLOAD_N));
    char *path = kc_entry_path(c, k);
    char *raw;
    TS_OK(kb_read_file(path, &raw, len));
    free(path);
    ck_assert_uint_eq(*len, 64 + PAYLOAD_N);
    return (uint8_t *)raw;
}

/* After the entry of k was damaged: the next get misses, logs one line naming the path and
 * reason, removes the file, counts it; then a put+get works again. */
static void expect_corrupt_detected(kc_cache *c, log_capture *lc, kc_key k, const uint8_t *payload,
                                    const char *reason, const char *what) {
    char *path = kc_entry_path(c, k);
    lc->lines = 0;
    lc->last[0] = 0;
    void *data = (void *)1;
    size_t size = 9;
    int corrupt = 5;
    TS_OK(kc_get(c, k, &data, &size, &corrupt));
    ck_assert_msg(data == NULL, "%s: corrupt entry returned as a hit", what);
    ck_assert_uint_eq(size, 0);
    ck_assert_msg(corrupt == 6, "%s: corrupt count %d", what, corrupt);
    ck_assert_msg(lc->lines == 1, "%s: %d log lines", what, lc->lines);
    ck_assert_msg(strstr(lc->last, path) != NULL, "%s: log lacks path: %s", what, lc->last);
    ck_assert_msg(strncmp(lc->last, "kiln: cache entry ", 18) == 0 && strstr(lc->last, "is corrupt (") &&
                      strstr(lc->last, "removed, rebuilding"),
                  "%s: log line: %s", what, lc->last);
    if (reason) ck_assert_msg(strstr(lc->last, reason) != NULL, "%s: want reason '%s' in: %s", what, reason, lc->last);
    ck_assert_msg(!file_exists(path), "%s: corrupt file not removed", what);
    /* Later lookups are plain misses; the counter stays as it was. */
    corrupt = 0;
    TS_OK(kc_get(c, k, &data, &size, &corrupt));
    ck_assert(data == NULL && corrupt == 0);
    /* Rebuild. */
    TS_OK(kc_put(c, k, payload, PAYLOAD_N));
    expect_hit(c, k, payload, PAYLOAD_N);
    free(path);
}

static void write_raw(const char *path, const void *p, size_t n) { TS_OK(kb_write_file(path, p, n)); }

START_TEST(corruption_detected) {
    char *dir = ts_tmpdir();
    log_capture lc = {0};
    kc_cache c = {.dir = dir, .mode = KILN_CACHE_ON, .log = capture_log, .log_user = &lc};
    kc_key k = key_n(9);
    char *path = kc_entry_path(&c, k);
    uint8_t payload[PAYLOAD_N];
    fill_payload(payload, sizeof payload, 9);
    size_t len;
    char what[64];

    /* Flipped payload bytes. */
    size_t pos[] = {64, 64 + 1, 64 + PAYLOAD_N / 2, 64 + PAYLOAD_N - 1};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++) {
        uint8_t *raw = fresh_entry(&c, k, payload, &len);
        raw[pos[i]] ^= 0x01;
        write_raw(path, raw, len);
        free(raw);
        snprintf(what, sizeof what, "payload byte %zu", pos[i]);
        expect_corrupt_detected(&c, &lc, k, payload, "payload checksum mismatch", what);
    }

    /* Every single header byte flipped (magic, version, kind, key, length, checksums,
     * reserved). */
    for (size_t i = 0; i < 64; i++) {
        uint8_t *raw = fresh_entry(&c, k, payload, &len);
        raw[i] ^= 0x80;
        write_raw(path, raw, len);
        free(raw);
        snprintf(what, sizeof what, "header byte %zu", i);
        const char *reason = i < 8    ? "bad magic"
                             : i < 12 ? "unsupported format version"
                             : i < 16 ? "unknown payload kind"
                             : i < 32 ? "key mismatch"
                             : i < 40 ? "header checksum mismatch"
                             : i < 48 ? "header checksum mismatch"
                             : i < 56 ? "header checksum mismatch"
                                      : "reserved";
        expect_corrupt_detected(&c, &lc, k, payload, reason, what);
    }

    /* Truncated files. */
    size_t cuts[] = {0, 1, 8, 32, 63, 64, 65, 64 + PAYLOAD_N - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        uint8_t *raw = fresh_entry(&c, k, payload, &len);
        write_raw(path, raw, cuts[i]);
        free(raw);
        snprintf(what, sizeof what, "truncated to %zu", cuts[i]);
        expect_corrupt_detected(&c, &lc, k, payload, cuts[i] < 64 ? "truncated" : "payload length", what);
    }

    /* Appended garbage. */
    {
        uint8_t *raw = fresh_entry(&c, k, payload, &len);
        uint8_t *big = malloc(len + 7);
        memcpy(big, raw, len);
        memcpy(big + len, "garbage", 7);
        write_raw(path, big, len + 7);
        free(big);
        free(raw);
        expect_corrupt_detected(&c, &lc, k, payload, "payload length", "appended garbage");
    }

    /* Another key's (valid) entry renamed to this key's path. */
    {
        kc_key other = key_n(10);
        TS_OK(kc_put(&c, other, payload, PAYLOAD_N));
        char *opath = kc_entry_path(&c, other);
        ck_assert_int_eq(rename(opath, path), 0);
        free(opath);
        expect_corrupt_detected(&c, &lc, k, payload, "key mismatch", "wrong key");
    }

    /* Arbitrary garbage of many lengths, including garbage behind a valid-looking magic. */
    for (int i = 0; i < 300; i++) {
        size_t n = (size_t)(i * 7 % 400);
        uint8_t *g = malloc(n + 1);
        fill_payload(g, n, (uint64_t)i + 1000);
        if (i % 2 && n >= 16) {
            memcpy(g, "KILNCACH\1\0\0\0\1\0\0\0", 16);
        }
        write_raw(path, g, n);
        free(g);
        snprintf(what, sizeof what, "garbage %d", i);
        expect_corrupt_detected(&c, &lc, k, payload, NULL, what);
    }

    free(path);
    ts_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(corruption_readonly_keeps_file) {
    char *dir = ts_tmpdir();
    log_capture lc = {0};
    kc_cache c = {.dir = dir, .mode = KILN_CACHE_ON, .log = capture_log, .log_user = &lc};
    kc_cache ro = c;
    ro.mode = KILN_CACHE_READONLY;
    kc_key k = key_n(11);
    uint8_t payload[PAYLOAD_N];
    fill_payload(payload, sizeof payload, 11);
    size_t len;
    uint8_t *raw = fresh_entry(&c, k, payload, &len);
    raw[100] ^= 0xff;
    char *path = kc_entry_path(&c, k);
    write_raw(path, raw, len);
    free(raw);

    int corrupt = 0;
    void *data = NULL;
    size_t size = 0;
    TS_OK(kc_get(&ro, k, &data, &size, &corrupt));
    ck_assert_ptr_null(data);
    ck_assert_int_eq(corrupt, 1);
    ck_assert_int_eq(lc.lines, 1);
    ck_assert_msg(strstr(lc.last, path) && strstr(lc.last, "is corrupt (payload checksum mismatch)") &&
                      strstr(lc.last, "not removed"),
                  "log: %s", lc.last);
    ck_assert(file_exists(path));
    ck_assert_int_eq(file_size(path), (long)len);
    /* corrupt may be NULL. */
    TS_OK(kc_get(&ro, k, &data, &size, NULL));
    ck_assert_ptr_null(data);
    ck_assert_int_eq(lc.lines, 2);
    free(path);
    ts_rmtree(dir);
    free(dir);
}
END_TEST

/* With no log callback the line goes to stderr. */
START_TEST(corruption_logs_to_stderr) {
    char *dir = ts_tmpdir();
    kc_cache c = {.dir = dir, .mode = KILN_CACHE_ON};
    kc_key k = key_n(12);
    char *path = kc_entry_path(&c, k);
    TS_OK(kc_put(&c, k, "abcdef", 6));
    write_raw(path, "KILNCACH", 8);

    kb_str b = {0};
    kb_str_addf(&b, "%s/stderr.txt", dir);
    char *errpath = kb_str_take(&b);
    fflush(stderr);
    int saved = dup(2);
    int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    void *data = NULL;
    size_t size = 0;
    int corrupt = 0;
    kiln_status st = kc_get(&c, k, &data, &size, &corrupt);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    TS_OK(st);
    ck_assert_ptr_null(data);
    ck_assert_int_eq(corrupt, 1);
    char *text;
    size_t len;
    TS_OK(kb_read_file(errpath, &text, &len));
    ck_assert_msg(strstr(text, "kiln: cache entry ") && strstr(text, path) && strstr(text, "truncated"),
                  "stderr: %s", text);
    ck_assert_msg(len > 0 && text[len - 1] == '\n' && strchr(text, '\n') == text + len - 1, "one line: %s", text);
    ck_assert(!file_exists(path));
    free(text);
    free(errpath);
    free(path);
    ts_rmtree(dir);
    free(dir);
}
END_TEST

/* ---- errors --------------------------------------------------------------------------------- */

START_TEST(io_errors_name_the_path) {
    char *dir = ts_tmpdir();
    kb_str b = {0};

    /* The cache root is a regular file. */
    kb_str_addf(&b, "%s/notadir", dir);
    char *file = kb_str_take(&b);
    write_raw(file, "x", 1);
    kc_cache c = {.dir = file, .mode = KILN_CACHE_ON};
    kiln_status st = kc_put(&c, key_n(1), "abc", 3);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_IO);
    ck_assert_msg(strstr(kiln_status_msg(st), file) != NULL, "msg: %s", kiln_status_msg(st));
    kiln_status_free(st);
    void *data = (void *)1;
    size_t size = 0;
    st = kc_get(&c, key_n(1), &data, &size, NULL);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_IO);
    ck_assert_msg(strstr(kiln_status_msg(st), file) != NULL, "msg: %s", kiln_status_msg(st));
    ck_assert_ptr_null(data);
    kiln_status_free(st);

    /* The entry path is a directory: get reports it, put fails cleanly without temp files. */
    kc_cache d = {.dir = dir, .mode = KILN_CACHE_ON};
    char *path = kc_entry_path(&d, key_n(2));
    TS_OK(kb_mkdirs(path));
    st = kc_get(&d, key_n(2), &data, &size, NULL);
    ck_assert(st != NULL);
    ck_assert_msg(strstr(kiln_status_msg(st), path) != NULL, "msg: %s", kiln_status_msg(st));
    kiln_status_free(st);
    st = kc_put(&d, key_n(2), "abc", 3);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_IO);
    ck_assert_msg(strstr(kiln_status_msg(st), path) != NULL, "msg: %s", kiln_status_msg(st));
    kiln_status_free(st);
    int cubins, tmps;
    count_entries(dir, &cubins, &tmps);
    ck_assert_int_eq(tmps, 0);

    /* A cache without a directory, and NULL arguments, are rejected, not crashed on. */
    kc_cache none = {.dir = NULL, .mode = KILN_CACHE_ON};
    ck_assert_ptr_null(kc_entry_path(&none, key_n(1)));
    st = kc_put(&none, key_n(1), "a", 1);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_INVALID);
    kiln_status_free(st);
    st = kc_get(&d, key_n(1), NULL, &size, NULL);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_INVALID);
    kiln_status_free(st);

    free(path);
    free(file);
    ts_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(long_paths) {
    char *dir = ts_tmpdir();
    size_t n = 20000;
    char *longdir = malloc(strlen(dir) + n + 2);
    strcpy(longdir, dir);
    char *p = longdir + strlen(dir);
    for (size_t i = 0; i < n; i++) *p++ = (i % 100 == 0) ? '/' : 'd';
    *p = 0;
    kc_cache c = {.dir = longdir, .mode = KILN_CACHE_ON};
    char *path = kc_entry_path(&c, key_n(1));
    ck_assert_uint_eq(strlen(path), strlen(longdir) + strlen("/kernels/xx/") + 32 + strlen(".cubin"));
    free(path);
    kiln_status st = kc_put(&c, key_n(1), "abc", 3);
    ck_assert(st != NULL); /* too long for the file system; an error, not a crash */
    kiln_status_free(st);
    void *data = NULL;
    size_t size;
    st = kc_get(&c, key_n(1), &data, &size, NULL);
    ck_assert(st != NULL || data == NULL);
    kiln_status_free(st);
    free(longdir);
    ts_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(stale_temp_files_swept) {
    char *dir = ts_tmpdir();
    kc_cache c = {.dir = dir, .mode = KILN_CACHE_ON};
    kc_key k = key_n(3);
    TS_OK(kc_put(&c, k, "a", 1));
    char *path = kc_entry_path(&c, k);
    char *slash = strrchr(path, '/');
    kb_str b = {0};
    kb_str_addn(&b, path, (size_t)(slash - path));
    kb_str_add(&b, "/.tmp.99999.old");
    char *old = kb_str_take(&b);
    kb_str_addn(&b, path, (size_t)(slash - path));
    kb_str_add(&b, "/.tmp.99999.new");
    char *young = kb_str_take(&b);
    write_raw(old, "x", 1);
    write_raw(young, "x", 1);
    struct timespec ts[2] = {{.tv_sec = time(NULL) - 7200}, {.tv_sec = time(NULL) - 7200}};
    ck_assert_int_eq(utimensat(AT_FDCWD, old, ts, 0), 0);
    TS_OK(kc_put(&c, k, "b", 1));
    ck_assert(!file_exists(old));
    ck_assert(file_exists(young)); /* might belong to a writer still running */
    expect_hit(&c, k, "b", 1);
    free(old);
    free(young);
    free(path);
    ts_rmtree(dir);
    free(dir);
}
END_TEST

/* ---- directory resolution ------------------------------------------------------------------- */

static void expect_dir(const char *explicit_dir, const char *want) {
    char *got = NULL;
    TS_OK(kc_default_dir(explicit_dir, &got));
    ck_assert_str_eq(got, want);
    free(got);
}

START_TEST(default_dir_resolution) {
    unsetenv("KILN_CACHE_DIR");
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    char *got = (char *)1;
    kiln_status st = kc_default_dir(NULL, &got);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_CACHE);
    ck_assert_msg(strstr(kiln_status_msg(st), "KILN_CACHE_DIR") != NULL, "msg: %s", kiln_status_msg(st));
    ck_assert_ptr_null(got);
    kiln_status_free(st);

    setenv("HOME", "/home/u", 1);
    expect_dir(NULL, "/home/u/.cache/kiln");
    setenv("XDG_CACHE_HOME", "", 1); /* empty: ignored */
    expect_dir(NULL, "/home/u/.cache/kiln");
    setenv("XDG_CACHE_HOME", "rel/cache", 1); /* relative: ignored, as the XDG spec says */
    expect_dir(NULL, "/home/u/.cache/kiln");
    setenv("XDG_CACHE_HOME", "/xdg/cache", 1);
    expect_dir(NULL, "/xdg/cache/kiln");
    setenv("KILN_CACHE_DIR", "", 1);
    expect_dir(NULL, "/xdg/cache/kiln");
    setenv("KILN_CACHE_DIR", "/kc/dir/", 1); /* trailing slashes dropped */
    expect_dir(NULL, "/kc/dir");
    expect_dir("", "/kc/dir");
    expect_dir("/explicit", "/explicit");
    expect_dir("relative/x", "relative/x");
    expect_dir("/", "/");
    unsetenv("KILN_CACHE_DIR");
    unsetenv("HOME");
    expect_dir(NULL, "/xdg/cache/kiln");
    unsetenv("XDG_CACHE_HOME");
    expect_dir("/only/explicit", "/only/explicit");
}
END_TEST

/* ---- concurrency ---------------------------------------------------------------------------- */

enum { WRITERS = 8, ROUNDS = 20 };

/* Payloads say who wrote them, so a reader can check an entry is one writer's whole payload. */
static size_t make_shared_payload(uint8_t *buf, int writer, int round) {
    size_t n = 1000 + (size_t)writer * 997 + (size_t)round * 131;
    buf[0] = (uint8_t)writer;
    buf[1] = (uint8_t)round;
    fill_payload(buf + 2, n - 2, (uint64_t)(writer * 1000 + round));
    return n;
}

static int shared_payload_ok(const uint8_t *p, size_t n) {
    if (n < 2 || p[0] >= WRITERS || p[1] >= ROUNDS) return 0;
    static uint8_t want[1000 + WRITERS * 997 + ROUNDS * 131];
    size_t wn = make_shared_payload(want, p[0], p[1]);
    return wn == n && memcmp(want, p, n) == 0;
}

static kc_key own_key(int writer, int round) { return key_n(1000 + writer * 100 + round); }

static int writer_main(const char *dir, int w) {
    kc_cache c = {.dir = (char *)dir, .mode = KILN_CACHE_ON};
    kc_key shared = key_n(999);
    static uint8_t buf[1000 + WRITERS * 997 + ROUNDS * 131];
    for (int r = 0; r < ROUNDS; r++) {
        size_t n = make_shared_payload(buf, w, r);
        kiln_status st = kc_put(&c, shared, buf, n);
        if (st) return 10;
        uint8_t own[64];
        fill_payload(own, sizeof own, (uint64_t)(w * 100 + r));
        st = kc_put(&c, own_key(w, r), own, sizeof own);
        if (st) return 11;
        void *data = NULL;
        size_t size = 0;
        int corrupt = 0;
        st = kc_get(&c, shared, &data, &size, &corrupt);
        if (st) return 12;
        if (corrupt) return 13;
        if (!data) return 14; /* nobody ever removes it, so it must be there */
        int ok = shared_payload_ok(data, size);
        free(data);
        if (!ok) return 15;
    }
    return 0;
}

START_TEST(concurrent_writers) {
    char *dir = ts_tmpdir();
    pid_t pids[WRITERS];
    for (int w = 0; w < WRITERS; w++) {
        pids[w] = fork();
        ck_assert(pids[w] >= 0);
        if (pids[w] == 0) _exit(writer_main(dir, w));
    }
    for (int w = 0; w < WRITERS; w++) {
        int status = 0;
        ck_assert(waitpid(pids[w], &status, 0) == pids[w]);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "writer %d: status %d", w, status);
    }
    log_capture lc = {0};
    kc_cache c = {.dir = dir, .mode = KILN_CACHE_ON, .log = capture_log, .log_user = &lc};
    void *data = NULL;
    size_t size = 0;
    int corrupt = 0;
    TS_OK(kc_get(&c, key_n(999), &data, &size, &corrupt));
    ck_assert_ptr_nonnull(data);
    ck_assert(shared_payload_ok(data, size));
    free(data);
    for (int w = 0; w < WRITERS; w++)
        for (int r = 0; r < ROUNDS; r++) {
            uint8_t own[64];
            fill_payload(own, sizeof own, (uint64_t)(w * 100 + r));
            expect_hit(&c, own_key(w, r), own, sizeof own);
        }
    ck_assert_int_eq(corrupt, 0);
    ck_assert_int_eq(lc.lines, 0);
    int cubins, tmps;
    count_entries(dir, &cubins, &tmps);
    ck_assert_int_eq(cubins, 1 + WRITERS * ROUNDS);
    ck_assert_int_eq(tmps, 0);
    ts_rmtree(dir);
    free(dir);
}
END_TEST

static Suite *cache_suite(void) {
    Suite *s = suite_create("cache");
    TCase *t = tcase_create("key");
    tcase_add_test(t, key_deterministic);
    tcase_add_test(t, key_matches_documented_format);
    tcase_add_test(t, key_sensitivity);
    tcase_add_test(t, key_hex_format);
    suite_add_tcase(s, t);
    t = tcase_create("store");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, put_get_roundtrip);
    tcase_add_test(t, miss_on_absent);
    tcase_add_test(t, modes);
    tcase_add_test(t, corruption_detected);
    tcase_add_test(t, corruption_readonly_keeps_file);
    tcase_add_test(t, corruption_logs_to_stderr);
    tcase_add_test(t, io_errors_name_the_path);
    tcase_add_test(t, long_paths);
    tcase_add_test(t, stale_temp_files_swept);
    tcase_add_test(t, default_dir_resolution);
    tcase_add_test(t, concurrent_writers);
    suite_add_tcase(s, t);
    return s;
}

int main(void) { return ts_main(cache_suite()); }
