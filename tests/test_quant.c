/* The quantized types (issue 25, base/quant.c, docs/quantization.md), CPU side:
 *  - dequantization bit-identical to ggml's dequantize_row_* on vectors made independently of
 *    kiln's code (scripts/quant_vectors.py -> tests/quant_vectors.h), per row and per element;
 *  - kiln's quantizers against the dequantizer: the largest error of every element within a
 *    bound derived from the format (below, and in the doc), the RMSE of random rows within a
 *    measured limit, structured rows (constant, zeros, an outlier, ramps, tiny and large values),
 *    and quantize(dequantize(q)) == q for q8_0 and q4_0;
 *  - the type table API (names, sizes, blocks, row sizes, names without regard to case);
 *  - the frontend's refusals (rows of partial blocks, views that break blocks, ops that do not
 *    take quantized operands) and the .kg round trip of quantized declarations;
 *  - the CPU reference of mul_mat, mul_mat_id and get_rows with quantized weights, equal bit for
 *    bit to the same graph with the weights dequantized to f32 by hand.
 * No GPU needed. */
#include "tests/support.h"

#include "base/base.h"
#include "tests/quant_vectors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

#define NQ 8
static const kiln_type QTYPES[NQ] = {KILN_Q8_0, KILN_Q4_0, KILN_Q4_K, KILN_Q5_K, KILN_Q6_K, KILN_MXFP4, KILN_Q5_0, KILN_Q5_1};

/* ---- dequantization: ggml's vectors ---------------------------------------------------------- */

/* want is a bit pattern from the vectors; 0x7fc00000 stands for any NaN (inf · 0). Element i
 * of blocks of blk. */
static void expect_bits(float got, uint32_t want, const char *type, int64_t blk, const char *how, int64_t i) {
    if (want == 0x7fc00000u) {
        ck_assert_msg(isnan(got), "%s %s element %lld: got %a (0x%08x), want NaN", type, how, (long long)i, got,
                      bits_of(got));
        return;
    }
    ck_assert_msg(bits_of(got) == want, "%s %s element %lld (block %lld, j %lld): got %a (0x%08x), want 0x%08x",
                  type, how, (long long)i, (long long)(i / blk), (long long)(i % blk), got,
                  bits_of(got), want);
}

START_TEST(dequant_vectors) {
    const qv_case *c = &qv_cases[_i];
    kiln_type      t = (kiln_type)c->type;
    int64_t        blk = kiln_type_block(t), n = c->nblocks * blk;
    ck_assert_str_eq(kiln_type_name(t), c->name);
    float *y = malloc((size_t)n * sizeof *y);
    ck_assert_ptr_nonnull(y);
    kb_dequant_row(c->blocks, t, y, n);
    for (int64_t i = 0; i < n; i++) expect_bits(y[i], c->want[i], c->name, blk, "row", i);
    for (int64_t i = 0; i < n; i++) expect_bits(kb_dequant_elem(c->blocks, t, i), c->want[i], c->name, blk, "elem", i);
    for (int64_t i = 0; i < n; i++) expect_bits(kb_load_f32(c->blocks, t, i), c->want[i], c->name, blk, "load", i);
    /* A row that starts at block 1 reads the same values as elements blk.. of the whole. */
    kb_dequant_row(c->blocks + kiln_type_size(t), t, y, n - blk);
    for (int64_t i = 0; i < n - blk; i++) expect_bits(y[i], c->want[i + blk], c->name, blk, "row from block 1", i + blk);
    free(y);
}
END_TEST

/* Types that are not quantized have no codec: NaN, and the quantizer refuses them and rows of
 * partial blocks. */
START_TEST(codec_refusals) {
    float   x[256] = {0}, y[2];
    uint8_t q[512];
    ck_assert(isnan(kb_dequant_elem(x, KILN_F32, 0)));
    kb_dequant_row(x, KILN_F16, y, 2);
    ck_assert(isnan(y[0]) && isnan(y[1]));
    ck_assert(!kb_quant_row(x, KILN_F32, q, 32));
    ck_assert(!kb_quant_row(x, KILN_Q8_0, q, 31));
    ck_assert(!kb_quant_row(x, KILN_Q4_K, q, 128));
    ck_assert(kb_quant_row(x, KILN_Q4_K, q, 256));
    ck_assert(kb_quant_row(x, KILN_Q8_0, q, 0));
}
END_TEST

/* The device layout of q8_0, q4_0, q6_K and mxfp4 (base/quant.c, templates/quant.lua): tiles of
 * KB_QTILE blocks (16 for mxfp4), the blocks without their scales (f16; mxfp4's one byte), then
 * the scales; the last tile the same with what is left. Buffers of whole tiles converted apart equal their concatenation converted
 * (pass mul_mat_cat's weight blocks rely on it); from_device inverts to_device; other types and
 * sizes that are not whole blocks are refused. */
START_TEST(device_layout) {
    static const kiln_type ts[6] = {KILN_Q8_0, KILN_Q4_0, KILN_Q6_K, KILN_MXFP4, KILN_Q5_0, KILN_Q5_1};
    enum { NB = 35 }; /* two whole tiles of 16 (four of 8) and 3 blocks */
    kiln_type t = ts[_i];
    /* the "scale": mxfp4's exponent byte, q5_0's d and qh, q5_1's d, m and qh, the others' d */
    size_t tile = t == KILN_MXFP4 ? 16 : 8, sb = t == KILN_MXFP4 ? 1 : t == KILN_Q5_0 ? 6 : t == KILN_Q5_1 ? 8 : 2;
    size_t    size = kiln_type_size(t), rest = size - sb, sa = t == KILN_Q6_K ? 208 : 0, ra = sa ? 0 : sb;
    ck_assert_int_eq(kb_quant_tile(t), (int)tile);
    uint8_t  *src = malloc(NB * size), *dev = malloc(NB * size), *back = malloc(NB * size), *two = malloc(NB * size);
    ck_assert(src && dev && back && two);
    for (size_t i = 0; i < NB * size; i++) src[i] = (uint8_t)(i * 131 + 7);
    ck_assert(kb_quant_split(t));
    ck_assert(kb_quant_to_device(t, src, dev, NB * size));
    for (size_t i = 0; i < NB; i++) {
        size_t t0 = i / tile * tile, n = NB - t0 < tile ? NB - t0 : tile;
        ck_assert_msg(memcmp(dev + t0 * size + (i - t0) * rest, src + i * size + ra, rest) == 0, "body of block %zu", i);
        ck_assert_msg(memcmp(dev + t0 * size + n * rest + (i - t0) * sb, src + i * size + sa, sb) == 0, "scale of block %zu", i);
        if (rest == 16) ck_assert_uint_eq((t0 * size + (i - t0) * rest) % 16, 0); /* 16-byte loads */
        if (t == KILN_Q5_1) ck_assert_uint_eq((t0 * size + n * rest + (i - t0) * sb) % 8, 0); /* one 8-byte load */
    }
    ck_assert(kb_quant_from_device(t, dev, back, NB * size));
    ck_assert(memcmp(back, src, NB * size) == 0);
    ck_assert(kb_quant_to_device(t, src, two, tile * size));
    ck_assert(kb_quant_to_device(t, src + tile * size, two + tile * size, tile * size));
    ck_assert(memcmp(two, dev, 2 * tile * size) == 0);
    ck_assert(!kb_quant_to_device(t, src, two, size + 1));
    ck_assert(!kb_quant_split(KILN_Q4_K) && !kb_quant_to_device(KILN_Q4_K, src, two, 144));
    free(src), free(dev), free(back), free(two);
}
END_TEST

