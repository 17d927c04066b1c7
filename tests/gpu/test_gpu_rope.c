/* GPU tests of the rope family (rope_ext): random cases of every mode (normal, neox, mrope,
 * vision, imrope) in every type, with partial rotation (n_dims < head_dim), freq_factors, YaRN
 * (ext_factor != 0, freq_scale, attn_factor, n_ctx_orig), several freq_bases, positions up to
 * 65536 (and negative ones), and operands read through permuted, transposed, offset (view),
 * reshaped and fused-QKV layouts; then targeted shapes (4097 tokens, decode, 4-D, chunked caches
 * of n_dims > 4096, misaligned views, positions up to 2^17). Each case runs on the GPU and is
 * compared with kiln_reference by NMSE against fe_ops[FE_OP_ROPE_EXT].nmse_tol, ggml's
 * test-backend-ops tolerance for rope (its default, 1e-7), for every type.
 *
 * $KILN_TEST_CASES sets the random cases per mode and type (default 5: 25 per type). */
#include "tests/support.h"

#include "frontend/frontend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/gpu_support.h"

static const int MODES[5] = {KILN_ROPE_NORMAL, KILN_ROPE_NEOX, KILN_ROPE_MROPE, KILN_ROPE_VISION, 40};

static int num_cases(void) {
    const char *e = getenv("KILN_TEST_CASES");
    int         n = e ? atoi(e) : 5;
    return n > 0 ? n : 5;
}

/* One rope_ext case: everything the builder takes, plus how a and pos are laid out. */
typedef struct {
    kiln_type t;
    int64_t   ne[4];
    int       mode, n_dims, n_ctx_orig, sections[4];
    float     freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow;
    int       layout;    /* a layout of gpu_support (LAY_*), or LAY_COUNT: a view of a fused QKV */
    int       qkv_which; /* LAY_COUNT: 0 q, 1 k, 2 v */
    int64_t   ff_len;    /* 0: no freq_factors */
    int       n_ctx;     /* positions in [0, n_ctx) */
    bool      negative;  /* some positions below 0 */
    int       pos_offs;  /* positions read through a view at this element offset */
} rcase;

static const char *mode_name(int m) {
    switch (m) {
    case 0: return "normal";
    case 2: return "neox";
    case 8: return "mrope";
    case 24: return "vision";
    case 40: return "imrope";
    }
    return "?";
}

/* The fused tensor [ne0, 3 * ne1, ne2, ne3] of which a is the q, k or v part. */
static kiln_tensor *qkv_operand(kiln_ctx *ctx, hset *h, const rcase *c, uint64_t seed, char *desc, size_t n) {
    int64_t      fne[4] = {c->ne[0], 3 * c->ne[1], c->ne[2], c->ne[3]};
    kiln_tensor *fused = kiln_new_tensor(ctx, KILN_ROLE_INPUT, c->t, "qkv", 4, fne);
    hdata       *d = hset_add(h, "qkv", c->t, fne[0] * fne[1] * fne[2] * fne[3]);
    fill(d->data, c->t, d->n, seed, FILL_ANY);
    size_t nb[3] = {kiln_tensor_nb(fused, 1), kiln_tensor_nb(fused, 2), kiln_tensor_nb(fused, 3)};
    snprintf(desc, n, "%s part of a fused qkv [%lld, %lld, %lld, %lld]", (const char *[]){"q", "k", "v"}[c->qkv_which],
             (long long)fne[0], (long long)fne[1], (long long)fne[2], (long long)fne[3]);
    return kiln_view(ctx, fused, 4, c->ne, nb, (size_t)c->qkv_which * (size_t)c->ne[1] * nb[0]);
}

