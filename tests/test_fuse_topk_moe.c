/* The topk_moe pass (ir/fuse_topk_moe.c), its CPU reference (ir/ref_moe.c) and its template
 * (templates/moe.lua), no GPU needed:
 *  - it fires on every routing variant of llama.cpp's build_moe_ffn (softmax / sigmoid /
 *    delayed softmax gating, selection bias, norm with and without clamp, scale; argsort_top_k
 *    and top_k; E of 8 to 512 including non powers of two, k of 1 to 32, T of 1 to 512), the
 *    fused program evaluating bit for bit like the unfused one (ids and weights);
 *  - it leaves the nodes alone when an intermediate is an output or has another reader, when
 *    types differ (f16 logits give f16 probabilities), when E > 512 or k > 32, when the softmax
 *    has a mask; a tail step that is not legal (w or the sum read elsewhere) ends the fused node
 *    before it, the rest staying unfused;
 *  - ties are broken by expert index, as argsort_top_k's reference does;
 *  - examples/qwen3moe-layer.kg fuses its routing;
 *  - every kernel the template generates compiles with NVRTC for sm_90a and sm_80 without
 *    warnings. */
#include "tests/support.h"

#include "base/base.h"
#include "ir/ir.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- graphs ------------------------------------------------------------------------------- */

typedef enum { G_SOFTMAX, G_SOFTMAX_EXT, G_SIGMOID, G_DELAYED } gating;

typedef struct {
    int    E, T, k;
    gating gate;
    bool   bias, norm, clamp, scale;
    bool   top_k;      /* top_k instead of argsort_top_k */
    bool   ids_out;    /* ids an output rather than a temporary read by a get_rows */
    /* breakers */
    bool   probs_out;  /* the probabilities are an output */
    bool   sel_reader; /* the biased selection values have another reader */
    bool   w_reader;   /* get_rows' result has another reader (the norm cannot be absorbed) */
    bool   sum_out;    /* the norm's sum is an output */
    bool   f16;        /* f16 logits */
    bool   mask;       /* soft_max_ext with a mask */
} moe_case;

