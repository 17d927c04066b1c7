-- gemv_rope: the store of a one-column GEMV that computes its tails (pass gemv_rope,
-- ir/fuse_gemv_rope.c): k.tail lists the nodes reading the GEMV's result z, each a node table
-- as its own template would get it, with parameters numbered in the GEMV's list:
--   rope_ext (mode 0 or 2, n_dims = ne0)  rows [lo, hi) of z as heads of one token -> its dst
--   rope_ext fused rope_set_rows     the same, rotated rows written to cache row ids[0], in place
--   set_rows                         rows [lo, hi) converted to the cache type at row ids[0]
-- The GEMV's thread that stores rows (row, row + 1), row even, has both values of a mode 0 pair
-- (elements 2i, 2i+1 of a head). A neox (mode 2) pair is elements i and i + ne0/2 of a head, so
-- in a neox segment the GEMV computes its rows in another order (M.phys_row): its "rows" 2i and
-- 2i + 1 of a head are the weight's rows i and i + ne0/2. The thread rotates the pair with ggml's
-- angle (templates/angle.lua, the same theta for pair i in both modes) and
-- writes them where the tail's own kernel would: q rounded to its type, cache elements rounded
-- to the rope's op type then converted to the cache's type (what the unfused rope + set_rows
-- store). A cache row id out of range writes nothing (the CPU reference rejects it). z itself is
-- not stored: the pass made sure nothing else reads it. With an epilogue (a bias add: qwen2's and
-- gpt-oss's q/k/v), the values the tails get are the epilogue's (epilogue.value_lines).

local kit = require("kit")
local angle = require("angle")
local prelude = require("prelude")

local M = {}

local fail = kit.failer("matmul: gemv_rope")

local function static(r, what)
    for d = 1, 4 do
        if r.dyn and r.dyn[d] then fail("%s: symbolic dim %d", what, d - 1) end
    end
end

-- One segment of z per tail: {kind, lo, hi, ne0, t (the node), C (angle constants), ...}.
function M.plan(k, s)
    local segs = {}
    for i, t in ipairs(k.tail) do
        local g = { t = t, n = i }
        if t.op == "rope_ext" then
            if t.params.mode ~= 0 and t.params.mode ~= 2 then fail("tail %d: rope mode %s, not 0 or 2", i, tostring(t.params.mode)) end
            g.neox = t.params.mode == 2
            g.z, g.kind = t.args.a, t.fused == "rope_set_rows" and "rope_row" or "rope"
            if t.fused and t.fused ~= "rope_set_rows" then fail("tail %d: fusion %s", i, t.fused) end
            if t.params.n_dims ~= g.z.ne[1] then fail("tail %d: n_dims %d is not ne0 %d", i, t.params.n_dims, g.z.ne[1]) end
            g.C = angle.constants(t)
            g.pos, g.ff = t.args.pos, t.args.freq_factors
            if g.kind == "rope_row" then
                if not t.set_rows.in_place then fail("tail %d: rope_set_rows not in place", i) end
                g.ids, g.ot = t.set_rows.ids, t.set_rows.type
            elseif t.dst.type ~= "f32" then
                fail("tail %d: rope dst type %s, not f32", i, t.dst.type)
            end
        elseif t.op == "set_rows" then
            if not t.in_place then fail("tail %d: set_rows not in place", i) end
            g.z, g.kind, g.ids = t.args.b, "row", t.args.ids
        else
            fail("tail %d: op %s", i, tostring(t.op))
        end
        local z = g.z
        static(z, "z view")
        static(t.dst, "tail dst")
        if z.param ~= k.dst.param or z.type ~= "f32" or z.st[1] ~= 1 or z.ne[3] ~= 1 or z.ne[4] ~= 1 or
            (z.ne[2] > 1 and z.st[2] ~= z.ne[1]) then
            fail("tail %d does not read whole rows of z", i)
        end
        g.ne0 = z.ne[1]
        g.lo, g.hi = z.offs - k.dst.offs, z.offs - k.dst.offs + z.ne[1] * z.ne[2]
        if g.lo % 2 ~= 0 or g.hi % 2 ~= 0 or g.ne0 % 2 ~= 0 or g.lo < 0 or g.hi > s.M then
            fail("tail %d: rows [%d, %d) of %d, heads of %d", i, g.lo, g.hi, s.M, g.ne0)
        end
        if g.kind ~= "rope" then
            local c = t.dst
            if c.st[1] ~= 1 or c.ne[1] < g.hi - g.lo then fail("tail %d: cache rows of %d", i, c.ne[1]) end
            if g.ids.ne[1] * g.ids.ne[2] * g.ids.ne[3] * g.ids.ne[4] ~= 1 then fail("tail %d: more than one id", i) end
        end
        segs[#segs + 1] = g
    end
    segs.k = k
    return segs
end

-- The row of the weight that the GEMV computes as its row L (an unsigned C expression): L
-- itself, but in a neox segment [lo, lo + heads * d) where rows (2i, 2i + 1) of a head are its
-- rows (i, i + d/2).
function M.phys_row(segs, L)
    local x = L
    for _, g in ipairs(segs or {}) do
        if g.neox then
            local e = g.lo > 0 and string.format("(%s - %du)", L, g.lo) or L
            local within = g.lo > 0 and string.format("%s >= %du && %s < %du", L, g.lo, L, g.hi) or string.format("%s < %du", L, g.hi)
            x = string.format("(%s ? %s%s / %du * %du + %s %% %du / 2u + (%s & 1u) * %du : %s)", within,
                g.lo > 0 and g.lo .. "u + " or "", e, g.ne0, g.ne0, e, g.ne0, e, g.ne0 // 2, x)
        end
    end
    return x
end

-- Whether parameter p is written by a tail.
function M.writes(k, p)
    for _, t in ipairs(k.tail or {}) do
        if t.dst.param == p then return true end
    end
    return false
end

local function lit(v) return math.abs(v) > 2147483647 and string.format("%dll", v) or tostring(v) end

local function ptr(b, r, var, ct, const)
    b.add(kit.pointer(r, var, ct, const, lit))
end

-- Pointer declarations of every tail's operands (tail n's names start with "t<n>").
function M.pointers(b, segs)
    for _, g in ipairs(segs) do
        local t, n = g.t, g.n
        ptr(b, t.dst, "t" .. n .. "y", prelude.ctype[t.dst.type], false)
        if g.pos then ptr(b, g.pos, "t" .. n .. "pos", "int", true) end
        if g.ff then ptr(b, g.ff, "t" .. n .. "ff", "float", true) end
        if g.ids then ptr(b, g.ids, "t" .. n .. "ids", g.ids.type == "i64" and "long long" or "int", true) end
    end
end

-- The stores of rows (row, row + 1) (row: an even C expression) with values ya and yb.
function M.store(b, pre, segs, row, ya, yb)
    local k = segs.k
    if k and k.epilogue then
        local epilogue = require("epilogue")
        b.add("float za, zb; /* the epilogue's values of both rows */")
        -- (at the weight's rows: in a neox segment the GEMV's row order is not z's)
        local ra, rb = M.phys_row(segs, row), M.phys_row(segs, "(" .. row .. " + 1u)")
        for _, l in ipairs(epilogue.value_lines(k, pre, { ra }, { ya }, "za")) do b.add("%s", l) end
        for _, l in ipairs(epilogue.value_lines(k, pre, { rb }, { yb }, "zb")) do b.add("%s", l) end
        ya, yb = "za", "zb"
    end
    local first = true
    for _, g in ipairs(segs) do
        local t, n = g.t, "t" .. g.n
        local cond = g.lo > 0 and string.format("%s >= %du && %s < %du", row, g.lo, row, g.hi)
            or string.format("%s < %du", row, g.hi)
        b.open("%sif (%s) { /* %s: rows [%d, %d) */", first and "" or "} else ", cond,
            g.kind == "rope" and "rope" or g.kind == "rope_row" and "rope into a cache row" or "cache row", g.lo, g.hi)
        first = false
        b.add("const unsigned e = %s%s; /* element of the segment, even */", row, g.lo > 0 and string.format(" - %du", g.lo) or "")
        local dst
        if g.kind ~= "rope" then
            b.add("const long long id = (long long)%sids[0];", n)
            b.open("if (id >= 0 && id < %dll) {", t.dst.ne[2])
            dst = function(o) return string.format("%sy[id * %s + e%s]", n, lit(t.dst.st[2]), o) end
            if g.neox then -- the pair's elements i and i + d/2 of head e / d
                b.add("const unsigned en = e / %du * %du + e %% %du / 2u;", g.ne0, g.ne0, g.ne0)
                dst = function(o) return string.format("%sy[id * %s + en%s]", n, lit(t.dst.st[2]), o ~= "" and " + " .. (g.ne0 // 2) .. "u" or "") end
            end
        end
        if g.kind == "row" then
            b.add("%s = %s;", dst(""), pre.store(t.dst.type, ya))
            b.add("%s = %s;", dst(" + 1u"), pre.store(t.dst.type, yb))
        else
            if g.kind == "rope" then
                b.add("const unsigned i = e %% %du / 2u, h = e / %du; /* pair i of head h */", g.ne0, g.ne0)
            else
                b.add("const unsigned i = e %% %du / 2u; /* pair i of its head */", g.ne0)
            end
            b.add("float t = (float)%spos[0]; /* ggml's chain theta_k = pos * theta_scale^k, to pair i */", n)
            b.add("for (unsigned k = 0u; k < i; k++)")
            b.add("    t = __fmul_rn(t, %s);", angle.lit(g.C.theta_scale))
            b.add("const float theta = t;")
            angle.lines(t, g.C, function(l) b.add("%s", l) end, "", {
                i = "i",
                ff = g.ff and string.format("%sff[(long long)i * %s]", n, lit(g.ff.st[1])),
                store = function(c, sn) return string.format("const float c = %s, s = %s;", c, sn) end,
            })
            local o0, o1 = angle.rotate(ya, yb, "c", "s")
            if g.kind == "rope" then
                local y = t.dst
                local el = g.neox and "i" or string.format("(e %% %du)", g.ne0) -- the pair's first element
                local at = string.format("(long long)%s * %s + (long long)h * %s", el, lit(y.st[1]), lit(y.st[2]))
                b.add("%sy[%s] = %s;", n, at, o0)
                b.add("%sy[%s + %s] = %s;", n, at, lit(g.neox and (g.ne0 // 2) * y.st[1] or y.st[1]), o1)
            else
                b.add("%s = %s;", dst(""), pre.store(t.dst.type, pre.round(g.ot, o0)))
                b.add("%s = %s;", dst(" + 1u"), pre.store(t.dst.type, pre.round(g.ot, o1)))
            end
        end
        if g.kind ~= "rope" then b.close() end
        b.pop()
    end
    b.add("}")
end

-- Header notes.
function M.notes(segs)
    local out = {}
    for _, g in ipairs(segs) do
        local mode = g.neox and "neox" or "mode 0"
        local what = ({ rope = "rope (" .. mode .. ") to its dst", rope_row = "rope (" .. mode .. ") into cache row ids[0]",
            row = "into cache row ids[0]" })[g.kind]
        out[#out + 1] = string.format("tail %d: rows [%d, %d), heads of %d: %s (%s)", g.n, g.lo, g.hi, g.ne0, what, g.t.dst.type)
    end
    return out
end

return M
