/* GPU tests of the elementwise-lowered ops beyond the unary/binary ones: add1, the gated linear
 * units (reglu, geglu, swiglu, swiglu_oai, geglu_erf, geglu_quick; one-tensor form, swapped,
 * split form) and the copies (cpy, dup, cast, repeat). Random cases per op and type, operands in
 * every layout of gpu_support's operand() (permuted, transposed, viewed with offsets, reshaped),
 * compiled, run on the GPU and compared with kiln_reference by NMSE against fe_ops[op].nmse_tol
 * (ggml's test-backend-ops default, 1e-7). The copies move values without arithmetic, so they
 * must match exactly (NMSE 0). $KILN_TEST_CASES sets the cases per op and type (default 20). */
#include "tests/support.h"

#include "frontend/frontend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/gpu_support.h"

static int num_cases(void) {
    const char *e = getenv("KILN_TEST_CASES");
    int         n = e && *e ? atoi(e) : 20;
    return n > 0 ? n : 20;
}

/* Shapes: fixed ones first (1, 7, 4097, several dims), then random; at most 2^19 elements. */
static void gen_shape(rng_t *r, int c, int64_t ne[4]) {
    static const int64_t fixed[][4] = {
        {1, 1, 1, 1}, {7, 1, 1, 1}, {4097, 3, 1, 1}, {7, 1, 3, 2}, {1, 7, 1, 5}, {33, 17, 4, 3}, {2, 4097, 1, 1},
        {4096, 64, 1, 1},
    };
    if (c < (int)(sizeof fixed / sizeof fixed[0])) {
        memcpy(ne, fixed[c], sizeof fixed[c]);
        return;
    }
    random_ew_shape(r, ne);
}

/* A random divisor of n: 1, n, or another. */
static int64_t divisor(rng_t *r, int64_t n) {
    int k = rng_int(r, 0, 2);
    if (k == 0) return 1;
    if (k == 1) return n;
    int64_t ds[64];
    int     nds = 0;
    for (int64_t d = 2; d < n && nds < 64; d++)
        if (n % d == 0) ds[nds++] = d;
    return nds ? ds[rng_int(r, 0, nds - 1)] : n;
}

/* Multiplies the host data of leaf `name` by s (GLU inputs over [-8, 8): the activations' tails
 * and swiglu_oai's clamps are exercised). */
static void scale_data(hset *h, const char *name, float s) {
    for (int i = 0; i < h->nin; i++) {
        if (strcmp(h->in[i].name, name) != 0) continue;
        for (int64_t j = 0; j < h->in[i].n; j++)
            kb_store_f32(h->in[i].data, h->in[i].type, j, s * kb_load_f32(h->in[i].data, h->in[i].type, j));
    }
}

static bool is_glu(fe_op op) { return fe_ops[op].kind == FE_GLU; }
static bool is_copy(fe_op op) { return fe_ops[op].kind == FE_COPY; }

static kiln_tensor *glu(kiln_ctx *ctx, fe_op op, kiln_tensor *a, kiln_tensor *b, bool swapped, float alpha,
                        float limit) {
    switch (op) {
    case FE_OP_REGLU: return kiln_reglu(ctx, a, b, swapped);
    case FE_OP_GEGLU: return kiln_geglu(ctx, a, b, swapped);
    case FE_OP_SWIGLU: return kiln_swiglu(ctx, a, b, swapped);
    case FE_OP_GEGLU_ERF: return kiln_geglu_erf(ctx, a, b, swapped);
    case FE_OP_GEGLU_QUICK: return kiln_geglu_quick(ctx, a, b, swapped);
    case FE_OP_SWIGLU_OAI: return kiln_swiglu_oai(ctx, a, b, swapped, alpha, limit);
    default: ck_abort_msg("not a GLU: %s", fe_ops[op].name);
    }
    return NULL;
}

static layout pick_layout(rng_t *r, int c) { return c < 2 ? LAY_PLAIN : (layout)rng_int(r, 0, LAY_COUNT - 1); }

