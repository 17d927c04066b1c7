-- elementwise: the kernel template of IR_EW nodes (docs/templates.md describes the table k).
--
-- Three shapes of kernel, chosen from the static layouts:
--
-- * plain: one thread per element of dst's index space (a grid-stride loop only when the space
--   needs more than 2^31-1 blocks). The linear index is decomposed into the coordinates i0..i3
--   with the static extents of dst; each operand is addressed as offs + sum_d (i_d mod ne[d]) *
--   st[d], with the modulo elided where the operand spans the whole dimension and the term where
--   it is broadcast. Operands laid out contiguously in dst's shape use the linear index itself.
--   Small index spaces (fewer than FAST_MIN elements) and everything the other two shapes do not
--   cover use it.
-- * vector: each thread computes VEC consecutive elements along dim 0 (16 bytes of the narrowest
--   operand), reading and writing them with aligned vector accesses where the layout allows
--   (alignment is checked here, at generation time, on offsets and strides: buffers are
--   256-byte aligned). "flat" when dst and every input are linear or a single broadcast value
--   (a scalar tail handles n mod VEC); "rows" when dst's rows are contiguous and VEC divides
--   ne0: operands contiguous along dim 0 are vectors, operands constant along dim 0 are read
--   once per thread, anything else element by element.
-- * tile: when an input is read with its fastest-moving dimension d in memory not being dst's
--   dim 0 (a transpose or permute), square tiles of dims (0, d), 64 or 32 elements on a side,
--   go through shared memory: read along d, written along 0, so both sides are coalesced.
--
-- Every element is computed by the same f32 statements in all three, so they give identical
-- results. Indices are 32-bit unsigned unless the element count or an operand offset needs more
-- (the vector shape is 32-bit only).

local kit = require("kit")
local tpl = require("tpl")
local prelude = require("prelude")
local E = require("epilogue")

local BLOCK = 256
local INT_MAX = 2147483647
local MAX_GRID_X = 2147483647
local LOOP_GRID_X = 1048576 -- blocks of a grid-stride launch (spaces of more than 2^39 elements)
local NAME_MAX = 56         -- cg_kernel.name holds 63 characters
local FAST_MIN = 65536      -- smaller index spaces are launch-bound: the plain kernel, most blocks
local VEC_BYTES = 16        -- bytes of the narrowest operand one thread moves on the vector path
-- Tiles of the tile path: edge x edge elements moved by blocks of edge x rows threads, an f32
-- array of edge x (edge + 1) in shared memory per tiled input (the padding column keeps the
-- column reads free of bank conflicts). The big tile (more loads in flight per thread: 88% of
-- copy bandwidth instead of 75% for 16-bit types on the H100) needs both tiled extents of at
-- least its edge and at most `max_in` tiled inputs (static shared memory is at most 48 KiB).
local TILES = {
    { edge = 64, rows = 4, max_in = 2 },
    { edge = 32, rows = 8, max_in = 8 },
}
local TILE_MIN = 8          -- both tiled extents at least this

local SIZE = { f32 = 4, f16 = 2, bf16 = 2 }

local fail = kit.failer("elementwise")

local dims = kit.dims

local check_ref = kit.ref_checker(fail, { types = prelude.ctype, min_ne = 0 })

-- Strides of the contiguous layout of ne.
local function natural(ne)
    local st, s = {}, 1
    for d = 1, 4 do
        st[d] = s
        s = s * ne[d]
    end
    return st
end

-- True when r is laid out contiguously in dst's shape, so element i of the index space is r[i].
local function is_linear(r, dne, nat)
    for d = 1, 4 do
        if r.ne[d] ~= dne[d] then return false end
        if dne[d] > 1 and r.st[d] ~= nat[d] then return false end
    end
    return true
end

-- True when r's offset moves with coordinate d (1-based) of dst's index space.
local function spans(r, dne, d)
    return dne[d] > 1 and r.ne[d] > 1 and r.st[d] ~= 0
end

-- True when r is one value for the whole index space.
local function is_scalar(r, dne)
    for d = 1, 4 do
        if spans(r, dne, d) then return false end
    end
    return true
end

