-- sample: the kernel template of the sample family (op sample); docs/templates.md describes the
-- table k of IR_OP nodes, docs/ops-sample.md the op, docs/sampling.md ("On the GPU") why every
-- line is what it is: the kernels pick exactly the token kiln_sample (model/sampler.c) picks.
--
-- The row's logits are 64-bit keys: the order-preserving bits of the logit, complemented, above
-- the id, so ascending keys are the draw order (logit descending, then id ascending) and no two
-- keys are equal; NaN and -inf are no candidates (the sentinel ~0). Two steps over a scratch:
--  1. slices: B blocks, each holding a slice of S keys in registers and selecting its K smallest
--     by a radix select (8-bit digits from the top, a shared histogram a pass, ending as soon as
--     the digit that holds the K-th key is taken whole), then writing them (in no order, padded
--     with ~0 to K) and the smallest index of a -inf in its slice (the fallback of a row with no
--     candidate) to the scratch.
--  2. pick: one block holds the B lists in registers, selects the K smallest again, sorts them
--     by rank (each key's rank is the count of smaller keys), then runs stages 5-9 of
--     docs/sampling.md on them: the exps in parallel (one thread a candidate), the running sums
--     on thread 0 in the draw order (zeros past the candidates add nothing), the searches by
--     warp 0's ballots, each float operation one rounded __fadd_rn / __fsub_rn / __fmul_rn /
--     __fdiv_rn (NVRTC would contract a * b + c into an FMA), km_sampler_exp and Philox4x32-10
--     ported operation for operation.
-- The K smallest keys of the row are among the union of each slice's K smallest, and the order
-- is total, so the split into slices only changes the speed (an H100 measured the bitonic
-- sort-and-merge this replaced at 32 us a token for 128256 logits). The kernels keep at most
-- MAX_K candidates: a top_k past it (or <= 0 over a longer row) is refused here; the model
-- builder only asks for the op within it.

local kit = require("kit")
local tpl = require("tpl")

local fail = kit.failer("sample")
local check_ref = kit.ref_checker(fail)
local next_pow2, ceil_div = kit.next_pow2, kit.ceil_div

local MAX_K = 256        -- KILN_SAMPLE_GPU_MAX_K (include/kiln.h)
local PICK_KEYS = 8192   -- keys the pick block holds at most (in registers, 8 a thread of 1024)
local MIN_SLICE = 1024   -- logits a slice block holds at least (4 a thread of 256): fewer lists
local MAX_SLICE = 16384  -- and at most (16 a thread of 1024)

local HELPERS_KEY = [[
/* The draw order as an unsigned 64-bit order: the logit's bits made monotonic (-0 read as +0),
 * complemented so that larger logits come first, above the id (ties by id, ascending). */
static __device__ __forceinline__ unsigned long long kiln_sample_key(float x, unsigned i)
{
    unsigned b = __float_as_uint(x == 0.0f ? 0.0f : x);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return (unsigned long long)~b << 32 | i;
}]]

local HELPERS_PICK = [[
/* The logit of a key (kiln_sample_key's inverse; -0 comes back as +0, which computes the same). */
static __device__ __forceinline__ float kiln_sample_logit(unsigned long long key)
{
    unsigned b = ~(unsigned)(key >> 32);
    b = (b & 0x80000000u) ? (b & 0x7fffffffu) : ~b;
    return __uint_as_float(b);
}

/* km_sampler_exp (model/sampler.c), x <= 0: Cody-Waite reduction, Cephes' polynomial, 2^n from
 * its bits; the constants are its floats, bit for bit. */
static __device__ __forceinline__ float kiln_sample_exp(float x)
{
    if (!(x >= -86.0f))
        return 0.0f;
    if (x > 0.0f)
        x = 0.0f;
    const float t = __fmul_rn(x, __int_as_float(0x3fb8aa3b)); /* log2 e */
    const float n = rintf(t);                                  /* half to even */
    const float a = __fmul_rn(n, __int_as_float(0x3f318000)); /* C1 */
    float r = __fsub_rn(x, a);
    const float b = __fmul_rn(n, __int_as_float(0xb95e8083)); /* C2 */
    r = __fsub_rn(r, b);
    const float z = __fmul_rn(r, r);
    float y = __fmul_rn(__int_as_float(0x39506967), r);       /* P0 */
    y = __fadd_rn(y, __int_as_float(0x3ab743ce));             /* P1 */
    y = __fmul_rn(y, r);
    y = __fadd_rn(y, __int_as_float(0x3c088908));             /* P2 */
    y = __fmul_rn(y, r);
    y = __fadd_rn(y, __int_as_float(0x3d2aa9c1));             /* P3 */
    y = __fmul_rn(y, r);
    y = __fadd_rn(y, __int_as_float(0x3e2aaaaa));             /* P4 */
    y = __fmul_rn(y, r);
    y = __fadd_rn(y, 0.5f);                                    /* P5 */
    y = __fmul_rn(y, z);
    y = __fadd_rn(y, r);
    y = __fadd_rn(y, 1.0f);
    return __fmul_rn(y, __int_as_float(((int)n + 127) << 23));
}

/* Warp 0's search: the first j in [from, n) where v[j] >= t (ge) or v[j] < t (not ge), else n;
 * every lane returns it. */
static __device__ __forceinline__ unsigned kiln_sample_first(unsigned lane, unsigned n, const float *v, float t,
                                                             bool ge, unsigned from)
{
    for (unsigned j0 = from; j0 < n; j0 += 32u) {
        const unsigned j = j0 + lane;
        const bool hit = j < n && (ge ? v[j] >= t : v[j] < t);
        const unsigned b = __ballot_sync(0xffffffffu, hit);
        if (b)
            return j0 + (unsigned)(__ffs(b) - 1);
    }
    return n;
}

/* km_sampler_uniform: Philox4x32-10 at counter (position, 0, 0), key (seed lo, seed hi); word 0's
 * top 24 bits times 2^-24 (exact). */
static __device__ __forceinline__ float kiln_sample_uniform(unsigned long long position, unsigned k0, unsigned k1)
{
    unsigned c0 = (unsigned)position, c1 = (unsigned)(position >> 32), c2 = 0u, c3 = 0u;
#pragma unroll
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const unsigned hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const unsigned hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    return __fmul_rn(__uint2float_rn(c0 >> 8), __int_as_float(0x33800000));
}]]

-- The block's `need` smallest keys (need >= 1, fewer than its valid keys; R a thread, ~0 not
-- counted), as the test (key & pmask) <= prefix: MSB-first 8-bit digits, a shared histogram of
-- the keys still tied with the prefix each pass, warp 0 scanning it in ascending order for the
-- digit that holds the need-th key. Keys are distinct, so at the latest the last digit holds
-- exactly one: the loop ends when the chosen digit's keys are all needed. Every thread takes
-- the same branches (the shared control words), as __syncthreads requires.
local HELPERS_SELECT = [[
template <int R>
static __device__ __forceinline__ void kiln_sample_select(const unsigned long long (&k)[R], unsigned need,
                                                          unsigned *hist2, unsigned *ctl,
                                                          unsigned long long &prefix, unsigned long long &pmask)
{
    prefix = 0ull;
    pmask = 0ull;
    for (unsigned t = threadIdx.x; t < 256u; t += blockDim.x)
        hist2[t] = 0u;
    __syncthreads();
    for (int shift = 56, pass = 0; shift >= 0; shift -= 8, pass++) {
        /* Two halves: this pass counts in one while clearing the other, which the last pass
         * counted in (read before the barrier that ended it): two barriers a pass. */
        unsigned *const hist = hist2 + (pass & 1) * 256;
        for (unsigned t = threadIdx.x; t < 256u; t += blockDim.x)
            hist2[((pass + 1) & 1) * 256 + t] = 0u;
        /* The keys still tied crowd into few digits (a row's logits share their exponent, so
         * the first pass sees a handful): the warp adds its largest groups with one atomic each
         * (ballots; __match_any_sync measured slower on an H100), its other lanes one by one. */
#pragma unroll
        for (int r = 0; r < R; r++) {
            const unsigned d = k[r] != ~0ull && (k[r] & pmask) == prefix ? (unsigned)(k[r] >> shift) & 255u : 256u;
            const unsigned lane = threadIdx.x & 31u;
            unsigned pending = __ballot_sync(0xffffffffu, d < 256u);
#pragma unroll
            for (int g = 0; g < 2 && pending; g++) {
                const unsigned lead = (unsigned)(__ffs(pending) - 1);
                const unsigned ld = __shfl_sync(0xffffffffu, d, lead);
                const unsigned same = __ballot_sync(0xffffffffu, d == ld) & pending;
                if (lane == lead)
                    atomicAdd(&hist[ld], (unsigned)__popc(same));
                pending &= ~same;
            }
            if ((pending >> lane) & 1u)
                atomicAdd(&hist[d], 1u);
        }
        __syncthreads();
        if (threadIdx.x < 32u) {
            const unsigned l = threadIdx.x;
            unsigned c[8], sum = 0u;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                c[i] = hist[l * 8u + i];
                sum += c[i];
            }
            unsigned incl = sum;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned v = __shfl_up_sync(0xffffffffu, incl, o);
                if (l >= (unsigned)o)
                    incl += v;
            }
            unsigned before = incl - sum;
            if (before < need && need <= incl) {
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    if (before < need && need <= before + c[i]) {
                        ctl[0] = l * 8u + i;
                        ctl[1] = need - before;
                        ctl[2] = c[i];
                    }
                    before += c[i];
                }
            }
        }
        __syncthreads();
        const unsigned digit = ctl[0], left = ctl[1], count = ctl[2];
        prefix |= (unsigned long long)digit << shift;
        pmask |= 255ull << shift;
        need = left;
        if (count == left)
            break;
    }
}

