/* Pass topk_moe: MoE routing (llama.cpp's build_moe_ffn) in one kernel per token row.
 *
 * Pattern, matched from each argsort_top_k / top_k node (E experts, T token rows, k kept):
 *   probs = soft_max(logits) | sigmoid(logits)      f32 [E, T]   (gated)
 *         | logits                                                (delayed, see below)
 *   sel   = probs | add(probs, bias)                 f32 [E, T]   (the bias steers selection only)
 *   ids   = argsort_top_k(sel, k) | top_k(sel, k)    i32 [k, T]
 *   w     = get_rows(reshape(probs, [1, E, T]), ids) f32 [1, k, T]
 *   delayed only: w = soft_max(reshape(w, [k, T]))   (gpt-oss: top-k of raw logits)
 *   optional: s = sum_rows(reshape(w, [k, T])); optional s = clamp(s, lo, hi); w = div(w, s)
 *   optional: w = scale(w, s)                        (ggml_scale: no bias term)
 * The fused node is an argsort_top_k over the logits (slot 0; the bias an extra operand) with
 * fused = IR_FUSED_TOPK_MOE, dst = the last absorbed node's result and dst2 = ids; it takes the
 * top-k node's place, where its operands are ready and every reader of ids or w still follows.
 *
 * Legality: every absorbed intermediate (probs when gated, sel, w before its last step, the
 * sums) is an f32 temporary read exactly by the pattern's nodes (probs: by the selection and by
 * get_rows), read through a contiguous layout of the whole buffer (the reshapes); ids and the
 * final weights may be outputs and may have any readers (the mul_mat_id nodes read ids). The
 * softmax must be plain (soft_max_ext only with scale 1, no mask, no sinks). E <= 512, k <= 32,
 * logits and bias f32 of shape [E, T] (the bias may broadcast over either dim).
 * The tail is absorbed greedily: the post-processing steps (delayed softmax, norm, scale) are
 * taken in that order as long as each is legal; the first that is not ends the fused node,
 * whose result is then that step's input (e.g. w read by another node: the fusion stops at
 * get_rows and the norm stays unfused). A delayed pattern needs its softmax, else nothing fuses.
 * Requires: lowered IR, before ew_chain (consumers are single-instruction nodes). Keeps: every
 * IR invariant (ir_verify). */
#include "ir_internal.h"

#include <stdlib.h>
#include <string.h>

#define MOE_MAX_EXPERTS 512
#define MOE_MAX_K 32
#define MOE_MAX_NODES 8 /* nodes one match absorbs: gate, add, top-k, get_rows, softmax, sum, clamp, div, scale */

typedef struct {
    int     ti;     /* the top-k node */
    int64_t E, T, k;
    int     ids;    /* the ids buffer */
    ir_ref  logits; /* as the gate (or, delayed, the selection) reads it: [E, T] */
    ir_ref  bias;
    bool    has_bias;
    int     nodes[MOE_MAX_NODES + 1];
    int     nn;
    int     last;   /* the node whose result is the fused node's dst */
    ir_moe  moe;
} moe_match;

static bool shape_is(const int64_t ne[4], int64_t a, int64_t b, int64_t c) {
    return ne[0] == a && ne[1] == b && ne[2] == c && ne[3] == 1;
}

/* r is all of its buffer, contiguous in the order of r's own shape (a reshape of the buffer),
 * with extents ne. */
static bool whole_as(const ir_prog *p, const ir_ref *r, int64_t a, int64_t b, int64_t c) {
    const ir_buf *buf = &p->bufs[r->buf];
    if (!shape_is(r->ne, a, b, c) || r->offs != 0 || r->type != buf->type) return false;
    if (a * b * c != buf->ne[0] * buf->ne[1] * buf->ne[2] * buf->ne[3]) return false;
    int64_t st = 1;
    for (int d = 0; d < 4; d++) {
        if (r->ne[d] != 1 && r->st[d] != st) return false;
        st *= r->ne[d];
    }
    return true;
}

static bool temp_f32(const ir_prog *p, int buf) {
    return p->bufs[buf].kind == IR_BUF_TEMP && p->bufs[buf].type == KILN_F32;
}

/* An IR_OP node of op `op` with nothing fused into it. */
static bool plain_op(const ir_node *n, fe_op op) {
    return !n->dead && n->kind == IR_OP && n->op == op && n->ninstr == 0 && !n->paired && !n->fused && !n->has_dst2;
}

