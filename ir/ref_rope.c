/* CPU reference of the rope family: rope_ext.
 *
 * Follows ggml's CPU kernel (ggml/src/ggml-cpu/ops.cpp: ggml_compute_forward_rope_flt,
 * ggml_rope_cache_init, ggml_mrope_cache_init, rope_yarn, rope_yarn_ramp, rotate_pairs; and
 * ggml_rope_yarn_corr_dims in ggml.c) step by step in float:
 *
 *   theta_scale = powf(freq_base, -2.0f / n_dims)
 *   per token, a cache of (cos, sin) for pair index i = 0, 1, ...:
 *     theta_0 = (float) pos;  theta_{i+1} = theta_i * theta_scale     (a float recurrence: the
 *                                                                     exact chain matters)
 *     theta_extrap = theta_i / freq_factors[i]   (no division without freq_factors)
 *     theta_interp = freq_scale * theta_extrap
 *     ext_factor == 0: theta = theta_interp, mscale = attn_factor
 *     else: ramp_mix = rope_yarn_ramp(corr_dims, i) * ext_factor
 *           theta = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix
 *           mscale = attn_factor * (1.0f + 0.1f * logf(1.0f / freq_scale))
 *     cos = cosf(theta) * mscale, sin = sinf(theta) * mscale
 *   mrope modes keep four such chains (positions t, h, w, e) and pick one per pair by section;
 *   vision restarts each chain at the start of its section.
 *   rotation of pair (x0, x1):  y0 = x0*cos - x1*sin,  y1 = x0*sin + x1*cos
 *     normal: pair i = elements (2i, 2i+1), i < n_dims/2
 *     neox, mrope, imrope: pair i = elements (i, i + n_dims/2), i < n_dims/2
 *     vision: pair i = elements (i, i + n_dims), i < n_dims (= ne0/2)
 *   elements n_dims..ne0-1 are copied (all modes but vision, which rotates the whole row).
 *
 * The transcendental functions of constants (theta_scale's powf, the logf of the YaRN
 * correction dims and of mscale) are computed in double and rounded once to float, so that the
 * kernel template (templates/rope.lua) computes the same floats with Lua's doubles: that is the
 * correctly rounded powf/logf, which glibc's powf misses by one ulp for ~0.1% of (freq_base,
 * n_dims) pairs. Everything else rounds in float exactly where ggml does. f16/bf16 operands are
 * widened on load and each result is rounded once on store. */
#include "ir_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ROPE_PI_F 3.14159265358979323846f /* (float)M_PI, as ggml's corr_dim */

typedef struct {
    int   mode, n_dims, np; /* np: pairs of the cache that are rotated */
    int   sections[4];
    float theta_scale, freq_scale, ext_factor, mscale, corr[2];
} rope_cfg;

/* powf and logf, correctly rounded (see the top comment). */
static float pow_f32(float b, float e) { return (float)pow((double)b, (double)e); }
static float log_f32(float x) { return (float)log((double)x); }

static float max_f(float a, float b) { return a > b ? a : b; } /* ggml's MAX(a, b) */
static float min_f(float a, float b) { return a < b ? a : b; } /* ggml's MIN(a, b) */

/* ggml_rope_yarn_corr_dim: n_dims * logf(n_ctx_orig / (n_rot * 2 * pi)) / (2 * logf(base)). */
static float corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    const float l = log_f32((float)n_ctx_orig / (n_rot * 2.0f * ROPE_PI_F));
    return (float)n_dims * l / (2.0f * log_f32(base));
}

/* ggml_rope_yarn_corr_dims. */
static void corr_dims(int n_dims, int n_ctx_orig, float base, float beta_fast, float beta_slow, float out[2]) {
    const float start = floorf(corr_dim(n_dims, n_ctx_orig, beta_fast, base));
    const float end = ceilf(corr_dim(n_dims, n_ctx_orig, beta_slow, base));
    out[0] = max_f(0.0f, start);
    out[1] = min_f((float)(n_dims - 1), end);
}

/* rope_yarn_ramp: i is the pair index (ggml's i0 / 2). */
static float yarn_ramp(float low, float high, int i) {
    const float y = ((float)i - low) / max_f(0.001f, high - low);
    return 1.0f - min_f(1.0f, max_f(0.0f, y));
}

/* rope_yarn: the cos and sin of pair i at theta_extrap, scaled by mscale. */
static void yarn(const rope_cfg *c, float theta_extrap, int i, float *cs, float *sn) {
    const float theta_interp = c->freq_scale * theta_extrap;
    float       theta = theta_interp;
    if (c->ext_factor != 0.0f) {
        const float ramp_mix = yarn_ramp(c->corr[0], c->corr[1], i) * c->ext_factor;
        theta = theta_interp * (1.0f - ramp_mix) + theta_extrap * ramp_mix;
    }
    *cs = cosf(theta) * c->mscale;
    *sn = sinf(theta) * c->mscale;
}

static float freq_factor(const ir_ref *ff, const void *data, int i) {
    if (!ff) return 1.0f;
    const int64_t at[4] = {i, 0, 0, 0};
    return kb_load_f32(data, ff->type, ir_offset_at(ff, at));
}

/* The theta of pair i before freq_factors: ggml_rope_cache_init's chain, or
 * ggml_mrope_cache_init's four chains and section pick. p: the token's 4 positions (1 used). */
