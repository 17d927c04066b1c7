/* GPU tests of the attention family (flash_attn_ext): cases compiled, run on the GPU and
 * compared with kiln_reference by NMSE against fe_ops[FLASH_ATTN_EXT].nmse_tol (5e-4, ggml's
 * test-backend-ops tolerance for FLASH_ATTN_EXT).
 *
 * Fixed cases cover every kernel of templates/attn.lua (decode with and without split-KV,
 * prefill, the f32/odd-size FMA kernel, the combine step) at the shapes: GQA ratios 1, 4
 * and 8; n_kv 1, 7, 31, 256, 1000, 4097, 16384; n_q 1, 3, 16, 512; head sizes 64, 80, 96, 112,
 * 128, 256, 576/512 and an odd one; each K/V type; masks (random values, causal, ragged: random
 * -inf holes plus fully masked rows, sliding window, broadcast planes, extra rows), ALiBi, softcap, sinks; q in
 * permuted layouts; K/V as strided views (a padded, misaligned view, and a KV-cache view with the
 * heads interleaved in each token's row). Random cases draw from the same sets, per K/V type,
 * their size capped so the CPU reference stays quick ($KILN_TEST_CASES per type, default 12).
 * Fully masked inputs give exact zeros (with and without sinks), which NMSE cannot judge.
 * Each tcase can run alone (CK_RUN_CASE) so a GPU machine can run them in parallel. */
#include "tests/support.h"

#include "frontend/frontend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/gpu_support.h"

typedef enum { MASK_NONE, MASK_VALUES, MASK_CAUSAL, MASK_RAGGED, MASK_WINDOW, MASK_ALL_INF } mask_kind;
typedef enum { KV_PLAIN, KV_PADDED, KV_CACHE } kv_layout;

static const char *MASK_NAMES[] = {"no mask", "mask", "causal mask", "ragged mask", "sliding-window mask",
                                   "all -inf mask"};

typedef struct {
    int64_t   D, Dv, nq, nh, nhkv, nkv, nseq;
    kiln_type kt;
    mask_kind mask;
    int       mpad;   /* mask rows beyond n_q */
    bool      mheads; /* mask planes per head (m2 = n_head) rather than 1 */
    bool      mseq;   /* mask planes per sequence (m3 = n_seq) */
    float     scale_mul; /* scale = scale_mul / sqrt(D) */
    float     max_bias, softcap;
    bool      sinks;
    kv_layout kvl;
    layout    ql;
} acase;

static int num_cases(void) {
    const char *e = getenv("KILN_TEST_CASES");
    int         n = e && *e ? atoi(e) : 12;
    return n > 0 ? n : 12;
}

/* K or V [D, nkv, nhkv, nseq] of type t through layout l, its leaf's data added to h. */
static kiln_tensor *kv_operand(kiln_ctx *ctx, hset *h, const char *name, kiln_type t, int64_t D, const acase *c,
                               uint64_t seed, char *desc, size_t dn) {
    int64_t ne[4] = {D, c->nkv, c->nhkv, c->nseq};
    size_t  es = kiln_type_size(t);
    kiln_tensor *leaf, *x;
    int64_t      n;
    if (c->kvl == KV_PLAIN) {
        x = leaf = kiln_new_tensor(ctx, KILN_ROLE_INPUT, t, name, 4, ne);
        n = D * c->nkv * c->nhkv * c->nseq;
        snprintf(desc, dn, "%s plain", name);
    } else if (c->kvl == KV_PADDED) {
        /* rows of D + 3 elements, 5 spare rows per head, starting at element 1 of row 2:
         * every vector alignment breaks, only rows stay contiguous */
        int64_t src[4] = {D + 3, c->nkv + 5, c->nhkv, c->nseq};
        leaf = kiln_new_tensor(ctx, KILN_ROLE_INPUT, t, name, 4, src);
        size_t nb[3] = {kiln_tensor_nb(leaf, 1), kiln_tensor_nb(leaf, 2), kiln_tensor_nb(leaf, 3)};
        x = kiln_view(ctx, leaf, 4, ne, nb, es * 1 + nb[0] * 2);
        n = src[0] * src[1] * src[2] * src[3];
        snprintf(desc, dn, "%s view of [%lld, %lld, ...] at (1, 2)", name, (long long)src[0], (long long)src[1]);
    } else {
        /* a KV cache as llama.cpp keeps it: [D * nhkv, n_ctx] per sequence, the kv heads of one
         * token side by side; the view starts at cache row 3 */
        int64_t ctxn = c->nkv + 7, src[4] = {D, c->nhkv, ctxn, c->nseq};
        leaf = kiln_new_tensor(ctx, KILN_ROLE_INPUT, t, name, 4, src);
        size_t nb[3] = {D * c->nhkv * es, D * es, D * c->nhkv * ctxn * es};
        x = kiln_view(ctx, leaf, 4, ne, nb, 3 * nb[0]);
        n = src[0] * src[1] * src[2] * src[3];
        snprintf(desc, dn, "%s cache view (heads interleaved, from row 3)", name);
    }
    hdata *d = hset_add(h, name, t, n);
    fill(d->data, t, n, seed, FILL_ANY);
    return x;
}

