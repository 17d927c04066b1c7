/* Tests of the GGUF reader and writer (model/gguf.c, model/gguf_write.c, docs/gguf.md): round
 * trips of every value type and of tensors of every kiln type with 1-4 dims, byte-exact and
 * deterministic writing, the fill callback in chunks, writer errors, and malformed files, each
 * refused with an error naming the field and its offset: hand-built bad headers, key-value
 * pairs, tensor infos and data sections, a valid file truncated at every byte, and every byte
 * of it flipped (never a crash: run it under `make test-asan` too). CPU only. */
#include "tests/support.h"

#include "base/base.h"

#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* "héllo ✓ 日本" */
static const char *uni = "h\xc3\xa9llo \xe2\x9c\x93 \xe6\x97\xa5\xe6\x9c\xac";

/* ---- helpers -------------------------------------------------------------------------------- */

static char *path_in(const char *dir, const char *name) {
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    ck_assert_ptr_nonnull(p);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int            n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Deterministic bytes. */
static void fill_bytes(void *p, size_t n, uint32_t seed) {
    uint8_t *b = p;
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        b[i] = (uint8_t)(x >> 24);
    }
}

/* Expects a status with code and a message containing want (NULL: any); frees it. */
static void expect_err(kiln_status st, kiln_code code, const char *want, const char *what) {
    ck_assert_msg(st != NULL, "%s: succeeded", what);
    ck_assert_msg(kiln_status_code(st) == code, "%s: code %s, want %s: %s", what, kiln_code_name(kiln_status_code(st)),
                  kiln_code_name(code), kiln_status_msg(st));
    ck_assert_msg(!want || strstr(kiln_status_msg(st), want), "%s: message '%s' lacks '%s'", what,
                  kiln_status_msg(st), want);
    kiln_status_free(st);
}

/* ---- a byte builder for hand-made files ------------------------------------------------------- */

static void put_u8(kb_str *b, uint8_t v) { kb_str_addn(b, (const char *)&v, 1); }

static void put_zeros(kb_str *b, size_t n) {
    while (n--) put_u8(b, 0);
}

static void put_pad(kb_str *b, size_t align) { put_zeros(b, (align - b->len % align) % align); }

static kb_str hdr(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    kb_str b = {0};
    kb_str_addn(&b, "GGUF", 4);
    kb_put_u32(&b, version);
    kb_put_u64(&b, n_tensors);
    kb_put_u64(&b, n_kv);
    return b;
}

/* A key and its type; returns the offset of the type field. */
static size_t put_key(kb_str *b, const char *key, uint32_t type) {
    kb_put_cstr(b, key);
    size_t at = b->len;
    kb_put_u32(b, type);
    return at;
}

typedef struct {
    size_t name, n_dims, ne, type, offset; /* file offsets of the fields */
} tpos;

static tpos put_tensor(kb_str *b, const char *name, uint32_t n_dims, const int64_t *ne, uint32_t type, uint64_t off) {
    tpos p = {.name = b->len};
    kb_put_cstr(b, name);
    p.n_dims = b->len;
    kb_put_u32(b, n_dims);
    p.ne = b->len;
    for (uint32_t j = 0; j < n_dims; j++) kb_put_u64(b, (uint64_t)ne[j]);
    p.type = b->len;
    kb_put_u32(b, type);
    p.offset = b->len;
    kb_put_u64(b, off);
    return p;
}

/* Opening b must fail with KILN_ERR_FORMAT, a message naming the label, want and "at offset at". */
static void expect_bad(kb_str *b, const char *want, size_t at, const char *what) {
    ck_assert(!b->oom);
    kiln_gguf  *g = (kiln_gguf *)1;
    kiln_status st = kiln_gguf_open_memory(b->s, b->len, "bad.gguf", &g);
    ck_assert_msg(st != NULL, "%s: opened", what);
    ck_assert_ptr_null(g);
    char off[64];
    snprintf(off, sizeof off, "at offset %zu: ", at);
    const char *m = kiln_status_msg(st);
    ck_assert_msg(kiln_status_code(st) == KILN_ERR_FORMAT, "%s: %s: %s", what, kiln_code_name(kiln_status_code(st)), m);
    ck_assert_msg(!strncmp(m, "bad.gguf: ", 10), "%s: no label: %s", what, m);
    ck_assert_msg(strstr(m, want), "%s: '%s' lacks '%s'", what, m, want);
    ck_assert_msg(strstr(m, off), "%s: '%s' lacks '%s'", what, m, off);
    kiln_status_free(st);
    kb_str_free(b);
}

static kiln_gguf *open_ok(kb_str *b) {
    kiln_gguf *g = NULL;
    TS_OK(kiln_gguf_open_memory(b->s, b->len, "ok.gguf", &g));
    kb_str_free(b);
    return g;
}

/* ---- round trips ------------------------------------------------------------------------------ */

#define N_ARR 5
static const kiln_gguf_type numeric[] = {KILN_GGUF_U8,  KILN_GGUF_I8,  KILN_GGUF_U16, KILN_GGUF_I16,
                                         KILN_GGUF_U32, KILN_GGUF_I32, KILN_GGUF_F32, KILN_GGUF_BOOL,
                                         KILN_GGUF_U64, KILN_GGUF_I64, KILN_GGUF_F64};
#define N_NUMERIC (sizeof numeric / sizeof numeric[0])
static const size_t numeric_size[] = {1, 1, 2, 2, 4, 4, 4, 1, 8, 8, 8};

static void arr_data(int k, uint8_t *out) {
    fill_bytes(out, N_ARR * 8, (uint32_t)k + 100);
    if (numeric[k] == KILN_GGUF_BOOL)
        for (int i = 0; i < N_ARR; i++) out[i] = (uint8_t)(i % 2);
}

static const char *strs[] = {"a", "", "h\xc3\xa9llo \xe2\x9c\x93 \xe6\x97\xa5\xe6\x9c\xac", "with space", "x\ty"};

/* Every value type, in this order of keys. */
static kiln_gguf_writer *values_writer(void) {
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    ck_assert_ptr_nonnull(w);
    uint8_t  u8 = 250;
    int8_t   i8 = -7;
    uint16_t u16 = 65000;
    int16_t  i16 = -30000;
    int64_t  i64 = -1234567890123;
    double   f64 = 3.141592653589793;
    kiln_gguf_set_scalar(w, "v.u8", KILN_GGUF_U8, &u8);
    kiln_gguf_set_scalar(w, "v.i8", KILN_GGUF_I8, &i8);
    kiln_gguf_set_scalar(w, "v.u16", KILN_GGUF_U16, &u16);
    kiln_gguf_set_scalar(w, "v.i16", KILN_GGUF_I16, &i16);
    kiln_gguf_set_u32(w, "v.u32", 4000000000u);
    kiln_gguf_set_i32(w, "v.i32", -2000000000);
    kiln_gguf_set_f32(w, "v.f32", 0.1f);
    kiln_gguf_set_bool(w, "v.true", true);
    kiln_gguf_set_bool(w, "v.false", false);
    kiln_gguf_set_str(w, "v.str", uni);
    kiln_gguf_set_str(w, "v.empty", "");
    kiln_gguf_set_u64(w, "v.u64", UINT64_MAX);
    kiln_gguf_set_u64(w, "v.u64small", 42);
    kiln_gguf_set_scalar(w, "v.i64", KILN_GGUF_I64, &i64);
    kiln_gguf_set_scalar(w, "v.f64", KILN_GGUF_F64, &f64);
    for (size_t k = 0; k < N_NUMERIC; k++) {
        uint8_t d[N_ARR * 8];
        char    key[32];
        arr_data((int)k, d);
        snprintf(key, sizeof key, "arr.%s", kiln_gguf_type_name(numeric[k]));
        kiln_gguf_set_arr(w, key, numeric[k], N_ARR, d);
    }
    kiln_gguf_set_arr(w, "arr.empty", KILN_GGUF_U32, 0, NULL);
    kiln_gguf_set_arr_str(w, "arr.str", 5, strs);
    kiln_gguf_set_arr_str(w, "arr.str_empty", 0, NULL);
    kiln_gguf_set_str(w, uni, "a unicode key"); /* any bytes but NUL */
    return w;
}

