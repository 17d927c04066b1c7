/* GPU tests of the topk_moe fusion (ir/fuse_topk_moe.c, templates/moe.lua): MoE routing graphs
 * as llama.cpp's build_moe_ffn builds them (softmax / sigmoid / delayed softmax gating, selection
 * bias, norm with and without clamp, scale; E of 8 to 512, k of 1 to 32, T of 1 to 512), each
 * compiled with fusion (one kernel) and without, run on the GPU and compared:
 *  - fused vs the CPU reference: ids exactly, weights by NMSE (<= 1e-10: the GPU's expf and its
 *    tree-ordered double sums differ from the reference's in the last bits only);
 *  - fused vs unfused GPU: ids exactly, weights by NMSE (<= 1e-10).
 * Logits are distinct within a row and spaced far apart (so no rounding difference can swap two
 * experts), except in the ties case, whose equal logits must come out in index order.
 *
 * $KILN_TEST_CASES changes the number of random cases (default 24). */
#include "tests/support.h"

#include "base/base.h"
#include "frontend/frontend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/gpu_support.h"

#define W_TOL 1e-10

typedef enum { G_SOFTMAX, G_SIGMOID, G_DELAYED } gating;
static const char *GATE_NAMES[] = {"softmax", "sigmoid", "delayed"};

typedef struct {
    int    E, T, k;
    gating gate;
    bool   bias, norm, clamp, scale, ties;
} moe_case;

/* The routing graph of c: outputs ids (i32 [k, T]) and weights. Caller frees. */
static char *moe_kg(const moe_case *c) {
    kb_str g = {0};
    int    E = c->E, T = c->T, k = c->k;
    kb_str_addf(&g, "kiln-graph 1\ninput logits: f32[%d, %d]\n", E, T);
    if (c->bias) kb_str_addf(&g, "weight bias: f32[%d]\n", E);
    const char *P = c->gate == G_DELAYED ? "logits" : "probs";
    if (c->gate == G_SOFTMAX) kb_str_add(&g, "probs = soft_max(logits)\n");
    if (c->gate == G_SIGMOID) kb_str_add(&g, "probs = sigmoid(logits)\n");
    if (c->bias) kb_str_addf(&g, "sel = add(%s, bias)\n", P);
    kb_str_addf(&g, "output ids = argsort_top_k(%s, %d)\n", c->bias ? "sel" : P, k);
    kb_str_addf(&g, "p3 = reshape(%s, [1, %d, %d])\n", P, E, T);
    /* The tail after get_rows; its last statement is the output `weights`. */
    char stm[8][96];
    int  n = 0;
    snprintf(stm[n++], sizeof stm[0], "w = get_rows(p3, ids)");
    const char *cur = "w";
    if (c->gate == G_DELAYED) {
        snprintf(stm[n++], sizeof stm[0], "w2 = reshape(w, [%d, %d])", k, T);
        snprintf(stm[n++], sizeof stm[0], "wd = soft_max(w2)");
        cur = "wd";
    }
    if (c->norm) {
        snprintf(stm[n++], sizeof stm[0], "wf = reshape(%s, [%d, %d])", cur, k, T);
        snprintf(stm[n++], sizeof stm[0], "s = sum_rows(wf)");
        if (c->clamp) snprintf(stm[n++], sizeof stm[0], "sc = clamp(s, 0.05, 0.3)");
        snprintf(stm[n++], sizeof stm[0], "wn = div(wf, %s)", c->clamp ? "sc" : "s");
        cur = "wn";
    }
    if (c->scale) snprintf(stm[n++], sizeof stm[0], "ws = scale(%s, 2.5)", cur);
    for (int i = 0; i < n; i++)
        kb_str_addf(&g, i == n - 1 ? "output weights %s\n" : "%s\n", i == n - 1 ? strchr(stm[i], '=') : stm[i]);
    return kb_str_take(&g);
}

/* Logits distinct within each row, 8/E apart in [-4, 4) (ties: 4 values only); the bias in
 * steps of 0.25. */
static void fill_case(const moe_case *c, hset *h, uint64_t seed) {
    rng_t  r = {seed};
    hdata *x = hset_add(h, "logits", KILN_F32, (int64_t)c->E * c->T);
    for (int t = 0; t < c->T; t++) {
        int add = rng_int(&r, 0, c->E - 1);
        for (int e = 0; e < c->E; e++) {
            int   v = (e * 37 + add) % c->E;
            float f = c->ties ? (float)(v % 4) : (float)v * (8.0f / (float)c->E) - 4.0f;
            ((float *)x->data)[(int64_t)t * c->E + e] = f;
        }
    }
    if (c->bias) {
        hdata *b = hset_add(h, "bias", KILN_F32, c->E);
        for (int e = 0; e < c->E; e++) ((float *)b->data)[e] = (float)rng_int(&r, 0, 4) * 0.25f;
    }
}

/* Runs g compiled with or without fusion on h's inputs; ids and weights come back (caller frees). */
static void run_gpu(const kiln_graph *g, const hset *h, int no_fuse, int *kernels, int32_t **ids, float **w, size_t nid,
                    size_t nw) {
    kiln_program *p = compile(g, no_fuse);
    *kernels = kiln_program_kernel_count(p);
    kiln_session *s = NULL;
    TS_OK(kiln_session_new(p, NULL, &s));
    for (int i = 0; i < h->nin; i++)
        TS_OK(kiln_session_set(s, h->in[i].name, h->in[i].data, (size_t)h->in[i].n * kiln_type_size(h->in[i].type)));
    TS_OK(kiln_session_run(s));
    *ids = malloc(nid * sizeof **ids);
    *w = malloc(nw * sizeof **w);
    TS_OK(kiln_session_get(s, "ids", *ids, nid * sizeof **ids));
    TS_OK(kiln_session_get(s, "weights", *w, nw * sizeof **w));
    kiln_session_free(s);
    kiln_program_free(p);
}

