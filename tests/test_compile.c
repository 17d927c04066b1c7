/* The whole compile pipeline: determinism, NVRTC for sm_90a and sm_80, the kernel cache as
 * kiln_compile uses it, dumps. NVRTC needs no GPU. */
#include "tests/support.h"

#include "base/base.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *GRAPH =
    "input x: f32[4096, 4]\nweight w: f16[4096]\ninput b: bf16[4096, 4]\n"
    "a = mul(x, w)\ns = silu(a)\noutput y = add(s, b)\n"
    "t = transpose(x)\noutput z = gelu(t)\n";

typedef struct {
    char lines[8][512];
    int n;
} log_lines;

static void capture(void *user, const char *line) {
    log_lines *l = user;
    if (l->n < 8) snprintf(l->lines[l->n++], sizeof l->lines[0], "%s", line);
}

/* A compiled program with the graph it refers to (the IR names graph nodes). */
typedef struct {
    kiln_ctx     *ctx;
    kiln_graph   *g;
    kiln_program *p;
} built;

static void drop(built b) {
    kiln_program_free(b.p);
    kiln_graph_free(b.g);
    kiln_ctx_free(b.ctx);
}

/* Tests of the kernel cache set it: a program-cache hit would not look at kernel entries. */
static int g_no_program_cache;

static built compile(const char *text, const char *cache, const char *arch, const char *dump, log_lines *log) {
    built b;
    b.ctx = ts_parse(text);
    TS_OK(kiln_graph_new(b.ctx, &b.g));
    kiln_compile_opts o = {.arch = arch, .cache_dir = cache, .dump_dir = dump, .log = capture, .log_user = log,
                           .no_program_cache = g_no_program_cache};
    static log_lines sink;
    if (!log) o.log_user = &sink;
    TS_OK(kiln_compile(b.g, &o, &b.p));
    return b;
}

START_TEST(deterministic_sources_and_keys) {
    char *cache = ts_tmpdir();
    built b1 = compile(GRAPH, cache, "sm_90a", NULL, NULL);
    built b2 = compile(GRAPH, cache, "sm_90a", NULL, NULL);
    ck_assert_int_eq(kiln_program_kernel_count(b1.p), 2);
    ck_assert_int_eq(kiln_program_kernel_count(b1.p), kiln_program_kernel_count(b2.p));
    for (int i = 0; i < kiln_program_kernel_count(b1.p); i++) {
        ck_assert_str_eq(kiln_program_kernel_source(b1.p, i), kiln_program_kernel_source(b2.p, i));
        ck_assert_str_eq(kiln_program_kernel_key(b1.p, i), kiln_program_kernel_key(b2.p, i));
        ck_assert_int_eq(strlen(kiln_program_kernel_key(b1.p, i)), 32);
    }
    char *d1, *d2;
    TS_OK(kiln_program_describe(b1.p, &d1));
    TS_OK(kiln_program_describe(b2.p, &d2));
    ck_assert_str_eq(d1, d2);
    free(d1);
    free(d2);
    drop(b1);
    drop(b2);
    ts_tmpdir_free(cache);
}
END_TEST

START_TEST(nvrtc_compiles_for_sm90a_and_sm80) {
    char *cache = ts_tmpdir();
    built ba = compile(GRAPH, cache, "sm_90a", NULL, NULL);
    built bb = compile(GRAPH, cache, "sm_80", NULL, NULL);
    kiln_compile_stats sa, sb;
    kiln_program_stats(ba.p, &sa);
    kiln_program_stats(bb.p, &sb);
    ck_assert_int_eq(sa.compiled, 2);
    ck_assert_int_eq(sb.compiled, 2); /* another arch: other keys, nothing from cache */
    for (int i = 0; i < 2; i++)
        ck_assert_str_ne(kiln_program_kernel_key(ba.p, i), kiln_program_kernel_key(bb.p, i));
    drop(ba);
    drop(bb);
    ts_tmpdir_free(cache);
}
END_TEST