static void check_int(const kiln_gguf *g, const char *key, int64_t want) {
    int64_t v = 0;
    TS_OK(kiln_gguf_get_int(g, key, &v));
    ck_assert_msg(v == want, "%s: %" PRId64 ", want %" PRId64, key, v, want);
}

START_TEST(roundtrip_values) {
    char             *dir = ts_tmpdir(), *path = path_in(dir, "v.gguf");
    kiln_gguf_writer *w = values_writer();
    TS_OK(kiln_gguf_write(w, path, NULL, NULL, NULL));
    kiln_gguf_writer_free(w);
    kiln_gguf *g;
    TS_OK(kiln_gguf_open(path, &g));
    ck_assert_uint_eq(kiln_gguf_version(g), 3);
    ck_assert_uint_eq(kiln_gguf_alignment(g), 32);
    ck_assert_int_eq(kiln_gguf_tensor_count(g), 0);

    static const char *keys[] = {"v.u8",    "v.i8",    "v.u16",   "v.i16",    "v.u32",      "v.i32",
                                 "v.f32",   "v.true",  "v.false", "v.str",    "v.empty",    "v.u64",
                                 "v.u64small", "v.i64", "v.f64"};
    int64_t     nk = (int64_t)(sizeof keys / sizeof keys[0]);
    ck_assert_int_eq(kiln_gguf_kv_count(g), nk + (int64_t)N_NUMERIC + 4);
    for (int64_t i = 0; i < nk; i++) {
        ck_assert_str_eq(kiln_gguf_kv_key(g, i), keys[i]);
        ck_assert_int_eq(kiln_gguf_find_kv(g, keys[i]), i);
    }
    ck_assert_int_eq(kiln_gguf_kv_type(g, 0), KILN_GGUF_U8);
    ck_assert_int_eq(kiln_gguf_kv_type(g, 9), KILN_GGUF_STRING);
    ck_assert_int_eq(kiln_gguf_kv_type(g, nk), KILN_GGUF_ARRAY);
    ck_assert_ptr_null(kiln_gguf_kv_key(g, -1));
    ck_assert_ptr_null(kiln_gguf_kv_key(g, kiln_gguf_kv_count(g)));
    ck_assert_int_eq(kiln_gguf_kv_type(g, kiln_gguf_kv_count(g)), KILN_GGUF_TYPE_COUNT);
    ck_assert_int_eq(kiln_gguf_find_kv(g, "nope"), -1);
    ck_assert_str_eq(kiln_gguf_kv_key(g, kiln_gguf_kv_count(g) - 1), uni);

    check_int(g, "v.u8", 250);
    check_int(g, "v.i8", -7);
    check_int(g, "v.u16", 65000);
    check_int(g, "v.i16", -30000);
    check_int(g, "v.u32", 4000000000);
    check_int(g, "v.i32", -2000000000);
    check_int(g, "v.true", 1);
    check_int(g, "v.false", 0);
    check_int(g, "v.u64small", 42);
    check_int(g, "v.i64", -1234567890123);
    double d;
    TS_OK(kiln_gguf_get_float(g, "v.f32", &d));
    ck_assert(d == (double)0.1f);
    TS_OK(kiln_gguf_get_float(g, "v.f64", &d));
    ck_assert(d == 3.141592653589793);
    bool b = false;
    TS_OK(kiln_gguf_get_bool(g, "v.true", &b));
    ck_assert(b);
    TS_OK(kiln_gguf_get_bool(g, "v.false", &b));
    ck_assert(!b);
    const char *s;
    size_t      len;
    TS_OK(kiln_gguf_get_str(g, "v.str", &s, &len));
    ck_assert_uint_eq(len, strlen(uni));
    ck_assert(!memcmp(s, uni, len));
    TS_OK(kiln_gguf_get_str(g, "v.empty", &s, &len));
    ck_assert_uint_eq(len, 0);
    TS_OK(kiln_gguf_get_str(g, uni, &s, &len));
    ck_assert(len == 13 && !memcmp(s, "a unicode key", 13));

    for (size_t k = 0; k < N_NUMERIC; k++) {
        uint8_t        want[N_ARR * 8];
        char           key[32];
        kiln_gguf_type elem;
        uint64_t       n;
        const void    *data;
        arr_data((int)k, want);
        snprintf(key, sizeof key, "arr.%s", kiln_gguf_type_name(numeric[k]));
        TS_OK(kiln_gguf_get_arr(g, key, &elem, &n, &data));
        ck_assert_int_eq(elem, numeric[k]);
        ck_assert_uint_eq(n, N_ARR);
        ck_assert_msg(!memcmp(data, want, N_ARR * numeric_size[k]), "%s: elements differ", key);
    }
    kiln_gguf_type elem;
    uint64_t       n;
    const void    *data = NULL;
    TS_OK(kiln_gguf_get_arr(g, "arr.empty", &elem, &n, &data));
    ck_assert(elem == KILN_GGUF_U32 && n == 0 && data != NULL);
    TS_OK(kiln_gguf_get_arr(g, "arr.str", &elem, &n, &data));
    ck_assert(elem == KILN_GGUF_STRING && n == 5 && data == NULL);
    for (uint64_t i = 0; i < 5; i++) {
        TS_OK(kiln_gguf_get_arr_str(g, "arr.str", i, &s, &len));
        ck_assert_uint_eq(len, strlen(strs[i]));
        ck_assert(!memcmp(s, strs[i], len));
    }
    TS_OK(kiln_gguf_get_arr(g, "arr.str_empty", &elem, NULL, NULL));
    ck_assert_int_eq(elem, KILN_GGUF_STRING);

    /* Errors name the key, its type and its value. */
    int64_t v;
    expect_err(kiln_gguf_get_int(g, "v.str", &v), KILN_ERR_FORMAT, "'v.str' is string 'h\xc3\xa9llo", "int of string");
    expect_err(kiln_gguf_get_int(g, "v.u64", &v), KILN_ERR_FORMAT, "u64 18446744073709551615", "u64 max");
    expect_err(kiln_gguf_get_int(g, "v.f32", &v), KILN_ERR_FORMAT, "'v.f32' is f32 0.1", "int of f32");
    expect_err(kiln_gguf_get_float(g, "v.u32", &d), KILN_ERR_FORMAT, "u32 4000000000", "float of u32");
    expect_err(kiln_gguf_get_bool(g, "v.u8", &b), KILN_ERR_FORMAT, "'v.u8' is u8 250, not a bool", "bool of u8");
    expect_err(kiln_gguf_get_str(g, "arr.u32", &s, &len), KILN_ERR_FORMAT, "an array of 5 u32", "str of arr");
    expect_err(kiln_gguf_get_arr(g, "v.i8", NULL, NULL, NULL), KILN_ERR_FORMAT, "i8 -7, not an array", "arr of i8");
    expect_err(kiln_gguf_get_arr_str(g, "arr.u8", 0, &s, &len), KILN_ERR_FORMAT, "not an array of strings", "arr_str");
    expect_err(kiln_gguf_get_arr_str(g, "arr.str", 5, &s, &len), KILN_ERR_INVALID, "no element 5", "past the end");
    expect_err(kiln_gguf_get_int(g, "nope", &v), KILN_ERR_NOT_FOUND, "no key 'nope'", "absent");
    expect_err(kiln_gguf_get_int(g, "v.u8", NULL), KILN_ERR_INVALID, NULL, "NULL out");
    kiln_gguf_close(g);
    free(path);
    ts_rmtree(dir);
    free(dir);
}
END_TEST

typedef struct {
    const char *name;
    kiln_type   type;
    int         n_dims;
    int64_t     ne[4];
} tspec;

static const tspec tensors[] = {
    {"t.f32.1d", KILN_F32, 1, {7}},
    {"t.f16.2d", KILN_F16, 2, {5, 3}},
    {"t.bf16.3d", KILN_BF16, 3, {4, 3, 2}},
    {"t.i32.4d", KILN_I32, 4, {2, 3, 2, 2}},
    {"t.i64", KILN_I64, 1, {3}},
    {"blk.0.attn_q.weight", KILN_F16, 2, {64, 64}},
    {"t.f32.4d", KILN_F32, 4, {3, 1, 2, 5}},
};
#define N_TENSORS (int64_t)(sizeof tensors / sizeof tensors[0])

static size_t spec_bytes(const tspec *t) {
    size_t n = kiln_type_size(t->type);
    for (int j = 0; j < t->n_dims; j++) n *= (size_t)t->ne[j];
    return n;
}

