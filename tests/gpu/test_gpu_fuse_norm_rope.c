/* GPU tests of the fusion passes rms_norm_mul and rope_set_rows (issue 5): random cases, each
 * compiled with the pass (the other issue-5 passes left out, so only the pass under test and
 * ew_chain fuse) and without any fusion, run on the GPU and compared by NMSE with the CPU
 * reference and with each other. The fused program must show the fusion (or, for the broken
 * patterns, must not).
 *
 * rms_norm_mul: rms_norm and norm in f32, f16 and bf16 rows (decode rows of 2048 and 4096,
 * per-head rows, rows longer than a block keeps in registers, uneven rows), times a weight of the
 * row's type or f32, then zero, one or two residual adds. rope_set_rows: normal and neox ropes of
 * 1 to 9 tokens written into f32, f16 and bf16 caches by i32 and i64 ids, distinct or repeated
 * (the last token naming a row wins), plus a rope whose result is also used elsewhere (no
 * fusion). NMSE tolerance: 1e-7 (fe_ops' tolerance of rms_norm, norm and rope_ext). */
#include "tests/support.h"

#include "frontend/frontend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/gpu_support.h"

#define OTHERS "topk_moe,mul_mat_glu,add_chain"
#define TOL 1e-7

static double g_worst_ref, g_worst_unfused; /* over the cases of one test (a forked process) */

static void report(const char *what, int i) {
    printf("%s %d: worst NMSE fused vs reference %.3g, fused vs unfused GPU %.3g\n", what, i, g_worst_ref,
           g_worst_unfused);
    fflush(stdout);
}

/* Compiles g (fused but for OTHERS, or not at all), checks the fusion line is (not) in the
 * program, runs it on h's inputs and returns the outputs in h->out's order. */
static void **run_gpu(const kiln_graph *g, hset *h, int no_fuse, const char *line, bool want, const char *label) {
    kiln_compile_opts o = {.arch = g_arch, .cache_dir = g_cache_dir, .no_fuse = no_fuse,
                           .no_fuse_passes = no_fuse ? NULL : OTHERS};
    kiln_program *p = NULL;
    kiln_status   st = kiln_compile(g, &o, &p);
    ck_assert_msg(st == NULL, "%s: compile: %s", label, kiln_status_msg(st));
    if (line) {
        char *text;
        TS_OK(kiln_program_describe(p, &text));
        ck_assert_msg((strstr(text, line) != NULL) == want, "%s: '%s' %s:\n%s", label, line,
                      want ? "missing" : "present", text);
        free(text);
    }
    kiln_session     *s = NULL;
    kiln_session_opts so = {.device = 0};
    TS_OK(kiln_session_new(p, &so, &s));
    for (int i = 0; i < h->nin; i++)
        if (h->in[i].requested)
            TS_OK(kiln_session_set(s, h->in[i].name, h->in[i].data, (size_t)h->in[i].n * kiln_type_size(h->in[i].type)));
    TS_OK(kiln_session_run(s));
    void **out = calloc((size_t)h->nout, sizeof *out);
    ck_assert_ptr_nonnull(out);
    for (int i = 0; i < h->nout; i++) {
        size_t bytes = (size_t)h->out[i].n * kiln_type_size(h->out[i].type);
        out[i] = malloc(bytes ? bytes : 1);
        ck_assert_ptr_nonnull(out[i]);
        TS_OK(kiln_session_get(s, h->out[i].name, out[i], bytes));
    }
    kiln_session_free(s);
    kiln_program_free(p);
    return out;
}

static void compare(const char *label, const char *what, const hdata *r, const void *out, const void *want) {
    int64_t bad;
    bool    nonfinite;
    double  e = nmse(out, want, r->type, r->n, &bad, &nonfinite);
    ck_assert_msg(!nonfinite && bad < 0, "%s: output '%s': non-finite values (vs %s, element %lld)", label, r->name,
                  what, (long long)bad);
    ck_assert_msg(e <= TOL, "%s: output '%s' (%s, %lld elements): NMSE vs %s %.3g > %.3g", label, r->name,
                  kiln_type_name(r->type), (long long)r->n, what, e, TOL);
    double *w = strcmp(what, "reference") == 0 ? &g_worst_ref : &g_worst_unfused;
    if (e > *w) *w = e;
}

/* kg over the inputs in h: fused vs reference and fused vs unfused. */
static void check_case(const char *kg, hset *h, const char *line, bool want, const char *label) {
    kiln_ctx   *ctx;
    kiln_graph *g = ts_build(kg, &ctx);
    hset_clear_out(h);
    for (int i = 0; i < h->nin; i++) h->in[i].requested = false;
    TS_OK(kiln_reference(g, ref_get, ref_put, h));
    ck_assert_msg(h->nout > 0, "%s: no output", label);
    void **f = run_gpu(g, h, 0, line, want, label);
    void **u = run_gpu(g, h, 1, NULL, false, label);
    for (int i = 0; i < h->nout; i++) {
        compare(label, "reference", &h->out[i], f[i], h->out[i].data);
        compare(label, "unfused GPU", &h->out[i], f[i], u[i]);
        free(f[i]);
        free(u[i]);
    }
    free(f);
    free(u);
    ts_graph_free(g, ctx);
}

