/* Pass mul_mat_glu: the gate and up projections of a feed-forward block and their GLU in one
 * kernel.
 *
 * Pattern:  A: ta = mul_mat(wa, x)     B: tb = mul_mat(wb, x)     (or both mul_mat_id(w, x, ids))
 *           optionally  ta' = add(ta, bias_a)  and/or  tb' = add(tb, bias_b)
 *           (for mul_mat_id also add_id(ta, bias_a, ids): a per-expert bias, gpt-oss's)
 *           y = glu(ta('), tb('))   (swiglu, geglu, swiglu_oai, reglu, geglu_erf, geglu_quick;
 *                                    either operand order: the GLU's first operand is A's)
 * Legal when
 *   - A and B are plain IR_OP nodes of one op (no epilogue, pairing or fusion yet) with equal
 *     parameters, the same b (and for mul_mat_id the same ids) read through equal layouts, and
 *     weights of one type and shape (their strides may differ: the template reads each through
 *     its own layout);
 *   - ta and tb are temporaries written naturally and read by exactly one operand of one live
 *     node: the GLU, or the bias add, which in turn is the only reader of its own temporary;
 *   - the GLU is the two-tensor form (one instruction over two distinct operands, each reading
 *     its value naturally over the whole output space). The one-tensor form (halves of one
 *     tensor, `swapped`) is its own pattern, below;
 *   - a bias is an input or weight, or written by a node before the merged kernel's place, and
 *     its extents divide dst's (it broadcasts onto dst like any elementwise operand), or, of an
 *     add_id, it is [ne0, experts] and the add_id reads the mul_mat_id's own ids; B's weight is
 *     ready at A's place too.
 * Effect: A becomes paired (B's weight appended as in[pair_in]) and carries the GLU (and the
 * adds) as its epilogue, writing y; B, the adds and the GLU die. Values are rounded exactly as
 * the unfused graph stored them (op_type, each add's type), so results are bit-identical in
 * the CPU reference. An add_id's bias becomes an epilogue operand read through the ids (ir.h,
 * by_id).
 * Halves (phi3's fused gate_up weight): t = mul_mat(w, x) of 2n rows, y = glu(t) of its halves
 * (rows [0, n) and [n, 2n) of each column, either one the GLU's x). Legal when the mul_mat is
 * plain, its weight a whole weight read naturally (rows contiguous, 2n of them) and t a
 * temporary written naturally that only the GLU reads, through exactly those two halves, of at
 * most HALVES_COLS columns (decode and small batches: a prefill's one GEMM of 2n rows and the GLU
 * kernel beat two GEMMs into scratch and an epilogue step; H100 phi-3.5-mini prefill 512
 * 50.9k -> 48.5k tok/s fused, decode 3.208 -> 3.168 ms). Effect:
 * the node computes rows [0, n) of w and, paired, rows [n, 2n) (two views of the one weight),
 * with the GLU as its epilogue, writing y: the same pairing and rounding as above.
 * Requires: lowered IR (before ew_chain, so consumers are single-instruction nodes). Keeps: every
 * IR invariant (ir_verify). */
#include "ir_internal.h"

#include <stdlib.h>
#include <string.h>

static bool is_glu(fe_op op) {
    switch (op) {
    case FE_OP_SWIGLU:
    case FE_OP_GEGLU:
    case FE_OP_SWIGLU_OAI:
    case FE_OP_REGLU:
    case FE_OP_GEGLU_ERF:
    case FE_OP_GEGLU_QUICK: return true;
    default: return false;
    }
}

static bool same_ne(const int64_t a[4], const int64_t b[4]) {
    for (int d = 0; d < 4; d++)
        if (a[d] != b[d]) return false;
    return true;
}

/* One side of the GLU: the mul_mat node producing it and, when present, the bias add between. */
typedef struct {
    int mm;      /* node index of the mul_mat(_id) */
    int add;     /* node index of the add, or -1 */
    int bias;    /* the add's operand holding the bias (index into its in[]), when add >= 0 */
    int val;     /* the add's operand reading the mul_mat result */
    bool by_id;  /* the add is an add_id: its bias is read through the ids */
} side;

/* A temporary written naturally by a live node and read by exactly one operand of one live
 * node, `reader`, naturally: the node writing it, or -1. */