/* The tensors above with deterministic data (given, or left to fill when with_data is false). */
static kiln_gguf_writer *tensors_writer(uint32_t align, bool with_data) {
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    kiln_gguf_set_str(w, "general.architecture", "llama");
    if (align) kiln_gguf_set_u32(w, "general.alignment", align);
    for (int64_t i = 0; i < N_TENSORS; i++) {
        size_t n = spec_bytes(&tensors[i]);
        void  *d = malloc(n);
        fill_bytes(d, n, (uint32_t)i);
        kiln_gguf_add_tensor(w, tensors[i].name, tensors[i].type, tensors[i].n_dims, tensors[i].ne,
                             with_data ? d : NULL);
        free(d);
    }
    return w;
}

static kiln_status fill_spec(void *user, int64_t i, const char *name, uint64_t offset, void *buf, size_t bytes) {
    ck_assert_str_eq(name, tensors[i].name);
    size_t n = spec_bytes(&tensors[i]);
    ck_assert_uint_le(offset + bytes, n);
    uint8_t *d = malloc(n);
    fill_bytes(d, n, (uint32_t)i);
    memcpy(buf, d + offset, bytes);
    free(d);
    return NULL;
}

/* mapped: the file is mapped (page-aligned), else copied to a 64-byte aligned buffer. */
static void check_tensors(const kiln_gguf *g, size_t align, bool mapped) {
    ck_assert_uint_eq(kiln_gguf_alignment(g), align);
    ck_assert_uint_eq(kiln_gguf_data_offset(g) % align, 0);
    ck_assert_int_eq(kiln_gguf_tensor_count(g), N_TENSORS);
    for (int64_t i = 0; i < N_TENSORS; i++) {
        const tspec     *s = &tensors[i];
        kiln_gguf_tensor t;
        ck_assert_int_eq(kiln_gguf_find_tensor(g, s->name), i);
        TS_OK(kiln_gguf_tensor_info(g, i, &t));
        ck_assert_str_eq(t.name, s->name);
        ck_assert(t.has_kiln_type);
        ck_assert_int_eq(t.type, s->type);
        ck_assert_str_eq(t.type_name, kiln_type_name(s->type));
        ck_assert_int_eq(t.n_dims, s->n_dims);
        for (int j = 0; j < 4; j++) ck_assert_int_eq(t.ne[j], j < s->n_dims ? s->ne[j] : 1);
        ck_assert_uint_eq(t.bytes, spec_bytes(s));
        ck_assert_msg(t.offset % align == 0, "tensor %s at %" PRIu64, s->name, t.offset);
        size_t base_align = mapped ? 4096 : 64;
        ck_assert_msg((uintptr_t)t.data % (align < base_align ? align : base_align) == 0, "tensor %s data not aligned",
                      s->name);
        uint8_t *want = malloc(t.bytes);
        fill_bytes(want, t.bytes, (uint32_t)i);
        ck_assert_msg(!memcmp(t.data, want, t.bytes), "tensor %s: data differs", s->name);
        free(want);
    }
    ck_assert_int_eq(kiln_gguf_find_tensor(g, "nope"), -1);
    kiln_gguf_tensor t;
    expect_err(kiln_gguf_tensor_info(g, N_TENSORS, &t), KILN_ERR_INVALID, "no tensor 7", "past the end");
}

START_TEST(roundtrip_tensors) {
    char *dir = ts_tmpdir(), *path = path_in(dir, "t.gguf");
    static const uint32_t aligns[] = {0, 64, 8, 4096};
    for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++) {
        kiln_gguf_writer *w = tensors_writer(aligns[a], true);
        TS_OK(kiln_gguf_write(w, path, NULL, NULL, NULL));
        kiln_gguf_writer_free(w);
        kiln_gguf *g;
        TS_OK(kiln_gguf_open(path, &g));
        check_tensors(g, aligns[a] ? aligns[a] : 32, true);
        kiln_gguf_close(g);
        /* The same through memory. */
        size_t len;
        char  *bytes = ts_read_file(path, &len);
        TS_OK(kiln_gguf_open_memory(bytes, len, "m", &g));
        check_tensors(g, aligns[a] ? aligns[a] : 32, false);
        kiln_gguf_close(g);
        free(bytes);
    }
    free(path);
    ts_rmtree(dir);
    free(dir);
}
END_TEST

/* The writer's bytes for a small file, against the layout built by hand. */
START_TEST(writer_bytes_exact) {
    char             *dir = ts_tmpdir(), *path = path_in(dir, "x.gguf");
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    float             x[3] = {1, 2, 3};
    int32_t           y[2] = {-1, 7};
    int64_t           ne3 = 3, ne2[2] = {1, 2};
    kiln_gguf_set_str(w, "general.architecture", "llama");
    kiln_gguf_set_u32(w, "n", 5);
    kiln_gguf_add_tensor(w, "x", KILN_F32, 1, &ne3, x);
    kiln_gguf_add_tensor(w, "y", KILN_I32, 2, ne2, y);
    kiln_gguf_set_u32(w, "n", 6); /* replaces, where it stands */
    TS_OK(kiln_gguf_write(w, path, NULL, NULL, NULL));
    kiln_gguf_writer_free(w);

    kb_str b = hdr(3, 2, 2);
    put_key(&b, "general.architecture", KILN_GGUF_STRING);
    kb_put_cstr(&b, "llama");
    put_key(&b, "n", KILN_GGUF_U32);
    kb_put_u32(&b, 6);
    put_tensor(&b, "x", 1, &ne3, 0, 0);
    put_tensor(&b, "y", 2, ne2, 26, 32);
    put_pad(&b, 32);
    kb_str_addn(&b, (const char *)x, sizeof x);
    put_pad(&b, 32);
    kb_str_addn(&b, (const char *)y, sizeof y);
    put_pad(&b, 32);
    size_t len;
    char  *got = ts_read_file(path, &len);
    ck_assert_uint_eq(len, b.len);
    ck_assert(!memcmp(got, b.s, len));
    free(got);
    kb_str_free(&b);
    free(path);
    ts_rmtree(dir);
    free(dir);
}
END_TEST

/* Same calls, same bytes; tensors given or filled, same bytes. */
START_TEST(deterministic) {
    char *dir = ts_tmpdir(), *p1 = path_in(dir, "1.gguf"), *p2 = path_in(dir, "2.gguf"), *p3 = path_in(dir, "3.gguf");
    kiln_gguf_writer *w1 = values_writer(), *w2 = values_writer();
    TS_OK(kiln_gguf_write(w1, p1, NULL, NULL, NULL));
    TS_OK(kiln_gguf_write(w2, p2, NULL, NULL, NULL));
    TS_OK(kiln_gguf_write(w1, p3, NULL, NULL, NULL)); /* a writer may be written again */
    size_t l1, l2, l3;
    char  *b1 = ts_read_file(p1, &l1), *b2 = ts_read_file(p2, &l2), *b3 = ts_read_file(p3, &l3);
    ck_assert(l1 == l2 && l1 == l3 && !memcmp(b1, b2, l1) && !memcmp(b1, b3, l1));
    free(b1);
    free(b2);
    free(b3);
    kiln_gguf_writer_free(w1);
    kiln_gguf_writer_free(w2);

    w1 = tensors_writer(0, true);
    w2 = tensors_writer(0, false);
    TS_OK(kiln_gguf_write(w1, p1, NULL, NULL, NULL));
    TS_OK(kiln_gguf_write(w2, p2, fill_spec, NULL, NULL));
    b1 = ts_read_file(p1, &l1);
    b2 = ts_read_file(p2, &l2);
    ck_assert(l1 == l2 && !memcmp(b1, b2, l1));
    free(b1);
    free(b2);
    kiln_gguf_writer_free(w1);
    kiln_gguf_writer_free(w2);
    ck_assert_int_eq(count_entries(dir), 3); /* no temporaries left */
    free(p1);
    free(p2);
    free(p3);
    ts_rmtree(dir);
    free(dir);
}
END_TEST

/* ---- the fill callback: a tensor larger than the 32 MiB buffer comes in chunks ---------------- */

#define BIG_NE0 4096
#define BIG_NE1 2100 /* 4096 x 2100 f32: 34.4 MB */

