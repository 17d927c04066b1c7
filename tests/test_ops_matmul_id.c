/* mul_mat_id (mixture-of-experts matmul): the CPU reference against products worked out by hand
 * (expert selection, duplicate ids, ids outside [0, n_expert) giving zero rows, b broadcast over
 * the slots or one row per slot, f16/bf16 weights, a permuted b), the frontend's shape and type
 * errors, and each specialization of templates/matmul_id.lua (decode GEMV with every load width,
 * prefill route/pack + tensor-core kernel for each token tile, prefill FMA kernel for f32 or
 * unaligned weights, the fused GEMV of quantized experts and their f16 dequantization fallback)
 * generated and compiled by NVRTC for sm_90a and sm_80 without warnings.
 * No GPU needed. */
#include "tests/support.h"

#include "base/base.h"
#include "codegen/codegen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the reference, by hand ------------------------------------------------------------------ */

/* Output y of buffers b holds exactly want[0..n). */
static void expect_f32(ts_buf *b, const float *want, int64_t n, const char *what) {
    ts_buf *t = ts_buf_find(b, "y");
    ck_assert_msg(t->out, "%s: no output", what);
    ck_assert_int_eq(t->type, KILN_F32);
    ck_assert_msg(t->n == n, "%s: %lld outputs, want %lld", what, (long long)t->n, (long long)n);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(((const float *)t->out)[i] == want[i], "%s: y[%lld] = %.9g, want %.9g", what, (long long)i,
                      (double)((const float *)t->out)[i], (double)want[i]);
}

/* as [3, 2, 2]: expert 0 rows (1 2 3) (4 5 6), expert 1 rows (-1 0 1) (0.5 0.5 0.5).
 * b [3, 1, 2]: token 0 (1 1 1), token 1 (1 2 3). ids [2, 2]: token 0 -> (1, 0), token 1 -> (0, 5):
 *   y[:, 0, 0] = e1.(1 1 1) = (0, 1.5)    y[:, 1, 0] = e0.(1 1 1) = (6, 15)
 *   y[:, 0, 1] = e0.(1 2 3) = (14, 32)    y[:, 1, 1] = id 5 >= 2: (0, 0) */
static const float AS[12] = {1, 2, 3, 4, 5, 6, -1, 0, 1, 0.5f, 0.5f, 0.5f};
static const float B2[6] = {1, 1, 1, 1, 2, 3};
static const float WANT[8] = {0, 1.5f, 6, 15, 14, 32, 0, 0};

START_TEST(ref_select) {
    static const char *types[3] = {"f32", "f16", "bf16"};
    static const kiln_type kt[3] = {KILN_F32, KILN_F16, KILN_BF16};
    for (int t = 0; t < 3; t++) {
        uint16_t half[12];
        for (int i = 0; t && i < 12; i++) kb_store_f32(half, kt[t], i, AS[i]); /* all exact in f16/bf16 */
        const int32_t ids[4] = {1, 0, 0, 5};
        ts_buf b[] = {{.name = "as", .type = kt[t], .data = t ? (const void *)half : AS, .n = 12},
                      {.name = "x", .type = KILN_F32, .data = B2, .n = 6},
                      {.name = "ids", .type = KILN_I32, .data = ids, .n = 4},
                      TS_OUT("y"),
                      {0}};
        char kg[160];
        snprintf(kg, sizeof kg, "input as: %s[3, 2, 2]\ninput x: f32[3, 1, 2]\ninput ids: i32[2, 2]\n"
                                "output y = mul_mat_id(as, x, ids)\n", types[t]);
        ts_reference(kg, b);
        expect_f32(b, WANT, 8, types[t]);
        ts_buf_free(b);
    }
}
END_TEST

