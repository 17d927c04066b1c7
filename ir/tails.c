/* What may follow a one-token q/k/v product as a "tail": a rope of whole heads, a rope into a
 * cache row, a row written into a cache. Passes gemv_rope (the GEMV's store computes them) and
 * head_rope (one kernel computes several of them, norms of heads included) share these rules,
 * so the two agree on what a tail is and templates/gemv_rope.lua and templates/heads.lua can
 * assume the same shapes. */
#include "ir_internal.h"

#include <stdlib.h>
#include <string.h>

bool ir_tail_one_preset(const ir_prog *p, const ir_ref *r) {
    return r && ir_ref_static(r) && ir_buf_preset(p->bufs[r->buf].kind) && r->ne[0] * r->ne[1] * r->ne[2] * r->ne[3] == 1;
}

bool ir_tail_rows(const ir_ref *v, int64_t *lo, int64_t *hi) {
    if (v->type != KILN_F32 || !ir_ref_static(v) || v->st[0] != 1 || v->ne[2] != 1 || v->ne[3] != 1) return false;
    if (v->ne[1] > 1 && v->st[1] != v->ne[0]) return false;
    *lo = v->offs;
    *hi = v->offs + v->ne[0] * v->ne[1];
    return *lo % 2 == 0 && *hi % 2 == 0;
}

/* A mode 0 or neox rope of every element, with static one-token positions and natural frequency
 * factors (or none). */
static bool normal_rope(const ir_prog *p, const ir_node *r) {
    const ir_ref *a = ir_operand(r, 0), *pos = ir_operand(r, 1), *ff = ir_operand(r, 2);
    if (r->op != FE_OP_ROPE_EXT || (r->ip[1] != 0 && r->ip[1] != 2) || !a || r->ip[0] != a->ne[0] || a->ne[0] % 2 != 0)
        return false;
    if (!ir_tail_one_preset(p, pos) || pos->type != KILN_I32) return false;
    return !ff || (ir_ref_static(ff) && ir_buf_preset(p->bufs[ff->buf].kind) && ff->type == KILN_F32);
}

/* A state written in place at one row of ids: dst is in[a_in] itself, a state. */
static bool in_place_row(const ir_prog *p, const ir_node *n, int a_in, const ir_ref *ids) {
    return a_in >= 0 && p->bufs[n->dst.buf].kind == IR_BUF_STATE && ir_ref_equal(&n->in[a_in], &n->dst) &&
           ir_ref_static(&n->dst) && ir_tail_one_preset(p, ids) && (ids->type == KILN_I64 || ids->type == KILN_I32);
}

int ir_tail_operand(const ir_prog *p, const ir_node *c) {
    if (c->dead || c->kind != IR_OP || c->ninstr > 0 || c->paired || c->bnorm || c->has_dst2 || c->host) return -1;
    if (c->op == FE_OP_ROPE_EXT && (c->fused == IR_FUSED_NONE || c->fused == IR_FUSED_ROPE_SET_ROWS)) {
        if (!normal_rope(p, c)) return -1;
        int zin = c->opd[0];
        if (c->fused == IR_FUSED_NONE) return c->dst.type == KILN_F32 && ir_ref_static(&c->dst) ? zin : -1;
        const ir_scatter *s = &c->scatter;
        const ir_ref     *a = &c->in[zin];
        if (!in_place_row(p, c, s->a_in, &c->in[s->ids_in]) || c->op_type != KILN_F32 ||
            s->b_ne[0] != a->ne[0] * a->ne[1] || s->b_ne[0] != c->dst.ne[0] || c->dst.st[0] != 1)
            return -1;
        return zin;
    }
    if (c->op == FE_OP_SET_ROWS && c->fused == IR_FUSED_NONE) {
        const ir_ref *b = ir_operand(c, 1);
        if (!b || !in_place_row(p, c, c->opd[0], ir_operand(c, 2)) || b->ne[1] != 1 || b->ne[0] != c->dst.ne[0] ||
            c->dst.st[0] != 1)
            return -1;
        return c->opd[1];
    }
    return -1;
}

bool ir_touches(const ir_node *n, int b) {
    if (n->dst.buf == b || (n->has_dst2 && n->dst2.buf == b)) return true;
    for (int k = 0; k < n->nin; k++)
        if (n->in[k].buf == b) return true;
    return false;
}

bool ir_commutes(const ir_node *x, const ir_node *t) {
    if (ir_touches(x, t->dst.buf)) return false;
    for (int k = 0; k < t->nin; k++)
        if (t->in[k].buf == x->dst.buf || (x->has_dst2 && t->in[k].buf == x->dst2.buf)) return false;
    return true;
}

kiln_status ir_gather(ir_prog *p, int lo, int hi, const int *first, int nfirst) {
    int      n = hi - lo + 1, k = 0;
    ir_node *seg = malloc(sizeof *seg * (size_t)n);
    if (!seg) return kb_oom();
    for (int t = 0; t < nfirst; t++) seg[k++] = p->nodes[first[t]];
    for (int pass = 0; pass < 2; pass++)
        for (int i = lo, t = 0; i <= hi; i++) {
            if (t < nfirst && first[t] == i) {
                t++;
                continue;
            }
            if (p->nodes[i].dead == (pass == 1)) seg[k++] = p->nodes[i];
        }
    memcpy(&p->nodes[lo], seg, sizeof *seg * (size_t)n);
    free(seg);
    return NULL;
}
