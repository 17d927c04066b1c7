/* The token sampler (kiln_sample): llama.cpp's default chain — penalties, top-k, top-p, min-p,
 * temperature, a draw — as a CPU reference that a GPU kernel reproduces bit for bit. Hence
 * three rules here, which docs/sampling.md spells out for the kernel:
 *  - every float value comes from single IEEE-754 binary32 operations (round to nearest even)
 *    in the order written, with no fused multiply-add and no library call whose last bit may
 *    differ between libm and CUDA: exp is km_sampler_exp, a fixed polynomial;
 *  - the candidates have one total order (logit descending, id ascending), and every sum and
 *    walk goes through them sequentially in that order;
 *  - the random number is a pure function of (seed, position): Philox4x32-10, no state. */
#include "model/sampler.h"

#include "base/base.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* The float order is part of the contract: no excess precision, no contraction into FMAs
 * (GCC contracts nothing under -std=c11; clang would, within an expression, without this). */
#if FLT_EVAL_METHOD != 0
#error "the sampler needs FLT_EVAL_METHOD 0 (float math in float)"
#endif
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- the random number ----------------------------------------------------------------------- */

/* Philox4x32's multipliers and Weyl key increments (Salmon et al., SC'11; Random123). */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static void philox_round(uint32_t c[4], const uint32_t k[2]) {
    uint64_t p0 = (uint64_t)PHILOX_M0 * c[0], p1 = (uint64_t)PHILOX_M1 * c[2];
    uint32_t x0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k[0];
    uint32_t x2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k[1];
    c[0] = x0, c[1] = (uint32_t)p1, c[2] = x2, c[3] = (uint32_t)p0;
}

void km_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]}, k[2] = {key[0], key[1]};
    for (int r = 0; r < 10; r++) {
        if (r > 0) k[0] += PHILOX_W0, k[1] += PHILOX_W1; /* the key bumps between rounds */
        philox_round(c, k);
    }
    memcpy(out, c, sizeof c);
}

float km_sampler_uniform(uint64_t seed, int64_t position) {
    uint64_t pos = (uint64_t)position;
    uint32_t ctr[4] = {(uint32_t)pos, (uint32_t)(pos >> 32), 0, 0};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t x[4];
    km_philox4x32_10(ctr, key, x);
    /* 24 bits: every value k * 2^-24 is a float, so the conversion is exact and u < 1. */
    return (float)(x[0] >> 8) * 0x1p-24f;
}

/* ---- exp ------------------------------------------------------------------------------------ */

/* Cody and Waite's reduction x = n ln2 + r, |r| <= ln2/2, ln2 split in two (C1 has 9 bits, so
 * n * C1 is exact), then Cephes' degree-6 polynomial for e^r, then the scale 2^n built from
 * its bits. Below -86 the result would be under 2^-124, near the subnormals that a GPU may
 * flush: 0 instead, a relative weight under 1e-37 that no draw can pick. */
/* Cephes' decimal constants rounded to float, written exactly. */
#define EXP_LOG2E 0x1.715476p+0f   /* 1.44269504 */
#define EXP_C1    0x1.63p-1f       /* 0.693359375 */
#define EXP_C2    -0x1.bd0106p-13f /* -2.12194440e-4 */
#define EXP_P0    0x1.a0d2cep-13f  /* 1.9875691500e-4 */
#define EXP_P1    0x1.6e879cp-10f  /* 1.3981999507e-3 */
#define EXP_P2    0x1.11121p-7f    /* 8.3334519073e-3 */
#define EXP_P3    0x1.555382p-5f   /* 4.1665795894e-2 */
#define EXP_P4    0x1.555554p-3f   /* 1.6666665459e-1 */
#define EXP_P5    0x1p-1f          /* 5.0000001201e-1 rounds to 0.5 */
#define EXP_MIN   -86.0f