START_TEST(second_compile_is_all_cache_hits) {
    char *cache = ts_tmpdir();
    built b1 = compile(GRAPH, cache, NULL, NULL, NULL);
    built b2 = compile(GRAPH, cache, NULL, NULL, NULL);
    kiln_compile_stats s1, s2;
    kiln_program_stats(b1.p, &s1);
    kiln_program_stats(b2.p, &s2);
    ck_assert_int_eq(s1.compiled, 2);
    ck_assert_int_eq(s1.cached, 0);
    ck_assert_int_eq(s2.compiled, 0);
    ck_assert_int_eq(s2.cached, 2);
    drop(b1);
    drop(b2);
    ts_tmpdir_free(cache);
}
END_TEST

/* Identical layers share kernels: one key, compiled once. */
START_TEST(identical_kernels_compile_once) {
    char *cache = ts_tmpdir();
    built b = compile("input x: f32[256]\ninput y: f32[256]\noutput a = silu(x)\noutput b = silu(y)\n",
                              cache, NULL, NULL, NULL);
    kiln_compile_stats s;
    kiln_program_stats(b.p, &s);
    ck_assert_int_eq(s.kernels, 2);
    ck_assert_int_eq(s.compiled, 1);
    ck_assert_str_eq(kiln_program_kernel_key(b.p, 0), kiln_program_kernel_key(b.p, 1));
    drop(b);
    ts_tmpdir_free(cache);
}
END_TEST

static char *first_entry(const char *cache) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "find '%s/kernels' -name '*.cubin' | sort | head -1 | tr -d '\\n'", cache);
    char *out = NULL;
    ck_assert_int_eq(ts_run(cmd, &out), 0);
    ck_assert_msg(out && *out, "no cache entry under %s", cache);
    return out;
}

START_TEST(flipped_byte_is_detected_and_rebuilt) {
    char *cache = ts_tmpdir();
    g_no_program_cache = 1;
    drop(compile(GRAPH, cache, NULL, NULL, NULL));
    char *entry = first_entry(cache);
    char *data;
    size_t len;
    TS_OK(kb_read_file(entry, &data, &len));
    ck_assert_uint_gt(len, 200);
    data[len / 2] ^= 0x10;
    TS_OK(kb_write_file(entry, data, len));
    free(data);
    log_lines log = {0};
    built b = compile(GRAPH, cache, NULL, NULL, &log);
    kiln_compile_stats s;
    kiln_program_stats(b.p, &s);
    ck_assert_int_eq(s.corrupt, 1);
    ck_assert_int_eq(s.compiled, 1);
    ck_assert_int_eq(s.cached, 1);
    ck_assert_int_ge(log.n, 1);
    ck_assert_ptr_nonnull(strstr(log.lines[0], "corrupt"));
    drop(b);
    /* Rebuilt: the third compile is all hits again. */
    b = compile(GRAPH, cache, NULL, NULL, NULL);
    kiln_program_stats(b.p, &s);
    ck_assert_int_eq(s.cached, 2);
    ck_assert_int_eq(s.corrupt, 0);
    drop(b);
    g_no_program_cache = 0;
    free(entry);
    ts_tmpdir_free(cache);
}
END_TEST

START_TEST(dumps_are_byte_identical) {
    char *cache = ts_tmpdir(), *d1 = ts_tmpdir(), *d2 = ts_tmpdir();
    drop(compile(GRAPH, cache, NULL, d1, NULL));
    drop(compile(GRAPH, cache, NULL, d2, NULL));
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "diff -r '%s' '%s' && ls '%s'", d1, d2, d1);
    char *out = NULL;
    ck_assert_int_eq(ts_run(cmd, &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "program.txt"));
    ck_assert_ptr_nonnull(strstr(out, "000_"));
    ck_assert_ptr_nonnull(strstr(out, ".cu"));
    free(out);
    /* The header names the graph nodes the kernel implements. */
    snprintf(cmd, sizeof cmd, "cat '%s'/000_*.cu", d1);
    ck_assert_int_eq(ts_run(cmd, &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "graph nodes: a (mul), s (silu), y (add)"));
    ck_assert_ptr_nonnull(strstr(out, "fusion: ew_chain"));
    ck_assert_ptr_nonnull(strstr(out, "launch: grid"));
    free(out);
    ts_rmtree(cache);
    ts_rmtree(d1);
    ts_rmtree(d2);
    free(cache);
    free(d1);
    free(d2);
}
END_TEST