/* Negative ids, and ids == n_expert, give zero rows; nothing else changes. */
START_TEST(ref_invalid_ids) {
    const int32_t ids[4] = {-1, 0, 2, 1};
    ts_buf b[] = {{.name = "as", .type = KILN_F32, .data = AS, .n = 12},
                  {.name = "x", .type = KILN_F32, .data = B2, .n = 6},
                  {.name = "ids", .type = KILN_I32, .data = ids, .n = 4},
                  TS_OUT("y"),
                  {0}};
    ts_reference("input as: f32[3, 2, 2]\ninput x: f32[3, 1, 2]\ninput ids: i32[2, 2]\n"
                 "output y = mul_mat_id(as, x, ids)\n", b);
    const float want[8] = {0, 0, 6, 15, 0, 0, 2, 3}; /* token 1 slot 1: e1.(1 2 3) = (2, 3) */
    expect_f32(b, want, 8, "ids -1 and 2 of 2 experts");
    ts_buf_free(b);
}
END_TEST

/* b with one row per slot (B1 = n_used), and the same expert twice in one token. */
START_TEST(ref_per_slot_b_and_duplicates) {
    const float   x[6] = {1, 0, 0, 0, 0, 2}; /* slot 0 (1 0 0), slot 1 (0 0 2) */
    const int32_t ids[2] = {0, 0};
    ts_buf b[] = {{.name = "as", .type = KILN_F32, .data = AS, .n = 12},
                  {.name = "x", .type = KILN_F32, .data = x, .n = 6},
                  {.name = "ids", .type = KILN_I32, .data = ids, .n = 2},
                  TS_OUT("y"),
                  {0}};
    ts_reference("input as: f32[3, 2, 2]\ninput x: f32[3, 2, 1]\ninput ids: i32[2, 1]\n"
                 "output y = mul_mat_id(as, x, ids)\n", b);
    const float want[4] = {1, 4, 6, 12};
    expect_f32(b, want, 4, "B1 = n_used, duplicate expert");
    ts_buf_free(b);
}
END_TEST

/* A permuted b (tokens fastest in memory) and a strided ids view give the logical products. */
START_TEST(ref_views) {
    /* xt [2, 3, 1] holds b with tokens fastest (element (t, k) at t + 2k); permute(xt, 2, 0, 1, 3)
     * is b [3, 1, 2]. */
    const float   xt[6] = {1, 1, 1, 2, 1, 3}; /* token 0 (1 1 1), token 1 (1 2 3) */
    const int32_t ids6[6] = {1, 0, 9, 0, 5, 9};   /* ids view [2, 2] with row stride 3 */
    ts_buf b[] = {{.name = "as", .type = KILN_F32, .data = AS, .n = 12},
                  {.name = "xt", .type = KILN_F32, .data = xt, .n = 6},
                  {.name = "ip", .type = KILN_I32, .data = ids6, .n = 6},
                  TS_OUT("y"),
                  {0}};
    ts_reference("input as: f32[3, 2, 2]\ninput xt: f32[2, 3, 1]\ninput ip: i32[3, 2]\n"
                 "p = permute(xt, 2, 0, 1, 3)\nids = view(ip, [2, 2], [12], 0)\n"
                 "output y = mul_mat_id(as, p, ids)\n", b);
    expect_f32(b, WANT, 8, "permuted b, strided ids");
    ts_buf_free(b);
}
END_TEST

/* ---- frontend errors ------------------------------------------------------------------------ */

static void expect_error(const char *kg, const char *needle) { ts_parse_error(kg, KILN_ERR_SHAPE, TS_NEEDLES(needle)); }

