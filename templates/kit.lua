-- kit: what every kernel template shares (docs/templates.md, "What every template gets from
-- kit.lua"). A template takes its helpers from here and keeps no copy of them, so a fix or a
-- new rule (an operand check, a symbolic-dim refusal) lands in every template at once.
--
--   local kit = require("kit")
--   local tpl, prelude = kit.tpl, kit.prelude
--   local fail = kit.failer("rope")
--   local check_ref = kit.ref_checker(fail)
--
-- The template engine (tpl.lua) and the CUDA device helpers (prelude.lua) stay modules of their
-- own — the engine is not a template helper, and prelude is CUDA text — and are re-exported
-- here; the symbolic-dim helpers live here.

local tpl = require("tpl")
local prelude = require("prelude")

local M = { tpl = tpl, prelude = prelude }

-- ---- errors and operand checks ----------------------------------------------------------------

-- fail(fmt, ...) for the template `family`: a Lua error "family: message" with no position
-- (the message names the operand; generate.c adds the node).
function M.failer(family)
    return function(fmt, ...) error(family .. ": " .. string.format(fmt, ...), 0) end
end

-- check_ref(r, what [, types]): fails (through `fail`) unless r is a ref of k (docs/templates.md)
-- whose type is a key of `types` (default opts.types) with integer ne, st, offs and param.
-- opts.min_ne is the smallest extent accepted: 0 in templates that handle an empty index space
-- (elementwise, norm), 1 elsewhere (the default). opts.offs_min, when set, is the smallest
-- offset accepted (matmul addresses from the buffer's start).
function M.ref_checker(fail, opts)
    opts = opts or {}
    local min_ne = opts.min_ne or 1
    return function(r, what, types)
        types = types or opts.types
        if type(r) ~= "table" then fail("%s: missing", what) end
        if not types[r.type] then fail("%s: unsupported type %s", what, tostring(r.type)) end
        for d = 1, 4 do
            if math.type(r.ne[d]) ~= "integer" or r.ne[d] < min_ne then fail("%s: bad ne[%d]", what, d - 1) end
            if math.type(r.st[d]) ~= "integer" then fail("%s: bad st[%d]", what, d - 1) end
        end
        if math.type(r.offs) ~= "integer" or (opts.offs_min and r.offs < opts.offs_min) then
            fail("%s: bad offs", what)
        end
        if math.type(r.param) ~= "integer" then fail("%s: bad param", what) end
    end
end

-- ---- pointers -------------------------------------------------------------------------------

-- An int C literal, long long when its magnitude passes 2^31 - 1.
function M.int_lit(v) return tostring(v) .. (math.abs(v) > 2147483647 and "ll" or "") end

-- Fails (through `fail`) unless r.param is a parameter of a node with nparams buffers; `var`
-- names the pointer in the message.
function M.check_param(fail, r, var, nparams)
    if math.type(r.param) ~= "integer" or r.param < 0 or r.param >= nparams then
        fail("%s: param %s out of range", var, tostring(r.param))
    end
end

-- The declaration of `var`, a pointer to operand r's first element (elements of C type ct,
-- const when `const`) in parameter p<r.param>: "ct *const var = (ct *)pN + offs;". `lit`
-- writes the offset (default kit.int_lit).
function M.pointer(r, var, ct, const, lit)
    local cq = (const and "const " or "") .. ct
    local offs = r.offs ~= 0 and (" + " .. (lit or M.int_lit)(r.offs)) or ""
    return string.format("%s *const %s = (%s *)p%d%s;", cq, var, cq, r.param, offs)
end

-- ---- text -------------------------------------------------------------------------------------

-- "[a, b, c, d]": a list of integers as kernels' comments print ne and st.
function M.dims(t) return "[" .. table.concat(t, ", ") .. "]" end

-- A 64-bit C literal of an element offset or stride (so products never wrap).
function M.ll(v) return tostring(v) .. "ll" end

-- A list of lines with an indentation level (4 spaces a level; `ind` the starting one, default
-- none). Preprocessor lines (starting with '#') are never indented.
function M.builder(ind)
    local b = { lines = {}, ind = ind or "" }
    function b.add(fmt, ...)
        local s = select("#", ...) > 0 and string.format(fmt, ...) or fmt
        b.lines[#b.lines + 1] = (s:sub(1, 1) == "#" and "" or b.ind) .. s
    end
    function b.push() b.ind = b.ind .. "    " end
    function b.pop() b.ind = b.ind:sub(5) end
    -- A line that opens a block ("for (...) {"), and the line that closes it (default "}").
    function b.open(fmt, ...)
        b.add(fmt, ...)
        b.push()
    end
    function b.close(s)
        b.pop()
        b.add(s or "}")
    end
    function b.text() return table.concat(b.lines, "\n") end
    return b
end

-- ---- the kernel source ------------------------------------------------------------------------

-- The source of one kernel, in the order every template writes it: the `head` comment lines
-- (each after "// "), the `notes` (after "//   "), the prelude helpers `pre` (a string, "" for
-- none), each of `blocks` (types, device helpers) after a blank line, then the entry
-- `name(params)` with __launch_bounds__(threads) — on one line when `inline`, else the name on
-- a line of its own — and its body: `ptrs` (indented by 4) and the `body` lines as they are.
M.kernel = tpl.define [[
@ for _, l in ipairs(head) do
// ${l}
@ end
@ for _, l in ipairs(notes or {}) do
//   ${l}
@ end
@ if pre ~= "" then

${pre}
@ end
@ for _, t in ipairs(blocks or {}) do

${t}
@ end

@ if inline then
extern "C" __global__ void __launch_bounds__(${threads}) ${name}(${params})
@ else
extern "C" __global__ void __launch_bounds__(${threads})
${name}(${params})
@ end
{
@ for _, p in ipairs(ptrs or {}) do
    ${p}
@ end
@ for _, s in ipairs(body) do
${s}
@ end
}
]]

-- ---- integers ---------------------------------------------------------------------------------

function M.ceil_div(a, b) return (a + b - 1) // b end

-- The non-nil entries of list t in order (a table constructor with `cond and x or nil` items
-- leaves holes, which # does not see past reliably).
function M.compact(t)
    local n, out = 0, {}
    for i in pairs(t) do if type(i) == "number" and i > n then n = i end end
    for i = 1, n do if t[i] ~= nil then out[#out + 1] = t[i] end end
    return out
end

-- v rounded up to a multiple of m.
function M.round_up(v, m) return (v + m - 1) // m * m end

-- The smallest power of two >= x (1 for x <= 1).
function M.next_pow2(x)
    local p = 1
    while p < x do p = p * 2 end
    return p
end

-- Largest element offset r reaches, and whether its offset or a stride it moves along is
-- negative (dims of extent 1 never move).
function M.reach(r)
    local m, neg = r.offs, r.offs < 0
    for d = 1, 4 do
        if r.ne[d] > 1 then
            if r.st[d] < 0 then neg = true else m = m + (r.ne[d] - 1) * r.st[d] end
        end
    end
    return m, neg
end

-- ---- symbolic dims (docs/templates.md: ref.dyn) -----------------------------------------------

-- The C expression (int) of r's run-time extent in dim d (1-based), or nil when static (or r nil).
function M.ext(r, d) return r and r.dyn and r.dyn[d] or nil end

-- The first of r's dynamic dims (1-based) that is not in the set `allowed`, or nil.
function M.disallowed(r, allowed)
    for d = 1, 4 do
        if M.ext(r, d) and not allowed[d] then return d end
    end
    return nil
end

-- dyn_only(r, what, allowed): fails (through `fail`) unless r's dynamic dims are among the
-- allowed ones (a set of 1-based dims).
function M.dyn_checker(fail)
    return function(r, what, allowed)
        local d = M.disallowed(r, allowed)
        if d then fail("%s: symbolic dim %d is not supported", what, d - 1) end
    end
end

-- Lines declaring r1..r3, the coordinates of row `row` (a C variable) over rows of extents ne
-- (dims 2..4) whose run-time extents are dy.ext[d] where symbolic, and the coordinate names by
-- dim (nil for dims of extent 1).
function M.row_coords(ne, dy)
    local last = 1
    for d = 2, 4 do if ne[d] > 1 then last = d end end
    local lines, coords = {}, {}
    local sconst, sdyn = 1, {}
    for d = 2, 4 do
        if ne[d] > 1 then
            local f = {}
            if sconst > 1 then f[#f + 1] = sconst .. "u" end
            for _, x in ipairs(sdyn) do f[#f + 1] = x end
            local e = "row"
            if #f == 1 then e = e .. " / " .. f[1]
            elseif #f > 1 then e = e .. " / (" .. table.concat(f, " * ") .. ")" end
            if d < last then
                if #f > 0 then e = "(" .. e .. ")" end
                e = e .. " % " .. (dy.ext[d] or (ne[d] .. "u"))
            end
            lines[#lines + 1] = string.format("const unsigned r%d = %s;", d - 1, e)
            coords[d] = "r" .. (d - 1)
        end
        if dy.ext[d] then sdyn[#sdyn + 1] = dy.ext[d] else sconst = sconst * ne[d] end
    end
    return lines, coords
end


-- The head of a flat kernel's loop over its index space: variable v (C type ix) takes
-- blockIdx.x * step + threadIdx.x; with loop, a grid-stride for loop (its "{" opened) to bound,
-- else one index and a return when it is >= bound. Lines indented for a kernel's body.
function M.flat_index(ix, v, bound, step, loop)
    if loop then
        return { string.format("    for (%s %s = blockIdx.x * %s + threadIdx.x; %s < %s; %s += gridDim.x * %s) {",
            ix, v, step, v, bound, v, step) }
    end
    return { string.format("    const %s %s = blockIdx.x * %s + threadIdx.x;", ix, v, step),
        string.format("    if (%s >= %s)", v, bound), "        return;" }
end


-- kiln_sort_key under the comment lines `comment`: the order-preserving pattern of a float
-- (unsigned comparison orders values as numbers, -0 == +0, NaN above +inf), as the sort and
-- moe kernels declare it.
function M.sort_key_helper(comment)
    return comment .. [[

static __device__ __forceinline__ unsigned kiln_sort_key(float v)
{
    unsigned u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0xffffffffu;
    if (u == 0x80000000u)
        u = 0u;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}]]
end

-- kiln_warp_min, the minimum of a 64-bit key over the warp (sort's warp kernel, moe).
M.WARP_MIN_HELPER = [[
/* Minimum of x over the warp (keys are distinct, so one lane holds it). */
static __device__ __forceinline__ unsigned long long kiln_warp_min(unsigned long long x)
{
#if __CUDA_ARCH__ >= 800
    const unsigned hi = __reduce_min_sync(0xffffffffu, (unsigned)(x >> 32));
    const unsigned lo = __reduce_min_sync(0xffffffffu, (unsigned)(x >> 32) == hi ? (unsigned)x : 0xffffffffu);
    return (unsigned long long)hi << 32 | lo;
#else
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long y = __shfl_xor_sync(0xffffffffu, x, o);
        x = y < x ? y : x;
    }
    return x;
#endif
}]]

return M
