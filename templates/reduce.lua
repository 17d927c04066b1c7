-- reduce: the kernel template of the reduce family (sum, sum_rows, mean, argmax, cumsum); the
-- table k of IR_OP nodes is described in docs/templates.md, the kernels in docs/ops-reduce.md.
--
-- Every shape, stride and offset is baked in. Rows run along dim 0 of the operand a; the other
-- three dims of a are flattened into a row index (dim 1 fastest).
--
-- * sum_rows, mean, argmax: a group of G threads per row. G = 32 (a warp; 256-thread blocks of
--   8 rows) for rows of up to 128 loads; longer rows get one block per row, G = 64 .. 1024, so
--   that each thread issues about 4 loads. Loads are 16-byte vectors when a's rows are
--   contiguous and every row starts 16-byte aligned (checked here on the static offsets and
--   strides; buffers are 256-byte aligned), with a scalar tail; otherwise element by element
--   through st0. Each thread accumulates in f32 in index order; warps combine with xor
--   shuffles, the warps of a block through shared memory, in a fixed order (deterministic).
-- * cumsum (f32 only): a group per row as above, sized so one chunk of 4*G elements covers the
--   row (G at most 1024); longer rows loop over chunks with a running carry. Each thread scans
--   its 4 consecutive elements, warps scan the thread totals with shuffles, blocks add the
--   warp totals through shared memory.
-- * sum: a single block of 1024 threads loops over every element and reduces as above: one
--   kernel, no scratch buffer, deterministic, but it runs on one SM (docs/ops-reduce.md). When
--   a's elements fill a contiguous range (any permutation of a contiguous tensor) the range is
--   read as vectors; otherwise dims are walked in order of increasing stride.

local kit = require("kit")
local tpl = require("tpl")
local prelude = require("prelude")

local INT_MAX = 2147483647
local MAX_GRID_X = 2147483647
local VEC_BYTES = 16   -- bytes of one vector load
local WARP_BLOCK = 256 -- threads of a block of warp-per-row groups
local SUM_BLOCK = 1024 -- threads of the single block of sum
local LOADS = 4        -- loads per thread a row group aims at
local CUM_K = 4        -- consecutive elements one cumsum thread scans per chunk

local SIZE = { f32 = 4, f16 = 2, bf16 = 2 }
local FULL = "0xffffffffu"

local fail = kit.failer("reduce")

local dims = kit.dims

local check_ref = kit.ref_checker(fail)

-- dst must be its buffer's contiguous layout: kernels index it linearly.
local function check_natural(dst)
    local s = 1
    for d = 1, 4 do
        if dst.ne[d] > 1 and dst.st[d] ~= s then fail("dst is not contiguous: st %s", dims(dst.st)) end
        s = s * dst.ne[d]
    end
end

-- Largest element offset r reaches, and whether an offset or stride is negative.
local reach = kit.reach

local function nelem(r) return r.ne[1] * r.ne[2] * r.ne[3] * r.ne[4] end

-- Name and definition of the struct of v elements of type t used for vector loads.
local function vec_type(t, v)
    local name = string.format("kiln_%sx%d", t == "f32" and "f32" or "u16", v)
    return name, string.format("struct alignas(%d) %s {\n    %s v[%d];\n};", v * SIZE[t], name,
        prelude.ctype[t], v)
end

