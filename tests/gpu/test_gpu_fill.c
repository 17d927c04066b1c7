/* GPU tests of the fill family (arange, fill, diag_mask_inf, tri): random cases per op and type,
 * compiled, run on the GPU and compared with kiln_reference.
 *
 * These ops only copy values, write constants or compute start + step * i with the same two f32
 * roundings as the reference, so the comparison is bit for bit (stricter than the NMSE of
 * fe_ops[op].nmse_tol, which is 0 for the family): NMSE cannot compare diag_mask_inf's -inf
 * anyway. Operands come in every layout of gpu_support's operand() (permuted, transposed, viewed
 * with offsets, reshaped). $KILN_TEST_CASES sets the cases per op and type (default 20). */
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

/* Runs the reference and the GPU program and compares every output bit for bit. */
static void check_exact(const kiln_graph *g, hset *h, const char *label) {
    hset_clear_out(h);
    for (int i = 0; i < h->nin; i++) h->in[i].requested = false;
    TS_OK(kiln_reference(g, ref_get, ref_put, h));
    ck_assert_msg(h->nout > 0, "%s: the reference produced no output", label);
    kiln_program *p = compile(g, 0);
    kiln_session *s = NULL;
    TS_OK(kiln_session_new(p, NULL, &s));
    for (int i = 0; i < h->nin; i++)
        if (h->in[i].requested)
            TS_OK(kiln_session_set(s, h->in[i].name, h->in[i].data,
                                   (size_t)h->in[i].n * kiln_type_size(h->in[i].type)));
    TS_OK(kiln_session_run(s));
    for (int o = 0; o < h->nout; o++) {
        hdata *r = &h->out[o];
        size_t es = kiln_type_size(r->type), bytes = (size_t)r->n * es;
        char  *out = malloc(bytes ? bytes : 1);
        ck_assert_ptr_nonnull(out);
        TS_OK(kiln_session_get(s, r->name, out, bytes));
        if (memcmp(out, r->data, bytes) != 0) {
            int64_t i = 0;
            while (memcmp(out + (size_t)i * es, (const char *)r->data + (size_t)i * es, es) == 0) i++;
            int64_t bad = 0;
            for (int64_t j = i; j < r->n; j++)
                bad += memcmp(out + (size_t)j * es, (const char *)r->data + (size_t)j * es, es) != 0;
            ck_abort_msg("%s: output '%s' (%s, %lld elements): %lld element(s) differ; first at %lld: gpu "
                         "%.9g, reference %.9g",
                         label, r->name, kiln_type_name(r->type), (long long)r->n, (long long)bad, (long long)i,
                         (double)kb_load_f32(out, r->type, i), (double)kb_load_f32(r->data, r->type, i));
        }
        free(out);
    }
    kiln_session_free(s);
    kiln_program_free(p);
}

/* Shapes: fixed ones first (1, 7, 4097, several dims), then random, at most 2^20 elements. */
static void gen_shape(rng_t *r, int c, bool square, int64_t ne[4]) {
    static const int64_t fixed[][4] = {
        {1, 1, 1, 1}, {7, 7, 1, 1}, {4097, 4097, 1, 1}, {8, 8, 3, 2}, {129, 129, 2, 1}, {64, 64, 1, 3},
    };
    static const int64_t fixed_any[][4] = {
        {1, 1, 1, 1}, {7, 1, 1, 1}, {4097, 3, 1, 1}, {4097, 4097, 1, 1}, {7, 5, 3, 2}, {2, 4097, 1, 1},
    };
    const int nfixed = 6;
    if (c < nfixed) {
        memcpy(ne, square ? fixed[c] : fixed_any[c], sizeof fixed[c]);
        return;
    }
    static const int64_t pick[] = {1, 2, 3, 7, 8, 16, 33, 64, 100, 129, 256, 1000};
    for (int d = 0; d < 4; d++) {
        if (d >= 2 && rng_int(r, 0, 2) == 0) ne[d] = 1;
        else if (rng_int(r, 0, 3) == 0) ne[d] = rng_int(r, 1, 40);
        else ne[d] = pick[rng_int(r, 0, (int)(sizeof pick / sizeof pick[0]) - 1)];
    }
    if (square) ne[1] = ne[0];
    for (int d = 3; d >= 2; d--)
        while (ne[0] * ne[1] * ne[2] * ne[3] > (1 << 20) && ne[d] > 1) ne[d] = (ne[d] + 1) / 2;
    while (ne[0] * ne[1] * ne[2] * ne[3] > (1 << 20)) {
        ne[0] = (ne[0] + 1) / 2;
        ne[1] = square ? ne[0] : (ne[1] + 1) / 2;
    }
}

/* fill constants: ordinary ones, and ones that round interestingly in f16/bf16. */
static float fill_value(rng_t *r, int c) {
    static const float special[] = {0.0f, -0.0f, 1.0f, 0.1f, 65520.0f, 1e-7f, -3.4e38f, INFINITY, -INFINITY,
                                    3.14159265f};
    if (c < (int)(sizeof special / sizeof special[0])) return special[c];
    return rng_float(r, -1000.0f, 1000.0f);
}

static const char *TRI_NAMES[4] = {"upper_diag", "upper", "lower_diag", "lower"};

