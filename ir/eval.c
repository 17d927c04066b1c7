/* The CPU reference: a plain interpreter of IR nodes, used as the oracle for every GPU test.
 * kiln_reference runs it on the unfused IR, so it is ggml's graph evaluated op by op. */
#include "ir_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float round_to(float v, kiln_type t) {
    switch (t) {
    case KILN_F16: return kb_f16_to_f32(kb_f32_to_f16(v));
    case KILN_BF16: return kb_bf16_to_f32(kb_f32_to_bf16(v));
    default: return v;
    }
}

float ir_apply(const ir_instr *in, float a, float b) {
    switch (in->op) {
    case FE_OP_CONT: return a;
    case FE_OP_ADD: return a + b;
    case FE_OP_SUB: return a - b;
    case FE_OP_MUL: return a * b;
    case FE_OP_DIV: return a / b;
    case FE_OP_SCALE: return a * in->f[0] + in->f[1];
    case FE_OP_NEG: return -a;
    case FE_OP_EXP: return expf(a);
    case FE_OP_SQR: return a * a;
    case FE_OP_SQRT: return sqrtf(a);
    case FE_OP_SILU: return a / (1.0f + expf(-a));
    /* ggml_gelu: the tanh approximation with ggml's constants. */
    case FE_OP_GELU: return 0.5f * a * (1.0f + tanhf(0.79788456080286535587989211986876f * a * (1.0f + 0.044715f * a * a)));
    case FE_OP_RELU: return a > 0.0f ? a : 0.0f;
    case FE_OP_TANH: return tanhf(a);
    case FE_OP_SIGMOID: return 1.0f / (1.0f + expf(-a));
    case FE_OP_ABS: return fabsf(a);
    case FE_OP_SGN: return a > 0.0f ? 1.0f : (a < 0.0f ? -1.0f : 0.0f);
    case FE_OP_STEP: return a > 0.0f ? 1.0f : 0.0f;
    case FE_OP_ELU: return a > 0.0f ? a : expm1f(a);
    case FE_OP_LEAKY_RELU: return (a > 0.0f ? a : 0.0f) + in->f[0] * (a < 0.0f ? a : 0.0f);
    case FE_OP_GELU_ERF: return 0.5f * a * (1.0f + erff(a * 0.70710678118654752440f));
    case FE_OP_GELU_QUICK: return a * (1.0f / (1.0f + expf(-1.702f * a)));
    case FE_OP_HARDSWISH: return a * fminf(1.0f, fmaxf(0.0f, (a + 3.0f) / 6.0f));
    case FE_OP_HARDSIGMOID: return fminf(1.0f, fmaxf(0.0f, (a + 3.0f) / 6.0f));
    case FE_OP_LOG: return logf(a);
    case FE_OP_SIN: return sinf(a);
    case FE_OP_COS: return cosf(a);
    case FE_OP_SOFTPLUS: return a > 20.0f ? a : logf(1.0f + expf(a));
    /* ggml_clamp: MAX(MIN(x, max), min) */
    case FE_OP_CLAMP: return fmaxf(fminf(a, in->f[1]), in->f[0]);
    case FE_OP_ADD1: return a + b;
    case FE_OP_REGLU: return a > 0.0f ? a * b : 0.0f; /* ggml_vec_reglu_f32: no inf*0 NaN */
    case FE_OP_GEGLU: return 0.5f * a * (1.0f + tanhf(0.79788456080286535587989211986876f * a * (1.0f + 0.044715f * a * a))) * b;
    case FE_OP_SWIGLU: return a / (1.0f + expf(-a)) * b;
    case FE_OP_GEGLU_ERF: return 0.5f * a * (1.0f + erff(a * 0.70710678118654752440f)) * b;
    case FE_OP_GEGLU_QUICK: return a * (1.0f / (1.0f + expf(-1.702f * a))) * b;
    case FE_OP_SWIGLU_OAI: {
        /* ggml-cpu: x = min(x, limit), g = clamp(g, -limit, limit), silu_alpha(x) * (g + 1) */
        float x = fminf(a, in->f[1]), g = fminf(fmaxf(b, -in->f[1]), in->f[1]);
        return x / (1.0f + expf(in->f[0] * -x)) * (g + 1.0f);
    }
    default: return NAN;
    }
}