/* ---- rms_norm_mul ------------------------------------------------------------------------------ */

static const int64_t NORM_SHAPES[][3] = {
    {2048, 1, 1}, {4096, 1, 1}, {128, 8, 3}, {5000, 2, 1}, {7, 5, 3}, {1024, 9, 1},
};
#define NNORM_SHAPES (int)(sizeof NORM_SHAPES / sizeof NORM_SHAPES[0])

/* _i = op * 3 + type; every shape with 0, 1 and 2 adds. */
START_TEST(rms_norm_mul) {
    need_gpu();
    const char *op = _i / 3 ? "norm" : "rms_norm";
    kiln_type   t = FLOAT_TYPES[_i % 3];
    const char *tn = kiln_type_name(t);
    for (int c = 0; c < NNORM_SHAPES * 3; c++) {
        const int64_t *ne = NORM_SHAPES[c / 3];
        int            adds = c % 3;
        uint64_t       seed = 0x6e6d756cull + (uint64_t)_i * 1000 + (uint64_t)c;
        kiln_type      wt = c % 2 ? KILN_F32 : t;
        int64_t        n = ne[0] * ne[1] * ne[2];
        hset           h = {0};
        fill(hset_add(&h, "x", t, n)->data, t, n, seed, FILL_ANY);
        fill(hset_add(&h, "w", wt, ne[0])->data, wt, ne[0], seed + 1, FILL_ANY);
        if (adds > 0) fill(hset_add(&h, "r", t, n)->data, t, n, seed + 2, FILL_ANY);
        if (adds > 1) fill(hset_add(&h, "s", t, ne[0])->data, t, ne[0], seed + 3, FILL_ANY);
        char kg[1024], label[256];
        int  k = snprintf(kg, sizeof kg, "input x: %s[%lld, %lld, %lld]\nweight w: %s[%lld]\nn = %s(x, 1e-05)\n", tn,
                          (long long)ne[0], (long long)ne[1], (long long)ne[2], kiln_type_name(wt), (long long)ne[0], op);
        if (adds > 0)
            k += snprintf(kg + k, sizeof kg - (size_t)k, "input r: %s[%lld, %lld, %lld]\nm = mul(n, w)\n", tn,
                          (long long)ne[0], (long long)ne[1], (long long)ne[2]);
        if (adds == 0) snprintf(kg + k, sizeof kg - (size_t)k, "output y = mul(n, w)\n");
        else if (adds == 1) snprintf(kg + k, sizeof kg - (size_t)k, "output y = add(m, r)\n");
        else snprintf(kg + k, sizeof kg - (size_t)k, "input s: %s[%lld]\na = add(r, m)\noutput y = add(a, s)\n", tn,
                      (long long)ne[0]);
        const char *line = adds == 0 ? "fused rms_norm_mul: n, y\n"
                           : adds == 1 ? "fused rms_norm_mul: n, m, y\n"
                                       : "fused rms_norm_mul: n, m, a, y\n";
        snprintf(label, sizeof label, "%s %s [%lld, %lld, %lld] weight %s, %d add(s)", op, tn, (long long)ne[0],
                 (long long)ne[1], (long long)ne[2], kiln_type_name(wt), adds);
        check_case(kg, &h, line, true, label);
        hset_free(&h);
    }
    report("rms_norm_mul", _i);
}
END_TEST

/* The norm's result is also an output: no fusion, still right. */
START_TEST(rms_norm_mul_blocked) {
    need_gpu();
    hset h = {0};
    fill(hset_add(&h, "x", KILN_F16, 4096 * 2)->data, KILN_F16, 4096 * 2, 7, FILL_ANY);
    fill(hset_add(&h, "w", KILN_F32, 4096)->data, KILN_F32, 4096, 8, FILL_ANY);
    check_case("input x: f16[4096, 2]\nweight w: f32[4096]\noutput n = rms_norm(x, 1e-06)\noutput y = mul(n, w)\n", &h,
               "fused rms_norm_mul:", false, "rms_norm whose result is an output");
    hset_free(&h);
}
END_TEST

/* ---- rope_set_rows ------------------------------------------------------------------------------ */

static const struct {
    int  hd, heads, tokens, slots;
    bool i64, repeat;
} ROPES[] = {
    {64, 8, 1, 1024, true, false},  {128, 8, 1, 512, true, false}, {128, 4, 4, 64, false, false},
    {64, 2, 7, 16, true, true},     {128, 2, 9, 12, false, true},  {32, 3, 5, 40, true, false},
};
#define NROPES (int)(sizeof ROPES / sizeof ROPES[0])