/* Mask values: random in [-1, 1) with -inf where the kind says. Row i1 of plane p. */
static void fill_mask(hdata *d, const acase *c, int64_t ne1, int64_t planes, uint64_t seed) {
    rng_t r = {seed};
    for (int64_t p = 0; p < planes; p++)
        for (int64_t i1 = 0; i1 < ne1; i1++) {
            bool row_off = c->mask == MASK_RAGGED && (i1 + p) % 7 == 3; /* fully masked rows */
            for (int64_t j = 0; j < c->nkv; j++) {
                float v = rng_float(&r, -1.0f, 1.0f);
                switch (c->mask) {
                case MASK_CAUSAL:
                    if (j > i1 + (c->nkv - c->nq)) v = -INFINITY;
                    break;
                case MASK_RAGGED:
                    if (row_off || rng_int(&r, 0, 9) < 3) v = -INFINITY;
                    break;
                case MASK_WINDOW: /* causal, and at most 100 keys back: early tiles masked too */
                    if (j > i1 + (c->nkv - c->nq) || j + 100 < i1 + (c->nkv - c->nq)) v = -INFINITY;
                    break;
                case MASK_ALL_INF: v = -INFINITY; break;
                default: break;
                }
                kb_store_f32(d->data, KILN_F16, (p * ne1 + i1) * c->nkv + j, v);
            }
        }
}

