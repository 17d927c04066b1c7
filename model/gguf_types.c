/* ggml's tensor types as GGUF files number them (ggml.h's enum ggml_type, ggml.c's type
 * traits), and GGUF's value types. A tensor of type t with ne[0] a multiple of blck elements per
 * row takes nelements / blck * size bytes. */
#include "model/gguf.h"

#include <stddef.h>

/* Codes with no entry (name NULL) are unknown: 4 and 5 (q4_2, q4_3), 31-33 (q4_0_4_4, q4_0_4_8,
 * q4_0_8_8) and 36-38 (iq4_nl_4_4, ...) were removed from ggml and from GGUF files. */
static const km_ggml_type types[] = {
    [0] = {"f32", 1, 4},         [1] = {"f16", 1, 2},         [2] = {"q4_0", 32, 18},
    [3] = {"q4_1", 32, 20},      [6] = {"q5_0", 32, 22},      [7] = {"q5_1", 32, 24},
    [8] = {"q8_0", 32, 34},      [9] = {"q8_1", 32, 36},      [10] = {"q2_K", 256, 84},
    [11] = {"q3_K", 256, 110},   [12] = {"q4_K", 256, 144},   [13] = {"q5_K", 256, 176},
    [14] = {"q6_K", 256, 210},   [15] = {"q8_K", 256, 292},   [16] = {"iq2_xxs", 256, 66},
    [17] = {"iq2_xs", 256, 74},  [18] = {"iq3_xxs", 256, 98}, [19] = {"iq1_s", 256, 50},
    [20] = {"iq4_nl", 32, 18},   [21] = {"iq3_s", 256, 110},  [22] = {"iq2_s", 256, 82},
    [23] = {"iq4_xs", 256, 136}, [24] = {"i8", 1, 1},         [25] = {"i16", 1, 2},
    [26] = {"i32", 1, 4},        [27] = {"i64", 1, 8},        [28] = {"f64", 1, 8},
    [29] = {"iq1_m", 256, 56},   [30] = {"bf16", 1, 2},       [34] = {"tq1_0", 256, 54},
    [35] = {"tq2_0", 256, 66},   [39] = {"mxfp4", 32, 17},    [40] = {"nvfp4", 64, 36},
    [41] = {"q1_0", 128, 18},
};

#define N_TYPES (sizeof types / sizeof types[0])

const km_ggml_type *km_ggml_type_info(uint32_t t) {
    return t < N_TYPES && types[t].name ? &types[t] : NULL;
}

bool km_ggml_type_removed(uint32_t t) { return t == 4 || t == 5 || (t >= 31 && t <= 33) || (t >= 36 && t <= 38); }

/* kiln's types and their ggml codes, in kiln_type order. */
static const uint32_t kiln_codes[KILN_TYPE_COUNT] = {
    [KILN_F32] = 0,  [KILN_F16] = 1,  [KILN_BF16] = 30, [KILN_I32] = 26, [KILN_I64] = 27,
    [KILN_Q8_0] = 8, [KILN_Q4_0] = 2, [KILN_Q4_K] = 12, [KILN_Q5_K] = 13, [KILN_Q6_K] = 14,
    [KILN_MXFP4] = 39, [KILN_Q5_0] = 6, [KILN_Q5_1] = 7,
};

bool km_ggml_to_kiln(uint32_t t, kiln_type *out) {
    for (int k = 0; k < KILN_TYPE_COUNT; k++)
        if (kiln_codes[k] == t) {
            *out = (kiln_type)k;
            return true;
        }
    return false;
}

uint32_t km_ggml_from_kiln(kiln_type t) { return kiln_codes[t]; }

static const struct {
    const char *name;
    size_t      size;
} values[KILN_GGUF_TYPE_COUNT] = {
    [KILN_GGUF_U8] = {"u8", 1},         [KILN_GGUF_I8] = {"i8", 1},     [KILN_GGUF_U16] = {"u16", 2},
    [KILN_GGUF_I16] = {"i16", 2},       [KILN_GGUF_U32] = {"u32", 4},   [KILN_GGUF_I32] = {"i32", 4},
    [KILN_GGUF_F32] = {"f32", 4},       [KILN_GGUF_BOOL] = {"bool", 1}, [KILN_GGUF_STRING] = {"string", 0},
    [KILN_GGUF_ARRAY] = {"array", 0},   [KILN_GGUF_U64] = {"u64", 8},   [KILN_GGUF_I64] = {"i64", 8},
    [KILN_GGUF_F64] = {"f64", 8},
};

size_t km_gguf_value_size(uint32_t t) { return t < KILN_GGUF_TYPE_COUNT ? values[t].size : 0; }

const char *kiln_gguf_type_name(kiln_gguf_type t) {
    return (unsigned)t < KILN_GGUF_TYPE_COUNT ? values[t].name : "?";
}