/* ---- quantizer <-> dequantizer ---------------------------------------------------------------- */

/* How far f16 rounding moves a scale v >= 0: half an ulp, 2^-11 relative while normal, 2^-25
 * absolute while subnormal. */
static double f16_err(double v) { return fmax(v * 0x1p-11, 0x1p-25); }

/* The largest error kiln's quantizer may leave on each element of one block x of type t, from
 * the format (the derivations are in docs/quantization.md); bound[j] gets element j's. slack
 * covers f32 arithmetic (a few ulps of the block's largest magnitude). */
static void error_bounds(kiln_type t, const float *x, double *bound) {
    int    blk = (int)kiln_type_block(t);
    double amax = 0;
    for (int j = 0; j < blk; j++) amax = fmax(amax, fabs(x[j]));
    double slack = amax * 0x1p-20 + 0x1p-40;
    if (t == KILN_Q8_0) { /* d = amax/127, |q| <= 127: half a step, plus 127 times d's rounding */
        double d = amax / 127;
        for (int j = 0; j < blk; j++) bound[j] = d / 2 + 127 * f16_err(d) + slack;
        return;
    }
    if (t == KILN_Q4_0) { /* the largest magnitude maps to -8 (d signed); +8 clamps to 7 */
        double max = 0;
        for (int j = 0; j < blk; j++)
            if (fabs(x[j]) > fabs(max)) max = x[j];
        double d = max / -8, ad = fabs(d);
        for (int j = 0; j < blk; j++) {
            double r = d != 0 ? x[j] / d : 0; /* in [-8, 8] */
            bound[j] = (r > 7.5 ? ad * (r - 7) : ad / 2) + 8 * f16_err(ad) + slack;
        }
        return;
    }
    if (t == KILN_Q5_0) { /* q4_0's bound with 32 levels: -16 at the largest magnitude, 15 the top */
        double max = 0;
        for (int j = 0; j < blk; j++)
            if (fabs(x[j]) > fabs(max)) max = x[j];
        double d = max / -16, ad = fabs(d);
        for (int j = 0; j < blk; j++) {
            double r = d != 0 ? x[j] / d : 0; /* in [-16, 16] */
            bound[j] = (r > 15.5 ? ad * (r - 15) : ad / 2) + 16 * f16_err(ad) + slack;
        }
        return;
    }
    if (t == KILN_Q5_1) { /* [lo, hi] onto 0..31: half a step, m's rounding, 31 times d's at the top */
        double lo = x[0], hi = x[0];
        for (int j = 0; j < blk; j++) {
            lo = fmin(lo, x[j]);
            hi = fmax(hi, x[j]);
        }
        double d = (hi - lo) / 31;
        for (int j = 0; j < blk; j++) bound[j] = d / 2 + f16_err(fabs(lo)) + 32 * f16_err(d) + slack;
        return;
    }
    if (t == KILN_MXFP4) {
        /* the scale 2^(e - 128) >= amax / 12 (codes' steps at most 4 of it: 8 -> 12, so half a
         * step is at most amax / 3), or the next smaller, where the largest magnitudes clip to 12
         * scales >= amax / 2 and the steps are at most amax / 6: within amax / 2 either way */
        for (int j = 0; j < blk; j++) bound[j] = amax / 2 + slack;
        return;
    }
    if (t == KILN_Q6_K) { /* 16 sub-blocks: scale s = amax_s/32, an int8 code within 1.5 of s/d */
        double s[16], d = 0;
        for (int b = 0; b < 16; b++) {
            s[b] = 0;
            for (int j = 0; j < 16; j++) s[b] = fmax(s[b], fabs(x[16 * b + j]) / 32);
            d = fmax(d, s[b] / 127);
        }
        double ds = 1.5 * d + 128 * f16_err(d);
        for (int j = 0; j < 256; j++) bound[j] = fmax(s[j / 16] + 31 * ds, 32 * ds) + slack;
        return;
    }
    /* q4_K, q5_K: 8 sub-blocks mapped from [min(0, lo), hi] onto 0..nmax; 6-bit scale and min
     * codes within 1.5 of their ideal (rounding, then the quantizer's search of the neighbours). */
    int    nmax = t == KILN_Q4_K ? 15 : 31;
    double range[8], max_scale = 0, max_min = 0;
    for (int b = 0; b < 8; b++) {
        double lo = 0, hi = x[32 * b];
        for (int j = 0; j < 32; j++) {
            lo = fmin(lo, x[32 * b + j]);
            hi = fmax(hi, x[32 * b + j]);
        }
        range[b] = hi - lo;
        max_scale = fmax(max_scale, range[b] / nmax);
        max_min = fmax(max_min, -lo);
    }
    double d = max_scale / 63, dmin = max_min / 63;
    double ds = 1.5 * d + 64 * f16_err(d), dm = 1.5 * dmin + 64 * f16_err(dmin);
    for (int j = 0; j < 256; j++) bound[j] = fmax((range[j / 32] / nmax + ds) / 2, dm + nmax * ds) + slack;
}

typedef struct {
    double worst;  /* largest error / bound over the elements */
    double rel;    /* RMSE / RMS of the row */
    int64_t where; /* element of the worst */
} qerr;

/* Quantizes x (n elements) to t, dequantizes, and measures against error_bounds. */
static qerr roundtrip_error(kiln_type t, const float *x, int64_t n, float *y) {
    size_t   bytes = kiln_row_size(t, n);
    uint8_t *q = malloc(bytes ? bytes : 1);
    ck_assert_ptr_nonnull(q);
    ck_assert(kb_quant_row(x, t, q, n));
    kb_dequant_row(q, t, y, n);
    free(q);
    int64_t blk = kiln_type_block(t);
    double  bound[256], se = 0, sx = 0;
    qerr    r = {0};
    for (int64_t b = 0; b < n; b += blk) {
        error_bounds(t, x + b, bound);
        for (int64_t j = 0; j < blk; j++) {
            double e = fabs((double)y[b + j] - x[b + j]);
            ck_assert_msg(!isnan(y[b + j]), "%s: NaN at %lld", kiln_type_name(t), (long long)(b + j));
            if (e / bound[j] > r.worst) {
                r.worst = e / bound[j];
                r.where = b + j;
            }
            se += e * e;
            sx += (double)x[b + j] * x[b + j];
        }
    }
    r.rel = sx > 0 ? sqrt(se / sx) : sqrt(se);
    return r;
}

