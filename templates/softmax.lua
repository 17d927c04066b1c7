-- softmax: the kernel template of the softmax family (soft_max, soft_max_ext); see
-- docs/templates.md for the table k of IR_OP nodes and docs/ops-softmax.md for the semantics.
--
-- Per row (i1, i2, i3) of a, as ggml's CPU kernel (ir/ref_softmax.c is the oracle):
--   x = a * scale + slope * mask;  max = max(x, sink);  out = expf(x - max) / (sum + expf(sink - max))
-- with each rounding step of ggml's in f32 (__fmul_rn / __fadd_rn keep the compiler from
-- contracting a*scale + slope*m into one fma).
--
-- Three shapes of kernel, chosen from the static shapes:
--
-- * team: rows of at most WARP_MAX_VEC vectors. A team of G <= 32 lanes (the smallest power of
--   two covering the row's vectors) per row, BLOCK_SMALL / G rows per block, shuffles only.
-- * block, cached: one block of T threads per row, or on sm_90 one cluster of C <= 8 blocks per
--   row (rows too long for one block's registers, or too few rows to fill the GPU). Each thread
--   keeps its K groups of V elements in registers, so a is read once: max, then sum of exps,
--   then the scaled exps are stored. Block partials meet in shared memory, cluster partials
--   through distributed shared memory (mapa + barrier.cluster).
-- * block, streamed: rows longer than a cluster's registers (C * T * VMAX elements). Pass 1
--   keeps an online (max, sum) per thread; pass 2 reads the row again (mostly from L2) and stores.
--
-- Cluster kernels carry their sm_80 fallback in the same source (#if __CUDA_ARCH__ >= 900): the
-- grid is the same, one block of each row's C does the whole row (cached or streamed as fits)
-- and the others return at once.
--
-- Elements move V at a time (V = 4, 2 or 1: the largest dividing ne0): one vector access per
-- operand whose row is contiguous and aligned (checked here on the static offsets and strides;
-- buffers are 256-byte aligned), else V element accesses through the strides.
--
-- Reductions are xor butterflies (every lane ends with the bitwise-same value), and cluster
-- partials are combined in rank order, so every block of a row uses the same max and sum.

local kit = require("kit")
local tpl = require("tpl")
local prelude = require("prelude")

local USE_CLUSTERS = true -- sm_90 thread-block clusters for long rows / few rows
local SIZE = { f32 = 4, f16 = 2, bf16 = 2 }
local INT_MAX = 2147483647
local WARP_MAX_VEC = 256  -- rows of at most this many vectors: the team kernel (<= 8 per lane)
local BLOCK_SMALL = 256   -- block of the team kernel
local PER_THREAD = 16     -- elements per thread the block kernel aims for
local VMAX = 16           -- at most this many elements cached per thread (64 registers at 1024 threads)
local MIN_BLOCK = 128
local MAX_BLOCK = 1024
local MAX_CLUSTER = 8     -- the portable cluster size
local FILL_BLOCKS = 264   -- below this many blocks, split rows over more of a cluster (2 per H100 SM)
local MIN_CHUNK = 2048    -- ... as long as each block keeps at least this many elements

local fail = kit.failer("softmax")

local dims = kit.dims

local ceil_div = kit.ceil_div

local next_pow2 = kit.next_pow2

local check_ref = kit.ref_checker(fail)

-- ---- symbolic dims ------------------------------------------------------------------------

-- The run-time extents of the node's symbolic dims (docs/ops-softmax.md): dyn[d] is the C
-- expression of dst's (= a's) dim d - 1, nil when static, and isdyn whether the node uses any
-- symbolic dim (its kernel then takes kdims). Supported: any of a's dims (the row length, dim 0,
-- and the row dims 1..3), the mask following a (its ne0 = the row length; its dims 1..3 only
-- where it spans a's), sinks following a's dim 2. Anything else is refused here.
local function symbolic(k, a, dst, mask, sinks)
    local dyn = {}
    local dyn_of = kit.ext
    for d = 1, 4 do
        local e = dyn_of(a, d)
        if dyn_of(dst, d) ~= e then
            fail("a's dim %d is %s but dst's is %s", d - 1, tostring(e or "static"), tostring(dyn_of(dst, d) or "static"))
        end
        if e ~= nil and type(e) ~= "string" then fail("a: bad dyn[%d]", d) end
        dyn[d] = e
    end
    if mask then
        for d = 1, 4 do
            local e = dyn_of(mask, d)
            if e ~= nil and (e ~= dyn[d] or (d > 1 and mask.ne[d] ~= a.ne[d])) then
                fail("mask dim %d is symbolic (%s) but does not follow a's dim %d (%s, extent %d vs %d)", d - 1, tostring(e),
                    d - 1, tostring(dyn[d] or "static"), mask.ne[d], a.ne[d])
            end
        end
    end
    if sinks and dyn_of(sinks, 1) ~= nil and dyn_of(sinks, 1) ~= dyn[3] then
        fail("sinks' symbolic dim 0 does not follow a's dim 2")
    end
    if sinks then
        for d = 2, 4 do
            if dyn_of(sinks, d) then fail("sinks dim %d is symbolic", d - 1) end
        end
    end
    local isdyn = k.dims ~= nil and #k.dims > 0
    for d = 1, 4 do
        if dyn[d] and not isdyn then fail("a symbolic dim without k.dims") end
    end
    return dyn, isdyn
end

-- ---- operands -----------------------------------------------------------------------------

-- The row offset (without offs) of r at the row coordinates i1, i2, i3 of dst's shape dne:
-- a list of terms, marking the coordinates it uses in `used`. Dims 2 and 3 broadcast (mask).
local function row_terms(r, dne, used)
    local terms = {}
    for d = 2, 4 do
        if dne[d] > 1 and r.ne[d] > 1 and r.st[d] ~= 0 then
            used[d] = true
            local c = "i" .. (d - 1)
            if r.ne[d] < dne[d] then c = "(" .. c .. " % " .. r.ne[d] .. "u)" end
            terms[#terms + 1] = { c = c, st = r.st[d] }
        end
    end
    return terms
end

-- Can r's rows be read as whole vectors of v elements?
local function vectorizable(r, terms, v)
    if v == 1 or r.st[1] ~= 1 or r.offs % v ~= 0 then return false end
    for _, t in ipairs(terms) do
        if t.st % v ~= 0 then return false end
    end
    return true
end

local VEC_NAME = { f32 = "kiln_f32x", f16 = "kiln_u16x", bf16 = "kiln_u16x" }

local function vec_type(t, v)
    return VEC_NAME[t] .. v
end

local function vec_def(t, v)
    local bytes = v * SIZE[t]
    return string.format("struct alignas(%d) %s {\n    %s v[%d];\n};", bytes, vec_type(t, v), prelude.ctype[t], v)
end

-- ---- the plan -----------------------------------------------------------------------------

-- How a row of nv vectors is processed by blocks of t threads, c blocks per row.
local function block_plan(nv, v, t, c)
    local k = ceil_div(nv, c * t)
    return { C = c, T = t, K = k, cached = k * v <= VMAX, full = nv % (c * t) == 0 }
end

local function choose(n, v, nrows)
    local nv = n // v
    if nv <= WARP_MAX_VEC then
        local g = math.min(32, next_pow2(nv))
        return { kind = "team", G = g, K = ceil_div(nv, g), R = BLOCK_SMALL // g, full = nv % g == 0 }
    end
    local cap = MAX_BLOCK * VMAX -- elements one block caches
    local c = 1
    if USE_CLUSTERS then
        c = next_pow2(ceil_div(n, cap))
        if c > MAX_CLUSTER then c = MAX_CLUSTER end
        while c < MAX_CLUSTER and nrows * c < FILL_BLOCKS and n // (2 * c) >= MIN_CHUNK do c = c * 2 end
    end
    local chunk = ceil_div(n, c)
    local t = math.max(MIN_BLOCK, math.min(MAX_BLOCK, next_pow2(ceil_div(chunk, PER_THREAD))))
    local main = block_plan(nv, v, t, c)
    if not main.cached then main = block_plan(nv, v, MAX_BLOCK, c) end
    local p = { kind = "block", T = main.T, C = c, main = main }
    if c > 1 then p.fallback = block_plan(nv, v, main.T, 1) end
    return p
end

-- ---- code ---------------------------------------------------------------------------------

-- A list of lines with an indentation level.
local builder = kit.builder

local HELPERS = {
    warp = [[
static __device__ __forceinline__ float kiln_warp_max(float v, int from)
{
#pragma unroll
    for (int o = from; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __device__ __forceinline__ float kiln_warp_sum(float v, int from)
{
#pragma unroll
    for (int o = from; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}]],
    online = [[
/* (m, s) += (m2, s2): sums of exps relative to their maxima, merged; -inf maxima hold 0. */
static __device__ __forceinline__ void kiln_online(float &m, float &s, float m2, float s2)
{
    const float mn = fmaxf(m, m2);
    const float base = mn == -__int_as_float(0x7f800000) ? 0.0f : mn;
    s = s * expf(m - base) + s2 * expf(m2 - base);
    m = mn;
}

static __device__ __forceinline__ void kiln_warp_online(float &m, float &s, int from)
{
#pragma unroll
    for (int o = from; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
        kiln_online(m, s, m2, s2);
    }
}]],
    cluster = [[
#if __CUDA_ARCH__ >= 900
static __device__ __forceinline__ unsigned kiln_cluster_rank()
{
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

static __device__ __forceinline__ void kiln_cluster_arrive()
{
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}

static __device__ __forceinline__ void kiln_cluster_wait()
{
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

/* *p in the shared memory of block `rank` of this cluster. */
static __device__ __forceinline__ float kiln_cluster_load(const float *p, unsigned rank)
{
    unsigned long long a;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(a) : "l"(p), "r"(rank));
    return *(const volatile float *)a;
}
#endif]],
}

-- The source of a softmax kernel (kit.kernel with this family's head; a kernel of a cluster of
-- blocks declares its cluster on sm_90+).
local function kernel(t)
    t.head = {
        "kiln softmax kernel " .. t.name,
        t.op .. ": rows of " .. t.n .. " elements, " .. t.nrows .. " rows (dst " .. dims(t.dst.ne) .. " " .. t.dst.type .. ")",
    }
    local blocks = {}
    for _, x in ipairs(t.types) do blocks[#blocks + 1] = x end
    for _, x in ipairs(t.helpers) do blocks[#blocks + 1] = x end
    if t.cluster > 1 then
        blocks[#blocks + 1] = "#if __CUDA_ARCH__ >= 900\n#define KILN_CLUSTER_DIMS __cluster_dims__(" .. t.cluster
            .. ", 1, 1)\n#else\n#define KILN_CLUSTER_DIMS\n#endif"
    end
    t.blocks, t.threads, t.inline, t.name = blocks, t.block, true, t.attr .. t.name
    return kit.kernel(t)
end

-- ---- the node -----------------------------------------------------------------------------

-- The softmax node as the code writers below see it (S): the operands (dst, a, mask, sinks),
-- dst's extents dne, the row length n and row count nrows, the op's scale, max_bias and flags
-- (scaled, alibi), the symbolic dims (dyn, isdyn), the vector width v and plan, the row's vector
-- count as C (NVS), the row operands (ops: a, then the mask) with their terms and whether they
-- read whole vectors, the row coordinates used, the index type ix, the kernel parameters
-- (plist, ptrs) and the recorders of prelude helpers (pre) and vector types (types).
local function node_of(k)
    if k.kind ~= "op" then fail("node kind %s is not op", tostring(k.kind)) end
    local op = k.op
    if op ~= "soft_max" and op ~= "soft_max_ext" then fail("unknown op %s", tostring(op)) end
    local FT = { f32 = true, f16 = true, bf16 = true }
    local dst, a = k.dst, k.args.a
    local mask, sinks = k.args.mask, k.args.sinks
    check_ref(dst, "dst", FT)
    check_ref(a, "a", FT)
    if mask then check_ref(mask, "mask", { f32 = true, f16 = true }) end
    if sinks then check_ref(sinks, "sinks", { f32 = true }) end
    local dne = dst.ne
    for d = 1, 4 do
        if a.ne[d] ~= dne[d] then fail("a ne %s differs from dst ne %s", dims(a.ne), dims(dne)) end
    end
    if dst.type ~= a.type then fail("dst type %s differs from a's %s", dst.type, a.type) end
    local n = dne[1]
    local nrows = dne[2] * dne[3] * dne[4]
    if mask and (mask.ne[1] ~= n or mask.ne[2] < dne[2] or dne[3] % mask.ne[3] ~= 0 or dne[4] % mask.ne[4] ~= 0) then
        fail("mask ne %s does not fit a ne %s", dims(mask.ne), dims(dne))
    end
    if sinks and sinks.ne[1] ~= dne[3] then fail("sinks ne0 %d is not a's ne2 %d", sinks.ne[1], dne[3]) end
    local dyn, isdyn = symbolic(k, a, dst, mask, sinks)

    local params = k.params or {}
    local values = k.values or {}
    local scale = op == "soft_max_ext" and params.scale or "1.0f"
    local scaled = op == "soft_max_ext" and values.scale ~= 1
    local max_bias = op == "soft_max_ext" and params.max_bias or "0.0f"
    local alibi = op == "soft_max_ext" and (values.max_bias or 0) > 0 and mask ~= nil
    if alibi and dyn[3] then fail("ALiBi with a symbolic head count (a's dim 2): the slopes depend on it") end

    local v = 4
    while v > 1 and n % v ~= 0 do v = v // 2 end
    local nv = n // v
    if nv > INT_MAX // 2 then fail("rows of %d elements are too long", n) end
    local plan = choose(n, v, nrows)
    if dyn[1] then
        -- a run-time row length: every vector index is guarded (the plan is the maximum's)
        plan.full = false
        if plan.main then plan.main.full = false end
        if plan.fallback then plan.fallback.full = false end
    end

    local used = {}
    local ops = { { r = a, var = "a" } }
    if mask then ops[#ops + 1] = { r = mask, var = "m" } end
    for _, o in ipairs(ops) do
        o.terms = row_terms(o.r, dne, used)
        o.vec = vectorizable(o.r, o.terms, v)
    end
    if alibi then used[3] = true end -- the head index i2, 0 when ne2 == 1
    if sinks and dne[3] > 1 then used[3] = true end

    -- Index type inside a row: 32-bit unless an element offset could pass 2^31 or run backwards.
    local wide = false
    for _, o in ipairs(ops) do
        if o.r.st[1] < 0 or (n - 1) * math.abs(o.r.st[1]) + v > INT_MAX then wide = true end
    end

    return {
        k = k, op = op, dst = dst, a = a, mask = mask, sinks = sinks, dne = dne, n = n, nrows = nrows,
        dyn = dyn, isdyn = isdyn, scale = scale, scaled = scaled, max_bias = max_bias, alibi = alibi,
        v = v, dvec = v > 1, plan = plan, used = used, ops = ops, ix = wide and "long long" or "unsigned",
        -- The vector count of a row as C: static, or nvr (computed from the run-time length).
        NVS = dyn[1] and "nvr" or string.format("%du", nv),
        pre = prelude.new(), types = {}, seen_types = {},
    }
end

-- ---- code of the row ----------------------------------------------------------------------

-- The kernel's parameters: the node's buffers, then kdims when a dim is symbolic.
local function param_list(S)
    local plist = {}
    for p = 0, S.k.nparams - 1 do
        plist[#plist + 1] = (p == 0 and "char" or "const char") .. " *__restrict__ p" .. p
    end
    if S.isdyn then plist[#plist + 1] = ((S.k.dims_arg or ", const int* __restrict__ kdims"):gsub("^,%s*", "")) end
    return plist
end

-- The declaration of pointer var to operand r's first element.
local function ptr(S, r, var, const)
    kit.check_param(fail, r, var, S.k.nparams)
    return kit.pointer(r, var, prelude.ctype[r.type], const)
end

-- The name of the vector type of S.v elements of type t, defined once in S.types.
local function vtype(S, t)
    local nm = vec_type(t, S.v)
    if not S.seen_types[nm] then
        S.seen_types[nm] = true
        S.types[#S.types + 1] = vec_def(t, S.v)
    end
    return nm
end

-- Row setup: coordinates, row pointers, slope and sink (all threads of the row).
local function row_setup(S, b)
    local dne, used, sinks = S.dne, S.used, S.sinks
    local stride, last = 1, 1
    for d = 2, 4 do if dne[d] > 1 then last = d end end
    for d = 2, 4 do
        if used[d] and dne[d] > 1 then
            local e = "row"
            if stride > 1 then e = e .. " / " .. stride .. "u" end
            if d < last then e = "(" .. e .. ") % " .. dne[d] .. "u" end
            b.add("const unsigned i%d = %s;", d - 1, e)
        elseif used[d] then
            b.add("const unsigned i%d = 0;", d - 1)
        end
        stride = stride * dne[d]
    end
    for _, o in ipairs(S.ops) do
        local ts = {}
        for _, t in ipairs(o.terms) do ts[#ts + 1] = "(long long)" .. t.c .. " * " .. t.st .. "ll" end
        local ct = "const " .. prelude.ctype[o.r.type]
        b.add("%s *const %sr = in_%s%s;", ct, o.var, o.var, #ts > 0 and " + (" .. table.concat(ts, " + ") .. ")" or "")
    end
    b.add("%s *const orow = out + (long long)row * %dll;", prelude.ctype[S.dst.type], S.n)
    if S.alibi then
        -- ggml: n_head = ne2, n_head_log2 = 2^floor(log2(n_head)), slopes in f32 via powf.
        local nh = dne[3]
        local nhl2 = 1
        while nhl2 * 2 <= nh do nhl2 = nhl2 * 2 end
        b.add("const float m0 = powf(2.0f, -(%s) / %d.0f);", S.max_bias, nhl2)
        b.add("const float m1 = powf(2.0f, -(%s / 2.0f) / %d.0f);", S.max_bias, nhl2)
        b.add("const float slope = i2 < %du ? powf(m0, (float)(i2 + 1u)) : powf(m1, (float)(2u * (i2 - %du) + 1u));",
            nhl2, nhl2)
    end
    if sinks then
        local e = "0"
        if dne[3] > 1 then e = "(" .. S.ix .. ")i2 * " .. sinks.st[1] end
        b.add("const float sink = in_s[%s];", e)
    end
end

-- The f32 value of element t of vector j of row operand o (j an expression).
local function load_elem(S, o, j, t)
    local v, ix = S.v, S.ix
    local e
    if o.vec then e = "v" .. o.var .. ".v[" .. t .. "]"
    else
        local idx = v > 1 and string.format("((%s)(%s) * %d + %d)", ix, j, v, t) or string.format("(%s)(%s)", ix, j)
        if o.r.st[1] ~= 1 then idx = idx .. " * " .. o.r.st[1] end
        e = o.var .. "r[" .. idx .. "]"
    end
    return S.pre.load(o.r.type, e)
end

-- Statements computing x[base + t] (t < v) from vector j of the row (j an expression).
local function load_group(S, b, j, dest)
    local v, ix, ops = S.v, S.ix, S.ops
    for _, o in ipairs(ops) do
        if o.vec then
            local vt = vtype(S, o.r.type)
            b.add("const %s v%s = *(const %s *)(%sr + (%s)(%s) * %d);", vt, o.var, vt, o.var, ix, j, v)
        end
    end
    for t = 0, v - 1 do
        local x = load_elem(S, ops[1], j, t)
        if S.scaled then x = string.format("__fmul_rn(%s, %s)", x, S.scale) end
        if S.mask then
            local m = load_elem(S, ops[2], j, t)
            if S.alibi then m = string.format("__fmul_rn(slope, %s)", m) end
            x = string.format("__fadd_rn(%s, %s)", x, m)
        end
        if S.dyn[1] and v > 1 then
            -- the last vector may pass the run-time length: its tail is -inf (exp gives 0)
            x = string.format("(%s)(%s) * %d + %d < (%s)dn0 ? %s : __int_as_float(0xff800000)", ix, j, v, t, ix, x)
        end
        b.add("%s = %s;", dest(t), x)
    end
end

-- Statements storing f32 values val(t) (t < v) as vector j of the output row.
local function store_group(S, b, j, val)
    local v, ix, dst = S.v, S.ix, S.dst
    if S.dvec then
        local vt = vtype(S, dst.type)
        b.add("%s o;", vt)
        for t = 0, v - 1 do b.add("o.v[%d] = %s;", t, S.pre.store(dst.type, val(t))) end
        b.add("*(%s *)(orow + (%s)(%s) * %d) = o;", vt, ix, j, v)
    else
        b.add("orow[(%s)(%s)] = %s;", ix, j, S.pre.store(dst.type, val(0)))
    end
end

local function layout_note(r, what, how)
    return string.format("%-5s p%d %-4s ne %s st %s offs %d%s", what, r.param, r.type, dims(r.ne), dims(r.st), r.offs,
        how and (" (" .. how .. ")") or "")
end

-- The notes on the operands and what the kernel computes.
local function operand_notes(S)
    local v, ops = S.v, S.ops
    local notes = {}
    notes[#notes + 1] = layout_note(S.dst, "out", S.dvec and ("vectors of " .. v) or nil)
    notes[#notes + 1] = layout_note(S.a, "a", ops[1].vec and ("vectors of " .. v) or "element by element")
    if S.mask then notes[#notes + 1] = layout_note(S.mask, "mask", ops[2].vec and ("vectors of " .. v) or "element by element") end
    if S.sinks then notes[#notes + 1] = layout_note(S.sinks, "sinks") end
    notes[#notes + 1] = string.format("x = a%s%s; scale %s, max_bias %s%s", S.scaled and " * scale" or "",
        S.mask and (S.alibi and " + slope * mask" or " + mask") or "", S.scale, S.max_bias, S.sinks and "; a sink per head" or "")
    return notes
end

-- Symbolic dims: the liveness of a row (every coordinate below its dim's run-time extent dnD),
-- nil when no row dim is symbolic.
local function live_of(S, rowvar)
    local dne = S.dne
    local terms, stride, last = {}, 1, 1
    for d = 2, 4 do if dne[d] > 1 then last = d end end
    for d = 2, 4 do
        if S.dyn[d] then
            local e = rowvar
            if stride > 1 then e = e .. " / " .. stride .. "u" end
            if d < last then e = "(" .. e .. ") % " .. dne[d] .. "u" end
            terms[#terms + 1] = string.format("%s < dn%d", e, d - 1)
        end
        stride = stride * dne[d]
    end
    if #terms == 0 then return nil end
    return table.concat(terms, " && ")
end

-- Symbolic dims: their run-time extents (dnD for dim D) and the row's vector count nvr.
local function dyn_setup(S, b, notes)
    if not S.isdyn then return end
    local l = {}
    for d = 1, 4 do
        if S.dyn[d] then
            l[#l + 1] = string.format("dim %d <= %d", d - 1, S.dne[d])
            b.add("const unsigned dn%d = (unsigned)(%s);", d - 1, S.dyn[d])
        end
    end
    local v = S.v
    if S.dyn[1] then b.add(v > 1 and string.format("const unsigned nvr = (dn0 + %du) / %du;", v - 1, v) or "const unsigned nvr = dn0;") end
    notes[#notes + 1] = "symbolic dims (run-time extents from kdims; rows past them exit): " .. table.concat(l, ", ")
end

local INF = "__int_as_float(0xff800000)"

-- An `if (cond) {` around the statements that follow, when cond is not "" (a full last vector).
local function guard_open(b, cond) if cond ~= "" then b.add("if (%s) {", cond) b.push() end end
local function guard_close(b, cond) if cond ~= "" then b.pop() b.add("}") end end

-- ---- the team kernel: a team of lanes of a warp per row -----------------------------------

-- Writes the team kernel's body into b; returns its grid and block.
local function team_kernel(S, b, notes)
    local plan, v, nrows, NVS = S.plan, S.v, S.nrows, S.NVS
    local G, K, R = plan.G, plan.K, plan.R
    local nb = ceil_div(nrows, R)
    if nb > INT_MAX then fail("too many rows (%d)", nrows) end
    notes[#notes + 1] = string.format("%d block%s of %d: a team of %d lane%s per row, %d rows per block, %d group%s of %d per lane in registers",
        nb, nb == 1 and "" or "s", BLOCK_SMALL, G, G == 1 and "" or "s", R, K, K == 1 and "" or "s", v)
    local live = nrows % R ~= 0
    b.add("const unsigned lane = threadIdx.x %% %du;", G)
    local dlive = live_of(S, "row0")
    if dlive then
        -- Teams of rows past the run-time extents redo row 0 (their lanes must join the
        -- full-mask shuffles) and store nothing; warps with no live row leave at once.
        live = true
        b.add("const unsigned row0 = blockIdx.x * %du + threadIdx.x / %du;", R, G)
        b.add("const bool live = %s%s;", nrows % R ~= 0 and string.format("row0 < %du && ", nrows) or "", dlive)
        b.add("if (__all_sync(0xffffffffu, !live))")
        b.add("    return;")
        b.add("const unsigned row = live ? row0 : 0u;")
    elseif live then
        -- Teams past the last row redo the last row (their lanes must join the full-mask
        -- shuffles) and store nothing.
        b.add("const unsigned row0 = blockIdx.x * %du + threadIdx.x / %du;", R, G)
        b.add("const bool live = row0 < %du;", nrows)
        b.add("const unsigned row = live ? row0 : %du;", nrows - 1)
    else
        b.add("const unsigned row = blockIdx.x * %du + threadIdx.x / %du;", R, G)
    end
    row_setup(S, b)
    b.add("float x[%d];", K * v)
    b.add("float mx = %s;", INF)
    b.add("#pragma unroll")
    b.add("for (unsigned k = 0; k < %du; k++) {", K)
    b.push()
    b.add("const unsigned j = lane + k * %du;", G)
    local cond = plan.full and "" or "j < " .. NVS
    if cond ~= "" then
        b.add("if (%s) {", cond)
        b.push()
    end
    load_group(S, b, "j", function(t) return string.format("x[k * %d + %d]", v, t) end)
    for t = 0, v - 1 do b.add("mx = fmaxf(mx, x[k * %d + %d]);", v, t) end
    if cond ~= "" then
        b.pop()
        b.add("} else {")
        b.push()
        for t = 0, v - 1 do b.add("x[k * %d + %d] = %s;", v, t, INF) end
        b.pop()
        b.add("}")
    end
    b.pop()
    b.add("}")
    b.add("mx = kiln_warp_max(mx, %d);", G // 2)
    if S.sinks then b.add("mx = fmaxf(mx, sink);") end
    b.add("float s = 0.0f;")
    b.add("#pragma unroll")
    b.add("for (unsigned k = 0; k < %du; k++) {", K)
    b.push()
    for t = 0, v - 1 do b.add("x[k * %d + %d] = expf(x[k * %d + %d] - mx);", v, t, v, t) end
    if cond ~= "" then b.add("if (lane + k * %du < %s)", G, NVS) b.push() end
    b.add("s += %s;", tpl.map_join((function() local l = {} for t = 0, v - 1 do l[#l + 1] = string.format("x[k * %d + %d]", v, t) end return l end)(), " + "))
    if cond ~= "" then b.pop() end
    b.pop()
    b.add("}")
    b.add("s = kiln_warp_sum(s, %d);", G // 2)
    if S.sinks then b.add("s += expf(sink - mx);") end
    b.add("const float inv = 1.0f / s;")
    if live then b.add("if (!live)") b.add("    return;") end
    b.add("#pragma unroll")
    b.add("for (unsigned k = 0; k < %du; k++) {", K)
    b.push()
    b.add("const unsigned j = lane + k * %du;", G)
    if cond ~= "" then b.add("if (%s) {", cond) b.push() end
    store_group(S, b, "j", function(t) return string.format("x[k * %d + %d] * inv", v, t) end)
    if cond ~= "" then b.pop() b.add("}") end
    b.pop()
    b.add("}")
    return nb, BLOCK_SMALL
end

-- ---- the block kernel: a block (or a cluster of C blocks) per row ---------------------------

-- Block-wide reductions through red (NW floats); every thread gets the result.
local function block_reduce(b, NW, what, var, red)
    local fn = what == "max" and "kiln_warp_max" or "kiln_warp_sum"
    b.add("%s = %s(%s, 16);", var, fn, var)
    if NW > 1 then
        b.add("if ((threadIdx.x & 31u) == 0)")
        b.add("    %s[threadIdx.x >> 5] = %s;", red, var)
        b.add("__syncthreads();")
        b.add("%s = %s(%s[threadIdx.x & %du], %d);", var, fn, red, NW - 1, NW // 2)
    end
end

-- Exchange of one value per block through a cluster of C: slot, then read all in rank order.
local function cluster_exchange(b, C, var, slot, op_)
    b.add("if (threadIdx.x == 0)")
    b.add("    kiln_slot[%d] = %s;", slot, var)
    b.add("kiln_cluster_arrive();")
    b.add("kiln_cluster_wait();")
    b.add("%s = kiln_cluster_load(&kiln_slot[%d], 0);", var, slot)
    b.add("#pragma unroll")
    b.add("for (unsigned r = 1; r < %du; r++)", C)
    if op_ == "max" then b.add("    %s = fmaxf(%s, kiln_cluster_load(&kiln_slot[%d], r));", var, var, slot)
    else b.add("    %s += kiln_cluster_load(&kiln_slot[%d], r);", var, slot) end
end

-- The row of plan p cached in registers: one read, exact max then sum. jexpr is the vector index
-- of group k of this thread, cond the guard of a partial last vector ("" when full).
local function cached_row(S, b, p, NW, jexpr, cond)
    local v, NVS = S.v, S.NVS
    b.add("float x[%d];", p.K * v)
    b.add("float mx = %s;", INF)
    b.add("#pragma unroll")
    b.add("for (unsigned k = 0; k < %du; k++) {", p.K)
    b.push()
    b.add("const unsigned j = %s;", jexpr)
    guard_open(b, cond)
    load_group(S, b, "j", function(t) return string.format("x[k * %d + %d]", v, t) end)
    for t = 0, v - 1 do b.add("mx = fmaxf(mx, x[k * %d + %d]);", v, t) end
    if cond ~= "" then
        b.pop()
        b.add("} else {")
        b.push()
        for t = 0, v - 1 do b.add("x[k * %d + %d] = %s;", v, t, INF) end
    end
    guard_close(b, cond)
    b.pop()
    b.add("}")
    block_reduce(b, NW, "max", "mx", "kiln_red_max")
    if p.C > 1 then cluster_exchange(b, p.C, "mx", 0, "max") end
    if S.sinks then b.add("mx = fmaxf(mx, sink);") end
    b.add("float s = 0.0f;")
    b.add("#pragma unroll")
    b.add("for (unsigned k = 0; k < %du; k++) {", p.K)
    b.push()
    for t = 0, v - 1 do b.add("x[k * %d + %d] = expf(x[k * %d + %d] - mx);", v, t, v, t) end
    local l = {}
    for t = 0, v - 1 do l[#l + 1] = string.format("x[k * %d + %d]", v, t) end
    if cond ~= "" then b.add("if (%s < %s)", jexpr, NVS) b.push() end
    b.add("s += %s;", table.concat(l, " + "))
    if cond ~= "" then b.pop() end
    b.pop()
    b.add("}")
    block_reduce(b, NW, "sum", "s", "kiln_red_sum")
    if p.C > 1 then
        cluster_exchange(b, p.C, "s", 1, "sum")
        -- No block may leave while others read its slots: wait at the very end.
        b.add("kiln_cluster_arrive();")
    end
    if S.sinks then b.add("s += expf(sink - mx);") end
    b.add("const float inv = 1.0f / s;")
    b.add("#pragma unroll")
    b.add("for (unsigned k = 0; k < %du; k++) {", p.K)
    b.push()
    b.add("const unsigned j = %s;", jexpr)
    guard_open(b, cond)
    store_group(S, b, "j", function(t) return string.format("x[k * %d + %d] * inv", v, t) end)
    guard_close(b, cond)
    b.pop()
    b.add("}")
    if p.C > 1 then b.add("kiln_cluster_wait();") end
end

-- The row of plan p streamed: an online max/sum over one read, then a second read to store.
-- jexpr and cond as for cached_row.
local function streamed_row(S, b, p, NW, jexpr, cond)
    local v = S.v
    b.add("float mx = %s, s = 0.0f;", INF)
    b.add("#pragma unroll 2")
    b.add("for (unsigned k = 0; k < %du; k++) {", p.K)
    b.push()
    b.add("const unsigned j = %s;", jexpr)
    guard_open(b, cond)
    b.add("float x[%d];", v)
    load_group(S, b, "j", function(t) return string.format("x[%d]", t) end)
    local mx = "x[0]"
    for t = 1, v - 1 do mx = string.format("fmaxf(%s, x[%d])", mx, t) end
    b.add("const float mn = fmaxf(mx, %s);", mx)
    b.add("const float base = mn == %s ? 0.0f : mn;", INF)
    local l = {}
    for t = 0, v - 1 do l[#l + 1] = string.format("expf(x[%d] - base)", t) end
    b.add("s = s * expf(mx - base) + %s;", table.concat(l, " + "))
    b.add("mx = mn;")
    guard_close(b, cond)
    b.pop()
    b.add("}")
    b.add("kiln_warp_online(mx, s, 16);")
    if NW > 1 then
        b.add("if ((threadIdx.x & 31u) == 0) {")
        b.add("    kiln_red_max[threadIdx.x >> 5] = mx;")
        b.add("    kiln_red_sum[threadIdx.x >> 5] = s;")
        b.add("}")
        b.add("__syncthreads();")
        b.add("mx = kiln_red_max[threadIdx.x & %du];", NW - 1)
        b.add("s = kiln_red_sum[threadIdx.x & %du];", NW - 1)
        b.add("kiln_warp_online(mx, s, %d);", NW // 2)
    end
    if p.C > 1 then
        b.add("if (threadIdx.x == 0) {")
        b.add("    kiln_slot[0] = mx;")
        b.add("    kiln_slot[1] = s;")
        b.add("}")
        b.add("kiln_cluster_arrive();")
        b.add("kiln_cluster_wait();")
        b.add("mx = kiln_cluster_load(&kiln_slot[0], 0);")
        b.add("s = kiln_cluster_load(&kiln_slot[1], 0);")
        b.add("#pragma unroll")
        b.add("for (unsigned r = 1; r < %du; r++)", p.C)
        b.add("    kiln_online(mx, s, kiln_cluster_load(&kiln_slot[0], r), kiln_cluster_load(&kiln_slot[1], r));")
        b.add("kiln_cluster_arrive();")
    end
    if S.sinks then b.add("kiln_online(mx, s, sink, 1.0f);") end
    b.add("const float inv = 1.0f / s;")
    b.add("#pragma unroll 2")
    b.add("for (unsigned k = 0; k < %du; k++) {", p.K)
    b.push()
    b.add("const unsigned j = %s;", jexpr)
    guard_open(b, cond)
    b.add("float x[%d];", v)
    load_group(S, b, "j", function(t) return string.format("x[%d]", t) end)
    store_group(S, b, "j", function(t) return string.format("expf(x[%d] - mx) * inv", t) end)
    guard_close(b, cond)
    b.pop()
    b.add("}")
    if p.C > 1 then b.add("kiln_cluster_wait();") end
end

-- The body for plan p (p.C blocks per row, rank = this block's place among them).
local function block_row(S, b, p, NW)
    local dlive = live_of(S, "row")
    if dlive then
        -- a row past the run-time extents: the whole block (cluster) leaves
        b.add("if (!(%s))", dlive)
        b.add("    return;")
    end
    row_setup(S, b)
    local jexpr = string.format("(k * %du + rank) * %du + threadIdx.x", p.C, p.T)
    if p.C == 1 then jexpr = string.format("k * %du + threadIdx.x", p.T) end
    local cond = p.full and "" or "j < " .. S.NVS
    if p.cached then cached_row(S, b, p, NW, jexpr, cond) else streamed_row(S, b, p, NW, jexpr, cond) end
end

-- Writes the block kernel's body into b; returns its grid, block, cluster size and helpers.
local function block_kernel(S, b, notes)
    local plan, v, nrows = S.plan, S.v, S.nrows
    local T, C = plan.T, plan.C
    local NW = T // 32
    if nrows * C > INT_MAX then fail("too many rows (%d)", nrows) end
    local grid = nrows * C
    local function describe(p, where)
        return string.format("%s%d block%s of %d%s: %d group%s of %d per thread %s", where, grid, grid == 1 and "" or "s", T,
            p.C > 1 and string.format(", a cluster of %d per row", p.C) or (C > 1 and string.format(", 1 of each %d per row", C) or ", one per row"),
            p.K, p.K == 1 and "" or "s", v, p.cached and "in registers (one read)" or "streamed (online max/sum, then a second read)")
    end
    notes[#notes + 1] = describe(plan.main, C > 1 and "sm_90: " or "")
    if plan.fallback then notes[#notes + 1] = describe(plan.fallback, "before sm_90: ") end
    -- Cached bodies use the warp max/sum, streamed ones the online pair; a helper only one
    -- side of the #if uses goes under the same #if (NVRTC warns about unused functions).
    local p90, p80 = plan.main, plan.fallback or plan.main
    local function guarded(code, on90, on80)
        if on90 and on80 then return code end
        if on90 then return "#if __CUDA_ARCH__ >= 900\n" .. code .. "\n#endif" end
        if on80 then return "#if __CUDA_ARCH__ < 900\n" .. code .. "\n#endif" end
        return nil
    end
    local helpers = {}
    helpers[#helpers + 1] = guarded(HELPERS.warp, p90.cached, p80.cached)
    helpers[#helpers + 1] = guarded(HELPERS.online, not p90.cached, not p80.cached)
    if C > 1 then helpers[#helpers + 1] = HELPERS.cluster end

    if NW > 1 then
        b.add("__shared__ float kiln_red_max[%d];", NW)
        b.add("__shared__ float kiln_red_sum[%d];", NW)
    end
    if C > 1 then
        b.add("#if __CUDA_ARCH__ >= 900")
        b.add("__shared__ float kiln_slot[2];")
        b.add("const unsigned rank = kiln_cluster_rank();")
        b.add("const unsigned row = blockIdx.x / %du;", C)
        block_row(S, b, plan.main, NW)
        b.add("#else")
        b.add("/* No clusters: the first block of each row's %d does the whole row. */", C)
        b.add("if (blockIdx.x %% %du != 0)", C)
        b.add("    return;")
        b.add("const unsigned row = blockIdx.x / %du;", C)
        block_row(S, b, plan.fallback, NW)
        b.add("#endif")
    else
        b.add("const unsigned row = blockIdx.x;")
        block_row(S, b, plan.main, NW)
    end
    return grid, T, C, helpers
end

-- ---- the template -------------------------------------------------------------------------

return function(k)
    local S = node_of(k)
    local op, dst, a, mask, sinks, n = S.op, S.dst, S.a, S.mask, S.sinks, S.n

    local ptrs = { ptr(S, dst, "out", false), ptr(S, a, "in_a", true) }
    if mask then ptrs[#ptrs + 1] = ptr(S, mask, "in_m", true) end
    if sinks then ptrs[#ptrs + 1] = ptr(S, sinks, "in_s", true) end
    local notes = operand_notes(S)

    local b = builder()
    b.push()
    for _, p in ipairs(ptrs) do b.add(p) end
    dyn_setup(S, b, notes)
    local grid, block, cluster, helpers
    if S.plan.kind == "team" then
        grid, block = team_kernel(S, b, notes)
        cluster, helpers = 1, { HELPERS.warp }
    else
        grid, block, cluster, helpers = block_kernel(S, b, notes)
    end

    local name = op .. "_" .. a.type .. "_" .. n
    if S.isdyn then name = name .. "_dyn" end
    if mask then name = name .. "_m" .. mask.type end
    if S.alibi then name = name .. "_alibi" end
    if sinks then name = name .. "_sinks" end
    if #name > 63 then name = name:sub(1, 63) end
    local plist = param_list(S)
    local plines = table.concat(plist, ", ")
    if #plines + #name > 80 then plines = "\n    " .. table.concat(plist, ",\n    ") end
    local source = kernel {
        name = name, op = op, n = n, nrows = S.nrows, dst = dst, dims = dims, notes = notes,
        pre = (S.pre.code():gsub("\n$", "")), types = S.types, helpers = helpers, cluster = cluster,
        block = block, attr = cluster > 1 and "KILN_CLUSTER_DIMS " or "", params = plines, body = b.lines,
    }
    return { name = name, source = source, grid = { grid, 1, 1 }, block = { block, 1, 1 }, smem = 0,
             dynamic = S.isdyn or nil }
end
