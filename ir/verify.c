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

/* An operand index that is valid and not one of the op's own slots. */
static bool extra_operand(const ir_node *n, int k) { return k >= 0 && k < n->nin && !ir_in_slot(n, k); }

/* The fields of paired and fused nodes (ir.h) refer to operands and outputs that exist. */
static kiln_status check_fused(const ir_prog *p, int i, const ir_node *n) {
    if (n->kind != IR_OP) {
        if (n->paired || n->fused || n->has_dst2)
            return kb_error(KILN_ERR_INVALID, "IR node %d: an elementwise node cannot be paired or fused", i);
        return NULL;
    }
    if (n->paired) {
        const ir_ref *w = ir_operand(n, 0);
        if (!w || !extra_operand(n, n->pair_in))
            return kb_error(KILN_ERR_INVALID, "IR node %d: paired operand %d is not an extra operand", i, n->pair_in);
        const ir_ref *w2 = &n->in[n->pair_in];
        for (int d = 0; d < 4; d++)
            if (w2->ne[d] != w->ne[d] || w2->type != w->type)
                return kb_error(KILN_ERR_INVALID, "IR node %d: paired weight differs from slot 0 in shape or type", i);
    }
    switch (n->fused) {
    case IR_FUSED_NONE:
        if (n->has_dst2) return kb_error(KILN_ERR_INVALID, "IR node %d: a second output without a fusion", i);
        return NULL;
    case IR_FUSED_TOPK_MOE:
        if (n->op != FE_OP_ARGSORT_TOP_K || !n->has_dst2 || n->dst2.type != KILN_I32 || n->moe.k < 1 ||
            (n->moe.bias_in >= 0 && !extra_operand(n, n->moe.bias_in)))
            return kb_error(KILN_ERR_INVALID, "IR node %d: malformed topk_moe", i);
        return check_ref(p, i, "dst2", &n->dst2);
    case IR_FUSED_ROPE_SET_ROWS:
        if (n->op != FE_OP_ROPE_EXT || n->has_dst2 || !extra_operand(n, n->scatter.a_in) ||
            !extra_operand(n, n->scatter.ids_in))
            return kb_error(KILN_ERR_INVALID, "IR node %d: malformed rope_set_rows", i);
        return NULL;
    }
    return kb_error(KILN_ERR_INVALID, "IR node %d: unknown fusion kind %d", i, (int)n->fused);
}

/* Operand k of n is the state that n updates in place: set_rows's destination (or that of a
 * fused rope_set_rows), the very layout n writes. */
static bool in_place_operand(const ir_prog *p, const ir_node *n, int k) {
    if (p->bufs[n->dst.buf].kind != IR_BUF_STATE || n->kind != IR_OP) return false;
    bool slot = (n->op == FE_OP_SET_ROWS && n->opd[0] == k) ||
                (n->fused == IR_FUSED_ROPE_SET_ROWS && n->scatter.a_in == k);
    return slot && ir_ref_equal(&n->in[k], &n->dst);
}

static kiln_status check_node(const ir_prog *p, int i, const bool *written) {
    const ir_node *n = &p->nodes[i];
    kiln_status st = check_ref(p, i, "dst", &n->dst);
    if (st) return st;
    ir_buf_kind dk = p->bufs[n->dst.buf].kind;
    if (ir_buf_preset(dk))
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
    if ((st = check_fused(p, i, n))) return st;
    if (n->bnorm && (ew || n->op != FE_OP_MUL_MAT || !extra_operand(n, n->bnorm_w) || !ir_operand(n, 1)))
        return kb_error(KILN_ERR_INVALID, "IR node %d: malformed rms_norm_gemv", i);
    bool epi_in[IR_MAX_IN] = {false}; /* IR_OP: operands of the epilogue (in no slot) */
    for (int k = 0; !ew && n->ninstr > 0 && k < n->nin; k++) {
        epi_in[k] = !(n->paired && k == n->pair_in) && !(n->bnorm && k == n->bnorm_w);
        for (int s = 0; s < FE_MAX_SRC; s++) epi_in[k] &= n->opd[s] != k;
    }
    for (int k = 0; k < 32 && n->by_id; k++) {
        if (!(n->by_id >> k & 1u)) continue;
        const ir_ref *r = k < n->nin ? &n->in[k] : NULL;
        if (ew || n->op != FE_OP_MUL_MAT_ID || !r || !epi_in[k] || n->dst.ne[0] % r->ne[0] != 0 || r->ne[2] != 1 ||
            r->ne[3] != 1)
            return kb_error(KILN_ERR_INVALID, "IR node %d: operand %d read through ids is not a [ne0, experts] "
                                              "epilogue operand of a mul_mat_id", i, k);
        epi_in[k] = false; /* (it does not broadcast: below) */
    }
    if (!ew && (n->ninstr > 0 || n->paired || n->fused) && (unsigned)n->op_type >= KILN_TYPE_COUNT)
        return kb_error(KILN_ERR_INVALID, "IR node %d: epilogue without a valid op type", i);
    for (int k = 0; k < n->nin; k++) {
        if ((st = check_ref(p, i, "operand", &n->in[k]))) return st;
        int b = n->in[k].buf;
        if (b == n->dst.buf && !in_place_operand(p, n, k))
            return kb_error(KILN_ERR_INVALID, "IR node %d reads the buffer it writes ('%s')", i, p->bufs[b].name);
        ir_buf_kind bk = p->bufs[b].kind;
        if (!ir_buf_preset(bk) && bk != IR_BUF_STATE && !written[b])
            return kb_error(KILN_ERR_INVALID, "IR node %d reads '%s' before any node writes it", i, p->bufs[b].name);
        for (int d = 0; (ew || epi_in[k]) && d < 4; d++)
            if (n->dst.ne[d] % n->in[k].ne[d] != 0)
                return kb_error(KILN_ERR_INVALID, "IR node %d: operand %d does not broadcast in dim %d", i, k, d);
    }
    for (int j = 0; j < n->ninstr; j++) {
        const ir_instr *in = &n->ins[j];
        int limit = n->nin + j + (ew ? 0 : ir_op_values(n)); /* IR_OP: registers nin.. are the op's values */
        if ((unsigned)in->op >= FE_OP_COUNT || in->a < 0 || in->a >= limit ||
            (fe_ops[in->op].nsrc > 1 && (in->b < 0 || in->b >= limit)))
            return kb_error(KILN_ERR_INVALID, "IR node %d: instruction %d reads a register not yet defined", i, j);
    }
    return NULL;
}

