/* Lowering: graph -> IR. Every leaf and every computed tensor gets a buffer; views get none —
 * they become strided layouts (ir_ref) into the buffer of the tensor that owns their data, so
 * a chain of reshape/permute/view costs nothing at run time. Each computed tensor becomes one
 * elementwise node of a single instruction; the passes merge them later. A graph output that is
 * a view is materialized by a copy into its own output buffer. */
#include "ir_internal.h"

#include <stdlib.h>
#include <string.h>

/* The layout through which tensor t is read: its owner's buffer with t's strides. */
static ir_ref ref_of(const kiln_tensor *t, const int *buf_of) {
    const kiln_tensor *owner = t->view_src ? t->view_src : t;
    /* Element units. A quantized type's bytes come in blocks of blk elements (the frontend keeps
     * its layouts to whole blocks with dim 0 in place): byte offset b is element b / es · blk,
     * and element e sits in block e / blk, whatever the dim. */
    size_t  es = kiln_type_size(t->type);
    int64_t blk = kiln_type_block(t->type);
    ir_ref  r = {.buf = buf_of[owner->id], .type = t->type, .offs = (int64_t)(t->view_offs / es) * blk};
    for (int d = 0; d < 4; d++) {
        r.ne[d] = t->ne[d];
        r.st[d] = d == 0 && blk > 1 ? 1 : (int64_t)(t->nb[d] / es) * blk;
        r.sym[d] = t->sym[d];
    }
    return r;
}

/* A buffer holding tensor t's natural layout (symbolic dims at their maximum). */
static int tensor_buf(ir_prog *p, ir_buf_kind kind, const kiln_tensor *t) {
    int b = ir_add_buf(p, kind, t->type, t->ne, t->name);
    if (b >= 0) memcpy(p->bufs[b].sym, t->sym, sizeof t->sym);
    return b;
}

static int add_input(ir_node *n, const ir_ref *r) {
    for (int i = 0; i < n->nin; i++)
        if (ir_ref_equal(&n->in[i], r)) return i;
    n->in[n->nin] = *r;
    return n->nin++;
}

/* One single-instruction elementwise node computing t from its operands into buffer dst. */
static kiln_status lower_compute(ir_prog *p, const kiln_tensor *t, int dst, const int *buf_of) {
    ir_node *n = ir_add_node(p);
    if (!n) return kb_oom();
    n->kind = IR_EW;
    n->dst = ir_natural_ref(p, dst);
    int reg[FE_MAX_SRC] = {0, 0};
    for (int s = 0; s < fe_ops[t->op].nsrc; s++) {
        ir_ref r = ref_of(t->src[s], buf_of);
        reg[s] = add_input(n, &r);
    }
    ir_instr *in = &n->ins[n->ninstr++];
    in->op = t->op;
    in->a = reg[0];
    in->b = reg[1];
    in->f[0] = t->fp[0];
    in->f[1] = t->fp[1];
    in->type = t->type;
    n->src[n->nsrc++] = t->id;
    return NULL;
}

/* The result buffer of computed tensor t: an output's own, or a temporary. */
static int result_buf(ir_prog *p, const kiln_tensor *t, int *buf_of) {
    ir_buf_kind k = t->role == KILN_ROLE_OUTPUT ? IR_BUF_OUTPUT : IR_BUF_TEMP;
    buf_of[t->id] = tensor_buf(p, k, t);
    return buf_of[t->id];
}

/* An elementwise node of one instruction `op` over operand refs x (and g when op is binary or
 * gated), writing dst. */
static kiln_status ew_node(ir_prog *p, const kiln_tensor *t, int dst, fe_op op, const ir_ref *x,
                           const ir_ref *g) {
    ir_node *n = ir_add_node(p);
    if (!n) return kb_oom();
    n->kind = IR_EW;
    n->dst = ir_natural_ref(p, dst);
    ir_instr *in = &n->ins[n->ninstr++];
    in->op = op;
    in->a = add_input(n, x);
    in->b = g ? add_input(n, g) : 0;
    in->type = t->type;
    n->src[n->nsrc++] = t->id;
    return NULL;
}

