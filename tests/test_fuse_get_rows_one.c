/* Pass get_rows_one (ir/fuse_get_rows_one.c): a get_rows of the one row of an f32 source by one
 * id (llama.cpp's pick of the output token in the last layer, at decode) is its source read in
 * place, so the residual add joins the GEMV before it (pass add_chain) as in every other
 * layer. It fires for a GEMV's result and for an input; the outputs are the unfused graph's
 * bits; it leaves the graph alone for a source of two rows, an f16 source, two ids, a state
 * source and a second reader; --no-fuse=get_rows_one keeps the kernels. The ids come from an
 * argmax over one value (always 0), the only id in range, so the CPU reference (which runs
 * unfused and rejects ids out of range) has valid inputs. No GPU. */
#include "tests/support.h"

#include <stdio.h>

/* y = w x; r = get_rows(y, ids), q = get_rows(h, ids); z = r + q. `src` declares x, h (and may
 * replace the rest); `tail` is appended. */
static char *graph(const char *src, const char *ids_n, const char *tail) {
    static char kg[2048];
    snprintf(kg, sizeof kg,
             "%s"
             "input s: f32[%s]\nids = argmax(s)\nweight w: bf16[64, 64]\ny = mul_mat(w, x)\n"
             "r = get_rows(y, ids)\nq = get_rows(h, ids)\noutput z = add(r, q)\n%s",
             src, ids_n, tail ? tail : "");
    return kg;
}

static const char *const ONE_ROW = "input x: f32[64]\ninput h: f32[64]\n";

START_TEST(fires) {
    /* both get_rows fold; the add then joins the GEMV: argmax + one GEMV */
    ts_expect_fusion(graph(ONE_ROW, "1", NULL), NULL, "fused add_chain: y, r, q, z\n", "get_rows nodes", 2);
}
END_TEST

START_TEST(skipped) {
    /* --no-fuse=get_rows_one: argmax, GEMV, two get_rows, add */
    ts_expect_fusion(graph(ONE_ROW, "1", NULL), "get_rows_one", "get_rows nodes: r\n", "fused add_chain", 5);
}
END_TEST

START_TEST(not_fired) {
    /* h of two rows: its get_rows stays (y's folds; it is still one row) */
    ts_expect_fusion("input x: f32[64]\ninput h2: f32[64, 2]\ninput s: f32[1]\nids = argmax(s)\ninput s2: f32[2]\n"
                     "ids2 = argmax(s2)\nweight w: bf16[64, 64]\ny = mul_mat(w, x)\nr = get_rows(y, ids)\n"
                     "q = get_rows(h2, ids2)\n"
                     "output z = add(r, q)\n",
                     NULL, "get_rows nodes: q\n", "get_rows nodes: r\n", -1);
    /* an f16 source: get_rows converts, so it is no view */
    ts_expect_fusion("input x: f32[64]\ninput h: f16[64]\ninput s: f32[1]\nids = argmax(s)\n"
                     "weight w: bf16[64, 64]\ny = mul_mat(w, x)\nr = get_rows(y, ids)\nq = get_rows(h, ids)\n"
                     "output z = add(r, q)\n",
                     NULL, "get_rows nodes: q\n", "get_rows nodes: r\n", -1);
    /* two ids: two rows out */
    ts_expect_fusion("input x: f32[64]\ninput h: f32[64]\ninput s: f32[1, 2]\nids = argmax(s)\n"
                     "weight w: bf16[64, 64]\ny = mul_mat(w, x)\nr = get_rows(y, ids)\noutput z = scale(r, 2)\n",
                     NULL, "get_rows nodes: r\n", NULL, -1);
    /* a second reader of the get_rows' result */
    ts_expect_fusion(graph(ONE_ROW, "1", "output z2 = scale(q, 3)\n"), NULL, "get_rows nodes: q\n", NULL, -1);
    /* a state source: written in place, it may change between the pick and its reader */
    ts_expect_fusion("input x: f32[64]\nstate h: f32[64]\ninput s: f32[1]\nids = argmax(s)\n"
                     "weight w: bf16[64, 64]\ny = mul_mat(w, x)\nr = get_rows(y, ids)\nq = get_rows(h, ids)\n"
                     "output z = add(r, q)\n",
                     NULL, "get_rows nodes: q\n", "get_rows nodes: r\n", -1);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("fuse_get_rows_one",
                        TS_CASE("pass", 60), TS_TESTS(fires, skipped, not_fired));
    return ts_main(s);
}
