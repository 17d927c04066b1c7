/* ir_prog construction helpers shared by lowering and passes. */
#include "ir_internal.h"

#include <stdlib.h>
#include <string.h>

void ir_prog_free(ir_prog *p) {
    if (!p) return;
    free(p->bufs);
    free(p->nodes);
    free(p->pool);
    free(p);
}

int ir_add_buf(ir_prog *p, ir_buf_kind kind, kiln_type type, const int64_t ne[4], const char *name) {
    if (p->nbufs == p->capbufs) {
        int cap = p->capbufs ? p->capbufs * 2 : 32;
        ir_buf *b = realloc(p->bufs, (size_t)cap * sizeof *b);
        if (!b) return -1;
        p->bufs = b;
        p->capbufs = cap;
    }
    ir_buf *b = &p->bufs[p->nbufs];
    memset(b, 0, sizeof *b);
    b->kind = kind;
    b->type = type;
    memcpy(b->ne, ne, sizeof b->ne);
    b->bytes = kiln_row_size(type, ne[0]) * (size_t)(ne[1] * ne[2] * ne[3]);
    snprintf(b->name, sizeof b->name, "%s", name);
    b->first = b->last = -1;
    return p->nbufs++;
}

ir_node *ir_add_node(ir_prog *p) {
    if (p->nnodes == p->capnodes) {
        int cap = p->capnodes ? p->capnodes * 2 : 32;
        ir_node *n = realloc(p->nodes, (size_t)cap * sizeof *n);
        if (!n) return NULL;
        p->nodes = n;
        p->capnodes = cap;
    }
    ir_node *n = &p->nodes[p->nnodes++];
    memset(n, 0, sizeof *n);
    return n;
}

ir_ref ir_natural_ref(const ir_prog *p, int buf) {
    const ir_buf *b = &p->bufs[buf];
    ir_ref r = {.buf = buf, .type = b->type, .offs = 0};
    int64_t st = 1;
    for (int d = 0; d < 4; d++) {
        r.ne[d] = b->ne[d];
        r.sym[d] = b->sym[d];
        r.st[d] = st;
        st *= b->ne[d];
    }
    return r;
}

bool ir_ref_equal(const ir_ref *a, const ir_ref *b) {
    if (a->buf != b->buf || a->type != b->type || a->offs != b->offs) return false;
    for (int d = 0; d < 4; d++)
        if (a->ne[d] != b->ne[d] || a->sym[d] != b->sym[d] || (a->ne[d] != 1 && a->st[d] != b->st[d]))
            return false;
    return true;
}

bool ir_ref_is_natural(const ir_prog *p, const ir_ref *r) {
    ir_ref n = ir_natural_ref(p, r->buf);
    return ir_ref_equal(&n, r);
}

static int cmp_int(const void *x, const void *y) {
    int a = *(const int *)x, b = *(const int *)y;
    return (a > b) - (a < b);
}

bool ir_plain_op(const ir_node *n) {
    return n->kind == IR_OP && !n->dead && n->ninstr == 0 && !n->paired && !n->bnorm && n->fused == IR_FUSED_NONE &&
           !n->has_dst2 && !n->fusion;
}

void ir_sort_sources(ir_node *n) { qsort(n->src, (size_t)n->nsrc, sizeof n->src[0], cmp_int); }

int ir_node_writing(const ir_prog *p, int buf) {
    for (int i = 0; i < p->nnodes; i++)
        if (!p->nodes[i].dead && (p->nodes[i].dst.buf == buf || (p->nodes[i].has_dst2 && p->nodes[i].dst2.buf == buf)))
            return i;
    return -1;
}

int ir_next_tail(const ir_prog *p, int h, int after) {
    for (int j = after + 1; j < p->nnodes; j++)
        if (!p->nodes[j].dead) return p->nodes[j].host == h + 1 ? j : -1;
    return -1;
}

const char *ir_node_name(const ir_prog *p, int tensor_id) {
    const kiln_ctx *ctx = p->g->ctx;
    if (tensor_id < 0 || tensor_id >= ctx->n) return "?";
    return ctx->t[tensor_id]->name;
}

int ir_reader_after(const ir_prog *p, int buf, int after) {
    for (int i = after + 1; i < p->nnodes; i++) {
        const ir_node *c = &p->nodes[i];
        for (int k = 0; !c->dead && k < c->nin; k++)
            if (c->in[k].buf == buf) return i;
    }
    return -1;
}

int ir_readers(const ir_prog *p, int buf) {
    int n = 0;
    for (int i = 0; i < p->nnodes; i++) {
        const ir_node *c = &p->nodes[i];
        if (c->dead) continue;
        for (int k = 0; k < c->nin; k++) n += c->in[k].buf == buf;
    }
    return n;
}

bool ir_in_slot(const ir_node *n, int k) {
    for (int s = 0; s < FE_MAX_SRC; s++)
        if (n->opd[s] == k) return true;
    return false;
}

bool ir_buf_ready_at(const ir_prog *p, int buf, int at) {
    ir_buf_kind kind = p->bufs[buf].kind;
    if (ir_buf_preset(kind)) return true;
    int w = ir_node_writing(p, buf);
    return (w >= 0 && w < at) || (kind == IR_BUF_STATE && w < 0);
}

bool ir_operands_ready(const ir_prog *p, const ir_node *n, int before) {
    for (int k = 0; k < n->nin; k++) {
        if (n->in[k].buf == n->dst.buf) continue; /* in place: the old value, ready from the start */
        if (!ir_buf_ready_at(p, n->in[k].buf, before)) return false;
    }
    return true;
}
