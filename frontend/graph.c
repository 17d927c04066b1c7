/* kiln_graph: the outputs of a context and everything they depend on. */
#include "frontend.h"

#include <stdlib.h>
#include <string.h>

/* A name's two lowest ids among the tensors that bear it. */
typedef struct {
    const kiln_tensor *lo, *lo2;
} name_slot;

/* In one pass over a table by name hash (a sort by name took an eighth of a program-cache hit:
 * every kiln_graph_new checks its thousands of names): of the names borne twice, the first in
 * byte order, and its two lowest ids. */
kiln_status fe_find_duplicate_name(kiln_tensor *const *t, int n, const kiln_tensor **first,
                                   const kiln_tensor **second) {
    *first = *second = NULL;
    if (n < 2) return NULL;
    size_t cap = 64;
    while (cap < 2 * (size_t)n) cap *= 2;
    name_slot *slot = calloc(cap, sizeof *slot);
    if (!slot) return kb_oom();
    for (int i = 0; i < n; i++) {
        size_t h = (size_t)fe_name_hash(t[i]->name) & (cap - 1);
        while (slot[h].lo && strcmp(slot[h].lo->name, t[i]->name)) h = (h + 1) & (cap - 1);
        name_slot *s = &slot[h];
        const kiln_tensor *x = t[i];
        if (!s->lo || x->id < s->lo->id) s->lo2 = s->lo, s->lo = x;
        else if (!s->lo2 || x->id < s->lo2->id) s->lo2 = x;
    }
    for (size_t h = 0; h < cap; h++)
        if (slot[h].lo2 && (!*first || strcmp(slot[h].lo->name, (*first)->name) < 0))
            *first = slot[h].lo, *second = slot[h].lo2;
    free(slot);
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
