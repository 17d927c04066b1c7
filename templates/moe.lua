-- moe: the kernel template of topk_moe nodes (IR_FUSED_TOPK_MOE, ir/fuse_topk_moe.c): MoE
-- routing of one token row per warp. See docs/ops-moe.md for the semantics and
-- docs/templates.md for the table k (k.moe, k.dst2).
--
-- Lane l holds the experts l, l + 32, ... (ceil(E/32) <= 16 values in registers). The gating
-- (softmax: warp max, expf, the sum in double as the reference's sum_rows/softmax do, times
-- (float)(1.0 / sum); sigmoid) gives the probabilities; each gets the 64-bit key of the sort
-- family (templates/sort.lua, ir/ref_sort.c): the complemented order-preserving pattern of
-- prob (+ bias) above, the expert index below, so the k warp minima are the first k of the
-- descending order with ties by index, NaN first, -0 == +0, exactly as the reference. Lane j
-- keeps the j-th id and its probability (sent by the owning lane with the winning key); the
-- weights' post-processing (delayed softmax, norm with clamp, scale) runs on lanes 0..k-1
-- with warp sums in double, and lane j stores id j and weight j.

local kit = require("kit")
local tpl = require("tpl")
local prelude = require("prelude")

local MAX_E = 512
local MAX_K = 32
local MAX_WARPS = 4 -- token rows per block

local fail = kit.failer("moe")

local dims = kit.dims

local check_ref = kit.ref_checker(fail)

