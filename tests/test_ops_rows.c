/* The rows family (get_rows, set_rows, concat, pad, add_id): the CPU reference on cases computed
 * by hand, the shape and type errors, and every op's kernels generated and NVRTC-compiled for
 * sm_90a and sm_80 over a spread of shapes, types and layouts (no GPU needed). */
#include "tests/support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "codegen/codegen.h"

#include <nvrtc.h>

/* ---- the reference on small graphs ----------------------------------------------------------- */

#define MAX_IO 8

typedef struct {
    const char *name;
    kiln_type   type;
    int64_t     n;
    const void *data;
} leaf;

typedef struct {
    leaf    in[MAX_IO];
    int     nin;
    char    out_name[MAX_IO][64];
    float   out[MAX_IO][256]; /* outputs as f32 */
    int64_t nout_elems[MAX_IO];
    int     nout;
} io;

static const void *io_get(void *user, const char *name, kiln_type type, int64_t n) {
    io *x = user;
    for (int i = 0; i < x->nin; i++) {
        if (strcmp(x->in[i].name, name) != 0) continue;
        ck_assert_msg(x->in[i].type == type && x->in[i].n == n, "leaf %s: reference wants %s x %lld", name,
                      kiln_type_name(type), (long long)n);
        return x->in[i].data;
    }
    ck_abort_msg("no data for leaf %s", name);
    return NULL;
}

static void io_put(void *user, const char *name, kiln_type type, int64_t n, const void *data) {
    io *x = user;
    ck_assert_int_lt(x->nout, MAX_IO);
    ck_assert_int_le(n, 256);
    snprintf(x->out_name[x->nout], 64, "%s", name);
    for (int64_t i = 0; i < n; i++) x->out[x->nout][i] = kb_load_f32(data, type, i);
    x->nout_elems[x->nout] = n;
    x->nout++;
}

static void add_in(io *x, const char *name, kiln_type t, int64_t n, const void *data) {
    ck_assert_int_lt(x->nin, MAX_IO);
    x->in[x->nin++] = (leaf){name, t, n, data};
}

/* Runs the reference of kg; returns its status (the graph must build). */
static kiln_status reference(const char *kg, io *x) {
    kiln_ctx   *ctx;
    kiln_graph *g = ts_build(kg, &ctx);
    x->nout = 0;
    kiln_status st = kiln_reference(g, io_get, io_put, x);
    ts_graph_free(g, ctx);
    return st;
}

static const float *output(io *x, const char *name, int64_t n) {
    for (int i = 0; i < x->nout; i++)
        if (strcmp(x->out_name[i], name) == 0) {
            ck_assert_int_eq(x->nout_elems[i], n);
            return x->out[i];
        }
    ck_abort_msg("no output %s", name);
    return NULL;
}

static void expect(const float *got, const float *want, int n, const char *what) {
    for (int i = 0; i < n; i++)
        ck_assert_msg(got[i] == want[i] || (isnan(got[i]) && isnan(want[i])),
                      "%s: element %d is %g, expected %g", what, i, got[i], want[i]);
}

/* 1, 2, 3, ... */
static void iota(float *v, int n, float start) {
    for (int i = 0; i < n; i++) v[i] = start + (float)i;
}

