/* Symbolic dims in the rope, rows, moe and sort templates (templates/rope.lua, rows.lua, moe.lua,
 * sort.lua): every symbolic graph of tests/dyn_rope_cases.h generates and compiles with NVRTC for
 * sm_90a and sm_80 without warnings, each symbolic kernel takes the run-time extents (kdims) as its
 * last parameter, the sources of one graph are identical for two bound values (kiln compile
 * --dim); set_rows and rope_set_rows into a state are written in place (no copy of the cache);
 * static kernels in place stay without kdims; what the templates do not support is refused.
 * No GPU needed (tests/gpu/test_gpu_dyn_rope.c runs the same graphs). */
#include "tests/support.h"

#include "base/base.h"
#include "codegen/codegen.h"
#include "ir/ir.h"
#include "tests/dyn_rope_cases.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *g_cache;

static bool is_mine(const ir_node *n) {
    if (n->kind != IR_OP) return false;
    fe_fam fam = fe_ops[n->op].fam;
    return n->fused == IR_FUSED_TOPK_MOE || fam == FE_FAM_ROPE || fam == FE_FAM_ROWS || fam == FE_FAM_SORT;
}

START_TEST(kernels_compile) {
    ts_dyn_kernels(DYN_CASES[_i].kg, DYN_CASES[_i].want, g_cache, is_mine, 0, "rope/rows/moe/sort",
                   ts_case_label(_i));
}
END_TEST

/* kiln compile --dim NAME=V1 and =V2 write the same kernel sources. */
START_TEST(values_identical) {
    const dyn_case *c = &DYN_CASES[_i];
    char            kg[4096];
    snprintf(kg, sizeof kg, "kiln-graph 1\n%s", c->kg);
    ts_sources_identical(kg, c->dim, c->vals[0], c->vals[1], ts_case_label(_i));
}
END_TEST

/* A state written by set_rows / rope_set_rows: the kernel writes only the named rows (no copy
 * blocks, no loop over the cache's rows), with or without symbolic dims, and its grid does not
 * grow with the cache. */
static const struct {
    const char *kg, *kernel;
    unsigned    max_grid;
} IN_PLACE[] = {
    {"input k: f32[128, 8, 1]\ninput pos: i32[1]\ninput kv_idxs: i64[1]\nstate cache_k: f16[1024, 4096]\n"
     "kr = rope_ext(k, pos, n_dims=128, mode=0, n_ctx_orig=131072, freq_base=500000)\n"
     "k_row = reshape(kr, [1024, 1])\nk_cache = set_rows(cache_k, k_row, kv_idxs)\noutput o = view(k_cache, [16], [], 0)\n",
     "rope_set_rows_normal_f32_128_128_f16_i64", 8},
    {"input b: f32[512, 1]\ninput ids: i64[1]\nstate c: f16[512, 4096]\nc2 = set_rows(c, b, ids)\n"
     "output o = view(c2, [8], [], 0)\n",
     "set_rows_inplace_f16_i64_512", 1},
};

START_TEST(in_place) {
    kiln_ctx     *ctx;
    kiln_graph   *g;
    kiln_program *p = ts_compile(IN_PLACE[_i].kg, "sm_90a", g_cache, 1, &ctx, &g);
    bool          found = false;
    for (int i = 0; i < p->nkernels; i++) {
        const cg_kernel *k = &p->kernels[i];
        if (strcmp(k->name, IN_PLACE[_i].kernel)) continue;
        found = true;
        ck_assert_msg(!strstr(k->source, "kdims"), "static kernel %s takes kdims", k->name);
        ck_assert_msg(!strstr(k->source, "copy blocks") && !strstr(k->source, "ca +"), "%s copies the cache:\n%s",
                      k->name, k->source);
        ck_assert_msg(k->grid[0] * k->grid[1] * k->grid[2] <= IN_PLACE[_i].max_grid, "%s: grid %u", k->name, k->grid[0]);
        ts_nvrtc_clean(k->source, k->name, "sm_90a");
        ts_nvrtc_clean(k->source, k->name, "sm_80");
    }
    ck_assert_msg(found, "case %d: no kernel %s", _i, IN_PLACE[_i].kernel);
    ts_compiled_free(p, g, ctx);
}
END_TEST

/* What the templates do not take symbolically is refused, naming the dim. */
static const struct {
    const char *kg, *msg;
} REFUSED[] = {
    /* rope: a symbolic row (dim 0) */
    {"dim hd <= 128\ninput x: f32[hd, 8, 4]\ninput pos: i32[4]\noutput y = rope_ext(x, pos, n_dims=64)\n", "symbolic"},
    /* set_rows over a symbolic count of matrices */
    {"dim m <= 4\ninput c: f32[16, 10, m]\ninput b: f32[16, 3, m]\ninput ids: i32[3, m]\n"
     "output c2 = set_rows(c, b, ids)\n", "symbolic"},
    /* argsort of a symbolic row length */
    {"dim n <= 50\ninput a: f32[n, 4]\noutput y = argsort(a)\n", "symbolic"},
    /* get_rows of a symbolic row length */
    {"dim n <= 50\ninput a: f32[n, 40]\ninput ids: i32[3]\noutput y = get_rows(a, ids)\n", "symbolic"},
};

START_TEST(refusals) {
    char *m = ts_refused_msg(REFUSED[_i].kg, g_cache, 0, ts_case_label(_i));
    ck_assert_msg(strstr(m, REFUSED[_i].msg), "case %d: message: %s", _i, m);
    free(m);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("dyn_rope",
                        TS_CASE("all", 600), TS_LOOP(0, DYN_NCASES, kernels_compile, values_identical),
                        TS_LOOP(0, (int)(sizeof IN_PLACE / sizeof IN_PLACE[0]), in_place),
                        TS_LOOP(0, (int)(sizeof REFUSED / sizeof REFUSED[0]), refusals));
    return ts_main_cache(s, "dyn-rope", &g_cache);
}
