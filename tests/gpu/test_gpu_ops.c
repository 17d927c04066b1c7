/* GPU tests (make test-gpu): every elementwise op, fused chains, CUDA-graph replay and the
 * examples, each compiled with kiln_compile, run on the GPU and compared with kiln_reference.
 *
 * Accuracy is measured as ggml's test-backend-ops does: NMSE = sum (out - ref)^2 / sum ref^2
 * over all output elements, against fe_ops[op].nmse_tol (ggml's default 1e-7) for single ops in
 * every type — the reference and the kernel both compute in f32 and round once to the output
 * type, so only the f32 math functions differ. Fused chains are held to the same tolerance:
 * a fused kernel rounds each intermediate to the type the graph stored it in (ir_instr.type),
 * exactly as the unfused reference does. FUSED_TOL_F16/BF16 stay as a knob, set to 0 (no
 * relaxation).
 *
 * This program only runs on GPU machines: every test fails when no GPU is present.
 * $KILN_TEST_CASES changes the number of random cases per op and type (default 24, at least 20
 * for a real run); $KILN_TEST_SHARD=k/n runs a share of the looped cases (my_shard). */
#include "tests/support.h"

#include "frontend/frontend.h"
#include "runtime/runtime.h"
#include "runtime/session_int.h"

#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/gpu_support.h"

/* Builds op on operands (b may be NULL for unary ops). */
static kiln_tensor *apply_op(kiln_ctx *ctx, fe_op op, kiln_tensor *a, kiln_tensor *b, float s0,
                             float s1) {
    switch (op) {
    case FE_OP_CONT: return kiln_cont(ctx, a);
    case FE_OP_ADD: return kiln_add(ctx, a, b);
    case FE_OP_SUB: return kiln_sub(ctx, a, b);
    case FE_OP_MUL: return kiln_mul(ctx, a, b);
    case FE_OP_DIV: return kiln_div(ctx, a, b);
    case FE_OP_ADD1: return kiln_add1(ctx, a, b);
    case FE_OP_SCALE: return kiln_scale(ctx, a, s0, s1);
    case FE_OP_NEG: return kiln_neg(ctx, a);
    case FE_OP_EXP: return kiln_exp(ctx, a);
    case FE_OP_SQR: return kiln_sqr(ctx, a);
    case FE_OP_SQRT: return kiln_sqrt(ctx, a);
    case FE_OP_SILU: return kiln_silu(ctx, a);
    case FE_OP_GELU: return kiln_gelu(ctx, a);
    case FE_OP_RELU: return kiln_relu(ctx, a);
    case FE_OP_TANH: return kiln_tanh(ctx, a);
    case FE_OP_SIGMOID: return kiln_sigmoid(ctx, a);
    case FE_OP_ABS: return kiln_abs(ctx, a);
    case FE_OP_SGN: return kiln_sgn(ctx, a);
    case FE_OP_STEP: return kiln_step(ctx, a);
    case FE_OP_ELU: return kiln_elu(ctx, a);
    case FE_OP_LEAKY_RELU: return kiln_leaky_relu(ctx, a, s0);
    case FE_OP_GELU_ERF: return kiln_gelu_erf(ctx, a);
    case FE_OP_GELU_QUICK: return kiln_gelu_quick(ctx, a);
    case FE_OP_HARDSWISH: return kiln_hardswish(ctx, a);
    case FE_OP_HARDSIGMOID: return kiln_hardsigmoid(ctx, a);
    case FE_OP_LOG: return kiln_log(ctx, a);
    case FE_OP_SIN: return kiln_sin(ctx, a);
    case FE_OP_COS: return kiln_cos(ctx, a);
    case FE_OP_SOFTPLUS: return kiln_softplus(ctx, a);
    case FE_OP_CLAMP: return kiln_clamp(ctx, a, s0 < s1 ? s0 : s1, s0 < s1 ? s1 : s0);
    default:
        ck_abort_msg("test_gpu_ops has no builder for op '%s': add it to apply_op",
                     fe_ops[op].name);
    }
    return NULL;
}

static fill_kind op_fill(fe_op op, int operand_index) {
    if (op == FE_OP_SQRT) return FILL_POSITIVE;
    if (op == FE_OP_LOG) return FILL_LOG_DOMAIN;
    if (op == FE_OP_DIV && operand_index == 1) return FILL_AWAY_FROM_ZERO;
    return FILL_ANY;
}