START_TEST(get_rows_by_hand) {
    /* a: 4 rows of 3 (1..12); rows 2, 0, 2. */
    float   a[12];
    int32_t ids[3] = {2, 0, 2};
    iota(a, 12, 1);
    io x = {0};
    add_in(&x, "a", KILN_F32, 12, a);
    add_in(&x, "i", KILN_I32, 3, ids);
    TS_OK(reference("input a: f32[3, 4]\ninput i: i32[3]\noutput y = get_rows(a, i)\n", &x));
    const float want[9] = {7, 8, 9, 1, 2, 3, 7, 8, 9};
    expect(output(&x, "y", 9), want, 9, "get_rows f32");

    /* f16 source: the result is f32 (ggml_get_rows), values exact. */
    uint16_t h[12];
    for (int i = 0; i < 12; i++) h[i] = kb_f32_to_f16(a[i] * 0.5f);
    io y = {0};
    add_in(&y, "a", KILN_F16, 12, h);
    add_in(&y, "i", KILN_I32, 3, ids);
    TS_OK(reference("input a: f16[3, 4]\ninput i: i32[3]\noutput y = get_rows(a, i)\n", &y));
    const float half[9] = {3.5f, 4, 4.5f, 0.5f, 1, 1.5f, 3.5f, 4, 4.5f};
    expect(output(&y, "y", 9), half, 9, "get_rows f16");

    /* 3-D: a is two 3x2 matrices; ids [2, 2] picks rows of matrix j for column j of ids. */
    float   b[12];
    int32_t bi[4] = {1, 1, 2, 0}; /* matrix 0: rows 1, 1; matrix 1: rows 2, 0 */
    iota(b, 12, 0);
    io z = {0};
    add_in(&z, "a", KILN_F32, 12, b);
    add_in(&z, "i", KILN_I32, 4, bi);
    TS_OK(reference("input a: f32[2, 3, 2]\ninput i: i32[2, 2]\noutput y = get_rows(a, i)\n", &z));
    const float w3[8] = {2, 3, 2, 3, 10, 11, 6, 7};
    expect(output(&z, "y", 8), w3, 8, "get_rows 3-D");
}
END_TEST