typedef struct {
    uint64_t next[3]; /* per tensor: where the next chunk must start */
    int      calls;
    uint64_t last_done, total;
    int      progress_calls;
    int64_t  fail_at; /* tensor whose fill fails, or -1 */
} fill_state;

static uint8_t big_byte(int64_t i, uint64_t j) { return (uint8_t)(j * 7 + (uint64_t)i * 13 + (j >> 12)); }

static kiln_status fill_big(void *user, int64_t i, const char *name, uint64_t offset, void *buf, size_t bytes) {
    fill_state *f = user;
    static const char *names[] = {"a", "big", "c"};
    ck_assert(i >= 0 && i < 3);
    ck_assert_str_eq(name, names[i]);
    if (i == f->fail_at) return kb_error(KILN_ERR_IO, "disk on fire");
    ck_assert_uint_eq(offset, f->next[i]);
    ck_assert_uint_le(bytes, (size_t)32 << 20);
    ck_assert_uint_eq(offset % 4, 0);
    ck_assert_uint_eq(bytes % 4, 0);
    for (size_t k = 0; k < bytes; k++) ((uint8_t *)buf)[k] = big_byte(i, offset + k);
    f->next[i] += bytes;
    f->calls++;
    return NULL;
}

static void on_progress(void *user, uint64_t done, uint64_t total) {
    fill_state *f = user;
    ck_assert_uint_ge(done, f->last_done);
    ck_assert_uint_le(done, total);
    f->last_done = done;
    f->total = total;
    f->progress_calls++;
}

static kiln_gguf_writer *big_writer(void) {
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    int64_t           ne_a = 10, ne_big[2] = {BIG_NE0, BIG_NE1}, ne_c[3] = {3, 5, 7};
    kiln_gguf_add_tensor(w, "a", KILN_F16, 1, &ne_a, NULL);
    kiln_gguf_add_tensor(w, "big", KILN_F32, 2, ne_big, NULL);
    kiln_gguf_add_tensor(w, "c", KILN_I32, 3, ne_c, NULL);
    return w;
}

START_TEST(fill_chunks) {
    char             *dir = ts_tmpdir(), *path = path_in(dir, "big.gguf");
    kiln_gguf_writer *w = big_writer();
    fill_state        f = {.fail_at = -1};
    TS_OK(kiln_gguf_write(w, path, fill_big, &f, on_progress));
    ck_assert_uint_eq(f.next[0], 20);
    ck_assert_uint_eq(f.next[1], (uint64_t)BIG_NE0 * BIG_NE1 * 4);
    ck_assert_uint_eq(f.next[2], 3 * 5 * 7 * 4);
    ck_assert_int_ge(f.calls, 4); /* big came in two chunks at least */
    ck_assert_int_ge(f.progress_calls, 2);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq(f.last_done, (uint64_t)st.st_size);
    ck_assert_uint_eq(f.total, (uint64_t)st.st_size);

    kiln_gguf *g;
    TS_OK(kiln_gguf_open(path, &g));
    for (int64_t i = 0; i < 3; i++) {
        kiln_gguf_tensor t;
        TS_OK(kiln_gguf_tensor_info(g, i, &t));
        const uint8_t *d = t.data;
        for (size_t k = 0; k < t.bytes; k += (i == 1 ? 4093 : 1))
            ck_assert_msg(d[k] == big_byte(i, k), "tensor %" PRId64 " byte %zu", i, k);
        ck_assert(d[t.bytes - 1] == big_byte(i, t.bytes - 1));
    }
    kiln_gguf_close(g);

    /* A failing fill: its error, naming the tensor, and neither the file nor a temporary left. */
    ck_assert_int_eq(unlink(path), 0);
    f = (fill_state){.fail_at = 1};
    kiln_status s = kiln_gguf_write(w, path, fill_big, &f, NULL);
    ck_assert_msg(s && strstr(kiln_status_msg(s), "tensor 1 ('big')") && strstr(kiln_status_msg(s), "disk on fire") &&
                      strstr(kiln_status_msg(s), path),
                  "%s", kiln_status_msg(s));
    expect_err(s, KILN_ERR_IO, NULL, "failing fill");
    ck_assert(!exists(path));
    ck_assert_int_eq(count_entries(dir), 0);

    /* Tensors without data need a fill callback. */
    expect_err(kiln_gguf_write(w, path, NULL, NULL, NULL), KILN_ERR_INVALID, "tensor 0 ('a') has no data", "no fill");
    ck_assert_int_eq(count_entries(dir), 0);
    kiln_gguf_writer_free(w);
    free(path);
    ts_rmtree(dir);
    free(dir);
}
END_TEST

/* ---- writer errors ---------------------------------------------------------------------------- */

static void expect_writer_err(kiln_gguf_writer *w, const char *want, const char *dir) {
    char *path = path_in(dir, "e.gguf");
    expect_err(kiln_gguf_write(w, path, NULL, NULL, NULL), KILN_ERR_INVALID, want, want);
    /* the recorded error names the file being written (a fresh writer: the first one is freed) */
    kiln_gguf_writer *again = kiln_gguf_writer_new();
    kiln_gguf_set_u32(again, "", 1);
    expect_err(kiln_gguf_write(again, path, NULL, NULL, NULL), KILN_ERR_INVALID, "e.gguf: ", "path");
    kiln_gguf_writer_free(again);
    ck_assert(!exists(path));
    ck_assert_int_eq(count_entries(dir), 0);
    kiln_gguf_writer_free(w);
    free(path);
}

START_TEST(writer_errors) {
    char   *dir = ts_tmpdir();
    int64_t ne[5] = {2, 2, 2, 2, 2}, zero[2] = {4, 0}, neg[1] = {-3}, huge[2] = {(int64_t)1 << 40, (int64_t)1 << 30};
    uint8_t two = 2, bools[3] = {0, 1, 2};
    float   f[32] = {1};

    const char *with_null[2] = {"a", NULL};
    for (int c = 0;; c++) {
        kiln_gguf_writer *w = kiln_gguf_writer_new();
        const char       *want = NULL;
        switch (c) {
        case 0: kiln_gguf_set_u32(w, "", 1), want = "kiln_gguf_set_scalar: empty key"; break;
        case 1: kiln_gguf_set_str(w, NULL, "x"), want = "kiln_gguf_set_str: empty key"; break;
        case 2: kiln_gguf_set_str(w, "k", NULL), want = "key 'k': NULL value"; break;
        case 3: kiln_gguf_set_scalar(w, "k", KILN_GGUF_STRING, "x"), want = "type string is not a numeric or bool type"; break;
        case 4: kiln_gguf_set_scalar(w, "k", KILN_GGUF_BOOL, &two), want = "bool element 0 is 2"; break;
        case 5: kiln_gguf_set_arr(w, "k", KILN_GGUF_BOOL, 3, bools), want = "key 'k': bool element 2 is 2"; break;
        case 6: kiln_gguf_set_arr(w, "k", KILN_GGUF_STRING, 1, f), want = "element type string is not numeric"; break;
        case 7: kiln_gguf_set_arr(w, "k", KILN_GGUF_ARRAY, 1, f), want = "element type array is not numeric"; break;
        case 8: kiln_gguf_set_arr(w, "k", KILN_GGUF_F32, 2, NULL), want = "NULL data"; break;
        case 9: kiln_gguf_set_arr_str(w, "k", 2, with_null), want = "element 1 is NULL"; break;
        case 10: kiln_gguf_set_u32(w, "general.alignment", 3), want = "general.alignment 3 is not a power of 2"; break;
        case 11: kiln_gguf_set_u32(w, "general.alignment", 0), want = "general.alignment 0 is not a power of 2"; break;
        case 12: kiln_gguf_set_u64(w, "general.alignment", 32), want = "general.alignment must be a u32, not u64"; break;
        case 13:
            kiln_gguf_add_tensor(w, "t", KILN_F32, 1, ne, f);
            kiln_gguf_add_tensor(w, "t", KILN_F32, 1, ne, NULL), want = "duplicate tensor 't'";
            break;
        case 14: kiln_gguf_add_tensor(w, "t", KILN_F32, 0, ne, NULL), want = "tensor 't': a tensor has 1 to 4 dims"; break;
        case 15: kiln_gguf_add_tensor(w, "t", KILN_F32, 5, ne, NULL), want = "a tensor has 1 to 4 dims"; break;
        case 16: kiln_gguf_add_tensor(w, "t", KILN_F32, 2, zero, NULL), want = "ne[1] = 0 is not positive"; break;
        case 17: kiln_gguf_add_tensor(w, "t", KILN_F32, 1, neg, NULL), want = "ne[0] = -3 is not positive"; break;
        case 18: kiln_gguf_add_tensor(w, "t", KILN_F32, 2, huge, NULL), want = "ne[1] = 1073741824 makes the size overflow"; break;
        case 19: kiln_gguf_add_tensor(w, "t", KILN_TYPE_COUNT, 1, ne, NULL), want = "tensor 't': unknown type"; break;
        case 20: kiln_gguf_add_tensor(w, "", KILN_F32, 1, ne, NULL), want = "empty tensor name"; break;
        case 21: kiln_gguf_add_tensor(w, NULL, KILN_F32, 1, ne, NULL), want = "empty tensor name"; break;
        case 22: kiln_gguf_add_tensor(w, "t", KILN_F32, 1, NULL, NULL), want = "NULL extents"; break;
        }
        if (!want) {
            kiln_gguf_writer_free(w);
            break;
        }
        expect_writer_err(w, want, dir);
    }

    /* The first error is the one returned. */
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    kiln_gguf_set_u32(w, "", 1);
    kiln_gguf_add_tensor(w, "", KILN_F32, 1, ne, NULL);
    expect_writer_err(w, "empty key", dir);

    /* A directory that does not exist: an I/O error naming the path. */
    w = kiln_gguf_writer_new();
    kiln_gguf_set_u32(w, "a", 1);
    char *nowhere = path_in(dir, "no/such/dir.gguf");
    expect_err(kiln_gguf_write(w, nowhere, NULL, NULL, NULL), KILN_ERR_IO, "no/such/dir.gguf.tmp.", "no dir");
    free(nowhere);
    expect_err(kiln_gguf_write(NULL, "x", NULL, NULL, NULL), KILN_ERR_INVALID, NULL, "NULL writer");
    expect_err(kiln_gguf_write(w, NULL, NULL, NULL, NULL), KILN_ERR_INVALID, NULL, "NULL path");
    kiln_gguf_writer_free(w);
    kiln_gguf_set_u32(NULL, "a", 1); /* no writer: ignored */
    kiln_gguf_writer_free(NULL);
    ts_rmtree(dir);
    free(dir);
}
END_TEST

