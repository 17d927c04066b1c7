/* The GRAPH argument of kiln compile, run, inspect and cache explain (tools/graph_file.c):
 * a .kg graph, a GGUF model (its whole graph) or an AOT bundle, told apart by their first
 * bytes, so that each command builds the same graph from the same file and says plainly what
 * a file it cannot use holds. Prefix kt_. */
#ifndef KILN_TOOLS_GRAPH_FILE_H
#define KILN_TOOLS_GRAPH_FILE_H

#include "kiln.h"

#include <stdbool.h>
#include <stdint.h>

typedef enum { KT_GRAPH_KG, KT_GRAPH_GGUF, KT_GRAPH_BUNDLE } kt_graph_kind;

/* Whether path names a GGUF file: its first bytes are "GGUF", or its name ends in .gguf. */
bool kt_graph_is_gguf(const char *path);

/* What path holds: a bundle (starts with KILNBNDL), a GGUF (kt_graph_is_gguf), else .kg text.
 * An error, naming the file, when it cannot be read, is empty, is named .kiln without being
 * a bundle, or holds binary data that is none of these. */
kiln_status kt_graph_kind_of(const char *path, kt_graph_kind *kind);

/* The context of a model's graph from --n-ctx and --n-batch (0: not given): n_ctx defaults as
 * kiln_build_opts documents (4096, at most the model's n_ctx_train) and may not exceed
 * n_ctx_train; n_batch defaults to min(512, n_ctx) and may not exceed n_ctx. Both resolved in
 * place. False after a usage message of command cmd naming the flags and the numbers. */
bool kt_model_ctx(const char *cmd, const kiln_model_hparams *hp, int64_t *n_ctx, int64_t *n_batch);

/* Builds path's graph into a new context, as every command builds it: a .kg file parsed, a GGUF
 * model's graph built from its hyperparameters with n_ctx and n_batch (kt_model_ctx; argmax
 * output included, as kiln run builds it, so compile fills the cache run reads). A bundle, or
 * --n-ctx/--n-batch given for a .kg file, is refused. Returns KT_GO_ON when *ctx and *g are
 * built (the caller frees them), else the exit status (tools/cmd.h) after printing why to
 * stderr. */
int kt_graph_load(const char *cmd, const char *path, int64_t n_ctx, int64_t n_batch, kiln_ctx **ctx,
                  kiln_graph **g);

#endif
