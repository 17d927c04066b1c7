/* Tests of cache/: key derivation, entry format, modes, corruption handling, directory
 * resolution and concurrent writers. */
#include "tests/support.h"

#include "base/base.h"
#include "cache/cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
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

static void expect_hit_kind(const kc_cache *c, kc_kind kind, kc_key k, const void *want, size_t n) {
    void *data = NULL;
    size_t size = 123;
    int corrupt = 0;
    TS_OK(kc_get(c, kind, k, &data, &size, &corrupt));
    ck_assert_msg(data != NULL, "expected a cache hit");
    ck_assert_uint_eq(size, n);
    ck_assert_int_eq(corrupt, 0);
    ck_assert(n == 0 || memcmp(data, want, n) == 0);
    free(data);
}

static void expect_miss_kind(const kc_cache *c, kc_kind kind, kc_key k, int want_corrupt) {
    void *data = (void *)1;
    size_t size = 123;
    int corrupt = 0;
    TS_OK(kc_get(c, kind, k, &data, &size, &corrupt));
    ck_assert_ptr_null(data);
    ck_assert_uint_eq(size, 0);
    ck_assert_int_eq(corrupt, want_corrupt);
}

static void expect_hit(const kc_cache *c, kc_key k, const void *want, size_t n) {
    expect_hit_kind(c, KC_CUBIN, k, want, n);
}
static void expect_miss(const kc_cache *c, kc_key k, int want_corrupt) { expect_miss_kind(c, KC_CUBIN, k, want_corrupt); }

