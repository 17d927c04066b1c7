/* The element types (one table) and the codec of the quantized ones: ggml's block layouts
 * (ggml/src/ggml-common.h), dequantization that gives the same floats as ggml's
 * dequantize_row_* (ggml/src/ggml-quants.c: the same formulas in the same order of operations,
 * so a C compiler that does not contract a*b-c into an fma gives bit-identical results; kiln
 * builds as ISO C11, where GCC does not contract), and kiln's own quantizers.
 *
 * Block layouts (byte offsets; f16 values little-endian):
 *   q8_0  34 B / 32:  d f16 @0, qs int8[32] @2                    x = qs[j] * d
 *   q4_0  18 B / 32:  d f16 @0, qs u8[16] @2                      x[j] = (lo(qs[j]) - 8) * d,
 *                                                                 x[j + 16] = (hi(qs[j]) - 8) * d
 *   q5_0  22 B / 32:  d f16 @0, qh u32 @2, qs u8[16] @6            x[j] = ((lo(qs[j]) | bit j of qh << 4) - 16) * d,
 *                                                                 x[j + 16] = ((hi(qs[j]) | bit j + 16 << 4) - 16) * d
 *   q5_1  24 B / 32:  d f16 @0, m f16 @2, qh u32 @4, qs u8[16] @8  as q5_0 without the -16, x = q * d + m
 *   q4_K 144 B / 256: d @0, dmin @2, scales[12] @4, qs[128] @16   8 sub-blocks of 32 with a 6-bit
 *                     scale and min each: x = d*sc * q - dmin*m
 *   q5_K 176 B / 256: d @0, dmin @2, scales[12] @4, qh[32] @16, qs[128] @48: q4_K plus a fifth
 *                     bit per element in qh
 *   q6_K 210 B / 256: ql[128] @0, qh[64] @128, scales int8[16] @192, d @208: 16 sub-blocks of 16,
 *                     x = d * sc * (q - 32), q 6-bit (4 low bits in ql, 2 high in qh)
 *   mxfp4 17 B / 32:  e u8 @0, qs u8[16] @1                       x[j] = kv[lo(qs[j])] * 2^(e - 128),
 *                                                                 x[j + 16] = kv[hi(qs[j])] * 2^(e - 128),
 *                     kv = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, ..., -12}: twice the E2M1 (FP4) values,
 *                     hence half of the E8M0 scale 2^(e - 127) (ggml's GGML_E8M0_TO_FP32_HALF) */
#include "base.h"

#include <ctype.h>
#include <math.h>
#include <string.h>
#include <strings.h>

typedef struct {
    const char *name;
    int64_t     block;
    size_t      size;
} type_info;

static const type_info types[KILN_TYPE_COUNT] = {
    [KILN_F32] = {"f32", 1, 4},       [KILN_F16] = {"f16", 1, 2},       [KILN_BF16] = {"bf16", 1, 2},
    [KILN_I32] = {"i32", 1, 4},       [KILN_I64] = {"i64", 1, 8},       [KILN_Q8_0] = {"q8_0", 32, 34},
    [KILN_Q4_0] = {"q4_0", 32, 18},   [KILN_Q4_K] = {"q4_K", 256, 144}, [KILN_Q5_K] = {"q5_K", 256, 176},
    [KILN_Q6_K] = {"q6_K", 256, 210}, [KILN_MXFP4] = {"mxfp4", 32, 17},   [KILN_Q5_0] = {"q5_0", 32, 22},
    [KILN_Q5_1] = {"q5_1", 32, 24},
};

const char *kiln_type_name(kiln_type t) { return (unsigned)t < KILN_TYPE_COUNT ? types[t].name : "?"; }
size_t      kiln_type_size(kiln_type t) { return (unsigned)t < KILN_TYPE_COUNT ? types[t].size : 0; }
int64_t     kiln_type_block(kiln_type t) { return (unsigned)t < KILN_TYPE_COUNT ? types[t].block : 1; }
bool        kiln_type_is_quantized(kiln_type t) { return kiln_type_block(t) > 1; }

size_t kiln_row_size(kiln_type t, int64_t n) {
    int64_t b = kiln_type_block(t);
    if ((unsigned)t >= KILN_TYPE_COUNT || n < 0 || n % b != 0) return 0;
    return (size_t)(n / b) * types[t].size;
}