/* The .kg text of c; the last statement is the output `weights`. Caller frees. */
static char *moe_kg(const moe_case *c) {
    kb_str g = {0};
    int    E = c->E, T = c->T, k = c->k;
    kb_str_addf(&g, "kiln-graph 1\ninput logits: %s[%d, %d]\n", c->f16 ? "f16" : "f32", E, T);
    if (c->bias) kb_str_addf(&g, "weight bias: f32[%d]\n", E);
    if (c->mask) kb_str_addf(&g, "input mask: f32[%d, %d]\n", E, T);
    if (!c->ids_out) kb_str_addf(&g, "weight table: f32[3, %d, %d]\n", E, T);
    const char *P = "probs";
    const char *po = c->probs_out ? "output " : "";
    switch (c->gate) {
    case G_SOFTMAX: kb_str_addf(&g, "%sprobs = soft_max(logits)\n", po); break;
    case G_SOFTMAX_EXT:
        if (c->mask) kb_str_addf(&g, "%sprobs = soft_max_ext(logits, mask, scale=1)\n", po);
        else kb_str_addf(&g, "%sprobs = soft_max_ext(logits, scale=1)\n", po);
        break;
    case G_SIGMOID: kb_str_addf(&g, "%sprobs = sigmoid(logits)\n", po); break;
    case G_DELAYED: P = "logits"; break;
    }
    const char *S = P;
    if (c->bias) {
        kb_str_addf(&g, "sel = add(%s, bias)\n", P);
        S = "sel";
        if (c->sel_reader) kb_str_add(&g, "output selx = scale(sel, 2)\n");
    }
    kb_str_addf(&g, "%sids = %s(%s, %d)\n", c->ids_out ? "output " : "", c->top_k ? "top_k" : "argsort_top_k", S, k);
    if (!c->ids_out) kb_str_add(&g, "output picked = get_rows(table, ids)\n");
    kb_str_addf(&g, "p3 = reshape(%s, [1, %d, %d])\n", P, E, T);
    /* Statements after get_rows; the last becomes "output weights = ...". */
    char  stm[8][160];
    int   n = 0;
    const char *cur = "w";
    bool  flat = false; /* cur is [k, T] */
    snprintf(stm[n++], sizeof stm[0], "w = get_rows(p3, ids)");
    if (c->w_reader) snprintf(stm[n++], sizeof stm[0], "output wx = scale(w, 3)");
    if (c->gate == G_DELAYED) {
        snprintf(stm[n++], sizeof stm[0], "w2 = reshape(w, [%d, %d])", k, T);
        snprintf(stm[n++], sizeof stm[0], "wd = soft_max(w2)");
        cur = "wd", flat = true;
    }
    if (c->norm) {
        if (!flat) snprintf(stm[n++], sizeof stm[0], "wf = reshape(%s, [%d, %d])", cur, k, T), cur = "wf";
        snprintf(stm[n++], sizeof stm[0], "%ss = sum_rows(%s)", c->sum_out ? "output " : "", cur);
        if (c->clamp) snprintf(stm[n++], sizeof stm[0], "sc = clamp(s, 0.05, 0.3)");
        snprintf(stm[n++], sizeof stm[0], "wn = div(%s, %s)", cur, c->clamp ? "sc" : "s");
        cur = "wn", flat = true;
    }
    if (c->scale) {
        if (flat) snprintf(stm[n++], sizeof stm[0], "w3 = reshape(%s, [1, %d, %d])", cur, k, T), cur = "w3";
        snprintf(stm[n++], sizeof stm[0], "ws = scale(%s, 2.5)", cur);
        cur = "ws";
    }
    if (strncmp(stm[n - 1], cur, strlen(cur)) != 0 || stm[n - 1][strlen(cur)] != ' ')
        snprintf(stm[n++], sizeof stm[0], "wc = cont(%s)", cur);
    for (int i = 0; i < n; i++) {
        if (i == n - 1) {
            const char *eq = strchr(stm[i], '=');
            kb_str_addf(&g, "output weights %s\n", eq);
        } else {
            kb_str_addf(&g, "%s\n", stm[i]);
        }
    }
    return kb_str_take(&g);
}

/* The names the fused node absorbed ("fused topk_moe: a, b" line), or NULL when it did not fire. */
static char *fused_line(const char *ir) {
    const char *s = strstr(ir, "fused topk_moe: ");
    if (!s) return NULL;
    s += strlen("fused topk_moe: ");
    const char *e = strchr(s, '\n');
    size_t      n = e ? (size_t)(e - s) : strlen(s);
    char       *out = malloc(n + 1);
    memcpy(out, s, n);
    out[n] = 0;
    return out;
}

/* Fuses and evaluates c against the unfused program; returns the fused line (caller frees) or
 * NULL, and the kernel count. Every case must evaluate bit for bit like the unfused program. */
static char *run_case(const moe_case *c, int *live) {
    char  *kg = moe_kg(c);
    char  *ir = NULL;
    double d = ts_fusion_compare(kg, NULL, live, &ir);
    char  *line = fused_line(ir);
    ck_assert_msg(d == 0.0, "fused and unfused differ by %g:\n%s\n%s", d, kg, ir);
    free(ir);
    free(kg);
    return line;
}

static void expect_fused(const moe_case *c, const char *want, int want_live) {
    int   live;
    char *line = run_case(c, &live);
    char *kg = moe_kg(c);
    ck_assert_msg(line && strcmp(line, want) == 0, "fused topk_moe: %s, want %s\n%s", line ? line : "(none)", want, kg);
    ck_assert_msg(live == want_live, "%d kernels, want %d\n%s", live, want_live, kg);
    free(kg);
    free(line);
}

