/* Shape inference, lowering, the elementwise fusion pass, the memory plan and the CPU reference. */
#include "tests/support.h"

#include "ir/ir.h"
#include "codegen/codegen.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------------------------ */

static ir_prog *lower_text(const char *text, kiln_ctx **ctx, kiln_graph **g, bool fuse) {
    *ctx = ts_parse(text);
    TS_OK(kiln_graph_new(*ctx, g));
    ir_prog *p;
    TS_OK(ir_lower(*g, &p));
    TS_OK(ir_run_passes(p, fuse, NULL));
    return p;
}

static int live_nodes(const ir_prog *p) {
    int n = 0;
    for (int i = 0; i < p->nnodes; i++) n += !p->nodes[i].dead;
    return n;
}

static const ir_node *live_node(const ir_prog *p, int k) {
    for (int i = 0; i < p->nnodes; i++)
        if (!p->nodes[i].dead && k-- == 0) return &p->nodes[i];
    return NULL;
}

static void free_all(ir_prog *p, kiln_graph *g, kiln_ctx *ctx) {
    ir_prog_free(p);
    ts_graph_free(g, ctx);
}

/* Host buffers for p; temporaries placed in one arena by the memory plan when use_arena. */
static void **alloc_bufs(const ir_prog *p, bool use_arena, void **arena, uint64_t seed) {
    void **data = calloc((size_t)p->nbufs, sizeof *data);
    *arena = use_arena ? calloc(1, p->arena_bytes + 1) : NULL;
    for (int b = 0; b < p->nbufs; b++) {
        const ir_buf *buf = &p->bufs[b];
        if (use_arena && buf->kind == IR_BUF_TEMP && buf->first >= 0) data[b] = (char *)*arena + buf->offset;
        else data[b] = calloc(1, buf->bytes + 1);
        if (buf->kind == IR_BUF_INPUT || buf->kind == IR_BUF_WEIGHT)
            kb_fill_random(data[b], buf->type, (int64_t)(buf->bytes / kiln_type_size(buf->type)), seed + (uint64_t)b);
    }
    return data;
}

static void free_bufs(const ir_prog *p, void **data, void *arena) {
    for (int b = 0; b < p->nbufs; b++)
        if (!(arena && p->bufs[b].kind == IR_BUF_TEMP && p->bufs[b].first >= 0)) free(data[b]);
    free(data);
    free(arena);
}

static int find_buf(const ir_prog *p, const char *name) {
    for (int b = 0; b < p->nbufs; b++)
        if (!strcmp(p->bufs[b].name, name)) return b;
    return -1;
}

/* ---- shape inference ---------------------------------------------------------------------- */

static void expect_build_error(const char *text, const char *needle) {
    kiln_ctx *ctx = kiln_ctx_new();
    kiln_status st = kiln_parse(ctx, text, strlen(text), "test.kg");
    ck_assert_msg(st != NULL, "expected an error containing '%s'", needle);
    ck_assert_msg(strstr(kiln_status_msg(st), needle), "message '%s' lacks '%s'", kiln_status_msg(st), needle);
    kiln_status_free(st);
    kiln_ctx_free(ctx);
}

START_TEST(shape_errors) {
    expect_build_error("input a: f32[3, 4]\ninput b: f32[4, 4]\noutput c = add(a, b)\n", "cannot broadcast");
    expect_build_error("input a: f32[3, 4]\ninput b: f32[4, 4]\noutput c = add(a, b)\n", "test.kg:3:");
    expect_build_error("input a: f32[3, 4]\nt = transpose(a)\nr = reshape(t, [12])\n", "not contiguous");
    expect_build_error("input a: f32[3, 4]\nr = reshape(a, [13])\n", "12 elements");
    expect_build_error("input a: f32[3, 4]\nv = view(a, [3, 4], [12], 4)\n", "reaches byte");
    expect_build_error("input a: f32[3, 4]\nv = view(a, [3], [], 2)\n", "multiple");
    expect_build_error("input a: f32[3, 4]\np = permute(a, 0, 0, 1, 2)\n", "permutation");
    expect_build_error("input a: i32[3, 4]\noutput s = silu(a)\n", "f32, f16 or bf16");
}
END_TEST

