-- qmma: mul_mat of quantized weights against 2..64 columns on tensor cores, each weight read
-- once from memory for all the columns (batched decode: kiln_batch, kiln serve). Without it a
-- quantized mul_mat of more than one column dequantizes the whole weight to f16 (2 bytes a
-- weight written, then read again by cuBLAS) at every step.
--
-- Three steps (matmul.lua's quant_matmul):
-- * pack: b (f32 [K, n]) rounded to f16 into the scratch in fragment order: for each
--   256-element super-block sb, k-step j (0..15), 8-column tile nt and lane l = 4g + t, the 8
--   bytes that lane l passes to mma.sync as its b words for column nt*8 + g (zeros past n);
-- * main: a block of WARPS warps owns 32*WARPS rows and a range of super-blocks (split-K when the
--   rows alone give too few blocks); every super-block's packed b is copied to shared memory
--   with cp.async (double-buffered) and serves all the block's rows; each lane dequantizes the
--   weights it feeds to mma.sync m16n8k16 (f16 in, f32 accumulate) in registers, the loads of the
--   next super-block in flight meanwhile;
-- * reduce (split-K only): dst = the sum of the splits' partial products, in split order.
--
-- The permutation of k. A dot product does not care in which order k runs: in k-step j of a
-- super-block, lane t (of the 4 that share a row) supplies the elements
--   e = 64t + 32(j & 1) + 4(j >> 1) + {0, 1, 2, 3}
-- as its A words (e0, e1) and (e2, e3) (mma k 2t..2t+1 and 2t+8..2t+9) and the pack step puts
-- b's values at the same e in its B words, so both operands use one permutation. For q4_K these
-- are the low (j even) or high (j odd) nibbles of bytes 32t + 4(j >> 1).. of the quants: one
-- 32-bit word of the lane's own 32 bytes, from sub-block 2t + (j & 1), one scale and min. For
-- the 32-element block types (q8_0, q4_0) they are elements 4(j >> 1).. of block 2t + (j & 1)
-- of the step's 8 blocks (q5_0 and q5_1 as q4_0, with their fifth bits). mxfp4 (its codes need
-- a table) is not here yet.
-- Rounding: weights are dequantized to f16 (v * scale - min, one f16 fma), b is rounded to f16,
-- as in ggml's cuBLAS path; the sums are f32.

local kit = require("kit")
local quant = require("quant")

local M = {}

M.MAX_COLS = 64 -- columns (8 tiles of 8) a run takes at most
local WARPS = 4 -- warps per block; a warp owns 32 rows (two 16-row mma tiles)
local TARGET = 264 -- block slots of one wave (two blocks an H100 SM: 211 registers a lane)
local BLOCK = 32 * WARPS
local RED_BLOCK = 256
local RED_GRID = 264 -- most blocks of the split-K sum
local PACK_GRID = 264 -- most blocks of the packing of b

-- Per type: block (elements a block; 256 when absent), decl and load (the lane's registers of one
-- 256-element step of a row, named by prefix), prep (the row's scales, after the loads arrive),
-- pairs (the f16 pairs of k-step j), and with prefetch the copy of the next step's registers.
-- Types without an entry take the dequantize + cuBLAS path.
local TYPES = {}

-- Word m (0..7) of a lane's 8 words held in two uint4 registers pa, pb (p the row's prefix).
local function word(p, a, b, m)
    return string.format("%s%s.%s", p, m < 4 and a or b, ("xyzw"):sub(m % 4 + 1, m % 4 + 1))
end

-- The f16 pairs (e0, e1) and (e2, e3) of the 4 byte values in C expression x, as v * s + n with
-- the row's scales s{h}_{r} and offsets n{h}_{r}.
local function nibble_pairs(x, h, r, lo, hi)
    return {
        string.format("{ const unsigned x = %s;", x),
        string.format("  %s = kiln_qm_dq(__byte_perm(x, 0x64u, 0x4140u), s%d_%d, n%d_%d);", lo, h, r, h, r),
        string.format("  %s = kiln_qm_dq(__byte_perm(x, 0x64u, 0x4342u), s%d_%d, n%d_%d); }", hi, h, r, h, r),
    }
end

