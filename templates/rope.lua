-- rope: the kernel template of the rope family (rope_ext); see docs/templates.md for the table k
-- of IR_OP nodes and docs/ops-rope.md for the semantics (ggml's CPU rope, ir/ref_rope.c).
--
-- One block per (token, group of HPB heads): grid = (ne2 * ne3, ceil(ne1 / HPB)).
--
-- 1. The block's threads compute the token's cos/sin cache into shared memory, one pair index
--    per thread (cs[q] = {cos, sin} of pair q). The angle of pair i is ggml's float recurrence
--    theta_{i+1} = theta_i * theta_scale started at the position, so each thread walks that chain
--    (keeping its state from one of its pairs to the next) with the same float multiplications
--    the CPU does: the angles are bit-identical to the reference's, which matters because the
--    angles reach thousands of radians (a relative error of 1e-7 in theta would be 1e-4 in the
--    output). The YaRN ramp, freq_factors and mscale steps use explicitly rounded intrinsics
--    (__fmul_rn, ...) in ggml's order so that contraction into FMAs cannot change them; sin and
--    cos are CUDA's precise sincosf (<= 2 ulp). Each cache entry is shared by the HPB heads.
-- 2. Each thread rotates units of G consecutive pairs of one head: for neox/mrope/imrope/vision
--    the two halves x[i..i+G) and x[i+n..i+n+G) (n = n_dims/2, vision n_dims), for normal the 2G
--    adjacent elements x[2i..2i+2G); 16-byte vector loads and stores where the static layout
--    allows (checked here on offsets and strides; buffers are 256-byte aligned). When the whole
--    row's pairs fit in one cache chunk and each thread has at most MAX_U units, the units are
--    loaded into registers before step 1, so the loads overlap the angle computation.
-- 3. Elements n_dims..ne0-1 (not vision) are copied as they are.
--
-- Pairs beyond CACHE_MAX are processed in chunks of CACHE_MAX (large n_dims only).

local kit = require("kit")
local tpl = require("tpl")
local prelude = require("prelude")

local SIZE = { f32 = 4, f16 = 2, bf16 = 2 }
local INT_MAX = 2147483647
local BLOCK_MAX = 256
local CACHE_MAX = 2048  -- pairs of one chunk: 16 KiB of float2
local MAX_U = 4         -- units per thread held in registers across step 1
local TARGET_UNITS = 512 -- units per block the head grouping aims for
local MIN_BLOCKS = 264  -- with fewer blocks, heads are split over more blocks (2 per H100 SM)
local MAX_GRID_Y = 65535
local MODES = { [0] = "normal", [2] = "neox", [8] = "mrope", [24] = "vision", [40] = "imrope" }

local fail = kit.failer("rope")

local dims = kit.dims

local check_ref = kit.ref_checker(fail)

local ceil_div = kit.ceil_div

-- ---- symbolic dims (docs/templates.md: ref.dyn) ----------------------------------------------
--
-- dyn(r, d): the C expression (int) of r's run-time extent in dim d (1-based), or nil when static.
local dyn = kit.ext

-- Fails unless r's dynamic dims are among the allowed ones (a set of 1-based dims).
local dyn_only = kit.dyn_checker(fail)

-- The run-time extent of a dim that a and b share: one of their expressions (nil when static).
local function dyn_of(a, b, d) return dyn(a, d) or dyn(b, d) end

-- ---- the angle: templates/angle.lua ---------------------------------------------------------

local angle = require("angle")
local lit, constants = angle.lit, angle.constants

-- Largest element offset r reaches, and whether an offset or stride is negative.
local reach = kit.reach

-- ---- the plan -----------------------------------------------------------------------------

-- Can x be read (and the natural dst written) as vectors of ve elements at element offsets that
-- are multiples of ve?
local function vector_ok(a, dst, ve)
    if ve < 2 or ve * SIZE[a.type] > 16 then return false end
    if a.st[1] ~= 1 or a.offs % ve ~= 0 then return false end
    for d = 2, 4 do
        if a.ne[d] > 1 and a.st[d] % ve ~= 0 then return false end
    end
    if dst.offs % ve ~= 0 then return false end
    if dst.ne[2] * dst.ne[3] * dst.ne[4] > 1 and dst.ne[1] % ve ~= 0 then return false end
    if dst.rowst and dst.rowst % ve ~= 0 then return false end
    return true
end

-- dst: where rows are written (k.dst, or for rope_set_rows the cache row: see the caller).
local function plan_of(k, dst)
    local a = k.args.a
    local p = k.params
    local P = { mode = p.mode, kind = MODES[p.mode], nd = p.n_dims, type = a.type }
    if not P.kind then fail("unsupported mode %s", tostring(p.mode)) end
    local ne = dst.ne
    P.ne = ne
    P.np = P.kind == "vision" and P.nd or P.nd // 2 -- pairs rotated per row
    P.off = P.np                                     -- neox-like: partner of element i is i + np
    P.pt = P.kind == "vision" and 0 or ne[1] - P.nd  -- elements copied per row
    if P.kind == "vision" and 2 * P.nd ~= ne[1] then fail("vision needs n_dims == ne0 / 2") end
    if P.nd < 0 or P.nd % 2 ~= 0 or P.nd > ne[1] then fail("bad n_dims %d for ne0 %d", P.nd, ne[1]) end

    -- Pairs per unit (G) and vector width in elements (ve, 1 = element by element).
    local size = SIZE[a.type]
    local normal = P.kind == "normal"
    local g = 1
    if P.np > 0 and a.st[1] == 1 then
        g = (normal and 8 or 16) // size
        while g > 1 and P.np % g ~= 0 do g = g // 2 end
        while g > 1 and not vector_ok(a, dst, normal and 2 * g or g) do g = g // 2 end
    end
    P.g = g
    P.ve = normal and 2 * g or g
    P.vec = vector_ok(a, dst, P.ve)
    if not P.vec then P.ve = 1 end

    -- Cache chunks.
    P.ch = math.min(P.np, CACHE_MAX)
    P.nchunks = P.np > 0 and ceil_div(P.np, P.ch) or 0
    P.uph = P.ch // g -- units per head of a full chunk

    -- Heads per block: about TARGET_UNITS units, more blocks when the grid would be small.
    local tokens = ne[3] * ne[4]
    local per_head = math.max(P.uph, P.pt, 1)
    local hpb = math.max(1, math.min(ne[2], ceil_div(TARGET_UNITS, per_head)))
    while hpb > 1 and tokens * ceil_div(ne[2], hpb) < MIN_BLOCKS and (hpb // 2) * per_head >= 64 do
        hpb = ceil_div(hpb, 2)
    end
    if ceil_div(ne[2], hpb) > MAX_GRID_Y then hpb = ceil_div(ne[2], MAX_GRID_Y) end
    P.hpb = hpb
    P.hg = ceil_div(ne[2], hpb)
    P.tokens = tokens
    if tokens > INT_MAX then fail("too many tokens (%d)", tokens) end

    -- Block size: enough threads for the block's units (and the chunk's pairs), a warp at least.
    local work = math.max(hpb * P.uph, hpb * P.pt, math.min(P.ch, BLOCK_MAX), 1)
    P.block = math.min(BLOCK_MAX, ceil_div(work, 32) * 32)
    P.nu = hpb * P.uph
    P.prefetch = P.nchunks == 1 and ceil_div(P.nu, P.block) <= MAX_U
    P.u = ceil_div(P.nu, P.block)
    return P
end

-- ---- rope_set_rows ----------------------------------------------------------------------------
--
-- k.fused == "rope_set_rows" (ir/fuse_rope_set_rows.c): the rope's result r ([ne0, ne1, T, 1], of
-- op type k.set_rows.type) is not stored; dst = set_rows(k.set_rows.a, r viewed as T rows of
-- ne0 * ne1, ids): a fresh copy of a whose row ids[j] is token j's rotated heads (the last j
-- naming a row wins, as ggml's sequential loop leaves it). One launch of two kinds of blocks:
-- * blocks 0 .. T * HG - 1 are the rope's (token, head group) blocks with their output rows
--   redirected to cache row ids[tok]; a block whose token is overridden by a later one naming
--   the same row, or whose id is out of range, writes nothing (the reference rejects such ids);
-- * the others copy a's rows that no id names, one warp per row, 16-byte vectors where the
--   layouts allow, four loads in flight per lane.
-- Replaced rows are computed from x directly: each value rounded to the op type, then converted
-- to dst's type, which is what the unfused rope + set_rows store.