static double uniform(uint64_t *s) { return (double)(ts_rng_next(s) >> 11) * 0x1p-53; }

static double gaussian(uint64_t *s) {
    double u = uniform(s) + 0x1p-60, v = uniform(s);
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* RMSE / RMS of kiln's quantizer on these rows (deterministic), a few percent over what it
 * measures (docs/quantization.md): q8_0 0.0054, q4_0 0.086, q4_K 0.072, q5_K 0.035, q6_K
 * 0.018, q5_0 0.043, q5_1 0.038 on the gaussian rows. ggml's reference quantizers measure 0.0054, 0.086, 0.071, 0.036
 * and 0.0177 on such rows; kiln's first K-quant quantizers (nearest 6-bit/8-bit scale codes,
 * q6_K to ±31) measured 0.078, 0.038 and 0.0194, above these limits. mxfp4 measures 0.1126 (the
 * better of two exponents); ggml's first guess alone, 2^(floor(log2 amax) - 2) with nearest
 * codes, measures about 0.115 on such rows. */
static const double RMSE_LIMIT[NQ] = {0.0060, 0.090, 0.075, 0.0365, 0.0188, 0.116, 0.045, 0.040};

START_TEST(quant_random_rows) {
    kiln_type t = QTYPES[_i];
    int64_t   n = 256 * 64;
    float    *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
    ck_assert(x && y);
    uint64_t s = 25 + (uint64_t)_i;
    for (int dist = 0; dist < 3; dist++) {
        /* gaussian; uniform in [-1, 1); gaussian with a per-256 scale from 1e-3 to 1e3 */
        for (int64_t i = 0; i < n; i++)
            x[i] = (float)(dist == 1 ? 2 * uniform(&s) - 1 : gaussian(&s) * (dist == 2 ? pow(10, (i / 256) % 7 - 3) : 1));
        qerr r = roundtrip_error(t, x, n, y);
        ck_assert_msg(r.worst <= 1, "%s dist %d: element %lld: x %g, got %g: %.3f of its bound", kiln_type_name(t),
                      dist, (long long)r.where, x[r.where], y[r.where], r.worst);
        ck_assert_msg(r.rel <= RMSE_LIMIT[_i], "%s dist %d: RMSE/RMS %.5f > %.5f", kiln_type_name(t), dist, r.rel,
                      RMSE_LIMIT[_i]);
    }
    free(x);
    free(y);
}
END_TEST

/* Rows with structure, one block pattern repeated over 2 K-blocks: every element within its
 * bound; zeros and constants come back exactly where the format holds them exactly. */
START_TEST(quant_structured_rows) {
    kiln_type t = QTYPES[_i];
    enum { N = 512 };
    float x[N], y[N];
    for (int pat = 0; pat < 12; pat++) {
        for (int i = 0; i < N; i++) {
            switch (pat) {
            case 0: x[i] = 0; break;
            case 1: x[i] = 0.75f; break;                                  /* constant */
            case 2: x[i] = -3.5f; break;                                  /* negative constant */
            case 3: x[i] = i == 77 ? 100.0f : 0.01f * (float)(i % 5 - 2); break; /* one outlier */
            case 4: x[i] = (float)i / N; break;                           /* ramp up */
            case 5: x[i] = 1 - 2 * (float)(i % 256) / 255; break;         /* ramp down across zero */
            case 6: x[i] = 1e-6f * (float)(i % 7 - 3); break;             /* tiny: scales subnormal */
            case 7: x[i] = 1e-9f * (float)(i % 3 - 1); break;             /* below f16: scales 0 */
            case 8: x[i] = 2000.0f * (float)(i % 9 - 4); break;           /* large */
            case 9: x[i] = i % 2 ? 1.0f : -1.0f; break;                   /* alternating */
            case 10: x[i] = i % 64 == 0 ? -5.0f : 0.5f; break;            /* spikes below */
            default: x[i] = (float)((i * 37) % 101) - 50.0f; break;       /* integers */
            }
        }
        qerr r = roundtrip_error(t, x, N, y);
        ck_assert_msg(r.worst <= 1, "%s pattern %d: element %lld: x %g, got %g: %.3f of its bound",
                      kiln_type_name(t), pat, (long long)r.where, x[r.where], y[r.where], r.worst);
        /* zeros stay zeros (q4_0 and q6_K give -0, as ggml's quantizers do: the scale of a
         * zero block is 0 / -8) */
        if (pat == 0)
            for (int i = 0; i < N; i++) ck_assert_msg(y[i] == 0, "%s: zeros give %a", kiln_type_name(t), y[i]);
    }
}
END_TEST

/* q8_0 and q4_0 rows that are already quantized survive another round unchanged: the same
 * dequantized values, and the same bytes wherever the scale is not zero. */
START_TEST(quant_idempotent) {
    kiln_type t = _i ? KILN_Q4_0 : KILN_Q8_0;
    enum { N = 32 * 64 };
    float    x[N], y[N], z[N];
    uint8_t  q[N * 2], q2[N * 2];
    uint64_t s = 7;
    for (int i = 0; i < N; i++) x[i] = (float)(gaussian(&s) * pow(10, (i / 32) % 9 - 4));
    for (int i = 0; i < 32; i++) x[5 * 32 + i] = 0; /* a zero block */
    ck_assert(kb_quant_row(x, t, q, N));
    kb_dequant_row(q, t, y, N);
    ck_assert(kb_quant_row(y, t, q2, N));
    kb_dequant_row(q2, t, z, N);
    for (int i = 0; i < N; i++) ck_assert_msg(bits_of(y[i]) == bits_of(z[i]), "%s: %d: %a then %a", kiln_type_name(t), i, y[i], z[i]);
    size_t bs = kiln_type_size(t);
    for (int b = 0; b < N / 32; b++) {
        uint16_t d = (uint16_t)(q[b * bs] | q[b * bs + 1] << 8);
        if (d & 0x7fff) ck_assert_msg(!memcmp(q + b * bs, q2 + b * bs, bs), "%s: block %d changed", kiln_type_name(t), b);
    }
}
END_TEST

/* kb_fill_random on a quantized type: the quantized uniform values, deterministic. */
START_TEST(fill_random_quantized) {
    for (int k = 0; k < NQ; k++) {
        kiln_type t = QTYPES[k];
        uint8_t   a[34 * 32], b[34 * 32]; /* q8_0 is the largest: 32 blocks of 34 */
        float     y[1024];
        kb_fill_random(a, t, 1024, 99);
        kb_fill_random(b, t, 1024, 99);
        ck_assert(!memcmp(a, b, kiln_row_size(t, 1024)));
        kb_dequant_row(a, t, y, 1024);
        for (int i = 0; i < 1024; i++) ck_assert_msg(fabsf(y[i]) <= 1.1f, "%s: %g", kiln_type_name(t), y[i]);
    }
}
END_TEST

/* ---- the type table --------------------------------------------------------------------------- */