int kiln_type_from_name(const char *name, kiln_type *out) {
    for (int i = 0; i < KILN_TYPE_COUNT; i++) {
        if (strcasecmp(types[i].name, name) == 0) {
            *out = (kiln_type)i;
            return 0;
        }
    }
    return -1;
}

/* ---- dequantization ----------------------------------------------------------------------- */

static float half_at(const uint8_t *p) { return kb_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

static void put_half(uint8_t *p, float v) {
    uint16_t h = kb_f32_to_f16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j (0..7) of a q4_K/q5_K block
 * from its 12 packed bytes (j < 4: low 6 bits of bytes j and j+4; j >= 4: a nibble of byte j+4
 * and the top 2 bits of bytes j-4 and j). */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static float elem_q8_0(const uint8_t *b, int j) { return (float)(int8_t)b[2 + j] * half_at(b); }

static float elem_q4_0(const uint8_t *b, int j) {
    uint8_t q = b[2 + j % 16];
    int     v = (j < 16 ? q & 0xF : q >> 4) - 8;
    return (float)v * half_at(b);
}

/* q5_0 and q5_1: the low four bits as q4_0's (byte j % 16, low nibble for j < 16), the fifth
 * bit j of the little-endian word qh (ggml: (qh >> j) << 4 & 0x10 and (qh >> (j + 12)) & 0x10). */
static int q5_value(const uint8_t *qh, const uint8_t *qs, int j) {
    uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    uint8_t  q = qs[j % 16];
    return (j < 16 ? q & 0xF : q >> 4) | (int)((h >> j) & 1) << 4;
}

static float elem_q5_0(const uint8_t *b, int j) { return (float)(q5_value(b + 2, b + 6, j) - 16) * half_at(b); }

/* ggml: x0*d + m, as one multiply then one add (ISO C: not contracted into an fma). */
static float elem_q5_1(const uint8_t *b, int j) {
    float p = (float)q5_value(b + 4, b + 8, j) * half_at(b);
    return p + half_at(b + 2);
}

/* q4_K and q5_K share the sub-block layout: element j is in 64-element chunk j / 64, sub-block
 * 2·chunk + (high nibble), byte l = j % 32 of the chunk's 32 bytes of qs. */
static float elem_qk(const uint8_t *b, int j, const uint8_t *qs, const uint8_t *qh) {
    int     chunk = j / 64, hi = (j % 64) >= 32, l = j % 32;
    uint8_t sc, m;
    scale_min_k4(2 * chunk + hi, b + 4, &sc, &m);
    float   d1 = half_at(b) * sc, m1 = half_at(b + 2) * m;
    uint8_t byte = qs[32 * chunk + l];
    int     q = hi ? byte >> 4 : byte & 0xF;
    if (qh && (qh[l] & (1u << (2 * chunk + hi)))) q += 16;
    return d1 * (float)q - m1;
}

static float elem_q4_K(const uint8_t *b, int j) { return elem_qk(b, j, b + 16, NULL); }
static float elem_q5_K(const uint8_t *b, int j) { return elem_qk(b, j, b + 48, b + 16); }

/* q6_K: each 128-element half has 64 bytes of ql, 32 of qh and 8 scales; its four 32-element
 * quarters take the low nibbles of ql[0..31], of ql[32..63], then the high nibbles, and bit
 * pairs 0, 2, 4, 6 of qh. */
static float elem_q6_K(const uint8_t *b, int j) {
    int            half = j / 128, r = j % 128, quarter = r / 32, l = r % 32;
    const uint8_t *ql = b + 64 * half, *qh = b + 128 + 32 * half;
    const int8_t  *sc = (const int8_t *)(b + 192) + 8 * half;
    uint8_t        lo = ql[l + (quarter & 1) * 32];
    int            q = ((quarter < 2 ? lo & 0xF : lo >> 4) | (((qh[l] >> (2 * quarter)) & 3) << 4)) - 32;
    float          d = half_at(b + 208);
    return d * (float)sc[l / 16 + 2 * quarter] * (float)q;
}

/* ggml's kvalues_mxfp4 and GGML_E8M0_TO_FP32_HALF: 2^(e - 128) (e 0 and 1 are subnormals). */
static const int8_t mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static float e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float    f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static float elem_mxfp4(const uint8_t *b, int j) {
    uint8_t q = b[1 + j % 16];
    return (float)mxfp4_values[j < 16 ? q & 0xF : q >> 4] * e8m0_half(b[0]);
}

typedef float (*elem_fn)(const uint8_t *block, int j);

static elem_fn elem_of(kiln_type t) {
    switch (t) {
    case KILN_Q8_0: return elem_q8_0;
    case KILN_Q4_0: return elem_q4_0;
    case KILN_Q5_0: return elem_q5_0;
    case KILN_Q5_1: return elem_q5_1;
    case KILN_Q4_K: return elem_q4_K;
    case KILN_Q5_K: return elem_q5_K;
    case KILN_Q6_K: return elem_q6_K;
    case KILN_MXFP4: return elem_mxfp4;
    default: return NULL;
    }
}

float kb_dequant_elem(const void *p, kiln_type t, int64_t i) {
    elem_fn f = elem_of(t);
    if (!f) return NAN;
    int64_t b = types[t].block;
    return f((const uint8_t *)p + (size_t)(i / b) * types[t].size, (int)(i % b));
}

void kb_dequant_row(const void *p, kiln_type t, float *y, int64_t n) {
    elem_fn f = elem_of(t);
    int64_t b = kiln_type_block(t);
    for (int64_t i = 0; i < n; i++) y[i] = f ? f((const uint8_t *)p + (size_t)(i / b) * types[t].size, (int)(i % b)) : NAN;
}

/* ---- quantization (kiln's own) ------------------------------------------------------------ */

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

static void quant_q8_0(const float *x, uint8_t *b) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127, id = d > 0 ? 1 / d : 0;
    put_half(b, d);
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)clampi((int)lrintf(x[j] * id), -127, 127);
}

