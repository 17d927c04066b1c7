-- attn: the kernel template of the attention family (flash_attn_ext); see docs/templates.md
-- for the table k of IR_OP nodes and docs/ops-attn.md for the semantics and the designs.
--
-- Per query row (token iq1, head h, sequence i3), with kv head hk = h / G (G = n_head /
-- n_head_kv), as ggml's CPU kernel (ir/ref_attn.c is the oracle):
--   x_j = dot(q, k_j) * scale'           (scale' = scale / softcap when softcap != 0)
--   x_j = softcap * tanh(x_j)            (softcap != 0)
--   x_j = x_j + slope(h) * mask[j, iq1]  (-inf: the key is skipped; ALiBi slopes as soft_max_ext)
--   out = sum_j e^(x_j - M) v_j / (sum_j e^(x_j - M) + e^(sink_h - M))
-- Kernels work in the log2 domain (x * log2 e, then ex2) with an online softmax: per row a
-- running max m, a running sum l and an unnormalised output o, rescaled by 2^(m_old - m_new)
-- when the max grows. A row that saw no key has m = -inf; "base" (m, or 0 when m = -inf) keeps
-- -inf - -inf out of every exponent, so fully masked rows give l = 0 and the output 0, as ggml.
--
-- The rows of one kv head ("group") are processed together: row r of a group is token r / G,
-- head hk * G + r % G, so every query head of a GQA group reads the group's K and V once.
--
-- Kernels (chosen from the static shapes, `plan` below):
--
-- * dec (decode: at most 32 rows per group, f16/bf16 K/V, head sizes multiples of 16 up to 256):
--   block = 4 warps over one split of the KV range, one tile of 8 or 16 rows; each warp takes
--   16 keys at a time (interleaved with the other warps) and computes S^T = K Q^T and
--   O^T += V^T P^T with mma.sync m16n8k16 (keys / head dims on the 16 side, rows on the 8 side).
--   K and V fragments come straight from global memory in 16-byte loads (no shared memory):
--   the dot product is indifferent to the order of d, so Q's fragment uses the same
--   permutation of d as the 16-byte K loads; V^T's fragment wants pairs of keys, made from two
--   keys' 16-byte loads by byte permutes (prmt), the head dim permuted the same way and undone
--   at the store; P^T (keys x rows) becomes the B fragment (rows x keys) by movmatrix.trans.
--   The 4 warps' states meet in shared memory at the end.
-- * pre (prefill: more rows): FlashAttention-2 style. Block = 4 warps x 16 rows = 64 rows of one
--   group; K and V tiles of BN keys go through padded shared memory by cp.async (K of the next
--   tile loads during P V, V during Q K^T), fragments by ldmatrix (.trans for V); S = Q K^T and
--   O += P V with mma.sync m16n8k16, P reused from S's accumulators. With a mask, the block
--   first scans its distinct mask rows for the first and last 8-key chunk holding a finite
--   value and visits only the tiles in between (causal: nothing right of the diagonal); inside,
--   the mask tile is read into registers one tile ahead, and a tile that is -inf for every row
--   of the block is skipped with one __syncthreads_or.
-- * fma (f32 K/V, head sizes that are not multiples of 16, or larger than 256): one warp per
--   row; per 32 keys each lane computes one key's score (f32 FMA), the warp shares the
--   probabilities by shuffles and each lane accumulates its head dims.
-- * split-KV: when the groups and row tiles give fewer than FILL blocks, the KV range is split
--   so that about FILL blocks run; each split writes (m, l, o) of its rows to scratch and a
--   second kernel ("combine": one warp per row when a row's partials fit in a lane's registers,
--   else one 256-thread block per row) merges the splits and the sink and writes dst.

local kit = require("kit")
local prelude = require("prelude")

local SM_COUNT = 132        -- H100 SXM
local FILL = 2 * SM_COUNT   -- blocks to aim for: about two waves on every SM
local DEC_MAX_ROWS = 32     -- rows per group up to which the decode kernel is used
local MMA_MAX_D = 256       -- largest head size of the prefill tensor-core kernel
-- Largest head size of the decode tensor-core kernel, which then serves every row count:
-- DeepSeek's MLA attends with K 576 and V 512 wide over one kv head shared by all heads. Its
-- accumulators (V^T P^T: DV / 16 m-tiles of 8 rows) fit the registers; the prefill kernel's
-- (64 rows x DV) would not. (Measured on the H100, DeepSeek-V2-Lite bf16: the FMA kernel
-- took 170 us a layer at decode and 31 ms a layer for a 512-token prefill.)
local DEC_MAX_D = 576
-- Key intervals: the most splits of one row tile's keys (a short batch over long sequences).
local RANGE_MAX_SPLITS = 16
local W = 4                 -- warps per block (every kernel)
local NTHR = 32 * W
local INT_MAX = 2147483647
local NEG_INF = "(-__int_as_float(0x7f800000))"
local LOG2E = "1.44269504088896341f"
local NEG_INF_F16X2 = "0xfc00fc00u" -- two f16 -inf

local fail = kit.failer("attn")
local ceil_div = kit.ceil_div
local dims = kit.dims

-- A C literal of an element offset or stride: long long, so products never wrap.
local ll = kit.ll

local check_ref = kit.ref_checker(fail)

-- The largest of 8, 4, 2, 1 elements that divides r's offset and every stride a coordinate
-- can reach (dims of extent 1 never move), so rows can be read in vectors of that many.
local function row_align(r)
    local a = 8
    local function fit(x)
        while a > 1 and x % a ~= 0 do a = a // 2 end
    end
    fit(r.offs)
    for d = 2, 4 do
        if r.ne[d] > 1 then fit(r.st[d]) end
    end
    return a
end

-- ---- CUDA helpers -------------------------------------------------------------------------------
-- Each is emitted only when used (NVRTC warns about unused static functions).

