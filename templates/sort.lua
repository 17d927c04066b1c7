-- sort: the kernel template of the sort family: argsort, argsort_top_k, top_k (see
-- docs/templates.md for the table k of IR_OP nodes, docs/ops-sort.md for the semantics).
--
-- Every element of a row gets a 64-bit key, compared as an unsigned integer: the high half is
-- the value's order-preserving bit pattern (complemented for a descending order), the low half
-- the element's index. Keys are distinct, so every algorithm below produces the same order as
-- the reference's stable sort (ir/ref_sort.c builds the same key), ties and NaN included.
-- Sorting is always ascending by key.
--
-- Four kernel shapes, chosen from the static row length n and k (the kept count: n for argsort):
--
-- * warp (top-k with n <= 1024 and k <= 32, the MoE router case): one warp per row; each lane
--   keeps its ceil(n/32) keys in registers and the warp extracts the minimum k times (a warp
--   reduction each); lane j holds the j-th result and the row's k indices are stored at once.
-- * smem (n <= SMEM_KEYS): R rows per block sorted in shared memory by a bitonic network over
--   the next power of two, the positions beyond n being virtual +inf. The network is the
--   variant whose comparators all put the minimum at the lower position (the first stage of
--   each merge compares i with its mirror i ^ (size-1)), so a comparator whose upper position
--   is >= n would never swap and is skipped: no padding is stored.
-- * global (argsort with n > SMEM_KEYS, and the large-k end of select): one block per row sorts
--   the row's indices in the destination row itself. Chunks of CHUNK keys are sorted in shared
--   memory; each later merge runs its strides >= CHUNK over the destination in global memory
--   (keys gathered from the input through the indices) and its strides < CHUNK chunk by chunk
--   in shared memory again.
-- * select (top-k with n > SMEM_KEYS, k < n): one block per row finds the k-th smallest key by a
--   radix select (8-bit digits, most significant first, a shared histogram per pass; it stops
--   as soon as the bucket holding the k-th key holds exactly the keys still needed), gathers
--   the k keys at or below it (in any order: they are sorted next), and sorts them in shared
--   memory (k <= SMEM_KEYS) or with the global scheme over the destination row.

local kit = require("kit")
local tpl = require("tpl")
local prelude = require("prelude")

local SMEM_KEYS = 5632 -- keys (8 bytes each) a block sorts in shared memory: 44 KiB of the 48 KiB
local CHUNK = 4096     -- chunk of the global scheme (a power of two <= SMEM_KEYS)
local WARP_MAX_N = 1024
local WARP_MAX_K = 32
local WARPS = 4        -- rows (warps) per block of the warp kernel
local SMEM_ROW_TARGET = 2048 -- keys per block the smem kernel aims at by batching short rows
local BIG_BLOCK = 1024 -- threads of the global and select kernels

local fail = kit.failer("sort")

local dims = kit.dims

local pow2_ceil = kit.next_pow2

local function log2(p)
    local l = 0
    while (1 << l) < p do l = l + 1 end
    return l
end

local round_up = kit.round_up

local SORT_KEY = kit.sort_key_helper([[
/* Order-preserving pattern of v: unsigned comparison orders values as numbers, -0 == +0, NaN
 * above +inf. */]])

-- The CUDA helpers every sort kernel uses: the key of an element and one comparator.
local helpers = tpl.define [[
${sort_key}

/* The key of element i of a row: value pattern (${order}) above, index below. */
static __device__ __forceinline__ unsigned long long kiln_key(const ${ct} *__restrict__ row, unsigned i)
{
    const unsigned v = ${complement}kiln_sort_key(${load});
    return (unsigned long long)v << 32 | i;
}

@ if row_ok ~= "" then
/* Whether row r lies below the run-time extents (symbolic dims). */
static __device__ __forceinline__ bool kiln_row_ok(unsigned r, const int *__restrict__ kdims)
{
    return ${row_ok};
}

@ end
/* The row r of the input. */
static __device__ __forceinline__ const ${ct} *kiln_row(const ${ct} *in, unsigned r)
{
@ if row_offset == "0" then
    (void)r;
    return in;
@ else
    return in + (${row_offset});
@ end
}
@ if need_cx then

/* Comparator: the smaller key to position i. */
static __device__ __forceinline__ void kiln_cx(unsigned long long *s, unsigned i, unsigned p)
{
    const unsigned long long x = s[i], y = s[p];
    if (x > y) {
        s[i] = y;
        s[p] = x;
    }
}
@ end
]]