/* Shapes: the fixed ones first (1, 7, 4097, multi-dim), then random up to 4 dims. */
static void gen_shape(rng_t *r, int c, int64_t ne[4]) {
    static const int64_t fixed[][4] = {
        {1, 1, 1, 1}, {7, 1, 1, 1}, {4097, 1, 1, 1}, {4097, 3, 1, 1},
        {7, 1, 3, 2}, {1, 7, 1, 5}, {33, 17, 4, 3}, {2, 4097, 1, 1},
    };
    if (c < (int)(sizeof fixed / sizeof fixed[0])) {
        memcpy(ne, fixed[c], sizeof fixed[c]);
        return;
    }
    random_ew_shape(r, ne);
}

/* b's shape for broadcasting into a: each dim is a's, 1, or another divisor of a's. */
static void gen_bcast(rng_t *r, const int64_t a[4], int64_t b[4], bool allow) {
    for (int i = 0; i < 4; i++) {
        b[i] = a[i];
        if (!allow) continue;
        int k = rng_int(r, 0, 9);
        if (k < 3) b[i] = 1;
        else if (k < 5) {
            int64_t ds[64];
            int     nds = 0;
            for (int64_t d = 2; d < a[i] && nds < 64; d++)
                if (a[i] % d == 0) ds[nds++] = d;
            if (nds) b[i] = ds[rng_int(r, 0, nds - 1)];
        }
    }
}

/* $KILN_TEST_SHARD=k/n: this process runs the looped tests whose index is k modulo n, so that n
 * processes share this program's NVRTC work (a kernel a case, one at a time within a process:
 * alone it took over 400 s on the H100 machine's 16 cores while they idled). Unset: all. */
static bool my_shard(int i) {
    const char *e = getenv("KILN_TEST_SHARD");
    int         k, n;
    if (!e || sscanf(e, "%d/%d", &k, &n) != 2 || n < 1 || k < 0 || k >= n) return true;
    return i % n == k;
}

static int num_cases(void) {
    const char *e = getenv("KILN_TEST_CASES");
    int         n = e && *e ? atoi(e) : 24;
    return n > 0 ? n : 24;
}

/* Whether op accepts type t (the frontend's answer for a tiny contiguous case). */
static bool op_accepts(fe_op op, kiln_type t, char *why, size_t why_n) {
    kiln_ctx    *ctx = kiln_ctx_new();
    int64_t      ne[1] = {4};
    kiln_tensor *a = kiln_new_tensor(ctx, KILN_ROLE_INPUT, t, "a", 1, ne);
    int64_t      one[1] = {1};
    kiln_tensor *b = fe_ops[op].kind == FE_BINARY
                         ? kiln_new_tensor(ctx, KILN_ROLE_INPUT, t, "b", 1, op == FE_OP_ADD1 ? one : ne)
                         : NULL;
    kiln_set_output(ctx, apply_op(ctx, op, a, b, 0.5f, 0.25f), "out");
    kiln_graph *g = NULL;
    kiln_status st = kiln_graph_new(ctx, &g);
    bool        ok = st == NULL;
    snprintf(why, why_n, "%s", kiln_status_msg(st));
    kiln_status_free(st);
    ts_graph_free(g, ctx);
    return ok;
}

/* ---- (1) every elementwise op, every float type ---------------------------------------------- */

