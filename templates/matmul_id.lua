-- matmul_id: the kernel template of mul_mat_id (ggml_mul_mat_id: mixture-of-experts matmul);
-- docs/templates.md describes the table k, docs/ops-matmul-id.md the semantics and designs.
--
--   as [K, M, E] (f32, f16, bf16, or quantized: qgemv_id and quant_id at the end; rows
--   contiguous), b f32 [K, B1, T] (any strides), ids i32 [U, T] (any strides), dst f32 [M, U, T]:
--   dst[:, u, t] = as[:, :, ids[u, t]] · b[:, u % B1, t]; an id outside [0, E) gives zeros.
--
-- Two designs, chosen from the static T:
--
-- * gemv (T <= GEMV_MAX_T, decode): one launch, grid (row tiles, U, T). Each block reads its
--   slot's id from device memory and runs a GEMV over that expert's rows only: one warp per
--   RW rows, 16-byte weight loads (L1 bypassed) issued in groups before their FMAs, b read
--   from L1, a shuffle reduction per row. Only the selected experts' rows are read.
--
-- * grouped (prefill): three pieces of scratch and two launches.
--   1. prep: block 0 sorts the (token, slot) pairs by expert (shared-memory counts, a block
--      scan, a scatter by atomics) into a list, with per-expert offsets and a work list of
--      (expert, chunk of at most BN pairs) items; invalid ids go to an extra bucket E. The other
--      blocks convert b's B1*T rows into a packed, zero-padded copy: the weight's 16-bit type
--      for the tensor-core kernel (b is rounded to it, as ggml's cuBLAS path does), f32 for the
--      FMA kernel.
--   2. main: grid (work items, row tiles), sized for the worst case (min(E+1, N) + N/BN items
--      for N = U*T pairs); blocks past the real item count exit at once. A block reads its
--      expert's BM x K weight tile once for up to BN tokens:
--        - mma: 16-bit weights whose rows are 16-byte aligned; a cp.async pipeline (4 stages
--          of 128 rows, or 6 of 64 rows when K <= 1024) of (BM + BN) x 64 tiles in swizzled
--          shared memory, ldmatrix and mma.sync.m16n8k16 with f32 accumulation; 8 warps. BN
--          (16 .. 128 tokens) fits 1.5 times the mean pairs per expert.
--        - fma: f32 weights, or 16-bit ones not 16-byte aligned; 64 x 32 tiles, 4 x 2 outputs
--          per thread, plain f32 FMA.
--      Items of bucket E write zeros. The order inside an expert's list depends on atomics, but
--      every output element is the same sum whatever its place in a tile, so results are
--      identical run to run.

local quant = require("quant")
local kit = require("kit")
local tpl = require("tpl")
local prelude = require("prelude")

local SIZE = { f32 = 4, f16 = 2, bf16 = 2 }
local INT_MAX = 2147483647

local GEMV_MAX_T = 4        -- tokens up to which each (slot, token) gets its own GEMV
local GEMV_WARPS = 4        -- warps per GEMV block
local GEMV_ROW_BYTES = 4096 -- a warp takes rows until it has about this many weight bytes
local GEMV_MAX_ROWS = 4
local GEMV_MIN_WARPS = 8192 -- ... unless that leaves fewer warps than this (64 per SM, 132 SMs)
local GEMV_LOADS = 8        -- vector loads per lane issued before their FMAs

local PREP_THREADS = 1024
local PACK_MAX_BLOCKS = 1024
local MAX_EXPERTS = 4096    -- the route block keeps two ints per expert in shared memory
local ROUTE_REGS = 16       -- pairs per route thread kept in registers (N <= 16384), else ids read twice

local MMA_BK, MMA_THREADS = 64, 256
local MMA_BM, MMA_STAGES = 128, 4             -- weight rows per tile, pipeline depth
local MMA_SHORT_K = 1024                      -- rows of at most this K (and tiles of 32+ tokens):
local MMA_BM_SHORT, MMA_STAGES_SHORT = 64, 6  -- ... 64-row tiles, 6 stages (2 blocks per SM)
local CP_HINT = ".L2::256B" -- L2 prefetch qualifier of the weight copies ("", ".L2::128B", ".L2::256B")
local FMA_BM, FMA_BN, FMA_BK, FMA_THREADS = 64, 32, 32, 256

local fail = kit.failer("matmul_id")

local dims = kit.dims

local ceil_div = kit.ceil_div

local align = kit.round_up

local check_ref = kit.ref_checker(fail)

-- A list of lines with an indentation level (as softmax.lua's).
local function builder() return kit.builder("    ") end

-- 64-bit C literal of an element offset or stride.
local ll = kit.ll

-- ---- the problem -------------------------------------------------------------------------------

-- Symbolic dims (docs/templates.md: ref.dyn, k.dims): only the token count T (b dim 2 = ids dim 1
-- = dst dim 2) may be symbolic; the plan is chosen from its maximum and the kernels read the
-- run-time value (p.dT, a C expression) from kdims. Anything else symbolic is refused.
local function dyn_tokens(k, p)
    local function dy(r, d) return r and r.dyn and r.ne[d] > 1 and r.dyn[d] or nil end
    local function name(r, d) return (r.sym and r.sym[d]) or r.dyn[d] end
    local want = { [p.b] = 3, [p.ids] = 2, [p.dst] = 3 }
    local refs = { { p.as, "as" }, { p.b, "b" }, { p.ids, "ids" }, { p.dst, "dst" } }
    if p.pa then refs[#refs + 1] = { p.pa, "pair" } end
    p.dT = dy(p.b, 3)
    for _, rw in ipairs(refs) do
        local r, w = rw[1], rw[2]
        for d = 1, 4 do
            local x = dy(r, d)
            if x and d ~= want[r] then
                fail("symbolic dim '%s' in %s's dim %d: only the tokens (b dim 2, ids dim 1, dst dim 2) may be symbolic", name(r, d), w, d - 1)
            end
            if d == want[r] and x ~= p.dT then
                fail("the tokens of %s (dim %d) and b (dim 2) are not symbolic alike (not supported)", w, d - 1)
            end
        end
    end
    if k.epilogue then require("epilogue").check_dyn(k, fail) end
    p.kdims = k.dims and #k.dims > 0
end

local AS_TYPES = { f32 = true, f16 = true, bf16 = true }
local AS_QTYPES = { f32 = true, f16 = true, bf16 = true }
for t in pairs(quant.TYPES) do AS_QTYPES[t] = true end

-- Checks k and gathers the shapes, strides and parameters every kernel needs (`quantized`:
-- as may be of a quantized type, for the fused quantized GEMV).
local function problem(k, quantized)
    if k.kind ~= "op" or k.op ~= "mul_mat_id" then fail("node is not mul_mat_id (%s %s)", tostring(k.kind), tostring(k.op)) end
    local args = k.args or {}
    local as, b, ids, dst = args.as, args.b, args.ids, k.dst
    -- With an epilogue dst is the epilogue's (any type and layout, stored through ep_lines): the
    -- shapes are checked against its space as an f32 product.
    if k.epilogue then dst = { type = "f32", ne = dst.ne, st = { 1, dst.st[2], dst.st[3], dst.st[4] }, offs = dst.offs, param = dst.param, dyn = dst.dyn, sym = dst.sym } end
    check_ref(as, "as", quantized and AS_QTYPES or AS_TYPES)
    check_ref(b, "b", { f32 = true })
    check_ref(ids, "ids", { i32 = true })
    check_ref(dst, "dst", { f32 = true })
    local p = {
        as = as, b = b, ids = ids, dst = dst, W = as.type,
        K = as.ne[1], M = as.ne[2], E = as.ne[3], B1 = b.ne[2], T = b.ne[3], U = ids.ne[1],
        nparams = k.nparams, pa = k.pair, scratch_dst = k.scratch_dst, k = k,
    }
    -- The scratch of the prefill plan, after the products' regions in the epilogue fallback.
    local base = k.scratch_base or 0
    p.S = base > 0 and string.format("(p%d + %d)", k.nparams, base) or "p" .. k.nparams
    p.base = base
    if p.pa then
        check_ref(p.pa, "pair", { [as.type] = true })
        for d = 1, 4 do
            if p.pa.ne[d] ~= as.ne[d] then fail("pair ne %s differs from as ne %s", dims(p.pa.ne), dims(as.ne)) end
        end
        if p.pa.st[1] ~= 1 then fail("the pair's rows must be contiguous (st0 = %d)", p.pa.st[1]) end
    end
    if as.ne[4] ~= 1 or b.ne[4] ~= 1 or ids.ne[3] ~= 1 or ids.ne[4] ~= 1 then fail("as, b must be 3-D and ids 2-D") end
    if b.ne[1] ~= p.K then fail("b ne0 %d differs from as ne0 %d", b.ne[1], p.K) end
    if ids.ne[2] ~= p.T then fail("ids ne1 %d differs from b ne2 %d", ids.ne[2], p.T) end
    if p.U % p.B1 ~= 0 then fail("b ne1 %d does not divide ids ne0 %d", p.B1, p.U) end
    if dst.ne[1] ~= p.M or dst.ne[2] ~= p.U or dst.ne[3] ~= p.T or dst.ne[4] ~= 1 then
        fail("dst ne %s is not [%d, %d, %d, 1]", dims(dst.ne), p.M, p.U, p.T)
    end
    if as.st[1] ~= 1 then fail("as rows must be contiguous (st0 = %d)", as.st[1]) end
    if dst.st[1] ~= 1 then fail("dst rows must be contiguous (st0 = %d)", dst.st[1]) end
    p.N = p.U * p.T
    dyn_tokens(k, p)
    if p.N > INT_MAX // 2 or p.M > INT_MAX // 2 or p.K > INT_MAX // 2 then fail("sizes out of range") end
    -- (an epilogue's operands and the paired weight are parameters of their own)
    for i = 0, k.nparams - 1 do
        if i ~= dst.param and i ~= as.param and i ~= b.param and i ~= ids.param and not (k.epilogue or k.scratch_dst) then
            fail("stray parameter p%d", i)
        end
    end
    return p
end

-- Kernel parameter list: p0 (dst) writable, the others read-only, plus the scratch, plus the
-- run-time extents of symbolic dims (last).
local function param_list(p, scratch)
    if p.scratch_dst then scratch = true end
    local l = {}
    for i = 0, p.nparams - 1 do
        l[#l + 1] = (i == p.dst.param and "char" or "const char") .. " *__restrict__ p" .. i
    end
    if scratch then l[#l + 1] = "char *__restrict__ p" .. p.nparams end
    if p.kdims then l[#l + 1] = "const int* __restrict__ kdims" end
    return "\n    " .. table.concat(l, ",\n    ")
end

-- "T *const var = (T *)pN + offs;"
local function ptr(r, var, ctype, const) return kit.pointer(r, var, ctype, const, ll) end

local function layout_note(r, what)
    return string.format("%-4s p%d %-4s ne %s st %s offs %d", what, r.param, r.type, dims(r.ne), dims(r.st), r.offs)
end

local function notes_of(p)
    return {
        layout_note(p.dst, "dst"), layout_note(p.as, "as"), layout_note(p.b, "b"), layout_note(p.ids, "ids"),
        string.format("K %d, M %d, %d experts, %d used per token (b broadcast over %d), %d tokens", p.K, p.M, p.E,
            p.U, p.B1, p.T),
    }
end

-- The term "(expr) * st" of an index, dropped where the extent is 1.
local function term(expr, n, st)
    if n == 1 or st == 0 then return nil end
    if st == 1 then return "(long long)(" .. expr .. ")" end
    return "(long long)(" .. expr .. ") * " .. ll(st)
end

local function sum_terms(...)
    local l = {}
    for i = 1, select("#", ...) do
        local t = select(i, ...)
        if t then l[#l + 1] = t end
    end
    if #l == 0 then return "0" end
    return table.concat(l, " + ")
end

-- The expression of ids[u, t].
local function id_expr(p, u, t)
    return "ids[" .. sum_terms(term(u, p.U, p.ids.st[1]), term(t, p.T, p.ids.st[2])) .. "]"
end

-- The element offset of b's row (v, t), v < B1.
local function brow_expr(p, v, t)
    return sum_terms(term(v, p.B1, p.b.st[2]), term(t, p.T, p.b.st[3]))
end

-- The element offset of dst's column (u, t).
local function dcol_expr(p, u, t)
    return sum_terms(term(u, p.U, p.dst.st[2]), term(t, p.T, p.dst.st[3]))
end

-- The largest of `widths` dividing every value of `vals`.
local function widest(widths, vals)
    for _, w in ipairs(widths) do
        local ok = true
        for _, v in ipairs(vals) do if v % w ~= 0 then ok = false end end
        if ok then return w end
    end
    return 1
end

-- b read V elements at a time along K: the float vector width (4, 2 or 1) its rows allow.
local function b_width(p, v)
    if p.b.st[1] ~= 1 then return 1 end
    local vals = { v, p.b.offs }
    if p.B1 > 1 then vals[#vals + 1] = p.b.st[2] end
    if p.T > 1 then vals[#vals + 1] = p.b.st[3] end
    return widest({ 4, 2, 1 }, vals)
end

-- Statements loading n (a multiple of xv) floats of b's row `row` from element k into xs[0..n).
local function load_b(bl, p, row, k, n, xv, xs)
    for q = 0, n - 1, xv do
        if xv == 4 then
            bl.add("{ const float4 v4 = *(const float4 *)(%s + %s + %d); %s[%d] = v4.x; %s[%d] = v4.y; %s[%d] = v4.z; %s[%d] = v4.w; }",
                row, k, q, xs, q, xs, q + 1, xs, q + 2, xs, q + 3)
        elseif xv == 2 then
            bl.add("{ const float2 v2 = *(const float2 *)(%s + %s + %d); %s[%d] = v2.x; %s[%d] = v2.y; }", row, k, q, xs, q, xs, q + 1)
        else
            local idx = q == 0 and k or string.format("%s + %d", k, q)
            if p.b.st[1] ~= 1 then idx = string.format("(long long)(%s) * %s", idx, ll(p.b.st[1])) end
            bl.add("%s[%d] = %s[%s];", xs, q, row, idx)
        end
    end
end

-- The source of a mul_mat_id kernel (kit.kernel with this family's head).
local function source(t)
    t.head = { "kiln mul_mat_id kernel " .. t.name, t.what }
    t.blocks, t.inline, t.body = t.helpers, true, { t.body }
    return kit.kernel(t)
end

-- ---- epilogues (k.epilogue and k.pair; docs/templates.md, "Epilogues"): templates/epilogue.lua

local epilogue = require("epilogue")
local ep_lines, ep_body, EP_BLOCK = epilogue.store_lines, epilogue.step_body, epilogue.STEP_BLOCK

-- ---- decode: one GEMV per (slot, token) ----------------------------------------------------------

-- Vector types of a weight load of vb bytes: the loaded words and how to load them.
local function wload_helpers(vb)
    if vb == 16 then
        return [[
/* 16 bytes of weights, read once: no L1 allocation. */
static __device__ __forceinline__ uint4 kiln_ldw(const void *p)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}]]
    end
    return nil
end

local WORDS = { "x", "y", "z", "w" }

-- The f32 value of element q of a weight vector `v` (vb bytes, type W) as an expression.
local function welem(pre, W, vb, v, q)
    if vb == 2 then return pre.load(W, v) end
    local word
    if vb == 4 then word = v else word = v .. "." .. WORDS[(q * SIZE[W]) // 4 + 1] end
    if W == "f32" then return "__uint_as_float(" .. word .. ")" end
    local hi = q % 2 == 1
    if W == "bf16" then
        return hi and ("__uint_as_float(" .. word .. " & 0xffff0000u)") or ("__uint_as_float(" .. word .. " << 16)")
    end
    return pre.load("f16", hi and ("(unsigned short)(" .. word .. " >> 16)") or ("(unsigned short)(" .. word .. " & 0xffffu)"))
end

-- The GEMVs' slot u (grid y) and token t (grid z) of the block, tokens past a symbolic count
-- returning, and the slot's expert e.
local function slot_expert(bl, p)
    if p.U > 1 then bl.add("const unsigned u = blockIdx.y;") end
    if p.T > 1 then bl.add("const unsigned t = blockIdx.z;") end
    if p.dT then
        bl.add("if (t >= (unsigned)(%s)) /* tokens past the run-time count */", p.dT)
        bl.add("    return;")
    end
    bl.add("const int e = %s;", id_expr(p, "u", "t"))
end

local function gemv(p)
    local W, es = p.W, SIZE[p.W]
    local as = p.as
    -- Elements per weight load: up to 16 bytes, as far as K and every row start allow.
    local wvals = { p.K, as.offs, as.st[2] }
    if p.E > 1 then wvals[#wvals + 1] = as.st[3] end
    local pa = p.pa -- paired (mul_mat_glu): the same rows of a second weight, same loads of b
    if pa then
        wvals[#wvals + 1] = pa.offs
        wvals[#wvals + 1] = pa.st[2]
        if p.E > 1 then wvals[#wvals + 1] = pa.st[3] end
    end
    local NW = pa and 2 or 1
    local V = widest({ 16 // es, 8 // es, 4 // es, 2 // es, 1 }, wvals)
    if V < 1 then V = 1 end
    local vb = V * es
    local XV = b_width(p, V)
    local NVK = p.K // V
    local ITER = ceil_div(NVK, 32)
    local RW = math.max(1, math.min(GEMV_MAX_ROWS, GEMV_ROW_BYTES // (p.K * es)))
    while RW > 1 and ceil_div(p.M, RW) * p.U * p.T < GEMV_MIN_WARPS do RW = RW // 2 end
    local G = math.max(1, math.min(ITER, GEMV_LOADS // (RW * NW)))
    local NG = ceil_div(ITER, G)
    local rows_per_block = GEMV_WARPS * RW
    local gx = ceil_div(p.M, rows_per_block)
    if p.U > 65535 or p.T > 65535 then fail("gemv: %d slots x %d tokens exceed the grid", p.U, p.T) end

    local vt = ({ [16] = "uint4", [8] = "uint2", [4] = "unsigned", [2] = "unsigned short" })[vb]
    local wct = prelude.ctype[W]
    local bl = builder()
    local ep = p.k.epilogue
    if not ep then bl.add(ptr(p.dst, "out", "float", false)) end
    bl.add(ptr(as, "wa", wct, true))
    if pa then bl.add(ptr(pa, "wpa", wct, true)) end
    bl.add(ptr(p.b, "xb", "float", true))
    bl.add(ptr(p.ids, "ids", "int", true))
    bl.add("const unsigned lane = threadIdx.x & 31u;")
    bl.add("const unsigned row0 = (blockIdx.x * %du + (threadIdx.x >> 5)) * %du;", GEMV_WARPS, RW)
    if p.M % rows_per_block ~= 0 then
        bl.add("if (row0 >= %du)", p.M)
        bl.add("    return;")
    end
    slot_expert(bl, p)
    if not ep then bl.add("float *const o = out + %s + row0;", dcol_expr(p, "u", "t")) end
    -- The dst coordinates (row, slot, token) of row expression r, for the epilogue.
    local function coords(r)
        return { r, p.U > 1 and "u" or nil, p.T > 1 and "t" or nil }
    end
    local pre = prelude.new()
    bl.add("if ((unsigned)e >= %du) { /* no such expert: a zero row, nothing read */", p.E)
    bl.push()
    if RW == 1 then
        bl.add("if (lane == 0)")
    else
        bl.add("if (lane < %du%s)", RW, p.M % RW ~= 0 and string.format(" && row0 + lane < %du", p.M) or "")
    end
    if ep then
        local zeros = pa and { "0.0f", "0.0f" } or { "0.0f" }
        bl.push()
        for _, l in ipairs(ep_lines(p.k, pre, coords(RW == 1 and "row0" or "row0 + lane"), zeros)) do bl.add("%s", l) end
        bl.pop()
    else
        bl.add("    o[%s] = 0.0f;", RW == 1 and "0" or "lane")
    end
    bl.add("return;")
    bl.pop()
    bl.add("}")
    bl.add("const %s *const w = wa + (long long)e * %s + (long long)row0 * %s;", wct, ll(as.st[3]), ll(as.st[2]))
    if pa then bl.add("const %s *const wp = wpa + (long long)e * %s + (long long)row0 * %s;", wct, ll(pa.st[3]), ll(pa.st[2])) end
    local vidx = p.B1 == 1 and "0" or (p.B1 == p.U and "u" or string.format("u %% %du", p.B1))
    bl.add("const float *const x = xb + %s;", brow_expr(p, vidx, "t"))
    -- Accumulators acc0.. of the rows of as, then (paired) accRW.. of the same rows of the pair.
    local NR = RW * NW
    local acc = {}
    for r = 0, NR - 1 do acc[#acc + 1] = "acc" .. r .. " = 0.0f" end
    bl.add("float %s;", table.concat(acc, ", "))
    -- Rows past M (M % RW != 0) are not loaded; their sums stay 0 and are not stored.
    local function row_ok(r)
        if r == 0 or p.M % RW == 0 then return nil end
        return string.format("row0 + %du < %du", r, p.M)
    end
    local full = NG * G * 32 == NVK
    if NG > 1 then
        bl.add("#pragma unroll 1")
        bl.add("for (unsigned g = 0; g < %du; g++) {", NG)
        bl.push()
    else
        bl.add("{")
        bl.push()
        bl.add("const unsigned g = 0;")
    end
    bl.add("%s wv[%d][%d];", vt, NR, G)
    bl.add("#pragma unroll")
    bl.add("for (unsigned i = 0; i < %du; i++) {", G)
    bl.push()
    bl.add("const unsigned j = (g * %du + i) * 32u + lane;", G)
    if not full then bl.add("if (j < %du) {", NVK) bl.push() end
    for r = 0, NR - 1 do
        local rr, wr = r % RW, r < RW and as or pa
        local src = string.format("%s + %s(long long)j * %d", r < RW and "w" or "wp", rr > 0 and (ll(rr * wr.st[2]) .. " + ") or "", V)
        local ld = vb == 16 and ("kiln_ldw(" .. src .. ")") or string.format("*(const %s *)(%s)", vt, src)
        local ok = row_ok(rr)
        if ok then
            bl.add("if (%s)", ok)
            bl.add("    wv[%d][i] = %s;", r, ld)
            bl.add("else")
            bl.add("    wv[%d][i] = %s;", r, ({ [16] = "make_uint4(0u, 0u, 0u, 0u)", [8] = "make_uint2(0u, 0u)", [4] = "0u", [2] = "(unsigned short)0" })[vb])
        else
            bl.add("wv[%d][i] = %s;", r, ld)
        end
    end
    if not full then bl.pop() bl.add("}") end
    bl.pop()
    bl.add("}")
    bl.add("#pragma unroll")
    bl.add("for (unsigned i = 0; i < %du; i++) {", G)
    bl.push()
    bl.add("const unsigned j = (g * %du + i) * 32u + lane;", G)
    if not full then bl.add("if (j < %du) {", NVK) bl.push() end
    bl.add("float xs[%d];", V)
    load_b(bl, p, "x", string.format("j * %du", V), V, XV, "xs")
    for r = 0, NR - 1 do
        for q = 0, V - 1 do
            bl.add("acc%d = fmaf(%s, xs[%d], acc%d);", r, welem(pre, W, vb, string.format("wv[%d][i]", r), q), q, r)
        end
    end
    if not full then bl.pop() bl.add("}") end
    bl.pop()
    bl.add("}")
    bl.pop()
    bl.add("}")
    for r = 0, NR - 1 do
        bl.add("#pragma unroll")
        bl.add("for (int s = 16; s > 0; s >>= 1)")
        bl.add("    acc%d += __shfl_xor_sync(0xffffffffu, acc%d, s);", r, r)
    end
    bl.add("if (lane == 0) {")
    bl.push()
    for r = 0, RW - 1 do
        local ok = row_ok(r)
        if ep then
            if ok then bl.add("if (%s)", ok) end
            local vals = pa and { "acc" .. r, "acc" .. (r + RW) } or { "acc" .. r }
            for _, l in ipairs(ep_lines(p.k, pre, coords(r == 0 and "row0" or string.format("row0 + %du", r)), vals)) do
                bl.add("%s%s", ok and "    " or "", l)
            end
        else
            bl.add("%so[%d] = acc%d;", ok and ("if (" .. ok .. ") ") or "", r, r)
        end
    end
    bl.pop()
    bl.add("}")

    local name = string.format("mul_mat_id_gemv%s_%s_k%d_m%d_u%d", pa and "_pair" or (ep and "_ep" or ""), W, p.K, p.M, p.U)
    local notes = notes_of(p)
    notes[#notes + 1] = string.format("grid (%d, %d, %d) of %d warps; %d row%s per warp; loads of %d bytes (%d per lane before the FMAs); b %s",
        gx, p.U, p.T, GEMV_WARPS, RW, RW == 1 and "" or "s", vb, G * RW,
        XV > 1 and string.format("as float%d", XV) or "element by element")
    if pa then notes[#notes + 1] = "paired: the same rows of the second weight (wpa) against the same b; the epilogue stores" end
    if ep and not pa then notes[#notes + 1] = "epilogue at the store" end
    local helpers = {}
    helpers[#helpers + 1] = wload_helpers(vb)
    local src = source {
        name = name, what = "decode: one GEMV over the selected expert's rows per (slot, token)", notes = notes,
        pre = (pre.code():gsub("\n$", "")), helpers = helpers, threads = GEMV_WARPS * 32,
        params = param_list(p, false), body = bl.text(),
    }
    return { name = name, source = src, grid = { gx, p.U, p.T }, block = { GEMV_WARPS * 32, 1, 1 }, smem = 0 }
end

-- ---- prefill: route, pack, grouped kernels --------------------------------------------------------

-- The scratch layout (byte offsets, 256-aligned sections) for tiles of BN pairs, packed rows of
-- kp elements of `pt`.
local function scratch_layout(p, bn, kp, pt)
    local s = { BN = bn, KP = kp, PT = pt }
    s.E1 = p.E + 1                                    -- buckets: experts, then invalid ids
    s.WMAX = math.min(s.E1, p.N) + p.N // bn          -- an upper bound of the work items
    s.R = p.B1 * p.T                                  -- packed rows of b
    local at = 256                                    -- [0]: the number of work items
    s.OFF = at;  at = at + align(4 * (s.E1 + 1), 256) -- bucket offsets into the list
    s.WORK = at; at = at + align(8 * s.WMAX, 256)     -- (bucket, first list index) per item
    s.LIST = at; at = at + align(4 * p.N, 256)        -- j = t * U + u, grouped by bucket
    s.PACK = at; at = at + align(s.R * kp * SIZE[pt], 256)
    s.bytes = at
    return s
end

-- Step 1: block 0 routes, the other blocks pack b.
local function prep(p, s)
    local pre = prelude.new()
    local bl = builder()
    local E1, N, U = s.E1, p.N, p.U
    local per = ceil_div(E1, PREP_THREADS)
    local kp8 = s.KP // 8
    local total = s.R * kp8
    local pb = math.max(1, math.min(PACK_MAX_BLOCKS, ceil_div(total, PREP_THREADS)))
    local S = p.S
    bl.add(ptr(p.ids, "ids", "int", true))
    bl.add(ptr(p.b, "xb", "float", true))
    bl.add("if (blockIdx.x == 0) {")
    bl.push()
    bl.add("/* Route: count pairs per bucket, scan, write offsets and work items, scatter. */")
    bl.add("__shared__ int s_cnt[%d], s_cur[%d], s_tot[2][32];", E1, E1)
    bl.add("int *const off = (int *)(%s + %d);", S, s.OFF)
    bl.add("int2 *const work = (int2 *)(%s + %d);", S, s.WORK)
    bl.add("int *const list = (int *)(%s + %d);", S, s.LIST)
    bl.add("const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;")
    bl.add("for (int i = tid; i < %d; i += %d)", E1, PREP_THREADS)
    bl.add("    s_cnt[i] = 0;")
    -- Pair j = tid + q * threads: its bucket stays in a register from the count to the scatter
    -- when a thread has at most ROUTE_REGS pairs; the loads are all issued before any atomic.
    local npt = ceil_div(N, PREP_THREADS)
    local keep = npt <= ROUTE_REGS
    local jfull = N % PREP_THREADS == 0
    local nlim = tostring(N) -- pairs (run time)
    if p.dT then
        -- Symbolic T: only the run-time pairs j < U * T are routed (the rest of ids is not read).
        bl.add("const int kiln_n = %s(int)(%s); /* run-time pairs */", U > 1 and U .. " * " or "", p.dT)
        nlim = "kiln_n"
    end
    local function jcond(q)
        if p.dT then return string.format("tid + %d < kiln_n", q * PREP_THREADS) end
        if jfull or (q + 1) * PREP_THREADS <= N then return nil end
        return string.format("tid + %d < %d", q * PREP_THREADS, N)
    end
    if keep then
        bl.add("int bk[%d];", npt)
        for q = 0, npt - 1 do
            local c = jcond(q)
            bl.add("bk[%d] = %skiln_bucket(ids, tid + %d)%s;", q, c and ("(" .. c .. ") ? ") or "", q * PREP_THREADS,
                c and " : -1" or "")
        end
        bl.add("__syncthreads();")
        bl.add("#pragma unroll")
        bl.add("for (int q = 0; q < %d; q++)", npt)
        bl.add("    if (bk[q] >= 0)")
        bl.add("        atomicAdd(&s_cnt[bk[q]], 1);")
    else
        bl.add("__syncthreads();")
        bl.add("for (int j = tid; j < %s; j += %d)", nlim, PREP_THREADS)
        bl.add("    atomicAdd(&s_cnt[kiln_bucket(ids, j)], 1);")
    end
    bl.add("__syncthreads();")
    bl.add("/* Thread tid owns buckets [tid * %d, tid * %d + %d): pairs and work items, scanned. */", per, per, per)
    bl.add("int c_own = 0, w_own = 0;")
    bl.add("#pragma unroll")
    bl.add("for (int q = 0; q < %d; q++) {", per)
    bl.add("    const int i = tid * %d + q;", per)
    bl.add("    const int c = i < %d ? s_cnt[i] : 0;", E1)
    bl.add("    c_own += c;")
    bl.add("    w_own += (c + %d) / %d;", s.BN - 1, s.BN)
    bl.add("}")
    bl.add("int c_inc = c_own, w_inc = w_own;")
    bl.add("#pragma unroll")
    bl.add("for (int o = 1; o < 32; o <<= 1) {")
    bl.add("    const int c = __shfl_up_sync(0xffffffffu, c_inc, o), w = __shfl_up_sync(0xffffffffu, w_inc, o);")
    bl.add("    if (lane >= o) {")
    bl.add("        c_inc += c;")
    bl.add("        w_inc += w;")
    bl.add("    }")
    bl.add("}")
    bl.add("if (lane == 31) {")
    bl.add("    s_tot[0][warp] = c_inc;")
    bl.add("    s_tot[1][warp] = w_inc;")
    bl.add("}")
    bl.add("__syncthreads();")
    bl.add("if (warp == 0) {")
    bl.add("    int c = lane < %d ? s_tot[0][lane] : 0, w = lane < %d ? s_tot[1][lane] : 0;", PREP_THREADS // 32, PREP_THREADS // 32)
    bl.add("#pragma unroll")
    bl.add("    for (int o = 1; o < 32; o <<= 1) {")
    bl.add("        const int c2 = __shfl_up_sync(0xffffffffu, c, o), w2 = __shfl_up_sync(0xffffffffu, w, o);")
    bl.add("        if (lane >= o) {")
    bl.add("            c += c2;")
    bl.add("            w += w2;")
    bl.add("        }")
    bl.add("    }")
    bl.add("    s_tot[0][lane] = c;")
    bl.add("    s_tot[1][lane] = w;")
    bl.add("}")
    bl.add("__syncthreads();")
    bl.add("int cb = c_inc - c_own + (warp > 0 ? s_tot[0][warp - 1] : 0);")
    bl.add("int wb = w_inc - w_own + (warp > 0 ? s_tot[1][warp - 1] : 0);")
    bl.add("#pragma unroll")
    bl.add("for (int q = 0; q < %d; q++) {", per)
    bl.add("    const int i = tid * %d + q;", per)
    bl.add("    if (i < %d) {", E1)
    bl.add("        const int c = s_cnt[i], nch = (c + %d) / %d;", s.BN - 1, s.BN)
    bl.add("        off[i] = cb;")
    bl.add("        s_cur[i] = cb;")
    bl.add("        for (int ch = 0; ch < nch; ch++)")
    bl.add("            work[wb + ch] = make_int2(i, cb + ch * %d);", s.BN)
    bl.add("        cb += c;")
    bl.add("        wb += nch;")
    bl.add("    }")
    bl.add("}")
    bl.add("if (tid == %d) {", PREP_THREADS - 1)
    bl.add("    off[%d] = cb; /* == %s */", E1, p.dT and "the run-time pairs" or tostring(N))
    bl.add("    *(int *)%s = wb; /* work items */", S)
    bl.add("}")
    bl.add("__syncthreads();")
    if keep then
        bl.add("#pragma unroll")
        bl.add("for (int q = 0; q < %d; q++)", npt)
        bl.add("    if (bk[q] >= 0)")
        bl.add("        list[atomicAdd(&s_cur[bk[q]], 1)] = tid + q * %d;", PREP_THREADS)
    else
        bl.add("for (int j = tid; j < %s; j += %d)", nlim, PREP_THREADS)
        bl.add("    list[atomicAdd(&s_cur[kiln_bucket(ids, j)], 1)] = j;")
    end
    bl.add("return;")
    bl.pop()
    bl.add("}")

    -- Pack: element chunks of 8 of each packed row, zero past K.
    local pct = prelude.ctype[s.PT]
    bl.add("/* Pack b's %d rows (row t * %d + v = b[:, v, t]) as %s, %d elements each, zero past %d. */", s.R, p.B1, s.PT, s.KP, p.K)
    bl.add("%s *const pk = (%s *)(%s + %d);", pct, pct, S, s.PACK)
    local tlim = ll(total)
    if p.dT then tlim = string.format("(long long)(%s) * %d", p.dT, p.B1 * kp8) end -- rows of the run-time tokens
    bl.add("for (long long idx = (long long)(blockIdx.x - 1) * %d + threadIdx.x; idx < %s; idx += (long long)%d) {",
        PREP_THREADS, tlim, (pb) * PREP_THREADS)
    bl.push()
    bl.add("const int r = (int)(idx / %d), c = (int)(idx %% %d);", kp8, kp8)
    if p.B1 == 1 then
        bl.add("const int t = r;")
    else
        bl.add("const int t = r / %d, v = r %% %d;", p.B1, p.B1)
    end
    bl.add("const float *const src = xb + %s;", brow_expr(p, "v", "t"))
    bl.add("const int k0 = c * 8;")
    bl.add("float f[8];")
    local XV = b_width(p, 8)
    if p.K == s.KP then
        load_b(bl, p, "src", "k0", 8, XV, "f")
    else -- the padding past K is written as zeros and never read from b
        bl.add("if (k0 + 8 <= %d) {", p.K)
        bl.push()
        load_b(bl, p, "src", "k0", 8, XV, "f")
        bl.pop()
        bl.add("} else {")
        bl.push()
        bl.add("#pragma unroll")
        bl.add("for (int q = 0; q < 8; q++)")
        local idx = p.b.st[1] == 1 and "k0 + q" or string.format("(long long)(k0 + q) * %s", ll(p.b.st[1]))
        bl.add("    f[q] = k0 + q < %d ? src[%s] : 0.0f;", p.K, idx)
        bl.pop()
        bl.add("}")
    end
    local dstp = string.format("pk + (long long)r * %d + k0", s.KP)
    if s.PT == "f32" then
        bl.add("*(float4 *)(%s) = make_float4(f[0], f[1], f[2], f[3]);", dstp)
        bl.add("*(float4 *)(%s + 4) = make_float4(f[4], f[5], f[6], f[7]);", dstp)
    else
        local h = {}
        for q = 0, 7 do h[q + 1] = pre.store(s.PT, "f[" .. q .. "]") end
        local words = {}
        for q = 0, 3 do
            words[q + 1] = string.format("(unsigned)%s | ((unsigned)%s << 16)", h[2 * q + 1], h[2 * q + 2])
        end
        bl.add("*(uint4 *)(%s) = make_uint4(%s);", dstp, table.concat(words, ",\n        "))
    end
    bl.pop()
    bl.add("}")

    local bucket = string.format([[
/* The bucket of pair j = t * %d + u: its expert, or %d for an id outside [0, %d). */
static __device__ __forceinline__ int kiln_bucket(const int *ids, int j)
{
    %s
    const int e = %s;
    return (unsigned)e < %du ? e : %d;
}]], U, p.E, p.E, U == 1 and "const int t = j;" or string.format("const int t = j / %d, u = j - t * %d;", U, U),
        id_expr(p, "u", "t"), p.E, p.E)
    local name = string.format("mul_mat_id_prep_%s_u%d_t%d_e%d", s.PT, p.U, p.T, p.E)
    local notes = notes_of(p)
    notes[#notes + 1] = string.format("grid %d x %d threads: block 0 routes %d pairs into %d buckets (tiles of %d), %d blocks pack b",
        1 + pb, PREP_THREADS, N, E1, s.BN, pb)
    notes[#notes + 1] = string.format("scratch p%d: items at 0, offsets at %d, work at %d, list at %d, packed b at %d (%d bytes)",
        p.nparams, s.OFF, s.WORK, s.LIST, s.PACK, s.bytes)
    local src = source {
        name = name, what = "prefill step 1: sort (token, slot) pairs by expert; pack b", notes = notes,
        pre = (pre.code():gsub("\n$", "")), helpers = { bucket }, threads = PREP_THREADS,
        params = param_list(p, true), body = bl.text(),
    }
    return { name = name, source = src, grid = { 1 + pb, 1, 1 }, block = { PREP_THREADS, 1, 1 }, smem = 0 }
end

-- The common head of both main kernels: the work item, its pairs' packed rows and dst columns,
-- and the zero rows of invalid ids. Leaves n (pairs of this item), s_brow, s_dcol, e, m0.
local function main_head(bl, p, s, bm)
    local S = p.S
    bl.add("__shared__ int s_brow[%d];", s.BN)
    bl.add("__shared__ long long s_dcol[%d];", s.BN)
    bl.add(ptr(p.dst, "out", "float", false))
    bl.add("const int item = blockIdx.x;")
    bl.add("if (item >= *(const int *)%s) /* the grid is sized for the worst case */", S)
    bl.add("    return;")
    bl.add("const int2 wk = ((const int2 *)(%s + %d))[item];", S, s.WORK)
    bl.add("const int e = wk.x, first = wk.y;")
    bl.add("const int n = min(%d, ((const int *)(%s + %d))[e + 1] - first);", s.BN, S, s.OFF)
    bl.add("const int m0 = blockIdx.y * %d;", bm)
    bl.add("if (threadIdx.x < %d) {", s.BN)
    bl.push()
    bl.add("int br = -1;")
    bl.add("long long dc = 0;")
    bl.add("if ((int)threadIdx.x < n) {")
    bl.push()
    bl.add("const int j = ((const int *)(%s + %d))[first + threadIdx.x];", S, s.LIST)
    if p.U == 1 then
        bl.add("const int t = j;")
    else
        bl.add("const int t = j / %d, u = j - t * %d;", p.U, p.U)
    end
    bl.add("br = t%s;", p.B1 == 1 and "" or (" * " .. p.B1 .. " + " .. (p.B1 == p.U and "u" or string.format("u %% %d", p.B1))))
    bl.add("dc = %s;", dcol_expr(p, "u", "t"))
    bl.pop()
    bl.add("}")
    bl.add("s_brow[threadIdx.x] = br;")
    bl.add("s_dcol[threadIdx.x] = dc;")
    bl.pop()
    bl.add("}")
    bl.add("__syncthreads();")
    bl.add("if (e == %d) { /* ids outside [0, %d): zero rows */", p.E, p.E)
    bl.push()
    bl.add("for (int i = threadIdx.x; i < n * %d; i += blockDim.x) {", bm)
    bl.add("    const int r = m0 + i %% %d;", bm)
    bl.add("    if (r < %d)", p.M)
    bl.add("        out[s_dcol[i / %d] + r] = 0.0f;", bm)
    bl.add("}")
    bl.add("return;")
    bl.pop()
    bl.add("}")
end

local MMA_HELPERS = [[
static __device__ __forceinline__ unsigned kiln_smem_addr(const void *p)
{
    unsigned r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

/* 16 bytes global -> shared, asynchronously; zeros when n == 0 (nothing is read). */
static __device__ __forceinline__ void kiln_cp16(unsigned dst, const void *src, unsigned n)
{
    asm volatile("cp.async.cg.shared.global@HINT@ [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(n) : "memory");
}

static __device__ __forceinline__ void kiln_cp_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int N>
static __device__ __forceinline__ void kiln_cp_wait()
{
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}

static __device__ __forceinline__ void kiln_ldsm4(unsigned a, unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
}]]

local function mma_helper(W)
    return string.format([[
/* d += a (16x16, row) * b (16x8, col): %s inputs, f32 accumulators. */
static __device__ __forceinline__ void kiln_mma(float *d, const unsigned *a, const unsigned *b)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.%s.%s.f32 {%%0, %%1, %%2, %%3}, {%%4, %%5, %%6, %%7}, "
                 "{%%8, %%9}, {%%0, %%1, %%2, %%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}]], W, W, W)
end

-- The 8 warps of a BM x BN tile as WM x WN warps of (BM/WM) x (BN/WN), each at least 16 x 16:
-- the squarest such warp tile (fewest ldmatrix per mma), taller on ties.
local function warp_grid(bm, bn, nwarps)
    local best
    local wn = 1
    while wn <= nwarps do
        local wm = nwarps // wn
        if bm % (16 * wm) == 0 and bn % (16 * wn) == 0 then
            local tm, tn = bm // wm, bn // wn
            if not best or tm + tn < best.tm + best.tn or (tm + tn == best.tm + best.tn and tm > best.tm) then
                best = { wm = wm, wn = wn, tm = tm, tn = tn }
            end
        end
        wn = wn * 2
    end
    if not best then fail("no warp grid for a %d x %d tile", bm, bn) end
    return best.wm, best.wn
end

-- Step 2, tensor cores: 16-bit weights with 16-byte aligned rows.
local function main_mma(p, s)
    local BM, BN, BK, ST = s.BM, s.BN, MMA_BK, s.ST
    local WM, WN = warp_grid(BM, BN, MMA_THREADS // 32)
    local WTM, WTN = BM // WM, BN // WN
    local MI, NI = WTM // 16, WTN // 8
    local NT = MMA_THREADS
    local stage = (BM + BN) * BK * 2
    local smem = ST * stage
    local NK = ceil_div(p.K, BK)
    local a_chunks, b_chunks = BM * 8, BN * 8
    local A_IT = a_chunks // NT
    local wct = prelude.ctype[p.W]
    local S = p.S
    local bl = builder()
    bl.add("extern __shared__ __align__(128) unsigned char kiln_smem[];")
    main_head(bl, p, s, BM)
    bl.add(ptr(p.as, "wa", wct, true))
    bl.add("const unsigned short *const pk = (const unsigned short *)(%s + %d);", S, s.PACK)
    bl.add("const unsigned short *const w = (const unsigned short *)(wa + (long long)e * %s);", ll(p.as.st[3]))
    bl.add("const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;")
    bl.add("const unsigned sbase = kiln_smem_addr(kiln_smem);")
    bl.add("/* Each thread copies %d 16-byte chunks of the weight tile and %s of the b tile per stage; a row of",
        A_IT, b_chunks >= NT and tostring(b_chunks // NT) or "at most 1")
    bl.add("   64 elements is 8 chunks, stored at chunk c ^ (row & 7) (conflict-free ldmatrix). */")
    bl.add("const unsigned short *a_src[%d];", A_IT)
    bl.add("unsigned a_dst[%d], a_n[%d];", A_IT, A_IT)
    bl.add("#pragma unroll")
    bl.add("for (int i = 0; i < %d; i++) {", A_IT)
    bl.add("    const int id = tid + i * %d, r = id >> 3, c = id & 7;", NT)
    if p.M % BM ~= 0 then
        bl.add("    const bool ok = m0 + r < %d;", p.M)
        bl.add("    a_src[i] = w + (long long)(ok ? m0 + r : 0) * %s + c * 8;", ll(p.as.st[2]))
        bl.add("    a_n[i] = ok ? 16u : 0u;")
    else
        bl.add("    a_src[i] = w + (long long)(m0 + r) * %s + c * 8;", ll(p.as.st[2]))
        bl.add("    a_n[i] = 16u;")
    end
    bl.add("    a_dst[i] = r * 128 + ((c ^ (r & 7)) << 4);")
    bl.add("}")
    local B_IT = math.max(1, b_chunks // NT)
    local b_guard = b_chunks < NT
    bl.add("const unsigned short *b_src[%d];", B_IT)
    bl.add("unsigned b_dst[%d], b_n[%d];", B_IT, B_IT)
    bl.add("#pragma unroll")
    bl.add("for (int i = 0; i < %d; i++) {", B_IT)
    bl.add("    const int id = tid + i * %d, r = (id >> 3) %% %d, c = id & 7;", NT, BN)
    bl.add("    const int br = s_brow[r];")
    bl.add("    b_src[i] = pk + (long long)(br < 0 ? 0 : br) * %d + c * 8;", s.KP)
    bl.add("    b_n[i] = br < 0 ? 0u : 16u;")
    bl.add("    b_dst[i] = %d + r * 128 + ((c ^ (r & 7)) << 4);", BM * 128)
    bl.add("}")
    -- K tail: chunks past K (K % 8 == 0 here) are zero-filled.
    local ktail = p.K % BK ~= 0
    bl.add("auto load = [&](int kt, int st) {")
    bl.push()
    bl.add("const unsigned sb = sbase + st * %d;", stage)
    bl.add("const int k0 = kt * %d;", BK)
    bl.add("#pragma unroll")
    bl.add("for (int i = 0; i < %d; i++)", A_IT)
    if ktail then
        -- Every chunk of this thread has the column (tid & 7) * 8 (the thread count is a multiple of 8).
        bl.add("    kiln_cp16(sb + a_dst[i], a_src[i] + k0, k0 + (tid & 7) * 8 < %d ? a_n[i] : 0u);", p.K)
    else
        bl.add("    kiln_cp16(sb + a_dst[i], a_src[i] + k0, a_n[i]);")
    end
    bl.add("#pragma unroll")
    bl.add("for (int i = 0; i < %d; i++)", B_IT)
    if b_guard then bl.add("    if (tid < %d)", b_chunks) end
    bl.add("    %skiln_cp16(sb + b_dst[i], b_src[i] + k0, b_n[i]);", b_guard and "    " or "")
    bl.pop()
    bl.add("};")
    bl.add("float acc[%d][%d][4];", MI, NI)
    bl.add("#pragma unroll")
    bl.add("for (int mi = 0; mi < %d; mi++)", MI)
    bl.add("#pragma unroll")
    bl.add("    for (int ni = 0; ni < %d; ni++)", NI)
    bl.add("        acc[mi][ni][0] = acc[mi][ni][1] = acc[mi][ni][2] = acc[mi][ni][3] = 0.0f;")
    bl.add("const int wm = warp %% %d, wn = warp / %d;", WM, WM)
    bl.add("#pragma unroll")
    bl.add("for (int st = 0; st < %d; st++) {", ST - 1)
    bl.add("    if (st < %d)", NK)
    bl.add("        load(st, st);")
    bl.add("    kiln_cp_commit();")
    bl.add("}")
    bl.add("#pragma unroll 1")
    bl.add("for (int kt = 0; kt < %d; kt++) {", NK)
    bl.push()
    bl.add("kiln_cp_wait<%d>();", ST - 2)
    bl.add("__syncthreads(); /* stage kt landed for all; stage kt - 1 is free */")
    bl.add("if (kt + %d < %d)", ST - 1, NK)
    bl.add("    load(kt + %d, (kt + %d) %% %d);", ST - 1, ST - 1, ST)
    bl.add("kiln_cp_commit();")
    bl.add("const unsigned sa = sbase + (kt %% %d) * %d, sb = sa + %d;", ST, stage, BM * 128)
    bl.add("#pragma unroll")
    bl.add("for (int kk = 0; kk < %d; kk++) {", BK // 16)
    bl.push()
    bl.add("unsigned af[%d][4], bf[%d][2];", MI, NI)
    bl.add("#pragma unroll")
    bl.add("for (int mi = 0; mi < %d; mi++) {", MI)
    bl.add("    const int r = wm * %d + mi * 16 + (lane & 15), c = kk * 2 + (lane >> 4);", WTM)
    bl.add("    kiln_ldsm4(sa + r * 128 + ((c ^ (r & 7)) << 4), af[mi][0], af[mi][1], af[mi][2], af[mi][3]);")
    bl.add("}")
    bl.add("#pragma unroll")
    bl.add("for (int np = 0; np < %d; np++) {", NI // 2)
    bl.add("    const int r = wn * %d + np * 16 + ((lane >> 4) << 3) + (lane & 7), c = kk * 2 + ((lane >> 3) & 1);", WTN)
    bl.add("    kiln_ldsm4(sb + r * 128 + ((c ^ (r & 7)) << 4), bf[2 * np][0], bf[2 * np][1], bf[2 * np + 1][0], bf[2 * np + 1][1]);")
    bl.add("}")
    bl.add("#pragma unroll")
    bl.add("for (int mi = 0; mi < %d; mi++)", MI)
    bl.add("#pragma unroll")
    bl.add("    for (int ni = 0; ni < %d; ni++)", NI)
    bl.add("        kiln_mma(acc[mi][ni], af[mi], bf[ni]);")
    bl.pop()
    bl.add("}")
    bl.pop()
    bl.add("}")
    bl.add("kiln_cp_wait<0>();")
    bl.add("/* Accumulator (mi, ni, h): weight row g + 8 * (h >> 1), token 2q + (h & 1). */")
    bl.add("const int g = lane >> 2, q = lane & 3;")
    bl.add("#pragma unroll")
    bl.add("for (int mi = 0; mi < %d; mi++)", MI)
    bl.add("#pragma unroll")
    bl.add("    for (int ni = 0; ni < %d; ni++)", NI)
    bl.add("#pragma unroll")
    bl.add("        for (int h = 0; h < 4; h++) {")
    bl.add("            const int r = m0 + wm * %d + mi * 16 + g + 8 * (h >> 1), c = wn * %d + ni * 8 + 2 * q + (h & 1);", WTM, WTN)
    bl.add("            if (c < n%s)", p.M % BM ~= 0 and string.format(" && r < %d", p.M) or "")
    bl.add("                out[s_dcol[c] + r] = acc[mi][ni][h];")
    bl.add("        }")

    local name = string.format("mul_mat_id_mma_%s_k%d_m%d_n%d", p.W, p.K, p.M, BN)
    local notes = notes_of(p)
    notes[#notes + 1] = string.format("grid (%d work items at most, %d row tiles) of %d threads; tiles %d rows x %d tokens x %d, %d stages (%d bytes shared); warps %d x %d of %d x %d",
        s.WMAX, ceil_div(p.M, BM), NT, BM, BN, BK, ST, smem, WM, WN, WTM, WTN)
    local src = source {
        name = name, what = "prefill step 2: per (expert, tile of tokens), weights read once; mma.sync " .. p.W,
        notes = notes, pre = "", helpers = { (MMA_HELPERS:gsub("@HINT@", CP_HINT)), mma_helper(p.W) }, threads = NT,
        params = param_list(p, true), body = bl.text(),
    }
    return { name = name, source = src, grid = { s.WMAX, ceil_div(p.M, BM), 1 }, block = { NT, 1, 1 }, smem = smem }
end

-- Step 2, plain FMA: f32 weights, or 16-bit ones whose rows are not 16-byte aligned.
local function main_fma(p, s)
    local BM, BN, BK, NT = FMA_BM, s.BN, FMA_BK, FMA_THREADS
    local pre = prelude.new()
    local wct = prelude.ctype[p.W]
    local S = p.S
    local bl = builder()
    main_head(bl, p, s, BM)
    bl.add(ptr(p.as, "wa", wct, true))
    bl.add("const float *const pk = (const float *)(%s + %d);", S, s.PACK)
    bl.add("const %s *const w = wa + (long long)e * %s;", wct, ll(p.as.st[3]))
    bl.add("__shared__ float s_a[%d][%d], s_b[%d][%d];", BK, BM + 1, BK, BN + 1)
    bl.add("const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;")
    bl.add("float acc[4][2] = {};")
    bl.add("#pragma unroll 1")
    bl.add("for (int k0 = 0; k0 < %d; k0 += %d) {", p.K, BK)
    bl.push()
    bl.add("#pragma unroll")
    bl.add("for (int i = 0; i < %d; i++) {", BM * BK // NT)
    bl.add("    const int id = tid + i * %d, r = id / %d, kk = id %% %d, k = k0 + kk;", NT, BK, BK)
    bl.add("    s_a[kk][r] = m0 + r < %d && k < %d ? %s : 0.0f;", p.M, p.K,
        pre.load(p.W, string.format("w[(long long)(m0 + r) * %s + k]", ll(p.as.st[2]))))
    bl.add("}")
    bl.add("#pragma unroll")
    bl.add("for (int i = 0; i < %d; i++) {", BN * BK // NT)
    bl.add("    const int id = tid + i * %d, c = id / %d, kk = id %% %d;", NT, BK, BK)
    bl.add("    const int br = s_brow[c];")
    bl.add("    s_b[kk][c] = br >= 0 ? pk[(long long)br * %d + k0 + kk] : 0.0f;", s.KP)
    bl.add("}")
    bl.add("__syncthreads();")
    bl.add("#pragma unroll 8")
    bl.add("for (int kk = 0; kk < %d; kk++) {", BK)
    bl.add("    float a[4], b[2];")
    bl.add("#pragma unroll")
    bl.add("    for (int i = 0; i < 4; i++)")
    bl.add("        a[i] = s_a[kk][ty * 4 + i];")
    bl.add("    b[0] = s_b[kk][tx * 2];")
    bl.add("    b[1] = s_b[kk][tx * 2 + 1];")
    bl.add("#pragma unroll")
    bl.add("    for (int i = 0; i < 4; i++) {")
    bl.add("        acc[i][0] = fmaf(a[i], b[0], acc[i][0]);")
    bl.add("        acc[i][1] = fmaf(a[i], b[1], acc[i][1]);")
    bl.add("    }")
    bl.add("}")
    bl.add("__syncthreads();")
    bl.pop()
    bl.add("}")
    bl.add("#pragma unroll")
    bl.add("for (int i = 0; i < 4; i++)")
    bl.add("#pragma unroll")
    bl.add("    for (int j = 0; j < 2; j++) {")
    bl.add("        const int r = m0 + ty * 4 + i, c = tx * 2 + j;")
    bl.add("        if (c < n && r < %d)", p.M)
    bl.add("            out[s_dcol[c] + r] = acc[i][j];")
    bl.add("    }")

    local name = string.format("mul_mat_id_fma_%s_k%d_m%d", p.W, p.K, p.M)
    local notes = notes_of(p)
    notes[#notes + 1] = string.format("grid (%d work items at most, %d row tiles) of %d threads; tiles %d rows x %d tokens x %d; 4 x 2 outputs per thread",
        s.WMAX, ceil_div(p.M, BM), NT, BM, BN, BK)
    local src = source {
        name = name, what = "prefill step 2: per (expert, tile of tokens), weights read once; f32 FMA",
        notes = notes, pre = (pre.code():gsub("\n$", "")), helpers = {}, threads = NT,
        params = param_list(p, true), body = bl.text(),
    }
    return { name = name, source = src, grid = { s.WMAX, ceil_div(p.M, BM), 1 }, block = { NT, 1, 1 }, smem = 0 }
end

-- Tokens per tile of the mma kernel: room for 1.5 times the mean pairs per expert.
local function mma_bn(p)
    local mean = ceil_div(p.N, math.min(p.E, p.N))
    for _, bn in ipairs({ 16, 32, 64 }) do
        if 2 * bn >= 3 * mean then return bn end
    end
    return 128
end

-- 16-bit weights whose every row starts on 16 bytes, K a multiple of 8.
local function mma_ok(p)
    if p.W == "f32" then return false end
    local vals = { p.K, p.as.offs, p.as.st[2] }
    if p.E > 1 then vals[#vals + 1] = p.as.st[3] end
    return widest({ 8 }, vals) == 8
end

local prefill

-- The epilogue fallback of the prefill plan: the product (and the paired product) into f32
-- regions of the scratch by the plain plan, its own scratch after them; the paired product's
-- routing and packing (identical to the first's) are not repeated; then the epilogue as a step
-- of its own.
-- (run: how each product is computed; default the prefill plan. Quantized experts: quant_sub.)
local function via_scratch(k, p, run)
    local subs, voffs, base = epilogue.value_nodes(k, "as")
    local steps, scratch, prep_src = {}, base, nil
    for _, sk in ipairs(subs) do
        local r = run and run(sk) or prefill(problem(sk))
        local rs = r.steps or { r }
        scratch = math.max(scratch, r.scratch or 0)
        if not epilogue.same_code(rs[1].source, prep_src) then steps[#steps + 1] = rs[1] end
        prep_src = rs[1].source
        for i = 2, #rs do steps[#steps + 1] = rs[i] end
    end
    local pre = prelude.new()
    local body, blocks = ep_body(k, pre, voffs)
    local bl = builder()
    for _, l in ipairs(body) do bl.add("%s", l) end
    local name = string.format("mul_mat_id_epilogue_%s_m%d_u%d_t%d", p.pa and "pair" or "one", p.M, p.U, p.T)
    local src = source {
        name = name, what = "epilogue after the product" .. (p.pa and "s" or "") .. ": one thread per dst element",
        notes = notes_of(p), pre = (pre.code():gsub("\n$", "")), helpers = {}, threads = EP_BLOCK,
        params = param_list(p, true), body = bl.text(),
    }
    steps[#steps + 1] = { name = name, source = src, grid = { blocks, 1, 1 }, block = { EP_BLOCK, 1, 1 }, smem = 0 }
    return { scratch = scratch, steps = steps }
end

prefill = function(p)
    if p.E > MAX_EXPERTS then fail("%d experts: at most %d for prefill", p.E, MAX_EXPERTS) end
    local s, main
    if mma_ok(p) then
        local bn = mma_bn(p)
        s = scratch_layout(p, bn, align(p.K, MMA_BK), p.W)
        s.BM, s.ST = MMA_BM, MMA_STAGES
        if p.K <= MMA_SHORT_K and bn >= 32 then s.BM, s.ST = MMA_BM_SHORT, MMA_STAGES_SHORT end
        main = main_mma
    else
        s = scratch_layout(p, FMA_BN, align(p.K, FMA_BK), "f32")
        s.BM = FMA_BM
        main = main_fma
    end
    if ceil_div(p.M, s.BM) > 65535 then fail("M %d: too many row tiles", p.M) end
    return { scratch = p.base + s.bytes, steps = { prep(p, s), main(p, s) } }
end

-- ---- quantized experts: the fused GEMV (decode and small token counts) ------------------------

local QID_WARPS = 4      -- warps per block
local QID_R = 4          -- rows per warp: each load of b serves them all
-- Warps that may split one row's units. 1: a warp takes whole rows, so b's quantization in the
-- block's prologue serves 4 warps' rows, not 1. H100 decode ms (base of 4 / 1 / 2): gpt-oss-20b
-- mxfp4_moe 1.901 / 1.858 / 1.884 (K 2880: 1 unit a lane when 4 warps split it), Qwen3-30B-A3B
-- Q4_K_M 2.303 / 2.303 / 2.301; with 8 warps a block (1 and 2): 1.847 / 1.944 and 2.331 / 2.331.
local QID_WK_MAX = 1
local QID_REGS = 40      -- registers of weights a lane keeps in flight ahead of its products (matmul.lua's)
local QID_MAX_SLOTS = 64 -- (slot, token) pairs up to which the fused GEMV is always taken
-- The next kernel's launch after the main loop (matmul.lua's QGEMV_PDL "late"): not taken, H100
-- decode ms base / late: gpt-oss-20b mxfp4_moe 1.914 / 1.911 (1.889 again), Qwen3-30B-A3B Q4_K_M
-- 2.324 / 2.343.
local QID_LATE = false

-- Whether N = U*T (its maximum) pairs take the fused GEMV rather than dequantizing every expert:
-- always up to QID_MAX_SLOTS pairs; beyond, while the fused kernel's weight reads (N expert
-- matrices at q bytes an element, q = the type's block bytes / block elements) stay below what
-- the dequantization alone moves (all E experts read at q and written as f16: q + 2 bytes an
-- element), i.e. N * q < E * (q + 2). For 128 experts: N <= 368 (q8_0) .. 583 (q4_0, q4_K).
local function qid_fused(p)
    local ti = quant.TYPES[p.W]
    return p.N <= QID_MAX_SLOTS or p.N * ti.size < p.E * (ti.size + 2 * ti.block)
end

-- The fused GEMV of quantized experts, grid (row tiles, U, T): a block reads its slot's id and
-- owns QID_R rows per warp group of that expert; a warp group's warps split K into units (as
-- matmul.lua's qgemv: a q8_0/q4_0 block or a quarter of a K-quant block). The block
-- first quantizes its b row to int8 in shared memory (quant.bq_prologue, after the first units'
-- weight loads are issued), then each lane multiplies its units' weight integers against b's in
-- dp4a (quant.lua's int8 path, as the dense qgemv), the next units' loads in flight, and the
-- warps meet in shared memory. Only the selected experts' rows are read; an invalid id writes
-- zeros and reads nothing. nil when b's rows are not contiguous and 16-byte aligned (its
-- float4 loads), or the pairs are too many (qid_fused): quant_id's path then.
local function qgemv_id(k)
    local p = problem(k, true)
    if k.pair and not (k.epilogue and k.epilogue.values == 2) then fail("a paired weight needs an epilogue over 2 values") end
    local b = p.b
    if b.st[1] ~= 1 or b.offs % 4 ~= 0 then return nil end
    if p.B1 > 1 and b.st[2] % 4 ~= 0 then return nil end
    if p.T > 1 and b.st[3] % 4 ~= 0 then return nil end
    if not qid_fused(p) then return nil end
    if p.U > 65535 or p.T > 65535 then return nil end
    quant.check_blocks(p.as, fail, "as")
    if p.pa then quant.check_blocks(p.pa, fail, "pair") end
    local pa, ep, NV = p.pa, k.epilogue, p.pa and 2 or 1
    local as, T = p.as, p.W
    local ti = quant.TYPES[T]
    local BL, UB = ti.block, ti.ub
    local NU = p.K // BL * UB
    -- WK warps split a row's units (the fewest powers of 2 giving each lane a unit, at most
    -- QID_WK_MAX: 1, so every warp owns its 4 rows whole and the block's b prologue serves 16).
    local WK = 1
    while WK < math.min(QID_WARPS, QID_WK_MAX) and 32 * WK < NU do WK = WK * 2 end
    local RG = QID_WARPS // WK
    local R = QID_R
    local RB = RG * R
    local NI = ceil_div(NU, 32 * WK)
    local gx = ceil_div(p.M, RB)
    local bl = builder()
    if not ep then bl.add(ptr(p.dst, "out", "float", false)) end
    for _, l in ipairs(quant.pointers(as, fail)) do bl.add("%s", l) end
    if pa then
        for _, l in ipairs(quant.pointers(pa, fail, "W2", "NB2")) do bl.add("%s /* the paired weight */", l) end
    end
    bl.add(ptr(p.b, "xb", "float", true))
    bl.add(ptr(p.ids, "ids", "int", true))
    bl.add("const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;")
    if WK > 1 then
        bl.add("const unsigned wk = warp %% %du, row0 = blockIdx.x * %du + warp / %du * %du;", WK, RB, WK, R)
    else
        bl.add("const unsigned row0 = blockIdx.x * %du + warp * %du;", RB, R)
    end
    slot_expert(bl, p)
    local pre = prelude.new()
    -- The store of row `row` (an expression) with values vals: dst directly, or the epilogue at
    -- dst coordinates (row, u, t).
    local function store(row, vals)
        if ep then
            return ep_lines(k, pre, { row, p.U > 1 and "u" or nil, p.T > 1 and "t" or nil }, vals)
        end
        return { string.format("o[%s] = %s;", row == "orow" and "threadIdx.x" or row, vals[1]) }
    end
    if not ep then bl.add("float *const o = out + %s + blockIdx.x * %du;", dcol_expr(p, "u", "t"), RB) end
    local guard = p.M % RB ~= 0 and string.format(" && blockIdx.x * %du + threadIdx.x < %du", RB, p.M) or ""
    bl.add("if ((unsigned)e >= %du) { /* no such expert: zero rows, nothing read */", p.E)
    bl.add("    if (threadIdx.x < %du%s) {", RB, guard)
    if ep then bl.add("        const unsigned orow = blockIdx.x * %du + threadIdx.x;", RB) end
    for _, l in ipairs(store("orow", pa and { "0.0f", "0.0f" } or { "0.0f" })) do bl.add("        %s", l) end
    bl.add("    }")
    bl.add("    return;")
    bl.add("}")
    -- Rows past M (the last block's) read row M - 1 again and store nothing.
    local row = p.M % RB ~= 0 and string.format("min(row0 + r, %du)", p.M - 1) or "(row0 + r)"
    local base = { ll(as.offs // BL) }
    if as.offs == 0 then base = {} end
    base[#base + 1] = string.format("(long long)e * %s", ll(as.st[3] // BL))
    base[#base + 1] = string.format("(long long)%s * %s", row, ll(as.st[2] // BL))
    bl.add("long long blk0[%d]; /* each row's first block */", R)
    bl.add("#pragma unroll")
    bl.add("for (int r = 0; r < %d; r++)", R)
    bl.add("    blk0[r] = %s;", table.concat(base, " + "))
    if pa then
        local pbase = { ll(pa.offs // BL) }
        if pa.offs == 0 then pbase = {} end
        pbase[#pbase + 1] = string.format("(long long)e * %s", ll(pa.st[3] // BL))
        pbase[#pbase + 1] = string.format("(long long)%s * %s", row, ll(pa.st[2] // BL))
        bl.add("long long blk1[%d]; /* the paired weight's */", R)
        bl.add("#pragma unroll")
        bl.add("for (int r = 0; r < %d; r++)", R)
        bl.add("    blk1[r] = %s;", table.concat(pbase, " + "))
    end
    local vidx = p.B1 == 1 and "0" or (p.B1 == p.U and "u" or string.format("u %% %du", p.B1))
    local brow = brow_expr(p, vidx, "t")
    bl.add("const float *const bk = xb%s;", brow == "0" and "" or " + " .. brow)
    -- Unit i of the lane (units past NU, in a partial last round, load unit NU - 1 again and
    -- add nothing), its block in the row and its part of the block; its weights' loads.
    local partial = NU % (32 * WK) ~= 0
    local lane_unit = WK > 1 and "(int)(lane + 32u * wk)" or "(int)lane"
    local function loads(i)
        quant.unit_index(bl, i, lane_unit, 32 * WK, UB, NU, partial)
        bl.add("kiln_qw_%s w%d[%d];", T, i, R * NV)
        bl.add("#pragma unroll")
        bl.add("for (int r = 0; r < %d; r++) {", R)
        bl.add("    w%d[r] = kiln_qwl_%s(W, NB, blk0[r] + ub%d, pt%d);", i, T, i, i)
        if pa then bl.add("    w%d[%d + r] = kiln_qwl_%s(W2, NB2, blk1[r] + ub%d, pt%d);", i, R, T, i, i) end
        bl.add("}")
    end
    -- The first units' loads go out before b's quantization, whose latency hides behind them.
    local PF = math.max(1, math.min(NI, QID_REGS // (quant.QW_REGS[T] * R * NV)))
    for i = 0, PF - 1 do loads(i) end
    for _, l in ipairs(quant.bq_prologue(p.K, QID_WARPS * 32, "bk")) do bl.add("%s", l) end
    bl.add("float acc[%d] = {%s};", NV * R, string.rep("0.0f", NV * R, ", "))
    quant.unit_loop(bl, T, NI, PF, R * NV, loads, partial, lane_unit, 32 * WK, NU)
    if QID_LATE then bl.add("/* kiln: launch dependents here */") end
    bl.add("__shared__ float part[%d][%d];", QID_WARPS, NV * R)
    bl.add("#pragma unroll")
    bl.add("for (int r = 0; r < %d; r++) {", NV * R)
    bl.add("#pragma unroll")
    bl.add("    for (int s = 16; s > 0; s >>= 1)")
    bl.add("        acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], s);")
    bl.add("    if (lane == 0)")
    bl.add("        part[warp][r] = acc[r];")
    bl.add("}")
    bl.add("__syncthreads();")
    bl.add("if (threadIdx.x < %du%s) {", RB, guard)
    bl.push()
    bl.add("const unsigned g = threadIdx.x / %du * %du, r = threadIdx.x %% %du;", R, WK, R)
    bl.add("float v = 0.0f%s;", pa and ", v2 = 0.0f" or "")
    bl.add("#pragma unroll")
    bl.add("for (int w = 0; w < %d; w++) {", WK)
    bl.add("    v += part[g + w][r];")
    if pa then bl.add("    v2 += part[g + w][%d + r];", R) end
    bl.add("}")
    if ep then bl.add("const unsigned orow = blockIdx.x * %du + threadIdx.x;", RB) end
    for _, l in ipairs(store("orow", pa and { "v", "v2" } or { "v" })) do bl.add("%s", l) end
    bl.pop()
    bl.add("}")

    local name = string.format("mul_mat_id_qgemv_%s%s_k%d_m%d_u%d", pa and "pair_" or "", T, p.K, p.M, p.U)
    local notes = notes_of(p)
    notes[#notes + 1] = string.format("grid (%d, %d, %d) of %d warps: %d rows a warp, %d warp%s split K (%d units of %d, %d per lane), %d rows a block",
        gx, p.U, p.T, QID_WARPS, R, WK, WK == 1 and "" or "s", NU, BL // UB, NI, RB)
    local src = source {
        name = name, what = "decode: a fused GEMV over the selected expert's quantized rows per (slot, token)",
        notes = notes, pre = (pre.code():gsub("\n$", "")), helpers = { quant.helpers(T, false, true) }, threads = QID_WARPS * 32,
        params = param_list(p, false), body = bl.text(),
    }
    return { name = name, source = src, grid = { gx, p.U, p.T }, block = { QID_WARPS * 32, 1, 1 }, smem = 0,
        dynamic = p.kdims or nil }
end

-- Quantized experts: all of as dequantized into the scratch as f16 (templates/quant.lua), then
-- the f16 plans on it, their own scratch after it. (Correct at every size; a fused quantized
-- expert GEMV is future work: this reads and writes every expert at decode.)
local quant_sub
local function quant_id(k, run)
    if k.epilogue or k.pair then
        -- Each product through quant_sub (into the scratch), then the epilogue step.
        local p = problem(k, true)
        local r = via_scratch(k, p, quant_sub)
        r.epilogue, r.paired = true, k.pair ~= nil
        if p.kdims then r.dynamic = true end
        return r
    end
    local as = k.args.as
    local base0 = k.scratch_base or 0
    local plist = {}
    for i = 0, k.nparams - 1 do plist[#plist + 1] = (i == k.dst.param and "char" or "const char") .. " *__restrict__ p" .. i end
    plist[#plist + 1] = "char *__restrict__ p" .. k.nparams
    if k.dims and #k.dims > 0 then plist[#plist + 1] = "const int* __restrict__ kdims" end
    local step, bytes = quant.dequant_step(k.nparams, table.concat(plist, ", "), as, base0, "as", fail, "mul_mat_id_dq_")
    local sk = {}
    for key, x in pairs(k) do sk[key] = x end
    sk.args = {}
    for key, x in pairs(k.args) do sk.args[key] = x end
    sk.args.as = { type = "f16", ne = as.ne, st = { 1, as.ne[1], as.ne[1] * as.ne[2], as.ne[1] * as.ne[2] * as.ne[3] },
        offs = base0 // 2, param = k.nparams, dyn = as.dyn, sym = as.sym }
    sk.scratch_dst = true
    sk.scratch_base = (base0 + bytes + 255) // 256 * 256
    local sub = run(sk)
    local steps = { step }
    for _, st in ipairs(sub.steps or { sub }) do steps[#steps + 1] = st end
    return { scratch = math.max(sk.scratch_base, sub.scratch or 0), steps = steps, dynamic = sub.dynamic }
end

local function plain(k)
    local p = problem(k)
    if k.pair and not (k.epilogue and k.epilogue.values == 2) then fail("a paired weight needs an epilogue over 2 values") end
    local r
    if p.T <= GEMV_MAX_T then
        r = gemv(p)
        r.epilogue, r.paired = k.epilogue ~= nil, k.pair ~= nil
    elseif k.epilogue then
        r = via_scratch(k, p)
        r.epilogue, r.paired = true, k.pair ~= nil
    else
        r = prefill(p)
    end
    if p.kdims then r.dynamic = true end
    return r
end

-- A quantized product: the fused GEMV, else the dequantization and the f16 plans.
function quant_sub(k) return qgemv_id(k) or quant_id(k, plain) end

return function(k)
    if k.args and k.args.as and quant.is(k.args.as.type) then
        local r = quant_sub(k)
        if k.epilogue then r.epilogue, r.paired = true, k.pair ~= nil end
        return r
    end
    return plain(k)
end
