-- matmul: the kernel template of mul_mat; see docs/templates.md for the table k of IR_OP nodes and
-- docs/ops-matmul.md for the semantics and the measurements.
--
-- mul_mat(a, b) = b·aᵀ (ggml): a [K, M, A2, A3] (f32, f16 or bf16, rows contiguous), b f32
-- [K, N, B2, B3] in any strided layout, dst f32 [M, N, B2, B3]:
--   dst[i, j, i2, i3] = sum_k a[k, i, i2 / r2, i3 / r3] * b[k, j, i2, i3],  r2 = B2/A2, r3 = B3/A3.
--
-- Columns. The r2*r3 b-matrices that share one a-matrix (ja2, ja3) are gathered with b's N
-- columns into C = N*r2*r3 "columns" of that a-matrix: column c = j + N*(q2 + r2*q3) is b's
-- column j of batch (ja2*r2 + q2, ja3*r3 + q3). Every kernel reads a weight once for all the
-- columns it handles, so a broadcast (GQA-style) batch costs no more weight traffic than N.
--
-- Plans, chosen from the static shapes:
--
-- * gemv (C == 1): a block of T threads covers R rows per team of G threads (G <= 32: several
--   teams per block, shuffles only; G > 32: one team per block, warp partials meet in shared
--   memory). A team splits the row into 16-byte vectors (8 f16/bf16 or 4 f32) read with
--   ld.global.nc.L1::no_allocate (streamed: they must not evict b), lane l taking vectors l,
--   l+G, ...; b's matching values come through L1 (every block reads the same b) into registers
--   and serve all R rows. Tails (K not a multiple of the vector width) are one element per lane.
-- * tile (2 <= C <= 16 with small weights, and whatever the gemm plan cannot take; f32 weights or
--   rows not 16-byte aligned): a block of W warps owns RW rows per
--   warp and CT <= 16 columns. K is walked in chunks of KC: the chunk of b for the CT columns is
--   copied to shared memory with cp.async (double-buffered: chunk i+1 streams in while chunk i is
--   used; out-of-range elements zero-filled), each lane takes U vectors of the chunk for its RW
--   rows and keeps RW*CT accumulators. Columns beyond 16 take several column tiles.
-- * tile on tensor cores (f16/bf16 weights with 16-byte aligned rows): the same blocking with
--   mma.sync m16n8k16 (b rounded to the weight type); warps split each chunk's k-steps and meet in
--   shared memory at the end.
-- * gemm (C > 16, or C >= 2 with at least GEMM_SMALL_WEIGHTS weights, where cuBLAS measured
--   faster; dst contiguous, at most MAX_STEPS calls): a generated conversion kernel writes b
--   contiguous into scratch in the weight type (f16/bf16; f32 weights: only when b's layout
--   cannot be handed to cuBLAS as is), then cuBLAS (cublasGemmStridedBatchedEx, f32 accumulate)
--   writes dst directly: per group of b-matrices sharing an a-matrix, C(M x N*r2) = Aᵀ·B with
--   stride 0 over the shared a where needed.
--
-- Accumulation is f32 everywhere (fmaf on CUDA cores; the tensor-core tile and the cuBLAS plan
-- round b to the weight type first, as ggml's cuBLAS path does); results are stored once.
-- Indices inside a row are 32-bit, row and batch bases 64-bit.

local kit = require("kit")
local tpl = require("tpl")
local prelude = require("prelude")
local gemv_rope = require("gemv_rope")
local quant = require("quant")
local qmma = require("qmma")

local SIZE = { f32 = 4, f16 = 2, bf16 = 2 }
local INT_MAX = 2147483647
local UINT_MAX = 4294967295

-- Tuning (measured on the H100, docs/ops-matmul.md).
local GEMV_PT = 2          -- vectors per thread the gemv aims for (sets the team size G)
local GEMV_GMAX = 256      -- most threads per team (one team per block above 32)
local GEMV_R = 2           -- rows per team
local GEMV_BLOCK = 128     -- block size when teams are narrower than a warp
local GEMV_MINB = 2        -- __launch_bounds__ minimum blocks per SM (0: none)
local GEMV_GROUP = 0       -- vectors whose loads are issued together (0: a loop, the compiler decides)
local TILE_COLS = 16       -- most columns per tile
local TILE_RW = 4          -- rows per warp in the tile kernel
local TILE_WMAX = 8        -- most warps per tile block
local TILE_SMEM = 65536    -- bytes of shared memory for b chunks (both buffers)
local TILE_UMAX = 4        -- most vectors per lane per chunk
local TARGET_BLOCKS = 132  -- tile blocks wanted at least (one per H100 SM) before warps shrink
local MMA = true           -- tensor cores (mma.sync) in the tile plan for f16/bf16 weights
local MMA_RT = 2           -- 16-row tiles per block
local MMA_WMAX = 8         -- most warps per block (they split each chunk's k-steps)
local MMA_U = 2            -- 32-element k-steps per warp per chunk
local MMA_SMEM = 98304     -- most bytes of shared memory per block
local GEMM_MIN_COLS = 17   -- columns per a-matrix from which cuBLAS takes over
local GEMM_SMALL_WEIGHTS = 8388608 -- ... and from 2 columns when the weights have this many elements
                                   -- (measured: cuBLAS wins at 2..16 columns on 4096x14336)
local MAX_STEPS = 64       -- gemm calls per node at most (else the tile kernel)
local W_LOAD = "ld.global.nc.L1::no_allocate" -- weight loads: streamed, no L1 allocation
local CVT_BLOCK = 256

local fail = kit.failer("matmul")

local dyn_shape -- (symbolic dims, below)
local function epilogue_check_dyn(k, f) return require("epilogue").check_dyn(k, f) end

local dims = kit.dims

local ceil_div = kit.ceil_div

local next_pow2 = kit.next_pow2

local check_ref = kit.ref_checker(fail, { offs_min = 0 })

-- Strides with 0 for extents of 1 (never multiplied by a nonzero index).
local function strides(r)
    local s = {}
    for d = 1, 4 do s[d] = r.ne[d] > 1 and r.st[d] or 0 end
    return s
end

-- A C integer literal (long long when it does not fit in int).
local function lit(v)
    if v > INT_MAX or v < -INT_MAX then return tostring(v) .. "ll" end
    return tostring(v)
end

-- "expr * s" as 64-bit, or nothing (nil) when s is 0; "(long long)expr" when s is 1.
local function term64(expr, s)
    if s == 0 then return nil end
    if s == 1 then return "(long long)" .. expr end
    return "(long long)" .. expr .. " * " .. lit(s)
end

-- The sum of the non-nil entries of terms (a table that may have holes: not ipairs).
local function sum(terms)
    local t = {}
    local n = 0
    for i in pairs(terms) do if i > n then n = i end end
    for i = 1, n do if terms[i] then t[#t + 1] = terms[i] end end
    if #t == 0 then return "0" end
    return table.concat(t, " + ")
end

-- A list of lines with an indentation level.
local builder = kit.builder

-- ---- the shape ----------------------------------------------------------------------------

-- ---- symbolic dims (docs/templates.md: ref.dyn, k.dims) --------------------------------------
--
-- A ref's ne is the maximum of a symbolic dim and its strides the layout at the maximum; ref.dyn[d]
-- is the C expression of the run-time extent. The plans are chosen from the maxima; the kernels
-- read the run-time extents (kdims, the last kernel parameter) where a dim is symbolic:
--   s.dK (a dim 0 = b dim 0), s.dM (a dim 1 = dst dim 0), s.dN (b dim 1 = dst dim 1), s.dB2, s.dB3
--   (b dims 2, 3 = dst's; a's dim is then 1, or symbolic with the same extent: r = 1).
-- Anything else symbolic is refused with a message.

-- The run-time extent expression of dim d (1-based) of r, nil when static (or at most 1).
local function dyn(r, d)
    if r and r.dyn and r.ne[d] > 1 then return r.dyn[d] end
    return nil
end

local function dyn_name(r, d) return (r.sym and r.sym[d]) or r.dyn[d] end

-- Fills s.dK .. s.dB3 and s.dyn (any of them), checking that the operands agree.
dyn_shape = function(k, s)
    local a, b, d = s.a, s.b, s.d
    local function same(r1, d1, w1, r2, d2, w2)
        local x, y = dyn(r1, d1), dyn(r2, d2)
        if x == y then return x end
        local r, dd, w = r1, d1, w1
        if not x then r, dd, w = r2, d2, w2 end
        fail("symbolic dim '%s' in %s's dim %d without the same extent in %s's dim %d (not supported)",
            dyn_name(r, dd), w, dd - 1, r == r1 and w2 or w1, r == r1 and d2 - 1 or d1 - 1)
    end
    s.dK = same(a, 1, "a", b, 1, "b")
    s.dM = same(a, 2, "a", d, 1, "dst")
    s.dN = same(b, 2, "b", d, 2, "dst")
    for i = 3, 4 do
        local x = same(b, i, "b", d, i, "dst")
        local ax = dyn(a, i)
        if ax and ax ~= x then fail("symbolic dim '%s' in a's batch dim %d: b's must be the same (not supported)", dyn_name(a, i), i - 1) end
        if x and a.ne[i] > 1 and ax ~= x then
            fail("symbolic batch dim '%s' (b's dim %d) over %d a-matrices: a must be broadcast or share it (not supported)",
                dyn_name(b, i), i - 1, a.ne[i])
        end
        if i == 3 then s.dB2 = x else s.dB3 = x end
    end
    if s.pa then
        for i = 1, 4 do
            if dyn(s.pa, i) ~= dyn(a, i) then fail("the paired weight's dim %d is not symbolic as a's (not supported)", i - 1) end
        end
    end
    if k.epilogue then epilogue_check_dyn(k, fail) end
    s.dyn = (s.dK or s.dM or s.dN or s.dB2 or s.dB3) ~= nil
    s.kdims = k.dims and #k.dims > 0
end

-- The kdims slot of the symbolic dim of ref r's dim d (for n_dyn).
local function dyn_slot(k, r, d)
    local name = r.sym and r.sym[d]
    for _, x in ipairs(k.dims or {}) do
        if name and x.name == name then return x.slot end
    end
    local n = r.dyn[d]:match("^kdims%[(%d+)%]$")
    if n then return math.tointeger(n) end
    fail("cannot find the slot of symbolic dim '%s'", dyn_name(r, d))
end

-- Everything the plans need, from k.
local function shape_of(k, vdst)
    local a, b, d = k.args.a, k.args.b, vdst or k.dst
    check_ref(d, "dst", { f32 = true })
    check_ref(a, "a", { f32 = true, f16 = true, bf16 = true, q8_0 = true, q4_0 = true, q5_0 = true, q5_1 = true, q4_K = true, q5_K = true, q6_K = true, mxfp4 = true })
    check_ref(b, "b", { f32 = true })
    local s = {
        a = a, b = b, d = d, ta = a.type, es = SIZE[a.type],
        K = a.ne[1], M = a.ne[2], A2 = a.ne[3], A3 = a.ne[4],
        N = b.ne[2], B2 = b.ne[3], B3 = b.ne[4],
        sa = strides(a), sb = strides(b), sd = strides(d),
    }
    if b.ne[1] ~= s.K then fail("a ne %s and b ne %s differ in ne0", dims(a.ne), dims(b.ne)) end
    if s.B2 % s.A2 ~= 0 or s.B3 % s.A3 ~= 0 then fail("a ne %s does not broadcast over b ne %s", dims(a.ne), dims(b.ne)) end
    local want = { s.M, s.N, s.B2, s.B3 }
    for i = 1, 4 do
        if d.ne[i] ~= want[i] then fail("dst ne %s, want %s", dims(d.ne), dims(want)) end
    end
    if s.K > 1 and a.st[1] ~= 1 then fail("a's rows must be contiguous (st0 = %d)", a.st[1]) end
    if k.pair then
        local q = k.pair
        check_ref(q, "pair", { [a.type] = true })
        for i = 1, 4 do
            if q.ne[i] ~= a.ne[i] then fail("pair ne %s differs from a ne %s", dims(q.ne), dims(a.ne)) end
        end
        if s.K > 1 and q.st[1] ~= 1 then fail("the pair's rows must be contiguous (st0 = %d)", q.st[1]) end
        s.pa, s.spa = q, strides(q)
    end
    s.r2, s.r3 = s.B2 // s.A2, s.B3 // s.A3
    s.C = s.N * s.r2 * s.r3   -- columns per a-matrix
    s.NG = s.A2 * s.A3        -- a-matrices
    if s.K > INT_MAX or s.M > INT_MAX or s.C > INT_MAX then fail("extents beyond 2^31") end
    dyn_shape(k, s)
    return s
end

-- The largest vector width (elements, at most 16 bytes and at most K) at which every row of a
-- starts aligned (buffers are 256-byte aligned).
local function weight_width(s)
    local v = 16 // s.es
    while v > 1 and v > s.K do v = v // 2 end
    local function ok(w)
        if s.a.offs % w ~= 0 then return false end
        for d = 2, 4 do if s.sa[d] % w ~= 0 then return false end end
        if s.pa then -- the paired weight is read with the same vectors
            if s.pa.offs % w ~= 0 then return false end
            for d = 2, 4 do if s.spa[d] % w ~= 0 then return false end end
        end
        return true
    end
    while v > 1 and not ok(v) do v = v // 2 end
    return v
end

-- The largest width (4, 2 or 1 floats, at most vw) at which every column of b starts aligned and
-- is contiguous; 1 when b's elements are strided.
local function b_width(s, vw)
    if s.K > 1 and s.sb[1] ~= 1 then return 1 end
    local v = math.min(4, vw)
    local function ok(w)
        if s.b.offs % w ~= 0 then return false end
        for d = 2, 4 do if s.sb[d] % w ~= 0 then return false end end
        return true
    end
    while v > 1 and not ok(v) do v = v // 2 end
    return v
end

-- ---- device helpers -----------------------------------------------------------------------

-- A global load helper kiln_<name> of n (1, 2 or 4) registers of PTX type ty (C type ct, asm
-- constraint c) from p, with the load instruction op: one register is returned, several are
-- written through references. The weight (ldw*) and b (ldb*) loads differ only in these.
local function load_helper(name, ptr, op, ty, ct, c, n)
    local head = "static __device__ __forceinline__ "
    if n == 1 then
        return string.format([[
%s%s kiln_%s(const %s *p)
{
    %s x;
    asm("%s.%s %%0, [%%1];" : "=%s"(x) : "l"(p));
    return x;
}]], head, ct, name, ptr, ct, op, ty, c)
    end
    local refs, regs, outs = {}, {}, {}
    for i = 1, n do
        local v = ("xyzw"):sub(i, i)
        refs[i], regs[i], outs[i] = ct .. " &" .. v, "%" .. (i - 1), '"=' .. c .. '"(' .. v .. ")"
    end
    return string.format([[
%svoid kiln_%s(const %s *p, %s)
{
    asm("%s.v%d.%s {%s}, [%%%d];" : %s : "l"(p));
}]], head, name, ptr, table.concat(refs, ", "), op, n, ty, table.concat(regs, ", "), n,
        table.concat(outs, ", "))
end

local HELPERS = {
    ldw16 = load_helper("ldw16", "void", W_LOAD, "u32", "unsigned", "r", 4),
    ldw8 = load_helper("ldw8", "void", W_LOAD, "u32", "unsigned", "r", 2),
    ldw4 = load_helper("ldw4", "void", W_LOAD, "u32", "unsigned", "r", 1),
    ldw2 = load_helper("ldw2", "void", W_LOAD, "u16", "unsigned short", "h", 1),
    ldb4 = load_helper("ldb4", "float", "ld.global.nc", "f32", "float", "f", 4),
    ldb2 = load_helper("ldb2", "float", "ld.global.nc", "f32", "float", "f", 2),
    ldb1 = load_helper("ldb1", "float", "ld.global.nc", "f32", "float", "f", 1),
    f16x2 = [[
/* The two f16 halves of u as floats: lo = bits 0..15, hi = bits 16..31. */
static __device__ __forceinline__ void kiln_f16x2(unsigned u, float &lo, float &hi)
{
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
        : "=f"(lo), "=f"(hi) : "r"(u));
}]],
    smem_addr = [[
/* Shared-memory address of p for cp.async. */
static __device__ __forceinline__ unsigned kiln_smem_addr(const void *p)
{
    unsigned a;
    asm("{\n\t.reg .u64 t;\n\tcvta.to.shared.u64 t, %1;\n\tcvt.u32.u64 %0, t;\n\t}" : "=r"(a) : "l"(p));
    return a;
}]],
    cp16 = [[
/* Copies `bytes` (0..16) of src to the 16 bytes at dst, zero-filling the rest (sm_80+: async,
 * completed by kiln_cp_wait). */
static __device__ __forceinline__ void kiln_cp16(float *dst, const float *src, unsigned bytes)
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(kiln_smem_addr(dst)), "l"(src), "r"(bytes) : "memory");
#else
#pragma unroll
    for (unsigned i = 0; i < 4u; i++)
        dst[i] = 4u * i < bytes ? src[i] : 0.0f;
#endif
}]],
    cp4 = [[
/* The same for one float (bytes 0 or 4). */
static __device__ __forceinline__ void kiln_cp4(float *dst, const float *src, unsigned bytes)
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(kiln_smem_addr(dst)), "l"(src), "r"(bytes) : "memory");
#else
    *dst = bytes ? *src : 0.0f;
#endif
}]],
    cp_sync = [[
static __device__ __forceinline__ void kiln_cp_commit()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

/* Waits until at most n (0 or 1) of this thread's copy groups are pending. */
template <int n>
static __device__ __forceinline__ void kiln_cp_wait()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" :: "n"(n) : "memory");
#endif
}]],
    st16 = [[
static __device__ __forceinline__ void kiln_st16(void *p, unsigned x, unsigned y, unsigned z, unsigned w)
{
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(p), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
}]],
    st8 = [[
static __device__ __forceinline__ void kiln_st8(void *p, unsigned x, unsigned y)
{
    asm volatile("st.global.v2.u32 [%0], {%1, %2};" :: "l"(p), "r"(x), "r"(y) : "memory");
}]],
}
-- The tensor-core helpers of a 16-bit type t ("bf16" or "f16"): mma.sync and the f32 pair
-- packing; the two types' texts differ only in the type's name.
local function mma_helpers(t)
    local open = "static __device__ __forceinline__ void kiln_mma_" .. t .. "("
    return string.format([[
#if __CUDA_ARCH__ < 800
#error "kiln: this mul_mat kernel uses mma.sync on %s (sm_80 or newer)"
#endif

/* c += a (16x16, row) * b (16x8, col), %s in, f32 accumulate: one warp-wide tensor-core op. */
%sfloat &c0, float &c1, float &c2, float &c3, unsigned a0,
%sunsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.%s.%s.f32 {%%0, %%1, %%2, %%3}, {%%4, %%5, %%6, %%7}, {%%8, %%9}, "
        "{%%0, %%1, %%2, %%3};"
        : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* lo and hi rounded to %s (nearest even), lo in bits 0..15. */
static __device__ __forceinline__ unsigned kiln_pack_%s(float lo, float hi)
{
    unsigned r;
    asm("cvt.rn.%sx2.f32 %%0, %%1, %%2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}]], t, t, open, string.rep(" ", #open), t, t, t, t, t)
end
-- (two helpers, the mma and the packing, one after the other as the text has them: templates/
-- qmma.lua packs no floats and takes the mma alone)
for _, t in ipairs({ "bf16", "f16" }) do
    local text = mma_helpers(t)
    local cut = text:find("\n\n/%* lo and hi rounded")
    HELPERS["mma_" .. t], HELPERS["pack_" .. t] = text:sub(1, cut - 1), text:sub(cut + 2)
end
local HELPER_ORDER = { "ldw16", "ldw8", "ldw4", "ldw2", "ldb4", "ldb2", "ldb1", "f16x2", "smem_addr", "cp16", "cp4",
    "cp_sync", "st16", "st8", "mma_bf16", "pack_bf16", "mma_f16", "pack_f16" }
local HELPER_DEPS = { cp16 = "smem_addr", cp4 = "smem_addr" }

-- A recorder of the helpers one kernel uses (emitted in a fixed order).
local function helpers()
    local used = {}
    local H = {}
    function H.use(name)
        used[name] = true
        if HELPER_DEPS[name] then used[HELPER_DEPS[name]] = true end
    end
    function H.code()
        local out = {}
        for _, n in ipairs(HELPER_ORDER) do
            if used[n] then out[#out + 1] = HELPERS[n] end
        end
        return out
    end
    return H
end

-- ---- weights: loading a vector and converting it to floats ----------------------------------

-- Statements loading the vw elements of a at pointer expression p (aligned to vw elements) as
-- raw words NAME_u0.. (or NAME_h for one 2-byte element).
local function load_raw(b, H, s, vw, p, name)
    local bytes = vw * s.es
    if bytes < 4 then
        H.use("ldw2")
        b.add("const unsigned short %s_h = kiln_ldw2(%s);", name, p)
        return
    end
    local nw = bytes // 4
    local words = {}
    for i = 0, nw - 1 do words[i + 1] = name .. "_u" .. i end
    if nw == 4 then
        H.use("ldw16")
        b.add("unsigned %s, %s, %s, %s;", words[1], words[2], words[3], words[4])
        b.add("kiln_ldw16(%s, %s, %s, %s, %s);", p, words[1], words[2], words[3], words[4])
    elseif nw == 2 then
        H.use("ldw8")
        b.add("unsigned %s, %s;", words[1], words[2])
        b.add("kiln_ldw8(%s, %s, %s);", p, words[1], words[2])
    else
        H.use("ldw4")
        b.add("const unsigned %s = kiln_ldw4(%s);", words[1], p)
    end
end

-- Statements declaring `float NAME_0 .. NAME_{vw-1}` from the raw words of load_raw.
local function convert_raw(b, H, pre, s, vw, name)
    if vw * s.es < 4 then
        b.add("const float %s_0 = %s;", name, pre.load(s.ta, name .. "_h"))
        return
    end
    if s.ta == "f32" then
        for i = 0, vw - 1 do b.add("const float %s_%d = __uint_as_float(%s_u%d);", name, i, name, i) end
    elseif s.ta == "bf16" then
        for i = 0, vw - 1, 2 do
            b.add("const float %s_%d = __uint_as_float(%s_u%d << 16);", name, i, name, i // 2)
            b.add("const float %s_%d = __uint_as_float(%s_u%d & 0xffff0000u);", name, i + 1, name, i // 2)
        end
    else
        H.use("f16x2")
        for i = 0, vw - 1, 2 do
            b.add("float %s_%d, %s_%d;", name, i, name, i + 1)
            b.add("kiln_f16x2(%s_u%d, %s_%d, %s_%d);", name, i // 2, name, i, name, i + 1)
        end
    end
end

-- Both: `float NAME_0 .. NAME_{vw-1}` from the vw elements at p.
local function load_weights(b, H, pre, s, vw, p, name)
    load_raw(b, H, s, vw, p, name)
    convert_raw(b, H, pre, s, vw, name)
end

-- An expression: the f32 value of the single element of a at pointer expression p.
local function load_weight1(H, pre, s, p)
    if s.ta == "f32" then
        H.use("ldw4")
        return "__uint_as_float(kiln_ldw4(" .. p .. "))"
    end
    H.use("ldw2")
    return pre.load(s.ta, "kiln_ldw2(" .. p .. ")")
end

-- Pointer declarations of the operands (typed, with their static offsets).
local function pointers(b, k, s, with_b)
    local wt = s.ta == "f32" and "float" or "unsigned short"
    local function off(o) return o ~= 0 and " + " .. lit(o) or "" end
    b.add("const %s *const A = (const %s *)p%d%s;", wt, wt, s.a.param, off(s.a.offs))
    if s.pa then b.add("const %s *const A2 = (const %s *)p%d%s; /* the paired weight */", wt, wt, s.pa.param, off(s.pa.offs)) end
    if with_b then b.add("const float *const B = (const float *)p%d%s;", s.b.param, off(s.b.offs)) end
    -- With an epilogue the stores go through ep_lines (dst in its own type and layout); with
    -- tails (pass gemv_rope) dst is not stored at all.
    if not k.epilogue and not k.tail then b.add("float *const D = (float *)p%d%s;", s.d.param, off(s.d.offs)) end
    return wt
end

local function param_list(k, extra)
    -- A product computed into the scratch (epilogue fallback): the scratch is dst, writable.
    if k.scratch_dst then extra = 1 end
    local n = k.nparams + (extra or 0)
    local plist = {}
    for p = 0, n - 1 do
        local writes = p == k.dst.param or (extra and p == k.nparams) or gemv_rope.writes(k, p)
        plist[#plist + 1] = (writes and "char" or "const char") .. " *__restrict__ p" .. p
    end
    -- Symbolic dims: every kernel step of the node takes the run-time extents last.
    if k.dims and #k.dims > 0 then plist[#plist + 1] = "const int* __restrict__ kdims" end
    return plist
end

-- The source of a matmul kernel (kit.kernel with this family's head).
local function kernel(t)
    local s = t.s
    t.head = {
        "kiln matmul kernel " .. t.name,
        "mul_mat: dst " .. dims(s.d.ne) .. " f32 = b " .. dims(s.b.ne) .. " f32 · a " .. dims(s.a.ne) .. " " .. s.ta .. "ᵀ",
    }
    t.blocks, t.threads, t.inline = t.helpers, t.block, true
    return kit.kernel(t)
end

local function render(name, s, notes, pre, H, block, plist, body)
    local plines = table.concat(plist, ", ")
    if #plines + #name > 80 then plines = "\n    " .. table.concat(plist, ",\n    ") end
    return kernel {
        name = name, s = s, dims = dims, notes = notes, pre = (pre.code():gsub("\n$", "")),
        helpers = H.code(), block = block, params = plines, body = body,
    }
end

local function short_name(n)
    if #n > 63 then n = n:sub(1, 63) end
    return n
end

-- Batch coordinates of a-matrix g: "ja2", "ja3" (only those with extent > 1 are declared).
local function decl_batch(b, s, g)
    if s.A2 > 1 and s.A3 > 1 then
        b.add("const unsigned ja2 = %s %% %du, ja3 = %s / %du;", g, s.A2, g, s.A2)
    elseif s.A2 > 1 then
        b.add("const unsigned ja2 = %s;", g)
    elseif s.A3 > 1 then
        b.add("const unsigned ja3 = %s;", g)
    end
end

-- The 64-bit element offset of a-matrix (ja2, ja3) in a (0 when there is one matrix).
local function a_batch_offset(s)
    return sum({ s.A2 > 1 and term64("ja2", s.sa[3]) or nil, s.A3 > 1 and term64("ja3", s.sa[4]) or nil })
end

-- ---- epilogues (k.epilogue and k.pair; docs/templates.md, "Epilogues"): templates/epilogue.lua

local epilogue = require("epilogue")
local ep_lines, ep_body, EP_BLOCK = epilogue.store_lines, epilogue.step_body, epilogue.STEP_BLOCK

-- ---- gemv: C == 1 ---------------------------------------------------------------------------

local function gemv_plan(s)
    local vw = weight_width(s)
    local vf = s.K // vw          -- full vectors per row
    local tail = s.K - vf * vw    -- elements after them
    local g
    if vf > 0 then
        g = math.min(GEMV_GMAX, next_pow2(ceil_div(vf, GEMV_PT)))
    else
        g = next_pow2(tail)
    end
    local t = g >= 32 and g or GEMV_BLOCK
    local r = math.min(GEMV_R, s.M)
    local teams = t // g
    local rpb = teams * r
    local rgn = ceil_div(s.M, rpb)
    if rgn * s.NG > INT_MAX then fail("gemv grid too large") end
    return {
        vw = vw, vf = vf, tail = tail, G = g, T = t, R = r, teams = teams, rpb = rpb, rgn = rgn,
        pf = vf // g, rem = vf % g, bw = b_width(s, vw),
    }
end

local function gemv(k, s)
    local P = gemv_plan(s)
    local H, pre = helpers(), prelude.new()
    local b = builder()
    b.push()
    pointers(b, k, s, true)
    local G, T, R = P.G, P.T, P.R
    -- k.tail (pass gemv_rope): the rows' readers computed at the store, pairs of rows at a time.
    local segs
    if k.tail then
        if s.pa or s.NG > 1 or s.dM or R % 2 ~= 0 or P.rpb % 2 ~= 0 then
            fail("gemv_rope: tails need an unpaired single-matrix gemv with an even number of rows per team")
        end
        segs = gemv_rope.plan(k, s)
        gemv_rope.pointers(b, segs)
    end
    -- block -> (row group, a-matrix); C == 1 so b's batch is the a-matrix.
    local rg = "blockIdx.x"
    if s.NG > 1 and P.rgn > 1 then
        b.add("const unsigned rg = blockIdx.x %% %du;", P.rgn)
        b.add("const unsigned g = blockIdx.x / %du;", P.rgn)
        rg = "rg"
    elseif s.NG > 1 then
        b.add("const unsigned g = blockIdx.x;")
        rg = nil
    end
    if s.NG > 1 then decl_batch(b, s, "g") end
    -- Symbolic dims: blocks past the run-time rows or a-matrices return (C == 1: b's batch is a's).
    local gone = {}
    if s.dM and rg then gone[#gone + 1] = string.format("%s * %du >= (unsigned)(%s)", rg, P.rpb, s.dM) end
    if s.dB2 then gone[#gone + 1] = string.format("ja2 >= (unsigned)(%s)", s.dB2) end
    if s.dB3 then gone[#gone + 1] = string.format("ja3 >= (unsigned)(%s)", s.dB3) end
    if #gone > 0 then
        b.add("if (%s)", table.concat(gone, " || "))
        b.add("    return;")
    end
    local tl = "threadIdx.x"
    local row0 = {}
    if rg then row0[#row0 + 1] = string.format("%s * %du", rg, P.rpb) end
    if P.teams > 1 then
        b.add("const unsigned tl = threadIdx.x & %du;", G - 1)
        row0[#row0 + 1] = string.format("(threadIdx.x / %du) * %du", G, R)
        tl = "tl"
    end
    b.add("const unsigned row0 = %s;", #row0 > 0 and table.concat(row0, " + ") or "0u")
    local abase = a_batch_offset(s)
    local bbase = sum({ s.A2 > 1 and term64("ja2", s.sb[3]) or nil, s.A3 > 1 and term64("ja3", s.sb[4]) or nil })
    local dbase = sum({ s.A2 > 1 and term64("ja2", s.sd[3]) or nil, s.A3 > 1 and term64("ja3", s.sd[4]) or nil })
    local wt = s.ta == "f32" and "float" or "unsigned short"
    -- Paired (mul_mat_glu): rows R..2R-1 are the same rows of the paired weight A2, so every
    -- loop below streams both weights against one read of b.
    local NR = s.pa and 2 * R or R
    local pbase = s.pa and sum({ s.A2 > 1 and term64("ja2", s.spa[3]) or nil, s.A3 > 1 and term64("ja3", s.spa[4]) or nil })
    for r = 0, NR - 1 do
        local rr = r % R
        local row = rr == 0 and "row0" or string.format("(row0 + %du)", rr)
        local clamp = s.M % P.rpb == 0 and row or string.format("(%s < %du ? %s : %du)", row, s.M, row, s.M - 1)
        if segs then clamp = gemv_rope.phys_row(segs, clamp) end -- (neox segments: rows in pair order)
        if s.dM then clamp = string.format("(%s < (unsigned)(%s) ? %s : (unsigned)(%s) - 1u)", row, s.dM, row, s.dM) end
        if r < R then
            b.add("const %s *const w%d = A + %s;", wt, r, sum({ term64(clamp, s.sa[2]), abase ~= "0" and abase or nil }))
        else
            b.add("const %s *const w%d = A2 + %s;", wt, r, sum({ term64(clamp, s.spa[2]), pbase ~= "0" and pbase or nil }))
        end
        b.add("float acc%d = 0.0f;", r)
    end
    b.add("const float *const bc = B%s;", bbase ~= "0" and " + " .. bbase or "")
    -- k.bnorm (pass rms_norm_gemv): b arrives un-normalized. Every team streams all of b, so
    -- it sums b² beside the dot products and multiplies b by the norm's weight; the results
    -- are scaled by 1/sqrt(mean(b²) + eps) at the store (docs/ops-matmul.md).
    local bn = k.bnorm
    if bn then
        local w = bn.w
        if w.type ~= "f32" or w.ne[1] ~= s.K or (s.K > 1 and w.st[1] ~= 1) then fail("bnorm: the norm weight must be a contiguous f32 [K]") end
        b.add("const float *const wn = (const float *)p%d%s; /* the norm's weight */", w.param, w.offs ~= 0 and " + " .. lit(w.offs) or "")
        b.add("float ss = 0.0f; /* sum of b² */")
    end

    -- Vector v of the row: b's vw values, each row's weights (loaded already when `loaded`),
    -- fmas. Names carry `tag` so that several vectors can be in flight in one scope.
    local vw, bw = P.vw, P.bw
    local function body(v, tag, loaded)
        for q = 0, vw - 1, bw do
            local kexpr = string.format("%s * %du + %du", v, vw, q)
            if q == 0 then kexpr = string.format("%s * %du", v, vw) end
            local n0 = string.format("b%s_%d", tag, q)
            if bw == 4 then
                H.use("ldb4")
                b.add("float %s, b%s_%d, b%s_%d, b%s_%d;", n0, tag, q + 1, tag, q + 2, tag, q + 3)
                b.add("kiln_ldb4(bc + %s, %s, b%s_%d, b%s_%d, b%s_%d);", kexpr, n0, tag, q + 1, tag, q + 2, tag, q + 3)
            elseif bw == 2 then
                H.use("ldb2")
                b.add("float %s, b%s_%d;", n0, tag, q + 1)
                b.add("kiln_ldb2(bc + %s, %s, b%s_%d);", kexpr, n0, tag, q + 1)
            else
                H.use("ldb1")
                local off = s.sb[1] == 1 and "(" .. kexpr .. ")" or string.format("(long long)(%s) * %s", kexpr, lit(s.sb[1]))
                b.add("%s %s = kiln_ldb1(bc + %s);", bn and "float" or "const float", n0, off)
            end
            if bn then -- the norm weight's values at the same k, in vectors as wide as b's
                local ns = {}
                for e = q, q + bw - 1 do ns[#ns + 1] = string.format("n%s_%d", tag, e) end
                b.add("float %s;", table.concat(ns, ", "))
                H.use(bw == 4 and "ldb4" or bw == 2 and "ldb2" or "ldb1")
                if bw == 1 then b.add("%s = kiln_ldb1(wn + %s);", ns[1], kexpr)
                else b.add("kiln_ldb%d(wn + %s, %s);", bw, kexpr, table.concat(ns, ", ")) end
                for e = q, q + bw - 1 do
                    local nm = string.format("b%s_%d", tag, e)
                    b.add("ss = fmaf(%s, %s, ss);", nm, nm)
                    b.add("%s *= n%s_%d;", nm, tag, e)
                end
            end
        end
        for r = 0, NR - 1 do
            local nm = string.format("x%d%s", r, tag)
            if not loaded then load_raw(b, H, s, vw, string.format("w%d + %s * %du", r, v, vw), nm) end
            convert_raw(b, H, pre, s, vw, nm)
        end
        for r = 0, NR - 1 do
            for e = 0, vw - 1 do b.add("acc%d = fmaf(x%d%s_%d, b%s_%d, acc%d);", r, r, tag, e, tag, e, r) end
        end
    end
    if P.pf > 0 and GEMV_GROUP > 0 and P.pf <= 32 then
        -- Straight-line groups of GEMV_GROUP vectors: every weight load of a group is issued
        -- before its first fma, so each thread has that many 16-byte loads in flight.
        for p0 = 0, P.pf - 1, GEMV_GROUP do
            local p1 = math.min(P.pf, p0 + GEMV_GROUP) - 1
            b.open("{")
            for p = p0, p1 do b.add("const unsigned v%d = %s + %du;", p, tl, p * G) end
            for p = p0, p1 do
                for r = 0, NR - 1 do
                    load_raw(b, H, s, vw, string.format("w%d + v%d * %du", r, p, vw), string.format("x%d_%d", r, p))
                end
            end
            for p = p0, p1 do body("v" .. p, "_" .. p, true) end
            b.close()
        end
    elseif P.pf > 0 then
        b.add("#pragma unroll%s", P.pf > 16 and " 8" or "")
        b.open("for (unsigned p = 0; p < %du; p++) {", P.pf)
        b.add("const unsigned v = %s + p * %du;", tl, G)
        body("v", "", false)
        b.close()
    end
    if P.rem > 0 then
        b.open("{")
        b.add("const unsigned v = %s + %du;", tl, P.pf * G)
        b.open("if (v < %du) {", P.vf)
        body("v", "", false)
        b.close()
        b.close()
    end
    if P.tail > 0 then
        -- The K % vw elements after the full vectors: one per lane (a loop when the team is
        -- narrower than the tail).
        if P.tail <= G then
            b.open("if (%s < %du) {", tl, P.tail)
            b.add("const unsigned kt = %du + %s;", P.vf * vw, tl)
        else
            b.open("for (unsigned kt = %du + %s; kt < %du; kt += %du) {", P.vf * vw, tl, s.K, G)
        end
        local off = s.sb[1] == 1 and "kt" or string.format("(long long)kt * %s", lit(s.sb[1]))
        H.use("ldb1")
        b.add("%s bt = kiln_ldb1(bc + %s);", bn and "float" or "const float", off)
        if bn then
            b.add("ss = fmaf(bt, bt, ss);")
            b.add("bt *= kiln_ldb1(wn + kt);")
        end
        for r = 0, NR - 1 do
            b.add("acc%d = fmaf(%s, bt, acc%d);", r, load_weight1(H, pre, s, "w" .. r .. " + kt"), r)
        end
        b.close()
    end

    -- Reduce over the team and store.
    local from = math.min(G, 32) // 2
    if from > 0 then
        b.add("#pragma unroll")
        b.open("for (int o = %d; o > 0; o >>= 1) {", from)
        for r = 0, NR - 1 do b.add("acc%d += __shfl_xor_sync(0xffffffffu, acc%d, o);", r, r) end
        if bn then b.add("ss += __shfl_xor_sync(0xffffffffu, ss, o);") end
        b.close()
    end
    -- vals: the product (and the paired product) of the row; with an epilogue, the epilogue at
    -- dst coordinates (row, 0, ja2, ja3) (C == 1: dst's batch is the a-matrix's).
    local function store(b_, vals, row)
        local guard = s.M % P.rpb ~= 0 or s.dM
        if s.dM then
            b_.add("if (%s < (unsigned)(%s))", row, s.dM)
            b_.push()
        elseif guard then b_.add("if (%s < %du)", row, s.M) b_.push() end
        if k.epilogue then
            local c = { row, nil, s.A2 > 1 and "ja2" or nil, s.A3 > 1 and "ja3" or nil }
            for _, l in ipairs(ep_lines(k, pre, c, vals)) do b_.add("%s", l) end
        else
            b_.add("D[%s] = %s;", sum({ term64(row, s.sd[1]), dbase ~= "0" and dbase or nil }), vals[1])
        end
        if guard then b_.pop() end
    end
    local function scaled(v) return bn and "(" .. v .. " * bscale)" or v end
    local function row_vals(r)
        return s.pa and { scaled("acc" .. r), scaled("acc" .. (r + R)) } or { scaled("acc" .. r) }
    end
    -- ggml's rms_norm: mean = sum/K, scale = 1/sqrt(mean + eps), in f32.
    local function norm_scale(ssx) b.add("const float bscale = 1.0f / sqrtf(%s / %s + %s);", ssx, lit(s.K) .. ".0f", bn.eps) end
    local function row_of(r) return r == 0 and "row0" or string.format("(row0 + %du)", r) end
    -- Teams of several warps: each warp's partials (and b²'s) into red[row][warp], a barrier.
    local function spill()
        local W = G // 32
        b.add("__shared__ float red[%d][%d];", NR + (bn and 1 or 0), W)
        b.open("if ((threadIdx.x & 31u) == 0) {")
        for r = 0, NR - 1 do b.add("red[%d][threadIdx.x >> 5] = acc%d;", r, r) end
        if bn then b.add("red[%d][threadIdx.x >> 5] = ss;", NR) end
        b.close()
        b.add("__syncthreads();")
        return W
    end
    if G <= 32 then
        b.open("if (%s == 0) {", tl)
        if bn then norm_scale("ss") end
        if segs then
            for r = 0, R - 1, 2 do gemv_rope.store(b, pre, segs, row_of(r), scaled("acc" .. r), scaled("acc" .. (r + 1))) end
        else
            for r = 0, R - 1 do store(b, row_vals(r), row_of(r)) end
        end
        b.close()
    elseif segs then
        -- One thread sums every row's warp partials (in the order the per-row threads below
        -- would), so that it holds both rows of each pair.
        local W = spill()
        b.open("if (threadIdx.x == 0) {")
        local ts = {}
        for r = 0, R - 1 do ts[#ts + 1] = string.format("t%d = 0.0f", r) end
        b.add("float %s;", table.concat(ts, ", "))
        if bn then b.add("float sst = 0.0f;") end
        b.add("#pragma unroll")
        b.open("for (unsigned w = 0; w < %du; w++) {", W)
        for r = 0, R - 1 do b.add("t%d += red[%d][w];", r, r) end
        if bn then b.add("sst += red[%d][w];", R) end
        b.close()
        if bn then norm_scale("sst") end
        for r = 0, R - 1, 2 do gemv_rope.store(b, pre, segs, row_of(r), scaled("t" .. r), scaled("t" .. (r + 1))) end
        b.close()
    else
        local W = spill()
        b.open("if (threadIdx.x < %du) {", R)
        local tv = s.pa and { scaled("t"), scaled("t2") } or { scaled("t") }
        b.add("float %s;", s.pa and "t = 0.0f, t2 = 0.0f" or "t = 0.0f")
        if bn then b.add("float sst = 0.0f;") end
        b.add("#pragma unroll")
        b.open("for (unsigned w = 0; w < %du; w++) {", W)
        b.add("t += red[threadIdx.x][w];")
        if s.pa then b.add("t2 += red[threadIdx.x + %du][w];", R) end
        if bn then b.add("sst += red[%d][w];", NR) end
        b.close()
        if bn then norm_scale("sst") end
        store(b, tv, "(row0 + threadIdx.x)")
        b.close()
    end

    local notes = {
        string.format("gemv: %d row%s of %d (%s), %d column; %d-element vectors (%d full + %d tail elements)",
            s.M, s.M > 1 and "s" or "", s.K, s.ta, 1, vw, P.vf, P.tail),
        string.format("teams of %d threads, %d rows per team, %d teams per block of %d; %d vectors per thread",
            G, R, P.teams, T, ceil_div(P.vf, G)),
        string.format("b: %s; grid %d blocks (%d row groups x %d matrices)",
            bw > 1 and string.format("%d-float vector loads through L1", bw) or "element loads through L1",
            P.rgn * s.NG, P.rgn, s.NG),
    }
    if s.pa then notes[#notes + 1] = "paired: the same rows of the second weight (A2) against the same b" end
    if k.epilogue then notes[#notes + 1] = string.format("epilogue: %d instruction(s), dst %s", #k.epilogue.instrs, k.dst.type) end
    for _, l in ipairs(segs and gemv_rope.notes(segs) or {}) do notes[#notes + 1] = l end
    local kind = s.pa and "_pair" or (k.epilogue and "_ep" or (segs and "_rope" or ""))
    local name = short_name(string.format("mul_mat_gemv%s_%s_%dx%d", kind, s.ta, s.K, s.M))
    local bounds = GEMV_MINB > 0 and string.format("%d, %d", T, GEMV_MINB) or T
    local source = render(name, s, notes, pre, H, bounds, param_list(k), b.lines)
    return { name = name, source = source, grid = { P.rgn * s.NG, 1, 1 }, block = { T, 1, 1 }, smem = 0 }
end

-- ---- tile: 2 <= C (and the gemm plan's leftovers) --------------------------------------------

local function log2(x)
    local n = 0
    while (1 << n) < x do n = n + 1 end
    return n
end

local function tile_plan(s)
    local vw = weight_width(s)
    local ctn = ceil_div(s.C, TILE_COLS)
    local ct = ceil_div(s.C, ctn)
    local rw = math.min(TILE_RW, next_pow2(s.M))
    local w = TILE_WMAX
    while w > 1 and (w // 2) * rw >= s.M do w = w // 2 end -- no more warps than the rows need
    while w > 1 and ceil_div(s.M, rw * w) * s.NG * ctn < TARGET_BLOCKS do w = w // 2 end
    local vk = ceil_div(s.K, vw) -- vectors per row, the last one maybe partial
    local u = TILE_UMAX
    while u > 1 and 2 * ct * 32 * vw * u * 4 > TILE_SMEM do u = u // 2 end
    while u > 1 and 32 * (u // 2) >= vk do u = u // 2 end -- no more than the row needs
    local kc = 32 * vw * u
    local nch = ceil_div(s.K, kc)
    local rb = rw * w
    local rbn = ceil_div(s.M, rb)
    if rbn * s.NG * ctn > INT_MAX then fail("tile grid too large") end
    return {
        vw = vw, CT = ct, CTN = ctn, RW = rw, W = w, T = 32 * w, U = u, KC = kc, NCH = nch, RB = rb, RBN = rbn,
        bufs = nch > 1 and 2 or 1, bvec = b_width(s, 4) == 4,
    }
end

-- ---- shared by the tile kernels ------------------------------------------------------------

-- Dynamic shared memory: the column bases (2 x CT long longs), then the b chunks. All of it is
-- dynamic so that the runtime's > 48 KiB opt-in sees the whole size.
local function smem_layout(b, P, what)
    b.add("extern __shared__ __align__(16) float kiln_smem[];")
    b.add("long long *const kiln_bcol = (long long *)kiln_smem; /* column bases in b and dst, -1: none */")
    b.add("long long *const kiln_dcol = kiln_bcol + %d;", P.CT)
    b.add("float *const kiln_bs = kiln_smem + %d; /* %s */", 4 * P.CT, what)
end

-- blockIdx.x -> (rb: row block, ct: column tile, g: a-matrix -> ja2, ja3), then the column
-- bases of the block's CT columns in kiln_bcol / kiln_dcol (threads < CT), and a barrier.
local function tile_prologue(b, s, P, rows)
    local rest = P.CTN * s.NG
    if P.RBN > 1 then
        b.add("const unsigned rb = %s;", rest > 1 and string.format("blockIdx.x %% %du", P.RBN) or "blockIdx.x")
        if s.dM then
            b.add("if (rb * %du >= (unsigned)(%s)) /* rows past the run-time extent */", rows, s.dM)
            b.add("    return;")
        end
    end
    if rest > 1 then b.add("const unsigned t1 = %s;", P.RBN > 1 and string.format("blockIdx.x / %du", P.RBN) or "blockIdx.x") end
    if P.CTN > 1 then
        b.add("const unsigned ct = t1 %% %du;", P.CTN)
        if s.NG > 1 then b.add("const unsigned g = t1 / %du;", P.CTN) end
    elseif s.NG > 1 then
        b.add("const unsigned g = t1;")
    end
    if s.NG > 1 then decl_batch(b, s, "g") end

    local CT = P.CT
    local partial = CT * P.CTN ~= s.C
    -- Symbolic N or batch dims: a column is live when its token and batch lie within the run-time
    -- extents; dead columns are -1 (zero in the chunks, never stored), and a block without a live
    -- column returns.
    local dcols = s.dN or s.dB2 or s.dB3
    if dcols then b.add("bool kiln_live = false;") end
    b.open("if (threadIdx.x < %du) {", CT)
    local rr = s.r2 * s.r3
    -- c (the column) is unused only for a single column (C == 1: a symbolic K, never static).
    if rr > 1 or s.N > 1 or partial then
        b.add("const unsigned c = %s;", P.CTN > 1 and string.format("ct * %du + threadIdx.x", CT) or "threadIdx.x")
    end
    local j, q2, q3 = "c", nil, nil
    if rr > 1 then
        if s.N > 1 then
            b.add("const unsigned j = c %% %du, q = c / %du;", s.N, s.N)
            j = "j"
        else
            b.add("const unsigned q = c;")
            j = nil
        end
        if s.r2 > 1 and s.r3 > 1 then
            b.add("const unsigned q2 = q %% %du, q3 = q / %du;", s.r2, s.r2)
            q2, q3 = "q2", "q3"
        elseif s.r2 > 1 then
            q2 = "q"
        else
            q3 = "q"
        end
    elseif s.N == 1 then
        j = nil
    end
    local function col(st)
        return sum({
            j and term64(j, st[2]) or nil,
            s.A2 > 1 and term64("ja2", s.r2 * st[3]) or nil, q2 and term64(q2, st[3]) or nil,
            s.A3 > 1 and term64("ja3", s.r3 * st[4]) or nil, q3 and term64(q3, st[4]) or nil,
        })
    end
    if dcols then
        local conds = {}
        if partial then conds[#conds + 1] = string.format("c < %du", s.C) end
        if s.dN then conds[#conds + 1] = string.format("%s < (unsigned)(%s)", j or "0u", s.dN) end
        local function bx(ja, r, q) -- the batch index of b: ja * r + q
            return sum({ ja and (r > 1 and ja .. " * " .. r .. "u" or ja) or nil, q })
        end
        if s.dB2 then conds[#conds + 1] = string.format("%s < (unsigned)(%s)", bx(s.A2 > 1 and "ja2" or nil, s.r2, q2), s.dB2) end
        if s.dB3 then conds[#conds + 1] = string.format("%s < (unsigned)(%s)", bx(s.A3 > 1 and "ja3" or nil, s.r3, q3), s.dB3) end
        b.add("kiln_live = %s;", table.concat(conds, " && "))
        b.add("kiln_bcol[threadIdx.x] = kiln_live ? %s : -1ll;", col(s.sb))
        b.add("kiln_dcol[threadIdx.x] = kiln_live ? %s : -1ll;", col(s.sd))
        b.close()
        b.add("if (!__syncthreads_or(kiln_live)) /* no live column */")
        b.add("    return;")
        return true
    end
    if partial then
        b.add("kiln_bcol[threadIdx.x] = c < %du ? %s : -1ll;", s.C, col(s.sb))
        b.add("kiln_dcol[threadIdx.x] = c < %du ? %s : -1ll;", s.C, col(s.sd))
    else
        b.add("kiln_bcol[threadIdx.x] = %s;", col(s.sb))
        b.add("kiln_dcol[threadIdx.x] = %s;", col(s.sd))
    end
    b.close()
    b.add("__syncthreads();")
    return partial
end

-- Statements copying chunk `chunk` (an expression) of b's CT columns into buffer `buf` with
-- cp.async: column cc at cc * P.CS floats, element kk at phys(kk); out-of-range elements and
-- columns zero-filled. 16-byte copies when b's columns are contiguous and aligned.
local function stage_chunk(b, H, s, P, chunk, buf, phys, phys4)
    local CT, KC, CS = P.CT, P.KC, P.CS
    b.open("{")
    b.add("const unsigned k0s = %s * %du;", chunk, KC)
    b.add("float *const sb = kiln_bs%s;", buf == "0" and "" or string.format(" + %s * %du", buf, CT * CS))
    if P.bvec then
        local n = CT * KC // 4
        b.add("#pragma unroll 4")
        b.open("for (unsigned i = threadIdx.x; i < %du; i += %du) {", n, P.T)
        b.add("const unsigned cc = i >> %d, q = i & %du;", log2(KC // 4), KC // 4 - 1)
        b.add("const unsigned k = k0s + q * 4u;")
        b.add("const long long base = kiln_bcol[cc];")
        local bytes = s.K % 4 == 0 and "16u" or string.format("(%du - k < 4u ? (%du - k) * 4u : 16u)", s.K, s.K)
        if s.dK then
            b.add("const unsigned kn = (unsigned)(%s); /* run-time K */", s.dK)
            b.add("const unsigned n = base < 0 || k >= kn ? 0u : (kn - k < 4u ? (kn - k) * 4u : 16u);")
        else
            b.add("const unsigned n = base < 0 || k >= %du ? 0u : %s;", s.K, bytes)
        end
        H.use("cp16")
        b.add("kiln_cp16(sb + cc * %du + %s, B + (n ? base + k : 0ll), n);", CS, phys4("q"))
        b.close()
    else
        local n = CT * KC
        b.add("#pragma unroll 4")
        b.open("for (unsigned i = threadIdx.x; i < %du; i += %du) {", n, P.T)
        b.add("const unsigned cc = i >> %d, kk = i & %du;", log2(KC), KC - 1)
        b.add("const unsigned k = k0s + kk;")
        b.add("const long long base = kiln_bcol[cc];")
        b.add("const bool ok = base >= 0 && k < %s;", s.dK and string.format("(unsigned)(%s)", s.dK) or s.K .. "u")
        local off = s.sb[1] == 1 and "k" or (s.sb[1] == 0 and "0" or string.format("(long long)k * %s", lit(s.sb[1])))
        H.use("cp4")
        b.add("kiln_cp4(sb + cc * %du + %s, B + (ok ? base + %s : 0ll), ok ? 4u : 0u);", CS, phys("kk"), off)
        b.close()
    end
    b.add("kiln_cp_commit();")
    b.close()
end

-- The chunk loop: chunk i+1 is copied while chunk i is used (two buffers); compute() emits the
-- use of the chunk at `bs` starting at element k0.
local function chunk_loop(b, H, s, P, stage, compute)
    H.use("cp_sync")
    if P.NCH == 1 then
        stage("0u", "0")
        b.add("kiln_cp_wait<0>();")
        b.add("__syncthreads();")
        b.open("{")
        b.add("const float *const bs = kiln_bs;")
        b.add("const unsigned k0 = 0;")
        compute()
        b.close()
    else
        stage("0u", "0")
        local nch = P.NCH .. "u"
        if s.dK then
            -- Symbolic K: only the chunks below the run-time K.
            b.add("const unsigned kiln_nch = ((unsigned)(%s) + %du) / %du;", s.dK, P.KC - 1, P.KC)
            nch = "kiln_nch"
        end
        b.add("#pragma unroll 1")
        b.open("for (unsigned ch = 0; ch < %s; ch++) {", nch)
        b.open("if (ch + 1u < %s) {", nch)
        stage("(ch + 1u)", "((ch + 1u) & 1u)")
        b.add("kiln_cp_wait<1>();")
        b.pop()
        b.add("} else {")
        b.push()
        b.add("kiln_cp_wait<0>();")
        b.close()
        b.add("__syncthreads();")
        b.add("const float *const bs = kiln_bs + (ch & 1u) * %du;", P.CT * P.CS)
        b.add("const unsigned k0 = ch * %du;", P.KC)
        compute()
        b.add("__syncthreads();")
        b.close()
    end
end

local F4_TYPES = {
    "struct alignas(16) kiln_f4 {\n    float x, y, z, w;\n};",
    "struct alignas(8) kiln_f2 {\n    float x, y;\n};",
}

local function tile_source(name, s, notes, pre, H, T, k, body)
    local pl = param_list(k)
    local plines = table.concat(pl, ", ")
    if #plines + #name > 80 then plines = "\n    " .. table.concat(pl, ",\n    ") end
    return kernel {
        name = name, s = s, dims = dims, notes = notes,
        pre = ((pre.code() .. "\n" .. table.concat(F4_TYPES, "\n\n")):gsub("^\n", ""):gsub("\n$", "")),
        helpers = H.code(), block = T, params = plines, body = body,
    }
end

-- ---- tile on CUDA cores: f32 weights, misaligned rows ------------------------------------------

local function tile(k, s)
    local P = tile_plan(s)
    local H, pre = helpers(), prelude.new()
    local b = builder()
    b.push()
    local wt = pointers(b, k, s, true)
    local CT, KC, vw, RW = P.CT, P.KC, P.vw, P.RW
    P.CS = KC
    smem_layout(b, P, string.format("%d buffer%s of %d columns x %d floats", P.bufs, P.bufs > 1 and "s" or "", CT, KC))
    local partial = tile_prologue(b, s, P, P.RB)
    -- Rows of this warp.
    b.add("const unsigned lane = threadIdx.x & 31u;")
    local wrow = P.W > 1 and string.format("(threadIdx.x >> 5) * %du", RW) or nil
    local rrow = P.RBN > 1 and string.format("rb * %du", P.RB) or nil
    b.add("const unsigned row0 = %s;", (rrow and wrow) and rrow .. " + " .. wrow or rrow or wrow or "0u")
    local guard_rows = s.M % P.RB ~= 0 or s.dM
    local mlim = s.dM and string.format("(unsigned)(%s)", s.dM) or s.M .. "u" -- rows (run time)
    local abase = a_batch_offset(s)
    for r = 0, RW - 1 do
        local row = r == 0 and "row0" or string.format("(row0 + %du)", r)
        local clamp = guard_rows and string.format("(%s < %du ? %s : %du)", row, s.M, row, s.M - 1) or row
        if s.dM then clamp = string.format("(%s < %s ? %s : %s - 1u)", row, mlim, row, mlim) end
        b.add("const %s *const w%d = A + %s;", wt, r, sum({ term64(clamp, s.sa[2]), abase ~= "0" and abase or nil }))
    end
    for r = 0, RW - 1 do
        local l = {}
        for c = 0, CT - 1 do l[#l + 1] = string.format("a%d_%d = 0.0f", r, c) end
        b.add("float %s;", table.concat(l, ", "))
    end

    -- Where element kk of a chunk lives in its column's KC floats: with 8-element vectors the two
    -- 4-float halves of each vector go to separate halves of the column, so that the lanes'
    -- 16-byte reads are consecutive (no bank conflicts).
    local function phys(kk)
        if vw ~= 8 then return kk end
        return string.format("((%s >> 2) & 1u) * %du + ((%s >> 3) << 2) + (%s & 3u)", kk, KC // 2, kk, kk)
    end
    local function phys4(q)
        if vw ~= 8 then return q .. " * 4u" end
        return string.format("(%s & 1u) * %du + (%s >> 1) * 4u", q, KC // 2, q)
    end
    local function stage(chunk, buf) stage_chunk(b, H, s, P, chunk, buf, phys, phys4) end

    -- One chunk: each lane's U vectors of its RW rows against the CT columns of bs.
    local function compute()
        b.add("#pragma unroll")
        b.open("for (unsigned u = 0; u < %du; u++) {", P.U)
        b.add("const unsigned vv = lane + u * 32u;")
        b.add("const unsigned k = k0 + vv * %du;", vw)
        local always = s.K % KC == 0 and not s.dK
        local klim = s.dK and string.format("(unsigned)(%s)", s.dK) or s.K .. "u"
        if always then
            for r = 0, RW - 1 do load_weights(b, H, pre, s, vw, string.format("w%d + k", r), "x" .. r) end
        else
            for r = 0, RW - 1 do
                local l = {}
                for e = 0, vw - 1 do l[#l + 1] = string.format("x%d_%d = 0.0f", r, e) end
                b.add("float %s;", table.concat(l, ", "))
            end
            b.open("if (k + %du <= %s) {", vw, klim)
            for r = 0, RW - 1 do
                load_weights(b, H, pre, s, vw, string.format("w%d + k", r), "y" .. r)
                for e = 0, vw - 1 do b.add("x%d_%d = y%d_%d;", r, e, r, e) end
            end
            b.close()
            if s.dK and vw > 1 then
                -- Symbolic K: the vector holding the run-time end is read element by element.
                b.open("else if (k < %s) {", klim)
                for e = 0, vw - 1 do
                    if e > 0 then b.add("if (k + %du < %s) {", e, klim) b.push() end
                    for r = 0, RW - 1 do
                        local p = e == 0 and string.format("w%d + k", r) or string.format("w%d + k + %du", r, e)
                        b.add("x%d_%d = %s;", r, e, load_weight1(H, pre, s, p))
                    end
                    if e > 0 then b.pop() b.add("}") end
                end
                b.close()
            elseif s.K % vw ~= 0 then
                -- Only the row's last vector is partial: it has K % vw elements.
                b.open("else if (k < %du) {", s.K)
                for e = 0, s.K % vw - 1 do
                    for r = 0, RW - 1 do
                        local p = e == 0 and string.format("w%d + k", r) or string.format("w%d + k + %du", r, e)
                        b.add("x%d_%d = %s;", r, e, load_weight1(H, pre, s, p))
                    end
                end
                b.close()
            end
        end
        for c = 0, CT - 1 do
            b.open("{")
            if vw >= 4 then
                for h = 0, vw // 4 - 1 do
                    local off = vw == 8 and string.format("%d + vv * 4u", c * KC + h * (KC // 2)) or string.format("%d + vv * 4u", c * KC)
                    b.add("const kiln_f4 c%d = *(const kiln_f4 *)(bs + %s);", h, off)
                end
            elseif vw == 2 then
                b.add("const kiln_f2 c0 = *(const kiln_f2 *)(bs + %d + vv * 2u);", c * KC)
            else
                b.add("const float c0 = bs[%d + vv];", c * KC)
            end
            local comp = { "x", "y", "z", "w" }
            for e = 0, vw - 1 do
                local bv
                if vw >= 2 then bv = string.format("c%d.%s", e // 4, comp[e % 4 + 1]) else bv = "c0" end
                for r = 0, RW - 1 do b.add("a%d_%d = fmaf(x%d_%d, %s, a%d_%d);", r, c, r, e, bv, r, c) end
            end
            b.close()
        end
        b.close()
    end

    chunk_loop(b, H, s, P, stage, compute)

    -- Warp sums, then lane (r * CT + c) % 32 stores (r, c).
    b.add("#pragma unroll")
    b.open("for (int o = 16; o > 0; o >>= 1) {")
    for r = 0, RW - 1 do
        for c = 0, CT - 1 do b.add("a%d_%d += __shfl_xor_sync(0xffffffffu, a%d_%d, o);", r, c, r, c) end
    end
    b.close()
    for r = 0, RW - 1 do
        local row = r == 0 and "row0" or string.format("(row0 + %du)", r)
        if guard_rows then b.open("if (%s < %s) {", row, mlim) else b.open("{") end
        b.add("float *const dr = D + %s;", sum({ term64(row, s.sd[1]) }))
        for c = 0, CT - 1 do
            local cond = string.format("lane == %du", (r * CT + c) % 32)
            if partial then cond = cond .. string.format(" && kiln_dcol[%d] >= 0", c) end
            b.add("if (%s)", cond)
            b.add("    dr[kiln_dcol[%d]] = a%d_%d;", c, r, c)
        end
        b.close()
    end

    local notes = {
        string.format("tile: %d rows of %d (%s) x %d columns per a-matrix (N %d x r2 %d x r3 %d), %d a-matri%s",
            s.M, s.K, s.ta, s.C, s.N, s.r2, s.r3, s.NG, s.NG > 1 and "ces" or "x"),
        string.format("%d column tile%s of %d; %d warps x %d rows per block; %d-element vectors, %d per lane per chunk",
            P.CTN, P.CTN > 1 and "s" or "", CT, P.W, RW, vw, P.U),
        string.format("K in %d chunk%s of %d; b chunks in shared memory by cp.async (%s)%s", P.NCH,
            P.NCH > 1 and "s" or "", KC, P.bvec and "16-byte copies" or "element copies",
            P.bufs > 1 and ", double-buffered" or ""),
    }
    local name = short_name(string.format("mul_mat_n%d_%s_%dx%d", s.C, s.ta, s.K, s.M))
    local source = tile_source(name, s, notes, pre, H, P.T, k, b.lines)
    return {
        name = name, source = source, grid = { P.RBN * P.CTN * s.NG, 1, 1 }, block = { P.T, 1, 1 },
        smem = P.bufs * CT * KC * 4 + 16 * CT,
    }
end

-- ---- tile on tensor cores: f16/bf16 weights with 16-byte aligned rows -----------------------

-- mma.sync m16n8k16 (row.col): lane l = 4g + t holds A (16x16) words a0 (row g, k 2t..2t+1),
-- a1 (row g+8, same k), a2 (row g, k 2t+8..2t+9), a3 (row g+8, same k); B (16x8) words b0 (k
-- 2t..2t+1, column g), b1 (k 2t+8..2t+9, column g); C floats c0, c1 (row g, columns 2t, 2t+1),
-- c2, c3 (row g+8, same columns). A dot product does not care in which order k runs, so a lane
-- reads 8 consecutive weights of rows g and g+8 with one 16-byte load each (real k = 8t..8t+7
-- of a 32-element step) and feeds them to two mmas: words 0 and 1 (real k 8t..8t+3) to the
-- first, words 2 and 3 (8t+4..8t+7) to the second; its b words are b's values at the same real
-- k for column g, so both operands use one permutation of k and the sums are exact.

local function mma_plan(s)
    if not MMA or s.ta == "f32" or weight_width(s) ~= 8 then return nil end
    local ctn = ceil_div(s.C, TILE_COLS)
    local nt = ceil_div(ceil_div(s.C, ctn), 8) -- n-tiles of 8 columns
    local ct = nt * 8
    local nsteps = ceil_div(s.K, 32)
    local w = math.min(MMA_WMAX, next_pow2(nsteps))
    local u = math.max(1, math.min(MMA_U, ceil_div(nsteps, w)))
    local rt = math.min(MMA_RT, ceil_div(s.M, 16))
    -- Fewer rows per block (and more steps per warp) while the GPU would get too few blocks.
    while rt > 1 and ceil_div(s.M, 16 * rt) * ctn * s.NG < 2 * TARGET_BLOCKS do
        rt = rt // 2
        u = u * 2
    end
    local P
    local function size()
        local kc = 32 * w * u
        local nch = ceil_div(s.K, kc)
        local bufs = nch > 1 and 2 or 1
        local cs = kc + 4 -- column stride: 4 floats of padding keep the lanes' reads conflict-free
        local red = w > 1 and w * rt * nt * 128 * 4 or 0
        P = {
            CT = ct, NT = nt, CTN = ctn, W = w, T = 32 * w, U = u, RT = rt, KC = kc, CS = cs, NCH = nch, bufs = bufs,
            ROWS = 16 * rt, RBN = ceil_div(s.M, 16 * rt), bvec = b_width(s, 4) == 4,
        }
        P.smem = 16 * ct + math.max(bufs * ct * cs * 4, red)
    end
    size()
    while P.smem > MMA_SMEM and u > 1 do u = u // 2; size() end
    while P.smem > MMA_SMEM and w > 1 do w = w // 2; size() end
    if P.RBN * ctn * s.NG > INT_MAX then fail("mma grid too large") end
    return P
end

local function tile_mma(k, s, P)
    local H, pre = helpers(), prelude.new()
    local b = builder()
    b.push()
    local wt = pointers(b, k, s, true)
    local CT, NT, RT, CS, W = P.CT, P.NT, P.RT, P.CS, P.W
    local mma = "kiln_mma_" .. s.ta
    local pack = "kiln_pack_" .. s.ta
    H.use("mma_" .. s.ta)
    H.use("pack_" .. s.ta)
    smem_layout(b, P, string.format("%d buffer%s of %d columns x %d floats (padded to %d); then the warps' partial sums",
        P.bufs, P.bufs > 1 and "s" or "", CT, P.KC, CS))
    local partial = tile_prologue(b, s, P, P.ROWS)
    b.add("const unsigned lane = threadIdx.x & 31u;")
    if W > 1 then b.add("const unsigned warp = threadIdx.x >> 5;") end
    b.add("const unsigned gq = lane >> 2, tq = lane & 3u;")
    local rbase = P.RBN > 1 and string.format("rb * %du", P.ROWS) or nil
    b.add("const unsigned row0 = %s;", rbase and rbase .. " + gq" or "gq")
    local guard_rows = s.M % P.ROWS ~= 0 or s.dM
    local mlim = s.dM and string.format("(unsigned)(%s)", s.dM) or s.M .. "u" -- rows (run time)
    local klim = s.dK and string.format("(unsigned)(%s)", s.dK) or s.K .. "u"
    local abase = a_batch_offset(s)
    for rt = 0, RT - 1 do
        for h = 0, 1 do
            local off = rt * 16 + h * 8
            local row = off == 0 and "row0" or string.format("(row0 + %du)", off)
            local clamp = guard_rows and string.format("(%s < %du ? %s : %du)", row, s.M, row, s.M - 1) or row
            if s.dM then clamp = string.format("(%s < %s ? %s : %s - 1u)", row, mlim, row, mlim) end
            b.add("const %s *const w%s%d = A + %s;", wt, h == 0 and "l" or "h", rt,
                sum({ term64(clamp, s.sa[2]), abase ~= "0" and abase or nil }))
        end
    end
    for rt = 0, RT - 1 do
        for nt = 0, NT - 1 do
            b.add("float c%d_%d_0 = 0.0f, c%d_%d_1 = 0.0f, c%d_%d_2 = 0.0f, c%d_%d_3 = 0.0f;", rt, nt, rt, nt, rt, nt, rt, nt)
        end
    end

    local function phys(kk) return kk end
    local function phys4(q) return q .. " * 4u" end
    local function stage(chunk, buf) stage_chunk(b, H, s, P, chunk, buf, phys, phys4) end

    -- The weights of step `ks` for the RT row tiles: words l{rt}_0..3 (row g) and h{rt}_0..3 (row g+8).
    local function load_step()
        local words = {}
        for rt = 0, RT - 1 do
            for _, h in ipairs({ "l", "h" }) do
                for j = 0, 3 do words[#words + 1] = string.format("%s%d_%d", h, rt, j) end
            end
        end
        local function full(prefix)
            H.use("ldw16")
            for rt = 0, RT - 1 do
                for _, h in ipairs({ "l", "h" }) do
                    b.add("kiln_ldw16(w%s%d + k, %s%s%d_0, %s%s%d_1, %s%s%d_2, %s%s%d_3);", h, rt, prefix, h, rt, prefix, h,
                        rt, prefix, h, rt, prefix, h, rt)
                end
            end
        end
        if s.K % P.KC == 0 and not s.dK then
            local l = {}
            for _, w_ in ipairs(words) do l[#l + 1] = w_ end
            b.add("unsigned %s;", table.concat(l, ", "))
            full("")
            return
        end
        local l = {}
        for _, w_ in ipairs(words) do l[#l + 1] = w_ .. " = 0u" end
        b.add("unsigned %s;", table.concat(l, ", "))
        b.open("if (k + 8u <= %s) {", klim)
        full("")
        b.close()
        local tail = s.K % 8
        if s.dK then
            -- Symbolic K: the vector holding the run-time end, element by element.
            H.use("ldw2")
            b.open("else if (k < %s) {", klim)
            for rt = 0, RT - 1 do
                for _, h in ipairs({ "l", "h" }) do
                    for j = 0, 3 do
                        local e0, e1 = 2 * j, 2 * j + 1
                        local lo = string.format("(k + %du < %s ? (unsigned)kiln_ldw2(w%s%d + k + %du) : 0u)", e0, klim, h, rt, e0)
                        local hi = string.format("(k + %du < %s ? (unsigned)kiln_ldw2(w%s%d + k + %du) << 16 : 0u)", e1, klim, h, rt, e1)
                        b.add("%s%d_%d = %s | %s;", h, rt, j, lo, hi)
                    end
                end
            end
            b.close()
        elseif tail > 0 then
            -- The row's last vector: only K % 8 elements exist.
            H.use("ldw2")
            b.open("else if (k < %du) {", s.K)
            for rt = 0, RT - 1 do
                for _, h in ipairs({ "l", "h" }) do
                    for j = 0, 3 do
                        local e0, e1 = 2 * j, 2 * j + 1
                        if e0 < tail then
                            local lo = string.format("(unsigned)kiln_ldw2(w%s%d + k%s)", h, rt, e0 > 0 and " + " .. e0 .. "u" or "")
                            local hi = e1 < tail and string.format(" | ((unsigned)kiln_ldw2(w%s%d + k + %du) << 16)", h, rt, e1) or ""
                            b.add("%s%d_%d = %s%s;", h, rt, j, lo, hi)
                        end
                    end
                end
            end
            b.close()
        end
    end

    local function compute()
        b.add("#pragma unroll")
        b.open("for (unsigned u = 0; u < %du; u++) {", P.U)
        if W > 1 then
            b.add("const unsigned ks = (u * %du + warp) * 32u;", W)
        else
            b.add("const unsigned ks = u * 32u;")
        end
        b.add("const unsigned k = k0 + ks + tq * 8u;")
        load_step()
        for nt = 0, NT - 1 do
            b.open("{")
            b.add("const float *const bp = bs + %s(gq * %du + ks + tq * 8u);", nt > 0 and (nt * 8 * CS) .. " + " or "", CS)
            b.add("const kiln_f4 f0 = *(const kiln_f4 *)bp, f1 = *(const kiln_f4 *)(bp + 4);")
            b.add("const unsigned p0 = %s(f0.x, f0.y), p1 = %s(f0.z, f0.w);", pack, pack)
            b.add("const unsigned p2 = %s(f1.x, f1.y), p3 = %s(f1.z, f1.w);", pack, pack)
            for rt = 0, RT - 1 do
                local c = string.format("c%d_%d_0, c%d_%d_1, c%d_%d_2, c%d_%d_3", rt, nt, rt, nt, rt, nt, rt, nt)
                b.add("%s(%s, l%d_0, h%d_0, l%d_1, h%d_1, p0, p1);", mma, c, rt, rt, rt, rt)
                b.add("%s(%s, l%d_2, h%d_2, l%d_3, h%d_3, p2, p3);", mma, c, rt, rt, rt, rt)
            end
            b.close()
        end
        b.close()
    end
    chunk_loop(b, H, s, P, stage, compute)

    -- Sum the warps' partial tiles (through shared memory, reusing the b buffers) and store.
    local function store(rowx, colx, val)
        local conds = {}
        if guard_rows then conds[#conds + 1] = string.format("%s < %s", rowx, mlim) end
        if partial then conds[#conds + 1] = string.format("kiln_dcol[%s] >= 0", colx) end
        if #conds > 0 then b.add("if (%s)", table.concat(conds, " && ")) b.push() end
        b.add("D[%s + kiln_dcol[%s]] = %s;", sum({ term64(rowx, s.sd[1]) }), colx, val)
        if #conds > 0 then b.pop() end
    end
    if W > 1 then
        local per = RT * NT * 128
        if P.NCH == 1 then b.add("__syncthreads();") end
        b.add("float *const red = kiln_bs + warp * %du + lane * 4u;", per)
        for rt = 0, RT - 1 do
            for nt = 0, NT - 1 do
                for i = 0, 3 do b.add("red[%d] = c%d_%d_%d;", (rt * NT + nt) * 128 + i, rt, nt, i) end
            end
        end
        b.add("__syncthreads();")
        b.open("for (unsigned idx = threadIdx.x; idx < %du; idx += %du) {", per, P.T)
        b.add("float v = kiln_bs[idx];")
        b.add("#pragma unroll")
        b.add("for (unsigned w = 1; w < %du; w++)", W)
        b.add("    v += kiln_bs[w * %du + idx];", per)
        b.add("const unsigned i = idx & 3u, ln = (idx >> 2) & 31u, q = idx >> 7;")
        local ntx = NT > 1 and string.format("(q %% %du)", NT) or "0u"
        local rtx = NT > 1 and string.format("(q / %du)", NT) or "q"
        b.add("const unsigned row = %s%s * 16u + (ln >> 2) + ((i >> 1) << 3);", rbase and rbase .. " + " or "", rtx)
        b.add("const unsigned col = %s * 8u + (ln & 3u) * 2u + (i & 1u);", ntx)
        store("row", "col", "v")
        b.close()
    else
        for rt = 0, RT - 1 do
            for nt = 0, NT - 1 do
                for i = 0, 3 do
                    b.open("{")
                    local roff = rt * 16 + (i >= 2 and 8 or 0)
                    b.add("const unsigned row = row0%s, col = %du + tq * 2u;", roff > 0 and " + " .. roff .. "u" or "",
                        nt * 8 + (i % 2))
                    store("row", "col", string.format("c%d_%d_%d", rt, nt, i))
                    b.close()
                end
            end
        end
    end

    local notes = {
        string.format("tile on tensor cores: %d rows of %d (%s) x %d columns per a-matrix (N %d x r2 %d x r3 %d), %d a-matri%s",
            s.M, s.K, s.ta, s.C, s.N, s.r2, s.r3, s.NG, s.NG > 1 and "ces" or "x"),
        string.format("mma.sync m16n8k16: %d column tile%s of %d (%d n-tiles), %d row tiles of 16 per block; %d warps split K",
            P.CTN, P.CTN > 1 and "s" or "", CT, NT, RT, W),
        string.format("K in %d chunk%s of %d (%d steps of 32 per warp); b chunks in shared memory by cp.async (%s)%s; b rounded to %s for the mma",
            P.NCH, P.NCH > 1 and "s" or "", P.KC, P.U, P.bvec and "16-byte copies" or "element copies",
            P.bufs > 1 and ", double-buffered" or "", s.ta),
    }
    local name = short_name(string.format("mul_mat_mma_n%d_%s_%dx%d", s.C, s.ta, s.K, s.M))
    local source = tile_source(name, s, notes, pre, H, P.T, k, b.lines)
    return { name = name, source = source, grid = { P.RBN * P.CTN * s.NG, 1, 1 }, block = { P.T, 1, 1 }, smem = P.smem }
end

-- ---- gemm: a conversion kernel and cuBLAS ---------------------------------------------------

-- A kernel writing b contiguous ([K, N, B2, B3]) in type tt into the scratch.
local function convert(k, s, tt)
    local H, pre = helpers(), prelude.new()
    local vc = tt == "f32" and 4 or 8
    while vc > 1 and s.K % vc ~= 0 do vc = vc // 2 end
    local bw = b_width(s, math.min(vc, 4))
    local kv = s.K // vc
    local ncol = s.N * s.B2 * s.B3
    local total = kv * ncol
    if total > UINT_MAX - CVT_BLOCK then fail("b of %d elements is too large to convert", s.K * ncol) end
    local b = builder()
    b.push()
    if k.n_above then -- a quantized mul_mat whose tensor-core tile takes this few columns (templates/qmma.lua)
        b.add("if ((unsigned)(%s) <= %du)", s.dN, k.n_above)
        b.add("    return; /* the quantized tensor-core tile took these columns */")
    end
    b.add("const float *const B = (const float *)p%d%s;", s.b.param, s.b.offs ~= 0 and " + " .. lit(s.b.offs) or "")
    local ot = tt == "f32" and "float" or "unsigned short"
    local base = k.scratch_base or 0
    b.add("%s *const S = (%s *)(p%d%s);", ot, ot, k.nparams, base > 0 and " + " .. base or "")
    b.add("const unsigned idx = blockIdx.x * %du + threadIdx.x;", CVT_BLOCK)
    if total % CVT_BLOCK ~= 0 then
        b.add("if (idx >= %du)", total)
        b.add("    return;")
    end
    -- idx -> (kv, col), col -> (j, i2, i3): only the coordinates with extent > 1.
    local kvx, colx
    if kv > 1 and ncol > 1 then
        b.add("const unsigned kv = idx %% %du, col = idx / %du;", kv, kv)
        kvx, colx = "kv", "col"
    elseif kv > 1 then
        kvx = "idx"
    else
        colx = "idx"
    end
    local terms = {}
    local dl = {}
    if s.N > 1 then dl[#dl + 1] = { s.N, s.sb[2], "j" } end
    if s.B2 > 1 then dl[#dl + 1] = { s.B2, s.sb[3], "i2" } end
    if s.B3 > 1 then dl[#dl + 1] = { s.B3, s.sb[4], "i3" } end
    local left = colx
    local jx
    for i, d in ipairs(dl) do
        if i < #dl then
            b.add("const unsigned %s = %s %% %du, %s_r = %s / %du;", d[3], left, d[1], d[3], left, d[1])
            terms[#terms + 1] = term64(d[3], d[2])
            if d[3] == "j" then jx = "j" end
            left = d[3] .. "_r"
        else
            terms[#terms + 1] = term64(left, d[2])
            if d[3] == "j" then jx = left end
        end
    end
    if s.dN then
        -- Symbolic N: only the run-time columns (cuBLAS reads no others).
        b.add("if (%s >= (unsigned)(%s))", jx, s.dN)
        b.add("    return;")
    end
    if kvx then terms[#terms + 1] = term64(vc > 1 and "(" .. kvx .. " * " .. vc .. "u)" or kvx, s.sb[1]) end
    b.add("const float *const src = B + %s;", sum(terms))
    for q = 0, vc - 1, bw do
        if bw == 4 then
            H.use("ldb4")
            b.add("float v%d, v%d, v%d, v%d;", q, q + 1, q + 2, q + 3)
            b.add("kiln_ldb4(src + %d, v%d, v%d, v%d, v%d);", q, q, q + 1, q + 2, q + 3)
        elseif bw == 2 then
            H.use("ldb2")
            b.add("float v%d, v%d;", q, q + 1)
            b.add("kiln_ldb2(src + %d, v%d, v%d);", q, q, q + 1)
        else
            H.use("ldb1")
            local off = q == 0 and "0" or (s.sb[1] == 1 and tostring(q) or lit(q * s.sb[1]))
            b.add("const float v%d = kiln_ldb1(src + %s);", q, off)
        end
    end
    local out = string.format("S + (long long)idx * %d", vc)
    if vc == 1 and tt ~= "f32" then
        b.add("*(%s) = %s;", out, pre.store(tt, "v0"))
    elseif vc == 1 then
        b.add("*(%s) = v0;", out)
    else
        local words = {}
        if tt == "f32" then
            for e = 0, vc - 1 do words[#words + 1] = string.format("__float_as_uint(v%d)", e) end
        else
            for e = 0, vc - 1, 2 do
                words[#words + 1] = string.format("((unsigned)%s | ((unsigned)%s << 16))", pre.store(tt, "v" .. e),
                    pre.store(tt, "v" .. (e + 1)))
            end
        end
        if #words == 4 then
            H.use("st16")
            b.add("kiln_st16(%s, %s);", out, table.concat(words, ", "))
        elseif #words == 2 then
            H.use("st8")
            b.add("kiln_st8(%s, %s);", out, table.concat(words, ", "))
        else
            b.add("*(unsigned *)(%s) = %s;", out, words[1])
        end
    end
    local notes = {
        string.format("b made contiguous in %s for cuBLAS: %d columns of %d; %d elements per thread (%s)", tt, ncol,
            s.K, vc, bw > 1 and string.format("%d-float loads", bw) or "element loads"),
    }
    local name = short_name(string.format("mul_mat_cvt_%s_%dx%d", tt, s.K, ncol))
    local source = render(name, s, notes, pre, H, CVT_BLOCK, param_list(k, 1), b.lines)
    return { name = name, source = source, grid = { ceil_div(total, CVT_BLOCK), 1, 1 }, block = { CVT_BLOCK, 1, 1 }, smem = 0 },
        s.K * ncol * SIZE[tt]
end

-- Is dst laid out contiguously ([M, N, B2, B3], the fresh buffer the IR gives)?
local function dst_contiguous(s)
    local want = { 1, s.M, s.M * s.N, s.M * s.N * s.B2 }
    for d = 1, 4 do
        if s.d.ne[d] > 1 and s.sd[d] ~= want[d] then return false end
    end
    return true
end

-- b as cuBLAS can take it without a copy (f32 weights only): contiguous columns, and the r2
-- columns groups sharing an a-matrix evenly spaced. Returns the column stride, or nil.
local function direct_ldb(s)
    if s.ta ~= "f32" then return nil end
    if s.K > 1 and s.sb[1] ~= 1 then return nil end
    local ld
    if s.N > 1 then
        if s.r2 > 1 and s.sb[3] ~= s.N * s.sb[2] then return nil end
        ld = s.sb[2]
    elseif s.r2 > 1 then
        ld = s.sb[3]
    else
        ld = s.K
    end
    if ld < s.K or ld > INT_MAX then return nil end
    return ld
end

local function gemm(k, s)
    if not dst_contiguous(s) then return nil end
    -- Symbolic dims: only N, as cuBLAS's n (n_dyn), and only when each call's columns are one
    -- b-matrix (r2 == 1: the r2 groups would be Nmax columns apart).
    if s.dK or s.dM or s.dB2 or s.dB3 or (s.dN and s.r2 > 1) then return nil end
    local lda = s.M > 1 and s.sa[2] or s.K
    if lda < s.K or lda > INT_MAX then return nil end
    local steps, scratch = {}, 0
    local bsrc
    local ldb = direct_ldb(s)
    if ldb then
        bsrc = { param = s.b.param, offs = s.b.offs, st = s.sb, ld = ldb, type = "f32" }
    else
        local tt = s.ta
        local conv, bytes = convert(k, s, tt)
        steps[1] = conv
        local base = k.scratch_base or 0
        scratch = base + bytes
        bsrc = { param = k.nparams, offs = base // SIZE[tt], st = { 1, s.K, s.K * s.N, s.K * s.N * s.B2 }, ld = s.K, type = tt }
    end
    local es, bes = s.es, SIZE[bsrc.type]
    local sa, sb, sd = s.sa, bsrc.st, s.sd
    local n = s.N * s.r2
    local n_dyn = s.dN and { slot = dyn_slot(k, s.b, 2), mul = 1, above = k.n_above } or nil
    local function call(ao, as_, bo, bs_, co, cs_, batch)
        return { gemm = {
            transa = true, transb = false, m = s.M, n = n, k = s.K, batch = batch, n_dyn = n_dyn,
            a = { param = s.a.param, offset = (s.a.offs + ao) * es, type = s.ta, ld = lda, stride = batch > 1 and as_ or 0 },
            b = { param = bsrc.param, offset = (bsrc.offs + bo) * bes, type = bsrc.type, ld = bsrc.ld, stride = batch > 1 and bs_ or 0 },
            c = { param = s.d.param, offset = (s.d.offs + co) * 4, type = "f32", ld = s.M, stride = batch > 1 and cs_ or 0 },
        } }
    end
    -- Plan Z: one call per i3, batched over the A2 a-matrices of that i3 (one call in all when
    -- the i3 steps are evenly spaced in a, b and dst). Plan Y: one call per a-matrix, batched
    -- over the r3 b-matrices of each (a stride 0).
    local calls = {}
    local mergeable = s.B3 == 1 or (s.r3 == 1 and (s.A2 == 1 or (sa[4] == s.A2 * sa[3] and sb[4] == s.B2 * sb[3]
        and sd[4] == s.B2 * sd[3])))
    local nz = mergeable and 1 or s.B3
    local ny = s.NG
    if math.min(nz, ny) > MAX_STEPS then return nil end
    if nz <= ny then
        if mergeable and s.B3 > 1 and s.A2 == 1 then
            calls[1] = call(0, sa[4], 0, sb[4], 0, sd[4], s.B3)
        elseif mergeable then
            calls[1] = call(0, sa[3], 0, s.r2 * sb[3], 0, s.r2 * sd[3], s.A2 * s.B3)
        else
            for i3 = 0, s.B3 - 1 do
                local ja3 = i3 // s.r3
                calls[#calls + 1] = call(ja3 * sa[4], sa[3], i3 * sb[4], s.r2 * sb[3], i3 * sd[4], s.r2 * sd[3], s.A2)
            end
        end
    else
        for ja3 = 0, s.A3 - 1 do
            for ja2 = 0, s.A2 - 1 do
                calls[#calls + 1] = call(ja2 * sa[3] + ja3 * sa[4], 0, ja2 * s.r2 * sb[3] + ja3 * s.r3 * sb[4], sb[4],
                    ja2 * s.r2 * sd[3] + ja3 * s.r3 * sd[4], sd[4], s.r3)
            end
        end
    end
    for _, c in ipairs(calls) do steps[#steps + 1] = c end
    if #steps > MAX_STEPS then return nil end
    if #steps == 1 then return steps[1] end
    return { scratch = scratch, steps = steps }
end

-- The gemv serves C == 1 (a symbolic K goes to the tile kernels, which guard it).
local function use_gemv(s) return s.C == 1 and not s.dK end

local function plan(k, s)
    if use_gemv(s) then return gemv(k, s) end
    if s.C >= GEMM_MIN_COLS or s.K * s.M * s.NG >= GEMM_SMALL_WEIGHTS then
        local r = gemm(k, s)
        if r then return r end
    end
    local mp = mma_plan(s)
    if mp then return tile_mma(k, s, mp) end
    return tile(k, s)
end

-- The epilogue fallback of the tile and gemm plans: the product (and the paired product) into
-- f32 regions of the scratch by the plain plan, then the epilogue as a step of its own. The
-- paired product's conversion of b (identical to the first's) is not repeated.
local quant_matmul -- (quantized weights: below)
local function via_scratch(k)
    local d = k.dst
    local subs, voffs, base = epilogue.value_nodes(k, "a")
    local steps, scratch, conv = {}, base, nil
    for _, sk in ipairs(subs) do
        local r = quant.is(sk.args.a.type) and quant_matmul(sk) or plan(sk, shape_of(sk))
        scratch = math.max(scratch, r.scratch or 0)
        for i, st in ipairs(r.steps or { r }) do
            local is_conv = i == 1 and r.steps and st.source and st.name:find("^mul_mat_cvt_")
            if not (is_conv and epilogue.same_code(conv, st.source)) then steps[#steps + 1] = st end
            if is_conv then conv = st.source end
        end
    end
    local pre = prelude.new()
    local body, blocks = ep_body(k, pre, voffs)
    local b = builder()
    b.push()
    for _, l in ipairs(body) do b.add("%s", l) end
    local s = shape_of(k, { type = "f32", ne = d.ne, st = d.st, offs = d.offs, param = d.param, dyn = d.dyn, sym = d.sym })
    local name = short_name(string.format("mul_mat_epilogue_%s_%dx%d", k.pair and "pair" or "one", s.M, s.C))
    local notes = { string.format("epilogue after the product%s: one thread per dst element, values from the scratch",
        k.pair and "s" or "") }
    steps[#steps + 1] = { name = name, source = render(name, s, notes, pre, helpers(), EP_BLOCK, param_list(k, 1), b.lines),
        grid = { blocks, 1, 1 }, block = { EP_BLOCK, 1, 1 }, smem = 0 }
    if #steps > 64 then fail("the epilogue fallback needs %d steps, more than 64", #steps) end
    return { scratch = scratch, steps = steps, epilogue = k.epilogue ~= nil, paired = k.pair ~= nil }
end

-- ---- quantized weights (templates/quant.lua) --------------------------------------------------

local QGEMV_WARPS = 8 -- warps per block of the quantized gemv (groups of them split K)
local QGEMV_RMAX = 2  -- most rows per warp group (each read of b's shared bytes serves them all;
                      -- H100, 8B decode: 2 gave Q4_K_M 2.92 ms, 4 3.11, 1 2.93 but Q8_0 3.94 against 3.78)
-- Where the quantized GEMV's programmatic-dependent-launch instructions go (codegen/generate.c):
-- "start": both at the top; "late": the launch of the next kernel after the main loop (its
-- blocks then take the SMs this one's leave); "early": the grid wait after the first units'
-- weight loads (weights are never written by an earlier kernel); "early_late": both. H100, one
-- call, decode ms (start / late / early / early_late): 8B Q4_K_M 2.548 / 2.497 / 2.536 / 2.497,
-- 8B Q4_0 2.275 / 2.256 / 2.256 / 2.248, 1B Q4_K_M 0.602 / 0.591 / 0.594 / 0.593.
local QGEMV_PDL = "late"
local QGEMV_REGS = 64 -- registers of weights one lane keeps in flight ahead of its products, at most
                      -- (H100, one call: 40 gave 8B Q4_K_M 2.700 ms, Q8_0 3.541; 64 2.573 and 3.390; 52
                      -- and 80 in between; 64 but 40 for q6_K 2.644)
local QGEMV_MINB = 0  -- __launch_bounds__ minimum blocks per SM (0: none)

-- The quantized gemv's layout: the block's QGEMV_WARPS warps form groups of WK that own R rows
-- each and split those rows' units. R starts at QGEMV_RMAX / NV and WK at 1; while the grid has
-- fewer than QGEMV_TARGET warps (all of a small matrix's bytes must be requested at once: at
-- 512 warps a 4096 x 4096 q4_K took 11.6 us, 0.8 TB/s), WK doubles as long as the units fill
-- whole rounds of the group's lanes, else R halves.
local QGEMV_TARGET = 2048
local function qgemv_layout(M, NG, NU, NV, RMIN)
    local WK, R = 1, math.max(RMIN, QGEMV_RMAX // NV)
    while ceil_div(M, QGEMV_WARPS // WK * R) * QGEMV_WARPS * NG < QGEMV_TARGET do
        -- (only while the units still fill whole rounds of the group's lanes: a partial last
        -- round measured 31% of the roofline for q4_0 14336 -> 4096, against 52% without)
        if WK < QGEMV_WARPS and NU % (32 * WK * 2) == 0 then
            WK = WK * 2
        elseif R > RMIN then
            R = R // 2
        else
            break
        end
    end
    return WK, QGEMV_WARPS // WK, R
end


-- The fused gemv of a quantized a (one column): nil when b's layout does not allow its
-- 16-byte loads (contiguous, 4-float aligned columns) or a dim is symbolic. Each block first
-- quantizes b to int8 in shared memory (quant.bq_prologue; the first units' weight loads are
-- issued before it, so that its latency hides behind theirs), then each lane takes units of
-- 32 elements of its rows: the weights' integers against b's in dp4a (quant.lua's int8 path),
-- the loads of the next PF units in flight while one is multiplied. With k.pair (pass
-- mul_mat_glu) it computes the paired weight's rows against the same bytes of b, and with
-- k.epilogue (the GLU, a residual add) the store applies it (epilogue.store_lines).
local function qgemv(k, s)
    local ti = quant.TYPES[s.ta]
    if s.C ~= 1 or s.dyn then return nil end
    if s.K > 1 and s.sb[1] ~= 1 then return nil end
    if s.b.offs % 4 ~= 0 then return nil end
    for d = 3, 4 do if s.sb[d] % 4 ~= 0 then return nil end end
    quant.check_blocks(s.a, fail, "a")
    if s.pa then quant.check_blocks(s.pa, fail, "pair") end
    local T = s.ta
    local BL, UB = ti.block, ti.ub
    local NU = s.K // BL * UB
    local NV = s.pa and 2 or 1 -- products per row
    local WP = QGEMV_WARPS
    -- k.tail (pass gemv_rope): a thread stores rows (row, row + 1) together (gemv_rope.store),
    -- so groups own 2 rows at least.
    if k.tail and (s.pa or s.NG > 1 or s.M % 2 ~= 0) then
        fail("gemv_rope: tails need an unpaired single-matrix gemv with an even number of rows")
    end
    local WK, G, R = qgemv_layout(s.M, s.NG, NU, NV, k.tail and 2 or 1)
    local RB = G * R -- rows per block
    local NI = ceil_div(NU, 32 * WK)
    -- units whose loads run ahead of the one being multiplied
    local PF = math.max(1, math.min(NI, QGEMV_REGS // (quant.QW_REGS[T] * R * NV)))
    local pre = prelude.new()
    local b = builder()
    b.push()
    for _, l in ipairs(quant.pointers(s.a, fail)) do b.add("%s", l) end
    if s.pa then
        for _, l in ipairs(quant.pointers(s.pa, fail, "W2", "NB2")) do b.add("%s /* the paired weight */", l) end
    end
    b.add("const float *const B = (const float *)p%d%s;", s.b.param, s.b.offs ~= 0 and " + " .. lit(s.b.offs) or "")
    if not k.epilogue and not k.tail then -- (tails store rows elsewhere: z is not stored)
        b.add("float *const Y = (float *)p%d%s;", s.d.param, s.d.offs ~= 0 and " + " .. lit(s.d.offs) or "")
    end
    local segs
    if k.tail then
        segs = gemv_rope.plan(k, s)
        gemv_rope.pointers(b, segs)
    end
    b.add("const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;")
    b.add("const unsigned kw = warp %% %du, row0 = blockIdx.x * %du + warp / %du * %du;", WK, RB, WK, R)
    decl_batch(b, s, "blockIdx.y")
    -- Rows past M (the last block's) read row M - 1 again and store nothing.
    local function row_blocks(var, ref, st)
        b.add("long long %s[%d];", var, R)
        b.add("#pragma unroll")
        b.add("for (int r = 0; r < %d; r++)", R)
        local row = s.M % RB ~= 0 and string.format("min(row0 + r, %du)", s.M - 1) or "(row0 + r)"
        if segs then row = gemv_rope.phys_row(segs, row) end -- (neox segments: rows in pair order)
        b.add("    %s[r] = %s;", var, sum({ lit(ref.offs // BL), term64(row, st[2] // BL),
            s.A2 > 1 and term64("ja2", st[3] // BL) or nil, s.A3 > 1 and term64("ja3", st[4] // BL) or nil }))
    end
    row_blocks("blk0", s.a, s.sa)
    if s.pa then row_blocks("blk1", s.pa, s.spa) end
    -- Unit i of the lane (units past NU, in a partial last round, load unit NU - 1 again and
    -- add nothing); its block in the row and its part of the block.
    local partial = NU % (32 * WK) ~= 0
    local function unit(i) quant.unit_index(b, i, "(int)(lane + 32u * kw)", 32 * WK, UB, NU, partial) end
    local function loads(i)
        unit(i)
        b.add("kiln_qw_%s w%d[%d];", T, i, R * NV)
        b.add("#pragma unroll")
        b.add("for (int r = 0; r < %d; r++) {", R)
        b.add("    w%d[r] = kiln_qwl_%s(W, NB, blk0[r] + ub%d, pt%d);", i, T, i, i)
        if s.pa then b.add("    w%d[%d + r] = kiln_qwl_%s(W2, NB2, blk1[r] + ub%d, pt%d);", i, R, T, i, i) end
        b.add("}")
    end
    for i = 0, PF - 1 do loads(i) end
    if QGEMV_PDL == "early" or QGEMV_PDL == "early_late" then b.add("/* kiln: grid wait here */") end
    -- k.bnorm (pass rms_norm_gemv): b is x, the prologue quantizes x * w and sums x² once per
    -- block; the products are scaled by the norm's 1/sqrt(mean(x²) + eps) at the store.
    local norm
    if k.bnorm then
        local w = k.bnorm.w
        if w.type ~= "f32" or w.ne[1] ~= s.K or (s.K > 1 and w.st[1] ~= 1) or w.offs % 4 ~= 0 then
            fail("bnorm: the norm weight must be a contiguous, 16-byte aligned f32 [K]")
        end
        norm = { w = string.format("(const float *)p%d%s", w.param, w.offs ~= 0 and " + " .. lit(w.offs) or ""), eps = k.bnorm.eps }
    end
    local boffs = sum({ s.A2 > 1 and term64("ja2", s.sb[3]) or nil, s.A3 > 1 and term64("ja3", s.sb[4]) or nil })
    for _, l in ipairs(quant.bq_prologue(s.K, 32 * WP, "B" .. (boffs ~= "0" and " + " .. boffs or ""), norm)) do
        b.add("%s", l)
    end
    b.add("float acc[%d] = {%s};", NV * R, string.rep("0.0f", NV * R, ", "))
    quant.unit_loop(b, T, NI, PF, R * NV, loads, partial, "(int)(lane + 32u * kw)", 32 * WK, NU)
    if QGEMV_PDL == "late" or QGEMV_PDL == "early_late" then b.add("/* kiln: launch dependents here */") end
    b.add("#pragma unroll")
    b.add("for (int r = 0; r < %d; r++) {", NV * R)
    b.add("#pragma unroll")
    b.add("    for (int o = 16; o > 0; o >>= 1)")
    b.add("        acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);")
    b.add("}")
    -- vals: the product (and the paired one) of a row; with an epilogue, it is applied at dst
    -- coordinates (row, 0, ja2, ja3) (one column: dst's batch is the a-matrix's).
    local function store(row, vals)
        if norm then
            local sv = {}
            for i, v in ipairs(vals) do sv[i] = "(" .. v .. " * bscale)" end
            vals = sv
        end
        if k.epilogue then
            local c = { row, nil, s.A2 > 1 and "ja2" or nil, s.A3 > 1 and "ja3" or nil }
            return ep_lines(k, pre, c, vals)
        end
        return { string.format("Y[%s] = %s;", sum({ term64(row, s.sd[1]), s.A2 > 1 and term64("ja2", s.sd[3]) or nil,
            s.A3 > 1 and term64("ja3", s.sd[4]) or nil }), vals[1]) }
    end
    local function scaled(v) return norm and "(" .. v .. " * bscale)" or v end
    if segs and WK == 1 then
        -- Lane 0 holds every row of its group: pairs of rows to the tails.
        b.open("if (lane == 0%s) {", s.M % RB ~= 0 and string.format(" && row0 < %du", s.M) or "")
        for r = 0, R - 1, 2 do
            gemv_rope.store(b, pre, segs, r == 0 and "row0" or string.format("(row0 + %du)", r), scaled(string.format("acc[%d]", r)),
                scaled(string.format("acc[%d]", r + 1)))
        end
        b.close()
    elseif segs then
        -- The warps' partials meet in shared memory; thread p sums rows 2p and 2p + 1.
        b.add("__shared__ float part[%d][%d];", WP, R)
        b.add("if (lane == 0) {")
        b.add("#pragma unroll")
        b.add("    for (int r = 0; r < %d; r++)", R)
        b.add("        part[warp][r] = acc[r];")
        b.add("}")
        b.add("__syncthreads();")
        local guard = s.M % RB ~= 0 and string.format(" && blockIdx.x * %du + 2u * threadIdx.x < %du", RB, s.M) or ""
        b.open("if (threadIdx.x < %du%s) {", RB // 2, guard)
        b.add("const unsigned g = 2u * threadIdx.x / %du, r = 2u * threadIdx.x %% %du;", R, R)
        b.add("float v = 0.0f, v2 = 0.0f;")
        b.add("#pragma unroll")
        b.add("for (int w = 0; w < %d; w++) {", WK)
        b.add("    v += part[g * %du + w][r];", WK)
        b.add("    v2 += part[g * %du + w][r + 1];", WK)
        b.add("}")
        b.add("const unsigned row = blockIdx.x * %du + 2u * threadIdx.x;", RB)
        gemv_rope.store(b, pre, segs, "row", scaled("v"), scaled("v2"))
        b.close()
    elseif WK == 1 then
        -- Each warp owns its rows whole: its lane r stores row r.
        local guard = s.M % RB ~= 0 and string.format(" && row0 + r < %du", s.M) or ""
        b.add("#pragma unroll")
        b.add("for (int r = 0; r < %d; r++)", R)
        b.add("    if (lane == r%s) {", guard)
        for _, l in ipairs(store("(row0 + r)", s.pa and { "acc[r]", string.format("acc[%d + r]", R) } or { "acc[r]" })) do
            b.add("        %s", l)
        end
        b.add("    }")
    else
        b.add("__shared__ float part[%d][%d];", WP, NV * R)
        b.add("if (lane == 0) {")
        b.add("#pragma unroll")
        b.add("    for (int r = 0; r < %d; r++)", NV * R)
        b.add("        part[warp][r] = acc[r];")
        b.add("}")
        b.add("__syncthreads();")
        local guard = s.M % RB ~= 0 and string.format(" && blockIdx.x * %du + threadIdx.x < %du", RB, s.M) or ""
        b.add("if (threadIdx.x < %du%s) {", RB, guard)
        b.add("    const unsigned g = threadIdx.x / %du, r = threadIdx.x %% %du;", R, R)
        b.add("    float v = 0.0f%s;", s.pa and ", v2 = 0.0f" or "")
        b.add("#pragma unroll")
        b.add("    for (int w = 0; w < %d; w++) {", WK)
        b.add("        v += part[g * %du + w][r];", WK)
        if s.pa then b.add("        v2 += part[g * %du + w][%d + r];", WK, R) end
        b.add("    }")
        for _, l in ipairs(store(string.format("(blockIdx.x * %du + threadIdx.x)", RB), s.pa and { "v", "v2" } or { "v" })) do
            b.add("    %s", l)
        end
        b.add("}")
    end
    local name = short_name(string.format("mul_mat_qgemv_%s%s_%dx%d%s", s.pa and "pair_" or "", s.ta, s.K, s.M,
        s.NG > 1 and "x" .. s.NG or ""))
    local notes = {
        string.format("quantized gemv: %d rows of %d %s elements (%d blocks); a block: %d groups of %d warps, %d rows a group, " ..
            "the group's warps split K: %d units of %d elements per lane, the loads of %d ahead", s.M, s.K, s.ta, s.K // BL, G, WK,
            R, NI, BL // UB, PF),
        "b quantized to int8 per 32 elements in shared memory (as ggml's q8_0/q8_1 activations); dp4a products",
    }
    if s.pa then notes[#notes + 1] = "paired weight (mul_mat_glu): its rows against the same bytes of b" end
    if k.epilogue then notes[#notes + 1] = "epilogue applied at the store" end
    if norm then notes[#notes + 1] = "b's rms_norm (rms_norm_gemv): x * w quantized, the norm's scale applied at the store" end
    for _, l in ipairs(segs and gemv_rope.notes(segs) or {}) do notes[#notes + 1] = l end
    local source = kit.kernel {
        head = { "kiln matmul kernel " .. name,
            "mul_mat: dst " .. dims(s.d.ne) .. " f32 = b " .. dims(s.b.ne) .. " f32 · a " .. dims(s.a.ne) .. " " .. s.ta .. "ᵀ" },
        notes = notes, pre = (pre.code():gsub("\n$", "")), blocks = { quant.helpers(s.ta, false, true) }, inline = true,
        name = name, threads = QGEMV_MINB > 0 and string.format("%d, %d", 32 * WP, QGEMV_MINB) or tostring(32 * WP),
        params = table.concat(param_list(k), ", "), body = b.lines,
    }
    return { name = name, source = source, grid = { ceil_div(s.M, RB), s.NG, 1 },
        block = { 32 * WP, 1, 1 }, smem = 0 }
end

-- The quantized a dequantized to f16 into the scratch (from k.scratch_base: a sub-node of the
-- epilogue fallback has its values first) and the f16 plan on it (the gemm plan's own scratch
-- after it). above: nil, or the columns up to which a run leaves the product to qmma's steps;
-- r.hybrid tells whether every step then skips those runs (the f16 plan is the conversion and
-- cuBLAS, which honour it).
local function dequant_plan(k, s, above)
    local base0 = k.scratch_base or 0
    local sk0 = {}
    for key, x in pairs(k) do sk0[key] = x end
    sk0.scratch_dst = true
    local step, bytes = quant.dequant_step(k.nparams, table.concat(param_list(sk0), ", "), s.a, base0, "a", fail,
        "mul_mat_dq_", above and { s.dN, above } or nil)
    local sk = {}
    for key, x in pairs(k) do sk[key] = x end
    sk.args = {}
    for key, x in pairs(k.args) do sk.args[key] = x end
    local a = s.a
    sk.args.a = { type = "f16", ne = a.ne, st = { 1, a.ne[1], a.ne[1] * a.ne[2], a.ne[1] * a.ne[2] * a.ne[3] },
        offs = base0 // 2, param = k.nparams, dyn = a.dyn, sym = a.sym }
    sk.scratch_dst = true
    sk.scratch_base = (base0 + bytes + 255) // 256 * 256
    sk.n_above = above
    local sub = plan(sk, shape_of(sk))
    local steps = { step }
    local hybrid = above ~= nil
    for _, st in ipairs(sub.steps or { sub }) do
        steps[#steps + 1] = st
        if not (st.gemm or (st.name and st.name:find("^mul_mat_cvt_"))) then hybrid = false end
    end
    return { scratch = math.max(sk.scratch_base, sub.scratch or 0), steps = steps, hybrid = hybrid }
end

-- mul_mat with a quantized a: the fused gemv, else a dequantized to f16 in the scratch (from
-- k.scratch_base: a sub-node of the epilogue fallback has its values first) and the f16 plan on
-- it (the gemm plan's own scratch after it).
function quant_matmul(k)
    if k.epilogue or k.pair then
        local d = k.dst
        local s = shape_of(k, { type = "f32", ne = d.ne, st = d.st, offs = d.offs, param = d.param, dyn = d.dyn, sym = d.sym })
        if k.pair and not (k.epilogue and k.epilogue.values == 2) then fail("a paired weight needs an epilogue over 2 values") end
        local r = qgemv(k, s)
        if not r and (k.bnorm or k.tail) then
            fail("bnorm (b's rms_norm) and tails over quantized weights need the fused gemv (one contiguous column)")
        end
        r = r or via_scratch(k)
        r.epilogue, r.paired, r.bnorm, r.tail = k.epilogue ~= nil, k.pair ~= nil, k.bnorm ~= nil, k.tail ~= nil
        if s.kdims then r.dynamic = true end
        return r
    end
    local s = shape_of(k)
    local r = qgemv(k, s)
    if not r and (k.bnorm or k.tail) then
        fail("bnorm and tails over quantized weights need the fused gemv (one contiguous column)")
    end
    if r then r.bnorm, r.tail = k.bnorm ~= nil, k.tail ~= nil end
    -- 2..64 columns: the tensor-core tile reading the quantized weights (qmma); a symbolic N
    -- beyond them (above): the tile's steps for runs up to 64 columns and the dequantizing ones,
    -- each doing nothing on the other's runs.
    local tile, above
    if not r then
        tile, above = qmma.plan(k, s, { param_list = param_list, lit = lit, fail = fail, helpers = helpers })
        if tile and not above then r = tile end
    end
    if not r then
        r = dequant_plan(k, s, above)
        if tile and r.hybrid then
            for i, st in ipairs(tile.steps) do table.insert(r.steps, i, st) end
            r.scratch = math.max(r.scratch, tile.scratch)
        elseif tile then
            r = dequant_plan(k, s, nil) -- (the f16 plan is not one that skips runs: no tile)
        end
        r.hybrid = nil
    end
    if s.kdims then r.dynamic = true end
    return r
end

return function(k)
    if k.kind ~= "op" then fail("node kind %s is not op", tostring(k.kind)) end
    if k.op ~= "mul_mat" then fail("unknown op %s", tostring(k.op)) end
    if k.args and k.args.a and quant.is(k.args.a.type) then return quant_matmul(k) end
    if not (k.epilogue or k.pair or k.bnorm or k.tail) then
        local s = shape_of(k)
        local r = plan(k, s)
        if s.kdims then r.dynamic = true end
        return r
    end
    -- An epilogue (mul_mat_glu: the GLU over the product and the paired product; the shapes are
    -- checked against dst's space as an f32 product) and/or b's norm (pass rms_norm_gemv, which
    -- only fuses one column with a static K: the gemv, the one plan that computes it).
    local d = k.dst
    local s = k.epilogue and shape_of(k, { type = "f32", ne = d.ne, st = d.st, offs = d.offs, param = d.param, dyn = d.dyn, sym = d.sym })
        or shape_of(k)
    if k.pair and not (k.epilogue and k.epilogue.values == 2) then fail("a paired weight needs an epilogue over 2 values") end
    if k.bnorm and not use_gemv(s) then fail("bnorm (b's rms_norm) is computed by the gemv plan only (one column, static K)") end
    if k.tail and not use_gemv(s) then fail("gemv_rope: tails are computed by the gemv plan only (one column)") end
    local r
    if use_gemv(s) then r = gemv(k, s) else r = via_scratch(k) end
    r.epilogue, r.paired, r.bnorm, r.tail = k.epilogue ~= nil, k.pair ~= nil, k.bnorm ~= nil, k.tail ~= nil
    if s.kdims then r.dynamic = true end
    return r
end
