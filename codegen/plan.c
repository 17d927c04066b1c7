/* Serialized programs ("plans"): everything kiln_compile produced — the lowered IR, the kernel
 * table with sources, launch configurations, GEMM calls, keys, the distinct cubins, and the
 * specializations — so that a program-cache hit or a bundle runs neither Lua nor NVRTC
 * (docs/cache.md, "Program entries").
 *
 * A program-cache hit takes the stored IR (its key names the graph, the options and the kiln
 * build: lowering again would give the same); a bundle, paired with a graph by its caller,
 * lowers that graph again and must match the fingerprint of the IR's printed form stored in the
 * plan, which proves that the kernel table fits it. */
#include "codegen/codegen.h"

#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

static const char plan_magic[8] = {'K', 'I', 'L', 'N', 'P', 'L', 'A', 'N'};

uint64_t cg_ir_fingerprint(const ir_prog *ir) {
    kb_str o = {0};
    ir_print(ir, &o);
    uint64_t h = XXH3_64bits(o.s ? o.s : "", o.len);
    kb_str_free(&o);
    return h;
}

static void put_i64(kb_str *b, int64_t v) { kb_put_u64(b, (uint64_t)v); }
static int64_t get_i64(kb_reader *r, const char *what) { return (int64_t)kb_get_u64(r, what); }

static void put_mat(kb_str *b, const cg_mat *m) {
    put_i64(b, m->param);
    put_i64(b, m->offset);
    kb_put_u32(b, (uint32_t)m->type);
    put_i64(b, m->ld);
    put_i64(b, m->stride);
}

static void put_gemm(kb_str *b, const cg_gemm *g) {
    kb_put_u32(b, (uint32_t)g->ta | (uint32_t)g->tb << 1);
    put_i64(b, g->m);
    put_i64(b, g->n);
    put_i64(b, g->k);
    put_i64(b, g->batch);
    put_mat(b, &g->a);
    put_mat(b, &g->b);
    put_mat(b, &g->c);
    put_i64(b, g->n_sym);
    put_i64(b, g->n_mul);
    put_i64(b, g->n_above);
}

static void put_coll(kb_str *b, const cg_coll *c) {
    put_i64(b, c->ranks);
    put_i64(b, c->count);
    put_i64(b, c->count_sym);
    put_i64(b, c->count_mul);
    put_mat(b, &c->src);
    put_mat(b, &c->dst);
}

/* The first kernel before `upto` with this key: it owns the source and code both share. */
static int first_with_key(const kiln_program *p, int upto, const uint8_t key[16]) {
    for (int i = 0; i < upto; i++)
        if (memcmp(p->kernels[i].key, key, 16) == 0) return i;
    return -1;
}

/* A kernel: what locates and launches it, then — unless an earlier kernel has its key (twin
 * >= 0) — its name, source and code. */
static void put_kernel(kb_str *b, const cg_kernel *k, int64_t twin) {
    kb_put_u32(b, (uint32_t)k->kind);
    put_i64(b, k->node);
    put_i64(b, k->step);
    put_i64(b, k->nsteps);
    kb_str_addn(b, (const char *)k->key, 16);
    put_i64(b, twin);
    for (int d = 0; d < 3; d++) kb_put_u32(b, k->grid[d]);
    for (int d = 0; d < 3; d++) kb_put_u32(b, k->block[d]);
    kb_put_u32(b, k->smem);
    put_i64(b, k->nparams);
    for (int a = 0; a < k->nparams; a++) put_i64(b, k->params[a]);
    kb_put_u64(b, k->scratch);
    put_gemm(b, &k->gemm);
    put_coll(b, &k->coll);
    if (twin >= 0) return;
    kb_put_cstr(b, k->name);
    kb_put_cstr(b, k->source);
    kb_put_u32(b, k->cubin != NULL);
    if (k->cubin) kb_put_blob(b, k->cubin, k->cubin_size);
}