static int sole_producer(const ir_prog *p, const ir_ref *r, int reader) {
    if (p->bufs[r->buf].kind != IR_BUF_TEMP || !ir_ref_is_natural(p, r)) return -1;
    if (ir_readers(p, r->buf) != 1) return -1;
    int w = ir_node_writing(p, r->buf);
    if (w < 0 || w >= reader || !ir_ref_is_natural(p, &p->nodes[w].dst)) return -1;
    return w;
}

static bool plain_matmul(const ir_node *n) {
    return ir_plain_op(n) && (n->op == FE_OP_MUL_MAT || n->op == FE_OP_MUL_MAT_ID);
}

/* The side through add_id node w: t = mul_mat_id(...) read only by it as its a, with the same ids,
 * and a bias of t's rows. */
static bool add_id_side(const ir_prog *p, int w, side *s) {
    const ir_node *n = &p->nodes[w];
    const ir_ref  *t = ir_operand(n, 0), *bias = ir_operand(n, 1), *ids = ir_operand(n, 2);
    if (!ir_plain_op(n) || !t || !bias || !ids) return false;
    int m = sole_producer(p, t, w);
    if (m < 0 || !plain_matmul(&p->nodes[m]) || p->nodes[m].op != FE_OP_MUL_MAT_ID) return false;
    const ir_ref *mids = ir_operand(&p->nodes[m], 2);
    if (!mids || !ir_ref_equal(mids, ids) || !same_ne(t->ne, n->dst.ne) || bias->ne[0] != n->dst.ne[0] ||
        bias->ne[2] != 1 || bias->ne[3] != 1)
        return false;
    s->mm = m;
    s->add = w;
    s->val = n->opd[0];
    s->bias = n->opd[1];
    s->by_id = true;
    return true;
}

/* The side feeding GLU operand r of node gi: the mul_mat directly, or through a bias add. */
static bool find_side(const ir_prog *p, int gi, const ir_ref *r, side *s) {
    int w = sole_producer(p, r, gi);
    if (w < 0) return false;
    const ir_node *n = &p->nodes[w];
    s->add = -1;
    s->by_id = false;
    if (plain_matmul(n)) {
        s->mm = w;
        return true;
    }
    if (n->kind == IR_OP && n->op == FE_OP_ADD_ID) return add_id_side(p, w, s);
    if (n->kind != IR_EW || n->ninstr != 1 || n->ins[0].op != FE_OP_ADD || n->nin != 2) return false;
    if (n->ins[0].a == n->ins[0].b || n->fusion) return false;
    for (int v = 0; v < 2; v++) {
        int m = sole_producer(p, &n->in[v], w);
        if (m < 0 || !plain_matmul(&p->nodes[m]) || !same_ne(n->in[v].ne, n->dst.ne)) continue;
        s->mm = m;
        s->add = w;
        s->val = v;
        s->bias = 1 - v;
        return true;
    }
    return false;
}

/* Whether the two mul_mat nodes compute the same product but for the weight. */
static bool pairable(const ir_prog *p, const ir_node *a, const ir_node *b, int at) {
    if (a->op != b->op || memcmp(a->ip, b->ip, sizeof a->ip) != 0 || memcmp(a->fp, b->fp, sizeof a->fp) != 0)
        return false;
    if (a->dst.type != b->dst.type || !same_ne(a->dst.ne, b->dst.ne)) return false;
    const ir_ref *wa = ir_operand(a, 0), *wb = ir_operand(b, 0);
    if (!wa || !wb || wa->type != wb->type || !same_ne(wa->ne, wb->ne) || wa->buf == a->dst.buf) return false;
    for (int slot = 1; slot < FE_MAX_SRC; slot++) {
        const ir_ref *x = ir_operand(a, slot), *y = ir_operand(b, slot);
        if (!x != !y || (x && !ir_ref_equal(x, y))) return false;
    }
    return ir_buf_ready_at(p, wb->buf, at);
}

/* A bias operand: ready at the merged node's place and broadcasting onto dst (read through the
 * ids: checked by add_id_side). */
static bool bias_ok(const ir_prog *p, const ir_node *add, int k, const ir_ref *dst, int at, bool by_id) {
    const ir_ref *r = &add->in[k];
    for (int d = 0; d < 4 && !by_id; d++)
        if (dst->ne[d] % r->ne[d] != 0) return false;
    return ir_buf_ready_at(p, r->buf, at) && r->buf != dst->buf;
}

/* The graph nodes of the merged kernel: its own, B's and the adds', in graph order. */
static void add_sources(ir_node *m, const ir_node *const *more, int n) {
    for (int i = 0; i < n; i++)
        for (int s = 0; s < more[i]->nsrc && m->nsrc < IR_MAX_INSTR; s++) m->src[m->nsrc++] = more[i]->src[s];
    ir_sort_sources(m);
}

