/* Deterministic text form of the IR: stable numbering, names from the graph, no pointers, so
 * tests and bug reports can diff it. */
#include "ir_internal.h"

static const char *kind_name(ir_buf_kind k) {
    static const char *n[] = {"input", "weight", "output", "temp", "state", "block"};
    return n[k];
}

static void print_shape(kb_str *o, kiln_type t, const int64_t ne[4]) {
    int dims = 1;
    for (int d = 1; d < 4; d++)
        if (ne[d] != 1) dims = d + 1;
    kb_str_addf(o, "%s[", kiln_type_name(t));
    for (int d = 0; d < dims; d++) kb_str_addf(o, "%s%lld", d ? ", " : "", (long long)ne[d]);
    kb_str_add(o, "]");
}

static void print_ref(kb_str *o, const ir_prog *p, const ir_ref *r) {
    kb_str_addf(o, "b%d ", r->buf);
    print_shape(o, r->type, r->ne);
    if (!ir_ref_is_natural(p, r))
        kb_str_addf(o, " strides [%lld, %lld, %lld, %lld] offset %lld", (long long)r->st[0],
                    (long long)r->st[1], (long long)r->st[2], (long long)r->st[3], (long long)r->offs);
}

/* Registers: in<k> operands; IR_OP epilogues also "op" (the op's value, register nin). */
static void print_reg(kb_str *o, const ir_node *n, int r) {
    int nv = n->kind == IR_OP ? ir_op_values(n) : 0;
    if (r < n->nin) kb_str_addf(o, "in%d", r);
    else if (r < n->nin + nv) kb_str_add(o, r == n->nin ? "op" : "op2");
    else kb_str_addf(o, "r%d", r - n->nin - nv);
}

/* What a fused node computes beyond its op: the paired weight, topk_moe, rope_set_rows. */
static void print_fused(kb_str *o, const ir_prog *p, const ir_node *n) {
    if (n->paired) {
        kb_str_addf(o, "    paired in%d (op2 = the op with it as weight) ", n->pair_in);
        print_ref(o, p, &n->in[n->pair_in]);
        kb_str_add(o, "\n");
    }
    if (n->bnorm) {
        char eps[32];
        kb_format_float(n->bnorm_eps, eps);
        kb_str_addf(o, "    b normalized: rms_norm(b, eps=%s) * in%d ", eps, n->bnorm_w);
        print_ref(o, p, &n->in[n->bnorm_w]);
        kb_str_add(o, "\n");
    }
    if (n->has_dst2) {
        kb_str_add(o, "    dst2 ");
        print_ref(o, p, &n->dst2);
        kb_str_add(o, "\n");
    }
    if (n->fused == IR_FUSED_TOPK_MOE) {
        const ir_moe *m = &n->moe;
        char lo[32], hi[32], sc[32];
        kb_format_float(m->clamp_lo, lo), kb_format_float(m->clamp_hi, hi), kb_format_float(m->scale, sc);
        kb_str_addf(o, "    topk_moe k=%d gating=%s%s", m->k, m->gating == IR_GATE_SIGMOID ? "sigmoid" : "softmax",
                    m->delayed ? " (delayed: top-k of logits, softmax of the selected)" : "");
        if (m->bias_in >= 0) kb_str_addf(o, ", selection bias in%d", m->bias_in);
        if (m->norm) kb_str_add(o, ", normalized");
        if (m->clamp) kb_str_addf(o, " (sum clamped to [%s, %s])", lo, hi);
        if (m->scaled) kb_str_addf(o, ", scale=%s", sc);
        kb_str_addf(o, " : %s\n", kiln_type_name(n->op_type));
    }
    if (n->fused == IR_FUSED_ROPE_SET_ROWS) {
        const int64_t *b = n->scatter.b_ne;
        kb_str_addf(o, "    set_rows a=in%d ids=in%d, rope result (%s) as rows [%lld, %lld, %lld, %lld]\n",
                    n->scatter.a_in, n->scatter.ids_in, kiln_type_name(n->op_type), (long long)b[0], (long long)b[1],
                    (long long)b[2], (long long)b[3]);
        for (int k = 0; k < 2; k++) {
            int in = k ? n->scatter.ids_in : n->scatter.a_in;
            kb_str_addf(o, "    in%d ", in);
            print_ref(o, p, &n->in[in]);
            kb_str_add(o, "\n");
        }
    }
}

