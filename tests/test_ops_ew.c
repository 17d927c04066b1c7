/* The elementwise-lowered ops beyond the unary/binary ones: add1, the gated linear units (reglu,
 * geglu, swiglu, swiglu_oai, geglu_erf, geglu_quick; one-tensor form, swapped, split form) and
 * the copies (cpy, dup, cast, repeat). The CPU reference against values worked out by hand from
 * ggml's definitions (ggml-cpu vec.h / ops.cpp), the shape rules and their errors, and every
 * kernel generated and compiled by NVRTC for sm_90a and sm_80 (no GPU needed). */
#include "tests/support.h"

#include "base/base.h"
#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "ir/ir.h"

#include <math.h>
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a small reference harness: named host buffers in, named outputs back ------------------- */

/* Output `name` is n values of type t close to want[] (relative tol; 0 = exact). */
static void expect(ts_buf *b, const char *name, kiln_type t, const float *want, int64_t n, double tol) {
    ts_buf *o = ts_buf_find(b, name);
    ck_assert_msg(o->out, "no output %s", name);
    ck_assert_msg(o->type == t, "%s is %s, want %s", name, kiln_type_name(o->type), kiln_type_name(t));
    ck_assert_msg(o->n == n, "%s has %lld elements, want %lld", name, (long long)o->n, (long long)n);
    for (int64_t i = 0; i < n; i++) {
        double got = kb_load_f32(o->out, t, i), w = want[i];
        bool   ok = tol == 0 ? got == w || (isnan(got) && isnan(w)) : fabs(got - w) <= tol * fmax(1.0, fabs(w));
        ck_assert_msg(ok, "%s[%lld] = %.9g, want %.9g", name, (long long)i, got, w);
    }
}

/* Output `name` holds exactly the raw 16-bit elements want[] (f16 / bf16 bit patterns). */
static void expect_bits(ts_buf *b, const char *name, kiln_type t, const uint16_t *want, int64_t n) {
    ts_buf *o = ts_buf_find(b, name);
    ck_assert_msg(o->out && o->type == t && o->n == n, "%s: bad output", name);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(((const uint16_t *)o->out)[i] == want[i], "%s[%lld] = 0x%04x, want 0x%04x", name,
                      (long long)i, ((const uint16_t *)o->out)[i], want[i]);
}

/* ---- gated linear units, by hand ------------------------------------------------------------- */

/* x = {1, -2, 0.25, 4}, g = {3, 0.5, -1.5, 2}. Rows of a are [x | g] and [g | x], so row 0 of
 * the one-tensor form is act(x) * g and row 1 act(g) * x (swapped: the other way round). The
 * values are ggml's formulas evaluated in double: silu(v) = v / (1 + e^-v); gelu the tanh form
 * 0.5 v (1 + tanh(sqrt(2/pi) v (1 + 0.044715 v^2))); gelu_erf 0.5 v (1 + erf(v / sqrt 2));
 * gelu_quick v / (1 + e^(-1.702 v)); relu max(v, 0). */
static const float GLU_X[4] = {1, -2, 0.25f, 4}, GLU_G[4] = {3, 0.5f, -1.5f, 2};

static const struct {
    const char *op;
    float       xg[4]; /* act(x) * g */
    float       gx[4]; /* act(g) * x */
} GLU_HAND[] = {
    {"reglu", {3, 0, -0.375f, 8}, {3, -1, 0, 8}},
    {"swiglu", {2.19317574f, -0.119202922f, -0.210816188f, 7.85611032f},
     {2.85772238f, -0.622459331f, -0.0684095714f, 7.04637662f}},
    {"geglu", {2.52357597f, -0.022701153f, -0.224513026f, 7.99985951f},
     {2.99636261f, -0.69142802f, -0.0251071058f, 7.81839078f}},
    {"geglu_erf", {2.52403424f, -0.0227501319f, -0.224514872f, 7.99974663f},
     {2.99595031f, -0.691462461f, -0.0250527005f, 7.81799894f}},
    {"geglu_quick", {2.5373873f, -0.0321706884f, -0.226799475f, 7.99117055f},
     {2.98192869f, -0.700776873f, -0.0270844504f, 7.74263449f}},
};

