-- heads: one kernel for a run of per-head nodes of one token (pass head_rope,
-- ir/fuse_head_rope.c). k is the run's first node and k.tail the others, each a node table as
-- its own template would get it, with parameters numbered in one list:
--   rms_norm (+ epilogue)          heads of rows of one token -> read by a rope of the run only
--   rope_ext (mode 0 or 2, n_dims = ne0)               heads -> its dst
--   rope_ext fused rope_set_rows   the same, rotated rows into cache row ids[0], in place
--   set_rows                       one row converted to the cache type at row ids[0], in place
-- An elementwise node (kind "ew") may follow a plain rope of the run, reading its result, which
-- is then not stored: the node's instructions run on the rotated values and its result is
-- stored instead (Gemma 3's scale of q).
-- A "job" is a rope with the norm before it and the elementwise node after it (if any), a rope
-- alone, or a cache row. A warp computes one head of a job (of a cache row, one piece of at most
-- PIECE elements), so the kernel is a warp per head of every job: Qwen3-30B-A3B's 32 q heads,
-- 4 k heads and the 2 pieces of its v row are 38 warps, where the unfused graph launched 5
-- kernels.
--
-- In a warp, lane l holds pairs i = l, l + 32, ... of the head (a mode 0 pair is elements 2i,
-- 2i + 1; a neox pair i and i + ne0/2), so loads and stores are coalesced. The norm sums the
-- squares in double (each f32 square widened, as ggml's ggml_float sum) by xor butterflies, so
-- every lane has the same sum; the norm's value, its epilogue (the head weight) and the
-- rounding to its dst's type are the unfused kernel's, and that value never leaves registers.
-- The rope's angle for pair i is ggml's float chain pos * theta_scale^i, walked by each lane
-- from its first pair on (templates/angle.lua), bit for bit the reference's.

local kit = require("kit")
local angle = require("angle")
local prelude = require("prelude")
local E = require("epilogue")

local fail = kit.failer("heads")

local WARPS = 4      -- warps a block
local PIECE = 256    -- elements of a cache row a warp copies
local MAX_NE0 = 1024 -- ir/fuse_head_rope.c

local function static(r, what)
    for d = 1, 4 do
        if r.dyn and r.dyn[d] then fail("%s: symbolic dim %d", what, d - 1) end
    end
end

-- The rows a node reads as heads of one token: f32, contiguous rows [ne0, heads].
local function rows_of(r, what)
    static(r, what)
    if r.type ~= "f32" or r.st[1] ~= 1 or r.ne[3] ~= 1 or r.ne[4] ~= 1 or (r.ne[2] > 1 and r.st[2] ~= r.ne[1]) then
        fail("%s: not contiguous f32 rows of one token", what)
    end
    if r.ne[1] % 2 ~= 0 then fail("%s: rows of %d elements, not even", what, r.ne[1]) end
    return r
end

-- The jobs of the run: {kind = "rope" | "rope_row" | "row", norm = the norm's node or nil,
-- t = the node, x = the rows read, ne0, heads (warps), ...}.
local function plan(k)
    local nodes = { k }
    for _, t in ipairs(k.tail or {}) do nodes[#nodes + 1] = t end
    local norms, jobs, posts = {}, {}, {}
    for i, t in ipairs(nodes) do
        local what = string.format("node %d (%s)", i, tostring(t.op or t.kind))
        static(t.dst, what .. " dst")
        if t.op == "rms_norm" then
            rows_of(t.args.a, what .. " a")
            if t.dst.type ~= "f32" then fail("%s: dst %s, not f32", what, t.dst.type) end
            if t.args.a.ne[1] > MAX_NE0 then fail("%s: heads of %d elements", what, t.args.a.ne[1]) end
            if t.epilogue and (t.epilogue.values or 1) ~= 1 then fail("%s: a paired epilogue", what) end
            norms[#norms + 1] = { t = t, used = false }
        elseif t.op == "rope_ext" then
            local j = { t = t, x = rows_of(t.args.a, what .. " a") }
            if t.params.mode ~= 0 and t.params.mode ~= 2 then fail("%s: rope mode %s", what, tostring(t.params.mode)) end
            if t.params.n_dims ~= j.x.ne[1] then fail("%s: n_dims %d is not ne0 %d", what, t.params.n_dims, j.x.ne[1]) end
            if j.x.ne[1] > MAX_NE0 then fail("%s: heads of %d elements", what, j.x.ne[1]) end
            j.neox, j.C, j.pos, j.ff = t.params.mode == 2, angle.constants(t), t.args.pos, t.args.freq_factors
            if t.fused == "rope_set_rows" then
                if not t.set_rows.in_place then fail("%s: rope_set_rows not in place", what) end
                j.kind, j.ids, j.ot = "rope_row", t.set_rows.ids, t.set_rows.type
            elseif t.fused then
                fail("%s: fusion %s", what, t.fused)
            else
                if t.dst.type ~= "f32" then fail("%s: dst %s, not f32", what, t.dst.type) end
                j.kind = "rope"
            end
            for _, n in ipairs(norms) do
                local d = n.t.dst
                if d.param == j.x.param and d.offs == j.x.offs then
                    if n.used then fail("%s: a norm read twice", what) end
                    n.used, j.norm = true, n.t
                end
            end
            jobs[#jobs + 1] = j
        elseif t.op == "set_rows" then
            if not t.in_place then fail("%s: set_rows not in place", what) end
            local b = rows_of(t.args.b, what .. " b")
            if b.ne[2] ~= 1 then fail("%s: %d rows, not one", what, b.ne[2]) end
            jobs[#jobs + 1] = { kind = "row", t = t, x = b, ids = t.args.ids }
        elseif t.kind == "ew" then
            posts[#posts + 1] = t
        else
            fail("%s: not a norm, rope, set_rows or elementwise node", what)
        end
    end
    for i, n in ipairs(norms) do
        if not n.used then fail("norm %d: no rope of the run reads it", i) end
    end
    for i, t in ipairs(posts) do -- each reads the result of a plain rope of the run, in its place
        local found
        for _, j in ipairs(jobs) do
            for q, r in ipairs(t.inputs) do
                if j.kind == "rope" and r.param == j.t.dst.param and r.offs == j.t.dst.offs and not found then
                    found, j.post, j.post_in = j, t, q - 1
                end
            end
        end
        if not found then fail("elementwise node %d: reads no rope of the run", i) end
        static(t.dst, "elementwise dst")
        for d = 1, 4 do
            if t.dst.ne[d] ~= found.t.dst.ne[d] then fail("elementwise node %d: shape differs from its rope's", i) end
        end
        for q, r in ipairs(t.inputs) do
            if q - 1 ~= found.post_in then static(r, "elementwise operand") end
        end
    end
    local w = 0
    for _, j in ipairs(jobs) do
        j.ne0 = j.kind == "row" and math.min(j.x.ne[1], PIECE) or j.x.ne[1]
        j.heads = j.kind == "row" and kit.ceil_div(j.x.ne[1], PIECE) or j.x.ne[2]
        j.np = j.ne0 // 2
        j.J = kit.ceil_div(j.np, 32)
        j.w0, w = w, w + j.heads
        if j.kind ~= "rope" then
            local c = j.t.dst
            if c.st[1] ~= 1 then fail("cache rows of stride %d", c.st[1]) end
            if j.ids.ne[1] * j.ids.ne[2] * j.ids.ne[3] * j.ids.ne[4] ~= 1 then fail("more than one id") end
        end
    end
    if #jobs == 0 then fail("no rope or cache row") end
    return jobs, w
end

-- Element of the head (C expression) of half `s` (0 or 1) of pair i.
local function elem(j, i, s)
    if j.kind ~= "row" and j.neox then return s == 0 and i or string.format("%s + %du", i, j.np) end
    return s == 0 and string.format("2u * %s", i) or string.format("2u * %s + 1u", i)
end

-- Pointer declarations of job n's operands (names "j<n>...").
local function pointers(b, n, j)
    local t = j.t
    local function ptr(r, var, ct, const) b.add(kit.pointer(r, var, ct, const)) end
    ptr(j.norm and j.norm.args.a or j.x, "j" .. n .. "x", "float", true)
    ptr(j.post and j.post.dst or t.dst, "j" .. n .. "y", prelude.ctype[(j.post and j.post.dst or t.dst).type], false)
    if j.pos then ptr(j.pos, "j" .. n .. "pos", "int", true) end
    if j.ff then ptr(j.ff, "j" .. n .. "ff", "float", true) end
    if j.ids then ptr(j.ids, "j" .. n .. "ids", j.ids.type == "i64" and "long long" or "int", true) end
end

-- The norm of job j's head in registers x0_<q>, x1_<q> (q: the lane's pairs): scale, value,
-- epilogue, rounded to the norm's dst type, as rms_norm's own kernel and its epilogue compute.
local function norm_lines(b, pre, n, j)
    local t = j.norm
    b.add("double ss = 0.0;")
    for q = 0, j.J - 1 do
        b.add("ss += (double)(x0_%d * x0_%d) + (double)(x1_%d * x1_%d);", q, q, q, q)
    end
    b.add("for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);")
    b.add("const float mean = (float)(ss / %d.0);", j.ne0)
    b.add("const float scale = 1.0f / sqrtf(mean + %s);", t.params.eps)
    for q = 0, j.J - 1 do
        for h = 0, 1 do
            local x = string.format("x%d_%d", h, q)
            local v = x .. " * scale"
            if t.epilogue then
                local e = string.format("(%s)", elem(j, "i" .. q, h))
                local loads = {}
                for _, o in ipairs(E.operands(t)) do
                    local r = t.inputs[o + 1]
                    static(r, "norm epilogue operand")
                    local off = E.offset(r, t.dst.ne, { e, "hd" }, function(c) return c .. "u" end)
                    loads[o] = pre.load(r.type, string.format("((const %s *)p%d)[%s%s]", prelude.ctype[r.type], r.param,
                        r.offs ~= 0 and r.offs .. "u + " or "", off))
                end
                b.open("{")
                local lines, res = E.lines(t, pre, { v }, loads, string.format("e%d_%d_", h, q))
                for _, l in ipairs(lines) do b.add("%s", l) end
                b.add("%s = %s;", x, pre.round(t.dst.type, res))
                b.close()
            else
                b.add("%s = %s;", x, pre.round(t.dst.type, v))
            end
        end
    end
end

-- The rope of the lane's pairs and their stores.
local function rope_lines(b, pre, n, j)
    local t, nm = j.t, "j" .. n
    b.add("float th = (float)%spos[0]; /* ggml's chain theta_i = pos * theta_scale^i, to pair lane */", nm)
    b.add("for (unsigned c = 0u; c < lane; c++) th = __fmul_rn(th, %s);", angle.lit(j.C.theta_scale))
    for q = 0, j.J - 1 do
        local i = "i" .. q
        if q > 0 then
            b.add("for (int c = 0; c < 32; c++) th = __fmul_rn(th, %s); /* to pair %s */", angle.lit(j.C.theta_scale), i)
        end
        b.open("if (%s < %du) {", i, j.np)
        b.add("const float theta = th;")
        angle.lines(t, j.C, function(l) b.add("%s", l) end, "", {
            i = i,
            ff = j.ff and string.format("%sff[%s * %du]", nm, i, j.ff.st[1]),
            store = function(c, sn) return string.format("const float c = %s, s = %s;", c, sn) end,
        })
        local o0, o1 = angle.rotate("x0_" .. q, "x1_" .. q, "c", "s")
        if j.kind == "rope" and j.post then -- the elementwise node after the rope, its result stored
            local e, y = j.post, j.post.dst
            for h, o in ipairs({ o0, o1 }) do
                local el, pf = elem(j, i, h - 1), string.format("p%d_%d_", h - 1, q)
                b.open("{")
                for r, x in ipairs(e.inputs) do
                    local v = r - 1 == j.post_in and pre.round(t.dst.type, o) or pre.load(x.type, string.format("((const %s *)p%d)[%s%s]",
                        prelude.ctype[x.type], x.param, x.offs ~= 0 and x.offs .. "u + " or "",
                        E.offset(x, y.ne, { "(" .. el .. ")", "hd" }, function(c) return c .. "u" end)))
                    b.add("const float %sr%d = %s;", pf, r - 1, v)
                end
                local lines, _, res = E.instructions(e.instrs, #e.inputs, y, pre, pf)
                for _, l in ipairs(lines) do b.add("%s", l) end
                b.add("%sy[(%s) * %du + hd * %du] = %s;", nm, el, y.st[1], y.st[2], pre.store(y.type, res))
                b.close()
            end
        elseif j.kind == "rope" then
            local y = t.dst
            local function at(s)
                return string.format("(%s) * %du + hd * %du", elem(j, i, s), y.st[1], y.st[2])
            end
            b.add("%sy[%s] = %s;", nm, at(0), o0)
            b.add("%sy[%s] = %s;", nm, at(1), o1)
        else
            b.add("%sy[row + hd * %du + %s] = %s;", nm, j.ne0, elem(j, i, 0), pre.store(t.dst.type, pre.round(j.ot, o0)))
            b.add("%sy[row + hd * %du + %s] = %s;", nm, j.ne0, elem(j, i, 1), pre.store(t.dst.type, pre.round(j.ot, o1)))
        end
        b.close()
    end
end

-- One job's body: head hd of it, in warp-uniform code.
local function job_lines(b, pre, n, j)
    local nm = "j" .. n
    for q = 0, j.J - 1 do
        b.add("const unsigned i%d = lane + %du; /* pair */", q, 32 * q)
    end
    -- the pairs, zero past the head (a piece of a cache row may be shorter)
    local len = j.kind == "row" and string.format("min(%du, %du - hd * %du)", j.np, j.x.ne[1] // 2, j.np) or nil
    if len then b.add("const unsigned np = %s;", len) end
    local np = len and "np" or (j.np .. "u")
    local base = string.format("hd * %du", j.ne0)
    for q = 0, j.J - 1 do
        local guard = (len or j.np % 32 ~= 0) and string.format("i%d < %s", q, np) or nil
        local function ld(s)
            local e = string.format("%sx[%s + %s]", nm, base, elem(j, "i" .. q, s))
            return guard and string.format("%s ? %s : 0.0f", guard, e) or e
        end
        b.add("float x0_%d = %s, x1_%d = %s;", q, ld(0), q, ld(1))
    end
    if j.kind ~= "rope" then
        b.add("const long long id = (long long)%sids[0];", nm)
        b.add("if (id < 0 || id >= %dll) return; /* the CPU reference rejects it */", j.t.dst.ne[2])
        b.add("const long long row = id * %dll;", j.t.dst.st[2])
    end
    if j.norm then norm_lines(b, pre, n, j) end
    if j.kind == "row" then
        for q = 0, j.J - 1 do
            b.open("if (i%d < np) {", q)
            for s = 0, 1 do
                b.add("%sy[row + %s + %s] = %s;", nm, base, elem(j, "i" .. q, s), pre.store(j.t.dst.type, string.format("x%d_%d", s, q)))
            end
            b.close()
        end
    else
        rope_lines(b, pre, n, j)
    end
end

local function describe(j)
    local what = j.kind == "row" and "cache row" or (j.kind == "rope_row" and "rope into a cache row" or "rope")
    if j.norm then what = "rms_norm, " .. what end
    if j.post then what = what .. ", then elementwise" end
    return string.format("%s: %d warp%s of %d elements%s (%s)", what, j.heads, j.heads > 1 and "s" or "", j.ne0,
        j.kind ~= "row" and (j.neox and ", neox" or ", mode 0") or "", j.t.dst.type)
end

return function(k)
    if k.kind ~= "op" then fail("not an op node") end
    local jobs, warps = plan(k)
    local pre = prelude.new()
    local b = kit.builder("    ")
    b.add("const unsigned lane = threadIdx.x & 31u;")
    b.add("const unsigned w = blockIdx.x * %du + threadIdx.x / 32u; /* the warp's head over all jobs */", WARPS)
    b.add("if (w >= %du) return;", warps)
    local name = "heads"
    for n, j in ipairs(jobs) do
        name = name .. "_" .. (j.norm and "n" or "") .. ({ rope = "r", rope_row = "k", row = "v" })[j.kind] .. (j.post and "e" or "")
            .. j.x.ne[1]
        if n > 1 then b.pop() end
        b.open("%sif (w < %du) { /* job %d: %s */", n > 1 and "} else " or "", j.w0 + j.heads, n, describe(j))
        b.add("const unsigned hd = w - %du;", j.w0)
        pointers(b, n, j)
        job_lines(b, pre, n, j)
    end
    b.close()
    if #name > 60 then name = name:sub(1, 60) end
    local written = {}
    for _, j in ipairs(jobs) do written[(j.post and j.post.dst or j.t.dst).param] = true end
    local plist = {}
    for q = 0, k.nparams - 1 do plist[#plist + 1] = (written[q] and "char" or "const char") .. " *__restrict__ p" .. q end
    local notes = {}
    for n, j in ipairs(jobs) do notes[#notes + 1] = string.format("job %d: %s", n, describe(j)) end
    local head = { "kiln heads kernel (pass head_rope: per-head norms, ropes and cache rows of one token)",
        string.format("%d warps, %d a block", warps, WARPS) }
    local source = kit.kernel {
        head = head, notes = notes, pre = (pre.code():gsub("\n$", "")), threads = 32 * WARPS, name = name,
        params = "\n    " .. table.concat(plist, ",\n    "), body = b.lines,
    }
    return { name = name, source = source, grid = { kit.ceil_div(warps, WARPS), 1, 1 }, block = { 32 * WARPS, 1, 1 },
        smem = 0, tail = true, epilogue = k.epilogue ~= nil, fused = k.fused }
end
