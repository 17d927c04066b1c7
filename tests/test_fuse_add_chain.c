/* Pass add_chain: where it fires, where it must not, and that the CPU reference computes the same
 * outputs with and without it. */
#include "tests/support.h"

#include <stdlib.h>
#include <string.h>

/* A MoE expert sum as llama.cpp builds it: 4 slots of 16 features, 2 tokens. */
#define MOE_HEAD                                                                                  \
    "input experts: f32[16, 4, 2]\ninput w: f32[1, 4, 2]\ninput res: f32[16, 2]\n"                \
    "weighted = mul(experts, w)\n"                                                                \
    "e0 = view(weighted, [16, 2], [256], 0)\ne1 = view(weighted, [16, 2], [256], 64)\n"           \
    "e2 = view(weighted, [16, 2], [256], 128)\ne3 = view(weighted, [16, 2], [256], 192)\n"        \
    "s1 = add(e0, e1)\ns2 = add(s1, e2)\n"

static void expect(const char *kg, const char *skip, int live, const char *needle, bool present) {
    int   n;
    char *ir;
    double d = ts_fusion_compare(kg, skip, &n, &ir);
    ck_assert_msg(d == 0, "fused and unfused outputs differ by %g\n%s", d, ir);
    ck_assert_msg(n == live, "%d kernels, expected %d\n%s", n, live, ir);
    ck_assert_msg(!needle || (strstr(ir, needle) != NULL) == present, "'%s' %s expected\n%s", needle,
                  present ? "is" : "is not", ir);
    free(ir);
}

START_TEST(moe_sum_is_one_kernel) {
    /* the products are recomputed per slot and summed in the graph's order: bit for bit */
    const char *kg = MOE_HEAD "s3 = add(s2, e3)\noutput out = add(s3, res)\n";
    expect(kg, NULL, 1, "fused add_chain: weighted, s1, s2, s3, out\n", true);
    expect(kg, "ew_chain", 1, "fused add_chain:", true);
    expect(kg, "add_chain", 2, "fused add_chain", false);
}
END_TEST

START_TEST(add_chain_alone) {
    expect("input a: f32[8, 3]\ninput b: f32[8, 3]\ninput c: f32[8]\ninput d: f32[8, 3]\n"
           "s = add(a, b)\nt = add(s, c)\noutput u = add(t, d)\n",
           "ew_chain", 1, "fused add_chain: s, t, u\n", true);
}
END_TEST

START_TEST(does_not_fire) {
    /* weighted is also an output: it must be stored, so the slices are not recomputed */
    expect("input experts: f32[16, 4, 2]\ninput w: f32[1, 4, 2]\ninput res: f32[16, 2]\n"
           "output weighted = mul(experts, w)\n"
           "e0 = view(weighted, [16, 2], [256], 0)\ne1 = view(weighted, [16, 2], [256], 64)\n"
           "output out = add(e0, e1)\n",
           "ew_chain", 2, "fused add_chain", false);
    /* weighted has another reader */
    expect(MOE_HEAD "output t = sum_rows(weighted)\noutput out = add(s2, res)\n", "ew_chain", 3,
           "fused add_chain: s1, s2, out", true);
    /* a view whose row stride (32 elements) is not one of weighted's natural strides */
    expect("input experts: f32[16, 4, 2]\ninput w: f32[1, 4, 2]\n"
           "weighted = mul(experts, w)\n"
           "e0 = view(weighted, [16, 2], [128], 0)\ne1 = view(weighted, [16, 2], [128], 64)\n"
           "output out = add(e0, e1)\n",
           "ew_chain", 2, "fused add_chain", false);
    /* an intermediate sum that is an output stays stored */
    expect("input a: f32[8, 3]\ninput b: f32[8, 3]\ninput c: f32[8, 3]\n"
           "output s = add(a, b)\noutput u = add(s, c)\n",
           "ew_chain", 2, "fused add_chain", false);
    /* a chain through a multiply is ew_chain's business, not add_chain's */
    expect("input a: f32[8, 3]\ninput b: f32[8, 3]\ninput c: f32[8, 3]\n"
           "s = mul(a, b)\noutput u = add(s, c)\n",
           "ew_chain", 2, "fused add_chain", false);
}
END_TEST

START_TEST(partial_broadcast) {
    /* w repeats over slots by modulo (2 of 4): a slice at a fixed slot reads w at slot % 2 */
    expect("input experts: f32[16, 4, 2]\ninput w: f32[1, 2, 2]\n"
           "weighted = mul(experts, w)\n"
           "e0 = view(weighted, [16, 2], [256], 0)\ne1 = view(weighted, [16, 2], [256], 192)\n"
           "output out = add(e0, e1)\n",
           "ew_chain", 1, "fused add_chain: weighted, out", true);
    /* but a slice that walks the slots cannot express the modulo: left alone */
    expect("input experts: f32[16, 4, 2]\ninput w: f32[1, 2, 2]\n"
           "weighted = mul(experts, w)\n"
           "t0 = view(weighted, [16, 4], [64], 0)\nt1 = view(weighted, [16, 4], [64], 256)\n"
           "output out = add(t0, t1)\n",
           "ew_chain", 2, "fused add_chain", false);
}
END_TEST

START_TEST(into_matmul) {
    /* the residual add (and a second add) become the projection's epilogue: one kernel */
    expect("weight w: bf16[64, 32]\ninput x: f32[64, 2]\ninput r: f32[32, 2]\ninput r2: f32[32]\n"
           "m = mul_mat(w, x)\ns = add(r, m)\noutput y = add(s, r2)\n",
           "ew_chain", 1, "fused add_chain: m, s, y\n", true);
    /* granite's residual branch, scaled before its add: still the projection's epilogue */
    expect("weight w: bf16[64, 32]\ninput x: f32[64, 2]\ninput r: f32[32, 2]\n"
           "m = mul_mat(w, x)\nms = scale(m, 0.22, 0)\noutput y = add(ms, r)\n",
           "ew_chain", 1, "fused add_chain: m, ms, y\n", true);
    expect("weight w: bf16[64, 32]\ninput x: f32[64, 2]\ninput r: f32[32, 2]\n"
           "m = mul_mat(w, x)\nms = scale(m, 0.22, 0)\noutput y = add(ms, r)\n",
           NULL, 1, "fused add_chain: m, ms, y\n", true);
    /* not when the product is also an output */
    expect("weight w: bf16[64, 32]\ninput x: f32[64, 2]\ninput r: f32[32, 2]\n"
           "output m = mul_mat(w, x)\noutput y = add(r, m)\n",
           "ew_chain", 2, "fused add_chain", false);
    /* nor when the add broadcasts the product over a larger space */
    expect("weight w: bf16[64, 32]\ninput x: f32[64, 1]\ninput r: f32[32, 3]\n"
           "m = mul_mat(w, x)\noutput y = add(r, m)\n",
           "ew_chain", 2, "fused add_chain", false);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("fuse_add_chain",
                        TS_CASE("add_chain", 0),
                        TS_TESTS(moe_sum_is_one_kernel, add_chain_alone, does_not_fire, partial_broadcast,
                                 into_matmul));
    return ts_main(s);
}
