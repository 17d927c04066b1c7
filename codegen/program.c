/* The program object: lowering a graph into a new kiln_program (cg_lower), its
 * specializations, freeing it, and what the public API reads of it (stats, description,
 * kernels, I/O bytes). Both compiling (codegen/compile.c) and loading a serialized program
 * (codegen/plan.c) build on this file, which calls neither: compile -> program <- plan. */
#include "codegen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- lowering ----------------------------------------------------------------------------- */

kiln_status cg_lower(const kiln_graph *g, const kiln_compile_opts *o, const char *arch, kiln_program **out) {
    *out = NULL;
    kiln_program *p = calloc(1, sizeof *p);
    if (!p) return kb_oom();
    snprintf(p->arch, sizeof p->arch, "%s", arch);
    kiln_status st = ir_lower(g, &p->ir);
    if (!st) st = ir_run_passes(p->ir, !o->no_fuse, o->no_fuse_passes);
    if (st) {
        kiln_program_free(p);
        return st;
    }
    *out = p;
    return NULL;
}

kiln_status cg_program_from_ir(ir_prog *ir, const char *arch, kiln_program **out) {
    *out = NULL;
    kiln_program *p = calloc(1, sizeof *p);
    if (!p) {
        ir_prog_free(ir);
        return kb_oom();
    }
    snprintf(p->arch, sizeof p->arch, "%s", arch);
    p->ir = ir;
    *out = p;
    return NULL;
}

kiln_status cg_bind_graph(const kiln_graph *g, const char *text, int d, int64_t v, kiln_ctx **bctx,
                          kiln_graph **bg) {
    *bg = NULL;
    kiln_status st = fe_ctx_specialize(g->ctx, text, d, v, bctx);
    if (!st) st = kiln_graph_new(*bctx, bg);
    if (st) {
        kiln_ctx_free(*bctx);
        *bctx = NULL;
    }
    return st;
}

const char *cg_spec_label(const kiln_ctx *ctx, int d, int64_t v, char *buf, size_t len) {
    snprintf(buf, len, "%s %s %lld", ctx->dims[d].name, v < 0 ? "<=" : "=", (long long)(v < 0 ? -v : v));
    return buf;
}

void cg_program_add_spec(kiln_program *p, int d, int64_t v, kiln_program *sp, kiln_ctx *bctx, kiln_graph *bg) {
    sp->own_ctx = bctx;
    sp->own_graph = bg;
    p->spec[p->nspec] = sp;
    p->spec_dim[p->nspec] = d;
    p->spec_val[p->nspec++] = v;
}

/* ---- the object and its accessors ------------------------------------------------------------ */

void kiln_program_free(kiln_program *p) {
    if (!p) return;
    for (int i = 0; i < p->nspec; i++) kiln_program_free(p->spec[i]);
    free(p->spec);
    for (int i = 0; i < p->nkernels; i++) cg_kernel_clear(&p->kernels[i]);
    free(p->kernels);
    ir_prog_free(p->ir);
    kiln_graph_free(p->own_graph);
    kiln_ctx_free(p->own_ctx);
    free(p);
}

void kiln_program_stats(const kiln_program *p, kiln_compile_stats *stats) {
    if (p && stats) *stats = p->stats;
}

kiln_status kiln_program_describe(const kiln_program *p, char **text) {
    if (!p || !text) return kb_error(KILN_ERR_INVALID, "kiln_program_describe: NULL argument");
    kb_str o = {0};
    cg_describe_one(p, &o);
    for (int i = 0; i < p->nspec; i++) {
        const kiln_ctx *ctx = p->ir->g->ctx;
        char label[FE_MAX_NAME + 32];
        kb_str_addf(&o, "\nspecialization %d: %s\n", i + 1, cg_spec_label(ctx, p->spec_dim[i], p->spec_val[i], label,
                                                                        sizeof label));
        cg_describe_one(p->spec[i], &o);
    }
    *text = kb_str_take(&o);
    return *text ? NULL : kb_oom();
}