/* Builds flash_attn_ext for case c over leaves added to h; label describes it. */
static kiln_tensor *build(kiln_ctx *ctx, hset *h, const acase *c, uint64_t seed, char *label, size_t ln) {
    rng_t        lr = {seed ^ 0x5A5Aull};
    char         dq[192], dk[128], dv[128];
    int64_t      qne[4] = {c->D, c->nq, c->nh, c->nseq};
    kiln_tensor *q = operand(ctx, h, &lr, "q", KILN_F32, qne, c->ql, FILL_ANY, seed + 1, dq, sizeof dq);
    kiln_tensor *k = kv_operand(ctx, h, "k", c->kt, c->D, c, seed + 2, dk, sizeof dk);
    kiln_tensor *v = kv_operand(ctx, h, "v", c->kt, c->Dv, c, seed + 3, dv, sizeof dv);
    kiln_tensor *m = NULL, *s = NULL;
    if (c->mask != MASK_NONE) {
        int64_t mne[4] = {c->nkv, c->nq + c->mpad, c->mheads ? c->nh : 1, c->mseq ? c->nseq : 1};
        m = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F16, "m", 4, mne);
        hdata *d = hset_add(h, "m", KILN_F16, mne[0] * mne[1] * mne[2] * mne[3]);
        fill_mask(d, c, mne[1], mne[2] * mne[3], seed + 4);
    }
    if (c->sinks) {
        int64_t ns = c->nh;
        s = kiln_new_tensor(ctx, KILN_ROLE_WEIGHT, KILN_F32, "s", 1, &ns);
        hdata *d = hset_add(h, "s", KILN_F32, ns);
        fill(d->data, KILN_F32, ns, seed + 5, FILL_ANY);
        for (int64_t i = 0; i < ns; i++) ((float *)d->data)[i] *= 3.0f;
    }
    float scale = c->scale_mul / sqrtf((float)c->D);
    snprintf(label, ln,
             "%s D %lld/%lld, n_q %lld, heads %lld/%lld, n_kv %lld, seqs %lld; %s%s%s (+%d rows); scale %g, "
             "max_bias %g, softcap %g%s; %s; %s; %s",
             kiln_type_name(c->kt), (long long)c->D, (long long)c->Dv, (long long)c->nq, (long long)c->nh,
             (long long)c->nhkv, (long long)c->nkv, (long long)c->nseq, MASK_NAMES[c->mask],
             c->mheads ? " per head" : "", c->mseq ? " per seq" : "", c->mpad, (double)scale, (double)c->max_bias,
             (double)c->softcap, c->sinks ? ", sinks" : "", dq, dk, dv);
    return kiln_flash_attn_ext(ctx, q, k, v, m, scale, c->max_bias, c->softcap, s);
}

static void run_case(const acase *c, uint64_t seed) {
    kiln_ctx *ctx = kiln_ctx_new();
    hset      h = {0};
    char      label[1024];
    kiln_tensor *y = build(ctx, &h, c, seed, label, sizeof label);
    ck_assert_msg(y != NULL, "%s: build failed: %s", label, kiln_status_msg(kiln_ctx_status(ctx)));
    kiln_set_output(ctx, y, "out");
    kiln_graph *g = NULL;
    kiln_status st = kiln_graph_new(ctx, &g);
    ck_assert_msg(st == NULL, "%s: kiln_graph_new failed: %s", label, kiln_status_msg(st));
    cmp_opts co = {.label = label, .tol_f32 = fe_ops[FE_OP_FLASH_ATTN_EXT].nmse_tol};
    double   e = check_graph(g, &h, &co);
    fprintf(stderr, "ok  nmse %.2e  %s\n", e, label);
    gpu_free(NULL, NULL, g, &h, ctx);
}

/* ---- fixed cases -------------------------------------------------------------------------------- */

#define F16 KILN_F16
#define BF16 KILN_BF16
#define F32 KILN_F32