static void expect_not_fused(const moe_case *c) {
    int   live;
    char *line = run_case(c, &live);
    char *kg = moe_kg(c);
    ck_assert_msg(!line, "fused topk_moe: %s, want no fusion\n%s", line, kg);
    free(kg);
}

/* ---- the pattern fires -------------------------------------------------------------------- */

START_TEST(fires_on_softmax_norm) {
    moe_case c = {.E = 128, .T = 7, .k = 8, .gate = G_SOFTMAX, .norm = true};
    /* The fused node and the get_rows reading the ids (the mul_mat_id of a model). */
    expect_fused(&c, "probs, ids, w, s, weights", 2);
    c.ids_out = true;
    expect_fused(&c, "probs, ids, w, s, weights", 1);
}
END_TEST

START_TEST(fires_on_every_variant) {
    static const gating gates[] = {G_SOFTMAX, G_SOFTMAX_EXT, G_SIGMOID, G_DELAYED};
    int                 n = 0;
    for (int gi = 0; gi < 4; gi++)
        for (int v = 0; v < 16; v++) {
            moe_case c = {.E = 60, .T = 5, .k = 4, .gate = gates[gi], .bias = v & 1, .norm = (v >> 1) & 1,
                          .clamp = ((v >> 1) & 1) && ((v >> 2) & 1), .scale = (v >> 3) & 1, .top_k = v % 3 == 0,
                          .ids_out = v % 5 == 0};
            if (!c.norm && ((v >> 2) & 1)) continue; /* clamp without norm: no such graph */
            int   live;
            char *line = run_case(&c, &live);
            char *kg = moe_kg(&c);
            ck_assert_msg(line != NULL, "no fusion:\n%s", kg);
            ck_assert_msg(live == (c.ids_out ? 1 : 2), "%d kernels\n%s", live, kg);
            /* Every routing node is absorbed: the last one is the output weights. */
            ck_assert_msg(strstr(line, "weights") && strstr(line, "ids"), "fused %s\n%s", line, kg);
            free(kg);
            free(line);
            n++;
        }
    ck_assert_int_eq(n, 48);
}
END_TEST

START_TEST(fires_on_every_size) {
    static const int Es[] = {8, 60, 128, 256, 512}, ks[] = {1, 2, 4, 8, 32}, Ts[] = {1, 7, 512};
    for (int e = 0; e < 5; e++)
        for (int k = 0; k < 5; k++)
            for (int t = 0; t < 3; t++) {
                if (ks[k] > Es[e]) continue;
                moe_case c = {.E = Es[e], .T = Ts[t], .k = ks[k], .gate = (gating)((e + k + t) % 4),
                              .bias = (e + t) % 2, .norm = (k + t) % 2 == 0, .clamp = k % 3 == 0, .scale = e % 2};
                c.clamp = c.clamp && c.norm;
                int   live;
                char *line = run_case(&c, &live);
                char *kg = moe_kg(&c);
                ck_assert_msg(line != NULL && live == 2, "E %d k %d T %d: %d kernels\n%s", Es[e], ks[k], Ts[t], live, kg);
                free(kg);
                free(line);
            }
}
END_TEST

/* ---- and does not fire (or stops) where it would change what is computed ---------------- */

START_TEST(no_fusion_when_illegal) {
    moe_case base = {.E = 128, .T = 3, .k = 8, .gate = G_SOFTMAX, .bias = true, .norm = true};
    moe_case c = base;
    c.probs_out = true; /* probs must be materialized */
    expect_not_fused(&c);
    c = base;
    c.sel_reader = true; /* so must the biased selection */
    expect_not_fused(&c);
    c = base;
    c.f16 = true; /* f16 logits: f16 probabilities, not the f32 the kernel keeps */
    expect_not_fused(&c);
    c = base;
    c.E = 600; /* more experts than registers hold */
    expect_not_fused(&c);
    c = base;
    c.k = 33;
    expect_not_fused(&c);
    c = base;
    c.gate = G_SOFTMAX_EXT;
    c.mask = true;
    expect_not_fused(&c);
    c = base;
    c.gate = G_SIGMOID;
    c.probs_out = true;
    expect_not_fused(&c);
    /* Delayed softmax whose selected logits are read elsewhere: no routing without its softmax. */
    c = base;
    c.gate = G_DELAYED;
    c.w_reader = true;
    expect_not_fused(&c);
}
END_TEST

