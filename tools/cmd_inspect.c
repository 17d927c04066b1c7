/* kiln inspect GRAPH: the fusions, the IR after passes, the memory plan and the kernels, without
 * NVRTC or a GPU; kiln inspect FILE.kiln: a bundle verified and described. */
#include "tools/cmd.h"
#include "tools/compile_args.h"
#include "tools/graph_file.h"

#include <stdio.h>
#include <stdlib.h>

static const char summary[] =
    "  inspect GRAPH   print the IR after passes, the memory plan and the kernel list;\n"
    "  inspect FILE.kiln  verify a bundle (checksum, signature, programs) and describe it\n";

static const char help[] =
    "usage: kiln inspect GRAPH [--no-fuse[=NAME,...]]\n"
    "       kiln inspect FILE.kiln\n"
    "       kiln inspect MODEL.gguf --tp G | --pp G [--n-ctx N]\n"
    "  prints every fusion applied, one per line (\"fused NAME: node, node, ...\"), the IR after\n"
    "  passes (kernels, fused graph nodes, layouts), the memory plan and the generated kernels'\n"
    "  names, launch configs and keys. Needs neither NVRTC nor a GPU.\n"
    "  A bundle is verified (checksum, signature, each program against the graph) and described:\n"
    "  what built it, its targets, its graph; exit 1 when it is damaged or foreign.\n"
    "  --tp G: how tensor parallelism splits the model over G GPUs (docs/tp.md): each weight's\n"
    "  shape on a GPU and how it is cut, a GPU's weights and KV cache (at --n-ctx), the\n"
    "  all_reduce collectives, and whether a GPU's graph builds; exit 1 when the model cannot\n"
    "  split over G (the hyperparameter is named); 'kiln run MODEL.gguf --tp G' runs it.\n"
    "  --pp G: the pipeline split in G stages (docs/tp.md): each stage's layers, weights and KV\n"
    "  cache (a GPU's), what it takes and gives; 'kiln run MODEL.gguf --pp G' runs it.\n";

static int inspect_bundle(const char *path) {
    kiln_bundle *b = NULL;
    char        *text = NULL;
    kiln_status  st = kiln_bundle_open(path, &b);
    if (!st) st = kiln_bundle_describe(b, &text);
    if (!st) fputs(text, stdout);
    free(text);
    kiln_bundle_free(b);
    return st ? kt_fail(NULL, st) : KT_EXIT_OK;
}

static int inspect_split(const kt_args *c) {
    if (!kt_graph_is_gguf(c->graph))
        return kt_usage(c->cmd, "%s splits a GGUF model; %s is not one", c->tp > 1 ? "--tp" : "--pp", c->graph);
    kiln_model *m = NULL;
    char       *text = NULL;
    kiln_status st = kiln_model_open(c->graph, &m);
    if (!st) {
        int64_t n_ctx = c->n_ctx > 0 ? c->n_ctx : kiln_default_n_ctx(kiln_model_get_hparams(m));
        st = c->tp > 1 ? kiln_model_tp_describe(m, c->tp, n_ctx, &text) : kiln_model_pp_describe(m, c->pp, n_ctx, &text);
    }
    if (!st) fputs(text, stdout);
    free(text);
    kiln_model_close(m);
    return st ? kt_fail(NULL, st) : KT_EXIT_OK;
}

static int run(int argc, char **argv) {
    kt_args c = {0};
    int     rc = kt_args_parse(argc, argv, &c);
    if (rc != KT_GO_ON) return rc;
    if (c.tp > 1 || c.pp > 1) return inspect_split(&c);
    kt_graph_kind kind;
    kiln_status   st = kt_graph_kind_of(c.graph, &kind);
    if (st) return kt_fail(NULL, st);
    if (kind == KT_GRAPH_BUNDLE) return inspect_bundle(c.graph);
    kiln_ctx     *ctx;
    kiln_graph   *g;
    kiln_program *p = NULL;
    if ((rc = kt_args_graph(&c, &ctx, &g)) != KT_GO_ON) return rc;
    kiln_compile_opts o = kt_args_compile_opts(&c, NULL);
    o.skip_nvrtc = 1;
    o.cache_mode = KILN_CACHE_OFF;
    st = kiln_compile(g, &o, &p);
    char *text = NULL;
    if (!st) st = kiln_program_describe(p, &text);
    if (!st) fputs(text, stdout);
    free(text);
    kiln_program_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
    return st ? kt_fail(NULL, st) : KT_EXIT_OK;
}

const kt_cmd kt_cmd_inspect = {"inspect", summary, help, kt_print_fusion_passes, run};
