-- sample: the kernel template of the sample family (op sample); docs/templates.md describes the
-- table k of IR_OP nodes, docs/ops-sample.md the op, docs/sampling.md ("On the GPU") why every
-- line is what it is: the kernels pick exactly the token kiln_sample (model/sampler.c) picks.
--
-- Two steps over a scratch:
--  1. slices: B blocks, each sorting a slice of S logits as 64-bit keys (the order-preserving
--     bits of the logit, complemented, above the id: ascending keys are the draw order, logit
--     descending then id ascending; NaN and -inf are no candidates and sort last as ~0) with a
--     bitonic sort in shared memory, and writing its first KP keys (KP = K rounded up to a
--     power of two) and the smallest index of a -inf in its slice (the fallback of a row with
--     no candidate) to the scratch.
--  2. pick: one block merges the B sorted lists pairwise in shared memory (the smaller of a[i]
--     and b[KP-1-i] is a bitonic sequence holding the best KP of both; a half-cleaner sorts it)
--     down to the first KP candidates of the row, then runs stages 5-9 of docs/sampling.md on
--     its first K: the exps in parallel (one thread a candidate), every sum and walk on thread
--     0 in the draw order, each float operation one rounded __fadd_rn / __fsub_rn / __fmul_rn /
--     __fdiv_rn (NVRTC would contract a * b + c into an FMA), km_sampler_exp and Philox4x32-10
--     ported operation for operation.
-- Any selection gives the same list (the order is total), so the split into slices only
-- changes the speed. The kernels keep at most MAX_K candidates: a top_k past it (or <= 0 over
-- a longer row) is refused here; the model builder only asks for the op within it.

local kit = require("kit")
local tpl = require("tpl")

local fail = kit.failer("sample")
local check_ref = kit.ref_checker(fail)
local next_pow2, ceil_div = kit.next_pow2, kit.ceil_div

local MAX_K = 256        -- KILN_SAMPLE_GPU_MAX_K (include/kiln.h)
local CAP = 16384        -- keys the pick kernel merges in shared memory (128 KiB)
local MIN_SLICE = 1024   -- logits a slice block sorts at least (fewer blocks for the merge)
local MAX_SLICE = 16384  -- and at most (128 KiB of keys)

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