local header = tpl.define [[
// kiln sort kernel ${name}
// ${op}: ${what}
//   in   p${a.param} ${a.type} ne ${dims(a.ne)} st ${dims(a.st)} offs ${a.offs}
//   out  p${dst.param} i32 ne ${dims(dst.ne)} (contiguous)
// ${rows} row${rows == 1 and "" or "s"} of ${n}, keeping ${kk}; ${how}
// launch: ${launch}
@ if pre ~= "" then

${pre}
@ end

${helpers}
]]

-- The warp kernel: top-k by repeated warp minimum.
local warp_kernel = tpl.define [[
${warp_min}

extern "C" __global__ void __launch_bounds__(${WARPS * 32})
${name}(${params})
{
@ for _, p in ipairs(ptrs) do
    ${p}
@ end
    const unsigned lane = threadIdx.x & 31u;
    const unsigned r = blockIdx.x * ${WARPS}u + (threadIdx.x >> 5);
@ if rows % WARPS ~= 0 then
    if (r >= ${rows}u)
        return;
@ end
@ if dyn then
    if (!kiln_row_ok(r, kdims))
        return;
@ end
    const ${ct} *const row = kiln_row(in, r);
    unsigned long long v[${E}];
#pragma unroll
    for (unsigned e = 0; e < ${E}u; e++) {
        const unsigned i = e * 32u + lane;
@ if n % 32 == 0 then
        v[e] = kiln_key(row, i);
@ else
        v[e] = i < ${n}u ? kiln_key(row, i) : ~0ull;
@ end
    }
    unsigned long long best = v[0];
#pragma unroll
    for (unsigned e = 1; e < ${E}u; e++)
        best = v[e] < best ? v[e] : best;
    unsigned mine = 0;
    for (unsigned j = 0; j < ${kk}u; j++) {
        const unsigned long long m = kiln_warp_min(best);
        if (lane == j)
            mine = (unsigned)m;
        if (best == m) {
            best = ~0ull;
#pragma unroll
            for (unsigned e = 0; e < ${E}u; e++) {
                if (v[e] == m)
                    v[e] = ~0ull;
                best = v[e] < best ? v[e] : best;
            }
        }
    }
@ if kk < 32 then
    if (lane < ${kk}u)
        out[(unsigned long long)r * ${kk}u + lane] = (int)mine;
@ else
    out[(unsigned long long)r * ${kk}u + lane] = (int)mine;
@ end
}
]]

-- Bitonic sort of `segs` segments of s (segment q at s + q * seg_stride), each of `len` valid
-- keys (a C expression) padded virtually to np positions; the network runs sizes 2 .. np. T
-- threads; ends with __syncthreads.
local bitonic = tpl.define [[
${ind}for (unsigned size = 2; size <= ${np}u; size <<= 1) {
${ind}    for (unsigned j = size >> 1; j > 0; j >>= 1) {
${ind}        for (unsigned q = threadIdx.x; q < ${pairs}u; q += ${T}u) {
@ if segs > 1 then
${ind}            unsigned long long *const seg = s + (q >> ${lhalf}) * ${seg_stride}u;
${ind}            const unsigned w = q & ${half - 1}u;
@ else
${ind}            unsigned long long *const seg = s;
${ind}            const unsigned w = q;
@ end
${ind}            const unsigned i = ((w & ~(j - 1)) << 1) | (w & (j - 1));
${ind}            const unsigned p = j == size >> 1 ? i ^ (size - 1) : i + j;
@ if check then
${ind}            if (p < ${len})
${ind}                kiln_cx(seg, i, p);
@ else
${ind}            kiln_cx(seg, i, p);
@ end
${ind}        }
${ind}        __syncthreads();
${ind}    }
${ind}}
]]

local function bitonic_code(ind, np, segs, seg_stride, len, check, T)
    if np < 2 then return "" end
    local half = np // 2
    return (bitonic {
        ind = ind, np = np, segs = segs, seg_stride = seg_stride, len = len, check = check, T = T,
        half = half, lhalf = log2(half), pairs = segs * half,
    }):gsub("\n$", "")
