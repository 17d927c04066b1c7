/* Pass get_rows_one: a get_rows that picks one row of a one-row source is that row, read in
 * place.
 *
 * Pattern:  r = get_rows(a, ids)   a: f32, one row [K, 1, 1, 1], its elements contiguous;
 *                                  ids: one id; r a temporary [K, 1, 1, 1] read by one node c
 * llama.cpp's graphs pick the output tokens of the last layer with get_rows(cur, inp_out_ids)
 * and get_rows(inpSA, inp_out_ids). At decode (one token) both select row 0 of a one-row
 * tensor: two kernels, and a third because the residual add then cannot join the o-proj GEMV
 * as it does in every other layer (pass add_chain).
 * Legal when, besides the shapes above, no symbolic dim is involved, r is written naturally and
 * read by exactly one live node, and a's buffer (not a state) holds the same value at c as at
 * the get_rows (every buffer but a state has one writer).
 * Effect: c reads a where it read r (same strides; offsets shifted by a's, which is exact since
 * r's K elements are a's K contiguous ones), c takes the get_rows' graph node, the get_rows dies.
 * Semantics: with one source row the only id in range is 0, and for it the values are the same
 * bits. An id out of range, which ggml asserts against and kiln's CPU reference (which runs
 * unfused) reports as an error, no longer gives the GPU kernel's row of zeros: the row is read
 * regardless. --no-fuse=get_rows_one keeps the kernel.
 * Requires: lowered IR; runs first, so that the fusions after it see c reading a directly.
 * Keeps: every IR invariant. */
#include "ir_internal.h"

static bool one_row(const ir_ref *r) { return r->ne[1] == 1 && r->ne[2] == 1 && r->ne[3] == 1 && ir_ref_static(r); }

static bool fold(ir_prog *p, int gi) {
    ir_node *g = &p->nodes[gi];
    if (g->dead || g->kind != IR_OP || g->op != FE_OP_GET_ROWS || g->ninstr || g->paired || g->fused || g->has_dst2)
        return false;
    const ir_ref *a = ir_operand(g, 0), *ids = ir_operand(g, 1);
    const ir_ref *r = &g->dst;
    if (!a || !ids || a->type != KILN_F32 || r->type != KILN_F32 || !one_row(a) || !one_row(ids) || ids->ne[0] != 1 ||
        !one_row(r) || r->ne[0] != a->ne[0] || (a->ne[0] > 1 && a->st[0] != 1))
        return false;
    if (p->bufs[r->buf].kind != IR_BUF_TEMP || !ir_ref_is_natural(p, r)) return false;
    if (p->bufs[a->buf].kind == IR_BUF_STATE) return false;
    int ci = ir_reader_after(p, r->buf, gi);
    if (ci < 0 || ir_reader_after(p, r->buf, ci) >= 0) return false;
    int w = ir_node_writing(p, a->buf);
    if (w >= gi && w < ci) return false;
    ir_node *c = &p->nodes[ci];
    if (c->nsrc + g->nsrc > IR_MAX_INSTR) return false;
    for (int k = 0; k < c->nin; k++) {
        if (c->in[k].buf != r->buf) continue;
        c->in[k].buf = a->buf;
        c->in[k].offs += a->offs;
    }
    for (int s = 0; s < g->nsrc; s++) c->src[c->nsrc++] = g->src[s];
    ir_sort_sources(c);
    g->dead = true;
    return true;
}

kiln_status ir_fuse_get_rows_one(ir_prog *p) {
    for (int i = 0; i < p->nnodes; i++) fold(p, i);
    return NULL;
}