START_TEST(set_rows_by_hand) {
    /* a: 4 rows of 2; b: 3 rows; ids 3, 1, 3: row 3 takes b's last row (ggml's loop order). */
    float   a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    float   b[6] = {10, 11, 20, 21, 30, 31};
    int64_t ids[3] = {3, 1, 3};
    io      x = {0};
    add_in(&x, "a", KILN_F32, 8, a);
    add_in(&x, "b", KILN_F32, 6, b);
    add_in(&x, "i", KILN_I64, 3, ids);
    TS_OK(reference("input a: f32[2, 4]\ninput b: f32[2, 3]\ninput i: i64[3]\noutput y = set_rows(a, b, i)\n", &x));
    const float want[8] = {1, 2, 20, 21, 5, 6, 30, 31};
    expect(output(&x, "y", 8), want, 8, "set_rows f32");

    /* f16 destination: b's values are rounded to f16 (1 + 2^-12 rounds to 1, to even). */
    uint16_t h[8];
    for (int i = 0; i < 8; i++) h[i] = kb_f32_to_f16(a[i]);
    float   bb[2] = {1.0f + 0x1p-12f, -2.5f};
    int32_t one[1] = {0};
    io      y = {0};
    add_in(&y, "a", KILN_F16, 8, h);
    add_in(&y, "b", KILN_F32, 2, bb);
    add_in(&y, "i", KILN_I32, 1, one);
    TS_OK(reference("input a: f16[2, 4]\ninput b: f32[2, 1]\ninput i: i32[1]\noutput y = set_rows(a, b, i)\n", &y));
    const float wh[8] = {1, -2.5f, 3, 4, 5, 6, 7, 8};
    expect(output(&y, "y", 8), wh, 8, "set_rows f16");

    /* Broadcast: a [1, 2, 4] (4 matrices of 2 rows), b [1, 1, 4], ids [1, 2]: matrix k uses
     * ids[0, k % 2]. */
    float   a3[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float   b3[4] = {1, 2, 3, 4};
    int32_t i3[2] = {1, 0};
    io      z = {0};
    add_in(&z, "a", KILN_F32, 8, a3);
    add_in(&z, "b", KILN_F32, 4, b3);
    add_in(&z, "i", KILN_I32, 2, i3);
    TS_OK(reference("input a: f32[1, 2, 4]\ninput b: f32[1, 1, 4]\ninput i: i32[1, 2]\noutput y = set_rows(a, b, i)\n", &z));
    const float w3[8] = {0, 1, 2, 0, 0, 3, 4, 0};
    expect(output(&z, "y", 8), w3, 8, "set_rows broadcast");
}
END_TEST

START_TEST(concat_by_hand) {
    float a[6], b[4];
    iota(a, 6, 1);   /* [3, 2] */
    iota(b, 4, 100); /* [2, 2] along dim 0, or [3, ...] below */
    io x = {0};
    add_in(&x, "a", KILN_F32, 6, a);
    add_in(&x, "b", KILN_F32, 4, b);
    TS_OK(reference("input a: f32[3, 2]\ninput b: f32[2, 2]\noutput y = concat(a, b, 0)\n", &x));
    const float w0[10] = {1, 2, 3, 100, 101, 4, 5, 6, 102, 103};
    expect(output(&x, "y", 10), w0, 10, "concat dim 0");

    float c[3] = {7, 8, 9};
    io    y = {0};
    add_in(&y, "a", KILN_F32, 6, a);
    add_in(&y, "c", KILN_F32, 3, c);
    TS_OK(reference("input a: f32[3, 2]\ninput c: f32[3, 1]\noutput y = concat(a, c, 1)\n"
                    "output z = concat(c, a, 1)\n", &y));
    const float w1[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    const float w1b[9] = {7, 8, 9, 1, 2, 3, 4, 5, 6};
    expect(output(&y, "y", 9), w1, 9, "concat dim 1");
    expect(output(&y, "z", 9), w1b, 9, "concat dim 1 (swapped)");

    /* dims 2 and 3 of 1-element tensors, and a transposed operand: t = [[1, 4], [2, 5], [3, 6]]. */
    io z = {0};
    add_in(&z, "a", KILN_F32, 6, a);
    TS_OK(reference("input a: f32[3, 2]\nt = transpose(a)\noutput y = concat(t, t, 3)\n"
                    "output w = concat(t, t, 2)\n", &z));
    const float wt[12] = {1, 4, 2, 5, 3, 6, 1, 4, 2, 5, 3, 6};
    expect(output(&z, "y", 12), wt, 12, "concat dim 3 of a transposed view");
    expect(output(&z, "w", 12), wt, 12, "concat dim 2 of a transposed view");
}
END_TEST

START_TEST(pad_by_hand) {
    float a[4] = {1, 2, 3, 4}; /* [2, 2] */
    io    x = {0};
    add_in(&x, "a", KILN_F32, 4, a);
    TS_OK(reference("input a: f32[2, 2]\noutput y = pad(a, 1, 0, 0, 1)\n"
                    "output z = pad(a, rp2=1, lp3=1)\n", &x));
    const float want[9] = {0, 1, 2, 0, 3, 4, 0, 0, 0};
    expect(output(&x, "y", 9), want, 9, "pad lp0=1 rp1=1");
    const float wz[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 0, 0, 0, 0};
    expect(output(&x, "z", 16), wz, 16, "pad rp2=1 lp3=1");

    /* bf16 keeps its type and values. */
    uint16_t h[4];
    for (int i = 0; i < 4; i++) h[i] = kb_f32_to_bf16(a[i]);
    io y = {0};
    add_in(&y, "a", KILN_BF16, 4, h);
    TS_OK(reference("input a: bf16[2, 2]\noutput y = pad(a, 0, 1)\n", &y));
    const float wb[6] = {1, 2, 0, 3, 4, 0};
    expect(output(&y, "y", 6), wb, 6, "pad bf16");
}
END_TEST

START_TEST(add_id_by_hand) {
    /* a [2, 2, 2] (2 experts used, 2 tokens), b [2, 3] (3 expert biases), ids [2, 2]. */
    float   a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    float   b[6] = {10, 20, 30, 40, 50, 60};
    int32_t ids[4] = {2, 0, 1, 1};
    io      x = {0};
    add_in(&x, "a", KILN_F32, 8, a);
    add_in(&x, "b", KILN_F32, 6, b);
    add_in(&x, "i", KILN_I32, 4, ids);
    TS_OK(reference("input a: f32[2, 2, 2]\ninput b: f32[2, 3]\ninput i: i32[2, 2]\noutput y = add_id(a, b, i)\n", &x));
    const float want[8] = {51, 62, 13, 24, 35, 46, 37, 48};
    expect(output(&x, "y", 8), want, 8, "add_id");
}
END_TEST

/* An index out of range is a reference error naming the node, the index and the extent. */
START_TEST(reference_index_errors) {
    float   a[6] = {0};
    int32_t bad[2] = {0, 3};
    io      x = {0};
    add_in(&x, "a", KILN_F32, 6, a);
    add_in(&x, "i", KILN_I32, 2, bad);
    kiln_status st = reference("input a: f32[2, 3]\ninput i: i32[2]\noutput y = get_rows(a, i)\n", &x);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_INVALID);
    ck_assert_msg(strstr(kiln_status_msg(st), "'y'") && strstr(kiln_status_msg(st), "= 3") &&
                      strstr(kiln_status_msg(st), "3 rows"),
                  "%s", kiln_status_msg(st));
    kiln_status_free(st);

    int64_t neg[1] = {-1};
    float   b[2] = {0};
    io      y = {0};
    add_in(&y, "a", KILN_F32, 6, a);
    add_in(&y, "b", KILN_F32, 2, b);
    add_in(&y, "i", KILN_I64, 1, neg);
    st = reference("input a: f32[2, 3]\ninput b: f32[2, 1]\ninput i: i64[1]\noutput y = set_rows(a, b, i)\n", &y);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_INVALID);
    ck_assert_msg(strstr(kiln_status_msg(st), "set_rows") && strstr(kiln_status_msg(st), "-1"), "%s",
                  kiln_status_msg(st));
    kiln_status_free(st);

    int32_t big[2] = {0, 5};
    io      z = {0};
    add_in(&z, "a", KILN_F32, 6, a);
    add_in(&z, "b", KILN_F32, 6, a);
    add_in(&z, "i", KILN_I32, 2, big);
    st = reference("input a: f32[3, 2]\ninput b: f32[3, 2]\ninput i: i32[2]\noutput y = add_id(a, b, i)\n", &z);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_INVALID);
    ck_assert_msg(strstr(kiln_status_msg(st), "add_id") && strstr(kiln_status_msg(st), "= 5"), "%s",
                  kiln_status_msg(st));
    kiln_status_free(st);
}
END_TEST

