/* The CUDA driver API through dlopen: loading libcuda, one-time initialisation, error text. */
#include "runtime/runtime.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static rt_cuda_api      g_api;
static bool             g_ok;
static kiln_status      g_init_err; /* set once by do_init, copied out to callers */
static int              g_driver_version;
static int              g_ndevices;
static void            *g_lib;
static pthread_once_t   g_once = PTHREAD_ONCE_INIT;

const rt_cuda_api *rt_cuda(void) { return g_ok ? &g_api : NULL; }
int                rt_driver_version(void) { return g_driver_version; }

const char *rt_cu_errstr(rt_cures r, char *buf, size_t n) {
    const char *name = NULL, *str = NULL;
    if (g_api.GetErrorName && g_api.GetErrorName(r, &name) != RT_CUDA_SUCCESS) name = NULL;
    if (g_api.GetErrorString && g_api.GetErrorString(r, &str) != RT_CUDA_SUCCESS) str = NULL;
    if (name && str) snprintf(buf, n, "%s (%s)", name, str);
    else if (name) snprintf(buf, n, "%s", name);
    else snprintf(buf, n, "CUDA error %d", r);
    return buf;
}

kiln_status rt_cuda_error(rt_cures r, const char *call, const char *what_fmt, ...) {
    char what[512], err[256];
    va_list ap;
    va_start(ap, what_fmt);
    vsnprintf(what, sizeof what, what_fmt, ap);
    va_end(ap);
    return kb_error(KILN_ERR_CUDA, "CUDA driver call %s failed with %s while %s", call,
                    rt_cu_errstr(r, err, sizeof err), what);
}

/* Every entry point: field offset in g_api and the exported symbol. */
#define RT_SYM(field, sym) RT_DL_SYM(rt_cuda_api, field, sym)
static const rt_dl_sym g_syms[] = {
    RT_SYM(Init, cuInit),
    RT_SYM(DriverGetVersion, cuDriverGetVersion),
    RT_SYM(DeviceGetCount, cuDeviceGetCount),
    RT_SYM(DeviceGet, cuDeviceGet),
    RT_SYM(DeviceGetAttribute, cuDeviceGetAttribute),
    RT_SYM(DeviceGetName, cuDeviceGetName),
    RT_SYM(DevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain),
    RT_SYM(DevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2),
    RT_SYM(CtxSetCurrent, cuCtxSetCurrent),
    RT_SYM(CtxSynchronize, cuCtxSynchronize),
    RT_SYM(ModuleLoadData, cuModuleLoadData),
    RT_SYM(ModuleUnload, cuModuleUnload),
    RT_SYM(ModuleGetFunction, cuModuleGetFunction),
    RT_SYM(FuncSetAttribute, cuFuncSetAttribute),
    RT_SYM(LaunchKernel, cuLaunchKernel),
    RT_SYM(MemAlloc, cuMemAlloc_v2),
    RT_SYM(MemFree, cuMemFree_v2),
    RT_SYM(MemcpyHtoD, cuMemcpyHtoD_v2),
    RT_SYM(MemcpyHtoDAsync, cuMemcpyHtoDAsync_v2),
    RT_SYM(MemAllocHost, cuMemAllocHost_v2),
    RT_SYM(MemFreeHost, cuMemFreeHost),
    RT_SYM(MemcpyDtoH, cuMemcpyDtoH_v2),
    RT_SYM(MemHostAlloc, cuMemHostAlloc),
    RT_SYM(MemHostGetDevicePointer, cuMemHostGetDevicePointer_v2),
    RT_SYM(MemsetD8, cuMemsetD8_v2),
    RT_SYM(MemcpyDtoDAsync, cuMemcpyDtoDAsync_v2),
    RT_SYM(MemcpyDtoHAsync, cuMemcpyDtoHAsync_v2),
    RT_SYM(DeviceTotalMem, cuDeviceTotalMem_v2),
    RT_SYM(StreamCreate, cuStreamCreate),
    RT_SYM(StreamDestroy, cuStreamDestroy_v2),
    RT_SYM(StreamSynchronize, cuStreamSynchronize),
    RT_SYM(StreamWaitEvent, cuStreamWaitEvent),
    RT_SYM(StreamBeginCapture, cuStreamBeginCapture_v2),
    RT_SYM(StreamEndCapture, cuStreamEndCapture),
    RT_SYM(GraphInstantiateWithFlags, cuGraphInstantiateWithFlags),
    RT_SYM(GraphLaunch, cuGraphLaunch),
    RT_SYM(GraphExecDestroy, cuGraphExecDestroy),
    RT_SYM(GraphDestroy, cuGraphDestroy),
    RT_SYM(EventCreate, cuEventCreate),
    RT_SYM(EventRecord, cuEventRecord),
    RT_SYM(EventSynchronize, cuEventSynchronize),
    RT_SYM(EventElapsedTime, cuEventElapsedTime),
    RT_SYM(EventDestroy, cuEventDestroy_v2),
    RT_SYM(GetErrorName, cuGetErrorName),
    RT_SYM(GetErrorString, cuGetErrorString),
};