static uint64_t rd64le(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint32_t rd32le(const uint8_t *p) { return (uint32_t)(p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24); }
static void wr64le(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static int64_t mtime_of(const char *path) {
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    return (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
}

/* Sets path's mtime to sec seconds after the epoch (LRU order in the tests). */
static void set_mtime(const char *path, time_t sec) {
    struct timespec ts[2] = {{.tv_sec = sec}, {.tv_sec = sec}};
    ck_assert_int_eq(utimensat(AT_FDCWD, path, ts, 0), 0);
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

/* The header as docs/cache.md lays it out. */
static void check_header_layout(const uint8_t *h, kc_kind kind, kc_key k, const char *meta, const void *payload,
                                size_t n) {
    size_t ml = strlen(meta);
    ck_assert(memcmp(h, "KILNCACH", 8) == 0);
    ck_assert_uint_eq(rd32le(h + 8), 2);
    ck_assert_uint_eq(rd32le(h + 12), 80);
    ck_assert_uint_eq(rd32le(h + 16), (uint32_t)kind);
    ck_assert_uint_eq(rd32le(h + 20), 0);
    ck_assert(memcmp(h + 24, k.b, 16) == 0);
    ck_assert_uint_eq(rd64le(h + 40), ml);
    ck_assert_uint_eq(rd64le(h + 48), n);
    ck_assert_uint_eq(rd64le(h + 56), XXH3_64bits(meta, ml));
    ck_assert_uint_eq(rd64le(h + 64), XXH3_64bits(payload, n));
    ck_assert_uint_eq(rd64le(h + 72), XXH3_64bits(h, 72));
    ck_assert(memcmp(h + 80, meta, ml) == 0);
    ck_assert(memcmp(h + 80 + ml, payload, n) == 0);
}

START_TEST(put_get_roundtrip) {
    char *dir = ts_tmpdir();
    kc_cache c = {.dir = dir, .mode = KILN_CACHE_ON};
    kc_key k = key_n(42);
    uint8_t payload[5000];
    fill_payload(payload, sizeof payload, 1);
    const char *meta = "kernel silu_mul_f32\nsource 1234 bytes, sm_90a";
    TS_OK(kc_put(&c, KC_CUBIN, k, meta, payload, sizeof payload));

    char hex[33];
    kc_key_hex(k, hex);
    char *path = kc_entry_path(&c, KC_CUBIN, k);
    char want[4200];
    snprintf(want, sizeof want, "%s/kernels/%.2s/%s.cubin", dir, hex, hex);
    ck_assert_str_eq(path, want);
    ck_assert_int_eq(file_size(path), 80 + (long)strlen(meta) + (long)sizeof payload);
    char *raw;
    size_t len;
    TS_OK(kb_read_file(path, &raw, &len));
    check_header_layout((const uint8_t *)raw, KC_CUBIN, k, meta, payload, sizeof payload);
    free(raw);
    expect_hit(&c, k, payload, sizeof payload);
    expect_miss(&c, key_n(43), 0);

    /* A program with the same key is another entry, in programs/, with its own payload. */
    char *ppath = kc_entry_path(&c, KC_PROGRAM, k);
    snprintf(want, sizeof want, "%s/programs/%.2s/%s.prog", dir, hex, hex);
    ck_assert_str_eq(ppath, want);
    expect_miss_kind(&c, KC_PROGRAM, k, 0);
    TS_OK(kc_put(&c, KC_PROGRAM, k, "program decode", "PLAN", 4));
    TS_OK(kb_read_file(ppath, &raw, &len));
    check_header_layout((const uint8_t *)raw, KC_PROGRAM, k, "program decode", "PLAN", 4);
    free(raw);
    expect_hit_kind(&c, KC_PROGRAM, k, "PLAN", 4);
    expect_hit(&c, k, payload, sizeof payload);

    /* Overwrite; empty payloads and NULL or empty meta are fine. */
    TS_OK(kc_put(&c, KC_CUBIN, k, "", "abc", 3));
    expect_hit(&c, k, "abc", 3);
    TS_OK(kc_put(&c, KC_CUBIN, k, NULL, NULL, 0));
    expect_hit(&c, k, NULL, 0);
    ck_assert_int_eq(file_size(path), 80);

    /* Unknown kinds are refused, not crashed on. */
    ck_assert_ptr_null(kc_entry_path(&c, (kc_kind)3, k));
    kiln_status st = kc_put(&c, (kc_kind)0, k, NULL, "a", 1);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_INVALID);
    kiln_status_free(st);
    void *data;
    size_t size;
    st = kc_get(&c, (kc_kind)9, k, &data, &size, NULL);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_INVALID);
    kiln_status_free(st);

    int cubins, tmps;
    count_entries(dir, &cubins, &tmps);
    ck_assert_int_eq(cubins, 1);
    ck_assert_int_eq(tmps, 0);
    free(ppath);
    free(path);
    ts_tmpdir_free(dir);
}
END_TEST

START_TEST(miss_on_absent) {
    char *dir = ts_tmpdir();
    kc_cache c = {.dir = dir, .mode = KILN_CACHE_ON};
    expect_miss(&c, key_n(1), 0); /* kernels/ does not even exist */
    TS_OK(kc_put(&c, KC_CUBIN, key_n(2), NULL, "x", 1));
    expect_miss(&c, key_n(1), 0);
    /* A cache root that does not exist yet is created by put. */
    kb_str b = {0};
    kb_str_addf(&b, "%s/deep/er/root", dir);
    char *deep = kb_str_take(&b);
    kc_cache d = {.dir = deep, .mode = KILN_CACHE_ON};
    expect_miss(&d, key_n(1), 0);
    TS_OK(kc_put(&d, KC_CUBIN, key_n(1), NULL, "y", 1));
    expect_hit(&d, key_n(1), "y", 1);
    free(deep);
    ts_tmpdir_free(dir);
}
END_TEST

START_TEST(modes) {
    char *dir = ts_tmpdir();
    kc_key k = key_n(7);
    kc_cache on = {.dir = dir, .mode = KILN_CACHE_ON};
    kc_cache off = {.dir = dir, .mode = KILN_CACHE_OFF};
    kc_cache ro = {.dir = dir, .mode = KILN_CACHE_READONLY};
    kc_cache refresh = {.dir = dir, .mode = KILN_CACHE_REFRESH};
    char *path = kc_entry_path(&on, KC_CUBIN, k);

    /* off and readonly never write. */
    TS_OK(kc_put(&off, KC_CUBIN, k, NULL, "off", 3));
    ck_assert(!file_exists(path));
    TS_OK(kc_put(&ro, KC_CUBIN, k, NULL, "ro", 2));
    ck_assert(!file_exists(path));

    TS_OK(kc_put(&on, KC_CUBIN, k, NULL, "one", 3));
    expect_hit(&on, k, "one", 3);
    expect_hit(&ro, k, "one", 3); /* readonly reads */
    expect_miss(&off, k, 0);      /* off never reads */
    expect_miss(&refresh, k, 0);  /* refresh never reads... */
    TS_OK(kc_put(&refresh, KC_CUBIN, k, NULL, "two", 3)); /* ...but writes */
    expect_hit(&on, k, "two", 3);
    TS_OK(kc_put(&ro, KC_CUBIN, k, NULL, "three", 5));
    TS_OK(kc_put(&off, KC_CUBIN, k, NULL, "three", 5));
    expect_hit(&on, k, "two", 3);

    /* LRU: a hit marks the entry used, except in readonly mode, which touches nothing. */
    set_mtime(path, 1000000);
    expect_hit(&ro, k, "two", 3);
    ck_assert_int_eq(mtime_of(path), (int64_t)1000000 * 1000000000);
    expect_miss(&refresh, k, 0);
    ck_assert_int_eq(mtime_of(path), (int64_t)1000000 * 1000000000);
    expect_hit(&on, k, "two", 3);
    ck_assert_int_ge(mtime_of(path), ((int64_t)time(NULL) - 60) * 1000000000);

    free(path);
    ts_tmpdir_free(dir);
}
END_TEST

/* ---- corruption ----------------------------------------------------------------------------- */

enum { PAYLOAD_N = 300 };
#define META "kernel rms_norm_f32\nsrc 812 bytes"
#define META_N (sizeof META - 1)
#define ENTRY_N (80 + META_N + PAYLOAD_N)

/* Puts a fresh entry for (kind, k) and returns its file contents (caller frees). */
static uint8_t *fresh_entry_kind(kc_cache *c, kc_kind kind, kc_key k, const uint8_t *payload, size_t *len) {
    TS_OK(kc_put(c, kind, k, META, payload, PAYLOAD_N));
    char *path = kc_entry_path(c, kind, k);
    char *raw;
    TS_OK(kb_read_file(path, &raw, len));
    free(path);
    ck_assert_uint_eq(*len, ENTRY_N);
    return (uint8_t *)raw;
}

static uint8_t *fresh_entry(kc_cache *c, kc_key k, const uint8_t *payload, size_t *len) {
    return fresh_entry_kind(c, KC_CUBIN, k, payload, len);
}

/* After the entry of k was damaged: the next get misses, logs one line naming the path and
 * reason, removes the file, counts it; then a put+get works again. */
static void expect_corrupt_detected(kc_cache *c, ts_log *lc, kc_key k, const uint8_t *payload,
                                    const char *reason, const char *what) {
    char *path = kc_entry_path(c, KC_CUBIN, k);
    lc->lines = 0;
    lc->last[0] = 0;
    void *data = (void *)1;
    size_t size = 9;
    int corrupt = 5;
    TS_OK(kc_get(c, KC_CUBIN, k, &data, &size, &corrupt));
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
    TS_OK(kc_get(c, KC_CUBIN, k, &data, &size, &corrupt));
    ck_assert(data == NULL && corrupt == 0);
    /* Rebuild. */
    TS_OK(kc_put(c, KC_CUBIN, k, META, payload, PAYLOAD_N));
    expect_hit(c, k, payload, PAYLOAD_N);
    free(path);
}

static void write_raw(const char *path, const void *p, size_t n) { TS_OK(kb_write_file(path, p, n)); }

/* Why a header whose byte i was flipped is refused: fields before the header checksum that
 * decide how to read the rest, then the checksum, which covers everything else. */
static const char *header_flip_reason(size_t i) {
    return i < 8 ? "bad magic" : i < 12 ? "unsupported format version" : i < 16 ? "bad header size"
                                                                               : "header checksum mismatch";
}

/* Every byte of header, meta and payload flipped in turn, one at a time. */
static void flip_every_byte(kc_cache *c, ts_log *lc, kc_key k, const uint8_t *payload) {
    char *path = kc_entry_path(c, KC_CUBIN, k);
    char what[64];
    for (size_t i = 0; i < ENTRY_N; i++) {
        size_t len;
        uint8_t *raw = fresh_entry(c, k, payload, &len);
        raw[i] ^= i % 2 ? 0x80 : 0x01;
        write_raw(path, raw, len);
        free(raw);
        snprintf(what, sizeof what, "byte %zu flipped", i);
        const char *reason = i < 80 ? header_flip_reason(i)
                             : i < 80 + META_N ? "meta checksum mismatch" : "payload checksum mismatch";
        expect_corrupt_detected(c, lc, k, payload, reason, what);
    }
    free(path);
}

/* Rewrites the header checksum after a change, as a buggy writer with a valid checksum would. */
static void reseal(uint8_t *h) { wr64le(h + 72, XXH3_64bits(h, 72)); }

START_TEST(corruption_detected) {
    char *dir = ts_tmpdir();
    ts_log lc = {0};
    kc_cache c = {.dir = dir, .mode = KILN_CACHE_ON, .log = ts_log_line, .log_user = &lc};
    kc_key k = key_n(9);
    char *path = kc_entry_path(&c, KC_CUBIN, k);
    uint8_t payload[PAYLOAD_N];
    fill_payload(payload, sizeof payload, 9);
    size_t len;
    char what[64];

    flip_every_byte(&c, &lc, k, payload);

    /* Truncated at every length. */
    for (size_t cut = 0; cut < ENTRY_N; cut++) {
        uint8_t *raw = fresh_entry(&c, k, payload, &len);
        write_raw(path, raw, cut);
        free(raw);
        snprintf(what, sizeof what, "truncated to %zu", cut);
        expect_corrupt_detected(&c, &lc, k, payload, cut < 80 ? "truncated" : "follow the header", what);
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
        expect_corrupt_detected(&c, &lc, k, payload, "follow the header", "appended garbage");
    }

    /* Headers with a valid checksum but wrong fields. */
    struct {
        size_t      at;
        uint8_t     val;
        const char *reason;
    } sealed[] = {{16, 7, "unknown payload kind 7"}, {20, 1, "reserved header bytes not zero"},
                  {40, META_N + 1, "follow the header"}, {48, (uint8_t)(PAYLOAD_N - 1), "follow the header"}};
    for (size_t i = 0; i < sizeof sealed / sizeof sealed[0]; i++) {
        uint8_t *raw = fresh_entry(&c, k, payload, &len);
        raw[sealed[i].at] = sealed[i].val;
        reseal(raw);
        write_raw(path, raw, len);
        free(raw);
        snprintf(what, sizeof what, "sealed header byte %zu", sealed[i].at);
        expect_corrupt_detected(&c, &lc, k, payload, sealed[i].reason, what);
    }

    /* Another key's (valid) entry renamed to this key's path. */
    {
        kc_key other = key_n(10);
        TS_OK(kc_put(&c, KC_CUBIN, other, META, payload, PAYLOAD_N));
        char *opath = kc_entry_path(&c, KC_CUBIN, other);
        ck_assert_int_eq(rename(opath, path), 0);
        free(opath);
        expect_corrupt_detected(&c, &lc, k, payload, "key mismatch", "wrong key");
    }
    /* A program entry of this key renamed to its cubin path. */
    {
        TS_OK(kc_put(&c, KC_PROGRAM, k, META, payload, PAYLOAD_N));
        char *ppath = kc_entry_path(&c, KC_PROGRAM, k);
        ck_assert_int_eq(rename(ppath, path), 0);
        free(ppath);
        expect_corrupt_detected(&c, &lc, k, payload, "kind mismatch: a prog entry where a cubin belongs",
                                "wrong kind");
    }

    /* Arbitrary garbage of many lengths, including garbage behind a valid-looking start. */
    for (int i = 0; i < 300; i++) {
        size_t n = (size_t)(i * 7 % 400);
        uint8_t *g = malloc(n + 1);
        fill_payload(g, n, (uint64_t)i + 1000);
        if (i % 3 == 1 && n >= 16) memcpy(g, "KILNCACH\2\0\0\0\x50\0\0\0", 16);
        if (i % 3 == 2 && n >= 16) memcpy(g, "KILNCACH\1\0\0\0\1\0\0\0", 16);
        write_raw(path, g, n);
        free(g);
        snprintf(what, sizeof what, "garbage %d", i);
        expect_corrupt_detected(&c, &lc, k, payload, NULL, what);
    }

    free(path);
    ts_tmpdir_free(dir);
}
END_TEST

/* A version-1 entry (the format before kinds and meta) as kiln 0.1 wrote it. */
static size_t v1_entry(uint8_t *buf, kc_key k, const void *payload, size_t n) {
    memset(buf, 0, 64);
    memcpy(buf, "KILNCACH", 8);
    buf[8] = 1;
    buf[12] = 1;
    memcpy(buf + 16, k.b, 16);
    wr64le(buf + 32, n);
    wr64le(buf + 40, XXH3_64bits(payload, n));
    wr64le(buf + 48, XXH3_64bits(buf, 48));
    memcpy(buf + 64, payload, n);
    return 64 + n;
}

/* A version-3 entry as the rule version 2 sets for its successors: header size at 12, the
 * header's checksum in its last 8 bytes. */
static size_t v3_entry(uint8_t *buf, const void *payload, size_t n) {
    memset(buf, 0, 96);
    memcpy(buf, "KILNCACH", 8);
    buf[8] = 3;
    buf[12] = 96;
    wr64le(buf + 88, XXH3_64bits(buf, 88));
    memcpy(buf + 96, payload, n);
    return 96 + n;
}

typedef struct {
    int      n;
    uint32_t version[8];
    int      meta_null, corrupt_null;
} version_walk;

static int note_version(void *user, const kc_entry *e) {
    version_walk *w = user;
    if (w->n < 8) w->version[w->n] = e->version;
    w->n++;
    w->meta_null += e->meta == NULL;
    w->corrupt_null += e->corrupt == NULL;
    return 0;
}

/* Another kiln build may share the directory: its entries are misses, left alone, and
 * overwritten by our own put. */
START_TEST(other_format_version_is_a_miss) {
    char *dir = ts_tmpdir();
    ts_log lc = {0};
    kc_cache c = {.dir = dir, .mode = KILN_CACHE_ON, .log = ts_log_line, .log_user = &lc};
    kc_key k1 = key_n(21), k3 = key_n(23);
    uint8_t buf[200];
    TS_OK(kc_put(&c, KC_CUBIN, k1, NULL, "x", 1)); /* creates the directory */
    char *p1 = kc_entry_path(&c, KC_CUBIN, k1), *p3 = kc_entry_path(&c, KC_CUBIN, k3);
    size_t n1 = v1_entry(buf, k1, "old cubin", 9);
    write_raw(p1, buf, n1);
    char *slash = strrchr(p3, '/');
    *slash = 0;
    TS_OK(kb_mkdirs(p3));
    *slash = '/';
    size_t n3 = v3_entry(buf, "future", 6);
    write_raw(p3, buf, n3);

    expect_miss(&c, k1, 0);
    expect_miss(&c, k3, 0);
    ck_assert_int_eq(lc.lines, 0);
    ck_assert_int_eq(file_size(p1), (long)n1);
    ck_assert_int_eq(file_size(p3), (long)n3);

    /* kc_walk sees them as entries of other versions: neither meta nor corrupt. */
    version_walk w = {0};
    TS_OK(kc_walk(&c, true, note_version, &w));
    ck_assert_int_eq(w.n, 2);
    ck_assert_int_eq(w.meta_null, 2);
    ck_assert_int_eq(w.corrupt_null, 2);
    uint32_t a = w.version[0], b = w.version[1];
    ck_assert((a == 1 && b == 3) || (a == 3 && b == 1));

    /* Our put replaces them. */
    TS_OK(kc_put(&c, KC_CUBIN, k1, "new", "new cubin", 9));
    expect_hit(&c, k1, "new cubin", 9);
    ck_assert_int_eq(lc.lines, 0);
    free(p1);
    free(p3);
    ts_tmpdir_free(dir);
}
END_TEST

START_TEST(corruption_readonly_keeps_file) {
    char *dir = ts_tmpdir();
    ts_log lc = {0};
    kc_cache c = {.dir = dir, .mode = KILN_CACHE_ON, .log = ts_log_line, .log_user = &lc};
    kc_cache ro = c;
    ro.mode = KILN_CACHE_READONLY;
    kc_key k = key_n(11);
    uint8_t payload[PAYLOAD_N];
    fill_payload(payload, sizeof payload, 11);
    size_t len;
    uint8_t *raw = fresh_entry(&c, k, payload, &len);
    raw[ENTRY_N - 10] ^= 0xff;
    char *path = kc_entry_path(&c, KC_CUBIN, k);
    write_raw(path, raw, len);
    free(raw);

    int corrupt = 0;
    void *data = NULL;
    size_t size = 0;
    TS_OK(kc_get(&ro, KC_CUBIN, k, &data, &size, &corrupt));
    ck_assert_ptr_null(data);
    ck_assert_int_eq(corrupt, 1);
    ck_assert_int_eq(lc.lines, 1);
    ck_assert_msg(strstr(lc.last, path) && strstr(lc.last, "is corrupt (payload checksum mismatch)") &&
                      strstr(lc.last, "not removed"),
                  "log: %s", lc.last);
    ck_assert(file_exists(path));
    ck_assert_int_eq(file_size(path), (long)len);
    /* corrupt may be NULL. */
    TS_OK(kc_get(&ro, KC_CUBIN, k, &data, &size, NULL));
    ck_assert_ptr_null(data);
    ck_assert_int_eq(lc.lines, 2);
    free(path);
    ts_tmpdir_free(dir);
}
END_TEST

/* What fn(user) writes to stderr (fd 2 redirected to a file in dir meanwhile). */
static char *stderr_of(void (*fn)(void *), void *user, const char *dir) {
    kb_str b = {0};
    kb_str_addf(&b, "%s/stderr.txt", dir);
    char *errpath = kb_str_take(&b);
    fflush(stderr);
    int saved = dup(2);
    int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    fn(user);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char *text = ts_read_file(errpath, NULL);
    free(errpath);
    return text;
}

/* kc_get's call and results, for stderr_of. */
typedef struct {
    kc_cache   *c;
    kc_key      k;
    void       *data;
    size_t      size;
    int         corrupt;
    kiln_status st;
} get_call;

static void get_once(void *user) {
    get_call *g = user;
    g->st = kc_get(g->c, KC_CUBIN, g->k, &g->data, &g->size, &g->corrupt);
}

/* With no log callback the line goes to stderr. */
START_TEST(corruption_logs_to_stderr) {
    char *dir = ts_tmpdir();
    kc_cache c = {.dir = dir, .mode = KILN_CACHE_ON};
    kc_key k = key_n(12);
    char *path = kc_entry_path(&c, KC_CUBIN, k);
    TS_OK(kc_put(&c, KC_CUBIN, k, NULL, "abcdef", 6));
    write_raw(path, "KILNCACH", 8);

    get_call g = {.c = &c, .k = k};
    char    *text = stderr_of(get_once, &g, dir);
    size_t   len = strlen(text);
    TS_OK(g.st);
    ck_assert_ptr_null(g.data);
    ck_assert_int_eq(g.corrupt, 1);
    ck_assert_msg(strstr(text, "kiln: cache entry ") && strstr(text, path) && strstr(text, "truncated"),
                  "stderr: %s", text);
    ck_assert_msg(len > 0 && text[len - 1] == '\n' && strchr(text, '\n') == text + len - 1, "one line: %s", text);
    ck_assert(!file_exists(path));
    free(text);
    free(path);
    ts_tmpdir_free(dir);
}
END_TEST

/* ---- errors --------------------------------------------------------------------------------- */

START_TEST(io_errors_name_the_path) {
    char *dir = ts_tmpdir();
    kb_str b = {0};
    ts_log lc = {0};

    /* The cache root is a regular file: it holds no entries (a miss), and writing it fails with a
     * warning naming it, once, not with an error. */
    kb_str_addf(&b, "%s/notadir", dir);
    char *file = kb_str_take(&b);
    write_raw(file, "x", 1);
    kc_cache c = {.dir = file, .mode = KILN_CACHE_ON, .log = ts_log_line, .log_user = &lc};
    TS_OK(kc_put(&c, KC_CUBIN, key_n(1), NULL, "abc", 3));
    ck_assert_int_eq(lc.lines, 1);
    ck_assert_msg(strstr(lc.last, file) && strstr(lc.last, strerror(ENOTDIR)), "log: %s", lc.last);
    ck_assert_int_eq(c.write_errno, ENOTDIR);
    TS_OK(kc_put(&c, KC_PROGRAM, key_n(2), NULL, "abc", 3));
    ck_assert_int_eq(lc.lines, 1);
    void *data = (void *)1;
    size_t size = 0;
    TS_OK(kc_get(&c, KC_CUBIN, key_n(1), &data, &size, NULL));
    ck_assert_ptr_null(data);

    /* The entry path is a directory: get reports it; put warns (rename fails) and leaves no
     * temporary file. */
    ts_log ld = {0};
    kc_cache d = {.dir = dir, .mode = KILN_CACHE_ON, .log = ts_log_line, .log_user = &ld};
    char *path = kc_entry_path(&d, KC_CUBIN, key_n(2));
    TS_OK(kb_mkdirs(path));
    kiln_status st = kc_get(&d, KC_CUBIN, key_n(2), &data, &size, NULL);
    ck_assert(st != NULL);
    ck_assert_msg(strstr(kiln_status_msg(st), path) != NULL, "msg: %s", kiln_status_msg(st));
    kiln_status_free(st);
    TS_OK(kc_put(&d, KC_CUBIN, key_n(2), NULL, "abc", 3));
    ck_assert_int_eq(ld.lines, 1);
    ck_assert_msg(strstr(ld.last, dir) && strstr(ld.last, strerror(d.write_errno)), "log: %s", ld.last);
    int cubins, tmps;
    count_entries(dir, &cubins, &tmps);
    ck_assert_int_eq(tmps, 0);

    /* A cache without a directory, and NULL arguments, are rejected, not crashed on. */
    kc_cache none = {.dir = NULL, .mode = KILN_CACHE_ON};
    ck_assert_ptr_null(kc_entry_path(&none, KC_CUBIN, key_n(1)));
    st = kc_put(&none, KC_CUBIN, key_n(1), NULL, "a", 1);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_INVALID);
    kiln_status_free(st);
    st = kc_get(&d, KC_CUBIN, key_n(1), NULL, &size, NULL);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_INVALID);
    kiln_status_free(st);

    free(path);
    free(file);
    ts_tmpdir_free(dir);
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
    ts_log lc = {0};
    kc_cache c = {.dir = longdir, .mode = KILN_CACHE_ON, .log = ts_log_line, .log_user = &lc};
    char *path = kc_entry_path(&c, KC_CUBIN, key_n(1));
    ck_assert_uint_eq(strlen(path), strlen(longdir) + strlen("/kernels/xx/") + 32 + strlen(".cubin"));
    free(path);
    /* Too long for the file system: a write failure (warned), not an error, not a crash. */
    TS_OK(kc_put(&c, KC_CUBIN, key_n(1), NULL, "abc", 3));
    ck_assert_int_eq(lc.lines, 1);
    ck_assert_int_ne(c.write_errno, 0);
    void *data = NULL;
    size_t size;
    kiln_status st = kc_get(&c, KC_CUBIN, key_n(1), &data, &size, NULL);
    ck_assert(st != NULL || data == NULL);
    kiln_status_free(st);
    free(longdir);
    ts_tmpdir_free(dir);
}
END_TEST

