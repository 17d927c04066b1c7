/* Attaching an elementwise consumer to an op as its epilogue: the shared step of the fusion
 * passes that fold a consumer into the kernel producing its operand (rms_norm_mul,
 * mul_mat_glu, add_chain). The merged node computes exactly what the two did: the op's value
 * is rounded to the type the graph stored it in (op_type) before the epilogue reads it. */
#include "ir_internal.h"

#include <string.h>

static bool same_space(const int64_t a[4], const int64_t b[4]) {
    for (int d = 0; d < 4; d++)
        if (a[d] != b[d]) return false;
    return true;
}

/* The register c's operand k becomes in the merged node, or -1 when it is not an op value. */
static int value_register(const ir_node *o, const ir_ref *r, const int *vals, int nvals) {
    for (int v = 0; v < nvals; v++)
        if (r->buf == vals[v]) {
            if (o->ninstr == 0) return o->nin + v;
            return v == 0 ? o->nin + ir_op_values(o) + o->ninstr - 1 : -2;
        }
    return -1;
}

static bool epilogue_operand(const ir_node *o, int j) {
    if (o->paired && j == o->pair_in) return false;
    for (int s = 0; s < FE_MAX_SRC; s++)
        if (o->opd[s] == j) return false;
    return true;
}

static bool legal(const ir_prog *p, int oi, int ci, const int *vals, int nvals) {
    const ir_node *o = &p->nodes[oi], *c = &p->nodes[ci];
    if (o->dead || c->dead || o->kind != IR_OP || c->kind != IR_EW || ci <= oi || o->fused) return false;
    if (nvals < 1 || nvals > 2 || (nvals == 2) != o->paired || o->has_dst2) return false;
    if (o->dst.buf != vals[0] || !ir_ref_is_natural(p, &o->dst)) return false;
    if (!same_space(c->dst.ne, o->dst.ne)) return false;
    for (int v = 0; v < nvals; v++) {
        if (p->bufs[vals[v]].kind != IR_BUF_TEMP) return false;
        int reads = 0;
        for (int k = 0; k < c->nin; k++) {
            if (c->in[k].buf != vals[v]) continue;
            if (!ir_ref_is_natural(p, &c->in[k]) || !same_space(c->in[k].ne, o->dst.ne)) return false;
            reads++;
        }
        if (reads != 1 || ir_readers(p, vals[v]) != 1) return false;
    }
    for (int k = 0; k < c->nin; k++) {
        if (value_register(o, &c->in[k], vals, nvals) == -2) return false;
        if (value_register(o, &c->in[k], vals, nvals) >= 0) continue;
        ir_buf_kind kind = p->bufs[c->in[k].buf].kind;
        int         w = ir_node_writing(p, c->in[k].buf);
        bool        pre = ir_buf_preset(kind) || (kind == IR_BUF_STATE && w < 0);
        if (!pre && (w < 0 || w >= oi)) return false;
        if (c->in[k].buf == o->dst.buf || c->in[k].buf == c->dst.buf) return false;
    }
    return o->ninstr + c->ninstr <= IR_MAX_INSTR && o->nsrc + c->nsrc <= IR_MAX_INSTR;
}

bool ir_absorb_ew(ir_prog *p, int oi, int ci, const int *vals, int nvals, const char *fusion) {
    if (!legal(p, oi, ci, vals, nvals)) return false;
    ir_node *o = &p->nodes[oi], *c = &p->nodes[ci];
    ir_node  m = *o;
    int      map[IR_MAX_IN + IR_MAX_INSTR];
    for (int k = 0; k < c->nin; k++) {
        map[k] = -1;
        if (value_register(o, &c->in[k], vals, nvals) >= 0) continue;
        /* Only epilogue operands are read at the output coordinate: never reuse the op's own. */
        for (int j = 0; j < m.nin && map[k] < 0; j++)
            if (epilogue_operand(&m, j) && ir_ref_equal(&m.in[j], &c->in[k])) map[k] = j;
        if (map[k] < 0) {
            if (m.nin == IR_MAX_IN) return false;
            m.in[m.nin] = c->in[k];
            map[k] = m.nin++;
        }
    }
    /* Registers past the operands (op values, epilogue results) move up by the operands added. */
    int shift = m.nin - o->nin;
    for (int k = 0; k < c->nin; k++)
        if (map[k] < 0) map[k] = value_register(o, &c->in[k], vals, nvals) + shift;
    for (int j = 0; j < m.ninstr; j++) {
        if (m.ins[j].a >= o->nin) m.ins[j].a += shift;
        if (fe_ops[m.ins[j].op].nsrc > 1 && m.ins[j].b >= o->nin) m.ins[j].b += shift;
    }
    int first = m.nin + ir_op_values(&m) + m.ninstr;
    for (int j = 0; j < c->ninstr; j++) {
        ir_instr in = c->ins[j];
        in.a = in.a < c->nin ? map[in.a] : first + in.a - c->nin;
        if (fe_ops[in.op].nsrc > 1) in.b = in.b < c->nin ? map[in.b] : first + in.b - c->nin;
        m.ins[m.ninstr++] = in;
    }
    if (o->ninstr == 0) m.op_type = o->dst.type;
    m.dst = c->dst;
    for (int s = 0; s < c->nsrc; s++) m.src[m.nsrc++] = c->src[s];
    m.fusion = fusion;
    *o = m;
    c->dead = true;
    return true;
}