/* The value of largest magnitude maps to -8 (the scale takes its sign), so the 16 levels
 * -8..7 cover [-|max|, |max|·7/8] on the side where it matters. */
static void quant_q4_0(const float *x, uint8_t *b) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    float d = max / -8, id = d != 0 ? 1 / d : 0;
    put_half(b, d);
    for (int j = 0; j < 16; j++) {
        int lo = clampi((int)lrintf(x[j] * id) + 8, 0, 15), hi = clampi((int)lrintf(x[j + 16] * id) + 8, 0, 15);
        b[2 + j] = (uint8_t)(lo | hi << 4);
    }
}

/* The 5-bit codes q[32] into a q5_0/q5_1 block's qh (at qh) and qs (at qs). */
static void put_q5(const int q[32], uint8_t *qh, uint8_t *qs) {
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0xF) | (q[j + 16] & 0xF) << 4);
        h |= (uint32_t)(q[j] >> 4) << j | (uint32_t)(q[j + 16] >> 4) << (j + 16);
    }
    for (int i = 0; i < 4; i++) qh[i] = (uint8_t)(h >> (8 * i));
}

/* q5_0: as q4_0 with 32 levels, the value of largest magnitude at -16; the elements are rounded
 * against the stored (f16) scale. */
static void quant_q5_0(const float *x, uint8_t *b) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    put_half(b, max / -16);
    float d = half_at(b), id = d != 0 ? 1 / d : 0;
    int   q[32];
    for (int j = 0; j < 32; j++) q[j] = clampi((int)lrintf(x[j] * id) + 16, 0, 31);
    put_q5(q, b + 2, b + 6);
}

/* q5_1: the block's [min, max] onto 0..31, x = d·q + m with m = min; the elements are rounded
 * against the stored (f16) d and m. */
static void quant_q5_1(const float *x, uint8_t *b) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; j++) {
        lo = fminf(lo, x[j]);
        hi = fmaxf(hi, x[j]);
    }
    put_half(b, (hi - lo) / 31);
    put_half(b + 2, lo);
    float d = half_at(b), m = half_at(b + 2), id = d != 0 ? 1 / d : 0;
    int   q[32];
    for (int j = 0; j < 32; j++) q[j] = clampi((int)lrintf((x[j] - m) * id), 0, 31);
    put_q5(q, b + 4, b + 8);
}

