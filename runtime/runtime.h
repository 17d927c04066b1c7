/* runtime: the CUDA driver API loaded with dlopen, device memory, modules, launches, CUDA graphs,
 * and the kiln_session API. Prefix rt_.
 *
 * Nothing here links against CUDA: the binary starts (and compiles) on machines without a GPU
 * or driver, and only creating a session needs one. */
#ifndef KILN_RUNTIME_H
#define KILN_RUNTIME_H

#include "base/base.h"

/* Loads libcuda.so.1 and initialises the driver once per process. KILN_ERR_NO_GPU, with a
 * message saying what is missing, when there is no driver or no device. */
kiln_status rt_driver_init(void);
/* Compute capability of device ordinal `dev` as "sm_XY" (for choosing an arch). */
kiln_status rt_device_arch(int dev, char out[16]);

/* ---- the driver API, for runtime/ only -------------------------------------------------------
 *
 * Our own minimal declarations of the CUDA driver API (cuda.h is never included, so that the
 * build needs no CUDA headers for the runtime and nothing links against libcuda). Types are
 * ABI-compatible with cuda.h; names carry an rt_ prefix so that a file may include both. */

typedef int                rt_cures;   /* CUresult; 0 is CUDA_SUCCESS */
typedef int                rt_cudev;   /* CUdevice */
typedef unsigned long long rt_cuptr;   /* CUdeviceptr */
typedef struct rt_cuctx_s       *rt_cuctx;       /* CUcontext */
typedef struct rt_cumod_s       *rt_cumod;       /* CUmodule */
typedef struct rt_cufn_s        *rt_cufn;        /* CUfunction */
typedef struct rt_custream_s    *rt_custream;    /* CUstream */
typedef struct rt_cuevent_s     *rt_cuevent;     /* CUevent */
typedef struct rt_cugraph_s     *rt_cugraph;     /* CUgraph */
typedef struct rt_cugraphexec_s *rt_cugraphexec; /* CUgraphExec */

/* Enum values, checked against cuda.h (CUDA 13.0). */
#define RT_CUDA_SUCCESS 0
#define RT_CUDA_ERROR_NO_DEVICE 100
#define RT_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define RT_CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE 38
#define RT_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define RT_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define RT_CU_STREAM_NON_BLOCKING 0x1
#define RT_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1
#define RT_CU_EVENT_DEFAULT 0x0
#define RT_CU_EVENT_DISABLE_TIMING 0x2
#define RT_CU_MEMHOSTALLOC_DEVICEMAP 0x02
#define RT_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8

/* cuLaunchKernelEx's CUlaunchConfig and CUlaunchAttribute (same layout): for programmatic
 * dependent launch, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION with value 1. */
#define RT_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION 6
typedef struct {
    int  id;
    char pad[4];
    union {
        char               bytes[64];
        int                value;
        unsigned long long align;
    } v;
} rt_launch_attr;
typedef struct {
    unsigned        grid[3], block[3], smem;
    rt_custream     stream;
    rt_launch_attr *attrs;
    unsigned        nattrs;
} rt_launch_config;

/* Entry points, resolved by rt_driver_init (valid only after it succeeded). Fields are named
 * after the exported symbol without its "cu" prefix and version suffix. */
