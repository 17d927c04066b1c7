/* Pass mul_mat_glu (ir/fuse_mul_mat_glu.c): it fires on gate/up mul_mat (and mul_mat_id) pairs
 * feeding a GLU, with and without bias adds, in either operand order; it leaves every broken
 * variant alone; the CPU reference gives bit-identical outputs with and without it (the fused
 * node rounds every value as the graph stored it); and the fused kernels of every matmul plan
 * (gemv, tile, tensor-core tile, cuBLAS, mul_mat_id decode and prefill) compile with NVRTC for
 * sm_90a and sm_80 without warnings. No GPU needed. */
#include "tests/support.h"

#include "codegen/codegen.h"
#include "ir/ir.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every fusion pass but this one is skipped, so that counts and texts are this pass's own. */
static const char *const OTHERS = "rope_set_rows,topk_moe,rms_norm_mul,add_chain,mul_mat_cat,rms_norm_gemv,ew_chain";

static const char *const GLUS[] = {"swiglu", "geglu", "reglu", "geglu_erf", "geglu_quick", "swiglu_oai"};
#define NGLU (int)(sizeof GLUS / sizeof GLUS[0])

/* The GLU call: swiglu_oai takes alpha and limit. */
static void glu_call(char *out, size_t n, const char *glu, const char *x, const char *g) {
    if (!strcmp(glu, "swiglu_oai")) snprintf(out, n, "%s(%s, %s, alpha=1.5, limit=6)", glu, x, g);
    else snprintf(out, n, "%s(%s, %s)", glu, x, g);
}

/* Dense: gate and up of one x; `up_first` puts up's node first, `gate_x` makes gate the GLU's
 * first operand (else up), `bias` adds a bias to gate (1: a [M] vector broadcast over the
 * columns), up (2: an [M, N] one, as the add's first operand) or both (3). */
static char *dense_kg(const char *wt, int K, int M, int N, const char *glu, bool up_first, bool gate_x, int bias) {
    static char kg[2048];
    char        call[128], gname[16], uname[16];
    snprintf(gname, sizeof gname, "%s", bias & 1 ? "gate_b" : "gate");
    snprintf(uname, sizeof uname, "%s", bias & 2 ? "up_b" : "up");
    glu_call(call, sizeof call, glu, gate_x ? gname : uname, gate_x ? uname : gname);
    const char *g = "gate = mul_mat(wg, x)\n", *u = "up = mul_mat(wu, x)\n";
    snprintf(kg, sizeof kg,
             "weight wg: %s[%d, %d]\nweight wu: %s[%d, %d]\nweight bg: f32[%d]\nweight bu: f32[%d, %d]\n"
             "input x: f32[%d, %d]\n%s%s%s%soutput y = %s\n",
             wt, K, M, wt, K, M, M, M, N, K, N, up_first ? u : g, up_first ? g : u,
             bias & 1 ? "gate_b = add(gate, bg)\n" : "", bias & 2 ? "up_b = add(bu, up)\n" : "", call);
    return kg;
}

static char *moe_kg(const char *wt, int K, int M, int E, int U, int T, const char *glu, int bias) {
    static char kg[2048];
    char        call[128];
    glu_call(call, sizeof call, glu, bias & 1 ? "gate_b" : "gate", bias & 2 ? "up_b" : "up");
    snprintf(kg, sizeof kg,
             "weight wg: %s[%d, %d, %d]\nweight wu: %s[%d, %d, %d]\nweight bg: f32[%d]\n"
             "input x: f32[%d, 1, %d]\ninput ids: i32[%d, %d]\n"
             "up = mul_mat_id(wu, x, ids)\ngate = mul_mat_id(wg, x, ids)\n%s%soutput y = %s\n",
             wt, K, M, E, wt, K, M, E, M, K, T, U, T, bias & 1 ? "gate_b = add(gate, bg)\n" : "",
             bias & 2 ? "up_b = add(up, bg)\n" : "", call);
    return kg;
}

/* gpt-oss's experts: per-expert biases (add_id, [M, E]) on gate (bias & 1) and up (bias & 2);
 * with `down`, a down projection of the GLU's result with its own add_id (pass
 * mul_mat_id_bias). E = 16 keeps the test fill's ids (0..15) in range: add_id refuses others. */