float km_sampler_exp(float x) {
    if (!(x >= EXP_MIN)) return 0.0f; /* -inf, NaN too */
    if (x > 0.0f) x = 0.0f;           /* outside the domain: the sampler passes x <= 0 */
    float t = x * EXP_LOG2E;
    float n = rintf(t);               /* round half to even, in [-124, 0] */
    float a = n * EXP_C1;
    float r = x - a;
    float b = n * EXP_C2;
    r = r - b;
    float z = r * r;
    float y = EXP_P0 * r;
    y = y + EXP_P1;
    y = y * r;
    y = y + EXP_P2;
    y = y * r;
    y = y + EXP_P3;
    y = y * r;
    y = y + EXP_P4;
    y = y * r;
    y = y + EXP_P5;
    y = y * z;
    y = y + r;
    y = y + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float    scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

/* ---- parameters ----------------------------------------------------------------------------- */

kiln_sampler_params kiln_sampler_params_default(void) {
    return (kiln_sampler_params){.seed = KILN_SAMPLER_DEFAULT_SEED, .temp = 0.8f, .top_k = 40,
                                 .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.0f,
                                 .repeat_last_n = 64, .presence_penalty = 0.0f,
                                 .frequency_penalty = 0.0f};
}

static bool in_unit(float v) { return v >= 0.0f && v <= 1.0f; } /* false for NaN */

kiln_status kiln_sampler_check(const kiln_sampler_params *p) {
    if (!p) return kb_error(KILN_ERR_INVALID, "kiln_sampler_check: NULL parameters");
    if (!isfinite(p->temp))
        return kb_error(KILN_ERR_INVALID, "--temp %g: must be a finite number (0 or less: greedy)",
                        (double)p->temp);
    if (!in_unit(p->top_p))
        return kb_error(KILN_ERR_INVALID, "--top-p %g: must be in [0, 1] (1: off)", (double)p->top_p);
    if (!in_unit(p->min_p))
        return kb_error(KILN_ERR_INVALID, "--min-p %g: must be in [0, 1] (0: off)", (double)p->min_p);
    if (!(isfinite(p->repeat_penalty) && p->repeat_penalty > 0.0f))
        return kb_error(KILN_ERR_INVALID, "--repeat-penalty %g: must be a finite number > 0 (1: off)",
                        (double)p->repeat_penalty);
    if (p->repeat_last_n < -1)
        return kb_error(KILN_ERR_INVALID, "--repeat-last-n %d: must be -1 (the whole history), 0 (off) or more",
                        (int)p->repeat_last_n);
    if (!isfinite(p->presence_penalty))
        return kb_error(KILN_ERR_INVALID, "--presence-penalty %g: must be a finite number (0: off)",
                        (double)p->presence_penalty);
    if (!isfinite(p->frequency_penalty))
        return kb_error(KILN_ERR_INVALID, "--frequency-penalty %g: must be a finite number (0: off)",
                        (double)p->frequency_penalty);
    return NULL; /* top_k: every value means something (<= 0: all); seed: every value is a key */
}

/* ---- penalties ------------------------------------------------------------------------------ */

/* Tokens in the window, as llama.cpp's penalties sampler skips its work. */
bool kiln_sampler_penalized(const kiln_sampler_params *p) {
    return p->repeat_last_n != 0 &&
           (p->repeat_penalty != 1.0f || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f);
}

static int64_t penalty_window(const kiln_sampler_params *p, int64_t n_history) {
    if (!kiln_sampler_penalized(p)) return 0;
    return p->repeat_last_n < 0 || p->repeat_last_n > n_history ? n_history : p->repeat_last_n;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* llama.cpp's rule (the CTRL paper's division, with its fix for negative logits: those are
 * multiplied, so a penalty always lowers), then count * frequency + presence subtracted. */
static float penalize_one(const kiln_sampler_params *p, float l, int32_t count) {
    l = l <= 0.0f ? l * p->repeat_penalty : l / p->repeat_penalty;
    float sub = (float)count * p->frequency_penalty;
    sub = sub + p->presence_penalty;
    return l - sub;
}

kiln_status km_sampler_penalize(const kiln_sampler_params *p, float *logits, int64_t n,
                                const int32_t *history, int64_t n_history) {
    int64_t w = penalty_window(p, n_history);
    if (w == 0) return NULL;
    /* The window sorted: each distinct id is a run whose length is its count (no n_vocab-sized
     * table for a window of 64). */
    int32_t *ids = malloc((size_t)w * sizeof *ids);
    if (!ids) return kb_oom();
    memcpy(ids, history + (n_history - w), (size_t)w * sizeof *ids);
    qsort(ids, (size_t)w, sizeof *ids, cmp_i32);
    for (int64_t i = 0, j; i < w; i = j) {
        for (j = i + 1; j < w && ids[j] == ids[i]; j++) {}
        if (ids[i] >= 0 && ids[i] < n) logits[ids[i]] = penalize_one(p, logits[ids[i]], (int32_t)(j - i));
    }
    free(ids);
    return NULL;
}

/* ---- top-k ---------------------------------------------------------------------------------- */

/* The draw order: a comes before b. -0 and +0 are equal (then the id decides). */
static bool before(km_cand a, km_cand b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

static int cmp_cand(const void *pa, const void *pb) {
    km_cand a = *(const km_cand *)pa, b = *(const km_cand *)pb;
    return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

/* A candidate as a 64-bit key whose unsigned order is the draw order: the logit's bits made
 * monotonic (and -0 read as +0, which compares equal to it) and inverted, then the id. */
static uint64_t cand_key(km_cand c) {
    float    l = c.logit == 0.0f ? 0.0f : c.logit;
    uint32_t b;
    memcpy(&b, &l, sizeof b);
    b = (b & 0x80000000u) ? ~b : b | 0x80000000u;
    return (uint64_t)~b << 32 | (uint32_t)c.id;
}

static km_cand key_cand(uint64_t k) {
    uint32_t b = ~(uint32_t)(k >> 32);
    b = (b & 0x80000000u) ? b & 0x7fffffffu : ~b;
    km_cand c = {0, (int32_t)(uint32_t)k};
    memcpy(&c.logit, &b, sizeof b);
    return c;
}

/* Sorts c[0..n) into the draw order. Past a few thousand, an LSD radix sort of the keys, a
 * byte a pass, skipping the bytes all keys share (the ids' high bits): for a 150k vocabulary with
 * top-k off, kiln_sample takes 5-7 ms instead of 30 with qsort. */
static kiln_status sort_cands(km_cand *c, int64_t n) {
    if (n <= 4096) {
        qsort(c, (size_t)n, sizeof *c, cmp_cand);
        return NULL;
    }
    uint64_t *key = malloc((size_t)n * 2 * sizeof *key);
    if (!key) return kb_oom();
    uint64_t *tmp = key + n;
    int64_t count[8][256] = {{0}};
    for (int64_t i = 0; i < n; i++) {
        key[i] = cand_key(c[i]);
        for (int d = 0; d < 8; d++) count[d][(key[i] >> (8 * d)) & 0xff]++;
    }
    for (int d = 0; d < 8; d++) {
        if (count[d][(key[0] >> (8 * d)) & 0xff] == n) continue; /* one value: order unchanged */
        int64_t pos[256], at = 0;
        for (int v = 0; v < 256; v++) pos[v] = at, at += count[d][v];
        for (int64_t i = 0; i < n; i++) tmp[pos[(key[i] >> (8 * d)) & 0xff]++] = key[i];
        uint64_t *t = key;
        key = tmp, tmp = t;
    }
    for (int64_t i = 0; i < n; i++) c[i] = key_cand(key[i]);
    free(key < tmp ? key : tmp);
    return NULL;
}

/* h is a heap whose root is the last, in the draw order, of what it holds. */
static void heap_down(km_cand *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, last = i;
        if (l < n && before(h[last], h[l])) last = l;
        if (r < n && before(h[last], h[r])) last = r;
        if (last == i) return;
        km_cand t = h[i];
        h[i] = h[last], h[last] = t, i = last;
    }
}

static void heap_up(km_cand *h, int64_t i) {
    while (i > 0 && before(h[(i - 1) / 2], h[i])) {
        km_cand t = h[i];
        h[i] = h[(i - 1) / 2], h[(i - 1) / 2] = t, i = (i - 1) / 2;
    }
}

static bool valid(float l) { return l > -INFINITY; } /* NaN and -inf are never candidates */

/* The first k in the draw order, sorted, into c (capacity k): *n_kept of them, of *n_valid
 * candidates. k < n: one pass keeping the best k in a heap (for most of a 150k vocabulary one
 * compare with the root), then a sort of those; k == n: every candidate sorted. */
static kiln_status top_k(const float *logits, int64_t n, int64_t k, km_cand *c, int64_t *n_valid,
                         int64_t *n_kept) {
    int64_t m = 0, nv = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!valid(logits[i])) continue;
        km_cand x = {logits[i], (int32_t)i};
        nv++;
        if (k == n) {
            c[m++] = x;
        } else if (m < k) {
            c[m] = x;
            heap_up(c, m++);
        } else if (before(x, c[0])) {
            c[0] = x;
            heap_down(c, m, 0);
        }
    }
    *n_valid = nv, *n_kept = m;
    return sort_cands(c, m);
}