static void expect_same_ids(const int32_t *got, const int32_t *want, size_t n, const char *what, const char *label) {
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(got[i] == want[i], "%s: %s: ids[%zu] = %d, want %d", label, what, i, got[i], want[i]);
}

static void expect_close(const float *got, const float *want, size_t n, const char *what, const char *label) {
    int64_t bad;
    bool    nonfinite;
    double  e = nmse(got, want, KILN_F32, (int64_t)n, &bad, &nonfinite);
    ck_assert_msg(bad < 0 && !nonfinite && e <= W_TOL, "%s: %s: weights NMSE %.3g (tolerance %.1g)", label, what, e,
                  W_TOL);
}

static void run_case(const moe_case *c, uint64_t seed) {
    char  label[256];
    snprintf(label, sizeof label, "E %d k %d T %d %s%s%s%s%s%s (seed %llu)", c->E, c->k, c->T, GATE_NAMES[c->gate],
             c->bias ? " bias" : "", c->norm ? " norm" : "", c->clamp ? " clamp" : "", c->scale ? " scale" : "",
             c->ties ? " ties" : "", (unsigned long long)seed);
    char       *kg = moe_kg(c);
    kiln_ctx   *ctx;
    kiln_graph *g = ts_build(kg, &ctx);
    hset h = {0};
    fill_case(c, &h, seed);
    TS_OK(kiln_reference(g, ref_get, ref_put, &h));
    const int32_t *rid = NULL;
    const float   *rw = NULL;
    for (int i = 0; i < h.nout; i++) {
        if (strcmp(h.out[i].name, "ids") == 0) rid = h.out[i].data;
        if (strcmp(h.out[i].name, "weights") == 0) rw = h.out[i].data;
    }
    ck_assert_msg(rid && rw, "%s: reference outputs missing", label);
    size_t   nid = (size_t)c->k * (size_t)c->T, nw = nid;
    int32_t *fid, *uid;
    float   *fw, *uw;
    int      fk, uk;
    run_gpu(g, &h, 0, &fk, &fid, &fw, nid, nw);
    run_gpu(g, &h, 1, &uk, &uid, &uw, nid, nw);
    ck_assert_msg(fk == 1, "%s: fused program has %d kernels, want 1\n%s", label, fk, kg);
    ck_assert_msg(uk > 1, "%s: unfused program has %d kernels", label, uk);
    expect_same_ids(fid, rid, nid, "fused vs reference", label);
    expect_close(fw, rw, nw, "fused vs reference", label);
    expect_same_ids(fid, uid, nid, "fused vs unfused", label);
    expect_close(fw, uw, nw, "fused vs unfused", label);
    free(fid), free(fw), free(uid), free(uw);
    hset_free(&h);
    ts_graph_free(g, ctx);
    free(kg);
}

static int num_cases(void) {
    const char *e = getenv("KILN_TEST_CASES");
    int         n = e && *e ? atoi(e) : 24;
    return n > 0 ? n : 24;
}

START_TEST(test_fixed_cases) {
    need_gpu();
    static const moe_case cases[] = {
        {128, 1, 8, G_SOFTMAX, false, true, false, false, false},  /* Qwen3-MoE decode */
        {128, 512, 8, G_SOFTMAX, false, true, false, false, false}, /* Qwen3-MoE prefill */
        {256, 7, 8, G_SIGMOID, true, true, false, true, false},     /* DeepSeek-V3 style */
        {60, 7, 4, G_SOFTMAX, false, false, false, false, false},   /* Qwen2-MoE: 60 experts */
        {32, 7, 4, G_DELAYED, false, false, false, false, false},   /* gpt-oss */
        {512, 512, 32, G_SIGMOID, true, true, true, true, false},
        {8, 1, 1, G_SOFTMAX, false, false, false, true, false},
        {8, 512, 2, G_SOFTMAX, false, true, true, false, false},    /* Mixtral */
        {512, 1, 32, G_DELAYED, true, true, false, true, false},
        {128, 7, 8, G_SOFTMAX, false, true, false, false, true},    /* ties */
        {60, 7, 32, G_SIGMOID, true, false, false, false, true},    /* ties */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], 1000 + i);
}
END_TEST

START_TEST(test_random_cases) {
    need_gpu();
    static const int Es[] = {8, 60, 128, 256, 512}, ks[] = {1, 2, 4, 8, 32}, Ts[] = {1, 7, 512};
    int n = num_cases();
    for (int i = 0; i < n; i++) {
        rng_t    r = {7777 + 31 * (uint64_t)i};
        moe_case c = {.E = Es[rng_int(&r, 0, 4)], .k = ks[rng_int(&r, 0, 4)], .T = Ts[rng_int(&r, 0, 2)],
                      .gate = (gating)rng_int(&r, 0, 2), .bias = rng_int(&r, 0, 1), .norm = rng_int(&r, 0, 1),
                      .scale = rng_int(&r, 0, 1)};
        c.clamp = c.norm && rng_int(&r, 0, 1);
        if (c.k > c.E) c.k = c.E;
        run_case(&c, 5000 + (uint64_t)i);
    }
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_fuse_topk_moe",
                        TS_CASE("topk_moe", 600), TS_TESTS(test_fixed_cases, test_random_cases));
    return ts_main_cache(s, "gpu-fuse-topk-moe", &g_cache_dir);
}
