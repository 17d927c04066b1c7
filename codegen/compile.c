/* kiln_compile: the whole pipeline for one graph.
 *
 *   lower -> passes -> for each kernel: template (Lua) -> key -> cache hit, or NVRTC + store
 *         -> dumps
 *
 * Kernels with the same key (identical layers) are compiled or loaded once and share a cubin. */
#include "codegen.h"

#include "cache/cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const kiln_compile_opts *o;
    char                     arch[16];
    const char              *dump_dir;
    kc_cache                 cache;
    const char              *nvrtc_opts[CG_MAX_OPTS];
    int                      nopts;
    int                      nvrtc_major, nvrtc_minor;
} compile_env;

static void default_log(void *user, const char *line) {
    (void)user;
    fprintf(stderr, "%s\n", line);
}

static kiln_status check_arch(const char *arch) {
    const char *p = arch;
    if (strncmp(p, "sm_", 3) != 0) goto bad;
    p += 3;
    if (!(*p >= '0' && *p <= '9')) goto bad;
    while (*p >= '0' && *p <= '9') p++;
    if (*p == 'a') p++;
    if (*p == 0 && strlen(arch) < 16) return NULL;
bad:
    return kb_error(KILN_ERR_INVALID, "unknown GPU architecture '%s' (expected sm_XY or sm_XYa, e.g. sm_90a, sm_80)", arch);
}

static kiln_status setup(compile_env *e, const kiln_compile_opts *o) {
    e->o = o;
    kiln_status st = check_arch(o->arch ? o->arch : "sm_90a");
    if (st) return st;
    snprintf(e->arch, sizeof e->arch, "%s", o->arch ? o->arch : "sm_90a");
    e->dump_dir = o->dump_dir ? o->dump_dir : getenv("KILN_DUMP");
    if (e->dump_dir && !*e->dump_dir) e->dump_dir = NULL;
    e->cache.mode = o->cache_mode;
    e->cache.log = o->log ? o->log : default_log;
    e->cache.log_user = o->log_user;
    if (o->skip_nvrtc) return NULL;
    if ((st = cg_nvrtc_version(&e->nvrtc_major, &e->nvrtc_minor))) return st;
    e->nopts = cg_nvrtc_options(e->arch, e->nvrtc_opts);
    if (o->cache_mode != KILN_CACHE_OFF) return kc_default_dir(o->cache_dir, &e->cache.dir);
    return NULL;
}

/* Finds an earlier kernel of the program with the same key. */
static const cg_kernel *same_key(const kiln_program *p, int upto, const uint8_t key[16]) {
    for (int i = 0; i < upto; i++)
        if (p->kernels[i].cubin && memcmp(p->kernels[i].key, key, 16) == 0) return &p->kernels[i];
    return NULL;
}

static kiln_status obtain_cubin(compile_env *e, kiln_program *p, int i) {
    cg_kernel *k = &p->kernels[i];
    kc_key key = kc_kernel_key(k->source, e->nvrtc_opts, e->nopts, e->arch, e->nvrtc_major,
                               e->nvrtc_minor, CG_CODEGEN_VERSION);
    memcpy(k->key, key.b, 16);
    kc_key_hex(key, k->key_hex);
    if (e->o->skip_nvrtc || k->kind == CG_GEMM) return NULL; /* a library call has no code */
    const cg_kernel *twin = same_key(p, i, k->key);
    if (twin) {
        k->cubin = malloc(twin->cubin_size);
        if (!k->cubin) return kb_oom();
        memcpy(k->cubin, twin->cubin, twin->cubin_size);
        k->cubin_size = twin->cubin_size;
        k->from_cache = twin->from_cache;
        return NULL;
    }
    int corrupt = 0;
    kiln_status st = kc_get(&e->cache, KC_CUBIN, key, &k->cubin, &k->cubin_size, &corrupt);
    p->stats.corrupt += corrupt;
    if (st) return st;
    if (k->cubin) {
        k->from_cache = true;
        p->stats.cached++;
        return NULL;
    }
    if ((st = cg_nvrtc_compile(k->source, k->name, e->arch, &k->cubin, &k->cubin_size))) return st;
    p->stats.compiled++;
    return kc_put(&e->cache, KC_CUBIN, key, NULL, k->cubin, k->cubin_size); /* meta: the lead fills it */
}

