/* deepseek2 (DeepSeek-V2, MLA) against a forward pass written here from the model's definition:
 * attention without absorption (each head's K and V decompressed from the cached latent through
 * attn_k_b and attn_v_b, as HF's modeling_deepseek computes them), YaRN on the last n_rot values
 * of each Q head and of the shared key, the scale (1 + 0.1 m ln factor)^2 / sqrt(head_dim), the
 * first layers dense, then routed experts (softmax or sigmoid, the selection bias, groups
 * scored by their two best, renormalized and scaled weights) plus the shared ones. kiln's graph
 * (the absorbed path llama.cpp builds, f16 cache) must give the same logits, so the absorption,
 * the views into q and the latent, and the routing are pinned by an independent computation. */
#include "tests/support.h"

#include "base/base.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NTOK 6
static const int32_t tokens[NTOK] = {3, 700, 41, 9, 1000, 256};

typedef struct {
    const kiln_model         *m;
    const kiln_model_hparams *hp;
} naive;

/* Weight `name` of layer il (-1: global), f32 with n elements. */
static const float *wt(const naive *n, int il, const char *name, int64_t count) {
    char full[128];
    if (il >= 0) snprintf(full, sizeof full, "blk.%d.%s", il, name);
    else snprintf(full, sizeof full, "%s", name);
    const float *w = kiln_model_weight(n->m, full, KILN_F32, count);
    ck_assert_msg(w != NULL, "weight %s (f32, %lld values) missing", full, (long long)count);
    return w;
}

/* y = W x for a GGUF matrix {in, out}: out rows of in values. */
static void matvec(const float *w, const float *x, float *y, int64_t in, int64_t out) {
    for (int64_t o = 0; o < out; o++) {
        double s = 0;
        for (int64_t i = 0; i < in; i++) s += (double)w[o * in + i] * x[i];
        y[o] = (float)s;
    }
}

static void rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    float r = 1.0f / sqrtf((float)(s / (double)n) + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

static float silu(float v) { return v / (1.0f + expf(-v)); }

/* HF's DeepseekV2YarnRotaryEmbedding on adjacent pairs (llama.cpp keeps the weights unpermuted):
 * inverse frequencies mixed between interpolated (/ factor) and extrapolated by a linear ramp
 * over the correction range; magnitude mscale / mscale_all_dim = 1. */
static void rope(const kiln_model_hparams *hp, float *x, int64_t nd, int pos) {
    const double pi = 3.14159265358979323846;
    double       base = hp->rope_freq_base, f = hp->rope_factor, orig = (double)hp->rope_orig_ctx;
    double       lo = floor(nd * log(orig / (32.0 * 2 * pi)) / (2 * log(base)));
    double       hi = ceil(nd * log(orig / (1.0 * 2 * pi)) / (2 * log(base)));
    if (lo < 0) lo = 0;
    if (hi > nd - 1) hi = (double)(nd - 1);
    if (hi == lo) hi += 0.001;
    for (int64_t i = 0; i < nd / 2; i++) {
        double extra = pow(base, -2.0 * (double)i / (double)nd), inter = extra / f;
        double ramp = ((double)i - lo) / (hi - lo);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        double mask = 1 - ramp; /* 1: extrapolate (high frequencies) */
        double th = pos * (inter * (1 - mask) + extra * mask);
        float  c = (float)cos(th), s = (float)sin(th), a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = a * c - b * s;
        x[2 * i + 1] = a * s + b * c;
    }
}

/* The routed experts' weights for f: the top n_expert_used by probs (+ bias), limited to the
 * best groups (a group's score: the sum of its two best), weights the unbiased probs. */
static void route(const naive *n, int il, const float *f, int *sel, float *w) {
    const kiln_model_hparams *hp = n->hp;
    int64_t E = hp->n_expert, k = hp->n_expert_used, D = hp->n_embd;
    float  *p = malloc(sizeof *p * (size_t)E), *s = malloc(sizeof *s * (size_t)E);
    matvec(wt(n, il, "ffn_gate_inp.weight", D * E), f, p, D, E);
    if (hp->expert_gating == KILN_GATING_SIGMOID) {
        for (int64_t e = 0; e < E; e++) p[e] = 1.0f / (1.0f + expf(-p[e]));
    } else {
        float mx = p[0], sum = 0;
        for (int64_t e = 1; e < E; e++) mx = p[e] > mx ? p[e] : mx;
        for (int64_t e = 0; e < E; e++) sum += p[e] = expf(p[e] - mx);
        for (int64_t e = 0; e < E; e++) p[e] /= sum;
    }
    const float *bias = hp->expert_probs_bias ? wt(n, il, "exp_probs_b.bias", E) : NULL;
    for (int64_t e = 0; e < E; e++) s[e] = p[e] + (bias ? bias[e] : 0.0f);
    if (hp->n_expert_groups > 1) {
        int64_t G = hp->n_expert_groups, per = E / G;
        float   score[64];
        bool    keep[64] = {0};
        for (int64_t g = 0; g < G; g++) {
            float a = -INFINITY, b = -INFINITY;
            for (int64_t e = g * per; e < (g + 1) * per; e++) {
                if (s[e] > a) b = a, a = s[e];
                else if (s[e] > b) b = s[e];
            }
            score[g] = a + b;
        }
        for (int64_t u = 0; u < hp->n_group_used; u++) {
            int64_t best = -1;
            for (int64_t g = 0; g < G; g++)
                if (!keep[g] && (best < 0 || score[g] > score[best])) best = g;
            keep[best] = true;
        }
        for (int64_t e = 0; e < E; e++)
            if (!keep[e / per]) s[e] = -INFINITY;
    }
    float sum = 0;
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++) {
            bool used = false;
            for (int64_t q = 0; q < j; q++) used |= sel[q] == e;
            if (!used && (best < 0 || s[e] > s[best])) best = e;
        }
        sel[j] = (int)best;
        sum += w[j] = p[best];
    }
    for (int64_t j = 0; j < k; j++) {
        if (hp->norm_topk_prob) w[j] /= sum > 6.103515625e-5f ? sum : 6.103515625e-5f;
        if (hp->expert_weights_scale != 0.0f) w[j] *= hp->expert_weights_scale;
    }
    free(p);
    free(s);
}