-- q4_K/q5_K scales of the lane's sub-blocks 2t and 2t+1 from the row's 16-byte head ph:
-- s{0,1} = d * sc, n{0,1} = -dmin * m, as half2.
local function k_scales(p, r)
    return {
        string.format("unsigned s0_%d, s1_%d, n0_%d, n1_%d;", r, r, r, r),
        "{",
        string.format("    const float d = kiln_qh2f(%sh.x & 0xFFFFu), dm = kiln_qh2f(%sh.x >> 16);", p, p),
        "    float sc, mn;",
        string.format("    kiln_qscale_k4(2 * t, %sh.y, %sh.z, %sh.w, &sc, &mn);", p, p, p),
        string.format("    s0_%d = kiln_h2(d * sc); n0_%d = kiln_h2(-dm * mn);", r, r),
        string.format("    kiln_qscale_k4(2 * t + 1, %sh.y, %sh.z, %sh.w, &sc, &mn);", p, p, p),
        string.format("    s1_%d = kiln_h2(d * sc); n1_%d = kiln_h2(-dm * mn);", r, r),
        "}",
    }
end

-- The 32-element block types (tiled layout: kiln_qtb, kiln_qts): the lane's elements of a
-- 256-element step are blocks 2t (j even) and 2t + 1 (j odd), elements 4(j >> 1).. of each.
-- Scales: the block's f16 d as a half2 (exact), the offset n = -off * d (off a power of two:
-- exact) through kiln_qm_neg (f16 of -off).
local function b32_type(size, rest, body16, off_f16, pairs)
    return {
        block = 32,
        decl = function(p)
            if body16 == 2 then return string.format("uint4 %sa, %sa2, %sb, %sb2; unsigned %sd0, %sd1;", p, p, p, p, p, p) end
            return string.format("uint4 %sa, %sb; unsigned %sd0, %sd1;", p, p, p, p)
        end,
        load = function(p, blk)
            local l = {
                string.format("{ const long long bk = %s + 2 * t;", blk),
                string.format("  const unsigned char *const q0 = kiln_qtb(W, bk, %d, %d), *const q1 = kiln_qtb(W, bk + 1, %d, %d);", size, rest, size, rest),
                string.format("  %sa = kiln_q16(q0); %sb = kiln_q16(q1);", p, p),
            }
            if body16 == 2 then l[#l + 1] = string.format("  %sa2 = kiln_q16(q0 + 16); %sb2 = kiln_q16(q1 + 16);", p, p) end
            l[#l + 1] = string.format("  %sd0 = kiln_qts(W, NB, bk, %d, %d); %sd1 = kiln_qts(W, NB, bk + 1, %d, %d); }", p, size, rest, p, size, rest)
            return l
        end,
        prep = function(p, r)
            return {
                string.format("const unsigned s0_%d = %sd0 | (%sd0 << 16), s1_%d = %sd1 | (%sd1 << 16);", r, p, p, r, p, p),
                string.format("const unsigned n0_%d = kiln_qm_neg(s0_%d, 0x%04Xu), n1_%d = kiln_qm_neg(s1_%d, 0x%04Xu);", r, r, off_f16, r, r, off_f16),
            }
        end,
        pairs = pairs,
    }
end

-- q8_0: byte 4m + i of the block is element 4m + i; the signed byte as 128 + v (xor 0x80).
TYPES.q8_0 = b32_type(34, 32, 2, 0xD800, function(p, r, j, lo, hi)
    local m, h = j >> 1, j & 1
    local a, b = h == 0 and "a" or "b", h == 0 and "a2" or "b2"
    return nibble_pairs(string.format("%s ^ 0x80808080u", word(p, a, b, m)), h, r, lo, hi)
end)

-- q4_0: element e < 16 is the low nibble of byte e, e >= 16 the high nibble of byte e - 16;
-- the value is the nibble - 8.
TYPES.q4_0 = b32_type(18, 16, 1, 0xC800, function(p, r, j, lo, hi)
    local m, h = j >> 1, j & 1
    local reg = string.format("%s%s.%s", p, h == 0 and "a" or "b", ("xyzw"):sub(m % 4 + 1, m % 4 + 1))
    return nibble_pairs(string.format("(%s%s) & 0x0F0F0F0Fu", reg, m >= 4 and " >> 4" or ""), h, r, lo, hi)
end)

-- q5_0 / q5_1 (tiled: 16 bytes of low nibbles a block, then the tile's heads, kiln_q5h_T): q4_0's
-- element order, each nibble's fifth bit from the head's 32 high bits (bit e: element e), spread
-- to bit 4 of its byte (kiln_q5spread_T). q5_0: v * d - 16 d (offset -16, f16 0xCC00); q5_1:
-- v * d + m (n is the block's f16 m).
local function q5_type(t)
    local size, min = t == "q5_0" and 22 or 24, t == "q5_1"
    return {
        block = 32,
        decl = function(p) return string.format("uint4 %sa, %sb; uint2 %sh0, %sh1;", p, p, p, p) end,
        load = function(p, blk)
            return {
                string.format("{ const long long bk = %s + 2 * t;", blk),
                string.format("  %sa = kiln_q16(kiln_qtb(W, bk, %d, 16)); %sb = kiln_q16(kiln_qtb(W, bk + 1, %d, 16));", p, size, p, size),
                string.format("  %sh0 = kiln_q5h_%s(W, NB, bk); %sh1 = kiln_q5h_%s(W, NB, bk + 1); }", p, t, p, t),
            }
        end,
        prep = function(p, r)
            local l = {}
            for h = 0, 1 do
                l[#l + 1] = string.format("const unsigned s%d_%d = (%sh%d.x & 0xFFFFu) * 0x10001u;", h, r, p, h)
                l[#l + 1] = min and string.format("const unsigned n%d_%d = (%sh%d.x >> 16) * 0x10001u;", h, r, p, h)
                    or string.format("const unsigned n%d_%d = kiln_qm_neg(s%d_%d, 0xCC00u);", h, r, h, r)
            end
            return l
        end,
        pairs = function(p, r, j, lo, hi)
            local m, h = j >> 1, j & 1
            local reg = string.format("%s%s.%s", p, h == 0 and "a" or "b", ("xyzw"):sub(m % 4 + 1, m % 4 + 1))
            return nibble_pairs(string.format("((%s%s) & 0x0F0F0F0Fu) | kiln_q5spread_%s(%sh%d.y >> %d)", reg,
                m >= 4 and " >> 4" or "", t, p, h, 4 * m), h, r, lo, hi)
        end,
    }
end
TYPES.q5_0 = q5_type("q5_0")
TYPES.q5_1 = q5_type("q5_1")

-- q4_K (the file's 144-byte blocks): d, dmin, 12 scale bytes; quants: byte 32c + l holds
-- element 64c + l (low nibble) and 64c + 32 + l (high). Lane t reads the 16-byte head (the 4
-- lanes of a row read the same 16 bytes: one transaction) and its 32 bytes 32t.. (chunk t).
TYPES.q4_K = {
    -- the next step's loads in flight during the products: 12 registers a row, 4 rows, twice
    -- (q6_K's 29 a row would not fit twice; the other types have none yet)
    prefetch = true,
    decl = function(p) return string.format("uint4 %sh, %sa, %sb;", p, p, p) end,
    load = function(p, blk)
        return {
            string.format("{ const unsigned char *const q = W + (%s) * 144ll;", blk),
            string.format("  %sh = kiln_q16(q); %sa = kiln_q16(q + 16 + 32 * t); %sb = kiln_q16(q + 32 + 32 * t); }", p, p, p),
        }
    end,
    copy = function(dst, src) return string.format("%sh = %sh; %sa = %sa; %sb = %sb;", dst, src, dst, src, dst, src) end,
    -- scales: half2 s{0,1} (d * sc of sub-blocks 2t, 2t+1) and n{0,1} (-dmin * m)
    prep = function(p, r) return k_scales(p, r) end,
    pairs = function(p, r, j, lo, hi)
        local m, h = j >> 1, j & 1
        return nibble_pairs(string.format("(%s%s) & 0x0F0F0F0Fu", word(p, "a", "b", m), h == 1 and " >> 4" or ""), h, r, lo, hi)
    end,
}

-- q5_K (the file's 176-byte blocks): q4_K's head, then qh[32] (bit 2c + h of qh[l] is the fifth
-- bit of element 64c + 32h + l), then the 128 quant bytes as q4_K's. Lane t reads the head, all
-- 32 qh bytes and its 32 quant bytes.
TYPES.q5_K = {
    decl = function(p) return string.format("uint4 %sh, %sq0, %sq1, %sa, %sb;", p, p, p, p, p) end,
    load = function(p, blk)
        return {
            string.format("{ const unsigned char *const q = W + (%s) * 176ll;", blk),
            string.format("  %sh = kiln_q16(q); %sq0 = kiln_q16(q + 16); %sq1 = kiln_q16(q + 32);", p, p, p),
            string.format("  %sa = kiln_q16(q + 48 + 32 * t); %sb = kiln_q16(q + 64 + 32 * t); }", p, p),
        }
    end,
    prep = function(p, r) return k_scales(p, r) end,
    pairs = function(p, r, j, lo, hi)
        local m, h = j >> 1, j & 1
        return nibble_pairs(string.format("((%s%s) & 0x0F0F0F0Fu) | (((%s >> (2 * t + %d)) & 0x01010101u) << 4)",
            word(p, "a", "b", m), h == 1 and " >> 4" or "", word(p, "q0", "q1", m), h), h, r, lo, hi)
    end,
}

-- q6_K (tiled layout, quant.lua: ql[128] qh[64] scales[16] a block, the f16 d after the tile's
-- bodies). Element e = 128h + 32q + l: low 4 bits in ql[64h + 32(q & 1) + l] (nibble q >> 1),
-- high 2 bits in qh[32h + l] >> 2q, scale scales[8h + 2q + l / 16]. Lane t's elements have
-- h = t >> 1 and q = 2(t & 1) + (j & 1), l = 4(j >> 1)..: its ql bytes 64h..64h+63 (the nibble
-- t & 1), its qh bytes 32h..32h+31 and the 16 scale bytes.
TYPES.q6_K = {
    decl = function(p) return string.format("uint4 %sl0, %sl1, %sl2, %sl3, %sq0, %sq1, %ss; unsigned %sd;", p, p, p, p, p, p, p, p) end,
    load = function(p, blk)
        return {
            string.format("{ const long long bk = %s; const unsigned char *const q = kiln_qtb(W, bk, 210, 208);", blk),
            string.format("  const unsigned char *const ql = q + 64 * (t >> 1), *const qh = q + 128 + 32 * (t >> 1);"),
            string.format("  %sl0 = kiln_q16(ql); %sl1 = kiln_q16(ql + 16); %sl2 = kiln_q16(ql + 32); %sl3 = kiln_q16(ql + 48);", p, p, p, p),
            string.format("  %sq0 = kiln_q16(qh); %sq1 = kiln_q16(qh + 16); %ss = kiln_q16(q + 192); %sd = kiln_qts(W, NB, bk, 210, 208); }",
                p, p, p, p),
        }
    end,
    -- scales: half2 s{hf}{i}: d * scales[8h + 2q + i], q = 2(t & 1) + hf, i = l / 16: byte
    -- 2hf + i of word 2h + (t & 1) of the 16 scale bytes (no min: the -32 offset is in the pair)
    prep = function(p, r)
        local l = { string.format("unsigned s00_%d, s01_%d, s10_%d, s11_%d;", r, r, r, r), "{" }
        l[#l + 1] = string.format("    const float d = kiln_qh2f(%sd);", p)
        l[#l + 1] = string.format("    const unsigned w = (t >> 1) ? ((t & 1u) ? %ss.w : %ss.z) : ((t & 1u) ? %ss.y : %ss.x);", p, p, p, p)
        for hf = 0, 1 do
            for i = 0, 1 do
                l[#l + 1] = string.format("    s%d%d_%d = kiln_h2(d * (float)(signed char)(w >> %d));", hf, i, r, 8 * (2 * hf + i))
            end
        end
        l[#l + 1] = "}"
        return l
    end,
    pairs = function(p, r, j, lo, hi)
        local m, hf = j >> 1, j & 1
        -- ql word: bytes 32hf + 4m of the lane's 64 (l0..l3: 16 bytes each)
        local qb = 32 * hf + 4 * m
        local ql = string.format("%sl%d.%s", p, qb // 16, ("xyzw"):sub((qb % 16) // 4 + 1, (qb % 16) // 4 + 1))
        local hb = 4 * m
        local qh = string.format("%sq%d.%s", p, hb // 16, ("xyzw"):sub((hb % 16) // 4 + 1, (hb % 16) // 4 + 1))
        local i = (4 * m) // 16
        return {
            string.format("{ const unsigned x = ((%s >> (4 * (t & 1u))) & 0x0F0F0F0Fu) | (((%s >> (2 * (2 * (t & 1u) + %d))) & 0x03030303u) << 4);",
                ql, qh, hf),
            string.format("  %s = kiln_qm_dq(__byte_perm(x, 0x64u, 0x4140u), s%d%d_%d, kiln_qm_neg(s%d%d_%d, 0xD000u));", lo, hf, i, r, hf, i, r),
            string.format("  %s = kiln_qm_dq(__byte_perm(x, 0x64u, 0x4342u), s%d%d_%d, kiln_qm_neg(s%d%d_%d, 0xD000u)); }", hi, hf, i, r, hf, i, r),
        }
    end,
}

local HELPERS = [[
/* f to f16 in both halves. */
__device__ __forceinline__ unsigned kiln_h2(float f)
{
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %1;" : "=r"(r) : "f"(f));
    return r;
}
/* x holds two f16 1024 + v (v a small integer, exact): v * s + n, one rounding (f16x2 ops). */
__device__ __forceinline__ unsigned kiln_qm_dq(unsigned x, unsigned s, unsigned n)
{
    unsigned v, r;
    asm("sub.f16x2 %0, %1, %2;" : "=r"(v) : "r"(x), "r"(0x64006400u));
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(v), "r"(s), "r"(n));
    return r;
}
/* s times the f16 c (both halves): the offsets -off * scale (off a power of two: exact). */
__device__ __forceinline__ unsigned kiln_qm_neg(unsigned s, unsigned c)
{
    unsigned r;
    asm("mul.f16x2 %0, %1, %2;" : "=r"(r) : "r"(s), "r"(c | (c << 16)));
    return r;
}]]

-- The plan: nil when this path does not apply (then the caller dequantizes for cuBLAS), else
-- { steps, scratch } and the columns it takes at most (a symbolic N larger than that: its
-- steps return at once above it, and the caller adds the dequantizing path for those runs).
-- env: matmul.lua's param_list, lit, fail, and helpers (its recorder of device helpers: the
-- tile's mma.sync and cp.async are the f16 tensor-core tile's own).
function M.plan(k, s, env)
    local T = TYPES[s.ta]
    if not T or s.dK or s.dM or s.dB2 or s.dB3 or s.NG ~= 1 or s.r2 * s.r3 ~= 1 then return nil end
    if s.C < 2 or s.K % 256 ~= 0 or s.K < 256 then return nil end
    if s.K > 1 and s.sb[1] ~= 1 then return nil end
    if s.sd[1] > 1 then return nil end
    if s.N > M.MAX_COLS and not s.dN then return nil end
    quant.check_blocks(s.a, env.fail, "a")
    local cols = math.min(s.N, M.MAX_COLS)
    local NTS = kit.ceil_div(cols, 8)
    local NSB = s.K // 256
    local ROWS = 32 * WARPS
    local RBN = kit.ceil_div(s.M, ROWS)
    -- Split K while the rows leave block slots empty, within one wave of TARGET blocks (a
    -- second, partial wave would idle most SMs at its end) and at 4 super-blocks a split at least
    -- (each split pays the pipeline's fill).
    local S = math.max(1, math.min(TARGET // RBN, NSB // 4))
    local SPB = kit.ceil_div(NSB, S)
    S = kit.ceil_div(NSB, SPB)
    local above = s.N > M.MAX_COLS and M.MAX_COLS or nil
    local params = table.concat(env.param_list(k, 1), ", ")
    local base = k.scratch_base or 0
    local TILE = NTS * 4096 -- bytes of one super-block's packed b
    local pbase = kit.round_up(base + NSB * TILE, 256)
    local scratch = S > 1 and pbase + S * NTS * 8 * s.M * 4 or base + NSB * TILE
    local lit = env.lit
    local nexpr = s.dN and string.format("(unsigned)(%s)", s.dN) or tostring(s.N) .. "u"
    local function guard(b)
        if above then
            b.add("if (%s > %du)", nexpr, above)
            b.add("    return; /* more columns than this path takes: the dequantize + cuBLAS steps run */")
        end
    end
    local shape = string.format("%s [%d, %d] x %s%d columns", s.ta, s.K, s.M, s.dN and "at most " or "", cols)
    local head = { "", "mul_mat: dst " .. kit.dims(s.d.ne) .. " f32 = b " .. kit.dims(s.b.ne) .. " f32 · a " .. kit.dims(s.a.ne) .. " " .. s.ta .. "ᵀ" }

    -- pack: b to f16 in fragment order
    local pk = kit.builder()
    pk.push()
    guard(pk)
    pk.add("const float *const B = (const float *)p%d%s;", s.b.param, s.b.offs ~= 0 and " + " .. lit(s.b.offs) or "")
    pk.add("uint2 *const X = (uint2 *)(p%d%s);", k.nparams, base > 0 and " + " .. lit(base) or "")
    -- the run's ntr column tiles only (the main step copies no others), a grid of at most
    -- PACK_GRID blocks looping
    local total = NSB * 16 * NTS * 32
    local pgrid = math.min(kit.ceil_div(total, 256), PACK_GRID)
    if s.dN then
        pk.add("const unsigned ntr = min((%s + 7u) >> 3, %du), total = %du * ntr;", nexpr, NTS, NSB * 16 * 32)
    else
        pk.add("const unsigned ntr = %du, total = %du;", NTS, total)
    end
    pk.open("for (unsigned i = blockIdx.x * 256u + threadIdx.x; i < total; i += %du) {", pgrid * 256)
    pk.add("const unsigned lane = i & 31u, nt = (i >> 5) % ntr, q = (i >> 5) / ntr, j = q & 15u, sb = q >> 4;")
    pk.add("const unsigned col = nt * 8u + (lane >> 2), t = lane & 3u;")
    pk.add("const unsigned kk = sb * 256u + 64u * t + 32u * (j & 1u) + 4u * (j >> 1);")
    pk.add("uint2 v = make_uint2(0u, 0u);")
    pk.open("if (col < %s) {", nexpr)
    local cs = s.N > 1 and s.sb[2] or 0
    pk.add("const float *const src = B + (long long)col * %s + kk;", lit(cs))
    if s.b.offs % 4 == 0 and cs % 4 == 0 then
        pk.add("const float4 f = *(const float4 *)src;")
    else
        pk.add("const float4 f = make_float4(src[0], src[1], src[2], src[3]);")
    end
    pk.add("asm(\"cvt.rn.f16x2.f32 %0, %1, %2;\" : \"=r\"(v.x) : \"f\"(f.y), \"f\"(f.x));")
    pk.add("asm(\"cvt.rn.f16x2.f32 %0, %1, %2;\" : \"=r\"(v.y) : \"f\"(f.w), \"f\"(f.z));")
    pk.close()
    pk.add("X[(q * %du + nt) * 32u + lane] = v;", NTS)
    pk.close()
    local pname = string.format("mul_mat_qpk_%dx%d_%d", s.K, NTS, base):sub(1, 63)
    head[1] = "kiln matmul kernel " .. pname
    local psrc = kit.kernel {
        head = head, notes = { "b rounded to f16 in the fragment order of the quantized tensor-core tile (templates/qmma.lua)" },
        pre = "", blocks = {}, inline = true, name = pname, threads = 256, params = params, body = pk.lines,
    }
    local steps = { { name = pname, source = psrc, grid = { pgrid, 1, 1 }, block = { 256, 1, 1 }, smem = 0 } }

    -- main
    local H = env.helpers()
    H.use("mma_f16")
    H.use("cp16")
    H.use("cp_sync")
    local b = kit.builder()
    b.push()
    guard(b)
    for _, l in ipairs(quant.pointers(s.a, env.fail)) do b.add("%s", l) end
    b.add("(void)NB; /* (q4_K keeps the file's layout) */")
    b.add("const unsigned char *const X = (const unsigned char *)(p%d%s);", k.nparams, base > 0 and " + " .. lit(base) or "")
    if S > 1 then
        b.add("float *const P = (float *)(p%d + %s);", k.nparams, lit(pbase))
    else
        b.add("float *const D = (float *)p%d%s;", s.d.param, s.d.offs ~= 0 and " + " .. lit(s.d.offs) or "")
    end
    b.add("extern __shared__ __align__(16) unsigned char kiln_sm[];")
    b.add("const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3u;")
    if s.dN then
        b.add("const unsigned ntr = min((%s + 7u) >> 3, %du); /* column tiles this run */", nexpr, NTS)
    else
        b.add("const unsigned ntr = %du;", NTS)
    end
    b.add("const unsigned sb0 = blockIdx.y * %du, sb1 = min(sb0 + %du, %du);", SPB, SPB, NSB)
    b.add("const unsigned rbase = blockIdx.x * %du + warp * 32u;", ROWS)
    local BL = T.block or 256 -- elements a block (a 256-element step is 256 / BL blocks)
    local rs = s.sa[2] // BL -- row stride in blocks
    local aoff = s.a.offs // BL
    b.add("long long blk[4];")
    b.add("#pragma unroll")
    b.add("for (int i = 0; i < 4; i++)")
    b.add("    blk[i] = %s(long long)min(rbase + g + 8u * i, %du) * %s;", aoff > 0 and lit(aoff) .. " + " or "", s.M - 1, lit(rs))
    -- stage: super-block sb's packed b (its ntr tiles of each of the 16 k-steps) to buffer buf
    b.add("/* the copy of super-block sb's packed b into buffer buf: ntr of the %d tiles of each k-step */", NTS)
    b.add("#define KILN_STAGE(sb, buf) \\")
    b.add("    for (unsigned i_ = threadIdx.x; i_ < 256u * ntr; i_ += %du) { \\", BLOCK)
    b.add("        const unsigned j_ = i_ / (16u * ntr), c_ = i_ - j_ * 16u * ntr; \\")
    b.add("        kiln_cp16((float *)(kiln_sm + (buf) * %du + j_ * %du + c_ * 16u), (const float *)(X + (unsigned long long)(sb) * %du + j_ * %du + c_ * 16u), 16u); \\",
        TILE, NTS * 256, TILE, NTS * 256)
    b.add("    }")
    b.add("float c[2][%d][4];", NTS)
    b.add("#pragma unroll")
    b.add("for (int i = 0; i < %d; i++)", 2 * NTS * 4)
    b.add("    (&c[0][0][0])[i] = 0.0f;")
    local rows = { "r0", "r1", "r2", "r3" }
    local pf = T.prefetch
    for _, r in ipairs(rows) do
        b.add("%s", T.decl(r .. "_"))
        if pf then b.add("%s", T.decl("n" .. r .. "_")) end
    end
    local function loads(prefix, sbx)
        for i, r in ipairs(rows) do
            local at = BL == 256 and string.format("blk[%d] + %s", i - 1, sbx)
                or string.format("blk[%d] + (long long)(%s) * %d", i - 1, sbx, 256 // BL)
            for _, l in ipairs(T.load(prefix .. r .. "_", at)) do b.add("%s", l) end
        end
    end
    b.add("KILN_STAGE(sb0, 0u);")
    b.add("kiln_cp_commit();")
    if pf then loads("", "sb0") end
    b.add("#pragma unroll 1")
    b.open("for (unsigned sb = sb0, buf = 0u; sb < sb1; sb++, buf ^= 1u) {")
    b.open("if (sb + 1u < sb1) {")
    b.add("KILN_STAGE(sb + 1u, buf ^ 1u);")
    if pf then loads("n", "sb + 1u") end
    b.close()
    b.add("kiln_cp_commit();")
    if not pf then loads("", "sb") end
    b.add("kiln_cp_wait<1>();")
    b.add("__syncthreads();")
    for i, r in ipairs(rows) do
        for _, l in ipairs(T.prep(r .. "_", i - 1)) do b.add("%s", l) end
    end
    b.add("const uint2 *const bs = (const uint2 *)(kiln_sm + buf * %du) + lane;", TILE)
    for j = 0, 15 do
        b.open("{")
        b.add("unsigned a00, a01, a10, a11, a20, a21, a30, a31; /* row r: a{r}0 (e0, e1), a{r}1 (e2, e3) */")
        for i, r in ipairs(rows) do
            for _, l in ipairs(T.pairs(r .. "_", i - 1, j, string.format("a%d0", i - 1), string.format("a%d1", i - 1))) do
                b.add("%s", l)
            end
        end
        b.add("#pragma unroll")
        b.open("for (int nt = 0; nt < %d; nt++) {", NTS)
        if s.dN then b.add("if ((unsigned)nt >= ntr)"); b.add("    break;") end
        b.add("const uint2 bv = bs[%d + nt * 32];", j * NTS * 32)
        b.add("kiln_mma_f16(c[0][nt][0], c[0][nt][1], c[0][nt][2], c[0][nt][3], a00, a10, a01, a11, bv.x, bv.y);")
        b.add("kiln_mma_f16(c[1][nt][0], c[1][nt][1], c[1][nt][2], c[1][nt][3], a20, a30, a21, a31, bv.x, bv.y);")
        b.close()
        b.close()
    end
    b.add("__syncthreads();")
    if pf then
        for _, r in ipairs(rows) do b.add("%s", T.copy(r .. "_", "n" .. r .. "_")) end
    end
    b.close()
    b.add("#undef KILN_STAGE")
    -- store: c[rt][nt][i] is row rbase + 16rt + g + 8(i >> 1), column 8nt + 2t + (i & 1)
    b.add("#pragma unroll")
    b.open("for (int rt = 0; rt < 2; rt++) {")
    b.add("#pragma unroll")
    b.open("for (int nt = 0; nt < %d; nt++) {", NTS)
    b.add("#pragma unroll")
    b.open("for (int i = 0; i < 4; i++) {")
    b.add("const unsigned row = rbase + 16u * rt + g + 8u * (i >> 1), col = 8u * nt + 2u * t + (i & 1);")
    if S > 1 then
        b.add("if (row < %du && col < 8u * ntr)", s.M)
        b.add("    P[((unsigned long long)blockIdx.y * %du + col) * %du + row] = c[rt][nt][i];", NTS * 8, s.M)
    else
        b.add("if (row < %du && col < %s)", s.M, nexpr)
        b.add("    D[(long long)col * %s + row] = c[rt][nt][i];", lit(s.N > 1 and s.sd[2] or 0))
    end
    b.close()
    b.close()
    b.close()
    local name = string.format("mul_mat_qmma_%s_%dx%d_n%d", s.ta, s.K, s.M, cols):sub(1, 63)
    head[1] = "kiln matmul kernel " .. name
    local notes = {
        string.format("quantized tensor-core tile: %s; %d warps a block, 32 rows a warp (%d blocks of rows), %d super-blocks of K in %d split%s",
            shape, WARPS, RBN, NSB, S, S > 1 and "s" or ""),
        "each lane dequantizes its weights to f16 in registers (the next super-block's loads in flight); b packed by the step before, "
            .. "one super-block of it in shared memory at a time (cp.async, double-buffered)",
    }
    if above then notes[#notes + 1] = string.format("runs only while n <= %d (above it the dequantize + cuBLAS steps)", above) end
    local src = kit.kernel {
        head = head, notes = notes, pre = "", blocks = { quant.helpers(s.ta, false, false), HELPERS, table.concat(H.code(), "\n") },
        inline = true,
        name = name, threads = BLOCK, params = params, body = b.lines,
    }
    steps[#steps + 1] = { name = name, source = src, grid = { RBN, S, 1 }, block = { BLOCK, 1, 1 }, smem = 2 * TILE }

    if S > 1 then
        local r = kit.builder()
        r.push()
        guard(r)
        r.add("const float *const P = (const float *)(p%d + %s);", k.nparams, lit(pbase))
        r.add("float *const D = (float *)p%d%s;", s.d.param, s.d.offs ~= 0 and " + " .. lit(s.d.offs) or "")
        -- a grid of at most RED_GRID blocks looping over the run's n columns (not one block per
        -- 256 elements of the largest n: most would have nothing to do)
        local rtotal = s.M * NTS * 8
        local rgrid = math.min(kit.ceil_div(rtotal, RED_BLOCK), RED_GRID)
        r.add("const unsigned total = %du * min(%s, %du);", s.M, nexpr, NTS * 8)
        r.open("for (unsigned idx = blockIdx.x * %du + threadIdx.x; idx < total; idx += %du) {", RED_BLOCK, rgrid * RED_BLOCK)
        r.add("const unsigned row = idx %% %du, col = idx / %du;", s.M, s.M)
        r.add("float v = 0.0f;")
        r.add("#pragma unroll")
        r.add("for (unsigned q = 0; q < %du; q++) /* the splits in order: the same sums every run */", S)
        r.add("    v += P[((unsigned long long)q * %du + col) * %du + row];", NTS * 8, s.M)
        r.add("D[(long long)col * %s + row] = v;", lit(s.N > 1 and s.sd[2] or 0))
        r.close()
        local rname = string.format("mul_mat_qred_%dx%d_%d", s.M, NTS * 8, S):sub(1, 63)
        head[1] = "kiln matmul kernel " .. rname
        local rsrc = kit.kernel {
            head = head, notes = { string.format("the sum of the quantized tile's %d split-K partial products", S) },
            pre = "", blocks = {}, inline = true, name = rname, threads = RED_BLOCK, params = params, body = r.lines,
        }
        steps[#steps + 1] = { name = rname, source = rsrc, grid = { rgrid, 1, 1 },
            block = { RED_BLOCK, 1, 1 }, smem = 0 }
    end
    return { steps = steps, scratch = scratch }, above
end

return M
