/* States (KILN_ROLE_STATE): memory that outlives a run, such as a KV cache.
 *
 * ggml writes a KV cache with set_rows into the cache tensor itself; kiln does the same when
 * set_rows's destination is a state: the node writes only the rows, into the state's buffer,
 * and its result is the state. That is only equal to the functional meaning of set_rows (a new
 * tensor, the old one unchanged) when nothing reads the old value, so this checks it. */
#include "ir_internal.h"

static const kiln_tensor *owner_of(const kiln_tensor *t) { return t->view_src ? t->view_src : t; }

static bool is_state(const kiln_tensor *t) { return t->op == FE_OP_LEAF && t->role == KILN_ROLE_STATE; }

/* The set_rows writing state s in place, or NULL; an error when two do. */
static kiln_status writer_of(const kiln_graph *g, const kiln_tensor *s, const kiln_tensor **w) {
    *w = NULL;
    for (int i = 0; i < g->n; i++) {
        const kiln_tensor *t = g->nodes[i];
        if (t->op != FE_OP_SET_ROWS || owner_of(t->src[0]) != s) continue;
        if (t->src[0] != s)
            return kb_error(KILN_ERR_INVALID,
                            "set_rows '%s' writes into a view of state '%s'; write the state itself "
                            "(set_rows(%s, ...)) so that it is updated in place",
                            t->name, s->name, s->name);
        if (*w)
            return kb_error(KILN_ERR_INVALID,
                            "state '%s' is written by two set_rows, '%s' and '%s'; a state is written "
                            "in place by at most one node per run",
                            s->name, (*w)->name, t->name);
        *w = t;
    }
    return NULL;
}

static kiln_status check_state(const kiln_graph *g, const kiln_tensor *s) {
    const kiln_tensor *w;
    kiln_status        st = writer_of(g, s, &w);
    if (st || !w) return st;
    if (w->role == KILN_ROLE_OUTPUT)
        return kb_error(KILN_ERR_INVALID,
                        "'%s' writes state '%s' in place, so it cannot also be an output; read the "
                        "state back by its name",
                        w->name, s->name);
    for (int i = 0; i < g->n; i++) {
        const kiln_tensor *t = g->nodes[i];
        if (t == w || (fe_ops[t->op].kind == FE_VIEW && t->role != KILN_ROLE_OUTPUT)) continue;
        for (int k = 0; k < FE_MAX_SRC; k++)
            if (t->src[k] && owner_of(t->src[k]) == s)
                return kb_error(KILN_ERR_INVALID,
                                "'%s' reads state '%s', which set_rows '%s' writes in place: read '%s' "
                                "(the state after the write) instead",
                                t->name, s->name, w->name, w->name);
        if (fe_ops[t->op].kind == FE_VIEW && owner_of(t) == s)
            return kb_error(KILN_ERR_INVALID,
                            "output '%s' is a view of state '%s', which set_rows '%s' writes in place; "
                            "view '%s' instead",
                            t->name, s->name, w->name, w->name);
    }
    return NULL;
}

kiln_status ir_check_states(const kiln_graph *g) {
    for (int i = 0; i < g->n; i++) {
        const kiln_tensor *t = g->nodes[i];
        if (!is_state(t)) continue;
        kiln_status st = check_state(g, t);
        if (st) return st;
    }
    return NULL;
}