/* Builds case c of op for type t into ctx/h; writes a description to label. */
static kiln_tensor *build_case(kiln_ctx *ctx, hset *h, fe_op op, kiln_type t, int c, uint64_t seed, char *label,
                               size_t label_n) {
    rng_t   r = {seed};
    rng_t   lr = {seed ^ 0xC0FFEEull};
    int64_t ne[4];
    gen_shape(&r, c, ne);
    char da[192] = "", db[192] = "", extra[160] = "", s[96];
    kiln_tensor *y = NULL;
    if (is_glu(op)) {
        bool  split = c % 2 == 1, swapped = !split && (c / 2) % 2 == 1;
        float alpha = 1.702f, limit = 7.0f;
        if (op == FE_OP_SWIGLU_OAI && c >= 4) alpha = rng_float(&r, 0.5f, 2.0f), limit = rng_float(&r, 1.0f, 10.0f);
        int64_t na[4] = {split ? ne[0] : 2 * ne[0], ne[1], ne[2], ne[3]};
        kiln_tensor *a = operand(ctx, h, &lr, "a", t, na, pick_layout(&r, c), FILL_ANY, seed * 3 + 1, da, sizeof da);
        kiln_tensor *b = split ? operand(ctx, h, &lr, "b", t, ne, pick_layout(&r, c), FILL_ANY, seed * 3 + 2, db, sizeof db)
                               : NULL;
        scale_data(h, "a", 8.0f);
        scale_data(h, "b", 8.0f);
        y = glu(ctx, op, a, b, swapped, alpha, limit);
        snprintf(extra, sizeof extra, "%s form%s", split ? "split" : "one-tensor", swapped ? ", swapped" : "");
        if (op == FE_OP_SWIGLU_OAI) {
            size_t l = strlen(extra);
            snprintf(extra + l, sizeof extra - l, ", alpha %.9g, limit %.9g", (double)alpha, (double)limit);
        }
    } else if (op == FE_OP_ADD1) {
        kiln_tensor *a = operand(ctx, h, &lr, "a", t, ne, pick_layout(&r, c), FILL_ANY, seed * 3 + 1, da, sizeof da);
        kiln_type    st = c % 3 == 2 ? KILN_F32 : t;
        int64_t      one[4] = {1, 1, 1, 1};
        kiln_tensor *sc = operand(ctx, h, &lr, "s", st, one, LAY_PLAIN, FILL_ANY, seed * 3 + 2, db, sizeof db);
        y = kiln_add1(ctx, a, sc);
        snprintf(extra, sizeof extra, "scalar %s", kiln_type_name(st));
    } else if (op == FE_OP_CPY || op == FE_OP_CAST) {
        kiln_type to = FLOAT_TYPES[c % 3];
        kiln_tensor *a = operand(ctx, h, &lr, "a", t, ne, pick_layout(&r, c), FILL_ANY, seed * 3 + 1, da, sizeof da);
        if (op == FE_OP_CAST) {
            y = kiln_cast(ctx, a, to);
            snprintf(extra, sizeof extra, "to %s", kiln_type_name(to));
        } else {
            /* b: same shape, flat, two dims, or dims reversed (a's elements in its logical order) */
            int64_t n = ne[0] * ne[1] * ne[2] * ne[3], nb[4];
            int     mode = (c / 3) % 4;
            int64_t shapes[4][4] = {{ne[0], ne[1], ne[2], ne[3]}, {n, 1, 1, 1}, {ne[0] * ne[1], ne[2] * ne[3], 1, 1},
                                    {ne[3], ne[2], ne[1], ne[0]}};
            memcpy(nb, shapes[mode], sizeof nb);
            kiln_tensor *b = operand(ctx, h, &lr, "b", to, nb, pick_layout(&r, c), FILL_ANY, seed * 3 + 2, db, sizeof db);
            y = kiln_cpy(ctx, a, b);
            snprintf(extra, sizeof extra, "to %s", kiln_type_name(to));
        }
    } else if (op == FE_OP_DUP) {
        layout       lay = c < 2 ? LAY_PLAIN : (layout)rng_int(&r, 1, LAY_COUNT - 1);
        kiln_tensor *a = operand(ctx, h, &lr, "a", t, ne, lay, FILL_ANY, seed * 3 + 1, da, sizeof da);
        y = kiln_dup(ctx, a);
    } else if (op == FE_OP_REPEAT) {
        int64_t na[4];
        for (int d = 0; d < 4; d++) na[d] = divisor(&r, ne[d]);
        kiln_tensor *a = operand(ctx, h, &lr, "a", t, na, pick_layout(&r, c), FILL_ANY, seed * 3 + 1, da, sizeof da);
        kiln_tensor *b = operand(ctx, h, &lr, "b", t, ne, LAY_PLAIN, FILL_ANY, seed * 3 + 2, db, sizeof db);
        y = kiln_repeat(ctx, a, b);
    } else {
        ck_abort_msg("no builder for %s", fe_ops[op].name);
    }
    shape_str(ne, s, sizeof s);
    snprintf(label, label_n, "op %s %s case %d (seed %llu)%s%s: shape %s; a = %s%s%s", fe_ops[op].name,
             kiln_type_name(t), c, (unsigned long long)seed, extra[0] ? ", " : "", extra, s, da, db[0] ? "; b = " : "",
             db);
    return y;
}