typedef struct {
    rt_cures (*Init)(unsigned flags);
    rt_cures (*DriverGetVersion)(int *version);
    rt_cures (*DeviceGetCount)(int *count);
    rt_cures (*DeviceGet)(rt_cudev *dev, int ordinal);
    rt_cures (*DeviceGetAttribute)(int *value, int attrib, rt_cudev dev);
    rt_cures (*DeviceGetName)(char *name, int len, rt_cudev dev);
    rt_cures (*DevicePrimaryCtxRetain)(rt_cuctx *ctx, rt_cudev dev);
    rt_cures (*DevicePrimaryCtxRelease)(rt_cudev dev);
    rt_cures (*CtxSetCurrent)(rt_cuctx ctx);
    rt_cures (*CtxSynchronize)(void);
    rt_cures (*ModuleLoadData)(rt_cumod *mod, const void *image);
    rt_cures (*ModuleUnload)(rt_cumod mod);
    rt_cures (*ModuleGetFunction)(rt_cufn *fn, rt_cumod mod, const char *name);
    rt_cures (*FuncSetAttribute)(rt_cufn fn, int attrib, int value);
    rt_cures (*LaunchKernel)(rt_cufn f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                             unsigned by, unsigned bz, unsigned smem, rt_custream stream,
                             void **params, void **extra);
    rt_cures (*MemAlloc)(rt_cuptr *ptr, size_t bytes);
    rt_cures (*MemFree)(rt_cuptr ptr);
    rt_cures (*MemcpyHtoD)(rt_cuptr dst, const void *src, size_t bytes);
    rt_cures (*MemcpyHtoDAsync)(rt_cuptr dst, const void *src, size_t bytes, rt_custream stream);
    rt_cures (*MemAllocHost)(void **ptr, size_t bytes);
    rt_cures (*MemFreeHost)(void *ptr);
    rt_cures (*MemcpyDtoH)(void *dst, rt_cuptr src, size_t bytes);
    rt_cures (*MemHostAlloc)(void **ptr, size_t bytes, unsigned flags);
    rt_cures (*MemHostGetDevicePointer)(rt_cuptr *dptr, void *host, unsigned flags);
    rt_cures (*MemsetD8)(rt_cuptr dst, unsigned char value, size_t n);
    rt_cures (*MemcpyDtoDAsync)(rt_cuptr dst, rt_cuptr src, size_t bytes, rt_custream stream);
    rt_cures (*MemcpyDtoHAsync)(void *dst, rt_cuptr src, size_t bytes, rt_custream stream);
    rt_cures (*DeviceTotalMem)(size_t *bytes, rt_cudev dev);
    rt_cures (*StreamCreate)(rt_custream *stream, unsigned flags);
    rt_cures (*StreamDestroy)(rt_custream stream);
    rt_cures (*StreamSynchronize)(rt_custream stream);
    rt_cures (*StreamWaitEvent)(rt_custream stream, rt_cuevent ev, unsigned flags);
    rt_cures (*StreamBeginCapture)(rt_custream stream, int mode);
    rt_cures (*StreamEndCapture)(rt_custream stream, rt_cugraph *graph);
    rt_cures (*GraphInstantiateWithFlags)(rt_cugraphexec *exec, rt_cugraph graph,
                                          unsigned long long flags);
    rt_cures (*GraphLaunch)(rt_cugraphexec exec, rt_custream stream);
    rt_cures (*GraphExecDestroy)(rt_cugraphexec exec);
    rt_cures (*GraphDestroy)(rt_cugraph graph);
    rt_cures (*EventCreate)(rt_cuevent *ev, unsigned flags);
    rt_cures (*EventRecord)(rt_cuevent ev, rt_custream stream);
    rt_cures (*EventSynchronize)(rt_cuevent ev);
    rt_cures (*EventElapsedTime)(float *ms, rt_cuevent start, rt_cuevent end);
    rt_cures (*EventDestroy)(rt_cuevent ev);
    rt_cures (*GetErrorName)(rt_cures err, const char **s);
    rt_cures (*GetErrorString)(rt_cures err, const char **s);
    /* Optional (NULL when the driver lacks it): launches with attributes. */
    rt_cures (*LaunchKernelEx)(const rt_launch_config *cfg, rt_cufn f, void **params, void **extra);
} rt_cuda_api;

/* A runtime utility kernel (templates/util.lua: "fill_uniform", "l2_read") for arch, from the
 * kernel cache or NVRTC (cg_util_kernel), loaded into the current context. grid is the most
 * blocks of block threads to launch it with (the kernels loop with a grid stride). The caller
 * unloads mod. */
typedef struct {
    rt_cumod mod;
    rt_cufn  fn;
    unsigned grid, block;
} rt_util_kernel;
kiln_status rt_util_load(const char *kernel, const char *arch, rt_util_kernel *out);

/* One entry point of a dlopen'ed library: where it goes in an API struct of function pointers
 * and the symbol it is exported as. RT_DL_SYM(rt_cuda_api, Init, cuInit) makes one. */
typedef struct {
    size_t      off;
    const char *sym;
} rt_dl_sym;
#define RT_DL_SYM(api, field, sym) {offsetof(api, field), #sym}
/* Resolves the n symbols of syms from lib into the struct at api. Returns NULL, or the name of
 * the first symbol lib lacks (api then holds only those before it); the caller words the error,
 * since what a missing symbol means differs per library (old driver, old cuBLAS). */
const char *rt_dl_bind(void *lib, void *api, const rt_dl_sym *syms, size_t n);
/* The first of the n library names that dlopen loads, or NULL with *why the first one's dlerror
 * text (the name the error message should give). */
void       *rt_dl_open_first(const char *const *names, size_t n, const char **why);

/* The resolved entry points; NULL until rt_driver_init has succeeded. */
const rt_cuda_api *rt_cuda(void);
/* The driver's CUDA version as reported by cuDriverGetVersion (e.g. 12080), 0 if unknown. */
int rt_driver_version(void);
/* "CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)", for messages. Never NULL; the
 * text is static or owned by the driver. Writes into buf when it has to format. */
const char *rt_cu_errstr(rt_cures r, char *buf, size_t n);
/* KILN_ERR_CUDA: "<call> failed with <name> (<string>) while <what>". */
kiln_status rt_cuda_error(rt_cures r, const char *call, const char *what_fmt, ...) KB_PRINTF(3, 4);
/* Retains device `dev`'s primary context for the rest of the process (once per device), so
 * that sessions come and go without the driver tearing the context down and rebuilding it.
 * Sessions still retain and release their own reference. */
