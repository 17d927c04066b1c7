/* GPU tests of pass mul_mat_glu: gate/up products feeding a GLU, compiled fused and unfused
 * (--no-fuse), run on the GPU and each compared with kiln_reference (the unfused graph on the
 * CPU) by NMSE against mul_mat's tolerance (5e-4); both within it bounds fused vs unfused.
 *
 * - dense: n = 1 (the paired gemv, epilogue at the store), 3, 16 (tiles), 64, 512 (cuBLAS),
 *   for f32, f16 and bf16 weights, every GLU op in turn, the GLU's operands in both orders, with
 *   no bias, a gate bias, an up bias or both; plus K = 8192 at n = 1 (one team per block);
 * - moe: mul_mat_id with 8 of 128 experts, T = 1, 4 (decode gemv) and 64 (prefill via scratch);
 * - one_tensor: the one-operand GLU (swapped or not) of one product is left alone and correct;
 * - examples: examples/llama-layer.kg and qwen3moe-layer.kg, fused vs unfused.
 * Each tcase can run alone (CK_RUN_CASE). */
#include "tests/support.h"

#include "frontend/frontend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/gpu_support.h"

static const char *const GLUS[] = {"swiglu", "geglu", "reglu", "geglu_erf", "geglu_quick", "swiglu_oai"};
#define NGLU 6
static const char *const WTS[3] = {"bf16", "f16", "f32"};

/* Random data for every leaf of g (ids: distinct experts per token below n_expert; other
 * integers small, valid as positions and row indices). */
static void fill_leaves(const kiln_graph *g, hset *h, uint64_t seed, int n_expert) {
    rng_t r = {seed};
    for (int i = 0; i < g->n; i++) {
        const kiln_tensor *t = g->nodes[i];
        if (t->role != KILN_ROLE_INPUT && t->role != KILN_ROLE_WEIGHT && t->role != KILN_ROLE_STATE) continue;
        int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        hdata  *d = hset_add(h, t->name, t->type, n);
        if (t->type == KILN_I32 && !strcmp(t->name, "ids")) {
            int32_t *ids = d->data;
            int64_t  U = t->ne[0];
            for (int64_t tok = 0; tok < n / U; tok++)
                for (int64_t u = 0; u < U; u++) {
                    int32_t e;
                    bool    dup;
                    do {
                        e = rng_int(&r, 0, n_expert - 1);
                        dup = false;
                        for (int64_t v = 0; v < u; v++) dup |= ids[tok * U + v] == e;
                    } while (dup);
                    ids[tok * U + u] = e;
                }
        } else if (t->type == KILN_I32 || t->type == KILN_I64) {
            for (int64_t k = 0; k < n; k++) kb_store_f32(d->data, t->type, k, (float)rng_int(&r, 0, 3));
        } else {
            fill(d->data, t->type, n, seed * 7 + (uint64_t)i, FILL_ANY);
        }
    }
}

/* kg fused and unfused, each against the reference. */
static void run_kg(const char *kg, const char *what, int n_expert, uint64_t seed) {
    need_gpu();
    kiln_ctx   *ctx;
    kiln_graph *g = ts_build(kg, &ctx);
    hset h = {0};
    fill_leaves(g, &h, seed, n_expert);
    for (int no_fuse = 0; no_fuse <= 1; no_fuse++) {
        char label[2600];
        snprintf(label, sizeof label, "%s%s:\n%s", what, no_fuse ? " (unfused)" : " (fused)", kg);
        cmp_opts co = {.label = label, .tol_f32 = fe_ops[FE_OP_MUL_MAT].nmse_tol, .no_fuse = no_fuse};
        double   e = check_graph(g, &h, &co);
        printf("%-60s %s nmse %.3g\n", what, no_fuse ? "unfused" : "fused  ", e);
    }
    hset_free(&h);
    ts_graph_free(g, ctx);
}

static void glu_call(char *out, size_t n, const char *glu, const char *x, const char *g) {
    if (!strcmp(glu, "swiglu_oai")) snprintf(out, n, "%s(%s, %s, alpha=1.702, limit=7)", glu, x, g);
    else snprintf(out, n, "%s(%s, %s)", glu, x, g);
}

static void dense(const char *wt, int K, int M, int N, const char *glu, bool gate_x, int bias, uint64_t seed) {
    char kg[2048], call[128], what[160];
    const char *gn = bias & 1 ? "gate_b" : "gate", *un = bias & 2 ? "up_b" : "up";
    glu_call(call, sizeof call, glu, gate_x ? gn : un, gate_x ? un : gn);
    snprintf(kg, sizeof kg,
             "weight wg: %s[%d, %d]\nweight wu: %s[%d, %d]\nweight bg: f32[%d]\ninput bu: f32[%d, %d]\n"
             "input x: f32[%d, %d]\nup = mul_mat(wu, x)\ngate = mul_mat(wg, x)\n%s%soutput y = %s\n",
             wt, K, M, wt, K, M, M, M, N, K, N, bias & 1 ? "gate_b = add(gate, bg)\n" : "",
             bias & 2 ? "up_b = add(bu, up)\n" : "", call);
    snprintf(what, sizeof what, "dense %s K %d M %d n %d %s%s bias %d", wt, K, M, N, glu, gate_x ? "" : " (up first)", bias);
    run_kg(kg, what, 0, seed);
}