static char *moe_id_kg(const char *wt, int K, int M, int U, int T, int bias, bool down) {
    static char kg[2048];
    char        call[128], tail[512] = "";
    glu_call(call, sizeof call, "swiglu_oai", bias & 1 ? "gate_b" : "gate", bias & 2 ? "up_b" : "up");
    if (down)
        snprintf(tail, sizeof tail, "weight wd: %s[%d, %d, 16]\nweight bd: f32[%d, 16]\nd = mul_mat_id(wd, y, ids)\n"
                 "output od = add_id(d, bd, ids)\n", wt, M, K, K);
    snprintf(kg, sizeof kg,
             "weight wg: %s[%d, %d, 16]\nweight wu: %s[%d, %d, 16]\nweight bg: f32[%d, 16]\nweight bu: f32[%d, 16]\n"
             "input x: f32[%d, 1, %d]\ninput ids: i32[%d, %d]\n"
             "up = mul_mat_id(wu, x, ids)\ngate = mul_mat_id(wg, x, ids)\n%s%s%s y = %s\n%s",
             wt, K, M, wt, K, M, M, M, K, T, U, T, bias & 1 ? "gate_b = add_id(gate, bg, ids)\n" : "",
             bias & 2 ? "up_b = add_id(up, bu, ids)\n" : "", down ? "" : "output", call, tail);
    return kg;
}

/* kg fuses into one kernel listing `nodes`, and the reference gives the same bits. */
static void expect_fused(const char *kg, const char *nodes) {
    int   live;
    char *text;
    double d = ts_fusion_compare(kg, OTHERS, &live, &text);
    char want[256];
    snprintf(want, sizeof want, "fused mul_mat_glu: %s\n", nodes);
    ck_assert_msg(strstr(text, want), "no '%s' in:\n%s\ngraph:\n%s", want, text, kg);
    ck_assert_msg(live == 1, "%d kernels, want 1:\n%s", live, text);
    ck_assert_msg(d == 0, "fused differs from unfused by %g:\n%s", d, kg);
    free(text);
}

/* kg does not fuse: no mul_mat_glu line, `kernels` kernels; the reference agrees anyway. */
static void expect_unfused(const char *kg, int kernels) {
    int   live;
    char *text;
    double d = ts_fusion_compare(kg, OTHERS, &live, &text);
    ck_assert_msg(!strstr(text, "mul_mat_glu"), "fused:\n%s\ngraph:\n%s", text, kg);
    ck_assert_msg(live == kernels, "%d kernels, want %d:\n%s", live, kernels, text);
    ck_assert_msg(d == 0, "differs by %g:\n%s", d, kg);
    free(text);
}

/* Every GLU, node order and operand order, f32/f16/bf16 weights, decode and batch. */
START_TEST(fires_dense) {
    static const char *wts[3] = {"bf16", "f16", "f32"};
    const char *glu = GLUS[_i % NGLU];
    for (int v = 0; v < 4; v++) {
        bool up_first = v & 1, gate_x = v & 2;
        const char *kg = dense_kg(wts[(_i + v) % 3], 64, 48, v == 3 ? 5 : 1, glu, up_first, gate_x, 0);
        expect_fused(kg, up_first ? "up, gate, y" : "gate, up, y");
    }
}
END_TEST

/* Bias adds on gate, up or both (a [M] and an [M, 1] bias broadcast over the columns). */
START_TEST(fires_with_bias) {
    for (int bias = 1; bias <= 3; bias++)
        for (int gate_x = 0; gate_x < 2; gate_x++) {
            const char *kg = dense_kg("bf16", 64, 48, 3, GLUS[(bias + gate_x) % NGLU], false, gate_x, bias);
            const char *nodes = bias == 1 ? "gate, up, gate_b, y" : bias == 2 ? "gate, up, up_b, y" : "gate, up, gate_b, up_b, y";
            expect_fused(kg, nodes);
        }
}
END_TEST

/* mul_mat_id: decode and prefill token counts, 16 of which ids pick 12 experts (some invalid:
 * zero rows), with and without biases. */
START_TEST(fires_moe) {
    static const int T[3] = {1, 4, 9};
    for (int bias = 0; bias < 4; bias += 3) {
        const char *kg = moe_kg(_i % 2 ? "f16" : "bf16", 64, 40, 12, 4, T[_i], GLUS[_i], bias);
        expect_fused(kg, bias ? "up, gate, gate_b, up_b, y" : "up, gate, y");
    }
}
END_TEST