START_TEST(builder_errors_are_sticky) {
    kiln_ctx *ctx = kiln_ctx_new();
    int64_t ne_a[2] = {3, 4}, ne_b[2] = {4, 4};
    kiln_tensor *a = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "a", 2, ne_a);
    kiln_tensor *b = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "b", 2, ne_b);
    kiln_tensor *c = kiln_add(ctx, a, b);
    ck_assert_ptr_null(c);
    ck_assert_ptr_null(kiln_silu(ctx, c));
    ck_assert_ptr_null(kiln_neg(ctx, a)); /* after an error, nothing more is built */
    kiln_graph *g = NULL;
    kiln_status st = kiln_graph_new(ctx, &g);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_SHAPE);
    ck_assert_ptr_nonnull(strstr(kiln_status_msg(st), "add"));
    ck_assert_ptr_null(g);
    kiln_status_free(st);
    kiln_ctx_free(ctx);
}
END_TEST

START_TEST(api_argument_errors) {
    kiln_ctx *ctx = kiln_ctx_new();
    int64_t ne[5] = {1, 2, 3, 4, 5};
    ck_assert_ptr_null(kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "x", 5, ne));
    ts_ctx_error(ctx, 0, "1 to 4");

    ctx = kiln_ctx_new();
    ck_assert_ptr_null(kiln_new_tensor(ctx, KILN_ROLE_OUTPUT, KILN_F32, "x", 1, ne));
    kiln_ctx_free(ctx);

    ctx = kiln_ctx_new();
    kiln_tensor *x = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "x", 1, ne);
    ck_assert_ptr_nonnull(x);
    kiln_graph *g;
    kiln_status st = kiln_graph_new(ctx, &g); /* no output */
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(kiln_status_msg(st), "no outputs"));
    kiln_status_free(st);
    kiln_ctx_free(ctx);
}
END_TEST

START_TEST(broadcast_shapes) {
    kiln_ctx *ctx = ts_parse("input a: f32[8, 6, 4]\nweight w: f16[8, 1, 2]\noutput y = mul(a, w)\n");
    kiln_tensor *y = fe_find(ctx, "y");
    ck_assert_int_eq(kiln_tensor_ne(y, 0), 8);
    ck_assert_int_eq(kiln_tensor_ne(y, 1), 6);
    ck_assert_int_eq(kiln_tensor_ne(y, 2), 4);
    ck_assert_int_eq(kiln_tensor_type(y), KILN_F32);
    ck_assert_int_eq(kiln_tensor_nb(y, 2), 8 * 6 * 4);
    kiln_ctx_free(ctx);
}
END_TEST

START_TEST(view_strides) {
    kiln_ctx *ctx = ts_parse("input a: f32[4, 3, 2]\n"
                             "p = permute(a, 2, 0, 1, 3)\n"
                             "t = transpose(a)\n"
                             "v = view(a, [2, 3], [32], 8)\n");
    kiln_tensor *p = fe_find(ctx, "p"), *t = fe_find(ctx, "t"), *v = fe_find(ctx, "v");
    /* ggml_permute: source dim i goes to position axis[i]. */
    ck_assert_int_eq(p->ne[0], 3);
    ck_assert_int_eq(p->ne[1], 2);
    ck_assert_int_eq(p->ne[2], 4);
    ck_assert_int_eq(p->nb[2], 4);
    ck_assert_int_eq(p->nb[0], 16);
    ck_assert_int_eq(t->ne[0], 3);
    ck_assert_int_eq(t->nb[0], 16);
    ck_assert_int_eq(t->nb[1], 4);
    ck_assert_int_eq(v->view_offs, 8);
    ck_assert_int_eq(v->nb[1], 32);
    kiln_ctx_free(ctx);
}
END_TEST

/* ---- lowering and fusion ------------------------------------------------------------------ */

START_TEST(views_fold_into_layouts) {
    kiln_ctx *ctx;
    kiln_graph *g;
    ir_prog *p = lower_text("input a: f32[4, 3]\nt = transpose(a)\nr = permute(t, 1, 0, 2, 3)\n"
                            "output c = cont(t)\n", &ctx, &g, true);
    ck_assert_int_eq(live_nodes(p), 1);
    const ir_node *n = live_node(p, 0);
    ck_assert_int_eq(n->nin, 1);
    ck_assert_int_eq(n->in[0].st[0], 4); /* transposed: dim 0 strides over rows of a */
    ck_assert_int_eq(n->in[0].st[1], 1);
    ck_assert_int_eq(n->in[0].ne[0], 3);
    free_all(p, g, ctx);
}
END_TEST