START_TEST(tail_stops_at_an_illegal_step) {
    moe_case c = {.E = 128, .T = 3, .k = 8, .gate = G_SOFTMAX, .norm = true, .scale = true};
    /* w has a third reader: the norm stays, the fused node ends at get_rows (then wx, s, wn and
     * the scale are kernels of their own: ew_chain does not merge through the reshape). */
    c.w_reader = true;
    expect_fused(&c, "probs, ids, w", 2 + 4);
    c.w_reader = false;
    c.sum_out = true; /* the sum is an output: the same without wx */
    expect_fused(&c, "probs, ids, w", 2 + 3);
    c.sum_out = false;
    expect_fused(&c, "probs, ids, w, s, wn, weights", 2);
}
END_TEST

/* ---- the reference by hand: ties and order --------------------------------------------- */

/* Evaluates kg (fused or not) on the given f32 logits; returns ids and weights (caller frees). */
static void eval_by_hand(const char *kg, bool fuse, const float *logits, int32_t **ids, float **w) {
    kiln_ctx   *ctx;
    kiln_graph *g = ts_build(kg, &ctx);
    ir_prog *p;
    TS_OK(ir_lower(g, &p));
    TS_OK(ir_run_passes(p, fuse, NULL));
    void **data = calloc((size_t)p->nbufs, sizeof *data);
    for (int b = 0; b < p->nbufs; b++) {
        data[b] = calloc(1, p->bufs[b].bytes + 1);
        if (strcmp(p->bufs[b].name, "logits") == 0) memcpy(data[b], logits, p->bufs[b].bytes);
    }
    TS_OK(ir_eval(p, data));
    for (int b = 0; b < p->nbufs; b++) {
        if (p->bufs[b].kind != IR_BUF_OUTPUT) continue;
        void *copy = malloc(p->bufs[b].bytes);
        memcpy(copy, data[b], p->bufs[b].bytes);
        if (strcmp(p->bufs[b].name, "ids") == 0) *ids = copy;
        else if (strcmp(p->bufs[b].name, "weights") == 0) *w = copy;
        else free(copy);
    }
    for (int b = 0; b < p->nbufs; b++) free(data[b]);
    free(data);
    ir_prog_free(p);
    ts_graph_free(g, ctx);
}

START_TEST(ties_by_index) {
    /* Two rows of 8 experts: equal logits tie; the lower index comes first. */
    static const float logits[16] = {1, 3, 3, 0, 3, 2, 2, -1, /* row 1 */ 0, 0, 0, 0, 0, 0, 0, 0};
    static const int32_t want[2][4] = {{1, 2, 4, 5}, {0, 1, 2, 3}};
    moe_case c = {.E = 8, .T = 2, .k = 4, .gate = G_SOFTMAX, .norm = true, .ids_out = true};
    char    *kg = moe_kg(&c);
    for (int fuse = 0; fuse < 2; fuse++) {
        int32_t *ids = NULL;
        float   *w = NULL;
        eval_by_hand(kg, fuse, logits, &ids, &w);
        ck_assert_ptr_nonnull(ids);
        ck_assert_ptr_nonnull(w);
        for (int t = 0; t < 2; t++)
            for (int j = 0; j < 4; j++)
                ck_assert_msg(ids[t * 4 + j] == want[t][j], "fuse %d row %d: id %d = %d, want %d", fuse, t, j,
                              ids[t * 4 + j], want[t][j]);
        /* Row 2 is uniform: four weights of 1/4 after the norm. */
        for (int j = 0; j < 4; j++) ck_assert_float_eq(w[4 + j], 0.25f);
        free(ids);
        free(w);
    }
    free(kg);
}
END_TEST