kiln_status rt_device_pin(int dev, rt_cudev *cudev);

/* ---- cuBLAS, also through dlopen (runtime/cublas.c) ------------------------------------------ */

typedef struct rt_cublas_s *rt_cublas;
#define RT_CUBLAS_OP_N 0
#define RT_CUBLAS_OP_T 1
#define RT_CUDA_R_32F 0
#define RT_CUDA_R_16F 2
#define RT_CUDA_R_16BF 14
#define RT_CUBLAS_COMPUTE_32F 68
#define RT_CUBLAS_GEMM_DEFAULT (-1)

typedef struct {
    int (*Create)(rt_cublas *h);
    int (*Destroy)(rt_cublas h);
    int (*SetStream)(rt_cublas h, rt_custream s);
    int (*SetWorkspace)(rt_cublas h, void *ws, size_t bytes);
    int (*GemmStridedBatchedEx)(rt_cublas h, int ta, int tb, int m, int n, int k, const void *alpha,
                                const void *A, int Atype, int lda, long long sA, const void *B, int Btype,
                                int ldb, long long sB, const void *beta, void *C, int Ctype, int ldc,
                                long long sC, int batch, int compute, int algo);
    const char *(*GetStatusString)(int status);
} rt_cublas_api;

/* Loads cuBLAS once per process; KILN_ERR_NO_GPU saying what is missing when it cannot. */
kiln_status rt_cublas_init(const rt_cublas_api **out);
/* KILN_ERR_CUDA: "cuBLAS call <call> failed with status N (<text>) while <what>". */
kiln_status rt_cublas_error(int status, const char *call, const char *what);

/* ---- NCCL (runtime/nccl.c; issue 30's collectives), through dlopen as cuBLAS ---------------
 * Our own declarations of the entry points used (nccl.h of NCCL 2.x: ncclResult_t is an int,
 * ncclUniqueId 128 bytes, ncclComm_t opaque). */
typedef struct {
    char internal[128];
} rt_nccl_id;
typedef struct rt_nccl_comm_s *rt_nccl_comm;
#define RT_NCCL_FLOAT32 7  /* ncclFloat32 */
#define RT_NCCL_SUM 0      /* ncclSum */

typedef struct {
    int (*GetVersion)(int *version);
    int (*GetUniqueId)(rt_nccl_id *id);
    int (*CommInitRank)(rt_nccl_comm *comm, int nranks, rt_nccl_id id, int rank);
    int (*CommInitAll)(rt_nccl_comm *comms, int ndev, const int *devlist);
    int (*CommDestroy)(rt_nccl_comm comm);
    int (*CommAbort)(rt_nccl_comm comm);
    int (*AllReduce)(const void *send, void *recv, size_t count, int dtype, int op, rt_nccl_comm comm, rt_custream s);
    int (*AllGather)(const void *send, void *recv, size_t count, int dtype, rt_nccl_comm comm, rt_custream s);
    int (*GroupStart)(void);
    int (*GroupEnd)(void);
    const char *(*GetErrorString)(int result);
} rt_nccl_api;

/* Loads NCCL once per process (libnccl.so.2, then libnccl.so, or $KILN_NCCL_LIB first); first
 * sets NCCL_NVLS_ENABLE=0 unless the environment has it (NVLink multicast stays off on the
 * machines kiln runs on). KILN_ERR_NO_GPU saying what is missing when it cannot load. */
kiln_status rt_nccl_init(const rt_nccl_api **out);
/* KILN_ERR_CUDA: "NCCL call <call> failed with result N (<text>) while <what>". */
kiln_status rt_nccl_error(int result, const char *call, const char *what);

/* ---- ranks run at once (runtime/ranks.c; kiln_group's runs) --------------------------------
 * rt_ranks_run calls fn(user, r) for every rank r of n at once: ranks 1.. on worker threads
 * kept for the runner's life, rank 0 on the caller's; it returns when all have returned. The
 * first failure calls fail(user, rank) once, under the runner's lock, and breaks the runner:
 * rt_ranks_run returns that rank's error (*failed its rank, else -1), and every later run fails
 * at once naming it. */
typedef struct rt_ranks rt_ranks;
typedef kiln_status (*rt_rank_fn)(void *user, int rank);
typedef void (*rt_rank_fail_fn)(void *user, int rank);
kiln_status rt_ranks_new(int n, rt_rank_fn fn, rt_rank_fail_fn fail, void *user, rt_ranks **out);
kiln_status rt_ranks_run(rt_ranks *p, int *failed);
int         rt_ranks_broken(rt_ranks *p); /* the rank that broke it, or -1 */
void        rt_ranks_free(rt_ranks *p);

#endif