/* ---- top-p, min-p, temperature -------------------------------------------------------------- */

static float sum_seq(const float *w, int64_t n) {
    float s = 0.0f;
    for (int64_t j = 0; j < n; j++) s = s + w[j];
    return s;
}

/* exp((l - max) / temp); the max itself (and its ties) exactly 1, which also keeps an
 * infinite max from making inf - inf. */
static float weight(float l, float max, float temp) {
    return l == max ? 1.0f : km_sampler_exp((l - max) / temp);
}

/* llama.cpp's top-p: the softmax of the top-k candidates, and the shortest prefix whose
 * probabilities, added in order, reach p (all of them when rounding never gets there). */
static int64_t top_p(const float *e, int64_t n, float p) {
    if (p >= 1.0f) return n;
    float z = sum_seq(e, n), cum = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        cum = cum + e[j] / z;
        if (cum >= p) return j + 1;
    }
    return n;
}

/* llama.cpp's min-p: the prefix of candidates whose probability is at least p times the
 * largest's (e[j] is that ratio); the first always stays. */
static int64_t min_p(const float *e, int64_t n, float p) {
    if (p <= 0.0f) return n;
    int64_t j = 1;
    while (j < n && e[j] >= p) j++;
    return n < j ? n : j;
}

kiln_status km_sampler_filter(const kiln_sampler_params *p, const float *logits, int64_t n,
                              km_cands *out) {
    memset(out, 0, sizeof *out);
    int64_t k = p->top_k <= 0 || p->top_k >= n ? n : p->top_k;
    out->c = malloc((size_t)k * sizeof *out->c);
    out->w = malloc((size_t)k * sizeof *out->w);
    if (!out->c || !out->w) return kb_oom();
    int64_t     nk;
    kiln_status st = top_k(logits, n, k, out->c, &out->n_valid, &nk);
    out->n_top_k = nk;
    if (st || nk == 0) return st;
    float max = out->c[0].logit;
    /* Top-p and min-p see the probabilities at temperature 1, as in llama.cpp, where the
     * temperature comes after them. */
    for (int64_t j = 0; j < nk; j++) out->w[j] = weight(out->c[j].logit, max, 1.0f);
    out->n_top_p = top_p(out->w, nk, p->top_p);
    out->n = min_p(out->w, out->n_top_p, p->min_p);
    for (int64_t j = 0; j < out->n; j++) out->w[j] = weight(out->c[j].logit, max, p->temp);
    out->sum = sum_seq(out->w, out->n);
    return NULL;
}