/* The comment heading a dumped kernel: what graph nodes it implements, and how it launches. */
static void dump_header(kb_str *o, const kiln_program *p, int i) {
    const cg_kernel *k = &p->kernels[i];
    const ir_node *n = &p->ir->nodes[k->node];
    kb_str_addf(o, "/* kiln %s: kernel %d of %d, %s", KILN_VERSION, i + 1, p->nkernels, k->name);
    if (k->nsteps > 1) kb_str_addf(o, " (step %d of %d of its node)", k->step + 1, k->nsteps);
    kb_str_add(o, "\n * graph nodes:");
    for (int s = 0; s < n->nsrc; s++) {
        const kiln_tensor *t = p->ir->g->ctx->t[n->src[s]];
        kb_str_addf(o, "%s %s (%s)", s ? "," : "", t->name, fe_ops[t->op].name);
    }
    kb_str_addf(o, "\n * fusion: %s\n", n->fusion ? n->fusion : "none");
    if (k->kind == CG_GEMM) kb_str_add(o, " * launch: cuBLAS (below)\n");
    else
        kb_str_addf(o, " * launch: grid (%u, %u, %u), block (%u, %u, %u), %u bytes shared\n", k->grid[0],
                    k->grid[1], k->grid[2], k->block[0], k->block[1], k->block[2], k->smem);
    kb_str_addf(o, " * buffers:");
    for (int a = 0; a < k->nparams; a++) {
        if (k->params[a] == CG_PARAM_SCRATCH) kb_str_addf(o, "%s p%d = scratch (%zu bytes)", a ? "," : "", a, k->scratch);
        else if (k->params[a] == CG_PARAM_DIMS) kb_str_addf(o, "%s p%d = symbolic dims", a ? "," : "", a);
        else kb_str_addf(o, "%s p%d = %s", a ? "," : "", a, p->ir->bufs[k->params[a]].name);
    }
    kb_str_addf(o, "\n * key: %s (%s)\n */\n", k->key_hex, p->arch);
}

static kiln_status write_dumps(const compile_env *e, const kiln_program *p) {
    kiln_status st = kb_mkdirs(e->dump_dir);
    for (int i = 0; i < p->nkernels && !st; i++) {
        const cg_kernel *k = &p->kernels[i];
        kb_str o = {0};
        dump_header(&o, p, i);
        kb_str_add(&o, k->source);
        char *path = NULL;
        if (asprintf(&path, "%s/%03d_%s_%.8s.cu", e->dump_dir, i, k->name, k->key_hex) < 0) path = NULL;
        st = o.oom || !path ? kb_oom() : kb_write_file(path, o.s, o.len);
        free(path);
        kb_str_free(&o);
    }
    if (st) return st;
    char *text = NULL, *path = NULL;
    st = kiln_program_describe(p, &text);
    if (!st && asprintf(&path, "%s/program.txt", e->dump_dir) < 0) st = kb_oom();
    if (!st) st = kb_write_file(path, text, strlen(text));
    free(text);
    free(path);
    return st;
}

static kiln_status append_steps(kiln_program *p, int *cap, cg_kernel *steps, int n) {
    if (p->nkernels + n > *cap) {
        int ncap = (*cap ? *cap * 2 : 16) + n;
        cg_kernel *k = realloc(p->kernels, (size_t)ncap * sizeof *k);
        if (!k) return kb_oom();
        p->kernels = k;
        *cap = ncap;
    }
    memcpy(p->kernels + p->nkernels, steps, (size_t)n * sizeof *steps);
    p->nkernels += n;
    return NULL;
}

