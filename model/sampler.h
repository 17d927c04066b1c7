/* model: the token sampler's stages (sampler.c), exposed for the tests and for the GPU kernel
 * that must reproduce them bit for bit. Prefix km_. docs/sampling.md specifies every step. */
#ifndef KILN_MODEL_SAMPLER_H
#define KILN_MODEL_SAMPLER_H

#include "kiln.h"

#include <stdint.h>

/* Random123's Philox4x32 with 10 rounds: out = philox(ctr, key). */
void  km_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* The draw's uniform number in [0, 1): word 0 of philox((position lo, position hi, 0, 0),
 * (seed lo, seed hi)), its top 24 bits times 2^-24 (exact). */
float km_sampler_uniform(uint64_t seed, int64_t position);
/* exp(x) for x <= 0 by a fixed sequence of IEEE float operations (no library call, no fused
 * multiply-add), so that the GPU computes the same bits: 0 below -86 (no subnormal result),
 * within 2 ulp of exp elsewhere, exactly 1 at 0. */
float km_sampler_exp(float x);

/* Applies the penalties to logits[0..n) in place (the tokens of the window only). history's
 * ids must be in [0, n) (kiln_sample checks them). NOMEM is the only error. */
kiln_status km_sampler_penalize(const kiln_sampler_params *p, float *logits, int64_t n,
                                const int32_t *history, int64_t n_history);

typedef struct {
    float   logit; /* after the penalties, before the temperature */
    int32_t id;
} km_cand;

/* What the filters leave for the draw (temp > 0). c[0..n_top_k) is the top-k candidates in the
 * draw order: logit descending, id ascending on ties; NaN and -inf logits are never candidates.
 * Top-p keeps c[0..n_top_p), min-p c[0..n); w[j] is c[j]'s draw weight, exp((logit - max) /
 * temp) (1 for the logits equal to the max), sum their sequential sum. */
typedef struct {
    km_cand *c;
    float   *w;
    int64_t  n_valid, n_top_k, n_top_p, n;
    float    sum;
} km_cands;

/* The top-k, top-p, min-p and temperature stages over penalized logits[0..n); p->temp > 0.
 * n_valid 0 (every logit NaN or -inf) leaves nothing to draw from. out is freed with
 * km_cands_free, also after an error (NOMEM). */
kiln_status km_sampler_filter(const kiln_sampler_params *p, const float *logits, int64_t n,
                              km_cands *out);
void        km_cands_free(km_cands *c);
/* The draw: the index j in [0, c->n) where the running sum of w[0..j] first reaches u * sum
 * (c->n > 0, u in [0, 1)). */
int64_t     km_sampler_pick(const km_cands *c, float u);

#endif