kiln_status cg_plan_write(const kiln_program *p, kb_str *b) {
    kb_str_addn(b, plan_magic, 8);
    kb_put_u32(b, CG_PLAN_VERSION);
    kb_put_cstr(b, p->arch);
    kb_put_u64(b, cg_ir_fingerprint(p->ir));
    kb_put_u64(b, p->scratch_bytes);
    cg_ir_write(b, p->ir);
    put_i64(b, p->nkernels);
    for (int i = 0; i < p->nkernels; i++) put_kernel(b, &p->kernels[i], first_with_key(p, i, p->kernels[i].key));
    put_i64(b, p->nspec);
    for (int i = 0; i < p->nspec; i++) {
        put_i64(b, p->spec_dim[i]);
        put_i64(b, p->spec_val[i]);
        kb_str sub = {0};
        kiln_status st = cg_plan_write(p->spec[i], &sub);
        if (!st && sub.oom) st = kb_oom();
        if (!st) kb_put_blob(b, sub.s, sub.len);
        kb_str_free(&sub);
        if (st) return st;
    }
    return b->oom ? kb_oom() : NULL;
}

/* ---- reading ------------------------------------------------------------------------------ */

static void get_mat(kb_reader *r, cg_mat *m) {
    m->param = (int)get_i64(r, "gemm operand");
    m->offset = get_i64(r, "gemm operand");
    m->type = (kiln_type)kb_get_u32(r, "gemm operand");
    m->ld = get_i64(r, "gemm operand");
    m->stride = get_i64(r, "gemm operand");
}

static void get_gemm(kb_reader *r, cg_gemm *g) {
    uint32_t t = kb_get_u32(r, "gemm");
    g->ta = t & 1;
    g->tb = (t >> 1) & 1;
    g->m = (int)get_i64(r, "gemm");
    g->n = (int)get_i64(r, "gemm");
    g->k = (int)get_i64(r, "gemm");
    g->batch = (int)get_i64(r, "gemm");
    get_mat(r, &g->a);
    get_mat(r, &g->b);
    get_mat(r, &g->c);
    g->n_sym = (int)get_i64(r, "gemm");
    g->n_mul = (int)get_i64(r, "gemm");
    g->n_above = (int)get_i64(r, "gemm");
}

static void get_coll(kb_reader *r, cg_coll *c) {
    c->ranks = (int)get_i64(r, "collective");
    c->count = get_i64(r, "collective");
    c->count_sym = (int)get_i64(r, "collective");
    c->count_mul = (int)get_i64(r, "collective");
    get_mat(r, &c->src);
    get_mat(r, &c->dst);
}

static void get_key(kb_reader *r, cg_kernel *k) {
    if (r->err) return;
    if (r->len - r->pos < 16) {
        r->err = "kernel key", r->err_at = r->pos;
        return;
    }
    memcpy(k->key, r->p + r->pos, 16);
    r->pos += 16;
    kc_key key;
    memcpy(key.b, k->key, 16);
    kc_key_hex(key, k->key_hex); /* (16 snprintf calls a kernel were a tenth of a cache hit) */
}

/* Name, source and code of a kernel that owns them. The code gets one spare NUL: PTX text must
 * be NUL-terminated for the driver. */
static kiln_status get_owned(kb_reader *r, cg_kernel *k) {
    kb_get_str_into(r, k->name, sizeof k->name, "kernel name");
    k->source = kb_get_str(r, "kernel source");
    if (!kb_get_u32(r, "kernel code flag") || r->err) return NULL;
    size_t      n;
    const void *d = kb_get_blob(r, &n, "kernel code");
    if (r->err) return NULL;
    if (!(k->cubin = malloc(n + 1))) return kb_oom();
    memcpy(k->cubin, d, n);
    ((char *)k->cubin)[n] = 0;
    k->cubin_size = n;
    k->from_cache = true;
    return NULL;
}

static void borrow(cg_kernel *k, const cg_kernel *twin) {
    memcpy(k->name, twin->name, sizeof k->name);
    k->source = twin->source;
    k->cubin = twin->cubin;
    k->cubin_size = twin->cubin_size;
    k->from_cache = twin->from_cache;
    k->source_borrowed = k->cubin_borrowed = true;
}