-- The f32 pair packing and the mma.sync of a 16-bit input type: f16 and bf16 differ only in the
-- type's name (@T@).
local PACK = [[
/* Two f32 rounded to @T@, lo in the low half. */
static __device__ __forceinline__ unsigned kiln_pack(float lo, float hi)
{
    unsigned r;
    asm("cvt.rn.@T@x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}]]
local MMA = [[
/* c += a b, m16n8k16, @T@ inputs, f32 accumulators. */
static __device__ __forceinline__ void kiln_mma(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                                unsigned b0, unsigned b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.@T@.@T@.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}]]
local function typed_helper(text, t) return (text:gsub("@T@", t)) end

local HELPERS = {
    { name = "types", code = [[
typedef unsigned short kiln_u16;
struct alignas(16) kiln_u32x4 {
    unsigned x, y, z, w;
};
struct alignas(8) kiln_u32x2 {
    unsigned x, y;
};
struct alignas(8) kiln_f32x2 {
    float x, y;
};]] },
    { name = "ex2", code = [[
/* 2^x; ex2.approx(-inf) = +0. */
static __device__ __forceinline__ float kiln_ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}]] },
    { name = "warp", code = [[
static __device__ __forceinline__ float kiln_warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __device__ __forceinline__ float kiln_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}]] },
    { name = "pack_f16", code = typed_helper(PACK, "f16") },
    { name = "pack_bf16", code = typed_helper(PACK, "bf16") },
    { name = "mma_f16", code = typed_helper(MMA, "f16") },
    { name = "mma_bf16", code = typed_helper(MMA, "bf16") },
    { name = "trans", code = [[
/* The fragment of the transposed 8x8 matrix of 16-bit elements (warp-wide). */
static __device__ __forceinline__ unsigned kiln_trans(unsigned x)
{
    unsigned y;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}]] },
    { name = "smem", code = [[
static __device__ __forceinline__ unsigned kiln_smem_u32(const void *p)
{
    unsigned a;
    asm("{\n\t.reg .u64 t;\n\tcvta.to.shared.u64 t, %1;\n\tcvt.u32.u64 %0, t;\n\t}" : "=r"(a) : "l"(p));
    return a;
}

/* Four 8x8 matrices of 16-bit elements from shared memory (ldmatrix), plain and transposed. */
static __device__ __forceinline__ void kiln_ldsm4(unsigned (&r)[4], unsigned addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

static __device__ __forceinline__ void kiln_ldsm4t(unsigned (&r)[4], unsigned addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

/* 16 bytes global -> shared, asynchronously (cp.async, bypassing L1). */
static __device__ __forceinline__ void kiln_cp16(unsigned saddr, const void *g)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(saddr), "l"(g) : "memory");
}

static __device__ __forceinline__ void kiln_cp_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

static __device__ __forceinline__ void kiln_cp_wait_all()
{
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}]] },
}

-- A recorder of the helpers one kernel source uses.
local function helpers()
    local used = {}
    local H = {}
    function H.use(name) used[name] = true end
    function H.code()
        local parts = {}
        for _, h in ipairs(HELPERS) do
            if used[h.name] then parts[#parts + 1] = h.code end
        end
        return table.concat(parts, "\n\n")
    end
    return H
end

-- A list of lines with an indentation level.
local builder = kit.builder

-- ---- the problem ------------------------------------------------------------------------------

-- Symbolic dims (docs/ops-attn.md): n_kv (k and v dim 1, the mask's dim 0) and n_q (q dim 1,
-- the mask's dim 1, dst dim 2) may be run-time values; nothing else. Sets P.dyn_kv and P.dyn_q
-- (the C expressions, or nil), P.isdyn (the kernels take kdims), and the C forms of the bounds
-- that the kernels compare with: P.NKVS / P.NKV1S (keys, last key) and P.RS / P.R1S (rows per
-- group, last row), static literals or the run-time nkv and nr.
local function symbolic(k, P)
    local dyn_of = kit.ext
    local allowed = {
        { P.q, "q", { [2] = "n_q" } }, { P.k, "k", { [2] = "n_kv" } }, { P.v, "v", { [2] = "n_kv" } },
        { P.mask, "mask", { [1] = "n_kv", [2] = "n_q" } }, { P.sinks, "sinks", {} }, { P.dst, "dst", { [3] = "n_q" } },
    }
    local seen = {}
    for _, a in ipairs(allowed) do
        local r, what, ok = a[1], a[2], a[3]
        for d = 1, 4 do
            local e = dyn_of(r, d)
            if e ~= nil then
                if type(e) ~= "string" then fail("%s: bad dyn[%d]", what, d) end
                local role = ok[d]
                if not role then
                    fail("symbolic dim %s on %s dim %d is not supported (only n_kv: k/v dim 1 and mask dim 0; n_q: q dim 1, mask dim 1, dst dim 2)",
                        tostring(r.sym and r.sym[d] or e), what, d - 1)
                end
                if seen[role] and seen[role] ~= e then
                    fail("%s dim %d (%s) differs from the other %s dims (%s)", what, d - 1, e, role, seen[role])
                end
                seen[role] = e
            end
        end
    end
    -- every operand of a role follows it (a static mask of the maximum's width is read below nkv)
    if seen.n_kv and (dyn_of(P.k, 2) == nil or dyn_of(P.v, 2) == nil) then
        fail("n_kv is symbolic on %s but not on both k and v", dyn_of(P.k, 2) and "k" or "v or the mask")
    end
    if seen.n_q and (dyn_of(P.q, 2) == nil or dyn_of(P.dst, 3) == nil) then
        fail("n_q is symbolic on %s but not on both q and dst", dyn_of(P.q, 2) and "q" or "dst or the mask")
    end
    if dyn_of(P.mask, 2) and P.mask.ne[2] ~= P.NQ then
        fail("mask dim 1 is symbolic but its maximum %d is not n_q's %d", P.mask.ne[2], P.NQ)
    end
    P.dyn_kv, P.dyn_q = seen.n_kv, seen.n_q
    P.isdyn = k.dims ~= nil and #k.dims > 0
    if (P.dyn_kv or P.dyn_q) and not P.isdyn then fail("a symbolic dim without k.dims") end
    P.dims_arg = P.isdyn and (k.dims_arg or ", const int* __restrict__ kdims") or ""
    P.NKVS = P.dyn_kv and "nkv" or string.format("%du", P.NKV)
    P.NKV1S = P.dyn_kv and "nkv - 1u" or string.format("%du", P.NKV - 1)
    P.RS = P.dyn_q and "nr" or string.format("%du", P.R)
    P.R1S = P.dyn_q and "nr - 1u" or string.format("%du", P.R - 1)
end

-- Blocks whose split starts past the run-time keys, or whose row tile starts past the run-time
-- rows, leave at once (before any barrier; the grid is the maximum's). `split`, `rt` are the
-- block's names; S splits of L keys, RT row tiles of ROWS rows.
local function dyn_exit(b, P, S, L, RT, ROWS)
    local c = {}
    if P.dyn_kv and S > 1 then c[#c + 1] = string.format("split * %du >= nkv", L) end
    if P.dyn_q and RT > 1 then c[#c + 1] = string.format("rt * %du >= nr", ROWS) end
    if #c > 0 then
        b.add("if (%s)", table.concat(c, " || "))
        b.add("    return; /* nothing of this block's at this run's extents */")
    end
end

-- With a run-time n_kv, a split kernel (dec, fma) whose first split holds every key at this run
-- (nkv <= L: the other splits exited) finishes its rows itself, and the combine step returns
-- at once: a short KV range costs one kernel's work, as with the static plan of that length.
local function direct_one(P, p)
    return (P.dyn_kv ~= nil or p.range) and p.S > 1 and p.kind ~= "pre"
end

-- `finish` and `partial` emit the two ends of a split kernel; with direct_one, both, chosen
-- at run time.
local function split_end(b, P, p, finish, partial)
    if p.S == 1 then
        finish()
    elseif p.range then
        b.open("if (ns == 1u) { /* one split at this run: dst directly, the combine returns */")
        finish()
        b.close("} else {")
        b.push()
        partial()
        b.close()
    elseif direct_one(P, p) then
        b.open("if (nkv <= %du) { /* split 0 holds every key of this run: dst directly, the combine returns */", p.L)
        finish()
        b.close("} else {")
        b.push()
        partial()
        b.close()
    else
        partial()
    end
end

-- The run-time extents, first thing in a kernel: nkv (keys) and nr (rows per group).
local function dyn_setup(b, P, kv, q)
    if kv and P.dyn_kv then b.add("const unsigned nkv = (unsigned)(%s); /* keys at run time, <= %d */", P.dyn_kv, P.NKV) end
    if q and P.dyn_q then
        b.add("const unsigned nr = (unsigned)(%s) * %du; /* rows per kv head at run time, <= %d */", P.dyn_q, P.G, P.R)
    end
end

-- Everything the kernels need to know about the node, checked.
local function problem(k)
    if k.kind ~= "op" then fail("node kind %s is not op", tostring(k.kind)) end
    if k.op ~= "flash_attn_ext" then fail("unknown op %s", tostring(k.op)) end
    local a = k.args or {}
    local q, kk, v, mask, sinks, dst = a.q, a.k, a.v, a.mask, a.sinks, k.dst
    local FT = { f32 = true, f16 = true, bf16 = true }
    check_ref(dst, "dst", { f32 = true })
    check_ref(q, "q", { f32 = true })
    check_ref(kk, "k", FT)
    check_ref(v, "v", FT)
    if mask then check_ref(mask, "mask", { f16 = true, i32 = true }) end
    if sinks then check_ref(sinks, "sinks", { f32 = true }) end
    if v.type ~= kk.type then fail("k is %s but v is %s", kk.type, v.type) end
    local P = {
        q = q, k = kk, v = v, mask = mask, sinks = sinks, dst = dst, kt = kk.type,
        DK = q.ne[1], DV = v.ne[1], NQ = q.ne[2], NH = q.ne[3], NSEQ = q.ne[4],
        NKV = kk.ne[2], NHKV = kk.ne[3],
    }
    if kk.ne[1] ~= P.DK or v.ne[2] ~= P.NKV or v.ne[3] ~= P.NHKV or kk.ne[4] ~= P.NSEQ or v.ne[4] ~= P.NSEQ
        or P.NH % P.NHKV ~= 0 then
        fail("q %s, k %s and v %s do not fit", dims(q.ne), dims(kk.ne), dims(v.ne))
    end
    if dst.ne[1] ~= P.DV or dst.ne[2] ~= P.NH or dst.ne[3] ~= P.NQ or dst.ne[4] ~= P.NSEQ then
        fail("dst %s is not [%d, %d, %d, %d]", dims(dst.ne), P.DV, P.NH, P.NQ, P.NSEQ)
    end
    if kk.st[1] ~= 1 or v.st[1] ~= 1 then fail("k and v rows must be contiguous") end
    -- kiln's key intervals (docs/ops-attn.md): an i32 mask [2, n_q], token t sees keys
    -- mask[0, t] <= j < mask[1, t]; one sequence, no ALiBi
    P.range = mask ~= nil and mask.type == "i32"
    if P.range then
        if mask.ne[1] ~= 2 or mask.ne[2] < P.NQ or mask.ne[3] ~= 1 or mask.ne[4] ~= 1 or P.NSEQ ~= 1 then
            fail("key intervals %s do not fit q %s (i32 [2, n_q], one sequence)", dims(mask.ne), dims(q.ne))
        end
    elseif mask then
        if mask.st[1] ~= 1 or mask.ne[1] ~= P.NKV or mask.ne[2] < P.NQ or P.NH % mask.ne[3] ~= 0
            or P.NSEQ % mask.ne[4] ~= 0 then
            fail("mask %s does not fit q %s and k %s", dims(mask.ne), dims(q.ne), dims(kk.ne))
        end
    end
    if sinks and sinks.ne[1] ~= P.NH then fail("sinks %s is not [%d]", dims(sinks.ne), P.NH) end
    P.G = P.NH // P.NHKV
    P.R = P.NQ * P.G                -- rows per group
    P.NGROUPS = P.NHKV * P.NSEQ
    P.TOTAL = P.NGROUPS * P.R       -- rows in all
    if P.NGROUPS > 65535 then fail("%d kv heads x sequences is more than a grid dimension holds", P.NGROUPS) end
    if P.R > INT_MAX // 64 or P.NKV > INT_MAX // 2 or P.TOTAL > INT_MAX // 64 then fail("too many rows or keys") end
    local params, values = k.params or {}, k.values or {}
    P.scale = params.scale or "1.0f"
    P.softcap = (values.logit_softcap or 0) ~= 0 and params.logit_softcap or nil
    P.alibi = (values.max_bias or 0) > 0 and mask ~= nil
    if P.alibi and P.range then fail("ALiBi needs an f16 mask, not key intervals") end
    P.max_bias = params.max_bias or "0.0f"
    P.nparams = k.nparams
    for _, r in ipairs({ dst, q, kk, v, mask or dst, sinks or dst }) do
        if r.param < 0 or r.param >= k.nparams then fail("param %d out of range", r.param) end
    end
    symbolic(k, P)
    return P
end

-- How many splits of the KV range, and how long (a multiple of gran), for `blocks` blocks
-- per split: none when there are `enough` blocks already, else enough splits for about `target`
-- blocks, each at least gran keys. The length is nkv / s rounded to the nearest multiple of
-- gran, not up: rounding up doubled it (and every block's latency) when nkv / s was just above
-- a multiple, e.g. 17 splits of 256 keys for n_kv 4232 where 4136 got 33 of 128 (measured on
-- the H100, same machine: Llama-3.2-1B decode at KV 512 took 1.065 ms of GPU time instead of
-- 1.025).
local function splits(blocks, nkv, gran, target, enough)
    if blocks >= enough or nkv <= gran then return 1, nkv end
    local s = math.min(ceil_div(target, blocks), ceil_div(nkv, gran))
    local len = math.max(1, (2 * nkv + s * gran) // (2 * s * gran)) * gran
    s = ceil_div(nkv, len)
    if s == 1 then len = nkv end
    return s, len
end

-- ---- the plan -----------------------------------------------------------------------------------

-- Key intervals (P.range): the splits of each row tile's keys at a run of T live tiles, as the
-- kernels compute it (range_ns below): about FILL blocks, at most S.
local function range_splits(S, T, NG)
    return math.min(S, ceil_div(FILL, T * NG))
end

-- The decode kernel over key intervals (a batch of sequences, each token its own keys): one
-- block per (row tile, split) of the run, the tiles' rows and the splits known only at run
-- time, so the grid is the most blocks of any run (X) and the split count follows the live
-- tiles (range_splits). Each tile visits the hull of its rows' intervals, cut into ns parts.
-- Scratch: the partials of the runs that split (SCR slots, rows r-major so that a run's slots
-- are dense), the combine covering the rows of those runs (RSPLIT).
local function range_plan(P, p)
    local rows = 8 * p.NT
    p.S = math.max(1, math.min(RANGE_MAX_SPLITS, ceil_div(FILL, P.NGROUPS), ceil_div(P.NKV, 16 * p.U * W)))
    p.L = P.NKV
    p.X, p.SCR, p.RSPLIT = 0, 0, 0
    for T = 1, p.RT do
        local ns = range_splits(p.S, T, P.NGROUPS)
        p.X = math.max(p.X, T * ns)
        if ns > 1 then
            local r = math.min(T * rows, P.R)
            p.SCR = math.max(p.SCR, r * P.NGROUPS * ns)
            p.RSPLIT = math.max(p.RSPLIT, r)
        end
    end
    if p.RSPLIT == 0 then p.S = 1 end
    return p
end

local function plan(P)
    local mma = (P.kt == "f16" or P.kt == "bf16") and P.DK % 16 == 0 and P.DV % 16 == 0
        and P.DK <= DEC_MAX_D and P.DV <= DEC_MAX_D
    local ka, va = row_align(P.k), row_align(P.v)
    if P.range then
        if not mma then
            -- one warp per row over its own interval, no splits (f32 caches and odd head sizes)
            return { kind = "fma", RT = ceil_div(P.R, W), S = 1, L = P.NKV,
                     why = P.kt == "f32" and "f32 K/V" or "head size not a multiple of 16 or above " .. DEC_MAX_D }
        end
        local nt = (P.R > 8 and P.DV <= 128) and 2 or 1
        local u = (P.DK <= 128 and P.DV <= 128) and 2 or 1
        return range_plan(P, { kind = "dec", range = true, NT = nt, U = u, RT = ceil_div(P.R, 8 * nt), KA = ka, VA = va })
    end
    if not mma then
        local rt = ceil_div(P.R, W)
        local s, len = splits(rt * P.NGROUPS, P.NKV, 64, FILL, FILL)
        return { kind = "fma", RT = rt, S = s, L = len,
                 why = P.kt == "f32" and "f32 K/V" or "head size not a multiple of 16 or above " .. DEC_MAX_D }
    end
    local wide = P.DK > MMA_MAX_D or P.DV > MMA_MAX_D
    if P.R > DEC_MAX_ROWS and ka == 8 and va == 8 and not wide then
        local bn = (P.DK > 128 or P.DV > 128) and 32 or 64
        local rt = ceil_div(P.R, 64)
        -- a wave of prefill blocks already keeps the GPU busy; fewer get splits
        local s, len = splits(rt * P.NGROUPS, P.NKV, 2 * bn, FILL, SM_COUNT)
        return { kind = "pre", BM = 64, BN = bn, QREG = P.DK <= 128, RT = rt, S = s, L = len }
    end
    local nt = (P.R > 8 and P.DV <= 128) and 2 or 1
    local u = (P.DK <= 128 and P.DV <= 128) and 2 or 1
    local rt = ceil_div(P.R, 8 * nt)
    -- About two waves of blocks. (Measured on the H100, Llama-3-8B at n_kv 8192: 32 splits of
    -- 256 keys take 15 us; 64 splits of 128, one load round per warp, took 20 us: each block's
    -- fixed costs and the larger combine outweigh the shorter rounds.)
    local s, len = splits(rt * P.NGROUPS, P.NKV, 16 * u * W, FILL, FILL)
    return { kind = "dec", NT = nt, U = u, RT = rt, S = s, L = len, KA = ka, VA = va }
end

-- ---- code shared by the kernels ---------------------------------------------------------------

local function param_list(P, scratch)
    local l = {}
    for i = 0, P.nparams - 1 do
        l[#l + 1] = (i == P.dst.param and "char" or "const char") .. " *__restrict__ p" .. i
    end
    if scratch then l[#l + 1] = "char *__restrict__ p" .. P.nparams end
    if P.isdyn then l[#l + 1] = (P.dims_arg:gsub("^,%s*", "")) end
    return "\n    " .. table.concat(l, ",\n    ")
end

-- Typed base pointers of the operands: dst unless the kernel writes splits to scratch; the
-- inputs unless it is the combine kernel; the scratch when there are splits.
-- The partials' slots of a split kernel (m, l and DV outputs each), and the rows the combine
-- visits: every row's S splits, or with key intervals those of the runs that split.
local function scratch_slots(P, p)
    return p.range and p.SCR or P.TOTAL * p.S
end
local function combine_rows(P, p)
    return p.range and p.RSPLIT * P.NGROUPS or P.TOTAL
end

local function pointers(b, P, p, S, combine, direct)
    local function ptr(r, name, ct, const)
        b.add("%s%s *const %s = (%s%s *)p%d + %s;", const and "const " or "", ct, name, const and "const " or "",
            ct, r.param, ll(r.offs))
    end
    local ct = P.kt == "f32" and "float" or "kiln_u16"
    if S == 1 or combine or direct then ptr(P.dst, "dstb", "float", false) end
    if not combine then
        ptr(P.q, "qb", "float", true)
        ptr(P.k, "kb", ct, true)
        ptr(P.v, "vb", ct, true)
        if P.mask then ptr(P.mask, "mb", P.range and "int" or "kiln_u16", true) end
    end
    if P.sinks and (S == 1 or combine or direct) then ptr(P.sinks, "sb", "float", true) end
    if S > 1 then
        b.add("float *const scr_o = (float *)p%d;", P.nparams)
        b.add("float *const scr_ml = scr_o + %s;", ll(scratch_slots(P, p) * P.DV))
    end
end

-- The group of this block: kv head hk and sequence i3, and K/V at that head.
local function group_setup(b, P, zexpr)
    b.add("const unsigned grp = %s;", zexpr)
    b.add("const unsigned hk = grp %% %du, i3 = grp / %du;", P.NHKV, P.NHKV)
    b.add("const %s *const kg = kb + hk * %s + i3 * %s;", P.kt == "f32" and "float" or "kiln_u16", ll(P.k.st[3]),
        ll(P.k.st[4]))
    b.add("const %s *const vg = vb + hk * %s + i3 * %s;", P.kt == "f32" and "float" or "kiln_u16", ll(P.v.st[3]),
        ll(P.v.st[4]))
end

-- Per-row values of group row `rexpr` (possibly past R, then clamped to the last row): the
-- names <p>r, <p>ok, <p>iq1 (token), <p>h (head), <p>mr (mask row), <p>sl (slope * log2 e), each
-- emitted only when `need` asks for it or for something built on it (NVRTC warns about unused
-- variables). need.scores asks for what the scores use (mr with a mask, sl with ALiBi).
local function row_setup(b, P, pre, rexpr, need)
    local n = {}
    for key, v in pairs(need) do n[key] = v end
    if n.scores then
        n.mr = P.mask ~= nil and not P.range
        n.rg = P.range
        n.sl = P.alibi
    end
    if n.mr then
        n.iq1 = true
        if P.mask.ne[3] > 1 then n.h = true end
    end
    if n.rg then n.iq1 = true end
    if n.sl then n.h = true end
    local any = n.ok or n.iq1 or n.h or n.r
    if not any then return end
    b.add("const unsigned %sr = %s;", pre, rexpr)
    if n.ok or n.iq1 or n.h then b.add("const bool %sok = %sr < %s;", pre, pre, P.RS) end
    if n.iq1 or n.h then
        b.add("const unsigned %srr = %sok ? %sr : %s;", pre, pre, pre, P.R1S)
        if n.iq1 then b.add("const unsigned %siq1 = %srr / %du;", pre, pre, P.G) end
        if n.h then b.add("const unsigned %sh = hk * %du + %srr %% %du;", pre, P.G, pre, P.G) end
    end
    if n.mr then
        local m = P.mask
        local terms = { string.format("%siq1 * %s", pre, ll(m.st[2])) }
        if m.ne[3] > 1 then
            local hexp = m.ne[3] == P.NH and pre .. "h" or string.format("(%sh %% %du)", pre, m.ne[3])
            terms[#terms + 1] = string.format("%s * %s", hexp, ll(m.st[3]))
        end
        if m.ne[4] > 1 then
            local iexp = m.ne[4] == P.NSEQ and "i3" or string.format("(i3 %% %du)", m.ne[4])
            terms[#terms + 1] = string.format("%s * %s", iexp, ll(m.st[4]))
        end
        b.add("const kiln_u16 *const %smr = mb + %s;", pre, table.concat(terms, " + "))
    end
    if n.rg then
        b.add("const unsigned %slo = (unsigned)mb[%siq1 * %s], %shi = (unsigned)mb[%siq1 * %s + %s];", pre, pre,
            ll(P.mask.st[2]), pre, pre, ll(P.mask.st[2]), ll(P.mask.st[1]))
    end
    if n.sl then
        -- ggml: n_head_log2 = 2^floor(log2(n_head)); slopes in f32 by powf.
        local nhl2 = 1
        while nhl2 * 2 <= P.NH do nhl2 = nhl2 * 2 end
        b.add("const float %ssl = (%sh < %du ? powf(powf(2.0f, -(%s) / %d.0f), (float)(%sh + 1u))", pre, pre, nhl2,
            P.max_bias, nhl2, pre)
        b.add("    : powf(powf(2.0f, -(%s / 2.0f) / %d.0f), (float)(2u * (%sh - %du) + 1u))) * %s;", P.max_bias,
            nhl2, pre, nhl2, LOG2E)
    end
end

-- The prelude recorder of the source being generated (f16/bf16 conversions).
local PRE

local function mload(bits)
    return PRE.load("f16", "(kiln_u16)(" .. bits .. ")")
end

-- The log2-domain score of raw dot product `acc` for a row with prefix pre and the f16 mask
-- bits `mbits` (nil: no mask): an expression.
local function score(P, H, acc, pre, mbits)
    local x
    if P.softcap then
        x = string.format("%s * %s * tanhf(%s * (%s / %s))", P.softcap, LOG2E, acc, P.scale, P.softcap)
    else
        x = string.format("%s * (%s * %s)", acc, P.scale, LOG2E)
    end
    if mbits then
        local m = mload(mbits)
        local sl = P.alibi and pre .. "sl" or LOG2E
        x = string.format("fmaf(%s, %s, %s)", sl, m, x)
    end
    return x
end

-- The end of a row when there is one split: from its m (log2 domain) and l, merge the sink
-- (it joins the denominator only) and emit <pre>inv, the factor of the unnormalised o (0 for a
-- row that saw no key), and <pre>out, the row's dst pointer (head h, token iq1).
local function finish_row(b, P, pre, m, l, h, iq1)
    if P.sinks then
        b.add("const float %ssk = sb[%s * %s] * %s;", pre, h, ll(P.sinks.st[1]), LOG2E)
        b.add("const float %sM = fmaxf(%s, %ssk);", pre, m, pre)
        b.add("const float %sbase = %sM == %s ? 0.0f : %sM;", pre, pre, NEG_INF, pre)
        b.add("const float %sf = kiln_ex2(%s - %sbase);", pre, m, pre)
        b.add("const float %sL = %s * %sf + kiln_ex2(%ssk - %sbase);", pre, l, pre, pre, pre)
        b.add("const float %sinv = %sL > 0.0f ? %sf / %sL : 0.0f;", pre, pre, pre, pre)
    else
        b.add("const float %sinv = %s > 0.0f ? 1.0f / %s : 0.0f;", pre, l, l)
    end
    b.add("float *const %sout = dstb + %s * %s + %s * %s + i3 * %s;", pre, h, ll(P.dst.st[2]), iq1,
        ll(P.dst.st[3]), ll(P.dst.st[4]))
end

-- ---- the fma kernel -----------------------------------------------------------------------------

local function fma_kernel(P, p, H, name)
    local b = builder()
    local S = p.S
    local NDV = ceil_div(P.DV, 32)
    local T = P.kt == "f32" and "float" or "kiln_u16"
    local function ld(e)
        if P.kt == "f32" then return e end
        return PRE.load(P.kt, e)
    end
    H.use("types")
    H.use("ex2")
    H.use("warp")
    b.add("extern \"C\" __global__ void __launch_bounds__(%d) %s(%s)", NTHR, name, param_list(P, S > 1 and p))
    b.open("{")
    b.add("__shared__ float kiln_sq[%d][%d];", W, P.DK)
    pointers(b, P, p, S, false, direct_one(P, p))
    dyn_setup(b, P, true, true)
    b.add("const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;")
    group_setup(b, P, "blockIdx.z")
    if not P.range then b.add("const unsigned split = blockIdx.x;") end
    dyn_exit(b, P, S, p.L, 1, 1)
    row_setup(b, P, "", "blockIdx.y * " .. W .. "u + warp", { ok = true, iq1 = true, h = true, scores = true })
    b.add("if (!ok)")
    b.add("    return; /* no block-wide barrier below */")
    b.add("const float *const qr = qb + iq1 * %s + h * %s + i3 * %s;", ll(P.q.st[2]), ll(P.q.st[3]), ll(P.q.st[4]))
    b.add("for (unsigned d = lane; d < %du; d += 32u)", P.DK)
    b.add("    kiln_sq[warp][d] = qr[d * %s];", ll(P.q.st[1]))
    b.add("__syncwarp();")
    if P.range then
        -- the row's own interval (no splits)
        b.add("const unsigned jbeg = lo, jend = hi < %s ? hi : %s;", P.NKVS, P.NKVS)
    else
        b.add("const unsigned jbeg = split * %du;", p.L)
        b.add("const unsigned jend = jbeg + %du < %s ? jbeg + %du : %s;", p.L, P.NKVS, p.L, P.NKVS)
    end
    b.add("float m = %s, l = 0.0f;", NEG_INF)
    b.add("float acc[%d];", NDV)
    b.add("#pragma unroll")
    b.add("for (int i = 0; i < %d; i++)", NDV)
    b.add("    acc[i] = 0.0f;")
    b.open("for (unsigned jb = jbeg; jb < jend; jb += 32u) {")
    b.add("const unsigned j = jb + lane;")
    b.add("float s = %s;", NEG_INF)
    b.open("if (j < jend) {")
    local mbits = nil
    if P.mask and not P.range then
        b.add("const kiln_u16 mv = mr[j];")
        b.add("if (mv != (kiln_u16)0xfc00u) {")
        b.push()
        mbits = "mv"
    end
    b.add("const %s *const kr = kg + j * %s;", T, ll(P.k.st[2]))
    b.add("float dot = 0.0f;")
    b.add("#pragma unroll 8")
    b.add("for (unsigned d = 0; d < %du; d++)", P.DK)
    b.add("    dot = fmaf(kiln_sq[warp][d], %s, dot);", ld("kr[d]"))
    b.add("s = %s;", score(P, H, "dot", "", mbits))
    if P.mask and not P.range then b.close() end
    b.close()
    b.add("const float mn = fmaxf(m, kiln_warp_max(s));")
    b.add("const float base = mn == %s ? 0.0f : mn;", NEG_INF)
    b.add("const float alpha = kiln_ex2(m - base);")
    b.add("const float pj = kiln_ex2(s - base);")
    b.add("m = mn;")
    b.add("l = l * alpha + pj;")
    b.add("#pragma unroll")
    b.add("for (int i = 0; i < %d; i++)", NDV)
    b.add("    acc[i] *= alpha;")
    b.add("const unsigned nk = jend - jb < 32u ? jend - jb : 32u;")
    b.open("for (unsigned kk = 0; kk < nk; kk++) {")
    b.add("const float pk = __shfl_sync(0xffffffffu, pj, kk);")
    b.add("if (pk == 0.0f)")
    b.add("    continue; /* masked (or negligible): skip the row of V */")
    b.add("const %s *const vr = vg + (jb + kk) * %s;", T, ll(P.v.st[2]))
    b.add("#pragma unroll")
    b.open("for (int i = 0; i < %d; i++) {", NDV)
    b.add("const unsigned d = lane + 32u * i;")
    if P.DV % 32 ~= 0 then
        b.add("if (d < %du)", P.DV)
        b.add("    acc[i] = fmaf(pk, %s, acc[i]);", ld("vr[d]"))
    else
        b.add("acc[i] = fmaf(pk, %s, acc[i]);", ld("vr[d]"))
    end
    b.close()
    b.close()
    b.close()
    b.add("l = kiln_warp_sum(l);")
    split_end(b, P, p, function()
        finish_row(b, P, "", "m", "l", "h", "iq1")
        b.add("#pragma unroll")
        b.open("for (int i = 0; i < %d; i++) {", NDV)
        b.add("const unsigned d = lane + 32u * i;")
        b.add("if (d < %du)", P.DV)
        b.add("    out[d * %s] = acc[i] * inv;", ll(P.dst.st[1]))
        b.close()
    end, function()
        b.add("const long long slot = (long long)(grp * %du + r) * %du + split;", P.R, S)
        b.add("#pragma unroll")
        b.open("for (int i = 0; i < %d; i++) {", NDV)
        b.add("const unsigned d = lane + 32u * i;")
        b.add("if (d < %du)", P.DV)
        b.add("    scr_o[slot * %du + d] = acc[i];", P.DV)
        b.close()
        b.open("if (lane == 0) {")
        b.add("scr_ml[2 * slot] = m;")
        b.add("scr_ml[2 * slot + 1] = l;")
        b.close()
    end)
    b.close()
    return b.lines, { S, p.RT, P.NGROUPS }, 0
end

-- ---- the decode kernel --------------------------------------------------------------------------

-- Head-dim chunks of K (for the A fragment of S^T = K Q^T): {d0, width, vw}: vw elements per
-- load, one load per key covering width/16 k-steps.
local function k_chunks(DK, align)
    local c, d = {}, 0
    while d < DK do
        if DK - d >= 32 and align >= 8 then
            c[#c + 1] = { d0 = d, w = 32, vw = 8 }
            d = d + 32
        else
            c[#c + 1] = { d0 = d, w = 16, vw = math.min(align, 4) }
            d = d + 16
        end
    end
    return c
end

-- The head dims (relative to the chunk) of K's fragment registers for k-step `s` of a chunk:
-- a0 (k = 2t, 2t+1) and a2 (k = 2t+8, 2t+9) read d = base + {0, 1} with base an expression in t.
local function k_dmap(ch, s)
    if ch.vw == 8 then
        return string.format("8u * t + %du", 4 * s), string.format("8u * t + %du", 4 * s + 2)
    elseif ch.vw == 4 then
        return "4u * t", "4u * t + 2u"
    else
        return "2u * t", "2u * t + 8u"
    end
end

-- Head-dim tiles of V (for the A fragment of O^T = V^T P^T): {d0, vw}: 16 * vw dims, vw m-tiles
-- of 16; row m = g of m-tile i is d0 + vw * g + i, row m = g + 8 is d0 + 8 vw + vw * g + i.
local function v_tiles(DV, align)
    local c, d = {}, 0
    for _, vw in ipairs({ 8, 4, 2, 1 }) do
        if vw <= align then
            while DV - d >= 16 * vw do
                c[#c + 1] = { d0 = d, vw = vw }
                d = d + 16 * vw
            end
        end
    end
    return c
end

local VEC = { [8] = "kiln_u32x4", [4] = "kiln_u32x2", [2] = "unsigned", [1] = "kiln_u16" }
local WORD = { "x", "y", "z", "w" }

-- The 32-bit word holding elements (e, e+1) of a load of vw elements named v (e even).
local function word(v, vw, e)
    if vw == 8 or vw == 4 then return v .. "." .. WORD[e // 2 + 1] end
    return v
end

-- (element i of load x, element i of load y) packed: x's in the low half.
local function pair(x, y, vw, i)
    if vw == 1 then return string.format("((unsigned)%s | (unsigned)%s << 16)", x, y) end
    local wx, wy = word(x, vw, i - i % 2), word(y, vw, i - i % 2)
    return string.format("__byte_perm(%s, %s, %s)", wx, wy, i % 2 == 0 and "0x5410u" or "0x7632u")
end

-- Key intervals: the split count of a run (ntile live row tiles), as range_splits.
local function range_ns(P, S)
    if S == 1 then return "1u" end
    return string.format("min(%du, (%du + ntile * %du - 1u) / (ntile * %du))", S, FILL, P.NGROUPS, P.NGROUPS)
end

-- Key intervals: this block's row tile and split from blockIdx.x (the grid is the most of any
-- run; the rest leave at once).
local function range_block(b, P, S, ROWS)
    b.add("const unsigned ntile = (%s + %du) / %du; /* row tiles at this run */", P.RS, ROWS - 1, ROWS)
    b.add("const unsigned ns = %s; /* splits of each tile's keys at this run */", range_ns(P, S))
    b.add("if (blockIdx.x >= ntile * ns)")
    b.add("    return; /* nothing of this block's at this run */")
    b.add("const unsigned rt = blockIdx.x / ns, split = blockIdx.x % ns;")
end

-- Key intervals: the hull of the tile's rows' intervals (each warp's lanes t = 0 .. 3 hold
-- every row of the tile), cut into ns parts of a multiple of 16 keys: [jbeg, jend).
local function range_hull(b, NT)
    local lo, hi = {}, {}
    for nt = 0, NT - 1 do
        for e = 0, 1 do
            lo[#lo + 1] = string.format("r%d%dlo", nt, e)
            hi[#hi + 1] = string.format("r%d%dhi", nt, e)
        end
    end
    local function fold(f, l)
        local x = l[1]
        for i = 2, #l do x = string.format("%s(%s, %s)", f, x, l[i]) end
        return x
    end
    b.add("unsigned blo = %s, bhi = %s;", fold("min", lo), fold("max", hi))
    b.add("blo = min(blo, __shfl_xor_sync(0xffffffffu, blo, 1));")
    b.add("blo = min(blo, __shfl_xor_sync(0xffffffffu, blo, 2));")
    b.add("bhi = max(bhi, __shfl_xor_sync(0xffffffffu, bhi, 1));")
    b.add("bhi = max(bhi, __shfl_xor_sync(0xffffffffu, bhi, 2));")
    b.add("const unsigned span = bhi > blo ? bhi - blo : 0u;")
    b.add("const unsigned len = ((span + ns - 1u) / ns + 15u) & ~15u;")
    b.add("const unsigned jbeg = min(blo + split * len, bhi), jend = min(jbeg + len, bhi);")
end

local function dec_kernel(P, p, H, name)
    local b = builder()
    local S, NT, U = p.S, p.NT, p.U
    local ROWS = 8 * NT
    local kc, vt = k_chunks(P.DK, p.KA), v_tiles(P.DV, p.VA)
    local MT = P.DV // 16
    H.use("types")
    H.use("ex2")
    H.use("pack_" .. P.kt)
    H.use("mma_" .. P.kt)
    H.use("trans")
    b.add("extern \"C\" __global__ void __launch_bounds__(%d) %s(%s)", NTHR, name, param_list(P, S > 1 and p))
    b.open("{")
    b.add("extern __shared__ __align__(16) unsigned char kiln_smem[];")
    pointers(b, P, p, S, false, direct_one(P, p))
    dyn_setup(b, P, true, true)
    b.add("const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;")
    b.add("const unsigned g = lane >> 2, t = lane & 3u;")
    local function softmax_rows()
        b.add("/* softmax state of rows 2t, 2t + 1 of each n-tile */")
        for nt = 0, NT - 1 do
            for e = 0, 1 do
                row_setup(b, P, string.format("r%d%d", nt, e), string.format("rt * %du + %du + 2u * t", ROWS, 8 * nt + e),
                    { scores = true })
            end
        end
    end
    if p.range then
        range_block(b, P, S, ROWS)
    else
        b.add("const unsigned split = blockIdx.x, rt = blockIdx.y;")
        dyn_exit(b, P, S, p.L, p.RT, ROWS)
    end
    group_setup(b, P, "blockIdx.z")
    if p.range then
        softmax_rows()
        range_hull(b, NT)
    end
    -- Before the grid wait (programmatic dependent launch: the previous kernel may still run),
    -- the split's K and V rows are prefetched into L2. Only the newest row can be the previous
    -- kernel's (the cache row it writes), and its write updates L2 all the same.
    local kl, vl = ceil_div(P.DK * 2, 128), ceil_div(P.DV * 2, 128) -- 128-byte lines per row
    b.open("{")
    if p.range then
        -- only the first round of keys: a batch's blocks together span every sequence's cache,
        -- far more than L2 holds, and prefetching it all evicted lines before their loads (H100,
        -- Llama-3-8B, 64 sequences of 540 tokens: 83 us a layer with the whole range, 71 with
        -- the first round; 6319 tok/s against 5925)
        b.add("const unsigned pb = jbeg, pe = jend - jbeg < %du ? jend : jbeg + %du; /* the first round of keys */",
            16 * U * W, 16 * U * W)
    else
        b.add("const unsigned pb = split * %du, pe = pb + %du < %s ? pb + %du : %s;", p.L, p.L, P.NKVS, p.L, P.NKVS)
    end
    b.open("for (unsigned i = threadIdx.x; i < (pe - pb) * %du; i += %du) {", kl + vl, NTHR)
    b.add("const unsigned key = pb + i / %du, c = i %% %du;", kl + vl, kl + vl)
    b.add("const kiln_u16 *const a = c < %du ? kg + key * %s + c * 64u : vg + key * %s + (c - %du) * 64u;", kl,
        ll(P.k.st[2]), ll(P.v.st[2]), kl)
    b.add("asm volatile(\"prefetch.global.L2 [%0];\" :: \"l\"(a));")
    b.close()
    b.close()
    b.add("/* kiln: grid wait here */")

    -- Q as the B fragment of S^T = K Q^T: row g of each n-tile, head dims as K's chunks.
    b.add("/* Q (B fragments, rounded to %s), head dims permuted as K's loads */", P.kt)
    local nks = P.DK // 16
    b.add("unsigned qf[%d][%d][2];", NT, nks)
    for nt = 0, NT - 1 do
        b.open("{")
        row_setup(b, P, "x", string.format("rt * %du + %du + g", ROWS, 8 * nt), { ok = true, iq1 = true, h = true })
        b.add("const float *const qp = qb + xiq1 * %s + xh * %s + i3 * %s;", ll(P.q.st[2]), ll(P.q.st[3]),
            ll(P.q.st[4]))
        local ks = 0
        for _, ch in ipairs(kc) do
            for s = 0, ch.w // 16 - 1 do
                local e0, e1 = k_dmap(ch, s)
                for reg, e in ipairs({ e0, e1 }) do
                    local d = string.format("(%du + %s)", ch.d0, e)
                    b.add("qf[%d][%d][%d] = kiln_pack(xok ? qp[%s * %s] : 0.0f, xok ? qp[(%s + 1u) * %s] : 0.0f);", nt,
                        ks, reg - 1, d, ll(P.q.st[1]), d, ll(P.q.st[1]))
                end
                ks = ks + 1
            end
        end
        b.close()
    end

    -- Softmax rows of this thread: 2t + e of each n-tile (with key intervals, set up above).
    if not p.range then softmax_rows() end
    b.add("float mrow[%d][2], lrow[%d][2];", NT, NT)
    b.add("float o[%d][%d][4];", MT, NT)
    b.add("#pragma unroll")
    b.open("for (int i = 0; i < %d; i++) {", NT)
    b.add("mrow[i][0] = mrow[i][1] = %s;", NEG_INF)
    b.add("lrow[i][0] = lrow[i][1] = 0.0f;")
    b.close()
    b.add("#pragma unroll")
    b.add("for (int i = 0; i < %d; i++)", MT)
    b.add("#pragma unroll")
    b.add("    for (int j = 0; j < %d; j++)", NT)
    b.add("        o[i][j][0] = o[i][j][1] = o[i][j][2] = o[i][j][3] = 0.0f;")

    if not p.range then
        b.add("const unsigned jbeg = split * %du;", p.L)
        b.add("const unsigned jend = jbeg + %du < %s ? jbeg + %du : %s;", p.L, P.NKVS, p.L, P.NKVS)
    end
    b.open("for (unsigned j0 = jbeg + warp * %du; j0 < jend; j0 += %du) {", 16 * U, 16 * U * W)
    if p.range then
        -- keys between the tile's sequences (the hull's gaps) are skipped a chunk at a time
        local c = {}
        for nt = 0, NT - 1 do
            for e = 0, 1 do c[#c + 1] = string.format("(r%d%dlo < j0 + %du && r%d%dhi > j0)", nt, e, 16 * U, nt, e) end
        end
        b.add("if (!__any_sync(0xffffffffu, %s))", table.concat(c, " || "))
        b.add("    continue; /* no row of the tile sees these keys */")
    end
    -- Loads first (all sub-chunks), then compute.
    local function clamp(e) return string.format("(%s < %s ? %s : %s)", e, P.NKVS, e, P.NKV1S) end
    for u = 0, U - 1 do
        local jb = string.format("j0 + %du", 16 * u)
        b.add("const kiln_u16 *const k%d_0 = kg + %s * %s;", u, clamp(jb .. " + g"), ll(P.k.st[2]))
        b.add("const kiln_u16 *const k%d_1 = kg + %s * %s;", u, clamp(jb .. " + g + 8u"), ll(P.k.st[2]))
        for ci, ch in ipairs(kc) do
            for h = 0, 1 do
                if ch.vw == 8 or ch.vw == 4 then
                    b.add("const %s ka%d_%d_%d = *(const %s *)(k%d_%d + %du + %du * t);", VEC[ch.vw], u, ci, h, VEC[ch.vw],
                        u, h, ch.d0, ch.vw)
                else
                    -- vw 2 or 1: the standard fragment (2t, 2t + 1 and 2t + 8, 2t + 9)
                    for part = 0, 1 do
                        local off = string.format("%du + 2u * t", ch.d0 + 8 * part)
                        if ch.vw == 2 then
                            b.add("const unsigned ka%d_%d_%d_%d = *(const unsigned *)(k%d_%d + %s);", u, ci, h, part, u, h, off)
                        else
                            b.add("const unsigned ka%d_%d_%d_%d = (unsigned)k%d_%d[%s] | (unsigned)k%d_%d[%s + 1u] << 16;", u,
                                ci, h, part, u, h, off, u, h, off)
                        end
                    end
                end
            end
        end
        -- V rows: keys 2t, 2t + 1, 2t + 8, 2t + 9
        local vkeys = { "2u * t", "2u * t + 1u", "2u * t + 8u", "2u * t + 9u" }
        for x = 1, 4 do
            b.add("const kiln_u16 *const v%d_%d = vg + %s * %s;", u, x - 1, clamp(jb .. " + " .. vkeys[x]), ll(P.v.st[2]))
        end
        for vi, tl in ipairs(vt) do
            for x = 0, 3 do
                for hp = 0, 1 do
                    local off = string.format("%du + %du * g", tl.d0 + 8 * tl.vw * hp, tl.vw)
                    if tl.vw == 1 then
                        b.add("const kiln_u16 vl%d_%d_%d_%d = v%d_%d[%s];", u, vi, x, hp, u, x, off)
                    else
                        b.add("const %s vl%d_%d_%d_%d = *(const %s *)(v%d_%d + %s);", VEC[tl.vw], u, vi, x, hp, VEC[tl.vw],
                            u, x, off)
                    end
                end
            end
        end
        if P.mask and not P.range then
            for nt = 0, NT - 1 do
                for e = 0, 1 do
                    for kh = 0, 1 do
                        local key = string.format("%s + g + %du", jb, 8 * kh)
                        b.add("const kiln_u16 mk%d_%d%d_%d = r%d%dmr[%s];", u, nt, e, kh, nt, e, clamp(key))
                    end
                end
            end
        end
    end
    for u = 0, U - 1 do
        local jb = string.format("j0 + %du", 16 * u)
        b.open("{")
        b.add("float s[%d][4] = {};", NT)
        local ks = 0
        for ci, ch in ipairs(kc) do
            for s = 0, ch.w // 16 - 1 do
                local a
                if ch.vw == 8 then
                    a = { string.format("ka%d_%d_0.%s", u, ci, WORD[2 * s + 1]), string.format("ka%d_%d_1.%s", u, ci, WORD[2 * s + 1]),
                          string.format("ka%d_%d_0.%s", u, ci, WORD[2 * s + 2]), string.format("ka%d_%d_1.%s", u, ci, WORD[2 * s + 2]) }
                elseif ch.vw == 4 then
                    a = { string.format("ka%d_%d_0.x", u, ci), string.format("ka%d_%d_1.x", u, ci),
                          string.format("ka%d_%d_0.y", u, ci), string.format("ka%d_%d_1.y", u, ci) }
                else
                    a = { string.format("ka%d_%d_0_0", u, ci), string.format("ka%d_%d_1_0", u, ci),
                          string.format("ka%d_%d_0_1", u, ci), string.format("ka%d_%d_1_1", u, ci) }
                end
                for nt = 0, NT - 1 do
                    b.add("kiln_mma(s[%d], %s, %s, %s, %s, qf[%d][%d][0], qf[%d][%d][1]);", nt, a[1], a[2], a[3], a[4], nt, ks,
                        nt, ks)
                end
                ks = ks + 1
            end
        end
        -- scores: c = 0, 1: key g, rows 2t, 2t + 1; c = 2, 3: key g + 8
        for nt = 0, NT - 1 do
            for c = 0, 3 do
                local e, kh = c % 2, c // 2
                local pre = string.format("r%d%d", nt, e)
                local mbits = P.mask and not P.range and string.format("mk%d_%d%d_%d", u, nt, e, kh) or nil
                local key = string.format("%s + g + %du", jb, 8 * kh)
                local cond = string.format("%s < jend", key)
                if P.range then
                    cond = string.format("%s < jend && %s >= %slo && %s < %shi", key, key, pre, key, pre)
                end
                b.add("s[%d][%d] = %s ? %s : %s;", nt, c, cond,
                    score(P, H, string.format("s[%d][%d]", nt, c), pre, mbits), NEG_INF)
            end
        end
        -- online softmax per row (max over the 8 lanes sharing t)
        for nt = 0, NT - 1 do
            for e = 0, 1 do
                b.open("{")
                b.add("float mx = fmaxf(s[%d][%d], s[%d][%d]);", nt, e, nt, e + 2)
                b.add("mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));")
                b.add("mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));")
                b.add("mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));")
                b.add("const float mn = fmaxf(mrow[%d][%d], mx);", nt, e)
                b.add("const float base = mn == %s ? 0.0f : mn;", NEG_INF)
                b.add("const float alpha = kiln_ex2(mrow[%d][%d] - base);", nt, e)
                b.add("mrow[%d][%d] = mn;", nt, e)
                b.add("s[%d][%d] = kiln_ex2(s[%d][%d] - base);", nt, e, nt, e)
                b.add("s[%d][%d] = kiln_ex2(s[%d][%d] - base);", nt, e + 2, nt, e + 2)
                b.add("lrow[%d][%d] = lrow[%d][%d] * alpha + s[%d][%d] + s[%d][%d];", nt, e, nt, e, nt, e, nt, e + 2)
                b.add("#pragma unroll")
                b.open("for (int i = 0; i < %d; i++) {", MT)
                b.add("o[i][%d][%d] *= alpha;", nt, e)
                b.add("o[i][%d][%d] *= alpha;", nt, e + 2)
                b.close()
                b.close()
            end
        end
        -- P^T (keys x rows) to the B fragment (rows x keys) of O^T += V^T P^T
        for nt = 0, NT - 1 do
            b.add("const unsigned pb%d_0 = kiln_trans(kiln_pack(s[%d][0], s[%d][1]));", nt, nt, nt)
            b.add("const unsigned pb%d_1 = kiln_trans(kiln_pack(s[%d][2], s[%d][3]));", nt, nt, nt)
        end
        local mt = 0
        for vi, tl in ipairs(vt) do
            for i = 0, tl.vw - 1 do
                local function L(x, hp) return string.format("vl%d_%d_%d_%d", u, vi, x, hp) end
                b.add("{")
                b.push()
                b.add("const unsigned a0 = %s;", pair(L(0, 0), L(1, 0), tl.vw, i))
                b.add("const unsigned a1 = %s;", pair(L(0, 1), L(1, 1), tl.vw, i))
                b.add("const unsigned a2 = %s;", pair(L(2, 0), L(3, 0), tl.vw, i))
                b.add("const unsigned a3 = %s;", pair(L(2, 1), L(3, 1), tl.vw, i))
                for nt = 0, NT - 1 do
                    b.add("kiln_mma(o[%d][%d], a0, a1, a2, a3, pb%d_0, pb%d_1);", mt, nt, nt, nt)
                end
                b.close()
                mt = mt + 1
            end
        end
        b.close()
    end
    b.close() -- key loop

    -- Merge the warps: each writes its rows' (m, l, o) to shared memory.
    b.add("/* the warps' states meet in shared memory */")
    b.add("float *const so = (float *)kiln_smem;                 /* [%d warps][%d rows][%d] */", W, ROWS, P.DV)
    b.add("float *const sm = so + %d, *const sl = sm + %d; /* [%d warps][%d rows] */", W * ROWS * P.DV, W * ROWS, W, ROWS)
    b.add("#pragma unroll")
    b.open("for (int i = 0; i < %d; i++) {", NT)
    b.add("#pragma unroll")
    b.open("for (int e = 0; e < 2; e++) {")
    b.add("float lv = lrow[i][e];")
    b.add("lv += __shfl_xor_sync(0xffffffffu, lv, 4);")
    b.add("lv += __shfl_xor_sync(0xffffffffu, lv, 8);")
    b.add("lv += __shfl_xor_sync(0xffffffffu, lv, 16);")
    b.open("if (g == 0) {")
    b.add("sm[warp * %du + i * 8 + 2u * t + e] = mrow[i][e];", ROWS)
    b.add("sl[warp * %du + i * 8 + 2u * t + e] = lv;", ROWS)
    b.close()
    b.close()
    b.close()
    local mt2 = 0
    for _, tl in ipairs(vt) do
        for i = 0, tl.vw - 1 do
            for hp = 0, 1 do
                local d = string.format("%du + %du * g", tl.d0 + 8 * tl.vw * hp + i, tl.vw)
                for nt = 0, NT - 1 do
                    for e = 0, 1 do
                        b.add("so[(warp * %du + %du + 2u * t) * %du + %s] = o[%d][%d][%d];", ROWS, 8 * nt + e, P.DV, d, mt2,
                            nt, 2 * hp + e)
                    end
                end
            end
            mt2 = mt2 + 1
        end
    end
    b.add("__syncthreads();")
    b.open("for (unsigned idx = threadIdx.x; idx < %du; idx += %du) {", ROWS * P.DV, NTHR)
    b.add("const unsigned row = idx / %du, d = idx %% %du;", P.DV, P.DV)
    b.add("const unsigned r = rt * %du + row;", ROWS)
    b.add("if (r >= %s)", P.RS)
    b.add("    break; /* rows grow with idx */")
    b.add("float M = sm[row];")
    b.add("#pragma unroll")
    b.add("for (int w = 1; w < %d; w++)", W)
    b.add("    M = fmaxf(M, sm[w * %d + row]);", ROWS)
    b.add("const float base = M == %s ? 0.0f : M;", NEG_INF)
    b.add("float L = 0.0f, acc = 0.0f;")
    b.add("#pragma unroll")
    b.open("for (int w = 0; w < %d; w++) {", W)
    b.add("const float f = kiln_ex2(sm[w * %d + row] - base);", ROWS)
    b.add("L += f * sl[w * %d + row];", ROWS)
    b.add("acc += f * so[(w * %d + row) * %d + d];", ROWS, P.DV)
    b.close()
    split_end(b, P, p, function()
        b.add("const unsigned iq1 = r / %du, h = hk * %du + r %% %du;", P.G, P.G, P.G)
        finish_row(b, P, "f", "M", "L", "h", "iq1")
        b.add("fout[d * %s] = acc * finv;", ll(P.dst.st[1]))
    end, function()
        if p.range then
            b.add("const long long slot = ((long long)r * %du + grp) * ns + split; /* rows r-major: dense */", P.NGROUPS)
        else
            b.add("const long long slot = (long long)(grp * %du + r) * %du + split;", P.R, S)
        end
        b.add("scr_o[slot * %du + d] = acc;", P.DV)
        b.open("if (d == 0) {")
        b.add("scr_ml[2 * slot] = M;")
        b.add("scr_ml[2 * slot + 1] = L;")
        b.close()
    end)
    b.close()
    b.close()
    local smem = (W * ROWS * P.DV + 2 * W * ROWS) * 4
    return b.lines, p.range and { p.X, 1, P.NGROUPS } or { S, p.RT, P.NGROUPS }, smem
end

-- ---- the prefill kernel -------------------------------------------------------------------------

local function pre_kernel(P, p, H, name)
    local b = builder()
    local S, BM, BN = p.S, p.BM, p.BN
    local SQ, SK, SV = P.DK + 8, P.DK + 8, P.DV + 8 -- padded rows: ldmatrix rows hit distinct banks
    local NB = BN // 8
    local NO = P.DV // 8
    H.use("types")
    H.use("ex2")
    H.use("pack_" .. P.kt)
    H.use("mma_" .. P.kt)
    H.use("smem")
    b.add("extern \"C\" __global__ void __launch_bounds__(%d) %s(%s)", NTHR, name, param_list(P, S > 1 and p))
    b.open("{")
    b.add("extern __shared__ __align__(16) unsigned char kiln_smem[];")
    b.add("kiln_u16 *const sQ = (kiln_u16 *)kiln_smem; /* [%d][%d] */", BM, SQ)
    b.add("kiln_u16 *const sK = sQ + %d;              /* [%d][%d] */", BM * SQ, BN, SK)
    b.add("kiln_u16 *const sV = sK + %d;              /* [%d][%d] */", BN * SK, BN, SV)
    pointers(b, P, p, S)
    b.add("const unsigned tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;")
    b.add("const unsigned g = lane >> 2, t = lane & 3u;")
    b.add("const unsigned rt = %du - blockIdx.x; /* the longest (causal) row tiles first */", p.RT - 1)
    b.add("const unsigned split = blockIdx.y;")
    dyn_setup(b, P, true, true)
    dyn_exit(b, P, S, p.L, p.RT, BM)
    group_setup(b, P, "blockIdx.z")
    b.add("const unsigned jbeg = split * %du;", p.L)
    b.add("const unsigned jend = jbeg + %du < %s ? jbeg + %du : %s;", p.L, P.NKVS, p.L, P.NKVS)

    -- K or V tile j (keys jb ..) into shared memory: BN rows of D, 16 bytes per cp.async.
    local function load_tile(sname, gname, D, st, sstride)
        local chunks = D // 8
        b.add("#pragma unroll")
        b.open("for (unsigned i = tid; i < %du; i += %du) {", BN * chunks, NTHR)
        b.add("const unsigned row = i / %du, c = i %% %du;", chunks, chunks)
        b.add("const unsigned key = jb + row < %s ? jb + row : %s;", P.NKVS, P.NKV1S)
        b.add("kiln_cp16(kiln_smem_u32(%s + row * %du + 8u * c), %s + key * %s + 8u * c);", sname, sstride, gname, ll(st))
        b.close()
        b.add("kiln_cp_commit();")
    end

    -- Q: f32 from global, rounded to the K/V type, into shared memory.
    b.add("/* Q tile (rounded to %s) */", P.kt)
    b.open("for (unsigned i = tid; i < %du; i += %du) {", BM * P.DK // 2, NTHR)
    b.add("const unsigned row = i / %du, dp = i %% %du;", P.DK // 2, P.DK // 2)
    b.add("const unsigned r = rt * %du + row;", BM)
    b.add("float x0 = 0.0f, x1 = 0.0f;")
    b.open("if (r < %s) {", P.RS)
    b.add("const float *const qr = qb + (r / %du) * %s + (hk * %du + r %% %du) * %s + i3 * %s + 2u * dp * %s;", P.G,
        ll(P.q.st[2]), P.G, P.G, ll(P.q.st[3]), ll(P.q.st[4]), ll(P.q.st[1]))
    b.add("x0 = qr[0];")
    b.add("x1 = qr[%s];", ll(P.q.st[1]))
    b.close()
    b.add("*(unsigned *)(sQ + row * %du + 2u * dp) = kiln_pack(x0, x1);", SQ)
    b.close()
    if not P.mask then
        b.open("{")
        b.add("const unsigned jb = jbeg;")
        load_tile("sK", "kg", P.DK, P.k.st[2], SK)
        b.close()
    else
        -- Scan the block's mask rows once for the first and last 8-key chunk holding a finite
        -- value: the tile loop then covers just that range (causal: nothing right of the
        -- diagonal is visited), and per-tile checks skip the holes inside it.
        local m = P.mask
        local perhead = m.ne[3] > 1
        local valign = m.offs % 8 == 0 and (m.ne[2] == 1 or m.st[2] % 8 == 0) and (m.ne[3] == 1 or m.st[3] % 8 == 0)
            and (m.ne[4] == 1 or m.st[4] % 8 == 0)
        local i3t = ""
        if m.ne[4] > 1 then
            i3t = string.format(" + %s * %s", m.ne[4] == P.NSEQ and "i3" or string.format("(i3 %% %du)", m.ne[4]), ll(m.st[4]))
        end
        b.add("/* the block's first and last 8-key chunks with an unmasked key, over its distinct mask rows */")
        b.add("__shared__ unsigned kiln_lh[%d][2];", W)
        b.add("unsigned clo = 0xffffffffu, chi = 0u;")
        b.open("{")
        b.add("const unsigned nch = (jend - jbeg + 7u) / 8u;")
        if perhead then
            b.add("const unsigned r0 = rt * %du;", BM)
            b.add("const unsigned nscan = %s - r0 < %du ? %s - r0 : %du; /* rows: the mask has a plane per head */", P.RS,
                BM, P.RS, BM)
        else
            b.add("const unsigned tok0 = rt * %du / %du;", BM, P.G)
            b.add("const unsigned rlast = rt * %du + %du < %s ? rt * %du + %du : %s;", BM, BM - 1, P.RS, BM, BM - 1, P.R1S)
            b.add("const unsigned nscan = rlast / %du - tok0 + 1u; /* tokens: the heads share their mask row */", P.G)
        end
        b.open("for (unsigned i = tid; i < nscan * nch; i += %du) {", NTHR)
        b.add("const unsigned sr = i / nch, c = i % nch;")
        if perhead then
            local hexp = m.ne[3] == P.NH and "h" or string.format("(h %% %du)", m.ne[3])
            b.add("const unsigned r = r0 + sr, h = hk * %du + r %% %du;", P.G, P.G)
            b.add("const kiln_u16 *const mp = mb + (r / %du) * %s + %s * %s%s;", P.G, ll(m.st[2]), hexp, ll(m.st[3]), i3t)
        else
            b.add("const kiln_u16 *const mp = mb + (tok0 + sr) * %s%s;", ll(m.st[2]), i3t)
        end
        b.add("const unsigned key = jbeg + 8u * c;")
        b.add("bool any = false;")
        local function scalar()
            b.add("#pragma unroll")
            b.add("for (unsigned e = 0; e < 8u; e++)")
            b.add("    any = any || (key + e < jend && mp[key + e] != (kiln_u16)0xfc00u);")
        end
        if valign then
            b.open("if (key + 8u <= jend) {")
            b.add("const kiln_u32x4 w = *(const kiln_u32x4 *)(mp + key);")
            b.add("any = w.x != %s || w.y != %s || w.z != %s || w.w != %s;", NEG_INF_F16X2, NEG_INF_F16X2, NEG_INF_F16X2,
                NEG_INF_F16X2)
            b.close("} else {")
            b.push()
            scalar()
            b.close()
        else
            scalar()
        end
        b.open("if (any) {")
        b.add("clo = c < clo ? c : clo;")
        b.add("chi = c > chi ? c : chi;")
        b.close()
        b.close()
        b.close()
        b.add("#pragma unroll")
        b.open("for (int o = 16; o > 0; o >>= 1) {")
        b.add("const unsigned a = __shfl_xor_sync(0xffffffffu, clo, o), z = __shfl_xor_sync(0xffffffffu, chi, o);")
        b.add("clo = a < clo ? a : clo;")
        b.add("chi = z > chi ? z : chi;")
        b.close()
        b.open("if (lane == 0) {")
        b.add("kiln_lh[warp][0] = clo;")
        b.add("kiln_lh[warp][1] = chi;")
        b.close()
    end

    -- rows of this thread: g and g + 8 of the warp's 16
    for e = 0, 1 do
        row_setup(b, P, "r" .. e, string.format("rt * %du + warp * 16u + g + %du", BM, 8 * e),
            { ok = true, r = true, iq1 = S == 1, h = S == 1, scores = true })
    end
    -- ldmatrix lane addresses (bytes, shared space)
    b.add("const unsigned mi = lane >> 3, mr8 = lane & 7u;")
    b.add("const unsigned qaddr = kiln_smem_u32(sQ + (warp * 16u + (mi & 1u) * 8u + mr8) * %du + (mi >> 1) * 8u);", SQ)
    b.add("const unsigned kaddr = kiln_smem_u32(sK + ((mi >> 1) * 8u + mr8) * %du + (mi & 1u) * 8u);", SK)
    b.add("const unsigned vaddr = kiln_smem_u32(sV + ((mi & 1u) * 8u + mr8) * %du + (mi >> 1) * 8u);", SV)
    b.add("__syncthreads(); /* sQ%s */", P.mask and ", kiln_lh" or "")
    if P.mask then
        b.add("#pragma unroll")
        b.open("for (int w = 0; w < %d; w++) {", W)
        b.add("clo = kiln_lh[w][0] < clo ? kiln_lh[w][0] : clo;")
        b.add("chi = kiln_lh[w][1] > chi ? kiln_lh[w][1] : chi;")
        b.close()
        b.add("const unsigned tfirst = clo == 0xffffffffu ? 0u : 8u * clo / %du;", BN)
        b.add("const unsigned tend = clo == 0xffffffffu ? 0u : 8u * chi / %du + 1u; /* no unmasked key: no tile */", BN)
        b.open("if (tfirst < tend) {")
        b.add("const unsigned jb = jbeg + tfirst * %du;", BN)
        load_tile("sK", "kg", P.DK, P.k.st[2], SK)
        b.close()
    else
        b.add("const unsigned tfirst = 0, tend = (jend - jbeg + %du) / %du;", BN - 1, BN)
    end
    if p.QREG then
        b.add("unsigned qf[%d][4];", P.DK // 16)
        b.add("#pragma unroll")
        b.add("for (int ks = 0; ks < %d; ks++)", P.DK // 16)
        b.add("    kiln_ldsm4(qf[ks], qaddr + ks * 32u);")
    end
    b.add("float m0 = %s, m1 = %s, l0 = 0.0f, l1 = 0.0f;", NEG_INF, NEG_INF)
    b.add("float o[%d][4];", NO)
    b.add("#pragma unroll")
    b.add("for (int i = 0; i < %d; i++)", NO)
    b.add("    o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;")

    -- The mask of tile jb: mq[n][e] = f16 pair (keys jb + 8n + 2t, +1) of row e; -inf for rows
    -- past R and keys past jend, so the mask alone bounds the tile.
    local malign = P.mask and (P.mask.offs % 2 == 0 and (P.mask.ne[2] == 1 or P.mask.st[2] % 2 == 0)
        and (P.mask.ne[3] == 1 or P.mask.st[3] % 2 == 0) and (P.mask.ne[4] == 1 or P.mask.st[4] % 2 == 0))
    local function load_mask(dst, jbexpr)
        b.open("if (%s + %du <= jend) {", jbexpr, BN)
        for n = 0, NB - 1 do
            for e = 0, 1 do
                local key = string.format("%s + %du + 2u * t", jbexpr, 8 * n)
                if malign then
                    b.add("%s[%d][%d] = r%dok ? *(const unsigned *)(r%dmr + %s) : %s;", dst, n, e, e, e, key, NEG_INF_F16X2)
                else
                    b.add("%s[%d][%d] = r%dok ? (unsigned)r%dmr[%s] | (unsigned)r%dmr[%s + 1u] << 16 : %s;", dst, n, e, e,
                        e, key, e, key, NEG_INF_F16X2)
                end
            end
        end
        b.close("} else {")
        b.push()
        for n = 0, NB - 1 do
            for e = 0, 1 do
                local key = string.format("%s + %du + 2u * t", jbexpr, 8 * n)
                b.add("%s[%d][%d] = (r%dok && %s < jend ? (unsigned)r%dmr[%s] : 0xfc00u) |", dst, n, e, e, key, e, key)
                b.add("    (r%dok && %s + 1u < jend ? (unsigned)r%dmr[%s + 1u] : 0xfc00u) << 16;", e, key, e, key)
            end
        end
        b.close()
    end
    if P.mask then
        b.add("unsigned mq[%d][2];", NB)
        b.open("if (tfirst < tend) {")
        load_mask("mq", string.format("jbeg + tfirst * %du", BN))
        b.close()
    end

    b.open("for (unsigned jt = tfirst; jt < tend; jt++) {")
    b.add("const unsigned jb = jbeg + jt * %du;", BN)
    b.add("kiln_cp_wait_all(); /* K of this tile */")
    if P.mask then
        -- any key of any row of the block unmasked? (-inf f16 is 0xfc00)
        b.add("bool any = false;")
        b.add("#pragma unroll")
        b.add("for (int n = 0; n < %d; n++)", NB)
        b.add("    any = any || mq[n][0] != %s || mq[n][1] != %s;", NEG_INF_F16X2, NEG_INF_F16X2)
        b.open("if (!__syncthreads_or(any)) { /* every row masked over the whole tile: skip it */")
        b.open("if (jt + 1 < tend) {")
        b.open("{")
        b.add("const unsigned jb = jbeg + (jt + 1) * %du;", BN)
        load_tile("sK", "kg", P.DK, P.k.st[2], SK)
        b.close()
        load_mask("mq", string.format("jb + %du", BN))
        b.close()
        b.add("continue;")
        b.close()
    else
        b.add("__syncthreads();")
    end
    load_tile("sV", "vg", P.DV, P.v.st[2], SV)
    if P.mask then
        -- the next tile's mask, in flight during this tile
        b.add("unsigned mn[%d][2];", NB)
        b.open("if (jt + 1 < tend) {")
        load_mask("mn", string.format("jb + %du", BN))
        b.close()
    end
    -- S = Q K^T
    b.add("float s[%d][4] = {};", NB)
    b.add("#pragma unroll")
    b.open("for (int ks = 0; ks < %d; ks++) {", P.DK // 16)
    if p.QREG then
        b.add("const unsigned *const a = qf[ks];")
    else
        b.add("unsigned a[4];")
        b.add("kiln_ldsm4(a, qaddr + ks * 32u);")
    end
    b.add("#pragma unroll")
    b.open("for (int np = 0; np < %d; np++) {", NB // 2)
    b.add("unsigned bk[4];")
    b.add("kiln_ldsm4(bk, kaddr + (np * %du + ks * 16u) * 2u);", 16 * SK)
    b.add("kiln_mma(s[2 * np], a[0], a[1], a[2], a[3], bk[0], bk[1]);")
    b.add("kiln_mma(s[2 * np + 1], a[0], a[1], a[2], a[3], bk[2], bk[3]);")
    b.close()
    b.close()
    -- scores, row max over the 4 lanes of a row, online softmax
    b.add("#pragma unroll")
    b.open("for (int n = 0; n < %d; n++) {", NB)
    for c = 0, 3 do
        local e = c // 2
        local pre = "r" .. e
        local mbits = nil
        if P.mask then mbits = string.format("mq[n][%d] %s", e, c % 2 == 0 and "& 0xffffu" or ">> 16") end
        local sc = score(P, H, string.format("s[n][%d]", c), pre, mbits)
        if P.mask then
            b.add("s[n][%d] = %s;", c, sc)
        else
            b.add("s[n][%d] = jb + n * 8u + 2u * t + %du < jend ? %s : %s;", c, c % 2, sc, NEG_INF)
        end
    end
    b.close()
    for e = 0, 1 do
        b.open("{")
        b.add("float mx = %s;", NEG_INF)
        b.add("#pragma unroll")
        b.add("for (int n = 0; n < %d; n++)", NB)
        b.add("    mx = fmaxf(mx, fmaxf(s[n][%d], s[n][%d]));", 2 * e, 2 * e + 1)
        b.add("mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));")
        b.add("mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));")
        b.add("const float mnew = fmaxf(m%d, mx);", e)
        b.add("const float base = mnew == %s ? 0.0f : mnew;", NEG_INF)
        b.add("const float alpha = kiln_ex2(m%d - base);", e)
        b.add("m%d = mnew;", e)
        b.add("float ls = 0.0f;")
        b.add("#pragma unroll")
        b.open("for (int n = 0; n < %d; n++) {", NB)
        b.add("s[n][%d] = kiln_ex2(s[n][%d] - base);", 2 * e, 2 * e)
        b.add("s[n][%d] = kiln_ex2(s[n][%d] - base);", 2 * e + 1, 2 * e + 1)
        b.add("ls += s[n][%d] + s[n][%d];", 2 * e, 2 * e + 1)
        b.close()
        b.add("l%d = l%d * alpha + ls;", e, e)
        b.add("#pragma unroll")
        b.open("for (int i = 0; i < %d; i++) {", NO)
        b.add("o[i][%d] *= alpha;", 2 * e)
        b.add("o[i][%d] *= alpha;", 2 * e + 1)
        b.close()
        b.close()
    end
    -- P as A fragments (keys of n-tiles 2kk, 2kk + 1)
    b.add("unsigned pa[%d][4];", BN // 16)
    b.add("#pragma unroll")
    b.open("for (int kk = 0; kk < %d; kk++) {", BN // 16)
    b.add("pa[kk][0] = kiln_pack(s[2 * kk][0], s[2 * kk][1]);")
    b.add("pa[kk][1] = kiln_pack(s[2 * kk][2], s[2 * kk][3]);")
    b.add("pa[kk][2] = kiln_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);")
    b.add("pa[kk][3] = kiln_pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);")
    b.close()
    b.add("kiln_cp_wait_all(); /* V of this tile */")
    b.add("__syncthreads();   /* ... landed for all, and every warp is done with K */")
    b.open("if (jt + 1 < tend) {")
    b.add("const unsigned jb = jbeg + (jt + 1) * %du;", BN)
    load_tile("sK", "kg", P.DK, P.k.st[2], SK)
    b.close()
    -- O += P V
    b.add("#pragma unroll")
    b.open("for (int kk = 0; kk < %d; kk++) {", BN // 16)
    b.add("#pragma unroll")
    b.open("for (int qq = 0; qq < %d; qq++) {", P.DV // 16)
    b.add("unsigned bv[4];")
    b.add("kiln_ldsm4t(bv, vaddr + (kk * %du + qq * 16u) * 2u);", 16 * SV)
    b.add("kiln_mma(o[2 * qq], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], bv[0], bv[1]);")
    b.add("kiln_mma(o[2 * qq + 1], pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3], bv[2], bv[3]);")
    b.close()
    b.close()
    if P.mask then
        b.add("#pragma unroll")
        b.open("for (int n = 0; n < %d; n++) {", NB)
        b.add("mq[n][0] = mn[n][0];")
        b.add("mq[n][1] = mn[n][1];")
        b.close()
    end
    b.close() -- tile loop
    b.add("kiln_cp_wait_all();")

    -- rows g and g + 8: the sum over the 4 lanes of a row, then the output
    local dst2 = P.dst.st[1] == 1 and P.dst.offs % 2 == 0 and P.dst.st[2] % 2 == 0 and P.dst.st[3] % 2 == 0
        and P.dst.st[4] % 2 == 0
    for e = 0, 1 do
        local pre = "r" .. e
        b.open("{")
        b.add("float l = l%d;", e)
        b.add("l += __shfl_xor_sync(0xffffffffu, l, 1);")
        b.add("l += __shfl_xor_sync(0xffffffffu, l, 2);")
        b.open("if (%sok) {", pre)
        if S == 1 then
            finish_row(b, P, pre, "m" .. e, "l", pre .. "h", pre .. "iq1")
            b.add("#pragma unroll")
            b.open("for (int i = 0; i < %d; i++) {", NO)
            if dst2 then
                b.add("*(kiln_f32x2 *)(%sout + i * 8 + 2u * t) = kiln_f32x2{o[i][%d] * %sinv, o[i][%d] * %sinv};", pre,
                    2 * e, pre, 2 * e + 1, pre)
            else
                b.add("%sout[(i * 8 + 2u * t) * %s] = o[i][%d] * %sinv;", pre, ll(P.dst.st[1]), 2 * e, pre)
                b.add("%sout[(i * 8 + 2u * t + 1u) * %s] = o[i][%d] * %sinv;", pre, ll(P.dst.st[1]), 2 * e + 1, pre)
            end
            b.close()
        else
            b.add("const long long slot = (long long)(grp * %du + %sr) * %du + split;", P.R, pre, S)
            b.add("#pragma unroll")
            b.add("for (int i = 0; i < %d; i++)", NO)
            b.add("    *(kiln_f32x2 *)(scr_o + slot * %du + i * 8 + 2u * t) = kiln_f32x2{o[i][%d], o[i][%d]};", P.DV,
                2 * e, 2 * e + 1)
            b.open("if (t == 0) {")
            b.add("scr_ml[2 * slot] = m%d;", e)
            b.add("scr_ml[2 * slot + 1] = l;")
            b.close()
        end
        b.close()
        b.close()
    end
    b.close()
    local smem = (BM * SQ + BN * SK + BN * SV) * 2
    return b.lines, { p.RT, S, P.NGROUPS }, smem
end

-- ---- the combine kernel -------------------------------------------------------------------------

-- One block of CT threads per row. The partial outputs are loaded first (NSG groups of threads,
-- each a stride of the splits, every column VW wide; independent loads, in flight while the
-- block computes the weights 2^(m_s - M), the sink joining the denominator); then each group
-- sums its splits and the groups meet in shared memory. A row costs about one trip to L2.
local CT = 256

-- A combine kernel's row `row` (a C name): its group and row in the group, the exits at the
-- run-time extents (a row past the tokens; one split held every key and the main kernel wrote
-- dst), its head and token, and its partials ml (m, l per split) and po (o per split).
local function combine_row(b, P, p)
    local S = p.S
    if p.range then
        -- rows r-major, those of the runs that split (RSPLIT); ns as the main kernel's
        b.add("const unsigned r = row / %du, grp = row %% %du;", P.NGROUPS, P.NGROUPS)
        dyn_setup(b, P, false, true)
        b.add("if (r >= %s)", P.RS)
        b.add("    return; /* a row past this run's tokens */")
        b.add("const unsigned ntile = (%s + %du) / %du;", P.RS, 8 * p.NT - 1, 8 * p.NT)
        b.add("const unsigned ns = %s;", range_ns(P, S))
        b.add("if (ns == 1u)")
        b.add("    return; /* the main kernel wrote dst itself */")
        b.add("const unsigned hk = grp %% %du, i3 = grp / %du;", P.NHKV, P.NHKV)
        b.add("const unsigned iq1 = r / %du, h = hk * %du + r %% %du;", P.G, P.G, P.G)
        b.add("const long long slot0 = ((long long)r * %du + grp) * ns;", P.NGROUPS)
        b.add("const float *const ml = scr_ml + 2ll * slot0;")
        b.add("const float *const po = scr_o + slot0 * %du;", P.DV)
        return
    end
    b.add("const unsigned grp = row / %du, r = row %% %du;", P.R, P.R)
    if P.dyn_q then
        dyn_setup(b, P, false, true)
        b.add("if (r >= nr)")
        b.add("    return; /* a row past this run's tokens */")
    end
    if P.dyn_kv then
        dyn_setup(b, P, true, false)
        b.add("const unsigned ns = (nkv + %du) / %du; /* splits with keys at this run's nkv */", p.L - 1, p.L)
        if direct_one(P, p) then
            b.add("if (ns == 1)")
            b.add("    return; /* the main kernel wrote dst itself */")
        end
    end
    b.add("const unsigned hk = grp %% %du, i3 = grp / %du;", P.NHKV, P.NHKV)
    b.add("const unsigned iq1 = r / %du, h = hk * %du + r %% %du;", P.G, P.G, P.G)
    b.add("const float *const ml = scr_ml + 2ll * row * %du;", S)
    b.add("const float *const po = scr_o + (long long)row * %du;", S * P.DV)
end

local function combine_kernel(P, p, H, name)
    local b = builder()
    local S = p.S
    local VW = P.DV % 4 == 0 and 4 or 1
    local cols = P.DV // VW
    local nsg = math.max(1, math.min(CT // cols, S))
    local K = ceil_div(S, nsg)              -- splits per group
    local pre = cols <= CT and K <= 32      -- preload every partial into registers
    local NWC = CT // 32
    -- the splits holding keys: all S, or at run time ns = ceil(nkv / L) (the others wrote nothing)
    local SB = (P.dyn_kv or p.range) and "ns" or string.format("%du", S)
    H.use("types")
    H.use("ex2")
    H.use("warp")
    b.add("extern \"C\" __global__ void __launch_bounds__(%d) %s(%s)", CT, name, param_list(P, p))
    b.open("{")
    b.add("__shared__ float kiln_w[%d];", S)
    b.add("__shared__ float kiln_red[2][%d];", NWC)
    b.add("__shared__ __align__(16) float kiln_part[%d][%d];", nsg, P.DV)
    pointers(b, P, p, S, true)
    b.add("const unsigned tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;")
    b.add("const unsigned row = blockIdx.x;")
    combine_row(b, P, p)
    b.add("const unsigned sg = tid / %du, c = tid %% %du;", cols, cols)
    local vt = VW == 4 and "float4" or "float"
    if pre then
        b.add("/* group sg's partial outputs of column c, first: independent loads */")
        b.add("%s x[%d];", vt, K)
        b.add("#pragma unroll")
        b.open("for (int i = 0; i < %d; i++) {", K)
        b.add("const unsigned s = sg + %du * i;", nsg)
        if VW == 4 then
            b.add("x[i] = sg < %du && s < %s ? *(const float4 *)(po + s * %du + 4u * c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);",
                nsg, SB, P.DV)
        else
            b.add("x[i] = sg < %du && s < %s ? po[s * %du + c] : 0.0f;", nsg, SB, P.DV)
        end
        b.close()
    end
    b.add("float mx = %s;", NEG_INF)
    b.add("for (unsigned s = tid; s < %s; s += %du)", SB, CT)
    b.add("    mx = fmaxf(mx, ml[2 * s]);")
    b.add("mx = kiln_warp_max(mx);")
    b.add("if (lane == 0)")
    b.add("    kiln_red[0][warp] = mx;")
    b.add("__syncthreads();")
    b.add("float M = kiln_red[0][0];")
    b.add("#pragma unroll")
    b.add("for (int w = 1; w < %d; w++)", NWC)
    b.add("    M = fmaxf(M, kiln_red[0][w]);")
    if P.sinks then
        b.add("const float sk = sb[h * %s] * %s;", ll(P.sinks.st[1]), LOG2E)
        b.add("M = fmaxf(M, sk);")
    end
    b.add("const float base = M == %s ? 0.0f : M;", NEG_INF)
    b.add("float ls = 0.0f;")
    b.open("for (unsigned s = tid; s < %s; s += %du) {", SB, CT)
    b.add("const float f = kiln_ex2(ml[2 * s] - base);")
    b.add("kiln_w[s] = f;")
    b.add("ls += f * ml[2 * s + 1];")
    b.close()
    b.add("ls = kiln_warp_sum(ls);")
    b.add("if (lane == 0)")
    b.add("    kiln_red[1][warp] = ls;")
    b.add("__syncthreads(); /* kiln_w and kiln_red[1] */")
    b.add("float L = kiln_red[1][0];")
    b.add("#pragma unroll")
    b.add("for (int w = 1; w < %d; w++)", NWC)
    b.add("    L += kiln_red[1][w];")
    if P.sinks then b.add("L += kiln_ex2(sk - base);") end
    b.add("const float inv = L > 0.0f ? 1.0f / L : 0.0f;")
    if pre then
        b.open("if (sg < %du) {", nsg)
        if VW == 4 then
            b.add("float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;")
            b.add("#pragma unroll")
            b.open("for (int i = 0; i < %d; i++) {", K)
            b.add("const unsigned s = sg + %du * i;", nsg)
            b.add("const float f = s < %s ? kiln_w[s] : 0.0f;", SB)
            b.add("a0 = fmaf(f, x[i].x, a0);")
            b.add("a1 = fmaf(f, x[i].y, a1);")
            b.add("a2 = fmaf(f, x[i].z, a2);")
            b.add("a3 = fmaf(f, x[i].w, a3);")
            b.close()
            b.add("*(float4 *)&kiln_part[sg][4u * c] = make_float4(a0, a1, a2, a3);")
        else
            b.add("float a0 = 0.0f;")
            b.add("#pragma unroll")
            b.open("for (int i = 0; i < %d; i++) {", K)
            b.add("const unsigned s = sg + %du * i;", nsg)
            b.add("a0 = fmaf(s < %s ? kiln_w[s] : 0.0f, x[i], a0);", SB)
            b.close()
            b.add("kiln_part[sg][c] = a0;")
        end
        b.close()
    else
        -- many splits or wide rows: a plain loop per column
        b.open("for (unsigned cc = c; sg < %du && cc < %du; cc += %du) {", nsg, cols, CT)
        if VW == 4 then
            b.add("float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;")
            b.add("#pragma unroll 8")
            b.open("for (unsigned s = sg; s < %s; s += %du) {", SB, nsg)
            b.add("const float4 xv = *(const float4 *)(po + s * %du + 4u * cc);", P.DV)
            b.add("const float f = kiln_w[s];")
            b.add("a0 = fmaf(f, xv.x, a0);")
            b.add("a1 = fmaf(f, xv.y, a1);")
            b.add("a2 = fmaf(f, xv.z, a2);")
            b.add("a3 = fmaf(f, xv.w, a3);")
            b.close()
            b.add("*(float4 *)&kiln_part[sg][4u * cc] = make_float4(a0, a1, a2, a3);")
        else
            b.add("float a0 = 0.0f;")
            b.add("#pragma unroll 8")
            b.add("for (unsigned s = sg; s < %s; s += %du)", SB, nsg)
            b.add("    a0 = fmaf(kiln_w[s], po[s * %du + cc], a0);", P.DV)
            b.add("kiln_part[sg][cc] = a0;")
        end
        b.close()
    end
    b.add("__syncthreads();")
    b.add("float *const out = dstb + h * %s + iq1 * %s + i3 * %s;", ll(P.dst.st[2]), ll(P.dst.st[3]), ll(P.dst.st[4]))
    b.open("for (unsigned d = tid; d < %du; d += %du) {", P.DV, CT)
    b.add("float acc = kiln_part[0][d];")
    b.add("#pragma unroll")
    b.add("for (int i = 1; i < %d; i++)", nsg)
    b.add("    acc += kiln_part[i][d];")
    b.add("out[d * %s] = acc * inv;", ll(P.dst.st[1]))
    b.close()
    b.close()
    return b.lines, { combine_rows(P, p), 1, 1 }, 0
end

-- One warp per row, when every partial of a row fits in a lane's registers (S <= 64 splits,
-- DV = 32 VW with VW <= 4): each lane loads its VW dims of every split first (independent
-- loads), reads the maxima and sums of splits lane and lane + 32, and the warp reduces them by
-- shuffles; the weights reach the lanes by shuffles too. No shared memory, no block barrier.
local WARP_COMBINE = true
local CW = 4 -- warps (rows) per block
local function warp_combine_fits(P, p)
    return WARP_COMBINE and p.S <= 64 and P.DV % 32 == 0 and P.DV // 32 <= 4
end

local function combine_warp_kernel(P, p, H, name)
    local b = builder()
    local S = p.S
    local VW = P.DV // 32
    local vt = ({ "float", "float2", nil, "float4" })[VW]
    if not vt then
        VW = 1
        vt = "float"
    end
    local NL = P.DV // VW // 32 -- loads per split per lane (1, or DV / 32 for VW = 3)
    H.use("types")
    H.use("ex2")
    H.use("warp")
    b.add("extern \"C\" __global__ void __launch_bounds__(%d) %s(%s)", 32 * CW, name, param_list(P, p))
    b.open("{")
    pointers(b, P, p, S, true)
    b.add("const unsigned lane = threadIdx.x & 31u;")
    b.add("const unsigned row = blockIdx.x * %du + (threadIdx.x >> 5);", CW)
    if combine_rows(P, p) % CW ~= 0 then
        b.add("if (row >= %du)", combine_rows(P, p))
        b.add("    return; /* past the last row */")
    end
    combine_row(b, P, p)
    local SB = (P.dyn_kv or p.range) and "ns" or string.format("%du", S) -- the splits holding keys
    local zero = ({ "0.0f", "make_float2(0.0f, 0.0f)", nil, "make_float4(0.0f, 0.0f, 0.0f, 0.0f)" })[VW]
    b.add("/* the lane's dims of every split, first: independent loads */")
    b.add("%s x[%d][%d];", vt, S, NL)
    b.add("#pragma unroll")
    b.open("for (int s = 0; s < %d; s++) {", S)
    b.add("#pragma unroll")
    b.add("for (int i = 0; i < %d; i++)", NL)
    b.add("    x[s][i] = (unsigned)s < %s ? *(const %s *)(po + s * %d + %d * (lane + 32u * i)) : %s;", SB, vt, P.DV, VW, zero)
    b.close()
    local halves = S > 32 and 2 or 1
    for k = 0, halves - 1 do
        b.add("const float m%d = lane + %du < %s ? ml[2u * (lane + %du)] : %s;", k, 32 * k, SB, 32 * k, NEG_INF)
        b.add("const float l%d = lane + %du < %s ? ml[2u * (lane + %du) + 1u] : 0.0f;", k, 32 * k, SB, 32 * k)
    end
    b.add("float M = kiln_warp_max(%s);", halves == 2 and "fmaxf(m0, m1)" or "m0")
    if P.sinks then
        b.add("const float sk = sb[h * %s] * %s;", ll(P.sinks.st[1]), LOG2E)
        b.add("M = fmaxf(M, sk);")
    end
    b.add("const float base = M == %s ? 0.0f : M;", NEG_INF)
    for k = 0, halves - 1 do b.add("const float w%d = kiln_ex2(m%d - base);", k, k) end
    b.add("float L = kiln_warp_sum(%s);", halves == 2 and "w0 * l0 + w1 * l1" or "w0 * l0")
    if P.sinks then b.add("L += kiln_ex2(sk - base);") end
    b.add("const float inv = L > 0.0f ? 1.0f / L : 0.0f;")
    local comps = ({ { "" }, { ".x", ".y" }, nil, { ".x", ".y", ".z", ".w" } })[VW]
    b.add("float acc[%d][%d] = {};", NL, VW)
    b.add("#pragma unroll")
    b.open("for (int s = 0; s < %d; s++) {", S)
    if halves == 2 then
        b.add("const float w = __shfl_sync(0xffffffffu, s < 32 ? w0 : w1, s & 31);")
    else
        b.add("const float w = __shfl_sync(0xffffffffu, w0, s);")
    end
    b.add("#pragma unroll")
    b.open("for (int i = 0; i < %d; i++) {", NL)
    for c, comp in ipairs(comps) do
        b.add("acc[i][%d] = fmaf(w, x[s][i]%s, acc[i][%d]);", c - 1, comp, c - 1)
    end
    b.close()
    b.close()
    b.add("float *const out = dstb + h * %s + iq1 * %s + i3 * %s;", ll(P.dst.st[2]), ll(P.dst.st[3]), ll(P.dst.st[4]))
    b.add("#pragma unroll")
    b.add("for (int i = 0; i < %d; i++)", NL)
    b.add("#pragma unroll")
    b.add("    for (int c = 0; c < %d; c++)", VW)
    b.add("        out[(%du * (lane + 32u * i) + c) * %s] = acc[i][c] * inv;", VW, ll(P.dst.st[1]))
    b.close()
    return b.lines, { ceil_div(combine_rows(P, p), CW), 1, 1 }, 0
end

-- ---- assembly -----------------------------------------------------------------------------------

local function source(P, p, title, notes, H, body)
    local pre = PRE.code():gsub("\n$", "")
    local hdr = {
        "// kiln attention kernel " .. title,
        string.format("// flash_attn_ext: q %s, k %s %s, v %s %s -> dst %s", dims(P.q.ne), P.kt, dims(P.k.ne), P.kt,
            dims(P.v.ne), dims(P.dst.ne)),
    }
    for _, n in ipairs(notes) do hdr[#hdr + 1] = "//   " .. n end
    local parts = { table.concat(hdr, "\n") }
    local hc = H.code()
    if pre ~= "" then parts[#parts + 1] = pre end
    if hc ~= "" then parts[#parts + 1] = hc end
    parts[#parts + 1] = table.concat(body, "\n")
    return table.concat(parts, "\n\n") .. "\n"
end

local function features(P)
    local f = {}
    f[#f + 1] = P.range and "key intervals" or P.mask and "mask" or "no mask"
    if P.alibi then f[#f + 1] = "ALiBi" end
    if P.softcap then f[#f + 1] = "softcap " .. P.softcap end
    if P.sinks then f[#f + 1] = "sinks" end
    f[#f + 1] = "scale " .. P.scale
    return table.concat(f, ", ")
end

return function(k)
    local P = problem(k)
    local p = plan(P)
    local base = string.format("fattn_%s_%s_d%d", p.kind .. (P.range and "_rg" or ""), P.kt, P.DK)
    if P.DV ~= P.DK then base = base .. "_" .. P.DV end
    if P.isdyn then base = base .. "_dyn" end
    local notes = {
        string.format("%d rows per kv head (%d tokens x %d heads), %d kv heads x %d sequences, %d keys; %s", P.R, P.NQ,
            P.G, P.NHKV, P.NSEQ, P.NKV, features(P)),
    }
    local gen = ({ dec = dec_kernel, pre = pre_kernel, fma = fma_kernel })[p.kind]
    if p.kind == "dec" then
        notes[#notes + 1] = string.format("decode: %d rows per block, warps take 16 x %d keys at a time; K loads of %d, V loads of %d elements",
            8 * p.NT, p.U, p.KA, p.VA)
    elseif p.kind == "pre" then
        notes[#notes + 1] = string.format("prefill: %d rows x %d keys per tile, Q %s", p.BM, p.BN,
            p.QREG and "in registers" or "from shared memory")
    else
        notes[#notes + 1] = "fma: one warp per row (" .. p.why .. ")"
    end
    if p.range then
        notes[#notes + 1] = string.format("key intervals: each row tile visits the hull of its tokens' keys%s",
            p.S > 1 and string.format(", cut into up to %d splits when few tiles run (then the combine kernel)", p.S) or "")
    else
        notes[#notes + 1] = p.S > 1 and string.format("split-KV: %d splits of %d keys, then the combine kernel", p.S, p.L)
            or "one pass over the keys"
    end
    if P.isdyn then
        local l = {}
        if P.dyn_kv then l[#l + 1] = string.format("n_kv <= %d (splits past it exit, the combine merges the rest)", P.NKV) end
        if P.dyn_q then l[#l + 1] = string.format("n_q <= %d (row tiles past it exit)", P.NQ) end
        notes[#notes + 1] = "symbolic: " .. (#l > 0 and table.concat(l, "; ") or "none of this node's dims")
            .. "; the plan is the maximum's"
    end
    PRE = prelude.new()
    local H = helpers()
    local body, grid, smem = gen(P, p, H, base)
    local main = { name = base, source = source(P, p, base, notes, H, body), grid = grid, block = { NTHR, 1, 1 },
                   smem = smem }
    if p.S == 1 then
        if P.isdyn then main.dynamic = true end
        return main
    end
    PRE = prelude.new()
    local H2 = helpers()
    local cname = string.format("fattn_combine_d%d_s%d", P.DV, p.S)
    if P.isdyn then cname = cname .. "_dyn" end
    local warp = warp_combine_fits(P, p)
    local cbody, cgrid = (warp and combine_warp_kernel or combine_kernel)(P, p, H2, cname)
    local comb = { name = cname, source = source(P, p, cname, { string.format("merges %d splits per row", p.S) }, H2, cbody),
                   grid = cgrid, block = { warp and 32 * CW or CT, 1, 1 }, smem = 0 }
    return { scratch = scratch_slots(P, p) * (P.DV + 2) * 4, steps = { main, comb }, dynamic = P.isdyn or nil }
end
