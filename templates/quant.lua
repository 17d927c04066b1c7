-- quant: ggml's quantized weight types on the GPU (docs/quantization.md): their device layout,
-- CUDA functions that dequantize them, and the kernels of the quantized plans of mul_mat,
-- mul_mat_id and get_rows.
--
-- Device layout. q4_K and q5_K keep the file's blocks: every field sits at a 16-byte multiple
-- of a 144- or 176-byte block, so a lane loads its 16 bytes of quants with one vector load. The
-- blocks of q8_0 (34 bytes), q4_0 (18) and q6_K (210) are only 2-byte aligned because of their
-- f16 scale; on the device a buffer of these is tiles of 8 blocks, each the 8 blocks' other
-- bytes (32, 16 or 208 a block, 16-byte multiples) and then their 8 f16 scales (the "tiled"
-- layout; the last tile holds what is left the same way: kiln_qtb, kiln_qts). A tile is whole
-- blocks' bytes, so weights whose block counts are multiples of 8 placed side by side (the
-- weight block of pass mul_mat_cat) are the tiled layout of their concatenation. runtime/
-- converts on upload (kb_quant_to_device, base/quant.c), so the CPU reference and files keep
-- ggml's layout. Element e of a buffer is element e % block of block e / block, in either layout.
-- q5_0 (22 bytes: d, 4 bytes of high bits, 16 of low nibbles) and q5_1 (24: d, m, high bits, low
-- nibbles) are tiled with the 16 bytes of low nibbles as the body and the rest, their "head" (6
-- or 8 bytes), in place of the scale (kiln_q5h_T).
-- mxfp4 (17 bytes: an E8M0 scale byte, then 16 bytes of FP4 codes) is tiled the same way with
-- tiles of 16 blocks (16 bodies, then 16 scale bytes: 272 bytes, so the bodies stay 16-byte
-- aligned; kiln_qxb, kiln_qxe).
--
-- The fused GEMV (one column) reads each weight once: a warp owns a row and its lanes take
-- units of it (lane l units l, l+32, ...; a unit is a q8_0/q4_0 block, or a quarter of a
-- K-quant block), multiply the quants' integers by b's, quantized to int8 in shared memory
-- (dp4a), and apply the unit's scales once per sub-block sum. The other
-- plans dequantize the weight into the scratch as f16 (as ggml's cuBLAS path does) and run the
-- f16 plan of matmul.lua / matmul_id.lua on it.

local kit = require("kit")

local M = {}

-- block: elements per block; size: bytes per block in files; rest: bytes per block before the
-- scales in the tiled layout (nil: the file's layout); ub: the int8 GEMVs' units per block (32
-- elements for q8_0/q4_0, 64 for the K-quants: a unit's scales are decoded once for 64); tile:
-- blocks a tile of the tiled layout (8 when not given).
local TYPES = {
    q8_0 = { block = 32, size = 34, rest = 32, ub = 1 },
    q4_0 = { block = 32, size = 18, rest = 16, ub = 1 },
    q5_0 = { block = 32, size = 22, rest = 16, ub = 1 },
    q5_1 = { block = 32, size = 24, rest = 16, ub = 1 },
    q4_K = { block = 256, size = 144, ub = 4 },
    q5_K = { block = 256, size = 176, ub = 4 },
    q6_K = { block = 256, size = 210, rest = 208, ub = 4 },
    mxfp4 = { block = 32, size = 17, rest = 16, ub = 1, tile = 16 },
}
M.TYPES = TYPES

function M.is(t) return TYPES[t] ~= nil end

-- Registers of one unit's weights (kiln_qw_T, the int8 path's): the quantized GEMVs size how many
-- units' loads run ahead of the products by them.
M.QW_REGS = { q8_0 = 9, q4_0 = 5, q5_0 = 7, q5_1 = 6, q4_K = 13, q5_K = 21, q6_K = 16, mxfp4 = 5 }

-- (The helpers are not `static`: a kernel uses only some of them, and NVRTC warns about unused
-- static functions, not about unused external ones; each kernel is a program of its own.)
-- Shared helpers: streamed weight loads, b's values through L1, f16 to f32, and the exact
-- byte-to-float conversion (byte i of w, minus `off`).
local COMMON = [[
__device__ __forceinline__ uint4 kiln_q16(const unsigned char *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ uint2 kiln_q8(const unsigned char *p)
{
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
__device__ __forceinline__ unsigned kiln_q2(const unsigned char *p)
{
    unsigned short v;
    asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ float4 kiln_qb4(const float *p)
{
    float4 v;
    asm volatile("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ float kiln_qh2f(unsigned h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h));
    return f;
}
/* Block blk's body and f16 scale in the tiled layout of q8_0, q4_0 and q6_K (tiles of 8 blocks:
 * their bodies, then their scales; nb, the buffer's blocks, gives the last tile's count). */
__device__ __forceinline__ const unsigned char *kiln_qtb(const unsigned char *W, long long blk, int size, int rest)
{
    return W + (blk & ~7ll) * size + (blk & 7) * rest;
}
__device__ __forceinline__ unsigned kiln_qts(const unsigned char *W, long long nb, long long blk, int size, int rest)
{
    const long long t0 = blk & ~7ll;
    return kiln_q2(W + t0 * size + min(8ll, nb - t0) * rest + (blk & 7) * 2);
}
/* Byte i of w as a float, minus off: 0x4B0000xx is 2^23 + xx exactly. */
__device__ __forceinline__ float kiln_qbyte(unsigned w, int i, float off)
{
    return __int_as_float(__byte_perm(w, 0x4B000000u, 0x7540u + i)) - (8388608.0f + off);
}
/* sum_i (byte i of w - off) * b[i] for the 4 bytes of w and 4 consecutive b values. */
__device__ __forceinline__ float kiln_qdot4(unsigned w, float4 b, float off, float s)
{
    s = fmaf(kiln_qbyte(w, 0, off), b.x, s);
    s = fmaf(kiln_qbyte(w, 1, off), b.y, s);
    s = fmaf(kiln_qbyte(w, 2, off), b.z, s);
    return fmaf(kiln_qbyte(w, 3, off), b.w, s);
}
__device__ __forceinline__ float kiln_qsum4(float4 b) { return (b.x + b.y) + (b.z + b.w); }
/* One PRMT per value, no subtraction: a byte v < 128 placed in bits 16..22 of 0.5 is the float
 * 0.5 + v/256 exactly (kiln_q7); any byte in bits 8..15 is 0.5 + v/65536 (kiln_q8f). A unit sums
 * S = sum f * b and recovers sum v * b = 256 S - 128 T (65536 S - 32768 T), T = sum b, which is
 * computed once per unit for all rows; S - T/2 cancels only the leading bits (about 4 of 24
 * for 7-bit values, 8 for bytes). */
__device__ __forceinline__ float kiln_q7(unsigned w, int i) { return __int_as_float(__byte_perm(w, 0x3F000000u, 0x7044u | (i << 8))); }
__device__ __forceinline__ float kiln_q8f(unsigned w, int i) { return __int_as_float(__byte_perm(w, 0x3F000000u, 0x7404u | (i << 4))); }
__device__ __forceinline__ float kiln_qs7(unsigned w, float4 b, float s)
{
    s = fmaf(kiln_q7(w, 0), b.x, s);
    s = fmaf(kiln_q7(w, 1), b.y, s);
    s = fmaf(kiln_q7(w, 2), b.z, s);
    return fmaf(kiln_q7(w, 3), b.w, s);
}
__device__ __forceinline__ float kiln_qs8(unsigned w, float4 b, float s)
{
    s = fmaf(kiln_q8f(w, 0), b.x, s);
    s = fmaf(kiln_q8f(w, 1), b.y, s);
    s = fmaf(kiln_q8f(w, 2), b.z, s);
    return fmaf(kiln_q8f(w, 3), b.w, s);
}
/* The 6-bit scale and min of sub-block j (0..7) of a q4_K/q5_K block from its 12 scale bytes
 * in words y (bytes 0-3), z (4-7), w (8-11): ggml's get_scale_min_k4. */
__device__ __forceinline__ void kiln_qscale_k4(int j, unsigned y, unsigned z, unsigned w, float *sc, float *m)
{
    /* branch-free (lanes of a warp take different sub-blocks) */
    const int i = j & 3;
    const unsigned s_lo = (y >> (8 * i)) & 63u, m_lo = (z >> (8 * i)) & 63u;
    const unsigned s_hi = ((w >> (8 * i)) & 0xFu) | (((y >> (8 * i + 6)) & 3u) << 4);
    const unsigned m_hi = ((w >> (8 * i + 4)) & 0xFu) | (((z >> (8 * i + 6)) & 3u) << 4);
    *sc = (float)(j < 4 ? s_lo : s_hi);
    *m = (float)(j < 4 ? m_lo : m_hi);
}
]]

-- Helpers of one type that both of its paths below use (M.helpers adds them once).
local EXTRA = {}

-- mxfp4: the tiled layout's body and scale of block blk, the scale's value, and the int8 values
-- of a word's eight codes. A code's value is ggml's kvalues_mxfp4[code] (twice the E2M1 number: codes 0..7
-- are 0, 1, 2, 3, 4, 6, 8, 12; codes 8..15 their negatives), so the products stay integers
-- (dp4a) and the scale is half the E8M0 one: 2^(e - 128), ggml's GGML_E8M0_TO_FP32_HALF.
EXTRA.mxfp4 = [[
__device__ __forceinline__ const unsigned char *kiln_qxb(const unsigned char *W, long long blk)
{
    return W + (blk & ~15ll) * 17 + (blk & 15) * 16;
}
__device__ __forceinline__ unsigned kiln_qxe(const unsigned char *W, long long nb, long long blk)
{
    const long long t0 = blk & ~15ll;
    unsigned short v;
    asm volatile("ld.global.nc.u8 %0, [%1];" : "=h"(v) : "l"(W + t0 * 17 + min(16ll, nb - t0) * 16 + (blk & 15)));
    return v;
}
__device__ __forceinline__ float kiln_qe8(unsigned e) { return __int_as_float(e < 2u ? 0x00200000u << e : (e - 1u) << 23); }
/* The values of the eight codes of word q as int8 bytes: .x those of the low nibbles (bytes
 * 0..3), .y the high ones'. q's nibbles are the selectors of byte permutations, four at a time
 * (__byte_perm reads the low 3 bits of a selector nibble), over the table's non-negative half
 * and over its negative half; a third permutation picks each byte's half by the code's bit 3,
 * and two more part the low nibbles' values from the high ones'. 12 instructions for 8 codes
 * (the version that packed four codes into selectors first took 19: mxfp4's GEMV 4096 -> 14336
 * ran at 1262 GB/s where q4_0's runs at 1818, H100). */
__device__ __forceinline__ int2 kiln_mx8(unsigned q)
{
    const unsigned sel = 0x32103210u | ((q & 0x88888888u) >> 1);
    const unsigned a0 = __byte_perm(0x03020100u, 0x0C080604u, q), b0 = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, q);
    const unsigned a1 = __byte_perm(0x03020100u, 0x0C080604u, q >> 16), b1 = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, q >> 16);
    const unsigned v0 = __byte_perm(a0, b0, sel), v1 = __byte_perm(a1, b1, sel >> 16);
    return make_int2((int)__byte_perm(v0, v1, 0x6420u), (int)__byte_perm(v0, v1, 0x7531u));
}
]]

-- q5_0 and q5_1: kiln_q5h_T gives a block's head in the tiled layout as .x = d (and q5_1's m in
-- the high half) and .y = the 32 high bits (bit e: element e's fifth bit). q5_0's 6-byte heads
-- are 2-byte aligned (three 16-bit loads), q5_1's 8-byte ones 8-byte aligned (one load).
-- kiln_q5spread(h): bits 0..3 of h at bit 4 of bytes 0..3 (the four shifted copies of the
-- multiply do not overlap, so there are no carries), to OR into four low nibbles.
local function q5_extra(t)
    local size, hb = t == "q5_0" and 22 or 24, t == "q5_0" and 6 or 8
    local head = t == "q5_0" and "    return make_uint2(kiln_q2(h), kiln_q2(h + 2) | kiln_q2(h + 4) << 16);"
        or "    return kiln_q8(h);"
    return table.concat({
        string.format("__device__ __forceinline__ uint2 kiln_q5h_%s(const unsigned char *W, long long nb, long long blk)", t),
        "{",
        "    const long long t0 = blk & ~7ll;",
        string.format("    const unsigned char *const h = W + t0 * %d + min(8ll, nb - t0) * 16 + (blk & 7) * %d;", size, hb),
        head,
        "}",
        string.format("__device__ __forceinline__ unsigned kiln_q5spread_%s(unsigned h) { return ((h & 0xFu) * 0x00204081u & 0x01010101u) << 4; }", t),
        "",
    }, "\n")
end
EXTRA.q5_0 = q5_extra("q5_0")
EXTRA.q5_1 = q5_extra("q5_1")

-- Per type: kiln_dq8_T(W, NB, blk, j, out): elements j..j+7 of block blk (j a multiple of 8),
-- W the buffer's start, NB its blocks (the tiled layout's last tile). (The fused GEMVs' int8
-- path is below.)
local DQ8 = {}

DQ8.q8_0 = [[
__device__ __forceinline__ void kiln_dq8_q8_0(const unsigned char *W, long long NB, long long blk, int j,
                                                     float *out)
{
    const float d = kiln_qh2f(kiln_qts(W, NB, blk, 34, 32));
    const uint2 q = kiln_q8(kiln_qtb(W, blk, 34, 32) + j);
    const unsigned w[2] = {q.x ^ 0x80808080u, q.y ^ 0x80808080u};
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = kiln_qbyte(w[i / 4], i % 4, 128.0f) * d;
}
]]

DQ8.q4_0 = [[
__device__ __forceinline__ void kiln_dq8_q4_0(const unsigned char *W, long long NB, long long blk, int j,
                                                     float *out)
{
    const float d = kiln_qh2f(kiln_qts(W, NB, blk, 18, 16));
    const uint2 q = kiln_q8(kiln_qtb(W, blk, 18, 16) + (j & 15)); /* elements j..j+7: bytes (j % 16).., nibble j / 16 */
    const int sh = j < 16 ? 0 : 4;
    const unsigned w[2] = {(q.x >> sh) & 0x0F0F0F0Fu, (q.y >> sh) & 0x0F0F0F0Fu};
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = kiln_qbyte(w[i / 4], i % 4, 8.0f) * d;
}
]]

-- q5_0 / q5_1: elements j..j+7 are bytes (j % 16).. of the body, nibble j / 16, and bits j..j+7
-- of the high bits; q5_1's x = q * d + m as ggml's dequantize_row_q5_1 (a rounded product, then
-- the sum: not contracted into an fma).
local function q5_dq8(t)
    local size, min = t == "q5_0" and 22 or 24, t == "q5_1"
    return table.concat({
        string.format("__device__ __forceinline__ void kiln_dq8_%s(const unsigned char *W, long long NB, long long blk, int j,", t),
        "                                                     float *out)",
        "{",
        string.format("    const uint2 h = kiln_q5h_%s(W, NB, blk);", t),
        min and "    const float d = kiln_qh2f(h.x & 0xFFFFu), m = kiln_qh2f(h.x >> 16);" or "    const float d = kiln_qh2f(h.x);",
        string.format("    const uint2 q = kiln_q8(kiln_qtb(W, blk, %d, 16) + (j & 15));", size),
        "    const int sh = j < 16 ? 0 : 4;",
        string.format("    const unsigned w[2] = {((q.x >> sh) & 0x0F0F0F0Fu) | kiln_q5spread_%s(h.y >> j),", t),
        string.format("                           ((q.y >> sh) & 0x0F0F0F0Fu) | kiln_q5spread_%s(h.y >> (j + 4))};", t),
        "#pragma unroll",
        min and "    for (int i = 0; i < 8; i++) out[i] = __fadd_rn(__fmul_rn(kiln_qbyte(w[i / 4], i % 4, 0.0f), d), m);"
            or "    for (int i = 0; i < 8; i++) out[i] = kiln_qbyte(w[i / 4], i % 4, 16.0f) * d;",
        "}",
        "",
    }, "\n")
end
DQ8.q5_0 = q5_dq8("q5_0")
DQ8.q5_1 = q5_dq8("q5_1")

-- Elements j..j+7 of a q4_K/q5_K block: sub-block s = j / 32, chunk c = j / 64, quant bytes
-- 32c + j % 32.., nibble (j / 32) % 2; the fifth bit is bit s of the qh bytes j % 32...
local function qk_dq8(t, five)
    local size = five and 176 or 144
    local qs = five and 48 or 16
    return table.concat({
        string.format("__device__ __forceinline__ void kiln_dq8_%s(const unsigned char *W, long long NB, long long blk,", t),
        "                                                     int j, float *out)",
        "{",
        string.format("    const unsigned char *B = W + blk * %d;", size),
        "    const int s = j >> 5, c = j >> 6, l = j & 31;",
        "    const uint4 hd = kiln_q16(B);",
        "    float sc, m;",
        "    kiln_qscale_k4(s, hd.y, hd.z, hd.w, &sc, &m);",
        "    const float d = kiln_qh2f(hd.x & 0xFFFFu) * sc, dm = kiln_qh2f(hd.x >> 16) * m;",
        string.format("    const uint2 q = kiln_q8(B + %d + 32 * c + l);", qs),
        "    unsigned w[2] = {(q.x >> (4 * (s & 1))) & 0x0F0F0F0Fu, (q.y >> (4 * (s & 1))) & 0x0F0F0F0Fu};",
        five and "    const uint2 qh = kiln_q8(B + 16 + l);" or "",
        five and "    w[0] |= ((qh.x >> s) & 0x01010101u) << 4;" or "",
        five and "    w[1] |= ((qh.y >> s) & 0x01010101u) << 4;" or "",
        "#pragma unroll",
        "    for (int i = 0; i < 8; i++) out[i] = d * kiln_qbyte(w[i / 4], i % 4, 0.0f) - dm;",
        "}",
        "",
    }, "\n")
end
DQ8.q4_K = qk_dq8("q4_K", false)
DQ8.q5_K = qk_dq8("q5_K", true)

-- q6_K (tiled layout: ql[128] qh[64] scales[16] per block, the f16 scales after the tile's).
DQ8.q6_K = [[
__device__ __forceinline__ void kiln_dq8_q6_K(const unsigned char *W, long long NB, long long blk, int j,
                                                     float *out)
{
    const unsigned char *B = kiln_qtb(W, blk, 210, 208);
    const int hf = j >> 7, r = j & 127, q = r >> 5, l = r & 31;
    const uint2 ql = kiln_q8(B + 64 * hf + 32 * (q & 1) + l), qh = kiln_q8(B + 128 + 32 * hf + l);
    const float d = kiln_qh2f(kiln_qts(W, NB, blk, 210, 208));
    const float sc = (float)(signed char)B[192 + 8 * hf + (l >> 4) + 2 * q];
    const int sh = q < 2 ? 0 : 4;
    const unsigned w[2] = {((ql.x >> sh) & 0x0F0F0F0Fu) | (((qh.x >> (2 * q)) & 0x03030303u) << 4),
                           ((ql.y >> sh) & 0x0F0F0F0Fu) | (((qh.y >> (2 * q)) & 0x03030303u) << 4)};
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = d * sc * kiln_qbyte(w[i / 4], i % 4, 32.0f);
}
]]

-- mxfp4 (tiled: tiles of 16 blocks, one-byte scales): elements j..j+7 are bytes (j % 16).. of
-- the body, codes in nibble j / 16.
DQ8.mxfp4 = [[
__device__ __forceinline__ void kiln_dq8_mxfp4(const unsigned char *W, long long NB, long long blk, int j,
                                                      float *out)
{
    const float d = kiln_qe8(kiln_qxe(W, NB, blk));
    const uint2 q = kiln_q8(kiln_qxb(W, blk) + (j & 15));
    const int2 v0 = kiln_mx8(q.x), v1 = kiln_mx8(q.y);
    const unsigned w[2] = {(unsigned)(j < 16 ? v0.x : v0.y), (unsigned)(j < 16 ? v1.x : v1.y)};
#pragma unroll
    for (int i = 0; i < 8; i++) out[i] = (float)(signed char)(w[i / 4] >> (8 * (i % 4))) * d;
}
]]

-- ---- the int8 path of the fused GEMV (matmul.lua's qgemv) ----------------------------------
-- b is quantized per 32-element block j, as ggml quantizes the activations of a quantized
-- mul_mat (q8_0 on its CPU, q8_1 in its CUDA mmvq): d_j = max |b| / 127, q = round(b / d_j),
-- into shared memory once per thread block (M.bq_prologue). The weights' integers then meet
-- b's in dp4a (four int8 products a instruction, exact int32 sums), and the float scales are
-- applied once per 16 or 32 elements. Shared layout (K elements of b): the bytes of elements
-- 0..15 of every block (plane 0, 16 bytes a block), then, 16 bytes further (so that lanes
-- reading both planes in one instruction use different banks), elements 16..31 (plane 1); the
-- scales QD[j]; and QS[2j + h] = d_j * sum(q) over half h (the sums the offsets and the
-- K-quants' mins multiply).
--
-- Per type: kiln_qw_T (a unit's weight registers) and kiln_qwl_T(W, NB, blk, part) loading
-- them (issued ahead of their use: the loads in flight decide the bandwidth); kiln_qb_T (b's
-- side of the unit) and kiln_qbl_T(P0, P1, QD, QS, ub, part), ub the unit's block in the row;
-- kiln_qwd_T(w, x): the unit's sum of w * b.
local I8 = {}

-- b's side of a unit of one 32-element block without an offset (q8_0, mxfp4): its two planes'
-- 16 bytes and its scale.
local function qb32(t)
    local pad = string.rep(" ", #t - 4)
    return table.concat({
        string.format("struct kiln_qb_%s { uint4 a, b; float d; };", t),
        string.format("__device__ __forceinline__ kiln_qb_%s kiln_qbl_%s(const unsigned char *P0, const unsigned char *P1, const float *QD,", t, t),
        string.format("                                                      %sconst float *QS, int ub, int part)", pad),
        "{",
        string.format("    kiln_qb_%s x;", t),
        "    x.a = *(const uint4 *)(P0 + 16 * ub), x.b = *(const uint4 *)(P1 + 16 * ub), x.d = QD[ub];",
        "    return x;",
        "}",
    }, "\n")
end

I8.q8_0 = [[
struct kiln_qw_q8_0 { uint4 a, b; unsigned d; };
__device__ __forceinline__ kiln_qw_q8_0 kiln_qwl_q8_0(const unsigned char *W, long long NB, long long blk, int part)
{
    kiln_qw_q8_0 w;
    w.a = kiln_q16(kiln_qtb(W, blk, 34, 32)), w.b = kiln_q16(kiln_qtb(W, blk, 34, 32) + 16), w.d = kiln_qts(W, NB, blk, 34, 32);
    return w;
}
]] .. qb32("q8_0") .. [[
__device__ __forceinline__ float kiln_qwd_q8_0(const kiln_qw_q8_0 &w, const kiln_qb_q8_0 &x)
{
    int s = __dp4a((int)w.a.x, (int)x.a.x, 0);
    s = __dp4a((int)w.a.y, (int)x.a.y, s);
    s = __dp4a((int)w.a.z, (int)x.a.z, s);
    s = __dp4a((int)w.a.w, (int)x.a.w, s);
    s = __dp4a((int)w.b.x, (int)x.b.x, s);
    s = __dp4a((int)w.b.y, (int)x.b.y, s);
    s = __dp4a((int)w.b.z, (int)x.b.z, s);
    s = __dp4a((int)w.b.w, (int)x.b.w, s);
    return kiln_qh2f(w.d) * (x.d * (float)s);
}
]]

I8.q4_0 = [[
struct kiln_qw_q4_0 { uint4 q; unsigned d; };
__device__ __forceinline__ kiln_qw_q4_0 kiln_qwl_q4_0(const unsigned char *W, long long NB, long long blk, int part)
{
    kiln_qw_q4_0 w;
    w.q = kiln_q16(kiln_qtb(W, blk, 18, 16)), w.d = kiln_qts(W, NB, blk, 18, 16);
    return w;
}
struct kiln_qb_q4_0 { uint4 a, b; float d, s; };
__device__ __forceinline__ kiln_qb_q4_0 kiln_qbl_q4_0(const unsigned char *P0, const unsigned char *P1, const float *QD,
                                                      const float *QS, int ub, int part)
{
    kiln_qb_q4_0 x;
    x.a = *(const uint4 *)(P0 + 16 * ub), x.b = *(const uint4 *)(P1 + 16 * ub);
    x.d = QD[ub], x.s = QS[2 * ub] + QS[2 * ub + 1];
    return x;
}
/* byte i: element i (low nibble) and i + 16 (high); the value is the nibble minus 8 */
__device__ __forceinline__ float kiln_qwd_q4_0(const kiln_qw_q4_0 &w, const kiln_qb_q4_0 &x)
{
    const unsigned q[4] = {w.q.x, w.q.y, w.q.z, w.q.w}, a[4] = {x.a.x, x.a.y, x.a.z, x.a.w}, b[4] = {x.b.x, x.b.y, x.b.z, x.b.w};
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        s = __dp4a((int)(q[i] & 0x0F0F0F0Fu), (int)a[i], s);
        s = __dp4a((int)((q[i] >> 4) & 0x0F0F0F0Fu), (int)b[i], s);
    }
    return kiln_qh2f(w.d) * (x.d * (float)s - 8.0f * x.s);
}
]]

-- q5_0 and q5_1: q4_0's unit with each nibble's fifth bit ORed in (values 0..31, so the bytes
-- stay positive int8 for dp4a); q5_0 takes 16 times b's sum off (its offset), q5_1 adds m times
-- b's sum (x = d q + m).
local function q5_i8(t)
    local size, min = t == "q5_0" and 22 or 24, t == "q5_1"
    return table.concat({
        string.format("struct kiln_qw_%s { uint4 q; uint2 h; };", t),
        string.format("__device__ __forceinline__ kiln_qw_%s kiln_qwl_%s(const unsigned char *W, long long NB, long long blk, int part)", t, t),
        "{",
        string.format("    kiln_qw_%s w;", t),
        string.format("    w.q = kiln_q16(kiln_qtb(W, blk, %d, 16)), w.h = kiln_q5h_%s(W, NB, blk);", size, t),
        "    return w;",
        "}",
        string.format("struct kiln_qb_%s { uint4 a, b; float d, s; };", t),
        string.format("__device__ __forceinline__ kiln_qb_%s kiln_qbl_%s(const unsigned char *P0, const unsigned char *P1, const float *QD,", t, t),
        "                                                      const float *QS, int ub, int part)",
        "{",
        string.format("    kiln_qb_%s x;", t),
        "    x.a = *(const uint4 *)(P0 + 16 * ub), x.b = *(const uint4 *)(P1 + 16 * ub);",
        "    x.d = QD[ub], x.s = QS[2 * ub] + QS[2 * ub + 1];",
        "    return x;",
        "}",
        string.format("__device__ __forceinline__ float kiln_qwd_%s(const kiln_qw_%s &w, const kiln_qb_%s &x)", t, t, t),
        "{",
        "    const unsigned q[4] = {w.q.x, w.q.y, w.q.z, w.q.w}, a[4] = {x.a.x, x.a.y, x.a.z, x.a.w}, b[4] = {x.b.x, x.b.y, x.b.z, x.b.w};",
        "    int s = 0;",
        "#pragma unroll",
        "    for (int i = 0; i < 4; i++) {",
        string.format("        s = __dp4a((int)((q[i] & 0x0F0F0F0Fu) | kiln_q5spread_%s(w.h.y >> (4 * i))), (int)a[i], s);", t),
        string.format("        s = __dp4a((int)(((q[i] >> 4) & 0x0F0F0F0Fu) | kiln_q5spread_%s(w.h.y >> (16 + 4 * i))), (int)b[i], s);", t),
        "    }",
        min and "    return kiln_qh2f(w.h.x & 0xFFFFu) * (x.d * (float)s) + kiln_qh2f(w.h.x >> 16) * x.s;"
            or "    return kiln_qh2f(w.h.x) * (x.d * (float)s - 16.0f * x.s);",
        "}",
        "",
    }, "\n")
end
I8.q5_0 = q5_i8("q5_0")
I8.q5_1 = q5_i8("q5_1")

-- mxfp4: as q4_0 (byte i: element i in the low nibble, i + 16 in the high), the codes' int8
-- values through kiln_mx8; no offset, so b's sums are not needed.
I8.mxfp4 = [[
struct kiln_qw_mxfp4 { uint4 q; unsigned e; };
__device__ __forceinline__ kiln_qw_mxfp4 kiln_qwl_mxfp4(const unsigned char *W, long long NB, long long blk, int part)
{
    kiln_qw_mxfp4 w;
    w.q = kiln_q16(kiln_qxb(W, blk)), w.e = kiln_qxe(W, NB, blk);
    return w;
}
]] .. qb32("mxfp4") .. [[
__device__ __forceinline__ float kiln_qwd_mxfp4(const kiln_qw_mxfp4 &w, const kiln_qb_mxfp4 &x)
{
    const unsigned q[4] = {w.q.x, w.q.y, w.q.z, w.q.w}, a[4] = {x.a.x, x.a.y, x.a.z, x.a.w}, b[4] = {x.b.x, x.b.y, x.b.z, x.b.w};
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int2 v = kiln_mx8(q[i]);
        s = __dp4a(v.x, (int)a[i], s);
        s = __dp4a(v.y, (int)b[i], s);
    }
    return kiln_qe8(w.e) * (x.d * (float)s);
}
]]

-- q4_K and q5_K: unit `part` (0..3) is chunk c = part of the block: its 32 quant bytes, whose
-- low nibbles are sub-block 2c and high nibbles sub-block 2c + 1 (b's 32-element blocks j and
-- j + 1). Per unit the lane decodes the two sub-blocks' scales and mins once (the lane's chunk
-- is the same in every unit it takes, so the shifts are too) and multiplies 64 elements.
-- q4_K's high nibbles stay in place (q & 0xF0F0F0F0, unsigned bytes against b's signed ones:
-- dp4a.u32.s32) and their sum is 16 times the nibbles' (folded into the float scale).
local function qk_i8(t, five)
    local size, qs = five and 176 or 144, five and 48 or 16
    local L = {
        string.format("struct kiln_qw_%s { uint4 hd, qa, qb%s; int c; };", t, five and ", ha, hb" or ""),
        string.format("__device__ __forceinline__ kiln_qw_%s kiln_qwl_%s(const unsigned char *W, long long NB, long long blk, int part)", t, t),
        "{",
        string.format("    const unsigned char *B = W + blk * %d;", size),
        string.format("    kiln_qw_%s w;", t),
        "    w.c = part;",
        string.format("    w.hd = kiln_q16(B), w.qa = kiln_q16(B + %d + 32 * part), w.qb = kiln_q16(B + %d + 32 * part);", qs, qs + 16),
        five and "    w.ha = kiln_q16(B + 16), w.hb = kiln_q16(B + 32);" or nil,
        "    return w;",
        "}",
        string.format("struct kiln_qb_%s { uint4 a0, a1, b0, b1; float2 d; float4 s; };", t),
        string.format("__device__ __forceinline__ kiln_qb_%s kiln_qbl_%s(const unsigned char *P0, const unsigned char *P1, const float *QD,", t, t),
        "                                                      const float *QS, int ub, int part)",
        "{",
        "    const int j = 8 * ub + 2 * part;",
        string.format("    kiln_qb_%s x;", t),
        "    x.a0 = *(const uint4 *)(P0 + 16 * j), x.a1 = *(const uint4 *)(P1 + 16 * j);",
        "    x.b0 = *(const uint4 *)(P0 + 16 * j + 16), x.b1 = *(const uint4 *)(P1 + 16 * j + 16);",
        "    x.d = *(const float2 *)(QD + j), x.s = *(const float4 *)(QS + 2 * j);",
        "    return x;",
        "}",
        string.format("__device__ __forceinline__ float kiln_qwd_%s(const kiln_qw_%s &w, const kiln_qb_%s &x)", t, t, t),
        "{",
        "    /* the 6-bit scales and mins of sub-blocks 2c, 2c + 1 as byte pairs (get_scale_min_k4):",
        "     * bytes 2c, 2c + 1 of the 12 for c < 2; else low/high nibbles of bytes 8 + 2(c - 2).. with",
        "     * the top bits of bytes 2(c - 2).. (scales) and 4 + 2(c - 2).. (mins); branch-free */",
        "    const int c = w.c, sh = 16 * (c & 1);",
        "    const unsigned y = w.hd.y >> sh, z = w.hd.z >> sh, v = w.hd.w >> sh;",
        "    const unsigned S = c < 2 ? y & 0x3F3Fu : (v & 0x0F0Fu) | ((y >> 2) & 0x3030u);",
        "    const unsigned M = c < 2 ? z & 0x3F3Fu : ((v >> 4) & 0x0F0Fu) | ((z >> 2) & 0x3030u);",
        "    const unsigned q[8] = {w.qa.x, w.qa.y, w.qa.z, w.qa.w, w.qb.x, w.qb.y, w.qb.z, w.qb.w};",
        "    const unsigned a[8] = {x.a0.x, x.a0.y, x.a0.z, x.a0.w, x.a1.x, x.a1.y, x.a1.z, x.a1.w};",
        "    const unsigned b[8] = {x.b0.x, x.b0.y, x.b0.z, x.b0.w, x.b1.x, x.b1.y, x.b1.z, x.b1.w};",
        five and "    const unsigned hb[8] = {w.ha.x, w.ha.y, w.ha.z, w.ha.w, w.hb.x, w.hb.y, w.hb.z, w.hb.w};" or nil,
        "    int s0 = 0, s1 = 0;",
        "#pragma unroll",
        "    for (int i = 0; i < 8; i++) {",
        five and "        s0 = __dp4a((int)((q[i] & 0x0F0F0F0Fu) | (((hb[i] >> (2 * c)) & 0x01010101u) << 4)), (int)a[i], s0);"
            or "        s0 = __dp4a((int)(q[i] & 0x0F0F0F0Fu), (int)a[i], s0);",
        five and "        s1 = __dp4a((int)(((q[i] >> 4) & 0x0F0F0F0Fu) | (((hb[i] >> (2 * c + 1)) & 0x01010101u) << 4)), (int)b[i], s1);"
            or [[        asm("dp4a.u32.s32 %0, %1, %2, %0;" : "+r"(s1) : "r"(q[i] & 0xF0F0F0F0u), "r"(b[i]));]],
        "    }",
        "    const float d = kiln_qh2f(w.hd.x & 0xFFFFu), dmin = kiln_qh2f(w.hd.x >> 16);",
        string.format("    const float p = x.d.x * (float)(s0 * (int)(S & 0xFFu)) + x.d.y * %s(float)(s1 * (int)(S >> 8));", five and "" or "0.0625f * "),
        "    return d * p - dmin * ((float)(M & 0xFFu) * (x.s.x + x.s.y) + (float)(M >> 8) * (x.s.z + x.s.w));",
        "}",
        "",
    }
    return table.concat(kit.compact(L), "\n")
end
I8.q4_K = qk_i8("q4_K", false)
I8.q5_K = qk_i8("q5_K", true)

-- q6_K: unit `part` (0..3) is half hf = part / 2 of the block (128 elements) and, in each of
-- its 4 quarters q (32 elements, b's block 8 ub + 4 hf + q), the 16 elements from g = part % 2
-- (b's plane g): 16 bytes of ql (quarters 0 and 2 share them, low and high nibbles; 1 and 3 the
-- next 32 bytes), 16 of qh, and the quarters' 4 scales, bytes g, g + 2, g + 4, g + 6 of the
-- half's 8. The 6-bit values go to dp4a unsigned (0..63, dp4a.u32.s32) and the offset 32 is
-- taken off with b's half-block sums: sum (v - 32) b = sum v b - 32 sum b.
I8.q6_K = [[
struct kiln_qw_q6_K { uint4 qa, qb, qh; uint2 sw; unsigned d; int g; };
__device__ __forceinline__ kiln_qw_q6_K kiln_qwl_q6_K(const unsigned char *W, long long NB, long long blk, int part)
{
    const unsigned char *B = kiln_qtb(W, blk, 210, 208);
    const int hf = part >> 1, g = part & 1;
    kiln_qw_q6_K w;
    w.qa = kiln_q16(B + 64 * hf + 16 * g), w.qb = kiln_q16(B + 64 * hf + 32 + 16 * g);
    w.qh = kiln_q16(B + 128 + 32 * hf + 16 * g), w.sw = kiln_q8(B + 192 + 8 * hf);
    w.d = kiln_qts(W, NB, blk, 210, 208), w.g = g;
    return w;
}
struct kiln_qb_q6_K { uint4 x[4]; float4 d; float s[4]; };
__device__ __forceinline__ kiln_qb_q6_K kiln_qbl_q6_K(const unsigned char *P0, const unsigned char *P1, const float *QD,
                                                      const float *QS, int ub, int part)
{
    const int hf = part >> 1, g = part & 1, j = 8 * ub + 4 * hf;
    const unsigned char *P = g ? P1 : P0;
    kiln_qb_q6_K x;
#pragma unroll
    for (int q = 0; q < 4; q++) x.x[q] = *(const uint4 *)(P + 16 * (j + q)), x.s[q] = QS[2 * (j + q) + g];
    x.d = *(const float4 *)(QD + j);
    return x;
}
__device__ __forceinline__ int kiln_q6dot(unsigned v, unsigned b, int s)
{
    asm("dp4a.u32.s32 %0, %1, %2, %0;" : "+r"(s) : "r"(v), "r"(b));
    return s;
}
__device__ __forceinline__ float kiln_qwd_q6_K(const kiln_qw_q6_K &w, const kiln_qb_q6_K &x)
{
    const unsigned a[4] = {w.qa.x, w.qa.y, w.qa.z, w.qa.w}, b[4] = {w.qb.x, w.qb.y, w.qb.z, w.qb.w};
    const unsigned h[4] = {w.qh.x, w.qh.y, w.qh.z, w.qh.w};
    int s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const unsigned xi[4] = {i == 0 ? x.x[0].x : i == 1 ? x.x[0].y : i == 2 ? x.x[0].z : x.x[0].w,
                                i == 0 ? x.x[1].x : i == 1 ? x.x[1].y : i == 2 ? x.x[1].z : x.x[1].w,
                                i == 0 ? x.x[2].x : i == 1 ? x.x[2].y : i == 2 ? x.x[2].z : x.x[2].w,
                                i == 0 ? x.x[3].x : i == 1 ? x.x[3].y : i == 2 ? x.x[3].z : x.x[3].w};
        s0 = kiln_q6dot((a[i] & 0x0F0F0F0Fu) | ((h[i] << 4) & 0x30303030u), xi[0], s0);
        s1 = kiln_q6dot((b[i] & 0x0F0F0F0Fu) | ((h[i] << 2) & 0x30303030u), xi[1], s1);
        s2 = kiln_q6dot(((a[i] >> 4) & 0x0F0F0F0Fu) | (h[i] & 0x30303030u), xi[2], s2);
        s3 = kiln_q6dot(((b[i] >> 4) & 0x0F0F0F0Fu) | ((h[i] >> 2) & 0x30303030u), xi[3], s3);
    }
    const int sh = 8 * w.g;
    const float c0 = (float)(signed char)(w.sw.x >> sh), c1 = (float)(signed char)(w.sw.x >> (sh + 16));
    const float c2 = (float)(signed char)(w.sw.y >> sh), c3 = (float)(signed char)(w.sw.y >> (sh + 16));
    return kiln_qh2f(w.d) * ((c0 * (x.d.x * (float)s0 - 32.0f * x.s[0]) + c1 * (x.d.y * (float)s1 - 32.0f * x.s[1])) +
                             (c2 * (x.d.z * (float)s2 - 32.0f * x.s[2]) + c3 * (x.d.w * (float)s3 - 32.0f * x.s[3])));
}
]]

-- Lines (for kit.builder's add) that quantize K elements of b (a float pointer expression,
-- 16-byte aligned, contiguous) into the shared arrays QB, QD, QS (declared here) with T
-- threads, then wait for them all. Each thread takes 8 elements at a time; the 4 threads of a
-- block find its max and the 2 of a half its sum by shuffles among themselves (the loop's last
-- round may leave groups out, never part of one). With `norm` ({ w = the norm weight's float
-- pointer expression, eps = its literal }: pass rms_norm_gemv) b is x, quantized as x * w, and
-- `bscale` = 1/sqrt(mean(x²) + eps) (ggml's rms_norm, in f32) is declared for the store.
function M.bq_prologue(K, T, bexpr, norm)
    local L = {
        string.format("__shared__ __align__(16) unsigned char QB[%d]; /* b's int8 planes (quant.lua) */", K + 16),
        string.format("__shared__ __align__(16) float QD[%d]; /* 8- and 16-byte loads of them (q4_K, q5_K) */", K // 32),
        string.format("__shared__ __align__(16) float QS[%d];", K // 16),
        norm and string.format("__shared__ float QN[%d]; /* the warps' sums of x² */", T // 32) or nil,
        string.format("const unsigned char *const P0 = QB, *const P1 = QB + %d;", K // 2 + 16),
        "{",
        string.format("    const float *const bq = %s;", bexpr),
        norm and string.format("    const float *const wq = %s; /* the norm's weight */", norm.w) or nil,
        norm and "    float ss = 0.0f; /* sum of x² */" or nil,
        "    const unsigned gm = 0xFu << (threadIdx.x & 28u);",
        "#pragma unroll 2",
        string.format("    for (unsigned c = threadIdx.x; c < %du; c += %du) {", K // 8, T),
        norm and "        float4 v0 = kiln_qb4(bq + 8u * c), v1 = kiln_qb4(bq + 8u * c + 4u);"
            or "        const float4 v0 = kiln_qb4(bq + 8u * c), v1 = kiln_qb4(bq + 8u * c + 4u);",
        norm and "        const float4 n0 = kiln_qb4(wq + 8u * c), n1 = kiln_qb4(wq + 8u * c + 4u);" or nil,
        norm and "        ss += ((v0.x * v0.x + v0.y * v0.y) + (v0.z * v0.z + v0.w * v0.w)) + ((v1.x * v1.x + v1.y * v1.y) + (v1.z * v1.z + v1.w * v1.w));" or nil,
        norm and "        v0.x *= n0.x, v0.y *= n0.y, v0.z *= n0.z, v0.w *= n0.w, v1.x *= n1.x, v1.y *= n1.y, v1.z *= n1.z, v1.w *= n1.w;" or nil,
        "        float m = fmaxf(fmaxf(fmaxf(fabsf(v0.x), fabsf(v0.y)), fmaxf(fabsf(v0.z), fabsf(v0.w))),",
        "                        fmaxf(fmaxf(fabsf(v1.x), fabsf(v1.y)), fmaxf(fabsf(v1.z), fabsf(v1.w))));",
        "        m = fmaxf(m, __shfl_xor_sync(gm, m, 1));",
        "        m = fmaxf(m, __shfl_xor_sync(gm, m, 2));",
        "        const float id = m > 0.0f ? 127.0f / m : 0.0f;",
        "        const int q0 = __float2int_rn(v0.x * id), q1 = __float2int_rn(v0.y * id), q2 = __float2int_rn(v0.z * id),",
        "                  q3 = __float2int_rn(v0.w * id), q4 = __float2int_rn(v1.x * id), q5 = __float2int_rn(v1.y * id),",
        "                  q6 = __float2int_rn(v1.z * id), q7 = __float2int_rn(v1.w * id);",
        "        const unsigned w0 = __byte_perm(__byte_perm(q0, q1, 0x40u), __byte_perm(q2, q3, 0x40u), 0x5410u);",
        "        const unsigned w1 = __byte_perm(__byte_perm(q4, q5, 0x40u), __byte_perm(q6, q7, 0x40u), 0x5410u);",
        "        int sum = ((q0 + q1) + (q2 + q3)) + ((q4 + q5) + (q6 + q7));",
        "        sum += __shfl_xor_sync(gm, sum, 1);",
        "        const unsigned j = c >> 2, t = c & 3u;",
        string.format("        *(uint2 *)(QB + (t >> 1) * %du + 16u * j + 8u * (t & 1u)) = make_uint2(w0, w1);", K // 2 + 16),
        "        const float d = m * (1.0f / 127.0f);",
        "        if ((t & 1u) == 0u)",
        "            QS[2u * j + (t >> 1)] = d * (float)sum;",
        "        if (t == 0u)",
        "            QD[j] = d;",
        "    }",
    }
    L = kit.compact(L)
    if norm then
        L[#L + 1] = "#pragma unroll"
        L[#L + 1] = "    for (int o = 16; o > 0; o >>= 1)"
        L[#L + 1] = "        ss += __shfl_xor_sync(0xffffffffu, ss, o);"
        L[#L + 1] = "    if ((threadIdx.x & 31u) == 0u)"
        L[#L + 1] = "        QN[threadIdx.x >> 5] = ss;"
    end
    L[#L + 1] = "}"
    L[#L + 1] = "__syncthreads();"
    if norm then
        L[#L + 1] = "float bscale = 0.0f; /* the norm's scale, applied at the store */"
        L[#L + 1] = "#pragma unroll"
        L[#L + 1] = string.format("for (int w = 0; w < %d; w++)", T // 32)
        L[#L + 1] = "    bscale += QN[w];"
        L[#L + 1] = string.format("bscale = 1.0f / sqrtf(bscale / %d.0f + %s);", K, norm.eps)
    end
    return L
end

-- Lines (for a kit builder b) declaring unit i's block ub<i> and part pt<i> in the row, for a
-- lane whose first unit is lane_unit and takes every step-th: in whole rounds, unit 0's block
-- advanced by whole blocks (the weight addresses become one base and constant offsets); in a
-- partial last round, units past NU load unit NU - 1 again (the loop adds nothing for them).
function M.unit_index(b, i, lane_unit, step, UB, NU, partial)
    if not partial and i > 0 then
        b.add("const int ub%d = ub0 + %d, pt%d = pt0;", i, step * i // UB, i)
        return
    end
    b.add("const int u%d = %s;", i, partial and string.format("min(%s + %d, %d)", lane_unit, step * i, NU - 1)
        or string.format("%s + %d", lane_unit, step * i))
    if UB > 1 then
        b.add("const int ub%d = u%d >> %d, pt%d = u%d & %d;", i, i, math.floor(math.log(UB, 2) + 0.5), i, i, UB - 1)
    else
        b.add("const int ub%d = u%d, pt%d = 0;", i, i, i)
    end
end

-- The quantized GEMVs' main loop (matmul.lua's qgemv, matmul_id.lua's qgemv_id), for a kit
-- builder b: for each of the lane's NI units, the loads of unit i + PF first (loads, the
-- template's), then unit i's weights w<i> (n products: rows, twice with a paired weight)
-- against b's bytes of the unit into acc[0 .. n-1]. In a partial last round (`partial`) only
-- the lanes whose unit exists (lane_unit + step i < NU) add.
function M.unit_loop(b, t, NI, PF, n, loads, partial, lane_unit, step, NU)
    for i = 0, NI - 1 do
        if i + PF < NI then loads(i + PF) end
        b.open("{")
        local guard = partial and i == NI - 1
        if guard then
            b.add("if (%s + %d < %d) {", lane_unit, step * i, NU)
            b.push()
        end
        b.add("const kiln_qb_%s x = kiln_qbl_%s(P0, P1, QD, QS, ub%d, pt%d);", t, t, i, i)
        b.add("#pragma unroll")
        b.add("for (int r = 0; r < %d; r++)", n)
        b.add("    acc[r] += kiln_qwd_%s(w%d[r], x);", t, i)
        if guard then
            b.pop()
            b.add("}")
        end
        b.close()
    end
end

-- The CUDA text of type t's helpers (`dq8`: eight dequantized elements; `i8`: the int8 path's;
-- neither: the common ones and the type's own, for qmma.lua's tile).
function M.helpers(t, dq8, i8)
    local parts = { COMMON }
    if EXTRA[t] then parts[#parts + 1] = EXTRA[t] end
    if dq8 then parts[#parts + 1] = DQ8[t] end
    if i8 then parts[#parts + 1] = I8[t] end
    return table.concat(parts, "\n")
end

-- "W" and "NB" (its blocks, which the tiled layout's last tile needs; or the names wn, nn) of
-- a quantized ref r in parameter p<r.param>, whose buffer has `bytes` bytes.
function M.pointers(r, fail, wn, nn)
    wn, nn = wn or "W", nn or "NB"
    local ti = TYPES[r.type]
    if not r.bytes or r.bytes % ti.size ~= 0 then fail("%s buffer of %s bytes", r.type, tostring(r.bytes)) end
    return {
        string.format("const unsigned char *const %s = (const unsigned char *)p%d;", wn, r.param),
        string.format("const long long %s = %dll; /* blocks in the buffer%s */", nn, r.bytes // ti.size,
            ti.rest and " (tiled layout)" or ", unused: the file's layout"),
    }
end

-- Refusal of what the quantized kernels cannot address: an operand whose element offset or
-- strides are not whole blocks (the frontend guarantees whole blocks for every view).
function M.check_blocks(r, fail, what)
    local bl = TYPES[r.type].block
    if r.offs % bl ~= 0 then fail("%s: offset %d is not a whole number of %s blocks", what, r.offs, r.type) end
    for d = 2, 4 do
        if r.ne[d] > 1 and r.st[d] % bl ~= 0 then fail("%s: stride st[%d] = %d is not whole %s blocks", what, d - 1, r.st[d], r.type) end
    end
    if r.st[1] ~= 1 and r.ne[1] > 1 then fail("%s: rows must be contiguous", what) end
    if r.ne[1] % bl ~= 0 then fail("%s: ne0 = %d is not a multiple of the %s block (%d)", what, r.ne[1], r.type, bl) end
end

local DQ_BLOCK = 256
local DQ_GRID_SKIP = 1056 -- most blocks of a dequantization that may skip its run (8 an H100 SM)

-- "(long long)expr * s" (nil when s is 0), and the sum of the non-nil terms of a list.
local function term64(expr, s)
    if s == 0 then return nil end
    if s == 1 then return "(long long)" .. expr end
    return "(long long)" .. expr .. " * " .. kit.int_lit(s)
end

local function sum(terms)
    local t, n = {}, 0
    for i in pairs(terms) do if i > n then n = i end end
    for i = 1, n do if terms[i] then t[#t + 1] = terms[i] end end
    return #t > 0 and table.concat(t, " + ") or "0"
end

-- A step that dequantizes quantized ref a ([K, M, A2, A3]) into the scratch at byte `base` as
-- contiguous f16 (8 elements a thread, one 16-byte store), and the bytes it writes.
-- skip: nil, or {C expression, n}: the step does nothing while the expression is at most n (a
-- quantized mul_mat whose tensor-core tile takes this run's few columns: templates/qmma.lua).
function M.dequant_step(nparams, params, a, base, what, fail, prefix, skip)
    M.check_blocks(a, fail, what)
    local ti = TYPES[a.type]
    local K, R, A2, A3 = a.ne[1], a.ne[2], a.ne[3], a.ne[4]
    local total = K * R * A2 * A3 // 8
    if total > 4294967295 then fail("%s: %d elements are too many to dequantize", what, K * R * A2 * A3) end
    local BL = ti.block
    local b = kit.builder()
    b.push()
    if skip then
        b.add("if ((unsigned)(%s) <= %du)", skip[1], skip[2])
        b.add("    return; /* the quantized tensor-core tile took these columns */")
    end
    for _, l in ipairs(M.pointers(a, fail)) do b.add("%s", l) end
    b.add("unsigned char *const S = (unsigned char *)p%d%s;", nparams, base > 0 and " + " .. kit.int_lit(base) or "")
    -- With skip, runs that return at once are common (batched decode): a grid of at most
    -- DQ_GRID_SKIP blocks, each looping, costs them one wave of empty blocks instead of one block
    -- per 2048 weights (a 4096 x 14336 weight: 28672 blocks, tens of microseconds a launch).
    local grid = kit.ceil_div(total, DQ_BLOCK)
    local looped = skip and grid > DQ_GRID_SKIP
    if looped then
        grid = DQ_GRID_SKIP
        b.open("for (unsigned idx = blockIdx.x * %du + threadIdx.x; idx < %du; idx += %du) {", DQ_BLOCK, total, grid * DQ_BLOCK)
    else
        b.add("const unsigned idx = blockIdx.x * %du + threadIdx.x;", DQ_BLOCK)
        if total % DQ_BLOCK ~= 0 then
            b.add("if (idx >= %du)", total)
            b.add("    return;")
        end
    end
    b.add("const unsigned kk = idx %% %du * 8u, r = idx / %du;", K // 8, K // 8)
    if A2 * A3 > 1 then
        b.add("const unsigned row = r %% %du, g = r / %du;", R, R)
    else
        b.add("const unsigned row = r;")
    end
    b.add("const long long blk = %s + (long long)(kk / %du);", sum({ kit.int_lit(a.offs // BL), term64("row", (a.st[2] // BL)),
        A2 > 1 and term64("(g % " .. A2 .. "u)", a.st[3] // BL) or nil,
        A3 > 1 and term64("(g / " .. A2 .. "u)", a.st[4] // BL) or nil }), BL)
    b.add("float v[8];")
    b.add("kiln_dq8_%s(W, NB, blk, (int)(kk %% %du), v);", a.type, BL)
    b.add("unsigned h[4];")
    b.add("#pragma unroll")
    b.add("for (int i = 0; i < 4; i++)")
    b.add("    asm(\"cvt.rn.f16x2.f32 %0, %1, %2;\" : \"=r\"(h[i]) : \"f\"(v[2 * i + 1]), \"f\"(v[2 * i]));")
    b.add("*(uint4 *)(S + (unsigned long long)idx * 16ull) = make_uint4(h[0], h[1], h[2], h[3]);")
    if looped then b.close() end
    local name = string.format("%s%s_%dx%dx%d", prefix, a.type, K, R, A2 * A3):sub(1, 63)
    local source = kit.kernel {
        head = { "kiln kernel " .. name, string.format("dequantize %s %s %s into the scratch as f16", what, kit.dims(a.ne), a.type) },
        notes = { "as ggml's cuBLAS path: quantized weights become f16 for the f16 plan that follows" },
        pre = "", blocks = { M.helpers(a.type, true) }, inline = true, name = name,
        threads = DQ_BLOCK, params = params, body = b.lines,
    }
    return { name = name, source = source, grid = { grid, 1, 1 }, block = { DQ_BLOCK, 1, 1 }, smem = 0 },
        K * R * A2 * A3 * 2
end


-- get_rows of a quantized a (an embedding table): dst[:, i1, i2, i3] = a[:, ids[i1, i2, i3],
-- i2, i3] dequantized to f32, one thread per 8 elements; an id out of range gives a row of
-- zeros (as rows.lua). ids' dim 1 may be symbolic (the tokens of a ubatch).
function M.get_rows(k, fail)
    local a, ids, d = k.args.a, k.args.ids, k.dst
    if ids.type ~= "i32" or d.type ~= "f32" then fail("get_rows: ids %s, dst %s (want i32, f32)", ids.type, d.type) end
    M.check_blocks(a, fail, "get_rows: a")
    if d.st[1] ~= 1 then fail("get_rows: dst rows must be contiguous") end
    for i = 1, 4 do
        if (a.dyn and a.dyn[i]) or (d.dyn and d.dyn[i] and i ~= 2) or (ids.dyn and ids.dyn[i] and i ~= 1) then
            fail("get_rows of %s: only ids' dim 0 may be symbolic", a.type)
        end
    end
    local ti = TYPES[a.type]
    local BL, ne0 = ti.block, d.ne[1]
    local n1, n2, n3 = d.ne[2], d.ne[3], d.ne[4]
    local per = ne0 // 8
    local total = per * n1 * n2 * n3
    if total > 4294967295 then fail("get_rows: %d elements are too many", ne0 * n1 * n2 * n3) end
    local b = kit.builder()
    b.push()
    for _, l in ipairs(M.pointers(a, fail)) do b.add("%s", l) end
    b.add("const int *const I = (const int *)p%d%s;", ids.param, ids.offs ~= 0 and " + " .. kit.int_lit(ids.offs) or "")
    b.add("float *const Y = (float *)p%d%s;", d.param, d.offs ~= 0 and " + " .. kit.int_lit(d.offs) or "")
    b.add("const unsigned idx = blockIdx.x * %du + threadIdx.x;", DQ_BLOCK)
    if total % DQ_BLOCK ~= 0 then
        b.add("if (idx >= %du)", total)
        b.add("    return;")
    end
    b.add("const unsigned c8 = idx %% %du, row = idx / %du;", per, per)
    if n2 * n3 > 1 then
        b.add("const unsigned i1 = row %% %du, i2 = row / %du %% %du, i3 = row / %du;", n1, n1, n2, n1 * n2)
    else
        b.add("const unsigned i1 = row; /* (one matrix: i2 = i3 = 0) */")
    end
    if ids.dyn and ids.dyn[1] then
        b.add("if (i1 >= (unsigned)(%s))", ids.dyn[1])
        b.add("    return;")
    end
    b.add("const int r = I[%s];", sum({ term64("i1", ids.st[1]), term64("i2", n2 > 1 and ids.st[2] or 0),
        term64("i3", n3 > 1 and ids.st[3] or 0) }))
    b.add("const bool ok = (unsigned)r < %du;", a.ne[2])
    b.add("const long long blk = %s + (long long)(c8 * 8u / %du);", sum({ kit.int_lit(a.offs // BL),
        term64("(ok ? r : 0)", a.st[2] // BL), term64("i2", a.ne[3] > 1 and a.st[3] // BL or 0),
        term64("i3", a.ne[4] > 1 and a.st[4] // BL or 0) }), BL)
    b.add("float v[8];")
    b.add("kiln_dq8_%s(W, NB, blk, (int)(c8 * 8u %% %du), v);", a.type, BL)
    b.add("float *const y = Y + %s + c8 * 8u;", sum({ term64("i1", d.st[2]), term64("i2", n2 > 1 and d.st[3] or 0),
        term64("i3", n3 > 1 and d.st[4] or 0) }))
    b.add("#pragma unroll")
    b.add("for (int j = 0; j < 8; j++)")
    b.add("    y[j] = ok ? v[j] : 0.0f;")
    local plist = {}
    for p = 0, k.nparams - 1 do
        plist[#plist + 1] = (p == d.param and "char" or "const char") .. " *__restrict__ p" .. p
    end
    local dynamic = k.dims and #k.dims > 0
    if dynamic then plist[#plist + 1] = "const int* __restrict__ kdims" end
    local name = string.format("get_rows_%s_%d", a.type, ne0)
    local source = kit.kernel {
        head = { "kiln rows kernel " .. name, "dst[:, i1, i2, i3] = f32(a[:, ids[i1, i2, i3], i2, i3]), a " .. a.type },
        notes = { string.format("%d rows of %d, 8 elements a thread", n1 * n2 * n3, ne0) },
        pre = "", blocks = { M.helpers(a.type, true) }, inline = true, name = name,
        threads = DQ_BLOCK, params = table.concat(plist, ", "), body = b.lines,
    }
    return { name = name, source = source, grid = { kit.ceil_div(total, DQ_BLOCK), 1, 1 }, block = { DQ_BLOCK, 1, 1 },
        smem = 0, dynamic = dynamic or nil }
end

return M
