/* Pass mul_mat_cat: mul_mats that share an input become one mul_mat over their weights placed
 * side by side (the q, k and v projections of attention: one GEMV instead of three).
 *
 * Pattern:  y_i = mul_mat(w_i, x),  i = 1..n (2 <= n <= CAT_MAX), the same x; or, every one
 *           with a bias, y_i = add(mul_mat(w_i, x), b_i) as pass add_chain fused it (qwen2's and
 *           gpt-oss's q, k and v).
 * Legal when
 *   - every node is a plain mul_mat (no epilogue, pairing or fusion yet), or every one a
 *     mul_mat whose only fusion is add_chain's one add of a bias (a whole 1-D weight of its M_i
 *     rows, read naturally, in no block yet, of one type, its bytes a multiple of IR_ALIGN),
 *     with the same b (read through equal layouts) and parameters; each weight is a whole 2-D
 *     weight buffer read naturally, not yet in a block, of one type and row length K, and its
 *     bytes are a multiple of IR_ALIGN (the next one starts aligned);
 *   - each y_i is a temporary written naturally, of one type and one shape but for its rows
 *     M_i, and every read of it can be re-expressed in the concatenated result (below).
 * Effect: a weight block (IR_BUF_BLOCK, ir.h) of [K, M] (M = sum M_i) holds the weights in
 * order; the first node reads it and writes one temporary y of [M, N, ...]; y_i is rows
 * [c_i, c_i + M_i) of each column of y, and its readers' layouts are rewritten onto y; the other
 * nodes die. The weights keep their names (callers load them as before) and become views of the
 * block's memory, so the rewrite costs nothing at run time and every mul_mat plan (GEMV, tile,
 * cuBLAS) serves the wider matrix unchanged. With biases, a second block of [M] holds them in
 * the same order and the node's add reads it. Values are the unfused ones: each output element
 * is the same dot product of the same row and column (plus the same bias, rounded alike).
 * A read of y_i through (ne, st, offs) maps onto y when each dim either steps whole columns of
 * y_i (stride a multiple of M_i: the stride scales to a multiple of M) or stays inside one
 * column (the largest in-column offset it reaches is below M_i).
 * Requires: after the other pattern passes (they match natural reads of the results; after
 * this pass y_i's reads are strided views of y) and before ew_chain. Keeps: every IR invariant. */
#include "ir_internal.h"

#include <stdlib.h>
#include <string.h>

#define CAT_MAX 8

static bool plain_mul_mat(const ir_node *n) { return ir_plain_op(n) && n->op == FE_OP_MUL_MAT; }

/* The operand of n's bias: n is a mul_mat whose only fusion is add_chain's one add of its value
 * and a whole 1-D weight of its rows, read naturally, in no block, of IR_ALIGN-multiple bytes;
 * else -1. */
static int bias_operand(const ir_prog *p, const ir_node *n) {
    if (n->kind != IR_OP || n->dead || n->op != FE_OP_MUL_MAT || n->ninstr != 1 || n->paired || n->bnorm ||
        n->fused != IR_FUSED_NONE || n->has_dst2 || n->host || !n->fusion || strcmp(n->fusion, "add_chain") != 0)
        return -1;
    const ir_instr *in = &n->ins[0];
    int             k = in->a == n->nin ? in->b : in->b == n->nin ? in->a : -1;
    if (in->op != FE_OP_ADD || k < 0 || k >= n->nin || ir_in_slot(n, k)) return -1;
    const ir_ref *r = &n->in[k];
    const ir_buf *b = &p->bufs[r->buf];
    if (b->kind != IR_BUF_WEIGHT || b->block || !ir_ref_is_natural(p, r) || b->bytes == 0 || b->bytes % IR_ALIGN != 0)
        return -1;
    return b->ne[0] == n->dst.ne[0] && b->ne[1] == 1 && b->ne[2] == 1 && b->ne[3] == 1 ? k : -1;
}

/* A member of a group: a plain mul_mat, or one with a bias (bias_operand). */
static bool member(const ir_prog *p, const ir_node *n) { return plain_mul_mat(n) || bias_operand(p, n) >= 0; }

/* The node's weight, when it may join a block: a whole, natural, 2-D weight of its own; a
 * quantized one of whole device tiles (kb_quant_tile blocks: the device layouts of the members side
 * by side are then the layout of the block, templates/quant.lua). */