START_TEST(fusion_fires_on_chain) {
    kiln_ctx *ctx;
    kiln_graph *g;
    ir_prog *p = lower_text("input x: f32[64, 8]\nweight w: f16[64]\n"
                            "a = mul(x, w)\ns = silu(a)\noutput y = scale(s, 0.5, 1)\n", &ctx, &g, true);
    ck_assert_int_eq(live_nodes(p), 1);
    const ir_node *n = live_node(p, 0);
    ck_assert_str_eq(n->fusion, "ew_chain");
    ck_assert_int_eq(n->ninstr, 3);
    ck_assert_int_eq(n->nin, 2);
    ck_assert_int_eq(n->nsrc, 3);
    ck_assert_str_eq(ir_node_name(p, n->src[0]), "a");
    ck_assert_str_eq(ir_node_name(p, n->src[2]), "y");
    ck_assert_int_eq(p->arena_bytes, 0); /* no temporary survives */
    free_all(p, g, ctx);
}
END_TEST

/* Passes named in the skip list do not run; an unknown name is an error naming the valid ones. */
START_TEST(skip_named_passes) {
    kiln_ctx *ctx;
    kiln_graph *g = ts_build("input x: f32[64, 8]\nweight w: f16[64]\n"
                             "a = mul(x, w)\ns = silu(a)\noutput y = scale(s, 0.5, 1)\n", &ctx);
    ir_prog *p;
    TS_OK(ir_lower(g, &p));
    TS_OK(ir_run_passes(p, true, "ew_chain"));
    ck_assert_int_eq(live_nodes(p), 3);
    ir_prog_free(p);
    TS_OK(ir_lower(g, &p));
    kiln_status st = ir_run_passes(p, true, "ew_chain,ew_chian");
    ck_assert_msg(st && strstr(kiln_status_msg(st), "unknown fusion pass 'ew_chian' (passes: get_rows_one, rope_set_rows, topk_moe, mul_mat_glu, mul_mat_id_bias, rms_norm_mul, add_chain, mul_mat_cat, rms_norm_gemv, ew_chain, gemv_rope, head_rope)"), "%s",
                  kiln_status_msg(st));
    kiln_status_free(st);
    ir_prog_free(p);
    ck_assert_str_eq(kiln_fusion_pass(0, NULL), "get_rows_one");
    ck_assert_str_eq(kiln_fusion_pass(ir_nfusions - 1, NULL), "head_rope");
    ck_assert_ptr_null(kiln_fusion_pass(ir_nfusions, NULL));
    ts_graph_free(g, ctx);
}
END_TEST

START_TEST(no_fusion_across_second_use) {
    kiln_ctx *ctx;
    kiln_graph *g;
    ir_prog *p = lower_text("input x: f32[64, 8]\nweight w: f32[64]\n"
                            "a = mul(x, w)\ns = silu(a)\noutput y = scale(s, 2, 0)\noutput z = add(a, x)\n",
                            &ctx, &g, true);
    /* a is read by two kernels: it stays materialized; silu still fuses into the scale. */
    ck_assert_int_eq(live_nodes(p), 3);
    ck_assert_int_eq(live_node(p, 0)->ninstr, 1);
    ck_assert_str_eq(ir_node_name(p, live_node(p, 0)->src[0]), "a");
    ck_assert_int_eq(live_node(p, 1)->ninstr, 2);
    ck_assert_int_eq(live_node(p, 2)->ninstr, 1);
    free_all(p, g, ctx);
}
END_TEST