/* ---- malformed files -------------------------------------------------------------------------- */

START_TEST(malformed_header) {
    kb_str b = {0};
    kb_str_addn(&b, "GGU", 3);
    expect_bad(&b, "magic at offset 0: truncated", 0, "3 bytes");
    b = hdr(3, 0, 0);
    b.s[3] = 'X';
    expect_bad(&b, "'GGUX' is not 'GGUF'", 0, "magic");
    b = hdr(3, 0, 0);
    memcpy(b.s, "FUGG", 4);
    expect_bad(&b, "big-endian", 0, "swapped magic");
    b = hdr(1, 0, 0);
    expect_bad(&b, "version 1 is not supported", 4, "v1");
    b = hdr(4, 0, 0);
    expect_bad(&b, "version 4 is not supported (kiln reads versions 2 and 3)", 4, "v4");
    b = hdr(0, 0, 0);
    expect_bad(&b, "version 0 is not supported", 4, "v0");
    b = hdr(0x03000000, 0, 0);
    expect_bad(&b, "version 0x03000000 looks byte-swapped: a big-endian file?", 4, "big-endian");
    b = hdr(3, 0, (uint64_t)1 << 62);
    expect_bad(&b, "n_kv at offset 16: 4611686018427387904 key-value pairs cannot fit", 16, "n_kv 2^62");
    b = hdr(3, (uint64_t)1 << 62, 0);
    expect_bad(&b, "n_tensors at offset 8: 4611686018427387904 tensor infos cannot fit", 8, "n_tensors 2^62");
    b = hdr(3, UINT64_MAX, UINT64_MAX);
    expect_bad(&b, "n_kv", 16, "counts -1");

    /* Version 2 has the same layout; a file without tensors needs no padding. */
    b = hdr(2, 0, 1);
    put_key(&b, "a", KILN_GGUF_U8);
    put_u8(&b, 9);
    size_t     end = b.len;
    kiln_gguf *g = open_ok(&b);
    ck_assert_uint_eq(kiln_gguf_version(g), 2);
    ck_assert_uint_eq(kiln_gguf_data_offset(g), end);
    kiln_gguf_close(g);
}
END_TEST

START_TEST(malformed_kv) {
    kb_str b = hdr(3, 0, 1);
    kb_put_u64(&b, (uint64_t)1 << 63);
    put_zeros(&b, 64);
    expect_bad(&b, "kv 0 key at offset 24: length 9223372036854775808 runs past the end", 24, "key len 2^63");
    b = hdr(3, 0, 1);
    put_key(&b, "", KILN_GGUF_U8);
    put_zeros(&b, 16);
    expect_bad(&b, "kv 0 key at offset 24: empty", 24, "empty key");
    b = hdr(3, 0, 1);
    kb_put_blob(&b, "ab\0c", 4);
    kb_put_u32(&b, KILN_GGUF_U8);
    put_u8(&b, 0);
    expect_bad(&b, "kv 0 key at offset 34: contains a NUL byte", 34, "NUL in key");
    b = hdr(3, 0, 2);
    put_key(&b, "a\nb", KILN_GGUF_U8);
    put_u8(&b, 0);
    size_t at = b.len;
    put_key(&b, "a\nb", KILN_GGUF_U8);
    put_u8(&b, 0);
    expect_bad(&b, "kv 1 ('a\\x0ab') key at offset", at, "duplicate key");
    b = hdr(3, 0, 1);
    at = put_key(&b, "k", 13);
    put_u8(&b, 0);
    expect_bad(&b, "kv 0 ('k') type at offset 33: unknown value type 13", at, "type 13");
    b = hdr(3, 0, 1);
    put_key(&b, "k", KILN_GGUF_BOOL);
    at = b.len;
    put_u8(&b, 2);
    expect_bad(&b, "kv 0 ('k') value at offset 37: bool value 2 is neither 0 nor 1", at, "bool 2");
    for (int strings = 0; strings < 2; strings++) { /* checked before the string index is allocated */
        b = hdr(3, 0, 1);
        put_key(&b, "k", KILN_GGUF_ARRAY);
        kb_put_u32(&b, strings ? KILN_GGUF_STRING : KILN_GGUF_U32);
        kb_put_u64(&b, (uint64_t)1 << 61);
        put_zeros(&b, 64);
        expect_bad(&b, strings ? "kv 0 ('k') array count at offset 41: 2305843009213693952 strings cannot fit"
                               : "kv 0 ('k') array count at offset 41: 2305843009213693952 elements of 4 bytes cannot fit",
                   41, "array n 2^61");
    }
    b = hdr(3, 0, 1);
    put_key(&b, "k", KILN_GGUF_STRING);
    at = b.len;
    kb_put_u64(&b, (uint64_t)1 << 63);
    expect_bad(&b, "kv 0 ('k') value at offset 37: length 9223372036854775808 runs past", at, "str len 2^63");
    b = hdr(3, 0, 1);
    put_key(&b, "k", KILN_GGUF_ARRAY);
    kb_put_u32(&b, KILN_GGUF_STRING);
    kb_put_u64(&b, 3);
    kb_put_cstr(&b, "x");
    at = b.len;
    kb_put_u64(&b, 100);
    kb_put_cstr(&b, "z");
    expect_bad(&b, "kv 0 ('k') element 1 at offset", at, "element length");
    b = hdr(3, 0, 1);
    put_key(&b, "k", KILN_GGUF_ARRAY);
    at = b.len;
    kb_put_u32(&b, KILN_GGUF_ARRAY);
    kb_put_u64(&b, 0);
    expect_bad(&b, "kv 0 ('k') array element type at offset 37: nested arrays are not supported", at, "nested");
    b = hdr(3, 0, 1);
    put_key(&b, "k", KILN_GGUF_ARRAY);
    kb_put_u32(&b, 13);
    kb_put_u64(&b, 0);
    expect_bad(&b, "array element type at offset 37: unknown value type 13", 37, "element type 13");
    b = hdr(3, 0, 1);
    put_key(&b, "k", KILN_GGUF_ARRAY);
    kb_put_u32(&b, KILN_GGUF_BOOL);
    kb_put_u64(&b, 5);
    at = b.len;
    kb_str_addn(&b, "\1\0\1\3\0", 5);
    expect_bad(&b, "kv 0 ('k') element 3 at offset", at + 3, "bool array");
    b = hdr(3, 0, 1);
    put_key(&b, "k", KILN_GGUF_U64);
    kb_put_u32(&b, 0);
    expect_bad(&b, "kv 0 ('k') value at offset 37: truncated", 37, "short u64");

    /* general.alignment: a u32 power of 2. */
    static const uint32_t bad_align[] = {0, 3, 48};
    for (int i = 0; i < 3; i++) {
        b = hdr(3, 0, 2);
        put_key(&b, "x", KILN_GGUF_U8);
        put_u8(&b, 1);
        put_key(&b, "general.alignment", KILN_GGUF_U32);
        at = b.len;
        kb_put_u32(&b, bad_align[i]);
        char want[128];
        snprintf(want, sizeof want, "kv 1 ('general.alignment') value at offset %zu: alignment %u is not a power of 2",
                 at, bad_align[i]);
        expect_bad(&b, want, at, "alignment");
    }
    b = hdr(3, 0, 1);
    at = put_key(&b, "general.alignment", KILN_GGUF_U64);
    kb_put_u64(&b, 32);
    expect_bad(&b, "kv 0 ('general.alignment') type at offset 49: general.alignment has type u64; it must be u32", at,
               "alignment u64");
    b = hdr(3, 0, 1);
    at = put_key(&b, "general.alignment", KILN_GGUF_STRING);
    kb_put_cstr(&b, "32");
    expect_bad(&b, "has type string; it must be u32", at, "alignment string");
}
END_TEST