/* A SwiGLU FFN of width ff from (gate, up, down) matrices, added into y. */
static void swiglu_add(const float *g, const float *u, const float *d, const float *f, int64_t D, int64_t ff,
                       float scale, float *y) {
    float *a = malloc(sizeof *a * (size_t)ff), *b = malloc(sizeof *b * (size_t)ff), *o = malloc(sizeof *o * (size_t)D);
    matvec(g, f, a, D, ff);
    matvec(u, f, b, D, ff);
    for (int64_t i = 0; i < ff; i++) a[i] = silu(a[i]) * b[i];
    matvec(d, a, o, ff, D);
    for (int64_t i = 0; i < D; i++) y[i] += scale * o[i];
    free(a);
    free(b);
    free(o);
}

/* Logits of the last of NTOK tokens, token by token with a latent cache. */
static void forward(const naive *n, float *logits) {
    const kiln_model_hparams *hp = n->hp;
    int64_t D = hp->n_embd, L = hp->n_layer, H = hp->n_head, hd = hp->head_dim, rot = hp->n_rot, nope = hd - rot;
    int64_t lora = hp->kv_lora_rank, dv = hp->head_dim_v, V = hp->n_vocab, ql = hp->q_lora_rank, qdim = H * hd;
    float   ms = 1.0f + 0.1f * hp->rope_yarn_log_mul * logf(hp->rope_factor);
    float   scale = ms * ms / sqrtf((float)hd), eps = hp->rms_norm_eps;
    float  *lat = calloc((size_t)(L * NTOK * lora), sizeof *lat), *kpe = calloc((size_t)(L * NTOK * rot), sizeof *kpe);
    float  *x = malloc(sizeof *x * (size_t)D), *h = malloc(sizeof *h * (size_t)D), *q = malloc(sizeof *q * (size_t)qdim);
    float  *kv = malloc(sizeof *kv * (size_t)(lora + rot)), *att = calloc((size_t)(H * dv), sizeof *att);
    float  *qa = malloc(sizeof *qa * (size_t)(ql > 0 ? ql : 1)), *qan = malloc(sizeof *qan * (size_t)(ql > 0 ? ql : 1));
    float  *kn = malloc(sizeof *kn * (size_t)(NTOK * nope)), *vh = malloc(sizeof *vh * (size_t)(NTOK * dv));
    float  *sc = malloc(sizeof *sc * NTOK), *o = malloc(sizeof *o * (size_t)D), *y = malloc(sizeof *y * (size_t)D);
    const float *emb = wt(n, -1, "token_embd.weight", D * V);
    for (int t = 0; t < NTOK; t++) {
        memcpy(x, emb + (int64_t)tokens[t] * D, sizeof *x * (size_t)D);
        for (int il = 0; il < (int)L; il++) {
            rmsnorm(x, wt(n, il, "attn_norm.weight", D), h, D, eps);
            if (ql > 0) {
                matvec(wt(n, il, "attn_q_a.weight", D * ql), h, qa, D, ql);
                rmsnorm(qa, wt(n, il, "attn_q_a_norm.weight", ql), qan, ql, eps);
                matvec(wt(n, il, "attn_q_b.weight", ql * qdim), qan, q, ql, qdim);
            } else {
                matvec(wt(n, il, "attn_q.weight", D * qdim), h, q, D, qdim);
            }
            matvec(wt(n, il, "attn_kv_a_mqa.weight", D * (lora + rot)), h, kv, D, lora + rot);
            float *cl = lat + ((int64_t)il * NTOK + t) * lora, *cp = kpe + ((int64_t)il * NTOK + t) * rot;
            rmsnorm(kv, wt(n, il, "attn_kv_a_norm.weight", lora), cl, lora, eps);
            memcpy(cp, kv + lora, sizeof *cp * (size_t)rot);
            rope(hp, cp, rot, t);
            const float *kb = wt(n, il, "attn_k_b.weight", nope * lora * H), *vb = wt(n, il, "attn_v_b.weight", lora * dv * H);
            for (int64_t hh = 0; hh < H; hh++) {
                float *qh = q + hh * hd;
                rope(hp, qh + nope, rot, t);
                /* K and V of head hh decompressed from each cached latent (no absorption) */
                for (int s = 0; s <= t; s++) {
                    const float *c = lat + ((int64_t)il * NTOK + s) * lora;
                    for (int64_t d = 0; d < nope; d++) {
                        double a = 0;
                        for (int64_t j = 0; j < lora; j++) a += (double)kb[d + nope * (j + lora * hh)] * c[j];
                        kn[s * nope + d] = (float)a;
                    }
                    for (int64_t e = 0; e < dv; e++) {
                        double a = 0;
                        for (int64_t j = 0; j < lora; j++) a += (double)vb[j + lora * (e + dv * hh)] * c[j];
                        vh[s * dv + e] = (float)a;
                    }
                    double dot = 0;
                    for (int64_t d = 0; d < nope; d++) dot += (double)qh[d] * kn[s * nope + d];
                    const float *ps = kpe + ((int64_t)il * NTOK + s) * rot;
                    for (int64_t d = 0; d < rot; d++) dot += (double)qh[nope + d] * ps[d];
                    sc[s] = (float)dot * scale;
                }
                float mx = sc[0], sum = 0;
                for (int s = 1; s <= t; s++) mx = sc[s] > mx ? sc[s] : mx;
                for (int s = 0; s <= t; s++) sum += sc[s] = expf(sc[s] - mx);
                for (int64_t e = 0; e < dv; e++) {
                    double a = 0;
                    for (int s = 0; s <= t; s++) a += (double)sc[s] / sum * vh[s * dv + e];
                    att[hh * dv + e] = (float)a;
                }
            }
            matvec(wt(n, il, "attn_output.weight", H * dv * D), att, o, H * dv, D);
            for (int64_t i = 0; i < D; i++) x[i] += o[i];
            rmsnorm(x, wt(n, il, "ffn_norm.weight", D), h, D, eps);
            memset(y, 0, sizeof *y * (size_t)D);
            if (il < hp->n_layer_dense_lead) {
                int64_t ff = hp->n_ff;
                swiglu_add(wt(n, il, "ffn_gate.weight", D * ff), wt(n, il, "ffn_up.weight", D * ff),
                           wt(n, il, "ffn_down.weight", ff * D), h, D, ff, 1.0f, y);
            } else {
                int64_t fe = hp->n_ff_exp, E = hp->n_expert, fs = fe * hp->n_expert_shared;
                int     sel[16];
                float   w[16];
                route(n, il, h, sel, w);
                const float *g = wt(n, il, "ffn_gate_exps.weight", D * fe * E), *u = wt(n, il, "ffn_up_exps.weight", D * fe * E);
                const float *dn = wt(n, il, "ffn_down_exps.weight", fe * D * E);
                for (int64_t j = 0; j < hp->n_expert_used; j++)
                    swiglu_add(g + sel[j] * D * fe, u + sel[j] * D * fe, dn + sel[j] * fe * D, h, D, fe, w[j], y);
                swiglu_add(wt(n, il, "ffn_gate_shexp.weight", D * fs), wt(n, il, "ffn_up_shexp.weight", D * fs),
                           wt(n, il, "ffn_down_shexp.weight", fs * D), h, D, fs, 1.0f, y);
            }
            for (int64_t i = 0; i < D; i++) x[i] += y[i];
        }
    }
    rmsnorm(x, wt(n, -1, "output_norm.weight", D), h, D, eps);
    matvec(wt(n, -1, "output.weight", D * V), h, logits, D, V);
    free(lat), free(kpe), free(x), free(h), free(q), free(kv), free(att), free(qa), free(qan);
    free(kn), free(vh), free(sc), free(o), free(y);
}

