/* The pass pipeline, top to bottom. The verifier runs after every pass: it is cheap next to
 * code generation, and a broken invariant caught here names the pass that broke it. */
#include "ir_internal.h"

#include <string.h>

const ir_fusion ir_fusions[] = {
    {"get_rows_one", ir_fuse_get_rows_one, "get_rows of a one-row f32 source by one id (the last layer's output pick at decode): the source, read in place"},
    {"rope_set_rows", ir_fuse_rope_set_rows, "rope_ext -> view -> set_rows: rotated rows written straight into the cache"},
    {"topk_moe", ir_fuse_topk_moe, "MoE routing (gating, top-k, weights, normalization, scale) in one kernel per row"},
    {"mul_mat_glu", ir_fuse_mul_mat_glu, "gate and up mul_mat(_id) sharing an input, feeding a GLU, in one kernel"},
    {"mul_mat_id_bias", ir_fuse_mul_mat_id_bias, "add_id (per-expert biases) after a mul_mat_id: added at its store"},
    {"rms_norm_mul", ir_fuse_rms_norm_mul, "rms_norm/norm -> mul(weight) (-> add) in one kernel"},
    {"add_chain", ir_fuse_add_chain, "a residual plus several adds (MoE expert slices) in one kernel"},
    {"mul_mat_cat", ir_fuse_mul_mat_cat, "mul_mats sharing an input (q, k, v) as one mul_mat over their weights side by side"},
    {"rms_norm_gemv", ir_fuse_rms_norm_gemv, "rms_norm_mul feeding one decode GEMV: the norm computed by the GEMV from the column it streams"},
    {"ew_chain", ir_fuse_elementwise, "chains of elementwise ops (and copies, casts, GLUs) in one kernel"},
    {"gemv_rope", ir_fuse_gemv_rope, "rope of q, rope + cache row of k, cache row of v computed by the decode q/k/v GEMV's store"},
    {"head_rope", ir_fuse_head_rope, "per-head q/k norms, ropes and cache rows of one token that no GEMV store took, in one kernel"},
};
const int ir_nfusions = (int)(sizeof ir_fusions / sizeof ir_fusions[0]);

static kiln_status run(ir_prog *p, const char *name, kiln_status (*pass)(ir_prog *)) {
    kiln_status st = pass(p);
    if (!st) st = ir_verify(p);
    return st ? kb_wrap(st, "pass %s", name) : NULL;
}

/* Whether `name` is one of the comma-separated names in list. */
static bool listed(const char *list, const char *name, size_t len) {
    for (const char *s = list; s && *s;) {
        const char *e = strchr(s, ',');
        size_t      n = e ? (size_t)(e - s) : strlen(s);
        if (n == len && strncmp(s, name, len) == 0) return true;
        s = e ? e + 1 : NULL;
    }
    return false;
}

/* Every name in skip must be a fusion pass: a typo must not silently leave fusion on. */
kiln_status ir_check_fusion_list(const char *skip) {
    for (const char *s = skip; s && *s;) {
        const char *e = strchr(s, ',');
        size_t      n = e ? (size_t)(e - s) : strlen(s);
        bool        ok = false;
        for (int i = 0; i < ir_nfusions && !ok; i++) ok = strlen(ir_fusions[i].name) == n && !strncmp(s, ir_fusions[i].name, n);
        if (!ok) {
            kb_str names = {0};
            for (int i = 0; i < ir_nfusions; i++) kb_str_addf(&names, "%s%s", i ? ", " : "", ir_fusions[i].name);
            kiln_status st = kb_error(KILN_ERR_INVALID, "no-fuse: unknown fusion pass '%.*s' (passes: %s)", (int)n, s,
                                      names.s ? names.s : "");
            kb_str_free(&names);
            return st;
        }
        s = e ? e + 1 : NULL;
    }
    return NULL;
}

kiln_status ir_run_passes(ir_prog *p, bool fuse, const char *skip) {
    kiln_status st = ir_check_fusion_list(skip);
    if (st) return st;
    if ((st = ir_verify(p))) return kb_wrap(st, "lowering");
    for (int i = 0; fuse && i < ir_nfusions; i++) {
        const ir_fusion *f = &ir_fusions[i];
        if (listed(skip, f->name, strlen(f->name))) continue;
        if ((st = run(p, f->name, f->run))) return st;
    }
    return run(p, "memplan", ir_memplan);
}
