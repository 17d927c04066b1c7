-- fill: the kernel template of the fill family (arange, fill, diag_mask_inf, tri); docs/templates.md
-- describes the table k of IR_OP nodes, docs/ops-fill.md the ops.
--
-- Every op writes its contiguous destination once, element by element in linear order, and reads
-- at most one operand of the same shape and type, so one kernel shape serves all four: each
-- thread owns VEC consecutive elements of dst (16 bytes where dst's shape allows) and stores them
-- with one aligned vector store.
--   * fill, arange: no operand. A flat index space; the last group is cut short when VEC does not
--     divide the element count.
--   * diag_mask_inf, tri: y = keep(i0, i1) ? a : masked, per element. A group never straddles a
--     row (VEC divides ne0). a is read with one aligned vector load per group when its rows are
--     contiguous and 16-byte aligned, else element by element through its strides; a group whose
--     elements are all masked reads nothing (about half of a triangular mask). Kept values are
--     moved as raw elements of their type (a and the result share it), so the copy is exact.
-- Shapes, strides, offsets and parameters are compile-time constants. Indices are 32-bit unsigned
-- unless an element count or offset needs more.

local kit = require("kit")
local tpl = require("tpl")
local prelude = require("prelude")

local BLOCK = 256
local INT_MAX = 2147483647
local MAX_GRID_X = 2147483647
local LOOP_GRID_X = 1048576 -- blocks of a grid-stride launch (index spaces beyond 2^39 groups)
local VEC_BYTES = 16

local SIZE = { f32 = 4, f16 = 2, bf16 = 2 }
local CTYPE = { f32 = "float", f16 = "unsigned short", bf16 = "unsigned short" }
-- The masked values as raw elements of each type: -inf (diag_mask_inf) and +0 (tri).
local NEG_INF = { f32 = "__int_as_float(0xff800000)", f16 = "(unsigned short)0xfc00u", bf16 = "(unsigned short)0xff80u" }
local ZERO = { f32 = "0.0f", f16 = "(unsigned short)0u", bf16 = "(unsigned short)0u" }

local fail = kit.failer("fill")

local dims = kit.dims

local check_ref = kit.ref_checker(fail, { types = SIZE })

-- True when r is laid out contiguously in shape ne (strides of size-1 dims do not matter).
local function is_linear(r, ne)
    local s = 1
    for d = 1, 4 do
        if r.ne[d] ~= ne[d] then return false end
        if ne[d] > 1 and r.st[d] ~= s then return false end
        s = s * ne[d]
    end
    return true
end

-- Largest element offset r reaches, and whether a stride or the offset is negative.
local reach = kit.reach

-- keep(x): the C condition under which element (x, i1) keeps a's value, and the direction in which
-- it holds ("lower": for x up to a bound, "upper": from a bound on), so that a group [i0, i0+V)
-- keeps something iff keep(i0) (lower) or keep(i0 + V - 1) (upper). one_row: ne1 == 1, so i1 is 0
-- (the comparisons are folded instead of compared with a zero, which NVRTC calls pointless).
local function keep_rule(k, one_row, I)
    if k.op == "diag_mask_inf" then
        local np = k.params.n_past
        if math.type(np) ~= "integer" or np < 0 then fail("diag_mask_inf: bad n_past %s", tostring(np)) end
        local bound = one_row and I(np) or (np == 0 and "i1" or "i1 + " .. I(np))
        return "lower", function(x) return x .. " <= " .. bound end,
            string.format("i0 > n_past + i1 (n_past = %d) is -inf", np)
    end
    local t = k.params.type
    local rules = {
        upper_diag = { "upper", ">=", "i0 < i1 is 0" },
        upper = { "upper", ">", "i0 <= i1 is 0" },
        lower_diag = { "lower", "<=", "i0 > i1 is 0" },
        lower = { "lower", "<", "i0 >= i1 is 0" },
    }
    local r = rules[t]
    if not r then fail("tri: unknown type %s", tostring(t)) end
    local op = r[2]
    local function keep(x)
        if not one_row then return x .. " " .. op .. " i1" end
        if op == ">=" then return "true" end
        if op == ">" then return x .. " != " .. I(0) end
        if op == "<=" then return x .. " == " .. I(0) end
        return "false"
    end
    return r[1], keep, r[3]
end

local kernel = tpl.define [[
// kiln fill-family kernel ${name}
// op ${op}: ${what}
// index space ${dims(dst.ne)} = ${n} elements, ${launch}, ${bits}-bit indexing
@ for _, l in ipairs(notes) do
//   ${l}
@ end
@ if pre ~= "" then

${pre}
@ end
@ if vt then

struct alignas(${vbytes}) ${vt} {
    ${ct} v[${vec}];
};
@ end

extern "C" __global__ void __launch_bounds__(${BLOCK})
${name}(${params})
{
@ for _, p in ipairs(ptrs) do
    ${p}
@ end
@ for _, s in ipairs(lines) do
${s}
@ end
    }
}
]]

