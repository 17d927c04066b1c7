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
--
-- Kernels that store dst element by element at 64-bit offsets (matmul, matmul_id) use
-- E.store_lines(k, pre, c, vals) (the whole store at dst coordinates c, epilogue or not) and,
-- for plans whose products land in scratch, E.step_body(k, pre, voffs) (a kernel step of
-- E.STEP_BLOCK threads per block applying the epilogue over dst).

local kit = require("kit")
local ops = require("ops")
local prelude = require("prelude")

local M = {}

local fail = kit.failer("epilogue")

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
    for _, j in ipairs(M.operands(k)) do
        if k.inputs[j + 1].by_id then fail("operand %d is read through ids: only store_lines reads those", j) end
    end
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

-- ---- the instructions of an IR_EW node (templates/elementwise.lua, templates/heads.lua) ------

-- The statements of an elementwise node's instructions (register nin + j - 1 for instrs[j],
-- named pfx .. "r" .. register, pfx default ""), their notes, and the register of the result:
-- registers 0..nin-1 are the inputs, which the caller defines. Each result is rounded to its
-- type, but the last when dst's type is that type (its store converts it: rounding first
-- changes nothing).
function M.instructions(instrs, nin, dst, pre, pfx)
    pfx = pfx or ""
    local lines, notes = {}, {}
    for j, ins in ipairs(instrs) do
        local reg = nin + j - 1
        local op = ops[ins.op]
        if type(op) ~= "table" then fail("unknown op %s", tostring(ins.op)) end
        local function operand(v, which)
            if math.type(v) ~= "integer" or v < 0 or v >= reg then
                fail("instr %d (%s): operand %s = %s is not an earlier register", j - 1, ins.op, which,
                    tostring(v))
            end
            return pfx .. "r" .. v
        end
        local a = operand(ins.a, "a")
        local b = op.arity > 1 and operand(ins.b, "b") or nil
        local f = ins.f or { "0.0f", "0.0f" }
        local e = op.expr(a, b, f)
        local t = ins.type or "f32"
        if not prelude.ctype[t] then fail("instr %d: unsupported type %s", j - 1, tostring(t)) end
        if not (j == #instrs and t == dst.type) then e = pre.round(t, e) end
        lines[#lines + 1] = string.format("const float %sr%d = %s;", pfx, reg, e)
        local args = a .. (b and ", " .. b or "") .. (ins.op == "scale" and ", " .. f[1] .. ", " .. f[2] or "")
        notes[#notes + 1] = string.format("%sr%d = %s(%s)%s", pfx, reg, ins.op, args, t ~= "f32" and " -> " .. t or "")
    end
    return lines, notes, pfx .. "r" .. (nin + #instrs - 1)
end

-- ---- for kernels that store element by element (matmul, matmul_id) -------------------------

local INT_MAX = 2147483647

-- The 64-bit element offset of ref r at dst coordinates c (C expressions, nil for 0), r
-- broadcast by modulo where its extent is smaller than dst's (dne).
local function store_offset(r, c, dne)
    local t = {}
    for d = 1, 4 do
        if c[d] and r.ne[d] > 1 and r.st[d] ~= 0 then
            local e = "(" .. c[d] .. ")"
            if r.ne[d] ~= dne[d] then e = "(" .. e .. " % " .. r.ne[d] .. "u)" end
            t[#t + 1] = "(long long)" .. e .. (r.st[d] ~= 1 and " * " .. tostring(r.st[d]) .. "ll" or "")
        end
    end
    if r.offs ~= 0 then t[#t + 1] = tostring(r.offs) .. "ll" end
    return #t > 0 and table.concat(t, " + ") or "0"
end

-- Register e<i> for operand r (number i) of a mul_mat_id read through its ids (k.inputs[i].by_id,
-- ir.h): at dst coordinates c = (row, slot, token) the element (row, ids[slot, token]) of r
-- ([ne0, experts]), 0 for an id out of range (mul_mat_id's rows of such an id are zeros too).
local function by_id_load(k, pre, r, i, c, ct)
    local ids = k.args and k.args.ids
    if not ids or ids.type ~= "i32" then fail("operand %d is read through ids, but the node has no i32 ids", i) end
    local ie = store_offset(ids, { c[2], c[3] }, { k.dst.ne[2], k.dst.ne[3], 1, 1 })
    local row = c[1] and string.format("(long long)(%s)%s", c[1], r.st[1] ~= 1 and " * " .. r.st[1] .. "ll" or "") or "0ll"
    return {
        string.format("    const int id%d = ((const int *)p%d)[%s];", i, ids.param, ie),
        string.format("    const float e%d = (unsigned)id%d < %du ? %s : 0.0f;", i, i, r.ne[2],
            pre.load(r.type, string.format("((const %s *)p%d)[%s%s + (long long)id%d * %dll]", ct, r.param,
                r.offs ~= 0 and r.offs .. "ll + " or "", row, i, r.st[2]))),
    }
end

-- Lines storing to dst at coordinates c what the node computes there from the op's values
-- vals (f32 expressions: the product, then with k.pair the paired product): without an
-- epilogue vals[1]; with one, registers 0..nin-1 the epilogue's own operands (only those its
-- instructions read: the op's operands are never read), nin.. the values rounded to op_type,
-- then the instructions, each rounded to its type; the last is stored in dst's type.
-- The epilogue's statements at dst coordinates c (into L, each indented), and its result's register.
local function compute(k, pre, c, vals, L)
    local d, e = k.dst, k.epilogue
    local nin, nv = #k.inputs, e.values or 1
    if nv ~= #vals then fail("epilogue over %d values, the kernel has %d", nv, #vals) end
    local used = {}
    for _, ins in ipairs(e.instrs) do
        used[ins.a] = true
        if ins.b then used[ins.b] = true end
    end
    for i = 0, nin - 1 do
        if used[i] then
            local r = k.inputs[i + 1]
            local ct = prelude.ctype[r.type]
            if not ct then fail("epilogue operand %d: unsupported type %s", i, tostring(r.type)) end
            if r.by_id then
                for _, l in ipairs(by_id_load(k, pre, r, i, c, ct)) do L[#L + 1] = l end
            else
                L[#L + 1] = string.format("    const float e%d = %s;", i,
                    pre.load(r.type, string.format("((const %s *)p%d)[%s]", ct, r.param, store_offset(r, c, d.ne))))
            end
        end
    end
    for v = 1, nv do L[#L + 1] = string.format("    const float e%d = %s;", nin + v - 1, pre.round(e.op_type, vals[v])) end
    local first = nin + nv
    if #e.instrs == 0 then fail("epilogue without instructions") end
    for j, ins in ipairs(e.instrs) do
        local reg = first + j - 1
        local op = ops[ins.op]
        if type(op) ~= "table" then fail("epilogue: unknown op %s", tostring(ins.op)) end
        local function operand(v)
            if math.type(v) ~= "integer" or v < 0 or v >= reg then fail("epilogue instr %d: bad register %s", j - 1, tostring(v)) end
            return "e" .. v
        end
        local x = op.expr(operand(ins.a), op.arity > 1 and operand(ins.b) or nil, ins.f or { "0.0f", "0.0f" })
        local t = ins.type or "f32"
        if not prelude.ctype[t] then fail("epilogue instr %d: unsupported type %s", j - 1, tostring(t)) end
        if not (j == #e.instrs and t == d.type) then x = pre.round(t, x) end
        L[#L + 1] = string.format("    const float e%d = %s;", reg, x)
    end
    return "e" .. (first + #e.instrs - 1)
end

function M.store_lines(k, pre, c, vals)
    local d, e = k.dst, k.epilogue
    local L = {}
    if not prelude.ctype[d.type] then fail("dst: unsupported type %s", tostring(d.type)) end
    local function store(v)
        L[#L + 1] = string.format("((%s *)p%d)[%s] = %s;", prelude.ctype[d.type], d.param, store_offset(d, c, d.ne),
            pre.store(d.type, v))
    end
    if not e then
        store(vals[1])
        return L
    end
    L[#L + 1] = "{"
    local result = compute(k, pre, c, vals, L)
    store(result)
    L[#L] = "    " .. L[#L]
    L[#L + 1] = "}"
    return L
end

-- Lines setting `out` (a float declared by the caller) to what the node stores at dst
-- coordinates c, instead of storing it: the GEMV whose result its tails read (gemv_rope).
function M.value_lines(k, pre, c, vals, out)
    if not k.epilogue then return { string.format("%s = %s;", out, vals[1]) } end
    local L = { "{" }
    local result = compute(k, pre, c, vals, L)
    L[#L + 1] = string.format("    %s = %s;", out, result)
    L[#L + 1] = "}"
    return L
end

local EP_BLOCK = 256
M.STEP_BLOCK = EP_BLOCK -- threads per block of step_body's kernel

-- The epilogue as a kernel step of its own (the fallback of plans that cannot apply it where
-- they store): one thread per dst element; the op's values are f32, contiguous in dst's shape,
-- in the scratch at element offsets voffs[1..]. Returns the lines of the body.
-- The outermost dim of dst with an extent, when it is the only symbolic one: a run's elements
-- are then the first (inner elements) x (its run-time extent), which a grid-stride loop visits
-- with a grid of EP_GRID blocks at most. (H100, Llama-3-8B batch program at n_tokens <= 512: a
-- block per element of the maximum, most leaving at once, took 39 us for 14336 x 64 GLU
-- values, 8 times the work's.)
local EP_GRID = 1024
local function outer_dyn(d)
    local outer
    for dd = 4, 1, -1 do
        if d.ne[dd] > 1 then
            outer = dd
            break
        end
    end
    if not outer or not d.dyn or not d.dyn[outer] then return nil end
    for dd = 1, 4 do
        if dd ~= outer and d.ne[dd] > 1 and d.dyn[dd] then return nil end
    end
    return outer
end

-- dst's coordinates of element i (C expressions; dims of extent 1 have none) and the op's
-- values at i in the scratch (element offsets voffs).
local function element_at(k, voffs, count)
    local d = k.dst
    local c, div = {}, 1
    for dd = 1, 4 do
        if d.ne[dd] > 1 then
            local x = div == 1 and "i" or string.format("i / %du", div)
            if div * d.ne[dd] < count then x = string.format("(%s) %% %du", x, d.ne[dd]) end
            c[dd] = x
        end
        div = div * d.ne[dd]
    end
    local vals = {}
    for v, o in ipairs(voffs) do
        vals[v] = string.format("((const float *)p%d)[%si]", k.nparams, o > 0 and o .. "u + " or "")
    end
    return c, vals
end

-- step_body over a symbolic outermost dim: the run's elements by a grid-stride loop.
local function step_body_strided(k, pre, voffs, outer, count)
    local d = k.dst
    local L = {}
    L[#L + 1] = string.format("const unsigned n_run = %du * (unsigned)(%s); /* this run's elements */",
        count // d.ne[outer], d.dyn[outer])
    L[#L + 1] = string.format("for (unsigned i = blockIdx.x * %du + threadIdx.x; i < n_run; i += gridDim.x * %du) {",
        EP_BLOCK, EP_BLOCK)
    local c, vals = element_at(k, voffs, count)
    for _, l in ipairs(M.store_lines(k, pre, c, vals)) do L[#L + 1] = "    " .. l end
    L[#L + 1] = "}"
    return L, EP_GRID
end

function M.step_body(k, pre, voffs)
    local d = k.dst
    local count = d.ne[1] * d.ne[2] * d.ne[3] * d.ne[4]
    if count > INT_MAX - EP_BLOCK then fail("epilogue over %d elements: at most 2^31", count) end
    local outer = outer_dyn(d)
    if outer and count > EP_GRID * EP_BLOCK then return step_body_strided(k, pre, voffs, outer, count) end
    local L = {}
    L[#L + 1] = string.format("const unsigned i = blockIdx.x * %du + threadIdx.x;", EP_BLOCK)
    if count % EP_BLOCK ~= 0 then
        L[#L + 1] = string.format("if (i >= %du)", count)
        L[#L + 1] = "    return;"
    end
    local c, vals = element_at(k, voffs, count)
    -- Symbolic dims (dst.dyn): elements beyond a run-time extent are neither computed nor stored.
    local gd = {}
    for dd = 1, 4 do
        local x = d.dyn and d.ne[dd] > 1 and d.dyn[dd]
        if x then gd[#gd + 1] = string.format("(%s) >= (unsigned)(%s)", c[dd], x) end
    end
    if #gd > 0 then
        L[#L + 1] = string.format("if (%s)", table.concat(gd, " || "))
        L[#L + 1] = "    return;"
    end
    for _, l in ipairs(M.store_lines(k, pre, c, vals)) do L[#L + 1] = l end
    return L, (count + EP_BLOCK - 1) // EP_BLOCK
end

-- The plain nodes computing k's op values (v = 1, and 2 with k.pair, whose weight replaces
-- args[slot]) as f32 in dst's shape into the scratch, for plans that apply the epilogue as a
-- step of its own (step_body): sub-node tables, the values' element offsets in the scratch, and
-- the bytes they take (where the sub-nodes' own scratch begins: sk.scratch_base).
function M.value_nodes(k, slot)
    local d = k.dst
    local count = d.ne[1] * d.ne[2] * d.ne[3] * d.ne[4]
    local region = (count * 4 + 255) // 256 * 256
    local nv = k.pair and 2 or 1
    local base = nv * region
    local subs, voffs = {}, {}
    for v = 1, nv do
        local sk = {}
        for key, x in pairs(k) do sk[key] = x end
        sk.epilogue, sk.pair, sk.scratch_dst, sk.scratch_base = nil, nil, true, base
        voffs[v] = (v - 1) * region // 4
        sk.dst = { type = "f32", ne = d.ne, st = { 1, d.ne[1], d.ne[1] * d.ne[2], d.ne[1] * d.ne[2] * d.ne[3] },
                   offs = voffs[v], param = k.nparams, dyn = d.dyn, sym = d.sym }
        if v == 2 then
            sk.args = {}
            for key, x in pairs(k.args) do sk.args[key] = x end
            sk.args[slot] = k.pair
        end
        subs[v] = sk
    end
    return subs, voffs, base
end

-- Symbolic dims (docs/templates.md: ref.dyn): the epilogue's own operands must follow dst's
-- run-time extents. An operand may be symbolic only where dst is, with the same extent
-- expression, and may span (ne > 1) a dim where dst is symbolic only when it is symbolic there
-- too (else the bound graphs would not broadcast). fail_ reports the refusal.
function M.check_dyn(k, fail_)
    local d = k.dst
    local function dy(r, i) return r.dyn and r.ne[i] > 1 and r.dyn[i] or nil end
    for _, j in ipairs(M.operands(k)) do
        local r = k.inputs[j + 1]
        for i = 1, 4 do
            local rd, dd = dy(r, i), dy(d, i)
            if (rd or (dd and r.ne[i] > 1)) and rd ~= dd then
                local nm = (r.sym and r.sym[i]) or (d.sym and d.sym[i]) or "?"
                fail_("epilogue operand %d: symbolic dim '%s' in dim %d does not follow dst's (not supported)", j, nm, i - 1)
            end
        end
    end
end

-- Whether two kernel sources differ only in comments: the paired value's conversion or routing
-- step names a different weight in its notes but does the same work, so it runs once.
function M.same_code(a, b)
    local function code(src) return src and (src:gsub("//[^\n]*\n", ""):gsub("/%*.-%*/", "")) end
    return a ~= nil and b ~= nil and code(a) == code(b)
end

return M
