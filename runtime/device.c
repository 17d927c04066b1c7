/* Device facts for reports and benchmarks: name, arch, size, and the measured copy bandwidth
 * that memory-bound kernels are judged against (the datasheet figure is not reached by any
 * kernel; a device-to-device copy is the practical ceiling). */
#include "runtime/runtime.h"

#include "codegen/codegen.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

kiln_status kiln_device_get_info(int device, kiln_device_info *out) {
    if (!out) return kb_error(KILN_ERR_INVALID, "kiln_device_get_info: out is NULL");
    memset(out, 0, sizeof *out);
    rt_cudev    d;
    kiln_status st = rt_device_pin(device, &d);
    if (!st) st = kiln_device_arch(device, out->arch, sizeof out->arch);
    if (st) return st;
    const rt_cuda_api *cu = rt_cuda();
    size_t             mem = 0;
    rt_cures           r = cu->DeviceGetName(out->name, (int)sizeof out->name, d);
    if (r == RT_CUDA_SUCCESS) r = cu->DeviceGetAttribute(&out->sm_count, RT_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d);
    if (r == RT_CUDA_SUCCESS) r = cu->DeviceTotalMem(&mem, d);
    if (r != RT_CUDA_SUCCESS) return rt_cuda_error(r, "cuDeviceGet*", "reading the facts of device %d", device);
    out->memory_bytes = mem;
    return NULL;
}

typedef struct {
    const rt_cuda_api *cu;
    rt_cudev           dev;
    rt_cuctx           ctx;
    rt_cuptr           a, b;
    rt_custream        stream;
    rt_cuevent         e0, e1;
} copy_bench;

static void copy_bench_free(copy_bench *c) {
    if (c->e0) c->cu->EventDestroy(c->e0);
    if (c->e1) c->cu->EventDestroy(c->e1);
    if (c->stream) c->cu->StreamDestroy(c->stream);
    if (c->a) c->cu->MemFree(c->a);
    if (c->b) c->cu->MemFree(c->b);
    if (c->ctx) c->cu->DevicePrimaryCtxRelease(c->dev);
}

static int by_float(const void *x, const void *y) {
    float a = *(const float *)x, b = *(const float *)y;
    return a < b ? -1 : a > b;
}

/* Times iters copies a -> b; ms gets each. */
static kiln_status time_copies(copy_bench *c, size_t bytes, int iters, float *ms) {
    const rt_cuda_api *cu = c->cu;
    rt_cures           r = RT_CUDA_SUCCESS;
    for (int i = -2; i < iters && r == RT_CUDA_SUCCESS; i++) { /* two untimed warm-up copies */
        r = cu->EventRecord(c->e0, c->stream);
        if (r == RT_CUDA_SUCCESS) r = cu->MemcpyDtoDAsync(c->b, c->a, bytes, c->stream);
        if (r == RT_CUDA_SUCCESS) r = cu->EventRecord(c->e1, c->stream);
        if (r == RT_CUDA_SUCCESS) r = cu->EventSynchronize(c->e1);
        if (r == RT_CUDA_SUCCESS && i >= 0) r = cu->EventElapsedTime(&ms[i], c->e0, c->e1);
    }
    return r == RT_CUDA_SUCCESS ? NULL : rt_cuda_error(r, "cuMemcpyDtoDAsync", "timing a %zu-byte copy", bytes);
}

kiln_status kiln_device_copy_bandwidth(int device, size_t bytes, int iters, double *gb_per_s) {
    if (!gb_per_s || bytes == 0 || iters < 1)
        return kb_error(KILN_ERR_INVALID, "kiln_device_copy_bandwidth: need bytes > 0, iters >= 1 and an output");
    *gb_per_s = 0;
    copy_bench  c = {.cu = rt_cuda()};
    kiln_status st = rt_device_pin(device, &c.dev);
    if (st) return st;
    c.cu = rt_cuda();
    rt_cures r = c.cu->DevicePrimaryCtxRetain(&c.ctx, c.dev);
    if (r != RT_CUDA_SUCCESS) {
        c.ctx = NULL;
        return rt_cuda_error(r, "cuDevicePrimaryCtxRetain", "opening device %d", device);
    }
    if (r == RT_CUDA_SUCCESS) r = c.cu->CtxSetCurrent(c.ctx);
    if (r == RT_CUDA_SUCCESS) r = c.cu->MemAlloc(&c.a, bytes);
    if (r == RT_CUDA_SUCCESS) r = c.cu->MemAlloc(&c.b, bytes);
    if (r == RT_CUDA_SUCCESS) r = c.cu->MemsetD8(c.a, 1, bytes);
    if (r == RT_CUDA_SUCCESS) r = c.cu->StreamCreate(&c.stream, RT_CU_STREAM_NON_BLOCKING);
    if (r == RT_CUDA_SUCCESS) r = c.cu->EventCreate(&c.e0, RT_CU_EVENT_DEFAULT);
    if (r == RT_CUDA_SUCCESS) r = c.cu->EventCreate(&c.e1, RT_CU_EVENT_DEFAULT);
    if (r != RT_CUDA_SUCCESS) st = rt_cuda_error(r, "cuMemAlloc", "setting up a %zu-byte copy on device %d", bytes, device);
    float *ms = st ? NULL : calloc((size_t)iters, sizeof *ms);
    if (!st && !ms) st = kb_oom();
    if (!st) st = time_copies(&c, bytes, iters, ms);
    if (!st) {
        qsort(ms, (size_t)iters, sizeof *ms, by_float);
        double med = ms[iters / 2];
        *gb_per_s = med > 0 ? 2.0 * (double)bytes / (med * 1e6) : 0;
    }
    free(ms);
    copy_bench_free(&c);
    return st;
}

