/* kiln_session_fill_weights: weights made on the device instead of uploaded.
 *
 * Benchmarks and tests run models with random weights. Generating 61 GB (Qwen3-30B-A3B in
 * bf16) on the host and uploading it takes minutes and a file does not fit on a small disk; one
 * kernel writes it at memory speed. The generator is counter-based, so the device writes the
 * same bytes that kiln_model_write_random (model/random.c) writes into a file: element e of a
 * weight is base + scale * u, u = (mix(key + e * 0x9e3779b97f4a7c15) >> 40) * 2^-23 - 1 with mix
 * splitmix64's finalizer, rounded to nearest even into the weight's type. The kernel is
 * templates/util.lua's fill_uniform, compiled and cached like a program's kernels. */
#include "runtime/session_int.h"

#include <stdlib.h>
#include <math.h>

/* Random blocks of a quantized weight (templates/util.lua's fill_quant): the f16 scale (and
 * min) per type so that values span about ±scale — a benchmark's weights, not a file's. */
static kiln_status fill_quant(kiln_session *s, const rt_util_kernel *k, int i, const kiln_weight_init *w) {
    const ir_buf *b = &s->bufs[i];
    float         sc = w->scale != 0 ? w->scale : 1, d, dmin = 0;
    switch (b->type) {
    case KILN_Q8_0: d = sc / 128; break;
    case KILN_Q4_0: d = sc / 8; break;
    case KILN_Q5_0: d = sc / 16; break;
    case KILN_Q5_1: d = sc / 16, dmin = -sc; break; /* q * d + m, q 0..31 */
    case KILN_Q4_K: d = sc / (63 * 15), dmin = sc / 126; break;
    case KILN_Q5_K: d = sc / (63 * 31), dmin = sc / 126; break;
    case KILN_MXFP4: d = sc / 12; break; /* codes up to 12 times the power of two nearest d */
    default: d = sc / (128 * 32); break; /* q6_K */
    }
    bool               mx = b->type == KILN_MXFP4;
    /* the fill kernel's layouts: 1 tiled with f16 scales, 2 mxfp4's, 3 and 4 q5_0's and q5_1's
     * heads (6 and 8 bytes), 0 the file's */
    int split = mx ? 2 : b->type == KILN_Q5_0 ? 3 : b->type == KILN_Q5_1 ? 4 : kb_quant_split(b->type);
    int head = split == 2 ? 1 : split == 3 ? 6 : split == 4 ? 8 : 2;
    rt_cuptr           dst = s->dptr[i];
    unsigned long long nblocks = b->bytes / kiln_type_size(b->type), key = w->key;
    int                words = (int)((split ? kiln_type_size(b->type) - (size_t)head : kiln_type_size(b->type)) / 4);
    int                sp = split;
    long               e8 = 128 + lrintf(log2f(d)); /* mxfp4: the E8M0 exponent of 2^(e - 128) nearest d */
    unsigned           dh = mx ? (unsigned)(e8 < 1 ? 1 : e8 > 254 ? 254 : e8) : kb_f32_to_f16(d), mh = kb_f32_to_f16(dmin);
    void              *args[] = {&dst, &nblocks, &words, &sp, &key, &dh, &mh};
    unsigned long long blocks = (nblocks + k->block - 1) / k->block;
    unsigned           grid = blocks < k->grid ? (unsigned)blocks : k->grid;
    rt_cures           r = s->cu->LaunchKernel(k->fn, grid, 1, 1, k->block, 1, 1, 0, s->stream, args, NULL);
    if (r != RT_CUDA_SUCCESS) return rt_cuda_error(r, "cuLaunchKernel", "filling weight '%s'", b->name);
    return NULL;
}

static kiln_status upload_host(kiln_session *s, int i, const void *host) {
    const ir_buf *b = &s->bufs[i];
    void         *conv = NULL;
    if (kb_quant_split(b->type)) { /* the device layout (templates/quant.lua) */
        if (!(conv = malloc(b->bytes))) return kb_oom();
        kb_quant_to_device(b->type, host, conv, b->bytes);
        host = conv;
    }
    rt_cures r = s->cu->MemcpyHtoD(s->dptr[i], host, b->bytes);
    free(conv);
    if (r != RT_CUDA_SUCCESS) return rt_cuda_error(r, "cuMemcpyHtoD", "uploading weight '%s'", b->name);
    return NULL;
}

static kiln_status fill_one(kiln_session *s, const rt_util_kernel *k, const rt_util_kernel *kq, int i,
                            const kiln_weight_init *w) {
    const ir_buf *b = &s->bufs[i];
    rt_cures      r;
    if (w->host) return upload_host(s, i, w->host);
    if (kiln_type_is_quantized(b->type)) return fill_quant(s, kq, i, w);
    if (b->type != KILN_F32 && b->type != KILN_F16 && b->type != KILN_BF16)
        return kb_error(KILN_ERR_INVALID, "kiln_session_fill_weights: weight '%s' is %s; random fills are f32, "
                                              "f16 or bf16", b->name, kiln_type_name(b->type));
    rt_cuptr           dst = s->dptr[i];
    unsigned long long n = b->bytes / kiln_type_size(b->type), key = w->key;
    int                type = b->type == KILN_F32 ? 0 : b->type == KILN_F16 ? 1 : 2;
    float              scale = w->scale, base = w->base;
    void              *args[] = {&dst, &n, &type, &key, &scale, &base};
    unsigned long long blocks = (n + k->block - 1) / k->block;
    unsigned           grid = blocks < k->grid ? (unsigned)blocks : k->grid;
    if ((r = s->cu->LaunchKernel(k->fn, grid, 1, 1, k->block, 1, 1, 0, s->stream, args, NULL)) != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuLaunchKernel", "filling weight '%s'", b->name);
    return NULL;
}

kiln_status kiln_session_fill_weights(kiln_session *s, kiln_weight_init_fn init, void *user) {
    static const char fn[] = "kiln_session_fill_weights";
    if (!s || !init) return kb_error(KILN_ERR_INVALID, "%s: %s is NULL", fn, s ? "init" : "session");
    if (s->primary) return kb_error(KILN_ERR_INVALID, "%s: a variant session shares its primary's weights", fn);
    if (s->chain_unit) return kb_error(KILN_ERR_INVALID, "%s: a chain is open (kiln_session_chain_end first)", fn);
    kiln_status st = rt_make_current(s);
    rt_util_kernel k = {0}, kq = {0};
    if (!st) st = rt_util_load("fill_uniform", s->arch, &k);
    for (int i = 0; !st && i < s->nbufs; i++) {
        const ir_buf *b = &s->bufs[i];
        if (b->kind != IR_BUF_WEIGHT || b->bytes == 0) continue;
        if (kiln_type_is_quantized(b->type) && !kq.mod) st = rt_util_load("fill_quant", s->arch, &kq);
        kiln_weight_init w = {0};
        if (!st && !(st = init(user, b->name, b->type, b->ne, &w))) st = fill_one(s, &k, &kq, i, &w);
    }
    rt_cures r = s->cu->StreamSynchronize(s->stream);
    if (!st && r != RT_CUDA_SUCCESS) st = rt_cuda_error(r, "cuStreamSynchronize", "filling the weights");
    if (k.mod) s->cu->ModuleUnload(k.mod);
    if (kq.mod) s->cu->ModuleUnload(kq.mod);
    return st;
}
