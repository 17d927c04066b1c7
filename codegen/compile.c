/* kiln_compile: the whole pipeline for one graph.
 *
 *   program key -> program cache hit: load the plan (no Lua, no NVRTC) -> dumps
 *   miss: lower + passes (each variant) -> templates (Lua, a state per worker thread) -> keys
 *         -> each distinct kernel from the kernel cache or NVRTC (thread pool) -> dumps
 *         -> store the program -> keep the cache under its size limit
 *
 * Kernels with the same key (identical layers) are compiled or loaded once and share a cubin.
 * Threads change only the speed: every result is collected in program order. */
#include "codegen.h"

#include "cache/cache.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
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
    int                      jobs;
    bool                     program_cache; /* look up and store whole programs */
    bool                     wrote;         /* stored an entry: the size limit is checked at the end */
    pthread_mutex_t          lock;          /* progress, wrote */
} compile_env;

static void logf_(const compile_env *e, const char *fmt, ...) KB_PRINTF(2, 3);
static void logf_(const compile_env *e, const char *fmt, ...) {
    char    line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    kc_log(&e->cache, line);
}

/* sm_XY[a|f] for cubins, compute_XY[a|f] for PTX; below sm_80 the templates do not compile
 * (ptxas would refuse bf16 mma and cp.async with errors that name neither the arch nor kiln). */
kiln_status kiln_check_arch(const char *arch) {
    kb_arch a;
    if (!arch || !kb_arch_parse(arch, &a) || strlen(arch) >= 16)
        return kb_error(KILN_ERR_INVALID, "unknown GPU architecture '%s' (expected sm_XY, sm_XYa or sm_XYf, e.g. "
                                          "sm_90a, sm_80; compute_XY for PTX)", arch ? arch : "(null)");
    if (a.major < 8)
        return kb_error(KILN_ERR_INVALID, "GPU architecture '%s' is too old: kiln generates code for sm_80 (Ampere) "
                                          "or newer, e.g. sm_80, sm_86, sm_89, sm_90a", arch);
    return NULL;
}

static kiln_status setup(compile_env *e, const kiln_compile_opts *o) {
    e->o = o;
    kiln_status st = kiln_check_arch(o->arch ? o->arch : "sm_90a");
    if (st) return st;
    snprintf(e->arch, sizeof e->arch, "%s", o->arch ? o->arch : "sm_90a");
    e->dump_dir = o->dump_dir ? o->dump_dir : getenv("KILN_DUMP");
    if (e->dump_dir && !*e->dump_dir) e->dump_dir = NULL;
    e->cache.mode = o->cache_mode;
    if (o->cache_mode == KILN_CACHE_ON && (st = kc_env_mode(KILN_CACHE_ON, &e->cache.mode))) return st;
    e->cache.log = o->log; /* NULL: stderr, where kc_write_failed's warning is said once a process */
    e->cache.log_user = o->log_user;
    e->jobs = o->jobs > 0 ? o->jobs : kb_default_jobs();
    pthread_mutex_init(&e->lock, NULL);
    /* Keys are the real ones even without compiling (inspect, explain); NVRTC is linked, but
     * a broken one only matters when it must compile. */
    if ((st = cg_nvrtc_version(&e->nvrtc_major, &e->nvrtc_minor))) {
        if (!o->skip_nvrtc) return st;
        kiln_status_free(st);
    }
    e->nopts = cg_nvrtc_options(e->arch, e->nvrtc_opts);
    if (o->skip_nvrtc || e->cache.mode == KILN_CACHE_OFF) return NULL;
    /* Templates read from a directory are not part of the build id, so whole programs built
     * from them must not be cached (their kernels are: kernel keys hash the source). */
    const char *tdir = getenv("KILN_TEMPLATE_DIR");
    e->program_cache = !o->no_program_cache && !(tdir && *tdir);
    return kc_default_dir(o->cache_dir, &e->cache.dir);
}

static void teardown(compile_env *e) {
    free(e->cache.dir);
    pthread_mutex_destroy(&e->lock);
}

static void progress(compile_env *e, const char *what, int done, int total) {
    if (e->o->progress) e->o->progress(e->o->progress_user, what, done, total);
}

/* ---- lowering (codegen/program.c) ----------------------------------------------------------- */

/* The general program, plus one per specialized value of each symbolic dim (each lowered from
 * the graph with that dim bound; it owns the bound graph). */
