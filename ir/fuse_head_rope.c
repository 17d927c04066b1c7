/* Pass head_rope: at decode, the small per-head kernels after a q/k/v product that no GEMV store
 * could take (pass gemv_rope) run as one kernel: Qwen3's and Gemma 3's norms of q and k heads,
 * the ropes after them, the k and v cache rows. Those are 5 launches of a few microseconds a
 * layer, each moving a few KB: a decode step of Qwen3-30B-A3B spent about a quarter of its
 * launches there.
 *
 * Pattern: a run of consecutive live nodes ("members"), each one of
 *   norm      rms_norm (+ the epilogue rms_norm_mul gave it: the head weight) of rows of one
 *             token read from an f32 temporary ([ne0, heads, 1, 1], contiguous rows), into an
 *             f32 temporary that exactly one member of the run, a rope, reads whole;
 *   a tail    a rope of whole heads, a rope into a cache row or a cache row (ir/tails.c), of
 *             rows of an f32 temporary or of a norm of the run;
 *   post      an elementwise node reading the whole f32 result of a plain rope of the run, which
 *             nothing else reads, its other operands inputs or weights (Gemma 3's scale of q).
 * Legal when
 *   - the run has 2 to MAX_MEMBERS members, heads of at most MAX_NE0 elements;
 *   - the rows the members read are written before the run (or are a norm's, read by its rope);
 *     no member writes what another reads, and no two write the same buffer;
 *   - everything else a member reads (positions, ids, frequency factors, the norm's weight) is
 *     an input or weight, or its own state in place; nothing is symbolic.
 * Effect: every member after the first gets host = the first's index + 1 (ir.h). The IR still
 * says what each node computes and the CPU reference evaluates each as before; code generation
 * gives the first member's kernel the others as k.tail and the template heads.lua computes them
 * all, a warp per head (a norm's result never stored: only its rope reads it; nor a rope's that
 * a post reads). Memory
 * planning treats the run as one step (ir/memplan.c).
 * Requires: after gemv_rope (where a GEMV's store can take the tails, that saves more). */
#include "ir_internal.h"

#define MAX_MEMBERS 8
#define MAX_WAIT    4 /* other nodes between members that may move after them */
#define MAX_NE0     1024 /* a warp holds a head in registers: 32 elements a lane */

/* The epilogue's own operands (the norm's weight) are inputs or weights, static. */
static bool preset_epilogue(const ir_prog *p, const ir_node *c) {
    for (int k = 0; k < c->nin; k++)
        if (!ir_in_slot(c, k) && (!ir_ref_static(&c->in[k]) || !ir_buf_preset(p->bufs[c->in[k].buf].kind)))
            return false;
    return true;
}

/* Node c as a norm member: rms_norm of heads of one token of an f32 temporary, into an f32
 * temporary of the same shape, an elementwise epilogue of preset operands at most. */
static bool norm_member(const ir_prog *p, const ir_node *c) {
    const ir_ref *a = ir_operand(c, 0);
    int64_t       lo, hi;
    if (c->dead || c->kind != IR_OP || c->op != FE_OP_RMS_NORM || c->fused != IR_FUSED_NONE || c->paired ||
        c->bnorm || c->has_dst2 || c->host || !a || !ir_tail_rows(a, &lo, &hi))
        return false;
    const ir_ref *d = &c->dst;
    return p->bufs[a->buf].kind == IR_BUF_TEMP && p->bufs[d->buf].kind == IR_BUF_TEMP && d->type == KILN_F32 &&
           ir_ref_is_natural(p, d) && ir_ref_static(d) && d->ne[0] == a->ne[0] && d->ne[1] == a->ne[1] &&
           d->ne[2] == 1 && d->ne[3] == 1 && a->ne[0] % 2 == 0 && a->ne[0] <= MAX_NE0 && preset_epilogue(p, c);
}

/* Node c as an elementwise node after a rope (Gemma 3's scale of q): the operand through which
 * it reads the whole f32 result of a plain rope, in heads of one token, every other operand an
 * input or weight; its result of the same shape, natural. -1 when c is none. */
static int post_operand(const ir_prog *p, const ir_node *c) {
    if (c->dead || c->kind != IR_EW || c->host || c->ninstr < 1 || !ir_ref_static(&c->dst) ||
        !ir_ref_is_natural(p, &c->dst) || p->bufs[c->dst.buf].kind == IR_BUF_STATE)
        return -1;
    int k = -1;
    for (int q = 0; q < c->nin; q++) {
        const ir_ref *r = &c->in[q];
        int           w = ir_node_writing(p, r->buf);
        const ir_node *o = w >= 0 ? &p->nodes[w] : NULL;
        int64_t        lo, hi;
        if (o && o->kind == IR_OP && o->op == FE_OP_ROPE_EXT && o->fused == IR_FUSED_NONE && ir_ref_equal(r, &o->dst) &&
            p->bufs[r->buf].kind == IR_BUF_TEMP && ir_tail_rows(r, &lo, &hi) && k < 0) {
            k = q;
            continue;
        }
        if (!ir_ref_static(r) || !ir_buf_preset(p->bufs[r->buf].kind)) return -1;
    }
    if (k < 0) return -1;
    for (int d = 0; d < 4; d++)
        if (c->dst.ne[d] != c->in[k].ne[d]) return -1;
    return k;
}

/* The operand through which member c reads its rows (a norm's a, a tail's rows, the rope result
 * an elementwise node after it reads), or -1 when c is no member. A rope's heads are at most
 * MAX_NE0 long; a cache row (set_rows) is copied in pieces of any length. */
