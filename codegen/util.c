/* The runtime's utility kernels (templates/util.lua: the random weight fill, the L2 flush),
 * instantiated, keyed and compiled like a program's kernels: the same template engine, the
 * same key (kc_kernel_key over source, NVRTC options, arch and versions) and the same kernel
 * cache entries, so a second process loads the cubin instead of running NVRTC. */
#include "codegen/codegen.h"

#include <stdlib.h>
#include <string.h>

/* The cache a utility kernel goes through: cache_dir, else the default directory, with
 * $KILN_CACHE's mode. Without any directory to be found ($KILN_CACHE_DIR, $XDG_CACHE_HOME and
 * $HOME unset) the kernel is compiled uncached, as before it was cached at all: a session or
 * the bench need not fail for want of a place to keep two small cubins. */
static kiln_status open_cache(const char *cache_dir, kc_cache *c) {
    kiln_status st = kc_env_mode(KILN_CACHE_ON, &c->mode);
    if (st || c->mode == KILN_CACHE_OFF) return st;
    if ((st = kc_default_dir(cache_dir, &c->dir))) {
        kiln_status_free(st);
        c->mode = KILN_CACHE_OFF;
    }
    return NULL;
}

/* The target of arch: NVRTC's options and version, as kiln_compile's keys have them. */
static kiln_status target_for(const char *arch, const char *opts[CG_MAX_OPTS], cg_target *t) {
    *t = (cg_target){.arch = arch, .opts = opts, .nopts = cg_nvrtc_options(arch, opts)};
    if (t->nopts < 0)
        return kb_error(KILN_ERR_INVALID, "bad GPU architecture '%s' (expected sm_<digits>[a], e.g. sm_90a)", arch);
    return cg_nvrtc_version(&t->nvrtc_major, &t->nvrtc_minor);
}

kiln_status cg_util_kernel(const char *kernel, const char *arch, const char *cache_dir, cg_kernel *k) {
    if (!kernel || !arch || !k) return kb_error(KILN_ERR_INVALID, "cg_util_kernel: NULL argument");
    memset(k, 0, sizeof *k);
    const char *opts[CG_MAX_OPTS];
    cg_target   t;
    cg_lua     *L = NULL;
    kc_cache    c = {0};
    bool        compiled = false;
    kiln_status st = target_for(arch, opts, &t);
    if (!st) st = cg_lua_new(&L);
    if (!st) st = cg_generate_util(L, kernel, k);
    cg_lua_free(L);
    if (!st) {
        cg_kernel_key(k, &t);
        st = open_cache(cache_dir, &c);
    }
    if (!st) st = cg_kernel_code(k, &t, &c, &compiled, NULL);
    free(c.dir);
    if (st) {
        st = kb_wrap(st, "utility kernel %s for %s", kernel, arch);
        cg_kernel_clear(k);
    }
    return st;
}