START_TEST(bad_arch_is_refused) {
    kiln_ctx *ctx;
    kiln_graph *g = ts_build(GRAPH, &ctx);
    kiln_compile_opts o = {.arch = "ampere", .cache_mode = KILN_CACHE_OFF};
    kiln_program *p = NULL;
    kiln_status st = kiln_compile(g, &o, &p);
    ck_assert_int_eq(kiln_status_code(st), KILN_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(kiln_status_msg(st), "ampere"));
    ck_assert_ptr_null(p);
    kiln_status_free(st);
    ts_graph_free(g, ctx);
}
END_TEST

/* kiln needs sm_80 or newer: an older arch is refused up front (KILN_ERR_INVALID naming it and
 * sm_80), by kiln_compile (with or without NVRTC) and kiln_bundle_write, not by ptxas. */
START_TEST(arch_below_sm80_is_refused) {
    static const char *const old_archs[] = {"sm_75", "sm_70", "compute_75", "sm_61"};
    static const char *const ok_archs[] = {"sm_80", "sm_86", "sm_90a", "compute_80", "sm_100f", "sm_120a"};
    for (size_t i = 0; i < sizeof ok_archs / sizeof *ok_archs; i++) TS_OK(kiln_check_arch(ok_archs[i]));
    kiln_ctx *ctx;
    kiln_graph *g = ts_build(GRAPH, &ctx);
    for (size_t i = 0; i < sizeof old_archs / sizeof *old_archs; i++) {
        for (int skip = 0; skip < 2; skip++) {
            kiln_compile_opts o = {.arch = old_archs[i], .cache_mode = KILN_CACHE_OFF, .skip_nvrtc = skip};
            kiln_program *p = NULL;
            kiln_status st = kiln_compile(g, &o, &p);
            ck_assert_msg(kiln_status_code(st) == KILN_ERR_INVALID, "%s: %s", old_archs[i], kiln_status_msg(st));
            ck_assert_msg(strstr(kiln_status_msg(st), old_archs[i]) && strstr(kiln_status_msg(st), "sm_80"), "%s",
                          kiln_status_msg(st));
            ck_assert_ptr_null(p);
            kiln_status_free(st);
        }
    }
    char *dir = ts_tmpdir(), path[4200];
    snprintf(path, sizeof path, "%s/b.kiln", dir);
    const char *archs[] = {"sm_90a", "sm_75"};
    kiln_compile_opts o = {.cache_mode = KILN_CACHE_OFF};
    kiln_status st = kiln_bundle_write(g, &o, 2, archs, path);
    ck_assert_msg(kiln_status_code(st) == KILN_ERR_INVALID && strstr(kiln_status_msg(st), "sm_75"), "%s",
                  kiln_status_msg(st));
    kiln_status_free(st);
    FILE *f = fopen(path, "rb"); /* refused before anything was written */
    ck_assert_ptr_null(f);
    ts_tmpdir_free(dir);
    ts_graph_free(g, ctx);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("compile",
                        TS_CASE("compile", 120),
                        TS_TESTS(deterministic_sources_and_keys, nvrtc_compiles_for_sm90a_and_sm80,
                                 second_compile_is_all_cache_hits, identical_kernels_compile_once,
                                 flipped_byte_is_detected_and_rebuilt, dumps_are_byte_identical, bad_arch_is_refused,
                                 arch_below_sm80_is_refused));
    return ts_main(s);
}
