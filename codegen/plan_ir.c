/* The lowered IR inside a serialized program (codegen/plan.c): buffers, nodes and the arena size,
 * field by field, so that a program-cache hit takes the IR as it was compiled instead of
 * lowering the graph and running every pass again. (Qwen3-30B-A3B, 3567 graph nodes: lowering
 * and the passes of the general and the n_tokens = 1 programs were most of a 110 ms warm start;
 * issue 29 asks 50.) Reading checks every count, enum and index it can and then ir_verify's
 * invariants, so a damaged plan is an error, never a crash. */
#include "codegen/codegen.h"

#include <stdlib.h>
#include <string.h>

/* ---- writing ----------------------------------------------------------------------------- */

static void put_f32(kb_str *b, float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    kb_put_u32(b, u);
}

static void put_i(kb_str *b, int64_t v) { kb_put_u64(b, (uint64_t)v); }

static void put_ref(kb_str *b, const ir_ref *r) {
    put_i(b, r->buf);
    kb_put_u32(b, (uint32_t)r->type);
    for (int d = 0; d < 4; d++) put_i(b, r->ne[d]);
    for (int d = 0; d < 4; d++) put_i(b, r->st[d]);
    put_i(b, r->offs);
    for (int d = 0; d < 4; d++) kb_put_u32(b, r->sym[d]);
}

static void put_buf(kb_str *b, const ir_buf *x) {
    kb_put_u32(b, (uint32_t)x->kind);
    kb_put_u32(b, (uint32_t)x->type);
    for (int d = 0; d < 4; d++) put_i(b, x->ne[d]);
    for (int d = 0; d < 4; d++) kb_put_u32(b, x->sym[d]);
    kb_put_u64(b, x->bytes);
    kb_put_cstr(b, x->name);
    kb_put_u64(b, x->offset);
    put_i(b, x->block);
    put_i(b, x->first);
    put_i(b, x->last);
}

static void put_moe(kb_str *b, const ir_moe *m) {
    kb_put_u32(b, (uint32_t)m->gating);
    kb_put_u32(b, (uint32_t)m->delayed | (uint32_t)m->norm << 1 | (uint32_t)m->clamp << 2 | (uint32_t)m->scaled << 3);
    put_i(b, m->k);
    put_i(b, m->bias_in);
    put_f32(b, m->clamp_lo);
    put_f32(b, m->clamp_hi);
    put_f32(b, m->scale);
}

static void put_node(kb_str *b, const ir_node *n) {
    kb_put_u32(b, (uint32_t)n->kind);
    kb_put_u32(b, (uint32_t)n->dead | (uint32_t)n->paired << 1 | (uint32_t)n->bnorm << 2 | (uint32_t)n->has_dst2 << 3);
    put_ref(b, &n->dst);
    put_i(b, n->nin);
    for (int k = 0; k < n->nin; k++) put_ref(b, &n->in[k]);
    put_i(b, n->ninstr);
    for (int j = 0; j < n->ninstr; j++) {
        const ir_instr *in = &n->ins[j];
        kb_put_u32(b, (uint32_t)in->op);
        put_i(b, in->a);
        put_i(b, in->b);
        put_f32(b, in->f[0]);
        put_f32(b, in->f[1]);
        kb_put_u32(b, (uint32_t)in->type);
    }
    kb_put_u32(b, (uint32_t)n->op);
    for (int i = 0; i < FE_MAX_IP; i++) put_i(b, n->ip[i]);
    for (int i = 0; i < FE_MAX_FP; i++) put_f32(b, n->fp[i]);
    for (int i = 0; i < FE_MAX_SRC; i++) put_i(b, n->opd[i]);
    kb_put_u32(b, (uint32_t)n->op_type);
    put_i(b, n->pair_in);
    put_i(b, n->bnorm_w);
    put_f32(b, n->bnorm_eps);
    kb_put_u32(b, n->by_id);
    kb_put_u32(b, (uint32_t)n->fused);
    put_moe(b, &n->moe);
    put_i(b, n->scatter.a_in);
    put_i(b, n->scatter.ids_in);
    for (int d = 0; d < 4; d++) put_i(b, n->scatter.b_ne[d]);
    if (n->has_dst2) put_ref(b, &n->dst2);
    put_i(b, n->host);
    put_i(b, n->nsrc);
    for (int i = 0; i < n->nsrc; i++) put_i(b, n->src[i]);
    kb_put_u32(b, n->fusion != NULL);
    if (n->fusion) kb_put_cstr(b, n->fusion);
}