/* The cubin comes through the kernel cache like a program's (codegen/util.c); on a failure
 * after the module loaded, out->mod is set for the caller to unload. */
kiln_status rt_util_load(const char *kernel, const char *arch, rt_util_kernel *out) {
    memset(out, 0, sizeof *out);
    cg_kernel   k;
    kiln_status st = cg_util_kernel(kernel, arch, NULL, &k);
    if (st) return st;
    const rt_cuda_api *cu = rt_cuda();
    rt_cures           r = cu->ModuleLoadData(&out->mod, k.cubin);
    if (r != RT_CUDA_SUCCESS) {
        out->mod = NULL;
        st = rt_cuda_error(r, "cuModuleLoadData", "loading kernel %s", k.name);
    } else if ((r = cu->ModuleGetFunction(&out->fn, out->mod, k.name)) != RT_CUDA_SUCCESS) {
        st = rt_cuda_error(r, "cuModuleGetFunction", "finding kernel %s", k.name);
    }
    out->grid = k.grid[0];
    out->block = k.block[0];
    cg_kernel_clear(&k);
    return st;
}

typedef struct {
    int            dev;
    rt_cuptr       buf, sink;
    size_t         bytes;
    rt_util_kernel k;
} l2_flusher;

/* The flush reads a buffer of four times the L2 with a kernel of ours (templates/util.lua,
 * l2_read, says why it reads rather than writes), kept for the last device asked. */
static pthread_mutex_t g_flush_lock = PTHREAD_MUTEX_INITIALIZER;
static l2_flusher      g_flush = {.dev = -1};

static kiln_status flusher_init(l2_flusher *f, int device, rt_cudev d) {
    const rt_cuda_api *cu = rt_cuda();
    char               arch[16];
    int                l2 = 0;
    kiln_status        st = kiln_device_arch(device, arch, sizeof arch);
    if (!st) st = rt_util_load("l2_read", arch, &f->k);
    if (st) return st;
    rt_cures r = cu->DeviceGetAttribute(&l2, RT_CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, d);
    f->bytes = 4 * (size_t)(l2 > 0 ? l2 : 64 << 20);
    if (r == RT_CUDA_SUCCESS) r = cu->MemAlloc(&f->buf, f->bytes);
    if (r == RT_CUDA_SUCCESS) r = cu->MemAlloc(&f->sink, 4);
    if (r == RT_CUDA_SUCCESS) r = cu->MemsetD8(f->buf, 0, f->bytes);
    if (r != RT_CUDA_SUCCESS) return rt_cuda_error(r, "cuMemAlloc", "setting up the L2 flush");
    f->dev = device;
    return NULL;
}

kiln_status kiln_device_flush_l2(int device) {
    rt_cudev    d;
    kiln_status st = rt_device_pin(device, &d);
    if (st) return st;
    const rt_cuda_api *cu = rt_cuda();
    rt_cuctx           ctx;
    rt_cures           r = cu->DevicePrimaryCtxRetain(&ctx, d);
    if (r != RT_CUDA_SUCCESS) return rt_cuda_error(r, "cuDevicePrimaryCtxRetain", "opening device %d", device);
    pthread_mutex_lock(&g_flush_lock);
    r = cu->CtxSetCurrent(ctx);
    if (r != RT_CUDA_SUCCESS) st = rt_cuda_error(r, "cuCtxSetCurrent", "opening device %d", device);
    if (!st && g_flush.dev != device) { /* set up for the last device asked */
        if (g_flush.k.mod) cu->ModuleUnload(g_flush.k.mod);
        if (g_flush.buf) cu->MemFree(g_flush.buf);
        if (g_flush.sink) cu->MemFree(g_flush.sink);
        memset(&g_flush, 0, sizeof g_flush);
        g_flush.dev = -1;
        st = flusher_init(&g_flush, device, d);
    }
    if (!st) {
        unsigned long long n = g_flush.bytes / 16;
        void              *args[] = {&g_flush.buf, &n, &g_flush.sink};
        r = cu->LaunchKernel(g_flush.k.fn, g_flush.k.grid, 1, 1, g_flush.k.block, 1, 1, 0, NULL, args, NULL);
        /* The legacy stream, which a non-blocking session stream does not wait for: sync. */
        if (r == RT_CUDA_SUCCESS) r = cu->CtxSynchronize();
        if (r != RT_CUDA_SUCCESS) st = rt_cuda_error(r, "cuLaunchKernel", "flushing the L2 of device %d", device);
    }
    pthread_mutex_unlock(&g_flush_lock);
    cu->DevicePrimaryCtxRelease(d);
    return st;
}