/* ---- writes that fail ------------------------------------------------------------------------ */

static const int write_errnos[] = {ENOSPC, EROFS, EACCES, EDQUOT};
enum { NWRITE_ERRNOS = sizeof write_errnos / sizeof *write_errnos };

/* Counts the .tmp.* files under dir/kernels/xx/ and dir/programs/xx/. */
static int count_tmp(const char *dir) {
    int n = 0;
    for (int k = 0; k < 2; k++) {
        kb_str b = {0};
        kb_str_addf(&b, "%s/%s", dir, k ? "programs" : "kernels");
        char *top = kb_str_take(&b);
        DIR *d = opendir(top);
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.') continue;
            kb_str_addf(&b, "%s/%s", top, e->d_name);
            char *sub = kb_str_take(&b);
            DIR *s = opendir(sub);
            struct dirent *f;
            while (s && (f = readdir(s)) != NULL) n += strncmp(f->d_name, ".tmp.", 5) == 0;
            if (s) closedir(s);
            free(sub);
        }
        if (d) closedir(d);
        free(top);
    }
    return n;
}

/* Every write step failing with every errno of a full disk or a read-only directory: kc_put
 * succeeds without storing, removes its half-written temporary file, warns once naming the
 * directory and the reason, and stores nothing more through that cache (no retry per entry);
 * entries already there still hit; a new kc_cache (the next compile) tries again. */
