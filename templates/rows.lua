-- rows: the kernel template of the rows family (get_rows, set_rows, concat, pad, add_id); see
-- docs/templates.md for the table k of IR_OP nodes and docs/ops-rows.md for the design.
--
-- Every op is a row copy: one destination row (dst is contiguous, rows of ne0 elements) is
-- written by a group of TPR threads (TPR a power of two, 1..256), RPB = 256 / TPR rows per block
-- of TPR x RPB threads, a grid-stride loop over the rows. Each thread moves V consecutive
-- elements of the row at a time (16 bytes of dst's type: one whole-sector vector store per
-- warp instruction; sources are read as vectors of V of their own type), U chunks per loop
-- trip: it loads all U chunks, then stores them, so U 16-byte loads are in flight per thread.
-- A source whose row is contiguous and aligned for V elements (checked here, on the static
-- offsets and strides; buffers are 256-byte aligned) is read as vectors, any other element by
-- element. What differs between the ops is where a row comes from:
--
-- * get_rows: a's row ids[i1, i2, i3] of matrix (i2, i3), converted to f32. An id out of range
--   gives a row of zeros (the CPU reference reports it as an error, as ggml asserts).
-- * set_rows: one warp per row (TPR = 32). The warp scans ids[:, i2 % ids.ne1, i3 % ids.ne2] for
--   the last j naming this row (warp max of the matches): if found, b's row j converted to dst's
--   type, else a's row copied. Every row is written, since dst is a fresh buffer.
-- * concat: along dim >= 1 a row comes from a or from b; along dim 0 each chunk does.
-- * pad: zeros outside the source's box, the source inside it.
-- * add_id: a's row plus b's row ids[i1, i2] (zeros for an id out of range).
--
-- Values are copied bit for bit where types agree; offsets are 64-bit (long long), positions
-- inside a row 32-bit.

local quant = require("quant")
local kit = require("kit")
local tpl = require("tpl")
local prelude = require("prelude")

local BLOCK = 256
local INT_MAX = 2147483647
local MAX_GRID_X = 2147483647
local VEC_BYTES = 16 -- bytes of the narrowest type one thread moves per chunk
local UNROLL = 4     -- chunks per loop trip (loads in flight per thread)

local SIZE = { f32 = 4, f16 = 2, bf16 = 2, i32 = 4, i64 = 8 }
local CTYPE = { f32 = "float", f16 = "unsigned short", bf16 = "unsigned short", i32 = "int", i64 = "long long" }
local ZERO = { f32 = "0.0f", f16 = "0", bf16 = "0" } -- +0.0 in each float type's bits

local fail = kit.failer("rows")

local dims = kit.dims

local check_ref = kit.ref_checker(fail, { types = SIZE })

-- ---- symbolic dims (docs/templates.md: ref.dyn) ----------------------------------------------
--
-- dyn(r, d): the C expression (int) of r's run-time extent in dim d (1-based), or nil when static.
local dyn = kit.ext

-- Fails unless r's dynamic dims are among the allowed ones (a set of 1-based dims).
local dyn_only = kit.dyn_checker(fail)

local next_pow2 = kit.next_pow2

-- ---- the kernel being built -------------------------------------------------------------------

