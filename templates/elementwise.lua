-- elementwise: the kernel template of IR_EW nodes (docs/templates.md describes the table k).
--
-- One thread per element of dst's index space (a grid-stride loop only when the space needs more
-- than 2^31-1 blocks). The linear index is decomposed into the coordinates i0..i3 with the static
-- extents of dst; each operand is addressed as offs + sum_d (i_d mod ne[d]) * st[d], with the
-- modulo elided where the operand spans the whole dimension and the term where it is broadcast.
-- Operands laid out contiguously in dst's shape use the linear index itself. Indices are 32-bit
-- unsigned unless the element count or an operand offset needs more.

local tpl = require("tpl")
local ops = require("ops")
local prelude = require("prelude")

local BLOCK = 256
local INT_MAX = 2147483647
local MAX_GRID_X = 2147483647
local LOOP_GRID_X = 1048576 -- blocks of a grid-stride launch (spaces of more than 2^39 elements)
local NAME_MAX = 56         -- cg_kernel.name holds 63 characters

local function fail(fmt, ...) error("elementwise: " .. string.format(fmt, ...), 0) end

local function dims(t) return "[" .. tpl.map_join(t, ", ") .. "]" end

local function check_ref(r, what)
    if type(r) ~= "table" or not prelude.ctype[r.type] then
        fail("%s: unsupported type %s", what, type(r) == "table" and tostring(r.type) or "?")
    end
    for d = 1, 4 do
        if math.type(r.ne[d]) ~= "integer" or r.ne[d] < 0 then fail("%s: bad ne[%d]", what, d - 1) end
        if math.type(r.st[d]) ~= "integer" then fail("%s: bad st[%d]", what, d - 1) end
    end
    if math.type(r.offs) ~= "integer" then fail("%s: bad offs", what) end
end

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

-- Largest element offset r reaches, and whether an offset or stride is negative.
local function reach(r)
    local m, neg = r.offs, r.offs < 0
    for d = 1, 4 do
        if r.ne[d] > 1 then
            if r.st[d] < 0 then neg = true else m = m + (r.ne[d] - 1) * r.st[d] end
        end
    end
    return m, neg
end

-- Offset expression of r at coordinates i0..i3 (without r.offs, which is baked into the
-- pointer); marks the coordinates it uses in `used`.
local function offset_expr(r, dne, I, used)
    local terms = {}
    for d = 1, 4 do
        local n, s = r.ne[d], r.st[d]
        if dne[d] > 1 and n > 1 and s ~= 0 then
            used[d] = true
            local c = "i" .. (d - 1)
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

