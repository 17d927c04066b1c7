/* A kernel's key and code: the cubin from the kernel cache, else from NVRTC and then stored
 * (docs/cache.md). One path for a program's kernels (codegen/compile.c, on its thread pool) and
 * the runtime's utility kernels (codegen/util.c), so both are keyed and cached alike. */
#include "codegen/codegen.h"

#include <stdlib.h>
#include <string.h>

void cg_kernel_key(cg_kernel *k, const cg_target *t) {
    kc_key key = kc_kernel_key(k->source, t->opts, t->nopts, t->arch, t->nvrtc_major, t->nvrtc_minor,
                               CG_CODEGEN_VERSION);
    memcpy(k->key, key.b, 16);
    kc_key_hex(key, k->key_hex);
}

/* What the key was made of, kept with the entry for `kiln cache ls` and `kiln cache explain`. */
static char *kernel_meta(const cg_target *t, const cg_kernel *k) {
    kb_str m = {0};
    kb_str_addf(&m, "kernel %s\nkiln %s\ncodegen %d\nnvrtc %d.%d\narch %s\noptions", k->name, KILN_VERSION,
                CG_CODEGEN_VERSION, t->nvrtc_major, t->nvrtc_minor, t->arch);
    for (int i = 0; i < t->nopts; i++) kb_str_addf(&m, " %s", t->opts[i]);
    kb_str_add(&m, "\n--- source\n");
    kb_str_add(&m, k->source);
    return kb_str_take(&m);
}

kiln_status cg_kernel_code(cg_kernel *k, const cg_target *t, kc_cache *c, bool *compiled, int *corrupt) {
    kc_key key;
    memcpy(key.b, k->key, 16);
    *compiled = false;
    kiln_status st = kc_get(c, KC_CUBIN, key, &k->cubin, &k->cubin_size, corrupt);
    if (!st && k->cubin) k->from_cache = true;
    if (st || k->cubin) return st;
    if ((st = cg_nvrtc_compile(k->source, k->name, t->arch, &k->cubin, &k->cubin_size))) return st;
    *compiled = true;
    char *meta = kernel_meta(t, k);
    st = meta ? kc_put(c, KC_CUBIN, key, meta, k->cubin, k->cubin_size) : kb_oom();
    free(meta);
    return st;
}