-- k.set_rows when the node is a rope_set_rows fusion (checked), else nil.
local function set_rows_of(k)
    if k.fused ~= "rope_set_rows" then return nil end
    local S, a, dst = k.set_rows, k.args.a, k.dst
    if type(S) ~= "table" then fail("rope_set_rows without k.set_rows") end
    check_ref(S.a, "set_rows a", SIZE)
    check_ref(S.ids, "set_rows ids", { i32 = 4, i64 = 8 })
    if S.type ~= a.type then fail("rope_set_rows: op type %s differs from the rope's %s", tostring(S.type), a.type) end
    if S.a.type ~= dst.type then fail("rope_set_rows: a is %s, dst %s", S.a.type, dst.type) end
    local b = S.b_ne
    if type(b) ~= "table" or b[1] ~= a.ne[1] * a.ne[2] or b[2] ~= a.ne[3] or b[3] ~= 1 or b[4] ~= 1 or a.ne[4] ~= 1 then
        fail("rope_set_rows: the rows must be whole tokens (b %s, rope %s)", dims(b or {}), dims(a.ne))
    end
    for d = 1, 4 do
        if S.a.ne[d] ~= dst.ne[d] then fail("rope_set_rows: a %s and dst %s differ", dims(S.a.ne), dims(dst.ne)) end
    end
    if dst.ne[1] ~= b[1] or dst.ne[3] ~= 1 or dst.ne[4] ~= 1 or dst.st[1] ~= 1 then
        fail("rope_set_rows: dst %s st %s is not a matrix of contiguous rows of %d", dims(dst.ne), dims(dst.st), b[1])
    end
    if S.ids.ne[1] ~= b[2] or S.ids.ne[2] * S.ids.ne[3] * S.ids.ne[4] ~= 1 then
        fail("rope_set_rows: ids %s must list one row per token", dims(S.ids.ne))
    end
    if dst.ne[2] > INT_MAX then fail("rope_set_rows: %d rows", dst.ne[2]) end
    -- Symbolic dims: the token count (the rope's dim 2, b's and ids' rows) and the cache's rows.
    dyn_only(a, "rope_set_rows: a", { [3] = true })
    dyn_only(S.ids, "rope_set_rows: ids", { [1] = true })
    dyn_only(dst, "rope_set_rows: dst", { [2] = true })
    dyn_only(S.a, "rope_set_rows: set_rows a", { [2] = true })
    if S.in_place then
        if S.a.param ~= dst.param or S.a.offs ~= dst.offs or S.a.st[2] ~= dst.st[2] then
            fail("rope_set_rows in place: a (p%s offs %d) is not dst (p%s offs %d)", tostring(S.a.param), S.a.offs,
                tostring(dst.param), dst.offs)
        end
    end
    return S
end

local function scatter_notes(S, P, dst)
    return {
        string.format("set_rows: dst %s %s st %s offs %d = ca %s st %s offs %d with row ids[j] (%s st %d offs %d)",
            dst.type, dims(dst.ne), dims(dst.st), dst.offs, S.a.type, dims(S.a.st), S.a.offs, S.ids.type, S.ids.st[1],
            S.ids.offs),
        S.in_place and string.format("  = token j's rope (rounded to %s), in place: only the named rows are written",
            S.type) or
        string.format("  = token j's rope (rounded to %s); blocks 0..%d rope, the rest copy unnamed rows (warp each)",
            S.type, P.tokens * P.hg - 1),
    }
end

-- The copy blocks (see above), then the rope blocks' token, head group and cache row.
local function scatter_prologue(S, P, dst, add, ix, I, U, types)
    local R, W = dst.ne[2], dst.ne[1]
    local ropeb = P.tokens * P.hg
    local it = S.ids.type == "i64" and "long long" or "int"
    local function id(j)
        if S.ids.st[1] == 1 then return "ids[" .. j .. "]" end
        return string.format("ids[(%s)(%s) * %s]", ix, j, I(S.ids.st[1]))
    end
    -- Token count and cache rows: static, or read at run time (symbolic dims).
    local ntok = P.dT and "ntok" or U(P.tokens)
    local nrow = P.drow and "nrow" or U(R)
    if P.dT then add(string.format("const unsigned ntok = (unsigned)(%s); /* tokens at run time */", P.dT)) end
    if P.drow then add(string.format("const unsigned nrow = (unsigned)(%s); /* cache rows at run time */", P.drow)) end
    local in1, in2, in3 = "        ", "            ", "                "
    if not S.in_place then
        local ca, DT = S.a, dst.type
        local V = 16 // SIZE[DT]
        local vec = W % V == 0 and ca.st[1] == 1 and ca.offs % V == 0 and dst.offs % V == 0 and
            (R == 1 or (ca.st[2] % V == 0 and dst.st[2] % V == 0))
        if not vec then V = 1 end
        local ct = prelude.ctype[DT]
        local vt = ct
        if vec then
            vt = string.format("kiln_rows_%sx%d", DT == "f32" and "f32" or "u16", V)
            types[#types + 1] = string.format("struct alignas(16) %s {\n    %s v[%d];\n};", vt, ct, V)
    end
    local nv = W // V
    add("/* copy blocks: a's rows that no id names */")
    add(string.format("if (blockIdx.x >= %s) {", U(ropeb)))
    add(string.format("const unsigned crow = (blockIdx.x - %s) * %s + (threadIdx.x >> 5);", U(ropeb), U(P.block // 32)), in1)
    add(string.format("if (crow >= %s)", nrow), in1)
    add("return;", in2)
    add("const unsigned lane = threadIdx.x & 31u;", in1)
    add("bool named = false;", in1)
    add(string.format("for (unsigned j = lane; j < %s; j += 32u)", ntok), in1)
    add(string.format("named |= %s == (%s)crow;", id("j"), it), in2)
    add("if (__any_sync(0xffffffffu, named))", in1)
    add("return;", in2)
    add(string.format("const %s *const src = ca + (%s)crow * %s;", ct, ix, I(ca.st[2])), in1)
    add(string.format("%s *const drow = y + (%s)crow * %s;", ct, ix, I(dst.st[2])), in1)
    local function at(base, v, st)
        if vec then return string.format("((%s%s *)%s)[%s]", base == "src" and "const " or "", vt, base, v) end
        if st == 1 then return string.format("%s[%s]", base, v) end
        return string.format("%s[(%s)(%s) * %s]", base, ix, v, I(st))
    end
    add(string.format("for (unsigned v = lane; v < %s; v += 128u) {", U(nv)), in1)
    add(string.format("%s t0, t1, t2, t3;", vt), in2)
    for u = 0, 3 do
        local v = u == 0 and "v" or string.format("v + %s", U(32 * u))
        local guard = u == 0 and "" or string.format("if (%s < %s) ", v, U(nv))
        add(string.format("%st%d = %s;", guard, u, at("src", v, ca.st[1])), in2)
    end
    for u = 0, 3 do
        local v = u == 0 and "v" or string.format("v + %s", U(32 * u))
        local guard = u == 0 and "" or string.format("if (%s < %s) ", v, U(nv))
        add(string.format("%s%s = t%d;", guard, at("drow", v, 1), u), in2)
    end
    add("}", in1)
    add("return;", in1)
    add("}")
    add("")
    end
    add("/* rope blocks: token tok's heads into cache row ids[tok] */")
    add(P.hg > 1 and string.format("const unsigned tok = blockIdx.x / %s;", U(P.hg)) or "const unsigned tok = blockIdx.x;")
    if P.dT then
        add("if (tok >= ntok)")
        add("return;", in1)
    end
    add(string.format("const long long row = (long long)%s;", id("tok")))
    if P.drow then
        add("if (row < 0 || row >= (long long)nrow)")
    else
        add(string.format("if (row < 0 || row >= %dll)", R))
    end
    add("return; /* the reference rejects such an id */", in1)
    if P.tokens > 1 then
        add("int later = 0; /* a later token naming the same row wins */")
        add(string.format("for (unsigned j = tok + 1u + threadIdx.x; j < %s; j += %s)", ntok, U(P.block)))
        add(string.format("later |= %s == %s;", id("j"), id("tok")), in1)
        add("if (__syncthreads_or(later))")
        add("return;", in1)
    end
end

-- ---- code -------------------------------------------------------------------------------------

-- The source of a rope kernel (kit.kernel with this family's head: the rope's parameters, the
-- scatter of rope_set_rows, the symbolic dims and the launch).
local function kernel(t)
    local head = {
        "kiln rope kernel " .. t.name,
        "rope_ext mode " .. t.mode .. " (" .. t.kind .. "): a " .. t.atype .. " " .. dims(t.ane) .. " st " .. dims(t.ast)
            .. " offs " .. t.aoffs .. " -> out " .. dims(t.ane),
        "n_dims " .. t.nd .. ": " .. t.np .. " pairs per row" .. t.pairs .. "; " .. t.copied,
        "theta_scale " .. t.ts .. ", freq_scale " .. t.fs .. ", ext_factor " .. t.ef .. ", mscale " .. t.ms .. t.yarn,
        "positions: i32 st " .. t.pst .. " offs " .. t.poffs .. t.ffnote,
    }
    for _, l in ipairs(t.scatter) do head[#head + 1] = l end
    if t.symbolic ~= "" then
        head[#head + 1] = "symbolic dims (read at run time; blocks past them return): " .. t.symbolic
    end
    head[#head + 1] = "grid " .. t.gx .. " x " .. t.gy .. " (tokens x head groups of " .. t.hpb .. "), block " .. t.block
        .. "; units of " .. t.g .. " pair(s) (" .. t.how .. ");"
    head[#head + 1] = "  " .. t.chunks .. ", " .. t.bits .. "-bit offsets"
    t.head, t.blocks, t.threads = head, t.types, t.block
    return kit.kernel(t)
end

-- ---- the kernel being written ----------------------------------------------------------------

-- U(v): an unsigned C literal.
local function U(v) return tostring(v) .. "u" end

-- The rope node checked and planned, as the code writers below see it (K): the operands a, pos,
-- ff (freq_factors), dst; S (k.set_rows of a rope_set_rows fusion, or nil) and Y (the rows the
-- rope writes, in the rope's shape); OT (the type the rope's value is rounded to) and DT (Y's
-- type, the one stored); the plan P (with its symbolic extents) and the angle's constants C;
-- ix and I (the index type and its literals); the prelude recorder pre; the body lines and the
-- vector types being written, and add(s [, ind]) appending a line (indent 4 by default).
local function node_of(k)
    if k.kind ~= "op" or k.op ~= "rope_ext" then fail("unsupported node %s", tostring(k.op)) end
    local a, pos, ff, dst = k.args.a, k.args.pos, k.args.freq_factors, k.dst
    check_ref(a, "a", SIZE)
    check_ref(dst, "dst", SIZE)
    check_ref(pos, "pos", { i32 = 4 })
    if ff then check_ref(ff, "freq_factors", { f32 = 4 }) end
    -- Y: the rows the rope writes, in the rope's shape; for rope_set_rows a token's heads are
    -- one row of the cache dst, at a row (and so an offset) known only at run time.
    local S = set_rows_of(k)
    local Y = dst
    if S then
        Y = { type = dst.type, ne = a.ne, st = { 1, a.ne[1], a.ne[1] * a.ne[2], a.ne[1] * a.ne[2] * a.ne[3] },
            offs = dst.offs, rowst = dst.st[2], param = dst.param }
    else
        if k.fused then fail("unsupported fusion %s", tostring(k.fused)) end
        if dst.type ~= a.type then fail("dst type %s differs from a's %s", dst.type, a.type) end
        for d = 1, 4 do
            if dst.ne[d] ~= a.ne[d] then fail("dst and a shapes differ") end
        end
    end

    local P = plan_of(k, Y)
    local C = constants(k)
    -- Symbolic dims: a's (and dst's) dims 1..3 and the positions' count; the grid is the one of
    -- the maxima and blocks past a run-time extent return at once (block-uniform, before any
    -- barrier). P.dH, P.dT, P.dS: run-time heads, tokens (dim 2), sequences (dim 3); P.dT and
    -- P.drow for rope_set_rows: tokens and cache rows.
    dyn_only(pos, "pos", { [1] = true })
    if ff then dyn_only(ff, "freq_factors", {}) end
    if S then
        P.dT = dyn_of(a, S.ids, 3) or dyn(S.ids, 1)
        P.drow = dyn_of(dst, S.a, 2)
    else
        dyn_only(a, "a", { [2] = true, [3] = true, [4] = true })
        dyn_only(dst, "dst", { [2] = true, [3] = true, [4] = true })
        P.dH, P.dT, P.dS = dyn_of(a, dst, 2), dyn_of(a, dst, 3), dyn_of(a, dst, 4)
    end
    local dynamic = (P.dH or P.dT or P.dS or P.drow or dyn(pos, 1)) and true or false
    if dynamic and P.mode & 8 ~= 0 and P.ne[4] > 1 and P.dT then fail("mrope with symbolic tokens and ne3 > 1") end

    -- Index width: 32-bit unless an offset needs more.
    local wide = false
    for _, r in ipairs({ a, dst, pos, S and S.a, S and S.ids }) do
        local m, neg = reach(r)
        if m > INT_MAX or neg then wide = true end
    end
    if ff then
        local m, neg = reach(ff)
        if m > INT_MAX or neg then wide = true end
    end

    local body = {}
    local K = {
        k = k, a = a, pos = pos, ff = ff, dst = dst, S = S, Y = Y, OT = S and S.type or a.type, DT = Y.type,
        P = P, C = C, dynamic = dynamic, wide = wide, ix = wide and "long long" or "unsigned",
        pre = prelude.new(), T = prelude.ctype[a.type], body = body, types = {},
        ne = P.ne, nd = P.nd, np = P.np, g = P.g,
    }
    function K.I(v) return tostring(v) .. (wide and "ll" or "u") end
    function K.add(s, ind) body[#body + 1] = (s == "" or s:sub(1, 1) == "#") and s or (ind or "    ") .. s end
    return K
end

-- The declaration of pointer var (to elements of C type ct) to operand r's first element.
local function ptr(K, r, var, ct, const)
    kit.check_param(fail, r, var, K.k.nparams)
    return kit.pointer(r, var, ct, const)
end

-- The kernel's name and parameter list.
local function signature(K)
    local a, nd, ne, S = K.a, K.nd, K.ne, K.S
    local plist = {}
    for q = 0, K.k.nparams - 1 do
        plist[#plist + 1] = (q == 0 and "char" or "const char") .. " *__restrict__ p" .. q
    end
    local params = table.concat(plist, ", ")
    local name = string.format("rope_%s_%s_%d_%d", K.P.kind, a.type, nd, ne[1])
    if S then name = string.format("rope_set_rows_%s_%s_%d_%d_%s_%s", K.P.kind, a.type, nd, ne[1], K.DT, S.ids.type) end
    if #params + #name > 90 then params = "\n    " .. table.concat(plist, ",\n    ") end
    if K.dynamic then params = params .. (K.k.dims_arg or ", const int *__restrict__ kdims") end
    return name, params
end

-- The pointers, then the block's token, head group and the coordinates and bases of its rows.
-- Sets K.i2 (the token coordinate), K.partial (whether the block's last head group is cut)
-- and K.nh (its head count, an expression).
local function prologue(K)
    local add, a, dst, S, P, ne, ix, I = K.add, K.a, K.dst, K.S, K.P, K.ne, K.ix, K.I
    add(ptr(K, dst, "y", prelude.ctype[K.DT], false))
    add(ptr(K, a, "x", K.T, true))
    if S then
        if not S.in_place then add(ptr(K, S.a, "ca", prelude.ctype[K.DT], true)) end
        add(ptr(K, S.ids, "ids", S.ids.type == "i64" and "long long" or "int", true))
    end
    if K.np > 0 then
        add(ptr(K, K.pos, "pos", "int", true))
        if K.ff then add(ptr(K, K.ff, "ff", "float", true)) end
    end
    add("")

    -- Token and head group.
    if S then
        scatter_prologue(S, P, dst, add, ix, I, U, K.types)
    else
        add("const unsigned tok = blockIdx.x;")
    end
    -- tok = i3 * ne2 + i2; only the coordinates something reads are declared.
    local i2, i3 = "0u", "0u"
    local gate_t, gate_s = not S and P.dT, P.dS -- coordinates checked against run-time extents
    if ne[3] > 1 then
        i2 = ne[4] > 1 and "i2" or "tok"
        if ne[4] > 1 and (K.np > 0 or a.st[3] ~= 0 or gate_t) then add(string.format("const unsigned i2 = tok %% %s;", U(ne[3]))) end
    end
    if ne[4] > 1 and (a.st[4] ~= 0 or gate_s) then
        i3 = "i3"
        add(string.format("const unsigned i3 = tok / %s;", U(ne[3])))
    end
    local gates = {}
    if gate_t then gates[#gates + 1] = string.format("%s >= (unsigned)(%s)", ne[3] > 1 and i2 or "tok", P.dT) end
    if gate_s then gates[#gates + 1] = string.format("%s >= (unsigned)(%s)", ne[4] > 1 and i3 or "tok", P.dS) end
    if #gates > 0 then
        add(string.format("if (%s)", table.concat(gates, " || ")))
        add("return; /* past the run-time token count */", "        ")
    end
    local aterms = {}
    if ne[3] > 1 and a.st[3] ~= 0 then aterms[#aterms + 1] = string.format("(%s)%s * %s", ix, i2, I(a.st[3])) end
    if ne[4] > 1 and a.st[4] ~= 0 then aterms[#aterms + 1] = string.format("(%s)%s * %s", ix, i3, I(a.st[4])) end
    add(string.format("const %s xbase = %s;", ix, #aterms > 0 and table.concat(aterms, " + ") or I(0)))
    if S then
        add(string.format("const %s ybase = (%s)row * %s;", ix, ix, I(dst.st[2])))
    else
        add(string.format("const %s ybase = (%s)tok * %s;", ix, ix, I(ne[1] * ne[2])))
    end
    if S and P.hg > 1 then
        add(string.format("const unsigned hb = blockIdx.x %% %s * %s; /* first head of the block */", U(P.hg), U(P.hpb)))
    elseif P.hg > 1 then
        add(string.format("const unsigned hb = blockIdx.y * %s; /* first head of the block */", U(P.hpb)))
    else
        add("const unsigned hb = 0u; /* first head of the block */")
    end
    local partial = ne[2] % P.hpb ~= 0
    if P.dH then
        -- heads at run time: blocks past them return, the last one takes what is left
        partial = true
        add(string.format("const unsigned nhead = (unsigned)(%s);", P.dH))
        add("if (hb >= nhead)")
        add("return;", "        ")
        add(string.format("const unsigned nh = nhead - hb < %s ? nhead - hb : %s;", U(P.hpb), U(P.hpb)))
    elseif partial then
        add(string.format("const unsigned nh = %s - hb < %s ? %s - hb : %s;", U(ne[2]), U(P.hpb), U(ne[2]), U(P.hpb)))
    end
    K.i2, K.partial, K.nh = i2, partial, partial and "nh" or U(P.hpb)
end

-- Offsets of element e (an expression) of head h (an expression) in x and y.
local function xoff(K, h, e)
    local a, ix, I = K.a, K.ix, K.I
    local s = "xbase"
    if K.ne[2] > 1 and a.st[2] ~= 0 then s = s .. string.format(" + (%s)(%s) * %s", ix, h, I(a.st[2])) end
    if a.st[1] == 1 then return s .. string.format(" + (%s)", e) end
    return s .. string.format(" + (%s)(%s) * %s", ix, e, I(a.st[1]))
end
local function yoff(K, h, e)
    return string.format("ybase + (%s)(%s) * %s + (%s)", K.ix, h, K.I(K.ne[1]), e)
end

-- 3. the copied tail (ne0 - n_dims elements per row), element by element.
local function copy_tail(K)
    local P, add, pre = K.P, K.add, K.pre
    if P.pt <= 0 then return end
    add(string.format("for (unsigned v = threadIdx.x; v < %s * %s; v += %s) {", K.nh, U(P.pt), U(P.block)))
    add(string.format("const unsigned h = hb + v / %s, e = %s + v %% %s;", U(P.pt), U(K.nd), U(P.pt)), "        ")
    local v = string.format("x[%s]", xoff(K, "h", "e"))
    if K.S then v = pre.store(K.DT, pre.round(K.OT, pre.load(K.a.type, v))) end
    add(string.format("y[%s] = %s;", yoff(K, "h", "e"), v), "        ")
    add("}")
end

-- The vector types of a vectorized plan: K.vt (a's) and K.ovt (Y's: the same when as wide).
local function vector_types(K)
    local P, a, DT, types = K.P, K.a, K.DT, K.types
    if not P.vec then return end
    local vt = string.format("kiln_rope_%sx%d", a.type == "f32" and "f32" or "u16", P.ve)
    types[#types + 1] = string.format("struct alignas(%d) %s {\n    %s v[%d];\n};", P.ve * SIZE[a.type], vt, K.T, P.ve)
    local ovt = vt
    if SIZE[DT] ~= SIZE[a.type] then
        ovt = string.format("kiln_rope_%sx%d", DT == "f32" and "f32" or "u16", P.ve)
        types[#types + 1] = string.format("struct alignas(%d) %s {\n    %s v[%d];\n};", P.ve * SIZE[DT], ovt,
            prelude.ctype[DT], P.ve)
    end
    K.vt, K.ovt = vt, ovt
end

-- The rotated value v (f32) as stored: rounded to the op type, converted to Y's type.
local function out(K, v)
    if K.S then return K.pre.store(K.DT, K.pre.round(K.OT, v)) end
    return K.pre.store(K.a.type, v)
end

-- ---- units: the pairs a thread rotates ---------------------------------------------------------

-- The parts of a unit: one run of 2G elements (normal) or two runs of G (the others).
-- A part is read into raw registers (a vector, or G scalars) named by its prefix.
local function parts_of(K)
    local g = K.g
    if K.P.kind == "normal" then return { { e = function(i) return "2u * " .. i end, n = 2 * g, pfx = "r" } } end
    return {
        { e = function(i) return i end, n = g, pfx = "ra" },
        { e = function(i) return i .. " + " .. U(K.P.off) end, n = g, pfx = "rb" },
    }
end
local function raw(K, part, j, m)
    if K.P.vec then return string.format("%s%d.v[%d]", part.pfx, j, m) end
    return string.format("%s%d_%d", part.pfx, j, m)
end

-- Lines reading unit j's parts (head h<j>, first pair i<j>) into registers: declared here
-- (decl), or assigned to registers declared earlier.
local function load_unit(K, j, ind, decl)
    local add, vt = K.add, K.vt
    for _, part in ipairs(parts_of(K)) do
        local e = part.e("i" .. j)
        local h = "h" .. j
        if K.P.vec then
            add(string.format("%s%s%d = *(const %s *)(x + %s);", decl and "const " .. vt .. " " or "", part.pfx, j,
                vt, xoff(K, h, e)), ind)
        else
            for m = 0, part.n - 1 do
                add(string.format("%s%s = x[%s];", decl and "const " .. K.T .. " " or "", raw(K, part, j, m),
                    xoff(K, h, e .. " + " .. U(m))), ind)
            end
        end
    end
end

-- Lines rotating unit j (cache entries from chunk-relative pair q) and storing it.
local function rotate_unit(K, j, ind)
    local add, pre, g = K.add, K.pre, K.g
    local parts = parts_of(K)
    local function rot(m, x0, x1, cidx, out0, out1)
        add(string.format("const float2 c%d_%d = cs[q%d + %s];", j, m, j, U(cidx)), ind)
        local c = string.format("c%d_%d", j, m)
        add(string.format("const float x0_%d_%d = %s, x1_%d_%d = %s;", j, m, pre.load(K.a.type, x0), j, m,
            pre.load(K.a.type, x1)), ind)
        local X0, X1 = string.format("x0_%d_%d", j, m), string.format("x1_%d_%d", j, m)
        out0[#out0 + 1], out1[#out1 + 1] = angle.rotate(X0, X1, c .. ".x", c .. ".y")
    end
    local outs = {}
    if K.P.kind == "normal" then
        local o = {}
        for m = 0, g - 1 do
            local o0, o1 = {}, {}
            rot(m, raw(K, parts[1], j, 2 * m), raw(K, parts[1], j, 2 * m + 1), m, o0, o1)
            o[2 * m + 1], o[2 * m + 2] = o0[1], o1[1]
        end
        outs[1] = o
    else
        local o0, o1 = {}, {}
        for m = 0, g - 1 do rot(m, raw(K, parts[1], j, m), raw(K, parts[2], j, m), m, o0, o1) end
        outs[1], outs[2] = o0, o1
    end
    for pi, part in ipairs(parts) do
        local e = part.e("i" .. j)
        local h = "h" .. j
        if K.P.vec then
            add(string.format("%s o%d_%d;", K.ovt, j, pi), ind)
            for m = 0, part.n - 1 do
                add(string.format("o%d_%d.v[%d] = %s;", j, pi, m, out(K, outs[pi][m + 1])), ind)
            end
            add(string.format("*(%s *)(y + %s) = o%d_%d;", K.ovt, yoff(K, h, e), j, pi), ind)
        else
            for m = 0, part.n - 1 do
                add(string.format("y[%s] = %s;", yoff(K, h, e .. " + " .. U(m)), out(K, outs[pi][m + 1])), ind)
            end
        end
    end
end

-- Lines defining unit j's head h<j>, chunk-relative pair q<j> and pair i<j> from unit index u
-- (uph: units per head, an expression).
local function unit_index(K, j, u, c0, uph, ind)
    if uph == "1u" then
        K.add(string.format("const unsigned h%d = hb + %s, q%d = 0u;", j, u, j), ind)
    else
        K.add(string.format("const unsigned h%d = hb + %s / %s, q%d = %s %% %s * %s;", j, u, uph, j, u, uph, U(K.g)),
            ind)
    end
    K.add(string.format("const unsigned i%d = %s + q%d;", j, c0, j), ind)
end

-- ---- 1. the cos/sin cache ----------------------------------------------------------------------

-- The mrope sections of the node: K.mrope (whether the mode has them), K.sec, their sum K.sd and
-- the first pairs of the third and fourth, K.sec_w and K.sec_e; K.TS, theta_scale as C.
local function sections(K)
    local P = K.P
    K.mrope = P.mode == 8 or P.mode == 24 or P.mode == 40
    local sec = K.k.params.sections
    K.sec, K.sd = sec, sec[1] + sec[2] + sec[3] + sec[4]
    if K.mrope and K.sd <= 0 then fail("mode %d needs sections with a positive sum", P.mode) end
    K.sec_w, K.sec_e = sec[1] + sec[2], sec[1] + sec[2] + sec[3]
    K.TS = lit(K.C.theta_scale)
end

-- One step of ggml's theta chain(s) to the next pair.
local function step_chain(K, ind)
    local add, TS = K.add, K.TS
    if not K.mrope then
        add(string.format("t = __fmul_rn(t, %s);", TS), ind)
        return
    end
    add(string.format("tt = __fmul_rn(tt, %s); th = __fmul_rn(th, %s);", TS, TS), ind)
    add(string.format("tw = __fmul_rn(tw, %s); te = __fmul_rn(te, %s);", TS, TS), ind)
end

-- Vision restarts each section's chain at its first pair (ggml's indep_sects), in ggml's
-- if/else order; a repeated constant could never be reached, so it is left out.
local function resets(K, kvar, ind)
    if K.P.mode ~= 24 then return end
    local add, sec = K.add, K.sec
    local seen, first = {}, true
    add(string.format("{ const int s = (int)(%s %% %s);", kvar, U(K.sd)), ind)
    for _, r in ipairs({ { 0, "tt", "pt" }, { sec[1], "th", "ph" }, { K.sec_w, "tw", "pw" }, { K.sec_e, "te", "pe" } }) do
        if not seen[r[1]] then
            seen[r[1]] = true
            add(string.format("  %sif (s == %d) %s = %s;", first and "" or "else ", r[1], r[2], r[3]), ind)
            first = false
        end
    end
    add("}", ind)
end

-- theta of pair i: the chain's, or with mrope the one of i's section.
local function pick(K, ind)
    local add, sec, sec_w = K.add, K.sec, K.sec_w
    if not K.mrope then
        add("const float theta = t;", ind)
        return
    end
    add(string.format("const int s = (int)(i %% %s);", U(K.sd)), ind)
    add("float theta = tt;", ind)
    if K.P.mode == 40 then
        add(string.format("if (s %% 3 == 1 && s < %d) theta = th;", 3 * sec[2]), ind)
        add(string.format("else if (s %% 3 == 2 && s < %d) theta = tw;", 3 * sec[3]), ind)
        add(string.format("else if (s %% 3 == 0 && s < %d) theta = tt;", 3 * sec[1]), ind)
        add("else theta = te;", ind)
    else
        add(string.format("if (s >= %d && s < %d) theta = th;", sec[1], sec_w), ind)
        add(string.format("else if (s >= %d && s < %d) theta = tw;", sec_w, sec_w + sec[3]), ind)
        add(string.format("else if (s >= %d) theta = te;", sec_w + sec[3]), ind)
    end
end

-- The cache of pairs [c0, c0 + chn): cs[q] = (cos, sin) of pair c0 + q.
local function cache_phase(K, c0, chn, ind)
    local add, ff = K.add, K.ff
    local in2 = ind .. "    "
    add(string.format("for (unsigned q = threadIdx.x; q < %s; q += %s) {", chn, U(K.P.block)), ind)
    add(string.format("const unsigned i = %s + q;", c0), in2)
    add("for (; k < i; k++) {", in2)
    resets(K, "k", in2 .. "    ")
    step_chain(K, in2 .. "    ")
    add("}", in2)
    resets(K, "i", in2)
    pick(K, in2)
    angle.lines(K.k, K.C, add, in2, {
        i = "i",
        ff = ff and string.format("ff[(%s)i * %s]", K.ix, K.I(ff.st[1])),
        store = function(c, s) return string.format("cs[q] = make_float2(%s, %s);", c, s) end,
    })
    add("}", ind)
end

-- The cache in shared memory and the chains' start: the token's position(s).
local function chain_start(K)
    local add, ne, P, i2 = K.add, K.ne, K.P, K.i2
    add(string.format("__shared__ float2 cs[%d];", P.ch))
    local function posv(kk)
        local idx = kk == 0 and i2 or string.format("(%s + %s)", i2, U(kk * ne[3]))
        if kk > 0 and P.dT then
            -- the four blocks of positions are n_tokens apart at run time
            idx = string.format("(%s + %s * (unsigned)(%s))", i2, U(kk), P.dT)
        end
        return string.format("(float)pos[(%s)%s * %s]", K.ix, idx, K.I(K.pos.st[1]))
    end
    if K.mrope then
        add(string.format("const float pt = %s, ph = %s;", posv(0), posv(1)))
        add(string.format("const float pw = %s, pe = %s;", posv(2), posv(3)))
        add("float tt = pt, th = ph, tw = pw, te = pe; /* ggml's four chains, at pair k */")
    else
        add(string.format("float t = %s; /* ggml's chain theta_k = pos * theta_scale^k, at pair k */", posv(0)))
    end
    add("unsigned k = 0u;")
    add("")
end

-- ---- 2. the rotation ---------------------------------------------------------------------------

-- 2a. the units into registers, then the tail copy, the cache, the rotation.
local function prefetched(K)
    local add, P, np, nh = K.add, K.P, K.np, K.nh
    local guards = {}
    for j = 0, P.u - 1 do
        local u = string.format("(threadIdx.x + %s)", U(j * P.block))
        if j == 0 then u = "threadIdx.x" end
        local guard
        if K.partial or (j + 1) * P.block > P.nu then
            guard = string.format("%s < %s * %s", u, nh, U(P.uph))
        end
        guards[j] = guard
        add(string.format("/* unit %d */", j))
        unit_index(K, j, u, "0u", U(P.uph), "    ")
        if P.vec then
            for _, part in ipairs(parts_of(K)) do add(string.format("%s %s%d;", K.vt, part.pfx, j)) end
        else
            for _, part in ipairs(parts_of(K)) do
                local names = {}
                for m = 0, part.n - 1 do names[#names + 1] = raw(K, part, j, m) end
                add(string.format("%s %s;", K.T, table.concat(names, ", ")))
            end
        end
        if guard then add(string.format("if (%s) {", guard)) end
        load_unit(K, j, guard and "        " or "    ", false)
        if guard then add("}") end
    end
    add("")
    copy_tail(K)
    cache_phase(K, "0u", U(np), "    ")
    add("__syncthreads();")
    for j = 0, P.u - 1 do
        if guards[j] then
            add(string.format("if (%s) {", guards[j]))
            rotate_unit(K, j, "        ")
            add("}")
        else
            rotate_unit(K, j, "    ")
        end
    end
end

-- 2b. chunk by chunk: the cache, then every unit of the chunk.
local function chunked(K)
    local add, P, np = K.add, K.P, K.np
    copy_tail(K)
    local c0, chn, ind = "0u", U(np), "    "
    if P.nchunks > 1 then
        add(string.format("for (unsigned c0 = 0u; c0 < %s; c0 += %s) {", U(np), U(P.ch)))
        add(string.format("const unsigned chn = %s - c0 < %s ? %s - c0 : %s;", U(np), U(P.ch), U(np), U(P.ch)),
            "        ")
        c0, chn, ind = "c0", "chn", "        "
    end
    cache_phase(K, c0, chn, ind)
    add("__syncthreads();", ind)
    local uph = P.nchunks > 1 and string.format("(chn / %s)", U(K.g)) or U(P.uph)
    add(string.format("for (unsigned u = threadIdx.x; u < %s * %s; u += %s) {", K.nh, uph, U(P.block)), ind)
    local in2 = ind .. "    "
    unit_index(K, 0, "u", c0, uph, in2)
    load_unit(K, 0, in2, true)
    rotate_unit(K, 0, in2)
    add("}", ind)
    if P.nchunks > 1 then
        add("__syncthreads();", ind)
        add("}")
    end
end

-- ---- the template ------------------------------------------------------------------------------

-- The kernel's header: what kernel{} prints above the code.
local function header(K, name)
    local P, k, C, sec, ff, pos, a = K.P, K.k, K.C, K.sec, K.ff, K.pos, K.a
    local pairs_note = ({
        normal = " (2i, 2i+1)",
        neox = string.format(" (i, i+%d)", P.off),
        mrope = string.format(" (i, i+%d), sections [%d, %d, %d, %d]", P.off, sec[1], sec[2], sec[3], sec[4]),
        imrope = string.format(" (i, i+%d), interleaved sections [%d, %d, %d, %d]", P.off, sec[1], sec[2], sec[3], sec[4]),
        vision = string.format(" (i, i+%d), sections [%d, %d, %d, %d] restart", P.off, sec[1], sec[2], sec[3], sec[4]),
    })[P.kind]
    local sym = {}
    for _, d in ipairs({ { "heads", P.dH }, { "tokens", P.dT }, { "sequences", P.dS }, { "cache rows", P.drow },
        { "positions", dyn(pos, 1) } }) do
        if d[2] then sym[#sym + 1] = d[1] .. " " .. d[2] end
    end
    local nd, np, ne = K.nd, K.np, K.ne
    return {
        name = name, mode = P.mode, kind = P.kind, atype = a.type, ane = a.ne, ast = a.st, aoffs = a.offs,
        dims = dims, nd = nd, np = np, pairs = pairs_note,
        copied = P.pt > 0 and string.format("elements %d..%d copied", nd, ne[1] - 1) or "nothing copied",
        ts = K.TS, fs = k.params.freq_scale, ef = k.params.ext_factor, ms = lit(C.mscale),
        yarn = k.values.ext_factor ~= 0 and string.format(", ramp low %s den %s", lit(C.low), lit(C.den)) or "",
        pst = tostring(pos.st[1]), poffs = tostring(pos.offs),
        ffnote = ff and string.format("; freq_factors f32 st %d offs %d", ff.st[1], ff.offs) or "",
        gx = tostring(P.tokens), gy = tostring(P.hg), hpb = tostring(P.hpb), block = tostring(P.block),
        g = tostring(K.g), how = P.vec and string.format("vectors of %d", P.ve) or "element by element",
        chunks = np == 0 and "no pairs" or (P.nchunks == 1 and
            (P.prefetch and string.format("one chunk, %d unit(s) per thread in registers", P.u) or "one chunk")
            or string.format("%d chunks of %d pairs", P.nchunks, P.ch)),
        bits = K.wide and "64" or "32",
        scatter = K.S and scatter_notes(K.S, P, K.dst) or {}, symbolic = table.concat(sym, ", "),
    }
end

return function(k)
    local K = node_of(k)
    local name, params = signature(K)
    prologue(K)
    vector_types(K)
    sections(K)
    if K.np > 0 then
        chain_start(K)
        if K.P.prefetch then prefetched(K) else chunked(K) end
    else
        copy_tail(K)
    end

    local t = header(K, name)
    t.pre, t.types, t.params, t.body = (K.pre.code():gsub("\n$", "")), K.types, params, K.body
    local source = kernel(t)
    local S, P, dst = K.S, K.P, K.dst
    if S then
        local grid = P.tokens * P.hg
        if not S.in_place then grid = grid + ceil_div(dst.ne[2], P.block // 32) end
        if grid > 2147483647 then fail("rope_set_rows: %d blocks exceed the grid", grid) end
        return { name = name, source = source, grid = { grid, 1, 1 }, block = { P.block, 1, 1 }, smem = 0,
            fused = "rope_set_rows", dynamic = K.dynamic or nil }
    end
    return { name = name, source = source, grid = { P.tokens, P.hg, 1 }, block = { P.block, 1, 1 }, smem = 0,
        dynamic = K.dynamic or nil }
end