START_TEST(write_failures_warn_once) {
    for (int step = 0; step < KC_NSTEPS; step++)
        for (int e = 0; e < NWRITE_ERRNOS; e++) {
            int err = write_errnos[e];
            char *dir = ts_tmpdir();
            kc_cache first = {.dir = dir, .mode = KILN_CACHE_ON};
            TS_OK(kc_put(&first, KC_CUBIN, key_n(1), NULL, "old", 3));
            TS_OK(kc_put(&first, KC_PROGRAM, key_n(1), NULL, "plan", 4));

            kc_test_fail_writes((kc_write_step)step, err);
            ts_log lc = {0};
            kc_cache c = {.dir = dir, .mode = KILN_CACHE_ON, .log = ts_log_line, .log_user = &lc};
            kc_kind kind = step % 2 ? KC_PROGRAM : KC_CUBIN;
            TS_OK(kc_put(&c, kind, key_n(2), "meta", "new entry", 9));
            ck_assert_msg(lc.lines == 1, "step %d, %s: %d lines", step, strerror(err), lc.lines);
            kb_str b = {0};
            kb_str_addf(&b, "kiln: warning: cannot write the cache %s (%s); continuing without it", dir, strerror(err));
            char *want = kb_str_take(&b);
            ck_assert_str_eq(lc.last, want);
            free(want);
            ck_assert_int_eq(c.write_errno, err);
            expect_miss_kind(&c, kind, key_n(2), 0);
            ck_assert_int_eq(count_tmp(dir), 0);
            expect_hit_kind(&c, KC_CUBIN, key_n(1), "old", 3); /* reads still work */
            expect_hit_kind(&c, KC_PROGRAM, key_n(1), "plan", 4);

            /* Writing is off for the rest of c's life, even once the file system would take it. */
            kc_test_fail_writes(KC_STEP_MKDIR, 0);
            TS_OK(kc_put(&c, KC_CUBIN, key_n(3), NULL, "later", 5));
            expect_miss(&c, key_n(3), 0);
            ck_assert_int_eq(lc.lines, 1);
            kc_cache next = {.dir = dir, .mode = KILN_CACHE_ON, .log = ts_log_line, .log_user = &lc};
            TS_OK(kc_put(&next, KC_CUBIN, key_n(3), NULL, "later", 5));
            expect_hit(&next, key_n(3), "later", 5);
            ck_assert_int_eq(lc.lines, 1);
            ts_tmpdir_free(dir);
        }
}
END_TEST

