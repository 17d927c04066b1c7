/* Pass rms_norm_gemv: the rms_norm_mul that feeds a decode GEMV is computed by the GEMV.
 *
 * Pattern:  y = rms_norm_mul(x, w)   (the rms_norm_mul pass's node: rms_norm, epilogue "* w")
 *           z = mul_mat(a, y)        (one column: the GEMV plan; plain, paired, concatenated,
 *                                     with or without an epilogue)
 * Legal when y is a temporary of one f32 column [K], written naturally and read only by the b
 * slots of such GEMVs (up to MAX_READERS, each then computing the norm: the two of a layer whose
 * v weight has another type than q and k), naturally; x is an f32 [K] column, unchanged between the two nodes (a state it reads is
 * not written in between); w is an f32 [K] weight or input read naturally; K is static.
 * Effect: z reads x as b and w as an extra operand (bnorm, ir.h); the norm node dies. The GEMV
 * streams all of b in every team anyway (a quantized weight's GEMV quantizes b once per block),
 * so it sums b² beside the dot products (in that quantization) and scales the results:
 * z_i = s * sum_k a_ik (x_k w_k), s = 1/sqrt(mean(x²) + eps) — one launch and one
 * round trip of y fewer per norm (two per Llama layer). The values equal the unfused ones up
 * to f32 rounding order (y is f32 in the graph: no rounding to a narrower type is skipped); the
 * CPU reference evaluates the norm and the product separately, as the unfused graph does.
 * Requires: after rms_norm_mul, mul_mat_glu, add_chain and mul_mat_cat (z is in its final form).
 * Keeps: every IR invariant. */
#include "ir_internal.h"

#include <string.h>

/* A column [K] of f32, with no symbolic dim. */
static bool f32_column(const ir_ref *r, int64_t k) {
    return r->type == KILN_F32 && r->ne[0] == k && r->ne[1] == 1 && r->ne[2] == 1 && r->ne[3] == 1 &&
           ir_ref_static(r);
}

/* The operand of n's "* w" epilogue that is the weight, or -1. */
static int norm_weight(const ir_node *n) {
    if (n->ninstr != 1 || n->ins[0].op != FE_OP_MUL || n->ins[0].type != KILN_F32) return -1;
    int a = n->ins[0].a, b = n->ins[0].b, w = a == n->nin ? b : b == n->nin ? a : -1;
    return w >= 0 && w < n->nin ? w : -1;
}

/* Whether buffer `buf` holds the same value at node `to` as at node `from`. */
static bool unchanged(const ir_prog *p, int buf, int from, int to) {
    int w = ir_node_writing(p, buf);
    return w < 0 || w < from || w >= to;
}

/* The merged node's fusion name: this pass's, joined to the one the GEMV had (ir_node.fusion
 * holds static strings). */
static const char *joined_name(const char *had) {
    static const char *const names[][2] = {{"mul_mat_cat", "rms_norm_gemv+mul_mat_cat"},
                                           {"add_chain+mul_mat_cat", "rms_norm_gemv+add_chain+mul_mat_cat"},
                                           {"mul_mat_glu", "rms_norm_gemv+mul_mat_glu"},
                                           {"add_chain", "rms_norm_gemv+add_chain"}};
    for (size_t i = 0; had && i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(had, names[i][0])) return names[i][1];
    return "rms_norm_gemv";
}

/* How many of n's operands read buffer b. */
static int reads(const ir_node *n, int b) {
    int c = 0;
    for (int k = 0; k < n->nin; k++) c += n->in[k].buf == b;
    return c;
}

/* GEMV m may take norm node r (reading y = r's result, of K rows, through its b slot). */
static bool takes_norm(const ir_prog *p, const ir_node *r, const ir_node *m, int ri, int mi, int64_t k) {
    const ir_ref *b = ir_operand(m, 1), *a = ir_operand(m, 0), *x = ir_operand(r, 0);
    return m->kind == IR_OP && m->op == FE_OP_MUL_MAT && b && b->buf == r->dst.buf && reads(m, b->buf) == 1 && !m->bnorm &&
           ir_ref_is_natural(p, b) && a && a->ne[0] == k && !a->sym[0] && m->nin + 1 <= IR_MAX_IN &&
           m->nsrc + r->nsrc <= IR_MAX_INSTR && unchanged(p, x->buf, ri, mi);
}

/* Makes GEMV m compute norm node r's result from x itself (bnorm); `first`: it also lists r's
 * graph nodes. */
static void give_norm(ir_node *m, const ir_node *r, int wi, bool first) {
    m->in[m->opd[1]] = *ir_operand(r, 0);
    /* The new operand takes register nin; the epilogue's registers from nin on (the op's
     * values, then its instructions' results) move up by one. */
    for (int j = 0; j < m->ninstr; j++) {
        m->ins[j].a += m->ins[j].a >= m->nin;
        if (fe_ops[m->ins[j].op].nsrc > 1) m->ins[j].b += m->ins[j].b >= m->nin;
    }
    m->bnorm_w = m->nin;
    m->in[m->nin++] = r->in[wi];
    m->bnorm = true;
    m->bnorm_eps = r->fp[0];
    for (int s = 0; first && s < r->nsrc; s++) m->src[m->nsrc++] = r->src[s];
    ir_sort_sources(m);
    m->fusion = joined_name(m->fusion);
}

#define MAX_READERS 4

/* Every reader of y must be a GEMV that can take the norm: then each computes it (a layer whose
 * v weight has another type than q and k has two: mul_mat_cat left v apart). */
static bool fuse_one(ir_prog *p, int ri) {
    ir_node *r = &p->nodes[ri];
    if (r->kind != IR_OP || r->dead || r->op != FE_OP_RMS_NORM || !r->fusion || strcmp(r->fusion, "rms_norm_mul") != 0 ||
        r->paired || r->fused || r->has_dst2 || r->op_type != KILN_F32)
        return false;
    int64_t       k = r->dst.ne[0];
    int           wi = norm_weight(r), readers = ir_readers(p, r->dst.buf), gemv[MAX_READERS], n = 0;
    const ir_ref *x = ir_operand(r, 0);
    if (wi < 0 || !x || !f32_column(x, k) || !f32_column(&r->dst, k) || !f32_column(&r->in[wi], k)) return false;
    if (p->bufs[r->dst.buf].kind != IR_BUF_TEMP || !ir_ref_is_natural(p, &r->dst) || readers < 1 ||
        readers > MAX_READERS)
        return false;
    if (!ir_ref_is_natural(p, &r->in[wi]) || !ir_buf_preset(p->bufs[r->in[wi].buf].kind)) return false;
    for (int mi = ri + 1; mi < p->nnodes && n < readers; mi++) {
        const ir_node *m = &p->nodes[mi];
        if (m->dead || !reads(m, r->dst.buf)) continue;
        if (!takes_norm(p, r, m, ri, mi, k)) return false;
        gemv[n++] = mi;
    }
    if (n != readers) return false;
    for (int i = 0; i < n; i++) give_norm(&p->nodes[gemv[i]], r, wi, i == 0);
    r->dead = true;
    return true;
}

kiln_status ir_fuse_rms_norm_gemv(ir_prog *p) {
    for (int i = 0; i < p->nnodes; i++) fuse_one(p, i);
    return NULL;
}