/* Both steps' selection: the block's counts (one atomic a warp), then its `want` smallest keys
 * (fewer when fewer are valid) written to out in no order; returns how many. inf is the
 * thread's smallest -inf index, folded into *s_inf. */
template <int R>
static __device__ __forceinline__ unsigned kiln_sample_take(const unsigned long long (&k)[R], unsigned valid,
                                                            unsigned inf, unsigned want, unsigned *s_hist,
                                                            unsigned *s_ctl, unsigned *s_valid, unsigned *s_out,
                                                            unsigned *s_inf, unsigned long long *out)
{
    inf = __reduce_min_sync(0xffffffffu, inf);
    valid = __reduce_add_sync(0xffffffffu, valid);
    if ((threadIdx.x & 31u) == 0u) {
        if (inf != 0xffffffffu)
            atomicMin(s_inf, inf);
        if (valid)
            atomicAdd(s_valid, valid);
    }
    __syncthreads();
    const unsigned nv = *s_valid, need = nv < want ? nv : want;
    unsigned long long prefix = 0ull, pmask = 0ull;
    if (need < nv)
        kiln_sample_select<R>(k, need, s_hist, s_ctl, prefix, pmask);
#pragma unroll
    for (int r = 0; r < R; r++)
        if (k[r] != ~0ull && (k[r] & pmask) <= prefix)
            out[atomicAdd(s_out, 1u)] = k[r];
    return need;
}]]