/* Builds, runs and compares one case. */
static void run_case(const rcase *c, uint64_t seed, const char *what) {
    kiln_ctx *ctx = kiln_ctx_new();
    hset      h = {0};
    rng_t     r = {seed};
    char      adesc[192];
    kiln_tensor *a = c->layout == LAY_COUNT
                         ? qkv_operand(ctx, &h, c, seed + 1, adesc, sizeof adesc)
                         : operand(ctx, &h, &r, "a", c->t, c->ne, (layout)c->layout, FILL_ANY, seed + 1, adesc,
                                   sizeof adesc);
    ck_assert_ptr_nonnull(a);

    /* Positions: 1 or 4 per token, optionally read through an offset view. */
    const bool mrope = (c->mode & 8) != 0;
    int64_t    npos = (mrope ? 4 : 1) * c->ne[2], nleaf = npos + c->pos_offs;
    kiln_tensor *pleaf = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_I32, "pos", 1, &nleaf);
    hdata       *pd = hset_add(&h, "pos", KILN_I32, nleaf);
    for (int64_t i = 0; i < nleaf; i++) {
        int v = (int)(rng_next(&r) % (uint64_t)c->n_ctx);
        if (c->negative && rng_int(&r, 0, 3) == 0) v = -v;
        ((int32_t *)pd->data)[i] = v;
    }
    kiln_tensor *pos = pleaf;
    if (c->pos_offs) pos = kiln_view(ctx, pleaf, 1, &npos, NULL, (size_t)c->pos_offs * sizeof(int32_t));

    kiln_tensor *ff = NULL;
    if (c->ff_len) {
        ff = kiln_new_tensor(ctx, KILN_ROLE_WEIGHT, KILN_F32, "ff", 1, &c->ff_len);
        hdata *fd = hset_add(&h, "ff", KILN_F32, c->ff_len);
        for (int64_t i = 0; i < c->ff_len; i++) ((float *)fd->data)[i] = rng_float(&r, 0.9f, 1.1f); /* as ggml */
    }
    kiln_tensor *y = kiln_rope_multi(ctx, a, pos, ff, c->n_dims, c->sections, c->mode, c->n_ctx_orig, c->freq_base,
                                     c->freq_scale, c->ext_factor, c->attn_factor, c->beta_fast, c->beta_slow);
    kiln_status st = kiln_ctx_status(ctx);
    ck_assert_msg(y != NULL, "%s: rope_ext rejected: %s", what, st ? kiln_status_msg(st) : "?");
    kiln_set_output(ctx, y, "y");
    kiln_graph *g = NULL;
    TS_OK(kiln_graph_new(ctx, &g));

    char label[768];
    snprintf(label, sizeof label,
             "rope_ext %s: %s %s n_dims %d, a %s %s, positions %lld%s in (%s%d, %d), freq_factors %lld, "
             "sections [%d, %d, %d, %d], base %g, freq_scale %g, ext_factor %g, attn_factor %g, n_ctx_orig %d, "
             "beta %g/%g",
             what, mode_name(c->mode), kiln_type_name(c->t), c->n_dims, kiln_type_name(c->t), adesc,
             (long long)npos, c->pos_offs ? " (offset view)" : "", c->negative ? "-" : "", c->negative ? c->n_ctx : 0,
             c->n_ctx,
             (long long)c->ff_len, c->sections[0], c->sections[1], c->sections[2], c->sections[3],
             (double)c->freq_base, (double)c->freq_scale, (double)c->ext_factor, (double)c->attn_factor,
             c->n_ctx_orig, (double)c->beta_fast, (double)c->beta_slow);
    cmp_opts co = {.label = label, .tol_f32 = fe_ops[FE_OP_ROPE_EXT].nmse_tol, .fused_tol = false};
    check_and_free(g, &h, ctx, &co);
}

static void defaults(rcase *c, kiln_type t, int mode) {
    memset(c, 0, sizeof *c);
    c->t = t;
    c->mode = mode;
    c->freq_base = 10000.0f;
    c->freq_scale = 1.0f;
    c->attn_factor = 1.0f;
    c->beta_fast = 32.0f;
    c->beta_slow = 1.0f;
    c->n_ctx = 4096;
    c->ne[3] = 1;
}

/* Sections of the mrope modes for n_dims: three (sometimes four) parts of the pairs. */
static void random_sections(rcase *c, rng_t *r) {
    int pairs = c->n_dims / 2;
    if (c->mode == KILN_ROPE_VISION) { /* two sections covering the n_dims pairs, as clip.cpp */
        int s0 = rng_int(r, 1, c->n_dims > 1 ? c->n_dims - 1 : 1);
        c->sections[0] = s0, c->sections[1] = c->n_dims - s0 > 0 ? c->n_dims - s0 : 1;
        return;
    }
    /* Usually the sections cover the rotated pairs; sometimes fewer, so that sectors wrap. */
    int total = pairs > 0 ? (rng_int(r, 0, 3) == 0 ? rng_int(r, 1, pairs) : pairs) : 1;
    int s0 = rng_int(r, 0, total), s1 = rng_int(r, 0, total - s0);
    c->sections[0] = s0, c->sections[1] = s1, c->sections[2] = total - s0 - s1;
    if (c->sections[0] + c->sections[1] + c->sections[2] == 0) c->sections[2] = 1;
    if (rng_int(r, 0, 4) == 0 && total < c->ne[0]) c->sections[3] = 1;
}