static void run_case(fe_op op, kiln_type t, int c, uint64_t seed) {
    rng_t    r = {seed};
    kiln_ctx *ctx = kiln_ctx_new();
    hset      h = {0};
    char      label[512], desc[192] = "", s[96];
    kiln_tensor *y = NULL;
    if (op == FE_OP_ARANGE) {
        /* counts 1, 7, 4097, 2^25 + 3 (indices past 2^24 round when converted to float), random */
        static const int64_t counts[] = {1, 7, 4097, 33554435};
        int64_t n = c < 4 ? counts[c] : rng_int(&r, 2, 1 << 20);
        float   start = c < 4 ? (float)c - 1.0f : rng_float(&r, -100.0f, 100.0f);
        float   step = c < 4 ? 1.0f : (rng_int(&r, 0, 1) ? rng_float(&r, 0.001f, 0.1f) : rng_float(&r, 0.5f, 10.0f));
        float   stop = start + step * ((float)n - 0.5f);
        y = kiln_arange(ctx, start, stop, step);
        ck_assert_msg(y != NULL, "arange(%g, %g, %g): %s", (double)start, (double)stop, (double)step,
                      kiln_status_msg(kiln_ctx_status(ctx)));
        snprintf(label, sizeof label, "op arange case %d (seed %llu): arange(%.9g, %.9g, %.9g) -> %lld elements",
                 c, (unsigned long long)seed, (double)start, (double)stop, (double)step,
                 (long long)kiln_tensor_ne(y, 0));
    } else {
        int64_t ne[4];
        gen_shape(&r, c, op == FE_OP_TRI, ne);
        layout lay = c < 2 ? LAY_PLAIN : (layout)rng_int(&r, 0, LAY_COUNT - 1);
        rng_t  lr = {seed ^ 0x5eedull};
        kiln_tensor *a = operand(ctx, &h, &lr, "a", t, ne, lay, FILL_ANY, seed * 3 + 1, desc, sizeof desc);
        char params[96];
        if (op == FE_OP_FILL) {
            float v = fill_value(&r, c);
            y = kiln_fill(ctx, a, v);
            snprintf(params, sizeof params, "c = %.9g", (double)v);
        } else if (op == FE_OP_DIAG_MASK_INF) {
            int n_past = c % 4 == 3 ? (int)ne[0] + rng_int(&r, 0, 3) : rng_int(&r, 0, (int)(ne[0] < 8 ? ne[0] : 8));
            y = kiln_diag_mask_inf(ctx, a, n_past);
            snprintf(params, sizeof params, "n_past = %d", n_past);
        } else {
            kiln_tri_type tt = (kiln_tri_type)(c % 4);
            y = kiln_tri(ctx, a, tt);
            snprintf(params, sizeof params, "type = %s", TRI_NAMES[tt]);
        }
        shape_str(ne, s, sizeof s);
        snprintf(label, sizeof label, "op %s %s case %d (seed %llu): %s %s; a = %s", fe_ops[op].name,
                 kiln_type_name(t), c, (unsigned long long)seed, s, params, desc);
    }
    kiln_set_output(ctx, y, "y");
    kiln_graph *g = NULL;
    kiln_status st = kiln_graph_new(ctx, &g);
    ck_assert_msg(st == NULL, "%s: kiln_graph_new failed: %s", label, kiln_status_msg(st));
    check_exact(g, &h, label);
    gpu_free(NULL, NULL, g, &h, ctx);
}

static const fe_op OPS[] = {FE_OP_ARANGE, FE_OP_FILL, FE_OP_DIAG_MASK_INF, FE_OP_TRI};
#define N_OPS ((int)(sizeof OPS / sizeof OPS[0]))

START_TEST(test_fill_ops) {
    need_gpu();
    fe_op     op = OPS[_i / 3];
    kiln_type t = FLOAT_TYPES[_i % 3];
    if (op == FE_OP_ARANGE && t != KILN_F32) return; /* arange makes f32 only */
    int n = num_cases();
    for (int c = 0; c < n; c++) run_case(op, t, c, 7777ull * (uint64_t)(_i + 1) + (uint64_t)c);
}
END_TEST

/* The family inside a program: masks and fills feed elementwise kernels through the arena, and
 * arange broadcasts into an add, as in a graph that builds its own positions and masks. */
START_TEST(test_fill_in_graph) {
    need_gpu();
    kiln_ctx *ctx = ts_parse("input s: f32[64, 64, 4]\n"
                             "output m = diag_mask_inf(s, 3)\nt = tri(s, lower_diag)\n"
                             "f = fill(s, 0.5)\noutput x = add(t, f)\n"
                             "r = arange(0, 64, 1)\noutput y = mul(s, r)\n"
                             "h = cast(s, f16)\noutput z = tri(h, upper)\n");
    hset  h = {0};
    hdata *d = hset_add(&h, "s", KILN_F32, 64 * 64 * 4);
    fill(d->data, KILN_F32, d->n, 99, FILL_ANY);
    kiln_graph *g;
    TS_OK(kiln_graph_new(ctx, &g));
    check_exact(g, &h, "fill family in a graph");
    gpu_free(NULL, NULL, g, &h, ctx);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_fill",
                        TS_CASE("fill", 600), TS_LOOP(0, N_OPS * 3, test_fill_ops), TS_TESTS(test_fill_in_graph));
    return ts_main_cache(s, "gpu-fill", &g_cache_dir);
}