START_TEST(glu_by_hand) {
    float a[16], b[8], ga[8];
    for (int i = 0; i < 4; i++) {
        a[i] = GLU_X[i], a[4 + i] = GLU_G[i]; /* row 0: [x | g] */
        a[8 + i] = GLU_G[i], a[12 + i] = GLU_X[i]; /* row 1: [g | x] */
        b[i] = GLU_X[i], b[4 + i] = GLU_G[i];  /* split form: b = {x; g}, ga = {g; x} */
        ga[i] = GLU_G[i], ga[4 + i] = GLU_X[i];
    }
    /* at: a stored transposed ([2, 8] in memory), read through transpose(): strided halves */
    float at[16];
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 8; c++) at[c * 2 + r] = a[r * 8 + c];
    for (size_t k = 0; k < sizeof GLU_HAND / sizeof GLU_HAND[0]; k++) {
        const char *op = GLU_HAND[k].op;
        char        text[1024];
        snprintf(text, sizeof text,
                 "input a: f32[8, 2]\ninput b: f32[4, 2]\ninput ga: f32[4, 2]\ninput at: f32[2, 8]\n"
                 "output y = %s(a)\noutput ys = %s(a, swapped=true)\noutput yb = %s(b, ga)\n"
                 "t = transpose(at)\noutput yt = %s(t)\n",
                 op, op, op, op);
        ts_buf all[] = {{.name = "a", .type = KILN_F32, .data = a},  {.name = "b", .type = KILN_F32, .data = b},
                      {.name = "ga", .type = KILN_F32, .data = ga}, {.name = "at", .type = KILN_F32, .data = at},
                      {.name = "y"}, {.name = "ys"}, {.name = "yb"}, {.name = "yt"}, {.name = NULL}};
        ts_reference(text, all);
        float want[8], want_s[8];
        for (int i = 0; i < 4; i++) {
            want[i] = GLU_HAND[k].xg[i], want[4 + i] = GLU_HAND[k].gx[i];
            want_s[i] = GLU_HAND[k].gx[i], want_s[4 + i] = GLU_HAND[k].xg[i];
        }
        expect(all, "y", KILN_F32, want, 8, 2e-6);
        expect(all, "ys", KILN_F32, want_s, 8, 2e-6);
        expect(all, "yb", KILN_F32, want, 8, 2e-6);
        expect(all, "yt", KILN_F32, want, 8, 2e-6);
        ts_buf_free(all);
    }
}
END_TEST

/* swiglu_oai (gpt-oss): x' = min(x, limit), g' = clamp(g, -limit, limit),
 * y = x' / (1 + e^(-alpha x')) * (g' + 1); defaults alpha 1.702, limit 7. */