/* The GLU parameters an instruction needs: swiglu_oai's alpha and limit. */
static void glu_params(ir_prog *p, const kiln_tensor *t) {
    ir_node *n = &p->nodes[p->nnodes - 1];
    n->ins[0].f[0] = t->fp[0];
    n->ins[0].f[1] = t->fp[1];
}

/* Gated units: x and g are two operands of one instruction; in the one-tensor form they are the
 * two halves of a along dim 0 (exchanged when swapped). */
static kiln_status lower_glu(ir_prog *p, const kiln_tensor *t, int *buf_of) {
    int dst = result_buf(p, t, buf_of);
    if (dst < 0) return kb_oom();
    ir_ref x = ref_of(t->src[0], buf_of), g;
    if (t->src[1]) g = ref_of(t->src[1], buf_of);
    else {
        int64_t half = t->ne[0];
        x.ne[0] = half;
        g = x;
        if (t->ip[0]) x.offs += half * x.st[0];
        else g.offs += half * g.st[0];
    }
    kiln_status st = ew_node(p, t, dst, t->op, &x, &g);
    if (!st) glu_params(p, t);
    return st;
}

static bool ref_contiguous(const ir_ref *r) {
    int64_t s = 1;
    for (int d = 0; d < 4; d++) {
        if (r->ne[d] != 1 && r->st[d] != s) return false;
        s *= r->ne[d];
    }
    return true;
}

/* Copies: identity instructions (CONT) whose result rounds to the destination type. cpy into
 * another shape reads a in its linear order: directly when a is contiguous, else through a
 * contiguous temporary. */
static kiln_status lower_copy(ir_prog *p, const kiln_tensor *t, int *buf_of) {
    const kiln_tensor *a = t->src[0];
    ir_ref             x = ref_of(a, buf_of);
    bool               reshaped = false, sym = false;
    for (int d = 0; d < 4; d++) {
        reshaped |= t->op == FE_OP_CPY && (a->ne[d] != t->ne[d] || a->sym[d] != t->sym[d]);
        sym |= a->sym[d] || t->sym[d];
    }
    if (reshaped && sym)
        return kb_error(KILN_ERR_SHAPE, "cpy '%s': a copy into another shape reads its source in "
                                        "linear order, which symbolic dims (padded layouts) do not keep",
                        t->name);
    if (reshaped && !ref_contiguous(&x)) {
        int tmp = tensor_buf(p, IR_BUF_TEMP, a);
        if (tmp < 0) return kb_oom();
        ir_node *n = ir_add_node(p);
        if (!n) return kb_oom();
        n->kind = IR_EW;
        n->dst = ir_natural_ref(p, tmp);
        n->in[n->nin++] = x;
        n->ins[n->ninstr++] = (ir_instr){.op = FE_OP_CONT, .a = 0, .type = a->type};
        n->src[n->nsrc++] = t->id;
        x = ir_natural_ref(p, tmp);
    }
    if (reshaped) {
        int64_t s = 1;
        for (int d = 0; d < 4; d++) {
            x.ne[d] = t->ne[d];
            x.st[d] = s;
            s *= t->ne[d];
        }
    }
    int dst = result_buf(p, t, buf_of);
    if (dst < 0) return kb_oom();
    return ew_node(p, t, dst, FE_OP_CONT, &x, NULL);
}

/* Whether set_rows t writes a state in place: its destination operand is a state leaf itself. */
static bool writes_state(const kiln_tensor *t) {
    return t->op == FE_OP_SET_ROWS && t->src[0]->op == FE_OP_LEAF && t->src[0]->role == KILN_ROLE_STATE;
}

/* Any other op: one IR_OP node over its present tensor operands. A set_rows into a state
 * writes the state's buffer (ir/state.c checked that nothing else needs its old value). */