START_TEST(type_table) {
    static const struct {
        kiln_type   t;
        const char *name;
        size_t      size;
        int64_t     block;
    } want[] = {{KILN_F32, "f32", 4, 1},        {KILN_F16, "f16", 2, 1},        {KILN_BF16, "bf16", 2, 1},
                {KILN_I32, "i32", 4, 1},        {KILN_I64, "i64", 8, 1},        {KILN_Q8_0, "q8_0", 34, 32},
                {KILN_Q4_0, "q4_0", 18, 32},    {KILN_Q4_K, "q4_K", 144, 256},  {KILN_Q5_K, "q5_K", 176, 256},
                {KILN_Q6_K, "q6_K", 210, 256},  {KILN_MXFP4, "mxfp4", 17, 32},  {KILN_Q5_0, "q5_0", 22, 32},
                {KILN_Q5_1, "q5_1", 24, 32}};
    ck_assert_int_eq(sizeof want / sizeof want[0], KILN_TYPE_COUNT);
    for (int i = 0; i < KILN_TYPE_COUNT; i++) {
        kiln_type t = want[i].t;
        ck_assert_str_eq(kiln_type_name(t), want[i].name);
        ck_assert_uint_eq(kiln_type_size(t), want[i].size);
        ck_assert_int_eq(kiln_type_block(t), want[i].block);
        ck_assert(kiln_type_is_quantized(t) == (want[i].block > 1));
        /* ggml_row_size: whole blocks; a partial block is 0 */
        ck_assert_uint_eq(kiln_row_size(t, 0), 0);
        ck_assert_uint_eq(kiln_row_size(t, want[i].block), want[i].size);
        ck_assert_uint_eq(kiln_row_size(t, 4096 * want[i].block), 4096 * want[i].size);
        ck_assert_uint_eq(kiln_row_size(t, -want[i].block), 0);
        if (want[i].block > 1) {
            ck_assert_uint_eq(kiln_row_size(t, want[i].block + 1), 0);
            ck_assert_uint_eq(kiln_row_size(t, want[i].block / 2), 0);
            ck_assert_uint_eq(kiln_row_size(t, 1), 0);
        }
        /* names match without regard to case, and round trip */
        kiln_type got = KILN_TYPE_COUNT;
        ck_assert_int_eq(kiln_type_from_name(want[i].name, &got), 0);
        ck_assert_int_eq(got, t);
        char upper[16], lower[16];
        for (size_t k = 0; k <= strlen(want[i].name); k++) {
            upper[k] = (char)(want[i].name[k] >= 'a' && want[i].name[k] <= 'z' ? want[i].name[k] - 32 : want[i].name[k]);
            lower[k] = (char)(want[i].name[k] >= 'A' && want[i].name[k] <= 'Z' ? want[i].name[k] + 32 : want[i].name[k]);
        }
        got = KILN_TYPE_COUNT;
        ck_assert_int_eq(kiln_type_from_name(upper, &got), 0);
        ck_assert_int_eq(got, t);
        got = KILN_TYPE_COUNT;
        ck_assert_int_eq(kiln_type_from_name(lower, &got), 0);
        ck_assert_int_eq(got, t);
    }
    /* 1 GiB of q4_K weights: sizes past 32 bits */
    ck_assert_uint_eq(kiln_row_size(KILN_Q4_K, (int64_t)256 << 30), (size_t)144 << 30);
    /* out of range */
    ck_assert_str_eq(kiln_type_name(KILN_TYPE_COUNT), "?");
    ck_assert_str_eq(kiln_type_name((kiln_type)-1), "?");
    ck_assert_uint_eq(kiln_type_size(KILN_TYPE_COUNT), 0);
    ck_assert_int_eq(kiln_type_block(KILN_TYPE_COUNT), 1);
    ck_assert(!kiln_type_is_quantized(KILN_TYPE_COUNT));
    ck_assert_uint_eq(kiln_row_size(KILN_TYPE_COUNT, 32), 0);
    /* unknown names: ggml types kiln does not have, near misses */
    static const char *unknown[] = {"q4_1", "q8_1", "q8_K", "q2_K", "iq4_xs", "q4_K_M", "q4", "q4k", "f64", "", "q8_0 ", "?"};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        kiln_type got = KILN_Q6_K;
        ck_assert_msg(kiln_type_from_name(unknown[i], &got) != 0, "'%s' is a type", unknown[i]);
        ck_assert_int_eq(got, KILN_Q6_K); /* untouched */
    }
}
END_TEST

/* ---- the frontend ------------------------------------------------------------------------------ */