/* add_id biases (gpt-oss): on gate, up or both, decode and prefill token counts, bf16 and a
 * quantized type; the down projection's add_id joins its mul_mat_id (mul_mat_id_bias). */
START_TEST(fires_moe_add_id) {
    static const int T[2] = {1, 5};
    for (int bias = 1; bias <= 3; bias++) {
        const char *kg = moe_id_kg(bias == 2 ? "q8_0" : "bf16", 64, 40, 4, T[_i], bias, false);
        expect_fused(kg, bias == 1 ? "up, gate, gate_b, y" : bias == 2 ? "up, gate, up_b, y" : "up, gate, gate_b, up_b, y");
    }
    int   live;
    char *text;
    const char *kg = moe_id_kg("mxfp4", 64, 64, 4, T[_i], 3, true);
    double d = ts_fusion_compare(kg, OTHERS, &live, &text);
    ck_assert_msg(strstr(text, "fused mul_mat_glu: up, gate, gate_b, up_b, y\n") &&
                      strstr(text, "fused mul_mat_id_bias: d, od\n") && strstr(text, "(rows by ids)"),
                  "%s\ngraph:\n%s", text, kg);
    ck_assert_msg(live == 2, "%d kernels, want 2:\n%s", live, text);
    ck_assert_msg(d == 0, "fused differs from unfused by %g:\n%s", d, kg);
    free(text);
    /* another ids, or a bias of other rows: apart */
    kg = "weight w: bf16[64, 40, 16]\nweight b: f32[40, 16]\nweight b2: f32[40, 8]\ninput x: f32[64, 1, 2]\n"
         "input i1: i32[4, 2]\ninput i2: i32[4, 2]\nt = mul_mat_id(w, x, i1)\noutput y = add_id(t, b, i2)\n";
    d = ts_fusion_compare(kg, OTHERS, &live, &text);
    ck_assert_msg(!strstr(text, "mul_mat_id_bias") && live == 2 && d == 0, "%s", text);
    free(text);
}
END_TEST

/* The halves form (phi3's gate_up): one product of 2n rows, the GLU of its halves, either half
 * the GLU's x, decode and a batch, a float and a quantized weight. */
static char *halves_kg(const char *wt, int N, bool x_first, const char *glu) {
    static char kg[1024];
    char        call[128];
    glu_call(call, sizeof call, glu, x_first ? "a" : "b", x_first ? "b" : "a");
    snprintf(kg, sizeof kg,
             "weight w: %s[64, 96]\ninput x: f32[64, %d]\nt = mul_mat(w, x)\n"
             "a = view(t, [48, %d], [384], 0)\nb = view(t, [48, %d], [384], 192)\noutput y = %s\n",
             wt, N, N, N, call);
    return kg;
}

START_TEST(fires_halves) {
    for (int v = 0; v < 4; v++) expect_fused(halves_kg(_i ? "q8_0" : "bf16", v & 1 ? 3 : 1, v & 2, GLUS[(v + _i) % NGLU]), "t, y");
    /* a half that is not one (rows 8..56), or t read elsewhere: apart */
    expect_unfused("weight w: bf16[64, 96]\ninput x: f32[64, 1]\nt = mul_mat(w, x)\na = view(t, [48, 1], [384], 0)\n"
                   "b = view(t, [48, 1], [384], 32)\noutput y = swiglu(a, b)\n", 2);
    expect_unfused("weight w: bf16[64, 96]\ninput x: f32[64, 1]\nt = mul_mat(w, x)\na = view(t, [48, 1], [384], 0)\n"
                   "b = view(t, [48, 1], [384], 192)\noutput y = swiglu(a, b)\noutput s = sum_rows(t)\n", 3);
}
END_TEST

