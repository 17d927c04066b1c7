/* Decode with a growing KV length (issue 6): 200 decode steps (n_tokens = 1: its specialized program) of examples/llama-layer.kg, whose
 * attention reads n_kv = step + 1 cache slots of states written in place. One compile, then
 * per step: set n_kv and the inputs, run. Checks: no compile after the first step (there is no
 * second compile, and the program's counters do not move), exactly one CUDA-graph capture and
 * 200 replays, every step's output and the final caches bit for bit equal to plain launches,
 * and at sampled steps the CPU reference of the graph bound to that n_kv, from the same cache
 * contents. Prints the host time per step. */
#include "tests/gpu/gpu_support.h"

#include "base/base.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STEPS 200
#define KV_SLOTS 512
#define ROW 512 /* n_embd_k_gqa: one cache row */

typedef struct {
    const char *name;
    kiln_type   type;
    int64_t     n;
    void       *data;
} blob;

/* Host data by name for the reference: inputs, weights, states before the step. */
typedef struct {
    blob  in[32];
    int   nin;
    float *out, *k_after, *v_after;
} refdata;

static const void *rget(void *user, const char *name, kiln_type type, int64_t n) {
    refdata *r = user;
    for (int i = 0; i < r->nin; i++)
        if (!strcmp(r->in[i].name, name)) {
            ck_assert_msg(r->in[i].type == type && r->in[i].n == n, "%s: %lld elements wanted, have %lld", name,
                          (long long)n, (long long)r->in[i].n);
            return r->in[i].data;
        }
    ck_abort_msg("reference wants unknown '%s'", name);
    return NULL;
}

static void rput(void *user, const char *name, kiln_type type, int64_t n, const void *data) {
    refdata *r = user;
    float  **dst = !strcmp(name, "out") ? &r->out : !strcmp(name, "cache_k") ? &r->k_after
                 : !strcmp(name, "cache_v") ? &r->v_after : NULL;
    if (!dst) return;
    *dst = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) (*dst)[i] = kb_load_f32(data, type, i);
}