START_TEST(diamond_fuses_into_one_kernel) {
    kiln_ctx *ctx;
    kiln_graph *g;
    /* a has two uses, but once silu is fused into the add both are in one kernel: a is computed
     * once, in a register, and never materialized. */
    ir_prog *p = lower_text("input x: f32[64, 8]\nweight w: f32[64]\n"
                            "a = mul(x, w)\ns = silu(a)\noutput y = add(s, a)\n", &ctx, &g, true);
    ck_assert_int_eq(live_nodes(p), 1);
    ck_assert_int_eq(live_node(p, 0)->ninstr, 3);
    ck_assert_int_eq(live_node(p, 0)->nin, 2);
    free_all(p, g, ctx);
}
END_TEST

START_TEST(no_fusion_of_outputs_or_permuted_reads) {
    kiln_ctx *ctx;
    kiln_graph *g;
    ir_prog *p = lower_text("input x: f32[8, 8]\noutput a = exp(x)\noutput y = neg(a)\n", &ctx, &g, true);
    ck_assert_int_eq(live_nodes(p), 2);
    free_all(p, g, ctx);
    p = lower_text("input x: f32[8, 4]\na = exp(x)\nt = transpose(a)\noutput y = neg(t)\n", &ctx, &g, true);
    ck_assert_int_eq(live_nodes(p), 2);
    free_all(p, g, ctx);
    p = lower_text("input x: f32[8, 4]\na = exp(x)\ns = sqr(x)\noutput y = add(s, a)\n", &ctx, &g, false);
    ck_assert_int_eq(live_nodes(p), 3); /* --no-fuse */
    free_all(p, g, ctx);
}
END_TEST

START_TEST(fusion_with_broadcast_producer) {
    kiln_ctx *ctx;
    kiln_graph *g;
    /* b is computed at [16] and broadcast over [16, 4]: fused, it is recomputed per row. */
    ir_prog *p = lower_text("input x: f32[16, 4]\nweight w: f32[16]\nb = exp(w)\noutput y = mul(x, b)\n",
                            &ctx, &g, true);
    ck_assert_int_eq(live_nodes(p), 1);
    free_all(p, g, ctx);
}
END_TEST

/* Fused and unfused programs compute bit-identical results, f16 intermediates included. */
START_TEST(fused_equals_unfused) {
    static const char *graph =
        "input x: f32[33, 7, 3]\nweight w: f16[33, 1, 3]\ninput z: bf16[1, 7]\n"
        "a = mul(x, w)\nb = gelu(a)\nh = cont(b)\nc = sub(h, z)\nd = div(c, w)\ne = tanh(d)\n"
        "f = sigmoid(e)\ng2 = sqr(f)\nk = add(g2, a)\noutput y = scale(k, -0.75, 0.125)\n"
        "output y2 = sqrt(g2)\n";
    kiln_ctx *c1, *c2;
    kiln_graph *g1, *g2;
    ir_prog *fused = lower_text(graph, &c1, &g1, true);
    ir_prog *plain = lower_text(graph, &c2, &g2, false);
    ck_assert_int_lt(live_nodes(fused), live_nodes(plain));
    void *arena1, *arena2;
    void **d1 = alloc_bufs(fused, true, &arena1, 42), **d2 = alloc_bufs(plain, false, &arena2, 42);
    TS_OK(ir_eval(fused, d1));
    TS_OK(ir_eval(plain, d2));
    for (int b = 0; b < plain->nbufs; b++)
        if (plain->bufs[b].kind == IR_BUF_OUTPUT) {
            int fb = find_buf(fused, plain->bufs[b].name);
            ck_assert_int_ge(fb, 0);
            ck_assert_msg(memcmp(d1[fb], d2[b], plain->bufs[b].bytes) == 0, "output %s differs", plain->bufs[b].name);
        }
    free_bufs(fused, d1, arena1);
    free_bufs(plain, d2, arena2);
    free_all(fused, g1, c1);
    free_all(plain, g2, c2);
}
END_TEST

/* ---- epilogues ---------------------------------------------------------------------------- */

/* What a fusion pass does to attach elementwise node `ew` (which reads op node `op`'s result at
 * its own coordinates) to `op` as its epilogue. */