/* ---- shape and type errors ------------------------------------------------------------------- */

static const char DECLS[] = "input a: f32[4, 3]\ninput a3: f32[4, 3, 2]\ninput h: f16[4, 3]\n"
                            "input i: i32[2]\ninput i2: i32[2, 3]\ninput l: i64[2]\ninput f: f32[2]\n"
                            "input b: f32[4, 2]\ninput e: f32[4, 5]\ninput j: i32[3]\n";

/* Parsing DECLS + stmt fails with code and a message containing each of want[]. */
static void expect_error(const char *stmt, kiln_code code, const char *const *want) {
    char text[2048];
    snprintf(text, sizeof text, "%soutput y = %s\n", DECLS, stmt);
    ts_parse_error(text, code, want);
}

#define WANT(...) ((const char *const[]){__VA_ARGS__, NULL})

START_TEST(shape_errors) {
    expect_error("get_rows(a, f)", KILN_ERR_SHAPE, WANT("get_rows", "'f'", "f32[2]", "i32"));
    expect_error("get_rows(a, l)", KILN_ERR_SHAPE, WANT("get_rows", "'l'", "i32"));
    expect_error("get_rows(i, i)", KILN_ERR_SHAPE, WANT("get_rows", "'i'", "f32, f16 or bf16"));
    expect_error("get_rows(a3, i)", KILN_ERR_SHAPE, WANT("get_rows", "ne2", "'a3'", "ne1", "'i'"));
    expect_error("get_rows(a3, i2)", KILN_ERR_SHAPE, WANT("get_rows", "'a3' (f32[4, 3, 2])", "'i2' (i32[2, 3])"));
    expect_error("set_rows(a, h, i)", KILN_ERR_SHAPE, WANT("set_rows", "source", "'h'", "f32"));
    expect_error("set_rows(a, b, f)", KILN_ERR_SHAPE, WANT("set_rows", "'f'", "i32 or i64"));
    expect_error("set_rows(a, b, j)", KILN_ERR_SHAPE, WANT("set_rows", "ne1 of 'b'", "ne0 of 'j'"));
    expect_error("set_rows(a, e, j)", KILN_ERR_SHAPE, WANT("set_rows", "'e'"));
    expect_error("set_rows(a3, a3, i2)", KILN_ERR_SHAPE, WANT("set_rows", "ne1 of 'a3'", "ne0 of 'i2'"));
    expect_error("concat(a, h, 0)", KILN_ERR_SHAPE, WANT("concat", "'a'", "'h'", "same type"));
    expect_error("concat(a, b, 0)", KILN_ERR_SHAPE, WANT("concat", "differ in dim 1"));
    expect_error("concat(a, a, 4)", KILN_ERR_INVALID, WANT("concat", "dim is 4"));
    expect_error("concat(a, a, -1)", KILN_ERR_INVALID, WANT("concat", "dim is -1"));
    expect_error("concat(i, i, 0)", KILN_ERR_SHAPE, WANT("concat", "f32, f16 or bf16"));
    expect_error("pad(a, 1, -2)", KILN_ERR_INVALID, WANT("pad", "rp0 is -2"));
    expect_error("pad(a, lp3=-1)", KILN_ERR_INVALID, WANT("pad", "lp3 is -1"));
    expect_error("pad(l, 1)", KILN_ERR_SHAPE, WANT("pad", "'l'"));
    expect_error("add_id(h, e, j)", KILN_ERR_SHAPE, WANT("add_id", "'h'", "f32"));
    expect_error("add_id(a, e, l)", KILN_ERR_SHAPE, WANT("add_id", "'l'", "i32"));
    expect_error("add_id(a, e, i)", KILN_ERR_SHAPE, WANT("add_id", "ne1 of 'a'", "ne0 of 'i'"));
    expect_error("add_id(a, f, j)", KILN_ERR_SHAPE, WANT("add_id", "ne0 of 'a'", "ne0 of 'f'"));
}
END_TEST

