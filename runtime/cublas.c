/* cuBLAS through dlopen, like the driver: the binary neither links nor needs it unless a
 * program has a library GEMM step (large mul_mat), and then only when a session is created.
 *
 * Our own declarations of the few entry points used; enum values checked against
 * cublas_api.h and library_types.h (CUDA 13.0). */
#include "runtime/runtime.h"

#include <pthread.h>
#include <stdio.h>

static rt_cublas_api  g_api;
static kiln_status    g_err;
static bool           g_ok;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#define RT_BLAS_SYM(field, sym) RT_DL_SYM(rt_cublas_api, field, sym)
static const rt_dl_sym g_syms[] = {
    RT_BLAS_SYM(Create, cublasCreate_v2),
    RT_BLAS_SYM(Destroy, cublasDestroy_v2),
    RT_BLAS_SYM(SetStream, cublasSetStream_v2),
    RT_BLAS_SYM(SetWorkspace, cublasSetWorkspace_v2),
    RT_BLAS_SYM(GemmStridedBatchedEx, cublasGemmStridedBatchedEx),
    RT_BLAS_SYM(GetStatusString, cublasGetStatusString),
};

static void do_init(void) {
    /* The soname of the toolkit we build against first, then older and unversioned ones; the
     * rpath (/usr/local/cuda/lib64) is searched for the bare names, the full path is a last
     * resort for binaries started without it. */
    static const char *names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so",
                                  "/usr/local/cuda/lib64/libcublas.so.13", "/usr/local/cuda/lib64/libcublas.so"};
    const char *why;
    void       *lib = rt_dl_open_first(names, sizeof names / sizeof names[0], &why);
    if (!lib) {
        g_err = kb_error(KILN_ERR_NO_GPU,
                         "cannot load cuBLAS (libcublas.so.13 or .12: %s); the program has library GEMM steps "
                         "(large mul_mat). Install the CUDA toolkit's cuBLAS or add its folder to LD_LIBRARY_PATH",
                         why ? why : "not found");
        return;
    }
    const char *missing = rt_dl_bind(lib, &g_api, g_syms, sizeof g_syms / sizeof g_syms[0]);
    if (missing) {
        g_err = kb_error(KILN_ERR_NO_GPU, "cuBLAS has no entry point %s (too old?)", missing);
        return;
    }
    g_ok = true;
}

kiln_status rt_cublas_init(const rt_cublas_api **out) {
    pthread_once(&g_once, do_init);
    *out = g_ok ? &g_api : NULL;
    return g_ok ? NULL : kb_error(kiln_status_code(g_err), "%s", kiln_status_msg(g_err));
}

kiln_status rt_cublas_error(int r, const char *call, const char *what) {
    const char *s = g_api.GetStatusString ? g_api.GetStatusString(r) : NULL;
    return kb_error(KILN_ERR_CUDA, "cuBLAS call %s failed with status %d (%s) while %s", call, r, s ? s : "?", what);
}