local slices_kernel = tpl.define [[
${head}
${key_helper}
${select_helper}

extern "C" __global__ void __launch_bounds__(${T})
${name}(${params})
{
    const float *const in = (const float *)p${a.param}${aoffs};
    unsigned long long *const keys = (unsigned long long *)p${sp} + blockIdx.x * ${K}u;
    unsigned *const ninf = (unsigned *)((unsigned long long *)p${sp} + ${B * K}u);
    __shared__ unsigned s_hist[512], s_ctl[3], s_valid, s_out, s_inf;
    if (threadIdx.x == 0) {
        s_inf = 0xffffffffu;
        s_valid = 0u;
        s_out = 0u;
    }
    __syncthreads();
    /* Every load first: an atomic between two of them would keep the second behind it. */
    float x[${R}];
#pragma unroll
    for (int r = 0; r < ${R}; r++) {
        const unsigned i = blockIdx.x * ${S}u + (unsigned)r * ${T}u + threadIdx.x;
@ if partial then
        x[r] = i < ${N}u ? ${load} : __int_as_float(0x7fc00000); /* past the row: NaN, no candidate */
@ else
        x[r] = ${load};
@ end
    }
    unsigned long long k[${R}];
    unsigned valid = 0u, inf = 0xffffffffu;
#pragma unroll
    for (int r = 0; r < ${R}; r++) {
        const unsigned i = blockIdx.x * ${S}u + (unsigned)r * ${T}u + threadIdx.x;
        k[r] = ~0ull;
        if (x[r] > __int_as_float(0xff800000)) {
            k[r] = kiln_sample_key(x[r], i);
            valid++;
        } else if (x[r] == __int_as_float(0xff800000) && i < inf) {
            inf = i;
        }
    }
    const unsigned need = kiln_sample_take<${R}>(k, valid, inf, ${K}u, s_hist, s_ctl, &s_valid, &s_out, &s_inf, keys);
    for (unsigned t = need + threadIdx.x; t < ${K}u; t += ${T}u)
        keys[t] = ~0ull;
    if (threadIdx.x == 0)
        ninf[blockIdx.x] = s_inf;
}
]]