static void random_case(rcase *c, rng_t *r, kiln_type t, int mode) {
    defaults(c, t, mode);
    static const int64_t HD[] = {1, 2, 6, 7, 64, 80, 96, 128, 130, 256};
    static const int64_t HD_MROPE[] = {8, 12, 64, 80, 128};
    static const int64_t HEADS[] = {1, 3, 7, 8, 32};
    static const int64_t TOKENS[] = {1, 7, 17, 130, 512};
    const bool mrope = (mode & 8) != 0;
    c->ne[0] = mrope ? HD_MROPE[rng_int(r, 0, 4)] : HD[rng_int(r, 0, 9)];
    c->ne[1] = HEADS[rng_int(r, 0, 4)];
    c->ne[2] = TOKENS[rng_int(r, 0, 4)];
    c->ne[3] = rng_int(r, 0, 3) == 0 ? 2 : 1;
    while (c->ne[0] * c->ne[1] * c->ne[2] * c->ne[3] > (1 << 20) && c->ne[2] > 1) c->ne[2] /= 2;

    if (mode == KILN_ROPE_VISION) c->n_dims = (int)(c->ne[0] / 2);
    else if (rng_int(r, 0, 4) < 3) c->n_dims = (int)(c->ne[0] & ~1);
    else c->n_dims = 2 * rng_int(r, 0, (int)(c->ne[0] / 2));
    if (mrope) random_sections(c, r);

    static const float BASES[] = {10000.0f, 10000.0f, 500000.0f, 1000000.0f, 75000.0f};
    c->freq_base = BASES[rng_int(r, 0, 4)];
    if (rng_int(r, 0, 2) == 0) { /* YaRN */
        static const float EF[] = {1.0f, 0.5f, 0.25f}, FS[] = {0.25f, 0.5f, 0.125f};
        static const int   NCO[] = {2048, 4096, 32768};
        c->ext_factor = EF[rng_int(r, 0, 2)];
        c->freq_scale = FS[rng_int(r, 0, 2)];
        c->n_ctx_orig = NCO[rng_int(r, 0, 2)];
        c->attn_factor = rng_int(r, 0, 1) ? 1.0f : 0.75f;
        c->beta_fast = rng_int(r, 0, 1) ? 32.0f : 16.0f;
    } else {
        c->freq_scale = rng_int(r, 0, 2) == 0 ? 0.5f : 1.0f;
        c->attn_factor = rng_int(r, 0, 2) == 0 ? 2.0f : 1.0f;
    }
    if (rng_int(r, 0, 4) < 2) {
        int64_t need = mode == KILN_ROPE_VISION ? c->n_dims : c->n_dims / 2;
        c->ff_len = (need > 0 ? need : 1) + rng_int(r, 0, 3);
    }
    static const int NCTX[] = {16, 512, 4096, 65536};
    c->n_ctx = NCTX[rng_int(r, 0, 3)];
    c->negative = rng_int(r, 0, 5) == 0;
    c->pos_offs = rng_int(r, 0, 5) == 0 ? rng_int(r, 1, 3) : 0;
    c->layout = rng_int(r, 0, LAY_COUNT); /* LAY_COUNT: the fused QKV view */
    c->qkv_which = rng_int(r, 0, 2);
}

/* Random cases: _i = type * 5 + mode. */
START_TEST(test_rope_random) {
    need_gpu();
    kiln_type t = FLOAT_TYPES[_i / 5];
    int       mode = MODES[_i % 5];
    int       n = num_cases();
    for (int k = 0; k < n; k++) {
        uint64_t seed = 0x5eed0000ull + 1000003ull * (uint64_t)_i + 7919ull * (uint64_t)k;
        rng_t    r = {seed};
        rcase    c;
        random_case(&c, &r, t, mode);
        char what[64];
        snprintf(what, sizeof what, "random case %d (seed %llu)", k, (unsigned long long)seed);
        run_case(&c, seed, what);
    }
}
END_TEST

