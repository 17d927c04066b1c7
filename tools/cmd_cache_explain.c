/* `kiln cache explain GRAPH`: why a compile of GRAPH would (or would not) be warm
 * (kiln_cache_explain does the work). */
#include "tools/cmd_cache.h"

#include "kiln.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kiln_cmd_cache_explain(int argc, char **argv) {
    kiln_compile_opts o = {0};
    const char       *graph = NULL;
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if ((!strcmp(a, "--arch") || !strcmp(a, "--cache-dir")) && !v) {
            fprintf(stderr, "kiln cache explain: option %s needs a value\n(see 'kiln help cache')\n", a);
            return 2;
        }
        if (!strcmp(a, "--arch")) o.arch = argv[++i];
        else if (!strcmp(a, "--cache-dir")) o.cache_dir = argv[++i];
        else if (!strcmp(a, "--no-fuse")) o.no_fuse = 1;
        else if (!strncmp(a, "--no-fuse=", 10)) {
            kiln_status bad = kiln_check_fusion_passes(a + 10);
            if (bad) {
                fprintf(stderr, "kiln cache explain: %s\n", kiln_status_msg(bad));
                kiln_status_free(bad);
                return 2;
            }
            o.no_fuse_passes = a + 10;
        } else if (a[0] == '-') {
            fprintf(stderr, "kiln cache explain: unknown option '%s'\n(see 'kiln help cache')\n", a);
            return 2;
        } else if (graph) {
            fprintf(stderr, "kiln cache explain: more than one graph given ('%s')\n", a);
            return 2;
        } else {
            graph = a;
        }
    }
    if (!graph) {
        fprintf(stderr, "kiln cache explain: no graph file given\n(see 'kiln help cache')\n");
        return 2;
    }
    kiln_ctx   *ctx = kiln_ctx_new();
    kiln_graph *g = NULL;
    char       *text = NULL;
    kiln_status st = ctx ? kiln_load(ctx, graph) : NULL;
    if (!st) st = kiln_graph_new(ctx, &g);
    if (!st) st = kiln_cache_explain(g, &o, &text);
    if (!st) fputs(text, stdout);
    free(text);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
    if (st) {
        fprintf(stderr, "kiln: %s\n", kiln_status_msg(st));
        kiln_status_free(st);
        return 1;
    }
    return 0;
}