static void cache_thetas(const rope_cfg *c, const float p[4], float *theta) {
    if (!(c->mode & 8)) {
        float t = p[0];
        for (int i = 0; i < c->np; i++) {
            theta[i] = t;
            t *= c->theta_scale;
        }
        return;
    }
    const int *s = c->sections;
    const int  sect_dims = s[0] + s[1] + s[2] + s[3];
    const int  sec_w = s[1] + s[0];
    const int  sec_e = s[2] + sec_w;
    const bool imrope = c->mode == 40, vision = c->mode == 24;
    float      tt = p[0], th = p[1], tw = p[2], te = p[3];
    for (int i = 0; i < c->np; i++) {
        const int sector = i % sect_dims;
        if (vision) { /* indep_sects: each section restarts its chain */
            if (sector == 0) tt = p[0];
            else if (sector == s[0]) th = p[1];
            else if (sector == sec_w) tw = p[2];
            else if (sector == sec_e) te = p[3];
        }
        float t = tt;
        if (imrope) { /* interleaved: t h w t h w ... while each section lasts */
            if (sector % 3 == 1 && sector < 3 * s[1]) t = th;
            else if (sector % 3 == 2 && sector < 3 * s[2]) t = tw;
            else if (sector % 3 == 0 && sector < 3 * s[0]) t = tt;
            else t = te;
        } else {
            if (sector >= s[0] && sector < sec_w) t = th;
            else if (sector >= sec_w && sector < sec_w + s[2]) t = tw;
            else if (sector >= sec_w + s[2]) t = te;
        }
        theta[i] = t;
        tt *= c->theta_scale;
        th *= c->theta_scale;
        tw *= c->theta_scale;
        te *= c->theta_scale;
    }
}

static rope_cfg make_cfg(const ir_node *n) {
    rope_cfg c;
    memset(&c, 0, sizeof c);
    c.n_dims = n->ip[0];
    c.mode = n->ip[1];
    const int n_ctx_orig = n->ip[2];
    memcpy(c.sections, &n->ip[3], sizeof c.sections);
    const float freq_base = n->fp[0], attn_factor = n->fp[3], beta_fast = n->fp[4], beta_slow = n->fp[5];
    c.freq_scale = n->fp[1];
    c.ext_factor = n->fp[2];
    c.np = c.mode == 24 ? c.n_dims : c.n_dims / 2;
    c.theta_scale = pow_f32(freq_base, -2.0f / (float)c.n_dims);
    corr_dims(c.n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow, c.corr);
    c.mscale = attn_factor;
    if (c.ext_factor != 0.0f) c.mscale *= 1.0f + 0.1f * log_f32(1.0f / c.freq_scale);
    return c;
}

/* Element offsets of pair i's two elements along dim 0. */
static void pair_at(const rope_cfg *c, int i, int64_t *e0, int64_t *e1) {
    switch (c->mode) {
    case 0: *e0 = 2 * (int64_t)i, *e1 = *e0 + 1; break;
    case 24: *e0 = i, *e1 = i + c->n_dims; break;
    default: *e0 = i, *e1 = i + c->n_dims / 2; break;
    }
}

static kiln_status rope_ext(const ir_node *n, void **data) {
    const ir_ref *a = ir_operand(n, 0), *pos = ir_operand(n, 1), *ff = ir_operand(n, 2);
    const ir_ref *d = &n->dst;
    const rope_cfg c = make_cfg(n);
    const int64_t *ne = d->ne;
    float *theta = malloc(sizeof(float) * (size_t)(c.np > 0 ? c.np : 1));
    float *cs = malloc(sizeof(float) * 2 * (size_t)(c.np > 0 ? c.np : 1));
    if (!theta || !cs) {
        free(theta);
        free(cs);
        return kb_oom();
    }
    const void *src = data[a->buf];
    void       *dst = data[d->buf];
    for (int64_t i3 = 0; i3 < ne[3]; i3++)
        for (int64_t i2 = 0; i2 < ne[2]; i2++) {
            float p[4] = {0, 0, 0, 0};
            for (int k = 0; k < ((c.mode & 8) ? 4 : 1); k++) {
                const int64_t at[4] = {i2 + k * ne[2], 0, 0, 0};
                p[k] = (float)((const int32_t *)data[pos->buf])[ir_offset_at(pos, at)];
            }
            cache_thetas(&c, p, theta);
            for (int i = 0; i < c.np; i++)
                yarn(&c, ff ? theta[i] / freq_factor(ff, data[ff->buf], i) : theta[i], i, &cs[2 * i], &cs[2 * i + 1]);
            for (int64_t i1 = 0; i1 < ne[1]; i1++) {
                int64_t c4[4] = {0, i1, i2, i3};
                for (int i = 0; i < c.np; i++) {
                    int64_t e0, e1;
                    pair_at(&c, i, &e0, &e1);
                    c4[0] = e0;
                    const int64_t s0 = ir_offset_at(a, c4), o0 = ir_offset_at(d, c4);
                    c4[0] = e1;
                    const int64_t s1 = ir_offset_at(a, c4), o1 = ir_offset_at(d, c4);
                    const float x0 = kb_load_f32(src, a->type, s0), x1 = kb_load_f32(src, a->type, s1);
                    const float ct = cs[2 * i], st = cs[2 * i + 1];
                    kb_store_f32(dst, d->type, o0, x0 * ct - x1 * st);
                    kb_store_f32(dst, d->type, o1, x0 * st + x1 * ct);
                }
                if (c.mode == 24) continue;
                for (int64_t e = c.n_dims; e < ne[0]; e++) {
                    c4[0] = e;
                    kb_store_f32(dst, d->type, ir_offset_at(d, c4), kb_load_f32(src, a->type, ir_offset_at(a, c4)));
                }
            }
        }
    free(theta);
    free(cs);
    return NULL;
}

kiln_status ir_ref_rope(const ir_prog *p, const ir_node *n, void **data) {
    (void)p;
    switch (n->op) {
    case FE_OP_ROPE_EXT: return rope_ext(n, data);
    default: return kb_error(KILN_ERR_INVALID, "reference: %s is not a rope op", fe_ops[n->op].name);
    }
}
