-- util: the runtime's utility kernels, which belong to no graph (docs/templates.md, "Utility
-- kernels"). runtime/ instantiates them through cg_util_kernel (codegen/util.c), which compiles
-- and caches them like a program's kernels; k = { kind = "util", kernel = NAME }:
--   * fill_uniform: kiln_session_fill_weights (runtime/fill.c), random weights made on the device.
--     Element e of a weight is base + scale * u, u = (mix(key + e * 0x9e3779b97f4a7c15) >> 40) *
--     2^-23 - 1 with mix splitmix64's finalizer, rounded to nearest even into the weight's type
--     (0 f32, 1 f16, 2 bf16: a parameter, so one kernel serves the three): the bytes
--     kiln_model_write_random (model/random.c) writes into a file. The products and sums are the
--     _rn intrinsics so that NVRTC does not contract them into an FMA, whose single rounding the
--     host's code (two roundings) would not match.
--   * fill_quant: the same for quantized weights: random blocks with a fixed scale (they are not
--     the values a file of kiln gen-model holds; benchmarks only read their bytes).
--   * l2_read: kiln_device_flush_l2 (runtime/device.c) reads a buffer of four times the L2 (the
--     driver has no read-only operation; a memset would leave the L2 full of dirty lines, whose
--     write-back the timed kernel would pay for: about 10% of a 117 MB GEMV on the H100).
-- Both loop over their n elements with a grid stride, so the launch is the caller's: `grid` is
-- the most blocks it launches (fill: min(ceil(n / block), grid); flush: grid). Their sizes are
-- run-time parameters, so each kernel has one source, hence one cache entry per arch. Their
-- callers launch them plainly, outside any CUDA graph: codegen adds no grid-wait prologue.

local kit = require("kit")
local tpl = kit.tpl

local BLOCK = 256
-- Grid-stride caps: the launches these kernels had when they were C strings in runtime/ (fill:
-- 61 GB of weights in well under a second, docs/bench.md), kept so that nothing changes.
local FILL_GRID = 8192
local FLUSH_GRID = 1024

local fail = kit.failer("util")

local fill_uniform = tpl.define [[
// kiln utility kernel ${name}: n elements of base + scale * u(key, e), u uniform in [-1, 1), as
// type 0 f32, 1 f16, 2 bf16 (rounded to nearest even); a grid-stride loop, launched by
// kiln_session_fill_weights with at most ${FILL_GRID} blocks of ${BLOCK} threads
extern "C" __global__ void ${name}(void *dst, unsigned long long n, int type,
                                               unsigned long long key, float scale, float base)
{
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long e = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += step) {
        unsigned long long z = key + e * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        float u = __fadd_rn(__fmul_rn((float)(z >> 40), 1.0f / 8388608.0f), -1.0f);
        float v = __fadd_rn(base, __fmul_rn(scale, u));
        unsigned short h;
        if (type == 0) {
            ((float *)dst)[e] = v;
            continue;
        }
        if (type == 1) asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
        else asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
        ((unsigned short *)dst)[e] = h;
    }
}
]]

local l2_read = tpl.define [[
// kiln utility kernel ${name}: reads n 16-byte words (the L2 flush), launched by
// kiln_device_flush_l2 with ${FLUSH_GRID} blocks of ${BLOCK} threads
extern "C" __global__ void ${name}(const uint4 *p, unsigned long long n, unsigned *sink)
{
    unsigned acc = 0;
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc; /* never (the buffer holds zeros): keeps the loads */
}
]]

local fill_quant = tpl.define [[
// kiln utility kernel ${name}: random blocks of a quantized weight in its device layout
// (templates/quant.lua), one thread a block in a grid-stride loop, launched by
// kiln_session_fill_weights with at most ${FILL_GRID} blocks of ${BLOCK} threads. Each block's
// bytes are random words; the f16 scale (and q4_K/q5_K's min) is set to d (dmin), so values
// span about the weight's scale. split 1: the tiled layout of q8_0/q4_0/q6_K (tiles of 8 blocks:
// the blocks' `words` words, then their f16 scales; the last tile as many as it holds); split 2:
// mxfp4's (tiles of 16, one-byte scales: d is the E8M0 byte); split 3 and 4: q5_0's and q5_1's
// (tiles of 8: the blocks' words, then their 6- or 8-byte heads: d, q5_1's m = dmin, and 32
// random high bits); else `words` words a block whose first holds d and dmin.
extern "C" __global__ void ${name}(unsigned *dst, unsigned long long nblocks, int words, int split,
                                             unsigned long long key, unsigned d, unsigned dmin)
{
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long b = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; b < nblocks; b += step) {
        const unsigned long long tile = split == 2 ? 16ull : 8ull;
        const unsigned long long sb = split == 2 ? 1ull : split == 3 ? 6ull : split == 4 ? 8ull : 2ull;
        const unsigned long long t0 = b / tile * tile, j = b - t0, n = nblocks - t0 < tile ? nblocks - t0 : tile;
        const unsigned long long size = 4ull * words + sb; /* bytes a block (split) */
        unsigned char *tp = (unsigned char *)dst + t0 * size;
        unsigned *p = split ? (unsigned *)(tp + j * 4ull * words) : dst + b * (unsigned long long)words;
        for (int w = 0; w < words; w++) {
            unsigned long long z = key + (b * (unsigned long long)words + (unsigned long long)w) * 0x9e3779b97f4a7c15ull;
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
            p[w] = (unsigned)((z ^ (z >> 31)) >> 16);
        }
        if (split >= 3) { /* (2-byte aligned heads) */
            unsigned short *h = (unsigned short *)(tp + n * 4ull * words + sb * j);
            const unsigned hi = p[0] * 0x9e3779b9u ^ p[words - 1]; /* the high bits, from the body's */
            h[0] = (unsigned short)d;
            if (split == 4)
                h[1] = (unsigned short)dmin;
            h[split - 2] = (unsigned short)hi, h[split - 1] = (unsigned short)(hi >> 16);
        } else if (split == 2)
            tp[n * 4ull * words + j] = (unsigned char)d;
        else if (split)
            *(unsigned short *)(tp + n * 4ull * words + 2ull * j) = (unsigned short)d;
        else
            p[0] = d | (dmin << 16);
    }
}
]]

-- Each kernel: its entry point, its template and its grid cap.
local KERNELS = {
    fill_uniform = { name = "kiln_fill_uniform", text = fill_uniform, grid = FILL_GRID },
    l2_read = { name = "kiln_l2_read", text = l2_read, grid = FLUSH_GRID },
    fill_quant = { name = "kiln_fill_quant", text = fill_quant, grid = FILL_GRID },
}

return function(k)
    if type(k) ~= "table" or k.kind ~= "util" then fail("expected a table of kind \"util\"") end
    local u = KERNELS[k.kernel]
    if not u then fail("unknown utility kernel %s (fill_uniform, l2_read, fill_quant)", tostring(k.kernel)) end
    local env = { name = u.name, BLOCK = BLOCK, FILL_GRID = FILL_GRID, FLUSH_GRID = FLUSH_GRID }
    return { name = u.name, source = u.text(env), grid = { u.grid, 1, 1 }, block = { BLOCK, 1, 1 } }
end
