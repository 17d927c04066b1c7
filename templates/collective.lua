-- collective: the template of the collective family (all_reduce; docs/tp.md). An all-reduce over
-- several GPUs is an NCCL call, a step of the program that no kernel implements: the result is
-- one step with a `collective` table, which codegen/generate.c reads into a cg_coll and the
-- runtime turns into ncclAllReduce on the session's stream (captured in its CUDA graph with the
-- kernels). Over one rank kiln_all_reduce makes no node at all.
--
-- The call sums `count` contiguous f32 values of a into dst over the group's ranks (in place
-- when the memory plan gave them one buffer). With a symbolic dim (n_tokens) the values of a run
-- are the first mul * n of the buffer laid out at the maximum, which holds when the symbolic dim
-- is the outermost one of more than one element: count_dyn says so, and the runtime passes
-- mul * kdims[slot] at each run.

local kit = require("kit")

local fail = kit.failer("collective")

-- Whether ref r is contiguous (strides of a dense [ne0, ne1, ne2, ne3]).
local function contiguous(r)
    local want = 1
    for d = 1, 4 do
        if r.ne[d] > 1 and r.st[d] ~= want then return false end
        want = want * r.ne[d]
    end
    return true
end

-- The kdims slot of symbolic dim name `name` (k.dims), or nil.
local function slot_of(k, name)
    for _, x in ipairs(k.dims or {}) do
        if x.name == name then return x.slot end
    end
    return nil
end

-- nil, or { slot =, mul = } when r's only symbolic dim is its outermost dim of more than one
-- element: the run's values are then a prefix of mul * n.
local function count_dyn(k, r)
    local sym, outer = nil, 0
    for d = 1, 4 do
        if r.ne[d] > 1 or (r.dyn and r.dyn[d]) then outer = d end
    end
    for d = 1, 4 do
        if r.dyn and r.dyn[d] then
            if sym or d ~= outer then
                fail("all_reduce: only the outermost dim may be symbolic (%s has dim %d = %s)", r.type, d - 1, tostring(r.sym[d]))
            end
            sym = d
        end
    end
    if not sym then return nil end
    local mul = 1
    for d = 1, sym - 1 do mul = mul * r.ne[d] end
    local slot = slot_of(k, r.sym[sym])
    if not slot then fail("all_reduce: cannot find the slot of symbolic dim '%s'", tostring(r.sym[sym])) end
    return { slot = slot, mul = mul }
end

return function(k)
    if k.kind ~= "op" or k.op ~= "all_reduce" then fail("node is not an all_reduce (%s)", tostring(k.op)) end
    local a, d = k.args.a, k.dst
    local ranks = k.params and k.params.ranks
    if type(ranks) ~= "number" or ranks < 2 then fail("all_reduce over %s ranks", tostring(ranks)) end
    if a.type ~= "f32" or d.type ~= "f32" then fail("all_reduce: a %s, dst %s (want f32)", a.type, d.type) end
    if not contiguous(a) or not contiguous(d) then fail("all_reduce: a and dst must be contiguous") end
    local count = a.ne[1] * a.ne[2] * a.ne[3] * a.ne[4]
    local dyn = count_dyn(k, a)
    return {
        dynamic = dyn ~= nil,
        collective = {
            op = "sum", ranks = ranks, count = count, count_dyn = dyn,
            src = { param = a.param, offset = a.offs * 4 },
            dst = { param = d.param, offset = d.offs * 4 },
        },
    }
end