static kiln_status lower_variants(const compile_env *e, const kiln_graph *g, kiln_program **out) {
    kiln_status st = cg_lower(g, e->o, e->arch, out);
    if (st) return st;
    kiln_program   *p = *out;
    const kiln_ctx *ctx = g->ctx;
    int             total = 0;
    for (int d = 0; d < ctx->ndims; d++) total += ctx->dims[d].nspec;
    if (total && !(p->spec = calloc((size_t)total, sizeof *p->spec))) st = kb_oom();
    char *text = NULL; /* the graph's text, which each specialization binds anew */
    if (!st && total) st = kiln_print(ctx, &text);
    for (int d = 0; !st && d < ctx->ndims; d++)
        for (int k = 0; !st && k < ctx->dims[d].nspec; k++) {
            int64_t     v = ctx->dims[d].spec_upto[k] ? -ctx->dims[d].spec[k] : ctx->dims[d].spec[k];
            kiln_ctx   *bctx;
            kiln_graph *bg;
            kiln_program *sp = NULL;
            if ((st = cg_bind_graph(g, text, d, v, &bctx, &bg))) break;
            if ((st = cg_lower(bg, e->o, e->arch, &sp))) {
                kiln_graph_free(bg);
                kiln_ctx_free(bctx);
                char label[FE_MAX_NAME + 32];
                st = kb_wrap(st, "specialization %s", cg_spec_label(ctx, d, v, label, sizeof label));
                break;
            }
            cg_program_add_spec(p, d, v, sp, bctx, bg);
        }
    free(text);
    return st;
}

/* ---- template instantiation, in parallel (one Lua state per worker) ------------------------ */

typedef struct {
    kiln_program *prog;
    int           node;
    cg_kernel    *steps;
    int           n;
    kiln_status   st;
} gen_item;

typedef struct {
    compile_env *e;
    gen_item    *items;
    int          nitems, done;
    cg_lua     **lua; /* per worker, created on first use */
} gen_job;

static cg_target target_of(const compile_env *e) {
    return (cg_target){.arch = e->arch, .opts = e->nvrtc_opts, .nopts = e->nopts, .nvrtc_major = e->nvrtc_major,
                       .nvrtc_minor = e->nvrtc_minor};
}

static void gen_one(void *user, int i, int worker) {
    gen_job  *j = user;
    gen_item *it = &j->items[i];
    if (!j->lua[worker]) it->st = cg_lua_new(&j->lua[worker]);
    if (!it->st) it->st = cg_generate_steps(j->lua[worker], it->prog->ir, it->node, &it->steps, &it->n);
    cg_target t = target_of(j->e);
    for (int s = 0; !it->st && s < it->n; s++) cg_kernel_key(&it->steps[s], &t);
    pthread_mutex_lock(&j->e->lock);
    progress(j->e, "kernels generated", ++j->done, j->nitems);
    pthread_mutex_unlock(&j->e->lock);
}

static int count_items(const kiln_program *p) {
    int n = 0;
    for (int i = 0; i < p->ir->nnodes; i++) n += ir_launches(p->ir, i);
    return n;
}