/* A header with one tensor info "t" (n_dims, ne, type, offset as given) and data bytes. */
static kb_str one_tensor(uint32_t n_dims, const int64_t *ne, uint32_t type, uint64_t off, size_t data, tpos *p) {
    kb_str b = hdr(3, 1, 0);
    *p = put_tensor(&b, "t", n_dims, ne, type, off);
    put_pad(&b, 32);
    put_zeros(&b, data);
    return b;
}

START_TEST(malformed_tensor) {
    tpos    p;
    int64_t ne[5] = {4, 4, 4, 4, 4};
    kb_str  b = one_tensor(0, ne, 0, 0, 64, &p);
    expect_bad(&b, "tensor 0 ('t') n_dims at offset 33: 0 dimensions (a tensor has 1 to 4)", p.n_dims, "n_dims 0");
    b = one_tensor(5, ne, 0, 0, 4096, &p);
    expect_bad(&b, "tensor 0 ('t') n_dims at offset 33: 5 dimensions", p.n_dims, "n_dims 5");
    int64_t zero[2] = {4, 0};
    b = one_tensor(2, zero, 0, 0, 64, &p);
    expect_bad(&b, "tensor 0 ('t') ne[1] at offset 45: extent 0 is not positive", p.ne + 8, "ne 0");
    int64_t neg[3] = {4, 2, -5};
    b = one_tensor(3, neg, 0, 0, 64, &p);
    expect_bad(&b, "tensor 0 ('t') ne[2] at offset 53: extent -5 is not positive", p.ne + 16, "ne -5");
    int64_t big[3] = {(int64_t)1 << 32, (int64_t)1 << 30, 2};
    b = one_tensor(3, big, 0, 0, 64, &p);
    expect_bad(&b, "ne[2] at offset 53: the element count overflows (4611686018427387904 x 2)", p.ne + 16, "overflow");
    int64_t wide[2] = {(int64_t)1 << 31, (int64_t)1 << 31};
    b = one_tensor(2, wide, 0, 0, 64, &p);
    expect_bad(&b, "tensor 0 ('t') type at offset 53: the size in bytes of 4611686018427387904 elements of f32 overflows",
               p.type, "bytes overflow");
    b = one_tensor(1, ne, 4, 0, 64, &p);
    expect_bad(&b, "tensor 0 ('t') type at offset 45: unknown ggml type 4 (removed from ggml)", p.type, "type 4");
    static const uint32_t unknown[] = {5, 31, 32, 33, 36, 37, 38, 42, 1000, UINT32_MAX};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        b = one_tensor(1, ne, unknown[i], 0, 64, &p);
        expect_bad(&b, "unknown ggml type", p.type, "unknown type");
    }
    int64_t odd[2] = {33, 2};
    b = one_tensor(2, odd, 2, 0, 4096, &p);
    expect_bad(&b, "tensor 0 ('t') ne[0] at offset 37: 33 is not a multiple of q4_0's block size 32", p.ne, "q4_0 33");

    b = hdr(3, 1, 0);
    kb_put_blob(&b, "t\0x", 3);
    put_zeros(&b, 64);
    expect_bad(&b, "tensor 0 name at offset 33: contains a NUL byte", 33, "NUL in name");
    b = hdr(3, 1, 0);
    put_tensor(&b, "", 1, ne, 0, 0);
    put_pad(&b, 32);
    put_zeros(&b, 64);
    expect_bad(&b, "tensor 0 name at offset 24: empty", 24, "empty name");
    b = hdr(3, 1, 0);
    kb_put_u64(&b, (uint64_t)1 << 63);
    put_zeros(&b, 64);
    expect_bad(&b, "tensor 0 name at offset 24: length 9223372036854775808 runs past the end", 24, "name len");
    b = hdr(3, 2, 0);
    put_tensor(&b, "blk.0.attn_q.weight", 1, ne, 0, 0);
    p = put_tensor(&b, "blk.0.attn_q.weight", 1, ne, 0, 32);
    put_pad(&b, 32);
    put_zeros(&b, 64);
    expect_bad(&b, "tensor 1 ('blk.0.attn_q.weight') name at offset 75: duplicate of tensor 0", p.name, "dup name");

    /* Quantized types open (their sizes checked): q4_0 is one kiln computes with, q4_1 is not
     * (refusing it is the loader's job). */
    int64_t q[2] = {64, 2};
    b = one_tensor(2, q, 2, 0, 4 * 18, &p);
    kiln_gguf       *g = open_ok(&b);
    kiln_gguf_tensor t;
    TS_OK(kiln_gguf_tensor_info(g, 0, &t));
    ck_assert(t.has_kiln_type);
    ck_assert_int_eq(t.type, KILN_Q4_0);
    ck_assert_str_eq(t.type_name, "q4_0");
    ck_assert_uint_eq(t.ggml_type, 2);
    ck_assert_uint_eq(t.bytes, 4 * 18);
    kiln_gguf_close(g);
    b = one_tensor(2, q, 3, 0, 4 * 20, &p);
    g = open_ok(&b);
    TS_OK(kiln_gguf_tensor_info(g, 0, &t));
    ck_assert(!t.has_kiln_type);
    ck_assert_str_eq(t.type_name, "q4_1");
    ck_assert_uint_eq(t.bytes, 4 * 20);
    kiln_gguf_close(g);
    b = one_tensor(2, q, 2, 0, 4 * 18 - 1, &p);
    expect_bad(&b, "its 72 bytes at data offset 0 run past the end of the file", p.offset, "q4_0 short");

    /* Every ggml type: 256 elements (a multiple of every block size) take 256 / blck * size. */
    static const struct {
        uint32_t    code;
        const char *name;
        size_t      bytes;
    } every[] = {{0, "f32", 1024},       {1, "f16", 512},       {2, "q4_0", 144},      {3, "q4_1", 160},
                 {6, "q5_0", 176},       {7, "q5_1", 192},      {8, "q8_0", 272},      {9, "q8_1", 288},
                 {10, "q2_K", 84},       {11, "q3_K", 110},     {12, "q4_K", 144},     {13, "q5_K", 176},
                 {14, "q6_K", 210},      {15, "q8_K", 292},     {16, "iq2_xxs", 66},   {17, "iq2_xs", 74},
                 {18, "iq3_xxs", 98},    {19, "iq1_s", 50},     {20, "iq4_nl", 144},   {21, "iq3_s", 110},
                 {22, "iq2_s", 82},      {23, "iq4_xs", 136},   {24, "i8", 256},       {25, "i16", 512},
                 {26, "i32", 1024},      {27, "i64", 2048},     {28, "f64", 2048},     {29, "iq1_m", 56},
                 {30, "bf16", 512},      {34, "tq1_0", 54},     {35, "tq2_0", 66},     {39, "mxfp4", 136},
                 {40, "nvfp4", 144},     {41, "q1_0", 36}};
    int known = 0;
    for (size_t i = 0; i < sizeof every / sizeof every[0]; i++) {
        int64_t ne256 = 256;
        b = one_tensor(1, &ne256, every[i].code, 0, 2048, &p);
        g = open_ok(&b);
        TS_OK(kiln_gguf_tensor_info(g, 0, &t));
        ck_assert_str_eq(t.type_name, every[i].name);
        ck_assert_msg(t.bytes == every[i].bytes, "%s: %zu bytes", every[i].name, t.bytes);
        kiln_type kt;
        ck_assert(t.has_kiln_type == !kiln_type_from_name(every[i].name, &kt));
        if (t.has_kiln_type) {
            ck_assert_int_eq(t.type, kt);
            known++;
        }
        kiln_gguf_close(g);
    }
    ck_assert_int_eq(known, KILN_TYPE_COUNT);
}
END_TEST

