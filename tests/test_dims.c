/* Symbolic dims and states (issue 6): the .kg syntax and the C API, how dims follow ops, the
 * errors for what cannot follow, binding (kiln_ctx_bind), states written in place, programs
 * that do not depend on the values, and the CLI's --dim. No GPU needed. */
#include "tests/support.h"

#include "base/base.h"
#include "codegen/codegen.h"
#include "ir/ir.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kiln_status parse_text(const char *text, kiln_ctx **out) {
    *out = kiln_ctx_new();
    return kiln_parse(*out, text, strlen(text), "t.kg");
}

/* The error of parsing text (the test fails if it parses); caller frees. */
static char *parse_error(const char *text) {
    kiln_ctx   *ctx;
    kiln_status st = parse_text(text, &ctx);
    if (!st) {
        kiln_graph *g = NULL;
        st = kiln_graph_new(ctx, &g);
        kiln_program *p = NULL;
        kiln_compile_opts o = {.skip_nvrtc = 1, .cache_mode = KILN_CACHE_OFF};
        if (!st) st = kiln_compile(g, &o, &p);
        kiln_program_free(p);
        kiln_graph_free(g);
    }
    kiln_ctx_free(ctx);
    ck_assert_msg(st != NULL, "expected an error for:\n%s", text);
    char *msg = strdup(kiln_status_msg(st));
    kiln_status_free(st);
    return msg;
}

static void expect_error(const char *text, const char *want) {
    char *msg = parse_error(text);
    ck_assert_msg(strstr(msg, want), "error '%s' does not contain '%s'", msg, want);
    free(msg);
}

START_TEST(syntax_and_propagation) {
    const char *text = "kiln-graph 1\n"
                       "dim n_tokens <= 512 specialize 1\n"
                       "dim n_kv <= 4096\n"
                       "input x: f32[4096, n_tokens]\n"
                       "weight w: f32[4096]\n"
                       "input m: f16[n_kv, n_tokens]\n"
                       "state cache: f16[512, 4096]\n"
                       "y = mul(x, w)\n"
                       "r = reshape(y, [128, 32, n_tokens])\n"
                       "p = permute(r, 0, 2, 1, 3)\n"
                       "k = view(cache, [64, 8, n_kv], [128, 1024], 0)\n"
                       "s = sum_rows(m)\n"
                       "output o = rms_norm(p, 1e-05)\n"
                       "output o2 = scale(s, 2, 0)\n"
                       "output o3 = cont(k)\n";
    kiln_ctx *ctx;
    TS_OK(parse_text(text, &ctx));
    ck_assert_int_eq(kiln_ctx_dim_count(ctx), 2);
    ck_assert_str_eq(kiln_ctx_dim_name(ctx, 0), "n_tokens");
    ck_assert_int_eq(kiln_ctx_dim_max(ctx, 1), 4096);
    kiln_graph *g;
    TS_OK(kiln_graph_new(ctx, &g));
    const char *want[][5] = {
        /* name, dim names 0..3 ("" static) */
        {"y", "", "n_tokens", "", ""},   {"r", "", "", "n_tokens", ""}, {"p", "", "n_tokens", "", ""},
        {"k", "", "", "n_kv", ""},      {"s", "", "n_tokens", "", ""}, {"o", "", "n_tokens", "", ""},
        {"o2", "", "n_tokens", "", ""}, {"o3", "", "", "n_kv", ""},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        kiln_tensor *t = NULL;
        for (int j = 0; j < kiln_graph_size(g); j++)
            if (!strcmp(kiln_tensor_name(kiln_graph_node(g, j)), want[i][0])) t = kiln_graph_node(g, j);
        ck_assert_msg(t != NULL, "%s not in the graph", want[i][0]);
        for (int d = 0; d < 4; d++) {
            const char *n = kiln_tensor_dim_name(t, d);
            ck_assert_msg(!strcmp(n ? n : "", want[i][d + 1]), "%s dim %d: '%s', want '%s'", want[i][0], d,
                          n ? n : "", want[i][d + 1]);
        }
    }
    /* The maximum is the extent; the layout is the one at the maximum. */
    kiln_tensor *x = NULL;
    for (int j = 0; j < kiln_graph_size(g); j++)
        if (!strcmp(kiln_tensor_name(kiln_graph_node(g, j)), "x")) x = kiln_graph_node(g, j);
    ck_assert_int_eq(kiln_tensor_ne(x, 1), 512);
    /* print(parse(print)) is stable and keeps the dims, the states and the names in shapes. */
    char *t1, *t2;
    TS_OK(kiln_print(ctx, &t1));
    ck_assert_ptr_nonnull(strstr(t1, "dim n_tokens <= 512 specialize 1\n"));
    ck_assert_ptr_nonnull(strstr(t1, "input m: f16[n_kv, n_tokens]"));
    ck_assert_ptr_nonnull(strstr(t1, "state cache: f16[512, 4096]"));
    ck_assert_ptr_nonnull(strstr(t1, "view(cache, [64, 8, n_kv], [128, 1024], 0)"));
    kiln_ctx *c2;
    TS_OK(parse_text(t1, &c2));
    TS_OK(kiln_print(c2, &t2));
    ck_assert_str_eq(t1, t2);
    free(t1);
    free(t2);
    kiln_ctx_free(c2);
    ts_graph_free(g, ctx);
}
END_TEST