/* Whether node m hosts tails in its GEMV's store (pass gemv_rope): a one-column mul_mat. */
static bool gemv_host(const ir_node *m) {
    return m->kind == IR_OP && m->op == FE_OP_MUL_MAT && m->dst.ne[1] == 1 && m->dst.ne[2] == 1 && m->dst.ne[3] == 1;
}

/* A member of a head_rope run: a plain rope or set_rows, an rms_norm with an epilogue at most, or
 * an elementwise node (after a rope of the run). */
static bool head_member(const ir_node *n) {
    if (n->kind == IR_EW) return n->ninstr > 0;
    return n->kind == IR_OP && !n->paired && !n->bnorm && !n->has_dst2 &&
           ((n->op == FE_OP_ROPE_EXT && n->fused != IR_FUSED_TOPK_MOE && n->ninstr == 0) ||
            (n->op == FE_OP_SET_ROWS && n->fused == IR_FUSED_NONE && n->ninstr == 0) ||
            (n->op == FE_OP_RMS_NORM && n->fused == IR_FUSED_NONE));
}

/* Whether buffer b, which tail i of host h reads, is ready for the host's kernel: an input or
 * weight, the tail's own state in place (operand k), the host's result (gemv_rope), written
 * before the host, or (head_rope) the result of an rms_norm (read by a rope) or of a plain rope
 * (read by an elementwise node) of the run. */
static bool tail_reads_ok(const ir_prog *p, int h, int i, int k) {
    const ir_node *n = &p->nodes[i], *m = &p->nodes[h];
    int            b = n->in[k].buf;
    if (ir_buf_preset(p->bufs[b].kind) || in_place_operand(p, n, k)) return true;
    if (gemv_host(m)) return b == m->dst.buf;
    int w = ir_node_writing(p, b);
    if (w >= 0 && w < h) return true;
    if (w < h || w >= i) return false;
    const ir_node *o = &p->nodes[w];
    return n->kind == IR_EW ? o->kind == IR_OP && o->op == FE_OP_ROPE_EXT && o->fused == IR_FUSED_NONE
                            : o->kind == IR_OP && o->op == FE_OP_RMS_NORM && n->op == FE_OP_ROPE_EXT;
}

/* Node i is a tail of its host (ir.h, host): the host is an earlier node with its own kernel,
 * only tails of it lie between, and the tail is one the host's kind computes: a rope or set_rows
 * after a one-column mul_mat (gemv_rope), or any member of a head_rope run after its first. */
static kiln_status check_tail(const ir_prog *p, int i) {
    const ir_node *n = &p->nodes[i];
    int            h = n->host - 1;
    const ir_node *m = h >= 0 && h < i ? &p->nodes[h] : NULL;
    if (!m || m->dead || m->host || !(gemv_host(m) || head_member(m)))
        return kb_error(KILN_ERR_INVALID, "IR node %d: its host %d is not an earlier one-column mul_mat or head_rope run",
                        i, h);
    for (int j = h + 1; j < i; j++)
        if (!p->nodes[j].dead && p->nodes[j].host != n->host)
            return kb_error(KILN_ERR_INVALID, "IR node %d: node %d runs between it and its host %d", i, j, h);
    bool kind = gemv_host(m) ? n->kind == IR_OP && n->ninstr == 0 && !n->paired && !n->bnorm &&
                                   ((n->op == FE_OP_ROPE_EXT && n->fused != IR_FUSED_TOPK_MOE) ||
                                    (n->op == FE_OP_SET_ROWS && n->fused == IR_FUSED_NONE))
                             : head_member(n);
    if (!kind)
        return kb_error(KILN_ERR_INVALID, "IR node %d: only a plain rope or set_rows (or, in a head_rope run, an rms_norm "
                        "or an elementwise node) can be a tail", i);
    for (int k = 0; k < n->nin; k++)
        if (!tail_reads_ok(p, h, i, k))
            return kb_error(KILN_ERR_INVALID, "IR node %d: a tail reads '%s', which is neither its host's result nor "
                            "ready before the host", i, p->bufs[n->in[k].buf].name);
    return NULL;
}