/* A single-instruction elementwise node of op `op`, result f32. */
static bool ew1(const ir_node *n, fe_op op) {
    return !n->dead && n->kind == IR_EW && n->ninstr == 1 && n->ins[0].op == op && n->ins[0].type == KILN_F32;
}

/* soft_max, or soft_max_ext computing the same (scale 1, no mask, no sinks), f32. */
static bool plain_softmax(const ir_node *n) {
    if (plain_op(n, FE_OP_SOFT_MAX)) return n->dst.type == KILN_F32;
    return plain_op(n, FE_OP_SOFT_MAX_EXT) && n->opd[1] < 0 && n->opd[2] < 0 && n->fp[0] == 1.0f &&
           n->dst.type == KILN_F32;
}

/* The live node (after `after`) with an operand reading buf, other than `skip`; -1 if none. */
static int reader_after(const ir_prog *p, int buf, int after, int skip) {
    int i = ir_reader_after(p, buf, after);
    return i >= 0 && i == skip ? ir_reader_after(p, buf, skip) : i;
}

/* Same elements: a and b ([E, T] both) read the same places of one buffer at each coordinate. */
static bool same_elems(const ir_ref *a, const ir_ref *b) { return ir_ref_equal(a, b); }

/* probs as get_rows reads it ([1, E, T]) seen as [E, T]. */
static ir_ref flat_probs(const ir_ref *g) {
    ir_ref r = *g;
    r.ne[0] = g->ne[1], r.ne[1] = g->ne[2], r.ne[2] = 1, r.ne[3] = 1;
    r.st[0] = g->st[1], r.st[1] = g->st[2], r.st[2] = g->st[3], r.st[3] = g->st[3];
    r.sym[0] = g->sym[1], r.sym[1] = g->sym[2], r.sym[2] = 0, r.sym[3] = 0;
    return r;
}

static bool logits_ok(const moe_match *m, const ir_ref *r) {
    return r->type == KILN_F32 && shape_is(r->ne, m->E, m->T, 1);
}

static void take(moe_match *m, int i) { m->nodes[m->nn++] = i; }

/* The top-k node and the get_rows reading its ids; fills E, T, k, ids. Returns get_rows or -1. */
static int match_topk(const ir_prog *p, moe_match *m) {
    const ir_node *t = &p->nodes[m->ti];
    if (!plain_op(t, FE_OP_ARGSORT_TOP_K) && !plain_op(t, FE_OP_TOP_K)) return -1;
    const ir_ref *sel = ir_operand(t, 0);
    if (!sel || sel->type != KILN_F32 || sel->ne[2] != 1 || sel->ne[3] != 1) return -1;
    m->E = sel->ne[0], m->T = sel->ne[1], m->k = t->dst.ne[0];
    if (m->E > MOE_MAX_EXPERTS || m->k > MOE_MAX_K || m->k < 1 || !shape_is(t->dst.ne, m->k, m->T, 1)) return -1;
    m->ids = t->dst.buf;
    if (!ir_ref_is_natural(p, &t->dst) || p->bufs[m->ids].type != KILN_I32) return -1;
    for (int gi = m->ti + 1; gi < p->nnodes; gi++) {
        const ir_node *g = &p->nodes[gi];
        if (!plain_op(g, FE_OP_GET_ROWS)) continue;
        const ir_ref *src = ir_operand(g, 0), *ids = ir_operand(g, 1);
        if (ids->buf != m->ids || !whole_as(p, ids, m->k, m->T, 1)) continue;
        if (!shape_is(src->ne, 1, m->E, m->T) || src->type != KILN_F32) continue;
        if (g->dst.type != KILN_F32 || !shape_is(g->dst.ne, 1, m->k, m->T)) continue;
        return gi;
    }
    return -1;
}