static void attach_epilogue(ir_prog *p, int op, int ew) {
    ir_node *n = &p->nodes[op], *m = &p->nodes[ew];
    int map[IR_MAX_IN + IR_MAX_INSTR], nin = n->nin;
    int t = -1;
    for (int k = 0; k < m->nin; k++) {
        if (m->in[k].buf == n->dst.buf) {
            t = k;
            continue;
        }
        map[k] = nin;
        n->in[nin++] = m->in[k];
    }
    ck_assert_int_ge(t, 0);
    map[t] = nin; /* the op's value */
    for (int j = 0; j < m->ninstr; j++) map[m->nin + j] = nin + 1 + j;
    n->nin = nin;
    n->ninstr = m->ninstr;
    for (int j = 0; j < m->ninstr; j++) {
        n->ins[j] = m->ins[j];
        n->ins[j].a = map[m->ins[j].a];
        if (fe_ops[m->ins[j].op].nsrc > 1) n->ins[j].b = map[m->ins[j].b];
    }
    n->op_type = n->dst.type;
    n->dst = m->dst;
    for (int s = 0; s < m->nsrc; s++) n->src[n->nsrc++] = m->src[s];
    n->fusion = "test_epilogue";
    m->dead = true;
}

/* lower_text with every fusion pass but those in skip. */
static ir_prog *lower_skip(const char *text, kiln_ctx **ctx, kiln_graph **g, const char *skip) {
    *ctx = ts_parse(text);
    TS_OK(kiln_graph_new(*ctx, g));
    ir_prog *p;
    TS_OK(ir_lower(*g, &p));
    TS_OK(ir_run_passes(p, true, skip));
    return p;
}

/* An op node carrying the elementwise kernel that consumed it computes bit for bit what the two
 * nodes computed (the op's value rounded to its type first), prints its epilogue, and is
 * refused by a template that does not apply epilogues (softmax; the norm family does, and
 * attaches its epilogues itself: rms_norm_mul is left out here). */
START_TEST(op_epilogue_equals_unfused) {
    static const char *graph = "input x: f32[64, 6]\nweight w: f32[64]\ninput r: bf16[64, 6]\n"
                               "n = rms_norm(x, 1e-06)\nm = mul(n, w)\noutput y = add(m, r)\n"
                               "input x2: bf16[40, 3]\nn2 = norm(x2, 1e-05)\noutput y2 = scale(n2, 3, 0.25)\n";
    kiln_ctx *c1, *c2;
    kiln_graph *g1, *g2;
    ir_prog *e = lower_skip(graph, &c1, &g1, "rms_norm_mul");
    ir_prog *plain = lower_skip(graph, &c2, &g2, "rms_norm_mul");
    ck_assert_int_eq(live_nodes(e), 4);
    int live[4], nl = 0;
    for (int i = 0; i < e->nnodes; i++)
        if (!e->nodes[i].dead) live[nl++] = i;
    attach_epilogue(e, live[0], live[1]);
    attach_epilogue(e, live[2], live[3]);
    TS_OK(ir_verify(e));
    ck_assert_int_eq(live_nodes(e), 2);
    void *a1, *a2;
    void **d1 = alloc_bufs(e, false, &a1, 7), **d2 = alloc_bufs(plain, false, &a2, 7);
    TS_OK(ir_eval(e, d1));
    TS_OK(ir_eval(plain, d2));
    for (int b = 0; b < plain->nbufs; b++)
        if (plain->bufs[b].kind == IR_BUF_OUTPUT)
            ck_assert_msg(memcmp(d1[b], d2[b], plain->bufs[b].bytes) == 0, "output %s differs", plain->bufs[b].name);
    free_bufs(e, d1, a1);
    free_bufs(plain, d2, a2);

    kb_str o = {0};
    ir_print(e, &o);
    ck_assert_msg(strstr(o.s, "epilogue (op : f32):") && strstr(o.s, "r0 = mul op, in2") &&
                      strstr(o.s, "r1 = add r0, in1") && strstr(o.s, "epilogue (op : bf16):"),
                  "%s", o.s);
    kb_str_free(&o);

    /* a broken epilogue: an instruction reading a register defined later */
    ir_node *n0 = &e->nodes[live[0]];
    n0->ins[0].a = n0->nin + 2;
    kiln_status st = ir_verify(e);
    ck_assert_msg(st && strstr(kiln_status_msg(st), "register not yet defined"), "%s", kiln_status_msg(st));
    kiln_status_free(st);
    n0->ins[0].a = n0->nin;

    free_all(e, g1, c1);
    free_all(plain, g2, c2);

    /* a family whose template does not apply epilogues is refused up front */
    kiln_ctx   *c3;
    kiln_graph *g3;
    ir_prog    *sm = lower_skip("input s: f32[16, 4]\np = soft_max(s)\noutput z = scale(p, 2, 0)\n", &c3, &g3, NULL);
    ck_assert_int_eq(live_nodes(sm), 2);
    nl = 0;
    for (int i = 0; i < sm->nnodes; i++)
        if (!sm->nodes[i].dead) live[nl++] = i;
    attach_epilogue(sm, live[0], live[1]);
    TS_OK(ir_verify(sm));
    cg_lua *L;
    TS_OK(cg_lua_new(&L));
    cg_kernel *ks;
    int        nk;
    st = cg_generate_steps(L, sm, live[0], &ks, &nk);
    ck_assert_msg(st && strstr(kiln_status_msg(st), "does not apply the elementwise epilogue"), "%s",
                  kiln_status_msg(st));
    kiln_status_free(st);
    cg_lua_free(L);
    free_all(sm, g3, c3);
}
END_TEST