local coords -- defined below

-- Statements computing one group's elements of fill or arange (flat, no operand).
local function flat_body(c, value)
    local b, vec, n, I = {}, c.vec, c.n, c.I
    if c.dy and not c.dy.outer then
        -- The run-time index space is not laid out as at the maximum: one element per thread at
        -- its coordinates.
        b[#b + 1] = string.format("const %s e = g;", c.ix)
        local used = { true, true, true, true }
        local off = {}
        for _, x in ipairs(coords(c, used)) do
            local d = tonumber(x.var:sub(2)) + 1
            if c.dne[d] > 1 then
                b[#b + 1] = x.decl
                off[#off + 1] = d == 1 and x.var or (x.var .. " * " .. I(c.nat[d]))
            end
        end
        b[#b + 1] = string.format("out[%s] = %s;", #off > 0 and table.concat(off, " + ") or I(0), value("e"))
        return b
    end
    b[#b + 1] = vec == 1 and string.format("const %s e = g;", c.ix) or string.format("const %s e = g * %s;", c.ix, I(vec))
    if vec == 1 then
        b[#b + 1] = string.format("out[e] = %s;", value("e"))
        return b
    end
    local full = {}
    full[#full + 1] = string.format("%s o;", c.vt)
    full[#full + 1] = "#pragma unroll"
    full[#full + 1] = string.format("for (unsigned k = 0; k < %du; k++)", vec)
    full[#full + 1] = string.format("    o.v[k] = %s;", value("(e + k)"))
    full[#full + 1] = string.format("*(%s *)(out + e) = o;", c.vt)
    if (c.dy and c.dy.static or n) % vec == 0 then
        for _, s in ipairs(full) do b[#b + 1] = s end
        return b
    end
    -- The last group is short: element by element.
    if c.dy then n = "count" else n = I(n) end
    b[#b + 1] = string.format("if (e + %s <= %s) {", I(vec), n)
    for _, s in ipairs(full) do b[#b + 1] = "    " .. s end
    b[#b + 1] = "} else {"
    b[#b + 1] = string.format("    for (%s t = e; t < %s; t++)", c.ix, n)
    b[#b + 1] = string.format("        out[t] = %s;", value("t"))
    b[#b + 1] = "}"
    return b
end

-- The offset of a at column expression x (i0 or i0 + k) and the current i1, i2, i3.
local function a_offset(a, dne, I, x, used)
    local terms = {}
    for d = 1, 4 do
        if dne[d] > 1 and a.st[d] ~= 0 then
            local cd = d == 1 and x or ("i" .. (d - 1))
            used[d] = true
            if a.st[d] ~= 1 and cd:find(" ") and cd:sub(1, 1) ~= "(" then cd = "(" .. cd .. ")" end
            terms[#terms + 1] = a.st[d] == 1 and cd or cd .. " * " .. I(a.st[d])
        end
    end
    if #terms == 0 then return I(0) end
    return table.concat(terms, " + ")
end

-- Coordinate declarations from e ({ var, decl }): i0 and i1 always, i2 and i3 when the operand
-- offset uses them. masked_body keeps those the statements name (NVRTC warns of unused ones).
function coords(c, used)
    local dne, I, ix = c.dne, c.I, c.ix
    local last = 1
    for d = 1, 4 do if dne[d] > 1 then last = d end end
    local out = {}
    local stride = 1
    local sdyn = {} -- run-time extents below d (dynamic nodes)
    for d = 1, 4 do
        if d <= 2 or used[d] then
            local e = "e"
            if c.dy then
                local f = {}
                if stride > 1 then f[#f + 1] = I(stride) end
                for _, x in ipairs(sdyn) do f[#f + 1] = x end
                if #f == 1 then e = e .. " / " .. f[1]
                elseif #f > 1 then e = e .. " / (" .. table.concat(f, " * ") .. ")" end
                if d < last then e = (#f > 0 and "(" .. e .. ")" or e) .. " % " .. (c.dy.ext[d] or I(dne[d])) end
            else
                if stride > 1 then e = e .. " / " .. I(stride) end
                if d < last then e = e .. " % " .. I(dne[d]) end
            end
            if dne[d] == 1 then e = I(0) end
            if not (d == 2 and c.one_row) then
                out[#out + 1] = { var = "i" .. (d - 1), decl = string.format("const %s i%d = %s;", ix, d - 1, e) }
            end
        end
        if c.dy and c.dy.ext[d] then sdyn[#sdyn + 1] = c.dy.ext[d] else stride = stride * dne[d] end
    end
    return out
end

-- Statements of one group of diag_mask_inf or tri.
local function masked_body(c, a)
    local vec, I, dne = c.vec, c.I, c.dne
    local dir, keep = c.dir, c.keep
    local masked = c.masked
    local used = {}
    local linear = is_linear(a, dne) and not (c.dy and not c.dy.outer)
    -- dst's offset: the linear index, or with dynamic dims not laid out as at the maximum, the
    -- coordinates' (dst is contiguous at the maximum).
    local out_at = "e"
    if c.dy and not c.dy.outer then
        local t = {}
        for d = 1, 4 do
            if dne[d] > 1 then
                used[d] = true
                t[#t + 1] = d == 1 and "i0" or string.format("i%d * %s", d - 1, I(c.nat[d]))
            end
        end
        out_at = #t > 0 and table.concat(t, " + ") or I(0)
    end
    local function off(x)
        if linear then return x == "i0" and "e" or "e + k" end
        return a_offset(a, dne, I, x, used)
    end
    local b = {}
    local first_off = off("i0")
    local elem_off = vec > 1 and off("(i0 + k)") or nil
    -- The declarations of e and of the coordinates the statements below use.
    local function finish()
        local text = table.concat(b, "\n")
        local head = { vec == 1 and string.format("const %s e = g;", c.ix)
            or string.format("const %s e = g * %s;", c.ix, I(vec)) }
        for _, x in ipairs(coords(c, used)) do
            if text:find("%f[%w_]" .. x.var .. "%f[^%w_]") then head[#head + 1] = x.decl end
        end
        for _, l in ipairs(b) do head[#head + 1] = l end
        return head
    end
    if vec == 1 then
        b[#b + 1] = string.format("out[%s] = %s ? in0[%s] : %s;", out_at, keep("i0"), first_off, masked)
        return finish()
    end
    local any = dir == "lower" and keep("i0") or keep("(i0 + " .. I(vec - 1) .. ")")
    b[#b + 1] = string.format("%s o;", c.vt)
    b[#b + 1] = string.format("if (%s) {", any)
    if c.a_vec then
        b[#b + 1] = string.format("    const %s v = *(const %s *)(in0 + %s);", c.vt, c.vt, first_off)
        b[#b + 1] = "#pragma unroll"
        b[#b + 1] = string.format("    for (unsigned k = 0; k < %du; k++)", vec)
        b[#b + 1] = string.format("        o.v[k] = %s ? v.v[k] : %s;", keep("(i0 + k)"), masked)
    else
        b[#b + 1] = "#pragma unroll"
        b[#b + 1] = string.format("    for (unsigned k = 0; k < %du; k++)", vec)
        b[#b + 1] = string.format("        o.v[k] = %s ? in0[%s] : %s;", keep("(i0 + k)"), elem_off, masked)
    end
    b[#b + 1] = "} else {"
    b[#b + 1] = "#pragma unroll"
    b[#b + 1] = string.format("    for (unsigned k = 0; k < %du; k++)", vec)
    b[#b + 1] = string.format("        o.v[k] = %s;", masked)
    b[#b + 1] = "}"
    b[#b + 1] = string.format("*(%s *)(out + %s) = o;", c.vt, out_at)
    return finish()
end

-- Can a be read as whole vectors of v elements at every group of dst?
local function a_vectorizable(a, dne, v)
    local s = SIZE[a.type]
    local align = v * s
    if (a.offs * s) % align ~= 0 then return false end
    if is_linear(a, dne) then return true end
    if dne[1] > 1 and a.st[1] ~= 1 then return false end
    for d = 2, 4 do
        if dne[d] > 1 and (a.st[d] * s) % align ~= 0 then return false end
    end
    return true
end

local OPS = { arange = true, fill = true, diag_mask_inf = true, tri = true }

return function(k)
    if k.kind ~= "op" or not OPS[k.op] then fail("node is not a fill-family op (%s)", tostring(k.op)) end
    local dst = k.dst
    check_ref(dst, "dst")
    local dne = dst.ne
    local n = dne[1] * dne[2] * dne[3] * dne[4]
    if not is_linear(dst, dne) then fail("dst must be contiguous") end
    local a = k.args.a
    local rowwise = k.op == "diag_mask_inf" or k.op == "tri"
    if rowwise then
        check_ref(a, "a")
        if a.type ~= dst.type then fail("a is %s, dst %s", a.type, dst.type) end
        for d = 1, 4 do
            if a.ne[d] ~= dne[d] then fail("a's ne[%d] = %d, dst's %d", d - 1, a.ne[d], dne[d]) end
        end
    end
    if k.op == "arange" and dst.type ~= "f32" then fail("arange writes f32, not %s", dst.type) end

    -- Symbolic dims: dst.dyn[d] (nil when static) is the C int expression of dim d-1's run-time
    -- extent, ne[d] its maximum. The launch covers the maximum; `count` (the run-time element
    -- count) bounds the groups. When only the outermost dim is dynamic the run-time index space
    -- is laid out as at the maximum and nothing else changes; otherwise coordinates are
    -- decomposed with the run-time extents.
    local dy
    do
        local exprs, any = {}, false
        for d = 1, 4 do
            local e = dst.dyn and dst.dyn[d]
            if e ~= nil and dne[d] > 1 then exprs[d], any = e, true end
            local ea = rowwise and a.dyn and a.dyn[d] or nil
            if rowwise and dne[d] > 1 and ea ~= exprs[d] then
                fail("%s: a's dim %d is %s where dst's is %s", k.op, d - 1, ea or "static", exprs[d] or "static")
            end
        end
        if any then
            if k.op == "arange" then fail("arange: its length cannot be a symbolic dim") end
            local last = 0
            for d = 1, 4 do if dne[d] > 1 then last = d end end
            dy = { ext = {}, decl = {}, static = 1, outer = true, exprs = exprs }
            for d = 1, 4 do
                if exprs[d] then
                    dy.ext[d] = "dn" .. (d - 1)
                    dy.decl[#dy.decl + 1] = { name = dy.ext[d], expr = exprs[d], dim = d }
                    if d ~= last then dy.outer = false end
                else
                    dy.static = dy.static * dne[d]
                end
            end
        end
    end

    -- Index width.
    local wide = n > INT_MAX
    for _, r in ipairs(rowwise and { dst, a } or { dst }) do
        local m, neg = reach(r)
        if m > INT_MAX or neg then wide = true end
    end
    local ix = wide and "long long" or "unsigned"
    local function I(v) return tostring(v) .. (wide and "ll" or "u") end

    -- Elements per thread: 16 bytes of dst, halved until the groups fit dst's rows (row-wise
    -- ops) and dst's alignment.
    local es = SIZE[dst.type]
    local vec = VEC_BYTES // es
    if rowwise then
        while vec > 1 and dne[1] % vec ~= 0 do vec = vec // 2 end
    end
    if (dst.offs * es) % (vec * es) ~= 0 then vec = 1 end
    -- Dynamic: groups never straddle a run-time row end (rowwise ops with a dynamic dim 0) nor
    -- a dim whose run-time extent changes the layout (fill, dims other than the outermost).
    if dy and ((rowwise and dy.ext[1]) or (not rowwise and not dy.outer)) then vec = 1 end
    local groups = (n + vec - 1) // vec
    local nblocks = (groups + BLOCK - 1) // BLOCK
    local loop = nblocks > MAX_GRID_X
    local grid_x = loop and LOOP_GRID_X or nblocks

    local ct = CTYPE[dst.type]
    local vt = vec > 1 and string.format("kiln_%sx%d", dst.type == "f32" and "f32" or "u16", vec) or nil
    local c = { n = n, vec = vec, I = I, ix = ix, dne = dne, vt = vt, one_row = dne[2] == 1, dy = dy }
    c.nat = {}
    do
        local st = 1
        for d = 1, 4 do c.nat[d] = st; st = st * dne[d] end
    end
    local pre = prelude.new()
    local notes, setup, body = {}, {}, nil
    notes[1] = string.format("out  p%d %-4s ne %s (contiguous)%s", dst.param, dst.type, dims(dne),
        vec > 1 and string.format("; vectors of %d", vec) or "")
    local what, name
    local plist = {}
    for p = 0, k.nparams - 1 do
        plist[#plist + 1] = (p == 0 and "char" or "const char") .. " *__restrict__ p" .. p
    end
    local ptrs = { string.format("%s *const out = (%s *)p%d;", ct, ct, dst.param) }

    if k.op == "fill" then
        what = "y = " .. k.params.c .. " (rounded to " .. dst.type .. ")"
        name = string.format("fill_%s_%d", dst.type, n)
        local cv = k.params.c
        if dst.type ~= "f32" then cv = pre.store(dst.type, cv) end
        setup[#setup + 1] = string.format("const %s cv = %s;", ct, cv)
        body = flat_body(c, function() return "cv" end)
    elseif k.op == "arange" then
        local start, step = k.params.start, k.params.step
        what = string.format("y[i] = %s + %s * (float) i, each step rounded (no FMA, as ggml's CPU)", start, step)
        name = string.format("arange_f32_%d", n)
        body = flat_body(c, function(i)
            return string.format("__fadd_rn(%s, __fmul_rn(%s, (float)%s))", start, step, i)
        end)
    else
        local dir, keep, rule = keep_rule(k, c.one_row, I)
        c.dir, c.keep = dir, keep
        c.masked = k.op == "tri" and ZERO[dst.type] or NEG_INF[dst.type]
        what = "y = a, except " .. rule
        name = k.op == "tri" and string.format("tri_%s_%s_%d", k.params.type, dst.type, dne[1])
            or string.format("diag_mask_inf_%s_%d", dst.type, dne[1])
        c.a_vec = vec > 1 and a_vectorizable(a, dne, vec)
        local how = is_linear(a, dne) and "linear" or "strided"
        notes[#notes + 1] = string.format("a    p%d %-4s ne %s st %s offs %d (%s; %s)", a.param, a.type, dims(a.ne),
            dims(a.st), a.offs, how, c.a_vec and ("vectors of " .. vec) or "element by element")
        local offs = a.offs ~= 0 and (" + " .. tostring(a.offs) .. (math.abs(a.offs) > INT_MAX and "ll" or "")) or ""
        ptrs[#ptrs + 1] = string.format("const %s *const in0 = (const %s *)p%d%s;", ct, ct, a.param, offs)
        body = masked_body(c, a)
    end
    local gbound = I(groups)
    if dy then
        local f, decls = {}, {}
        if dy.static > 1 then f[#f + 1] = I(dy.static) end
        local l = {}
        for _, x in ipairs(dy.decl) do
            f[#f + 1] = x.name
            decls[#decls + 1] = string.format("const %s %s = (%s)%s; /* run-time extent of dim %d */", ix, x.name, ix,
                x.expr, x.dim - 1)
            l[#l + 1] = string.format("dim %d = %s (at most %d)", x.dim - 1, x.expr, dne[x.dim])
        end
        decls[#decls + 1] = string.format("const %s count = %s; /* run-time element count */", ix, table.concat(f, " * "))
        if vec > 1 then
            decls[#decls + 1] = string.format("const %s ngroups = (count + %s) / %s;", ix, I(vec - 1), I(vec))
            gbound = "ngroups"
        else
            gbound = "count"
        end
        for i = #decls, 1, -1 do table.insert(setup, 1, decls[i]) end
        notes[#notes + 1] = "dynamic: " .. table.concat(l, ", ") .. "; the launch covers the maximum"
        local dims_arg = k.dims_arg or ""
        if dims_arg == "" then dims_arg = ", const int* __restrict__ kdims" end
        plist[#plist + 1] = (dims_arg:gsub("^,%s*", ""))
    elseif (k.dims_arg or "") ~= "" then
        plist[#plist + 1] = (k.dims_arg:gsub("^,%s*", ""))
    end
    local params = table.concat(plist, ", ")
    local launch = string.format("%s%d block%s of %d, %d element%s per thread",
        loop and "grid-stride loop over " or "", grid_x, grid_x == 1 and "" or "s", BLOCK, vec, vec == 1 and "" or "s")
    -- The statements: setup, the index head (without a loop, a block of its own), the body.
    local lines = {}
    for _, s in ipairs(setup) do lines[#lines + 1] = "    " .. s end
    for _, s in ipairs(kit.flat_index(ix, "g", gbound, I(BLOCK), loop)) do lines[#lines + 1] = s end
    if not loop then lines[#lines + 1] = "    {" end
    for _, s in ipairs(body) do lines[#lines + 1] = "        " .. s end
    local source = kernel {
        name = name, op = k.op, what = what, dst = dst, n = n, launch = launch, bits = wide and 64 or 32,
        notes = notes, pre = (pre.code():gsub("\n$", "")), vt = vt, vbytes = vec * es, ct = ct, vec = vec,
        BLOCK = BLOCK, params = params, ptrs = ptrs, lines = lines, groups = groups, dims = dims,
    }
    return { name = name, source = source, grid = { grid_x, 1, 1 }, block = { BLOCK, 1, 1 }, smem = 0,
        dynamic = dy and true or nil }
end
