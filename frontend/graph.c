/* kiln_graph: the outputs of a context and everything they depend on. */
#include "frontend.h"

#include <stdlib.h>
#include <string.h>

static int by_name(const void *a, const void *b) {
    const kiln_tensor *x = *(kiln_tensor *const *)a, *y = *(kiln_tensor *const *)b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->id > y->id) - (x->id < y->id);
}

kiln_status fe_find_duplicate_name(kiln_tensor *const *t, int n, const kiln_tensor **first,
                                   const kiln_tensor **second) {
    *first = *second = NULL;
    if (n < 2) return NULL;
    kiln_tensor **sorted = malloc((size_t)n * sizeof *sorted);
    if (!sorted) return kb_oom();
    memcpy(sorted, t, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, by_name);
    for (int i = 1; i < n && !*first; i++)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
            *first = sorted[i - 1];
            *second = sorted[i];
        }
    free(sorted);
    return NULL;
}

/* Names identify inputs, weights and outputs at run time, so they must be unique. Builders
 * check user names, but an auto name "_ID" can still meet a user name spelled the same. */
static kiln_status check_unique_names(const kiln_graph *g) {
    const kiln_tensor *a, *b;
    kiln_status st = fe_find_duplicate_name(g->nodes, g->n, &a, &b);
    if (!st && a) st = kb_error(KILN_ERR_INVALID, "two tensors are named '%s'", a->name);
    return st;
}

kiln_status kiln_graph_new(kiln_ctx *ctx, kiln_graph **out) {
    if (!ctx || !out) return kb_error(KILN_ERR_INVALID, "kiln_graph_new: NULL argument");
    *out = NULL;
    if (ctx->err) return kb_status_copy(ctx->err);
    bool *keep = calloc((size_t)ctx->n + 1, sizeof *keep);
    if (!keep) return kb_oom();
    int nout = 0;
    /* Operands always have smaller ids than their users, so one backwards sweep marks every
     * ancestor of an output. */
    for (int i = ctx->n - 1; i >= 0; i--) {
        kiln_tensor *t = ctx->t[i];
        if (t->role == KILN_ROLE_OUTPUT) {
            keep[i] = true;
            nout++;
        }
        if (!keep[i]) continue;
        for (int s = 0; s < FE_MAX_SRC; s++)
            if (t->src[s]) keep[t->src[s]->id] = true;
    }
    if (nout == 0) {
        free(keep);
        return kb_error(KILN_ERR_INVALID, "the graph has no outputs (mark at least one: 'output NAME = ...' "
                                          "in .kg, kiln_set_output in C)");
    }
    kiln_graph *g = calloc(1, sizeof *g);
    int n = 0;
    for (int i = 0; i < ctx->n; i++) n += keep[i];
    if (g) g->nodes = malloc((size_t)n * sizeof *g->nodes);
    if (!g || !g->nodes) {
        free(keep);
        if (g) free(g);
        return kb_oom();
    }
    g->ctx = ctx;
    for (int i = 0; i < ctx->n; i++)
        if (keep[i]) g->nodes[g->n++] = ctx->t[i];
    free(keep);
    kiln_status st = check_unique_names(g);
    if (st) {
        kiln_graph_free(g);
        return st;
    }
    *out = g;
    return NULL;
}

void kiln_graph_free(kiln_graph *g) {
    if (!g) return;
    free(g->nodes);
    free(g);
}

int kiln_graph_size(const kiln_graph *g) { return g ? g->n : 0; }

kiln_tensor *kiln_graph_node(const kiln_graph *g, int i) {
    return g && i >= 0 && i < g->n ? g->nodes[i] : NULL;
}

double kiln_graph_nmse_tol(const kiln_graph *g) {
    double tol = 1e-6;
    for (int i = 0; g && i < g->n; i++)
        if (fe_ops[g->nodes[i]->op].nmse_tol > tol) tol = fe_ops[g->nodes[i]->op].nmse_tol;
    return tol;
}