typedef struct {
    kc_cache   *c;
    int         first;
    _Atomic int lines;
} race;

static void count_line(void *user, const char *line) {
    (void)line;
    atomic_fetch_add(&((race *)user)->lines, 1);
}

static void *put_many(void *user) {
    race *r = user;
    for (int i = 0; i < 20; i++) {
        kiln_status st = kc_put(r->c, KC_CUBIN, key_n(r->first + i), NULL, "x", 1);
        kiln_status_free(st);
    }
    return NULL;
}

/* Writers on several threads failing at once (a compile's thread pool): one warning. */
START_TEST(write_failure_warns_once_across_threads) {
    char *dir = ts_tmpdir();
    race r[8] = {{0}};
    kc_cache c = {.dir = dir, .mode = KILN_CACHE_ON, .log = count_line, .log_user = &r[0]};
    kc_test_fail_writes(KC_STEP_WRITE, ENOSPC);
    pthread_t th[8];
    for (int i = 0; i < 8; i++) {
        r[i].c = &c;
        r[i].first = 1000 + 20 * i;
        ck_assert_int_eq(pthread_create(&th[i], NULL, put_many, &r[i]), 0);
    }
    for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
    kc_test_fail_writes(KC_STEP_WRITE, 0);
    ck_assert_int_eq(atomic_load(&r[0].lines), 1);
    ck_assert_int_eq(c.write_errno, ENOSPC);
    ck_assert_int_eq(count_tmp(dir), 0);
    ts_tmpdir_free(dir);
}
END_TEST