START_TEST(c_api) {
    kiln_ctx *ctx = kiln_ctx_new();
    int64_t   nt = kiln_dim(ctx, "n_tokens", 64);
    ck_assert(nt < 0);
    ck_assert_int_eq(kiln_dim(ctx, "n_tokens", 64), nt); /* the same dim again */
    int64_t      ne[2] = {256, nt};
    kiln_tensor *x = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "x", 2, ne);
    kiln_tensor *y = kiln_silu(ctx, x);
    kiln_set_output(ctx, y, "y");
    TS_OK(kiln_ctx_status(ctx));
    ck_assert_str_eq(kiln_tensor_dim_name(y, 1), "n_tokens");
    ck_assert_ptr_null(kiln_tensor_dim_name(y, 0));
    ck_assert_int_eq(kiln_tensor_ne(y, 1), 64);
    /* A different maximum for the same name, and a weight with a symbolic dim, are errors. */
    ck_assert_int_eq(kiln_dim(ctx, "n_tokens", 32), 0);
    ts_ctx_error(ctx, 0, "declared again");

    ctx = kiln_ctx_new();
    int64_t w[1] = {kiln_dim(ctx, "n", 8)};
    ck_assert_ptr_null(kiln_new_tensor(ctx, KILN_ROLE_WEIGHT, KILN_F32, "w", 1, w));
    ts_ctx_error(ctx, 0, "cannot have a symbolic dim");
}
END_TEST

/* A dim whose maximum is 1 is the static extent 1 wherever it is used (shape inference could
 * not tell it from a static 1), but its name stays declared: it binds and prints. The Llama
 * builder's decode-only graph (n_tokens_max = 1) used to fail in a reshape for that reason. */
START_TEST(max_one) {
    const char *text = "kiln-graph 1\n"
                       "dim n <= 1\n"
                       "input x: f32[4096, n]\n"
                       "y = silu(x)\n"
                       "output r = reshape(y, [128, 32, n])\n";
    kiln_ctx *ctx;
    TS_OK(parse_text(text, &ctx));
    ck_assert_int_eq(kiln_ctx_dim_count(ctx), 1);
    ck_assert_int_eq(kiln_ctx_dim_max(ctx, 0), 1);
    ck_assert_int_eq(kiln_dim(ctx, "n", 1), 1); /* declared again: still the extent 1 */
    TS_OK(kiln_ctx_status(ctx));
    char *t;
    TS_OK(kiln_print(ctx, &t));
    ck_assert_ptr_nonnull(strstr(t, "dim n <= 1\n"));
    ck_assert_ptr_nonnull(strstr(t, "input x: f32[4096, 1]\n"));
    free(t);
    const char *names[1] = {"n"};
    int64_t     vals[1] = {1};
    kiln_ctx   *bound;
    TS_OK(kiln_ctx_bind(ctx, 1, names, vals, &bound));
    kiln_ctx_free(bound);
    kiln_ctx_free(ctx);

    kiln_model_hparams hp;
    TS_OK(kiln_model_preset("llama", "tiny", &hp));
    ctx = kiln_ctx_new();
    kiln_build_opts o = {.n_ctx = 64, .n_tokens_max = 1};
    TS_OK(kiln_build_model(ctx, &hp, &o));
    kiln_graph *g;
    TS_OK(kiln_graph_new(ctx, &g));
    ts_graph_free(g, ctx);
}
END_TEST