static void list_items(kiln_program *p, gen_item *items, int *n) {
    for (int i = 0; i < p->ir->nnodes; i++)
        if (ir_launches(p->ir, i)) items[(*n)++] = (gen_item){.prog = p, .node = i};
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

/* Moves the items' steps into their programs in node order; the first failure (in that
 * order, so that errors do not depend on thread timing) is returned. */
static kiln_status collect_steps(gen_item *items, int n) {
    kiln_status st = NULL;
    int         cap = 0;
    for (int i = 0; i < n; i++) {
        gen_item     *it = &items[i];
        kiln_program *p = it->prog;
        if (i > 0 && items[i - 1].prog != p) cap = 0;
        if (!st && it->st) st = kb_wrap(it->st, "kernel %d", p->nkernels);
        else if (!st) {
            for (int s = 0; s < it->n; s++)
                if (it->steps[s].scratch > p->scratch_bytes) p->scratch_bytes = it->steps[s].scratch;
            st = append_steps(p, &cap, it->steps, it->n);
            if (!st) it->n = 0;
        } else {
            kiln_status_free(it->st);
        }
        for (int s = 0; s < it->n; s++) cg_kernel_clear(&it->steps[s]);
        free(it->steps);
    }
    return st;
}

static kiln_status generate_all(compile_env *e, kiln_program *p) {
    int n = count_items(p);
    for (int v = 0; v < p->nspec; v++) n += count_items(p->spec[v]);
    gen_job j = {.e = e, .nitems = n};
    j.items = calloc((size_t)n + 1, sizeof *j.items);
    j.lua = calloc((size_t)e->jobs, sizeof *j.lua);
    if (!j.items || !j.lua) {
        free(j.items);
        free(j.lua);
        return kb_oom();
    }
    int k = 0;
    list_items(p, j.items, &k);
    for (int v = 0; v < p->nspec; v++) list_items(p->spec[v], j.items, &k);
    kb_parallel_for(n, e->jobs, gen_one, &j);
    for (int w = 0; w < e->jobs; w++) cg_lua_free(j.lua[w]);
    free(j.lua);
    kiln_status st = collect_steps(j.items, n);
    free(j.items);
    return st;
}

/* ---- code: each distinct kernel from the cache or NVRTC, in parallel ----------------------- */

typedef struct {
    cg_kernel  *k; /* the first kernel with this key; the others copy its code */
    bool        cached, compiled;
    int         corrupt;
    kiln_status st;
} code_item;

typedef struct {
    compile_env *e;
    code_item   *items;
    int          n, done;
} code_job;

static void code_one(void *user, int i, int worker) {
    (void)worker;
    code_job  *j = user;
    code_item *it = &j->items[i];
    cg_kernel *k = it->k;
    cg_target  t = target_of(j->e);
    it->st = cg_kernel_code(k, &t, &j->e->cache, &it->compiled, &it->corrupt);
    it->cached = k->from_cache;
    if (it->st) it->st = kb_wrap(it->st, "kernel %s (key %s)", k->name, k->key_hex);
    pthread_mutex_lock(&j->e->lock);
    if (it->compiled && j->e->cache.mode != KILN_CACHE_READONLY && j->e->cache.mode != KILN_CACHE_OFF)
        j->e->wrote = true;
    progress(j->e, "kernels compiled", ++j->done, j->n);
    pthread_mutex_unlock(&j->e->lock);
}

static cg_kernel *find_key(code_item *items, int n, const uint8_t key[16]) {
    for (int i = 0; i < n; i++)
        if (memcmp(items[i].k->key, key, 16) == 0) return items[i].k;
    return NULL;
}

/* Distinct launch kernels of every variant, in program order. */
static int distinct_kernels(kiln_program *p, code_item *items, int n) {
    for (int i = 0; i < p->nkernels; i++) {
        cg_kernel *k = &p->kernels[i];
        if (k->kind == CG_LAUNCH && !find_key(items, n, k->key)) items[n++] = (code_item){.k = k};
    }
    for (int v = 0; v < p->nspec; v++) n = distinct_kernels(p->spec[v], items, n);
    return n;
}

static int total_kernels(const kiln_program *p) {
    int n = p->nkernels;
    for (int v = 0; v < p->nspec; v++) n += total_kernels(p->spec[v]);
    return n;
}

static kiln_status copy_code(kiln_program *p, code_item *items, int n) {
    for (int i = 0; i < p->nkernels; i++) {
        cg_kernel *k = &p->kernels[i];
        if (k->kind != CG_LAUNCH || k->cubin) continue;
        const cg_kernel *src = find_key(items, n, k->key);
        k->cubin = src->cubin;
        k->cubin_borrowed = true;
        k->cubin_size = src->cubin_size;
        k->from_cache = src->from_cache;
    }
    for (int v = 0; v < p->nspec; v++) {
        kiln_status st = copy_code(p->spec[v], items, n);
        if (st) return st;
    }
    return NULL;
}

static kiln_status obtain_code(compile_env *e, kiln_program *p) {
    int        total = total_kernels(p);
    code_item *items = calloc((size_t)total + 1, sizeof *items);
    if (!items) return kb_oom();
    code_job j = {.e = e, .items = items, .n = distinct_kernels(p, items, 0)};
    p->stats.distinct = j.n;
    kiln_status st = NULL;
    if (!e->o->skip_nvrtc) {
        kb_parallel_for(j.n, e->jobs, code_one, &j);
        for (int i = 0; i < j.n; i++) {
            p->stats.compiled += items[i].compiled;
            p->stats.cached += items[i].cached;
            p->stats.corrupt += items[i].corrupt;
            if (!st) st = items[i].st;
            else kiln_status_free(items[i].st);
        }
        if (!st) st = copy_code(p, items, j.n);
    }
    free(items);
    return st;
}

/* ---- dumps -------------------------------------------------------------------------------- */

static void dump_shape(kb_str *o, const ir_buf *b) {
    kb_str_addf(o, "%s[", kiln_type_name(b->type));
    int nd = 4;
    while (nd > 1 && b->ne[nd - 1] == 1) nd--;
    for (int d = 0; d < nd; d++) kb_str_addf(o, "%s%lld%s", d ? ", " : "", (long long)b->ne[d], b->sym[d] ? "*" : "");
    kb_str_add(o, "]");
}

/* The comment heading a dumped kernel: what graph nodes it implements, its buffers' static
 * shapes, and how it launches. */
static void dump_header(kb_str *o, const kiln_program *p, int i) {
    const cg_kernel *k = &p->kernels[i];
    const ir_node *n = &p->ir->nodes[k->node];
    kb_str_addf(o, "/* kiln %s: kernel %d of %d, %s", KILN_VERSION, i + 1, p->nkernels, k->name);
    if (k->nsteps > 1) kb_str_addf(o, " (step %d of %d of its node)", k->step + 1, k->nsteps);
    kb_str_add(o, "\n * graph nodes:");
    /* then the nodes its kernel computes too (passes gemv_rope, head_rope) */
    bool tails = ir_next_tail(p->ir, k->node, k->node) >= 0;
    for (int j = k->node, s0 = 0; j >= 0; j = ir_next_tail(p->ir, k->node, j)) {
        const ir_node *m = &p->ir->nodes[j];
        for (int s = 0; s < m->nsrc; s++, s0++) {
            const kiln_tensor *t = p->ir->g->ctx->t[m->src[s]];
            kb_str_addf(o, "%s %s (%s)", s0 ? "," : "", t->name, fe_ops[t->op].name);
        }
    }
    const char *pass = n->op == FE_OP_MUL_MAT ? "gemv_rope" : "head_rope";
    kb_str_addf(o, "\n * fusion: %s%s%s\n", n->fusion ? n->fusion : tails ? "" : "none", tails && n->fusion ? "+" : "",
                tails ? pass : "");
    if (k->kind == CG_GEMM) kb_str_add(o, " * launch: cuBLAS (below)\n");
    else if (k->kind == CG_COLLECTIVE) kb_str_add(o, " * launch: NCCL (below)\n");
    else
        kb_str_addf(o, " * launch: grid (%u, %u, %u), block (%u, %u, %u), %u bytes shared\n", k->grid[0],
                    k->grid[1], k->grid[2], k->block[0], k->block[1], k->block[2], k->smem);
    kb_str_addf(o, " * buffers (static shapes; * marks a symbolic dim at its maximum):");
    for (int a = 0; a < k->nparams; a++) {
        kb_str_addf(o, "\n *   p%d = ", a);
        if (k->params[a] == CG_PARAM_SCRATCH) kb_str_addf(o, "scratch (%zu bytes)", k->scratch);
        else if (k->params[a] == CG_PARAM_DIMS) kb_str_add(o, "symbolic dims (int32 values at run time)");
        else {
            const ir_buf *b = &p->ir->bufs[k->params[a]];
            kb_str_addf(o, "%s ", b->name);
            dump_shape(o, b);
        }
    }
    kb_str_addf(o, "\n * key: %s (%s)\n */\n", k->key_hex, p->arch);
}

static kiln_status write_dumps(const char *dir, const kiln_program *p) {
    kiln_status st = kb_mkdirs(dir);
    for (int i = 0; i < p->nkernels && !st; i++) {
        const cg_kernel *k = &p->kernels[i];
        kb_str o = {0};
        dump_header(&o, p, i);
        kb_str_add(&o, k->source);
        char *path = NULL;
        if (asprintf(&path, "%s/%03d_%s_%.8s.cu", dir, i, k->name, k->key_hex) < 0) path = NULL;
        st = o.oom || !path ? kb_oom() : kb_write_file(path, o.s, o.len);
        free(path);
        kb_str_free(&o);
    }
    if (st) return st;
    char *text = NULL, *path = NULL;
    kb_str d = {0};
    cg_describe_one(p, &d);
    if (!(text = kb_str_take(&d)) || asprintf(&path, "%s/program.txt", dir) < 0) st = kb_oom();
    if (!st) st = kb_write_file(path, text, strlen(text));
    free(text);
    free(path);
    /* Specializations go to DIR/NAME=V. */
    for (int v = 0; !st && v < p->nspec; v++) {
        char sub[4096];
        /* (a smaller maximum: DIR/NAME<=V) */
        snprintf(sub, sizeof sub, "%s/%s%s%lld", dir, p->ir->g->ctx->dims[p->spec_dim[v]].name,
                 p->spec_val[v] < 0 ? "<=" : "=", (long long)(p->spec_val[v] < 0 ? -p->spec_val[v] : p->spec_val[v]));
        st = write_dumps(sub, p->spec[v]);
    }
    return st;
}

/* ---- the program cache ---------------------------------------------------------------------- */

static char *options_text(const compile_env *e) {
    kb_str o = {0};
    kb_str_addf(&o, "no_fuse=%d no_fuse_passes=%s", e->o->no_fuse ? 1 : 0, e->o->no_fuse_passes ? e->o->no_fuse_passes : "");
    return kb_str_take(&o);
}

static kc_key program_key(const compile_env *e, const char *graph_text, const char *opts_text) {
    return kc_program_key(graph_text, opts_text, e->arch, e->nvrtc_major, e->nvrtc_minor, kiln_build_id(),
                          CG_PLAN_VERSION);
}

kiln_status cg_program_key(const kiln_graph *g, const kiln_compile_opts *o, const char *arch, kc_key *key,
                           cg_env_info *env, char **graph_text) {
    kiln_compile_opts oo = *o;
    oo.arch = arch;
    oo.skip_nvrtc = 1;
    compile_env e = {0};
    *graph_text = NULL;
    kiln_status st = setup(&e, &oo);
    char       *opts_text = NULL;
    if (!st) st = kiln_print(g->ctx, graph_text);
    if (!st && !(opts_text = options_text(&e))) st = kb_oom();
    if (!st) {
        *key = program_key(&e, *graph_text, opts_text);
        *env = (cg_env_info){.nvrtc_major = e.nvrtc_major, .nvrtc_minor = e.nvrtc_minor};
        size_t n = 0;
        for (int i = 0; i < e.nopts && n < sizeof env->options; i++)
            n += (size_t)snprintf(env->options + n, sizeof env->options - n, "%s%s", i ? " " : "", e.nvrtc_opts[i]);
        snprintf(env->program_options, sizeof env->program_options, "%s", opts_text);
    }
    free(opts_text);
    teardown(&e);
    if (st) {
        free(*graph_text);
        *graph_text = NULL;
    }
    return st;
}

static void count_loaded(kiln_program *p) {
    code_item *items = calloc((size_t)total_kernels(p) + 1, sizeof *items);
    p->stats.kernels = total_kernels(p);
    p->stats.distinct = items ? distinct_kernels(p, items, 0) : 0;
    p->stats.cached = p->stats.distinct;
    p->stats.program_cached = 1;
    free(items);
}

/* A hit gives *out; a miss, or an entry that does not load (logged), gives NULL. *corrupt
 * counts a corrupt entry (removed) or one that does not load (replaced by the rebuild): the
 * caller adds it to the stats of whichever program results, hit or rebuilt. */
static kiln_status load_program(compile_env *e, const kiln_graph *g, const char *text, kc_key key, kiln_program **out,
                                int *corrupt) {
    *out = NULL;
    void       *data = NULL;
    size_t      size = 0;
    kiln_status st = kc_get(&e->cache, KC_PROGRAM, key, &data, &size, corrupt);
    if (st || !data) return st;
    st = cg_plan_read_keyed(data, size, g, text, e->o, out);
    free(data);
    if (st) {
        char *path = kc_entry_path(&e->cache, KC_PROGRAM, key);
        logf_(e, "kiln: program cache entry %s does not load (%s); rebuilding", path ? path : "?", kiln_status_msg(st));
        free(path);
        kiln_status_free(st);
        (*corrupt)++;
        return NULL;
    }
    count_loaded(*out);
    return NULL;
}

static char *program_meta(const compile_env *e, const kiln_program *p, const char *graph_text, const char *opts_text) {
    kb_str m = {0};
    kb_str_add(&m, "program");
    const ir_prog *ir = p->ir;
    for (int b = 0; b < ir->nbufs; b++)
        if (ir->bufs[b].kind == IR_BUF_OUTPUT) kb_str_addf(&m, " %s", ir->bufs[b].name);
    kb_str_addf(&m, "\nkiln %s build %s\nplan %d\nnvrtc %d.%d\narch %s\noptions %s\nkernels %d distinct %d\n--- graph\n",
                KILN_VERSION, kiln_build_id(), CG_PLAN_VERSION, e->nvrtc_major, e->nvrtc_minor, e->arch, opts_text,
                p->stats.kernels, p->stats.distinct);
    kb_str_add(&m, graph_text);
    return kb_str_take(&m);
}

static kiln_status store_program(compile_env *e, kc_key key, const char *graph_text, const char *opts_text,
                                 const kiln_program *p) {
    if (e->cache.mode == KILN_CACHE_READONLY || e->cache.mode == KILN_CACHE_OFF) return NULL;
    kb_str      plan = {0};
    kiln_status st = cg_plan_write(p, &plan);
    char       *meta = st ? NULL : program_meta(e, p, graph_text, opts_text);
    if (!st && (plan.oom || !meta)) st = kb_oom();
    if (!st) st = kc_put(&e->cache, KC_PROGRAM, key, meta, plan.s, plan.len);
    if (!st) e->wrote = true;
    free(meta);
    kb_str_free(&plan);
    return st;
}

/* Eviction is bookkeeping: when the file system refuses it, the compile has its program all
 * the same, so that is the write-failure warning, not an error (a bad KILN_CACHE_MAX is). */
static kiln_status enforce_limit(compile_env *e) {
    uint64_t    max = 0, total = 0;
    int         removed = 0;
    kiln_status st = kc_max_bytes(&max);
    if (!st) st = kc_evict(&e->cache, max, &removed, &total);
    if (st && kiln_status_code(st) == KILN_ERR_IO) {
        kc_write_failed(&e->cache, 0, kiln_status_msg(st));
        kiln_status_free(st);
        return NULL;
    }
    if (!st && removed)
        logf_(e, "kiln: cache over its limit (KILN_CACHE_MAX %llu bytes): removed %d least recently used entries",
              (unsigned long long)max, removed);
    return st;
}

/* ---- kiln_compile -------------------------------------------------------------------------- */

static kiln_status build_program(compile_env *e, const kiln_graph *g, kiln_program **out) {
    kiln_status st = lower_variants(e, g, out);
    if (!st) st = generate_all(e, *out);
    if (!st) st = obtain_code(e, *out);
    if (!st) {
        (*out)->stats.kernels = total_kernels(*out);
        (*out)->stats.generated = (*out)->stats.kernels;
    }
    return st;
}

kiln_status kiln_compile(const kiln_graph *g, const kiln_compile_opts *opts, kiln_program **out) {
    if (!g || !out) return kb_error(KILN_ERR_INVALID, "kiln_compile: NULL argument");
    *out = NULL;
    double            t0 = kb_now_ms();
    kiln_compile_opts defaults = {0};
    compile_env       e = {0};
    kiln_status       st = setup(&e, opts ? opts : &defaults);
    kiln_program     *p = NULL;
    char             *graph_text = NULL, *opts_text = NULL;
    kc_key            key = {{0}};
    int               prog_corrupt = 0; /* a program entry found corrupt (and rebuilt) */
    if (!st && e.program_cache) {
        st = kiln_print(g->ctx, &graph_text);
        if (!st && !(opts_text = options_text(&e))) st = kb_oom();
        if (!st) key = program_key(&e, graph_text, opts_text);
        if (!st) st = load_program(&e, g, graph_text, key, &p, &prog_corrupt);
    }
    if (!st && !p) st = build_program(&e, g, &p);
    if (!st) p->stats.corrupt += prog_corrupt;
    if (!st && e.dump_dir) st = write_dumps(e.dump_dir, p);
    if (!st && e.program_cache && !p->stats.program_cached) st = store_program(&e, key, graph_text, opts_text, p);
    if (!st && e.wrote && !atomic_load(&e.cache.write_errno)) st = enforce_limit(&e);
    if (!st) p->stats.cache_write_error = atomic_load(&e.cache.write_errno);
    free(graph_text);
    free(opts_text);
    teardown(&e);
    if (st) {
        kiln_program_free(p);
        return st;
    }
    p->stats.ms = kb_now_ms() - t0;
    *out = p;
    return NULL;
}

kiln_status kiln_check_fusion_passes(const char *list) { return ir_check_fusion_list(list); }

const char *kiln_fusion_pass(int i, const char **what) {
    if (i < 0 || i >= ir_nfusions) return NULL;
    if (what) *what = ir_fusions[i].what;
    return ir_fusions[i].name;
}