static void put_twice_on_two_caches(void *user) {
    char *root = user;
    for (int i = 0; i < 2; i++) {
        kc_cache c = {.dir = root, .mode = KILN_CACHE_ON}; /* no log: stderr */
        TS_OK(kc_put(&c, KC_CUBIN, key_n(1), NULL, "a", 1));
        TS_OK(kc_put(&c, KC_CUBIN, key_n(2), NULL, "b", 1));
        ck_assert_int_eq(c.write_errno, EROFS);
    }
}

/* Without a log callback the warning goes to stderr once per process for each directory and
 * reason, however many caches (compiles) hit it: kiln bench compiles dozens of programs. */
START_TEST(write_failure_on_stderr_once_per_process) {
    char *dir = ts_tmpdir();
    kb_str b = {0};
    kb_str_addf(&b, "%s/cache", dir);
    char *root = kb_str_take(&b);
    kc_test_fail_writes(KC_STEP_RENAME, EROFS);
    char *text = stderr_of(put_twice_on_two_caches, root, dir);
    kc_test_fail_writes(KC_STEP_RENAME, 0);
    kb_str_addf(&b, "kiln: warning: cannot write the cache %s (%s); continuing without it\n", root, strerror(EROFS));
    char *want = kb_str_take(&b);
    ck_assert_str_eq(text, want);
    free(want);
    free(text);
    free(root);
    ts_tmpdir_free(dir);
}
END_TEST

START_TEST(stale_temp_files_swept) {
    char *dir = ts_tmpdir();
    kc_cache c = {.dir = dir, .mode = KILN_CACHE_ON};
    kc_key k = key_n(3);
    TS_OK(kc_put(&c, KC_CUBIN, k, NULL, "a", 1));
    char *path = kc_entry_path(&c, KC_CUBIN, k);
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
    TS_OK(kc_put(&c, KC_CUBIN, k, NULL, "b", 1));
    ck_assert(!file_exists(old));
    ck_assert(file_exists(young)); /* might belong to a writer still running */
    expect_hit(&c, k, "b", 1);
    free(old);
    free(young);
    free(path);
    ts_tmpdir_free(dir);
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
        kiln_status st = kc_put(&c, KC_CUBIN, shared, NULL, buf, n);
        if (st) return 10;
        uint8_t own[64];
        fill_payload(own, sizeof own, (uint64_t)(w * 100 + r));
        st = kc_put(&c, KC_CUBIN, own_key(w, r), NULL, own, sizeof own);
        if (st) return 11;
        void *data = NULL;
        size_t size = 0;
        int corrupt = 0;
        st = kc_get(&c, KC_CUBIN, shared, &data, &size, &corrupt);
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
    ts_log lc = {0};
    kc_cache c = {.dir = dir, .mode = KILN_CACHE_ON, .log = ts_log_line, .log_user = &lc};
    void *data = NULL;
    size_t size = 0;
    int corrupt = 0;
    TS_OK(kc_get(&c, KC_CUBIN, key_n(999), &data, &size, &corrupt));
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
    ts_tmpdir_free(dir);
}
END_TEST

/* ---- walking, eviction, clearing ------------------------------------------------------------ */

typedef struct {
    int      n, stop_after;
    kc_kind  kind[32];
    char     hex[32][33];
    char     meta[32][64];
    char     corrupt[32][96];
    uint64_t bytes[32];
} walk_log;

static int record(void *user, const kc_entry *e) {
    walk_log *w = user;
    ck_assert_int_lt(w->n, 32);
    w->kind[w->n] = e->kind;
    snprintf(w->hex[w->n], 33, "%s", e->key_hex);
    snprintf(w->meta[w->n], 64, "%s", e->meta ? e->meta : "(null)");
    snprintf(w->corrupt[w->n], 96, "%s", e->corrupt ? e->corrupt : "(null)");
    w->bytes[w->n] = e->bytes;
    char hex[33];
    kc_key_hex(e->key, hex);
    ck_assert_str_eq(hex, e->key_hex);
    ck_assert_int_eq(file_size(e->path), (long)e->bytes);
    ck_assert_int_eq(mtime_of(e->path), e->mtime_ns);
    w->n++;
    return w->stop_after && w->n == w->stop_after;
}

/* Writes name in the two-digit directory of (kind, k): files that are not entries. */
static char *beside(const kc_cache *c, kc_kind kind, kc_key k, const char *name) {
    char *path = kc_entry_path(c, kind, k);
    kb_str b = {0};
    kb_str_addn(&b, path, (size_t)(strrchr(path, '/') - path + 1));
    kb_str_add(&b, name);
    free(path);
    char *p = kb_str_take(&b);
    write_raw(p, "junk", 4);
    return p;
}

START_TEST(walk_lists_entries_in_order) {
    char *dir = ts_tmpdir();
    kc_cache c = {.dir = dir, .mode = KILN_CACHE_ON};
    walk_log w = {0};
    TS_OK(kc_walk(&c, true, record, &w)); /* no directory yet: no entries */
    ck_assert_int_eq(w.n, 0);
    /* Programs first in put order, then kernels: the walk sorts by kind, then key. */
    for (int i = 0; i < 5; i++) {
        char meta[32];
        snprintf(meta, sizeof meta, "program %d\nmore", i);
        TS_OK(kc_put(&c, KC_PROGRAM, key_n(100 + i), meta, "p", 1));
    }
    for (int i = 0; i < 6; i++) {
        char meta[32];
        snprintf(meta, sizeof meta, "kernel %d", i);
        TS_OK(kc_put(&c, KC_CUBIN, key_n(200 + i), meta, "kk", 2));
    }
    free(beside(&c, KC_CUBIN, key_n(200), ".tmp.1.x"));
    free(beside(&c, KC_CUBIN, key_n(200), "notes.txt"));
    free(beside(&c, KC_PROGRAM, key_n(100), "0123.prog"));
    /* A corrupt entry is listed with why, and walking leaves it in place. */
    char *bad = kc_entry_path(&c, KC_CUBIN, key_n(203));
    write_raw(bad, "KILNCACH", 8);

    TS_OK(kc_walk(&c, false, record, &w));
    ck_assert_int_eq(w.n, 11);
    for (int i = 0; i < 11; i++) {
        ck_assert_int_eq(w.kind[i], i < 6 ? KC_CUBIN : KC_PROGRAM);
        ck_assert_str_eq(w.meta[i], "(null)");
        ck_assert_str_eq(w.corrupt[i], "(null)");
        if (i && w.kind[i] == w.kind[i - 1]) ck_assert_msg(strcmp(w.hex[i - 1], w.hex[i]) < 0, "order at %d", i);
    }
    walk_log m = {0};
    TS_OK(kc_walk(&c, true, record, &m));
    ck_assert_int_eq(m.n, 11);
    int bad_seen = 0;
    for (int i = 0; i < 11; i++) {
        ck_assert_str_eq(m.hex[i], w.hex[i]);
        char want_hex[33];
        kc_key_hex(key_n(203), want_hex);
        if (!strcmp(m.hex[i], want_hex) && m.kind[i] == KC_CUBIN) {
            bad_seen++;
            ck_assert_str_eq(m.meta[i], "(null)");
            ck_assert_msg(strstr(m.corrupt[i], "truncated"), "%s", m.corrupt[i]);
            ck_assert_uint_eq(m.bytes[i], 8);
        } else {
            ck_assert_str_eq(m.corrupt[i], "(null)");
            ck_assert_msg(!strncmp(m.meta[i], m.kind[i] == KC_CUBIN ? "kernel " : "program ", 7), "%s", m.meta[i]);
        }
    }
    ck_assert_int_eq(bad_seen, 1);
    ck_assert(file_exists(bad));
    /* fn returning nonzero stops the walk. */
    walk_log s = {.stop_after = 3};
    TS_OK(kc_walk(&c, true, record, &s));
    ck_assert_int_eq(s.n, 3);
    free(bad);
    ts_tmpdir_free(dir);
}
END_TEST