void km_cands_free(km_cands *c) {
    free(c->c);
    free(c->w);
    memset(c, 0, sizeof *c);
}

int64_t km_sampler_pick(const km_cands *c, float u) {
    /* The running sum ends at c->sum exactly (the same additions in the same order), and
     * u * sum <= sum for u < 1, so the walk always stops; the fallback is for u out of range. */
    float target = u * c->sum, cum = 0.0f;
    for (int64_t j = 0; j < c->n; j++) {
        cum = cum + c->w[j];
        if (cum >= target) return j;
    }
    return c->n - 1;
}

/* ---- the chain ------------------------------------------------------------------------------ */

static kiln_status check_args(const kiln_sampler_params *p, const float *logits, int64_t n_vocab,
                              const int32_t *history, int64_t n_history, int64_t position,
                              const int32_t *out) {
    if (!p || !logits || !out || (n_history > 0 && !history))
        return kb_error(KILN_ERR_INVALID, "kiln_sample: NULL argument");
    if (n_vocab < 1 || n_vocab > INT32_MAX)
        return kb_error(KILN_ERR_INVALID, "kiln_sample: n_vocab %lld: must be in [1, 2^31)", (long long)n_vocab);
    if (n_history < 0)
        return kb_error(KILN_ERR_INVALID, "kiln_sample: n_history %lld: must be >= 0", (long long)n_history);
    if (position < 0)
        return kb_error(KILN_ERR_INVALID, "kiln_sample: position %lld: must be >= 0", (long long)position);
    for (int64_t i = 0; i < n_history; i++)
        if (history[i] < 0 || history[i] >= n_vocab)
            return kb_error(KILN_ERR_INVALID, "kiln_sample: history[%lld] = %d is not a token id (n_vocab %lld)",
                            (long long)i, (int)history[i], (long long)n_vocab);
    return kiln_sampler_check(p);
}

