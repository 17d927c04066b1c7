#include "base.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float kb_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) return float_of(sign | 0x7f800000 | (man << 13));
    if (exp == 0) {
        /* subnormal: value is man * 2^-24 */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    return float_of(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t kb_f32_to_f16(float f) {
    uint32_t u = bits_of(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t au = u & 0x7fffffff;
    if (au > 0x7f800000) return sign | 0x7e00 | (uint16_t)((au >> 13) & 0x3ff); /* NaN */
    if (au >= 0x477ff000) return sign | 0x7c00;                                   /* overflow */
    if (au < 0x38800000) {
        /* result is subnormal or zero: round au's value to a multiple of 2^-24 */
        float a = float_of(au);
        float r = nearbyintf(a * 0x1p24f); /* default rounding: to nearest even */
        return sign | (uint16_t)r;
    }
    uint32_t mant_odd = (au >> 13) & 1;
    au += 0xfff + mant_odd; /* round to nearest even on the 13 dropped bits */
    return sign | (uint16_t)((au - 0x38000000) >> 13);
}

float kb_bf16_to_f32(uint16_t h) { return float_of((uint32_t)h << 16); }

uint16_t kb_f32_to_bf16(float f) {
    uint32_t u = bits_of(f);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float kb_load_f32(const void *p, kiln_type t, int64_t i) {
    switch (t) {
    case KILN_F32: return ((const float *)p)[i];
    case KILN_F16: return kb_f16_to_f32(((const uint16_t *)p)[i]);
    case KILN_BF16: return kb_bf16_to_f32(((const uint16_t *)p)[i]);
    case KILN_I32: return (float)((const int32_t *)p)[i];
    case KILN_I64: return (float)((const int64_t *)p)[i];
    default: return kb_dequant_elem(p, t, i);
    }
}

void kb_store_f32(void *p, kiln_type t, int64_t i, float v) {
    switch (t) {
    case KILN_F32: ((float *)p)[i] = v; break;
    case KILN_F16: ((uint16_t *)p)[i] = kb_f32_to_f16(v); break;
    case KILN_BF16: ((uint16_t *)p)[i] = kb_f32_to_bf16(v); break;
    case KILN_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case KILN_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    default: break;
    }
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill_quantized(void *p, kiln_type t, int64_t n, uint64_t seed) {
    int64_t b = kiln_type_block(t);
    float   x[256];
    for (int64_t i = 0; i + b <= n; i += b) {
        kb_fill_random(x, KILN_F32, b, seed + (uint64_t)i);
        kb_quant_row(x, t, (uint8_t *)p + kiln_row_size(t, i), b);
    }
}

void kb_fill_random(void *p, kiln_type t, int64_t n, uint64_t seed) {
    if (kiln_type_is_quantized(t)) {
        fill_quantized(p, t, n, seed);
        return;
    }
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = splitmix64(&s);
        if (t == KILN_I32 || t == KILN_I64) {
            kb_store_f32(p, t, i, (float)(r % 16));
        } else {
            float v = (float)((r >> 40) * 0x1p-24) * 2.0f - 1.0f;
            kb_store_f32(p, t, i, v);
        }
    }
}

void kb_format_float(float f, char out[32]) {
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(out, 32, "%.*g", digits, (double)f);
        if (strtof(out, NULL) == f) return;
    }
}

double kb_nmse(const void *ref, const void *got, kiln_type t, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double r = kb_load_f32(ref, t, i), o = kb_load_f32(got, t, i);
        num += (o - r) * (o - r);
        den += r * r;
    }
    return den > 0 ? num / den : num;
}