START_TEST(swiglu_oai_by_hand) {
    static const float x[4] = {1, 9, -3, 0.5f}, g[4] = {3, -10, 8, 0};
    float              a[8];
    for (int i = 0; i < 4; i++) a[i] = x[i], a[4 + i] = g[i];
    ts_buf all[] = {{.name = "a", .type = KILN_F32, .data = a}, {.name = "x", .type = KILN_F32, .data = x},
                  {.name = "g", .type = KILN_F32, .data = g}, {.name = "y"}, {.name = "yb"}, {.name = "yp"},
                  {.name = "ys"}, {.name = NULL}};
    ts_reference("input a: f32[8]\ninput x: f32[4]\ninput g: f32[4]\noutput y = swiglu_oai(a)\n"
            "output yb = swiglu_oai(x, g)\noutput yp = swiglu_oai(x, g, alpha=1, limit=2)\n"
            "output ys = swiglu_oai(a, swapped=true, alpha=1, limit=2)\n",
            all);
    const float want[4] = {3.38318306f, -41.9997188f, -0.144570478f, 0.350388437f};
    const float want_p[4] = {2.19317574f, -1.76159416f, -0.426832859f, 0.311229666f};
    expect(all, "y", KILN_F32, want, 4, 2e-6);
    expect(all, "yb", KILN_F32, want, 4, 2e-6);
    expect(all, "yp", KILN_F32, want_p, 4, 2e-6);
    /* swapped: x from the second half (g above), gate from the first; alpha 1, limit 2:
     * x' = min(x, 2) = {2, -10, 2, 0}, g' = clamp(g, -2, 2) = {1, 2, -2, 0.5} */
    float want_s[4];
    static const float xs[4] = {2, -10, 2, 0}, gs[4] = {1, 2, -2, 0.5f};
    for (int i = 0; i < 4; i++) want_s[i] = (float)(xs[i] / (1.0 + exp(-xs[i])) * (gs[i] + 1.0));
    expect(all, "ys", KILN_F32, want_s, 4, 2e-6);
    ts_buf_free(all);
}
END_TEST

/* f16 and bf16 GLUs compute in f32 and round once: swiglu(1) * 3 = 2.19317574 -> f16 0x4063
 * (2.193359375), bf16 0x400c (2.1875). */
START_TEST(glu_low_precision) {
    static const uint16_t h[2] = {0x3c00, 0x4200};  /* f16 [1 | 3] */
    static const uint16_t bf[2] = {0x3f80, 0x4040}; /* bf16 [1 | 3] */
    ts_buf all[] = {{.name = "h", .type = KILN_F16, .data = h}, {.name = "b", .type = KILN_BF16, .data = bf},
                  {.name = "yh"}, {.name = "yb"}, {.name = NULL}};
    ts_reference("input h: f16[2]\ninput b: bf16[2]\noutput yh = swiglu(h)\noutput yb = swiglu(b)\n", all);
    const uint16_t wh[1] = {0x4063}, wb[1] = {0x400c};
    expect_bits(all, "yh", KILN_F16, wh, 1);
    expect_bits(all, "yb", KILN_BF16, wb, 1);
    ts_buf_free(all);
}
END_TEST

/* ---- add1 and the copies, by hand --------------------------------------------------------------- */

START_TEST(add1_by_hand) {
    static const float    a[3] = {1, 2, -3}, s[1] = {0.5f};
    static const uint16_t h[2] = {0x3c00, 0x4000}; /* f16 1, 2 */
    ts_buf all[] = {{.name = "a", .type = KILN_F32, .data = a}, {.name = "s", .type = KILN_F32, .data = s},
                  {.name = "h", .type = KILN_F16, .data = h}, {.name = "y"}, {.name = "yh"}, {.name = NULL}};
    ts_reference("input a: f32[3]\ninput s: f32[1]\ninput h: f16[2]\noutput y = add1(a, s)\noutput yh = add1(h, s)\n",
            all);
    const float    want[3] = {1.5f, 2.5f, -2.5f};
    const uint16_t wh[2] = {0x3e00, 0x4100}; /* f16 1.5, 2.5 */
    expect(all, "y", KILN_F32, want, 3, 0);
    expect_bits(all, "yh", KILN_F16, wh, 2);
    ts_buf_free(all);
}
END_TEST