static double nmse_f(const float *a, const float *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

/* Compares step `t` of the GPU with the CPU reference of the graph at n_kv = t + 1. */
static void check_step(const kiln_ctx *ctx, refdata *r, int t, const float *gpu_out, const uint16_t *gpu_k,
                       const uint16_t *gpu_v) {
    kiln_ctx   *b;
    const char *names[2] = {"n_kv", "n_tokens"};
    int64_t     v[2] = {t + 1, 1};
    TS_OK(kiln_ctx_bind(ctx, 2, names, v, &b));
    kiln_graph *g;
    TS_OK(kiln_graph_new(b, &g));
    TS_OK(kiln_reference(g, rget, rput, r));
    double e = nmse_f(gpu_out, r->out, 2048), tol = kiln_graph_nmse_tol(g);
    float *k = malloc(sizeof(float) * ROW * KV_SLOTS), *vv = malloc(sizeof(float) * ROW * KV_SLOTS);
    for (int i = 0; i < ROW * KV_SLOTS; i++) {
        k[i] = kb_load_f32(gpu_k, KILN_F16, i);
        vv[i] = kb_load_f32(gpu_v, KILN_F16, i);
    }
    double ek = nmse_f(k, r->k_after, ROW * KV_SLOTS), ev = nmse_f(vv, r->v_after, ROW * KV_SLOTS);
    printf("step %3d (n_kv %3d): out NMSE %.3g, k_cache %.3g, v_cache %.3g vs CPU reference (limit %g)\n", t,
           t + 1, e, ek, ev, tol);
    ck_assert_msg(e <= tol && ek <= 1e-3 && ev <= 1e-3, "step %d: NMSE out %g k %g v %g", t, e, ek, ev);
    free(k);
    free(vv);
    free(r->out);
    free(r->k_after);
    free(r->v_after);
    r->out = r->k_after = r->v_after = NULL;
    ts_graph_free(g, b);
}

static void set_both(kiln_session *s[2], const char *name, const void *data, size_t bytes) {
    for (int i = 0; i < 2; i++) TS_OK(kiln_session_set(s[i], name, data, bytes));
}

START_TEST(decode_200_steps) {
    need_gpu();
    char path[4096];
    snprintf(path, sizeof path, "%s/examples/llama-layer.kg", ts_src_dir());
    kiln_ctx *ctx = kiln_ctx_new();
    TS_OK(kiln_load(ctx, path));
    kiln_graph *g;
    TS_OK(kiln_graph_new(ctx, &g));
    kiln_program *p = compile(g, 0);
    kiln_compile_stats cs0, cs1;
    kiln_program_stats(p, &cs0);

    kiln_session     *s[2];
    kiln_session_opts graph_opts = {0}, plain_opts = {.no_cuda_graph = 1};
    TS_OK(kiln_session_new(p, &graph_opts, &s[0]));
    TS_OK(kiln_session_new(p, &plain_opts, &s[1]));

    /* Weights: random, the same in both sessions and in the reference. */
    refdata r = {0};
    for (int i = 0; i < kiln_graph_size(g); i++) {
        kiln_tensor *t = kiln_graph_node(g, i);
        if (kiln_tensor_role(t) != KILN_ROLE_WEIGHT) continue;
        blob *b = &r.in[r.nin++];
        b->name = kiln_tensor_name(t);
        b->type = kiln_tensor_type(t);
        b->n = kiln_tensor_nelements(t);
        b->data = malloc((size_t)b->n * kiln_type_size(b->type));
        kb_fill_random(b->data, b->type, b->n, 1000u + (uint64_t)i);
        /* norm weights near 1, projections small: activations stay in range for 200 steps */
        set_both(s, b->name, b->data, (size_t)b->n * kiln_type_size(b->type));
    }
    int      nw = r.nin;
    float    inpl[2048];
    int32_t  pos;
    int64_t  idx;
    uint16_t mask[KV_SLOTS] = {0};
    uint16_t *kc[2], *vc[2];
    for (int i = 0; i < 2; i++) {
        kc[i] = malloc(sizeof(uint16_t) * ROW * KV_SLOTS);
        vc[i] = malloc(sizeof(uint16_t) * ROW * KV_SLOTS);
    }
    float out[2][2048];
    static const int sample[] = {0, 1, 63, 127, 199};
    int              next_sample = 0;
    for (int t = 0; t < STEPS; t++) {
        kb_fill_random(inpl, KILN_F32, 2048, 77u + (uint64_t)t);
        pos = t;
        idx = t;
        for (int i = 0; i < 2; i++) {
            TS_OK(kiln_session_set_dim(s[i], "n_tokens", 1)); /* the decode specialization */
            TS_OK(kiln_session_set_dim(s[i], "n_kv", t + 1));
        }
        set_both(s, "inpL", inpl, sizeof inpl);
        set_both(s, "inp_pos", &pos, sizeof pos);
        set_both(s, "kv_idxs", &idx, sizeof idx);
        set_both(s, "kq_mask", mask, sizeof(uint16_t) * (size_t)(t + 1));
        bool sampled = next_sample < (int)(sizeof sample / sizeof sample[0]) && sample[next_sample] == t;
        if (sampled) { /* the caches before the step, for the reference */
            TS_OK(kiln_session_get(s[1], "cache_k", kc[1], sizeof(uint16_t) * ROW * KV_SLOTS));
            TS_OK(kiln_session_get(s[1], "cache_v", vc[1], sizeof(uint16_t) * ROW * KV_SLOTS));
            r.nin = nw;
            r.in[r.nin++] = (blob){"inpL", KILN_F32, 2048, inpl};
            r.in[r.nin++] = (blob){"inp_pos", KILN_I32, 1, &pos};
            r.in[r.nin++] = (blob){"kv_idxs", KILN_I64, 1, &idx};
            r.in[r.nin++] = (blob){"kq_mask", KILN_F16, t + 1, mask};
            r.in[r.nin++] = (blob){"cache_k", KILN_F16, ROW * KV_SLOTS, kc[1]};
            r.in[r.nin++] = (blob){"cache_v", KILN_F16, ROW * KV_SLOTS, vc[1]};
        }
        for (int i = 0; i < 2; i++) {
            TS_OK(kiln_session_run(s[i]));
            TS_OK(kiln_session_get(s[i], "out", out[i], sizeof out[i]));
        }
        ck_assert_msg(memcmp(out[0], out[1], sizeof out[0]) == 0, "step %d: graph replay and plain launches differ", t);
        for (int j = 0; j < 2048; j++) ck_assert_msg(isfinite(out[0][j]), "step %d: out[%d] is not finite", t, j);
        if (sampled) {
            uint16_t *k_after = malloc(sizeof(uint16_t) * ROW * KV_SLOTS), *v_after = malloc(sizeof(uint16_t) * ROW * KV_SLOTS);
            TS_OK(kiln_session_get(s[0], "cache_k", k_after, sizeof(uint16_t) * ROW * KV_SLOTS));
            TS_OK(kiln_session_get(s[0], "cache_v", v_after, sizeof(uint16_t) * ROW * KV_SLOTS));
            check_step(ctx, &r, t, out[0], k_after, v_after);
            free(k_after);
            free(v_after);
            next_sample++;
        }
    }
    for (int i = 0; i < 2; i++) {
        TS_OK(kiln_session_get(s[i], "cache_k", kc[i], sizeof(uint16_t) * ROW * KV_SLOTS));
        TS_OK(kiln_session_get(s[i], "cache_v", vc[i], sizeof(uint16_t) * ROW * KV_SLOTS));
    }
    ck_assert_msg(!memcmp(kc[0], kc[1], sizeof(uint16_t) * ROW * KV_SLOTS) &&
                      !memcmp(vc[0], vc[1], sizeof(uint16_t) * ROW * KV_SLOTS),
                  "the caches after %d steps differ between graph replay and plain launches", STEPS);
    /* The caches hold exactly the STEPS rows written (the rest is still zero). */
    int written = 0;
    for (int row = 0; row < KV_SLOTS; row++) {
        bool any = false;
        for (int j = 0; j < ROW; j++) any |= kc[0][row * ROW + j] != 0;
        written += any;
        ck_assert_msg(any == (row < STEPS), "cache_k row %d %s", row, any ? "written" : "not written");
    }
    kiln_session_stats st[2];
    for (int i = 0; i < 2; i++) kiln_session_get_stats(s[i], &st[i]);
    kiln_program_stats(p, &cs1);
    printf("decode %d steps, n_kv 1..%d: kernels compiled %d at the first compile, %d after (no recompile); graph "
           "session: %lld capture, %lld replays, host %.1f us per step; plain session: %lld runs, host %.1f us per "
           "step; %d cache rows written\n",
           STEPS, STEPS, cs0.compiled + cs0.cached, cs1.compiled + cs1.cached - (cs0.compiled + cs0.cached),
           (long long)st[0].captures, (long long)st[0].replays, st[0].host_us_total / (double)st[0].runs,
           (long long)st[1].plain_runs, st[1].host_us_total / (double)st[1].runs, written);
    ck_assert_int_eq(cs1.compiled, cs0.compiled);
    ck_assert_int_eq(cs1.cached, cs0.cached);
    ck_assert_int_eq(st[0].variant, 1); /* n_tokens = 1 ran the decode program */
    ck_assert_int_eq(st[0].captures, 1);
    ck_assert_int_eq(st[0].replays, STEPS);
    ck_assert_int_eq(st[0].plain_runs, 0);
    ck_assert_int_eq(st[1].captures, 0);
    ck_assert_int_eq(st[1].plain_runs, STEPS);
    for (int i = 0; i < 2; i++) {
        free(kc[i]);
        free(vc[i]);
        kiln_session_free(s[i]);
    }
    for (int i = 0; i < nw; i++) free(r.in[i].data);
    kiln_program_free(p);
    ts_graph_free(g, ctx);
}
END_TEST

/* A value over the maximum is refused at run time too, with the dim's range. */
START_TEST(set_dim_errors) {
    need_gpu();
    kiln_ctx *ctx;
    kiln_graph *g = ts_build("dim n <= 8\ninput x: f32[4, n]\noutput y = scale(x, 2, 0)\n", &ctx);
    kiln_program *p = compile(g, 0);
    kiln_session *s;
    TS_OK(kiln_session_new(p, NULL, &s));
    kiln_status e = kiln_session_set_dim(s, "n", 9);
    ck_assert_ptr_nonnull(e);
    ck_assert_msg(strstr(kiln_status_msg(e), "n = 9 is out of range: 1 .. 8"), "%s", kiln_status_msg(e));
    kiln_status_free(e);
    e = kiln_session_set_dim(s, "m", 1);
    ck_assert_msg(e && strstr(kiln_status_msg(e), "no symbolic dim 'm'"), "%s", kiln_status_msg(e));
    kiln_status_free(e);
    /* Inputs and outputs take the shape at the current value. */
    TS_OK(kiln_session_set_dim(s, "n", 3));
    float x[12], y[12];
    for (int i = 0; i < 12; i++) x[i] = (float)i;
    e = kiln_session_set(s, "x", x, sizeof(float) * 32);
    ck_assert_msg(e && strstr(kiln_status_msg(e), "set the dims first"), "%s", kiln_status_msg(e));
    kiln_status_free(e);
    TS_OK(kiln_session_set(s, "x", x, sizeof x));
    TS_OK(kiln_session_run(s));
    TS_OK(kiln_session_get(s, "y", y, sizeof y));
    for (int i = 0; i < 12; i++) ck_assert_float_eq(y[i], 2.0f * (float)i);
    kiln_session_free(s);
    kiln_program_free(p);
    ts_graph_free(g, ctx);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_decode",
                        TS_CASE("all", 600), TS_TESTS(decode_200_steps, set_dim_errors));
    return ts_main_cache(s, "gpu-decode", &g_cache_dir);
}