local pick_kernel = tpl.define [[
${head}
${pick_helpers}
${select_helper}

extern "C" __global__ void __launch_bounds__(${T})
${name}(${params})
{
    int *const out = (int *)p${dst.param}${doffs};
@ if not greedy then
    const int *const pos = (const int *)p${pos.param}${poffs};
@ end
    const unsigned long long *const keys = (const unsigned long long *)p${sp};
    const unsigned *const ninf = (const unsigned *)(keys + ${M}u);
    __shared__ unsigned s_hist[512], s_ctl[3], s_valid, s_out, s_inf;
    __shared__ unsigned long long s_top[${KP}], s_key[${KP}];
@ if not greedy then
    __shared__ __align__(16) float s_w[${KP4}], s_W[${KP4}];
@ if use_top_p or use_min_p then
    __shared__ __align__(16) float s_e[${KP4}];
@ end
@ if use_top_p then
    __shared__ __align__(16) float s_q[${KP4}];
    __shared__ float s_z;
@ end
@ end
    if (threadIdx.x == 0) {
        s_inf = 0xffffffffu;
        s_valid = 0u;
        s_out = 0u;
    }
    __syncthreads();
    unsigned long long k[${R}];
    unsigned valid = 0u;
#pragma unroll
    for (int r = 0; r < ${R}; r++) {
        const unsigned t = (unsigned)r * ${T}u + threadIdx.x;
@ if R * T > M then
        k[r] = t < ${M}u ? keys[t] : ~0ull;
@ else
        k[r] = keys[t];
@ end
        valid += k[r] != ~0ull;
    }
    unsigned inf = 0xffffffffu;
    for (unsigned t = threadIdx.x; t < ${B}u; t += ${T}u)
        inf = min(inf, ninf[t]);
    const unsigned nk = kiln_sample_take<${R}>(k, valid, inf, ${K}u, s_hist, s_ctl, &s_valid, &s_out, &s_inf, s_top);
    __syncthreads();
    /* Stage 4's list in the draw order: each key lands at its rank (keys are distinct). */
    for (unsigned j = threadIdx.x; j < nk; j += ${T}u) {
        const unsigned long long key = s_top[j];
        unsigned rank = 0u;
#pragma unroll 8
        for (unsigned i = 0; i < nk; i++)
            rank += s_top[i] < key;
        s_key[rank] = key;
    }
    __syncthreads();
@ if greedy then
    if (threadIdx.x == 0)
        out[0] = nk > 0u ? (int)(unsigned)s_key[0] : s_inf != 0xffffffffu ? (int)s_inf : 0;
@ else
    /* Stage 5 and 8's weights, one thread a candidate (1 for the logits equal to the maximum),
     * zeros past the candidates (x + 0 is x: the chains below run on to a multiple of 4). */
    const float mx = kiln_sample_logit(s_key[0]);
    for (unsigned j = threadIdx.x; j < ${KP4}u; j += ${T}u) {
        const float l = j < nk ? kiln_sample_logit(s_key[j]) : 0.0f;
@ if use_top_p or use_min_p then
        s_e[j] = j >= nk ? 0.0f : l == mx ? 1.0f : kiln_sample_exp(__fsub_rn(l, mx));
@ end
        s_w[j] = j >= nk ? 0.0f : l == mx ? 1.0f : kiln_sample_exp(__fdiv_rn(__fsub_rn(l, mx), ${temp}));
    }
    __syncthreads();
    /* The sums in the draw order, each one chain on thread 0: W[j], the running sum of the
     * weights, is both stage 9's walk (acc after j) and, at n - 1, stage 8's W; Z (stage 6)
     * runs beside it. Everything after them is a search, done by warp 0's ballots. */
    /* Four values a shared load (the chains wait on the adds, not on the loads). */
    const unsigned nk4 = (nk + 3u) & ~3u;
    if (threadIdx.x == 0) {
@ if use_top_p then
        float z = 0.0f;
@ end
        float acc = 0.0f;
#pragma unroll 2
        for (unsigned j = 0; j < nk4; j += 4u) {
            const float4 w = *(const float4 *)(s_w + j);
            float4 c;
            c.x = acc = __fadd_rn(acc, w.x);
            c.y = acc = __fadd_rn(acc, w.y);
            c.z = acc = __fadd_rn(acc, w.z);
            c.w = acc = __fadd_rn(acc, w.w);
            *(float4 *)(s_W + j) = c;
@ if use_top_p then
            const float4 e = *(const float4 *)(s_e + j);
            z = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(z, e.x), e.y), e.z), e.w);
@ end
        }
@ if use_top_p then
        s_z = z;
@ end
    }