int64_t ir_offset_at(const ir_ref *r, const int64_t c[4]) {
    int64_t o = r->offs;
    for (int d = 0; d < 4; d++) o += (c[d] % r->ne[d]) * r->st[d];
    return o;
}

const ir_ref *ir_operand(const ir_node *n, int slot) {
    if (slot < 0 || slot >= FE_MAX_SRC || n->opd[slot] < 0) return NULL;
    return &n->in[n->opd[slot]];
}

/* The reference of each op family (FE_FAMS, frontend.h), indexed by its enum: the table is ir's
 * own because the functions are, and ir/ may not be reached from frontend/. Leaves and views
 * are no nodes, and elementwise ops are IR_EW nodes (ir_apply): those families have none. */
static const ir_ref_fn ref_fns[] = {
    [FE_FAM_NONE] = NULL,           [FE_FAM_EW] = NULL,                 [FE_FAM_ROWS] = ir_ref_rows,
    [FE_FAM_NORM] = ir_ref_norm,    [FE_FAM_SOFTMAX] = ir_ref_softmax,  [FE_FAM_ROPE] = ir_ref_rope,
    [FE_FAM_REDUCE] = ir_ref_reduce, [FE_FAM_SORT] = ir_ref_sort,       [FE_FAM_FILL] = ir_ref_fill,
    [FE_FAM_MATMUL] = ir_ref_matmul, [FE_FAM_MATMUL_ID] = ir_ref_matmul, [FE_FAM_ATTN] = ir_ref_attn,
    [FE_FAM_SAMPLE] = ir_ref_sample, [FE_FAM_COLLECTIVE] = ir_ref_collective,
};
_Static_assert(sizeof ref_fns / sizeof ref_fns[0] == FE_FAM_COUNT, "ref_fns: one entry per row of FE_FAMS");

ir_ref_fn ir_ref_of(fe_fam fam) { return (unsigned)fam < FE_FAM_COUNT ? ref_fns[fam] : NULL; }

/* n's instructions over reg, instruction k's result going to register first + k (IR_EW:
 * first = nin; an IR_OP epilogue: nin + 1, after the op's value). Returns the last result. */
static float run_instrs(const ir_node *n, float *reg, int first) {
    for (int j = 0; j < n->ninstr; j++) {
        const ir_instr *in = &n->ins[j];
        float b = fe_ops[in->op].nsrc > 1 ? reg[in->b] : 0.0f;
        reg[first + j] = round_to(ir_apply(in, reg[in->a], b), in->type);
    }
    return reg[first + n->ninstr - 1];
}

static kiln_status eval_ref(const ir_prog *p, int i, const ir_node *n, void **data) {
    ir_ref_fn fn = ir_ref_of(fe_ops[n->op].fam);
    if (fn) return fn(p, n, data);
    return kb_error(KILN_ERR_INVALID, "reference: node %d: no reference for op %s", i, fe_ops[n->op].name);
}

/* A temporary holding an op's value over n's output space, contiguous, of op_type. */
static ir_ref temp_ref(const ir_node *n, int buf, const int64_t ne[4]) {
    return (ir_ref){.buf = buf, .type = n->op_type, .ne = {ne[0], ne[1], ne[2], ne[3]},
                    .st = {1, ne[0], ne[0] * ne[1], ne[0] * ne[1] * ne[2]}};
}

/* Epilogue operand k of a mul_mat_id read through its ids (ir.h, by_id) at coordinate c: element
 * (c0, ids[c1, c2]), 0 for an id out of range. */