START_TEST(frontend_refusals) {
    /* rows of partial blocks: the tensor, its shape and the type are named */
    ts_parse_error("weight a: q4_K[255, 4]\n", KILN_ERR_SHAPE, TS_NEEDLES("'a'", "q4_K[255, 4]", "multiple of 256"));
    ts_parse_error("weight a: q4_0[48, 4]\n", KILN_ERR_SHAPE, TS_NEEDLES("'a'", "q4_0[48, 4]", "multiple of 32"));
    ts_parse_error("weight a: q8_0[16]\n", KILN_ERR_SHAPE, TS_NEEDLES("'a'", "q8_0[16]", "34 bytes"));
    /* Quantized data is a weight's: converted to the device layout on upload. */
    ts_parse_error("input a: q8_0[32]\n", KILN_ERR_INVALID, TS_NEEDLES("'a'", "q8_0 tensor must be a weight"));
    ts_parse_error("state a: q4_K[256]\n", KILN_ERR_INVALID, TS_NEEDLES("q4_K tensor must be a weight"));
    ts_parse_error("weight a: q6_K[128, 2]\n", KILN_ERR_SHAPE, TS_NEEDLES("q6_K[128, 2]", "multiple of 256"));
    ts_parse_error("weight a: q5_K[640, 2]\n", KILN_ERR_SHAPE, TS_NEEDLES("q5_K[640, 2]", "multiple of 256"));
    /* views, permutes, transposes and reshapes that break whole blocks */
    ts_parse_error("weight a: q4_K[256, 4]\nv = view(a, [128, 4], [144], 0)\n", KILN_ERR_SHAPE,
                   TS_NEEDLES("view of 'a'", "q4_K[128, 4]"));
    ts_parse_error("weight a: q4_K[256, 4]\nv = view(a, [256, 2], [144], 72)\n", KILN_ERR_SHAPE,
                   TS_NEEDLES("offset 72", "q4_K"));
    ts_parse_error("weight a: q8_0[64, 4]\nv = view(a, [32, 4], [68], 17)\n", KILN_ERR_SHAPE, TS_NEEDLES("q8_0"));
    ts_parse_error("weight a: q8_0[64, 4]\nv = view(a, [64, 2], [51], 0)\n", KILN_ERR_SHAPE, TS_NEEDLES("q8_0"));
    ts_parse_error("weight a: q4_K[256, 4]\nv = transpose(a)\n", KILN_ERR_SHAPE,
                   TS_NEEDLES("'a'", "q4_K[4, 256]", "dim 0 must stay dim 0"));
    ts_parse_error("weight a: q4_0[32, 4, 2]\nv = permute(a, 2, 0, 1, 3)\n", KILN_ERR_SHAPE,
                   TS_NEEDLES("permute of 'a'", "q4_0"));
    ts_parse_error("weight a: q4_K[256, 4]\nv = reshape(a, [128, 8])\n", KILN_ERR_SHAPE,
                   TS_NEEDLES("reshape of 'a'", "q4_K[128, 8]"));
    /* ...and those that keep them build */
    ts_builds("weight a: q4_K[256, 4]\nv = reshape(a, [512, 2])\ninput b: f32[512]\noutput y = mul_mat(v, b)\n");
    ts_builds("weight a: q4_K[256, 4]\nv = view(a, [256, 2], [288], 144)\ninput b: f32[256]\noutput y = mul_mat(v, b)\n");
    ts_builds("weight a: q8_0[64, 4, 2]\nv = permute(a, 0, 2, 1, 3)\ninput b: f32[64, 3, 4]\noutput y = mul_mat(v, b)\n");
    /* ops that take no quantized operand */
    static const struct {
        const char *kg, *needle;
    } ops[] = {
        {"weight a: q4_K[256, 4]\ninput b: f32[256, 4]\noutput y = add(b, a)\n", "must be f32, f16 or bf16"},
        {"weight a: q4_K[256, 4]\ninput b: f32[256, 4]\noutput y = mul(a, b)\n", "must be f32, f16 or bf16"},
        {"weight a: q8_0[64, 4]\noutput y = rms_norm(a, 1e-5)\n", "'a' is q8_0[64, 4]"},
        {"weight a: q8_0[64, 4]\noutput y = cast(a, f32)\n", "'a' is q8_0[64, 4]"},
        {"input a: f32[256, 4]\noutput y = cast(a, q4_K)\n", "target type q4_K"},
        {"weight a: q8_0[64, 4]\noutput y = cont(a)\n", "q8_0[64, 4]"},
        {"weight a: q8_0[64, 4]\noutput y = dup(a)\n", "q8_0[64, 4]"},
        {"weight a: q8_0[64, 4]\noutput y = soft_max(a)\n", "q8_0[64, 4]"},
        {"weight a: q8_0[64, 4]\noutput y = sum_rows(a)\n", "q8_0[64, 4]"},
        {"weight a: q8_0[64, 4]\ninput b: f32[64, 2]\ninput i: i32[2]\noutput y = set_rows(a, b, i)\n",
         "destination 'a' (q8_0[64, 4])"},
        {"weight a: f32[64, 4]\nweight b: q8_0[64, 2]\ninput i: i32[2]\noutput y = set_rows(a, b, i)\n",
         "source 'b' (q8_0[64, 2])"},
        {"input q: f32[64, 4, 2]\nweight k: q8_0[64, 8, 2]\nweight v: q8_0[64, 8, 2]\noutput y = flash_attn_ext(q, k, v)\n",
         "q8_0[64, 8, 2]"},
        {"weight a: f32[64, 4]\nweight b: q8_0[64, 2]\noutput y = mul_mat(a, b)\n", "b 'b' (q8_0[64, 2]) must be f32"},
        {"weight a: q8_0[64, 4]\nweight b: q8_0[64, 2]\noutput y = concat(a, b, 1)\n", "q8_0[64, 4]"},
        {"weight a: q4_0[64, 4]\nweight i: q4_0[32]\noutput y = get_rows(a, i)\n", "ids 'i' (q4_0[32]) must be i32"},
        {"weight a: q4_0[64, 4]\noutput y = silu(a)\n", "q4_0[64, 4]"},
        {"weight a: q4_0[64, 4]\noutput y = scale(a, 2)\n", "q4_0[64, 4]"},
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        ts_parse_error(ops[i].kg, KILN_ERR_SHAPE, TS_NEEDLES(ops[i].needle));
}
END_TEST

/* .kg declarations of every quantized type print back byte for byte (case as ggml writes it),
 * and a lower-case q4_k reads as q4_K. */
START_TEST(kg_round_trip) {
    const char *kg = "kiln-graph 1\n"
                     "weight a: q4_K[256, 4]\n"
                     "weight b: q5_K[512, 2, 3]\n"
                     "weight c: q6_K[256]\n"
                     "weight d: q8_0[64, 4]\n"
                     "weight e: q4_0[32, 2, 2, 2]\n"
                     "input x: f32[256, 3]\n"
                     "v = view(a, [256, 2], [288], 144)\n"
                     "output y = mul_mat(v, x)\n";
    kiln_ctx *ctx = ts_parse(kg);
    char     *text = NULL;
    TS_OK(kiln_print(ctx, &text));
    ck_assert_str_eq(text, kg);
    free(text);
    kiln_ctx_free(ctx);
    ctx = ts_parse("weight a: q4_k[256, 4]\nweight b: Q8_0[32]\n");
    TS_OK(kiln_print(ctx, &text));
    ck_assert_str_eq(text, "kiln-graph 1\nweight a: q4_K[256, 4]\nweight b: q8_0[32]\n");
    free(text);
    kiln_ctx_free(ctx);
}
END_TEST

/* ---- the CPU reference with quantized weights ------------------------------------------------- */

/* Random weights of n elements quantized to t (bytes, malloc'd) and their dequantization
 * (*f32, malloc'd). */
static uint8_t *quant_weights(kiln_type t, int64_t n, uint64_t seed, float **f32) {
    float   *x = malloc((size_t)n * 4);
    uint8_t *q = malloc(kiln_row_size(t, n));
    ck_assert(x && q);
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) x[i] = (float)gaussian(&s);
    ck_assert(kb_quant_row(x, t, q, n));
    kb_dequant_row(q, t, x, n);
    *f32 = x;
    return q;
}

static float *random_f32(int64_t n, uint64_t seed) {
    float   *x = malloc((size_t)n * 4);
    uint64_t s = seed;
    ck_assert_ptr_nonnull(x);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(2 * uniform(&s) - 1);
    return x;
}

/* Runs kg_fmt (one %s: the weight's type name) twice with the CPU reference: the weight named w
 * quantized to t, and the same weight dequantized to f32 by hand. The outputs "y" are equal bit
 * for bit: the reference reads a quantized weight through the dequantizer and then does the
 * same math. inputs: a NULL-ended list of other f32 or i32 buffers. */
