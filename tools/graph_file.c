/* The GRAPH argument of the commands that compile (tools/graph_file.h). */
#include "tools/graph_file.h"

#include "base/base.h"
#include "tools/cmd.h"
#include "tools/flag.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n > k && strcmp(s + n - k, suffix) == 0;
}

/* The first bytes of path (up to cap), or an error naming it. */
static kiln_status head(const char *path, unsigned char *buf, size_t cap, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return kb_error(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    *n = fread(buf, 1, cap, f);
    bool err = ferror(f);
    fclose(f);
    return err ? kb_error(KILN_ERR_IO, "%s: cannot read", path) : NULL;
}

bool kt_graph_is_gguf(const char *path) {
    unsigned char m[4];
    size_t        n = 0;
    if (!path) return false;
    kiln_status st = head(path, m, sizeof m, &n);
    kiln_status_free(st);
    return (!st && n == 4 && !memcmp(m, "GGUF", 4)) || ends_with(path, ".gguf");
}

kiln_status kt_graph_kind_of(const char *path, kt_graph_kind *kind) {
    unsigned char buf[4096];
    size_t        n;
    kiln_status   st = head(path, buf, sizeof buf, &n);
    *kind = KT_GRAPH_KG;
    if (st) return st;
    if (n == 0) return kb_error(KILN_ERR_INVALID, "%s: empty file (expected a .kg graph, a GGUF model or a bundle)", path);
    if (n >= 8 && !memcmp(buf, "KILNBNDL", 8)) *kind = KT_GRAPH_BUNDLE;
    else if (kt_graph_is_gguf(path)) *kind = KT_GRAPH_GGUF;
    else if (ends_with(path, ".kiln"))
        return kb_error(KILN_ERR_FORMAT, "%s: not a kiln bundle (it does not start with KILNBNDL: truncated, or "
                                         "another kind of file)", path);
    else if (memchr(buf, 0, n))
        return kb_error(KILN_ERR_FORMAT, "%s: not a .kg graph (binary data), a GGUF model or a kiln bundle", path);
    return NULL;
}

bool kt_model_ctx(const char *cmd, const kiln_model_hparams *hp, int64_t *n_ctx, int64_t *n_batch) {
    int64_t train = hp->n_ctx_train;
    bool    given = *n_ctx > 0;
    if (!given) *n_ctx = kiln_default_n_ctx(hp);
    if (given && *n_ctx > train)
        return kt_flag_usage(cmd, "--n-ctx %lld: the model's training context (n_ctx_train) is %lld; give at most %lld",
                             (long long)*n_ctx, (long long)train, (long long)train);
    if (*n_batch > *n_ctx)
        return kt_flag_usage(cmd, "--n-batch %lld: a batch must fit in the context, %s %lld", (long long)*n_batch,
                             given ? "--n-ctx" : "which is by default", (long long)*n_ctx);
    if (*n_batch <= 0) *n_batch = kiln_default_n_batch(*n_ctx);
    return true;
}

static kiln_status build_model(const char *path, int64_t n_ctx, int64_t n_batch, kiln_ctx *ctx, const char *cmd,
                               int *usage) {
    kiln_model *m = NULL;
    kiln_status st = kiln_model_open(path, &m);
    if (!st && !kt_model_ctx(cmd, kiln_model_get_hparams(m), &n_ctx, &n_batch)) *usage = 1;
    kiln_build_opts o = {.n_ctx = n_ctx, .n_tokens_max = n_batch, .argmax = true};
    if (!st && !*usage) st = kiln_model_build(ctx, m, &o);
    kiln_model_close(m);
    return st;
}

int kt_graph_load(const char *cmd, const char *path, int64_t n_ctx, int64_t n_batch, kiln_ctx **ctx,
                  kiln_graph **g) {
    kt_graph_kind kind;
    int           usage = 0;
    *ctx = NULL;
    *g = NULL;
    kiln_status st = kt_graph_kind_of(path, &kind);
    if (!st && kind == KT_GRAPH_BUNDLE)
        st = kb_error(KILN_ERR_INVALID, "%s is an AOT bundle, not a graph: run it with 'kiln run --bundle %s', "
                                        "describe it with 'kiln inspect %s'", path, path, path);
    if (!st && kind == KT_GRAPH_KG && (n_ctx || n_batch)) {
        return kt_usage(cmd, "%s sizes a GGUF model's graph; %s is a .kg graph", n_ctx ? "--n-ctx" : "--n-batch",
                        path);
    }
    if (!st && !(*ctx = kiln_ctx_new())) st = kb_oom();
    if (!st && kind == KT_GRAPH_GGUF) st = build_model(path, n_ctx, n_batch, *ctx, cmd, &usage);
    if (!st && kind == KT_GRAPH_KG) st = kiln_load(*ctx, path);
    if (!st && !usage) st = kiln_graph_new(*ctx, g);
    if (!st && !usage) return KT_GO_ON;
    kiln_ctx_free(*ctx);
    *ctx = NULL;
    return usage ? KT_EXIT_USAGE : kt_fail(NULL, st);
}