const char *rt_dl_bind(void *lib, void *api, const rt_dl_sym *syms, size_t n) {
    for (size_t i = 0; i < n; i++) {
        dlerror();
        void *f = dlsym(lib, syms[i].sym);
        if (!f) return syms[i].sym;
        /* memcpy, not a cast: ISO C has no conversion from void * to a function pointer */
        memcpy((char *)api + syms[i].off, &f, sizeof f);
    }
    return NULL;
}

void *rt_dl_open_first(const char *const *names, size_t n, const char **why) {
    void *lib = NULL;
    *why = NULL;
    for (size_t i = 0; i < n && !lib; i++) {
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib && i == 0) *why = dlerror();
    }
    return lib;
}

static void do_init(void) {
    const char *env = getenv("KILN_LIBCUDA"); /* test hook: a specific library, or a bad path */
    char first_err[512] = "";
    if (env && *env) {
        g_lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (!g_lib) {
            const char *e = dlerror();
            g_init_err = kb_error(KILN_ERR_NO_GPU,
                                  "no CUDA driver found (%s, from $KILN_LIBCUDA, could not be "
                                  "loaded: %s); running needs an NVIDIA GPU and driver",
                                  env, e ? e : "unknown error");
            return;
        }
    } else {
        g_lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!g_lib) {
            const char *e = dlerror();
            snprintf(first_err, sizeof first_err, "%s", e ? e : "unknown error");
            g_lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
        }
        if (!g_lib) {
            g_init_err = kb_error(KILN_ERR_NO_GPU,
                                  "no CUDA driver found (libcuda.so.1 could not be loaded: %s); "
                                  "running needs an NVIDIA GPU and driver",
                                  first_err);
            return;
        }
    }

    rt_cuda_api api;
    memset(&api, 0, sizeof api);
    const char *missing = rt_dl_bind(g_lib, &api, g_syms, sizeof g_syms / sizeof g_syms[0]);
    if (missing) {
        g_init_err = kb_error(KILN_ERR_NO_GPU,
                              "the CUDA driver library lacks %s (the installed NVIDIA driver "
                              "is too old, or the library is not libcuda); update the NVIDIA "
                              "driver",
                              missing);
        return;
    }
    void *ex = dlsym(g_lib, "cuLaunchKernelEx");
    memcpy(&api.LaunchKernelEx, &ex, sizeof ex);
    g_api = api; /* error names are available from here on */

    char err[256];
    rt_cures r = g_api.Init(0);
    if (r != RT_CUDA_SUCCESS) {
        g_init_err = kb_error(KILN_ERR_NO_GPU,
                              "the CUDA driver is installed but cuInit failed with %s; running "
                              "needs a working NVIDIA GPU (check nvidia-smi and "
                              "CUDA_VISIBLE_DEVICES)",
                              rt_cu_errstr(r, err, sizeof err));
        return;
    }
    if (g_api.DriverGetVersion(&g_driver_version) != RT_CUDA_SUCCESS) g_driver_version = 0;
    int n = 0;
    r = g_api.DeviceGetCount(&n);
    if (r != RT_CUDA_SUCCESS) {
        g_init_err = kb_error(KILN_ERR_NO_GPU, "cuDeviceGetCount failed with %s",
                              rt_cu_errstr(r, err, sizeof err));
        return;
    }
    if (n <= 0) {
        g_init_err = kb_error(KILN_ERR_NO_GPU,
                              "the CUDA driver found no GPU (cuDeviceGetCount returned 0, "
                              "CUDA_ERROR_NO_DEVICE); running needs an NVIDIA GPU (check "
                              "CUDA_VISIBLE_DEVICES)");
        return;
    }
    g_ndevices = n;
    g_ok = true;
}