@ if loop then
    for (${ix} i = blockIdx.x * ${I(BLOCK)} + threadIdx.x; i < ${I(n)}; i += gridDim.x * ${I(BLOCK)}) {
@ else
    const ${ix} i = blockIdx.x * ${I(BLOCK)} + threadIdx.x;
    if (i >= ${I(n)})
        return;
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

    -- Launch.
    local nblocks = math.max(1, (n + BLOCK - 1) // BLOCK)
    local loop = nblocks > MAX_GRID_X
    local grid_x = loop and LOOP_GRID_X or nblocks
    local launch = loop and string.format("grid-stride loop over %d blocks of %d", grid_x, BLOCK)
        or string.format("%d block%s of %d", nblocks, nblocks == 1 and "" or "s", BLOCK)

    local pre = prelude.new()

    -- Parameters and typed pointers.
    local nparams = k.nparams
    local plist = {}
    for p = 0, nparams - 1 do
        plist[#plist + 1] = (p == 0 and "char" or "const char") .. " *__restrict__ p" .. p
    end
    local params = table.concat(plist, ", ")
    local name = kernel_name(instrs)
    if #params + #name > 90 then
        params = "\n    " .. table.concat(plist, ",\n    ")
    end
    local function ptr(r, var, const)
        if math.type(r.param) ~= "integer" or r.param < 0 or r.param >= nparams then
            fail("%s: param %s out of range", var, tostring(r.param))
        end
        local ct = (const and "const " or "") .. prelude.ctype[r.type]
        local offs = ""
        if r.offs ~= 0 then offs = " + " .. tostring(r.offs) .. (math.abs(r.offs) > INT_MAX and "ll" or "") end
        return string.format("%s *const %s = (%s *)p%d%s;", ct, var, ct, r.param, offs)
    end
    local ptrs = { ptr(dst, "out", false) }
    for j, r in ipairs(inputs) do ptrs[#ptrs + 1] = ptr(r, "in" .. (j - 1), true) end

    -- Operand offsets.
    local nat = natural(dne)
    local used = {}
    local function at(r)
        if is_linear(r, dne, nat) then return "i", "linear" end
        local e = offset_expr(r, dne, I, used)
        local bcast = false
        for d = 1, 4 do
            if r.ne[d] ~= dne[d] or (r.ne[d] > 1 and r.st[d] == 0) then bcast = true end
        end
        return e, bcast and "broadcast" or "strided"
    end
    local notes = {}
    local function note(r, what, how)
        notes[#notes + 1] = string.format("%-4s p%d %-4s ne %s st %s offs %d (%s)", what, r.param,
            r.type, dims(r.ne), dims(r.st), r.offs, how)
    end
    local dst_at, how = at(dst)
    note(dst, "out", how)
    local loads = {}
    for j, r in ipairs(inputs) do
        local e
        e, how = at(r)
        note(r, "in" .. (j - 1), how)
        loads[j] = string.format("const float r%d = %s;", j - 1,
            pre.load(r.type, "in" .. (j - 1) .. "[" .. e .. "]"))
    end

    -- Coordinates.
    local body = {}
    local stride = 1
    local last = 0
    for d = 1, 4 do if dne[d] > 1 then last = d end end
    for d = 1, 4 do
        if used[d] then
            local e = "i"
            if stride > 1 then e = e .. " / " .. I(stride) end
            if d < last then e = e .. " % " .. I(dne[d]) end
            body[#body + 1] = string.format("const %s i%d = %s;", ix, d - 1, e)
        end
        stride = stride * dne[d]
    end
    if #body > 0 then body[#body + 1] = "" end
    for _, l in ipairs(loads) do body[#body + 1] = l end

    -- Instructions.
    local nin = #inputs
    for j, ins in ipairs(instrs) do
        local reg = nin + j - 1
        local op = ops[ins.op]
        if type(op) ~= "table" then fail("unknown op %s", tostring(ins.op)) end
        local function operand(v, which)
            if math.type(v) ~= "integer" or v < 0 or v >= reg then
                fail("instr %d (%s): operand %s = %s is not an earlier register", j - 1, ins.op, which,
                    tostring(v))
            end
            return "r" .. v
        end
        local a = operand(ins.a, "a")
        local b = op.arity > 1 and operand(ins.b, "b") or nil
        local f = ins.f or { "0.0f", "0.0f" }
        local e = op.expr(a, b, f)
        local t = ins.type or "f32"
        if not prelude.ctype[t] then fail("instr %d: unsupported type %s", j - 1, tostring(t)) end
        -- The last result is converted to dst's type on store; rounding it to that type first
        -- changes nothing.
        if not (j == #instrs and t == dst.type) then e = pre.round(t, e) end
        body[#body + 1] = string.format("const float r%d = %s;", reg, e)
        local args = a .. (b and ", " .. b or "") .. (ins.op == "scale" and ", " .. f[1] .. ", " .. f[2] or "")
        notes[#notes + 1] = string.format("r%d = %s(%s)%s", reg, ins.op, args, t ~= "f32" and " -> " .. t or "")
    end
    body[#body + 1] = string.format("out[%s] = %s;", dst_at, pre.store(dst.type, "r" .. (nin + #instrs - 1)))

    local ind = loop and "        " or "    "
    for j, s in ipairs(body) do
        if s ~= "" then body[j] = ind .. s end
    end

    local source = kernel {
        name = name, dst = dst, n = n, launch = launch, bits = wide and 64 or 32, notes = notes,
        pre = n > 0 and (pre.code():gsub("\n$", "")) or "", BLOCK = BLOCK, params = params, ptrs = ptrs,
        loop = loop, ix = ix, I = I, body = body, dims = dims,
    }
    return {
        name = name,
        source = source,
        grid = { grid_x, 1, 1 },
        block = { BLOCK, 1, 1 },
        smem = 0,
    }
end