static void run_op_case(fe_op op, kiln_type t, int c, uint64_t seed, int *rejected_layouts) {
    rng_t   r = {seed};
    int64_t ne[4], nb_[4];
    gen_shape(&r, c, ne);
    bool binary = fe_ops[op].kind == FE_BINARY;
    gen_bcast(&r, ne, nb_, binary && c >= 2);
    if (op == FE_OP_ADD1) nb_[0] = nb_[1] = nb_[2] = nb_[3] = 1; /* b is a scalar */
    layout la = c < 3 ? LAY_PLAIN : (layout)rng_int(&r, 0, LAY_COUNT - 1);
    layout lb = c < 3 ? LAY_PLAIN : (layout)rng_int(&r, 0, LAY_COUNT - 1);
    if (op == FE_OP_CONT && c >= 3 && la == LAY_PLAIN) la = LAY_PERMUTE;
    float s0 = rng_float(&r, -2, 2), s1 = rng_float(&r, -1, 1);

    for (int attempt = 0; attempt < 2; attempt++) {
        kiln_ctx *ctx = kiln_ctx_new();
        hset      h = {0};
        char      da[192], db[192] = "";
        rng_t     lr = {seed ^ 0xABCDEFull};
        kiln_tensor *a = operand(ctx, &h, &lr, "a", t, ne, la, op_fill(op, 0), seed * 3 + 1, da,
                                 sizeof da);
        kiln_tensor *b = binary ? operand(ctx, &h, &lr, "b", t, nb_, lb, op_fill(op, 1),
                                          seed * 3 + 2, db, sizeof db)
                                : NULL;
        kiln_tensor *x = a, *y = b;
        if (attempt == 1) { /* what a ggml user does when an op wants contiguous operands */
            if (la != LAY_PLAIN) x = kiln_cont(ctx, a);
            if (b && lb != LAY_PLAIN) y = kiln_cont(ctx, b);
        }
        kiln_set_output(ctx, apply_op(ctx, op, x, y, s0, s1), "out");
        kiln_graph *g = NULL;
        kiln_status st = kiln_graph_new(ctx, &g);
        char        label[700], params[64] = "";
        if (fe_op_sig(op)->nfloat > 0) snprintf(params, sizeof params, " params %g %g", s0, s1);
        snprintf(label, sizeof label, "op %s%s %s case %d (seed %llu%s): %s%s%s", fe_ops[op].name,
                 params, kiln_type_name(t), c, (unsigned long long)seed,
                 attempt ? ", operands made contiguous" : "", da, binary ? "; " : "", db);
        if (st && attempt == 0 && kiln_status_code(st) == KILN_ERR_SHAPE &&
            (la != LAY_PLAIN || (binary && lb != LAY_PLAIN)) && op != FE_OP_CONT) {
            if ((*rejected_layouts)++ < 3)
                printf("note: %s: rejected by the frontend (%s); retrying through cont\n", label,
                       kiln_status_msg(st));
            kiln_status_free(st);
            hset_free(&h);
            kiln_ctx_free(ctx);
            continue;
        }
        ck_assert_msg(st == NULL, "%s: kiln_graph_new failed: %s", label, kiln_status_msg(st));
        cmp_opts co = {.label = label, .tol_f32 = fe_ops[op].nmse_tol};
        if (attempt == 1) co.fused_tol = false; /* cont is exact: no extra rounding */
        check_and_free(g, &h, ctx, &co);
        return;
    }
}

START_TEST(test_elementwise_ops) {
    need_gpu();
    if (!my_shard(_i)) return;
    int       op_i = _i / 3;
    kiln_type t = FLOAT_TYPES[_i % 3];
    fe_op     op = (fe_op)op_i;
    if (fe_ops[op].kind != FE_UNARY && fe_ops[op].kind != FE_BINARY) return;
    char why[512];
    if (!op_accepts(op, t, why, sizeof why)) {
        ck_assert_msg(t != KILN_F32, "op %s must accept f32: %s", fe_ops[op].name, why);
        printf("note: op %s does not accept %s (%s); skipped\n", fe_ops[op].name,
               kiln_type_name(t), why);
        return;
    }
    int n = num_cases(), rejected = 0;
    for (int c = 0; c < n; c++)
        run_op_case(op, t, c, 1000003ull * (uint64_t)(op_i + 1) + 7919ull * (uint64_t)(_i % 3) + (uint64_t)c,
                    &rejected);
    if (rejected)
        printf("note: op %s %s: %d case(s) needed contiguous operands\n", fe_ops[op].name,
               kiln_type_name(t), rejected);
}
END_TEST

/* ---- (2) fused chains ------------------------------------------------------------------------ */

static const int64_t CHAIN_SHAPES[][4] = {{4097, 3, 1, 1}, {7, 1, 1, 1}, {64, 33, 2, 1},
                                          {1, 1, 1, 1}, {129, 7, 3, 2}};
#define N_CHAIN_SHAPES ((int)(sizeof CHAIN_SHAPES / sizeof CHAIN_SHAPES[0]))

typedef kiln_tensor *(*chain_fn)(kiln_ctx *ctx, hset *h, kiln_type t, const int64_t ne[4],
                                 uint64_t seed);

static kiln_tensor *leaf_data(kiln_ctx *ctx, hset *h, const char *name, kiln_type t,
                              const int64_t ne[4], uint64_t seed, fill_kind fk) {
    kiln_tensor *x = kiln_new_tensor(ctx, KILN_ROLE_INPUT, t, name, 4, ne);
    hdata       *d = hset_add(h, name, t, ne[0] * ne[1] * ne[2] * ne[3]);
    fill(d->data, t, d->n, seed, fk);
    return x;
}