-- The common frame: parameters, typed pointers, index type.
local function frame(k, a, dst_ctype, dy)
    local nparams = k.nparams
    local plist = {}
    for p = 0, nparams - 1 do
        plist[#plist + 1] = (p == 0 and "char" or "const char") .. " *__restrict__ p" .. p
    end
    local dims_arg = k.dims_arg or ""
    if dy and dims_arg == "" then dims_arg = ", const int* __restrict__ kdims" end
    if dims_arg ~= "" then plist[#plist + 1] = (dims_arg:gsub("^,%s*", "")) end
    local m, neg = reach(a)
    local wide = neg or m > INT_MAX or nelem(a) > INT_MAX
    local ix = wide and "long long" or "unsigned"
    local function I(v) return tostring(v) .. (wide and "ll" or "u") end
    local function ptr(r, var, ct, const)
        kit.check_param(fail, r, var, nparams)
        return kit.pointer(r, var, ct, const)
    end
    local ptrs = { ptr(k.dst, "out", dst_ctype, false), ptr(a, "in", prelude.ctype[a.type], true) }
    return { params = table.concat(plist, ", "), ptrs = ptrs, ix = ix, I = I, wide = wide, bits = wide and 64 or 32 }
end

-- The source of a reduce kernel (kit.kernel with this family's head).
local function kernel(t)
    local a, dst = t.a, t.dst
    t.head = {
        "kiln reduce kernel " .. t.name .. ": " .. t.what,
        "a " .. a.type .. " ne " .. dims(a.ne) .. " st " .. dims(a.st) .. " offs " .. a.offs .. "; out "
            .. dst.type .. " ne " .. dims(dst.ne),
        t.launch .. ", " .. t.bits .. "-bit indexing",
    }
    t.blocks = t.types
    return kit.kernel(t)
end

-- Indents every line of t by n spaces (preprocessor lines stay at column 0).
local function indent(t, n)
    local pad = string.rep(" ", n)
    local out = {}
    for i, s in ipairs(t) do
        out[i] = (s == "" or s:sub(1, 1) == "#") and s or pad .. s
    end
    return out
end

local function append(t, u)
    for _, s in ipairs(u) do t[#t + 1] = s end
end

-- The element offset of the row `row` of a (row index over dims 1..3, dim 1 fastest), as an
-- expression of the variable `row`, without a.offs.
local function row_offset(a, I)
    local terms, stride = {}, 1
    local last = 1
    for d = 2, 4 do if a.ne[d] > 1 then last = d end end
    for d = 2, 4 do
        if a.ne[d] > 1 then
            local c = "row"
            if stride > 1 then c = c .. " / " .. I(stride) end
            if d < last then c = "(" .. c .. " % " .. I(a.ne[d]) .. ")" end
            if a.st[d] ~= 1 then c = c .. " * " .. I(a.st[d]) end
            terms[#terms + 1] = c
        end
        stride = stride * a.ne[d]
    end
    if #terms == 0 then return "0" end
    return table.concat(terms, " + ")
end

-- ---- symbolic dims ----------------------------------------------------------------------------
--
-- ref.dyn[d] (nil when static) is the C int expression of dim d-1's run-time extent (ne[d] is the
-- maximum; strides stay those of the layout at the maximum). Row kernels launch for the maximum
-- rows; `nrows` (the run-time row count) bounds the row index, which is decomposed with the
-- run-time extents (r1..r3) and addresses a and dst through their static strides. A dynamic row
-- length (dim 0) is read element by element up to `dn0` (mean divides by it). sum walks the
-- run-time index space.

-- { ext = { [d] = "dn<d-1>" }, decl = { lines }, rows_static = product of static row dims } or nil.
local function dyn_plan(k, a)
    local exprs, any = {}, false
    for d = 1, 4 do
        local e = a.dyn and a.dyn[d]
        if e ~= nil and a.ne[d] > 1 then
            if type(e) ~= "string" then fail("%s: a: bad dyn[%d]", k.op, d - 1) end
            exprs[d], any = e, true
        end
    end
    local dst = k.dst
    -- argmax: a is a matrix and dst is [a's ne1] (its rows, one dim): out[row] is right.
    for d = 1, k.op == "argmax" and 0 or 4 do
        local e = dst.dyn and dst.dyn[d]
        if e ~= nil and dst.ne[d] > 1 and e ~= exprs[d] then
            fail("%s: dst: dim %d is dynamic (%s) where a's is %s", k.op, d - 1, tostring(e), exprs[d] or "static")
        end
        -- A reduced dim of dst (extent 1) is static; the others follow a.
        if exprs[d] and dst.ne[d] > 1 and e ~= exprs[d] then
            fail("%s: dst: dim %d is static where a's is dynamic (%s)", k.op, d - 1, exprs[d])
        end
    end
    if not any then return nil end
    local dy = { ext = {}, decl = {}, rows_static = 1, exprs = exprs }
    for d = 1, 4 do
        if exprs[d] then
            dy.ext[d] = "dn" .. (d - 1)
            dy.decl[#dy.decl + 1] = string.format("const unsigned %s = (unsigned)%s; /* run-time extent of dim %d */",
                dy.ext[d], exprs[d], d - 1)
        elseif d > 1 then
            dy.rows_static = dy.rows_static * a.ne[d]
        end
    end
    local f = {}
    if dy.rows_static > 1 then f[#f + 1] = dy.rows_static .. "u" end
    for d = 2, 4 do if dy.ext[d] then f[#f + 1] = dy.ext[d] end end
    dy.nrows = #f > 0 and table.concat(f, " * ") or "1u"
    return dy
end

-- Offset of r at the row coordinates coords (dims 2..4).
local function coords_offset(r, coords, I)
    local t = {}
    for d = 2, 4 do
        if coords[d] and r.st[d] ~= 0 then
            t[#t + 1] = r.st[d] == 1 and coords[d] or coords[d] .. " * " .. I(r.st[d])
        end
    end
    if #t == 0 then return I(0) end
    return table.concat(t, " + ")
end

-- Elements of a row of dynamic length n0 (a C expression), lane by lane, element by element.
local function visit_row_dyn(a, g, I, ix, pre, visit, n0)
    local at = a.st[1] == 1 and "x[j]" or string.format("x[j * %s]", I(a.st[1]))
    local lines = { string.format("for (%s j = lane; j < %s; j += %s) {", ix, n0, I(g)) }
    append(lines, indent(visit(pre.load(a.type, at), "j"), 4))
    lines[#lines + 1] = "}"
    return lines
end

-- A header note naming the dynamic dims.
local function dyn_note(a, dy)
    local l = {}
    for d = 1, 4 do
        if dy.ext[d] then l[#l + 1] = string.format("dim %d = %s (at most %d)", d - 1, dy.exprs[d], a.ne[d]) end
    end
    return "dynamic: " .. table.concat(l, ", ") .. "; the launch covers the maximum, rows past nrows return"
end

-- Elements per vector load of a's rows: 16 bytes when rows are contiguous and every row starts
-- on a vector boundary, smaller when only that divides, 1 when rows are strided.
local function row_vec(a)
    if a.ne[1] == 1 or a.st[1] ~= 1 then return 1 end
    local vec = VEC_BYTES // SIZE[a.type]
    while vec > 1 do
        local ok = a.offs % vec == 0 and a.ne[1] >= vec
        for d = 2, 4 do
            if a.ne[d] > 1 and a.st[d] % vec ~= 0 then ok = false end
        end
        if ok then return vec end
        vec = vec // 2
    end
    return 1
end

-- Threads per row: a warp up to 32*LOADS loads per row, then doubling to 1024.
local function group_size(units)
    local g = 32
    while g < 1024 and g * LOADS < units do g = g * 2 end
    return g
end

-- The row loop header of a group kernel: declares `row` (and `lane`). Returns opening lines,
-- closing lines and the launch. In warp mode, rows past the end return (a warp is one row); in
-- block mode the whole block takes the same row, so __syncthreads is safe.
local function row_loop(nrows, g, I, ix, dy)
    local open, close = {}, {}
    if dy then
        append(open, dy.decl)
        open[#open + 1] = string.format("const unsigned nrows = %s; /* run-time rows */", dy.nrows)
    end
    local rpb = g == 32 and math.min(WARP_BLOCK // 32, nrows) or 1
    local threads = g * rpb
    local nblocks = (nrows + rpb - 1) // rpb
    local loop = nblocks > MAX_GRID_X
    local grid = loop and 1048576 or nblocks
    if g == 32 and rpb > 1 then
        open[#open + 1] = "const unsigned lane = threadIdx.x % 32u;"
    else
        open[#open + 1] = "const unsigned lane = threadIdx.x;"
    end
    local first = rpb > 1 and string.format("blockIdx.x * %s + threadIdx.x / 32u", I(rpb)) or "blockIdx.x"
    if loop then
        open[#open + 1] = string.format("for (%s row = %s; row < %s; row += gridDim.x * %s) {", ix, first,
            dy and "nrows" or I(nrows), I(rpb))
        close[#close + 1] = "}"
    else
        open[#open + 1] = string.format("const %s row = %s;", ix, first)
        if dy then
            open[#open + 1] = "if (row >= nrows) /* rows past the run-time count */"
            open[#open + 1] = "    return;"
        elseif nblocks * rpb ~= nrows then
            open[#open + 1] = string.format("if (row >= %s)", I(nrows))
            open[#open + 1] = "    return;"
        end
    end
    local launch = string.format("%d block%s of %d threads, %s per row", grid, grid == 1 and "" or "s", threads,
        g == 32 and "a warp" or "a block")
    return open, close, loop, { grid, 1, 1 }, { threads, 1, 1 }, launch
end

-- Lines that visit the elements of one row x (a typed pointer) by the lanes of a group of g
-- threads, in increasing index order per lane: `visit(value, index_expr)` returns the lines
-- handling one element. vec > 1: vector loads of the row, then a scalar tail.
local function visit_row(a, vec, g, I, ix, pre, vtype, visit)
    local ne0, st0 = a.ne[1], a.st[1]
    local lines = {}
    local function add(s) lines[#lines + 1] = s end
    local function loop(count, each)
        -- Indices lane, lane + g, ... below count, as constant-trip iterations plus a guarded one.
        local full, rest = count // g, count % g
        if full > 0 then
            add(string.format("#pragma unroll %d", math.min(full, 8)))
            add(string.format("for (%s it = 0; it < %s; it++) {", ix, I(full)))
            add(string.format("    const %s j = it * %s + lane;", ix, I(g)))
            append(lines, indent(each, 4))
            add("}")
        end
        if rest > 0 then
            add(string.format("if (lane < %du) {", rest))
            add(string.format("    const %s j = %slane;", ix, full > 0 and I(full * g) .. " + " or ""))
            append(lines, indent(each, 4))
            add("}")
        end
    end
    if vec > 1 then
        local nvec = ne0 // vec
        local vt = vtype(a.type, vec)
        local each = { string.format("const %s v = ((const %s *)x)[j];", vt, vt) }
        if ne0 % vec > 0 then
            add(string.format("/* %d vectors of %d, then %d element%s */", nvec, vec, ne0 % vec, ne0 % vec == 1 and "" or "s"))
        end
        each[#each + 1] = "#pragma unroll"
        each[#each + 1] = string.format("for (unsigned k = 0; k < %du; k++) {", vec)
        append(each, indent(visit(pre.load(a.type, "v.v[k]"), string.format("j * %s + k", I(vec))), 4))
        each[#each + 1] = "}"
        loop(nvec, each)
        local tail = ne0 % vec
        if tail > 0 then
            local base = nvec * vec
            add(string.format("if (lane < %du) {", tail))
            add(string.format("    const %s j = %s + lane;", ix, I(base)))
            append(lines, indent(visit(pre.load(a.type, "x[j]"), "j"), 4))
            add("}")
        end
    else
        local at = (st0 == 1 or ne0 == 1) and "x[j]" or string.format("x[j * %s]", I(st0))
        loop(ne0, visit(pre.load(a.type, at), "j"))
    end
    return lines
end

-- Xor-shuffle reduction of `v` over a warp (sum), every lane ending with the total.
local function warp_sum(v)
    return {
        "#pragma unroll",
        "for (int o = 16; o > 0; o >>= 1)",
        string.format("    %s += __shfl_xor_sync(%s, %s, o);", v, FULL, v),
    }
end

-- The same for (best, bi): the larger value, on equal values the larger index (ggml keeps the
-- last of equal maxima).
local function warp_argmax()
    return {
        "#pragma unroll",
        "for (int o = 16; o > 0; o >>= 1) {",
        string.format("    const float ov = __shfl_xor_sync(%s, best, o);", FULL),
        string.format("    const int oi = __shfl_xor_sync(%s, bi, o);", FULL),
        "    if (ov > best || (ov == best && oi > bi)) {",
        "        best = ov;",
        "        bi = oi;",
        "    }",
        "}",
    }
end

-- ---- sum_rows, mean, argmax -------------------------------------------------------------------

local function row_reduce(k, a, dst)
    local op = k.op
    local argmax = op == "argmax"
    local dy = dyn_plan(k, a)
    local f = frame(k, a, argmax and "int" or prelude.ctype[dst.type], dy)
    local ix, I = f.ix, f.I
    local pre = prelude.new()
    local types, seen = {}, {}
    local function vtype(t, v)
        local name, def = vec_type(t, v)
        if not seen[name] then
            seen[name] = true
            types[#types + 1] = def
        end
        return name
    end
    local ne0 = a.ne[1]
    local nrows = a.ne[2] * a.ne[3] * a.ne[4]
    local dn0 = dy and dy.ext[1]
    local vec = dn0 and 1 or row_vec(a)
    local units = ne0 // vec + (ne0 % vec > 0 and 1 or 0)
    local g = group_size(units)
    local open, close, loop, grid, block, launch = row_loop(nrows, g, I, ix, dy)
    local nw = g // 32

    local body = {}
    local function add(s) body[#body + 1] = s end
    if g > 32 then
        add(string.format("__shared__ float s_val[%d];", nw))
        if argmax then add(string.format("__shared__ int s_idx[%d];", nw)) end
    end
    local inner = {}
    local function iadd(s) inner[#inner + 1] = s end
    local out_at = "row"
    if dy then
        local cl, coords = kit.row_coords(a.ne, dy)
        append(inner, cl)
        iadd(string.format("const %s *const x = in + %s;", prelude.ctype[a.type], coords_offset(a, coords, I)))
        if op ~= "argmax" then out_at = coords_offset(dst, coords, I) end
    else
        iadd(string.format("const %s *const x = in + %s;", prelude.ctype[a.type], row_offset(a, I)))
    end
    local visit
    if argmax then
        iadd("float best = __int_as_float(0xff800000); /* -inf */")
        iadd("int bi = -1;")
        visit = function(v, idx)
            return {
                "const float e = " .. v .. ";",
                "if (e >= best) { /* >=: the last of equal maxima, as ggml */",
                "    best = e;",
                "    bi = (int)" .. (idx == "j" and idx or "(" .. idx .. ")") .. ";",
                "}",
            }
        end
    else
        iadd("float acc = 0.0f;")
        visit = function(v) return { "acc += " .. v .. ";" } end
    end
    if dn0 then
        append(inner, visit_row_dyn(a, g, I, ix, pre, visit, dn0))
    else
        append(inner, visit_row(a, vec, g, I, ix, pre, vtype, visit))
    end
    append(inner, argmax and warp_argmax() or warp_sum("acc"))
    local result
    if argmax then
        result = "bi"
    elseif op == "mean" then
        result = dn0 and "acc / (float)" .. dn0 or string.format("acc / %d.0f", ne0) -- (float)ne0, as ggml divides
    else
        result = pre.store(dst.type, "acc")
    end
    if g > 32 then
        iadd("if (lane % 32u == 0u) {")
        iadd("    s_val[lane / 32u] = " .. (argmax and "best" or "acc") .. ";")
        if argmax then iadd("    s_idx[lane / 32u] = bi;") end
        iadd("}")
        iadd("__syncthreads();")
        iadd("if (lane < 32u) {")
        if argmax then
            if nw == 32 then
                iadd("    best = s_val[lane];")
                iadd("    bi = s_idx[lane];")
            else
                iadd(string.format("    best = lane < %du ? s_val[lane] : __int_as_float(0xff800000);", nw))
                iadd(string.format("    bi = lane < %du ? s_idx[lane] : -1;", nw))
            end
            append(inner, indent(warp_argmax(), 4))
        else
            iadd(nw == 32 and "    acc = s_val[lane];" or string.format("    acc = lane < %du ? s_val[lane] : 0.0f;", nw))
            append(inner, indent(warp_sum("acc"), 4))
        end
        iadd("    if (lane == 0u)")
        iadd("        out[" .. out_at .. "] = " .. result .. ";")
        iadd("}")
        if loop then iadd("__syncthreads(); /* s_val is reused by the next row */") end
    else
        iadd("if (lane == 0u)")
        iadd("    out[" .. out_at .. "] = " .. result .. ";")
    end
    append(body, open)
    append(body, loop and indent(inner, 4) or inner)
    append(body, close)

    local notes = {
        string.format("%d rows of %d; %s", nrows, ne0,
            vec > 1 and string.format("loads: vectors of %d %s", vec, a.type) or
            string.format("loads: element by element, stride %d", a.st[1])),
        op == "argmax" and "result: index of the max (last of equal maxima), i32" or
            op == "mean" and "result: f32 row sum / ne0" or "result: f32 row sum, stored as " .. dst.type,
    }
    if dy then notes[#notes + 1] = dyn_note(a, dy) end
    local name = string.format("%s_%s_%d", op, a.type, ne0)
    return {
        name = name,
        source = kernel {
            name = name, what = op .. " over rows", a = a, dst = dst, launch = launch, bits = f.bits,
            notes = notes, pre = (pre.code():gsub("\n$", "")), types = types, threads = block[1],
            params = f.params, ptrs = f.ptrs, body = indent(body, 4), dims = dims,
        },
        grid = grid, block = block, smem = 0, dynamic = dy and true or nil,
    }
end

-- ---- cumsum ---------------------------------------------------------------------------------

local function cumsum(k, a, dst)
    local dy = dyn_plan(k, a)
    local dn0 = dy and dy.ext[1]
    local f = frame(k, a, "float", dy)
    local ix, I = f.ix, f.I
    local ne0 = a.ne[1]
    local nrows = a.ne[2] * a.ne[3] * a.ne[4]
    local g = group_size((ne0 + CUM_K - 1) // CUM_K)
    local chunk = g * CUM_K
    local nchunks = (ne0 + chunk - 1) // chunk
    local open, close, loop, grid, block, launch = row_loop(nrows, g, I, ix, dy)
    local nw = g // 32
    -- Vector loads when every thread's 4 elements are whole and aligned; vector stores likewise
    -- (dst is contiguous and starts at element 0 of its buffer). Not with a dynamic row length.
    local vin = not dn0 and row_vec(a) == CUM_K and ne0 % CUM_K == 0
    local vout = not dn0 and ne0 % CUM_K == 0 and dst.offs % CUM_K == 0
    local types = {}
    if vin or vout then
        local _, def = vec_type("f32", CUM_K)
        types[1] = def
    end
    local K = CUM_K

    local body = {}
    local function add(s) body[#body + 1] = s end
    if g > 32 then add(string.format("__shared__ float s_tot[%d];", nw)) end
    local inner = {}
    local function iadd(s) inner[#inner + 1] = s end
    if dy then
        local cl, coords = kit.row_coords(a.ne, dy)
        append(inner, cl)
        iadd(string.format("const float *const x = in + %s;", coords_offset(a, coords, I)))
        iadd(string.format("float *const y = out + %s;", coords_offset(dst, coords, I)))
    else
        iadd(string.format("const float *const x = in + %s;", row_offset(a, I)))
        iadd(string.format("float *const y = out + row * %s;", I(ne0)))
    end
    if g > 32 then iadd("const unsigned wl = lane % 32u;") end
    local wl = g > 32 and "wl" or "lane"
    iadd("float carry = 0.0f; /* sum of the row's earlier chunks */")
    iadd(string.format("for (%s c = 0; c < %s; c++) {", ix,
        dn0 and string.format("(%s + %s) / %s", dn0, I(chunk - 1), I(chunk)) or I(nchunks)))
    local L = {}
    local function ladd(s) L[#L + 1] = s end
    ladd(string.format("const %s e = c * %s + lane * %s;", ix, I(chunk), I(K)))
    local vs = {}
    for q = 0, K - 1 do vs[#vs + 1] = "v" .. q end
    ladd("float " .. table.concat(vs, ", ") .. ";")
    local guard = dn0 or ne0 % chunk ~= 0
    local N0 = dn0 or I(ne0) -- the row length in the guards
    if vin then
        ladd("kiln_f32x4 q = {};")
        if guard then
            ladd(string.format("if (e < %s)", N0))
            ladd("    q = *(const kiln_f32x4 *)(x + e);")
        else
            ladd("q = *(const kiln_f32x4 *)(x + e);")
        end
        for q = 0, K - 1 do ladd(string.format("v%d = q.v[%d];", q, q)) end
    else
        for q = 0, K - 1 do
            local at = q == 0 and "e" or string.format("e + %s", I(q))
            local ld = (a.st[1] == 1 or ne0 == 1) and string.format("x[%s]", at) or
                string.format("x[%s * %s]", q == 0 and at or "(" .. at .. ")", I(a.st[1]))
            if guard then
                ladd(string.format("v%d = %s < %s ? %s : 0.0f;", q, at, N0, ld))
            else
                ladd(string.format("v%d = %s;", q, ld))
            end
        end
    end
    for q = 1, K - 1 do ladd(string.format("v%d += v%d;", q, q - 1)) end
    ladd(string.format("float t = v%d; /* inclusive scan of the thread totals over the warp */", K - 1))
    ladd("#pragma unroll")
    ladd("for (unsigned o = 1; o < 32u; o <<= 1) {")
    ladd(string.format("    const float u = __shfl_up_sync(%s, t, o);", FULL))
    ladd(string.format("    if (%s >= o)", wl))
    ladd("        t += u;")
    ladd("}")
    ladd(string.format("float ex = __shfl_up_sync(%s, t, 1); /* exclusive */", FULL))
    ladd(string.format("if (%s == 0u)", wl))
    ladd("    ex = 0.0f;")
    if g > 32 then
        ladd("if (wl == 31u)")
        ladd("    s_tot[lane / 32u] = t;")
        ladd("__syncthreads();")
        ladd("float before = 0.0f, total = 0.0f; /* every thread sums the warp totals in one order */")
        ladd("#pragma unroll")
        ladd(string.format("for (unsigned w = 0; w < %du; w++) {", nw))
        ladd("    const float s = s_tot[w];")
        ladd("    if (w < lane / 32u)")
        ladd("        before += s;")
        ladd("    total += s;")
        ladd("}")
        ladd("__syncthreads(); /* s_tot is rewritten by the next chunk */")
        ladd("const float off = carry + before + ex;")
    else
        ladd(string.format("const float total = __shfl_sync(%s, t, 31);", FULL))
        ladd("const float off = carry + ex;")
    end
    if vout then
        local vals = {}
        for q = 0, K - 1 do vals[#vals + 1] = "off + v" .. q end
        if guard then
            ladd(string.format("if (e < %s) {", N0))
            ladd("    const kiln_f32x4 r = {{" .. table.concat(vals, ", ") .. "}};")
            ladd("    *(kiln_f32x4 *)(y + e) = r;")
            ladd("}")
        else
            ladd("const kiln_f32x4 r = {{" .. table.concat(vals, ", ") .. "}};")
            ladd("*(kiln_f32x4 *)(y + e) = r;")
        end
    else
        for q = 0, K - 1 do
            local at = q == 0 and "e" or string.format("e + %s", I(q))
            if guard then
                ladd(string.format("if (%s < %s)", at, N0))
                ladd(string.format("    y[%s] = off + v%d;", at, q))
            else
                ladd(string.format("y[%s] = off + v%d;", at, q))
            end
        end
    end
    ladd("carry += total;")
    append(inner, indent(L, 4))
    iadd("}")
    append(body, open)
    append(body, loop and indent(inner, 4) or inner)
    append(body, close)

    local notes = {
        string.format("%d rows of %d; %d chunk%s of %d elements (%d per thread); loads %s, stores %s", nrows, ne0,
            nchunks, nchunks == 1 and "" or "s", chunk, K, vin and "vectors of 4" or "element by element",
            vout and "vectors of 4" or "element by element"),
    }
    if dy then notes[#notes + 1] = dyn_note(a, dy) end
    local name = string.format("cumsum_f32_%d", ne0)
    return {
        name = name,
        source = kernel {
            name = name, what = "inclusive prefix sum over rows", a = a, dst = dst, launch = launch,
            bits = f.bits, notes = notes, pre = "", types = types, threads = block[1], params = f.params,
            ptrs = f.ptrs, body = indent(body, 4), dims = dims,
        },
        grid = grid, block = block, smem = 0, dynamic = dy and true or nil,
    }
end

-- ---- sum ------------------------------------------------------------------------------------

-- The dims of a with more than one element, by increasing stride; and whether they fill a
-- contiguous range of memory (then the sum reads the range linearly).
local function memory_order(a)
    local ds = {}
    for d = 1, 4 do
        if a.ne[d] > 1 then ds[#ds + 1] = d end
    end
    table.sort(ds, function(x, y)
        if a.st[x] ~= a.st[y] then return a.st[x] < a.st[y] end
        return x < y
    end)
    local dense, s = true, 1
    for _, d in ipairs(ds) do
        if a.st[d] ~= s then dense = false end
        s = s * a.ne[d]
    end
    return ds, dense
end

local function sum(k, a, dst)
    local dy = dyn_plan(k, a)
    local f = frame(k, a, prelude.ctype[dst.type], dy)
    local ix, I = f.ix, f.I
    local pre = prelude.new()
    local n = nelem(a)
    local order, dense = memory_order(a)
    local types = {}
    local body = {}
    local function add(s) body[#body + 1] = s end
    add(string.format("__shared__ float s_val[%d];", SUM_BLOCK // 32))
    add("const unsigned lane = threadIdx.x;")
    add("float acc = 0.0f;")
    local how
    if dense and not dy then
        -- Any permutation of a contiguous tensor: the sum of the range [offs, offs + n).
        local vec = VEC_BYTES // SIZE[a.type]
        while vec > 1 and (a.offs % vec ~= 0 or n < vec) do vec = vec // 2 end
        local r = { type = a.type, ne = { n, 1, 1, 1 }, st = { 1, n, n, n }, offs = a.offs }
        add("const " .. prelude.ctype[a.type] .. " *const x = in;")
        local vtype = function(t, v)
            local name, def = vec_type(t, v)
            types[1] = def
            return name
        end
        append(body, visit_row(r, vec, SUM_BLOCK, I, ix, pre, vtype, function(v) return { "acc += " .. v .. ";" } end))
        how = string.format("a fills a contiguous range of %d elements: %s", n,
            vec > 1 and string.format("vectors of %d", vec) or "element by element")
    else
        -- Walk the index space with the smallest-stride dim fastest, so a warp's loads are close.
        local terms, stride = {}, 1
        local bound = I(n)
        if dy then
            -- The run-time index space, walked in the same order: the divisors are products of
            -- run-time extents.
            append(body, dy.decl)
            local sdyn = {}
            for q, d in ipairs(order) do
                local fs = {}
                if stride > 1 then fs[#fs + 1] = I(stride) end
                for _, x in ipairs(sdyn) do fs[#fs + 1] = x end
                local c = "i"
                if #fs == 1 then c = c .. " / " .. fs[1]
                elseif #fs > 1 then c = c .. " / (" .. table.concat(fs, " * ") .. ")" end
                if q < #order then c = "(" .. c .. " % " .. (dy.ext[d] or I(a.ne[d])) .. ")" end
                terms[#terms + 1] = a.st[d] == 1 and c or c .. " * " .. I(a.st[d])
                if dy.ext[d] then sdyn[#sdyn + 1] = dy.ext[d] else stride = stride * a.ne[d] end
            end
            local fs = {}
            if stride > 1 then fs[#fs + 1] = I(stride) end
            for _, x in ipairs(sdyn) do fs[#fs + 1] = x end
            add(string.format("const %s count = %s; /* run-time element count */", ix, table.concat(fs, " * ")))
            bound = "count"
        else
            for q, d in ipairs(order) do
                local c = "i"
                if stride > 1 then c = c .. " / " .. I(stride) end
                if q < #order then c = "(" .. c .. " % " .. I(a.ne[d]) .. ")" end
                terms[#terms + 1] = a.st[d] == 1 and c or c .. " * " .. I(a.st[d])
                stride = stride * a.ne[d]
            end
        end
        local off = #terms > 0 and table.concat(terms, " + ") or "0"
        add(string.format("for (%s i = lane; i < %s; i += %s)", ix, bound, I(SUM_BLOCK)))
        add("    acc += " .. pre.load(a.type, "in[" .. off .. "]") .. ";")
        local names = {}
        for _, d in ipairs(order) do names[#names + 1] = tostring(d - 1) end
        how = "strided: dims walked in the order " .. table.concat(names, ", ")
    end
    append(body, warp_sum("acc"))
    add("if (lane % 32u == 0u)")
    add("    s_val[lane / 32u] = acc;")
    add("__syncthreads();")
    add("if (lane < 32u) {")
    add("    acc = s_val[lane];")
    append(body, indent(warp_sum("acc"), 4))
    add("    if (lane == 0u)")
    add("        out[0] = " .. pre.store(dst.type, "acc") .. ";")
    add("}")
    local name = string.format("sum_%s_%d", a.type, n)
    return {
        name = name,
        source = kernel {
            name = name, what = "sum of all elements", a = a, dst = dst,
            launch = string.format("1 block of %d threads (deterministic, one SM)", SUM_BLOCK), bits = f.bits,
            notes = { how, dy and dyn_note(a, dy) or nil }, pre = (pre.code():gsub("\n$", "")), types = types, threads = SUM_BLOCK,
            params = f.params, ptrs = f.ptrs, body = indent(body, 4), dims = dims,
        },
        grid = { 1, 1, 1 }, block = { SUM_BLOCK, 1, 1 }, smem = 0, dynamic = dy and true or nil,
    }
end

local FLOATS = { f32 = true, f16 = true, bf16 = true }

return function(k)
    if k.kind ~= "op" then fail("node kind %s is not op", tostring(k.kind)) end
    local a, dst = k.args.a, k.dst
    if not a then fail("%s: operand a is missing", tostring(k.op)) end
    check_ref(a, "a", FLOATS)
    if k.op == "argmax" then
        check_ref(dst, "dst", { i32 = true })
    else
        check_ref(dst, "dst", FLOATS)
    end
    check_natural(dst)
    if k.op == "sum" then return sum(k, a, dst) end
    if k.op == "sum_rows" or k.op == "mean" or k.op == "argmax" then return row_reduce(k, a, dst) end
    if k.op == "cumsum" then
        if a.type ~= "f32" or dst.type ~= "f32" then fail("cumsum: f32 only, not %s", a.type) end
        return cumsum(k, a, dst)
    end
    fail("unknown op %s", tostring(k.op))
end