-- The C offset expression sum of var_d * st_d over the (var, ne, st) terms, broadcasting
-- (`% ne`) where ne divides the index space; "0" when empty.
local function offset(terms)
    local parts = {}
    for _, t in ipairs(terms) do
        local var, ne, full, st = t[1], t[2], t[3], t[4]
        if ne > 1 and st ~= 0 then
            local v = ne < full and ("(" .. var .. " % " .. ne .. "u)") or var
            parts[#parts + 1] = st == 1 and ("(long long)" .. v) or ("(long long)" .. v .. " * " .. st .. "ll")
        end
    end
    if #parts == 0 then return "0" end
    return table.concat(parts, " + ")
end

local SORT_KEY = kit.sort_key_helper("/* Order-preserving pattern of v (templates/sort.lua): -0 == +0, NaN above +inf. */")

local kernel = tpl.define [[
// kiln moe kernel ${name}
// topk_moe: ${what}
//   logits  p${a.param} ${a.type} ne ${dims(a.ne)} st ${dims(a.st)} offs ${a.offs}
@ if bias then
//   bias    p${bias.param} ${bias.type} ne ${dims(bias.ne)} st ${dims(bias.st)} offs ${bias.offs}
@ end
//   weights p${dst.param} ${dst.type} ne ${dims(dst.ne)} st ${dims(dst.st)} offs ${dst.offs}
//   ids     p${ids.param} i32 ne ${dims(ids.ne)} st ${dims(ids.st)} offs ${ids.offs}
// ${T} token row${T == 1 and "" or "s"} of ${E} experts, keeping ${K}: one warp per row, ${NPL} value${NPL == 1 and "" or "s"} per lane in registers, ${K} warp minima
// launch: ${grid} block${grid == 1 and "" or "s"} of ${WARPS * 32} threads
@ if dT then
// symbolic: token rows ${dT} at run time (warps past them return)
@ end
@ if pre ~= "" then

${pre}
@ end

${sort_key}

${warp_min}
@ if need_max then

static __device__ __forceinline__ float kiln_warp_max(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float y = __shfl_xor_sync(0xffffffffu, x, o);
        x = x > y ? x : y;
    }
    return x;
}
@ end
@ if need_sum then

static __device__ __forceinline__ double kiln_warp_sum(double x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
@ end

extern "C" __global__ void __launch_bounds__(${WARPS * 32})
${name}(${params})
{
@ for _, p in ipairs(ptrs) do
    ${p}
@ end
    const unsigned lane = threadIdx.x & 31u;
    const unsigned t = blockIdx.x * ${WARPS}u + (threadIdx.x >> 5);
@ if dT then
    if (t >= (unsigned)(${dT}))
        return; /* past the run-time token count */
@ elseif T % WARPS ~= 0 then
    if (t >= ${T}u)
        return;
@ end
@ if T == 1 and not dT then
    (void)t;
@ end
    float p[${NPL}];
    unsigned long long key[${NPL}];
#pragma unroll
    for (unsigned i = 0; i < ${NPL}u; i++) {
        const unsigned e = i * 32u + lane;
@ if E % 32 == 0 then
@ if not x_uses_e then
        (void)e;
@ end
        p[i] = ${load_x};
@ else
        p[i] = e < ${E}u ? ${load_x} : -__int_as_float(0x7f800000);
@ end
    }
@ if gating == "softmax" then
    /* softmax over the row: max, expf in f32, the sum in double, times (float)(1.0 / sum) */
    float mx = p[0];
#pragma unroll
    for (unsigned i = 1; i < ${NPL}u; i++)
        mx = mx > p[i] ? mx : p[i];
    mx = kiln_warp_max(mx);
    double sum = 0.0;
#pragma unroll
    for (unsigned i = 0; i < ${NPL}u; i++) {
@ if E % 32 == 0 then
        p[i] = expf(p[i] - mx);
@ else
        p[i] = i * 32u + lane < ${E}u ? expf(p[i] - mx) : 0.0f;
@ end
        sum += (double)p[i];
    }
    const float inv = (float)(1.0 / kiln_warp_sum(sum));
#pragma unroll
    for (unsigned i = 0; i < ${NPL}u; i++)
        p[i] = p[i] * inv;
@ elseif gating == "sigmoid" then
#pragma unroll
    for (unsigned i = 0; i < ${NPL}u; i++)
        p[i] = 1.0f / (1.0f + expf(-p[i]));
@ end
    /* keys: complemented value pattern (descending) above, expert index below */
#pragma unroll
    for (unsigned i = 0; i < ${NPL}u; i++) {
        const unsigned e = i * 32u + lane;
@ if bias then
        const float s = p[i] + ${load_b};
@ else
        const float s = p[i];
@ end
@ if E % 32 == 0 then
        key[i] = (unsigned long long)(~kiln_sort_key(s)) << 32 | e;
@ else
        key[i] = e < ${E}u ? (unsigned long long)(~kiln_sort_key(s)) << 32 | e : ~0ull;
@ end
    }
    unsigned long long best = key[0];
    float bestp = p[0];
#pragma unroll
    for (unsigned i = 1; i < ${NPL}u; i++)
        if (key[i] < best) {
            best = key[i];
            bestp = p[i];
        }
    int id = 0;
    float w = 0.0f;
    for (unsigned j = 0; j < ${K}u; j++) {
        const unsigned long long m = kiln_warp_min(best);
        const float v = __shfl_sync(0xffffffffu, bestp, (unsigned)m & 31u);
        if (lane == j) {
            id = (int)(unsigned)m;
            w = v;
        }
        if (best == m) {
            best = ~0ull;
#pragma unroll
            for (unsigned i = 0; i < ${NPL}u; i++) {
                if (key[i] == m)
                    key[i] = ~0ull;
                if (key[i] < best) {
                    best = key[i];
                    bestp = p[i];
                }
            }
        }
    }
@ if delayed then
    /* delayed softmax over the k selected logits */
    {
        const float x = lane < ${K}u ? w : -__int_as_float(0x7f800000);
        const float wm = kiln_warp_max(x);
        const float ex = lane < ${K}u ? expf(x - wm) : 0.0f;
        w = ex * (float)(1.0 / kiln_warp_sum((double)ex));
    }
@ end
@ if norm then
    /* w / sum of the k weights (summed in double, rounded to f32${clamp and ", clamped" or ""}) */
    {
        float s = (float)kiln_warp_sum(lane < ${K}u ? (double)w : 0.0);
@ if clamp then
        s = fmaxf(fminf(s, ${clamp_hi}), ${clamp_lo});
@ end
        w = w / s;
    }
@ end
@ if scaled then
    w = w * ${scale} + 0.0f;
@ end
@ if K < 32 then
    if (lane < ${K}u) {
        ids[${ids_off}] = id;
        out[${out_off}] = ${store_w};
    }
@ else
    ids[${ids_off}] = id;
    out[${out_off}] = ${store_w};
@ end
}
]]

return function(k)
    if k.kind ~= "op" or k.fused ~= "topk_moe" or type(k.moe) ~= "table" then fail("not a topk_moe node") end
    local m, a, dst, ids = k.moe, k.args.a, k.dst, k.dst2
    if not a then fail("no logits operand") end
    check_ref(a, "logits", prelude.ctype)
    check_ref(dst, "weights", prelude.ctype)
    check_ref(ids, "ids", { i32 = true })
    local E, K = a.ne[1], m.k
    local T = ids.ne[2]
    if math.type(K) ~= "integer" or K < 1 or K > MAX_K or K > E then fail("k %s for %d experts", tostring(K), E) end
    if E > MAX_E then fail("%d experts (at most %d)", E, MAX_E) end
    if a.ne[2] ~= T or a.ne[3] ~= 1 or a.ne[4] ~= 1 then fail("logits %s for %d token rows", dims(a.ne), T) end
    if ids.ne[1] ~= K or ids.ne[3] ~= 1 or ids.ne[4] ~= 1 then fail("ids %s for k %d", dims(ids.ne), K) end
    if T > 2147483647 then fail("%d token rows", T) end
    -- weights are [k, T] or [1, k, T]
    local kd, td
    if dst.ne[1] == K and dst.ne[2] == T and dst.ne[3] == 1 then kd, td = 1, 2
    elseif dst.ne[1] == 1 and dst.ne[2] == K and dst.ne[3] == T then kd, td = 2, 3
    else fail("weights %s for k %d and %d rows", dims(dst.ne), K, T) end
    if dst.ne[4] ~= 1 then fail("weights %s", dims(dst.ne)) end
    local bias = m.bias
    if bias then
        check_ref(bias, "bias", prelude.ctype)
        if (bias.ne[1] ~= 1 and bias.ne[1] ~= E) or (bias.ne[2] ~= 1 and bias.ne[2] ~= T) or bias.ne[3] ~= 1 or bias.ne[4] ~= 1 then
            fail("bias %s does not broadcast to [%d, %d]", dims(bias.ne), E, T)
        end
    end
    -- Symbolic dims: the token rows only (logits, bias, weights and ids).
    local dyn, dyn_only = kit.ext, kit.dyn_checker(fail)
    dyn_only(a, "logits", { [2] = true })
    dyn_only(ids, "ids", { [2] = true })
    dyn_only(dst, "weights", { [td] = true })
    if bias then dyn_only(bias, "bias", { [2] = true }) end
    local dT = dyn(a, 2) or dyn(ids, 2) or dyn(dst, td) or (bias and dyn(bias, 2))
    local gating = m.delayed and "none" or m.gating
    if gating ~= "softmax" and gating ~= "sigmoid" and gating ~= "none" then fail("gating %s", tostring(m.gating)) end

    local nparams = k.nparams
    local plist = {}
    for p = 0, nparams - 1 do
        local w = p == dst.param or p == ids.param
        plist[#plist + 1] = (w and "char" or "const char") .. " *__restrict__ p" .. p
    end
    local params = table.concat(plist, ", ")
    if dT then params = params .. (k.dims_arg or ", const int *__restrict__ kdims") end
    local function ptr(r, var, typ, const)
        kit.check_param(fail, r, var, nparams)
        return kit.pointer(r, var, typ, const, kit.ll)
    end
    if dst.param == ids.param then fail("weights and ids share a buffer") end
    local ptrs = { ptr(dst, "out", prelude.ctype[dst.type], false), ptr(ids, "ids", "int", false),
        ptr(a, "in", prelude.ctype[a.type], true) }
    if bias then ptrs[#ptrs + 1] = ptr(bias, "bias", prelude.ctype[bias.type], true) end

    local pre = prelude.new()
    local load_x = pre.load(a.type, "in[" .. offset({ { "e", E, E, a.st[1] }, { "t", T, T, a.st[2] } }) .. "]")
    local load_b = bias and pre.load(bias.type, "bias[" .. offset({ { "e", bias.ne[1], E, bias.st[1] },
        { "t", bias.ne[2], T, bias.st[2] } }) .. "]")
    local store_w = pre.store(dst.type, "w")

    local flags = {}
    if bias then flags[#flags + 1] = "bias" end
    if m.norm then flags[#flags + 1] = m.clamp and "normc" or "norm" end
    if m.scaled then flags[#flags + 1] = "scale" end
    local name = "topk_moe_" .. (m.delayed and "delayed" or m.gating) .. "_" .. a.type .. "_e" .. E .. "_k" .. K
    if #flags > 0 then name = name .. "_" .. table.concat(flags, "_") end

    local what = {}
    what[#what + 1] = m.delayed and "top-k of the logits, softmax of the selected" or (m.gating .. " gating")
    if bias then what[#what + 1] = "selection bias" end
    if m.norm then what[#what + 1] = "normalized" .. (m.clamp and (" (sum clamped to [" .. m.clamp_lo .. ", " .. m.clamp_hi .. "])") or "") end
    if m.scaled then what[#what + 1] = "scaled by " .. m.scale end

    local WARPS = math.min(MAX_WARPS, T)
    local grid = (T + WARPS - 1) // WARPS
    local src = kernel {
        name = name, what = table.concat(what, ", "), a = a, bias = bias, dst = dst, ids = ids, dims = dims,
        T = T, E = E, K = K, NPL = (E + 31) // 32, WARPS = WARPS, grid = grid,
        params = params, ptrs = ptrs, dT = dT, load_x = load_x, load_b = load_b,
        x_uses_e = E > 1 and a.st[1] ~= 0, gating = gating, delayed = m.delayed, norm = m.norm, clamp = m.clamp, scaled = m.scaled,
        clamp_lo = m.clamp_lo, clamp_hi = m.clamp_hi, scale = m.scale,
        need_max = gating == "softmax" or m.delayed, need_sum = gating == "softmax" or m.delayed or m.norm,
        ids_off = offset({ { "lane", K, K, ids.st[1] }, { "t", T, T, ids.st[2] } }),
        out_off = offset({ { "lane", K, K, dst.st[kd] }, { "t", T, T, dst.st[td] } }),
        store_w = store_w, pre = (pre.code():gsub("\n$", "")),
        sort_key = SORT_KEY, warp_min = kit.WARP_MIN_HELPER,
    }
    return { name = name, source = src, grid = { grid, 1, 1 }, block = { WARPS * 32, 1, 1 }, smem = 0,
        fused = "topk_moe", dynamic = dT and true or nil }
end