/* ---- memory plan -------------------------------------------------------------------------- */

START_TEST(memplan_reuses_and_never_overlaps_live_values) {
    kiln_ctx *ctx;
    kiln_graph *g;
    kb_str text = {0};
    kb_str_add(&text, "input x: f32[256, 16]\nt0 = exp(x)\n");
    for (int i = 1; i < 12; i++) kb_str_addf(&text, "t%d = %s(t%d)\n", i, i % 2 ? "neg" : "tanh", i - 1);
    kb_str_add(&text, "m = add(t11, t3)\noutput y = add(m, t7)\n");
    ir_prog *p = lower_text(text.s, &ctx, &g, false);
    kb_str_free(&text);
    size_t total = 0;
    for (int b = 0; b < p->nbufs; b++) {
        const ir_buf *x = &p->bufs[b];
        if (x->kind != IR_BUF_TEMP) continue;
        total += x->bytes;
        ck_assert_int_eq(x->offset % IR_ALIGN, 0);
        for (int c = b + 1; c < p->nbufs; c++) {
            const ir_buf *y = &p->bufs[c];
            if (y->kind != IR_BUF_TEMP) continue;
            bool live_together = x->first <= y->last && y->first <= x->last;
            bool overlap = x->offset < y->offset + y->bytes && y->offset < x->offset + x->bytes;
            ck_assert_msg(!(live_together && overlap), "%s and %s overlap while both live", x->name, y->name);
        }
    }
    ck_assert_int_lt(p->arena_bytes, total / 2);
    /* And the planned arena computes what separate buffers compute. */
    void *a1, *a2;
    void **d1 = alloc_bufs(p, true, &a1, 7), **d2 = alloc_bufs(p, false, &a2, 7);
    TS_OK(ir_eval(p, d1));
    TS_OK(ir_eval(p, d2));
    int y = find_buf(p, "y");
    ck_assert(memcmp(d1[y], d2[y], p->bufs[y].bytes) == 0);
    free_bufs(p, d1, a1);
    free_bufs(p, d2, a2);
    free_all(p, g, ctx);
}
END_TEST

/* ---- reference semantics, by hand ---------------------------------------------------------- */

typedef struct {
    const char *name;
    const float *data;
    float out[64];
    int64_t n;
} hand;

static const void *hand_get(void *user, const char *name, kiln_type type, int64_t n) {
    hand *h = user;
    ck_assert_int_eq(type, KILN_F32);
    for (int i = 0; h[i].name; i++)
        if (!strcmp(h[i].name, name)) return h[i].data;
    return NULL;
}

static void hand_put(void *user, const char *name, kiln_type type, int64_t n, const void *data) {
    hand *h = user;
    for (int i = 0; h[i].name; i++)
        if (!strcmp(h[i].name, name)) {
            ck_assert_int_le(n, 64);
            memcpy(h[i].out, data, (size_t)n * sizeof(float));
            h[i].n = n;
        }
}