/* Kernel i. What the runtime trusts is checked against the IR by check_kernel. */
static kiln_status get_kernel(kb_reader *r, kiln_program *p, int i) {
    cg_kernel *k = &p->kernels[i];
    k->kind = (cg_step_kind)kb_get_u32(r, "kernel kind");
    k->node = (int)get_i64(r, "kernel node");
    k->step = (int)get_i64(r, "kernel step");
    k->nsteps = (int)get_i64(r, "kernel step");
    get_key(r, k);
    int64_t twin = get_i64(r, "kernel twin");
    for (int d = 0; d < 3; d++) k->grid[d] = kb_get_u32(r, "launch grid");
    for (int d = 0; d < 3; d++) k->block[d] = kb_get_u32(r, "launch block");
    k->smem = kb_get_u32(r, "shared memory");
    int64_t np = get_i64(r, "parameter count");
    if (np < 0 || np > (int64_t)(sizeof k->params / sizeof k->params[0])) {
        if (!r->err) r->err = "parameter count", r->err_at = r->pos;
        np = 0;
    }
    k->nparams = (int)np;
    for (int a = 0; a < k->nparams; a++) k->params[a] = (int)get_i64(r, "parameter");
    k->scratch = (size_t)kb_get_u64(r, "scratch");
    get_gemm(r, &k->gemm);
    get_coll(r, &k->coll);
    if (r->err) return NULL;
    if (twin < 0) return get_owned(r, k);
    if (twin >= i || memcmp(p->kernels[twin].key, k->key, 16) != 0)
        return kb_error(KILN_ERR_FORMAT, "kernel %d shares the code of kernel %lld, which is not an earlier one with its key",
                        i, (long long)twin);
    borrow(k, &p->kernels[twin]);
    return NULL;
}

/* A collective's operand: a buffer parameter (not the scratch or the dims), the call's values
 * inside it. */
static bool coll_ref_ok(const kiln_program *p, const cg_kernel *k, const cg_mat *m) {
    if (m->param < 0 || m->param >= k->nparams || m->type != KILN_F32 || m->offset < 0 || m->offset % 4) return false;
    int buf = k->params[m->param];
    if (buf < 0 || buf >= p->ir->nbufs) return false;
    return k->coll.count <= ((int64_t)p->ir->bufs[buf].bytes - m->offset) / 4;
}

static bool coll_ok(const kiln_program *p, const cg_kernel *k) {
    const cg_coll *c = &k->coll;
    if (c->ranks < 2 || c->ranks > 64 || c->count < 1 || c->count_sym < -1 || c->count_sym >= KILN_MAX_SYMS) return false;
    if (c->count_sym >= 0 && c->count_mul < 1) return false;
    return coll_ref_ok(p, k, &c->src) && coll_ref_ok(p, k, &c->dst);
}

/* What the runtime trusts about a kernel: the node, parameters and operands it names exist. */
static kiln_status check_kernel(const kiln_program *p, int i) {
    const cg_kernel *k = &p->kernels[i];
    const char      *bad = NULL;
    if (k->kind != CG_LAUNCH && k->kind != CG_GEMM && k->kind != CG_COLLECTIVE) bad = "kind";
    else if (k->node < 0 || k->node >= p->ir->nnodes || !ir_launches(p->ir, k->node)) bad = "node";
    else if (k->step < 0 || k->step >= k->nsteps) bad = "step";
    else if ((k->kind == CG_LAUNCH) != (k->cubin != NULL) || !k->source) bad = "code";
    else if (k->scratch > p->scratch_bytes) bad = "scratch size";
    for (int a = 0; !bad && a < k->nparams; a++)
        if (k->params[a] != CG_PARAM_SCRATCH && k->params[a] != CG_PARAM_DIMS &&
            (k->params[a] < 0 || k->params[a] >= p->ir->nbufs))
            bad = "parameter buffer";
    const cg_mat *m[3] = {&k->gemm.a, &k->gemm.b, &k->gemm.c};
    for (int j = 0; !bad && k->kind == CG_GEMM && j < 3; j++)
        if (m[j]->param < 0 || m[j]->param >= k->nparams || (unsigned)m[j]->type >= KILN_TYPE_COUNT) bad = "gemm operand";
    if (!bad && k->kind == CG_COLLECTIVE && !coll_ok(p, k)) bad = "collective";
    if (!bad) return NULL;
    return kb_error(KILN_ERR_FORMAT, "kernel %d ('%s') has an invalid %s", i, k->name, bad);
}

