/* Pass ew_chain: fuse a producer elementwise node P into its consumer C.
 *
 * Pattern:  P: tmp = f(x...)      C: y = g(..., tmp, ...)
 * Legal when
 *   - tmp is a temporary (not an input, weight or output) read by exactly one operand of one
 *     live node (C), so no other reader needs it materialized;
 *   - C reads tmp through its natural layout (same shape, contiguous, offset 0). C may broadcast
 *     it: P's index space then divides C's in every dim, and P's own operands, which broadcast by
 *     modulo of their extents, read the same elements at C's coordinates (their extents divide
 *     P's, which divide C's). A permuted or re-viewed read is not a coordinate-wise map and is
 *     left unfused.
 *   - the merged kernel stays within IR_MAX_IN operands and IR_MAX_INSTR instructions.
 * Effect: C computes P's instructions inline, P is dead and tmp no longer exists. Each
 * instruction still rounds to the type its value had in the graph, so results are unchanged.
 * Requires: lowered IR. Keeps: every IR invariant (ir_verify). Runs before memplan. */
#include "ir_internal.h"

#include <string.h>

static int find_or_add(ir_ref *list, int *n, const ir_ref *r) {
    for (int i = 0; i < *n; i++)
        if (ir_ref_equal(&list[i], r)) return i;
    list[*n] = *r;
    return (*n)++;
}

/* Number of operands after merging P into C at C's operand k, or -1 when over the limit. */
static int merged_inputs(const ir_node *c, int k, const ir_node *pn, ir_ref *ins) {
    int n = 0;
    for (int i = 0; i < c->nin; i++)
        if (i != k) {
            if (n == IR_MAX_IN) return -1;
            find_or_add(ins, &n, &c->in[i]);
        }
    for (int i = 0; i < pn->nin; i++) {
        if (n == IR_MAX_IN) {
            bool present = false;
            for (int j = 0; j < n; j++) present |= ir_ref_equal(&ins[j], &pn->in[i]);
            if (!present) return -1;
        }
        find_or_add(ins, &n, &pn->in[i]);
    }
    return n;
}

static int input_index(const ir_ref *ins, int n, const ir_ref *r) {
    for (int i = 0; i < n; i++)
        if (ir_ref_equal(&ins[i], r)) return i;
    return -1; /* cannot happen: every operand was added by merged_inputs */
}

/* Rewrites c as P's instructions followed by C's, over the merged operand list. */
static void merge(ir_node *c, int k, ir_node *pn, const ir_ref *ins, int nin, const char *fusion) {
    ir_node m = *c;
    m.nin = nin;
    memcpy(m.in, ins, (size_t)nin * sizeof *ins);
    m.ninstr = 0;
    int pmap[IR_MAX_IN + IR_MAX_INSTR], cmap[IR_MAX_IN + IR_MAX_INSTR];
    for (int i = 0; i < pn->nin; i++) pmap[i] = input_index(ins, nin, &pn->in[i]);
    for (int i = 0; i < pn->ninstr; i++) {
        ir_instr in = pn->ins[i];
        in.a = pmap[in.a];
        in.b = fe_ops[in.op].nsrc > 1 ? pmap[in.b] : 0;
        pmap[pn->nin + i] = nin + m.ninstr;
        m.ins[m.ninstr++] = in;
    }
    for (int i = 0; i < c->nin; i++)
        cmap[i] = i == k ? pmap[pn->nin + pn->ninstr - 1] : input_index(ins, nin, &c->in[i]);
    for (int i = 0; i < c->ninstr; i++) {
        ir_instr in = c->ins[i];
        in.a = cmap[in.a];
        in.b = fe_ops[in.op].nsrc > 1 ? cmap[in.b] : 0;
        cmap[c->nin + i] = nin + m.ninstr;
        m.ins[m.ninstr++] = in;
    }
    m.nsrc = 0;
    for (int i = 0; i < pn->nsrc; i++) m.src[m.nsrc++] = pn->src[i];
    for (int i = 0; i < c->nsrc; i++) m.src[m.nsrc++] = c->src[i];
    m.fusion = fusion;
    *c = m;
    pn->dead = true;
}

bool ir_ew_fuse_producer(ir_prog *p, int ci, int k, const char *fusion) {
    ir_node *c = &p->nodes[ci];
    const ir_ref *r = &c->in[k];
    if (p->bufs[r->buf].kind != IR_BUF_TEMP) return false;
    int pi = ir_node_writing(p, r->buf);
    if (pi < 0 || pi >= ci) return false;
    ir_node *pn = &p->nodes[pi];
    if (pn->kind != IR_EW || c->kind != IR_EW) return false;
    if (!ir_ref_is_natural(p, r) || !ir_ref_is_natural(p, &pn->dst)) return false;
    if (ir_readers(p, r->buf) != 1) return false;
    if (pn->ninstr + c->ninstr > IR_MAX_INSTR || pn->nsrc + c->nsrc > IR_MAX_INSTR) return false;
    ir_ref ins[IR_MAX_IN];
    int nin = merged_inputs(c, k, pn, ins);
    if (nin < 0) return false;
    merge(c, k, pn, ins, nin, fusion);
    return true;
}

kiln_status ir_fuse_elementwise(ir_prog *p) {
    for (int ci = 0; ci < p->nnodes; ci++) {
        if (p->nodes[ci].dead) continue;
        /* Fusing changes c's operand list; rescan it from the start until nothing fuses. */
        bool again = true;
        while (again) {
            again = false;
            for (int k = 0; k < p->nodes[ci].nin && !again; k++) again = ir_ew_fuse_producer(p, ci, k, "ew_chain");
        }
    }
    return NULL;
}
