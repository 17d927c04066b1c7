/* Pass add_chain: a residual plus several adds in one kernel.
 *
 * Three rewrites, in order, each leaving the semantics unchanged:
 *  1. Chains: an elementwise node made only of adds (and scales by constants, add_only) absorbs
 *     such a producer whose result it alone reads (the rules of ew_chain, restricted to these ops
 *     so it works with ew_chain off).
 *  2. Slices: when every read of a temporary W is an operand of one add-only node C (two or more
 *     reads), each read
 *     through a view of W (llama.cpp's MoE sum reads the weighted expert outputs slot by slot:
 *     view(weighted, slot k), then adds) and W is computed by an elementwise node P, C computes P
 *     inline once per view: P's operands are re-viewed through the same slice. W is never stored.
 *     A view maps onto P's index space when each of its dims with extent > 1 has the natural
 *     stride of a distinct dim of W and stays inside it; P's operands must be full or broadcast
 *     (extent 1) in each mapped dim. Otherwise nothing changes.
 *  3. Into the producer: the add-only node becomes the epilogue of the mul_mat / mul_mat_id that
 *     produced one of its operands (the residual add after a projection), through ir_absorb_ew.
 * Requires: lowered IR (runs after rms_norm_mul, before ew_chain). Keeps: ir_verify. */
#include "ir_internal.h"

#include <string.h>

static const char *const NAME = "add_chain";

/* Adds, and scales by constants: granite multiplies each residual branch by residual_scale
 * before its add (model/arch_build.c), which must not keep the add out of the projection's
 * epilogue. */
static bool add_only(const ir_node *n) {
    if (n->dead || n->kind != IR_EW) return false;
    for (int j = 0; j < n->ninstr; j++)
        if (n->ins[j].op != FE_OP_ADD && n->ins[j].op != FE_OP_SCALE) return false;
    return true;
}

/* 1. */
static bool fuse_chains(ir_prog *p) {
    bool any = false;
    for (int ci = 0; ci < p->nnodes; ci++) {
        bool again = add_only(&p->nodes[ci]);
        while (again) {
            again = false;
            for (int k = 0; k < p->nodes[ci].nin && !again; k++) {
                int pi = ir_node_writing(p, p->nodes[ci].in[k].buf);
                if (pi >= 0 && add_only(&p->nodes[pi])) again = ir_ew_fuse_producer(p, ci, k, NAME);
            }
            any |= again;
        }
    }
    return any;
}

/* Where view v of P's (natural) destination lies in P's index space: pdim[i] is the dim of P
 * that v's dim i walks (-1 for extent 1), base the coordinates of v's first element. */
static bool view_map(const ir_node *pn, const ir_ref *v, int pdim[4], int64_t base[4]) {
    const int64_t *ne = pn->dst.ne;
    int64_t        nat[4] = {1, ne[0], ne[0] * ne[1], ne[0] * ne[1] * ne[2]};
    int64_t        off = v->offs;
    for (int d = 3; d >= 0; d--) {
        base[d] = off / nat[d];
        off %= nat[d];
        if (base[d] >= ne[d]) return false;
    }
    bool used[4] = {false};
    for (int i = 0; i < 4; i++) {
        pdim[i] = -1;
        if (v->ne[i] == 1) continue;
        for (int d = 0; d < 4 && pdim[i] < 0; d++)
            if (!used[d] && ne[d] > 1 && nat[d] == v->st[i]) pdim[i] = d;
        if (pdim[i] < 0 || base[pdim[i]] + v->ne[i] > ne[pdim[i]]) return false;
        used[pdim[i]] = true;
    }
    return true;
}

/* Operand o of P as read at the coordinates of view v (see view_map). */
static bool compose(const ir_node *pn, const ir_ref *o, const ir_ref *v, const int pdim[4], const int64_t base[4],
                    ir_ref *out) {
    *out = *o;
    for (int d = 0; d < 4; d++) out->offs += (base[d] % o->ne[d]) * o->st[d];
    for (int i = 0; i < 4; i++) {
        int d = pdim[i];
        if (d < 0 || o->ne[d] == 1) {
            out->ne[i] = 1;
            out->st[i] = 0;
            out->sym[i] = 0;
        } else if (o->ne[d] == pn->dst.ne[d]) {
            out->ne[i] = v->ne[i];
            out->st[i] = o->st[d];
            out->sym[i] = v->sym[i];
        } else {
            return false; /* a partial (modulo) broadcast does not survive slicing */
        }
    }
    return true;
}

static int add_operand(ir_node *m, const ir_ref *r) {
    for (int j = 0; j < m->nin; j++)
        if (ir_ref_equal(&m->in[j], r)) return j;
    if (m->nin == IR_MAX_IN) return -1;
    m->in[m->nin] = *r;
    return m->nin++;
}

