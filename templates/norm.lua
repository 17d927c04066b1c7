-- norm: the kernel template of the norm family (see docs/templates.md for the table k of IR_OP nodes).
return function(k)
    error("norm: template for " .. tostring(k.op) .. " is not implemented yet", 0)
end