/* What cannot follow a symbolic dim is refused, with a message naming it. */
START_TEST(errors) {
    expect_error("dim n <= 8\ninput x: f32[n]\ninput y: f32[8]\no = add(y, x)\noutput q = silu(o)\n",
                 "broadcasts only onto the same dim");
    expect_error("dim n <= 8\ninput x: f32[n]\ninput y: f32[8]\noutput o = add(x, y)\n", "must have 1 or n there");
    expect_error("dim n <= 8\ninput x: f32[4, n]\noutput r = reshape(x, [32])\n", "cannot merge or split a symbolic dim");
    expect_error("dim n <= 8\ninput x: f32[n, 4]\noutput r = reshape(x, [4, n])\n", "keep their places");
    expect_error("dim n <= 8\ndim n <= 9\n", "names a symbolic dim");
    expect_error("input x: f32[q, 4]\n", "is not a symbolic dim");
    expect_error("dim n <= 8\ninput x: f32[n, 4]\nv = view(x, [n, 2], [n], 0)\n", "strides are bytes");
    expect_error("dim n <= 0\n", "out of range");
    expect_error("dim n <= 8 specialize 9\n", "not in 1 .. 8");
    expect_error("dim x <= 8\ninput x: f32[4]\n", "names a symbolic dim");
    /* concat along the symbolic dim: the result's extent is not the dim itself */
    expect_error("dim n <= 8\ninput a: f32[4, n]\ninput b: f32[4, n]\noutput c = concat(a, b, 1)\n",
                 "other than by being it");
    /* the rule holds only at the maximum: a static operand of the maximum's size */
    expect_error("dim n <= 8\ninput a: f32[4, n]\ninput b: f32[4, 8]\noutput c = concat(a, b, 0)\n",
                 "fit only at the maximum");
}
END_TEST

START_TEST(bind) {
    kiln_ctx *ctx, *b;
    TS_OK(parse_text("dim n_tokens <= 16 specialize 1\ndim n_kv <= 64\ninput x: f32[8, n_tokens]\n"
                     "input m: f32[n_kv, n_tokens]\noutput y = soft_max_ext(m, scale=0.5)\noutput z = silu(x)\n",
                     &ctx));
    const char *names[2] = {"n_tokens", "n_kv"};
    int64_t     vals[2] = {3, 40};
    TS_OK(kiln_ctx_bind(ctx, 1, names, vals, &b));
    char *text;
    TS_OK(kiln_print(b, &text));
    ck_assert_msg(strstr(text, "input x: f32[8, 3]") && strstr(text, "input m: f32[n_kv, 3]") &&
                      !strstr(text, "n_tokens") && strstr(text, "dim n_kv <= 64"),
                  "bound text:\n%s", text);
    free(text);
    kiln_ctx_free(b);
    TS_OK(kiln_ctx_bind(ctx, 2, names, vals, &b));
    ck_assert_int_eq(kiln_ctx_dim_count(b), 0);
    kiln_ctx_free(b);
    vals[1] = 65;
    kiln_status st = kiln_ctx_bind(ctx, 2, names, vals, &b);
    ck_assert_ptr_nonnull(st);
    ck_assert_ptr_nonnull(strstr(kiln_status_msg(st), "n_kv = 65 is not in 1 .. 64"));
    kiln_status_free(st);
    const char *bad = "n_q";
    st = kiln_ctx_bind(ctx, 1, &bad, vals, &b);
    ck_assert_ptr_nonnull(strstr(kiln_status_msg(st), "no symbolic dim named 'n_q'"));
    kiln_status_free(st);
    kiln_ctx_free(ctx);
}
END_TEST

/* set_rows into a state writes it in place: the IR node's destination is the state's buffer,
 * nothing copies the cache, and the reference updates the state. */
START_TEST(states) {
    const char *text = "state cache: f32[4, 6]\ninput rows: f32[4, 2]\ninput ids: i64[2]\n"
                       "c = set_rows(cache, rows, ids)\noutput s = sum_rows(c)\n";
    kiln_ctx *ctx;
    TS_OK(parse_text(text, &ctx));
    kiln_graph *g;
    TS_OK(kiln_graph_new(ctx, &g));
    ir_prog *p;
    TS_OK(ir_lower(g, &p));
    TS_OK(ir_verify(p));
    int state = -1;
    for (int b = 0; b < p->nbufs; b++)
        if (p->bufs[b].kind == IR_BUF_STATE) state = b;
    ck_assert_int_ge(state, 0);
    ck_assert_int_eq(p->nodes[0].dst.buf, state);
    ir_prog_free(p);

    float    cache[24], rows[8] = {1, 2, 3, 4, 5, 6, 7, 8}, sums[6];
    int64_t  ids[2] = {4, 1};
    for (int i = 0; i < 24; i++) cache[i] = (float)i;
    ts_buf b[] = {{"cache", KILN_F32, cache, NULL, 24}, {"rows", KILN_F32, rows, NULL, 8},
                  {"ids", KILN_I64, ids, NULL, 2}, TS_OUT("s"), TS_OUT("cache"), {0}};
    ts_reference(text, b);
    const float *s = ts_buf_find(b, "s")->out, *after = b[4].out; /* the state after the run */
    for (int r = 0; r < 6; r++) {
        sums[r] = 0;
        for (int i = 0; i < 4; i++) {
            float v = r == 4 ? rows[i] : r == 1 ? rows[4 + i] : cache[r * 4 + i];
            sums[r] += v;
            ck_assert_float_eq(after[r * 4 + i], v);
        }
        ck_assert_float_eq(s[r], sums[r]);
    }
    ts_buf_free(b);
    ts_graph_free(g, ctx);

    expect_error("state c: f32[4, 6]\ninput r: f32[4, 1]\ninput i: i64[1]\nw = set_rows(c, r, i)\n"
                 "output o = add(c, w)\n",
                 "reads state 'c', which set_rows 'w' writes in place");
    expect_error("state c: f32[4, 6]\ninput r: f32[4, 1]\ninput i: i64[1]\noutput w = set_rows(c, r, i)\n",
                 "cannot also be an output");
    expect_error("state c: f32[4, 6]\ninput r: f32[4, 1]\ninput i: i64[1]\nw = set_rows(c, r, i)\n"
                 "w2 = set_rows(c, r, i)\noutput o = add(w, w2)\n",
                 "written by two set_rows");
    expect_error("dim n <= 8\nstate c: f32[4, n]\n", "cannot have a symbolic dim");
}
END_TEST