static kiln_status lower_kernel(ir_prog *p, const kiln_tensor *t, int *buf_of) {
    int dst = writes_state(t) ? (buf_of[t->id] = buf_of[t->src[0]->id]) : result_buf(p, t, buf_of);
    if (dst < 0) return kb_oom();
    ir_node *n = ir_add_node(p);
    if (!n) return kb_oom();
    n->kind = IR_OP;
    n->op = t->op;
    n->dst = ir_natural_ref(p, dst);
    memcpy(n->ip, t->ip, sizeof n->ip);
    memcpy(n->fp, t->fp, sizeof n->fp);
    for (int s = 0; s < FE_MAX_SRC; s++) {
        n->opd[s] = -1;
        if (s < fe_ops[t->op].nsrc && t->src[s]) {
            ir_ref r = ref_of(t->src[s], buf_of);
            n->opd[s] = add_input(n, &r);
        }
    }
    n->src[n->nsrc++] = t->id;
    return NULL;
}

/* A view that is a graph output: copy it into its own contiguous buffer. */
static kiln_status lower_view_output(ir_prog *p, const kiln_tensor *t, int *buf_of) {
    int dst = tensor_buf(p, IR_BUF_OUTPUT, t);
    if (dst < 0) return kb_oom();
    ir_node *n = ir_add_node(p);
    if (!n) return kb_oom();
    n->kind = IR_EW;
    n->dst = ir_natural_ref(p, dst);
    n->in[0] = ref_of(t, buf_of);
    n->nin = 1;
    n->ins[0] = (ir_instr){.op = FE_OP_CONT, .a = 0, .type = t->type};
    n->ninstr = 1;
    n->src[n->nsrc++] = t->id;
    buf_of[t->id] = dst;
    return NULL;
}

static kiln_status lower_tensor(ir_prog *p, const kiln_tensor *t, int *buf_of) {
    switch (fe_ops[t->op].kind) {
    case FE_LEAF: {
        ir_buf_kind k = t->role == KILN_ROLE_WEIGHT ? IR_BUF_WEIGHT
                        : t->role == KILN_ROLE_STATE ? IR_BUF_STATE
                                                     : IR_BUF_INPUT;
        buf_of[t->id] = tensor_buf(p, k, t);
        return buf_of[t->id] < 0 ? kb_oom() : NULL;
    }
    case FE_VIEW:
        return t->role == KILN_ROLE_OUTPUT ? lower_view_output(p, t, buf_of) : NULL;
    case FE_GLU: return lower_glu(p, t, buf_of);
    case FE_COPY: return lower_copy(p, t, buf_of);
    case FE_KERNEL: return lower_kernel(p, t, buf_of);
    case FE_UNARY:
    case FE_BINARY: {
        ir_buf_kind k = t->role == KILN_ROLE_OUTPUT ? IR_BUF_OUTPUT : IR_BUF_TEMP;
        buf_of[t->id] = tensor_buf(p, k, t);
        if (buf_of[t->id] < 0) return kb_oom();
        return lower_compute(p, t, buf_of[t->id], buf_of);
    }
    }
    return kb_error(KILN_ERR_INVALID, "lowering: node '%s': op %s cannot be lowered", t->name,
                    fe_ops[t->op].name);
}

kiln_status ir_lower(const kiln_graph *g, ir_prog **out) {
    *out = NULL;
    ir_prog *p = calloc(1, sizeof *p);
    int *buf_of = malloc(((size_t)g->ctx->n + 1) * sizeof *buf_of);
    if (!p || !buf_of) {
        free(p);
        free(buf_of);
        return kb_oom();
    }
    p->g = g;
    for (int i = 0; i < g->ctx->n; i++) buf_of[i] = -1;
    kiln_status st = ir_check_states(g);
    for (int i = 0; i < g->n && !st; i++) st = lower_tensor(p, g->nodes[i], buf_of);
    free(buf_of);
    if (st) {
        ir_prog_free(p);
        return st;
    }
    *out = p;
    return NULL;
}
