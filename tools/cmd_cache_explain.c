/* `kiln cache explain GRAPH`: why a compile of GRAPH would (or would not) be warm
 * (kiln_cache_explain does the work). GRAPH is built as kiln compile builds it
 * (kt_graph_load), so a GGUF model is explained as the graph its compile caches. */
#include "tools/cmd_cache.h"

#include "kiln.h"

#include "tools/cmd.h"
#include "tools/flag.h"
#include "tools/graph_file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CMD "cache explain"

typedef struct {
    kiln_compile_opts o;
    const char       *graph;
    int64_t           n_ctx, n_batch;
    char              no_fuse_passes[256];
} explain_args;

/* KT_GO_ON when the arguments are complete, else the exit status. */
static int parse(int argc, char **argv, explain_args *e) {
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool        valued = !strcmp(a, "--arch") || !strcmp(a, "--cache-dir") || !strcmp(a, "--n-ctx") ||
                      !strcmp(a, "--n-batch");
        bool        ok = true;
        if (valued && !v) return kt_usage(CMD, "option %s needs a value", a);
        if (valued) i++;
        if (!strcmp(a, "--arch")) ok = kt_flag_arch(CMD, a, e->o.arch = v, false);
        else if (!strcmp(a, "--cache-dir")) e->o.cache_dir = v;
        else if (!strcmp(a, "--n-ctx")) ok = kt_flag_int(CMD, a, v, 1, KT_FLAG_MAX_CTX, &e->n_ctx);
        else if (!strcmp(a, "--n-batch")) ok = kt_flag_int(CMD, a, v, 1, KT_FLAG_MAX_CTX, &e->n_batch);
        else if (!strcmp(a, "--no-fuse")) e->o.no_fuse = 1;
        else if (!strncmp(a, "--no-fuse=", 10)) ok = kt_flag_no_fuse(CMD, a, e->no_fuse_passes, sizeof e->no_fuse_passes);
        else if (a[0] == '-') return kt_usage(CMD, "unknown option '%s'", a);
        else if (e->graph) return kt_usage(CMD, "more than one graph given ('%s')", a);
        else e->graph = a;
        if (!ok) return KT_EXIT_USAGE;
    }
    if (!e->graph) return kt_usage(CMD, "no graph file given");
    e->o.no_fuse_passes = e->no_fuse_passes[0] ? e->no_fuse_passes : NULL;
    return KT_GO_ON;
}

int kt_cache_explain(int argc, char **argv) {
    explain_args e = {.graph = NULL};
    int          rc = parse(argc, argv, &e);
    if (rc != KT_GO_ON) return rc;
    kiln_ctx   *ctx = NULL;
    kiln_graph *g = NULL;
    char       *text = NULL;
    if ((rc = kt_graph_load(CMD, e.graph, e.n_ctx, e.n_batch, &ctx, &g)) != KT_GO_ON) return rc;
    kiln_status st = kiln_cache_explain(g, &e.o, &text);
    if (!st) fputs(text, stdout);
    free(text);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
    return st ? kt_fail(NULL, st) : KT_EXIT_OK;
}