START_TEST(errors) {
    expect_error("input a: i32[8, 4, 3]\ninput x: f32[8, 1, 2]\ninput i: i32[2, 2]\ny = mul_mat_id(a, x, i)\n",
                 "mul_mat_id: as 'a' (i32[8, 4, 3]) must be f32, f16, bf16 or a quantized type");
    expect_error("input a: f16[8, 4, 3]\ninput x: f16[8, 1, 2]\ninput i: i32[2, 2]\ny = mul_mat_id(a, x, i)\n",
                 "b 'x' (f16[8, 1, 2]) must be f32");
    expect_error("input a: f16[8, 4, 3]\ninput x: f32[8, 1, 2]\ninput i: f32[2, 2]\ny = mul_mat_id(a, x, i)\n",
                 "ids 'i' (f32[2, 2]) must be i32");
    expect_error("input a: f16[8, 4, 3, 2]\ninput x: f32[8, 1, 2]\ninput i: i32[2, 2]\ny = mul_mat_id(a, x, i)\n",
                 "must be 3-D and ids");
    expect_error("input a: f16[8, 4, 3]\ninput x: f32[8, 1, 2]\ninput i: i32[2, 2, 2]\ny = mul_mat_id(a, x, i)\n",
                 "must be 3-D and ids");
    expect_error("input a: f16[8, 4, 3]\ninput x: f32[7, 1, 2]\ninput i: i32[2, 2]\ny = mul_mat_id(a, x, i)\n",
                 "must have the same ne0");
    expect_error("input a: f16[8, 4, 3]\ninput x: f32[8, 1, 3]\ninput i: i32[2, 2]\ny = mul_mat_id(a, x, i)\n",
                 "must have one row per token");
    expect_error("input a: f16[8, 4, 3]\ninput x: f32[8, 3, 2]\ninput i: i32[2, 2]\ny = mul_mat_id(a, x, i)\n",
                 "b.ne1 must divide ids.ne0");
    expect_error("input a: f16[4, 8, 3]\ninput x: f32[4, 1, 2]\ninput i: i32[2, 2]\nt = transpose(a)\n"
                 "y = mul_mat_id(t, x, i)\n",
                 "must have contiguous rows");
}
END_TEST

START_TEST(shapes) {
    ts_builds("input a: bf16[64, 48, 8]\ninput x: f32[64, 1, 5]\ninput i: i32[4, 5]\n"
              "output y = mul_mat_id(a, x, i)\n");
    /* the C builder: the result is f32 [M, n_used, T] */
    kiln_ctx    *ctx = kiln_ctx_new();
    int64_t      na[3] = {16, 24, 4}, nx[3] = {16, 2, 3}, ni[2] = {2, 3};
    kiln_tensor *a = kiln_new_tensor(ctx, KILN_ROLE_WEIGHT, KILN_F16, "a", 3, na);
    kiln_tensor *x = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "x", 3, nx);
    kiln_tensor *i = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_I32, "i", 2, ni);
    kiln_tensor *y = kiln_mul_mat_id(ctx, a, x, i);
    ck_assert_ptr_nonnull(y);
    ck_assert_int_eq(kiln_tensor_type(y), KILN_F32);
    ck_assert_int_eq(kiln_tensor_ne(y, 0), 24);
    ck_assert_int_eq(kiln_tensor_ne(y, 1), 2);
    ck_assert_int_eq(kiln_tensor_ne(y, 2), 3);
    ck_assert_int_eq(kiln_tensor_ne(y, 3), 1);
    kiln_ctx_free(ctx);
}
END_TEST

/* ---- kernels: generated and compiled ---------------------------------------------------------- */

static char *g_cache;

typedef struct {
    const char *kg;
    int         steps; /* 1: decode GEMV; 2: prefill prep + main */
    const char *want;  /* a substring of the last step's source */
} gcase;

#define G3(w, x, i) "input as: " w "\ninput x: " x "\ninput ids: " i "\noutput y = mul_mat_id(as, x, ids)\n"
#define GQ(w, x, i) "weight as: " w "\ninput x: " x "\ninput ids: " i "\noutput y = mul_mat_id(as, x, ids)\n"

