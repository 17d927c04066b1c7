/* The options of kiln compile, run GRAPH and inspect (tools/compile_args.h). */
#include "tools/compile_args.h"

#include "tools/cmd.h"
#include "tools/flag.h"
#include "tools/graph_file.h"
#include "tools/progress.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* --iters' bound: a timing per run is kept (8 MB at most), and a million runs is already hours. */
#define MAX_ITERS 1000000

/* --dim NAME=V: the name kept in c, the value checked against 1 .. INT64_MAX here and against
 * the dim's own maximum when the graph is bound (kt_args_bind_dims). */
static int parse_dim(kt_args *c, const char *v) {
    const char *eq = strchr(v, '=');
    char        flag[80];
    if (!eq || eq == v || (size_t)(eq - v) >= sizeof c->dim_name[0])
        return kt_usage(NULL, "expected NAME=VALUE after --dim, got '%s'", v);
    if (c->ndims == KILN_MAX_SYMS) return kt_usage(NULL, "too many --dim options (at most 8): '%s'", v);
    snprintf(flag, sizeof flag, "--dim %.*s=", (int)(eq - v), v);
    if (!kt_flag_int(c->cmd, flag, eq + 1, 1, INT64_MAX, &c->dim_val[c->ndims])) return KT_EXIT_USAGE;
    snprintf(c->dim_name[c->ndims], sizeof c->dim_name[0], "%.*s", (int)(eq - v), v);
    c->dim_names[c->ndims] = c->dim_name[c->ndims];
    c->ndims++;
    return KT_GO_ON;
}

/* --input NAME=FILE, --output NAME=FILE */
static int parse_file(kt_args *c, const char *a, const char *v) {
    bool in = !strcmp(a, "--input");
    if (!strchr(v, '=')) return kt_usage(NULL, "expected NAME=FILE after --input/--output, got '%s'", v);
    if ((in ? c->ninputs : c->noutputs) == KT_ARGS_MAX_FILES) return kt_usage(NULL, "too many %s options", a);
    if (in) c->inputs[c->ninputs++] = v;
    else c->outputs[c->noutputs++] = v;
    return KT_GO_ON;
}

/* An option that takes a value, v: KT_GO_ON, else the exit status. */
static int parse_valued(kt_args *c, const char *a, const char *v) {
    bool ok = true;
    if (!strcmp(a, "--arch")) ok = kt_flag_arch(c->cmd, a, c->arch = v, !strcmp(c->cmd, "compile"));
    else if (!strcmp(a, "--dump-cu")) c->dump = v;
    else if (!strcmp(a, "-o")) c->out = v;
    else if (!strcmp(a, "--cache-dir")) c->cache_dir = v;
    else if (!strcmp(a, "--bundle")) c->bundle = v;
    else if (!strcmp(a, "--jobs")) ok = kt_flag_int32(c->cmd, a, v, 1, KT_FLAG_MAX_JOBS, &c->jobs);
    else if (!strcmp(a, "--dim")) return parse_dim(c, v);
    else if (!strcmp(a, "--seed")) ok = kt_flag_uint(c->cmd, a, v, UINT64_MAX, &c->seed);
    else if (!strcmp(a, "--n-ctx")) ok = kt_flag_int(c->cmd, a, v, 1, KT_FLAG_MAX_CTX, &c->n_ctx);
    else if (!strcmp(a, "--n-batch")) ok = kt_flag_int(c->cmd, a, v, 1, KT_FLAG_MAX_CTX, &c->n_batch);
    else if (!strcmp(a, "--iters")) ok = kt_flag_int32(c->cmd, a, v, 1, MAX_ITERS, &c->iters);
    else if (!strcmp(a, "--tp")) ok = kt_flag_int32(c->cmd, a, v, 1, 64, &c->tp);
    else if (!strcmp(a, "--pp")) ok = kt_flag_int32(c->cmd, a, v, 1, 64, &c->pp);
    else return parse_file(c, a, v); /* --input, --output */
    return ok ? KT_GO_ON : KT_EXIT_USAGE;
}

bool kt_args_takes_value(const char *a) {
    static const char *const valued[] = {"--arch", "--dump-cu", "-o",      "--cache-dir", "--bundle", "--jobs",
                                         "--dim",  "--seed",    "--n-ctx", "--n-batch",   "--iters",  "--input",
                                         "--output", "--tp",    "--pp"};
    for (size_t k = 0; k < sizeof valued / sizeof *valued; k++)
        if (!strcmp(a, valued[k])) return true;
    return false;
}

/* An option without a value, or the graph. */
static int parse_flag(kt_args *c, const char *a) {
    if (!strcmp(a, "--no-fuse")) c->no_fuse = true;
    else if (!strncmp(a, "--no-fuse=", 10)) {
        if (!kt_flag_no_fuse(c->cmd, a, c->no_fuse_passes, sizeof c->no_fuse_passes)) return KT_EXIT_USAGE;
    } else if (!strcmp(a, "--no-cache")) c->no_cache = true;
    else if (!strcmp(a, "--no-cuda-graph")) c->no_graph = true;
    else if (!strcmp(a, "--check")) c->check = true;
    else if (!strcmp(a, "--stats")) c->stats = true;
    else if (a[0] == '-' && a[1]) return kt_usage(NULL, "unknown option '%s'", a);
    else if (c->graph) return kt_usage(NULL, "more than one graph given ('%s')", a);
    else c->graph = a;
    return KT_GO_ON;
}