START_TEST(qwen3moe_example_fuses_its_routing) {
    char  *path = NULL, *text = NULL;
    size_t len;
    kb_str ps = {0};
    kb_str_addf(&ps, "%s/examples/qwen3moe-layer.kg", ts_src_dir());
    path = kb_str_take(&ps);
    TS_OK(kb_read_file(path, &text, &len));
    kiln_ctx   *ctx;
    kiln_graph *g = ts_build(text, &ctx);
    ir_prog *p;
    TS_OK(ir_lower(g, &p));
    TS_OK(ir_run_passes(p, true, NULL));
    kb_str o = {0};
    ir_print(p, &o);
    ck_assert_msg(strstr(o.s, "fused topk_moe: probs, selected, weights, weights_sum, weights_n\n"), "%s", o.s);
    ck_assert_msg(strstr(o.s, "topk_moe k=8 gating=softmax, normalized : f32"), "%s", o.s);
    kb_str_free(&o);
    ir_prog_free(p);
    ts_graph_free(g, ctx);
    free(text);
    free(path);
}
END_TEST

/* ---- kernels ---------------------------------------------------------------------------- */

START_TEST(kernels_compile) {
    static const moe_case cases[] = {
        {.E = 128, .T = 1, .k = 8, .gate = G_SOFTMAX, .norm = true},
        {.E = 128, .T = 512, .k = 8, .gate = G_SOFTMAX, .norm = true, .ids_out = true},
        {.E = 60, .T = 7, .k = 4, .gate = G_SOFTMAX, .bias = true, .scale = true},
        {.E = 256, .T = 7, .k = 8, .gate = G_SIGMOID, .bias = true, .norm = true, .clamp = true, .scale = true},
        {.E = 512, .T = 3, .k = 32, .gate = G_SIGMOID, .norm = true},
        {.E = 32, .T = 5, .k = 4, .gate = G_DELAYED},
        {.E = 33, .T = 2, .k = 32, .gate = G_DELAYED, .bias = true, .norm = true, .scale = true},
        {.E = 8, .T = 1, .k = 1, .gate = G_SOFTMAX_EXT},
        {.E = 1, .T = 1, .k = 1, .gate = G_SOFTMAX},
    };
    char *cache = ts_tmpdir();
    int   found = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char       *kg = moe_kg(&cases[i]);
        kiln_ctx   *ctx;
        kiln_graph *g;
        kiln_program *p = ts_compile(kg, "sm_90a", cache, 1, &ctx, &g);
        for (int k = 0; k < kiln_program_kernel_count(p); k++) {
            const char *name = kiln_program_kernel_name(p, k), *src = kiln_program_kernel_source(p, k);
            if (strncmp(name, "topk_moe_", 9) != 0) continue;
            found++;
            ck_assert_ptr_null(strstr(src, "#include"));
            ts_nvrtc_clean(src, name, "sm_90a");
            ts_nvrtc_clean(src, name, "sm_80");
        }
        ts_compiled_free(p, g, ctx);
        free(kg);
    }
    ck_assert_int_eq(found, (int)(sizeof cases / sizeof cases[0]));
    ts_tmpdir_free(cache);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("fuse_topk_moe",
                        TS_CASE("topk_moe", 120),
                        TS_TESTS(fires_on_softmax_norm, fires_on_every_variant, fires_on_every_size,
                                 no_fusion_when_illegal, tail_stops_at_an_illegal_step, ties_by_index,
                                 qwen3moe_example_fuses_its_routing, kernels_compile));
    return ts_main(s);
}