/* The buffer of tail i's group that its kernel does not store, or -1: a gemv_rope host's result;
 * in a head_rope run, the result of an rms_norm (the tail's own, or the host's when i is the
 * first tail), and a rope's result that an elementwise tail reads. */
static int unstored(const ir_prog *p, int i) {
    const ir_node *n = &p->nodes[i];
    int            h = n->host - 1;
    if (gemv_host(&p->nodes[h])) return p->nodes[h].dst.buf;
    if (n->kind == IR_OP && n->op == FE_OP_RMS_NORM) return n->dst.buf;
    for (int k = 0; n->kind == IR_EW && k < n->nin; k++) {
        int w = ir_node_writing(p, n->in[k].buf);
        if (w >= h && w < i) return n->in[k].buf;
    }
    return -1;
}

/* The tails' rules, and: nothing outside a group reads what its kernel does not store. */
static kiln_status check_hosts(const ir_prog *p) {
    int *hosted = NULL; /* by buffer: index + 1 of the host of the group that does not store it */
    for (int i = 0; i < p->nnodes; i++) {
        const ir_node *n = &p->nodes[i];
        if (n->dead || !n->host) continue;
        kiln_status st = check_tail(p, i);
        if (st) {
            free(hosted);
            return st;
        }
        if (!hosted && !(hosted = calloc((size_t)p->nbufs + 1, sizeof *hosted))) return kb_oom();
        int h = n->host - 1, b = unstored(p, i);
        if (b >= 0) hosted[b] = n->host;
        if (i == ir_next_tail(p, h, h) && !gemv_host(&p->nodes[h]) && p->nodes[h].kind == IR_OP &&
            p->nodes[h].op == FE_OP_RMS_NORM)
            hosted[p->nodes[h].dst.buf] = n->host;
    }
    for (int i = 0; hosted && i < p->nnodes; i++) {
        const ir_node *n = &p->nodes[i];
        for (int k = 0; !n->dead && k < n->nin; k++) {
            int h = hosted[n->in[k].buf];
            if (h && n->host != h && i != h - 1) {
                kiln_status st = kb_error(KILN_ERR_INVALID, "IR node %d reads '%s', the result of host %d, which only "
                                          "its tails may read", i, p->bufs[n->in[k].buf].name, h - 1);
                free(hosted);
                return st;
            }
        }
    }
    free(hosted);
    return NULL;
}

/* A weight placed in a block lies inside it, in its type, aligned. */
static kiln_status check_blocks(const ir_prog *p) {
    for (int w = 0; w < p->nbufs; w++) {
        const ir_buf *b = &p->bufs[w];
        if (!b->block) continue;
        int           k = b->block - 1;
        const ir_buf *blk = k >= 0 && k < p->nbufs ? &p->bufs[k] : NULL;
        if (b->kind != IR_BUF_WEIGHT || !blk || blk->kind != IR_BUF_BLOCK || blk->type != b->type ||
            b->offset % IR_ALIGN != 0 || b->offset > blk->bytes || b->bytes > blk->bytes - b->offset)
            return kb_error(KILN_ERR_INVALID, "buffer '%s' is not a weight inside the weight block it names (%d)",
                            b->name, b->block);
    }
    return NULL;
}

kiln_status ir_verify(const ir_prog *p) {
    kiln_status bs = check_blocks(p);
    if (!bs) bs = check_hosts(p);
    if (bs) return bs;
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
        if (!st && p->nodes[i].has_dst2) {
            int b = p->nodes[i].dst2.buf;
            if (written[b] || b == p->nodes[i].dst.buf || ir_buf_preset(p->bufs[b].kind))
                st = kb_error(KILN_ERR_INVALID, "IR node %d: its second output '%s' is written elsewhere or read-only", i,
                              p->bufs[b].name);
            for (int k = 0; !st && k < p->nodes[i].nin; k++)
                if (p->nodes[i].in[k].buf == b)
                    st = kb_error(KILN_ERR_INVALID, "IR node %d reads its second output '%s'", i, p->bufs[b].name);
            if (!st) written[b] = true;
        }
    }
    for (int b = 0; b < p->nbufs && !st; b++)
        if (p->bufs[b].kind == IR_BUF_OUTPUT && !written[b])
            st = kb_error(KILN_ERR_INVALID, "output '%s' is never written", p->bufs[b].name);
    free(written);
    return st;
}
