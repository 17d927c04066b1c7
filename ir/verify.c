/* The IR verifier: the invariants every pass must keep. */
#include "ir_internal.h"

#include <stdlib.h>

/* Largest element offset reachable through r, plus one. */
static int64_t extent(const ir_ref *r) {
    int64_t e = r->offs + 1;
    for (int d = 0; d < 4; d++) e += (r->ne[d] - 1) * r->st[d];
    return e;
}

static kiln_status check_ref(const ir_prog *p, int i, const char *what, const ir_ref *r) {
    if (r->buf < 0 || r->buf >= p->nbufs)
        return kb_error(KILN_ERR_INVALID, "IR node %d: %s refers to buffer %d of %d", i, what, r->buf, p->nbufs);
    const ir_buf *b = &p->bufs[r->buf];
    if (r->type != b->type)
        return kb_error(KILN_ERR_INVALID, "IR node %d: %s reads %s buffer '%s' as %s", i, what,
                        kiln_type_name(b->type), b->name, kiln_type_name(r->type));
    int64_t elems = b->ne[0] * b->ne[1] * b->ne[2] * b->ne[3];
    for (int d = 0; d < 4; d++)
        if (r->ne[d] < 1 || r->st[d] < 0)
            return kb_error(KILN_ERR_INVALID, "IR node %d: %s has a bad extent or stride in dim %d", i, what, d);
    if (r->offs < 0 || extent(r) > elems)
        return kb_error(KILN_ERR_INVALID, "IR node %d: %s reaches element %lld of buffer '%s' (%lld elements)",
                        i, what, (long long)extent(r), b->name, (long long)elems);
    return NULL;
}

static kiln_status check_node(const ir_prog *p, int i, const bool *written) {
    const ir_node *n = &p->nodes[i];
    kiln_status st = check_ref(p, i, "dst", &n->dst);
    if (st) return st;
    ir_buf_kind dk = p->bufs[n->dst.buf].kind;
    if (dk == IR_BUF_INPUT || dk == IR_BUF_WEIGHT)
        return kb_error(KILN_ERR_INVALID, "IR node %d writes %s '%s'", i,
                        dk == IR_BUF_INPUT ? "input" : "weight", p->bufs[n->dst.buf].name);
    bool ew = n->kind == IR_EW;
    if (!ew && (n->kind != IR_OP || (unsigned)n->op >= FE_OP_COUNT || fe_ops[n->op].kind != FE_KERNEL))
        return kb_error(KILN_ERR_INVALID, "IR node %d: bad kind or op", i);
    if (n->nin < 0 || n->nin > IR_MAX_IN || (ew && (n->ninstr < 1 || n->ninstr > IR_MAX_INSTR)) ||
        (!ew && (n->ninstr < 0 || n->ninstr > IR_MAX_INSTR)))
        return kb_error(KILN_ERR_INVALID, "IR node %d: %d operands, %d instructions", i, n->nin, n->ninstr);
    for (int s = 0; !ew && s < FE_MAX_SRC; s++)
        if (n->opd[s] < -1 || n->opd[s] >= n->nin)
            return kb_error(KILN_ERR_INVALID, "IR node %d: operand slot %d refers to operand %d of %d", i, s,
                            n->opd[s], n->nin);
    bool epi_in[IR_MAX_IN] = {false}; /* IR_OP: operands of the epilogue (in no slot) */
    for (int k = 0; !ew && n->ninstr > 0 && k < n->nin; k++) {
        epi_in[k] = true;
        for (int s = 0; s < FE_MAX_SRC; s++) epi_in[k] &= n->opd[s] != k;
    }
    if (!ew && n->ninstr > 0 && (unsigned)n->op_type >= KILN_TYPE_COUNT)
        return kb_error(KILN_ERR_INVALID, "IR node %d: epilogue without a valid op type", i);
    for (int k = 0; k < n->nin; k++) {
        if ((st = check_ref(p, i, "operand", &n->in[k]))) return st;
        int b = n->in[k].buf;
        if (b == n->dst.buf)
            return kb_error(KILN_ERR_INVALID, "IR node %d reads the buffer it writes ('%s')", i, p->bufs[b].name);
        ir_buf_kind bk = p->bufs[b].kind;
        if (bk != IR_BUF_INPUT && bk != IR_BUF_WEIGHT && !written[b])
            return kb_error(KILN_ERR_INVALID, "IR node %d reads '%s' before any node writes it", i, p->bufs[b].name);
        for (int d = 0; (ew || epi_in[k]) && d < 4; d++)
            if (n->dst.ne[d] % n->in[k].ne[d] != 0)
                return kb_error(KILN_ERR_INVALID, "IR node %d: operand %d does not broadcast in dim %d", i, k, d);
    }
    for (int j = 0; j < n->ninstr; j++) {
        const ir_instr *in = &n->ins[j];
        int limit = n->nin + j + !ew; /* IR_OP: register nin is the op's value */
        if ((unsigned)in->op >= FE_OP_COUNT || in->a < 0 || in->a >= limit ||
            (fe_ops[in->op].nsrc > 1 && (in->b < 0 || in->b >= limit)))
            return kb_error(KILN_ERR_INVALID, "IR node %d: instruction %d reads a register not yet defined", i, j);
    }
    return NULL;
}

kiln_status ir_verify(const ir_prog *p) {
    bool *written = calloc((size_t)p->nbufs + 1, sizeof *written);
    if (!written) return kb_oom();
    kiln_status st = NULL;
    for (int i = 0; i < p->nnodes && !st; i++) {
        if (p->nodes[i].dead) continue;
        st = check_node(p, i, written);
        if (!st && written[p->nodes[i].dst.buf])
            st = kb_error(KILN_ERR_INVALID, "IR node %d writes '%s', which an earlier node wrote", i,
                          p->bufs[p->nodes[i].dst.buf].name);
        if (!st) written[p->nodes[i].dst.buf] = true;
    }
    for (int b = 0; b < p->nbufs && !st; b++)
        if (p->bufs[b].kind == IR_BUF_OUTPUT && !written[b])
            st = kb_error(KILN_ERR_INVALID, "output '%s' is never written", p->bufs[b].name);
    free(written);
    return st;
}