/* Targeted cases, each in every type: _i = type * N_TARGETED + case. */
#define N_TARGETED 10

static void targeted_case(rcase *c, kiln_type t, int k) {
    switch (k) {
    case 0: /* many tokens, full neox rotation */
        defaults(c, t, KILN_ROPE_NEOX);
        c->ne[0] = 128, c->ne[1] = 8, c->ne[2] = 4097, c->n_dims = 128;
        break;
    case 1: /* decode: one token, heads split over blocks */
        defaults(c, t, KILN_ROPE_NEOX);
        c->ne[0] = 128, c->ne[1] = 32, c->ne[2] = 1, c->n_dims = 128, c->n_ctx = 131072;
        break;
    case 2: /* Llama-3-style: K view of a fused QKV, freq_factors, YaRN, large positions */
        defaults(c, t, KILN_ROPE_NEOX);
        c->ne[0] = 128, c->ne[1] = 8, c->ne[2] = 64, c->n_dims = 128, c->layout = LAY_COUNT, c->qkv_which = 1;
        c->ff_len = 64, c->freq_base = 500000.0f, c->ext_factor = 1.0f, c->freq_scale = 0.125f;
        c->n_ctx_orig = 8192, c->n_ctx = 131072;
        break;
    case 3: /* partial rotation (phi-2 style), normal mode, permuted operand */
        defaults(c, t, KILN_ROPE_NORMAL);
        c->ne[0] = 80, c->ne[1] = 32, c->ne[2] = 33, c->n_dims = 32, c->layout = LAY_PERMUTE;
        break;
    case 4: /* n_dims > 4096: a cache in chunks */
        defaults(c, t, KILN_ROPE_NORMAL);
        c->ne[0] = 4100, c->ne[1] = 2, c->ne[2] = 3, c->n_dims = 4098, c->n_ctx = 64;
        break;
    case 5: /* neox, chunks with vectors */
        defaults(c, t, KILN_ROPE_NEOX);
        c->ne[0] = 8192, c->ne[1] = 1, c->ne[2] = 2, c->n_dims = 8192, c->n_ctx = 64;
        break;
    case 6: /* 4-D, qwen2-vl mrope sections */
        defaults(c, t, KILN_ROPE_MROPE);
        c->ne[0] = 128, c->ne[1] = 4, c->ne[2] = 5, c->ne[3] = 3, c->n_dims = 128;
        c->sections[0] = 16, c->sections[1] = 24, c->sections[2] = 24;
        break;
    case 7: /* qwen3-vl imrope, V-part view, freq_factors */
        defaults(c, t, 40);
        c->ne[0] = 128, c->ne[1] = 4, c->ne[2] = 70, c->n_dims = 128, c->layout = LAY_COUNT, c->qkv_which = 2;
        c->sections[0] = 24, c->sections[1] = 20, c->sections[2] = 20, c->ff_len = 64;
        break;
    case 8: /* vision with YaRN and freq_factors, misaligned view */
        defaults(c, t, KILN_ROPE_VISION);
        c->ne[0] = 80, c->ne[1] = 16, c->ne[2] = 40, c->n_dims = 40, c->layout = LAY_VIEW;
        c->sections[0] = 20, c->sections[1] = 20, c->ff_len = 40, c->ext_factor = 0.5f, c->freq_scale = 0.5f;
        c->n_ctx_orig = 1024;
        break;
    default: /* n_dims 0: a copy; transposed operand, odd head_dim */
        defaults(c, t, KILN_ROPE_NEOX);
        c->ne[0] = 7, c->ne[1] = 5, c->ne[2] = 3, c->n_dims = 0, c->layout = LAY_TRANSPOSE;
        break;
    }
}

START_TEST(test_rope_targeted) {
    need_gpu();
    kiln_type t = FLOAT_TYPES[_i / N_TARGETED];
    rcase     c;
    targeted_case(&c, t, _i % N_TARGETED);
    char what[64];
    snprintf(what, sizeof what, "targeted case %d", _i % N_TARGETED);
    run_case(&c, 0xa11ce000ull + (uint64_t)_i, what);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_rope",
                        TS_CASE("random", 600), TS_LOOP(0, 15, test_rope_random),
                        TS_CASE("targeted", 600), TS_LOOP(0, 3 * N_TARGETED, test_rope_targeted));
    return ts_main_cache(s, "gpu-rope", &g_cache_dir);
}
