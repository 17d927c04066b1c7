/* Pass memplan: place every live temporary in one arena, reusing memory whose value is dead.
 *
 * A temporary lives from the node that writes it to the last node that reads it. Nodes are
 * visited in launch order; the destination is placed (best fit among free blocks, else at the
 * end) before the node's dying operands are released, so a kernel never writes over memory it
 * still reads. Placements are aligned to IR_ALIGN bytes. Deterministic: depends only on the IR.
 * A host and its tails (pass gemv_rope) are one kernel, so they are one step: the tails' reads
 * and writes count at the host's position, and nothing dies before the whole group is placed.
 * Requires: no further changes to nodes. Sets bufs[].offset/first/last and arena_bytes. */
#include "ir_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    size_t offs, size;
} block;

typedef struct {
    block *free;
    int    nfree, cap;
    size_t end;
} arena;

static size_t align_up(size_t n) { return (n + IR_ALIGN - 1) / IR_ALIGN * IR_ALIGN; }

static size_t place(arena *a, size_t size) {
    int best = -1;
    for (int i = 0; i < a->nfree; i++)
        if (a->free[i].size >= size && (best < 0 || a->free[i].size < a->free[best].size)) best = i;
    if (best < 0) {
        /* Grow into a free block that ends the arena, if any, rather than leave it stranded. */
        for (int i = 0; i < a->nfree; i++)
            if (a->free[i].offs + a->free[i].size == a->end) {
                size_t offs = a->free[i].offs;
                a->free[i] = a->free[--a->nfree];
                a->end = offs + size;
                return offs;
            }
        size_t offs = a->end;
        a->end += size;
        return offs;
    }
    size_t offs = a->free[best].offs;
    a->free[best].offs += size;
    a->free[best].size -= size;
    if (a->free[best].size == 0) a->free[best] = a->free[--a->nfree];
    return offs;
}

static int by_offset(const void *x, const void *y) {
    const block *a = x, *b = y;
    return a->offs < b->offs ? -1 : a->offs > b->offs;
}

static bool release(arena *a, size_t offs, size_t size) {
    if (a->nfree == a->cap) {
        int cap = a->cap ? a->cap * 2 : 16;
        block *f = realloc(a->free, (size_t)cap * sizeof *f);
        if (!f) return false;
        a->free = f;
        a->cap = cap;
    }
    a->free[a->nfree++] = (block){offs, size};
    /* Coalesce neighbours so large later buffers can reuse the space. */
    qsort(a->free, (size_t)a->nfree, sizeof *a->free, by_offset);
    int w = 0;
    for (int i = 0; i < a->nfree; i++) {
        if (w > 0 && a->free[w - 1].offs + a->free[w - 1].size == a->free[i].offs)
            a->free[w - 1].size += a->free[i].size;
        else
            a->free[w++] = a->free[i];
    }
    a->nfree = w;
    return true;
}

/* The step node i runs in: its own position, or its host's. */
static int step_of(const ir_prog *p, int i) { return p->nodes[i].host ? p->nodes[i].host - 1 : i; }

/* Whether node i is the last live node of its step. */
static bool ends_step(const ir_prog *p, int i) {
    for (int j = i + 1; j < p->nnodes; j++)
        if (!p->nodes[j].dead) return step_of(p, j) != step_of(p, i);
    return true;
}

static void compute_liveness(ir_prog *p) {
    for (int b = 0; b < p->nbufs; b++) p->bufs[b].first = p->bufs[b].last = -1;
    for (int i = 0; i < p->nnodes; i++) {
        const ir_node *n = &p->nodes[i];
        if (n->dead) continue;
        int t = step_of(p, i);
        for (int o = 0; o < 1 + n->has_dst2; o++) {
            ir_buf *d = &p->bufs[o ? n->dst2.buf : n->dst.buf];
            if (d->first < 0) d->first = t;
            if (d->last < t) d->last = t;
        }
        for (int k = 0; k < n->nin; k++) {
            ir_buf *b = &p->bufs[n->in[k].buf];
            if (b->first < 0) b->first = t;
            b->last = t;
        }
    }
}

kiln_status ir_memplan(ir_prog *p) {
    compute_liveness(p);
    arena a = {0};
    for (int i = 0; i < p->nnodes; i++) {
        const ir_node *n = &p->nodes[i];
        if (n->dead) continue;
        int step = step_of(p, i);
        for (int o = 0; o < 1 + n->has_dst2; o++) {
            ir_buf *d = &p->bufs[o ? n->dst2.buf : n->dst.buf];
            if (d->kind == IR_BUF_TEMP && d->first == step) d->offset = place(&a, align_up(d->bytes));
        }
        if (!ends_step(p, i)) continue;
        for (int b = 0; b < p->nbufs; b++) {
            ir_buf *t = &p->bufs[b];
            if (t->kind == IR_BUF_TEMP && t->last == step && t->first >= 0 &&
                !release(&a, t->offset, align_up(t->bytes))) {
                free(a.free);
                return kb_oom();
            }
        }
    }
    free(a.free);
    p->arena_bytes = a.end;
    return NULL;
}