static kiln_status read_kernels(kb_reader *r, kiln_program *p) {
    int64_t n = get_i64(r, "kernel count");
    if (r->err) return NULL;
    if (n < 0 || n > 1000000) return kb_error(KILN_ERR_FORMAT, "kernel count %lld is out of range", (long long)n);
    if (!(p->kernels = calloc((size_t)n + 1, sizeof *p->kernels))) return kb_oom();
    kiln_status st = NULL;
    for (int i = 0; i < n && !r->err && !st; i++) {
        p->nkernels = i + 1;
        st = get_kernel(r, p, i);
        if (!st && !r->err) st = check_kernel(p, i);
    }
    return st;
}

static kiln_status read_one(kb_reader *r, const kiln_graph *g, const char *text, const kiln_compile_opts *o,
                            bool keyed, kiln_program **out);

static kiln_status read_spec_list(kb_reader *r, const kiln_graph *g, const kiln_compile_opts *o, bool keyed,
                                  kiln_program *p, int64_t n, const char *text);

/* text: g's context printed, when the caller has it (NULL: printed here if there are specializations). */
static kiln_status read_specs(kb_reader *r, const kiln_graph *g, const char *given, const kiln_compile_opts *o,
                              bool keyed, kiln_program *p) {
    int64_t n = get_i64(r, "specialization count");
    if (r->err) return NULL;
    if (n < 0 || n > KILN_MAX_SYMS * 4)
        return kb_error(KILN_ERR_FORMAT, "specialization count %lld is out of range", (long long)n);
    if (n && !(p->spec = calloc((size_t)n, sizeof *p->spec))) return kb_oom();
    char       *text = NULL; /* the graph's text, which each specialization binds anew */
    kiln_status pst = n && !given ? kiln_print(g->ctx, &text) : NULL;
    if (pst) return pst;
    kiln_status st = read_spec_list(r, g, o, keyed, p, n, given ? given : text);
    free(text);
    return st;
}

static kiln_status read_spec_list(kb_reader *r, const kiln_graph *g, const kiln_compile_opts *o, bool keyed,
                                  kiln_program *p, int64_t n, const char *text) {
    for (int i = 0; i < n; i++) {
        int64_t d = get_i64(r, "specialized dim"), v = get_i64(r, "specialized value");
        size_t      len;
        const void *sub = kb_get_blob(r, &len, "specialization");
        if (r->err) return NULL;
        /* v < 0: the dim up to -v (kiln_dim_specialize_upto), below its maximum; compared as v <= -max
         * because -v overflows for INT64_MIN (a fuzzed plan had it) */
        if (d < 0 || d >= g->ctx->ndims || v == 0 || v > g->ctx->dims[d].max || (v < 0 && v <= -g->ctx->dims[d].max))
            return kb_error(KILN_ERR_FORMAT, "specialization %d names dim %lld = %lld, which the graph does not have", i,
                            (long long)d, (long long)v);
        kiln_ctx   *bctx = NULL;
        kiln_graph *bg = NULL;
        kiln_status st = cg_bind_graph(g, text, (int)d, v, &bctx, &bg);
        kb_reader   sr = {.p = sub, .len = len};
        kiln_program *sp = NULL;
        if (!st) st = read_one(&sr, bg, NULL, o, keyed, &sp);
        if (!st && sr.err)
            st = kb_error(KILN_ERR_FORMAT, "specialization %d: truncated or malformed at byte %zu (%s)", i, sr.err_at, sr.err);
        if (st) {
            kiln_program_free(sp);
            kiln_graph_free(bg);
            kiln_ctx_free(bctx);
            char label[FE_MAX_NAME + 32];
            return kb_wrap(st, "specialization %s", cg_spec_label(g->ctx, (int)d, v, label, sizeof label));
        }
        cg_program_add_spec(p, (int)d, v, sp, bctx, bg);
    }
    return NULL;
}

