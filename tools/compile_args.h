/* The options of the commands that compile a graph: kiln compile, run GRAPH (or --bundle) and
 * inspect (tools/compile_args.c). One parser, so that the three accept the same flags the same
 * way, and what they share once built: the graph, the compile options, the --dim values.
 * Prefix kt_args_. */
#ifndef KILN_TOOLS_COMPILE_ARGS_H
#define KILN_TOOLS_COMPILE_ARGS_H

#include "kiln.h"

#include <stdbool.h>
#include <stdint.h>

#define KT_ARGS_MAX_FILES 64

typedef struct {
    const char *cmd, *graph, *arch, *dump, *out, *cache_dir, *bundle;
    int         jobs;
    char        no_fuse_passes[256]; /* --no-fuse=NAME[,NAME]: the names, comma-separated */
    bool        no_fuse, no_cache, no_graph, check;
    uint64_t    seed;
    int         iters;
    int64_t     n_ctx, n_batch; /* a GGUF model's graph */
    int         tp;             /* --tp G: tensor parallelism over G GPUs (0: not given) */
    int         pp;             /* --pp G: a pipeline of G stages (0: not given) */
    const char *inputs[KT_ARGS_MAX_FILES], *outputs[KT_ARGS_MAX_FILES];
    int         ninputs, noutputs;
    bool        stats;
    int         ndims;
    char        dim_name[KILN_MAX_SYMS][64];
    const char *dim_names[KILN_MAX_SYMS];
    int64_t     dim_val[KILN_MAX_SYMS];
} kt_args;

/* argv[0] is the command ("compile", "run", "inspect"); options may stand before or after the
 * graph. KT_GO_ON when c is complete, else the exit status (--help printed, or a usage
 * error). */
int kt_args_parse(int argc, char **argv, kt_args *c);

/* Whether option arg takes a value (the next argument). */
bool kt_args_takes_value(const char *arg);

/* The graph of c->graph (kt_graph_load): KT_GO_ON when built, else the exit status, the error
 * printed. */
int kt_args_graph(const kt_args *c, kiln_ctx **ctx, kiln_graph **g);

/* The graph at the --dim values (every dim given is fixed; checked against its maximum): what
 * a run computes, so the shapes of its inputs and outputs and its CPU reference. */
kiln_status kt_args_bind_dims(const kt_args *c, const kiln_ctx *ctx, kiln_ctx **bctx, kiln_graph **bg);

/* "dims: n_kv = 37 (max 4096), n_tokens = 512 (max 512)", when the graph has dims. */
void kt_args_print_dims(const kt_args *c, const kiln_ctx *ctx);

/* The compile options the flags give, with progress on stderr; arch when --arch is not given. */
kiln_compile_opts kt_args_compile_opts(const kt_args *c, const char *arch);

/* "compiled 19 kernels (15 distinct: 15 new, 0 from cache) in 812 ms", or "loaded ..." when
 * the program came from the cache: s of a compile that took ms. */
void kt_print_compile(const kiln_compile_stats *s, double ms);

/* kt_print_compile of the compile that made p. */
void kt_print_program(const kiln_program *p);

/* "fusion passes (--no-fuse=NAME):" and a line a pass: the end of the compiling commands'
 * help. */
void kt_print_fusion_passes(void);

#endif