static const int NS[5] = {1, 3, 16, 64, 512};

START_TEST(test_dense) {
    int         ni = _i / 3, ti = _i % 3;
    const char *wt = WTS[ti];
    for (int v = 0; v < 2; v++) {
        int k = _i * 2 + v;
        dense(wt, v ? 320 : 256, v ? 200 : 384, NS[ni], GLUS[k % NGLU], k % 2 == 0, k % 4, 1000 + (uint64_t)k);
    }
    if (ni == 0) dense(wt, 8192, 64, 1, "swiglu", true, 3, 77);
}
END_TEST

static void moe(const char *wt, int T, const char *glu, int bias, uint64_t seed) {
    char kg[2048], call[128], what[160];
    glu_call(call, sizeof call, glu, bias & 1 ? "gate_b" : "gate", bias & 2 ? "up_b" : "up");
    snprintf(kg, sizeof kg,
             "weight wg: %s[256, 192, 128]\nweight wu: %s[256, 192, 128]\nweight bg: f32[192]\n"
             "input x: f32[256, 1, %d]\ninput ids: i32[8, %d]\n"
             "gate = mul_mat_id(wg, x, ids)\nup = mul_mat_id(wu, x, ids)\n%s%soutput y = %s\n",
             wt, wt, T, T, bias & 1 ? "gate_b = add(gate, bg)\n" : "", bias & 2 ? "up_b = add(up, bg)\n" : "", call);
    snprintf(what, sizeof what, "moe %s T %d 8 of 128 %s bias %d", wt, T, glu, bias);
    run_kg(kg, what, 128, seed);
}

START_TEST(test_moe) {
    static const int T[3] = {1, 4, 64};
    int              ti = _i / 3;
    for (int v = 0; v < 2; v++) moe(WTS[(_i + v) % 3], T[ti], GLUS[(_i * 2 + v) % NGLU], v ? 3 : _i % 3, 2000 + (uint64_t)_i);
}
END_TEST

START_TEST(test_one_tensor) {
    char kg[512];
    snprintf(kg, sizeof kg, "weight w: bf16[256, 384]\ninput x: f32[256, %d]\ngu = mul_mat(w, x)\noutput y = swiglu(gu%s)\n",
             _i < 2 ? 1 : 16, _i % 2 ? ", swapped=true" : "");
    run_kg(kg, "one-tensor swiglu", 0, 3000 + (uint64_t)_i);
    /* the halves form over a quantized weight (phi3's gate_up in a quantized file) */
    snprintf(kg, sizeof kg, "weight w: q4_0[256, 384]\ninput x: f32[256, %d]\ngu = mul_mat(w, x)\noutput y = geglu(gu%s)\n",
             _i < 2 ? 1 : 16, _i % 2 ? ", swapped=true" : "");
    run_kg(kg, "one-tensor geglu, q4_0", 0, 3100 + (uint64_t)_i);
}
END_TEST

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    ck_assert_uint_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = 0;
    fclose(f);
    return s;
}

START_TEST(test_examples) {
    static const char *files[2] = {"examples/llama-layer.kg", "examples/qwen3moe-layer.kg"};
    char path[4096];
    need_gpu();
    snprintf(path, sizeof path, "%s/%s", ts_src_dir(), files[_i]);
    char *kg = read_file(path);
    kiln_ctx   *ctx;
    kiln_graph *g = ts_build(kg, &ctx);
    hset h = {0};
    fill_leaves(g, &h, 4000 + (uint64_t)_i, 128);
    scale_weights(g, &h);
    for (int no_fuse = 0; no_fuse <= 1; no_fuse++) {
        char label[256];
        snprintf(label, sizeof label, "%s%s", files[_i], no_fuse ? " (unfused)" : " (fused)");
        /* a whole layer: the loosest op tolerance of its kernels (attention's) */
        cmp_opts co = {.label = label, .tol_f32 = 5e-4, .fused_tol = true, .no_fuse = no_fuse};
        double   e = check_graph(g, &h, &co);
        printf("%-60s nmse %.3g\n", label, e);
    }
    hset_free(&h);
    ts_graph_free(g, ctx);
    free(kg);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_fuse_glu",
                        TS_CASE("dense", 900), TS_LOOP(0, 15, test_dense),
                        TS_CASE("moe", 900), TS_LOOP(0, 9, test_moe),
                        TS_CASE("one_tensor", 900), TS_LOOP(0, 4, test_one_tensor),
                        TS_CASE("examples", 900), TS_LOOP(0, 2, test_examples));
    return ts_main_cache(s, "gpu-fuse-glu", &g_cache_dir);
}