/* The bias form: A's epilogue built here (ir_absorb_ew takes op values straight into the GLU
 * only). Registers: A's operands, then the biases; nin, nin+1 the two products; then one add
 * per biased side (in the add's own operand order) and the GLU. */
static bool fuse_with_bias(ir_prog *p, int gi, const side *sx, const side *sg) {
    ir_node *g = &p->nodes[gi], *a = &p->nodes[sx->mm], *b = &p->nodes[sg->mm];
    int      nsrc = a->nsrc + b->nsrc + g->nsrc;
    const side *sides[2] = {sx, sg};
    for (int i = 0; i < 2; i++) {
        if (sides[i]->add < 0) continue;
        const ir_node *ad = &p->nodes[sides[i]->add];
        if (!bias_ok(p, ad, sides[i]->bias, &g->dst, sx->mm, sides[i]->by_id)) return false;
        nsrc += ad->nsrc;
    }
    if (nsrc > IR_MAX_INSTR || a->nin + 3 > IR_MAX_IN) return false;
    ir_node m = *a;
    m.in[m.pair_in = m.nin++] = *ir_operand(b, 0);
    m.paired = true;
    int breg[2] = {-1, -1};
    for (int i = 0; i < 2; i++)
        if (sides[i]->add >= 0) {
            m.in[m.nin] = p->nodes[sides[i]->add].in[sides[i]->bias];
            if (sides[i]->by_id) m.by_id |= 1u << m.nin;
            breg[i] = m.nin++;
        }
    int reg[2] = {m.nin, m.nin + 1}; /* each side's current register */
    m.ninstr = 0;
    for (int i = 0; i < 2; i++) {
        if (sides[i]->add < 0) continue;
        const ir_node *ad = &p->nodes[sides[i]->add];
        ir_instr       in = sides[i]->by_id ? (ir_instr){.op = FE_OP_ADD, .a = 0, .b = 1, .type = ad->dst.type} : ad->ins[0];
        if (sides[i]->by_id) { /* add_id(t, bias, ids): t + bias[.., id] */
            in.a = reg[i];
            in.b = breg[i];
        } else {
            in.a = ad->ins[0].a == sides[i]->val ? reg[i] : breg[i];
            in.b = ad->ins[0].b == sides[i]->val ? reg[i] : breg[i];
        }
        reg[i] = m.nin + 2 + m.ninstr;
        m.ins[m.ninstr++] = in;
    }
    ir_instr glu = g->ins[0];
    glu.a = reg[0]; /* side x is the GLU's operand a by construction */
    glu.b = reg[1];
    m.ins[m.ninstr++] = glu;
    m.op_type = a->dst.type;
    m.dst = g->dst;
    m.fusion = "mul_mat_glu";
    const ir_node *more[4] = {b, g};
    int            nmore = 2;
    for (int i = 0; i < 2; i++)
        if (sides[i]->add >= 0) more[nmore++] = &p->nodes[sides[i]->add];
    add_sources(&m, more, nmore);
    for (int i = 0; i < 2; i++)
        if (sides[i]->add >= 0) p->nodes[sides[i]->add].dead = true;
    b->dead = true;
    g->dead = true;
    *a = m;
    return true;
}

/* The plain form: through ir_absorb_ew, with A paired first (it insists) and B's value as vals[1]. */
static bool fuse_plain(ir_prog *p, int gi, int ai, int bi) {
    ir_node *a = &p->nodes[ai], *b = &p->nodes[bi];
    if (a->nin == IR_MAX_IN || a->nsrc + b->nsrc + p->nodes[gi].nsrc > IR_MAX_INSTR) return false;
    ir_node saved = *a;
    a->in[a->pair_in = a->nin++] = *ir_operand(b, 0);
    a->paired = true;
    /* B must be dead before the absorb: nothing writes its temporary any more, and its operands
     * (b, its weight) are no longer read from B's place. Its value's only reader is the GLU. */
    b->dead = true;
    int vals[2] = {a->dst.buf, b->dst.buf};
    if (!ir_absorb_ew(p, ai, gi, vals, 2, "mul_mat_glu")) {
        *a = saved;
        b->dead = false;
        return false;
    }
    const ir_node *more[1] = {b};
    add_sources(a, more, 1);
    return true;
}

#define HALVES_COLS 16

