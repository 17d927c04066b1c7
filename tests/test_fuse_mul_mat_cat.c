/* Pass mul_mat_cat (ir/fuse_mul_mat_cat.c): mul_mats sharing an input become one mul_mat over a
 * block of their weights. It fires on q/k/v projections read through reshapes, permutes,
 * transposes and ops; it leaves out each member that cannot join (another input, another weight
 * type or row length, a weight whose bytes would misalign the next one, a graph output, a read
 * that crosses columns) and fuses the rest; the CPU reference gives bit-identical outputs with
 * and without it; the verifier rejects a weight placed outside its block. No GPU needed. */
#include "tests/support.h"

#include "ir/ir_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every other fusion pass is skipped, so that counts and texts are this pass's own. */
static const char *const OTHERS = "rope_set_rows,topk_moe,mul_mat_glu,rms_norm_mul,add_chain,rms_norm_gemv,ew_chain";

/* q, k, v of one x (k of x2 when `k_x2`), read as attention reads them; wk's type and rows
 * given, so a case can break one member. `q_out` makes q a graph output; `k_flat` reads k as one
 * flat row (across its columns). */
static char *qkv_kg(const char *wt, const char *kt, int kr, int n, bool k_x2, bool q_out, bool k_flat) {
    static char kg[2048];
    char        kread[96];
    if (k_flat) snprintf(kread, sizeof kread, "kf = reshape(k, [%d])\noutput ok = sum_rows(kf)\n", kr * n);
    else snprintf(kread, sizeof kread, "output ok = sum_rows(k)\n");
    snprintf(kg, sizeof kg,
             "weight wq: %s[64, 128]\nweight wk: %s[64, %d]\nweight wv: %s[64, 32]\n"
             "input x: f32[64, %d]\ninput x2: f32[64, %d]\n"
             "%sq = mul_mat(wq, x)\nk = mul_mat(wk, %s)\nv = mul_mat(wv, x)\n"
             "q3 = reshape(q, [16, 8, %d])\nqp = permute(q3, 0, 2, 1, 3)\noutput oq = scale(qp, 0.5)\n"
             "%svt = transpose(v)\noutput ov = cont(vt)\n",
             wt, kt, kr, wt, n, n, q_out ? "output " : "", k_x2 ? "x2" : "x", n, kread);
    return kg;
}

/* kg fuses `nodes` (or nothing when NULL) into `kernels` kernels, with the reference's bits. */
static void expect(const char *kg, const char *nodes, int kernels) {
    char want[128];
    snprintf(want, sizeof want, "fused mul_mat_cat: %s\n", nodes ? nodes : "");
    ts_expect_fusion(kg, OTHERS, nodes ? want : NULL, nodes ? NULL : "mul_mat_cat", kernels);
}

/* All three, every weight type, one column and a batch: 1 matmul + scale + sum_rows + cont. */
START_TEST(fires_qkv) {
    static const char *wts[3] = {"bf16", "f16", "f32"};
    const char *wt = wts[_i % 3];
    int         n = _i < 3 ? 1 : 5;
    expect(qkv_kg(wt, wt, 32, n, false, false, false), "q, k, v", 4);
}
END_TEST

/* Quantized weights join too (their device tiles concatenate: templates/quant.lua), one type a
 * block; a member of another type stays out. (For q8_0, q4_0 and q6_K, IR_ALIGN's rule already
 * implies the pass's whole tiles of 8 blocks: 34, 18 and 210 bytes need 128 blocks.) */
START_TEST(fires_quantized) {
    static const char *wts[3] = {"q8_0", "q4_K", "q4_0"};
    char kg[512];
    snprintf(kg, sizeof kg,
             "weight wq: %s[256, 128]\nweight wk: %s[256, 32]\nweight wv: %s[256, 32]\ninput x: f32[256, 1]\n"
             "q = mul_mat(wq, x)\nk = mul_mat(wk, x)\nv = mul_mat(wv, x)\n"
             "output oq = scale(q, 0.5)\noutput ok = sum_rows(k)\noutput ov = scale(v, 2)\n",
             wts[_i], wts[_i], _i == 1 ? "q6_K" : wts[_i]);
    expect(kg, _i == 1 ? "q, k" : "q, k, v", _i == 1 ? 5 : 4);
}
END_TEST

/* q, k, v with biases (qwen2, gpt-oss) as add_chain fuses them: one mul_mat over the weight
 * block, one add over the bias block; a member without a bias, or whose bias bytes would
 * misalign the next one (32 f32: 128 bytes), stays out. */
static char *qkv_bias_kg(const char *kb, int kr) {
    static char kg[1024];
    snprintf(kg, sizeof kg,
             "weight wq: bf16[64, 128]\nweight wk: bf16[64, %d]\nweight wv: bf16[64, 64]\n"
             "weight bq: f32[128]\nweight bk: f32[%d]\nweight bv: f32[64]\ninput x: f32[64, 2]\n"
             "q = mul_mat(wq, x)\nqb = add(q, bq)\nk = mul_mat(wk, x)\n%s\nv = mul_mat(wv, x)\nvb = add(v, bv)\n"
             "output oq = sum_rows(qb)\noutput ok = sum_rows(kb)\noutput ov = sum_rows(vb)\n",
             kr, kr, kb);
    return kg;
}