START_TEST(copies_by_hand) {
    /* a: f32[2, 3], a[i0, i1] = 2 i1 + i0; t = transpose(a) is [3, 2] with t[j0, j1] = 2 j0 + j1,
     * whose logical (row-major, j0 fastest) order is 0 2 4 1 3 5. */
    static const float a[6] = {0, 1, 2, 3, 4, 5};
    /* r: values that round in f16 / bf16 */
    static const float    r[6] = {1.00390625f, 1.01171875f, -2.5f, 1.00048828125f, 65520.0f, 1e-7f};
    static const uint16_t hb[2] = {0x3c00, 0xc100}; /* f16 1, -2.5 */
    static const float    rp[4] = {1, 2, 3, 4};
    /* destinations of cpy and repeat: their data is never read, but they are inputs */
    static const float    z32[24] = {0};
    static const uint16_t z16[6] = {0};
    ts_buf all[] = {{.name = "a", .type = KILN_F32, .data = a},     {.name = "r", .type = KILN_F32, .data = r},
                  {.name = "hb", .type = KILN_F16, .data = hb},   {.name = "rp", .type = KILN_F32, .data = rp},
                  {.name = "d16", .type = KILN_F16, .data = z16}, {.name = "d32", .type = KILN_F32, .data = z32},
                  {.name = "e6", .type = KILN_F32, .data = z32},  {.name = "bb", .type = KILN_BF16, .data = z16},
                  {.name = "big", .type = KILN_F32, .data = z32},
                  {.name = "c1"}, {.name = "c2"}, {.name = "c3"}, {.name = "c4"}, {.name = "c5"},
                  {.name = "d1"}, {.name = "k1"}, {.name = "k2"}, {.name = "k3"}, {.name = "p1"},
                  {.name = "p2"}, {.name = "p3"}, {.name = NULL}};
    ts_reference("input a: f32[2, 3]\ninput r: f32[6]\ninput hb: f16[2]\ninput rp: f32[4]\n"
            "input d16: f16[3, 2]\ninput d32: f32[6]\ninput e6: f32[2, 3]\ninput bb: bf16[2]\n"
            "input big: f32[6, 4]\n"
            "output c1 = cpy(a, d16)\n"                   /* [2, 3] -> [3, 2], f32 -> f16 */
            "t = transpose(a)\noutput c2 = cpy(t, d32)\n" /* non-contiguous source, [3, 2] -> [6] */
            "output c3 = cpy(t, e6)\n"                    /* non-contiguous source, [3, 2] -> [2, 3] */
            "output c4 = cpy(hb, bb)\n"                   /* f16 -> bf16 */
            "output c5 = cpy(r, d32)\n"                   /* same shape and type */
            "p = permute(a, 1, 0, 2, 3)\noutput d1 = dup(p)\n"
            "output k1 = cast(r, bf16)\noutput k2 = cast(r, f16)\noutput k3 = cast(hb, f32)\n"
            "v = view(rp, [2], [], 0)\nw = view(rp, [1, 2], [8], 0)\n"
            "output p1 = repeat(v, a)\n"   /* {1, 2} tiled to [2, 3] */
            "output p2 = repeat(w, d16)\n" /* {1; 3} ([1, 2], a strided view) tiled to [3, 2] */
            "output p3 = repeat(t, big)\n", /* transposed [3, 2] tiled to [6, 4] */
            all);
    const uint16_t c1[6] = {0x0000, 0x3c00, 0x4000, 0x4200, 0x4400, 0x4500};
    const float    tl[6] = {0, 2, 4, 1, 3, 5};
    const uint16_t c4[2] = {0x3f80, 0xc020};
    expect_bits(all, "c1", KILN_F16, c1, 6);
    expect(all, "c2", KILN_F32, tl, 6, 0);
    expect(all, "c3", KILN_F32, tl, 6, 0);
    expect_bits(all, "c4", KILN_BF16, c4, 2);
    expect(all, "c5", KILN_F32, r, 6, 0);
    expect(all, "d1", KILN_F32, tl, 6, 0);
    /* bf16, round to nearest even: 1 + 2^-8 is a tie -> 1.0; 1 + 3 * 2^-8 a tie -> 1 + 2^-6;
     * 65520 -> 65536; 1e-7 (0x33d6bf95) -> 0x33d7 */
    const uint16_t k1[6] = {0x3f80, 0x3f82, 0xc020, 0x3f80, 0x4780, 0x33d7};
    /* f16: 1 + 2^-8 and 1 + 3 * 2^-8 are exact; 1 + 2^-11 a tie -> 1.0; 65520 -> inf;
     * 1e-7 = 1.68 * 2^-24 -> the subnormal 2 * 2^-24 */
    const uint16_t k2[6] = {0x3c04, 0x3c0c, 0xc100, 0x3c00, 0x7c00, 0x0002};
    const float    k3[2] = {1, -2.5f};
    expect_bits(all, "k1", KILN_BF16, k1, 6);
    expect_bits(all, "k2", KILN_F16, k2, 6);
    expect(all, "k3", KILN_F32, k3, 2, 0);
    const float p1[6] = {1, 2, 1, 2, 1, 2};
    const float p2[6] = {1, 1, 1, 3, 3, 3};
    const float p3[24] = {0, 2, 4, 0, 2, 4, 1, 3, 5, 1, 3, 5, 0, 2, 4, 0, 2, 4, 1, 3, 5, 1, 3, 5};
    expect(all, "p1", KILN_F32, p1, 6, 0);
    expect(all, "p2", KILN_F32, p2, 6, 0);
    expect(all, "p3", KILN_F32, p3, 24, 0);
    ts_buf_free(all);
}
END_TEST