/* Rows [r0, r0 + n) of a natural 2-D weight ref w, as a view. */
static ir_ref weight_rows(const ir_ref *w, int64_t r0, int64_t n) {
    ir_ref v = *w;
    v.ne[1] = n;
    v.offs += r0 * w->st[1];
    return v;
}

/* The halves form (above): GLU node gi over the halves of one mul_mat's result. */
static bool try_halves(ir_prog *p, int gi) {
    ir_node      *g = &p->nodes[gi];
    const ir_ref *rx = &g->in[g->ins[0].a], *rg = &g->in[g->ins[0].b];
    if (rx->buf != rg->buf || p->bufs[rx->buf].kind != IR_BUF_TEMP || g->nin != 2 || ir_readers(p, rx->buf) != 2)
        return false; /* (its two operands are t's only reads) */
    int mi = ir_node_writing(p, rx->buf);
    if (mi < 0 || mi >= gi || !plain_matmul(&p->nodes[mi]) || p->nodes[mi].op != FE_OP_MUL_MAT) return false;
    ir_node      *m = &p->nodes[mi];
    const ir_ref *t = &m->dst, *w = ir_operand(m, 0);
    int64_t       n = t->ne[0] / 2;
    if (!w || !ir_ref_is_natural(p, t) || !ir_ref_is_natural(p, w) || w->ne[2] != 1 || w->ne[3] != 1 ||
        t->ne[0] % 2 != 0 || t->ne[1] > HALVES_COLS || t->ne[2] != 1 || t->ne[3] != 1 || m->nin >= IR_MAX_IN)
        return false;
    /* Each operand: the half of every column starting at row offs (0 or n), whole dst. */
    const ir_ref *half[2] = {rx, rg};
    int64_t       at[2];
    for (int h = 0; h < 2; h++) {
        const ir_ref *r = half[h];
        if (r->ne[0] != n || r->ne[1] != t->ne[1] || r->ne[2] != 1 || r->ne[3] != 1 || r->st[0] != 1 ||
            (r->ne[1] > 1 && r->st[1] != t->ne[0]) || (r->offs != 0 && r->offs != n) || !same_ne(r->ne, g->dst.ne))
            return false;
        at[h] = r->offs;
    }
    if (at[0] == at[1] || m->nsrc + g->nsrc > IR_MAX_INSTR) return false;
    ir_node f = *m;
    ir_ref  wx = weight_rows(w, at[0], n), wg = weight_rows(w, at[1], n);
    f.in[f.opd[0]] = wx;
    f.in[f.pair_in = f.nin++] = wg;
    f.paired = true;
    ir_instr glu = g->ins[0];
    glu.a = f.nin;     /* value 0: rows of x's half */
    glu.b = f.nin + 1; /* value 1: the paired rows */
    f.ins[0] = glu;
    f.ninstr = 1;
    f.op_type = t->type;
    f.dst = g->dst;
    f.fusion = "mul_mat_glu";
    const ir_node *more[1] = {g};
    add_sources(&f, more, 1);
    g->dead = true;
    *m = f;
    return true;
}

static bool try_glu(ir_prog *p, int gi) {
    const ir_node *g = &p->nodes[gi];
    if (g->kind != IR_EW || g->ninstr != 1 || !is_glu(g->ins[0].op) || g->nin != 2 || g->fusion) return false;
    if (g->ins[0].a == g->ins[0].b) return false;
    /* ins[0].a is the GLU's x (the activated operand): its producer becomes A. */
    const ir_ref *rx = &g->in[g->ins[0].a], *rg = &g->in[g->ins[0].b];
    if (rx->buf == rg->buf) return try_halves(p, gi);
    if (!same_ne(rx->ne, g->dst.ne) || !same_ne(rg->ne, g->dst.ne)) return false;
    side sx, sg;
    if (!find_side(p, gi, rx, &sx) || !find_side(p, gi, rg, &sg) || sx.mm == sg.mm) return false;
    const ir_node *a = &p->nodes[sx.mm], *b = &p->nodes[sg.mm];
    if (!pairable(p, a, b, sx.mm) || !same_ne(a->dst.ne, g->dst.ne)) return false;
    if (sx.add < 0 && sg.add < 0) return fuse_plain(p, gi, sx.mm, sg.mm);
    return fuse_with_bias(p, gi, &sx, &sg);
}

kiln_status ir_fuse_mul_mat_glu(ir_prog *p) {
    for (int i = 0; i < p->nnodes; i++)
        if (!p->nodes[i].dead) try_glu(p, i);
    return NULL;
}