/* D, Dv, nq, nh, nhkv, nkv, nseq, type, mask, mpad, mheads, mseq, scale_mul, max_bias, softcap, sinks, kv, q */
static const acase FIXED[] = {
    /* decode: Llama-3-8B heads, split-KV */
    {128, 128, 1, 32, 8, 8192, 1, F16, MASK_NONE, 0, false, false, 1.0f, 0, 0, false, KV_PLAIN, LAY_PLAIN},
    {128, 128, 1, 32, 8, 16384, 1, BF16, MASK_RAGGED, 0, false, false, 1.0f, 0, 0, true, KV_CACHE, LAY_PLAIN},
    {128, 128, 1, 32, 8, 4097, 1, F16, MASK_VALUES, 3, false, false, 2.0f, 0, 0, false, KV_PADDED, LAY_PERMUTE},
    /* decode: every n_kv, GQA 1, 4, 8, n_q 1, 3, 16 */
    {64, 64, 1, 8, 8, 1, 1, F16, MASK_NONE, 0, false, false, 1.0f, 0, 0, false, KV_PLAIN, LAY_PLAIN},
    {80, 80, 3, 8, 1, 7, 1, BF16, MASK_CAUSAL, 1, false, false, 1.0f, 0, 0, false, KV_PLAIN, LAY_PLAIN},
    {96, 96, 16, 16, 4, 31, 1, F16, MASK_RAGGED, 0, false, false, 1.0f, 4.0f, 0, false, KV_PLAIN, LAY_TRANSPOSE},
    {112, 112, 16, 4, 4, 4097, 1, BF16, MASK_RAGGED, 0, false, false, 1.5f, 0, 20.0f, true, KV_PLAIN, LAY_PLAIN},
    {256, 256, 3, 8, 2, 16384, 1, F16, MASK_RAGGED, 2, false, false, 1.0f, 0, 0, true, KV_PLAIN, LAY_PLAIN},
    {128, 128, 3, 8, 1, 1000, 1, BF16, MASK_CAUSAL, 0, false, false, 1.0f, 8.0f, 0, false, KV_CACHE, LAY_VIEW},
    {64, 64, 1, 12, 4, 256, 2, F16, MASK_RAGGED, 0, true, true, 1.0f, 0, 0, true, KV_PLAIN, LAY_PLAIN},
    /* prefill: tensor-core tiles, causal and ragged, GQA packing, views, splits */
    {128, 128, 512, 8, 2, 512, 1, F16, MASK_CAUSAL, 0, false, false, 1.0f, 0, 0, false, KV_PLAIN, LAY_PLAIN},
    {128, 128, 512, 8, 1, 1000, 1, BF16, MASK_CAUSAL, 5, false, false, 1.0f, 0, 0, true, KV_CACHE, LAY_PERMUTE},
    {256, 256, 512, 4, 1, 256, 1, BF16, MASK_RAGGED, 0, false, false, 1.0f, 0, 0, false, KV_PLAIN, LAY_PLAIN},
    {64, 64, 512, 2, 2, 256, 1, F16, MASK_RAGGED, 0, true, false, 1.0f, 2.0f, 0, false, KV_PLAIN, LAY_PERMUTE},
    {80, 80, 512, 4, 1, 300, 1, F16, MASK_VALUES, 0, false, false, 1.0f, 0, 30.0f, true, KV_PLAIN, LAY_PLAIN},
    {96, 96, 16, 32, 4, 4097, 1, BF16, MASK_CAUSAL, 0, false, false, 1.0f, 0, 0, false, KV_PLAIN, LAY_PLAIN},
    {112, 112, 512, 2, 2, 31, 2, BF16, MASK_NONE, 0, false, false, 1.0f, 0, 0, true, KV_PLAIN, LAY_PLAIN},
    {128, 128, 64, 8, 2, 1000, 1, F16, MASK_RAGGED, 0, false, false, 1.0f, 0, 0, false, KV_PADDED, LAY_PLAIN},
    {128, 128, 16, 16, 2, 16384, 1, F16, MASK_CAUSAL, 0, false, false, 1.0f, 0, 0, false, KV_PLAIN, LAY_PLAIN},
    {128, 128, 512, 4, 1, 1000, 1, BF16, MASK_WINDOW, 0, false, false, 1.0f, 0, 0, true, KV_PLAIN, LAY_PLAIN},
    {64, 64, 300, 4, 2, 600, 2, F16, MASK_WINDOW, 2, true, true, 1.0f, 1.0f, 0, false, KV_CACHE, LAY_PLAIN},
    /* f32 K/V and other head sizes: the FMA kernel (576 / 512: the decode kernel) */
    {128, 128, 1, 32, 8, 4097, 1, F32, MASK_RAGGED, 0, false, false, 1.0f, 0, 0, true, KV_CACHE, LAY_PLAIN},
    {64, 64, 16, 8, 1, 1000, 1, F32, MASK_CAUSAL, 0, false, false, 1.0f, 3.0f, 0, false, KV_PLAIN, LAY_PLAIN},
    {80, 80, 512, 2, 2, 256, 1, F32, MASK_NONE, 0, false, false, 1.0f, 0, 10.0f, false, KV_PADDED, LAY_PERMUTE},
    {256, 256, 3, 4, 1, 16384, 1, F32, MASK_VALUES, 0, false, false, 1.0f, 0, 0, true, KV_PLAIN, LAY_PLAIN},
    {576, 512, 1, 16, 1, 1000, 1, F16, MASK_RAGGED, 0, false, false, 1.0f, 0, 0, false, KV_PLAIN, LAY_PLAIN},
    {576, 512, 16, 16, 1, 256, 1, BF16, MASK_CAUSAL, 0, false, false, 1.0f, 0, 0, false, KV_PLAIN, LAY_PLAIN},
    /* DeepSeek's MLA prefill: 16 heads over one kv head of 576 / 512, the decode kernel's tiles */
    {576, 512, 300, 16, 1, 600, 1, BF16, MASK_CAUSAL, 0, false, false, 1.0f, 0, 0, false, KV_CACHE, LAY_PERMUTE},
    {40, 40, 3, 4, 2, 7, 1, BF16, MASK_VALUES, 0, false, false, 1.0f, 0, 0, true, KV_PLAIN, LAY_PLAIN},
};
#define NFIXED ((int)(sizeof FIXED / sizeof FIXED[0]))