end

-- The smem kernel: R rows per block, each sorted whole in shared memory.
local smem_kernel = tpl.define [[
extern "C" __global__ void __launch_bounds__(${T})
${name}(${params})
{
@ for _, p in ipairs(ptrs) do
    ${p}
@ end
    __shared__ unsigned long long s[${R * n}];
    const unsigned r0 = blockIdx.x * ${R}u;
@ if dyn and R == 1 then
    if (!kiln_row_ok(r0, kdims))
        return;
@ end
    for (unsigned t = threadIdx.x; t < ${R * n}u; t += ${T}u) {
@ if R > 1 then
        const unsigned q = t / ${n}u, i = t - q * ${n}u;
@ if dyn then
        s[t] = ${rows % R ~= 0 and ("r0 + q < " .. rows .. "u && ") or ""}kiln_row_ok(r0 + q, kdims) ? kiln_key(kiln_row(in, r0 + q), i) : ~0ull;
@ elseif rows % R ~= 0 then
        s[t] = r0 + q < ${rows}u ? kiln_key(kiln_row(in, r0 + q), i) : ~0ull;
@ else
        s[t] = kiln_key(kiln_row(in, r0 + q), i);
@ end
@ else
        s[t] = kiln_key(kiln_row(in, r0), t);
@ end
    }
    __syncthreads();
${sort}
    for (unsigned t = threadIdx.x; t < ${R * kk}u; t += ${T}u) {
@ if R > 1 then
        const unsigned q = t / ${kk}u, i = t - q * ${kk}u;
@ if dyn then
        if (${rows % R ~= 0 and ("r0 + q < " .. rows .. "u && ") or ""}kiln_row_ok(r0 + q, kdims))
            out[(unsigned long long)r0 * ${kk}u + t] = (int)(unsigned)s[q * ${n}u + i];
@ elseif rows % R ~= 0 then
        if (r0 + q < ${rows}u)
            out[(unsigned long long)r0 * ${kk}u + t] = (int)(unsigned)s[q * ${n}u + i];
@ else
        out[(unsigned long long)r0 * ${kk}u + t] = (int)(unsigned)s[q * ${n}u + i];
@ end
@ else
        out[(unsigned long long)r0 * ${kk}u + t] = (int)(unsigned)s[t];
@ end
    }
}
]]