static kiln_status generate_all(compile_env *e, kiln_program *p) {
    cg_lua *L;
    kiln_status st = cg_lua_new(&L);
    if (st) return st;
    int cap = 0;
    for (int i = 0; i < p->ir->nnodes && !st; i++) {
        if (p->ir->nodes[i].dead) continue;
        cg_kernel *steps = NULL;
        int        n = 0;
        st = cg_generate_steps(L, p->ir, i, &steps, &n);
        if (st) {
            st = kb_wrap(st, "kernel %d", p->nkernels);
            break;
        }
        int first = p->nkernels;
        if ((st = append_steps(p, &cap, steps, n))) {
            for (int j = 0; j < n; j++) cg_kernel_clear(&steps[j]);
        }
        free(steps);
        for (int j = first; j < p->nkernels && !st; j++) {
            if (p->kernels[j].scratch > p->scratch_bytes) p->scratch_bytes = p->kernels[j].scratch;
            st = obtain_cubin(e, p, j);
            if (st) st = kb_wrap(st, "kernel %d (%s)", j, p->kernels[j].name);
        }
    }
    cg_lua_free(L);
    return st;
}

static kiln_status compile_one(const kiln_graph *g, const kiln_compile_opts *opts, kiln_program **out);

/* The program of g with dim d fixed to v, compiled like g (dumps go to DIR/NAME=V). */
static kiln_status compile_spec(const kiln_graph *g, const kiln_compile_opts *opts, int d, int64_t v,
                                kiln_program **out) {
    const kiln_ctx *ctx = g->ctx;
    const char     *name = ctx->dims[d].name;
    kiln_ctx       *bctx;
    kiln_status     st = kiln_ctx_bind(ctx, 1, &name, &v, &bctx);
    if (st) return st;
    kiln_graph *bg = NULL;
    st = kiln_graph_new(bctx, &bg);
    kiln_compile_opts o = opts ? *opts : (kiln_compile_opts){0};
    char              dir[4096];
    const char       *dump = o.dump_dir ? o.dump_dir : getenv("KILN_DUMP");
    if (dump && *dump) {
        snprintf(dir, sizeof dir, "%s/%s=%lld", dump, name, (long long)v);
        o.dump_dir = dir;
    }
    if (!st) st = compile_one(bg, &o, out);
    if (st) {
        kiln_graph_free(bg);
        kiln_ctx_free(bctx);
        return st;
    }
    (*out)->own_ctx = bctx;
    (*out)->own_graph = bg;
    return NULL;
}

/* The general program, then one per specialized value of each symbolic dim. */
kiln_status kiln_compile(const kiln_graph *g, const kiln_compile_opts *opts, kiln_program **out) {
    if (!g || !out) return kb_error(KILN_ERR_INVALID, "kiln_compile: NULL argument");
    double      t0 = kb_now_ms();
    kiln_status st = compile_one(g, opts, out);
    if (st) return st;
    kiln_program   *p = *out;
    const kiln_ctx *ctx = g->ctx;
    int             total = 0;
    for (int d = 0; d < ctx->ndims; d++) total += ctx->dims[d].nspec;
    if (total) {
        p->spec = calloc((size_t)total, sizeof *p->spec);
        if (!p->spec) st = kb_oom();
    }
    for (int d = 0; !st && d < ctx->ndims; d++)
        for (int k = 0; !st && k < ctx->dims[d].nspec; k++) {
            kiln_program *sp;
            st = compile_spec(g, opts, d, ctx->dims[d].spec[k], &sp);
            if (st) break;
            p->spec[p->nspec] = sp;
            p->spec_dim[p->nspec] = d;
            p->spec_val[p->nspec++] = ctx->dims[d].spec[k];
            p->stats.kernels += sp->stats.kernels;
            p->stats.compiled += sp->stats.compiled;
            p->stats.cached += sp->stats.cached;
            p->stats.corrupt += sp->stats.corrupt;
        }
    if (st) {
        kiln_program_free(p);
        *out = NULL;
        return st;
    }
    p->stats.ms = kb_now_ms() - t0;
    return NULL;
}