START_TEST(test_fixed) {
    need_gpu();
    run_case(&FIXED[_i], 1000003ull * (uint64_t)(_i + 1));
}
END_TEST

/* ---- random cases ------------------------------------------------------------------------------- */

static acase random_case(rng_t *r, kiln_type t) {
    static const int64_t Ds[] = {64, 80, 96, 112, 128, 256};
    static const int64_t Gs[] = {1, 4, 8};
    static const int64_t kvs[] = {1, 7, 31, 256, 1000, 4097, 16384};
    static const int64_t qs[] = {1, 3, 16, 512};
    acase c = {0};
    c.D = c.Dv = Ds[rng_int(r, 0, 5)];
    int64_t G = Gs[rng_int(r, 0, 2)];
    c.nhkv = rng_int(r, 1, 4);
    c.nh = G * c.nhkv;
    c.nkv = kvs[rng_int(r, 0, 6)];
    c.nq = qs[rng_int(r, 0, 3)];
    c.nseq = rng_int(r, 0, 3) == 0 ? 2 : 1;
    c.kt = t;
    c.mask = (mask_kind)rng_int(r, 0, 4);
    if (c.mask != MASK_NONE) {
        c.mpad = rng_int(r, 0, 2) == 0 ? rng_int(r, 1, 4) : 0;
        c.mheads = rng_int(r, 0, 3) == 0;
        c.mseq = c.nseq > 1 && rng_int(r, 0, 1);
        if (rng_int(r, 0, 2) == 0) c.max_bias = rng_float(r, 0.5f, 8.0f);
    }
    c.scale_mul = rng_float(r, 0.25f, 2.0f);
    if (rng_int(r, 0, 3) == 0) c.softcap = rng_float(r, 5.0f, 50.0f);
    c.sinks = rng_int(r, 0, 1);
    c.kvl = (kv_layout)rng_int(r, 0, 2);
    c.ql = rng_int(r, 0, 2) == 0 ? (layout)rng_int(r, 0, LAY_COUNT - 1) : LAY_PLAIN;
    /* keep the CPU reference (n_q * n_head * n_kv * (Dk + Dv) multiply-adds) under ~2e8 */
    while (c.nq * c.nh * c.nkv * c.nseq * (c.D + c.Dv) > 200000000) {
        if (c.nseq > 1) c.nseq = 1, c.mseq = false;
        else if (c.nhkv > 1) c.nhkv--, c.nh = G * c.nhkv;
        else if (c.nq > 16) c.nq = 16;
        else if (c.nkv > 1000) c.nkv = 1000;
        else break;
    }
    return c;
}