/* The C builders give the same shapes and types as the rules. */
START_TEST(builders) {
    kiln_ctx    *ctx = kiln_ctx_new();
    int64_t      na[3] = {8, 10, 3}, ni[2] = {4, 3}, nb[3] = {8, 4, 3};
    kiln_tensor *a = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_BF16, "a", 3, na);
    kiln_tensor *i = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_I32, "i", 2, ni);
    kiln_tensor *b = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "b", 3, nb);
    kiln_tensor *g = kiln_get_rows(ctx, a, i);
    ck_assert_ptr_nonnull(g);
    ck_assert_int_eq(kiln_tensor_type(g), KILN_F32);
    ck_assert_int_eq(kiln_tensor_ne(g, 0), 8);
    ck_assert_int_eq(kiln_tensor_ne(g, 1), 4);
    ck_assert_int_eq(kiln_tensor_ne(g, 2), 3);
    int64_t      n1[1] = {4};
    kiln_tensor *i1 = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_I64, "i1", 1, n1);
    kiln_tensor *s = kiln_set_rows(ctx, a, b, i1);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(kiln_tensor_type(s), KILN_BF16);
    ck_assert_int_eq(kiln_tensor_ne(s, 1), 10);
    kiln_tensor *c = kiln_concat(ctx, a, a, 2);
    ck_assert_int_eq(kiln_tensor_ne(c, 2), 6);
    kiln_tensor *p = kiln_pad_ext(ctx, a, 1, 2, 3, 4, 0, 1, 2, 0);
    ck_assert_int_eq(kiln_tensor_ne(p, 0), 11);
    ck_assert_int_eq(kiln_tensor_ne(p, 1), 17);
    ck_assert_int_eq(kiln_tensor_ne(p, 2), 4);
    ck_assert_int_eq(kiln_tensor_ne(p, 3), 3);
    kiln_tensor *q = kiln_pad(ctx, a, 1, 0, 0, 1);
    ck_assert_int_eq(kiln_tensor_ne(q, 0), 9);
    ck_assert_int_eq(kiln_tensor_ne(q, 3), 2);
    kiln_status st = kiln_ctx_status(ctx);
    ck_assert_msg(st == NULL, "%s", kiln_status_msg(st));
    kiln_ctx_free(ctx);
}
END_TEST