static kiln_status compile_one(const kiln_graph *g, const kiln_compile_opts *opts, kiln_program **out) {
    if (!g || !out) return kb_error(KILN_ERR_INVALID, "kiln_compile: NULL argument");
    *out = NULL;
    double t0 = kb_now_ms();
    kiln_compile_opts defaults = {0};
    compile_env e = {0};
    kiln_status st = setup(&e, opts ? opts : &defaults);
    kiln_program *p = calloc(1, sizeof *p);
    if (!st && !p) st = kb_oom();
    if (!st) {
        snprintf(p->arch, sizeof p->arch, "%s", e.arch);
        st = ir_lower(g, &p->ir);
    }
    if (!st) st = ir_run_passes(p->ir, !e.o->no_fuse, e.o->no_fuse_passes);
    if (!st) st = generate_all(&e, p);
    if (!st && e.dump_dir) st = write_dumps(&e, p);
    free(e.cache.dir);
    if (st) {
        kiln_program_free(p);
        return st;
    }
    p->stats.kernels = p->nkernels;
    p->stats.ms = kb_now_ms() - t0;
    *out = p;
    return NULL;
}

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

static void describe_one(const kiln_program *p, kb_str *o);

kiln_status kiln_program_describe(const kiln_program *p, char **text) {
    if (!p || !text) return kb_error(KILN_ERR_INVALID, "kiln_program_describe: NULL argument");
    kb_str o = {0};
    describe_one(p, &o);
    for (int i = 0; i < p->nspec; i++) {
        const kiln_ctx *ctx = p->ir->g->ctx;
        kb_str_addf(&o, "\nspecialization %d: %s = %lld\n", i + 1, ctx->dims[p->spec_dim[i]].name,
                    (long long)p->spec_val[i]);
        describe_one(p->spec[i], &o);
    }
    *text = kb_str_take(&o);
    return *text ? NULL : kb_oom();
}

static void describe_one(const kiln_program *p, kb_str *out) {
    kb_str o = *out;
    kb_str_addf(&o, "kiln %s program for %s\n", KILN_VERSION, p->arch);
    ir_print(p->ir, &o);
    kb_str_add(&o, "launches:\n");
    if (p->scratch_bytes) kb_str_addf(&o, "  scratch: %zu bytes, shared by the steps of each node in turn\n", p->scratch_bytes);
    for (int i = 0; i < p->nkernels; i++) {
        const cg_kernel *k = &p->kernels[i];
        if (k->kind == CG_GEMM)
            kb_str_addf(&o, "  k%d %s cuBLAS m %d n %d k %d batch %d key %s\n", i, k->name, k->gemm.m, k->gemm.n,
                        k->gemm.k, k->gemm.batch, k->key_hex);
        else
            kb_str_addf(&o, "  k%d %s grid (%u, %u, %u) block (%u, %u, %u) key %s\n", i, k->name, k->grid[0],
                        k->grid[1], k->grid[2], k->block[0], k->block[1], k->block[2], k->key_hex);
    }
    *out = o;
}

int kiln_program_kernel_count(const kiln_program *p) { return p ? p->nkernels : 0; }

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
        if (buf->kind == IR_BUF_TEMP) continue;
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

kiln_status kiln_check_fusion_passes(const char *list) { return ir_check_fusion_list(list); }

const char *kiln_fusion_pass(int i, const char **what) {
    if (i < 0 || i >= ir_nfusions) return NULL;
    if (what) *what = ir_fusions[i].what;
    return ir_fusions[i].name;
}