static void same_as_dequantized(const char *kg_fmt, kiln_type t, const char *w, int64_t wn, const ts_buf *inputs,
                                const char *what) {
    float   *wf;
    uint8_t *wq = quant_weights(t, wn, 1234 + (uint64_t)t, &wf);
    char     kg[1024];
    ts_buf   b[8];
    float   *out[2];
    int64_t  nout = 0;
    for (int pass = 0; pass < 2; pass++) {
        int k = 0;
        b[k++] = (ts_buf){.name = w, .type = pass ? KILN_F32 : t, .data = pass ? (const void *)wf : wq, .n = wn};
        for (int i = 0; inputs[i].name; i++) b[k++] = inputs[i];
        b[k++] = (ts_buf)TS_OUT("y");
        b[k] = (ts_buf){0};
        snprintf(kg, sizeof kg, kg_fmt, pass ? "f32" : kiln_type_name(t));
        ts_reference(kg, b);
        ts_buf *y = ts_buf_find(b, "y");
        ck_assert_int_eq(y->type, KILN_F32);
        ck_assert(pass == 0 || y->n == nout);
        nout = y->n;
        out[pass] = y->out;
        y->out = NULL;
    }
    for (int64_t i = 0; i < nout; i++)
        ck_assert_msg(bits_of(out[0][i]) == bits_of(out[1][i]), "%s %s: y[%lld] = %a, with f32 weights %a", what,
                      kiln_type_name(t), (long long)i, out[0][i], out[1][i]);
    /* and not all zero: the test compares something */
    bool any = false;
    for (int64_t i = 0; i < nout; i++) any = any || out[0][i] != 0;
    ck_assert_msg(any, "%s %s: all zero", what, kiln_type_name(t));
    free(out[0]);
    free(out[1]);
    free(wq);
    free(wf);
}

/* mul_mat: a [512, 5] of each type times b of C columns: C = 1 (gemv), 2..16 (small batches),
 * more than 16 (gemm). */
START_TEST(ref_mul_mat_columns) {
    kiln_type     t = QTYPES[_i];
    static const int cols[] = {1, 2, 3, 8, 16, 17, 40};
    for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++) {
        float *x = random_f32(512 * cols[c], 5 + c);
        ts_buf in[] = {{.name = "b", .type = KILN_F32, .data = x}, {0}};
        char   fmt[160], what[32];
        snprintf(fmt, sizeof fmt, "weight a: %%s[512, 5]\ninput b: f32[512, %d]\noutput y = mul_mat(a, b)\n", cols[c]);
        snprintf(what, sizeof what, "C = %d", cols[c]);
        same_as_dequantized(fmt, t, "a", 512 * 5, in, what);
        free(x);
    }
}
END_TEST

/* Batches that broadcast the weight (a [512, 3, 2, 1], b [512, 2, 4, 3]), a row view of the
 * weight (every other row from row 1), a weight viewed as [512, 3] out of [256, 6] rows by
 * reshape, and a permuted b. */
START_TEST(ref_mul_mat_layouts) {
    kiln_type t = QTYPES[_i];
    float    *x = random_f32(512 * 2 * 4 * 3, 77);
    ts_buf    in[] = {{.name = "b", .type = KILN_F32, .data = x}, {0}};
    same_as_dequantized("weight a: %s[512, 3, 2]\ninput b: f32[512, 2, 4, 3]\noutput y = mul_mat(a, b)\n", t, "a",
                        512 * 3 * 2, in, "broadcast");
    /* rows 1, 3, 5 of a [512, 6] weight: nb1 = 2 rows, offset 1 row (in each type's bytes) */
    /* (the view's strides are bytes of the weight's type, so the two graphs differ in more
     * than the type: built here rather than by same_as_dequantized) */
    size_t row = kiln_row_size(t, 512), row32 = 512 * 4;
    float   *wf;
    uint8_t *wq = quant_weights(t, 512 * 6, 9, &wf);
    float   *outs[2];
    for (int pass = 0; pass < 2; pass++) {
        char kg[256];
        snprintf(kg, sizeof kg,
                 "weight w: %s[512, 6]\na = view(w, [512, 3], [%zu], %zu)\ninput b: f32[512, 2]\n"
                 "output y = mul_mat(a, b)\n",
                 pass ? "f32" : kiln_type_name(t), 2 * (pass ? row32 : row), pass ? row32 : row);
        ts_buf b[] = {{.name = "w", .type = pass ? KILN_F32 : t, .data = pass ? (const void *)wf : wq},
                      {.name = "b", .type = KILN_F32, .data = x},
                      TS_OUT("y"),
                      {0}};
        ts_reference(kg, b);
        ts_buf *y = ts_buf_find(b, "y");
        ck_assert_int_eq(y->n, 6);
        outs[pass] = y->out;
    }
    for (int i = 0; i < 6; i++)
        ck_assert_msg(bits_of(outs[0][i]) == bits_of(outs[1][i]), "row view %s: y[%d] %a vs %a", kiln_type_name(t), i,
                      outs[0][i], outs[1][i]);
    /* and the view reads rows 1, 3, 5: y[r] = w[2r + 1] · b[:, 0] */
    for (int r = 0; r < 3; r++) {
        double s = 0;
        for (int k = 0; k < 512; k++) s += (double)wf[(2 * r + 1) * 512 + k] * x[k];
        ck_assert_msg(outs[0][r] == (float)s, "row view %s: y[%d] = %g, want %g", kiln_type_name(t), r, outs[0][r], s);
    }
    free(outs[0]);
    free(outs[1]);
    free(wq);
    free(wf);
    same_as_dequantized("weight w: %s[512, 6]\na = reshape(w, [1024, 3])\ninput b: f32[1024, 2]\n"
                        "output y = mul_mat(a, b)\n", t, "w", 512 * 6, in, "reshape");
    same_as_dequantized("weight a: %s[512, 4]\ninput x: f32[3, 512]\nb = transpose(x)\n"
                        "output y = mul_mat(a, b)\n", t, "a", 512 * 4, (ts_buf[]){{.name = "x", .type = KILN_F32, .data = x}, {0}},
                        "transposed b");
    free(x);
}
END_TEST

/* mul_mat_id with quantized experts: 4 experts [512, 3], 2 used per token, 3 tokens. */
START_TEST(ref_mul_mat_id) {
    kiln_type     t = QTYPES[_i];
    float        *x = random_f32(512 * 2 * 3, 31);
    const int32_t ids[6] = {3, 0, 1, 3, 2, 2};
    ts_buf        in[] = {{.name = "x", .type = KILN_F32, .data = x},
                          {.name = "ids", .type = KILN_I32, .data = ids},
                          {0}};
    same_as_dequantized("weight as: %s[512, 3, 4]\ninput x: f32[512, 2, 3]\ninput ids: i32[2, 3]\n"
                        "output y = mul_mat_id(as, x, ids)\n", t, "as", 512 * 3 * 4, in, "mul_mat_id");
    /* one activation row shared by the used experts (b.ne1 = 1) */
    same_as_dequantized("weight as: %s[512, 3, 4]\ninput x: f32[512, 1, 3]\ninput ids: i32[2, 3]\n"
                        "output y = mul_mat_id(as, x, ids)\n", t, "as", 512 * 3 * 4, in, "mul_mat_id shared");
    free(x);
}
END_TEST

/* b rounded as the GPU's int8 GEMVs round the activations (per 32: q = round(x·127/max), times
 * max/127), written out here independently of ir/ref_matmul.c. */