START_TEST(malformed_data) {
    size_t  end;
    tpos    p;
    int64_t ne[1] = {16}; /* f32: 64 bytes */
    kb_str  b = one_tensor(1, ne, 0, 4, 128, &p);
    expect_bad(&b, "tensor 0 ('t') offset at offset 49: data offset 4 is not a multiple of the alignment 32", p.offset,
               "unaligned");
    b = one_tensor(1, ne, 0, (uint64_t)1 << 40, 128, &p);
    expect_bad(&b, "at data offset 1099511627776 run past the end of the file", p.offset, "offset past end");
    b = one_tensor(1, ne, 0, UINT64_MAX - 31, 128, &p);
    expect_bad(&b, "run past the end of the file", p.offset, "offset near 2^64");
    b = one_tensor(1, ne, 0, 96, 128, &p);
    expect_bad(&b, "its 64 bytes at data offset 96 run past the end of the file (the data section starts at 64 and has "
                   "128 bytes)",
               p.offset, "bytes past end");

    /* Overlaps, whichever order the infos come in; the message names both tensors. */
    static const struct {
        int         n;
        uint64_t    off[3];
        int         named; /* the tensor whose offset field the error points at */
        const char *want;
    } overlaps[] = {
        {2, {0, 32}, 1, "tensor 1 ('b') offset at offset 82: bytes [32, 96) overlap tensor 0 ('a') at [0, 64)"},
        {3, {32, 128, 0}, 0, "tensor 0 ('a') offset at offset 49: bytes [32, 96) overlap tensor 2 ('c') at [0, 64)"},
        {2, {0, 0}, 1, "tensor 1 ('b') offset at offset 82: bytes [0, 64) overlap tensor 0 ('a') at [0, 64)"},
    };
    for (size_t k = 0; k < sizeof overlaps / sizeof overlaps[0]; k++) {
        static const char *names[] = {"a", "b", "c"};
        tpos               pos[3];
        b = hdr(3, (uint64_t)overlaps[k].n, 0);
        for (int i = 0; i < overlaps[k].n; i++) pos[i] = put_tensor(&b, names[i], 1, ne, 0, overlaps[k].off[i]);
        put_pad(&b, 32);
        put_zeros(&b, 256);
        expect_bad(&b, overlaps[k].want, pos[overlaps[k].named].offset, "overlap");
    }

    /* Two tensors back to back and out of order are fine, as is a larger custom alignment. */
    b = hdr(3, 2, 1);
    put_key(&b, "general.alignment", KILN_GGUF_U32);
    kb_put_u32(&b, 128);
    put_tensor(&b, "a", 1, ne, 0, 128);
    put_tensor(&b, "b", 1, ne, 0, 0);
    put_pad(&b, 128);
    size_t data_at = b.len;
    put_zeros(&b, 192);
    kiln_gguf *g = open_ok(&b);
    ck_assert_uint_eq(kiln_gguf_alignment(g), 128);
    ck_assert_uint_eq(kiln_gguf_data_offset(g), data_at);
    kiln_gguf_close(g);
    b = hdr(3, 1, 1);
    put_key(&b, "general.alignment", KILN_GGUF_U32);
    kb_put_u32(&b, 128);
    p = put_tensor(&b, "a", 1, ne, 0, 64);
    put_pad(&b, 128);
    put_zeros(&b, 256);
    expect_bad(&b, "data offset 64 is not a multiple of the alignment 128", p.offset, "custom alignment");

    /* An alignment that is a power of 2 but larger than the file: the data section cannot start. */
    b = hdr(3, 1, 1);
    put_key(&b, "general.alignment", KILN_GGUF_U32);
    kb_put_u32(&b, (uint32_t)1 << 31);
    put_tensor(&b, "a", 1, ne, 0, 0);
    end = b.len;
    put_zeros(&b, 256);
    expect_bad(&b, "padding before the data section at offset", end, "alignment 2^31");

    /* The padding before the data section cut short. */
    b = hdr(3, 1, 0);
    put_tensor(&b, "t", 1, ne, 0, 0);
    end = b.len;
    put_zeros(&b, 3);
    expect_bad(&b, "padding before the data section at offset 57: truncated", end, "padding");
}
END_TEST

/* ---- damage: a valid file truncated at every byte, every byte flipped ------------------------- */

/* A small file with every section: strings, arrays of both kinds, and two tensors whose last
 * ends on the alignment (so that every shorter prefix loses bytes a reader needs). */
