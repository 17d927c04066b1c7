-- angle: the rope angle of one pair, ggml's float chain bit for bit; shared by the rope
-- template (templates/rope.lua) and the GEMV store that ropes q and k (pass gemv_rope,
-- templates/matmul.lua). See ir/ref_rope.c for the reference it must equal.
--
-- The angle of pair i is theta_i = pos * theta_scale^i as ggml computes it, a float recurrence
-- theta_{i+1} = theta_i * theta_scale (__fmul_rn: no contraction), then the freq_factors
-- division, the freq_scale interpolation, the YaRN ramp and mix, sincosf (CUDA's precise one,
-- <= 2 ulp) and mscale, each in ggml's order with explicitly rounded intrinsics. The angles reach
-- thousands of radians, so a relative error of 1e-7 in theta would be 1e-4 in the output.

local M = {}

-- ---- float32 arithmetic at generation time ---------------------------------------------------
--
-- Lua numbers are doubles. f32(x) rounds one to float; a double +, -, *, / of floats rounded
-- once to float is the float operation's result (53 >= 2*24 + 2), so f32(a op b) emulates float
-- arithmetic exactly. pow and log are the C library's double functions rounded to float: the
-- reference (ir/ref_rope.c) computes these constants the same way, in the same process.

local function f32(x) return (string.unpack("<f", string.pack("<f", x))) end

-- An exact CUDA float literal of the float value x.
function M.lit(x)
    if x ~= x then return "__int_as_float(0x7fc00000)" end
    if x == math.huge then return "__int_as_float(0x7f800000)" end
    if x == -math.huge then return "__int_as_float(0xff800000)" end
    local s = string.format("%.9g", x):gsub(",", ".")
    if not s:find("[%.e]") then s = s .. ".0" end
    return s .. "f"
end
local lit = M.lit

-- C's floorf/ceilf as floats (math.floor returns an integer when it can).
local function ffloor(x) return math.floor(x) + 0.0 end
local function fceil(x) return math.ceil(x) + 0.0 end

-- The constants of the angle computation, as ggml computes them (see ir/ref_rope.c), from the
-- rope node's k.params and k.values.
function M.constants(k)
    local v, p = k.values, k.params
    local nd = p.n_dims
    local c = {}
    c.theta_scale = f32(v.freq_base ^ f32(-2.0 / nd))
    -- ggml_rope_yarn_corr_dims
    local pi = f32(math.pi)
    local function corr_dim(n_rot)
        local l = f32(math.log(f32(p.n_ctx_orig / f32(f32(n_rot * 2.0) * pi))))
        return f32(f32(nd * l) / f32(2.0 * f32(math.log(v.freq_base))))
    end
    local start = ffloor(corr_dim(v.beta_fast))
    local stop = fceil(corr_dim(v.beta_slow))
    c.low = (0.0 > start) and 0.0 or start
    c.high = ((nd - 1) < stop) and (nd - 1) + 0.0 or stop
    local diff = f32(c.high - c.low)
    local milli = f32(0.001)
    c.den = (milli > diff) and milli or diff
    c.mscale = v.attn_factor
    if v.ext_factor ~= 0 then
        local l = f32(math.log(f32(1.0 / v.freq_scale)))
        c.mscale = f32(v.attn_factor * f32(1.0 + f32(f32(0.1) * l)))
    end
    return c
end

-- Lines (through add(line, ind)) that turn `theta` (a float variable holding theta_i of pair
-- o.i, a C expression) into cos and sin: they end with o.store(cos, sin) (two C expressions).
-- o.ff: the C expression of the pair's frequency factor, or nil.
function M.lines(k, C, add, ind, o)
    local ext = "theta"
    if o.ff then
        add(string.format("const float ext = __fdiv_rn(theta, %s);", o.ff), ind)
        ext = "ext"
    end
    local interp = ext
    if k.values.freq_scale ~= 1 then
        add(string.format("const float interp = __fmul_rn(%s, %s);", k.params.freq_scale, ext), ind)
        interp = "interp"
    end
    local ang = interp
    if k.values.ext_factor ~= 0 then
        -- rope_yarn_ramp(low, high, i) * ext_factor, then the mix, in ggml's order.
        add(string.format("const float ry = __fdiv_rn(__fsub_rn((float)%s, %s), %s);", o.i, lit(C.low), lit(C.den)), ind)
        add("const float rmax = 0.0f > ry ? 0.0f : ry;", ind)
        add("const float rmin = 1.0f < rmax ? 1.0f : rmax;", ind)
        add(string.format("const float mix = __fmul_rn(__fsub_rn(1.0f, rmin), %s);", k.params.ext_factor), ind)
        add(string.format("const float ang = __fadd_rn(__fmul_rn(%s, __fsub_rn(1.0f, mix)), __fmul_rn(%s, mix));",
            interp, ext), ind)
        ang = "ang"
    end
    add("float sn, cn;", ind)
    add(string.format("sincosf(%s, &sn, &cn);", ang), ind)
    if C.mscale ~= 1 then
        local ms = lit(C.mscale)
        add(o.store(string.format("__fmul_rn(cn, %s)", ms), string.format("__fmul_rn(sn, %s)", ms)), ind)
    else
        add(o.store("cn", "sn"), ind)
    end
end

-- The rotated pair (x0 cos - x1 sin, x0 sin + x1 cos) as two C expressions, each product and
-- sum rounded explicitly (no contraction into FMAs), as ggml's float code computes it.
function M.rotate(x0, x1, c, sn)
    return string.format("__fsub_rn(__fmul_rn(%s, %s), __fmul_rn(%s, %s))", x0, c, x1, sn),
        string.format("__fadd_rn(__fmul_rn(%s, %s), __fmul_rn(%s, %s))", x0, sn, x1, c)
end

return M