static float *round_like_gpu(const float *x, int64_t n) {
    float *r = malloc((size_t)n * sizeof *r);
    ck_assert_ptr_nonnull(r);
    for (int64_t b = 0; b < n; b += 32) {
        float m = 0;
        for (int i = 0; i < 32; i++) m = fmaxf(m, fabsf(x[b + i]));
        for (int i = 0; i < 32; i++) r[b + i] = m > 0 ? rintf(x[b + i] * (127.0f / m)) * (m * (1.0f / 127.0f)) : 0.0f;
    }
    return r;
}

/* One run of kg ("%s": the weight's type) with weight a of type t (q, or f32 f) and input b. */
static float *ref_run(const char *fmt, const char *bshape, kiln_type t, const void *w, int64_t wn, const float *b,
                      const int32_t *ids, int64_t *n) {
    char kg[256];
    snprintf(kg, sizeof kg, fmt, kiln_type_name(t), bshape);
    ts_buf bufs[] = {{.name = "a", .type = t, .data = w, .n = wn},
                     {.name = "b", .type = KILN_F32, .data = b},
                     {.name = "ids", .type = KILN_I32, .data = ids},
                     TS_OUT("y"),
                     {0}};
    if (!ids) bufs[2] = bufs[3], bufs[3] = (ts_buf){0};
    ts_reference(kg, bufs);
    ts_buf *y = ts_buf_find(bufs, "y");
    float  *out = y->out;
    *n = y->n, y->out = NULL;
    return out;
}

/* KILN_REF_Q8=1: a quantized weight's mul_mat and mul_mat_id take b rounded as the GPU's int8
 * GEMVs do (bit for bit the f32 weight's product with b rounded by hand), which changes the
 * result; an f32 weight's product does not change. */
START_TEST(ref_q8_activations) {
    static const char *const kg[2] = {
        "weight a: %s[64, 3]\ninput b: f32[%s]\noutput y = mul_mat(a, b)\n",
        "weight a: %s[64, 3, 4]\ninput b: f32[%s]\ninput ids: i32[2, 3]\noutput y = mul_mat_id(a, b, ids)\n"};
    static const char *const bshape[2] = {"64, 2", "64, 2, 3"};
    const int32_t ids[6] = {3, 0, 1, 3, 2, 2};
    for (int op = 0; op < 2; op++) {
        int64_t  wn = op ? 64 * 3 * 4 : 64 * 3, bn = op ? 64 * 6 : 64 * 2, n[4];
        float   *wf, *x = random_f32(bn, 91 + op), *xr = round_like_gpu(x, bn);
        uint8_t *wq = quant_weights(KILN_Q8_0, wn, 17 + op, &wf);
        const int32_t *id = op ? ids : NULL;
        setenv("KILN_REF_Q8", "1", 1);
        float *q8 = ref_run(kg[op], bshape[op], KILN_Q8_0, wq, wn, x, id, &n[0]);
        float *f32 = ref_run(kg[op], bshape[op], KILN_F32, wf, wn, x, id, &n[1]);
        unsetenv("KILN_REF_Q8");
        float *hand = ref_run(kg[op], bshape[op], KILN_F32, wf, wn, xr, id, &n[2]);
        float *exact = ref_run(kg[op], bshape[op], KILN_Q8_0, wq, wn, x, id, &n[3]);
        bool   differs = false;
        for (int64_t i = 0; i < n[0]; i++) {
            ck_assert_msg(bits_of(q8[i]) == bits_of(hand[i]), "op %d: y[%lld] = %a, by hand %a", op, (long long)i, q8[i],
                          hand[i]);
            ck_assert_msg(bits_of(f32[i]) == bits_of(exact[i]), "op %d: f32 weight y[%lld] = %a changed by KILN_REF_Q8 "
                          "(%a)", op, (long long)i, f32[i], exact[i]);
            differs = differs || q8[i] != exact[i];
        }
        ck_assert_msg(differs, "op %d: KILN_REF_Q8 changed nothing", op);
        free(q8), free(f32), free(hand), free(exact), free(x), free(xr), free(wq), free(wf);
    }
}
END_TEST

/* get_rows of a quantized embedding: the rows come back as ggml dequantizes them, exactly. */
START_TEST(ref_get_rows) {
    kiln_type     t = QTYPES[_i];
    const int32_t ids[5] = {7, 0, 3, 7, 2};
    ts_buf        in[] = {{.name = "ids", .type = KILN_I32, .data = ids}, {0}};
    same_as_dequantized("weight emb: %s[512, 8]\ninput ids: i32[5]\noutput y = get_rows(emb, ids)\n", t, "emb",
                        512 * 8, in, "get_rows");
    /* batched: emb [256, 4, 2], ids [3, 2]: matrix k's rows ids[:, k] */
    const int32_t ids2[6] = {3, 0, 3, 1, 2, 0};
    ts_buf        in2[] = {{.name = "ids", .type = KILN_I32, .data = ids2}, {0}};
    same_as_dequantized("weight emb: %s[256, 4, 2]\ninput ids: i32[3, 2]\noutput y = get_rows(emb, ids)\n", t, "emb",
                        256 * 8, in2, "get_rows batched");
    /* and the values themselves */
    float   *wf;
    uint8_t *wq = quant_weights(t, 512 * 8, 1234 + (uint64_t)t, &wf);
    ts_buf   b[] = {{.name = "emb", .type = t, .data = wq}, {.name = "ids", .type = KILN_I32, .data = ids}, TS_OUT("y"), {0}};
    char     kg[128];
    snprintf(kg, sizeof kg, "weight emb: %s[512, 8]\ninput ids: i32[5]\noutput y = get_rows(emb, ids)\n",
             kiln_type_name(t));
    ts_reference(kg, b);
    const float *y = ts_buf_find(b, "y")->out;
    for (int r = 0; r < 5; r++)
        for (int k = 0; k < 512; k++)
            ck_assert_msg(bits_of(y[r * 512 + k]) == bits_of(wf[ids[r] * 512 + k]), "get_rows %s: row %d [%d]",
                          kiln_type_name(t), r, k);
    ts_buf_free(b);
    free(wq);
    free(wf);
}
END_TEST

/* ---- the GPU kernels of quantized weights, generated and compiled by NVRTC (no GPU) ---- */

static char *g_cache;

static const kiln_type KTYPES[] = {KILN_Q8_0, KILN_Q4_0, KILN_Q4_K, KILN_Q5_K, KILN_Q6_K, KILN_MXFP4, KILN_Q5_0, KILN_Q5_1};

/* Compiles kg for sm_90a and sm_80: every kernel NVRTC-clean, and kernel 0 named `first`. */
static void compile_case(const char *kg, const char *first, const char *what) {
    static const char *archs[2] = {"sm_90a", "sm_80"};
    for (int a = 0; a < 2; a++) {
        kiln_ctx     *ctx;
        kiln_graph   *g;
        kiln_program *p = ts_compile(kg, archs[a], g_cache, 0, &ctx, &g);
        ck_assert_msg(kiln_program_kernel_count(p) >= 1, "%s: no kernel", what);
        const char *name = kiln_program_kernel_name(p, 0);
        ck_assert_msg(strncmp(name, first, strlen(first)) == 0, "%s (%s): first kernel %s, want %s...", what, archs[a], name,
                      first);
        for (int k = 0; k < kiln_program_kernel_count(p); k++)
            ts_nvrtc_clean(kiln_program_kernel_source(p, k), kiln_program_kernel_name(p, k), archs[a]);
        ts_compiled_free(p, g, ctx);
    }
}