static float by_id_load(const ir_node *n, int k, void **data, const int64_t c[4]) {
    const ir_ref *ids = ir_operand(n, 2), *r = &n->in[k];
    int64_t       ic[4] = {c[1], c[2], 0, 0};
    int64_t       e = (int64_t)kb_load_f32(data[ids->buf], ids->type, ir_offset_at(ids, ic));
    if (e < 0 || e >= r->ne[1]) return 0.0f;
    int64_t rc[4] = {c[0], e, 0, 0};
    return kb_load_f32(data[r->buf], r->type, ir_offset_at(r, rc));
}

/* An op with an epilogue: the op (twice when paired, the second time with in[pair_in] as its
 * weight) into temporaries of op_type (what the unfused graph stored), then the epilogue per
 * output element, exactly as eval_ew does for the consumer it replaced. */
static kiln_status eval_op_epilogue(const ir_prog *p, int i, const ir_node *n, void **data, int ndata) {
    const int64_t *ne = n->dst.ne;
    int64_t        count = ne[0] * ne[1] * ne[2] * ne[3];
    int            nv = ir_op_values(n);
    void          *tmp[2] = {NULL, NULL};
    void         **d2 = malloc(((size_t)ndata + 2) * sizeof *d2);
    ir_node       *m = malloc(sizeof *m);
    bool           ok = d2 && m;
    for (int v = 0; v < nv; v++) ok = ok && (tmp[v] = malloc((size_t)(count ? count : 1) * kiln_type_size(n->op_type)));
    if (!ok) {
        free(tmp[0]), free(tmp[1]), free(d2), free(m);
        return kb_oom();
    }
    memcpy(d2, data, (size_t)ndata * sizeof *d2);
    kiln_status st = NULL;
    ir_ref      vref[2];
    for (int v = 0; v < nv && !st; v++) {
        d2[ndata + v] = tmp[v];
        *m = *n;
        m->ninstr = 0;
        m->paired = false;
        if (v == 1) m->opd[0] = n->pair_in;
        m->dst = vref[v] = temp_ref(n, ndata + v, ne);
        st = eval_ref(p, i, m, d2);
    }
    float reg[IR_MAX_IN + 2 + IR_MAX_INSTR];
    int64_t c[4];
    for (c[3] = 0; !st && c[3] < ne[3]; c[3]++)
        for (c[2] = 0; c[2] < ne[2]; c[2]++)
            for (c[1] = 0; c[1] < ne[1]; c[1]++)
                for (c[0] = 0; c[0] < ne[0]; c[0]++) {
                    for (int k = 0; k < n->nin; k++)
                        reg[k] = n->by_id >> k & 1u ? by_id_load(n, k, data, c)
                                                   : kb_load_f32(data[n->in[k].buf], n->in[k].type, ir_offset_at(&n->in[k], c));
                    for (int v = 0; v < nv; v++)
                        reg[n->nin + v] = kb_load_f32(tmp[v], n->op_type, ir_offset_at(&vref[v], c));
                    float out = n->ninstr ? run_instrs(n, reg, n->nin + nv) : reg[n->nin];
                    kb_store_f32(data[n->dst.buf], n->dst.type, ir_offset_at(&n->dst, c), out);
                }
    free(tmp[0]), free(tmp[1]), free(d2), free(m);
    return st;
}

/* A fused node's reference evaluation with one intermediate: the buffers' data plus one more
 * slot, index nbufs, holding a temporary of `bytes`, and a node for the step that uses it. */
typedef struct {
    void    *tmp;
    void   **data;
    ir_node *m;
} eval_slot;

static void slot_close(eval_slot *s) { free(s->tmp), free(s->data), free(s->m); }

static kiln_status slot_open(const ir_prog *p, void **data, size_t bytes, eval_slot *s) {
    s->tmp = malloc(bytes ? bytes : 1);
    s->data = malloc(((size_t)p->nbufs + 1) * sizeof *s->data);
    s->m = malloc(sizeof *s->m);
    if (!s->tmp || !s->data || !s->m) {
        slot_close(s);
        return kb_oom();
    }
    memcpy(s->data, data, (size_t)p->nbufs * sizeof *s->data);
    s->data[p->nbufs] = s->tmp;
    return NULL;
}

