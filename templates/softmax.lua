-- softmax: the kernel template of the softmax family (see docs/templates.md for the table k of IR_OP nodes).
return function(k)
    error("softmax: template for " .. tostring(k.op) .. " is not implemented yet", 0)
end