START_TEST(reference_by_hand) {
    static const float x[6] = {-2, -0.5f, 0, 0.5f, 1, 3};  /* [3, 2] */
    static const float w[3] = {10, 20, 30};                /* [3] broadcast over rows */
    kiln_ctx *ctx;
    kiln_graph *g = ts_build("input x: f32[3, 2]\nweight w: f32[3]\n"
                             "output a = add(x, w)\noutput s = scale(x, 2, 1)\noutput r = relu(x)\n"
                             "output q = silu(x)\noutput e = gelu(x)\noutput d = div(w, w)\n"
                             "output t = transpose(x)\noutput v = view(x, [2], [], 12)\n", &ctx);
    hand h[11] = {{.name = "x", .data = x}, {.name = "w", .data = w}, {.name = "a"}, {.name = "s"},
                  {.name = "r"},           {.name = "q"},           {.name = "e"}, {.name = "d"},
                  {.name = "t"},           {.name = "v"},           {.name = NULL}};
    TS_OK(kiln_reference(g, hand_get, hand_put, h));
    const float a[6] = {8, 19.5f, 30, 10.5f, 21, 33};
    const float s[6] = {-3, 0, 1, 2, 3, 7};
    const float r[6] = {0, 0, 0, 0.5f, 1, 3};
    const float t[6] = {-2, 0.5f, -0.5f, 1, 0, 3};
    for (int i = 0; i < 6; i++) {
        ck_assert_float_eq(h[2].out[i], a[i]);
        ck_assert_float_eq(h[3].out[i], s[i]);
        ck_assert_float_eq(h[4].out[i], r[i]);
        ck_assert_float_eq_tol(h[5].out[i], x[i] / (1 + expf(-x[i])), 1e-6);
        ck_assert_float_eq(h[8].out[i], t[i]);
    }
    ck_assert_float_eq_tol(h[6].out[4], 0.841191990f, 1e-6); /* gelu(1), tanh approximation */
    ck_assert_float_eq_tol(h[6].out[0], -0.045402306f, 1e-6);
    ck_assert_float_eq(h[7].out[1], 1.0f);
    ck_assert_int_eq(h[9].n, 2);
    ck_assert_float_eq(h[9].out[0], 0.5f); /* bytes 12.. : elements 3, 4 */
    ck_assert_float_eq(h[9].out[1], 1.0f);
    ts_graph_free(g, ctx);
}
END_TEST

/* The reference dispatch reads the family of each op: every FE_KERNEL op's family has a
 * reference; the others (leaves, views, elementwise kinds) make no IR_OP node and have none. */
START_TEST(references_match_families) {
    for (int op = 0; op < FE_OP_COUNT; op++)
        ck_assert_msg((ir_ref_of(fe_ops[op].fam) != NULL) == (fe_ops[op].kind == FE_KERNEL),
                      "op %s: family %s %s a reference", fe_ops[op].name, fe_fams[fe_ops[op].fam].name,
                      fe_ops[op].kind == FE_KERNEL ? "lacks" : "has");
    ck_assert_ptr_eq(ir_ref_of(FE_FAM_MATMUL_ID), ir_ref_matmul);
    ck_assert_ptr_null(ir_ref_of(FE_FAM_COUNT));
}
END_TEST

static float apply1(fe_op op, float x, float f0, float f1) {
    ir_instr in = {.op = op, .f = {f0, f1}, .type = KILN_F32};
    return ir_apply(&in, x, 0.0f);
}