int kt_args_parse(int argc, char **argv, kt_args *c) {
    c->cmd = argv[0];
    c->seed = 1;
    c->iters = 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int         rc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return kt_print_help(c->cmd);
        if (!kt_args_takes_value(a)) rc = parse_flag(c, a);
        else if (i + 1 == argc) rc = kt_usage(NULL, "option %s needs a value", a);
        else rc = parse_valued(c, a, argv[++i]);
        if (rc != KT_GO_ON) return rc;
    }
    if (c->bundle && strcmp(c->cmd, "run") != 0)
        return kt_usage(NULL, "--bundle: only 'kiln run' takes a bundle (%s)", c->bundle);
    if (c->bundle && c->graph) return kt_usage(NULL, "give a graph or --bundle, not both ('%s')", c->graph);
    if (!c->graph && !c->bundle) return kt_usage(NULL, "%s: no graph file given", c->cmd);
    /* (kiln run MODEL.gguf --tp/--pp parses its flags elsewhere: here a .kg graph or a bundle) */
    if (c->tp > 1 && !strcmp(c->cmd, "run"))
        return kt_usage(c->cmd, "--tp %d splits a GGUF model: 'kiln run MODEL.gguf --tp %d' (not a .kg graph or a "
                        "bundle)", c->tp, c->tp);
    if (c->pp > 1 && !strcmp(c->cmd, "run"))
        return kt_usage(c->cmd, "--pp %d splits a GGUF model: 'kiln run MODEL.gguf --pp %d' (not a .kg graph or a "
                        "bundle)", c->pp, c->pp);
    if (c->tp > 1 && c->pp > 1) return kt_usage(c->cmd, "%s", "--tp and --pp: one split or the other, not both");
    return KT_GO_ON;
}

int kt_args_graph(const kt_args *c, kiln_ctx **ctx, kiln_graph **g) {
    return kt_graph_load(c->cmd, c->graph, c->n_ctx, c->n_batch, ctx, g);
}

kiln_status kt_args_bind_dims(const kt_args *c, const kiln_ctx *ctx, kiln_ctx **bctx, kiln_graph **bg) {
    *bg = NULL;
    kiln_status st = kiln_ctx_bind(ctx, c->ndims, c->dim_names, c->dim_val, bctx);
    if (st) return kb_error(kiln_status_code(st), "--dim: %s", kiln_status_msg(st));
    return kiln_graph_new(*bctx, bg);
}

void kt_args_print_dims(const kt_args *c, const kiln_ctx *ctx) {
    int n = kiln_ctx_dim_count(ctx);
    if (!n) return;
    printf("dims:");
    for (int i = 0; i < n; i++) {
        const char *name = kiln_ctx_dim_name(ctx, i);
        int64_t     v = kiln_ctx_dim_max(ctx, i);
        for (int k = 0; k < c->ndims; k++)
            if (!strcmp(c->dim_names[k], name)) v = c->dim_val[k];
        printf("%s %s = %lld (max %lld)", i ? "," : "", name, (long long)v, (long long)kiln_ctx_dim_max(ctx, i));
    }
    printf("\n");
}

static kt_progress g_progress;

kiln_compile_opts kt_args_compile_opts(const kt_args *c, const char *arch) {
    kiln_compile_opts o = {0};
    g_progress.tty = isatty(2);
    o.progress = kt_progress_count;
    o.progress_user = &g_progress;
    o.jobs = c->jobs;
    o.arch = c->arch ? c->arch : arch;
    o.dump_dir = c->dump;
    o.cache_dir = c->cache_dir;
    o.cache_mode = c->no_cache ? KILN_CACHE_OFF : KILN_CACHE_ON;
    o.no_fuse = c->no_fuse;
    o.no_fuse_passes = c->no_fuse_passes[0] ? c->no_fuse_passes : NULL;
    return o;
}

void kt_print_compile(const kiln_compile_stats *s, double ms) {
    if (s->program_cached)
        printf("loaded %d kernels (%d distinct) from the program cache in %.0f ms\n", s->kernels, s->distinct, ms);
    else
        printf("compiled %d kernels (%d distinct: %d new, %d from cache) in %.0f ms\n", s->kernels, s->distinct,
               s->compiled, s->cached, ms);
}

void kt_print_program(const kiln_program *p) {
    kiln_compile_stats s;
    kiln_program_stats(p, &s);
    kt_print_compile(&s, s.ms);
}

void kt_print_fusion_passes(void) {
    printf("fusion passes (--no-fuse=NAME):\n");
    const char *what, *name;
    for (int i = 0; (name = kiln_fusion_pass(i, &what)); i++) printf("  %-14s %s\n", name, what);
}