/* The gate writing probs (a temporary read by get_rows and the selection only), or -1. */
static int match_gate(const ir_prog *p, moe_match *m, const ir_ref *probs) {
    if (!temp_f32(p, probs->buf) || !whole_as(p, probs, m->E, m->T, 1) || ir_readers(p, probs->buf) != 2) return -1;
    int gi = ir_node_writing(p, probs->buf);
    if (gi < 0 || gi > m->ti) return -1;
    const ir_node *g = &p->nodes[gi];
    if (plain_softmax(g)) {
        m->moe.gating = IR_GATE_SOFTMAX;
        m->logits = *ir_operand(g, 0);
    } else if (ew1(g, FE_OP_SIGMOID) && g->nin == 1 && g->ins[0].a == 0) {
        m->moe.gating = IR_GATE_SIGMOID;
        m->logits = g->in[0];
    } else {
        return -1;
    }
    return logits_ok(m, &m->logits) ? gi : -1;
}

/* Selection: sel is probs itself, or add(probs, bias) read by the top-k node only. */
static bool match_selection(const ir_prog *p, moe_match *m, const ir_ref *probs) {
    const ir_ref *sel = ir_operand(&p->nodes[m->ti], 0);
    if (same_elems(sel, probs)) return true;
    if (!temp_f32(p, sel->buf) || !whole_as(p, sel, m->E, m->T, 1) || ir_readers(p, sel->buf) != 1) return false;
    int ai = ir_node_writing(p, sel->buf);
    if (ai < 0 || ai > m->ti) return false;
    const ir_node *a = &p->nodes[ai];
    if (!ew1(a, FE_OP_ADD) || a->nin != 2 || a->ins[0].a == a->ins[0].b) return false;
    int pi = same_elems(&a->in[a->ins[0].a], probs) ? a->ins[0].a : same_elems(&a->in[a->ins[0].b], probs) ? a->ins[0].b : -1;
    if (pi < 0) return false;
    const ir_ref *b = &a->in[1 - pi];
    if (b->type != KILN_F32 || (b->ne[0] != 1 && b->ne[0] != m->E) || (b->ne[1] != 1 && b->ne[1] != m->T) ||
        b->ne[2] != 1 || b->ne[3] != 1)
        return false;
    m->bias = *b;
    m->has_bias = true;
    take(m, ai);
    return true;
}

/* The first reader (after m->last) of w, the f32 temporary m->last writes, when w has exactly
 * `readers` readers (the tail ops each take w whole); -1 otherwise. */
static int next_reader(const ir_prog *p, const moe_match *m, int readers) {
    int w = p->nodes[m->last].dst.buf;
    if (!temp_f32(p, w) || ir_readers(p, w) != readers) return -1;
    return reader_after(p, w, m->last, -1);
}

/* The delayed softmax over w ([k, T]): the only reader of w. */
static bool match_delayed_softmax(const ir_prog *p, moe_match *m) {
    int si = next_reader(p, m, 1);
    if (si < 0 || !plain_softmax(&p->nodes[si])) return false;
    const ir_node *s = &p->nodes[si];
    if (!whole_as(p, ir_operand(s, 0), m->k, m->T, 1) || !shape_is(s->dst.ne, m->k, m->T, 1)) return false;
    take(m, si);
    m->last = si;
    return true;
}

/* Normalization: s = sum_rows(w), optionally clamped, w / s; w read by the sum and the div only. */
static bool match_norm(const ir_prog *p, moe_match *m) {
    int w = p->nodes[m->last].dst.buf, si = next_reader(p, m, 2);
    if (si < 0 || !plain_op(&p->nodes[si], FE_OP_SUM_ROWS)) return false;
    const ir_node *s = &p->nodes[si];
    if (!whole_as(p, ir_operand(s, 0), m->k, m->T, 1) || s->dst.type != KILN_F32 || !temp_f32(p, s->dst.buf) ||
        ir_readers(p, s->dst.buf) != 1)
        return false;
    int sum = s->dst.buf, ci = -1;
    int di = reader_after(p, sum, si, -1);
    if (di < 0) return false;
    if (ew1(&p->nodes[di], FE_OP_CLAMP)) {
        const ir_node *c = &p->nodes[di];
        if (c->nin != 1 || !whole_as(p, &c->in[0], 1, m->T, 1) || !shape_is(c->dst.ne, 1, m->T, 1) ||
            !temp_f32(p, c->dst.buf) || ir_readers(p, c->dst.buf) != 1)
            return false;
        ci = di;
        sum = c->dst.buf;
        di = reader_after(p, sum, ci, -1);
        if (di < 0) return false;
    }
    const ir_node *d = &p->nodes[di];
    if (!ew1(d, FE_OP_DIV) || d->nin != 2 || !shape_is(d->dst.ne, m->k, m->T, 1)) return false;
    const ir_ref *num = &d->in[d->ins[0].a], *den = &d->in[d->ins[0].b];
    if (num->buf != w || !whole_as(p, num, m->k, m->T, 1) || den->buf != sum || !whole_as(p, den, 1, m->T, 1))
        return false;
    if (reader_after(p, w, m->last, si) != di) return false; /* w's second reader is this div */
    m->moe.norm = true;
    take(m, si);
    if (ci >= 0) {
        m->moe.clamp = true;
        m->moe.clamp_lo = p->nodes[ci].ins[0].f[0];
        m->moe.clamp_hi = p->nodes[ci].ins[0].f[1];
        take(m, ci);
    }
    take(m, di);
    m->last = di;
    return true;
}