/* silu(a * b) + c, b broadcast along rows, c a column broadcast along ne0. */
static kiln_tensor *chain_swiglu(kiln_ctx *ctx, hset *h, kiln_type t, const int64_t ne[4],
                                 uint64_t seed) {
    int64_t nb[4] = {ne[0], 1, 1, 1}, nc[4] = {1, ne[1], ne[2], ne[3]};
    kiln_tensor *a = leaf_data(ctx, h, "a", t, ne, seed + 1, FILL_ANY);
    kiln_tensor *b = leaf_data(ctx, h, "b", t, nb, seed + 2, FILL_ANY);
    kiln_tensor *c = leaf_data(ctx, h, "c", t, nc, seed + 3, FILL_ANY);
    return kiln_add(ctx, kiln_silu(ctx, kiln_mul(ctx, a, b)), c);
}

/* scale(sigmoid(a - b), 0.5, 0.1) * transpose(d) with a shared operand used twice. */
static kiln_tensor *chain_mixed(kiln_ctx *ctx, hset *h, kiln_type t, const int64_t ne[4],
                                uint64_t seed) {
    int64_t      nd[4] = {ne[1], ne[0], ne[2], ne[3]};
    kiln_tensor *a = leaf_data(ctx, h, "a", t, ne, seed + 1, FILL_ANY);
    kiln_tensor *b = leaf_data(ctx, h, "b", t, ne, seed + 2, FILL_ANY);
    kiln_tensor *d = leaf_data(ctx, h, "d", t, nd, seed + 3, FILL_ANY);
    kiln_tensor *u = kiln_scale(ctx, kiln_sigmoid(ctx, kiln_sub(ctx, a, b)), 0.5f, 0.1f);
    kiln_tensor *v = kiln_mul(ctx, u, kiln_transpose(ctx, d));
    return kiln_add(ctx, kiln_gelu(ctx, v), kiln_tanh(ctx, a));
}

/* A long chain touching every unary op (keeps values in range). */
static kiln_tensor *chain_long(kiln_ctx *ctx, hset *h, kiln_type t, const int64_t ne[4],
                               uint64_t seed) {
    int64_t      nb[4] = {1, ne[1], 1, ne[3]};
    kiln_tensor *a = leaf_data(ctx, h, "a", t, ne, seed + 1, FILL_ANY);
    kiln_tensor *b = leaf_data(ctx, h, "b", t, nb, seed + 2, FILL_AWAY_FROM_ZERO);
    kiln_tensor *x = kiln_div(ctx, a, b);
    x = kiln_tanh(ctx, x);
    x = kiln_exp(ctx, x);
    x = kiln_sqrt(ctx, x);
    x = kiln_sqr(ctx, kiln_neg(ctx, x));
    x = kiln_relu(ctx, kiln_sub(ctx, x, kiln_scale(ctx, a, 0.25f, 0.5f)));
    x = kiln_sigmoid(ctx, kiln_silu(ctx, x));
    x = kiln_gelu(ctx, kiln_add(ctx, x, b));
    return kiln_mul(ctx, x, a);
}

/* Two outputs sharing an intermediate, and a permuted operand. */
static kiln_tensor *chain_two_outputs(kiln_ctx *ctx, hset *h, kiln_type t, const int64_t ne[4],
                                      uint64_t seed) {
    int64_t      np[4] = {ne[2], ne[0], ne[1], ne[3]}; /* permute(1,2,0,3) gives ne */
    kiln_tensor *a = leaf_data(ctx, h, "a", t, ne, seed + 1, FILL_ANY);
    kiln_tensor *p = leaf_data(ctx, h, "p", t, np, seed + 2, FILL_ANY);
    kiln_tensor *m = kiln_mul(ctx, a, kiln_permute(ctx, p, 2, 0, 1, 3));
    kiln_set_output(ctx, kiln_silu(ctx, m), "y1");
    return kiln_add(ctx, m, a);
}

static const struct {
    const char *name;
    chain_fn    fn;
} CHAINS[] = {
    {"silu(a*b)+c", chain_swiglu},
    {"mixed", chain_mixed},
    {"long", chain_long},
    {"two-outputs", chain_two_outputs},
};
#define N_CHAINS ((int)(sizeof CHAINS / sizeof CHAINS[0]))

static double max_tol(void) {
    double m = 0;
    for (int i = 0; i < FE_OP_COUNT; i++)
        if (fe_ops[i].nmse_tol > m) m = fe_ops[i].nmse_tol;
    return m;
}