/* Row ids of the tokens: distinct (a partial shuffle of the slots), or drawn from three rows
 * so that tokens repeat rows. */
static void fill_ids(hdata *d, rng_t *r, int tokens, int slots, bool repeat) {
    int *perm = malloc((size_t)slots * sizeof *perm);
    ck_assert_ptr_nonnull(perm);
    for (int j = 0; j < slots; j++) perm[j] = j;
    for (int j = 0; j < tokens; j++) {
        int k = rng_int(r, j, slots - 1), v = perm[k];
        perm[k] = perm[j], perm[j] = v;
        kb_store_f32(d->data, d->type, j, (float)(repeat ? rng_int(r, 0, 2) : v));
    }
    free(perm);
}

/* _i = mode (normal, neox) * 3 + cache type. */
START_TEST(rope_set_rows) {
    need_gpu();
    int         mode = _i / 3 ? 2 : 0;
    kiln_type   ct = FLOAT_TYPES[_i % 3];
    for (int c = 0; c < NROPES; c++) {
        int      hd = ROPES[c].hd, heads = ROPES[c].heads, tokens = ROPES[c].tokens, slots = ROPES[c].slots;
        uint64_t seed = 0x726f7065ull + (uint64_t)_i * 1000 + (uint64_t)c;
        rng_t    r = {seed};
        hset     h = {0};
        int64_t  nk = (int64_t)hd * heads * tokens, nc = (int64_t)hd * heads * slots;
        fill(hset_add(&h, "k", KILN_F32, nk)->data, KILN_F32, nk, seed, FILL_ANY);
        hdata *pos = hset_add(&h, "pos", KILN_I32, tokens);
        for (int j = 0; j < tokens; j++) ((int32_t *)pos->data)[j] = rng_int(&r, 0, 30000);
        fill_ids(hset_add(&h, "idx", ROPES[c].i64 ? KILN_I64 : KILN_I32, tokens), &r, tokens, slots, ROPES[c].repeat);
        fill(hset_add(&h, "cache", ct, nc)->data, ct, nc, seed + 1, FILL_ANY);
        char kg[1024], label[256];
        snprintf(kg, sizeof kg,
                 "input k: f32[%d, %d, %d]\ninput pos: i32[%d]\ninput idx: %s[%d]\ninput cache: %s[%d, %d]\n"
                 "r = rope_ext(k, pos, n_dims=%d, mode=%d, n_ctx_orig=4096, freq_base=500000)\n"
                 "rows = reshape(r, [%d, %d])\noutput c = set_rows(cache, rows, idx)\n",
                 hd, heads, tokens, tokens, ROPES[c].i64 ? "i64" : "i32", tokens, kiln_type_name(ct), hd * heads, slots,
                 hd, mode, hd * heads, tokens);
        snprintf(label, sizeof label, "rope mode %d [%d, %d, %d] into %s[%d, %d], %s ids%s", mode, hd, heads, tokens,
                 kiln_type_name(ct), hd * heads, slots, ROPES[c].i64 ? "i64" : "i32", ROPES[c].repeat ? " (repeated)" : "");
        check_case(kg, &h, "fused rope_set_rows: r, c\n", true, label);
        hset_free(&h);
    }
    report("rope_set_rows", _i);
}
END_TEST

/* A rope whose result is also read by another node (the Q-like use): no fusion, still right. */
START_TEST(rope_set_rows_blocked) {
    need_gpu();
    hset  h = {0};
    rng_t r = {99};
    fill(hset_add(&h, "k", KILN_F32, 64 * 8 * 2)->data, KILN_F32, 64 * 8 * 2, 5, FILL_ANY);
    hdata *pos = hset_add(&h, "pos", KILN_I32, 2);
    ((int32_t *)pos->data)[0] = 17, ((int32_t *)pos->data)[1] = 18;
    fill_ids(hset_add(&h, "idx", KILN_I64, 2), &r, 2, 32, false);
    fill(hset_add(&h, "cache", KILN_F16, 512 * 32)->data, KILN_F16, 512 * 32, 6, FILL_ANY);
    check_case("input k: f32[64, 8, 2]\ninput pos: i32[2]\ninput idx: i64[2]\ninput cache: f16[512, 32]\n"
               "r = rope_ext(k, pos, n_dims=64, mode=0)\nrows = reshape(r, [512, 2])\n"
               "output c = set_rows(cache, rows, idx)\nq = permute(r, 0, 2, 1, 3)\noutput qc = cont(q)\n",
               &h, "fused rope_set_rows:", false, "rope also read by a permute");
    hset_free(&h);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_fuse_norm_rope",
                        TS_CASE("fuse", 900), TS_LOOP(0, 6, rms_norm_mul), TS_TESTS(rms_norm_mul_blocked),
                        TS_LOOP(0, 6, rope_set_rows), TS_TESTS(rope_set_rows_blocked));
    return ts_main_cache(s, "gpu-fuse-nr", &g_cache_dir);
}