/* Result types and shapes of the copies and gated units. */
START_TEST(shapes) {
    kiln_ctx *ctx = ts_parse("input a: f16[8, 3, 2]\ninput b: f16[8, 3, 2]\ninput c: bf16[6, 8]\ninput s: f32[1]\n"
                             "g1 = swiglu(a)\ng2 = geglu(a, b)\ng3 = swiglu_oai(a, swapped=true)\n"
                             "c1 = cpy(a, c)\nc2 = dup(a)\nc3 = cast(a, f32)\nr = repeat(s, c)\n"
                             "q = add1(c, s)\n");
    static const struct {
        const char *name;
        kiln_type   t;
        int64_t     ne[4];
    } want[] = {
        {"g1", KILN_F16, {4, 3, 2, 1}}, {"g2", KILN_F16, {8, 3, 2, 1}}, {"g3", KILN_F16, {4, 3, 2, 1}},
        {"c1", KILN_BF16, {6, 8, 1, 1}}, {"c2", KILN_F16, {8, 3, 2, 1}}, {"c3", KILN_F32, {8, 3, 2, 1}},
        {"r", KILN_F32, {6, 8, 1, 1}},   {"q", KILN_BF16, {6, 8, 1, 1}},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        kiln_tensor *t = fe_find(ctx, want[i].name);
        ck_assert_ptr_nonnull(t);
        ck_assert_msg(kiln_tensor_type(t) == want[i].t, "%s: type %s", want[i].name,
                      kiln_type_name(kiln_tensor_type(t)));
        for (int d = 0; d < 4; d++)
            ck_assert_msg(kiln_tensor_ne(t, d) == want[i].ne[d], "%s: ne[%d] = %lld", want[i].name, d,
                          (long long)kiln_tensor_ne(t, d));
    }
    /* swiglu_oai's defaults are gpt-oss's */
    kiln_tensor *g3 = fe_find(ctx, "g3");
    ck_assert_float_eq(g3->fp[0], 1.702f);
    ck_assert_float_eq(g3->fp[1], 7.0f);
    ck_assert_int_eq(g3->ip[0], 1);
    kiln_ctx_free(ctx);
}
END_TEST

static void expect_error(const char *kg, kiln_code code, const char *needle) {
    ts_parse_error(kg, code, TS_NEEDLES(needle));
}