START_TEST(test_fused_chains) {
    need_gpu();
    if (!my_shard(_i)) return;
    int       chain = _i / 3;
    kiln_type t = FLOAT_TYPES[_i % 3];
    char      why[512];
    if (!op_accepts(FE_OP_MUL, t, why, sizeof why)) {
        ck_assert_msg(t != KILN_F32, "mul must accept f32: %s", why);
        printf("note: %s chains skipped: %s\n", kiln_type_name(t), why);
        return;
    }
    for (int si = 0; si < N_CHAIN_SHAPES; si++) {
        for (int no_fuse = 0; no_fuse <= 1; no_fuse++) {
            kiln_ctx *ctx = kiln_ctx_new();
            hset      h = {0};
            kiln_tensor *y = CHAINS[chain].fn(ctx, &h, t, CHAIN_SHAPES[si], 77 + (uint64_t)si);
            kiln_set_output(ctx, y, "y");
            kiln_graph *g = NULL;
            TS_OK(kiln_graph_new(ctx, &g));
            char label[256], s[96];
            shape_str(CHAIN_SHAPES[si], s, sizeof s);
            snprintf(label, sizeof label, "chain %s %s %s%s", CHAINS[chain].name,
                     kiln_type_name(t), s, no_fuse ? " (no_fuse)" : "");
            cmp_opts co = {.label = label, .tol_f32 = max_tol(), .fused_tol = !no_fuse,
                           .no_fuse = no_fuse};
            check_and_free(g, &h, ctx, &co);
        }
    }
}
END_TEST

/* ---- (3) CUDA graphs: replay equals plain launches, one capture ------------------------------ */

static kiln_session *new_session(const kiln_program *p, int no_graph) {
    kiln_session     *s = NULL;
    kiln_session_opts o = {.no_cuda_graph = no_graph, .device = 0};
    TS_OK(kiln_session_new(p, &o, &s));
    return s;
}

static void replay_vs_launches(int no_fuse) {
    kiln_ctx *ctx = kiln_ctx_new();
    hset      h = {0};
    int64_t   ne[4] = {4097, 9, 2, 1};
    kiln_set_output(ctx, chain_mixed(ctx, &h, KILN_F32, ne, 5), "y");
    kiln_graph *g = NULL;
    TS_OK(kiln_graph_new(ctx, &g));
    kiln_program *p = compile(g, no_fuse);
    if (no_fuse)
        ck_assert_msg(kiln_program_kernel_count(p) > 1, "no_fuse should give several kernels");
    kiln_session *sg = new_session(p, 0), *sl = new_session(p, 1);
    const int     runs = 6;
    for (int it = 0; it < runs; it++) {
        /* New inputs every other run: the graph reads the buffers' current contents. */
        if (it % 2 == 0)
            for (int i = 0; i < h.nin; i++) fill(h.in[i].data, h.in[i].type, h.in[i].n, 100 + (uint64_t)(it * 10 + i), FILL_ANY);
        for (int i = 0; i < h.nin; i++) {
            size_t bytes = (size_t)h.in[i].n * kiln_type_size(h.in[i].type);
            TS_OK(kiln_session_set(sg, h.in[i].name, h.in[i].data, bytes));
            TS_OK(kiln_session_set(sl, h.in[i].name, h.in[i].data, bytes));
        }
        TS_OK(kiln_session_run(sg));
        TS_OK(kiln_session_run(sl));
        double ms = kiln_session_last_ms(sg);
        ck_assert_msg(isfinite(ms) && ms >= 0, "last_ms %g", ms);

        hset_clear_out(&h);
        TS_OK(kiln_reference(g, ref_get, ref_put, &h));
        for (int o = 0; o < h.nout; o++) {
            size_t bytes = (size_t)h.out[o].n * kiln_type_size(h.out[o].type);
            void  *a = malloc(bytes), *b = malloc(bytes);
            ck_assert(a && b);
            TS_OK(kiln_session_get(sg, h.out[o].name, a, bytes));
            TS_OK(kiln_session_get(sl, h.out[o].name, b, bytes));
            ck_assert_msg(memcmp(a, b, bytes) == 0,
                          "run %d%s: CUDA graph replay and plain launches differ in '%s'", it,
                          no_fuse ? " (no_fuse)" : "", h.out[o].name);
            int64_t bad;
            bool    rnf;
            double  e = nmse(a, h.out[o].data, h.out[o].type, h.out[o].n, &bad, &rnf);
            ck_assert_msg(bad < 0 && e <= max_tol(), "run %d: '%s' NMSE %g vs reference", it,
                          h.out[o].name, e);
            free(a);
            free(b);
        }
    }
    ck_assert_int_eq(kiln_session_captures(sg), 1);
    ck_assert_int_eq(kiln_session_captures(sl), 0);
    kiln_session_free(sg);
    gpu_free(sl, p, g, &h, ctx);
}