/* The program of the plan's IR: as stored (keyed), or graph g lowered again, whose fingerprint
 * must be the stored one. */
static kiln_status plan_program(kb_reader *r, const kiln_graph *g, const kiln_compile_opts *o, const char *arch,
                                uint64_t fp, bool keyed, kiln_program **out) {
    ir_prog    *ir = NULL;
    kiln_status st = cg_ir_read(r, g, &ir);
    if (st || r->err) return st;
    if (keyed) return cg_program_from_ir(ir, arch, out);
    ir_prog_free(ir);
    if ((st = cg_lower(g, o, arch, out))) return st;
    uint64_t have = cg_ir_fingerprint((*out)->ir);
    if (have == fp) return NULL;
    kiln_program_free(*out);
    *out = NULL;
    return kb_error(KILN_ERR_FORMAT, "the program does not match this graph as this kiln lowers it (IR fingerprint "
                                     "%016llx, expected %016llx): it was built from another graph or by another "
                                     "kiln build", (unsigned long long)have, (unsigned long long)fp);
}

static kiln_status read_one(kb_reader *r, const kiln_graph *g, const char *text, const kiln_compile_opts *o,
                            bool keyed, kiln_program **out) {
    *out = NULL;
    const uint8_t *magic = r->len - r->pos >= 8 ? r->p + r->pos : NULL;
    if (!magic || memcmp(magic, plan_magic, 8) != 0) return kb_error(KILN_ERR_FORMAT, "not a kiln program (bad magic)");
    r->pos += 8;
    uint32_t version = kb_get_u32(r, "format version");
    if (!r->err && version != CG_PLAN_VERSION)
        return kb_error(KILN_ERR_FORMAT, "program format %u, this kiln reads format %u", version, CG_PLAN_VERSION);
    char arch[16];
    kb_get_str_into(r, arch, sizeof arch, "arch");
    uint64_t fp = kb_get_u64(r, "fingerprint");
    size_t   scratch = (size_t)kb_get_u64(r, "scratch");
    if (r->err) return NULL;
    kiln_program *p = NULL;
    kiln_status   st = plan_program(r, g, o, arch, fp, keyed, &p);
    if (st || r->err) return st;
    p->scratch_bytes = scratch;
    if (!(st = read_kernels(r, p)) && !r->err) st = read_specs(r, g, text, o, keyed, p);
    if (st || r->err) {
        kiln_program_free(p);
        return st;
    }
    p->stats.kernels = p->nkernels;
    *out = p;
    return NULL;
}

static kiln_status plan_read(const void *data, size_t size, const kiln_graph *g, const char *text,
                             const kiln_compile_opts *o, bool keyed, kiln_program **out) {
    kb_reader   r = {.p = data, .len = size};
    kiln_status st = read_one(&r, g, text, o, keyed, out);
    if (!st && r.err) st = kb_error(KILN_ERR_FORMAT, "program truncated or malformed at byte %zu (%s)", r.err_at, r.err);
    if (!st && r.pos != r.len) st = kb_error(KILN_ERR_FORMAT, "program has %zu stray bytes at its end", r.len - r.pos);
    if (st) {
        kiln_program_free(*out);
        *out = NULL;
    }
    return st;
}

kiln_status cg_plan_read(const void *data, size_t size, const kiln_graph *g, const kiln_compile_opts *o,
                         kiln_program **out) {
    return plan_read(data, size, g, NULL, o, false, out);
}

kiln_status cg_plan_read_keyed(const void *data, size_t size, const kiln_graph *g, const char *text,
                               const kiln_compile_opts *o, kiln_program **out) {
    return plan_read(data, size, g, text, o, true, out);
}
