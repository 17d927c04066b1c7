/* The runtime's utility kernels on the GPU (templates/util.lua, loaded by rt_util_load through
 * the kernel cache): kiln_session_fill_weights writes the generator's values bit for bit in
 * f32, f16 and bf16, over more elements than one pass of its capped grid covers and a count
 * that is no multiple of its block; kiln_device_flush_l2 runs; and both kernels land in the
 * kernel cache, where the next use finds them. tests/test_util_kernels.c checks the same
 * kernels without a GPU; test_gpu_model.c (device_fill_equals_file) checks whole models. */
#include "tests/support.h"

#include "codegen/codegen.h"

#include <stdlib.h>
#include <string.h>

#include "tests/gpu/gpu_support.h"

/* 8192 blocks of 256 threads (the fill's grid cap) cover 2^21 elements a pass: a few more. */
#define N 2100001

static const kiln_type types[3] = {KILN_F32, KILN_F16, KILN_BF16};
static const char *const weights[3] = {"w32", "w16", "wb"};

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Each weight its own key, scale and base. */
static kiln_status init(void *user, const char *name, kiln_type type, const int64_t ne[4], kiln_weight_init *out) {
    (void)user, (void)type, (void)ne;
    int i = name[1] == '3' ? 0 : name[1] == '1' ? 1 : 2;
    *out = (kiln_weight_init){.key = 0x1234567ull * (uint64_t)(i + 1), .scale = 0.75f + 0.5f * (float)i, .base = 0.125f * (float)i};
    return NULL;
}

/* Entries of the cache whose meta starts with "kernel NAME\n". */
typedef struct {
    const char *name;
    int         n;
} count_ctx;

static int count_kernel(void *user, const kc_entry *e) {
    count_ctx *c = user;
    size_t     len = strlen(c->name);
    if (e->kind == KC_CUBIN && e->meta && strncmp(e->meta, "kernel ", 7) == 0 && strncmp(e->meta + 7, c->name, len) == 0 &&
        e->meta[7 + len] == '\n')
        c->n++;
    return 0;
}

static int cached(const char *name) {
    kc_cache c = {.mode = KILN_CACHE_ON};
    TS_OK(kc_default_dir(NULL, &c.dir));
    count_ctx n = {name, 0};
    TS_OK(kc_walk(&c, true, count_kernel, &n));
    free(c.dir);
    return n.n;
}

static void fill_and_check(kiln_program *p) {
    kiln_session *s = NULL;
    TS_OK(kiln_session_new(p, NULL, &s));
    TS_OK(kiln_session_fill_weights(s, init, NULL));
    TS_OK(kiln_session_run(s));
    void *got = malloc((size_t)N * 4), *want = malloc((size_t)N * 4);
    for (int t = 0; t < 3; t++) {
        kiln_weight_init w;
        init(NULL, weights[t], types[t], NULL, &w);
        for (int64_t e = 0; e < N; e++) {
            float u = (float)(mix(w.key + (uint64_t)e * 0x9e3779b97f4a7c15ull) >> 40) * (1.0f / 8388608.0f) - 1.0f;
            kb_store_f32(want, types[t], e, w.base + w.scale * u);
        }
        char out[8];
        snprintf(out, sizeof out, "y%d", t);
        size_t bytes = (size_t)N * kiln_type_size(types[t]);
        TS_OK(kiln_session_get(s, out, got, bytes));
        ck_assert_msg(memcmp(got, want, bytes) == 0, "%s (%s): the device's fill differs from the generator",
                      weights[t], kiln_type_name(types[t]));
    }
    free(got);
    free(want);
    kiln_session_free(s);
}

/* Two sessions fill their weights: the values are the generator's, and the kernel is stored
 * once and then found in the cache. */
START_TEST(fill_weights_exact_and_cached) {
    need_gpu();
    char kg[512];
    snprintf(kg, sizeof kg,
             "kiln-graph 1\nweight w32: f32[%d]\nweight w16: f16[%d]\nweight wb: bf16[%d]\n"
             "output y0 = cont(w32)\noutput y1 = cont(w16)\noutput y2 = cont(wb)\n",
             N, N, N);
    kiln_ctx   *ctx;
    kiln_graph *g = ts_build(kg, &ctx);
    kiln_program *p = compile(g, 0);
    ck_assert_int_eq(cached("kiln_fill_uniform"), 0);
    fill_and_check(p);
    ck_assert_int_eq(cached("kiln_fill_uniform"), 1);
    cg_kernel k;
    TS_OK(cg_util_kernel("fill_uniform", g_arch, NULL, &k));
    ck_assert_msg(k.from_cache, "the fill kernel the session used is not in the cache (key %s)", k.key_hex);
    cg_kernel_clear(&k);
    fill_and_check(p);
    ck_assert_int_eq(cached("kiln_fill_uniform"), 1);
    kiln_program_free(p);
    ts_graph_free(g, ctx);
}
END_TEST

/* The flush runs (twice: the second reuses what the first set up) and its kernel is cached. */
START_TEST(flush_l2_runs_and_is_cached) {
    need_gpu();
    TS_OK(kiln_device_flush_l2(0));
    TS_OK(kiln_device_flush_l2(0));
    ck_assert_int_eq(cached("kiln_l2_read"), 1);
    char arch[16];
    TS_OK(kiln_device_arch(0, arch, sizeof arch));
    cg_kernel k;
    TS_OK(cg_util_kernel("l2_read", arch, NULL, &k));
    ck_assert_msg(k.from_cache, "the flush kernel is not in the cache (key %s)", k.key_hex);
    cg_kernel_clear(&k);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("gpu_util",
                        TS_CASE("gpu_util", 300), TS_TESTS(fill_weights_exact_and_cached, flush_l2_runs_and_is_cached));
    return ts_main_isolated(s, "gpu_util");
}