static int rows_operand(const ir_prog *p, const ir_node *c) {
    if (norm_member(p, c)) return c->opd[0];
    if (c->kind == IR_EW) return post_operand(p, c);
    int     k = ir_tail_operand(p, c);
    int64_t lo, hi;
    if (k < 0 || !ir_tail_rows(&c->in[k], &lo, &hi) || p->bufs[c->in[k].buf].kind != IR_BUF_TEMP) return -1;
    return c->op == FE_OP_SET_ROWS || c->in[k].ne[0] <= MAX_NE0 ? k : -1;
}

/* Whether member m of run[0..n) (rows through operand k) reads no member's result, or only the
 * whole result that only it reads, through k, of an earlier norm (m a rope) or plain rope (m
 * elementwise) of the run. */
static bool source_ok(const ir_prog *p, const int *run, int n, int m, int k) {
    const ir_node *c = &p->nodes[run[m]];
    for (int j = 0; j < n; j++) {
        const ir_node *o = &p->nodes[run[j]];
        if (j == m) continue;
        for (int q = 0; q < c->nin; q++) {
            if (c->in[q].buf != o->dst.buf) continue;
            bool pair = c->kind == IR_EW ? o->op == FE_OP_ROPE_EXT && o->fused == IR_FUSED_NONE
                                         : o->op == FE_OP_RMS_NORM && c->op == FE_OP_ROPE_EXT;
            bool whole = q == k && j < m && pair && ir_ref_equal(&c->in[q], &o->dst) && ir_readers(p, o->dst.buf) == 1;
            if (!whole) return false;
        }
    }
    return true;
}

/* The run of members from node i, its length; nodes in run[]. Up to MAX_WAIT other live nodes
 * between members (Gemma 3's scale of q after its rope) go to wait[], *nw of them; none hosts or
 * is a tail (their groups must stay together). */
static int run_from(const ir_prog *p, int i, int *run, int *wait, int *nw) {
    int n = 0;
    *nw = 0;
    for (int j = i; j < p->nnodes && n < MAX_MEMBERS; j++) {
        const ir_node *c = &p->nodes[j];
        if (c->dead) continue;
        if (rows_operand(p, c) >= 0) {
            run[n++] = j;
            continue;
        }
        if (n == 0 || *nw == MAX_WAIT || c->host || ir_next_tail(p, j, j) >= 0) break;
        wait[(*nw)++] = j;
    }
    return n;
}

/* Shortens run[0..n) to its longest legal prefix (0 or at least 2 members). */
static int legal_prefix(const ir_prog *p, const int *run, int n) {
    int ok = 0;
    for (int m = 0; m < n; m++) {
        const ir_node *c = &p->nodes[run[m]];
        int k = rows_operand(p, c);
        if (!source_ok(p, run, m + 1, m, k)) break;
        if (c->kind == IR_EW) { /* a post reads a rope of the run */
            int w = ir_node_writing(p, c->in[k].buf), j = 0;
            while (j < m && run[j] != w) j++;
            if (j == m) break;
        }
        /* no two members write one buffer, and none read what a later one writes */
        bool fine = true;
        for (int j = 0; j < m && fine; j++) {
            const ir_node *o = &p->nodes[run[j]];
            fine = o->dst.buf != c->dst.buf;
            for (int q = 0; q < o->nin && fine; q++) fine = o->in[q].buf != c->dst.buf;
        }
        if (!fine) break;
        ok = m + 1;
    }
    /* a norm's result must be read by its rope inside the prefix: drop members until so */
    while (ok > 0) {
        bool dangling = false;
        for (int j = 0; j < ok && !dangling; j++) {
            const ir_node *c = &p->nodes[run[j]];
            if (c->op != FE_OP_RMS_NORM) continue;
            int  r = ir_reader_after(p, c->dst.buf, run[j]);
            bool in = false;
            for (int m = j + 1; m < ok && !in; m++) in = run[m] == r;
            dangling = !in || ir_readers(p, c->dst.buf) != 1;
        }
        if (!dangling) break;
        ok--;
    }
    return ok >= 2 ? ok : 0;
}

/* The members of run[0..n) before the first waiting node that cannot move after the members
 * after it (all n when every one can). */
static int movable_prefix(const ir_prog *p, const int *run, int n, const int *wait, int nw) {
    for (int w = 0; w < nw; w++)
        for (int m = 0; m < n; m++)
            if (run[m] > wait[w] && !ir_commutes(&p->nodes[wait[w]], &p->nodes[run[m]])) {
                int before = 0;
                while (before < n && run[before] < wait[w]) before++;
                return before;
            }
    return n;
}

kiln_status ir_fuse_head_rope(ir_prog *p) {
    for (int i = 0; i < p->nnodes; i++) {
        int run[MAX_MEMBERS], wait[MAX_WAIT], nw;
        int n = run_from(p, i, run, wait, &nw), legal;
        /* shorter runs until the waiting nodes inside commute with the members after them */
        while ((legal = legal_prefix(p, run, n)) > 0) {
            int m = movable_prefix(p, run, legal, wait, nw);
            if (m == legal) break;
            n = m;
        }
        if (legal == 0) continue;
        if (run[legal - 1] - run[0] + 1 > legal) { /* waiting nodes inside: members first */
            kiln_status st = ir_gather(p, run[0], run[legal - 1], run, legal);
            if (st) return st;
            for (int m = 0; m < legal; m++) run[m] = run[0] + m;
        }
        for (int m = 1; m < legal; m++) p->nodes[run[m]].host = run[0] + 1;
        i = run[legal - 1];
    }
    return NULL;
}