static const ir_ref *block_weight(const ir_prog *p, const ir_node *n) {
    const ir_ref *w = ir_operand(n, 0);
    if (!w || !ir_operand(n, 1)) return NULL;
    const ir_buf *b = &p->bufs[w->buf];
    if (b->kind != IR_BUF_WEIGHT || b->block || !ir_ref_is_natural(p, w)) return NULL;
    if (b->ne[2] != 1 || b->ne[3] != 1 || b->bytes == 0 || b->bytes % IR_ALIGN != 0) return NULL;
    if (kiln_type_is_quantized(b->type) && b->bytes / kiln_type_size(b->type) % (size_t)kb_quant_tile(b->type) != 0) return NULL;
    return w;
}

/* Whether read r of a [m, ...] temporary stays inside one column in every dim that does not
 * step whole columns (strides are never negative: ir_verify). */
static bool in_column(const ir_ref *r, int64_t m) {
    int64_t reach = r->offs % m;
    for (int d = 0; d < 4; d++)
        if (r->ne[d] > 1 && r->st[d] % m != 0) reach += r->st[d] * (r->ne[d] - 1);
    return reach < m;
}

/* Rewrites r (an in_column read of a [m, ...] temporary) onto buffer `buf` of [mt, ...] whose
 * rows c0..c0 + m hold it. */
static void cat_ref(ir_ref *r, int64_t m, int64_t mt, int64_t c0, int buf) {
    for (int d = 0; d < 4; d++)
        if (r->ne[d] > 1 && r->st[d] % m == 0) r->st[d] = r->st[d] / m * mt;
    r->offs = r->offs / m * mt + r->offs % m + c0;
    r->buf = buf;
}

/* Every read of buffer `buf` (rows m) re-expressible in a wider result (whatever its rows). */
static bool reads_map(const ir_prog *p, int buf, int64_t m) {
    for (int i = 0; i < p->nnodes; i++) {
        const ir_node *c = &p->nodes[i];
        for (int k = 0; !c->dead && k < c->nin; k++)
            if (c->in[k].buf == buf && !in_column(&c->in[k], m)) return false;
    }
    return true;
}

/* Node j may join node i's group: the same product but for the weight (and the bias: both have
 * one, of one type, added alike, or neither). */
static bool joins(const ir_prog *p, const ir_node *a, const ir_node *b) {
    if (!member(p, b) || memcmp(a->ip, b->ip, sizeof a->ip) != 0 || memcmp(a->fp, b->fp, sizeof a->fp) != 0)
        return false;
    int ka = bias_operand(p, a), kb = bias_operand(p, b);
    if ((ka < 0) != (kb < 0)) return false;
    if (ka >= 0 && (a->in[ka].type != b->in[kb].type || a->ins[0].type != b->ins[0].type || a->op_type != b->op_type ||
                    (a->ins[0].a == a->nin) != (b->ins[0].a == b->nin)))
        return false;
    const ir_ref *wa = ir_operand(a, 0), *wb = block_weight(p, b);
    if (!wb || wb->type != wa->type || wb->ne[0] != wa->ne[0]) return false;
    if (!ir_ref_equal(ir_operand(a, 1), ir_operand(b, 1))) return false;
    if (b->dst.type != a->dst.type) return false;
    for (int d = 1; d < 4; d++)
        if (b->dst.ne[d] != a->dst.ne[d] || b->dst.sym[d] != a->dst.sym[d]) return false;
    return true;
}

/* A result this pass may move: a temporary the node writes naturally, with readers that can
 * read it as a slice of the concatenated result. */
static bool movable_result(const ir_prog *p, const ir_node *n) {
    return p->bufs[n->dst.buf].kind == IR_BUF_TEMP && ir_ref_is_natural(p, &n->dst) && n->dst.sym[0] == 0 &&
           reads_map(p, n->dst.buf, n->dst.ne[0]);
}

/* A name "first+n" (FE_MAX_NAME bounds names; the members are listed by ir_print). */
static void group_name(char *out, const char *first, int more) {
    char tail[16];
    int  t = snprintf(tail, sizeof tail, "+%d", more);
    snprintf(out, FE_MAX_NAME, "%.*s%s", FE_MAX_NAME - 1 - t, first, tail);
}

/* The members' biases (operand k of each) in a block of [mt] of their type, side by side in
 * order; the block's buffer, or -1 (out of memory). */