/* rope_set_rows: the rope into a temporary of op_type, then set_rows from it, exactly as the
 * two unfused nodes compute. */
static kiln_status eval_scatter(const ir_prog *p, int i, void **data) {
    const ir_node *n = &p->nodes[i];
    const ir_ref  *x = ir_operand(n, 0);
    if (!x) return kb_error(KILN_ERR_INVALID, "reference: node %d: rope_set_rows without its rope input", i);
    const int64_t *ne = x->ne;
    eval_slot      sl;
    kiln_status    st = slot_open(p, data, (size_t)(ne[0] * ne[1] * ne[2] * ne[3]) * kiln_type_size(n->op_type), &sl);
    if (st) return st;
    ir_node *m = sl.m;
    *m = *n;
    m->fused = IR_FUSED_NONE;
    m->ninstr = 0;
    m->dst = temp_ref(n, p->nbufs, ne);
    st = eval_ref(p, i, m, sl.data);
    if (!st) {
        const int64_t *b = n->scatter.b_ne;
        ir_node        s = {.kind = IR_OP, .op = FE_OP_SET_ROWS, .dst = n->dst, .nin = 3};
        s.in[0] = n->in[n->scatter.a_in];
        s.in[1] = temp_ref(n, p->nbufs, b);
        s.in[2] = n->in[n->scatter.ids_in];
        for (int k = 0; k < FE_MAX_SRC; k++) s.opd[k] = k < 3 ? k : -1;
        *m = s;
        st = ir_ref_rows(p, m, sl.data);
    }
    slot_close(&sl);
    return st;
}

/* The product of node n (its epilogue, pairing included) with data[0..ndata). */
static kiln_status eval_product(const ir_prog *p, int i, const ir_node *n, void **data, int ndata) {
    return n->ninstr > 0 || n->paired ? eval_op_epilogue(p, i, n, data, ndata) : eval_ref(p, i, n, data);
}

/* rms_norm_gemv: the norm and its weight into a temporary column, each value rounded to f32 as
 * the unfused rms_norm_mul stored it, then the product reading it as b. */
static kiln_status eval_bnorm(const ir_prog *p, int i, void **data) {
    const ir_node *n = &p->nodes[i];
    const ir_ref  *x = ir_operand(n, 1), *w = &n->in[n->bnorm_w];
    int64_t        k = x->ne[0];
    eval_slot      sl;
    kiln_status    st = slot_open(p, data, (size_t)k * sizeof(float), &sl);
    if (st) return st;
    float *col = sl.tmp;
    ir_ref c = {.buf = p->nbufs, .type = KILN_F32, .ne = {k, 1, 1, 1}, .st = {1, k, k, k}};
    ir_node norm = {.kind = IR_OP, .op = FE_OP_RMS_NORM, .nin = 1, .dst = c};
    norm.in[0] = *x;
    for (int s = 0; s < FE_MAX_SRC; s++) norm.opd[s] = s == 0 ? 0 : -1;
    norm.fp[0] = n->bnorm_eps;
    st = eval_ref(p, i, &norm, sl.data);
    for (int64_t e = 0; !st && e < k; e++) col[e] *= kb_load_f32(data[w->buf], KILN_F32, w->offs + e * w->st[0]);
    if (!st) {
        *sl.m = *n;
        sl.m->bnorm = false;
        sl.m->in[sl.m->opd[1]] = c;
        st = eval_product(p, i, sl.m, sl.data, p->nbufs + 1);
    }
    slot_close(&sl);
    return st;
}

static kiln_status eval_op(const ir_prog *p, int i, void **data) {
    const ir_node *n = &p->nodes[i];
    switch (n->fused) {
    case IR_FUSED_TOPK_MOE: return ir_ref_moe(p, n, data);
    case IR_FUSED_ROPE_SET_ROWS: return eval_scatter(p, i, data);
    case IR_FUSED_NONE: break;
    }
    if (n->bnorm) return eval_bnorm(p, i, data);
    return eval_product(p, i, n, data, p->nbufs);
}

