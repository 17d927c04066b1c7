/* Symbolic dims on the GPU: flash_attn_ext with a run-time n_kv (llama-layer decode) and n_q
 * (prefill), soft_max_ext with a run-time row length and rows. One program per graph, compiled
 * for the maxima, run at several values (1, a middle value, the maximum); each run matches the
 * CPU reference of the graph bound to those values (kiln_ctx_bind). Inputs and outputs of the
 * symbolic program live in the layout at the maximum (docs/templates.md, "Symbolic dims"): the
 * bound data is placed into it and read back from it. */
#include "tests/gpu/gpu_support.h"

#include "base/base.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#define MAXT 6

typedef struct {
    const char *name;
    kiln_type   type;
    int64_t     ne[4]; /* at the maxima */
    int         sym[4]; /* index into the case's dims + 1, 0 static */
    int         mask;   /* 1: f16 mask, some -inf; 2: i32 key intervals [2, n_tokens] over dims[0]'s keys */
} tspec;

typedef struct {
    const char *label;
    const char *kg;
    const char *dims[2];
    int64_t     values[3][2];
    tspec       in[MAXT], out[2];
    double      tol;
} gcase;

static const gcase CASES[] = {
    {"llama-layer decode attention, n_kv",
     "kiln-graph 1\ndim n_kv <= 4096\ninput q: f32[64, 1, 32]\ninput cache_k: f16[512, n_kv]\n"
     "input cache_v: f16[512, n_kv]\ninput kq_mask: f16[n_kv, 1]\n"
     "k_heads = view(cache_k, [64, 8, n_kv], [128, 1024], 0)\nv_heads = view(cache_v, [64, 8, n_kv], [128, 1024], 0)\n"
     "k = permute(k_heads, 0, 2, 1, 3)\nv = permute(v_heads, 0, 2, 1, 3)\n"
     "output y = flash_attn_ext(q, k, v, kq_mask, scale=0.125)\n",
     {"n_kv"}, {{1}, {1000}, {4096}},
     {{"q", KILN_F32, {64, 1, 32, 1}, {0}, 0}, {"cache_k", KILN_F16, {512, 4096, 1, 1}, {0, 1}, 0},
      {"cache_v", KILN_F16, {512, 4096, 1, 1}, {0, 1}, 0}, {"kq_mask", KILN_F16, {4096, 1, 1, 1}, {1}, 1}},
     {{"y", KILN_F32, {64, 32, 1, 1}, {0}, 0}}, 5e-4},
    {"bf16 decode, sinks, n_kv",
     "kiln-graph 1\ndim n_kv <= 8192\ninput q: f32[128, 1, 32]\ninput k: bf16[128, n_kv, 8]\ninput v: bf16[128, n_kv, 8]\n"
     "input m: f16[n_kv, 1]\ninput s: f32[32]\noutput y = flash_attn_ext(q, k, v, mask=m, scale=0.088, sinks=s)\n",
     {"n_kv"}, {{1}, {257}, {8192}},
     {{"q", KILN_F32, {128, 1, 32, 1}, {0}, 0}, {"k", KILN_BF16, {128, 8192, 8, 1}, {0, 1}, 0},
      {"v", KILN_BF16, {128, 8192, 8, 1}, {0, 1}, 0}, {"m", KILN_F16, {8192, 1, 1, 1}, {1}, 1},
      {"s", KILN_F32, {32, 1, 1, 1}, {0}, 0}},
     {{"y", KILN_F32, {128, 32, 1, 1}, {0}, 0}}, 5e-4},
    {"prefill attention, n_kv and n_tokens",
     "kiln-graph 1\ndim n_kv <= 1024\ndim n_tokens <= 128\ninput q: f32[64, n_tokens, 32]\ninput k: f16[64, n_kv, 8]\n"
     "input v: f16[64, n_kv, 8]\ninput m: f16[n_kv, n_tokens]\noutput y = flash_attn_ext(q, k, v, mask=m, scale=0.125)\n",
     {"n_kv", "n_tokens"}, {{1, 1}, {300, 77}, {1024, 128}},
     {{"q", KILN_F32, {64, 128, 32, 1}, {0, 2}, 0}, {"k", KILN_F16, {64, 1024, 8, 1}, {0, 1}, 0},
      {"v", KILN_F16, {64, 1024, 8, 1}, {0, 1}, 0}, {"m", KILN_F16, {1024, 128, 1, 1}, {1, 2}, 1}},
     {{"y", KILN_F32, {64, 32, 128, 1}, {0, 0, 2}, 0}}, 5e-4},
    {"f32 K/V (fma kernel), n_kv",
     "kiln-graph 1\ndim n_kv <= 4096\ninput q: f32[128, 1, 32]\ninput k: f32[128, n_kv, 8]\ninput v: f32[128, n_kv, 8]\n"
     "input m: f16[n_kv, 1]\noutput y = flash_attn_ext(q, k, v, mask=m, scale=0.088)\n",
     {"n_kv"}, {{1}, {65}, {4096}},
     {{"q", KILN_F32, {128, 1, 32, 1}, {0}, 0}, {"k", KILN_F32, {128, 4096, 8, 1}, {0, 1}, 0},
      {"v", KILN_F32, {128, 4096, 8, 1}, {0, 1}, 0}, {"m", KILN_F16, {4096, 1, 1, 1}, {1}, 1}},
     {{"y", KILN_F32, {128, 32, 1, 1}, {0}, 0}}, 5e-4},
    /* key intervals (kiln_batch's masks): the decode kernel over each row tile's hull, split
     * by the live tiles; a run of one token splits most */
    {"key intervals, Llama-3-8B heads (batch decode kernel), n_kv and n_tokens",
     "kiln-graph 1\ndim n_kv <= 8192\ndim n_tokens <= 256\ninput q: f32[128, n_tokens, 32]\ninput k: f16[128, n_kv, 8]\n"
     "input v: f16[128, n_kv, 8]\ninput m: i32[2, n_tokens]\noutput y = flash_attn_ext(q, k, v, mask=m, scale=0.088)\n",
     {"n_kv", "n_tokens"}, {{1, 1}, {700, 37}, {8192, 256}},
     {{"q", KILN_F32, {128, 256, 32, 1}, {0, 2}, 0}, {"k", KILN_F16, {128, 8192, 8, 1}, {0, 1}, 0},
      {"v", KILN_F16, {128, 8192, 8, 1}, {0, 1}, 0}, {"m", KILN_I32, {2, 256, 1, 1}, {0, 2}, 2}},
     {{"y", KILN_F32, {128, 32, 256, 1}, {0, 0, 2}, 0}}, 5e-4},
    {"key intervals, bf16 d64, sinks, few tokens (splits)",
     "kiln-graph 1\ndim n_kv <= 4096\ndim n_tokens <= 8\ninput q: f32[64, n_tokens, 8]\ninput k: bf16[64, n_kv, 1]\n"
     "input v: bf16[64, n_kv, 1]\ninput m: i32[2, n_tokens]\ninput s: f32[8]\n"
     "output y = flash_attn_ext(q, k, v, m, 0.125, 0, 0, s)\n",
     {"n_kv", "n_tokens"}, {{1, 1}, {3000, 3}, {4096, 8}},
     {{"q", KILN_F32, {64, 8, 8, 1}, {0, 2}, 0}, {"k", KILN_BF16, {64, 4096, 1, 1}, {0, 1}, 0},
      {"v", KILN_BF16, {64, 4096, 1, 1}, {0, 1}, 0}, {"m", KILN_I32, {2, 8, 1, 1}, {0, 2}, 2},
      {"s", KILN_F32, {8, 1, 1, 1}, {0}, 0}},
     {{"y", KILN_F32, {64, 8, 8, 1}, {0, 0, 2}, 0}}, 5e-4},
    {"key intervals, MLA (K 576, V 512, 16 heads over 1)",
     "kiln-graph 1\ndim n_kv <= 2048\ndim n_tokens <= 32\ninput q: f32[576, n_tokens, 16]\ninput k: f16[576, n_kv, 1]\n"
     "input v: f16[512, n_kv, 1]\ninput m: i32[2, n_tokens]\noutput y = flash_attn_ext(q, k, v, mask=m, scale=0.07)\n",
     {"n_kv", "n_tokens"}, {{1, 1}, {1500, 9}, {2048, 32}},
     {{"q", KILN_F32, {576, 32, 16, 1}, {0, 2}, 0}, {"k", KILN_F16, {576, 2048, 1, 1}, {0, 1}, 0},
      {"v", KILN_F16, {512, 2048, 1, 1}, {0, 1}, 0}, {"m", KILN_I32, {2, 32, 1, 1}, {0, 2}, 2}},
     {{"y", KILN_F32, {512, 16, 32, 1}, {0, 0, 2}, 0}}, 5e-4},
    {"key intervals, f32 K/V (fma kernel)",
     "kiln-graph 1\ndim n_kv <= 1000\ndim n_tokens <= 16\ninput q: f32[128, n_tokens, 8]\ninput k: f32[128, n_kv, 2]\n"
     "input v: f32[128, n_kv, 2]\ninput m: i32[2, n_tokens]\noutput y = flash_attn_ext(q, k, v, mask=m, scale=0.088)\n",
     {"n_kv", "n_tokens"}, {{1, 1}, {999, 5}, {1000, 16}},
     {{"q", KILN_F32, {128, 16, 8, 1}, {0, 2}, 0}, {"k", KILN_F32, {128, 1000, 2, 1}, {0, 1}, 0},
      {"v", KILN_F32, {128, 1000, 2, 1}, {0, 1}, 0}, {"m", KILN_I32, {2, 16, 1, 1}, {0, 2}, 2}},
     {{"y", KILN_F32, {128, 8, 16, 1}, {0, 0, 2}, 0}}, 5e-4},
    {"soft_max_ext, kq [n_kv, n_tokens, 32] with mask [n_kv, n_tokens]",
     "kiln-graph 1\ndim n_kv <= 4096\ndim n_tokens <= 64\ninput kq: f32[n_kv, n_tokens, 32]\ninput m: f16[n_kv, n_tokens]\n"
     "output y = soft_max_ext(kq, m, scale=0.125)\n",
     {"n_kv", "n_tokens"}, {{1, 1}, {999, 5}, {4096, 64}},
     {{"kq", KILN_F32, {4096, 64, 32, 1}, {1, 2}, 0}, {"m", KILN_F16, {4096, 64, 1, 1}, {1, 2}, 0}},
     {{"y", KILN_F32, {4096, 64, 32, 1}, {1, 2}, 0}}, 1e-6},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

static int64_t count(const int64_t ne[4]) { return ne[0] * ne[1] * ne[2] * ne[3]; }

static void bound_ne(const tspec *t, const int64_t *vals, int64_t ne[4]) {
    for (int d = 0; d < 4; d++) ne[d] = t->sym[d] ? vals[t->sym[d] - 1] : t->ne[d];
}

/* n key intervals over nkv keys, as a batch's tokens have them: consecutive tokens of a few
 * sequences, each its own stretch of keys (its first cell .. its position), some ending where
 * the next begins, an empty one, and one over every key. */
static void intervals(int32_t *iv, int64_t n, int64_t nkv, uint64_t seed) {
    int64_t nseq = n < 4 ? n : 4, span = nkv / nseq;
    for (int64_t t = 0; t < n; t++) {
        int64_t s = t % nseq, base = s * span, len = span > 0 ? 1 + (int64_t)((seed * 2654435761u + (uint64_t)t * 40503u) % (uint64_t)span) : 0;
        iv[2 * t] = (int32_t)base, iv[2 * t + 1] = (int32_t)(base + len < nkv ? base + len : nkv);
    }
    if (n > 2) iv[2] = iv[3] = (int32_t)(nkv / 2);   /* no key */
    if (n > 3) iv[6] = 0, iv[7] = (int32_t)nkv;      /* every key */
}

typedef struct {
    const gcase *c;
    const int64_t *vals;
    void *in[MAXT];
    void *ref[2];
} refdata;

static const void *get(void *user, const char *name, kiln_type type, int64_t n) {
    refdata *r = user;
    for (int i = 0; i < MAXT && r->c->in[i].name; i++)
        if (strcmp(r->c->in[i].name, name) == 0) return r->in[i];
    ck_abort_msg("no input %s", name);
    return NULL;
}

static void put(void *user, const char *name, kiln_type type, int64_t n, const void *data) {
    refdata *r = user;
    for (int i = 0; i < 2 && r->c->out[i].name; i++)
        if (strcmp(r->c->out[i].name, name) == 0) {
            r->ref[i] = malloc((size_t)n * kiln_type_size(type));
            memcpy(r->ref[i], data, (size_t)n * kiln_type_size(type));
        }
}

START_TEST(dyn_runs) {
    need_gpu();
    const gcase *c = &CASES[_i];
    int          nd = c->dims[1] ? 2 : 1;
    kiln_ctx    *ctx;
    kiln_graph  *g = ts_build(c->kg, &ctx);
    kiln_program *p = compile(g, 0);
    kiln_session *s = NULL;
    TS_OK(kiln_session_new(p, NULL, &s));
    for (int v = 0; v < 3; v++) {
        const int64_t *vals = c->values[v];
        kiln_ctx      *bc = NULL;
        TS_OK(kiln_ctx_bind(ctx, nd, c->dims, vals, &bc));
        kiln_graph *bg = NULL;
        TS_OK(kiln_graph_new(bc, &bg));
        refdata r = {.c = c, .vals = vals};
        /* Dims first: inputs and outputs are contiguous at the current values. */
        for (int d = 0; d < nd; d++) TS_OK(kiln_session_set_dim(s, c->dims[d], vals[d]));
        for (int i = 0; i < MAXT && c->in[i].name; i++) {
            const tspec *t = &c->in[i];
            int64_t      bne[4];
            bound_ne(t, vals, bne);
            int64_t n = count(bne);
            r.in[i] = malloc((size_t)n * kiln_type_size(t->type));
            fill(r.in[i], t->type, n, 1000 * (uint64_t)_i + 10 * (uint64_t)v + (uint64_t)i, FILL_ANY);
            if (t->mask == 1)
                for (int64_t e = 0; e < n; e++)
                    if (e % 7 == 3) kb_store_f32(r.in[i], t->type, e, -INFINITY);
            if (t->mask == 2) intervals(r.in[i], n / 2, vals[0], (uint64_t)(v * 31 + _i));
            TS_OK(kiln_session_set(s, t->name, r.in[i], (size_t)n * kiln_type_size(t->type)));
        }
        TS_OK(kiln_reference(bg, get, put, &r));
        TS_OK(kiln_session_run(s));
        for (int o = 0; o < 2 && c->out[o].name; o++) {
            const tspec *t = &c->out[o];
            int64_t      bne[4];
            bound_ne(t, vals, bne);
            size_t es = kiln_type_size(t->type);
            void  *got = malloc((size_t)count(bne) * es);
            TS_OK(kiln_session_get(s, t->name, got, (size_t)count(bne) * es));
            int64_t bad;
            bool    nonfinite;
            double  e = nmse(got, r.ref[o], t->type, count(bne), &bad, &nonfinite);
            fprintf(stderr, "%s at %s=%lld%s%s: nmse %.3g\n", c->label, c->dims[0], (long long)vals[0],
                    nd > 1 ? ", " : "", nd > 1 ? c->dims[1] : "", e);
            ck_assert_msg(e <= c->tol && bad < 0, "%s at value set %d: %s nmse %g (tol %g), first NaN at %lld", c->label, v,
                          t->name, e, c->tol, (long long)bad);
            free(got);
            free(r.ref[o]);
        }
        for (int i = 0; i < MAXT && c->in[i].name; i++) free(r.in[i]);
        ts_graph_free(bg, bc);
    }
    kiln_session_free(s);
    kiln_program_free(p);
    ts_graph_free(g, ctx);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_dyn_attn",
                        TS_CASE("symbolic", 300), TS_LOOP(0, NCASES, dyn_runs));
    return ts_main_cache(s, "gpu-dyn-attn", &g_cache_dir);
}