void cg_ir_write(kb_str *b, const ir_prog *p) {
    put_i(b, p->nbufs);
    for (int i = 0; i < p->nbufs; i++) put_buf(b, &p->bufs[i]);
    put_i(b, p->nnodes);
    for (int i = 0; i < p->nnodes; i++) put_node(b, &p->nodes[i]);
    kb_put_u64(b, p->arena_bytes);
}

/* ---- reading ----------------------------------------------------------------------------- */

/* The reader and what a value read must lie within: the first value out of range sets err
 * (as a truncation does), and reading goes on harmlessly to the end. */
typedef struct {
    kb_reader *r;
    int        ndims; /* the graph's symbolic dims (sym values 0 .. ndims) */
    const char *bad;
} ir_rd;

static int64_t get_i(ir_rd *x, int64_t lo, int64_t hi, const char *what) {
    int64_t v = (int64_t)kb_get_u64(x->r, what);
    if (!x->r->err && !x->bad && (v < lo || v > hi)) x->bad = what;
    return x->bad ? lo : v;
}

static uint32_t get_u(ir_rd *x, uint32_t hi, const char *what) {
    uint32_t v = kb_get_u32(x->r, what);
    if (!x->r->err && !x->bad && v > hi) x->bad = what;
    return x->bad ? 0 : v;
}