enum { EV_N = 10, EV_PAYLOAD = 1000 };

/* Ten entries of equal size (alternating kinds), entry i last used at t0 + 10 * (i % 5) + i / 5
 * (so kind and key do not follow age). Returns one entry's size. */
static uint64_t fill_for_eviction(kc_cache *c, time_t t0, char *paths[EV_N]) {
    uint8_t payload[EV_PAYLOAD];
    fill_payload(payload, sizeof payload, 5);
    for (int i = 0; i < EV_N; i++) {
        kc_kind kind = i % 2 ? KC_PROGRAM : KC_CUBIN;
        TS_OK(kc_put(c, kind, key_n(300 + i), "meta", payload, sizeof payload));
        paths[i] = kc_entry_path(c, kind, key_n(300 + i));
        set_mtime(paths[i], t0 + 10 * (i % 5) + i / 5);
    }
    return (uint64_t)file_size(paths[0]);
}

START_TEST(evict_removes_least_recently_used) {
    char *dir = ts_tmpdir();
    kc_cache c = {.dir = dir, .mode = KILN_CACHE_ON};
    char *paths[EV_N];
    time_t t0 = time(NULL) - 100000;
    uint64_t one = fill_for_eviction(&c, t0, paths);
    int removed = -1;
    uint64_t total = 0;

    /* Under the limit, or no limit: nothing goes. */
    TS_OK(kc_evict(&c, 0, &removed, &total));
    ck_assert_int_eq(removed, 0);
    ck_assert_uint_eq(total, EV_N * one);
    TS_OK(kc_evict(&c, EV_N * one, &removed, &total));
    ck_assert_int_eq(removed, 0);

    /* A hit makes entry 0 (the oldest) the newest, and young. */
    void *data = NULL;
    size_t size = 0;
    TS_OK(kc_get(&c, KC_CUBIN, key_n(300), &data, &size, NULL));
    ck_assert_ptr_nonnull(data);
    free(data);
    char *old_tmp = beside(&c, KC_CUBIN, key_n(300), ".tmp.42.old");
    char *new_tmp = beside(&c, KC_CUBIN, key_n(300), ".tmp.42.new");
    set_mtime(old_tmp, time(NULL) - 2 * 3600);

    /* Room for six: the four least recently used go (5, 1, 6, 2 by age), whatever their kind
     * or key. Stale temporary files go too. */
    TS_OK(kc_evict(&c, 6 * one + one / 2, &removed, &total));
    ck_assert_int_eq(removed, 4);
    ck_assert_uint_eq(total, 6 * one);
    int gone[] = {5, 1, 6, 2};
    for (int i = 0; i < EV_N; i++) {
        bool want_gone = false;
        for (int j = 0; j < 4; j++) want_gone |= gone[j] == i;
        ck_assert_msg(file_exists(paths[i]) == !want_gone, "entry %d", i);
    }
    ck_assert(!file_exists(old_tmp));
    ck_assert(file_exists(new_tmp));

    /* Room for one: every old entry goes; entry 0, used a moment ago, is spared... */
    TS_OK(kc_evict(&c, one, &removed, &total));
    ck_assert_int_eq(removed, 5);
    ck_assert_uint_eq(total, one);
    ck_assert(file_exists(paths[0]));
    /* ...unless the limit cannot be met otherwise. */
    TS_OK(kc_evict(&c, one - 1, &removed, &total));
    ck_assert_int_eq(removed, 1);
    ck_assert_uint_eq(total, 0);
    ck_assert(!file_exists(paths[0]));
    TS_OK(kc_evict(&c, 1, NULL, NULL)); /* outputs may be NULL */

    for (int i = 0; i < EV_N; i++) free(paths[i]);
    free(old_tmp);
    free(new_tmp);
    ts_tmpdir_free(dir);
}
END_TEST

