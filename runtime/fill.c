/* kiln_session_fill_weights: weights made on the device instead of uploaded.
 *
 * Benchmarks and tests run models with random weights. Generating 61 GB (Qwen3-30B-A3B in
 * bf16) on the host and uploading it takes minutes and a file does not fit on a small disk; one
 * kernel writes it at memory speed. The generator is counter-based, so the device writes the
 * same bytes that kiln_model_write_random (model/random.c) writes into a file: element e of a
 * weight is base + scale * u, u = (mix(key + e * 0x9e3779b97f4a7c15) >> 40) * 2^-23 - 1 with mix
 * splitmix64's finalizer, rounded to nearest even into the weight's type. The products and sums
 * are the _rn intrinsics so that NVRTC does not contract them into an FMA, whose single
 * rounding the host's code (two roundings) would not match. */
#include "runtime/session_int.h"

#include <stdlib.h>

static const char fill_src[] =
    "extern \"C\" __global__ void kiln_fill_uniform(void *dst, unsigned long long n, int type,\n"
    "                                               unsigned long long key, float scale, float base)\n"
    "{\n"
    "    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;\n"
    "    for (unsigned long long e = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += step) {\n"
    "        unsigned long long z = key + e * 0x9e3779b97f4a7c15ull;\n"
    "        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;\n"
    "        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;\n"
    "        z ^= z >> 31;\n"
    "        float u = __fadd_rn(__fmul_rn((float)(z >> 40), 1.0f / 8388608.0f), -1.0f);\n"
    "        float v = __fadd_rn(base, __fmul_rn(scale, u));\n"
    "        unsigned short h;\n"
    "        if (type == 0) {\n"
    "            ((float *)dst)[e] = v;\n"
    "            continue;\n"
    "        }\n"
    "        if (type == 1) asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(v));\n"
    "        else asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(v));\n"
    "        ((unsigned short *)dst)[e] = h;\n"
    "    }\n"
    "}\n";

typedef struct {
    rt_cumod mod;
    rt_cufn  fn;
} fill_kernel;

static kiln_status fill_one(kiln_session *s, const fill_kernel *k, int i, const kiln_weight_init *w) {
    const ir_buf *b = &s->bufs[i];
    rt_cures      r;
    if (w->host) {
        if ((r = s->cu->MemcpyHtoD(s->dptr[i], w->host, b->bytes)) != RT_CUDA_SUCCESS)
            return rt_cuda_error(r, "cuMemcpyHtoD", "uploading weight '%s'", b->name);
        return NULL;
    }
    if (b->type != KILN_F32 && b->type != KILN_F16 && b->type != KILN_BF16)
        return kb_error(KILN_ERR_INVALID, "kiln_session_fill_weights: weight '%s' is %s; random fills are f32, "
                                              "f16 or bf16", b->name, kiln_type_name(b->type));
    rt_cuptr           dst = s->dptr[i];
    unsigned long long n = b->bytes / kiln_type_size(b->type), key = w->key;
    int                type = b->type == KILN_F32 ? 0 : b->type == KILN_F16 ? 1 : 2;
    float              scale = w->scale, base = w->base;
    void              *args[] = {&dst, &n, &type, &key, &scale, &base};
    unsigned long long blocks = (n + 255) / 256;
    unsigned           grid = blocks < 8192 ? (unsigned)blocks : 8192;
    if ((r = s->cu->LaunchKernel(k->fn, grid, 1, 1, 256, 1, 1, 0, s->stream, args, NULL)) != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuLaunchKernel", "filling weight '%s'", b->name);
    return NULL;
}

kiln_status kiln_session_fill_weights(kiln_session *s, kiln_weight_init_fn init, void *user) {
    static const char fn[] = "kiln_session_fill_weights";
    if (!s || !init) return kb_error(KILN_ERR_INVALID, "%s: %s is NULL", fn, s ? "init" : "session");
    if (s->primary) return kb_error(KILN_ERR_INVALID, "%s: a variant session shares its primary's weights", fn);
    if (s->chain_unit) return kb_error(KILN_ERR_INVALID, "%s: a chain is open (kiln_session_chain_end first)", fn);
    kiln_status st = rt_make_current(s);
    fill_kernel k = {0};
    if (!st) st = rt_load_kernel(fill_src, "kiln_fill_uniform", s->arch, &k.mod, &k.fn);
    for (int i = 0; !st && i < s->nbufs; i++) {
        const ir_buf *b = &s->bufs[i];
        if (b->kind != IR_BUF_WEIGHT || b->bytes == 0) continue;
        kiln_weight_init w = {0};
        if (!(st = init(user, b->name, b->type, b->ne, &w))) st = fill_one(s, &k, i, &w);
    }
    rt_cures r = s->cu->StreamSynchronize(s->stream);
    if (!st && r != RT_CUDA_SUCCESS) st = rt_cuda_error(r, "cuStreamSynchronize", "filling the weights");
    if (k.mod) s->cu->ModuleUnload(k.mod);
    return st;
}