void cg_describe_one(const kiln_program *p, kb_str *out) {
    kb_str o = *out;
    kb_str_addf(&o, "kiln %s program for %s\n", KILN_VERSION, p->arch);
    ir_print(p->ir, &o);
    kb_str_add(&o, "launches:\n");
    if (p->scratch_bytes) kb_str_addf(&o, "  scratch: %zu bytes, shared by the steps of each node in turn\n", p->scratch_bytes);
    for (int i = 0; i < p->nkernels; i++) {
        const cg_kernel *k = &p->kernels[i];
        if (k->kind == CG_COLLECTIVE)
            kb_str_addf(&o, "  k%d %s NCCL all_reduce over %d ranks, %lld floats%s key %s\n", i, k->name, k->coll.ranks,
                        (long long)k->coll.count, k->coll.count_sym >= 0 ? " at most" : "", k->key_hex);
        else if (k->kind == CG_GEMM)
            kb_str_addf(&o, "  k%d %s cuBLAS m %d n %d k %d batch %d key %s\n", i, k->name, k->gemm.m, k->gemm.n,
                        k->gemm.k, k->gemm.batch, k->key_hex);
        else
            kb_str_addf(&o, "  k%d %s grid (%u, %u, %u) block (%u, %u, %u) key %s\n", i, k->name, k->grid[0],
                        k->grid[1], k->grid[2], k->block[0], k->block[1], k->block[2], k->key_hex);
    }
    *out = o;
}

int kiln_program_kernel_count(const kiln_program *p) { return p ? p->nkernels : 0; }

const char *kiln_program_arch(const kiln_program *p) { return p ? p->arch : NULL; }

/* The experts of buffer b a run can read: n_expert when something other than mul_mat_id's
 * `as` operand reads it, else the most any mul_mat_id reading it can select (n_used x
 * n_tokens, at most n_expert). Returns the fraction as a count over n_expert. */
static double expert_share(const ir_prog *ir, int b) {
    double share = 0;
    bool   read = false;
    for (int i = 0; i < ir->nnodes; i++) {
        const ir_node *n = &ir->nodes[i];
        if (n->dead) continue;
        for (int k = 0; k < n->nin; k++) {
            if (n->in[k].buf != b) continue;
            read = true;
            const ir_ref *as = n->kind == IR_OP && n->op == FE_OP_MUL_MAT_ID ? ir_operand(n, 0) : NULL;
            const ir_ref *ids = as ? ir_operand(n, 2) : NULL;
            if (as != &n->in[k] || !ids || ir_operand(n, 1) == &n->in[k] || ids == &n->in[k]) return 1.0;
            double e = (double)as->ne[2], sel = (double)ids->ne[0] * (double)ids->ne[1];
            double s = (sel < e ? sel : e) / e;
            if (s > share) share = s;
        }
    }
    return read ? share : 1.0;
}

size_t kiln_program_io_bytes(const kiln_program *p) {
    size_t n = 0;
    for (int b = 0; p && b < p->ir->nbufs; b++) {
        const ir_buf *buf = &p->ir->bufs[b];
        if (buf->kind == IR_BUF_TEMP || buf->block) continue; /* a block's members: counted as the block */
        n += buf->kind == IR_BUF_OUTPUT ? buf->bytes : (size_t)((double)buf->bytes * expert_share(p->ir, b) + 0.5);
    }
    return n;
}

static const cg_kernel *kernel_at(const kiln_program *p, int i) {
    return p && i >= 0 && i < p->nkernels ? &p->kernels[i] : NULL;
}

const char *kiln_program_kernel_source(const kiln_program *p, int i) {
    const cg_kernel *k = kernel_at(p, i);
    return k ? k->source : NULL;
}

const char *kiln_program_kernel_key(const kiln_program *p, int i) {
    const cg_kernel *k = kernel_at(p, i);
    return k ? k->key_hex : NULL;
}

const char *kiln_program_kernel_name(const kiln_program *p, int i) {
    const cg_kernel *k = kernel_at(p, i);
    return k ? k->name : NULL;
}