/* ---- kernels: generated and compiled ---------------------------------------------------------- */

/* Graphs whose kernels must compile: each a .kg body, outputs named y*. */
static const char *const GRAPHS[] = {
    /* get_rows: the vector path (f32, bf16), odd rows, 3-D ids, a permuted table, strided ids,
     * a padded view (rows not 16-byte aligned). */
    "input a: f32[4096, 64]\ninput i: i32[32]\noutput y = get_rows(a, i)\n",
    "input a: bf16[1024, 300]\ninput i: i32[512]\noutput y = get_rows(a, i)\n",
    "input a: f16[7, 5, 3]\ninput i: i32[4, 3]\noutput y = get_rows(a, i)\n",
    "input a: f32[4097, 3]\ninput i: i32[9]\noutput y = get_rows(a, i)\n",
    "input a: f16[5, 8, 2, 3]\np = permute(a, 1, 0, 2, 3)\ninput k: i32[6, 2, 3]\noutput y = get_rows(p, k)\n",
    "input a: f32[4, 3, 2]\ninput i: i32[2, 5]\nt = transpose(i)\noutput y = get_rows(a, t)\n",
    "input a: f32[130, 9]\nv = view(a, [128, 9], [520], 8)\ninput i: i32[3]\noutput y = get_rows(v, i)\n",
    /* set_rows: i32/i64 ids, broadcast ids, each type, permuted and viewed operands. */
    "input a: f16[128, 64]\ninput b: f32[128, 5]\ninput i: i64[5]\noutput y = set_rows(a, b, i)\n",
    "input a: bf16[7, 10, 4]\ninput b: f32[7, 3, 4]\ninput i: i32[3, 2]\noutput y = set_rows(a, b, i)\n",
    "input a: f32[4097, 2]\ninput b: f32[4097, 1]\ninput i: i32[1]\noutput y = set_rows(a, b, i)\n",
    "input a: f32[6, 8, 2]\np = permute(a, 1, 0, 2, 3)\ninput b: f32[3, 8, 2]\nt = permute(b, 1, 0, 2, 3)\n"
    "input i: i64[3, 1]\noutput y = set_rows(p, t, i)\n",
    "input a: f16[1, 1]\ninput b: f32[1, 1]\ninput i: i32[1]\noutput y = set_rows(a, b, i)\n",
    /* concat along each dim and type, odd and aligned sizes, a transposed operand. */
    "input a: f32[256, 4]\ninput b: f32[128, 4]\noutput y = concat(a, b, 0)\n",
    "input a: f16[7, 4]\ninput b: f16[9, 4]\noutput y = concat(a, b, 0)\n",
    "input a: bf16[64, 3, 2]\ninput b: bf16[64, 5, 2]\noutput y = concat(a, b, 1)\n",
    "input a: f32[5, 3, 2, 2]\ninput b: f32[5, 3, 1, 2]\noutput y = concat(a, b, 2)\n",
    "input a: f16[8, 3, 2, 1]\ninput b: f16[8, 3, 2, 3]\noutput y = concat(a, b, 3)\n",
    "input a: f32[3, 5]\nt = transpose(a)\ninput b: f32[5, 2]\noutput y = concat(t, b, 1)\noutput y2 = concat(b, t, 1)\n",
    /* pad: vector path (lp0 % 4 == 0), scalar path, every dim, each type, a permuted operand. */
    "input a: f32[64, 8]\noutput y = pad(a, 4, 4, 1, 0)\n",
    "input a: f16[7, 3, 2]\noutput y = pad(a, 1, 2, 0, 1, 2, 0)\n",
    "input a: bf16[8, 2, 2, 2]\noutput y = pad(a, 0, 0, 0, 0, 1, 1, 1, 1)\n",
    "input a: f32[5, 6, 2]\np = permute(a, 2, 0, 1, 3)\noutput y = pad(p, 3, 1, 1, 1)\n",
    /* add_id: the shapes of MoE biases, odd rows, a permuted operand. */
    "input a: f32[2880, 4, 5]\ninput b: f32[2880, 32]\ninput i: i32[4, 5]\noutput y = add_id(a, b, i)\n",
    "input a: f32[7, 3, 2]\ninput b: f32[7, 4]\ninput i: i32[3, 2]\noutput y = add_id(a, b, i)\n",
    "input a: f32[3, 8, 2]\np = permute(a, 1, 0, 2, 3)\ninput b: f32[8, 6]\ninput i: i32[3, 2]\n"
    "output y = add_id(p, b, i)\n",
};