/* _i: K/V type */
START_TEST(test_random) {
    need_gpu();
    kiln_type t = FLOAT_TYPES[_i];
    rng_t     r = {424242ull + 31ull * (uint64_t)_i};
    int       n = num_cases();
    for (int i = 0; i < n; i++) {
        acase c = random_case(&r, t);
        run_case(&c, 7919ull * (uint64_t)(i + 1) + (uint64_t)_i);
    }
}
END_TEST

/* ---- fully masked: exact zeros --------------------------------------------------------------------- */

/* Every key masked for every row: 0 everywhere (ggml: S == 0 gives 0), with or without sinks,
 * in each kernel (decode with splits, prefill, FMA). */
START_TEST(test_all_masked) {
    need_gpu();
    static const acase cs[] = {
        {128, 128, 1, 32, 8, 4097, 1, F16, MASK_ALL_INF, 0, false, false, 1.0f, 0, 0, false, KV_PLAIN, LAY_PLAIN},
        {128, 128, 1, 32, 8, 4097, 1, BF16, MASK_ALL_INF, 0, false, false, 1.0f, 0, 0, true, KV_PLAIN, LAY_PLAIN},
        {64, 64, 200, 4, 1, 300, 1, F16, MASK_ALL_INF, 0, false, false, 1.0f, 0, 0, false, KV_PLAIN, LAY_PLAIN},
        {64, 64, 200, 4, 1, 300, 1, BF16, MASK_ALL_INF, 0, false, false, 1.0f, 2.0f, 0, true, KV_PLAIN, LAY_PLAIN},
        {64, 64, 3, 4, 1, 1000, 1, F32, MASK_ALL_INF, 0, false, false, 1.0f, 0, 0, true, KV_PLAIN, LAY_PLAIN},
    };
    const acase *c = &cs[_i];
    kiln_ctx    *ctx = kiln_ctx_new();
    hset         h = {0};
    char         label[1024];
    kiln_set_output(ctx, build(ctx, &h, c, 99 + (uint64_t)_i, label, sizeof label), "out");
    kiln_graph *g = NULL;
    TS_OK(kiln_graph_new(ctx, &g));
    TS_OK(kiln_reference(g, ref_get, ref_put, &h));
    kiln_program *p = compile(g, 0);
    kiln_session *s = NULL;
    TS_OK(kiln_session_new(p, NULL, &s));
    for (int i = 0; i < h.nin; i++)
        TS_OK(kiln_session_set(s, h.in[i].name, h.in[i].data, (size_t)h.in[i].n * kiln_type_size(h.in[i].type)));
    TS_OK(kiln_session_run(s));
    int64_t n = h.out[0].n;
    float  *out = malloc((size_t)n * sizeof *out);
    ck_assert_ptr_nonnull(out);
    TS_OK(kiln_session_get(s, "out", out, (size_t)n * 4));
    const float *ref = h.out[0].data;
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(ref[i] == 0.0f && out[i] == 0.0f, "%s: y[%lld] gpu %g ref %g, want 0", label, (long long)i,
                      (double)out[i], (double)ref[i]);
    free(out);
    gpu_free(s, p, g, &h, ctx);
}
END_TEST

int main(void) {
    Suite *s = suite_create("gpu_attn");
    /* fixed cases in groups of 4 tcases so a GPU machine can run them in parallel */
    static char names[16][24];
    int         ng = (NFIXED + 3) / 4;
    for (int i = 0; i < ng && i < 16; i++) {
        snprintf(names[i], sizeof names[i], "fixed_%d", i);
        TCase *tc = ts_tcase(s, names[i], 900);
        int hi = 4 * i + 4 < NFIXED ? 4 * i + 4 : NFIXED;
        tcase_add_loop_test(tc, test_fixed, 4 * i, hi);
    }
    ts_add_rows(s, TS_ROWS(TS_CASE_EACH(900, test_random, "random_f32", "random_f16", "random_bf16"),
                           TS_CASE("all_masked", 900), TS_LOOP(0, 5, test_all_masked)));
    return ts_main_cache(s, "gpu-attn", &g_cache_dir);
}