/* Packs the 6-bit scales and mins of 8 sub-blocks as scale_min_k4 unpacks them. */
static void pack_scale_min_k4(const uint8_t sc[8], const uint8_t m[8], uint8_t q[12]) {
    memset(q, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            q[j] |= sc[j];
            q[j + 4] |= m[j];
        } else {
            q[j + 4] = (uint8_t)((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
            q[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            q[j] |= (uint8_t)((m[j] >> 4) << 6);
        }
    }
}

/* Squared error of the 32 elements x rounded against a sub-block's step and offset
 * (x ≈ step·q − off, q in 0..nmax), as the quantizer rounds them. */
static float qk_sub_err(const float *x, float step, float off, int nmax) {
    float e = 0;
    for (int j = 0; j < 32; j++) {
        int   q = step > 0 ? clampi((int)lrintf((x[j] + off) / step), 0, nmax) : 0;
        float d = step * (float)q - off - x[j];
        e += d * d;
    }
    return e;
}

/* q4_K (nmax 15) and q5_K (nmax 31): each 32-element sub-block gets the affine map of its
 * [min(0, lo), hi] range onto 0..nmax; the 8 scales and 8 mins are then quantized to 6 bits
 * against the block's largest. Rounding each 6-bit scale and min to nearest leaves a step up to
 * half a unit of d off, which on a sub-block with a small scale is a large part of it, so each
 * sub-block keeps the pair among the 3 × 3 nearest codes that gives its elements the least
 * squared error; the elements are then rounded against the quantized pair. */
static void quant_qk(const float *x, uint8_t *b, int nmax, uint8_t *qs, uint8_t *qh) {
    float scale[8], mn[8], max_scale = 0, max_min = 0;
    for (int s = 0; s < 8; s++) {
        float lo = 0, hi = x[32 * s];
        for (int j = 0; j < 32; j++) {
            lo = fminf(lo, x[32 * s + j]);
            hi = fmaxf(hi, x[32 * s + j]);
        }
        scale[s] = hi > lo ? (hi - lo) / (float)nmax : 0;
        mn[s] = -lo;
        max_scale = fmaxf(max_scale, scale[s]);
        max_min = fmaxf(max_min, mn[s]);
    }
    float d = max_scale / 63, dmin = max_min / 63;
    put_half(b, d);
    put_half(b + 2, dmin);
    float   dq = half_at(b), mq = half_at(b + 2);
    uint8_t sc[8], m[8];
    for (int s = 0; s < 8; s++) {
        int   sc0 = d > 0 ? clampi((int)lrintf(scale[s] / d), 0, 63) : 0;
        int   m0 = dmin > 0 ? clampi((int)lrintf(mn[s] / dmin), 0, 63) : 0;
        float best = INFINITY; /* (a NaN error keeps the nearest codes) */
        sc[s] = (uint8_t)sc0;
        m[s] = (uint8_t)m0;
        for (int a = clampi(sc0 - 1, 0, 63); a <= clampi(sc0 + 1, 0, 63); a++)
            for (int c = clampi(m0 - 1, 0, 63); c <= clampi(m0 + 1, 0, 63); c++) {
                float e = qk_sub_err(x + 32 * s, dq * (float)a, mq * (float)c, nmax);
                if (e < best) {
                    best = e;
                    sc[s] = (uint8_t)a;
                    m[s] = (uint8_t)c;
                }
            }
    }
    pack_scale_min_k4(sc, m, b + 4);
    if (qh) memset(qh, 0, 32);
    memset(qs, 0, 128);
    for (int j = 0; j < 256; j++) {
        int   s = j / 32, chunk = j / 64, hi = s & 1, l = j % 32;
        float step = dq * sc[s], off = mq * m[s];
        int   q = step > 0 ? clampi((int)lrintf((x[j] + off) / step), 0, nmax) : 0;
        qs[32 * chunk + l] |= (uint8_t)((q & 0xF) << (hi ? 4 : 0));
        if (qh && q > 15) qh[l] |= (uint8_t)(1u << (2 * chunk + hi));
    }
}

static void quant_q4_K(const float *x, uint8_t *b) { quant_qk(x, b, 15, b + 16, NULL); }
static void quant_q5_K(const float *x, uint8_t *b) { quant_qk(x, b, 31, b + 48, b + 16); }

/* Squared error of the 16 elements x rounded against a q6_K sub-block step (q in -32..31). */
static float q6_sub_err(const float *x, float step) {
    float e = 0;
    for (int j = 0; j < 16; j++) {
        int   q = step != 0 ? clampi((int)lrintf(x[j] / step), -32, 31) : 0;
        float d = step * (float)q - x[j];
        e += d * d;
    }
    return e;
}

/* q6_K: each 16-element sub-block's value of largest magnitude maps to -32 (its scale takes the
 * sign, so the 64 levels -32..31 reach it on the side where it is; the other side ends at 31).
 * The scales are int8 against the block's largest (d = max / 127); each sub-block keeps the code
 * among the 3 nearest that gives its elements the least squared error, and the elements are
 * rounded against the quantized scale. */
static void quant_q6_K(const float *x, uint8_t *b) {
    float scale[16], max_scale = 0;
    for (int s = 0; s < 16; s++) {
        float amax = 0, max = 0;
        for (int j = 0; j < 16; j++)
            if (fabsf(x[16 * s + j]) > amax) {
                amax = fabsf(x[16 * s + j]);
                max = x[16 * s + j];
            }
        scale[s] = max / -32;
        max_scale = fmaxf(max_scale, amax / 32);
    }
    float d = max_scale / 127;
    put_half(b + 208, d);
    float   dq = half_at(b + 208);
    int8_t *sc = (int8_t *)(b + 192);
    for (int s = 0; s < 16; s++) {
        int   c0 = d > 0 ? clampi((int)lrintf(scale[s] / d), -128, 127) : 0;
        float best = INFINITY; /* (a NaN error keeps the nearest code) */
        sc[s] = (int8_t)c0;
        for (int c = clampi(c0 - 1, -128, 127); c <= clampi(c0 + 1, -128, 127); c++) {
            float e = q6_sub_err(x + 16 * s, dq * (float)c);
            if (e < best) {
                best = e;
                sc[s] = (int8_t)c;
            }
        }
    }
    memset(b, 0, 192);
    for (int j = 0; j < 256; j++) {
        int      half = j / 128, r = j % 128, quarter = r / 32, l = r % 32;
        float    step = dq * (float)sc[l / 16 + 2 * quarter + 8 * half];
        int      q = (step != 0 ? clampi((int)lrintf(x[j] / step), -32, 31) : 0) + 32;
        uint8_t *ql = b + 64 * half + (quarter & 1) * 32, *qh = b + 128 + 32 * half;
        ql[l] |= (uint8_t)((q & 0xF) << (quarter < 2 ? 0 : 4));
        qh[l] |= (uint8_t)((q >> 4) << (2 * quarter));
    }
}

/* The code of kv nearest to v (v in units of the scale; ties to the smaller magnitude). */
static int mxfp4_code(float v) {
    int   best = 0;
    float err = INFINITY;
    for (int c = 0; c < 16; c++) {
        float e = fabsf(v - (float)mxfp4_values[c]);
        if (e < err) {
            err = e;
            best = c;
        }
    }
    return best;
}

/* Squared error of a block's 32 elements coded against scale exponent e (codes into qs). */
static float mxfp4_try(const float *x, uint8_t e, uint8_t qs[16]) {
    float d = e8m0_half(e), err = 0;
    for (int j = 0; j < 16; j++) {
        int lo = mxfp4_code(x[j] / d), hi = mxfp4_code(x[j + 16] / d);
        qs[j] = (uint8_t)(lo | hi << 4);
        float a = x[j] - (float)mxfp4_values[lo] * d, b = x[j + 16] - (float)mxfp4_values[hi] * d;
        err += a * a + b * b;
    }
    return err;
}

/* mxfp4: the smallest scale 2^(e - 128) at which the largest magnitude fits under 12 (the
 * largest code), or the one below it (finer steps, the largest clipped to 12), whichever codes
 * the block with the less squared error; each element takes its nearest code. */
static void quant_mxfp4(const float *x, uint8_t *b) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    int ex = 0;
    float m = amax > 0 ? frexpf(amax / 12, &ex) : 0; /* amax / 12 = m 2^ex, m in [0.5, 1) */
    int   e = amax > 0 ? 128 + (m > 0.5f ? ex : ex - 1) : 0; /* 2^(e - 128) >= amax / 12 */
    e = clampi(e, 1, 254);
    uint8_t qa[16], qb[16];
    float   ea = mxfp4_try(x, (uint8_t)e, qa), eb = mxfp4_try(x, (uint8_t)(e - 1), qb);
    bool    lower = eb < ea;
    b[0] = (uint8_t)(lower ? e - 1 : e);
    memcpy(b + 1, lower ? qb : qa, 16);
}

typedef void (*quant_fn)(const float *x, uint8_t *block);

static quant_fn quant_of(kiln_type t) {
    switch (t) {
    case KILN_Q8_0: return quant_q8_0;
    case KILN_Q4_0: return quant_q4_0;
    case KILN_Q5_0: return quant_q5_0;
    case KILN_Q5_1: return quant_q5_1;
    case KILN_Q4_K: return quant_q4_K;
    case KILN_Q5_K: return quant_q5_K;
    case KILN_Q6_K: return quant_q6_K;
    case KILN_MXFP4: return quant_mxfp4;
    default: return NULL;
    }
}

bool kb_quant_row(const float *x, kiln_type t, void *p, int64_t n) {
    quant_fn f = quant_of(t);
    int64_t  b = kiln_type_block(t);
    if (!f || n % b != 0) return false;
    for (int64_t i = 0; i < n / b; i++) f(x + i * b, (uint8_t *)p + (size_t)i * types[t].size);
    return true;
}

/* ---- the device layout (templates/quant.lua) ---------------------------------------------- */

/* Bytes of a block besides its scale, which the device keeps apart (q8_0, q4_0, q6_K, mxfp4;
 * q5_0 and q5_1 keep their head, the scale(s) and the 4 bytes of high bits, apart from their 16
 * bytes of low parts); 0 for the types whose device layout is the file's. */
static size_t split_rest(kiln_type t) {
    switch (t) {
    case KILN_Q8_0: return 32;
    case KILN_Q4_0: case KILN_MXFP4: case KILN_Q5_0: case KILN_Q5_1: return 16;
    case KILN_Q6_K: return 208;
    default: return 0;
    }
}

bool kb_quant_split(kiln_type t) { return split_rest(t) > 0; }

/* mxfp4's one-byte scales need tiles of 16 blocks (272 bytes) for its bodies to stay 16-byte
 * aligned; the f16 scales of the others, tiles of 8 (144, 272 and 1680 bytes). */
int kb_quant_tile(kiln_type t) { return t == KILN_MXFP4 ? 16 : KB_QTILE; }

/* The scale (q5_0/q5_1: the head) sits first in q8_0/q4_0/q5_0/q5_1/mxfp4 blocks and last in q6_K's. */
static size_t scale_at(kiln_type t) { return t == KILN_Q6_K ? 208 : 0; }

/* Block i's body and scale offsets in the tiled device layout: tiles of `tile` blocks, each
 * its bodies then their scales of size - rest bytes (the last tile: its n blocks' bodies, then
 * their n scales). A tile is whole blocks' bytes, so buffers whose block counts are multiples of
 * the tile concatenate (a weight block of mul_mat_cat) into the layout of the concatenation. */
static void tile_at(size_t i, size_t nb, size_t size, size_t rest, size_t tile, size_t *body, size_t *scale) {
    size_t t0 = i / tile * tile, n = nb - t0 < tile ? nb - t0 : tile;
    *body = t0 * size + (i - t0) * rest;
    *scale = t0 * size + n * rest + (i - t0) * (size - rest);
}

/* Copies bytes of type t's blocks between the file's layout and the device's (to_device: file
 * to device). false when t has no device layout of its own or bytes are not whole blocks. */
static bool quant_relayout(kiln_type t, const void *src, void *dst, size_t bytes, bool to_device) {
    size_t rest = split_rest(t), size = kiln_type_size(t);
    if (!rest || bytes % size != 0) return false;
    size_t         nb = bytes / size, sa = scale_at(t), sb = size - rest, ra = sa ? 0 : sb;
    const uint8_t *s = src;
    uint8_t       *d = dst;
    for (size_t i = 0; i < nb; i++) {
        size_t body, scale, file = i * size;
        tile_at(i, nb, size, rest, (size_t)kb_quant_tile(t), &body, &scale);
        if (to_device) {
            memcpy(d + body, s + file + ra, rest);
            memcpy(d + scale, s + file + sa, sb);
        } else {
            memcpy(d + file + ra, s + body, rest);
            memcpy(d + file + sa, s + scale, sb);
        }
    }
    return true;
}

bool kb_quant_to_device(kiln_type t, const void *src, void *dst, size_t bytes) {
    return quant_relayout(t, src, dst, bytes, true);
}

bool kb_quant_from_device(kiln_type t, const void *src, void *dst, size_t bytes) {
    return quant_relayout(t, src, dst, bytes, false);
}