static char *small_file(size_t *len) {
    char             *dir = ts_tmpdir(), *path = path_in(dir, "s.gguf");
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    int32_t           ids[3] = {1, -2, 3};
    const char       *toks[2] = {"x", "yz"};
    float             w1[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint16_t          w2[16] = {0};
    int64_t           ne1[2] = {4, 2}, ne2 = 16;
    uint8_t           pad[64] = {0};
    /* First a kv as long as the least that n_kv = 6 pairs take: every later cut is past the
     * n_kv check and names the field it cuts. */
    kiln_gguf_set_arr(w, "a.pad", KILN_GGUF_U8, 64, pad);
    kiln_gguf_set_u32(w, "a.u32", 7);
    kiln_gguf_set_arr(w, "a.arr", KILN_GGUF_I32, 3, ids);
    kiln_gguf_set_arr_str(w, "a.strs", 2, toks);
    kiln_gguf_set_bool(w, "a.bool", true);
    kiln_gguf_set_str(w, "general.architecture", "llama");
    kiln_gguf_add_tensor(w, "w1", KILN_F32, 2, ne1, w1);
    kiln_gguf_add_tensor(w, "w2", KILN_F16, 1, &ne2, w2);
    TS_OK(kiln_gguf_write(w, path, NULL, NULL, NULL));
    kiln_gguf_writer_free(w);
    char *data = ts_read_file(path, len);
    free(path);
    ts_rmtree(dir);
    free(dir);
    return data;
}

START_TEST(truncated_everywhere) {
    size_t len;
    char  *data = small_file(&len);
    kiln_gguf *g;
    TS_OK(kiln_gguf_open_memory(data, len, "s", &g));
    kiln_gguf_close(g);
    /* Fields each section's truncation must name somewhere. */
    static const char *fields[] = {"magic at", "version at", "n_tensors at", "n_kv at offset 16: truncated",
                                   "n_kv at offset 16: 6 key-value pairs cannot fit", "kv 1 key length at",
                                   "kv 1 key at", "('a.pad') array count at",
                                   "('a.u32') value at", "('a.arr') array element type at",
                                   "('a.arr') array count at", "('a.strs') array count at",
                                   "('a.strs') element 1 length at", "('a.strs') element 1 at",
                                   "('a.bool') value at", "('general.architecture') value length at",
                                   "('general.architecture') value at", "tensor 0 name length at",
                                   "tensor 1 name at", "('w1') n_dims at", "('w1') ne[0] at", "('w1') ne[1] at",
                                   "('w1') type at", "('w2') offset at", "padding before the data section at",
                                   "('w1') offset at offset", "('w2') offset at offset"};
    enum { NF = sizeof fields / sizeof fields[0] };
    bool seen[NF] = {0};
    for (size_t n = 0; n < len; n++) {
        g = (kiln_gguf *)1;
        kiln_status st = kiln_gguf_open_memory(data, n, "cut.gguf", &g);
        ck_assert_msg(st != NULL, "opened when cut to %zu of %zu bytes", n, len);
        ck_assert_ptr_null(g);
        const char *m = kiln_status_msg(st);
        ck_assert_msg(kiln_status_code(st) == KILN_ERR_FORMAT && !strncmp(m, "cut.gguf: ", 10) && strstr(m, " at offset "),
                      "cut to %zu: %s", n, m);
        for (int f = 0; f < NF; f++)
            if (strstr(m, fields[f])) seen[f] = true;
        if (getenv("SHOW")) fprintf(stderr, "%zu: %s\n", n, m);
        kiln_status_free(st);
    }
    for (int f = 0; f < NF; f++) ck_assert_msg(seen[f], "no truncation named '%s'", fields[f]);
    free(data);
}
END_TEST

/* Reads everything an open file offers, as a loader would. */
static uint64_t touch_all(const kiln_gguf *g) {
    uint64_t sum = 0;
    for (int64_t i = 0; i < kiln_gguf_kv_count(g); i++) {
        const char    *key = kiln_gguf_kv_key(g, i), *s;
        size_t         len;
        int64_t        v;
        double         d;
        bool           b;
        kiln_gguf_type elem;
        uint64_t       n;
        const void    *data;
        ck_assert_int_eq(kiln_gguf_find_kv(g, key), i);
        kiln_status_free(kiln_gguf_get_int(g, key, &v));
        kiln_status_free(kiln_gguf_get_float(g, key, &d));
        kiln_status_free(kiln_gguf_get_bool(g, key, &b));
        kiln_status st = kiln_gguf_get_str(g, key, &s, &len);
        if (!st)
            for (size_t k = 0; k < len; k++) sum += (uint8_t)s[k];
        kiln_status_free(st);
        st = kiln_gguf_get_arr(g, key, &elem, &n, &data);
        if (st) {
            kiln_status_free(st);
            continue;
        }
        if (elem == KILN_GGUF_STRING) {
            for (uint64_t k = 0; k < n; k++) {
                TS_OK(kiln_gguf_get_arr_str(g, key, k, &s, &len));
                for (size_t c = 0; c < len; c++) sum += (uint8_t)s[c];
            }
        } else if (n) {
            sum += ((const uint8_t *)data)[0] + ((const uint8_t *)data)[n - 1];
        }
    }
    for (int64_t i = 0; i < kiln_gguf_tensor_count(g); i++) {
        kiln_gguf_tensor t;
        TS_OK(kiln_gguf_tensor_info(g, i, &t));
        ck_assert_int_eq(kiln_gguf_find_tensor(g, t.name), i);
        const uint8_t *d = t.data;
        sum += d[0] + d[t.bytes - 1];
    }
    return sum;
}

START_TEST(flipped_bytes) {
    size_t len;
    char  *data = small_file(&len), *copy = malloc(len);
    static const uint8_t masks[] = {0x01, 0x80, 0xff, 0x40};
    int                  opened = 0, refused = 0;
    for (size_t i = 0; i < len; i++)
        for (size_t m = 0; m < sizeof masks; m++) {
            memcpy(copy, data, len);
            copy[i] = (char)(copy[i] ^ masks[m]);
            kiln_gguf  *g = NULL;
            kiln_status st = kiln_gguf_open_memory(copy, len, "flip.gguf", &g);
            if (st) {
                ck_assert_msg(kiln_status_code(st) == KILN_ERR_FORMAT && strstr(kiln_status_msg(st), "flip.gguf: ") &&
                                  strstr(kiln_status_msg(st), " at offset "),
                              "byte %zu ^ 0x%02x: %s", i, masks[m], kiln_status_msg(st));
                kiln_status_free(st);
                refused++;
            } else {
                touch_all(g);
                kiln_gguf_close(g);
                opened++;
            }
        }
    ck_assert_int_gt(refused, 0);
    ck_assert_int_gt(opened, 0); /* e.g. flips inside tensor data or string values */
    free(copy);
    free(data);
}
END_TEST

/* ---- files, and scale ------------------------------------------------------------------------- */

START_TEST(open_files) {
    char      *dir = ts_tmpdir(), *path = path_in(dir, "none.gguf");
    kiln_gguf *g = (kiln_gguf *)1;
    expect_err(kiln_gguf_open(path, &g), KILN_ERR_IO, "none.gguf: cannot open", "missing");
    ck_assert_ptr_null(g);
    expect_err(kiln_gguf_open(dir, &g), KILN_ERR_IO, "not a regular file", "directory");
    FILE *f = fopen(path, "wb");
    fclose(f);
    expect_err(kiln_gguf_open(path, &g), KILN_ERR_FORMAT, "none.gguf: magic at offset 0: truncated", "empty file");
    expect_err(kiln_gguf_open(NULL, &g), KILN_ERR_INVALID, NULL, "NULL path");
    expect_err(kiln_gguf_open(path, NULL), KILN_ERR_INVALID, NULL, "NULL out");
    expect_err(kiln_gguf_open_memory(NULL, 4, "x", &g), KILN_ERR_INVALID, NULL, "NULL data");
    expect_err(kiln_gguf_open_memory(NULL, 0, NULL, &g), KILN_ERR_FORMAT, "<memory>: magic", "no bytes");
    kiln_gguf_close(NULL);
    ck_assert_str_eq(kiln_gguf_type_name(KILN_GGUF_STRING), "string");
    ck_assert_str_eq(kiln_gguf_type_name(KILN_GGUF_TYPE_COUNT), "?");
    free(path);
    ts_rmtree(dir);
    free(dir);
}
END_TEST

static kiln_status fill_zero(void *user, int64_t i, const char *name, uint64_t offset, void *buf, size_t bytes) {
    memset(buf, 0, bytes);
    return NULL;
}

/* A 150k-token vocabulary and 1000 tensors: element i and each name found directly. */
START_TEST(large_vocab) {
    enum { NV = 150000, NT = 1000 };
    char             *dir = ts_tmpdir(), *path = path_in(dir, "vocab.gguf");
    char            **toks = malloc(NV * sizeof *toks);
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    for (int i = 0; i < NV; i++) {
        toks[i] = malloc(24);
        snprintf(toks[i], 24, "tok%d%s", i, i % 7 ? "" : "\xc4\xa0");
    }
    kiln_gguf_set_arr_str(w, "tokenizer.ggml.tokens", NV, (const char *const *)toks);
    for (int i = 0; i < NT; i++) {
        char    name[48];
        int64_t ne = 8;
        snprintf(name, sizeof name, "blk.%d.ffn_up.weight", i);
        kiln_gguf_add_tensor(w, name, KILN_F32, 1, &ne, NULL);
    }
    TS_OK(kiln_gguf_write(w, path, fill_zero, NULL, NULL));
    kiln_gguf_writer_free(w);
    double     t0 = kb_now_ms();
    kiln_gguf *g;
    TS_OK(kiln_gguf_open(path, &g));
    for (int i = NV - 1; i >= 0; i -= 7) {
        const char *s;
        size_t      len;
        TS_OK(kiln_gguf_get_arr_str(g, "tokenizer.ggml.tokens", (uint64_t)i, &s, &len));
        ck_assert(len == strlen(toks[i]) && !memcmp(s, toks[i], len));
    }
    for (int i = 0; i < NT; i++) {
        char name[48];
        snprintf(name, sizeof name, "blk.%d.ffn_up.weight", i);
        ck_assert_int_eq(kiln_gguf_find_tensor(g, name), i);
    }
    fprintf(stderr, "large_vocab: open and %d lookups in %.1f ms\n", NV / 7 + NT, kb_now_ms() - t0);
    kiln_gguf_close(g);
    for (int i = 0; i < NV; i++) free(toks[i]);
    free(toks);
    free(path);
    ts_rmtree(dir);
    free(dir);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gguf",
                        TS_CASE("gguf", 60),
                        TS_TESTS(roundtrip_values, roundtrip_tensors, writer_bytes_exact, deterministic, fill_chunks,
                                 writer_errors, malformed_header, malformed_kv, malformed_tensor, malformed_data,
                                 truncated_everywhere, flipped_bytes, open_files, large_vocab));
    return ts_main(s);
}