/* The program does not depend on the values: `kiln compile --dim` with two values gives the
 * same kernels, the second all from the cache; a value over the maximum is refused. */
START_TEST(cli_dim) {
    char *dir = ts_tmpdir();
    char  path[4200], cmd[9000], *out = NULL;
    snprintf(path, sizeof path, "%s/g.kg", dir);
    const char *kg = "dim n_kv <= 256\ninput x: f32[n_kv, 4]\noutput y = sum_rows(x)\n";
    TS_OK(kb_write_file(path, kg, strlen(kg)));
    for (int v = 0; v < 2; v++) {
        snprintf(cmd, sizeof cmd, "%s compile %s --dim n_kv=%d --cache-dir %s/c --dump-cu %s/d%d 2>&1", ts_kiln_bin(),
                 path, v ? 200 : 3, dir, dir, v);
        ck_assert_msg(ts_run(cmd, &out) == 0, "%s:\n%s", cmd, out);
        ck_assert_msg(strstr(out, v ? "loaded 1 kernels (1 distinct) from the program cache" : "(1 distinct: 1 new, 0 from cache)"),
                      "%s:\n%s", cmd, out);
        ck_assert_ptr_nonnull(strstr(out, v ? "n_kv = 200 (max 256)" : "n_kv = 3 (max 256)"));
        free(out);
        out = NULL;
    }
    snprintf(cmd, sizeof cmd, "diff -r %s/d0 %s/d1", dir, dir);
    ck_assert_msg(ts_run(cmd, NULL) == 0, "the programs of n_kv = 3 and n_kv = 200 differ");
    snprintf(cmd, sizeof cmd, "%s compile %s --dim n_kv=257 --cache-dir %s/c 2>&1", ts_kiln_bin(), path, dir);
    ck_assert_int_eq(ts_run(cmd, &out), 1);
    ck_assert_msg(strstr(out, "n_kv = 257 is not in 1 .. 256"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s compile %s --dim n_q=3 --cache-dir %s/c 2>&1", ts_kiln_bin(), path, dir);
    ck_assert_int_eq(ts_run(cmd, &out), 1);
    ck_assert_msg(strstr(out, "no symbolic dim named 'n_q'"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s compile %s --dim n_kv --cache-dir %s/c 2>&1", ts_kiln_bin(), path, dir);
    ck_assert_int_eq(ts_run(cmd, &out), 2);
    free(out);
    ts_tmpdir_free(dir);
}
END_TEST

/* A specialization is a program of its own, compiled with the general one. */
START_TEST(specialization) {
    kiln_ctx *ctx;
    TS_OK(parse_text("dim n <= 64 specialize 1, 2\ninput x: f32[32, n]\noutput y = sum_rows(x)\n", &ctx));
    kiln_graph *g;
    TS_OK(kiln_graph_new(ctx, &g));
    kiln_program     *p = NULL;
    kiln_compile_opts o = {.skip_nvrtc = 1, .cache_mode = KILN_CACHE_OFF};
    TS_OK(kiln_compile(g, &o, &p));
    ck_assert_int_eq(p->nspec, 2);
    ck_assert_int_eq(p->spec_val[0], 1);
    ck_assert_int_eq(p->spec_val[1], 2);
    ck_assert_int_eq(kiln_ctx_dim_count(p->spec[0]->own_ctx), 0);
    /* the specialized program is static: its kernel has no kdims parameter */
    ck_assert_ptr_null(strstr(p->spec[0]->kernels[0].source, "kdims"));
    ck_assert_ptr_nonnull(strstr(p->kernels[0].source, "kdims"));
    ts_compiled_free(p, g, ctx);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("dims",
                        TS_CASE("all", 120),
                        TS_TESTS(syntax_and_propagation, c_api, max_one, errors, bind, states, cli_dim,
                                 specialization));
    return ts_main(s);
}