/* 2: C (add-only) computes P inline at each of its reads of P's destination. */
static bool inline_slices(ir_prog *p, int ci, int pi) {
    const ir_node *c = &p->nodes[ci], *pn = &p->nodes[pi];
    int            w = pn->dst.buf, reads = 0;
    for (int k = 0; k < c->nin; k++) reads += c->in[k].buf == w;
    /* One read is a plain producer-consumer pair: ew_chain's business. */
    if (reads < 2 || reads != ir_readers(p, w) || !ir_ref_is_natural(p, &pn->dst)) return false;
    if (reads * pn->ninstr + c->ninstr > IR_MAX_INSTR || pn->nsrc + c->nsrc > IR_MAX_INSTR) return false;
    ir_node m = *c;
    m.nin = 0;
    m.ninstr = 0;
    /* Operand registers first (all of them must be known before instructions are numbered). */
    int     opd_reg[IR_MAX_IN], pin[IR_MAX_IN][IR_MAX_IN];
    for (int k = 0; k < c->nin; k++) {
        opd_reg[k] = -1;
        if (c->in[k].buf != w) {
            if ((opd_reg[k] = add_operand(&m, &c->in[k])) < 0) return false;
            continue;
        }
        int     pdim[4];
        int64_t base[4];
        if (!view_map(pn, &c->in[k], pdim, base)) return false;
        for (int j = 0; j < pn->nin; j++) {
            ir_ref r;
            if (!compose(pn, &pn->in[j], &c->in[k], pdim, base, &r)) return false;
            if ((pin[k][j] = add_operand(&m, &r)) < 0) return false;
        }
    }
    /* Then P's instructions once per view, then C's, over the merged registers. */
    int cmap[IR_MAX_IN + IR_MAX_INSTR];
    for (int k = 0; k < c->nin; k++) {
        if (opd_reg[k] >= 0) {
            cmap[k] = opd_reg[k];
            continue;
        }
        int pmap[IR_MAX_IN + IR_MAX_INSTR];
        for (int j = 0; j < pn->nin; j++) pmap[j] = pin[k][j];
        for (int j = 0; j < pn->ninstr; j++) {
            ir_instr in = pn->ins[j];
            in.a = pmap[in.a];
            if (fe_ops[in.op].nsrc > 1) in.b = pmap[in.b];
            pmap[pn->nin + j] = m.nin + m.ninstr;
            m.ins[m.ninstr++] = in;
        }
        cmap[k] = pmap[pn->nin + pn->ninstr - 1];
    }
    for (int j = 0; j < c->ninstr; j++) {
        ir_instr in = c->ins[j];
        in.a = cmap[in.a];
        if (fe_ops[in.op].nsrc > 1) in.b = cmap[in.b];
        cmap[c->nin + j] = m.nin + m.ninstr;
        m.ins[m.ninstr++] = in;
    }
    m.nsrc = 0;
    for (int s = 0; s < pn->nsrc; s++) m.src[m.nsrc++] = pn->src[s];
    for (int s = 0; s < c->nsrc; s++) m.src[m.nsrc++] = c->src[s];
    m.fusion = NAME;
    p->nodes[ci] = m;
    p->nodes[pi].dead = true;
    return true;
}

static bool fuse_slices(ir_prog *p) {
    bool any = false;
    for (int ci = 0; ci < p->nnodes; ci++) {
        if (!add_only(&p->nodes[ci])) continue;
        for (int k = 0; k < p->nodes[ci].nin; k++) {
            int pi = ir_node_writing(p, p->nodes[ci].in[k].buf);
            if (pi < 0 || p->nodes[pi].kind != IR_EW || p->bufs[p->nodes[ci].in[k].buf].kind != IR_BUF_TEMP) continue;
            if (inline_slices(p, ci, pi)) {
                any = true;
                break;
            }
        }
    }
    return any;
}

/* 3. */
static void fuse_into_matmul(ir_prog *p) {
    for (int ci = 0; ci < p->nnodes; ci++) {
        if (!add_only(&p->nodes[ci])) continue;
        for (int k = 0; k < p->nodes[ci].nin; k++) {
            int buf = p->nodes[ci].in[k].buf, oi = ir_node_writing(p, buf);
            if (oi < 0 || p->nodes[oi].kind != IR_OP || p->nodes[oi].ninstr || p->nodes[oi].paired) continue;
            fe_op op = p->nodes[oi].op;
            if (op != FE_OP_MUL_MAT && op != FE_OP_MUL_MAT_ID) continue;
            if (ir_absorb_ew(p, oi, ci, &buf, 1, NAME)) break;
        }
    }
}

kiln_status ir_fuse_add_chain(ir_prog *p) {
    fuse_chains(p);
    fuse_slices(p);
    fuse_into_matmul(p);
    return NULL;
}