START_TEST(test_graph_replay) {
    need_gpu();
    replay_vs_launches(0);
    replay_vs_launches(1);
}
END_TEST

START_TEST(test_graphs_env_off) {
    need_gpu();
    kiln_ctx *ctx = kiln_ctx_new();
    hset      h = {0};
    int64_t   ne[4] = {33, 5, 1, 1};
    kiln_set_output(ctx, chain_swiglu(ctx, &h, KILN_F32, ne, 9), "y");
    kiln_graph *g = NULL;
    TS_OK(kiln_graph_new(ctx, &g));
    kiln_program *p = compile(g, 1);
    setenv("KILN_CUDA_GRAPHS", "0", 1);
    kiln_session *s = new_session(p, 0);
    unsetenv("KILN_CUDA_GRAPHS");
    for (int i = 0; i < h.nin; i++)
        TS_OK(kiln_session_set(s, h.in[i].name, h.in[i].data,
                               (size_t)h.in[i].n * kiln_type_size(h.in[i].type)));
    for (int i = 0; i < 3; i++) TS_OK(kiln_session_run(s));
    ck_assert_int_eq(kiln_session_captures(s), 0);
    kiln_session_free(s);
    /* With graphs on, several runs still capture once. */
    s = new_session(p, 0);
    for (int i = 0; i < 4; i++) TS_OK(kiln_session_run(s));
    ck_assert_int_eq(kiln_session_captures(s), 1);
    gpu_free(s, p, g, &h, ctx);
}
END_TEST

/* ---- the I/O windows (runtime/io.c) ---------------------------------------------------------- */

static bool in_window(const kiln_session *s, const char *name) {
    for (int i = 0; i < s->nbufs; i++)
        if (!strcmp(s->bufs[i].name, name) && s->bufs[i].kind != IR_BUF_TEMP) return s->win_off[i] > 0;
    ck_abort_msg("no buffer '%s'", name);
    return false;
}

/* x small (the input window), big over the item limit (its own allocation, its copy deferred
 * to the run); y = 2x is an output that sum_rows reads (device memory), its row sums r and
 * big's sum bs are outputs no kernel reads (the output window). Graph replays and plain
 * launches must see every new x. */
static void windows_case(int no_graph) {
    kiln_ctx    *ctx = kiln_ctx_new();
    int64_t      ne[2] = {37, 3}, nb[2] = {20000, 1};
    kiln_tensor *x = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "x", 2, ne);
    kiln_tensor *big = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "big", 2, nb);
    kiln_tensor *y = kiln_scale(ctx, x, 2.0f, 0.0f);
    kiln_set_output(ctx, y, "y");
    kiln_set_output(ctx, kiln_sum_rows(ctx, y), "r");
    kiln_set_output(ctx, kiln_sum_rows(ctx, big), "bs");
    kiln_graph *g = NULL;
    TS_OK(kiln_graph_new(ctx, &g));
    kiln_program *p = compile(g, 1);
    kiln_session *s = new_session(p, no_graph);
    ck_assert(in_window(s, "x"));
    ck_assert(!in_window(s, "big"));
    ck_assert(!in_window(s, "y")); /* sum_rows reads it */
    ck_assert(in_window(s, "r") && in_window(s, "bs"));
    float xv[111], bv[20000], yv[111], rv[3], bsv[1], back[111];
    for (int i = 0; i < 20000; i++) bv[i] = (float)(i % 7) - 3.0f;
    TS_OK(kiln_session_set(s, "big", bv, sizeof bv));
    static float bback[20000]; /* set, its copy deferred to the run: read back from the pinned copy */
    TS_OK(kiln_session_get(s, "big", bback, sizeof bback));
    ck_assert_mem_eq(bv, bback, sizeof bv);
    /* Before any run, outputs come from the device (zeros), not an unwritten window. */
    TS_OK(kiln_session_get(s, "r", rv, sizeof rv));
    ck_assert(rv[0] == 0.0f && rv[2] == 0.0f);
    for (int it = 0; it < 5; it++) {
        for (int i = 0; i < 111; i++) xv[i] = (float)(i + 100 * it);
        TS_OK(kiln_session_set(s, "x", xv, sizeof xv));
        TS_OK(kiln_session_get(s, "x", back, sizeof back)); /* as set, before the run */
        ck_assert_mem_eq(xv, back, sizeof xv);
        TS_OK(kiln_session_run(s));
        TS_OK(kiln_session_get(s, "y", yv, sizeof yv));
        TS_OK(kiln_session_get(s, "r", rv, sizeof rv));
        TS_OK(kiln_session_get(s, "bs", bsv, sizeof bsv));
        for (int i = 0; i < 111; i++) ck_assert_msg(yv[i] == 2.0f * xv[i], "run %d: y[%d] %g", it, i, yv[i]);
        for (int r = 0; r < 3; r++) {
            double want = 0;
            for (int i = 0; i < 37; i++) want += 2.0 * xv[r * 37 + i];
            ck_assert_msg(fabs(rv[r] - want) <= 1e-6 * fabs(want), "run %d (%s): r[%d] %g, want %g", it,
                          no_graph ? "plain" : "graph", r, rv[r], want);
        }
        ck_assert_msg(bsv[0] == -3.0f, "run %d: bs %g", it, bsv[0]); /* sum of (i % 7) - 3, exact in f32 */
    }
    ck_assert_int_eq(kiln_session_captures(s), no_graph ? 0 : 1);
    kiln_session_free(s);
    kiln_program_free(p);
    ts_graph_free(g, ctx);
}