/* w = scale(w, s) (no bias term), the only reader of w. */
static bool match_scale(const ir_prog *p, moe_match *m) {
    int si = next_reader(p, m, 1);
    if (si < 0 || !ew1(&p->nodes[si], FE_OP_SCALE)) return false;
    const ir_node *s = &p->nodes[si];
    const ir_ref  *in = &s->in[0];
    bool flat = whole_as(p, in, m->k, m->T, 1), rows = whole_as(p, in, 1, m->k, m->T);
    if (s->nin != 1 || s->ins[0].f[1] != 0.0f || !(flat || rows)) return false;
    for (int d = 0; d < 4; d++)
        if (s->dst.ne[d] != in->ne[d]) return false;
    m->moe.scaled = true;
    m->moe.scale = s->ins[0].f[0];
    take(m, si);
    m->last = si;
    return true;
}

static bool match(const ir_prog *p, moe_match *m) {
    int gi = match_topk(p, m);
    if (gi < 0) return false;
    m->moe.bias_in = -1;
    take(m, m->ti);
    ir_ref probs = flat_probs(ir_operand(&p->nodes[gi], 0));
    int    gate = match_gate(p, m, &probs);
    if (gate >= 0) take(m, gate);
    else {
        m->moe.delayed = true;
        m->moe.gating = IR_GATE_SOFTMAX;
        m->logits = probs;
        if (!logits_ok(m, &m->logits)) return false;
    }
    if (!match_selection(p, m, &probs)) return false;
    take(m, gi);
    m->last = gi;
    if (m->moe.delayed && !match_delayed_softmax(p, m)) return false;
    match_norm(p, m);
    match_scale(p, m);
    m->moe.k = (int)m->k;
    return true;
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Replaces the top-k node by the fused node; the other matched nodes die. */
static bool rewrite(ir_prog *p, moe_match *m) {
    ir_node f = {0};
    f.kind = IR_OP;
    f.op = FE_OP_ARGSORT_TOP_K;
    f.ip[0] = (int32_t)m->k;
    for (int s = 0; s < FE_MAX_SRC; s++) f.opd[s] = -1;
    f.opd[0] = 0;
    f.in[f.nin++] = m->logits;
    f.moe = m->moe;
    if (m->has_bias) {
        f.moe.bias_in = f.nin;
        f.in[f.nin++] = m->bias;
    }
    f.dst = p->nodes[m->last].dst;
    f.has_dst2 = true;
    f.dst2 = ir_natural_ref(p, m->ids);
    f.op_type = KILN_F32;
    f.fused = IR_FUSED_TOPK_MOE;
    f.fusion = "topk_moe";
    qsort(m->nodes, (size_t)m->nn, sizeof m->nodes[0], cmp_int);
    for (int i = 0; i < m->nn; i++) {
        const ir_node *n = &p->nodes[m->nodes[i]];
        if (f.nsrc + n->nsrc > IR_MAX_INSTR) return false;
        memcpy(f.src + f.nsrc, n->src, (size_t)n->nsrc * sizeof n->src[0]);
        f.nsrc += n->nsrc;
    }
    if (!ir_operands_ready(p, &f, m->ti)) return false;
    for (int i = 0; i < m->nn; i++) p->nodes[m->nodes[i]].dead = true;
    p->nodes[m->ti] = f;
    return true;
}

kiln_status ir_fuse_topk_moe(ir_prog *p) {
    for (int i = 0; i < p->nnodes; i++) {
        moe_match m = {.ti = i};
        if (match(p, &m)) rewrite(p, &m);
    }
    return NULL;
}