/* IR_OP: the operands by parameter name, then the scalar parameters. */
static void print_op(kb_str *o, const ir_prog *p, const ir_node *n) {
    const fe_sig *sig = fe_op_sig(n->op);
    for (int i = 0; i < sig->n; i++) {
        const fe_param *q = &sig->p[i];
        if (q->kind != FE_P_TENSOR || !ir_operand(n, q->slot)) continue;
        kb_str_addf(o, "    in%d %s ", n->opd[q->slot], q->name);
        print_ref(o, p, ir_operand(n, q->slot));
        kb_str_add(o, "\n");
    }
    bool any = false;
    for (int i = 0; i < sig->n; i++) {
        const fe_param *q = &sig->p[i];
        if (q->kind == FE_P_TENSOR || q->kind == FE_P_LIST) continue;
        kb_str_addf(o, "%s%s=", any ? ", " : "    params ", q->name);
        any = true;
        char s[32];
        switch (q->kind) {
        case FE_P_FLOAT: kb_format_float(n->fp[q->slot], s); kb_str_add(o, s); break;
        case FE_P_BOOL: kb_str_add(o, n->ip[q->slot] ? "true" : "false"); break;
        case FE_P_TYPE: kb_str_add(o, kiln_type_name((kiln_type)n->ip[q->slot])); break;
        case FE_P_ENUM:
            if (n->ip[q->slot] >= 0 && n->ip[q->slot] < q->nenum) kb_str_add(o, q->enums[n->ip[q->slot]]);
            else kb_str_addf(o, "%d", (int)n->ip[q->slot]);
            break;
        case FE_P_INT4:
            kb_str_addf(o, "[%d, %d, %d, %d]", (int)n->ip[q->slot], (int)n->ip[q->slot + 1],
                        (int)n->ip[q->slot + 2], (int)n->ip[q->slot + 3]);
            break;
        default: kb_str_addf(o, "%d", (int)n->ip[q->slot]); break;
        }
    }
    if (any) kb_str_add(o, "\n");
}

/* The elementwise instructions of an IR_EW node or of an IR_OP node's epilogue. */
static void print_instrs(kb_str *o, const ir_node *n) {
    for (int i = 0; i < n->ninstr; i++) {
        const ir_instr *in = &n->ins[i];
        kb_str_addf(o, "    r%d = %s ", i, fe_ops[in->op].name);
        print_reg(o, n, in->a);
        if (fe_ops[in->op].nsrc > 1) {
            kb_str_add(o, ", ");
            print_reg(o, n, in->b);
        }
        for (int f = 0; f < fe_op_sig(in->op)->nfloat; f++) {
            char s[32];
            kb_format_float(in->f[f], s);
            kb_str_addf(o, ", %s", s);
        }
        kb_str_addf(o, " : %s\n", kiln_type_name(in->type));
    }
}

static void print_node(kb_str *o, const ir_prog *p, int idx, int k) {
    const ir_node *n = &p->nodes[idx];
    const char    *tail = n->host ? "+" : "";
    if (n->kind == IR_OP) kb_str_addf(o, "k%d%s %s", k, tail, fe_ops[n->op].name);
    else kb_str_addf(o, "k%d%s ew", k, tail);
    if (n->fusion) kb_str_addf(o, " fused %s", n->fusion);
    if (n->host)
        kb_str_addf(o, p->nodes[n->host - 1].op == FE_OP_MUL_MAT ? " (computed by k%d's store: gemv_rope)"
                                                                 : " (computed by k%d: head_rope)", k);
    kb_str_add(o, " nodes:");
    for (int i = 0; i < n->nsrc; i++) kb_str_addf(o, "%s%s", i ? ", " : " ", ir_node_name(p, n->src[i]));
    kb_str_add(o, "\n    dst ");
    print_ref(o, p, &n->dst);
    kb_str_add(o, "\n");
    if (n->kind == IR_OP) {
        print_op(o, p, n);
        print_fused(o, p, n);
        if (n->ninstr) kb_str_addf(o, "    epilogue (op : %s):\n", kiln_type_name(n->op_type));
        for (int k = 0; n->ninstr && k < n->nin; k++) {
            kb_str_addf(o, "    in%d ", k);
            print_ref(o, p, &n->in[k]);
            kb_str_add(o, n->by_id >> k & 1u ? " (rows by ids)\n" : "\n");
        }
        print_instrs(o, n);
        return;
    }
    for (int i = 0; i < n->nin; i++) {
        kb_str_addf(o, "    in%d ", i);
        print_ref(o, p, &n->in[i]);
        kb_str_add(o, "\n");
    }
    print_instrs(o, n);
}

