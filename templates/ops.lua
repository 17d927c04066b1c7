-- ops: the CUDA expression of each elementwise op (frontend.h FE_OPS), computed in f32.
--
-- ops[name] = { arity = 1 or 2, expr = function(a, b, f) -> string }, where a and b are the
-- operand expressions (register names such as "r3") and f the instruction's two float
-- parameters as exact CUDA literals ("0.5f", "__int_as_float(0x7f800000)", ...). The
-- expressions must match ir_apply (ir/eval.c), the CPU reference.

local M = {}

-- A literal as an operand: negative ones in parentheses, for readability.
local function lit(s)
    if s:sub(1, 1) == "-" then return "(" .. s .. ")" end
    return s
end

local function unary(f) return { arity = 1, expr = f } end
local function binary(f) return { arity = 2, expr = f } end

M.cont = unary(function(a) return a end)

M.add = binary(function(a, b) return a .. " + " .. b end)
M.sub = binary(function(a, b) return a .. " - " .. b end)
M.mul = binary(function(a, b) return a .. " * " .. b end)
M.div = binary(function(a, b) return a .. " / " .. b end)

-- ggml_scale_bias: a*s + b
M.scale = unary(function(a, _, f) return a .. " * " .. lit(f[1]) .. " + " .. lit(f[2]) end)

M.neg = unary(function(a) return "-" .. a end)
M.exp = unary(function(a) return "expf(" .. a .. ")" end)
M.sqr = unary(function(a) return a .. " * " .. a end)
M.sqrt = unary(function(a) return "sqrtf(" .. a .. ")" end)
M.silu = unary(function(a) return a .. " / (1.0f + expf(-" .. a .. "))" end)
-- ggml's tanh approximation
M.gelu = unary(function(a)
    return "0.5f * " .. a .. " * (1.0f + tanhf(0.7978845608f * " .. a .. " * (1.0f + 0.044715f * "
        .. a .. " * " .. a .. ")))"
end)
M.relu = unary(function(a) return a .. " > 0.0f ? " .. a .. " : 0.0f" end)
M.tanh = unary(function(a) return "tanhf(" .. a .. ")" end)
M.sigmoid = unary(function(a) return "1.0f / (1.0f + expf(-" .. a .. "))" end)
M.abs = unary(function(a) return "fabsf(" .. a .. ")" end)
M.sgn = unary(function(a) return a .. " > 0.0f ? 1.0f : (" .. a .. " < 0.0f ? -1.0f : 0.0f)" end)
M.step = unary(function(a) return a .. " > 0.0f ? 1.0f : 0.0f" end)
M.elu = unary(function(a) return a .. " > 0.0f ? " .. a .. " : expm1f(" .. a .. ")" end)
-- ggml: max(x, 0) + slope * min(x, 0)
M.leaky_relu = unary(function(a, _, f)
    return "(" .. a .. " > 0.0f ? " .. a .. " : 0.0f) + " .. lit(f[1]) .. " * (" .. a .. " < 0.0f ? "
        .. a .. " : 0.0f)"
end)
M.gelu_erf = unary(function(a) return "0.5f * " .. a .. " * (1.0f + erff(" .. a .. " * 0.70710678f))" end)
M.gelu_quick = unary(function(a) return a .. " * (1.0f / (1.0f + expf(-1.702f * " .. a .. ")))" end)
M.hardswish = unary(function(a) return a .. " * fminf(1.0f, fmaxf(0.0f, (" .. a .. " + 3.0f) / 6.0f))" end)
M.hardsigmoid = unary(function(a) return "fminf(1.0f, fmaxf(0.0f, (" .. a .. " + 3.0f) / 6.0f))" end)
M.log = unary(function(a) return "logf(" .. a .. ")" end)
M.sin = unary(function(a) return "sinf(" .. a .. ")" end)
M.cos = unary(function(a) return "cosf(" .. a .. ")" end)
M.softplus = unary(function(a) return a .. " > 20.0f ? " .. a .. " : logf(1.0f + expf(" .. a .. "))" end)
-- ggml_clamp: max(min(x, max), min)
M.clamp = unary(function(a, _, f) return "fmaxf(fminf(" .. a .. ", " .. f[2] .. "), " .. f[1] .. ")" end)

-- ggml_add1: a + the scalar b (broadcast like any operand)
M.add1 = binary(function(a, b) return a .. " + " .. b end)

-- Gated units: act(x) * g with x = a, g = b (the lowering picks the halves). The activations
-- are the unary ones above, inlined so a fused chain keeps one rounding per graph value.
local function gated(act) return binary(function(a, b, f) return "(" .. act(a, f) .. ") * " .. b end) end
-- ggml_vec_reglu_f32: x > 0 ? x * g : 0 (so a masked inf or NaN gate gives 0)
M.reglu = binary(function(a, b) return a .. " > 0.0f ? " .. a .. " * " .. b .. " : 0.0f" end)
M.geglu = gated(function(a) return M.gelu.expr(a) end)
M.swiglu = gated(function(a) return M.silu.expr(a) end)
M.geglu_erf = gated(function(a) return M.gelu_erf.expr(a) end)
M.geglu_quick = gated(function(a) return M.gelu_quick.expr(a) end)
-- gpt-oss: x = min(x, limit); g = clamp(g, -limit, limit); x / (1 + exp(-alpha x)) * (g + 1)
M.swiglu_oai = binary(function(a, b, f)
    local x = "fminf(" .. a .. ", " .. f[2] .. ")"
    local g = "fminf(fmaxf(" .. b .. ", -" .. lit(f[2]) .. "), " .. f[2] .. ")"
    return "(" .. x .. " / (1.0f + expf(" .. lit(f[1]) .. " * -" .. x .. "))) * (" .. g .. " + 1.0f)"
end)

return M
