-- norm: the kernel template of the norm family (norm, rms_norm, l2_norm, group_norm); see
-- docs/templates.md for the table k of IR_OP nodes and docs/ops-norm.md for the semantics.
--
-- Every op normalizes "segments" of its operand: a row (dim 0) for norm, rms_norm and l2_norm,
-- and for group_norm the ne0*ne1*step elements of one group of channels (dim 2) at one i3.
-- One segment is reduced by one team of threads:
--
-- * rows of up to WARP_MAX elements: a team of TPR <= 32 lanes (the smallest power of two
--   covering the row's vectors), BLOCK_SMALL / TPR rows per block, shuffles only;
-- * longer rows and groups: one block per segment, warp shuffles then shared memory.
--
-- Each thread moves VEC consecutive elements at a time: one 16-byte load or store when the
-- layout allows it (checked here on the static offsets and strides; buffers are 256-byte
-- aligned), else VEC element accesses. When the segment fits (CACHE_MAX elements per thread),
-- it is read once into registers and written from them; otherwise each pass reads it again
-- (a row or group just read, so mostly from cache).
--
-- Sums are doubles (ggml sums in ggml_float): each thread adds the f32 sum of one access's VEC
-- values (as ggml's SIMD paths add one vector's f32 sum at a time) to a double, then the team
-- reduces by xor butterflies, so every lane of every warp ends with the bitwise-same sum and the
-- whole segment uses one scale. Widening every element to double instead would make norm bf16
-- conversion-bound (f32<->f64 conversions run at 16 per clock per SM). The rounding steps in
-- float after the sums follow ggml's CPU kernels exactly (see ir/ref_norm.c).

local kit = require("kit")
local tpl = require("tpl")
local prelude = require("prelude")
local E = require("epilogue")

local SIZE = { f32 = 4, f16 = 2, bf16 = 2 }
local INT_MAX = 2147483647
local WARP_MAX = 1024   -- rows up to this many elements: a team of at most one warp per row
local BLOCK_SMALL = 256 -- block of the small-row kernel
local PER_THREAD = 16   -- elements per thread the block kernel aims for
local CACHE_MAX = 32    -- at most this many elements cached per thread (64 registers at 1024 threads)
local MAX_BLOCK = 1024
local MAX_GRID = 2147483647

local fail = kit.failer("norm")

local dims = kit.dims

local check_ref = kit.ref_checker(fail, { types = SIZE, min_ne = 0 })

local round_up = kit.round_up
local ceil_div = kit.ceil_div

-- Largest element offset r reaches, and whether an offset or stride is negative.
local reach = kit.reach

-- Largest power of two <= 16 bytes of type t that divides n (elements), at least 1.
local function vec_of(t, n)
    local v = 16 // SIZE[t]
    while v > 1 and n % v ~= 0 do v = v // 2 end
    return v
end

-- True when the elements of dims 0..last of r are contiguous in that order (as one run).
local function collapsible(r, last)
    local s = 1
    for d = 1, last do
        if r.ne[d] > 1 and r.st[d] ~= s then return false end
        s = s * r.ne[d]
    end
    return true
end

-- ---- segments -----------------------------------------------------------------------------
--
-- A plan describes the segments: count, the length (a constant, or a runtime expression with
-- its largest value), the C expressions of a segment's base offset in the input and output, and
-- how element j of a segment is addressed (`step` elements apart when linear, or decomposed).

-- Offset expression of r's rows: row (a 32-bit index of rows over dims 1..3) -> i1, i2, i3.
local function row_base(r, ne, I, lines, pfx)
    -- Rows laid out uniformly (dims 1..3 collapse into one stride): row * st1.
    local uniform, s = true, nil
    for d = 2, 4 do
        if ne[d] > 1 then
            if s == nil then s = r.st[d]
            elseif r.st[d] ~= s then uniform = false end
            s = s * ne[d]
        end
    end
    if uniform then
        local first = nil
        for d = 2, 4 do if ne[d] > 1 then first = d break end end
        if not first then return I(0) end
        return "(" .. I("row") .. " * " .. I(r.st[first]) .. ")"
    end
    local terms, stride = {}, 1
    local last = 1
    for d = 2, 4 do if ne[d] > 1 then last = d end end
    for d = 2, 4 do
        if ne[d] > 1 then
            local e = "row"
            if stride > 1 then e = e .. " / " .. tostring(stride) .. "u" end
            if d < last then e = "(" .. e .. ") % " .. tostring(ne[d]) .. "u" end
            lines[#lines + 1] = string.format("const unsigned %s%d = %s;", pfx, d - 1, e)
            terms[#terms + 1] = I(pfx .. (d - 1)) .. " * " .. I(r.st[d])
        end
        stride = stride * ne[d]
    end
    return "(" .. table.concat(terms, " + ") .. ")"
end

-- ---- the kernel ---------------------------------------------------------------------------

local kernel = tpl.define [[
// kiln norm kernel ${name}: ${what}
// ${shape}
@ for _, l in ipairs(notes) do
//   ${l}
@ end
// launch: ${launch}
@ if pre ~= "" then

${pre}
@ end
@ for _, t in ipairs(types) do

${t}
@ end
@ if not empty then

static __device__ __forceinline__ double kiln_team_sum(double s)
{
@ for _, o in ipairs(shuffles) do
    s += __shfl_xor_sync(0xffffffffu, s, ${o});
@ end
    return s;
}
@ end

extern "C" __global__ void __launch_bounds__(${block})
${name}(${params})
{
@ for _, s in ipairs(body) do
${s}
@ end
}
]]

-- Emits the kernel. c holds the plan (see the callers).
local function emit(c)
    local pre = prelude.new()
    local t, dt = c.in_type, c.out_type
    local VEC, I, ix = c.vec, c.I, c.ix
    local body, types = {}, {}
    local depth = 1
    local function add(s)
        if s == "" then body[#body + 1] = "" return end
        body[#body + 1] = string.rep("    ", depth) .. s
    end
    local function vtype(ty)
        local nm = string.format("kiln_%sx%d", ty == "f32" and "f32" or "u16", VEC)
        for _, x in ipairs(types) do if x:find(nm .. " {", 1, true) then return nm end end
        types[#types + 1] = string.format("struct alignas(%d) %s {\n    %s v[%d];\n};", VEC * SIZE[ty], nm,
            prelude.ctype[ty], VEC)
        return nm
    end

    add(string.format("const %s *const in = (const %s *)p%d%s;", prelude.ctype[t], prelude.ctype[t], c.in_param,
        c.in_offs ~= 0 and (" + " .. I(c.in_offs)) or ""))
    add(string.format("%s *const out = (%s *)p%d%s;", prelude.ctype[dt], prelude.ctype[dt], c.out_param,
        c.out_offs ~= 0 and (" + " .. I(c.out_offs)) or ""))
    for _, o in ipairs(c.epi or {}) do
        local ct = prelude.ctype[o.ref.type]
        add(string.format("const %s *const e%d = (const %s *)p%d%s;", ct, o.j, ct, o.ref.param,
            o.ref.offs ~= 0 and (" + " .. I(o.ref.offs)) or ""))
    end
    if c.empty then
        add("(void)in;")
        add("(void)out;")
        return body, types, pre
    end
    for _, l in ipairs(c.prologue) do add(l) end
    add(string.format("const %s *const x = in + %s;", prelude.ctype[t], c.base_in))
    add(string.format("%s *const y = out + %s;", prelude.ctype[dt], c.base_out))

    -- Element offsets of vector group g (a C expression) in x and y.
    local function elem_at(which, g, k)
        local a = c[which]
        local e = string.format("%s * %s + %s", g, I(VEC), I(k))
        if VEC == 1 then e = g end
        if a.linear then
            if a.step == 1 then return e end
            return "(" .. e .. ") * " .. I(a.step)
        end
        return a.decompose("(" .. e .. ")")
    end
    local function idx(base, k)
        if base == "0" then return tostring(k) end
        return base .. " + " .. k
    end
    -- Statements loading group g into float array dst at index base (a C expression).
    local function load_group(g, dst, base, ind)
        local out = {}
        if c.x.vector then
            local vt = vtype(t)
            out[#out + 1] = string.format("const %s u = *(const %s *)(x + %s * %s);", vt, vt, g, I(VEC))
            for k = 0, VEC - 1 do
                out[#out + 1] = string.format("%s[%s] = %s;", dst, idx(base, k), pre.load(t, "u.v[" .. k .. "]"))
            end
        else
            for k = 0, VEC - 1 do
                out[#out + 1] = string.format("%s[%s] = %s;", dst, idx(base, k), pre.load(t, "x[" .. elem_at("x", g, k) .. "]"))
            end
        end
        for _, l in ipairs(out) do add(ind .. l) end
    end
    -- With an epilogue, element k of group g is the epilogue of op value vals(k) at coordinate
    -- i0 = g * VEC + k of the segment's row (operands read through e<j>, row part eb<j>).
    local function epilogue_group(g, vals, ind, put)
        for _, o in ipairs(c.epi) do
            if o.vector then
                local vt = vtype(o.ref.type)
                add(ind .. string.format("const %s ev%d = *(const %s *)(e%d + eb%d + %s * %s);", vt, o.j, vt, o.j, o.j,
                    g, I(VEC)))
            end
        end
        for k = 0, VEC - 1 do
            local loads = {}
            local i0 = VEC == 1 and g or string.format("%s * %s + %s", g, I(VEC), I(k))
            for _, o in ipairs(c.epi) do
                if o.vector then
                    loads[o.j] = pre.load(o.ref.type, string.format("ev%d.v[%d]", o.j, k))
                else
                    local off = E.offset(o.ref, c.dne, { i0 }, I)
                    loads[o.j] = pre.load(o.ref.type, string.format("e%d[eb%d + %s]", o.j, o.j, off))
                end
            end
            local lines, r = E.lines(c.k, pre, { vals(k) }, loads, "e" .. k .. "_")
            add(ind .. "{")
            for _, l in ipairs(lines) do add(ind .. "    " .. l) end
            add(ind .. "    " .. put(k, pre.store(dt, r)))
            add(ind .. "}")
        end
    end
    local function store_group(g, vals, ind)
        if c.epi then
            if c.y.vector then
                local vt = vtype(dt)
                add(ind .. string.format("%s o;", vt))
                epilogue_group(g, vals, ind, function(k, v) return string.format("o.v[%d] = %s;", k, v) end)
                add(ind .. string.format("*(%s *)(y + %s * %s) = o;", vt, g, I(VEC)))
            else
                epilogue_group(g, vals, ind, function(k, v) return string.format("y[%s] = %s;", elem_at("y", g, k), v) end)
            end
        elseif c.y.vector then
            local vt = vtype(dt)
            add(ind .. string.format("%s o;", vt))
            for k = 0, VEC - 1 do add(ind .. string.format("o.v[%d] = %s;", k, pre.store(dt, vals(k)))) end
            add(ind .. string.format("*(%s *)(y + %s * %s) = o;", vt, g, I(VEC)))
        else
            for k = 0, VEC - 1 do
                add(ind .. string.format("y[%s] = %s;", elem_at("y", g, k), pre.store(dt, vals(k))))
            end
        end
    end

    local op = c.op
    local G, TPR = c.groups, c.tpr -- vector groups per segment (expression), threads per segment
    local guard_all = c.live and "live && " or ""
    -- The loop over this thread's groups: `cached` loops are fully unrolled over CH chunks.
    -- uses_g: f addresses memory (else g is declared only when a guard needs it).
    local function for_groups(f, uses_g)
        if c.cached then
            add("#pragma unroll")
            add(string.format("for (unsigned ch = 0; ch < %du; ch++) {", c.ch))
            depth = depth + 1
            if uses_g or c.guard then add(string.format("const unsigned g = ch * %du + lane;", TPR)) end
            local need = c.guard or c.live
            if need then
                local cond = {}
                if c.live then cond[#cond + 1] = "live" end
                if c.guard then cond[#cond + 1] = "g < " .. G end
                add("if (" .. table.concat(cond, " && ") .. ") {")
                depth = depth + 1
            end
            f("ch * " .. VEC)
            if need then
                depth = depth - 1
                add("}")
            end
            depth = depth - 1
            add("}")
        else
            add(string.format("for (unsigned g = lane; %sg < %s; g += %du) {", guard_all, G, TPR))
            depth = depth + 1
            f(nil)
            depth = depth - 1
            add("}")
        end
    end
    local function reduce(var, slot)
        if c.block then
            add(string.format("%s = kiln_team_sum(%s);", var, var))
            add(string.format("if ((threadIdx.x & 31u) == 0u) red[%d][threadIdx.x >> 5] = %s;", slot, var))
            add("__syncthreads();")
            add(string.format("%s = kiln_team_sum((threadIdx.x & 31u) < %du ? red[%d][threadIdx.x & 31u] : 0.0);", var,
                c.block // 32, slot))
        else
            add(string.format("%s = kiln_team_sum(%s);", var, var))
        end
    end
    if c.block then add(string.format("__shared__ double red[%d][32];", (op == "norm" or op == "group_norm") and 2 or 1)) end

    local xv = "xv" -- cached values: float xv[CH * VEC]
    local nvals = c.ch * VEC
    if c.cached then
        add(string.format("float %s[%d];", xv, nvals))
        if c.guard or c.live then
            add("#pragma unroll")
            add(string.format("for (unsigned i = 0; i < %du; i++)", nvals))
            add(string.format("    %s[i] = 0.0f;", xv))
        end
    end
    -- Calls f(k, val) inside the group loop with val the f32 value of element k of the group;
    -- in the cached kernel the first call loads the segment into registers.
    local loaded = false
    local function each_value(f)
        local first = not loaded
        for_groups(function(base)
            if c.cached then
                if not loaded then load_group("g", xv, base, "") end
                local vals = {}
                for k = 0, VEC - 1 do vals[#vals + 1] = string.format("%s[%s]", xv, idx(base, k)) end
                f(vals)
            else
                add(string.format("float v[%d];", VEC))
                load_group("g", "v", "0", "")
                local vals = {}
                for k = 0, VEC - 1 do vals[#vals + 1] = string.format("v[%d]", k) end
                f(vals)
            end
        end, first or not c.cached)
        loaded = true
    end

    -- Stores every element as the format fmt (one %s: the element's value), from the cached
    -- copy or loaded again.
    local function store_all(fmt)
        if c.cached then
            for_groups(function(base)
                store_group("g", function(k) return fmt:format(xv .. "[" .. idx(base, k) .. "]") end, "")
            end, true)
        else
            for_groups(function()
                add(string.format("float v[%d];", VEC))
                load_group("g", "v", "0", "")
                store_group("g", function(k) return fmt:format("v[" .. k .. "]") end, "")
            end, true)
        end
    end

    local n_f, n_d = c.n_float, c.n_double -- the element count as float / double C expressions
    if op == "rms_norm" or op == "l2_norm" then
        add("double s = 0.0;")
        each_value(function(vals)
            add(string.format("s += (double)(%s);", tpl.map_join(vals, " + ", function(v) return v .. " * " .. v end)))
        end)
        reduce("s", 0)
        if op == "rms_norm" then
            add(string.format("const float mean = (float)(s / %s);", n_d))
            add(string.format("const float scale = 1.0f / sqrtf(mean + %s);", c.eps))
        else
            add(string.format("const float scale = 1.0f / fmaxf(sqrtf((float)s), %s);", c.eps))
        end
        store_all("%s * scale")
    else
        -- norm: the f32 sum divided in f32; group_norm: the double mean rounded (ggml differs).
        add("double s = 0.0;")
        each_value(function(vals) add(string.format("s += (double)(%s);", table.concat(vals, " + "))) end)
        reduce("s", 0)
        if op == "norm" then
            add(string.format("const float mean = (float)s / %s;", n_f))
        else
            add(string.format("const float mean = (float)(s / %s);", n_d))
        end
        add("double s2 = 0.0;")
        each_value(function(vals)
            local sq = {}
            for k, v in ipairs(vals) do
                add(string.format("const float d%d = %s - mean;", k - 1, v))
                sq[k] = string.format("d%d * d%d", k - 1, k - 1)
            end
            add(string.format("s2 += (double)(%s);", table.concat(sq, " + ")))
        end)
        reduce("s2", 1)
        add(string.format("const float var = (float)(s2 / %s);", n_d))
        add(string.format("const float scale = 1.0f / sqrtf(var + %s);", c.eps))
        store_all("(%s - mean) * scale")
    end
    return body, types, pre
end

-- Whether vector groups of VEC elements of r (linear with unit step inside a segment) can be
-- read as aligned 16-byte-or-smaller vectors: every segment base and group is aligned.
local function aligned(r, vec, bases)
    local bytes = vec * SIZE[r.type]
    if (r.offs * SIZE[r.type]) % bytes ~= 0 then return false end
    for _, s in ipairs(bases) do
        if (s * SIZE[r.type]) % bytes ~= 0 then return false end
    end
    return true
end

-- ---- symbolic dims ----------------------------------------------------------------------------
--
-- ref.dyn[d] (nil when static) is the C int expression of dim d-1's run-time extent (ne[d] is its
-- maximum, the strides stay those of the layout at the maximum). Row norms take dynamic row dims
-- (1..3): the launch covers the maximum rows; `nrows`, the run-time row count, bounds the row
-- index (blocks past it return at once), and the row index is decomposed with the run-time
-- extents into r1..r3 (no run-time division when only the outermost row dim is dynamic).
-- group_norm takes a dynamic dim 3. A dynamic row length (dim 0) is refused.

-- The dynamic dims of the node: { ext = { [d] = "dn<d-1>" }, decl = {...}, static = product of
-- the static row dims }, or nil. `allowed[d]` lists the dims that may be dynamic.
local function dyn_plan(k, allowed)
    local dst = k.dst
    local ne = dst.ne
    local exprs, any = {}, false
    for d = 1, 4 do
        local e = dst.dyn and dst.dyn[d]
        if e ~= nil and ne[d] > 1 then
            if type(e) ~= "string" then fail("%s: dst: bad dyn[%d]", k.op, d - 1) end
            if not allowed[d] then
                fail("%s: symbolic dim '%s' as dim %d is not supported%s", k.op, (dst.sym and dst.sym[d]) or e, d - 1,
                    d == 1 and " (a dynamic row length)" or " (group_norm: only dim 3 may be symbolic)")
            end
            exprs[d], any = e, true
        end
    end
    for j, r in ipairs(k.inputs) do
        for d = 1, 4 do
            local e = r.dyn and r.dyn[d]
            if e ~= nil and r.ne[d] > 1 then
                if e ~= exprs[d] then
                    fail("%s: input %d: dim %d is dynamic (%s) where dst's is %s", k.op, j - 1, d - 1, tostring(e),
                        exprs[d] or "static")
                end
                if r.ne[d] ~= ne[d] then fail("%s: input %d: dynamic dim %d of extent %d under %d", k.op, j - 1, d - 1, r.ne[d], ne[d]) end
            elseif exprs[d] and r.ne[d] > 1 and r.st[d] ~= 0 then
                fail("%s: input %d: static extent %d against dynamic dim %d", k.op, j - 1, r.ne[d], d - 1)
            end
        end
    end
    if not any then return nil end
    local dy = { ext = {}, decl = {}, static = 1 }
    for d = 2, 4 do
        if exprs[d] then
            dy.ext[d] = "dn" .. (d - 1)
            dy.decl[#dy.decl + 1] = string.format("const unsigned %s = (unsigned)%s; /* run-time extent of dim %d */",
                dy.ext[d], exprs[d], d - 1)
        else
            dy.static = dy.static * ne[d]
        end
    end
    return dy
end

-- Offset of r's row from the coordinates of kit.row_coords.
local function row_base_dyn(r, ne, coords, I)
    local terms = {}
    for d = 2, 4 do
        if coords[d] and r.st[d] ~= 0 then terms[#terms + 1] = I(coords[d]) .. " * " .. I(r.st[d]) end
    end
    if #terms == 0 then return I(0) end
    return "(" .. table.concat(terms, " + ") .. ")"
end

-- The epilogue's operands (c.epi): each read at the coordinate (i0, i1, i2, i3) of the element
-- being stored, i1..i3 from the row index; the row's part of the offset (eb<j>) is computed once
-- per segment, i0's per element. An operand contiguous along a full dim 0 whose rows line up
-- is read as one vector per group (a weight row, a residual), others element by element.
local function epilogue_plan(k, c, ne, rows, vec, I, plines, dcoords)
    if not k.epilogue then return end
    c.k, c.dne, c.epi = k, ne, {}
    local coords = {}
    if dcoords then
        coords = dcoords
    elseif rows > 1 then
        local stride = 1
        local last = 2
        for d = 2, 4 do if ne[d] > 1 then last = d end end
        for d = 2, 4 do
            if ne[d] > 1 then
                local e = "row"
                if stride > 1 then e = e .. " / " .. I(stride) end
                if d < last then e = "(" .. e .. ") % " .. I(ne[d]) end
                coords[d] = "(" .. e .. ")"
            end
            stride = stride * ne[d]
        end
    end
    for _, j in ipairs(E.operands(k)) do
        local r = k.inputs[j + 1]
        check_ref(r, "epilogue operand " .. j)
        for d = 1, 4 do
            if r.ne[d] < 1 or ne[d] % r.ne[d] ~= 0 then
                fail("%s: epilogue operand %d: ne %s does not broadcast onto %s", k.op, j, dims(r.ne), dims(ne))
            end
        end
        local v = vec > 1 and r.st[1] == 1 and r.ne[1] == ne[1] and vec * SIZE[r.type] <= 16 and r.offs % vec == 0
        for d = 2, 4 do
            if r.ne[d] > 1 and r.st[d] % vec ~= 0 then v = false end
        end
        c.epi[#c.epi + 1] = { j = j, ref = r, vector = v }
        plines[#plines + 1] = string.format("const %s eb%d = %s;", c.ix_decl, j, E.offset(r, ne, coords, I))
    end
end

-- The plan of norm, rms_norm and l2_norm: one segment per row.
local function row_plan(k, a, dst, I, ix, dy)
    local ne = dst.ne
    local n0 = ne[1]
    local rows = ne[2] * ne[3] * ne[4]
    local c = { op = k.op, in_type = a.type, out_type = dst.type, in_offs = a.offs, out_offs = dst.offs, I = I,
        ix_decl = ix }
    local vec = vec_of(a.type, n0)
    vec = math.min(vec, vec_of(dst.type, n0))
    -- Row strides of the rows actually present (dims of extent 1 never move).
    local function row_strides(r)
        local s = {}
        for d = 2, 4 do if ne[d] > 1 then s[#s + 1] = r.st[d] end end
        return s
    end
    local xv = vec > 1 and a.st[1] == 1 and aligned(a, vec, row_strides(a))
    if not xv then vec = 1 end
    local yv = vec > 1 and dst.st[1] == 1 and aligned(dst, vec, row_strides(dst))
    c.vec = vec
    c.x = { vector = xv, linear = true, step = a.st[1] }
    c.y = { vector = yv, linear = true, step = dst.st[1] }
    local groups = ceil_div(n0, vec)
    c.groups = I(groups)
    c.n_float = "(float)" .. tostring(n0)
    c.n_double = tostring(n0) .. ".0"
    c.prologue = {}
    local plines = {}
    if n0 <= WARP_MAX then
        local tpr = 1
        while tpr < groups and tpr < 32 do tpr = tpr * 2 end
        local block = math.min(BLOCK_SMALL, round_up(tpr * rows, 32))
        local rpb = block // tpr
        c.tpr, c.block, c.ch = tpr, nil, ceil_div(groups, tpr)
        c.nblocks = ceil_div(rows, rpb)
        c.threads = block
        c.live = rows % rpb ~= 0
        c.cached = true
        c.guard = groups % tpr ~= 0
        local shuffles = {}
        local o = tpr // 2
        while o >= 1 do shuffles[#shuffles + 1] = o; o = o // 2 end
        c.shuffles = shuffles
        plines[#plines + 1] = string.format("const unsigned lane = threadIdx.x %% %du;", tpr)
        if rpb > 1 then
            plines[#plines + 1] = string.format("const unsigned row = blockIdx.x * %du + threadIdx.x / %du;", rpb, tpr)
        else
            plines[#plines + 1] = "const unsigned row = blockIdx.x;"
        end
        if dy then
            -- Rows past the run-time count: whole blocks return, the lanes of a partly live
            -- block take part in the shuffles with nothing to do.
            c.live = rpb > 1
            for _, l in ipairs(dy.decl) do plines[#plines + 1] = l end
            plines[#plines + 1] = string.format("const unsigned nrows = %s;", dy.count)
            if rpb > 1 then
                plines[#plines + 1] = string.format("if (blockIdx.x * %du >= nrows)", rpb)
                plines[#plines + 1] = "    return;"
                plines[#plines + 1] = "const bool live = row < nrows;"
            else
                plines[#plines + 1] = "if (row >= nrows)"
                plines[#plines + 1] = "    return;"
            end
        elseif c.live then
            plines[#plines + 1] = string.format("const bool live = row < %du;", rows)
        end
        c.launch = string.format("%d block%s of %d threads, %d row%s per block, %d lane%s per row", c.nblocks,
            c.nblocks == 1 and "" or "s", block, rpb, rpb == 1 and "" or "s", tpr, tpr == 1 and "" or "s")
    else
        local per = math.max(1, PER_THREAD // vec)
        local block = math.max(64, math.min(MAX_BLOCK, round_up(ceil_div(groups, per), 32)))
        c.tpr, c.block, c.ch = block, block, ceil_div(groups, block)
        c.threads = block
        c.nblocks = rows
        c.live = false
        c.cached = c.ch * vec <= CACHE_MAX
        c.guard = groups % block ~= 0
        c.shuffles = { 16, 8, 4, 2, 1 }
        plines[#plines + 1] = "const unsigned lane = threadIdx.x;"
        plines[#plines + 1] = "const unsigned row = blockIdx.x;"
        if dy then
            for _, l in ipairs(dy.decl) do plines[#plines + 1] = l end
            plines[#plines + 1] = string.format("const unsigned nrows = %s;", dy.count)
            plines[#plines + 1] = "if (row >= nrows)"
            plines[#plines + 1] = "    return;"
        end
        c.launch = string.format("%d block%s of %d threads, one row per block", rows, rows == 1 and "" or "s", block)
    end
    if c.nblocks > MAX_GRID then fail("%d blocks exceed the grid", c.nblocks) end
    c.launch = c.launch .. string.format(", %d elements per access%s, %s", vec,
        xv and " (vector loads)" or "", c.cached and "row kept in registers" or "row reread per pass")
    local bi, bo, dcoords
    if dy then
        c.launch = c.launch .. string.format("; dynamic rows (at most %d): blocks past them return", rows)
        local lines
        lines, dcoords = kit.row_coords(ne, dy)
        for _, l in ipairs(lines) do plines[#plines + 1] = l end
        bi, bo = row_base_dyn(a, ne, dcoords, I), row_base_dyn(dst, ne, dcoords, I)
    else
        bi = row_base(a, ne, I, plines, "r")
        bo = row_base(dst, ne, I, plines, "r")
    end
    c.base_in, c.base_out = bi, bo
    epilogue_plan(k, c, ne, rows, vec, I, plines, dcoords)
    -- The row decomposition is shared: drop duplicate declarations, and `row` when nothing reads
    -- it (a single row).
    local seen, pro = {}, {}
    local rest = bi .. " " .. bo .. " " .. table.concat(plines, " ", 3)
    for j, l in ipairs(plines) do
        local unused = j == 2 and not rest:find("row", 1, true)
        if not seen[l] and not unused then seen[l] = true; pro[#pro + 1] = l end
    end
    c.prologue = pro
    c.what = string.format("%s over rows of %d", k.op, n0)
    return c
end

-- Decomposition of the flat index j (a C expression) of a group into (i0, i1, i2 - start).
local function group_decompose(r, ne, I)
    return function(j)
        local terms = {}
        local e0 = j .. " % " .. I(ne[1])
        if ne[1] == 1 then e0 = nil end
        if e0 and r.st[1] ~= 0 then terms[#terms + 1] = "(" .. e0 .. ") * " .. I(r.st[1]) end
        if ne[2] > 1 then
            terms[#terms + 1] = "(" .. j .. " / " .. I(ne[1]) .. " % " .. I(ne[2]) .. ") * " .. I(r.st[2])
        end
        terms[#terms + 1] = "(" .. j .. " / " .. I(ne[1] * ne[2]) .. ") * " .. I(r.st[3])
        return table.concat(terms, " + ")
    end
end

-- The plan of group_norm: one segment per (group, i3), one block each.
local function group_plan(k, a, dst, I, dy)
    local ne = dst.ne
    local ngroups = k.params.n_groups
    if math.type(ngroups) ~= "integer" or ngroups < 1 then fail("group_norm: bad n_groups") end
    local per = ceil_div(ne[3], ngroups)
    local live_groups = ceil_div(ne[3], per)     -- groups with at least one channel
    local last = ne[3] - (live_groups - 1) * per -- channels of the last group
    local plane = ne[1] * ne[2]
    local c = { op = k.op, in_type = a.type, out_type = dst.type, in_offs = a.offs, out_offs = dst.offs, I = I }
    local vec = math.min(vec_of(a.type, plane), vec_of(dst.type, plane))
    local xl, yl = collapsible(a, 3), collapsible(dst, 3)
    local function group_bases(r)
        local b = { per * plane }
        if ne[4] > 1 then b[#b + 1] = r.st[4] end
        return b
    end
    local xv = vec > 1 and xl and aligned(a, vec, group_bases(a))
    if not xv then vec = 1 end
    local yv = vec > 1 and yl and aligned(dst, vec, group_bases(dst))
    c.vec = vec
    c.x = { vector = xv, linear = xl, step = 1, decompose = group_decompose(a, ne, I) }
    c.y = { vector = yv, linear = yl, step = 1, decompose = group_decompose(dst, ne, I) }
    local full = plane * per -- elements of a full group
    local gmax = ceil_div(full, vec)
    local per_t = math.max(1, PER_THREAD // vec)
    local block = math.max(64, math.min(MAX_BLOCK, round_up(ceil_div(gmax, per_t), 32)))
    c.tpr, c.block, c.ch, c.threads = block, block, ceil_div(gmax, block), block
    c.nblocks = live_groups * ne[4]
    if c.nblocks > MAX_GRID then fail("%d blocks exceed the grid", c.nblocks) end
    c.live = false
    c.cached = c.ch * vec <= CACHE_MAX
    c.shuffles = { 16, 8, 4, 2, 1 }
    local pro = { "const unsigned lane = threadIdx.x;" }
    local uneven = last ~= per
    if live_groups > 1 then
        pro[#pro + 1] = string.format("const unsigned grp = blockIdx.x %% %du;", live_groups)
    else
        pro[#pro + 1] = "const unsigned grp = 0u;"
    end
    if ne[4] > 1 then
        pro[#pro + 1] = string.format("const unsigned i3 = blockIdx.x / %du;", live_groups)
        if dy then
            for _, l in ipairs(dy.decl) do pro[#pro + 1] = l end
            pro[#pro + 1] = "if (i3 >= dn3)"
            pro[#pro + 1] = "    return;"
        end
    end
    if uneven then
        -- The last group is shorter: its element count is known only per block.
        pro[#pro + 1] = string.format("const unsigned n = grp == %du ? %du : %du;", live_groups - 1, last * plane, full)
        pro[#pro + 1] = string.format("const unsigned ng = n / %du;", vec)
        c.groups = "ng"
        c.guard = true
        c.n_double = "(double)n"
    else
        c.groups = I(gmax)
        c.guard = gmax % block ~= 0
        c.n_double = tostring(full) .. ".0"
    end
    c.n_float = c.n_double -- unused by group_norm
    local function base(r)
        local t = { I("grp") .. " * " .. I(per * r.st[3]) }
        if ne[4] > 1 then t[#t + 1] = I("i3") .. " * " .. I(r.st[4]) end
        return "(" .. table.concat(t, " + ") .. ")"
    end
    c.base_in, c.base_out = base(a), base(dst)
    c.prologue = pro
    c.what = string.format("group_norm, %d group%s of %d channel%s (last %d) of %dx%d", live_groups,
        live_groups == 1 and "" or "s", per, per == 1 and "" or "s", last, ne[1], ne[2])
    c.launch = string.format("%d block%s of %d threads, one group per block, %d elements per access%s, %s",
        c.nblocks, c.nblocks == 1 and "" or "s", block, vec, xv and " (vector loads)" or "",
        c.cached and "group kept in registers" or "group reread per pass")
    return c
end

local function layout_note(r, what)
    return string.format("%-3s p%d %-4s ne %s st %s offs %d", what, r.param, r.type, dims(r.ne), dims(r.st), r.offs)
end

return function(k)
    if k.kind ~= "op" then fail("node kind %s is not op", tostring(k.kind)) end
    local op = k.op
    if op ~= "norm" and op ~= "rms_norm" and op ~= "l2_norm" and op ~= "group_norm" then
        fail("unknown op %s", tostring(op))
    end
    local a, dst = k.args.a, k.dst
    check_ref(a, "a")
    check_ref(dst, "dst")
    local nparams = k.nparams
    if math.type(nparams) ~= "integer" or nparams < 2 then fail("%s: bad kernel parameter count %s", op, tostring(nparams)) end
    for j, r in ipairs(k.inputs) do
        if math.type(r.param) ~= "integer" or r.param < 0 or r.param >= nparams then fail("%s: input %d: bad param", op, j - 1) end
    end
    if math.type(dst.param) ~= "integer" or dst.param < 0 or dst.param >= nparams then fail("%s: dst: bad param", op) end
    if k.epilogue and (op == "group_norm" or (k.epilogue.values or 1) ~= 1) then
        fail("%s: this template applies epilogues of row norms with one op value only", op)
    end
    for d = 1, 4 do
        if a.ne[d] ~= dst.ne[d] then fail("%s: operand shape %s differs from the result's %s", op, dims(a.ne), dims(dst.ne)) end
    end
    local eps = k.params.eps
    if type(eps) ~= "string" then fail("%s: missing eps", op) end
    local dy = dyn_plan(k, op == "group_norm" and { [4] = true } or { [2] = true, [3] = true, [4] = true })
    if dy then
        local f = {}
        if dy.static > 1 then f[#f + 1] = dy.static .. "u" end
        for d = 2, 4 do if dy.ext[d] then f[#f + 1] = dy.ext[d] end end
        dy.count = table.concat(f, " * ")
    end

    local ne = dst.ne
    local n = ne[1] * ne[2] * ne[3] * ne[4]
    local ma, na = reach(a)
    local md, nd = reach(dst)
    local wide = na or nd or ma > INT_MAX or md > INT_MAX
    for _, j in ipairs(E.operands(k)) do
        local m, neg = reach(k.inputs[j + 1])
        if neg or m > INT_MAX then wide = true end
    end
    local ix = wide and "long long" or "unsigned"
    local function I(v)
        if type(v) == "string" then return wide and ("(long long)" .. v) or v end
        return tostring(v) .. (wide and "ll" or "u")
    end

    local c
    if n == 0 then
        c = { empty = true, in_type = a.type, out_type = dst.type, in_offs = a.offs, out_offs = dst.offs, I = I,
            threads = 32, nblocks = 1, shuffles = {}, what = op .. " of nothing", launch = "1 block of 32 threads" }
    elseif op == "group_norm" then
        c = group_plan(k, a, dst, I, dy)
        if dy then c.launch = c.launch .. string.format("; dynamic dim 3 (at most %d): blocks past it return", ne[4]) end
    else
        c = row_plan(k, a, dst, I, ix, dy)
    end
    c.eps, c.ix = eps, ix
    c.in_param, c.out_param = a.param, dst.param

    local name = string.format("%s_%s_%d", op, a.type, ne[1])
    if op == "group_norm" then name = string.format("%s_%s_g%d", op, a.type, k.params.n_groups) end
    if k.epilogue then name = name .. E.name(k, 60 - #name) end
    local body, types, pre = emit(c)
    local notes = { layout_note(a, "in"), layout_note(dst, "out") }
    if k.epilogue then
        for _, o in ipairs(c.epi or {}) do
            notes[#notes + 1] = layout_note(o.ref, "in" .. o.j) .. (o.vector and " (vectors)" or "")
        end
        for _, l in ipairs(E.notes(k)) do notes[#notes + 1] = l end
    end
    notes[#notes + 1] = string.format("eps %s, %s indexing", eps, wide and "64-bit" or "32-bit")
    if c.block then
        -- The block reduction lives in the body; note the helper for readers.
        notes[#notes + 1] = "sums: double, warp xor butterflies, then shared memory across warps"
    else
        notes[#notes + 1] = "sums: double, xor butterflies inside each row's team of lanes"
    end
    local shuffles = c.shuffles
    local plist = {}
    for q = 0, nparams - 1 do plist[#plist + 1] = (q == 0 and "char" or "const char") .. " *__restrict__ p" .. q end
    local dims_arg = k.dims_arg or ""
    if dy and dims_arg == "" then dims_arg = ", const int* __restrict__ kdims" end
    if dims_arg ~= "" then plist[#plist + 1] = (dims_arg:gsub("^,%s*", "")) end
    if dy then
        local l = {}
        for d = 2, 4 do
            if dy.ext[d] then l[#l + 1] = string.format("dim %d = %s (at most %d)", d - 1, dst.dyn[d], ne[d]) end
        end
        notes[#notes + 1] = "dynamic: " .. table.concat(l, ", ")
    end
    local params = table.concat(plist, ", ")
    if #params + #name > 90 then params = "\n    " .. table.concat(plist, ",\n    ") end
    local source = kernel {
        name = name, what = c.what, shape = "shape " .. dims(ne) .. string.format(" = %d elements", n),
        notes = notes, launch = c.launch, pre = (pre.code():gsub("\n$", "")), types = types,
        shuffles = shuffles, block = c.threads, body = body, empty = c.empty or false, params = params,
    }
    return { name = name, source = source, grid = { c.nblocks, 1, 1 }, block = { c.threads, 1, 1 }, smem = 0,
        epilogue = k.epilogue ~= nil, dynamic = dy and true or nil }
end