/* Values worked out by hand from ggml's definitions (ggml-cpu vec.h / unary-ops.cpp). */
START_TEST(unary_semantics_by_hand) {
    ck_assert_float_eq(apply1(FE_OP_ABS, -3.5f, 0, 0), 3.5f);
    ck_assert_float_eq(apply1(FE_OP_SGN, -0.25f, 0, 0), -1.0f);
    ck_assert_float_eq(apply1(FE_OP_SGN, 0.0f, 0, 0), 0.0f);
    ck_assert_float_eq(apply1(FE_OP_STEP, 0.0f, 0, 0), 0.0f);
    ck_assert_float_eq(apply1(FE_OP_STEP, 1e-30f, 0, 0), 1.0f);
    ck_assert_float_eq(apply1(FE_OP_ELU, 2.0f, 0, 0), 2.0f);
    ck_assert_float_eq_tol(apply1(FE_OP_ELU, -1.0f, 0, 0), -0.63212056f, 1e-7);
    ck_assert_float_eq_tol(apply1(FE_OP_LEAKY_RELU, -2.0f, 0.1f, 0), -0.2f, 1e-7);
    ck_assert_float_eq(apply1(FE_OP_LEAKY_RELU, 3.0f, 0.1f, 0), 3.0f);
    ck_assert_float_eq_tol(apply1(FE_OP_GELU_ERF, 1.0f, 0, 0), 0.84134475f, 1e-6);
    ck_assert_float_eq_tol(apply1(FE_OP_GELU_QUICK, 1.0f, 0, 0), 0.84579575f, 1e-6);
    ck_assert_float_eq(apply1(FE_OP_HARDSIGMOID, -3.0f, 0, 0), 0.0f);
    ck_assert_float_eq(apply1(FE_OP_HARDSIGMOID, 0.0f, 0, 0), 0.5f);
    ck_assert_float_eq(apply1(FE_OP_HARDSIGMOID, 4.0f, 0, 0), 1.0f);
    ck_assert_float_eq(apply1(FE_OP_HARDSWISH, 1.0f, 0, 0), 1.0f * 4.0f / 6.0f);
    ck_assert_float_eq_tol(apply1(FE_OP_LOG, 2.0f, 0, 0), 0.69314718f, 1e-7);
    ck_assert_float_eq_tol(apply1(FE_OP_SIN, 1.0f, 0, 0), 0.84147098f, 1e-7);
    ck_assert_float_eq_tol(apply1(FE_OP_COS, 1.0f, 0, 0), 0.54030231f, 1e-7);
    ck_assert_float_eq(apply1(FE_OP_SOFTPLUS, 21.0f, 0, 0), 21.0f); /* past ggml's threshold */
    ck_assert_float_eq_tol(apply1(FE_OP_SOFTPLUS, 0.0f, 0, 0), 0.69314718f, 1e-7);
    ck_assert_float_eq(apply1(FE_OP_CLAMP, 5.0f, -1.0f, 2.0f), 2.0f);
    ck_assert_float_eq(apply1(FE_OP_CLAMP, -5.0f, -1.0f, 2.0f), -1.0f);
    ck_assert_float_eq(apply1(FE_OP_CLAMP, 0.5f, -1.0f, 2.0f), 0.5f);
    /* min > max: ggml's MAX(MIN(x, max), min) gives min */
    ck_assert_float_eq(apply1(FE_OP_CLAMP, 0.5f, 3.0f, 2.0f), 3.0f);
}
END_TEST

START_TEST(ir_text_is_deterministic) {
    static const char *graph = "input x: f32[64, 8]\nweight w: f16[64]\na = mul(x, w)\nt = transpose(a)\n"
                               "output y = silu(t)\noutput z = add(a, x)\n";
    char *text[2];
    for (int i = 0; i < 2; i++) {
        kiln_ctx *ctx;
        kiln_graph *g;
        ir_prog *p = lower_text(graph, &ctx, &g, true);
        kb_str o = {0};
        ir_print(p, &o);
        text[i] = kb_str_take(&o);
        free_all(p, g, ctx);
    }
    ck_assert_str_eq(text[0], text[1]);
    ck_assert_ptr_nonnull(strstr(text[0], "b0 input  x f32[64, 8]"));
    ck_assert_ptr_nonnull(strstr(text[0], "strides [64, 1, 512, 512]"));
    free(text[0]);
    free(text[1]);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("ir",
                        TS_CASE("ir", 0),
                        TS_TESTS(shape_errors, builder_errors_are_sticky, api_argument_errors, broadcast_shapes,
                                 view_strides, views_fold_into_layouts, fusion_fires_on_chain, skip_named_passes,
                                 op_epilogue_equals_unfused, no_fusion_across_second_use, diamond_fuses_into_one_kernel,
                                 no_fusion_of_outputs_or_permuted_reads, fusion_with_broadcast_producer,
                                 fused_equals_unfused, memplan_reuses_and_never_overlaps_live_values, reference_by_hand,
                                 unary_semantics_by_hand, references_match_families, ir_text_is_deterministic));
    return ts_main(s);
}
