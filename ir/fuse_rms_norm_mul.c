/* Pass rms_norm_mul: a row norm, the multiplication by its weight and the residual adds after
 * it in one kernel (the norm kernel with an elementwise epilogue, templates/norm.lua).
 *
 * Pattern:  n = rms_norm(x) or norm(x)     (IR_OP, no epilogue yet)
 *           m = mul(n, w) or mul(w, n)     (the only reader of n; w broadcast onto n's shape)
 *           y = add(m, r) or add(r, m)     (optional, repeated: each the only reader of the last)
 * The consumers are still the single-instruction IR_EW nodes of the lowering (the pass runs
 * before ew_chain). Only what ggml fuses is taken: the first consumer must be a mul, the
 * following ones adds; any other elementwise work is left to ew_chain (which fuses chains
 * among IR_EW nodes only, so it does not touch the merged node).
 * Legality is ir_absorb_ew's (ir/absorb.c): each intermediate is a temporary read once,
 * naturally, over exactly the norm's output space (a mul that broadcasts the norm's result is
 * not taken); the weight and residual are inputs, weights or written before the norm; the
 * limits on operands and instructions hold. l2_norm and group_norm are not part of the pattern.
 * Effect: the norm node computes m (and y), its value rounded to the type the graph stored n in
 * first, so the result is bit for bit the unfused one in the reference; the consumers die.
 * Requires: lowered IR. Keeps: every IR invariant (ir_verify). Runs before memplan. */
#include "ir_internal.h"

/* The single live node reading buf, or -1 (none, or several, or one reading it twice). */
static int only_reader(const ir_prog *p, int buf) { return ir_readers(p, buf) == 1 ? ir_reader_after(p, buf, -1) : -1; }

/* Whether node ci is a single `op` instruction of an elementwise node (as lowered). */
static bool is_single(const ir_prog *p, int ci, fe_op op) {
    const ir_node *c = &p->nodes[ci];
    return c->kind == IR_EW && c->ninstr == 1 && c->ins[0].op == op;
}

/* Absorbs into node oi its buffer's only reader when it is a single `op` node. */
static bool absorb_next(ir_prog *p, int oi, fe_op op) {
    int buf = p->nodes[oi].dst.buf;
    if (p->bufs[buf].kind != IR_BUF_TEMP) return false;
    int ci = only_reader(p, buf);
    if (ci < 0 || !is_single(p, ci, op)) return false;
    /* x * x or x + x is not a weight or a residual: leave it to ew_chain */
    if (p->nodes[ci].nin != 2) return false;
    return ir_absorb_ew(p, oi, ci, &buf, 1, "rms_norm_mul");
}

kiln_status ir_fuse_rms_norm_mul(ir_prog *p) {
    for (int i = 0; i < p->nnodes; i++) {
        const ir_node *n = &p->nodes[i];
        if (n->dead || n->kind != IR_OP || n->ninstr > 0 || n->paired || n->fused) continue;
        if (n->op != FE_OP_RMS_NORM && n->op != FE_OP_NORM) continue;
        if (!absorb_next(p, i, FE_OP_MUL)) continue;
        while (absorb_next(p, i, FE_OP_ADD)) {
        }
    }
    return NULL;
}