START_TEST(test_io_windows) {
    need_gpu();
    windows_case(0);
    windows_case(1);
}
END_TEST

/* ---- session API errors that need a GPU ------------------------------------------------------ */

static void expect_err(kiln_status st, kiln_code code, const char *needle, const char *what) {
    ck_assert_msg(st != NULL, "%s: expected an error", what);
    ck_assert_msg(kiln_status_code(st) == code, "%s: expected %s, got %s: %s", what,
                  kiln_code_name(code), kiln_code_name(kiln_status_code(st)), kiln_status_msg(st));
    ck_assert_msg(!needle || strstr(kiln_status_msg(st), needle), "%s: message lacks \"%s\": %s",
                  what, needle, kiln_status_msg(st));
    kiln_status_free(st);
}

START_TEST(test_session_errors) {
    need_gpu();
    kiln_ctx    *ctx = kiln_ctx_new();
    int64_t      ne[2] = {64, 4};
    kiln_tensor *x = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "x", 2, ne);
    kiln_tensor *w = kiln_new_tensor(ctx, KILN_ROLE_WEIGHT, KILN_F16, "w", 1, ne);
    kiln_set_output(ctx, kiln_silu(ctx, kiln_mul(ctx, x, w)), "y");
    kiln_graph *g = NULL;
    TS_OK(kiln_graph_new(ctx, &g));
    kiln_program *p = compile(g, 0);
    kiln_session *s = new_session(p, 0);
    float         buf[256] = {0};
    expect_err(kiln_session_set(s, "x", buf, 100), KILN_ERR_INVALID, "1024", "set x, wrong size");
    expect_err(kiln_session_set(s, "w", buf, 256), KILN_ERR_INVALID, "128", "set w, wrong size");
    expect_err(kiln_session_set(s, "nope", buf, 4), KILN_ERR_NOT_FOUND, "'x'", "set unknown");
    expect_err(kiln_session_get(s, "nope", buf, 4), KILN_ERR_NOT_FOUND, "'y'", "get unknown");
    expect_err(kiln_session_set(s, "y", buf, 1024), KILN_ERR_INVALID, "output", "set output");
    expect_err(kiln_session_get(s, "y", buf, 4), KILN_ERR_INVALID, "1024", "get y, wrong size");
    expect_err(kiln_session_set(s, "x", NULL, 1024), KILN_ERR_INVALID, NULL, "set NULL data");
    /* Inputs can be read back. */
    for (int i = 0; i < 256; i++) buf[i] = (float)i;
    TS_OK(kiln_session_set(s, "x", buf, 1024));
    float back[256];
    TS_OK(kiln_session_get(s, "x", back, 1024));
    ck_assert_mem_eq(buf, back, 1024);
    kiln_session_free(s);
    kiln_program_free(p);

    /* Sources only: cannot run. */
    kiln_compile_opts o = {.cache_dir = g_cache_dir, .arch = g_arch, .skip_nvrtc = 1};
    TS_OK(kiln_compile(g, &o, &p));
    s = NULL;
    expect_err(kiln_session_new(p, NULL, &s), KILN_ERR_INVALID, "skip_nvrtc", "skip_nvrtc program");
    ck_assert_ptr_null(s);
    kiln_program_free(p);

    /* A cubin for another major architecture. */
    const char *other = strncmp(g_arch, "sm_8", 4) == 0 ? "sm_90" : "sm_80";
    o.arch = other;
    o.skip_nvrtc = 0;
    TS_OK(kiln_compile(g, &o, &p));
    expect_err(kiln_session_new(p, NULL, &s), KILN_ERR_INVALID, other, "wrong arch");
    kiln_program_free(p);

    /* A device that does not exist. */
    o.arch = g_arch;
    TS_OK(kiln_compile(g, &o, &p));
    kiln_session_opts so = {.device = 1000};
    expect_err(kiln_session_new(p, &so, &s), KILN_ERR_NO_GPU, "1000", "device 1000");
    kiln_program_free(p);

    ts_graph_free(g, ctx);
}
END_TEST

