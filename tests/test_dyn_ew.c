/* Symbolic dims in the elementwise, norm, reduce and fill templates (templates/elementwise.lua,
 * norm.lua, reduce.lua, fill.lua): every case generates and compiles with NVRTC for sm_90a and
 * sm_80 without warnings, its kernels take the run-time extents (kdims) as their last parameter,
 * the sources of one graph are identical for two bound values (kiln compile --dim), and what the
 * templates do not take symbolically is refused with a message naming the dim. No GPU needed
 * (tests/gpu/test_gpu_dyn_ew.c runs them). */
#include "tests/support.h"

#include "base/base.h"
#include "codegen/codegen.h"
#include "ir/ir.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *g_cache;

typedef struct {
    const char *kg;
    const char *want; /* a substring of some source (the kernel or plan) */
    const char *dim;  /* the dim bound to two values in values_identical */
    int         v1, v2;
} dcase;

static const dcase CASES[] = {
    /* 0: swiglu of one tensor's halves (GLU), f32, vector path over [4096, n] */
    {"dim n <= 512\ninput x: f32[8192, n]\noutput y = swiglu(x)\n", "count = 4096u * dn1", "n", 1, 300},
    /* 1: fused chain silu(g) * u, f16 */
    {"dim n <= 512\ninput g: f16[4096, n]\ninput u: f16[4096, n]\nt = silu(g)\noutput y = mul(t, u)\n", "ew_silu_mul", "n",
     2, 511},
    /* 2: a static-1 operand broadcast against the symbolic dim */
    {"dim n <= 64\ninput a: bf16[4096, n]\nweight b: bf16[4096, 1]\noutput y = add(a, b)\n", "dn1", "n", 1, 64},
    /* 3: a transpose copy (the symbolic dim not the outermost of dst): run-time coordinates */
    {"dim n <= 300\ninput a: f32[64, n]\nt = transpose(a)\noutput y = cont(t)\n", "% dn0", "n", 7, 200},
    /* 4: cast */
    {"dim n <= 512\ninput a: f32[4096, n]\noutput y = cast(a, f16)\n", "ew_cont", "n", 3, 100},
    /* 5: repeat of a static row along the symbolic dim */
    {"dim n <= 128\ninput a: f32[64, 1]\ninput b: f32[64, n]\noutput y = repeat(a, b)\n", "count", "n", 1, 100},
    /* 6: rms_norm + mul (rms_norm_mul fusion: the norm's epilogue) */
    {"dim n <= 512\ninput x: f32[4096, n]\nweight w: f32[4096]\nh = rms_norm(x, 1e-6)\noutput y = mul(h, w)\n",
     "rms_norm_f32_4096_mul", "n", 1, 512},
    /* 7: norm of short rows, the symbolic dim outermost of three */
    {"dim n <= 64\ninput x: f16[128, 8, n]\noutput y = norm(x, 1e-5)\n", "const bool live = row < nrows;", "n", 1, 33},
    /* 8: l2_norm, rows decomposed with the run-time extent (symbolic dim 1 of three) */
    {"dim n <= 64\ninput x: f32[2048, n, 3]\noutput y = l2_norm(x, 1e-6)\n", "row % dn1", "n", 2, 50},
    /* 9: group_norm over a symbolic dim 3 */
    {"dim n <= 4\ninput x: f32[16, 16, 32, n]\noutput y = group_norm(x, 8, 1e-6)\n", "if (i3 >= dn3)", "n", 1, 3},
    /* 10: sum_rows */
    {"dim n <= 512\ninput x: f32[4096, n]\noutput y = sum_rows(x)\n", "sum_rows_f32_4096", "n", 1, 100},
    /* 11: mean over a symbolic row length */
    {"dim n <= 4096\ninput x: f16[n, 8]\noutput y = mean(x)\n", "acc / (float)dn0", "n", 5, 4000},
    /* 12: argmax */
    {"dim n <= 64\ninput x: f32[1000, n]\noutput y = argmax(x)\n", "argmax_f32_1000", "n", 1, 64},
    /* 13: cumsum over a symbolic row length */
    {"dim n <= 3000\ninput x: f32[n, 3]\noutput y = cumsum(x)\n", "cumsum_f32_3000", "n", 1, 2999},
    /* 14: sum of everything */
    {"dim n <= 512\ninput x: f32[4096, n]\noutput y = sum(x)\n", "run-time element count", "n", 1, 256},
    /* 15: fill */
    {"dim n <= 512\ninput x: f16[4096, n]\noutput y = fill(x, 1.5)\n", "fill_f16", "n", 1, 10},
    /* 16: diag_mask_inf over [n_kv, n_tokens] */
    {"dim n_kv <= 512\ninput x: f32[n_kv, 16]\nm = diag_mask_inf(x, 3)\noutput y = exp(m)\n", "diag_mask_inf_f32_512", "n_kv", 1,
     400},
    /* 17: tri over a symbolic batch dim */
    {"dim n <= 8\ninput x: f32[64, 64, n]\noutput y = tri(x, lower)\n", "tri_lower_f32_64", "n", 1, 8},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

static bool mine(const ir_node *n) {
    if (n->kind == IR_EW) return true;
    fe_fam f = fe_ops[n->op].fam;
    return f == FE_FAM_NORM || f == FE_FAM_REDUCE || f == FE_FAM_FILL;
}

START_TEST(kernels_compile) {
    ts_dyn_kernels(CASES[_i].kg, CASES[_i].want, g_cache, mine, TS_LAUNCH_ONLY | TS_KDIMS_IF_USED,
                   "elementwise/norm/reduce/fill", ts_case_label(_i));
}
END_TEST

START_TEST(values_identical) {
    ts_sources_identical(CASES[_i].kg, CASES[_i].dim, CASES[_i].v1, CASES[_i].v2, ts_case_label(_i));
}
END_TEST

/* What the templates do not take symbolically is refused, naming the dim. */
static const struct {
    const char *kg, *msg;
} REFUSED[] = {
    /* a symbolic row length of a row norm */
    {"dim nr <= 4096\ninput x: f32[nr, 4]\noutput y = rms_norm(x, 1e-6)\n", "'nr'"},
    /* group_norm: a symbolic channel dim */
    {"dim nc <= 32\ninput x: f32[16, 16, nc, 2]\noutput y = group_norm(x, 4, 1e-6)\n", "'nc'"},
};

START_TEST(refusals) {
    char *m = ts_refused_msg(REFUSED[_i].kg, g_cache, 0, ts_case_label(_i));
    ck_assert_msg(strstr(m, REFUSED[_i].msg) && strstr(m, "symbolic"), "case %d: message: %s", _i, m);
    free(m);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("dyn_ew",
                        TS_CASE("dyn_ew", 120), TS_LOOP(0, NCASES, kernels_compile, values_identical),
                        TS_LOOP(0, (int)(sizeof REFUSED / sizeof REFUSED[0]), refusals));
    return ts_main_cache(s, "dyn-ew", &g_cache);
}