/* Broken variants: each leaves the nodes alone. */
START_TEST(not_fired) {
    const char *head = "weight wg: bf16[64, 48]\nweight wu: bf16[64, 48]\ninput x: f32[64, 2]\n";
    char kg[2048];
    /* gate is also an output */
    snprintf(kg, sizeof kg, "%sup = mul_mat(wu, x)\noutput gate = mul_mat(wg, x)\noutput y = swiglu(gate, up)\n", head);
    expect_unfused(kg, 3);
    /* up has another reader */
    snprintf(kg, sizeof kg, "%sup = mul_mat(wu, x)\ngate = mul_mat(wg, x)\noutput y = swiglu(gate, up)\noutput z = scale(up, 2, 0)\n", head);
    expect_unfused(kg, 4);
    /* weights of different types */
    snprintf(kg, sizeof kg, "weight wg: bf16[64, 48]\nweight wu: f16[64, 48]\ninput x: f32[64, 2]\n"
                            "up = mul_mat(wu, x)\ngate = mul_mat(wg, x)\noutput y = swiglu(gate, up)\n");
    expect_unfused(kg, 3);
    /* different inputs */
    snprintf(kg, sizeof kg, "%sinput x2: f32[64, 2]\nup = mul_mat(wu, x2)\ngate = mul_mat(wg, x)\noutput y = swiglu(gate, up)\n", head);
    expect_unfused(kg, 3);
    /* (the one-tensor form, halves of one product, is the halves form: it fuses) */
    snprintf(kg, sizeof kg, "weight w: bf16[64, 96]\ninput x: f32[64, 2]\ngu = mul_mat(w, x)\noutput y = swiglu(gu)\n");
    expect_fused(kg, "gu, y");
    snprintf(kg, sizeof kg, "weight w: bf16[64, 96]\ninput x: f32[64, 2]\ngu = mul_mat(w, x)\noutput y = swiglu(gu, swapped=true)\n");
    expect_fused(kg, "gu, y");
    /* the bias add's result has another reader */
    snprintf(kg, sizeof kg, "%sweight bg: f32[48]\nup = mul_mat(wu, x)\ngate = mul_mat(wg, x)\ngb = add(gate, bg)\n"
                            "output y = swiglu(gb, up)\noutput z = scale(gb, 2, 0)\n", head);
    expect_unfused(kg, 5);
    /* a bias that the add broadcasts the product over (the add's result is wider than the product) */
    snprintf(kg, sizeof kg, "weight wg: bf16[64, 48]\nweight wu: bf16[64, 48]\ninput x: f32[64, 1]\ninput bb: f32[48, 3]\n"
                            "input u3: f32[48, 3]\ngate = mul_mat(wg, x)\ngb = add(bb, gate)\noutput y = swiglu(gb, u3)\n");
    expect_unfused(kg, 3);
    /* a GLU of a product and a non-product; a mul_mat and a mul_mat_id */
    snprintf(kg, sizeof kg, "%sinput u: f32[48, 2]\ngate = mul_mat(wg, x)\noutput y = swiglu(gate, u)\n", head);
    expect_unfused(kg, 2);
    /* mul_mat_id with different ids */
    snprintf(kg, sizeof kg, "weight wg: bf16[64, 40, 8]\nweight wu: bf16[64, 40, 8]\ninput x: f32[64, 1, 2]\n"
                            "input i1: i32[2, 2]\ninput i2: i32[2, 2]\nup = mul_mat_id(wu, x, i1)\n"
                            "gate = mul_mat_id(wg, x, i2)\noutput y = swiglu(gate, up)\n");
    expect_unfused(kg, 3);
    /* a product fed to a GLU with itself */
    snprintf(kg, sizeof kg, "%sgate = mul_mat(wg, x)\noutput y = swiglu(gate, gate)\n", head);
    expect_unfused(kg, 2);
}
END_TEST

/* The fused node passes ir_verify, prints its pairing, and with --no-fuse=mul_mat_glu stays apart. */
START_TEST(verify_and_skip) {
    const char *kg = dense_kg("bf16", 64, 48, 1, "swiglu", true, true, 3);
    kiln_ctx   *ctx;
    kiln_graph *g = ts_build(kg, &ctx);
    ir_prog *p;
    TS_OK(ir_lower(g, &p));
    TS_OK(ir_fuse_mul_mat_glu(p));
    TS_OK(ir_verify(p));
    int live = 0;
    const ir_node *f = NULL;
    for (int i = 0; i < p->nnodes; i++)
        if (!p->nodes[i].dead) live++, f = &p->nodes[i];
    ck_assert_int_eq(live, 1);
    ck_assert(f->paired && f->ninstr == 3 && f->op == FE_OP_MUL_MAT);
    ck_assert_int_eq(f->nsrc, 5);
    ir_prog_free(p);
    TS_OK(ir_lower(g, &p));
    TS_OK(ir_run_passes(p, true, "mul_mat_glu"));
    kb_str o = {0};
    ir_print(p, &o);
    ck_assert_msg(!strstr(o.s, "mul_mat_glu"), "%s", o.s);
    kb_str_free(&o);
    ir_prog_free(p);
    ts_graph_free(g, ctx);
}
END_TEST

