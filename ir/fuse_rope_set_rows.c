/* Pass rope_set_rows: the rotated K of a token written straight into the KV cache.
 *
 * Pattern:  r = rope_ext(x, pos[, freq_factors])     (IR_OP, r a temporary)
 *           y = set_rows(a, view(r), ids)             (IR_OP; the view is folded into b's layout)
 * Legal when
 *   - r is a temporary written naturally by the rope and read by exactly one operand of one live
 *     node: the set_rows' `b`, so nothing else needs r materialized;
 *   - b reads r whole, contiguous from offset 0, as rows of whole tokens: b.ne = [r.ne0 * r.ne1,
 *     r.ne2, 1, 1] with r.ne3 = 1 (llama.cpp's reshape of [head_dim, n_head_kv, n_tokens] to
 *     [n_embd_k_gqa, n_tokens]). Rows made of single heads, permuted or strided views, and 4-D
 *     ropes are left unfused (the kernel writes one token's heads into one cache row);
 *   - b's type is r's (set_rows takes f32 rows, so the rope is f32), neither node carries an
 *     epilogue or another fusion, and the merged node has at most IR_MAX_IN operands.
 * Effect: the set_rows node becomes the rope node (op, parameters, slots) plus two operands,
 * set_rows' `a` and `ids` (scatter.a_in, scatter.ids_in), with fused = IR_FUSED_ROPE_SET_ROWS,
 * op_type = r's type, scatter.b_ne = b's shape, dst = set_rows' dst, src = the rope's then the
 * set_rows' graph node; the rope node dies. The merged node sits at the set_rows position: its
 * set_rows operands are ready there, and the rope's were ready earlier (every buffer has one
 * writer, so nothing between the two positions changes them). Its reference (ir/eval.c) is the
 * two unfused computations, so results are bit for bit the same.
 * Requires: lowered IR. Keeps: every IR invariant (ir_verify). Runs before memplan. */
#include "ir_internal.h"

/* b reads r (the rope's natural result) as rows of whole tokens: see the legality above. */
static bool token_rows(const ir_ref *b, const ir_ref *r) {
    if (r->ne[3] != 1 || b->offs != 0 || b->type != r->type) return false;
    if (b->ne[0] != r->ne[0] * r->ne[1] || b->ne[1] != r->ne[2] || b->ne[2] != 1 || b->ne[3] != 1) return false;
    return b->st[0] == 1 && (b->ne[1] == 1 || b->st[1] == b->ne[0]);
}

static bool plain_op(const ir_node *n, fe_op op) {
    return !n->dead && n->kind == IR_OP && n->op == op && n->ninstr == 0 && !n->paired && !n->fused && !n->has_dst2;
}

/* Fuses rope node ri into the set_rows node reading its result, if legal. */
static bool try_fuse(ir_prog *p, int ri) {
    const ir_node *r = &p->nodes[ri];
    int            buf = r->dst.buf;
    if (p->bufs[buf].kind != IR_BUF_TEMP || !ir_ref_is_natural(p, &r->dst) || ir_readers(p, buf) != 1) return false;
    int si = ir_reader_after(p, buf, ri);
    if (si < 0 || !plain_op(&p->nodes[si], FE_OP_SET_ROWS)) return false;
    const ir_node *s = &p->nodes[si];
    const ir_ref  *a = ir_operand(s, 0), *b = ir_operand(s, 1), *ids = ir_operand(s, 2);
    if (!a || !b || !ids || b->buf != buf || !token_rows(b, &r->dst)) return false;
    if (r->nin + 2 > IR_MAX_IN || r->nsrc + s->nsrc > IR_MAX_INSTR) return false;

    ir_node m = *r;
    m.scatter.a_in = m.nin;
    m.in[m.nin++] = *a;
    m.scatter.ids_in = m.nin;
    m.in[m.nin++] = *ids;
    for (int d = 0; d < 4; d++) m.scatter.b_ne[d] = b->ne[d];
    m.fused = IR_FUSED_ROPE_SET_ROWS;
    m.op_type = r->dst.type;
    m.dst = s->dst;
    for (int k = 0; k < s->nsrc; k++) m.src[m.nsrc++] = s->src[k];
    m.fusion = "rope_set_rows";
    if (!ir_operands_ready(p, &m, si)) return false; /* cannot happen (see above); kept as a guard */
    p->nodes[si] = m;
    p->nodes[ri].dead = true;
    return true;
}

kiln_status ir_fuse_rope_set_rows(ir_prog *p) {
    for (int i = 0; i < p->nnodes; i++)
        if (plain_op(&p->nodes[i], FE_OP_ROPE_EXT)) try_fuse(p, i);
    return NULL;
}