START_TEST(clear_removes_everything) {
    char *dir = ts_tmpdir();
    kc_cache c = {.dir = dir, .mode = KILN_CACHE_ON};
    int removed = -1;
    TS_OK(kc_clear(&c, &removed)); /* nothing there yet */
    ck_assert_int_eq(removed, 0);
    char *paths[EV_N];
    fill_for_eviction(&c, time(NULL), paths);
    char *tmp = beside(&c, KC_PROGRAM, key_n(301), ".tmp.7.abc");
    char *other = beside(&c, KC_CUBIN, key_n(300), "keep.me");
    /* A file's mtime may run ahead of time(): the kernel stamps with a finer clock. Age 0
     * still counts it. */
    set_mtime(tmp, time(NULL) + 5);
    int ntmp = 0;
    uint64_t tmp_bytes = 0;
    TS_OK(kc_tmp_files(&c, 0, false, &ntmp, &tmp_bytes));
    ck_assert_int_eq(ntmp, 1);
    ck_assert_uint_eq(tmp_bytes, 4);
    TS_OK(kc_tmp_files(&c, KC_STALE_TMP_S, true, &ntmp, NULL)); /* young: neither counted nor removed */
    ck_assert_int_eq(ntmp, 0);
    ck_assert(file_exists(tmp));

    TS_OK(kc_clear(&c, &removed));
    ck_assert_int_eq(removed, EV_N);
    for (int i = 0; i < EV_N; i++) ck_assert(!file_exists(paths[i]));
    ck_assert(!file_exists(tmp));
    ck_assert(file_exists(other)); /* not the cache's */
    walk_log w = {0};
    TS_OK(kc_walk(&c, true, record, &w));
    ck_assert_int_eq(w.n, 0);
    /* Empty two-digit directories are gone; putting again recreates them. */
    char *sub = kc_entry_path(&c, KC_PROGRAM, key_n(301));
    *strrchr(sub, '/') = 0;
    ck_assert(!file_exists(sub));
    TS_OK(kc_put(&c, KC_PROGRAM, key_n(301), NULL, "again", 5));
    expect_hit_kind(&c, KC_PROGRAM, key_n(301), "again", 5);

    /* A cache root that is a file: errors name the path. */
    kb_str b = {0};
    kb_str_addf(&b, "%s/file", dir);
    char *file = kb_str_take(&b);
    write_raw(file, "x", 1);
    kc_cache f = {.dir = file, .mode = KILN_CACHE_ON};
    kiln_status st = kc_clear(&f, NULL);
    ck_assert_msg(st && strstr(kiln_status_msg(st), file), "%s", kiln_status_msg(st));
    kiln_status_free(st);
    st = kc_walk(&f, false, record, &w);
    ck_assert_msg(st && strstr(kiln_status_msg(st), file), "%s", kiln_status_msg(st));
    kiln_status_free(st);

    for (int i = 0; i < EV_N; i++) free(paths[i]);
    free(file);
    free(sub);
    free(tmp);
    free(other);
    ts_tmpdir_free(dir);
}
END_TEST

/* ---- settings ------------------------------------------------------------------------------- */

START_TEST(sizes_and_limits) {
    struct {
        const char *text;
        uint64_t    bytes;
    } ok[] = {{"0", 0},
              {"12345", 12345},
              {"100k", 100 << 10},
              {"100K", 100 << 10},
              {"100KiB", 100 << 10},
              {"512M", 512ull << 20},
              {"512mb", 512ull << 20},
              {"2G", 2ull << 30},
              {"2GiB", 2ull << 30},
              {"2gib", 2ull << 30},
              {"3T", 3ull << 40},
              {"7B", 7},
              {"18446744073709551615", UINT64_MAX}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        uint64_t v = 1;
        TS_OK(kc_parse_size(ok[i].text, &v));
        ck_assert_msg(v == ok[i].bytes, "%s: %llu", ok[i].text, (unsigned long long)v);
    }
    const char *bad[] = {"", "G", "-1", "1.5G", "2 G", "2X", "2GiBs", "2iB", " 2", "18446744073709551616",
                         "17179869184G"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v = 1;
        kiln_status st = kc_parse_size(bad[i], &v);
        ck_assert_msg(st != NULL, "'%s' accepted", bad[i]);
        char want[64];
        snprintf(want, sizeof want, "'%s'", bad[i]);
        ck_assert_msg(strstr(kiln_status_msg(st), want), "%s", kiln_status_msg(st));
        kiln_status_free(st);
    }

    uint64_t max = 0;
    unsetenv("KILN_CACHE_MAX");
    TS_OK(kc_max_bytes(&max));
    ck_assert_uint_eq(max, 1ull << 31);
    setenv("KILN_CACHE_MAX", "", 1);
    TS_OK(kc_max_bytes(&max));
    ck_assert_uint_eq(max, 1ull << 31);
    setenv("KILN_CACHE_MAX", "64M", 1);
    TS_OK(kc_max_bytes(&max));
    ck_assert_uint_eq(max, 64ull << 20);
    setenv("KILN_CACHE_MAX", "lots", 1);
    kiln_status st = kc_max_bytes(&max);
    ck_assert_msg(st && strstr(kiln_status_msg(st), "KILN_CACHE_MAX") && strstr(kiln_status_msg(st), "'lots'"),
                  "%s", kiln_status_msg(st));
    kiln_status_free(st);
    unsetenv("KILN_CACHE_MAX");
}
END_TEST

START_TEST(modes_from_text_and_env) {
    const char *names[] = {"on", "off", "readonly", "refresh"};
    kiln_cache_mode want[] = {KILN_CACHE_ON, KILN_CACHE_OFF, KILN_CACHE_READONLY, KILN_CACHE_REFRESH};
    for (int i = 0; i < 4; i++) {
        kiln_cache_mode m = (kiln_cache_mode)99;
        TS_OK(kc_parse_mode(names[i], &m));
        ck_assert_int_eq(m, want[i]);
        setenv("KILN_CACHE", names[i], 1);
        TS_OK(kc_env_mode(KILN_CACHE_ON, &m));
        ck_assert_int_eq(m, want[i]);
    }
    kiln_cache_mode m;
    kiln_status st = kc_parse_mode("ON", &m);
    ck_assert_msg(st && strstr(kiln_status_msg(st), "'ON'") && strstr(kiln_status_msg(st), "readonly"), "%s",
                  kiln_status_msg(st));
    kiln_status_free(st);
    setenv("KILN_CACHE", "sometimes", 1);
    st = kc_env_mode(KILN_CACHE_ON, &m);
    ck_assert_msg(st && strstr(kiln_status_msg(st), "KILN_CACHE") && strstr(kiln_status_msg(st), "'sometimes'") &&
                      strstr(kiln_status_msg(st), "on, off, readonly or refresh"),
                  "%s", kiln_status_msg(st));
    kiln_status_free(st);
    setenv("KILN_CACHE", "", 1);
    TS_OK(kc_env_mode(KILN_CACHE_READONLY, &m));
    ck_assert_int_eq(m, KILN_CACHE_READONLY);
    unsetenv("KILN_CACHE");
    TS_OK(kc_env_mode(KILN_CACHE_OFF, &m));
    ck_assert_int_eq(m, KILN_CACHE_OFF);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("cache",
                        TS_CASE("key", 0),
                        TS_TESTS(key_deterministic, key_matches_documented_format, key_sensitivity, key_hex_format),
                        TS_CASE("store", 60),
                        TS_TESTS(put_get_roundtrip, miss_on_absent, modes, corruption_detected,
                                 other_format_version_is_a_miss, corruption_readonly_keeps_file,
                                 corruption_logs_to_stderr, io_errors_name_the_path, long_paths,
                                 write_failures_warn_once, write_failure_warns_once_across_threads,
                                 write_failure_on_stderr_once_per_process, stale_temp_files_swept,
                                 default_dir_resolution, concurrent_writers),
                        TS_CASE("admin", 0),
                        TS_TESTS(walk_lists_entries_in_order, evict_removes_least_recently_used,
                                 clear_removes_everything, sizes_and_limits, modes_from_text_and_env));
    return ts_main(s);
}
