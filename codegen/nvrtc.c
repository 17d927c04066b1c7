/* NVRTC: CUDA source to cubin. The options are fixed apart from the architecture, so that a
 * kernel's cache key (which includes them) is the same on every run. */
#include "codegen/codegen.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <nvrtc.h>

static bool is_ptx_arch(const char *arch) { return strncmp(arch, "compute_", 8) == 0; }

static bool valid_arch(const char *arch) {
    kb_arch a;
    return kb_arch_parse(arch, &a);
}

/* The option strings live for the whole process: one per distinct architecture. */
#define MAX_ARCHS 64
static pthread_mutex_t arch_lock = PTHREAD_MUTEX_INITIALIZER;
static char arch_opts[MAX_ARCHS][40];
static int narch_opts;

static const char *arch_option(const char *arch) {
    char want[40];
    snprintf(want, sizeof want, "--gpu-architecture=%s", arch);
    const char *found = NULL;
    pthread_mutex_lock(&arch_lock);
    for (int i = 0; i < narch_opts && !found; i++)
        if (strcmp(arch_opts[i], want) == 0) found = arch_opts[i];
    if (!found && narch_opts < MAX_ARCHS) {
        strcpy(arch_opts[narch_opts], want);
        found = arch_opts[narch_opts++];
    }
    pthread_mutex_unlock(&arch_lock);
    return found;
}

/* Fills opts with the NVRTC options for arch; returns their count, or -1 when arch is not of
 * the form sm_<digits>[a]. The strings are static. */
int cg_nvrtc_options(const char *arch, const char *opts[CG_MAX_OPTS]) {
    if (!valid_arch(arch)) return -1;
    const char *a = arch_option(arch);
    if (!a) return -1;
    int n = 0;
    opts[n++] = a;
    opts[n++] = "--std=c++17";
    opts[n++] = "-default-device";
    return n;
}

kiln_status cg_nvrtc_version(int *major, int *minor) {
    nvrtcResult r = nvrtcVersion(major, minor);
    if (r != NVRTC_SUCCESS) return kb_error(KILN_ERR_NVRTC, "nvrtcVersion: %s", nvrtcGetErrorString(r));
    return NULL;
}

kiln_status cg_nvrtc_compile(const char *src, const char *name, const char *arch, void **cubin,
                             size_t *size) {
    *cubin = NULL;
    *size = 0;
    if (!src || !name) return kb_error(KILN_ERR_INVALID, "cg_nvrtc_compile: NULL argument");
    const char *opts[CG_MAX_OPTS];
    int nopts = cg_nvrtc_options(arch, opts);
    if (nopts < 0)
        return kb_error(KILN_ERR_INVALID, "bad GPU architecture '%s' (expected sm_<digits>[a], e.g. sm_90a, or "
                                          "compute_<digits>[a] for PTX)",
                        arch ? arch : "(null)");

    char file[80];
    snprintf(file, sizeof file, "%s.cu", name);
    nvrtcProgram prog;
    nvrtcResult r = nvrtcCreateProgram(&prog, src, file, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS)
        return kb_error(KILN_ERR_NVRTC, "nvrtc: kernel %s: nvrtcCreateProgram: %s", name, nvrtcGetErrorString(r));

    kiln_status st = NULL;
    r = nvrtcCompileProgram(prog, nopts, opts);
    if (r != NVRTC_SUCCESS) {
        size_t len = 0;
        char *log = NULL;
        if (nvrtcGetProgramLogSize(prog, &len) == NVRTC_SUCCESS && len > 0 && (log = malloc(len + 1)) &&
            nvrtcGetProgramLog(prog, log) == NVRTC_SUCCESS) {
            log[len] = 0;
            while (len > 0 && (log[len - 1] == '\n' || log[len - 1] == '\0')) log[--len] = 0;
        }
        st = kb_error(KILN_ERR_NVRTC, "nvrtc: kernel %s for %s failed (%s):\n%s", name, arch,
                      nvrtcGetErrorString(r), log && *log ? log : "(no log)");
        free(log);
    } else {
        /* A virtual arch gives PTX text (its size counts the NUL, which the driver needs). */
        bool   ptx = is_ptx_arch(arch);
        size_t n = 0;
        r = ptx ? nvrtcGetPTXSize(prog, &n) : nvrtcGetCUBINSize(prog, &n);
        void *buf = NULL;
        if (r == NVRTC_SUCCESS && n > 0) {
            buf = malloc(n);
            if (!buf) st = kb_oom();
            else if ((r = ptx ? nvrtcGetPTX(prog, buf) : nvrtcGetCUBIN(prog, buf)) != NVRTC_SUCCESS) {
                free(buf);
                buf = NULL;
            }
        }
        if (!st && !buf)
            st = kb_error(KILN_ERR_NVRTC, "nvrtc: kernel %s: no cubin for %s (%s)", name, arch,
                          r != NVRTC_SUCCESS ? nvrtcGetErrorString(r) : "empty");
        if (!st) {
            *cubin = buf;
            *size = n;
        }
    }
    nvrtcDestroyProgram(&prog);
    return st;
}