START_TEST(errors) {
    static const char *glus[] = {"reglu", "geglu", "swiglu", "swiglu_oai", "geglu_erf", "geglu_quick"};
    for (size_t i = 0; i < sizeof glus / sizeof glus[0]; i++) {
        char text[256], want[128];
        snprintf(text, sizeof text, "input a: f32[7, 2]\ny = %s(a)\n", glus[i]);
        snprintf(want, sizeof want, "%s: 'a' (f32[7, 2]) has an odd ne0", glus[i]);
        expect_error(text, KILN_ERR_SHAPE, want);
        snprintf(text, sizeof text, "input a: f32[8, 2]\ninput b: f32[8, 2]\ny = %s(a, b, swapped=true)\n", glus[i]);
        expect_error(text, KILN_ERR_INVALID, "swapped applies to the one-tensor form only");
        snprintf(text, sizeof text, "input a: f32[8, 2]\ninput b: f32[4, 2]\ny = %s(a, b)\n", glus[i]);
        expect_error(text, KILN_ERR_SHAPE, "must have the same shape");
        snprintf(text, sizeof text, "input a: i32[8, 2]\ny = %s(a)\n", glus[i]);
        expect_error(text, KILN_ERR_SHAPE, "must be f32, f16 or bf16");
    }
    expect_error("input a: f32[4, 3]\ninput b: f16[5, 2]\ny = cpy(a, b)\n", KILN_ERR_SHAPE,
                 "cpy: 'a' (f32[4, 3]) and 'b' (f16[5, 2]) have different element counts");
    expect_error("input a: f32[4]\ninput b: i32[4]\ny = cpy(a, b)\n", KILN_ERR_SHAPE, "cpy: destination");
    expect_error("input a: f32[3, 2]\ninput b: f32[4, 4]\ny = repeat(a, b)\n", KILN_ERR_SHAPE,
                 "repeat: cannot tile 'a' (f32[3, 2]) to the shape of 'b' (f32[4, 4])");
    expect_error("input a: f32[4, 4]\ninput b: f32[2, 2]\ny = repeat(a, b)\n", KILN_ERR_SHAPE, "cannot tile");
    expect_error("input a: f32[4]\ninput s: f32[2]\ny = add1(a, s)\n", KILN_ERR_SHAPE,
                 "add1: 's' (f32[2]) must be a scalar");
    expect_error("input a: f32[4]\ny = cast(a, i32)\n", KILN_ERR_SHAPE, "cast: target type i32");
    expect_error("input a: i64[4]\ny = dup(a)\n", KILN_ERR_SHAPE, "dup: operand");
}
END_TEST

/* ---- kernels: generated and compiled for sm_90a and sm_80 --------------------------------------- */

/* Every op of this file over types and layouts (plain, transposed, viewed with an offset, large
 * enough for the vector and tile paths), unfused, so each op is its own kernel. */
static char *spread_graph(void) {
    kb_str g = {0};
    static const char *types[] = {"f32", "f16", "bf16"};
    static const char *glus[] = {"reglu", "geglu", "swiglu", "swiglu_oai", "geglu_erf", "geglu_quick"};
    for (int t = 0; t < 3; t++) {
        const char *ty = types[t];
        kb_str_addf(&g, "input a%d: %s[256, 300]\ninput b%d: %s[128, 300]\ninput q%d: %s[300, 256]\n", t, ty, t, ty, t, ty);
        kb_str_addf(&g, "input s%d: %s[1]\ninput o%d: %s[5, 4]\n", t, ty, t, ty);
        kb_str_addf(&g, "qt%d = transpose(q%d)\nav%d = view(a%d, [128, 300], [%d], %d)\n", t, t, t, t,
                    256 * (t == 0 ? 4 : 2), 3 * (t == 0 ? 4 : 2));
    }
    for (int t = 0; t < 3; t++) {
        for (size_t k = 0; k < sizeof glus / sizeof glus[0]; k++) {
            const char *op = glus[k];
            kb_str_addf(&g, "output g%d_%zu_1 = %s(a%d)\n", t, k, op, t);
            kb_str_addf(&g, "output g%d_%zu_s = %s(a%d, swapped=true)\n", t, k, op, t);
            kb_str_addf(&g, "output g%d_%zu_b = %s(b%d, av%d)\n", t, k, op, t, t);
            kb_str_addf(&g, "output g%d_%zu_t = %s(qt%d)\n", t, k, op, t);
            kb_str_addf(&g, "output g%d_%zu_o = %s(o%d, o%d)\n", t, k, op, t, t);
        }
        kb_str_addf(&g, "output x%d_1 = add1(a%d, s%d)\noutput x%d_2 = add1(qt%d, s0)\n", t, t, t, t, t);
        kb_str_addf(&g, "output x%d_3 = dup(qt%d)\noutput x%d_4 = dup(o%d)\n", t, t, t, t);
        kb_str_addf(&g, "output x%d_5 = repeat(o%d, q%d)\noutput x%d_6 = repeat(s%d, a%d)\n", t, t, t, t, t, t);
        kb_str_addf(&g, "output x%d_7 = repeat(b%d, a%d)\n", t, t, t);
        for (int u = 0; u < 3; u++) {
            kb_str_addf(&g, "output c%d%d_1 = cast(a%d, %s)\noutput c%d%d_2 = cast(qt%d, %s)\n", t, u, t, types[u], t,
                        u, t, types[u]);
            kb_str_addf(&g, "output c%d%d_3 = cpy(a%d, q%d)\n", t, u, t, u);  /* reshape, type change */
            kb_str_addf(&g, "output c%d%d_4 = cpy(qt%d, a%d)\n", t, u, t, u); /* non-contiguous, shape kept */
            kb_str_addf(&g, "output c%d%d_5 = cpy(qt%d, q%d)\n", t, u, t, u); /* non-contiguous, reshaped */
            kb_str_addf(&g, "output c%d%d_6 = cpy(o%d, o%d)\n", t, u, t, u);
        }
    }
    return kb_str_take(&g);
}

