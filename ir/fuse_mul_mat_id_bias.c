/* Pass mul_mat_id_bias: a per-expert bias added to mul_mat_id's result (gpt-oss's experts:
 * ggml's add_id) in the mul_mat_id kernel's store.
 *
 * Pattern:  t = mul_mat_id(as, b, ids)     y = add_id(t, bias, ids)   (the same ids)
 * Legal when
 *   - the mul_mat_id is a plain IR_OP node (no epilogue, pairing or fusion yet) writing t
 *     naturally, a temporary whose only reader is the add_id's operand a, read naturally;
 *   - the add_id is a plain node whose ids are read exactly as the mul_mat_id reads its own, and
 *     whose bias has t's rows ([ne0, experts]), ready at the mul_mat_id's place
 *     (ir_buf_ready_at);
 *   - the mul_mat_id has an operand register to spare.
 * Effect: the mul_mat_id gets the bias as an operand read through its ids (ir.h, by_id) and the
 * epilogue `add(op, bias)` (rounded to y's type), writes y; the add_id dies. Values are the
 * unfused ones: the same sum in f32 rounded alike. (Where the add_id would refuse an id out of
 * range, the fused node adds 0 to the zero row mul_mat_id gives it: the GPU has no way to fail.)
 * Pass mul_mat_glu, before this one, takes the gate and up projections' biases itself; this one
 * serves the rest (the down projection).
 * Requires: lowered IR, after mul_mat_glu and before add_chain. Keeps: every IR invariant. */
#include "ir_internal.h"

#include <string.h>

/* Fuses the add_id reading mul_mat_id node mi's result, when the pattern holds. */
static void fuse_one(ir_prog *p, int mi) {
    ir_node *m = &p->nodes[mi];
    if (!ir_plain_op(m) || m->op != FE_OP_MUL_MAT_ID || m->nin >= IR_MAX_IN) return;
    if (p->bufs[m->dst.buf].kind != IR_BUF_TEMP || !ir_ref_is_natural(p, &m->dst)) return;
    int ai = ir_readers(p, m->dst.buf) == 1 ? ir_reader_after(p, m->dst.buf, mi) : -1; /* its only reader */
    if (ai <= mi) return;
    ir_node      *a = &p->nodes[ai];
    const ir_ref *t = ir_operand(a, 0), *bias = ir_operand(a, 1), *ids = ir_operand(a, 2);
    if (!ir_plain_op(a) || a->op != FE_OP_ADD_ID || !t || !bias || !ids || t->buf != m->dst.buf ||
        !ir_ref_equal(t, &m->dst) || !ir_operand(m, 2) || !ir_ref_equal(ids, ir_operand(m, 2)))
        return;
    if (bias->ne[0] != m->dst.ne[0] || bias->ne[2] != 1 || bias->ne[3] != 1 || !ir_buf_ready_at(p, bias->buf, mi)) return;
    for (int d = 0; d < 4; d++)
        if (a->dst.ne[d] != m->dst.ne[d] || a->dst.sym[d] != m->dst.sym[d]) return;
    if (m->nsrc + a->nsrc > IR_MAX_INSTR) return;
    int k = m->nin;
    m->in[m->nin++] = *bias;
    m->by_id |= 1u << k;
    m->op_type = m->dst.type;
    m->ins[0] = (ir_instr){.op = FE_OP_ADD, .a = m->nin, .b = k, .type = a->dst.type};
    m->ninstr = 1;
    m->dst = a->dst;
    m->fusion = "mul_mat_id_bias";
    for (int s = 0; s < a->nsrc; s++) m->src[m->nsrc++] = a->src[s];
    ir_sort_sources(m);
    a->dead = true;
}

kiln_status ir_fuse_mul_mat_id_bias(ir_prog *p) {
    for (int i = 0; i < p->nnodes; i++)
        if (!p->nodes[i].dead) fuse_one(p, i);
    return NULL;
}