static const char *const presets[] = {"tiny", "tiny-v3"};
static char             *g_dir;

START_TEST(graph_matches_naive_forward) {
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset("deepseek2", presets[_i], &hp));
    hp.ftype = KILN_FTYPE_ALL_F32; /* exact weights on both sides */
    char path[512];
    snprintf(path, sizeof path, "%s/ds-%s.gguf", g_dir, presets[_i]);
    TS_OK(kiln_model_write_random(&hp, 17, path, NULL, NULL));
    kiln_model *m;
    TS_OK(kiln_model_open(path, &m));
    naive n = {m, kiln_model_get_hparams(m)};
    float *want = malloc(sizeof *want * (size_t)hp.n_vocab);
    forward(&n, want);
    kiln_gen_opts o = {.n_ctx = 32, .cpu = true};
    kiln_gen     *g;
    TS_OK(kiln_gen_new(m, &o, &g));
    const float *got;
    TS_OK(kiln_gen_eval(g, tokens, NTOK, &got));
    double num = 0, den = 0;
    int    am = 0, bm = 0;
    for (int64_t v = 0; v < hp.n_vocab; v++) {
        num += ((double)got[v] - want[v]) * ((double)got[v] - want[v]);
        den += (double)want[v] * want[v];
        if (got[v] > got[am]) am = (int)v;
        if (want[v] > want[bm]) bm = (int)v;
    }
    /* kiln caches K/V in f16 (llama.cpp's default); the rest is f32 on both sides */
    printf("deepseek2 %s: logits NMSE %.3g against the naive forward pass (argmax %d, %d)\n", presets[_i],
           num / den, am, bm);
    ck_assert_msg(num / den < 1e-5, "%s: logits NMSE %g", presets[_i], num / den);
    ck_assert_int_eq(am, bm);
    kiln_gen_free(g);
    kiln_model_close(m);
    free(want);
}
END_TEST