START_TEST(fires_with_biases) {
    static const char *const ADD_CHAIN = "rope_set_rows,topk_moe,mul_mat_glu,rms_norm_mul,rms_norm_gemv,ew_chain";
    ts_expect_fusion(qkv_bias_kg("kb = add(k, bk)", 64), ADD_CHAIN, "fused add_chain+mul_mat_cat: q, qb, k, kb, v, vb\n",
                     NULL, 4);
    ts_expect_fusion(qkv_bias_kg("kb = scale(k, 2)", 64), ADD_CHAIN, "fused add_chain+mul_mat_cat: q, qb, v, vb\n", NULL,
                     5); /* k has no bias (bk unused) */
    ts_expect_fusion(qkv_bias_kg("kb = add(k, bk)", 32), ADD_CHAIN, "fused add_chain+mul_mat_cat: q, qb, v, vb\n", NULL,
                     5); /* bk of 128 bytes */
}
END_TEST

/* One member cannot join; the other two still do. */
START_TEST(leaves_one_out) {
    expect(qkv_kg("bf16", "bf16", 32, 3, true, false, false), "q, v", 5);  /* another input */
    expect(qkv_kg("bf16", "f16", 32, 3, false, false, false), "q, v", 5);  /* another type */
    expect(qkv_kg("bf16", "bf16", 3, 3, false, false, false), "q, v", 5);   /* 384 bytes: misaligns */
    expect(qkv_kg("bf16", "bf16", 32, 3, false, false, true), "q, v", 5);  /* read across columns */
    expect(qkv_kg("bf16", "bf16", 32, 1, false, false, true), "q, k, v", 4); /* one column: any read maps */
    expect(qkv_kg("bf16", "bf16", 32, 3, false, true, false), "k, v", 5);  /* q is an output */
}
END_TEST

/* Nothing to join: another input and another row length leave a single member each. */
START_TEST(not_fired) {
    expect("weight wa: bf16[64, 32]\nweight wb: bf16[128, 32]\ninput x: f32[64, 2]\ninput y: f32[128, 2]\n"
           "a = mul_mat(wa, x)\nb = mul_mat(wb, y)\noutput o = add(a, b)\n",
           NULL, 3);
    expect("weight wa: bf16[64, 32]\nweight wb: bf16[64, 32]\ninput x: f32[64, 2]\ninput y: f32[64, 2]\n"
           "a = mul_mat(wa, x)\nb = mul_mat(wb, y)\noutput o = add(a, b)\n",
           NULL, 3);
}
END_TEST

/* The weights keep their names and sizes; the block holds them in order; a member placed past
 * its block's end is refused by the verifier. */
START_TEST(block_layout) {
    kiln_ctx   *ctx;
    kiln_graph *g = ts_build(qkv_kg("bf16", "bf16", 32, 2, false, false, false), &ctx);
    ir_prog *p;
    TS_OK(ir_lower(g, &p));
    TS_OK(ir_run_passes(p, true, OTHERS));
    int blk = -1;
    for (int b = 0; b < p->nbufs; b++)
        if (p->bufs[b].kind == IR_BUF_BLOCK) blk = b;
    ck_assert_int_ge(blk, 0);
    ck_assert_int_eq(p->bufs[blk].ne[0], 64);
    ck_assert_int_eq(p->bufs[blk].ne[1], 192);
    size_t want[3] = {0, 64 * 128 * 2, 64 * 160 * 2};
    const char *names[3] = {"wq", "wk", "wv"};
    for (int b = 0, k = 0; b < p->nbufs; b++) {
        if (p->bufs[b].kind != IR_BUF_WEIGHT) continue;
        ck_assert_str_eq(p->bufs[b].name, names[k]);
        ck_assert_int_eq(p->bufs[b].block, blk + 1);
        ck_assert_uint_eq(p->bufs[b].offset, want[k++]);
    }
    for (int b = 0; b < p->nbufs; b++)
        if (p->bufs[b].kind == IR_BUF_WEIGHT && !strcmp(p->bufs[b].name, "wv")) p->bufs[b].offset = 64 * 192 * 2;
    kiln_status st = ir_verify(p);
    ck_assert_msg(st && strstr(kiln_status_msg(st), "'wv' is not a weight inside the weight block"), "%s",
                  st ? kiln_status_msg(st) : "accepted");
    kiln_status_free(st);
    ir_prog_free(p);
    ts_graph_free(g, ctx);
}
END_TEST

/* The Llama layer example fuses q, k and v and prints the block. */
START_TEST(example_inspect) {
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s inspect %s/examples/llama-layer.kg", ts_kiln_bin(), ts_src_dir());
    int rc = ts_run(cmd, &out);
    ck_assert_msg(rc == 0 && strstr(out, "fused mul_mat_cat: Qcur, Kcur, Vcur") &&
                      strstr(out, "weight wk bf16[2048, 512] 2097152 bytes in b") && strstr(out, "block  wq+2 bf16[2048, 3072]"),
                  "rc %d:\n%s", rc, out ? out : "");
    free(out);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("fuse_mul_mat_cat",
                        TS_CASE("pass", 120), TS_LOOP(0, 6, fires_qkv), TS_LOOP(0, 3, fires_quantized),
                        TS_TESTS(fires_with_biases, leaves_one_out, not_fired, block_layout, example_inspect));
    return ts_main(s);
}