-- ---- symbolic dims ----------------------------------------------------------------------------
--
-- A ref's dyn[d] (nil when static) is a C int expression of the run-time extent of dim d-1,
-- 1 <= value <= ne[d]; ne stays the maximum and the strides the (static) layout at the maximum.
-- The index space of a dynamic node is the run-time one: its element count `count` is the
-- product of the run-time extents (the launch is sized for the maximum; threads past `count`
-- return), coordinates are decomposed with the run-time extents (dn<d> locals), and operands are
-- addressed through their static strides. When the only dynamic dim is dst's outermost one
-- (the usual [4096, n_tokens]) the decomposition needs no run-time division and contiguous
-- operands keep their linear addressing.

-- The dynamic extents of dst's dims (ext[d] = "dn<d-1>" or nil), their declarations, the static
-- part of the element count, and whether only the outermost dim moves. nil when static.
local function dyn_plan(dst, inputs, dne)
    local exprs, any = {}, false
    for d = 1, 4 do
        local e = dst.dyn and dst.dyn[d]
        if e ~= nil and dne[d] > 1 then
            if type(e) ~= "string" then fail("dst: bad dyn[%d]", d - 1) end
            exprs[d], any = e, true
        end
    end
    for j, r in ipairs(inputs) do
        for d = 1, 4 do
            local e = r.dyn and r.dyn[d]
            if e ~= nil and r.ne[d] > 1 then
                if e ~= exprs[d] then
                    fail("input %d: dim %d is dynamic (%s) where dst's is %s", j - 1, d - 1, tostring(e),
                        exprs[d] or "static")
                end
                if r.ne[d] ~= dne[d] then fail("input %d: dynamic dim %d of extent %d under %d", j - 1, d - 1, r.ne[d], dne[d]) end
            elseif exprs[d] and r.ne[d] > 1 and r.st[d] ~= 0 then
                fail("input %d: static extent %d against dynamic dim %d of dst", j - 1, r.ne[d], d - 1)
            end
        end
    end
    if not any then return nil end
    local last = 0
    for d = 1, 4 do if dne[d] > 1 then last = d end end
    local ext, decl, static, outer = {}, {}, 1, true
    for d = 1, 4 do
        if exprs[d] then
            ext[d] = "dn" .. (d - 1)
            decl[#decl + 1] = { name = ext[d], expr = exprs[d], dim = d }
            if d ~= last then outer = false end
        else
            static = static * dne[d]
        end
    end
    return { ext = ext, decl = decl, static = static, outer = outer, last = last }
end

-- The run-time element count as a C expression (factors: the static part, then dn<d>).
local function dyn_count(dy, I)
    local f = {}
    if dy.static ~= 1 then f[#f + 1] = I(dy.static) end
    for _, x in ipairs(dy.decl) do f[#f + 1] = x.name end
    return table.concat(f, " * ")
end

-- Declarations of the dn<d> locals and of `count` (run-time element count).
local function dyn_decls(dy, ix, I)
    local out = {}
    for _, x in ipairs(dy.decl) do
        out[#out + 1] = string.format("const %s %s = (%s)%s; /* run-time extent of dim %d */", ix, x.name, ix, x.expr,
            x.dim - 1)
    end
    out[#out + 1] = string.format("const %s count = %s;", ix, dyn_count(dy, I))
    return out
end

-- Declarations of the coordinates marked in `used` from the linear index lin over the run-time
-- index space (static extents folded into constants).
local function coordinates_dyn(used, dne, dy, ix, I, lin)
    local lines = {}
    local sconst, sdyn = 1, {}
    for d = 1, 4 do
        if used[d] then
            local e = lin
            local f = {}
            if sconst > 1 then f[#f + 1] = I(sconst) end
            for _, x in ipairs(sdyn) do f[#f + 1] = x end
            if #f == 1 then e = e .. " / " .. f[1]
            elseif #f > 1 then e = e .. " / (" .. table.concat(f, " * ") .. ")" end
            if d < dy.last then
                if #f > 0 then e = "(" .. e .. ")" end
                e = e .. " % " .. (dy.ext[d] or I(dne[d]))
            end
            lines[#lines + 1] = string.format("const %s i%d = %s;", ix, d - 1, e)
        end
        if dy.ext[d] then sdyn[#sdyn + 1] = dy.ext[d] else sconst = sconst * dne[d] end
    end
    return lines
end

-- Largest element offset r reaches, and whether an offset or stride is negative.
local reach = kit.reach

-- Offset expression of r at coordinates i0..i3 (without r.offs, which is baked into the
-- pointer); marks the coordinates it uses in `used`. c0, when given, replaces i0 (an expression
-- in parentheses).
local function offset_expr(r, dne, I, used, c0)
    local terms = {}
    for d = 1, 4 do
        local n, s = r.ne[d], r.st[d]
        if dne[d] > 1 and n > 1 and s ~= 0 then
            used[d] = true
            local c = (d == 1 and c0) or ("i" .. (d - 1))
            local mod = n ~= dne[d]
            if mod then c = c .. " % " .. I(n) end
            if s ~= 1 then
                if mod then c = "(" .. c .. ")" end
                c = c .. " * " .. I(s)
                mod = false
            end
            terms[#terms + 1] = { c = c, mod = mod }
        end
    end
    if #terms == 0 then return "0" end
    if #terms == 1 then return terms[1].c end
    return tpl.map_join(terms, " + ", function(t) return t.mod and "(" .. t.c .. ")" or t.c end)
end

-- Declarations of the coordinates marked in `used`, from the linear index named lin.
local function coordinates(used, dne, ix, I, lin)
    local lines = {}
    local stride = 1
    local last = 0
    for d = 1, 4 do if dne[d] > 1 then last = d end end
    for d = 1, 4 do
        if used[d] then
            local e = lin
            if stride > 1 then e = e .. " / " .. I(stride) end
            if d < last then e = e .. " % " .. I(dne[d]) end
            lines[#lines + 1] = string.format("const %s i%d = %s;", ix, d - 1, e)
        end
        stride = stride * dne[d]
    end
    return lines
end

-- Content-derived kernel name: ew_ and the ops, e.g. ew_mul_silu.
local function kernel_name(instrs)
    local name = "ew"
    for i, ins in ipairs(instrs) do
        local suffix = "_n" .. #instrs
        if #name + 1 + #ins.op > NAME_MAX - (i < #instrs and #suffix or 0) then
            return name .. suffix
        end
        name = name .. "_" .. ins.op
    end
    return name
end


local function layout_note(r, what, how)
    return string.format("%-4s p%d %-4s ne %s st %s offs %d (%s)", what, r.param, r.type, dims(r.ne),
        dims(r.st), r.offs, how)
end

-- How r is addressed by the plain kernel: linear, broadcast or strided.
local function plain_how(r, dne, nat)
    if is_linear(r, dne, nat) then return "linear" end
    for d = 1, 4 do
        if r.ne[d] ~= dne[d] or (r.ne[d] > 1 and r.st[d] == 0) then return "broadcast" end
    end
    return "strided"
end

local kernel = tpl.define [[
// kiln elementwise kernel ${name}
// index space ${dims(dst.ne)} = ${n} elements, ${launch}, ${bits}-bit indexing
@ for _, l in ipairs(notes) do
//   ${l}
@ end
@ if pre ~= "" then

${pre}
@ end

extern "C" __global__ void __launch_bounds__(${BLOCK})
${name}(${params})
{
@ if n == 0 then
    /* empty index space: nothing to do */
@ else
@ for _, p in ipairs(ptrs) do
    ${p}
@ end

@ for _, s in ipairs(body) do
${s}
@ end
@ if loop then
    }
@ end
@ end
}
]]

-- The vector and tile kernels: body holds every statement, indented.
local function fast_kernel(t)
    t.head = {
        "kiln elementwise kernel " .. t.name,
        "index space " .. dims(t.dst.ne) .. " = " .. t.n .. " elements, " .. t.launch .. ", " .. t.bits .. "-bit indexing",
    }
    t.blocks = t.types
    table.insert(t.body, 1, "")
    return kit.kernel(t)
end

-- ---- the vector path ------------------------------------------------------------------------

-- The vector plan of a node, or nil: { vec, flat, kinds = { "vec" | "const" | "elem" per input } }.
local function vector_plan(dst, inputs, dne, nat, lin, dy)
    local flat = lin(dst)
    for _, r in ipairs(inputs) do
        if not (lin(r) or is_scalar(r, dne)) then flat = false end
    end
    local rows = dne[1] > 1 and dst.st[1] == 1 and not (dy and dy.ext[1])
    if not (flat or rows) then return nil end
    -- Does operand r move with the elements of one thread's group?
    local function varies(r)
        if flat then return not is_scalar(r, dne) end
        return spans(r, dne, 1)
    end
    local es = SIZE[dst.type]
    for _, r in ipairs(inputs) do
        if varies(r) then es = math.min(es, SIZE[r.type]) end
    end
    -- Can r be read (written) as whole vectors of v elements?
    local function aligned(r, v)
        local s = SIZE[r.type]
        local a = math.min(16, v * s)
        if (r.offs * s) % a ~= 0 then return false end
        if flat then return true end
        if r.st[1] ~= 1 or r.ne[1] % v ~= 0 then return false end
        for d = 2, 4 do
            if spans(r, dne, d) and (r.st[d] * s) % a ~= 0 then return false end
        end
        return true
    end
    local vec = VEC_BYTES // es
    while vec > 1 and not (aligned(dst, vec) and (flat or dne[1] % vec == 0)) do vec = vec // 2 end
    if vec < 2 then return nil end
    local kinds = {}
    for j, r in ipairs(inputs) do
        if not varies(r) then kinds[j] = "const"
        elseif aligned(r, vec) then kinds[j] = "vec"
        else kinds[j] = "elem" end
    end
    return { vec = vec, flat = flat, kinds = kinds }
end

-- Name and definition of the struct of v elements of type t used for vector accesses.
local function vec_type(t, v)
    local ct = prelude.ctype[t]
    local name = string.format("kiln_%sx%d", t == "f32" and "f32" or "u16", v)
    local bytes = v * SIZE[t]
    return name, string.format("struct alignas(%d) %s {\n    %s v[%d];\n};", math.min(16, bytes), name, ct, v)
end

local function vector_kernel(c, plan)
    local dst, inputs, dne, n, I, pre = c.dst, c.inputs, c.dne, c.n, c.I, c.pre
    local vec, flat, kinds = plan.vec, plan.flat, plan.kinds
    local groups = (n + vec - 1) // vec
    local nblocks = (groups + BLOCK - 1) // BLOCK
    local types, seen = {}, {}
    local function vtype(t)
        local name, def = vec_type(t, vec)
        if not seen[name] then
            seen[name] = true
            types[#types + 1] = def
        end
        return name
    end

    local used = {}
    local function at(r, elem)
        if c.lin(r) then return elem and "e + k" or "e" end
        return offset_expr(r, dne, I, used, elem and "(i0 + k)" or nil)
    end
    local notes = {}
    local how_of = { vec = "vector of " .. vec, const = "once per thread", elem = "element by element" }
    notes[1] = layout_note(dst, "out", plain_how(dst, dne, c.nat) .. "; vector of " .. vec)
    local before, inside = {}, {}
    local dst_at = at(dst)
    for j, r in ipairs(inputs) do
        local kind = kinds[j]
        local var = "in" .. (j - 1)
        notes[#notes + 1] = layout_note(r, var, plain_how(r, dne, c.nat) .. "; " .. how_of[kind])
        if kind == "const" then
            before[j] = string.format("const float r%d = %s;", j - 1, pre.load(r.type, var .. "[" .. at(r) .. "]"))
        elseif kind == "vec" then
            local vt = vtype(r.type)
            before[j] = string.format("const %s v%d = *(const %s *)(%s + %s);", vt, j - 1, vt, var, at(r))
            inside[#inside + 1] = string.format("const float r%d = %s;", j - 1, pre.load(r.type, "v" .. (j - 1) .. ".v[k]"))
        else
            inside[#inside + 1] = string.format("const float r%d = %s;", j - 1,
                pre.load(r.type, var .. "[" .. at(r, true) .. "]"))
        end
    end
    local ilines, inotes, last = E.instructions(c.instrs, #inputs, dst, pre)
    for _, l in ipairs(inotes) do notes[#notes + 1] = l end
    local ot = vtype(dst.type)

    local body = {}
    local function add(s) body[#body + 1] = s end
    local dy = c.dy
    if dy then
        for _, l in ipairs(dyn_decls(dy, "unsigned", I)) do add(l) end
        add(string.format("const unsigned groups = (count + %s) / %s;", I(vec - 1), I(vec)))
    end
    add(string.format("const unsigned i = blockIdx.x * %s + threadIdx.x;", I(BLOCK)))
    add(string.format("if (i >= %s)", dy and "groups" or I(groups)))
    add("    return;")
    add(string.format("const unsigned e = i * %s;", I(vec)))
    local coords = dy and coordinates_dyn(used, dne, dy, "unsigned", I, "e") or coordinates(used, dne, "unsigned", I, "e")
    for _, l in ipairs(coords) do add(l) end
    for j = 1, #inputs do
        if kinds[j] == "const" then add(before[j]) end
    end
    -- A tail element by element: from e to `limit`, then return.
    local function scalar_tail(cond, limit)
        add(string.format("if (%s) {", cond))
        add(string.format("    for (unsigned t = e; t < %s; t++) {", limit))
        for j, r in ipairs(inputs) do
            if kinds[j] ~= "const" then
                add(string.format("        const float r%d = %s;", j - 1, pre.load(r.type, "in" .. (j - 1) .. "[t]")))
            end
        end
        for _, l in ipairs(ilines) do add("        " .. l) end
        add(string.format("        out[t] = %s;", pre.store(dst.type, last)))
        add("    }")
        add("    return;")
        add("}")
    end
    if dy and flat and dy.static % vec ~= 0 then
        -- The run-time count may end inside this thread's group.
        scalar_tail(string.format("e + %s > count", I(vec)), "count")
    elseif not dy and flat and n % vec ~= 0 then
        -- The last thread's group is cut short.
        scalar_tail(string.format("i == %s", I(groups - 1)), I(n))
    end
    for j = 1, #inputs do
        if kinds[j] == "vec" then add(before[j]) end
    end
    add(string.format("%s o;", ot))
    add("#pragma unroll")
    add(string.format("for (unsigned k = 0; k < %s; k++) {", I(vec)))
    for _, l in ipairs(inside) do add("    " .. l) end
    for _, l in ipairs(ilines) do add("    " .. l) end
    add(string.format("    o.v[k] = %s;", pre.store(dst.type, last)))
    add("}")
    add(string.format("*(%s *)(out + %s) = o;", ot, dst_at))
    for j, s in ipairs(body) do
        if s ~= "" and s:sub(1, 1) ~= "#" then body[j] = "    " .. s end
    end
    local bytes = vec * SIZE[dst.type]
    local launch = string.format("%d block%s of %d, %d elements per thread (%s)", nblocks, nblocks == 1 and "" or "s",
        BLOCK, vec, flat and "flat" or "rows")
    return {
        notes = notes, types = types, body = body, launch = launch,
        grid = { nblocks, 1, 1 }, block = { BLOCK, 1, 1 }, smem = 0, bytes = bytes,
    }
end

-- ---- the tile path --------------------------------------------------------------------------

-- The tile plan of a node, or nil: { d, tiled = { bool per input }, tiles = { T0, Td }, nblocks }.
local function tile_plan(dst, inputs, dne, n)
    if dne[1] < TILE_MIN or dst.st[1] ~= 1 then return nil end
    -- The first input whose fastest dimension in memory is not dst's dim 0 picks d.
    local d
    for _, r in ipairs(inputs) do
        if spans(r, dne, 1) then
            local best, bs = nil, math.abs(r.st[1])
            for dd = 2, 4 do
                if spans(r, dne, dd) and math.abs(r.st[dd]) < bs then best, bs = dd, math.abs(r.st[dd]) end
            end
            if best then
                d = best
                break
            end
        end
    end
    if not d or dne[d] < TILE_MIN or not spans(dst, dne, d) then return nil end
    local tiled, count = {}, 0
    for j, r in ipairs(inputs) do
        tiled[j] = spans(r, dne, 1) and spans(r, dne, d) and math.abs(r.st[d]) < math.abs(r.st[1])
        if tiled[j] then count = count + 1 end
    end
    for _, tile in ipairs(TILES) do
        local e = tile.edge
        if count <= tile.max_in and (tile == TILES[#TILES] or math.min(dne[1], dne[d]) >= e) then
            local t0, td = (dne[1] + e - 1) // e, (dne[d] + e - 1) // e
            local nblocks = t0 * td * (n // (dne[1] * dne[d]))
            if nblocks > MAX_GRID_X then return nil end
            return { d = d, tiled = tiled, t0 = t0, td = td, nblocks = nblocks, edge = e, rows = tile.rows }
        end
    end
    return nil
end

local function tile_kernel(c, plan)
    local dst, inputs, dne, I, ix, pre = c.dst, c.inputs, c.dne, c.I, c.ix, c.pre
    local d, tiled, TILE, TILE_ROWS = plan.d, plan.tiled, plan.edge, plan.rows
    local cd = "i" .. (d - 1)
    local used = {}
    local notes = { layout_note(dst, "out", plain_how(dst, dne, c.nat)) }
    local loads, reads = {}, {}
    for j, r in ipairs(inputs) do
        local var = "in" .. (j - 1)
        local e = pre.load(r.type, var .. "[" .. offset_expr(r, dne, I, used) .. "]")
        if tiled[j] then
            notes[#notes + 1] = layout_note(r, var, plain_how(r, dne, c.nat) .. "; through shared memory")
            loads[#loads + 1] = string.format("s%d[threadIdx.y + k][threadIdx.x] = %s;", j - 1, e)
            reads[#reads + 1] = string.format("const float r%d = s%d[threadIdx.x][threadIdx.y + k];", j - 1, j - 1)
        else
            notes[#notes + 1] = layout_note(r, var, plain_how(r, dne, c.nat))
            reads[#reads + 1] = string.format("const float r%d = %s;", j - 1, e)
        end
    end
    local dst_at = offset_expr(dst, dne, I, used)
    local ilines, inotes, last = E.instructions(c.instrs, #inputs, dst, pre)
    for _, l in ipairs(inotes) do notes[#notes + 1] = l end

    -- Block index: tile of dim 0 fastest, then the tile of dim d, then the other dims.
    local factors = { { name = "t0", ext = plan.t0, scale = TILE }, { name = "t" .. (d - 1), ext = plan.td, scale = TILE } }
    for dd = 2, 4 do
        if dd ~= d then factors[#factors + 1] = { name = "i" .. (dd - 1), ext = dne[dd], dim = dd } end
    end
    local lastf = 0
    for f, x in ipairs(factors) do if x.ext > 1 then lastf = f end end
    local body = {}
    local function add(s) body[#body + 1] = s end
    for j = 1, #inputs do
        if tiled[j] then add(string.format("__shared__ float s%d[%d][%d];", j - 1, TILE, TILE + 1)) end
    end
    local prod = 1
    for f, x in ipairs(factors) do
        if not x.dim or used[x.dim] then
            local e
            if x.ext == 1 then
                e = I(0)
            else
                e = "blockIdx.x"
                if prod > 1 then e = e .. " / " .. I(prod) end
                if f < lastf then e = e .. " % " .. I(x.ext) end
                if x.scale then e = e .. " * " .. I(x.scale) end
            end
            add(string.format("const %s %s = %s;", ix, x.name, e))
        end
        prod = prod * x.ext
    end
    local guard = {}
    if dne[1] % TILE ~= 0 then guard[#guard + 1] = "i0 < " .. I(dne[1]) end
    if dne[d] % TILE ~= 0 then guard[#guard + 1] = cd .. " < " .. I(dne[d]) end
    guard = table.concat(guard, " && ")
    local function loop(c0, cdv, stmts)
        add("#pragma unroll")
        add(string.format("for (unsigned k = 0; k < %du; k += %du) {", TILE, TILE_ROWS))
        add(string.format("    const %s i0 = t0 + %s;", ix, c0))
        add(string.format("    const %s %s = t%d + %s;", ix, cd, d - 1, cdv))
        local ind = "    "
        if guard ~= "" then
            add(string.format("    if (%s) {", guard))
            ind = "        "
        end
        for _, s in ipairs(stmts) do add(ind .. s) end
        if guard ~= "" then add("    }") end
        add("}")
    end
    loop("threadIdx.y + k", "threadIdx.x", loads)
    add("__syncthreads();")
    local stmts = {}
    for _, s in ipairs(reads) do stmts[#stmts + 1] = s end
    for _, s in ipairs(ilines) do stmts[#stmts + 1] = s end
    stmts[#stmts + 1] = string.format("out[%s] = %s;", dst_at, pre.store(dst.type, last))
    loop("threadIdx.x", "threadIdx.y + k", stmts)
    for j, s in ipairs(body) do
        if s ~= "" and s:sub(1, 1) ~= "#" then body[j] = "    " .. s end
    end
    local launch = string.format("%d block%s of %dx%d, %dx%d tiles of dims 0 and %d through shared memory",
        plan.nblocks, plan.nblocks == 1 and "" or "s", TILE, TILE_ROWS, TILE, TILE, d - 1)
    return {
        notes = notes, types = {}, body = body, launch = launch,
        grid = { plan.nblocks, 1, 1 }, block = { TILE, TILE_ROWS, 1 }, smem = 0,
    }
end

-- ---- the plain path -------------------------------------------------------------------------

local function plain_kernel(c)
    local dst, inputs, dne, n, I, ix, pre = c.dst, c.inputs, c.dne, c.n, c.I, c.ix, c.pre
    local nblocks = math.max(1, (n + BLOCK - 1) // BLOCK)
    local loop = nblocks > MAX_GRID_X
    local grid_x = loop and LOOP_GRID_X or nblocks
    local launch = loop and string.format("grid-stride loop over %d blocks of %d", grid_x, BLOCK)
        or string.format("%d block%s of %d", nblocks, nblocks == 1 and "" or "s", BLOCK)

    -- Operand offsets.
    local used = {}
    local function at(r)
        if c.lin(r) then return "i" end
        return offset_expr(r, dne, I, used)
    end
    local notes = {}
    local dst_at = at(dst)
    if c.dy then
        local l = {}
        for _, x in ipairs(c.dy.decl) do
            l[#l + 1] = string.format("dim %d = %s (at most %d)", x.dim - 1, x.expr, dne[x.dim])
        end
        notes[#notes + 1] = "dynamic: " .. table.concat(l, ", ") .. "; the launch covers the maximum"
    end
    notes[#notes + 1] = layout_note(dst, "out", plain_how(dst, dne, c.nat))
    local loads = {}
    for j, r in ipairs(inputs) do
        local e = at(r)
        notes[#notes + 1] = layout_note(r, "in" .. (j - 1), plain_how(r, dne, c.nat))
        loads[j] = string.format("const float r%d = %s;", j - 1,
            pre.load(r.type, "in" .. (j - 1) .. "[" .. e .. "]"))
    end
    local ilines, inotes, last = E.instructions(c.instrs, #inputs, dst, pre)
    for _, l in ipairs(inotes) do notes[#notes + 1] = l end

    local body = c.dy and coordinates_dyn(used, dne, c.dy, ix, I, "i") or coordinates(used, dne, ix, I, "i")
    if #body > 0 then body[#body + 1] = "" end
    for _, l in ipairs(loads) do body[#body + 1] = l end
    for _, l in ipairs(ilines) do body[#body + 1] = l end
    body[#body + 1] = string.format("out[%s] = %s;", dst_at, pre.store(dst.type, last))

    -- The index head, then the body indented under it.
    local lines = kit.flat_index(ix, "i", c.dy and "count" or I(n), I(BLOCK), loop)
    local ind = loop and "        " or "    "
    for _, s in ipairs(body) do lines[#lines + 1] = s ~= "" and ind .. s or s end

    local source = kernel {
        name = c.name, dst = dst, n = n, launch = launch, bits = c.wide and 64 or 32, notes = notes,
        pre = n > 0 and (pre.code():gsub("\n$", "")) or "", BLOCK = BLOCK, params = c.params,
        ptrs = c.dy and c.dyptrs or c.ptrs, loop = loop, body = lines, dims = dims,
    }
    return { name = c.name, source = source, grid = { grid_x, 1, 1 }, block = { BLOCK, 1, 1 }, smem = 0,
        dynamic = c.dy and true or nil }
end

return function(k)
    if k.kind ~= "ew" then fail("node kind %s is not ew", tostring(k.kind)) end
    local dst, inputs, instrs = k.dst, k.inputs, k.instrs
    check_ref(dst, "dst")
    for j, r in ipairs(inputs) do check_ref(r, "input " .. (j - 1)) end
    if #instrs == 0 then fail("no instructions") end

    local dne = dst.ne
    local n = dne[1] * dne[2] * dne[3] * dne[4]
    for j, r in ipairs(inputs) do
        for d = 1, 4 do
            if n > 0 and (r.ne[d] < 1 or dne[d] % r.ne[d] ~= 0) then
                fail("input %d: ne[%d] = %d does not divide dst ne %d", j - 1, d - 1, r.ne[d], dne[d])
            end
        end
    end

    -- Index width.
    local refs = { dst }
    for _, r in ipairs(inputs) do refs[#refs + 1] = r end
    local wide = n > INT_MAX
    for _, r in ipairs(refs) do
        local m, neg = reach(r)
        if m > INT_MAX then wide = true end
        if neg then wide = true end -- signed 64-bit indices
    end
    local ix = wide and "long long" or "unsigned"
    local function I(v) return tostring(v) .. (wide and "ll" or "u") end

    local dy = dyn_plan(dst, inputs, dne)

    -- Parameters and typed pointers.
    local nparams = k.nparams
    local plist = {}
    for p = 0, nparams - 1 do
        plist[#plist + 1] = (p == 0 and "char" or "const char") .. " *__restrict__ p" .. p
    end
    local dims_arg = k.dims_arg or ""
    if dy and dims_arg == "" then dims_arg = ", const int* __restrict__ kdims" end
    if dims_arg ~= "" then plist[#plist + 1] = (dims_arg:gsub("^,%s*", "")) end
    local params = table.concat(plist, ", ")
    local name = kernel_name(instrs)
    if #params + #name > 90 then
        params = "\n    " .. table.concat(plist, ",\n    ")
    end
    local function ptr(r, var, const)
        kit.check_param(fail, r, var, nparams)
        return kit.pointer(r, var, prelude.ctype[r.type], const)
    end
    local ptrs = { ptr(dst, "out", false) }
    for j, r in ipairs(inputs) do ptrs[#ptrs + 1] = ptr(r, "in" .. (j - 1), true) end

    local nat = natural(dne)
    local c = {
        dst = dst, inputs = inputs, instrs = instrs, dne = dne, n = n, nat = nat, wide = wide,
        ix = ix, I = I, pre = prelude.new(), name = name, params = params, ptrs = ptrs, dy = dy,
        -- Is r addressed by the linear index? With dynamic dims only when the index space is laid
        -- out as at the maximum (only the outermost dim is dynamic).
        lin = function(x) return is_linear(x, dne, nat) and (not dy or dy.outer) end,
    }
    if dy then
        c.dyptrs = {}
        for _, p in ipairs(ptrs) do c.dyptrs[#c.dyptrs + 1] = p end
        for _, l in ipairs(dyn_decls(dy, ix, I)) do c.dyptrs[#c.dyptrs + 1] = l end
    end

    -- The shape of kernel.
    local r
    if n >= FAST_MIN then
        local plan = not dy and tile_plan(dst, inputs, dne, n) or nil
        if plan then
            r = tile_kernel(c, plan)
        elseif not wide then
            plan = vector_plan(dst, inputs, dne, c.nat, c.lin, dy)
            if plan then r = vector_kernel(c, plan) end
        end
    end
    if not r then return plain_kernel(c) end
    if dy then
        local l = {}
        for _, x in ipairs(dy.decl) do
            l[#l + 1] = string.format("dim %d = %s (at most %d)", x.dim - 1, x.expr, dne[x.dim])
        end
        table.insert(r.notes, 1, "dynamic: " .. table.concat(l, ", ") .. "; the launch covers the maximum")
    end
    local source = fast_kernel {
        name = name, dst = dst, n = n, launch = r.launch, bits = wide and 64 or 32, notes = r.notes,
        pre = (c.pre.code():gsub("\n$", "")), types = r.types, params = params, ptrs = ptrs,
        threads = r.block[1] * r.block[2] * r.block[3],
        body = r.body, dims = dims,
    }
    return { name = name, source = source, grid = r.grid, block = r.block, smem = r.smem, dynamic = dy and true or nil }
end