/* ---- (4) examples ---------------------------------------------------------------------------- */

static void fill_leaves(kiln_ctx *ctx, hset *h, uint64_t seed, bool positive) {
    hset_free(h);
    for (int i = 0; i < ctx->n; i++) {
        kiln_tensor *t = ctx->t[i];
        if (t->op != FE_OP_LEAF) continue;
        int64_t n = fe_nelements(t);
        hdata  *d = hset_add(h, t->name, t->type, n);
        if (positive) {
            /* [0.5, 1.5): inside the domain of every op (sqrt, div). */
            kb_fill_random(d->data, t->type, n, seed + (uint64_t)i);
            for (int64_t j = 0; j < n; j++)
                kb_store_f32(d->data, t->type, j, 1.0f + 0.5f * kb_load_f32(d->data, t->type, j));
        } else {
            fill(d->data, t->type, n, seed + (uint64_t)i, FILL_ANY);
        }
    }
}

static bool ref_finite(hset *h) {
    for (int o = 0; o < h->nout; o++)
        for (int64_t j = 0; j < h->out[o].n; j++)
            if (!isfinite(kb_load_f32(h->out[o].data, h->out[o].type, j))) return false;
    return true;
}

START_TEST(test_examples) {
    need_gpu();
    char pattern[4096];
    snprintf(pattern, sizeof pattern, "%s/examples/*.kg", ts_src_dir());
    glob_t gl;
    int    rc = glob(pattern, 0, NULL, &gl);
    ck_assert_msg(rc == 0 && gl.gl_pathc > 0, "no examples match %s (set KILN_SRC to the source "
                                              "tree)", pattern);
    for (size_t e = 0; e < gl.gl_pathc; e++) {
        const char *path = gl.gl_pathv[e];
        kiln_ctx   *ctx = kiln_ctx_new();
        TS_OK(kiln_load(ctx, path));
        kiln_graph *g = NULL;
        TS_OK(kiln_graph_new(ctx, &g));
        hset h = {0};
        fill_leaves(ctx, &h, 4242, false);
        scale_weights(g, &h);
        hset_clear_out(&h);
        TS_OK(kiln_reference(g, ref_get, ref_put, &h));
        bool positive = !ref_finite(&h);
        if (positive) {
            printf("note: %s: inputs in [-1, 1) leave the ops' domain; using [0.5, 1.5)\n", path);
            fill_leaves(ctx, &h, 4242, true);
            scale_weights(g, &h);
        }
        double tol = 0;
        for (int i = 0; i < g->n; i++)
            if (fe_ops[g->nodes[i]->op].nmse_tol > tol) tol = fe_ops[g->nodes[i]->op].nmse_tol;
        if (tol == 0) tol = 1e-7;
        for (int graphs = 0; graphs <= 1; graphs++) {
            char label[4200];
            snprintf(label, sizeof label, "example %s%s", path, graphs ? "" : " (no CUDA graph)");
            cmp_opts co = {.label = label, .tol_f32 = tol, .fused_tol = true,
                           .no_graph = !graphs};
            double worst = check_graph(g, &h, &co);
            if (graphs) printf("example %s: worst NMSE %.3g\n", path, worst);
        }
        gpu_free(NULL, NULL, g, &h, ctx);
    }
    globfree(&gl);
}
END_TEST

/* ---- suite ------------------------------------------------------------------------------------ */

int main(void) {
    Suite *s = TS_SUITE("gpu_ops",
                        TS_CASE("elementwise", 900), TS_LOOP(0, FE_OP_COUNT * 3, test_elementwise_ops),
                        TS_CASE("fused", 900), TS_LOOP(0, N_CHAINS * 3, test_fused_chains),
                        TS_CASE("session", 300),
                        TS_TESTS(test_graph_replay, test_graphs_env_off, test_io_windows, test_session_errors),
                        TS_CASE("examples", 900), TS_TESTS(test_examples));
    return ts_main_cache(s, "gpu-ops", &g_cache_dir);
}