/* temp > 0: the filters and the draw. A row without a candidate (every logit NaN or -inf)
 * falls back to the argmax's answer. */
static kiln_status draw(const kiln_sampler_params *p, const float *l, int64_t n, int64_t position,
                        int32_t *out) {
    km_cands    c;
    kiln_status st = km_sampler_filter(p, l, n, &c);
    if (!st) {
        int64_t j = c.n > 0 ? km_sampler_pick(&c, km_sampler_uniform(p->seed, position)) : -1;
        *out = j >= 0 ? c.c[j].id : (int32_t)kiln_argmax_f32(l, n);
    }
    km_cands_free(&c);
    return st;
}

kiln_status kiln_sample(const kiln_sampler_params *p, const float *logits, int64_t n_vocab,
                        const int32_t *history, int64_t n_history, int64_t position, int32_t *out) {
    kiln_status st = check_args(p, logits, n_vocab, history, n_history, position, out);
    if (st) return st;
    const float *l = logits;
    float       *pen = NULL;
    if (penalty_window(p, n_history) > 0) { /* the caller's logits stay as they are */
        pen = malloc((size_t)n_vocab * sizeof *pen);
        if (!pen) return kb_oom();
        memcpy(pen, logits, (size_t)n_vocab * sizeof *pen);
        st = km_sampler_penalize(p, pen, n_vocab, history, n_history);
        l = pen;
    }
    if (!st && p->temp <= 0.0f) /* greedy: llama.cpp's temperature 0 keeps the largest logit */
        *out = (int32_t)kiln_argmax_f32(l, n_vocab);
    else if (!st)
        st = draw(p, l, n_vocab, position, out);
    free(pen);
    return st;
}

/* ---- on the GPU ------------------------------------------------------------------------------ */

bool kiln_sampler_on_gpu(const kiln_sampler_params *p, int64_t n_vocab) {
    if (!p || kiln_sampler_penalized(p) || !(p->temp > 0.0f) || n_vocab < 1) return false;
    kiln_status bad = kiln_sampler_check(p); /* parameters out of range: the host says why */
    if (bad) {
        kiln_status_free(bad);
        return false;
    }
    /* The candidates the kernels keep: stage 4's K (docs/sampling.md). */
    int64_t k = p->top_k <= 0 || p->top_k >= n_vocab ? n_vocab : p->top_k;
    return k <= KILN_SAMPLE_GPU_MAX_K;
}