static const fe_op OPS[] = {FE_OP_ADD1,      FE_OP_REGLU, FE_OP_GEGLU, FE_OP_SWIGLU, FE_OP_SWIGLU_OAI,
                            FE_OP_GEGLU_ERF, FE_OP_GEGLU_QUICK, FE_OP_CPY, FE_OP_DUP, FE_OP_CAST, FE_OP_REPEAT};
#define N_OPS ((int)(sizeof OPS / sizeof OPS[0]))

START_TEST(test_ops) {
    need_gpu();
    fe_op     op = OPS[_i / 3];
    kiln_type t = FLOAT_TYPES[_i % 3];
    int       n = num_cases();
    double    worst = 0;
    for (int c = 0; c < n; c++) {
        kiln_ctx *ctx = kiln_ctx_new();
        hset      h = {0};
        char      label[1024];
        uint64_t  seed = 104729ull * (uint64_t)(_i + 1) + (uint64_t)c;
        kiln_tensor *y = build_case(ctx, &h, op, t, c, seed, label, sizeof label);
        kiln_set_output(ctx, y, "y");
        kiln_graph *g = NULL;
        kiln_status st = kiln_graph_new(ctx, &g);
        ck_assert_msg(st == NULL, "%s: kiln_graph_new failed: %s", label, kiln_status_msg(st));
        cmp_opts co = {.label = label, .tol_f32 = fe_ops[op].nmse_tol};
        double   e = check_graph(g, &h, &co);
        if (is_copy(op)) ck_assert_msg(e == 0, "%s: a copy must be exact, NMSE is %.3g", label, e);
        if (e > worst) worst = e;
        gpu_free(NULL, NULL, g, &h, ctx);
    }
    printf("%-12s %-4s %d cases, worst NMSE %.3g\n", fe_ops[op].name, kiln_type_name(t), n, worst);
}
END_TEST

/* GLUs and copies inside fused chains: the fused kernel rounds each intermediate to its graph
 * type, so fused and unfused programs both match the unfused reference. */
static const char *CHAINS[] = {
    /* a GLU whose gate is computed, then scaled: mul -> geglu (split) -> scale */
    "input x: %s[256, 33]\ninput w: %s[256]\ng = mul(x, w)\nh = geglu(x, g)\noutput y = scale(h, 0.5, 0.25)\n",
    /* one-tensor swiglu of a transposed input, times a broadcast row */
    "input x: %s[66, 512]\ninput w: %s[256]\nt = transpose(x)\ns = swiglu(t, swapped=true)\noutput y = mul(s, w)\n",
    /* casts and copies around a GLU: f32 math, result back in the input type */
    "input x: %s[128, 64]\ninput d: %s[64, 64]\nc = cast(x, f32)\ng = swiglu_oai(c)\nk = cpy(g, d)\n"
    "output y = add(k, d)\n",
    /* repeat feeding a GLU and add1 after it */
    "input x: %s[64, 1, 3]\ninput b: %s[64, 8, 3]\ninput s: %s[1]\nr = repeat(x, b)\ng = reglu(r, b)\n"
    "output y = add1(g, s)\n",
};

START_TEST(test_chains) {
    need_gpu();
    int       chain = _i / 3;
    kiln_type t = FLOAT_TYPES[_i % 3];
    const char *ty = kiln_type_name(t);
    char text[1024];
    snprintf(text, sizeof text, CHAINS[chain], ty, ty, ty, ty);
    for (int no_fuse = 0; no_fuse <= 1; no_fuse++) {
        kiln_ctx *ctx = ts_parse(text);
        hset      h = {0};
        for (int i = 0; i < ctx->n; i++) {
            kiln_tensor *x = ctx->t[i];
            if (x->op != FE_OP_LEAF) continue;
            hdata *d = hset_add(&h, x->name, x->type, fe_nelements(x));
            fill(d->data, x->type, d->n, 31 + (uint64_t)i, FILL_ANY);
        }
        scale_data(&h, "x", 4.0f);
        kiln_graph *g;
        TS_OK(kiln_graph_new(ctx, &g));
        char label[1200];
        snprintf(label, sizeof label, "chain %d %s%s:\n%s", chain, ty, no_fuse ? " (no_fuse)" : "", text);
        cmp_opts co = {.label = label, .tol_f32 = 1e-7, .fused_tol = !no_fuse, .no_fuse = no_fuse};
        check_and_free(g, &h, ctx, &co);
    }
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_ew_extra",
                        TS_CASE("ops", 900), TS_LOOP(0, N_OPS * 3, test_ops),
                        TS_CASE("chains", 300), TS_LOOP(0, (int)(sizeof CHAINS / sizeof CHAINS[0]) * 3, test_chains));
    return ts_main_cache(s, "gpu-ew-extra", &g_cache_dir);
}
