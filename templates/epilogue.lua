-- epilogue: the elementwise epilogue of an IR_OP node (docs/templates.md, "Epilogues") as CUDA
-- statements, for the templates of the families that apply epilogues (norm, matmul, ...).
--
-- k.epilogue = { op_type =, values =, instrs = }. At one output coordinate the registers are
--   0..nin-1        the node's operands read at that coordinate (nin = #k.inputs); only the
--                   epilogue's own operands (in no k.args slot) are ever read by instructions,
--   nin..nin+nv-1   the op's values (nv = k.epilogue.values: 2 when paired), rounded to op_type,
--   nin+nv+j        instruction j's result, rounded to its type.
-- The last result is what the kernel stores to dst (converted to dst's type).
--
-- The caller owns the loop over output elements and the addressing; this module turns the
-- instructions into statements over f32 expressions the caller supplies:
--
--   local E = require("epilogue")
--   for _, j in ipairs(E.operands(k)) do ... end        -- operands to load (0-based indices)
--   local lines, result = E.lines(k, pre, values, loads, pfx)
--
-- values[v] (v = 1..nv): f32 expression of op value v-1 (not yet rounded); loads[j] (j 0-based,
-- for every j of E.operands(k)): f32 expression of operand j at the coordinate; pfx: a prefix
-- making the register names unique in their scope (one per output element when the caller
-- unrolls elements). E.offset builds an operand's element offset from coordinate expressions,
-- broadcasting by modulo exactly as IR_EW inputs do.

local ops = require("ops")
local prelude = require("prelude")

local M = {}

local function fail(fmt, ...) error("epilogue: " .. string.format(fmt, ...), 0) end

-- The 0-based operand indices the instructions read, ascending: the epilogue's own operands.
function M.operands(k)
    local e = k.epilogue
    if not e then return {} end
    local nin = #k.inputs
    local used = {}
    for _, ins in ipairs(e.instrs) do
        local op = ops[ins.op]
        if type(op) ~= "table" then fail("unknown op %s", tostring(ins.op)) end
        if math.type(ins.a) == "integer" and ins.a < nin then used[ins.a] = true end
        if op.arity > 1 and math.type(ins.b) == "integer" and ins.b < nin then used[ins.b] = true end
    end
    local list = {}
    for j = 0, nin - 1 do
        if used[j] then list[#list + 1] = j end
    end
    return list
end

-- The ops of the instructions joined by "_" (for kernel names), at most max characters.
function M.name(k, max)
    local s = ""
    for _, ins in ipairs(k.epilogue and k.epilogue.instrs or {}) do
        if #s + 1 + #ins.op > max then break end
        s = s .. "_" .. ins.op
    end
    return s
end

-- Element offset of operand r (without r.offs) at the coordinates c[1..4] (C expressions of
-- unsigned or 64-bit type, nil for a coordinate that is always 0) of a dst of extents dne:
-- sum over d of (c_d mod r.ne[d]) * r.st[d], the modulo dropped where r spans dne[d] and the
-- term where r is broadcast. I(v) formats an integer constant in the index type.
function M.offset(r, dne, c, I)
    local terms = {}
    for d = 1, 4 do
        local n, s = r.ne[d], r.st[d]
        if c[d] and dne[d] > 1 and n > 1 and s ~= 0 then
            if dne[d] % n ~= 0 then fail("operand ne[%d] = %d does not divide dst's %d", d - 1, n, dne[d]) end
            local e = c[d]
            if n ~= dne[d] then e = "(" .. e .. ") % " .. I(n) end
            if s ~= 1 then e = "(" .. e .. ") * " .. I(s) end
            terms[#terms + 1] = e
        end
    end
    if #terms == 0 then return I(0) end
    return table.concat(terms, " + ")
end

-- Statements computing the epilogue at one coordinate, and the f32 expression of its result.
function M.lines(k, pre, values, loads, pfx)
    local e = k.epilogue
    if not e or #e.instrs == 0 then fail("node has no epilogue") end
    local nin = #k.inputs
    local nv = e.values or 1
    if #values ~= nv then fail("%d op values given, the node has %d", #values, nv) end
    local ot = e.op_type
    if not prelude.ctype[ot] then fail("unsupported op type %s", tostring(ot)) end
    local dt = k.dst.type
    local lines = {}
    local defined = {}
    local function reg(v) return pfx .. v end
    for _, j in ipairs(M.operands(k)) do
        if not loads[j] then fail("operand %d is read but not loaded", j) end
        lines[#lines + 1] = string.format("const float %s = %s;", reg(j), loads[j])
        defined[j] = true
    end
    for v = 1, nv do
        lines[#lines + 1] = string.format("const float %s = %s;", reg(nin + v - 1), pre.round(ot, values[v]))
        defined[nin + v - 1] = true
    end
    local first = nin + nv
    for j, ins in ipairs(e.instrs) do
        local r = first + j - 1
        local op = ops[ins.op]
        local function operand(v, which)
            if math.type(v) ~= "integer" or not defined[v] then
                fail("instr %d (%s): operand %s = %s is not an earlier register or a loaded operand", j - 1, ins.op,
                    which, tostring(v))
            end
            return reg(v)
        end
        local a = operand(ins.a, "a")
        local b = op.arity > 1 and operand(ins.b, "b") or nil
        local x = op.expr(a, b, ins.f or { "0.0f", "0.0f" })
        local t = ins.type or "f32"
        if not prelude.ctype[t] then fail("instr %d: unsupported type %s", j - 1, tostring(t)) end
        -- The last result is converted to dst's type on store: rounding it first changes nothing.
        if not (j == #e.instrs and t == dt) then x = pre.round(t, x) end
        lines[#lines + 1] = string.format("const float %s = %s;", reg(r), x)
        defined[r] = true
    end
    return lines, reg(first + #e.instrs - 1)
end

-- Header notes describing the epilogue: one line per instruction.
function M.notes(k)
    local e = k.epilogue
    local nin = #k.inputs
    local nv = e.values or 1
    local function name(v)
        if v < nin then return "in" .. v end
        if v < nin + nv then return nv == 1 and "op" or ("op" .. (v - nin)) end
        return "r" .. (v - nin - nv)
    end
    local out = { string.format("epilogue (op value rounded to %s):", e.op_type) }
    for j, ins in ipairs(e.instrs) do
        local args = name(ins.a)
        if ops[ins.op].arity > 1 then args = args .. ", " .. name(ins.b) end
        if ins.op == "scale" then args = args .. ", " .. ins.f[1] .. ", " .. ins.f[2] end
        out[#out + 1] = string.format("  r%d = %s(%s)%s", j - 1, ins.op, args,
            (ins.type or "f32") ~= "f32" and (" -> " .. ins.type) or "")
    end
    return out
end

return M
