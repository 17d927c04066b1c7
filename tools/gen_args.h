/* The options of kiln gen-graph (tools/cmd_gen_graph.c) and gen-model (tools/cmd_gen_model.c),
 * which both name a model by --arch and --preset (tools/gen_args.c). Prefix kt_gen_. */
#ifndef KILN_TOOLS_GEN_ARGS_H
#define KILN_TOOLS_GEN_ARGS_H

#include "kiln.h"

#include <stdint.h>

typedef struct {
    const char     *cmd; /* "gen-graph" or "gen-model": argv[0] */
    const char     *arch, *preset, *out;
    kiln_build_opts opts; /* gen-graph: --n-ctx, --n-tokens, --outputs */
    uint64_t        seed; /* gen-model: --seed */
    const char     *type; /* gen-model: --type */
    kiln_vocab_kind vocab; /* gen-model: --vocab bpe|spm */
} kt_gen_args;

/* argv[0] is the command; each takes its own options besides --arch, --preset and -o.
 * KT_GO_ON when g is complete, else the exit status (--help printed, or a usage error). */
int kt_gen_parse(int argc, char **argv, kt_gen_args *g);

/* "presets:" and a line a preset: the end of both commands' help. */
void kt_gen_print_presets(void);

#endif