/* Every plan a quantized weight takes (templates/quant.lua, matmul.lua): the fused gemv (plain,
 * odd rows through a row view, batches of weights), the f16 dequantization before the tile and
 * cuBLAS plans (4 and 40 columns, broadcast batches with b transposed), get_rows. */
START_TEST(kernels_compile) {
    kiln_type   t = KTYPES[_i];
    const char *tn = kiln_type_name(t);
    size_t      row256 = kiln_row_size(t, 256);
    char        kg[512], first[64], what[96];
#define CASE(label, pfx, ...)                                                                                          \
    do {                                                                                                               \
        snprintf(kg, sizeof kg, __VA_ARGS__);                                                                          \
        snprintf(first, sizeof first, pfx, tn);                                                                        \
        snprintf(what, sizeof what, "%s %s", tn, label);                                                               \
        compile_case(kg, first, what);                                                                                 \
    } while (0)
    CASE("gemv", "mul_mat_qgemv_%s_2048x40", "weight a: %s[2048, 40]\ninput b: f32[2048]\noutput y = mul_mat(a, b)\n", tn);
    CASE("gemv, row view, odd M", "mul_mat_qgemv_%s_256x37",
         "weight w: %s[256, 40]\ninput b: f32[256]\na = view(w, [256, 37], [%zu], %zu)\noutput y = mul_mat(a, b)\n", tn,
         row256, 2 * row256);
    CASE("gemv, batched weights", "mul_mat_qgemv_%s_768x24x3",
         "weight a: %s[768, 24, 3]\ninput b: f32[768, 1, 3]\noutput y = mul_mat(a, b)\n", tn);
    /* 2 .. 64 columns: the quantized tensor-core tile (templates/qmma.lua: b packed first) for
     * every type but mxfp4; mxfp4 and more columns: the f16 dequantization, then cuBLAS */
    const bool  tile = t != KILN_MXFP4;
    const char *few = tile ? "mul_mat_qpk_" : "mul_mat_dq_%s";
    CASE("4 columns", few, "weight a: %s[1024, 48]\ninput b: f32[1024, 4]\noutput y = mul_mat(a, b)\n", tn);
    CASE("40 columns", few, "weight a: %s[1024, 48]\ninput b: f32[1024, 40]\noutput y = mul_mat(a, b)\n", tn);
    CASE("64 columns, split K", few, "weight a: %s[14336, 40]\ninput b: f32[14336, 64]\noutput y = mul_mat(a, b)\n", tn);
    CASE("100 columns", "mul_mat_dq_%s", "weight a: %s[1024, 48]\ninput b: f32[1024, 100]\noutput y = mul_mat(a, b)\n", tn);
    CASE("broadcast batches", "mul_mat_dq_%s",
         "weight a: %s[512, 24, 2]\ninput bt: f32[3, 512, 4]\nb = transpose(bt)\noutput y = mul_mat(a, b)\n", tn);
    CASE("get_rows", "get_rows_%s_512", "weight a: %s[512, 50]\ninput ids: i32[9]\noutput y = get_rows(a, ids)\n", tn);
    /* pass mul_mat_glu: one gemv of both weights with the GLU at the store (one column); the
     * epilogue fallback (4 columns: each product through the tile or the dequantization, then the GLU) */
    CASE("glu gemv", "mul_mat_qgemv_pair_%s_1024x96",
         "weight g: %s[1024, 96]\nweight u: %s[1024, 96]\ninput x: f32[1024]\na = mul_mat(g, x)\nb = mul_mat(u, x)\n"
         "output y = swiglu(a, b)\n", tn, tn);
    CASE("glu, 4 columns", few,
         "weight g: %s[1024, 96]\nweight u: %s[1024, 96]\ninput x: f32[1024, 4]\na = mul_mat(g, x)\nb = mul_mat(u, x)\n"
         "output y = swiglu(a, b)\n", tn, tn);
    /* mul_mat_glu on quantized experts: the paired expert gemv (one token), and the fallback
     * (80 pairs over 40 tokens of 16 experts: each product dequantized, then the GLU) */
    CASE("expert glu gemv", "mul_mat_id_qgemv_pair_%s_k512_m96_u2",
         "weight g: %s[512, 96, 16]\nweight u: %s[512, 96, 16]\ninput x: f32[512, 1, 1]\ninput ids: i32[2, 1]\n"
         "a = mul_mat_id(g, x, ids)\nb = mul_mat_id(u, x, ids)\noutput y = swiglu(a, b)\n", tn, tn);
    CASE("expert glu, 40 tokens", "mul_mat_id_dq_%s",
         "weight g: %s[512, 96, 16]\nweight u: %s[512, 96, 16]\ninput x: f32[512, 1, 40]\ninput ids: i32[2, 40]\n"
         "a = mul_mat_id(g, x, ids)\nb = mul_mat_id(u, x, ids)\noutput y = swiglu(a, b)\n", tn, tn);
    /* pass add_chain: the residual add applied at the gemv's store */
    CASE("residual add", "mul_mat_qgemv_%s_512x64",
         "weight w: %s[512, 64]\ninput x: f32[512]\ninput h: f32[64]\nm = mul_mat(w, x)\noutput y = add(m, h)\n", tn);
#undef CASE
}
END_TEST

static void cache_setup(void) { g_cache = ts_tmpdir(); }
static void cache_teardown(void) { ts_tmpdir_free(g_cache); }

int main(void) {
    Suite *s = TS_SUITE("quant",
                        TS_CASE_FIXTURE("kernels", 120, cache_setup, cache_teardown),
                        TS_LOOP(0, (int)(sizeof KTYPES / sizeof KTYPES[0]), kernels_compile),
                        TS_CASE("dequant", 0), TS_LOOP(0, (int)(sizeof qv_cases / sizeof qv_cases[0]), dequant_vectors),
                        TS_TESTS(codec_refusals), TS_LOOP(0, 6, device_layout),
                        TS_CASE("quantizer", 60), TS_LOOP(0, NQ, quant_random_rows, quant_structured_rows),
                        TS_LOOP(0, 2, quant_idempotent), TS_TESTS(fill_random_quantized),
                        TS_CASE("api", 0), TS_TESTS(type_table, frontend_refusals, kg_round_trip),
                        TS_CASE("reference", 60),
                        TS_LOOP(0, NQ, ref_mul_mat_columns, ref_mul_mat_layouts, ref_mul_mat_id, ref_get_rows),
                        TS_TESTS(ref_q8_activations));
    return ts_main(s);
}