-- The global scheme over the m indices of orow (keys from row); phase 1 takes index base + t
-- from `first` (an expression of base + t: the identity for argsort, orow for select).
local global_sort = tpl.define [[
    /* 1: chunks of ${C} sorted in shared memory. */
    for (unsigned base = 0; base < ${m}u; base += ${C}u) {
        const unsigned len = ${m}u - base < ${C}u ? ${m}u - base : ${C}u;
        for (unsigned t = threadIdx.x; t < ${C}u; t += ${T}u)
            s[t] = t < len ? kiln_key(row, ${first}) : ~0ull;
        __syncthreads();
${chunk_sort}
        for (unsigned t = threadIdx.x; t < len; t += ${T}u)
            orow[base + t] = (int)(unsigned)s[t];
        __syncthreads();
    }
    /* 2: merges of sizes ${2 * C} .. ${np}: strides >= ${C} in global memory, the rest per chunk. */
    for (unsigned lsize = ${lc + 1}; lsize <= ${lnp}u; lsize++) {
        const unsigned size = 1u << lsize; /* a loop on size itself would overflow at 2^31 */
        for (unsigned j = size >> 1; j >= ${C}u; j >>= 1) {
            for (unsigned w = threadIdx.x; w < ${np // 2}u; w += ${T}u) {
                const unsigned i = ((w & ~(j - 1)) << 1) | (w & (j - 1));
                const unsigned p = j == size >> 1 ? i ^ (size - 1) : i + j;
                if (p < ${m}u) {
                    const int x = orow[i], y = orow[p];
                    if (kiln_key(row, (unsigned)x) > kiln_key(row, (unsigned)y)) {
                        orow[i] = y;
                        orow[p] = x;
                    }
                }
            }
            __syncthreads();
        }
        for (unsigned base = 0; base < ${m}u; base += ${C}u) {
            const unsigned len = ${m}u - base < ${C}u ? ${m}u - base : ${C}u;
            for (unsigned t = threadIdx.x; t < ${C}u; t += ${T}u)
                s[t] = t < len ? kiln_key(row, (unsigned)orow[base + t]) : ~0ull;
            __syncthreads();
            for (unsigned j = ${C // 2}u; j > 0; j >>= 1) {
                for (unsigned w = threadIdx.x; w < ${C // 2}u; w += ${T}u) {
                    const unsigned i = ((w & ~(j - 1)) << 1) | (w & (j - 1));
                    kiln_cx(s, i, i + j);
                }
                __syncthreads();
            }
            for (unsigned t = threadIdx.x; t < len; t += ${T}u)
                orow[base + t] = (int)(unsigned)s[t];
            __syncthreads();
        }
    }
]]

local global_kernel = tpl.define [[
extern "C" __global__ void __launch_bounds__(${T})
${name}(${params})
{
@ for _, p in ipairs(ptrs) do
    ${p}
@ end
    __shared__ unsigned long long s[${C}];
@ if dyn then
    if (!kiln_row_ok(blockIdx.x, kdims))
        return;
@ end
    const ${ct} *const row = kiln_row(in, blockIdx.x);
    int *const orow = out + (unsigned long long)blockIdx.x * ${m}u;
${body}
}
]]

local select_kernel = tpl.define [[
extern "C" __global__ void __launch_bounds__(${T})
${name}(${params})
{
@ for _, p in ipairs(ptrs) do
    ${p}
@ end
    __shared__ unsigned long long s[${skeys}];
    __shared__ unsigned hist[256];
    __shared__ unsigned sel_digit, sel_need, sel_done, sel_count;
@ if dyn then
    if (!kiln_row_ok(blockIdx.x, kdims))
        return;
@ end
    const ${ct} *const row = kiln_row(in, blockIdx.x);
    int *const orow = out + (unsigned long long)blockIdx.x * ${kk}u;

    /* Radix select of the ${kk}-th smallest key: prefix/mask hold the digits fixed so far, need
     * how many keys of the current bucket are still to be taken. */
    unsigned long long prefix = 0, mask = 0;
    unsigned need = ${kk}u;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (unsigned t = threadIdx.x; t < 256u; t += ${T}u)
            hist[t] = 0;
        __syncthreads();
        for (unsigned i = threadIdx.x; i < ${n}u; i += ${T}u) {
            const unsigned long long x = kiln_key(row, i);
            if ((x & mask) == prefix)
                atomicAdd(&hist[(unsigned)(x >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x < 32u) {
            /* Warp 0: lane l scans bins 8l .. 8l+7 after an inclusive scan of the lanes' sums. */
            const unsigned lane = threadIdx.x;
            unsigned h[8], tot = 0;
#pragma unroll
            for (unsigned b = 0; b < 8u; b++) {
                h[b] = hist[lane * 8u + b];
                tot += h[b];
            }
            unsigned incl = tot;
#pragma unroll
            for (unsigned o = 1; o < 32u; o <<= 1) {
                const unsigned y = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o)
                    incl += y;
            }
            unsigned run = incl - tot;
            if (run < need && need <= incl) {
#pragma unroll
                for (unsigned b = 0; b < 8u; b++) {
                    if (run < need && need <= run + h[b]) {
                        sel_digit = lane * 8u + b;
                        sel_need = need - run;
                        sel_done = h[b] == need - run;
                    }
                    run += h[b];
                }
            }
        }
        __syncthreads();
        prefix |= (unsigned long long)sel_digit << shift;
        mask |= 0xffull << shift;
        need = sel_need;
        if (sel_done)
            break;
    }

    /* The ${kk} keys whose fixed digits are at or below the bucket's. */
    if (threadIdx.x == 0)
        sel_count = 0;
    __syncthreads();
    for (unsigned i = threadIdx.x; i < ${n}u; i += ${T}u) {
        const unsigned long long x = kiln_key(row, i);
        if ((x & mask) <= prefix) {
            const unsigned slot = atomicAdd(&sel_count, 1u);
@ if small then
            s[slot] = x;
@ else
            orow[slot] = (int)i;
@ end
        }
    }
    __syncthreads();
@ if small then
${sort}
    for (unsigned t = threadIdx.x; t < ${kk}u; t += ${T}u)
        orow[t] = (int)(unsigned)s[t];
@ else
${body}
@ end
}
]]

local check_ref = kit.ref_checker(fail)

-- Offset (elements, long long) of row r's first element relative to the operand's offset.
local function row_offset(a)
    local last = 1
    for d = 2, 4 do if a.ne[d] > 1 then last = d end end
    local terms, div = {}, 1
    for d = 2, 4 do
        if a.ne[d] > 1 then
            local c = div > 1 and ("r / " .. div .. "u") or "r"
            if d < last then c = "(" .. c .. ") % " .. a.ne[d] .. "u" end
            if a.st[d] ~= 0 then
                terms[#terms + 1] = "(long long)(" .. c .. ") * " .. a.st[d] .. "ll"
            end
        end
        div = div * a.ne[d]
    end
    if #terms == 0 then return "0" end
    return table.concat(terms, " + ")
end

return function(k)
    if k.kind ~= "op" then fail("node kind %s is not op", tostring(k.kind)) end
    local op = k.op
    if op ~= "argsort" and op ~= "argsort_top_k" and op ~= "top_k" then fail("unknown op %s", tostring(op)) end
    local a, dst = k.args.a, k.dst
    if not a then fail("%s: no operand a", op) end
    check_ref(a, "a", prelude.ctype)
    check_ref(dst, "dst", { i32 = true })
    local n, kk = a.ne[1], dst.ne[1]
    local rows = a.ne[2] * a.ne[3] * a.ne[4]
    if dst.ne[2] * dst.ne[3] * dst.ne[4] ~= rows or kk > n then fail("%s: dst %s does not fit a %s", op, dims(dst.ne), dims(a.ne)) end
    if n > 2147483647 or rows > 2147483647 then fail("%s: %d rows of %d do not fit 32-bit indices", op, rows, n) end
    local desc = op ~= "argsort" or k.params.order == "desc"
    if op == "argsort" and kk ~= n then fail("argsort: dst ne0 %d is not a's %d", kk, n) end

    local nparams = k.nparams
    local plist = {}
    for p = 0, nparams - 1 do
        plist[#plist + 1] = (p == 0 and "char" or "const char") .. " *__restrict__ p" .. p
    end
    local params = table.concat(plist, ", ")
    -- Symbolic dims: a's (dst's) dims 1..3, the rows; rows past a run-time extent are skipped
    -- (kiln_row_ok, from the row's coordinates at the maxima).
    local dyn = kit.ext
    for d = 1, 4 do
        if d == 1 and (dyn(a, 1) or dyn(dst, 1)) then fail("%s: a symbolic row length is not supported", op) end
    end
    local okterms, div = {}, 1
    for d = 2, 4 do
        local e = dyn(a, d) or dyn(dst, d)
        if e and a.ne[d] > 1 then
            local c = div > 1 and ("r / " .. div .. "u") or "r"
            if d < 4 and div * a.ne[d] < rows then c = "(" .. c .. ") % " .. a.ne[d] .. "u" end
            okterms[#okterms + 1] = string.format("%s < (unsigned)(%s)", c, e)
        end
        div = div * a.ne[d]
    end
    local dynamic = false
    for d = 2, 4 do if dyn(a, d) or dyn(dst, d) then dynamic = true end end
    if dynamic then params = params .. (k.dims_arg or ", const int *__restrict__ kdims") end
    local row_ok = #okterms > 0 and table.concat(okterms, " && ") or (dynamic and "true" or "")
    local ct = prelude.ctype[a.type]
    local function ptr(r, var, typ, const)
        kit.check_param(fail, r, var, nparams)
        return kit.pointer(r, var, typ, const, kit.ll)
    end
    local ptrs = { ptr(dst, "out", "int", false), ptr(a, "in", ct, true) }

    local pre = prelude.new()
    local elem = a.st[1] == 1 and "row[i]" or ("row[(long long)i * " .. a.st[1] .. "ll]")

    -- The shape of kernel.
    local shape
    if op ~= "argsort" and n <= WARP_MAX_N and kk <= WARP_MAX_K then shape = "warp"
    elseif n <= SMEM_KEYS then shape = "smem"
    elseif kk == n then shape = "global"
    else shape = "select" end

    local tname = op .. "_" .. a.type .. "_" .. n .. (op == "argsort" and ("_" .. (desc and "desc" or "asc")) or ("_k" .. kk))
    local name = tname .. "_" .. shape
    local c = { name = name, params = params, ptrs = ptrs, ct = ct, n = n, kk = kk, rows = rows, dyn = dynamic }
    local src, grid, block, how, launch
    if shape == "warp" then
        c.WARPS, c.E, c.warp_min = WARPS, (n + 31) // 32, kit.WARP_MIN_HELPER
        src = warp_kernel(c)
        grid, block = { (rows + WARPS - 1) // WARPS, 1, 1 }, { WARPS * 32, 1, 1 }
        how = string.format("one warp per row, %d key%s per lane in registers, %d warp minima", c.E,
            c.E == 1 and "" or "s", kk)
    elseif shape == "smem" then
        local np = pow2_ceil(n)
        local R = math.max(1, math.min(rows, SMEM_ROW_TARGET // n))
        local T = math.min(BIG_BLOCK, math.max(128, round_up(R * np // 2, 32)))
        c.R, c.T = R, T
        c.sort = bitonic_code("    ", np, R, n, n .. "u", np ~= n, T)
        src = smem_kernel(c)
        grid, block = { (rows + R - 1) // R, 1, 1 }, { T, 1, 1 }
        how = string.format("%d row%s per block sorted in shared memory (bitonic over %d)", R, R == 1 and "" or "s", np)
    else
        local T = BIG_BLOCK
        local gc = { C = CHUNK, T = T, np = pow2_ceil(kk), m = kk, lc = log2(CHUNK), lnp = log2(pow2_ceil(kk)),
            chunk_sort = bitonic_code("        ", CHUNK, 1, CHUNK, "", false, T) }
        c.T, c.C, c.m = T, CHUNK, kk
        if shape == "global" then
            gc.first = "base + t"
            c.body = global_sort(gc):gsub("\n$", "")
            src = global_kernel(c)
            how = string.format("one block per row: chunks of %d in shared memory, merges over %d in global memory",
                CHUNK, gc.np)
        else
            c.small = kk <= SMEM_KEYS
            if c.small then
                local np = pow2_ceil(kk)
                c.skeys = kk
                c.sort = bitonic_code("    ", np, 1, kk, kk .. "u", np ~= kk, T)
                how = "one block per row: radix select, then the k keys sorted in shared memory"
            else
                c.skeys = CHUNK
                gc.first = "(unsigned)orow[base + t]"
                c.body = global_sort(gc):gsub("\n$", "")
                how = string.format("one block per row: radix select into the destination row, then chunks of %d in shared memory and merges in global memory", CHUNK)
            end
            src = select_kernel(c)
        end
        grid, block = { rows, 1, 1 }, { T, 1, 1 }
    end
    launch = string.format("%d block%s of %d threads", grid[1], grid[1] == 1 and "" or "s", block[1])

    local h = helpers {
        ct = ct, order = desc and "descending: complemented" or "ascending",
        complement = desc and "~" or "", load = pre.load(a.type, elem), row_offset = row_offset(a),
        need_cx = shape ~= "warp" and n > 1, row_ok = row_ok, sort_key = SORT_KEY,
    }
    local what
    if op == "argsort" then what = "indices of each row sorted " .. (desc and "descending" or "ascending")
    else what = "indices of the " .. kk .. " largest values of each row, in descending order of value" end
    if dynamic then how = how .. "; rows past the run-time extents skipped (kiln_row_ok)" end
    local head = header {
        name = name, op = op, what = what, a = a, dst = dst, dims = dims, rows = rows, n = n, kk = kk,
        how = how .. "; ties keep index order, NaN above +inf", launch = launch,
        pre = (pre.code():gsub("\n$", "")), helpers = h:gsub("\n$", ""),
    }
    return { name = name, source = head .. "\n" .. src, grid = grid, block = block, smem = 0,
        dynamic = dynamic or nil }
end