static int bias_block(ir_prog *p, const int *g, int n, int k, int64_t mt) {
    const ir_ref *b0 = &p->nodes[g[0]].in[k];
    int64_t       ne[4] = {mt, 1, 1, 1};
    char          name[FE_MAX_NAME];
    group_name(name, p->bufs[b0->buf].name, n - 1);
    int blk = ir_add_buf(p, IR_BUF_BLOCK, b0->type, ne, name);
    if (blk < 0) return -1;
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        const ir_node *mi = &p->nodes[g[i]];
        ir_buf        *b = &p->bufs[mi->in[bias_operand(p, mi)].buf];
        b->block = blk + 1;
        b->offset = at;
        at += b->bytes;
    }
    return blk;
}

/* Merges the group g[0..n) (node indices, in program order) into node g[0]. */
static kiln_status merge(ir_prog *p, const int *g, int n) {
    const ir_node *a = &p->nodes[g[0]];
    const ir_ref  *w0 = ir_operand(a, 0);
    int            kb = bias_operand(p, a);
    int64_t        m[CAT_MAX], mt = 0;
    for (int i = 0; i < n; i++) mt += m[i] = p->nodes[g[i]].dst.ne[0];
    int64_t bne[4] = {w0->ne[0], mt, 1, 1}, yne[4] = {mt, a->dst.ne[1], a->dst.ne[2], a->dst.ne[3]};
    char    name[FE_MAX_NAME];
    group_name(name, p->bufs[w0->buf].name, n - 1);
    int blk = ir_add_buf(p, IR_BUF_BLOCK, w0->type, bne, name);
    group_name(name, p->bufs[a->dst.buf].name, n - 1);
    int y = blk < 0 ? -1 : ir_add_buf(p, IR_BUF_TEMP, a->dst.type, yne, name);
    int bblk = y < 0 || kb < 0 ? -1 : bias_block(p, g, n, kb, mt);
    if (y < 0 || (kb >= 0 && bblk < 0)) return kb_oom();
    memcpy(&p->bufs[y].sym[1], &p->bufs[a->dst.buf].sym[1], 3);
    size_t  at = 0;
    int64_t c0 = 0;
    for (int i = 0; i < n; i++) {
        ir_node *mi = &p->nodes[g[i]];
        ir_buf  *w = &p->bufs[ir_operand(mi, 0)->buf];
        w->block = blk + 1;
        w->offset = at;
        at += w->bytes;
        int src = mi->dst.buf;
        for (int j = 0; j < p->nnodes; j++) {
            ir_node *c = &p->nodes[j];
            if (c->dead) continue;
            for (int k = 0; k < c->nin; k++)
                if (c->in[k].buf == src) cat_ref(&c->in[k], m[i], mt, c0, y);
        }
        c0 += m[i];
    }
    ir_node *first = &p->nodes[g[0]];
    first->in[first->opd[0]] = ir_natural_ref(p, blk);
    if (kb >= 0) first->in[kb] = ir_natural_ref(p, bblk);
    first->dst = ir_natural_ref(p, y);
    first->fusion = kb >= 0 ? "add_chain+mul_mat_cat" : "mul_mat_cat";
    for (int i = 1; i < n; i++) {
        ir_node *mi = &p->nodes[g[i]];
        for (int s = 0; s < mi->nsrc && first->nsrc < IR_MAX_INSTR; s++) first->src[first->nsrc++] = mi->src[s];
        mi->dead = true;
    }
    ir_sort_sources(first);
    return NULL;
}

kiln_status ir_fuse_mul_mat_cat(ir_prog *p) {
    for (int i = 0; i < p->nnodes; i++) {
        const ir_node *a = &p->nodes[i];
        if (!member(p, a) || !block_weight(p, a) || !movable_result(p, a)) continue;
        int g[CAT_MAX], n = 1, nsrc = a->nsrc;
        g[0] = i;
        for (int j = i + 1; j < p->nnodes && n < CAT_MAX; j++) {
            const ir_node *b = &p->nodes[j];
            if (b->dead || !joins(p, a, b) || !movable_result(p, b) || nsrc + b->nsrc > IR_MAX_INSTR) continue;
            bool dup = false; /* the same weight twice would need two places in the block */
            for (int k = 0; k < n; k++) dup |= ir_operand(&p->nodes[g[k]], 0)->buf == ir_operand(b, 0)->buf;
            if (dup) continue;
            g[n++] = j;
            nsrc += b->nsrc;
        }
        if (n < 2) continue;
        kiln_status st = merge(p, g, n);
        if (st) return st;
    }
    return NULL;
}