@ if use_top_p then
    __syncthreads();
    for (unsigned j = threadIdx.x; j < ${KP4}u; j += ${T}u)
        s_q[j] = __fdiv_rn(s_e[j], s_z);
    __syncthreads();
    /* Stage 6's running q, one chain: top-p keeps the first prefix whose sum reaches top_p. */
    if (threadIdx.x == 0) {
        float cum = 0.0f;
#pragma unroll 2
        for (unsigned j = 0; j < nk4; j += 4u) {
            float4 q = *(const float4 *)(s_q + j);
            q.x = cum = __fadd_rn(cum, q.x);
            q.y = cum = __fadd_rn(cum, q.y);
            q.z = cum = __fadd_rn(cum, q.z);
            q.w = cum = __fadd_rn(cum, q.w);
            *(float4 *)(s_q + j) = q;
        }
    }
@ end
    __syncthreads();
    if (threadIdx.x < 32u) {
        const unsigned lane = threadIdx.x;
        int tok = s_inf != 0xffffffffu ? (int)s_inf : 0; /* no candidate: kiln_argmax_f32's answer */
        if (nk > 0u) {
            unsigned n = nk;
@ if use_top_p then
            n = kiln_sample_first(lane, nk, s_q, ${top_p}, true, 0u) + 1u;
            if (n > nk)
                n = nk;
@ end
@ if use_min_p then
            /* Stage 7: the prefix whose e is at least min_p; the first always stays. */
            const unsigned j1 = kiln_sample_first(lane, n, s_e, ${min_p}, false, 1u);
            n = j1 < n ? j1 : n;
@ end
            /* Stages 8-9: t = u * W, the first running sum that reaches it (else the last). */
            const unsigned long long position = (unsigned long long)((long long)pos[${last}] + 1ll);
            const float target = __fmul_rn(kiln_sample_uniform(position, ${seed_lo}u, ${seed_hi}u), s_W[n - 1u]);
            unsigned pick = kiln_sample_first(lane, n, s_W, target, true, 0u);
            if (pick >= n)
                pick = n - 1u;
            tok = (int)(unsigned)s_key[pick];
        }
        if (lane == 0u)
            out[0] = tok;
    }