local slices_kernel = tpl.define [[
${head}
${key_helper}

extern "C" __global__ void __launch_bounds__(${T})
${name}(${params})
{
    const float *const in = (const float *)p${a.param}${aoffs};
    unsigned long long *const keys = (unsigned long long *)p${sp};
    unsigned *const ninf = (unsigned *)(keys + ${B * KP}u);
    extern __shared__ unsigned long long s[];
    __shared__ unsigned s_inf;
    if (threadIdx.x == 0)
        s_inf = 0xffffffffu;
    __syncthreads();
    const unsigned base = blockIdx.x * ${S}u;
    for (unsigned t = threadIdx.x; t < ${S}u; t += ${T}u) {
        const unsigned i = base + t;
        unsigned long long key = ~0ull;
@ if partial then
        if (i < ${N}u) {
@ else
        {
@ end
            const float x = ${load};
            if (x > __int_as_float(0xff800000))
                key = kiln_sample_key(x, i);
            else if (x == __int_as_float(0xff800000))
                atomicMin(&s_inf, i);
        }
        s[t] = key;
    }
    __syncthreads();
@ if S > 1 then
    /* Bitonic sort of the slice, ascending. */
    for (unsigned size = 2; size <= ${S}u; size <<= 1) {
        for (unsigned j = size >> 1; j > 0; j >>= 1) {
            for (unsigned w = threadIdx.x; w < ${S // 2}u; w += ${T}u) {
                const unsigned i = ((w & ~(j - 1u)) << 1) | (w & (j - 1u));
                const unsigned long long x = s[i], y = s[i + j];
                if ((x > y) == ((i & size) == 0u)) {
                    s[i] = y;
                    s[i + j] = x;
                }
            }
            __syncthreads();
        }
    }
@ end
    for (unsigned t = threadIdx.x; t < ${KP}u; t += ${T}u)
        keys[blockIdx.x * ${KP}u + t] = s[t];
    if (threadIdx.x == 0)
        ninf[blockIdx.x] = s_inf;
}
]]

local pick_kernel = tpl.define [[
${head}
${pick_helpers}

extern "C" __global__ void __launch_bounds__(${T})
${name}(${params})
{
    int *const out = (int *)p${dst.param}${doffs};
@ if not greedy then
    const int *const pos = (const int *)p${pos.param}${poffs};
@ end
    const unsigned long long *const keys = (const unsigned long long *)p${sp};
    const unsigned *const ninf = (const unsigned *)(keys + ${B * KP}u);
    extern __shared__ unsigned long long s[];
@ if not greedy then
    __shared__ int s_id[${KP}];
    __shared__ float s_w[${KP}];
@ if use_top_p then
    __shared__ float s_e[${KP}], s_q[${KP}];
    __shared__ float s_z;
@ elseif use_min_p then
    __shared__ float s_e[${KP}];
@ end
@ end
    __shared__ unsigned s_inf;
    if (threadIdx.x == 0)
        s_inf = 0xffffffffu;
    __syncthreads();
    for (unsigned t = threadIdx.x; t < ${BP * KP}u; t += ${T}u)
@ if BP > B then
        s[t] = t < ${B * KP}u ? keys[t] : ~0ull;
@ else
        s[t] = keys[t];
@ end
    for (unsigned t = threadIdx.x; t < ${B}u; t += ${T}u)
        atomicMin(&s_inf, ninf[t]);
    __syncthreads();
@ if BP > 1 then
    /* Level l merges lists 2m and 2m+1 (of KP keys, ${KP} << l apart) into list 2m's place. */
    for (unsigned l = 0; (${BP}u >> l) > 1u; l++) {
        const unsigned pairs = ${BP}u >> (l + 1u);
        for (unsigned w = threadIdx.x; w < pairs * ${KP}u; w += ${T}u) {
            const unsigned m = w / ${KP}u, i = w % ${KP}u;
            unsigned long long *const a = s + (((2u * m) << l) * ${KP}u);
            const unsigned long long y = a[(${KP}u << l) + ${KP - 1}u - i];
            if (y < a[i])
                a[i] = y;
        }
        __syncthreads();
@ if KP > 1 then
        for (unsigned j = ${KP // 2}u; j > 0; j >>= 1) {
            for (unsigned w = threadIdx.x; w < pairs * ${KP // 2}u; w += ${T}u) {
                const unsigned m = w / ${KP // 2}u, t = w % ${KP // 2}u;
                unsigned long long *const a = s + (((2u * m) << l) * ${KP}u);
                const unsigned i = ((t & ~(j - 1u)) << 1) | (t & (j - 1u));
                const unsigned long long x = a[i], y = a[i + j];
                if (x > y) {
                    a[i] = y;
                    a[i + j] = x;
                }
            }
            __syncthreads();
        }
@ end
    }
@ end
    /* s[0..${K}): the top-k list (stage 4); candidates first, the sentinels ~0 after them. */
    const unsigned nk = (unsigned)__syncthreads_count(threadIdx.x < ${K}u && s[threadIdx.x] != ~0ull);
@ if greedy then
    if (threadIdx.x == 0)
        out[0] = nk > 0u ? (int)(unsigned)s[0] : s_inf != 0xffffffffu ? (int)s_inf : 0;
@ else
    /* Stage 5 and 8's weights, one thread a candidate: 1 for the logits equal to the maximum. */
    const float mx = kiln_sample_logit(s[0]);
    for (unsigned j = threadIdx.x; j < nk; j += ${T}u) {
        const float l = kiln_sample_logit(s[j]);
        s_id[j] = (int)(unsigned)s[j];
@ if use_top_p or use_min_p then
        s_e[j] = l == mx ? 1.0f : kiln_sample_exp(__fsub_rn(l, mx));
@ end
        s_w[j] = l == mx ? 1.0f : kiln_sample_exp(__fdiv_rn(__fsub_rn(l, mx), ${temp}));
    }
    __syncthreads();
@ if use_top_p then
    /* Stage 6: Z summed in the draw order, then each q = e / Z. */
    if (threadIdx.x == 0) {
        float z = 0.0f;
        for (unsigned j = 0; j < nk; j++)
            z = __fadd_rn(z, s_e[j]);
        s_z = z;
    }
    __syncthreads();
    for (unsigned j = threadIdx.x; j < nk; j += ${T}u)
        s_q[j] = __fdiv_rn(s_e[j], s_z);
    __syncthreads();
@ end
    if (threadIdx.x == 0) {
        int tok = s_inf != 0xffffffffu ? (int)s_inf : 0; /* no candidate: kiln_argmax_f32's answer */
        if (nk > 0u) {
            unsigned n = nk;
@ if use_top_p then
            float cum = 0.0f;
            for (unsigned j = 0; j < nk; j++) {
                cum = __fadd_rn(cum, s_q[j]);
                if (cum >= ${top_p}) {
                    n = j + 1u;
                    break;
                }
            }
@ end
@ if use_min_p then
            /* Stage 7: the prefix whose e is at least min_p; the first always stays. */
            unsigned j1 = 1u;
            while (j1 < n && s_e[j1] >= ${min_p})
                j1++;
            n = j1;
@ end
            /* Stages 8-9: W in the draw order, t = u * W, the walk that reaches t. */
            float wsum = 0.0f;
            for (unsigned j = 0; j < n; j++)
                wsum = __fadd_rn(wsum, s_w[j]);
            const unsigned long long position = (unsigned long long)((long long)pos[${last}] + 1ll);
            const float target = __fmul_rn(kiln_sample_uniform(position, ${seed_lo}u, ${seed_hi}u), wsum);
            float acc = 0.0f;
            unsigned pick = n - 1u;
            for (unsigned j = 0; j < n; j++) {
                acc = __fadd_rn(acc, s_w[j]);
                if (acc >= target) {
                    pick = j;
                    break;
                }
            }
            tok = s_id[pick];
        }
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
    -- Slices: as short as the merge's room allows (more blocks, shorter sorts).
    local S = math.max(MIN_SLICE, next_pow2(ceil_div(n * KP, CAP)))
    S = math.max(KP, math.min(S, next_pow2(n)))
    if S > MAX_SLICE then
        fail("a row of %d logits with %d candidates needs slices of %d logits, past %d", n, K, S, MAX_SLICE)
    end
    local B = ceil_div(n, S)
    local BP = next_pow2(B)
    local T1 = math.min(1024, math.max(32, S // 2))
    local T2 = math.min(1024, math.max(64, KP, BP * KP // 2))
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
        string.format(" * %d block%s of %d threads, each a slice of %d logits sorted as keys (bitonic, shared memory);",
            B, B == 1 and "" or "s", T1, S),
        string.format(" * its first %d keys and its first -inf to the scratch */", KP),
    }, "\n")
    local src1 = slices_kernel({
        head = head1, key_helper = HELPERS_KEY, name = n1, params = params, T = T1, a = a, aoffs = offs(a),
        sp = k.nparams, B = B, KP = KP, S = S, N = n, partial = n % S ~= 0, load = load,
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
        string.format(" * merges %d sorted lists of %d keys in shared memory (%d threads), then stages 5-9 of", B, KP, T2),
        " * docs/sampling.md on the first K: " .. chain,
        string.format(" * pos i32 ne %s st %s offs %d: the pick's position is pos[%s] + 1 */", kit.dims(pos.ne),
            kit.dims(pos.st), pos.offs, dyn_n and (dyn_n .. " - 1") or tostring(pos.ne[1] - 1)),
    }, "\n")
    local src2 = pick_kernel({
        head = head2, pick_helpers = greedy and "" or HELPERS_PICK, name = n2, params = params, T = T2, dst = dst,
        doffs = offs(dst), pos = pos, poffs = offs(pos), sp = k.nparams, B = B, BP = BP, KP = KP, K = K,
        greedy = greedy, use_top_p = top_p, use_min_p = min_p, temp = k.params.temp, top_p = k.params.top_p,
        min_p = k.params.min_p, seed_lo = u32(k.params.seed_lo), seed_hi = u32(k.params.seed_hi), last = last,
    })
    return {
        scratch = B * KP * 8 + B * 4,
        steps = {
            { name = n1, source = src1, grid = { B, 1, 1 }, block = { T1, 1, 1 }, smem = S * 8 },
            { name = n2, source = src2, grid = { 1, 1, 1 }, block = { T2, 1, 1 }, smem = BP * KP * 8 },
        },
        dynamic = dynamic or nil,
    }
end