static void eval_ew(const ir_node *n, void **data) {
    float reg[IR_MAX_IN + IR_MAX_INSTR];
    const int64_t *ne = n->dst.ne;
    int64_t c[4];
    for (c[3] = 0; c[3] < ne[3]; c[3]++)
        for (c[2] = 0; c[2] < ne[2]; c[2]++)
            for (c[1] = 0; c[1] < ne[1]; c[1]++)
                for (c[0] = 0; c[0] < ne[0]; c[0]++) {
                    for (int k = 0; k < n->nin; k++)
                        reg[k] = kb_load_f32(data[n->in[k].buf], n->in[k].type, ir_offset_at(&n->in[k], c));
                    kb_store_f32(data[n->dst.buf], n->dst.type, ir_offset_at(&n->dst, c),
                                 run_instrs(n, reg, n->nin));
                }
}

kiln_status ir_eval(const ir_prog *p, void **data) {
    /* Callers fill each weight by name; a block's copy of its members is made here, as the
     * runtime's members are the block's memory itself. */
    for (int w = 0; w < p->nbufs; w++)
        if (p->bufs[w].block && p->bufs[w].bytes)
            memcpy((char *)data[p->bufs[w].block - 1] + p->bufs[w].offset, data[w], p->bufs[w].bytes);
    for (int i = 0; i < p->nnodes; i++) {
        const ir_node *n = &p->nodes[i];
        if (n->dead) continue;
        switch (n->kind) {
        case IR_EW: eval_ew(n, data); break;
        case IR_OP: {
            kiln_status st = eval_op(p, i, data);
            if (st) return st;
            break;
        }
        default: return kb_error(KILN_ERR_INVALID, "reference: node %d has an unknown kind", i);
        }
    }
    return NULL;
}

kiln_status kiln_reference(const kiln_graph *g, kiln_ref_get_fn get, kiln_ref_put_fn put, void *user) {
    if (!g || !get || !put) return kb_error(KILN_ERR_INVALID, "kiln_reference: NULL argument");
    ir_prog *p;
    kiln_status st = ir_lower(g, &p);
    if (st) return st;
    void **data = calloc((size_t)p->nbufs + 1, sizeof *data);
    if (!data) st = kb_oom();
    for (int b = 0; !st && b < p->nbufs; b++) {
        const ir_buf *buf = &p->bufs[b];
        data[b] = malloc(buf->bytes ? buf->bytes : 1);
        if (!data[b]) {
            st = kb_error(KILN_ERR_NOMEM, "reference: cannot allocate %zu bytes for '%s'", buf->bytes,
                          buf->name);
            break;
        }
        if (buf->kind != IR_BUF_INPUT && buf->kind != IR_BUF_WEIGHT && buf->kind != IR_BUF_STATE) continue;
        int64_t n = buf->ne[0] * buf->ne[1] * buf->ne[2] * buf->ne[3];
        const void *src = get(user, buf->name, buf->type, n);
        if (!src) st = kb_error(KILN_ERR_NOT_FOUND, "reference: no data for %s '%s'",
                                buf->kind == IR_BUF_INPUT    ? "input"
                                : buf->kind == IR_BUF_WEIGHT ? "weight"
                                                             : "state",
                                buf->name);
        else memcpy(data[b], src, buf->bytes);
    }
    if (!st) st = ir_eval(p, data);
    for (int b = 0; !st && b < p->nbufs; b++) {
        const ir_buf *buf = &p->bufs[b];
        if (buf->kind == IR_BUF_OUTPUT || buf->kind == IR_BUF_STATE)
            put(user, buf->name, buf->type, buf->ne[0] * buf->ne[1] * buf->ne[2] * buf->ne[3], data[b]);
    }
    for (int b = 0; data && b < p->nbufs; b++) free(data[b]);
    free(data);
    ir_prog_free(p);
    return st;
}