/* Every kernel compiles with NVRTC for sm_90a without a warning (identical kernels, e.g. cast to
 * the same type and dup, once). */
static void ew_kernel_clean(const kiln_program *p, int i) {
    const char *src = kiln_program_kernel_source(p, i);
    bool        seen = false;
    for (int j = 0; j < i && !seen; j++) seen = strcmp(src, kiln_program_kernel_source(p, j)) == 0;
    if (!seen) ts_nvrtc_clean(src, kiln_program_kernel_name(p, i), NULL);
}

START_TEST(kernels_compile) {
    char *text = spread_graph();
    ts_spread_compile(text, 1, 100, ew_kernel_clean);
    free(text);
}
END_TEST

/* A GLU fused with its neighbours: the fused kernel computes what the unfused reference does. */
START_TEST(glu_fuses) {
    kiln_ctx *ctx;
    kiln_graph *g = ts_build("input a: f16[64, 8]\ninput w: f16[32]\n"
                             "m = mul(a, a)\ng = swiglu(m)\noutput y = mul(g, w)\n"
                             "x = scale(a, 0.5, 0)\noutput z = geglu(x, a)\n", &ctx);
    kiln_compile_opts o = {.skip_nvrtc = 1};
    kiln_program     *p;
    TS_OK(kiln_compile(g, &o, &p));
    char *desc;
    TS_OK(kiln_program_describe(p, &desc));
    /* swiglu(m) reads m through two half views: m stays its own kernel; swiglu and the mul by w
     * fuse; scale fuses into geglu's first operand */
    int n = kiln_program_kernel_count(p);
    bool swiglu_mul = false, scale_geglu = false;
    for (int i = 0; i < n; i++) {
        const char *name = kiln_program_kernel_name(p, i);
        swiglu_mul |= strcmp(name, "ew_swiglu_mul") == 0;
        scale_geglu |= strcmp(name, "ew_scale_geglu") == 0;
    }
    ck_assert_msg(swiglu_mul && scale_geglu && n == 3, "%d kernels:\n%s", n, desc);
    free(desc);
    ts_compiled_free(p, g, ctx);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("ops_ew",
                        TS_CASE("ew", 120),
                        TS_TESTS(glu_by_hand, swiglu_oai_by_hand, glu_low_precision, add1_by_hand, copies_by_hand,
                                 shapes, errors, kernels_compile, glu_fuses));
    return ts_main(s);
}