/* Kernels are numbered over the nodes that launch one, in order; a tail (pass gemv_rope) has
 * its host's number. */
static int kernel_number(const ir_prog *p, int node) {
    int k = 0;
    if (p->nodes[node].host) node = p->nodes[node].host - 1;
    for (int i = 0; i < node; i++) k += ir_launches(p, i);
    return k;
}

/* Whether node i is the host of tails (pass gemv_rope). */
static bool hosts_tails(const ir_prog *p, int i) { return ir_next_tail(p, i, i) >= 0; }

static void add_sources(kb_str *o, const ir_prog *p, const ir_node *n, const char **sep) {
    for (int s = 0; s < n->nsrc; s++, *sep = ", ") kb_str_addf(o, "%s%s", *sep, ir_node_name(p, n->src[s]));
}

/* One line per fused kernel, "fused NAME: node, node, ...", in graph node names. */
static void print_fusions(kb_str *o, const ir_prog *p) {
    int n = 0;
    for (int i = 0; i < p->nnodes; i++) n += !p->nodes[i].dead && (p->nodes[i].fusion || hosts_tails(p, i));
    kb_str_addf(o, "fusions: %d\n", n);
    for (int i = 0; i < p->nnodes; i++) {
        const ir_node *f = &p->nodes[i];
        if (f->dead || !f->fusion) continue;
        kb_str_addf(o, "  fused %s:", f->fusion);
        for (int s = 0; s < f->nsrc; s++) kb_str_addf(o, "%s%s", s ? ", " : " ", ir_node_name(p, f->src[s]));
        kb_str_add(o, "\n");
    }
    for (int i = 0; i < p->nnodes; i++) {
        if (p->nodes[i].dead || !hosts_tails(p, i)) continue;
        kb_str_add(o, p->nodes[i].op == FE_OP_MUL_MAT ? "  fused gemv_rope:" : "  fused head_rope:");
        const char *sep = " ";
        add_sources(o, p, &p->nodes[i], &sep);
        for (int j = ir_next_tail(p, i, i); j >= 0; j = ir_next_tail(p, i, j)) add_sources(o, p, &p->nodes[j], &sep);
        kb_str_add(o, "\n");
    }
}

void ir_print(const ir_prog *p, kb_str *o) {
    print_fusions(o, p);
    kb_str_add(o, "buffers:\n");
    for (int b = 0; b < p->nbufs; b++) {
        const ir_buf *buf = &p->bufs[b];
        if (buf->kind == IR_BUF_TEMP && buf->first < 0 && ir_node_writing(p, b) < 0) continue;
        kb_str_addf(o, "  b%d %-6s %s ", b, kind_name(buf->kind), buf->name);
        print_shape(o, buf->type, buf->ne);
        kb_str_addf(o, " %zu bytes", buf->bytes);
        if (buf->block) kb_str_addf(o, " in b%d at +%zu", buf->block - 1, buf->offset);
        if (buf->kind == IR_BUF_TEMP && buf->first >= 0)
            kb_str_addf(o, " at arena+%zu live k%d..k%d", buf->offset, kernel_number(p, buf->first),
                        kernel_number(p, buf->last));
        kb_str_add(o, "\n");
    }
    kb_str_add(o, "kernels:\n");
    int k = 0;
    for (int i = 0; i < p->nnodes; i++) {
        if (p->nodes[i].dead) continue;
        print_node(o, p, i, p->nodes[i].host ? k - 1 : k);
        k += !p->nodes[i].host;
    }
    kb_str_addf(o, "arena: %zu bytes\n", p->arena_bytes);
}