static char *g_cache;

/* Every plan's fused kernels compile cleanly; the fused node says so in its sources. */
typedef struct {
    const char *kg;
    const char *want; /* in the fused node's sources */
} gcase;

static gcase GCASES[16];
static int   NGCASES;

static void make_gcases(void) {
    static char buf[16][2048];
    int         n = 0;
#define ADD(text, w)                                                                            \
    do {                                                                                        \
        snprintf(buf[n], sizeof buf[n], "%s", text);                                            \
        GCASES[n].kg = buf[n];                                                                  \
        GCASES[n++].want = (w);                                                                 \
    } while (0)
    ADD(dense_kg("bf16", 256, 96, 1, "swiglu", false, true, 0), "mul_mat_gemv_pair_bf16");
    ADD(dense_kg("f16", 300, 37, 1, "geglu", true, false, 3), "mul_mat_gemv_pair_f16");
    ADD(dense_kg("f32", 8192, 16, 1, "swiglu_oai", false, true, 1), "mul_mat_gemv_pair_f32"); /* one team per block */
    ADD(dense_kg("bf16", 256, 96, 3, "swiglu", false, true, 2), "mul_mat_mma_");
    ADD(dense_kg("f32", 100, 33, 16, "reglu", false, true, 0), "mul_mat_n16_f32");
    ADD(dense_kg("bf16", 256, 96, 64, "geglu_erf", false, true, 3), "mul_mat_epilogue_pair");
    ADD(moe_kg("bf16", 256, 96, 16, 4, 1, "swiglu", 0), "mul_mat_id_gemv_pair_bf16");
    ADD(moe_kg("f16", 200, 37, 16, 4, 4, "geglu_quick", 3), "mul_mat_id_gemv_pair_f16");
    ADD(moe_kg("bf16", 256, 96, 16, 4, 64, "swiglu", 1), "mul_mat_id_epilogue_pair");
    ADD(moe_kg("f32", 100, 40, 16, 4, 9, "swiglu", 0), "mul_mat_id_fma");
    /* per-expert biases read through the ids (add_id): quantized decode, bf16 decode, prefill */
    ADD(moe_id_kg("mxfp4", 256, 96, 4, 1, 3, false), "mul_mat_id_qgemv_pair_mxfp4");
    ADD(moe_id_kg("bf16", 256, 96, 4, 1, 1, false), "mul_mat_id_gemv_pair_bf16");
    ADD(moe_id_kg("q4_0", 256, 96, 4, 64, 2, false), "mul_mat_id_epilogue_pair");
    ADD(halves_kg("bf16", 1, true, "swiglu"), "mul_mat_gemv_pair_bf16"); /* phi3's gate_up halves */
    ADD(halves_kg("q4_0", 1, false, "geglu"), "mul_mat_qgemv_pair_q4_0");
#undef ADD
    NGCASES = n;
}

static bool paired(const ir_node *n) { return n->paired; }

START_TEST(kernels_compile) { ts_kernels_want(GCASES[_i].kg, g_cache, paired, GCASES[_i].want, _i); }
END_TEST

/* Both example layers show the fusion. */
START_TEST(examples_fuse) {
    static const char *files[2] = {"examples/llama-layer.kg", "examples/qwen3moe-layer.kg"};
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s inspect %s/%s", ts_kiln_bin(), ts_src_dir(), files[_i]);
    int rc = ts_run(cmd, &out);
    ck_assert_msg(rc == 0 && strstr(out, "fused mul_mat_glu: up, gate, "), "rc %d:\n%s", rc, out ? out : "");
    free(out);
}
END_TEST

int main(void) {
    make_gcases(); /* NGCASES */
    Suite *s = TS_SUITE("fuse_glu",
                        TS_CASE("pass", 120), TS_LOOP(0, NGLU, fires_dense), TS_TESTS(fires_with_bias),
                        TS_LOOP(0, 3, fires_moe), TS_LOOP(0, 2, fires_moe_add_id), TS_LOOP(0, 2, fires_halves), TS_TESTS(not_fired, verify_and_skip),
                        TS_CASE("codegen", 600), TS_LOOP(0, NGCASES, kernels_compile), TS_LOOP(0, 2, examples_fuse));
    return ts_main_cache(s, "fuse-glu-test", &g_cache);
}