kiln_status rt_driver_init(void) {
    if (pthread_once(&g_once, do_init) != 0)
        return kb_error(KILN_ERR_NO_GPU, "could not initialise the CUDA driver (pthread_once)");
    if (g_ok) return NULL;
    if (!g_init_err) return kb_error(KILN_ERR_NO_GPU, "CUDA driver initialisation failed");
    return kb_status_copy(g_init_err);
}

static kiln_status get_device(int dev, rt_cudev *out) {
    kiln_status st = rt_driver_init();
    if (st) return st;
    if (dev < 0 || dev >= g_ndevices)
        return kb_error(KILN_ERR_NO_GPU, "no CUDA device %d: %d device(s) visible (ordinals 0..%d)",
                        dev, g_ndevices, g_ndevices - 1);
    rt_cures r = g_api.DeviceGet(out, dev);
    if (r != RT_CUDA_SUCCESS) return rt_cuda_error(r, "cuDeviceGet", "looking up device %d", dev);
    return NULL;
}

kiln_status rt_device_arch(int dev, char out[16]) {
    if (!out) return kb_error(KILN_ERR_INVALID, "rt_device_arch: out is NULL");
    out[0] = 0;
    rt_cudev d;
    kiln_status st = get_device(dev, &d);
    if (st) return st;
    int major = 0, minor = 0;
    rt_cures r = g_api.DeviceGetAttribute(&major, RT_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d);
    if (r == RT_CUDA_SUCCESS)
        r = g_api.DeviceGetAttribute(&minor, RT_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d);
    if (r != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuDeviceGetAttribute", "reading the compute capability of device %d",
                             dev);
    snprintf(out, 16, "sm_%d%d", major, minor);
    return NULL;
}

kiln_status kiln_device_arch(int device, char *arch, size_t cap) {
    if (!arch || cap < 8) return kb_error(KILN_ERR_INVALID, "kiln_device_arch: need an output of at least 8 bytes");
    char        a[16];
    kiln_status st = rt_driver_init();
    if (!st) st = rt_device_arch(device, a);
    if (st) return st;
    kb_arch k;
    bool    specific = kb_arch_parse(a, &k) && k.major >= 9; /* the "a" variants exist from sm_90 on */
    if ((size_t)snprintf(arch, cap, "%s%s", a, specific ? "a" : "") >= cap)
        return kb_error(KILN_ERR_INVALID, "kiln_device_arch: output too small for '%s'", a);
    return NULL;
}

kiln_status kiln_device_count(int *n) {
    if (!n) return kb_error(KILN_ERR_INVALID, "kiln_device_count: n is NULL");
    *n = 0;
    kiln_status st = rt_driver_init();
    if (st) return st;
    rt_cures r = g_api.DeviceGetCount(n);
    return r == RT_CUDA_SUCCESS ? NULL : rt_cuda_error(r, "cuDeviceGetCount", "counting the GPUs");
}

/* Devices whose primary context this process keeps retained. */
#define RT_MAX_PINNED 64
static pthread_mutex_t g_pin_lock = PTHREAD_MUTEX_INITIALIZER;
static bool            g_pinned[RT_MAX_PINNED];

kiln_status rt_device_pin(int dev, rt_cudev *cudev) {
    rt_cudev d;
    kiln_status st = get_device(dev, &d);
    if (st) return st;
    if (cudev) *cudev = d;
    if (dev >= RT_MAX_PINNED) return NULL; /* works, only without the pin */
    pthread_mutex_lock(&g_pin_lock);
    if (!g_pinned[dev]) {
        rt_cuctx ctx;
        rt_cures r = g_api.DevicePrimaryCtxRetain(&ctx, d);
        if (r != RT_CUDA_SUCCESS)
            st = rt_cuda_error(r, "cuDevicePrimaryCtxRetain",
                               "creating the primary context of device %d", dev);
        else g_pinned[dev] = true;
    }
    pthread_mutex_unlock(&g_pin_lock);
    return st;
}
