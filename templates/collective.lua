-- collective: the template of the collective family (all_reduce; docs/tp.md). An all-reduce over
-- several GPUs is an NCCL call, a step of the program that no kernel implements; that step
-- (codegen and runtime) is not built yet, so a node reaching codegen is refused with what to do
-- instead. Over one rank kiln_all_reduce makes no node at all.

local kit = require("kit")

local fail = kit.failer("collective")

return function(k)
    if k.kind ~= "op" or k.op ~= "all_reduce" then fail("node is not an all_reduce (%s)", tostring(k.op)) end
    fail("all_reduce over %s GPUs: tensor parallelism's NCCL step is not built yet (issue 30); the CPU reference " ..
        "evaluates a group's graphs together (kiln_reference_group)", tostring(k.params and k.params.ranks or "several"))
end