/* The group limit matters in tiny-v3: without it the same file picks other experts (else the
 * test above could not tell a missing limit). */
START_TEST(group_limit_changes_choice) {
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset("deepseek2", "tiny-v3", &hp));
    hp.ftype = KILN_FTYPE_ALL_F32;
    char path[512];
    snprintf(path, sizeof path, "%s/ds-g.gguf", g_dir);
    TS_OK(kiln_model_write_random(&hp, 17, path, NULL, NULL));
    kiln_model *m;
    TS_OK(kiln_model_open(path, &m));
    kiln_model_hparams free_hp = *kiln_model_get_hparams(m);
    naive              a = {m, kiln_model_get_hparams(m)}, b = {m, &free_hp};
    free_hp.n_expert_groups = 0;
    float *la = malloc(sizeof *la * (size_t)hp.n_vocab), *lb = malloc(sizeof *lb * (size_t)hp.n_vocab);
    forward(&a, la);
    forward(&b, lb);
    double d = 0;
    for (int64_t v = 0; v < hp.n_vocab; v++) d += fabs((double)la[v] - lb[v]);
    ck_assert_msg(d > 1e-3, "the group limit changed the logits by only %g", d);
    kiln_model_close(m);
    free(la);
    free(lb);
}
END_TEST

static void setup(void) { g_dir = ts_tmpdir(); }
static void teardown(void) { ts_tmpdir_free(g_dir); }

int main(void) {
    Suite *s = TS_SUITE("deepseek2", TS_CASE_FIXTURE("deepseek2", 120, setup, teardown),
                        TS_LOOP(0, 2, graph_matches_naive_forward), TS_TESTS(group_limit_changes_choice));
    return ts_main_isolated(s, "deepseek2");
}
