-- prelude: CUDA helpers shared by kernels. No #include: NVRTC needs no include path, and the
-- source (hence the cache key) depends on nothing outside kiln.
--
-- f16 (IEEE binary16) and bf16 values are stored as unsigned short; arithmetic is f32.
-- Conversions round to nearest even, like kb_f32_to_f16 / kb_f32_to_bf16 (base/half.c).
--
-- prelude.new() returns a recorder for one kernel: expressions built with its load, store and
-- round functions note the helpers they call, and its code() returns just those helpers.

local M = {}

M.ctype = { f32 = "float", f16 = "unsigned short", bf16 = "unsigned short" }

-- The helpers, in the order they are emitted, each with the helpers it calls.
local HELPERS = {
    { name = "f16_to_f32", deps = {}, code = [[
static __device__ __forceinline__ float kiln_f16_to_f32(unsigned short h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
]] },
    { name = "f32_to_f16", deps = {}, code = [[
static __device__ __forceinline__ unsigned short kiln_f32_to_f16(float f)
{
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
]] },
    { name = "round_f16", deps = { "f16_to_f32", "f32_to_f16" }, code = [[
static __device__ __forceinline__ float kiln_round_f16(float f)
{
    return kiln_f16_to_f32(kiln_f32_to_f16(f));
}
]] },
    { name = "bf16_to_f32", deps = {}, code = [[
static __device__ __forceinline__ float kiln_bf16_to_f32(unsigned short h)
{
    return __uint_as_float((unsigned)h << 16);
}
]] },
    { name = "f32_to_bf16", deps = {}, code = [[
static __device__ __forceinline__ unsigned short kiln_f32_to_bf16(float f)
{
#if __CUDA_ARCH__ >= 800
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (unsigned short)((u >> 16) | 0x40u); /* NaN stays NaN (quiet) */
    u += 0x7fffu + ((u >> 16) & 1u);                /* round to nearest even */
    return (unsigned short)(u >> 16);
#endif
}
]] },
    { name = "round_bf16", deps = { "bf16_to_f32", "f32_to_bf16" }, code = [[
static __device__ __forceinline__ float kiln_round_bf16(float f)
{
    return kiln_bf16_to_f32(kiln_f32_to_bf16(f));
}
]] },
}

-- A recorder of the helpers one kernel uses: its load/store/round return expressions and note
-- the helpers they call; code() returns exactly those helpers (so NVRTC sees no unused function).
function M.new()
    local used = {}
    local P = {}
    local function use(name, expr)
        used[name] = true
        return "kiln_" .. name .. "(" .. expr .. ")"
    end
    -- The f32 value of element `e` (a C lvalue) stored as type t.
    function P.load(t, e)
        if t == "f32" then return e end
        return use(t .. "_to_f32", e)
    end
    -- f32 value v converted to type t for a store.
    function P.store(t, v)
        if t == "f32" then return v end
        return use("f32_to_" .. t, v)
    end
    -- v rounded to type t, still f32.
    function P.round(t, v)
        if t == "f32" then return v end
        return use("round_" .. t, v)
    end
    -- The helpers used so far, "" if none.
    function P.code()
        local need = {}
        for _, h in ipairs(HELPERS) do
            if used[h.name] then
                need[h.name] = true
                for _, d in ipairs(h.deps) do need[d] = true end
            end
        end
        local parts = {}
        for _, h in ipairs(HELPERS) do
            if need[h.name] then parts[#parts + 1] = h.code end
        end
        return table.concat(parts, "\n")
    end
    return P
end

return M