@ end
}
]]

-- The kernel parameters: the node's buffers (dst's, p0, writable), the scratch, kdims.
local function param_list(k, dynamic)
    local l = {}
    for p = 0, k.nparams - 1 do
        l[#l + 1] = (p == k.dst.param and "char" or "const char") .. " *__restrict__ p" .. p
    end
    l[#l + 1] = "char *__restrict__ p" .. k.nparams
    local s = table.concat(l, ", ")
    if dynamic then s = s .. (k.dims_arg or ", const int *__restrict__ kdims") end
    return s
end

local function offs(r) return r.offs ~= 0 and (" + " .. kit.ll(r.offs)) or "" end

-- K, the candidates stage 4 keeps (docs/sampling.md), or a refusal past MAX_K.
local function plan_k(k, n)
    local temp, top_k = k.values.temp, k.params.top_k
    if math.type(top_k) ~= "integer" or type(temp) ~= "number" then fail("bad parameters") end
    if not (temp > 0) then return 1, true end -- greedy: the first candidate
    local kk = (top_k <= 0 or top_k >= n) and n or top_k
    if kk > MAX_K then
        fail("top_k %d over a row of %d logits keeps %d candidates; the GPU sampler takes 1 <= top_k <= %d "
            .. "(or rows of at most %d logits): sample on the host (kiln_sample) instead", top_k, n, kk, MAX_K, MAX_K)
    end
    return kk, false
end

return function(k)
    if k.kind ~= "op" or k.op ~= "sample" then fail("unknown op %s", tostring(k.op)) end
    local a, pos, dst = k.args.a, k.args.pos, k.dst
    check_ref(a, "a", { f32 = true })
    check_ref(pos, "pos", { i32 = true })
    check_ref(dst, "dst", { i32 = true })
    for _, r in ipairs({ a, pos, dst }) do kit.check_param(fail, r, "operand", k.nparams) end
    local n = a.ne[1]
    if a.ne[2] * a.ne[3] * a.ne[4] ~= 1 or pos.ne[2] * pos.ne[3] * pos.ne[4] ~= 1 or
        dst.ne[1] * dst.ne[2] * dst.ne[3] * dst.ne[4] ~= 1 then
        fail("a %s, pos %s, dst %s: one row of logits and one token", kit.dims(a.ne), kit.dims(pos.ne), kit.dims(dst.ne))
    end
    for d = 1, 4 do
        if kit.ext(a, d) or kit.ext(dst, d) or (d > 1 and kit.ext(pos, d)) then
            fail("only pos's length may be symbolic")
        end
    end
    if n > 2147483647 then fail("a row of %d logits does not fit i32 ids", n) end
    local K, greedy = plan_k(k, n)
    local KP = next_pow2(K)
    -- Slices: as short as the pick's room allows (more blocks, fewer keys each), a row shorter
    -- than one slice in one block of 256 threads.
    local S = math.max(MIN_SLICE, next_pow2(ceil_div(n * K, PICK_KEYS)))
    S = math.min(S, math.max(256, next_pow2(n)))
    if S > MAX_SLICE then
        fail("a row of %d logits with %d candidates needs slices of %d logits, past %d", n, K, S, MAX_SLICE)
    end
    local B = ceil_div(n, S)
    local T1 = math.min(1024, math.max(256, S // 8))
    local R1 = S // T1
    local M = B * K
    local T2 = math.min(1024, math.max(64, ceil_div(ceil_div(M, 4), 32) * 32))
    local R2 = ceil_div(M, T2)
    local dyn_n = kit.ext(pos, 1)
    local dynamic = dyn_n ~= nil
    local params = param_list(k, dynamic)
    local lastix = dyn_n and ("(" .. dyn_n .. " - 1)") or tostring(pos.ne[1] - 1)
    local last = pos.st[1] == 1 and lastix or ("(long long)" .. lastix .. " * " .. kit.ll(pos.st[1]))
    if lastix == "0" then last = "0" end
    local load = a.st[1] == 1 and "in[i]" or ("in[(long long)i * " .. kit.ll(a.st[1]) .. "]")

    local tag = string.format("n%d_s%d_k%d", n, S, KP)
    local n1 = "sample_slices_" .. tag
    local head1 = table.concat({
        "/* kiln sample, step 1 of 2: " .. n1,
        string.format(" * a f32 ne %s st %s offs %d: one row of %d logits", kit.dims(a.ne), kit.dims(a.st), a.offs, n),
        string.format(" * %d block%s of %d threads, each a slice of %d logits as keys (%d a thread), radix-selecting",
            B, B == 1 and "" or "s", T1, S, R1),
        string.format(" * its %d smallest (padded with ~0) and its first -inf to the scratch */", K),
    }, "\n")
    local src1 = slices_kernel({
        head = head1, key_helper = HELPERS_KEY, select_helper = HELPERS_SELECT, name = n1, params = params, T = T1,
        a = a, aoffs = offs(a), sp = k.nparams, B = B, K = K, KP = KP, S = S, R = R1, N = n, partial = n % S ~= 0,
        load = load,
    })

    local u32 = function(v) return string.format("0x%08x", v & 0xffffffff) end
    local top_p = not greedy and k.values.top_p < 1
    local min_p = not greedy and k.values.min_p > 0
    local n2 = "sample_pick_" .. tag .. (greedy and "_greedy" or "")
    local chain
    if greedy then chain = "temp <= 0: greedy, the first candidate"
    else
        chain = string.format("temp %s, top_k %d (K %d), top_p %s%s, min_p %s%s, seed 0x%s%s",
            k.params.temp, k.params.top_k, K, k.params.top_p, top_p and "" or " (off)", k.params.min_p,
            min_p and "" or " (off)", u32(k.params.seed_hi):sub(3), u32(k.params.seed_lo):sub(3))
    end
    local head2 = table.concat({
        "/* kiln sample, step 2 of 2: " .. n2,
        string.format(" * radix-selects the %d smallest of %d lists of %d keys (%d threads, %d keys a thread), sorts", K, B,
            K, T2, R2),
        " * them by rank, then stages 5-9 of docs/sampling.md: " .. chain,
        string.format(" * pos i32 ne %s st %s offs %d: the pick's position is pos[%s] + 1 */", kit.dims(pos.ne),
            kit.dims(pos.st), pos.offs, dyn_n and (dyn_n .. " - 1") or tostring(pos.ne[1] - 1)),
    }, "\n")
    local src2 = pick_kernel({
        head = head2, pick_helpers = greedy and "" or HELPERS_PICK, name = n2, params = params, T = T2, dst = dst,
        doffs = offs(dst), pos = pos, poffs = offs(pos), sp = k.nparams, B = B, M = M, R = R2, KP = KP, K = K,
        select_helper = HELPERS_SELECT, KP4 = math.max(KP, 4),
        greedy = greedy, use_top_p = top_p, use_min_p = min_p, temp = k.params.temp, top_p = k.params.top_p,
        min_p = k.params.min_p, seed_lo = u32(k.params.seed_lo), seed_hi = u32(k.params.seed_hi), last = last,
    })
    return {
        scratch = B * K * 8 + B * 4,
        steps = {
            { name = n1, source = src1, grid = { B, 1, 1 }, block = { T1, 1, 1 } },
            { name = n2, source = src2, grid = { 1, 1, 1 }, block = { T2, 1, 1 } },
        },
        dynamic = dynamic or nil,
    }
end