-- A kernel under construction: parameters, pointers, vector types, row coordinates.
local function new_kernel(k)
    local K = { k = k, pre = prelude.new(), types = {}, seen = {}, ptrs = {}, notes = {}, used = {} }
    local plist = {}
    for p = 0, k.nparams - 1 do
        plist[#plist + 1] = (p == 0 and "char" or "const char") .. " *__restrict__ p" .. p
    end
    K.params = table.concat(plist, ", ")
    if #K.params > 80 then K.params = "\n    " .. table.concat(plist, ",\n    ") end
    return K
end

-- Declares the typed pointer `var` to r's first element (offset baked in).
local function pointer(K, r, var, const)
    if math.type(r.param) ~= "integer" or r.param < 0 or r.param >= K.k.nparams then
        fail("%s: param %s out of range", var, tostring(r.param))
    end
    local ct = (const and "const " or "") .. CTYPE[r.type]
    local offs = ""
    if r.offs ~= 0 then offs = " + " .. tostring(r.offs) .. (math.abs(r.offs) > INT_MAX and "ll" or "") end
    K.ptrs[#K.ptrs + 1] = string.format("%s *const %s = (%s *)p%d%s;", ct, var, ct, r.param, offs)
    K.notes[#K.notes + 1] = string.format("%-4s p%d %-4s ne %s st %s offs %d", var, r.param, r.type,
        dims(r.ne), dims(r.st), r.offs)
end

-- The struct of v elements of type t (defined once per kernel, in order of first use).
local function vtype(K, t, v)
    local name = string.format("kiln_%sx%d", t == "f32" and "f32" or "u16", v)
    if not K.seen[name] then
        K.seen[name] = true
        K.types[#K.types + 1] = string.format("struct alignas(%d) %s {\n    %s v[%d];\n};",
            math.min(VEC_BYTES, v * SIZE[t]), name, CTYPE[t], v)
    end
    return name
end

-- Can r's rows be read as aligned vectors of v elements starting at multiples of v?
local function can_vec(r, v)
    if v == 1 then return false end
    if r.ne[1] > 1 and r.st[1] ~= 1 then return false end
    if r.ne[1] % v ~= 0 then return false end
    local s = SIZE[r.type]
    local al = math.min(VEC_BYTES, v * s)
    if (r.offs * s) % al ~= 0 then return false end
    for d = 2, 4 do
        if r.ne[d] > 1 and (r.st[d] * s) % al ~= 0 then return false end
    end
    return true
end

-- x * s as a 64-bit C expression (x an identifier or parenthesized).
local function mul64(x, s)
    if s == 1 then return "(long long)" .. x end
    return x .. " * " .. s .. "ll"
end

-- 64-bit element offset of r at coordinates c[1..4] (C expressions, nil meaning 0), without
-- r.offs (baked into the pointer). Broadcast dims (ne 1) drop out.
local function offset(r, c)
    local terms = {}
    for d = 1, 4 do
        if c[d] and r.ne[d] > 1 and r.st[d] ~= 0 then terms[#terms + 1] = mul64(c[d], r.st[d]) end
    end
    if #terms == 0 then return "0ll" end
    return table.concat(terms, " + ")
end

-- Reads the v elements of r at element offset base + i0 .. i0 + v - 1 along dim 0: returns the
-- statements and a function giving the C expression (r's raw type) of element j (0-based).
local function read(K, r, var, base, i0, v, tag)
    if can_vec(r, v) then
        local vt = vtype(K, r.type, v)
        local name = "v" .. tag
        local line = string.format("const %s %s = *(const %s *)(%s + %s + %s);", vt, name, vt, var, base, i0)
        return { line }, function(j) return string.format("%s.v[%d]", name, j) end
    end
    return {}, function(j)
        local e = j == 0 and i0 or string.format("(%s + %du)", i0, j)
        if r.ne[1] == 1 then e = "0" end
        if r.st[1] ~= 1 and e ~= "0" then e = e .. " * " .. r.st[1] .. "ll" end
        return string.format("%s[%s + %s]", var, base, e)
    end
end

-- ---- the skeleton -----------------------------------------------------------------------------

-- Row coordinates of dst: K.coord(d) (d = 1..3) marks coordinate i<d> used and returns its name,
-- or nil when dst's dim d is 1 (the coordinate is always 0).
local function coordinates(K, dne, ix)
    K.coord = function(d)
        if dne[d + 1] == 1 then return nil end
        K.used[d] = true
        return "i" .. d
    end
    K.coord_lines = function()
        local lines = {}
        local below = 1
        local last = 1
        for d = 2, 4 do if dne[d] > 1 then last = d end end
        for d = 1, 3 do
            if K.used[d] then
                local e = "row"
                if below > 1 then e = e .. " / " .. below .. K.suffix end
                if d + 1 < last then e = e .. " % " .. dne[d + 1] .. K.suffix end
                lines[#lines + 1] = string.format("const %s i%d = %s;", ix, d, e)
            end
            below = below * dne[d + 1]
        end
        return lines
    end
end

-- The chunk loop of one row: fill(i0, o, u) returns the statements setting o.v[0 .. V-1]
-- (dst's raw type) for the chunk at position i0 (an unsigned expression).
local function chunk_loop(K, fill)
    local V, TPR, U, NE0 = K.V, K.TPR, K.U, K.NE0
    local step = TPR * V * U
    local lines = {}
    local function add(s) lines[#lines + 1] = s end
    add(string.format("for (unsigned c = threadIdx.x * %du; c < %du; c += %du) {", V, NE0, step))
    local ot = vtype(K, K.dst.type, V)
    local exact = NE0 % step == 0
    local guards = {}
    for u = 0, U - 1 do
        local i0 = u == 0 and "c" or ("i0_" .. u)
        if u > 0 then add(string.format("    const unsigned %s = c + %du;", i0, u * TPR * V)) end
        guards[u] = (u > 0 and not exact) and string.format("%s < %du", i0, NE0) or nil
        add(string.format("    %s o%d;", ot, u))
        local body = fill(i0, "o" .. u, u)
        if guards[u] then
            add(string.format("    if (%s) {", guards[u]))
            for _, s in ipairs(body) do add("        " .. s) end
            add("    }")
        else
            for _, s in ipairs(body) do add("    " .. s) end
        end
    end
    for u = 0, U - 1 do
        local i0 = u == 0 and "c" or ("i0_" .. u)
        local st = string.format("*(%s *)(out + obase + %s) = o%d;", ot, i0, u)
        if guards[u] then add(string.format("    if (%s)", guards[u])) end
        add((guards[u] and "        " or "    ") .. st)
    end
    add("}")
    return lines
end

-- The source of a rows kernel (kit.kernel with this family's head; the body runs in a loop over
-- rows, thread row threadIdx.y of each block of RPB rows).
local function kernel(t)
    t.head = {
        "kiln rows kernel " .. t.name .. ": " .. t.what,
        "dst " .. t.dst.type .. " " .. dims(t.dst.ne) .. ": " .. t.R .. " rows of " .. t.NE0 .. ", " .. t.launch,
    }
    local ix, rpb, sfx = t.ix, t.RPB .. t.suffix, t.suffix
    local body = { "", string.format("    for (%s row = (%s)blockIdx.x * %s + threadIdx.y; row < %s; row += (%s)gridDim.x * %s) {",
        ix, ix, rpb, t.R .. sfx, ix, rpb) }
    for _, s in ipairs(t.body) do body[#body + 1] = s end
    body[#body + 1] = "    }"
    t.blocks, t.threads, t.body = t.types, t.BLOCK, body
    return kit.kernel(t)
end

-- Chooses V (elements per chunk), TPR, RPB, U for rows of ne0 elements; `divides` lists extents
-- V must divide (chunk boundaries that must not straddle a source), min_size the narrowest type.
local function plan(K, ne0, min_size, divides, tpr_fixed)
    local V = VEC_BYTES // min_size
    local function ok(v)
        if ne0 % v ~= 0 then return false end
        for _, x in ipairs(divides) do if x % v ~= 0 then return false end end
        return true
    end
    while V > 1 and not ok(V) do V = V // 2 end
    local nvec = ne0 // V
    local TPR = tpr_fixed or math.min(BLOCK, next_pow2(nvec))
    K.V, K.TPR, K.RPB, K.NE0 = V, TPR, BLOCK // TPR, ne0
    K.U = math.max(1, math.min(UNROLL, (nvec + TPR - 1) // TPR))
end

-- Renders the kernel: body = statements of one row (inside the row loop, unindented).
local function finish(K, name, what, body)
    local k, R = K.k, K.R
    -- Symbolic dims: rows whose coordinate lies past a run-time extent are skipped (the grid,
    -- the row loop and the decomposition of a row into coordinates are those of the maxima).
    local skips = {}
    for d = 1, 3 do
        local e = K.rowdyn[d]
        if e and K.coord(d) then skips[#skips + 1] = string.format("i%d >= (%s)(%s)", d, K.ix, e) end
    end
    if #skips > 0 then
        local b = { string.format("if (%s)", table.concat(skips, " || ")), "    continue; /* past a run-time extent */" }
        for _, s in ipairs(body) do b[#b + 1] = s end
        body = b
    end
    local nblocks = (R + K.RPB - 1) // K.RPB
    local grid = math.min(nblocks, MAX_GRID_X)
    local launch = string.format("%d block%s of %dx%d (%d thread%s per row, %d element%s per chunk, %d chunk%s per trip)%s",
        grid, grid == 1 and "" or "s", K.TPR, K.RPB, K.TPR, K.TPR == 1 and "" or "s", K.V, K.V == 1 and "" or "s",
        K.U, K.U == 1 and "" or "s", grid < nblocks and ", grid-stride" or "")
    local lines = {}
    for _, s in ipairs(K.coord_lines()) do lines[#lines + 1] = "        " .. s end
    for _, s in ipairs(body) do lines[#lines + 1] = s == "" and "" or ("        " .. s) end
    local pre = K.pre.code():gsub("\n$", "")
    local params = K.params
    if K.dynamic then
        params = params .. (k.dims_arg or ", const int *__restrict__ kdims")
        local sym = {}
        for d = 1, 3 do if K.rowdyn[d] then sym[#sym + 1] = string.format("dim %d %s", d, K.rowdyn[d]) end end
        for _, n in ipairs(K.dynnotes) do sym[#sym + 1] = n end
        K.notes[#K.notes + 1] = "symbolic (read at run time): " .. table.concat(sym, ", ")
    end
    local source = kernel {
        name = name, what = what, dst = k.dst, dims = dims, R = R, NE0 = K.NE0, launch = launch,
        notes = K.notes, pre = pre, types = K.types, BLOCK = BLOCK, params = params, ptrs = K.ptrs,
        ix = K.ix, suffix = K.suffix, RPB = K.RPB, body = lines,
    }
    return { name = name, source = source, grid = { grid, 1, 1 }, block = { K.TPR, K.RPB, 1 }, smem = 0,
        dynamic = K.dynamic or nil }
end

-- Marks the kernel dynamic when any of refs has a symbolic dim.
local function note_dyn(K, refs)
    for _, r in ipairs(refs) do
        for d = 1, 4 do if dyn(r, d) then K.dynamic = true end end
    end
end

-- Sets up rows, coordinates and the dst pointer. rows: the tensor whose rows the kernel walks
-- (dst, or b for set_rows in place).
local function start(k, rows)
    local K = new_kernel(k)
    local d = k.dst
    check_ref(d, "dst")
    if not rows then
        for dd = 1, 4 do
            local nat = 1
            for e = 1, dd - 1 do nat = nat * d.ne[e] end
            if d.ne[dd] > 1 and d.st[dd] ~= nat then fail("dst is not contiguous") end
        end
    end
    rows = rows or d
    dyn_only(d, "dst", { [2] = true, [3] = true, [4] = true })
    -- run-time extents of the row coordinates i1..i3 (rows' dims 1..3)
    K.rowdyn, K.dynnotes = {}, {}
    for dd = 2, 4 do K.rowdyn[dd - 1] = dyn(rows, dd) end
    note_dyn(K, { d })
    K.dst = d
    K.R = rows.ne[2] * rows.ne[3] * rows.ne[4]
    if d.ne[1] > INT_MAX - 65536 then fail("rows of %d elements are too long", d.ne[1]) end
    local wide = K.R + BLOCK > INT_MAX
    K.ix = wide and "long long" or "unsigned"
    K.suffix = wide and "ll" or "u"
    pointer(K, d, "out", false)
    coordinates(K, rows.ne, K.ix)
    return K
end

local function input(K, name, nodecl)
    local r = K.k.args[name]
    check_ref(r, name)
    if not nodecl then pointer(K, r, name, true) end
    note_dyn(K, { r })
    return r
end

-- ---- the ops ------------------------------------------------------------------------------------

local OPS = {}

function OPS.get_rows(k)
    if k.args and k.args.a and quant.is(k.args.a.type) then return quant.get_rows(k, fail) end
    local K = start(k)
    local a, ids = input(K, "a"), input(K, "ids")
    if not prelude.ctype[a.type] or ids.type ~= "i32" then fail("get_rows: types %s, %s", a.type, ids.type) end
    local ne0 = k.dst.ne[1]
    -- V by dst (f32): 16-byte stores per thread, so each warp store covers whole sectors (a
    -- bf16 table is then read 8 bytes per thread, still whole sectors per warp). 32-byte
    -- stores per thread (V = 8 for a 2-byte table) measured 2077 GB/s against 2668 for f32.
    plan(K, ne0, SIZE[k.dst.type], {})
    local i1, i2, i3 = K.coord(1), K.coord(2), K.coord(3)
    local pre = K.pre
    -- Symbolic dims: ids' dims 0..2 are dst's rows (skipped past their run-time extents); a's
    -- rows are checked against their run-time count; a's dims 2, 3 follow dst's.
    dyn_only(ids, "get_rows: ids", { [1] = true, [2] = true, [3] = true })
    dyn_only(a, "get_rows: a", { [2] = true, [3] = true, [4] = true })
    for d = 1, 3 do K.rowdyn[d] = K.rowdyn[d] or dyn(ids, d) end
    for d = 3, 4 do
        if dyn(a, d) and not K.rowdyn[d - 1] then fail("get_rows: a's symbolic dim %d is static in dst", d - 1) end
    end
    local nrows = string.format("%du", a.ne[2])
    if dyn(a, 2) then
        nrows = string.format("(unsigned)(%s)", dyn(a, 2))
        K.dynnotes[#K.dynnotes + 1] = "a rows " .. dyn(a, 2)
    end
    local body = {
        string.format("const int r = ids[%s];", offset(ids, { i1, i2, i3 })),
        string.format("const bool ok = (unsigned)r < %s; /* out of range: a row of zeros */", nrows),
        string.format("const long long abase = %s;", offset(a, { nil, "(ok ? r : 0)", i2, i3 })),
        string.format("const long long obase = %s;", mul64("row", ne0)),
    }
    for _, s in ipairs(chunk_loop(K, function(i0, o, u)
        local lines, elem = read(K, a, "a", "abase", i0, K.V, u)
        for j = 0, K.V - 1 do
            lines[#lines + 1] = string.format("%s.v[%d] = ok ? %s : 0.0f;", o, j, pre.load(a.type, elem(j)))
        end
        return lines
    end)) do body[#body + 1] = s end
    local name = string.format("get_rows_%s_%d", a.type, ne0)
    return finish(K, name, "dst[:, i1, i2, i3] = f32(a[:, ids[i1, i2, i3], i2, i3])", body)
end

-- set_rows in place (k.in_place: dst is a, same buffer and layout): one warp per row j of b
-- writes it, converted to dst's type, into dst row ids[j, i2 % ids.ne1, i3 % ids.ne2], unless a
-- later row j' names the same row (the last one wins, as ggml's sequential loop leaves it) or
-- the id is out of range (the reference rejects it). Nothing else of dst is touched.
local function set_rows_in_place(k)
    local d, b = k.dst, k.args.b
    check_ref(b, "b")
    local a = k.args.a
    check_ref(a, "a")
    if a.param ~= d.param or a.offs ~= d.offs then
        fail("set_rows in place: a (p%s offs %d) is not dst (p%s offs %d)", tostring(a.param), a.offs,
            tostring(d.param), d.offs)
    end
    for dd = 1, 4 do
        if a.ne[dd] ~= d.ne[dd] or (a.ne[dd] > 1 and a.st[dd] ~= d.st[dd]) then
            fail("set_rows in place: a %s st %s is not dst's layout", dims(a.ne), dims(a.st))
        end
    end
    if d.ne[1] > 1 and d.st[1] ~= 1 then fail("set_rows in place: dst rows are not contiguous") end
    local K = start(k, b)
    note_dyn(K, { a })
    b = input(K, "b")
    local ids = input(K, "ids")
    if a.type ~= d.type or b.type ~= "f32" or (ids.type ~= "i32" and ids.type ~= "i64") then
        fail("set_rows: types %s, %s, %s", a.type, b.type, ids.type)
    end
    dyn_only(d, "set_rows: dst", { [2] = true })
    dyn_only(a, "set_rows: a", { [2] = true })
    dyn_only(b, "set_rows: b", { [2] = true })
    dyn_only(ids, "set_rows: ids", { [1] = true })
    local n = b.ne[2]
    if n > INT_MAX or d.ne[2] > INT_MAX then fail("set_rows: %d source rows, %d rows", n, d.ne[2]) end
    local ne0 = d.ne[1]
    -- chunks stored as aligned vectors of dst's type: V divides the offset and the row strides
    local divides = { d.offs }
    for dd = 2, 4 do if d.ne[dd] > 1 then divides[#divides + 1] = d.st[dd] end end
    plan(K, ne0, SIZE[d.type], divides, 32)
    local j, i2, i3 = K.coord(1), K.coord(2), K.coord(3)
    j = j or "0u"
    local pre = K.pre
    local function bcast(c, ext, full)
        if not c or ext == 1 then return nil end
        if ext == full then return c end
        return string.format("(%s %% %d%s)", c, ext, K.suffix)
    end
    local ibase = offset(ids, { nil, bcast(i2, ids.ne[2], b.ne[3]), bcast(i3, ids.ne[3], b.ne[4]) })
    local function ist(v) return ids.st[1] == 1 and v or (v .. " * " .. ids.st[1] .. "ll") end
    local it = ids.type == "i64" and "long long" or "int"
    local nsrc = dyn(b, 2) or dyn(ids, 1)
    local nexpr = nsrc and string.format("(unsigned)(%s)", nsrc) or string.format("%du", n)
    K.rowdyn[1] = nsrc
    local nrow = dyn(d, 2) or dyn(a, 2)
    if nrow then K.dynnotes[#K.dynnotes + 1] = "dst rows " .. nrow end
    local body = {
        string.format("const long long ibase = %s;", ibase),
        string.format("const %s id = ids[ibase + %s];", it, ist("(long long)" .. j)),
        nrow and string.format("if (id < 0 || id >= (%s)(%s))", it, nrow) or
            string.format("if (id < 0 || id >= (%s)%d)", it, d.ne[2]),
        "    continue; /* the reference rejects such an id */",
    }
    if n > 1 then
        body[#body + 1] = "/* a later source row naming the same row wins */"
        body[#body + 1] = "bool later = false;"
        body[#body + 1] = string.format("for (unsigned jj = (unsigned)%s + 1u + threadIdx.x; jj < %s; jj += 32u)", j, nexpr)
        body[#body + 1] = string.format("    later |= ids[ibase + %s] == id;", ist("(long long)jj"))
        body[#body + 1] = "if (__any_sync(0xffffffffu, later))"
        body[#body + 1] = "    continue;"
    end
    body[#body + 1] = string.format("const long long obase = %s;", offset(d, { nil, "id", i2, i3 }))
    body[#body + 1] = string.format("const long long bbase = %s;", offset(b, { nil, j ~= "0u" and j or nil, i2, i3 }))
    for _, s in ipairs(chunk_loop(K, function(i0, o, u)
        local lines, elem = read(K, b, "b", "bbase", i0, K.V, "b" .. u)
        for jx = 0, K.V - 1 do
            lines[#lines + 1] = string.format("%s.v[%d] = %s;", o, jx, pre.store(d.type, elem(jx)))
        end
        return lines
    end)) do body[#body + 1] = s end
    local name = string.format("set_rows_inplace_%s_%s_%d", d.type, ids.type, ne0)
    return finish(K, name, "in place: dst rows ids[j, i2 % ids.ne1, i3 % ids.ne2] = b[:, j, i2, i3] (last j wins)", body)
end

function OPS.set_rows(k)
    if k.in_place then return set_rows_in_place(k) end
    local K = start(k)
    local a, b, ids = input(K, "a"), input(K, "b"), input(K, "ids")
    local d = k.dst
    if a.type ~= d.type or b.type ~= "f32" or (ids.type ~= "i32" and ids.type ~= "i64") then
        fail("set_rows: types %s, %s, %s", a.type, b.type, ids.type)
    end
    local n = b.ne[2]
    if n > INT_MAX then fail("set_rows: %d source rows", n) end
    -- Symbolic dims: dst's (a's) rows and b's (ids') rows.
    dyn_only(d, "set_rows: dst", { [2] = true })
    dyn_only(a, "set_rows: a", { [2] = true })
    dyn_only(b, "set_rows: b", { [2] = true })
    dyn_only(ids, "set_rows: ids", { [1] = true })
    K.rowdyn[1] = K.rowdyn[1] or dyn(a, 2)
    local nsrc = dyn(b, 2) or dyn(ids, 1)
    if nsrc then K.dynnotes[#K.dynnotes + 1] = "b rows " .. nsrc end
    local ne0 = d.ne[1]
    plan(K, ne0, SIZE[d.type], {}, 32)
    local i1, i2, i3 = K.coord(1), K.coord(2), K.coord(3)
    local pre = K.pre
    -- ggml's broadcast of ids over b's dims 2 and 3.
    local function bcast(c, ext, full)
        if not c or ext == 1 then return nil end
        if ext == full then return c end
        return string.format("(%s %% %d%s)", c, ext, K.suffix)
    end
    local ibase = offset(ids, { nil, bcast(i2, ids.ne[2], d.ne[3]), bcast(i3, ids.ne[3], d.ne[4]) })
    local ist = ids.st[1] == 1 and "j" or ("j * " .. ids.st[1] .. "ll")
    local it = ids.type == "i64" and "long long" or "int"
    local body = {
        "/* The last source row j naming this row, as ggml's sequential loop leaves it. */",
        "int best = -1;",
        string.format("const long long ibase = %s;", ibase),
        nsrc and string.format("for (unsigned j = threadIdx.x; j < (unsigned)(%s); j += 32u)", nsrc) or
            string.format("for (unsigned j = threadIdx.x; j < %du; j += 32u)", n),
        string.format("    if (ids[ibase + %s] == (%s)%s)", ist, it, i1 or "0"),
        "        best = (int)j;",
        "for (int s = 16; s > 0; s >>= 1)",
        "    best = max(best, __shfl_xor_sync(0xffffffffu, best, s));",
        string.format("const long long obase = %s;", mul64("row", ne0)),
        "if (best >= 0) {",
        string.format("    const long long bbase = %s;", offset(b, { nil, "best", i2, i3 })),
    }
    local function indent(lines) for _, s in ipairs(lines) do body[#body + 1] = "    " .. s end end
    indent(chunk_loop(K, function(i0, o, u)
        local lines, elem = read(K, b, "b", "bbase", i0, K.V, "b" .. u)
        for j = 0, K.V - 1 do
            lines[#lines + 1] = string.format("%s.v[%d] = %s;", o, j, pre.store(d.type, elem(j)))
        end
        return lines
    end))
    body[#body + 1] = "} else {"
    body[#body + 1] = string.format("    const long long abase = %s;", offset(a, { nil, i1, i2, i3 }))
    indent(chunk_loop(K, function(i0, o, u)
        local lines, elem = read(K, a, "a", "abase", i0, K.V, "a" .. u)
        for j = 0, K.V - 1 do lines[#lines + 1] = string.format("%s.v[%d] = %s;", o, j, elem(j)) end
        return lines
    end))
    body[#body + 1] = "}"
    local name = string.format("set_rows_%s_%s_%d", d.type, ids.type, ne0)
    return finish(K, name, "dst = a with rows ids[j, i2 % ids.ne1, i3 % ids.ne2] = b[:, j, i2, i3] (last j wins)", body)
end

function OPS.concat(k)
    local K = start(k)
    local a, b = input(K, "a"), input(K, "b")
    local d = k.dst
    local dim = k.params.dim
    if math.type(dim) ~= "integer" or dim < 0 or dim > 3 then fail("concat: dim %s", tostring(dim)) end
    if a.type ~= d.type or b.type ~= d.type then fail("concat: types %s, %s", a.type, b.type) end
    -- Symbolic dims: any but dim 0 and the joined dim, shared by a, b and dst (rows skipped).
    local allowed = { [2] = true, [3] = true, [4] = true }
    allowed[dim + 1] = nil
    dyn_only(d, "concat: dst", allowed)
    dyn_only(a, "concat: a", allowed)
    dyn_only(b, "concat: b", allowed)
    for dd = 2, 4 do K.rowdyn[dd - 1] = K.rowdyn[dd - 1] or dyn(a, dd) or dyn(b, dd) end
    local ne0 = d.ne[1]
    local a_ext = a.ne[dim + 1]
    plan(K, ne0, SIZE[d.type], dim == 0 and { a_ext } or {})
    local c = { nil, K.coord(1), K.coord(2), K.coord(3) }
    local function copy(r, var, base, tag)
        return function(i0, o, u)
            local lines, elem = read(K, r, var, base, i0, K.V, tag .. u)
            for j = 0, K.V - 1 do lines[#lines + 1] = string.format("%s.v[%d] = %s;", o, j, elem(j)) end
            return lines
        end
    end
    local body = { string.format("const long long obase = %s;", mul64("row", ne0)) }
    local function indent(lines, ind) for _, s in ipairs(lines) do body[#body + 1] = ind .. s end end
    if dim == 0 then
        body[#body + 1] = string.format("const long long abase = %s;", offset(a, c))
        body[#body + 1] = string.format("const long long bbase = %s;", offset(b, c))
        local fa, fb = copy(a, "a", "abase", "a"), copy(b, "b", "bbase", "b")
        indent(chunk_loop(K, function(i0, o, u)
            local lines = { string.format("if (%s < %du) {", i0, a_ext) }
            for _, s in ipairs(fa(i0, o, u)) do lines[#lines + 1] = "    " .. s end
            lines[#lines + 1] = "} else {"
            local j0 = "j0_" .. u
            lines[#lines + 1] = string.format("    const unsigned %s = %s - %du;", j0, i0, a_ext)
            for _, s in ipairs(fb(j0, o, u)) do lines[#lines + 1] = "    " .. s end
            lines[#lines + 1] = "}"
            return lines
        end), "")
    else
        local cd = c[dim + 1]
        local cb = { c[1], c[2], c[3], c[4] }
        cb[dim + 1] = string.format("(%s - %d%s)", cd, a_ext, K.suffix)
        body[#body + 1] = string.format("if (%s < %d%s) {", cd, a_ext, K.suffix)
        body[#body + 1] = string.format("    const long long abase = %s;", offset(a, c))
        indent(chunk_loop(K, copy(a, "a", "abase", "a")), "    ")
        body[#body + 1] = "} else {"
        body[#body + 1] = string.format("    const long long bbase = %s;", offset(b, cb))
        indent(chunk_loop(K, copy(b, "b", "bbase", "b")), "    ")
        body[#body + 1] = "}"
    end
    local name = string.format("concat_%s_d%d_%d", d.type, dim, ne0)
    return finish(K, name, string.format("a and b joined along dim %d", dim), body)
end

function OPS.pad(k)
    local K = start(k)
    local a = input(K, "a")
    local d = k.dst
    if a.type ~= d.type then fail("pad: types %s, %s", a.type, d.type) end
    local p = k.params
    local lp = { p.lp0, p.lp1, p.lp2, p.lp3 }
    for dd = 1, 4 do
        if math.type(lp[dd]) ~= "integer" or lp[dd] < 0 or lp[dd] + a.ne[dd] > d.ne[dd] then
            fail("pad: bad padding of dim %d", dd - 1)
        end
    end
    -- Symbolic dims 1..3: a's run-time extent bounds the box; dst's rows past theirs are skipped.
    dyn_only(a, "pad: a", { [2] = true, [3] = true, [4] = true })
    for dd = 2, 4 do
        if dyn(a, dd) and not dyn(d, dd) then fail("pad: a's symbolic dim %d is static in dst", dd - 1) end
    end
    local ne0 = d.ne[1]
    plan(K, ne0, SIZE[d.type], { lp[1], a.ne[1] })
    -- Source coordinates of the row, and the test that the row lies inside the source's box.
    local c, inside = {}, {}
    for dd = 2, 4 do
        local x = K.coord(dd - 1)
        if x and lp[dd] > 0 then
            c[dd] = string.format("(%s - %d%s)", x, lp[dd], K.suffix)
        else
            c[dd] = x
        end
        if dyn(a, dd) and x then
            local cast = K.ix == "unsigned" and "" or "(unsigned long long)"
            inside[#inside + 1] = string.format("%s%s < (%s)(%s)", cast, c[dd],
                K.ix == "unsigned" and "unsigned" or "unsigned long long", dyn(a, dd))
        elseif a.ne[dd] < d.ne[dd] then
            local cast = K.ix == "unsigned" and "" or "(unsigned long long)"
            inside[#inside + 1] = string.format("%s%s < %d%s", cast, c[dd], a.ne[dd], K.ix == "unsigned" and "u" or "ull")
        end
    end
    local body = { string.format("const long long obase = %s;", mul64("row", ne0)) }
    local rowcond = nil
    if #inside > 0 then
        body[#body + 1] = string.format("const bool inside = %s;", table.concat(inside, " && "))
        rowcond = "inside"
    end
    body[#body + 1] = string.format("const long long abase = %s;", offset(a, c))
    for _, s in ipairs(chunk_loop(K, function(i0, o, u)
        local cond = {}
        if rowcond then cond[#cond + 1] = rowcond end
        local j0 = i0
        if a.ne[1] < ne0 then
            if lp[1] > 0 then j0 = string.format("(%s - %du)", i0, lp[1]) end
            cond[#cond + 1] = string.format("%s < %du", j0, a.ne[1])
        end
        local lines, elem = read(K, a, "a", "abase", j0, K.V, u)
        for j = 0, K.V - 1 do lines[#lines + 1] = string.format("%s.v[%d] = %s;", o, j, elem(j)) end
        if #cond == 0 then return lines end
        local out = { string.format("if (%s) {", table.concat(cond, " && ")) }
        for _, s in ipairs(lines) do out[#out + 1] = "    " .. s end
        out[#out + 1] = "} else {"
        for j = 0, K.V - 1 do out[#out + 1] = string.format("    %s.v[%d] = %s;", o, j, ZERO[d.type]) end
        out[#out + 1] = "}"
        return out
    end)) do body[#body + 1] = s end
    local name = string.format("pad_%s_%d", d.type, ne0)
    return finish(K, name, "a surrounded by zeros", body)
end

function OPS.add_id(k)
    local K = start(k)
    local a, b, ids = input(K, "a"), input(K, "b"), input(K, "ids")
    if a.type ~= "f32" or b.type ~= "f32" or ids.type ~= "i32" then
        fail("add_id: types %s, %s, %s", a.type, b.type, ids.type)
    end
    local ne0 = k.dst.ne[1]
    plan(K, ne0, 4, {})
    local i1, i2, i3 = K.coord(1), K.coord(2), K.coord(3)
    -- Symbolic dims: a's (dst's) dims 1..3 and ids' (rows skipped), b's rows (the bias table).
    dyn_only(a, "add_id: a", { [2] = true, [3] = true, [4] = true })
    dyn_only(ids, "add_id: ids", { [1] = true, [2] = true })
    dyn_only(b, "add_id: b", { [2] = true })
    for dd = 2, 4 do K.rowdyn[dd - 1] = K.rowdyn[dd - 1] or dyn(a, dd) end
    for dd = 1, 2 do K.rowdyn[dd] = K.rowdyn[dd] or dyn(ids, dd) end
    local nb = string.format("%du", b.ne[2])
    if dyn(b, 2) then
        nb = string.format("(unsigned)(%s)", dyn(b, 2))
        K.dynnotes[#K.dynnotes + 1] = "b rows " .. dyn(b, 2)
    end
    local body = {
        string.format("const int e = ids[%s];", offset(ids, { i1, i2 })),
        string.format("const bool ok = (unsigned)e < %s; /* out of range: no bias */", nb),
        string.format("const long long abase = %s;", offset(a, { nil, i1, i2, i3 })),
        string.format("const long long bbase = %s;", offset(b, { nil, "(ok ? e : 0)" })),
        string.format("const long long obase = %s;", mul64("row", ne0)),
    }
    for _, s in ipairs(chunk_loop(K, function(i0, o, u)
        local la, ea = read(K, a, "a", "abase", i0, K.V, "a" .. u)
        local lb, eb = read(K, b, "b", "bbase", i0, K.V, "b" .. u)
        for _, s in ipairs(lb) do la[#la + 1] = s end
        for j = 0, K.V - 1 do
            la[#la + 1] = string.format("%s.v[%d] = %s + (ok ? %s : 0.0f);", o, j, ea(j), eb(j))
        end
        return la
    end)) do body[#body + 1] = s end
    local name = string.format("add_id_f32_%d", ne0)
    return finish(K, name, "dst[:, i1, i2, i3] = a[:, i1, i2, i3] + b[:, ids[i1, i2]]", body)
end

return function(k)
    if k.kind ~= "op" then fail("node kind %s is not op", tostring(k.kind)) end
    local f = OPS[k.op]
    if not f then fail("no kernel for op %s", tostring(k.op)) end
    return f(k)
end
