/* NCCL through dlopen, like cuBLAS (issue 30: the all-reduces and gathers of tensor-parallel
 * programs): the binary neither links nor needs it; only a program split over several GPUs
 * will load it, and a machine without it gets an error saying what to install.
 *
 * NVLink multicast (NVLS) must stay off on the machines kiln runs on, so NCCL_NVLS_ENABLE=0 is
 * set in the process before NCCL is loaded, unless the environment already sets it. */
#include "runtime/runtime.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static rt_nccl_api    g_api;
static kiln_status    g_err;
static bool           g_ok;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#define RT_NCCL_SYM(field, sym) RT_DL_SYM(rt_nccl_api, field, sym)
static const rt_dl_sym g_syms[] = {
    RT_NCCL_SYM(GetVersion, ncclGetVersion),     RT_NCCL_SYM(GetUniqueId, ncclGetUniqueId),
    RT_NCCL_SYM(CommInitRank, ncclCommInitRank), RT_NCCL_SYM(CommInitAll, ncclCommInitAll),
    RT_NCCL_SYM(CommDestroy, ncclCommDestroy),   RT_NCCL_SYM(CommAbort, ncclCommAbort),
    RT_NCCL_SYM(AllReduce, ncclAllReduce),
    RT_NCCL_SYM(AllGather, ncclAllGather),       RT_NCCL_SYM(GroupStart, ncclGroupStart),
    RT_NCCL_SYM(GroupEnd, ncclGroupEnd),         RT_NCCL_SYM(GetErrorString, ncclGetErrorString),
};

static void do_init(void) {
    setenv("NCCL_NVLS_ENABLE", "0", 0); /* 0: keep a value the user set */
    const char *own = getenv("KILN_NCCL_LIB");
    const char *names[] = {own && *own ? own : "libnccl.so.2", "libnccl.so.2", "libnccl.so"};
    const char *why;
    void       *lib = rt_dl_open_first(names, sizeof names / sizeof names[0], &why);
    if (!lib) {
        g_err = kb_error(KILN_ERR_NO_GPU,
                         "cannot load NCCL (%s: %s); a program split over several GPUs needs it: install NCCL 2 "
                         "(Debian/Ubuntu: libnccl2), add its folder to LD_LIBRARY_PATH, or name the library in "
                         "KILN_NCCL_LIB", names[0], why ? why : "not found");
        return;
    }
    const char *missing = rt_dl_bind(lib, &g_api, g_syms, sizeof g_syms / sizeof g_syms[0]);
    if (missing) {
        g_err = kb_error(KILN_ERR_NO_GPU, "NCCL (%s) has no entry point %s (NCCL 2.x is needed)", names[0], missing);
        return;
    }
    g_ok = true;
}

kiln_status rt_nccl_init(const rt_nccl_api **out) {
    pthread_once(&g_once, do_init);
    *out = g_ok ? &g_api : NULL;
    return g_ok ? NULL : kb_error(kiln_status_code(g_err), "%s", kiln_status_msg(g_err));
}

kiln_status rt_nccl_error(int r, const char *call, const char *what) {
    const char *s = g_api.GetErrorString ? g_api.GetErrorString(r) : NULL;
    return kb_error(KILN_ERR_CUDA, "NCCL call %s failed with result %d (%s) while %s", call, r, s ? s : "?", what);
}