START_TEST(kernels_compile) {
    char *cache = ts_tmpdir();
    int   ok = 0;
    for (size_t g = 0; g < sizeof GRAPHS / sizeof GRAPHS[0]; g++) {
        kiln_ctx   *ctx;
        kiln_graph *graph = ts_build(GRAPHS[g], &ctx);
        static const char *const archs[] = {"sm_90a", "sm_80"};
        for (int a = 0; a < 2; a++) {
            kiln_compile_opts o = {0};
            o.arch = archs[a];
            o.cache_dir = cache;
            kiln_program *p = NULL;
            kiln_status   st = kiln_compile(graph, &o, &p);
            ck_assert_msg(st == NULL, "graph %zu (%s) for %s: %s", g, GRAPHS[g], archs[a], kiln_status_msg(st));
            int n = kiln_program_kernel_count(p);
            ck_assert_int_ge(n, 1);
            for (int k = 0; k < n && a == 0; k++) {
                const char *src = kiln_program_kernel_source(p, k);
                ck_assert_ptr_nonnull(src);
                ck_assert_msg(strstr(src, "kiln rows kernel") || strstr(src, "elementwise"),
                              "graph %zu: kernel %d is not a rows kernel", g, k);
                ts_nvrtc_clean(src, kiln_program_kernel_name(p, k), NULL);
            }
            kiln_program_free(p);
            ok++;
        }
        ts_graph_free(graph, ctx);
    }
    ck_assert_int_eq(ok, (int)(2 * sizeof GRAPHS / sizeof GRAPHS[0]));
    ts_tmpdir_free(cache);
}
END_TEST

/* Generation is deterministic, and identical nodes over different buffers share a source. */
START_TEST(kernels_deterministic) {
    const char *kg = "input a: f16[64, 10]\ninput b: f16[64, 10]\ninput i: i32[4]\n"
                     "output y = get_rows(a, i)\noutput z = get_rows(b, i)\n";
    char       *src[2][2];
    for (int run = 0; run < 2; run++) {
        kiln_ctx   *ctx;
        kiln_graph *g = ts_build(kg, &ctx);
        kiln_compile_opts o = {0};
        o.skip_nvrtc = 1;
        kiln_program *p = NULL;
        TS_OK(kiln_compile(g, &o, &p));
        ck_assert_int_eq(kiln_program_kernel_count(p), 2);
        for (int k = 0; k < 2; k++) {
            const char *s = kiln_program_kernel_source(p, k);
            /* Drop the dump header (it names the graph's nodes). */
            const char *body = strstr(s, "// kiln rows kernel");
            ck_assert_ptr_nonnull(body);
            src[run][k] = strdup(body);
        }
        ts_compiled_free(p, g, ctx);
    }
    ck_assert_str_eq(src[0][0], src[1][0]);
    ck_assert_str_eq(src[0][0], src[0][1]);
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < 2; k++) free(src[r][k]);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("ops_rows",
                        TS_CASE("reference", 0),
                        TS_TESTS(get_rows_by_hand, set_rows_by_hand, concat_by_hand, pad_by_hand, add_id_by_hand,
                                 reference_index_errors, shape_errors, builders),
                        TS_CASE("kernels", 120), TS_TESTS(kernels_compile, kernels_deterministic));
    return ts_main(s);
}
