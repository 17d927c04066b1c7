/* Pass gemv_rope: at decode, the q/k/v GEMV stores rope'd q, and k and v straight into their
 * cache rows; the three small kernels after it launch no more.
 *
 * Pattern:  z = mul_mat(a, b)                         (one column: the GEMV plan; typically the
 *                                                     mul_mat_cat of q, k, v, normalized b)
 *           readers of z, each reading one row segment of z:
 *             q = rope_ext(view(z), pos[, ff])         mode 0 (normal) or 2 (neox), every element rotated
 *             k = rope_set_rows(cache_k, view(z) ...)  the same rope, into a state in place
 *             v = set_rows(cache_v, view(z), ids)      in place into a state
 * Legal when
 *   - z is written naturally by a mul_mat (no pairing, no other fusion; an epilogue, such as the
 *     q/k/v biases that add_chain+mul_mat_cat carry, is applied to the values the tails get) with
 *     one column and static shapes, into a temporary of an even number of rows;
 *   - every reader of z is one of those three kinds, reads z through exactly one operand as
 *     whole rows of one token (a [ne0, heads, 1, 1] view, contiguous; set_rows: one row), at
 *     an even offset, the readers' row segments disjoint; every reader's other operands are
 *     inputs or weights (positions, ids, frequency factors) or its own state, in place;
 *   - the readers are the live nodes right after the mul_mat, or become so: up to MAX_WAIT live
 *     nodes between them that do not read z and share no buffer a later reader writes (nor
 *     write one it reads) move after the readers — the v GEMV of a layer whose v weight has
 *     another type than q and k (Q4_K_M's q6_K attn_v), which mul_mat_cat leaves apart;
 *   - one token: positions and ids of one element; nothing symbolic.
 * Effect: each reader gets host = the mul_mat's index + 1 and keeps everything else: the IR
 * still says what is computed and the CPU reference evaluates every node as before, so results
 * are bit for bit the unfused graph's. Code generation gives the host the readers' tables
 * (k.tail) and the readers no kernel of their own: the GEMV's store rotates each pair of rows
 * (mode 0 pairs are adjacent rows, neox pairs rows i and i + d/2 of a head, which the GEMV then
 * computes as adjacent rows: templates/gemv_rope.lua; a gemv team holds two consecutive rows starting at an
 * even one) and writes q, the k cache row and the v cache row; z itself is not stored. Memory
 * planning treats the group as one step (ir/memplan.c).
 * Requires: after every other fusion pass (the readers and the mul_mat are in final form).
 * Keeps: every IR invariant; verify checks the host rules (ir/verify.c). */
#include "ir_internal.h"


#define MAX_TAILS 4
#define MAX_WAIT  4 /* nodes that may wait until after a host's tails */

/* Reader c of z as a tail (ir/tails.c): the rows of z it covers; false when c cannot be one.
 * Its tail operand must read z, and no other operand. */
static bool tail_of(const ir_prog *p, const ir_node *c, int zbuf, int64_t *lo, int64_t *hi) {
    int zin = ir_tail_operand(p, c);
    if (zin < 0 || c->in[zin].buf != zbuf) return false;
    for (int k = 0; k < c->nin; k++)
        if (k != zin && c->in[k].buf == zbuf) return false;
    return ir_tail_rows(&c->in[zin], lo, hi);
}

static bool host_candidate(const ir_prog *p, const ir_node *m) {
    const ir_ref *a = ir_operand(m, 0), *b = ir_operand(m, 1);
    if (m->dead || m->kind != IR_OP || m->op != FE_OP_MUL_MAT || m->paired || m->fused || m->has_dst2 || m->host || !a ||
        !b || m->by_id)
        return false;
    /* The quantized GEMV reads b as a contiguous column of 16-byte vectors (templates/matmul.lua). */
    if (kiln_type_is_quantized(a->type) && !ir_ref_is_natural(p, b)) return false;
    const ir_ref *z = &m->dst;
    return p->bufs[z->buf].kind == IR_BUF_TEMP && ir_ref_is_natural(p, z) && ir_ref_static(z) && ir_ref_static(a) &&
           ir_ref_static(b) && z->type == KILN_F32 && z->ne[1] == 1 && z->ne[2] == 1 && z->ne[3] == 1 && z->ne[0] % 2 == 0;
}

/* Makes the readers of mul_mat mi tails of it, if legal. Live nodes between it and its readers
 * that neither read its result nor conflict with the readers after them (the v projection of a
 * layer whose v weight has another type than q and k, so mul_mat_cat left it apart) wait until
 * after the readers. */
static kiln_status try_host(ir_prog *p, int mi) {
    const ir_node *m = &p->nodes[mi];
    if (!host_candidate(p, m)) return NULL;
    int     zbuf = m->dst.buf, tails[MAX_TAILS], nt = 0, wait[MAX_WAIT], nw = 0, readers = ir_readers(p, zbuf), last = mi;
    int64_t lo[MAX_TAILS], hi[MAX_TAILS];
    for (int i = mi + 1; i < p->nnodes && nt < MAX_TAILS && nt < readers; i++) {
        const ir_node *c = &p->nodes[i];
        if (c->dead) continue;
        if (tail_of(p, c, zbuf, &lo[nt], &hi[nt])) {
            tails[nt++] = last = i;
            continue;
        }
        if (ir_touches(c, zbuf) || c->host || nw == MAX_WAIT) break;
        wait[nw++] = i;
    }
    /* Each tail reads z once (tail_of), so this says nothing else reads it. */
    if (nt == 0 || readers != nt) return NULL;
    for (int t = 0; t < nt; t++) {
        for (int u = 0; u < t; u++)
            if (lo[t] < hi[u] && lo[u] < hi[t]) return NULL;
        for (int k = 0; k < m->nin; k++) /* the GEMV must not read what its store writes */
            if (m->in[k].buf == p->nodes[tails[t]].dst.buf) return NULL;
        for (int w = 0; w < nw; w++)
            if (wait[w] < tails[t] && !ir_commutes(&p->nodes[wait[w]], &p->nodes[tails[t]])) return NULL;
    }
    if (nw > 0 && wait[0] < last) {
        kiln_status st = ir_gather(p, mi + 1, last, tails, nt);
        if (st) return st;
        for (int t = 0; t < nt; t++) tails[t] = mi + 1 + t;
    }
    for (int t = 0; t < nt; t++) p->nodes[tails[t]].host = mi + 1;
    return NULL;
}

kiln_status ir_fuse_gemv_rope(ir_prog *p) {
    for (int i = 0; i < p->nnodes; i++) {
        kiln_status st = try_host(p, i);
        if (st) return st;
    }
    return NULL;
}