static const gcase CASES[] = {
    /* decode GEMV: 16-byte loads (bf16, f16, f32), narrower ones, rows per warp, T up to 4 */
    {G3("bf16[2048, 768, 128]", "f32[2048, 1, 1]", "i32[8, 1]"), 1, "loads of 16 bytes"},
    {G3("bf16[768, 2048, 128]", "f32[768, 8, 1]", "i32[8, 1]"), 1, "2 rows per warp"},
    {G3("f16[256, 100, 4]", "f32[256, 2, 3]", "i32[2, 3]"), 1, "kiln_f16_to_f32"},
    {G3("f32[64, 33, 4]", "f32[64, 1, 4]", "i32[2, 4]"), 1, "loads of 16 bytes"},
    {G3("f16[38, 33, 3]", "f32[38, 1, 1]", "i32[1, 1]"), 1, "loads of 4 bytes"},
    {G3("bf16[37, 33, 3]", "f32[37, 1, 2]", "i32[3, 2]"), 1, "loads of 2 bytes"},
    {G3("f32[37, 130, 1]", "f32[37, 1, 1]", "i32[1, 1]"), 1, "loads of 4 bytes"},
    {"input as: bf16[64, 48, 5]\ninput xt: f32[3, 64, 1]\ninput ids: i32[1, 3]\n"
     "x = permute(xt, 2, 0, 1, 3)\noutput y = mul_mat_id(as, x, ids)\n", 1, "b element by element"},
    /* prefill, tensor cores: each token tile (16, 32, 64, 128), 64- and 128-row tiles, K tails,
     * M tails, f16 and bf16 */
    {G3("bf16[2048, 768, 128]", "f32[2048, 1, 512]", "i32[8, 512]"), 2, "128 rows x 64 tokens"},
    {G3("bf16[64, 48, 4]", "f32[64, 1, 4096]", "i32[8, 4096]"), 2, "mma.sync.aligned.m16n8k16.row.col.f32.bf16"},
    {G3("f16[40, 200, 128]", "f32[40, 2, 17]", "i32[2, 17]"), 2, "128 rows x 16 tokens"},
    {G3("bf16[136, 72, 16]", "f32[136, 1, 40]", "i32[8, 40]"), 2, "64 rows x 32 tokens"},
    {G3("f16[72, 200, 1]", "f32[72, 8, 512]", "i32[8, 512]"), 2, "64 rows x 128 tokens x 64, 6 stages"},
    {G3("f16[1032, 200, 1]", "f32[1032, 8, 512]", "i32[8, 512]"), 2, "128 rows x 128 tokens x 64, 4 stages"},
    {G3("bf16[768, 2048, 128]", "f32[768, 8, 512]", "i32[8, 512]"), 2, "64 rows x 64 tokens x 64, 6 stages"},
    {G3("bf16[64, 48, 4]", "f32[64, 1, 5]", "i32[1, 5]"), 2, "mma.sync"},
    {"input as: bf16[64, 48, 1]\ninput xp: f32[3, 64, 512]\ninput ids: i32[3, 512]\n"
     "x = permute(xp, 1, 0, 2, 3)\noutput y = mul_mat_id(as, x, ids)\n", 2, "mma.sync"},
    /* prefill, FMA: f32 weights, 16-bit weights not 16-byte aligned */
    {G3("f32[37, 33, 3]", "f32[37, 1, 16]", "i32[2, 16]"), 2, "f32 FMA"},
    {G3("bf16[37, 33, 3]", "f32[37, 2, 16]", "i32[2, 16]"), 2, "f32 FMA"},
    {"input w: f16[72, 100, 4]\ninput x: f32[64, 1, 9]\ninput ids: i32[2, 9]\n"
     "as = view(w, [64, 100, 4], [144, 14400], 4)\noutput y = mul_mat_id(as, x, ids)\n", 2, "f32 FMA"},
    /* quantized experts, the fused GEMV (one step): Qwen3-30B-A3B gate (32 units of 64: a warp
     * per 4 rows) and down (b one row per slot, 24 units: a warp per 4 rows), K = 256 with odd M (rows
     * past M clamped), a long K whose units do not fill the last round, 64 pairs over 16 tokens,
     * a symbolic token count */
    {GQ("q4_K[2048, 768, 128]", "f32[2048, 1, 1]", "i32[8, 1]"), 1, "1 warp split K (32 units of 64, 1 per lane)"},
    {GQ("q8_0[768, 2048, 128]", "f32[768, 8, 1]", "i32[8, 1]"), 1, "1 warp split K (24 units of 32, 1 per lane)"},
    {GQ("q6_K[256, 37, 4]", "f32[256, 1, 3]", "i32[2, 3]"), 1, "min(row0 + r, 36u)"},
    {GQ("q5_K[14080, 9, 2]", "f32[14080, 2, 2]", "i32[2, 2]"), 1, "lane + 192 < 220) {"}, /* a partial last round */
    {GQ("q4_0[4096, 33, 8]", "f32[4096, 1, 16]", "i32[4, 16]"), 1, "mul_mat_id_qgemv_q4_0_k4096_m33_u4"},
    {"dim n_tokens <= 8\nweight as: q4_K[512, 40, 16]\ninput x: f32[512, 2, n_tokens]\ninput ids: i32[4, n_tokens]\n"
     "output y = mul_mat_id(as, x, ids)\n", 1, "tokens past the run-time count"},
    /* quantized experts, dequantized to f16 first: too many pairs (4 x 33 of 16 experts: prep +
     * mma after the dequantization), b not 16-byte aligned (the f16 gemv after it) */
    {GQ("q4_K[1024, 40, 16]", "f32[1024, 1, 33]", "i32[4, 33]"), 3, "mma.sync"},
    {"weight as: q8_0[256, 40, 4]\ninput xp: f32[260, 1, 1]\ninput ids: i32[2, 1]\n"
     "x = view(xp, [256, 1, 1], [1040, 1040], 4)\noutput y = mul_mat_id(as, x, ids)\n", 2, "one GEMV over the selected"},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

/* The mul_mat_id steps of p: the first one's index and their count (graphs may hold copies). */
static int mmid_steps(const kiln_program *p, int *count) {
    int first = -1, n = 0;
    for (int i = 0; i < kiln_program_kernel_count(p); i++)
        if (strncmp(kiln_program_kernel_name(p, i), "mul_mat_id_", 11) == 0) {
            if (first < 0) first = i;
            n++;
        }
    ck_assert_msg(first >= 0, "no mul_mat_id kernel");
    *count = n;
    return first;
}

/* NVRTC compiles src without a warning, except (quantized experts) "declared but never
 * referenced" for the shared helpers of templates/quant.lua a type does not use. */
static void nvrtc_clean(const char *src, const char *name, const char *arch) {
    if (!strstr(src, "kiln_qh2f")) {
        ts_nvrtc_clean(src, name, arch);
        return;
    }
    bool  ok;
    char *log = ts_nvrtc_log(src, name, arch, &ok);
    ck_assert_msg(ok, "%s (%s): NVRTC says:\n%.600s", name, arch, log);
    for (char *l = log, *e; *l; l = e + (*e != 0)) {
        e = l + strcspn(l, "\n");
        char c = *e;
        *e = 0;
        bool diag = strstr(l, "): warning") || strstr(l, "error");
        ck_assert_msg(!diag || strstr(l, "warning #177-D: function \"kiln_q"), "%s (%s): NVRTC says: %s", name, arch, l);
        *e = c;
    }
    free(log);
}

START_TEST(kernels_compile) {
    static const char *archs[2] = {"sm_90a", "sm_80"};
    const gcase       *c = &CASES[_i];
    for (int a = 0; a < 2; a++) {
        kiln_ctx     *ctx;
        kiln_graph   *g;
        kiln_program *p = ts_compile(c->kg, archs[a], g_cache, 0, &ctx, &g);
        int           n, k = mmid_steps(p, &n);
        ck_assert_msg(n == c->steps, "case %d: %d steps, want %d", _i, n, c->steps);
        const char *last = kiln_program_kernel_source(p, k + n - 1);
        if (!strstr(last, c->want)) fprintf(stderr, "case %d source:\n%s\n", _i, last);
        ck_assert_msg(strstr(last, c->want), "case %d: missing \"%s\" (source on stderr)", _i, c->want);
        for (int s = k; s < k + n; s++) {
            const char *src = kiln_program_kernel_source(p, s);
            ck_assert_msg(!strstr(src, "#include"), "#include in source");
            nvrtc_clean(src, kiln_program_kernel_name(p, s), archs[a]);
        }
        /* quantized experts: the fused GEMV alone, or a dequantization step before the f16 plan */
        int dq = strncmp(kiln_program_kernel_name(p, k), "mul_mat_id_dq_", 14) == 0;
        if (dq || n == 2) { /* prefill steps (and the f16 experts) share the node's scratch */
            if (n - dq == 2)
                ck_assert_msg(strncmp(kiln_program_kernel_name(p, k + dq), "mul_mat_id_prep_", 16) == 0, "step %d is %s",
                              1 + dq, kiln_program_kernel_name(p, k + dq));
            char *d = NULL;
            TS_OK(kiln_program_describe(p, &d));
            ck_assert_msg(strstr(d, "scratch: "), "no scratch in:\n%s", d);
            free(d);
        }
        ts_compiled_free(p, g, ctx);
    }
}
END_TEST

static void mmid_header(const kiln_program *p) {
    int n, k = mmid_steps(p, &n);
    for (int s = 0; s < n; s++) /* (quantized experts: quant.lua's dequantization step, its own head) */
        ck_assert_msg(strstr(kiln_program_kernel_source(p, k + s), "kiln mul_mat_id kernel") ||
                          strstr(kiln_program_kernel_source(p, k + s), "kiln kernel mul_mat_id_dq_"),
                      "header comment");
}

/* The same graph gives the same sources. */
START_TEST(kernels_deterministic) {
    for (int i = 0; i < NCASES; i++) ts_compile_twice(CASES[i].kg, g_cache, mmid_header);
}
END_TEST

/* The bandwidth numerator counts only the experts a run can select; a weight read by anything
 * else counts whole. */
START_TEST(io_bytes_count_selected_experts) {
    kiln_ctx     *ctx;
    kiln_graph   *g;
    kiln_program *p = ts_compile("weight w: bf16[256, 64, 128]\ninput x: f32[256, 1, 1]\ninput ids: i32[8, 1]\n"
                                   "output y = mul_mat_id(w, x, ids)\n", "sm_90a", g_cache, 1, &ctx, &g);
    size_t expert = 256 * 64 * 2;
    ck_assert_uint_eq(kiln_program_io_bytes(p), 8 * expert + 256 * 4 + 8 * 4 + 64 * 8 * 4);
    kiln_program_free(p), kiln_graph_free(g), kiln_ctx_free(ctx);
    /* 32 tokens x 8 can select all 128 experts */
    p = ts_compile("weight w: bf16[256, 64, 128]\ninput x: f32[256, 1, 32]\ninput ids: i32[8, 32]\n"
                     "output y = mul_mat_id(w, x, ids)\n", "sm_90a", g_cache, 1, &ctx, &g);
    ck_assert_uint_eq(kiln_program_io_bytes(p), 128 * expert + 256 * 32 * 4 + 8 * 32 * 4 + 64 * 8 * 32 * 4);
    kiln_program_free(p), kiln_graph_free(g), kiln_ctx_free(ctx);
    /* also read whole elsewhere: counted whole */
    p = ts_compile("weight w: bf16[256, 64, 128]\ninput x: f32[256, 1, 1]\ninput ids: i32[8, 1]\n"
                     "output y = mul_mat_id(w, x, ids)\noutput z = cast(w, f32)\n", "sm_90a", g_cache, 1, &ctx, &g);
    ck_assert_uint_eq(kiln_program_io_bytes(p), 128 * expert + 256 * 4 + 8 * 4 + 64 * 8 * 4 + 128 * expert * 2);
    kiln_program_free(p), kiln_graph_free(g), kiln_ctx_free(ctx);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("ops_matmul_id",
                        TS_CASE("reference", 0),
                        TS_TESTS(ref_select, ref_invalid_ids, ref_per_slot_b_and_duplicates, ref_views),
                        TS_CASE("frontend", 0), TS_TESTS(errors, shapes),
                        TS_CASE("kernels", 120), TS_LOOP(0, NCASES, kernels_compile),
                        TS_TESTS(kernels_deterministic, io_bytes_count_selected_experts));
    return ts_main_cache(s, "matmul-id-test", &g_cache);
}