static float get_f32(ir_rd *x, const char *what) {
    uint32_t u = kb_get_u32(x->r, what);
    float    f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#define BIG ((int64_t)1 << 48)

static void get_ref(ir_rd *x, ir_ref *r) {
    r->buf = (int)get_i(x, -1, INT32_MAX, "IR ref buffer");
    r->type = (kiln_type)get_u(x, KILN_TYPE_COUNT - 1, "IR ref type");
    for (int d = 0; d < 4; d++) r->ne[d] = get_i(x, 1, BIG, "IR ref extent");
    for (int d = 0; d < 4; d++) r->st[d] = get_i(x, 0, BIG, "IR ref stride");
    r->offs = get_i(x, 0, BIG, "IR ref offset");
    for (int d = 0; d < 4; d++) r->sym[d] = (uint8_t)get_u(x, (uint32_t)x->ndims, "IR ref symbolic dim");
    /* the furthest element stays far inside int64 (ir_verify computes it) */
    double far = (double)r->offs;
    for (int d = 0; d < 4; d++) far += (double)(r->ne[d] - 1) * (double)r->st[d];
    if (!x->bad && far > (double)((int64_t)1 << 52)) x->bad = "IR ref extent";
}

static void get_buf(ir_rd *x, ir_buf *b) {
    b->kind = (ir_buf_kind)get_u(x, IR_BUF_BLOCK, "IR buffer kind");
    b->type = (kiln_type)get_u(x, KILN_TYPE_COUNT - 1, "IR buffer type");
    for (int d = 0; d < 4; d++) b->ne[d] = get_i(x, 1, BIG, "IR buffer extent");
    for (int d = 0; d < 4; d++) b->sym[d] = (uint8_t)get_u(x, (uint32_t)x->ndims, "IR buffer symbolic dim");
    b->bytes = (size_t)kb_get_u64(x->r, "IR buffer bytes");
    kb_get_str_into(x->r, b->name, sizeof b->name, "IR buffer name");
    b->offset = (size_t)kb_get_u64(x->r, "IR buffer offset");
    b->block = (int)get_i(x, 0, INT32_MAX, "IR buffer block");
    b->first = (int)get_i(x, -1, INT32_MAX, "IR buffer first node");
    b->last = (int)get_i(x, -1, INT32_MAX, "IR buffer last node");
    /* the size ir_add_buf gives every buffer (no product can overflow: extents < 2^48, and a
     * product past 2^62 is refused) */
    if (x->bad || x->r->err) return;
    double n = (double)b->ne[1] * (double)b->ne[2] * (double)b->ne[3];
    if (n * (double)b->ne[0] > (double)((int64_t)1 << 50) ||
        b->bytes != kiln_row_size(b->type, b->ne[0]) * (size_t)(b->ne[1] * b->ne[2] * b->ne[3]))
        x->bad = "IR buffer size";
}

static void get_moe(ir_rd *x, ir_moe *m) {
    m->gating = (ir_gate)get_u(x, IR_GATE_SIGMOID, "IR moe gating");
    uint32_t f = get_u(x, 15, "IR moe flags");
    m->delayed = f & 1, m->norm = f >> 1 & 1, m->clamp = f >> 2 & 1, m->scaled = f >> 3 & 1;
    m->k = (int)get_i(x, 0, INT32_MAX, "IR moe k");
    m->bias_in = (int)get_i(x, -1, IR_MAX_IN - 1, "IR moe bias operand");
    m->clamp_lo = get_f32(x, "IR moe clamp");
    m->clamp_hi = get_f32(x, "IR moe clamp");
    m->scale = get_f32(x, "IR moe scale");
}

/* Node i; a fusion name goes to *pool (offset + 1 in *fusion_at, 0 for none). */
static void get_node(ir_rd *x, ir_node *n, kb_str *pool, size_t *fusion_at) {
    n->kind = (ir_kind)get_u(x, IR_OP, "IR node kind");
    uint32_t f = get_u(x, 15, "IR node flags");
    n->dead = f & 1, n->paired = f >> 1 & 1, n->bnorm = f >> 2 & 1, n->has_dst2 = f >> 3 & 1;
    get_ref(x, &n->dst);
    n->nin = (int)get_i(x, 0, IR_MAX_IN, "IR node operand count");
    for (int k = 0; k < n->nin; k++) get_ref(x, &n->in[k]);
    n->ninstr = (int)get_i(x, 0, IR_MAX_INSTR, "IR node instruction count");
    for (int j = 0; j < n->ninstr; j++) {
        ir_instr *in = &n->ins[j];
        in->op = (fe_op)get_u(x, FE_OP_COUNT - 1, "IR instruction op");
        in->a = (int)get_i(x, -1, IR_MAX_IN + IR_MAX_INSTR + 2, "IR instruction register");
        in->b = (int)get_i(x, -1, IR_MAX_IN + IR_MAX_INSTR + 2, "IR instruction register");
        in->f[0] = get_f32(x, "IR instruction constant");
        in->f[1] = get_f32(x, "IR instruction constant");
        in->type = (kiln_type)get_u(x, KILN_TYPE_COUNT - 1, "IR instruction type");
    }
    n->op = (fe_op)get_u(x, FE_OP_COUNT - 1, "IR node op");
    for (int i = 0; i < FE_MAX_IP; i++) n->ip[i] = (int32_t)get_i(x, INT32_MIN, INT32_MAX, "IR node parameter");
    for (int i = 0; i < FE_MAX_FP; i++) n->fp[i] = get_f32(x, "IR node parameter");
    for (int i = 0; i < FE_MAX_SRC; i++) n->opd[i] = (int)get_i(x, -1, IR_MAX_IN - 1, "IR node operand slot");
    n->op_type = (kiln_type)get_u(x, KILN_TYPE_COUNT, "IR node op type");
    n->pair_in = (int)get_i(x, -1, IR_MAX_IN - 1, "IR node paired operand");
    n->bnorm_w = (int)get_i(x, -1, IR_MAX_IN - 1, "IR node norm weight");
    n->bnorm_eps = get_f32(x, "IR node norm epsilon");
    n->by_id = kb_get_u32(x->r, "IR node operands by id");
    n->fused = (ir_fused)get_u(x, IR_FUSED_ROPE_SET_ROWS, "IR node fusion kind");
    get_moe(x, &n->moe);
    n->scatter.a_in = (int)get_i(x, -1, IR_MAX_IN - 1, "IR scatter operand");
    n->scatter.ids_in = (int)get_i(x, -1, IR_MAX_IN - 1, "IR scatter operand");
    for (int d = 0; d < 4; d++) n->scatter.b_ne[d] = get_i(x, 0, BIG, "IR scatter extent");
    if (n->has_dst2) get_ref(x, &n->dst2);
    n->host = (int)get_i(x, 0, INT32_MAX, "IR node host");
    n->nsrc = (int)get_i(x, 0, IR_MAX_INSTR, "IR node source count");
    for (int i = 0; i < n->nsrc; i++) n->src[i] = (int)get_i(x, 0, INT32_MAX, "IR node source");
    *fusion_at = 0;
    if (get_u(x, 1, "IR node fusion flag")) {
        char name[64];
        kb_get_str_into(x->r, name, sizeof name, "IR node fusion");
        *fusion_at = pool->len + 1;
        kb_str_addn(pool, name, strlen(name) + 1);
    }
}

/* What ir_verify leaves to the reader: every buffer index, and the memory plan inside the
 * arena. */
static const char *check_indices(const ir_prog *p) {
    for (int i = 0; i < p->nnodes; i++) {
        const ir_node *n = &p->nodes[i];
        if (n->dst.buf < 0 || n->dst.buf >= p->nbufs) return "IR node destination";
        for (int k = 0; k < n->nin; k++)
            if (n->in[k].buf < 0 || n->in[k].buf >= p->nbufs) return "IR node operand buffer";
        if (n->has_dst2 && (n->dst2.buf < 0 || n->dst2.buf >= p->nbufs)) return "IR node second destination";
        if (n->host > i) return "IR node host";
    }
    for (int i = 0; i < p->nbufs; i++) {
        const ir_buf *b = &p->bufs[i];
        if (b->block > p->nbufs || b->first >= p->nnodes || b->last >= p->nnodes) return "IR buffer index";
        if (b->kind == IR_BUF_TEMP && b->first >= 0 && (b->offset > p->arena_bytes || b->bytes > p->arena_bytes - b->offset))
            return "IR buffer placement";
    }
    return NULL;
}

/* The fewest bytes a buffer and a node take in a plan (put_buf, put_node): a count that more
 * bytes than are left would need is damage, refused before anything is allocated for it. */
#define MIN_BUF_BYTES 100
#define MIN_NODE_BYTES 120

static int64_t get_count(ir_rd *x, size_t each, const char *what) {
    int64_t n = get_i(x, 0, 1 << 24, what);
    if (!x->bad && !x->r->err && (uint64_t)n > (x->r->len - x->r->pos) / each) x->bad = what;
    return x->bad ? 0 : n;
}

static kiln_status read_ir(ir_rd *x, ir_prog *p) {
    int64_t nb = get_count(x, MIN_BUF_BYTES, "IR buffer count");
    if (x->bad || x->r->err) return NULL;
    if (nb && !(p->bufs = calloc((size_t)nb, sizeof *p->bufs))) return kb_oom();
    p->nbufs = p->capbufs = (int)nb;
    for (int i = 0; i < p->nbufs; i++) get_buf(x, &p->bufs[i]);
    int64_t nn = get_count(x, MIN_NODE_BYTES, "IR node count");
    if (x->bad || x->r->err) return NULL;
    if (nn && !(p->nodes = calloc((size_t)nn, sizeof *p->nodes))) return kb_oom();
    size_t *at = calloc((size_t)nn + 1, sizeof *at);
    kb_str  pool = {0};
    if (!at) return kb_oom();
    p->nnodes = p->capnodes = (int)nn;
    for (int i = 0; i < p->nnodes && !x->bad && !x->r->err; i++) get_node(x, &p->nodes[i], &pool, &at[i]);
    p->arena_bytes = (size_t)kb_get_u64(x->r, "IR arena size");
    kiln_status st = pool.oom ? kb_oom() : NULL;
    if (!st) { /* the fusion names, in one block the program owns */
        p->pool = pool.s, pool.s = NULL;
        for (int i = 0; i < p->nnodes; i++) p->nodes[i].fusion = at[i] ? p->pool + at[i] - 1 : NULL;
    }
    kb_str_free(&pool);
    free(at);
    return st;
}

kiln_status cg_ir_read(kb_reader *r, const kiln_graph *g, ir_prog **out) {
    *out = NULL;
    ir_prog *p = calloc(1, sizeof *p);
    if (!p) return kb_oom();
    p->g = g;
    ir_rd       x = {.r = r, .ndims = g->ctx->ndims};
    kiln_status st = read_ir(&x, p);
    if (!st && !r->err && !x.bad) x.bad = check_indices(p);
    if (!st && !r->err && x.bad) st = kb_error(KILN_ERR_FORMAT, "program IR: %s out of range", x.bad);
    if (!st && !r->err) {
        st = ir_verify(p);
        if (st) st = kb_wrap(st, "program IR");
    }
    if (st || r->err) {
        ir_prog_free(p);
        return st;
    }
    *out = p;
    return NULL;
}
