/* A cache that cannot be written (full disk, read-only or unusable directory) never fails a
 * compile: kiln_compile goes on uncached, warns once naming the directory and the reason, and
 * gives the program an uncached compile gives; entries already cached still hit. The failures
 * come from kc_test_fail_writes (each write step, each errno) and from real paths that work as
 * root too (a cache root below a regular file; /proc and /sys). Then the same through the kiln
 * command. CPU only: NVRTC compiles, no GPU needed. */
#include "tests/support.h"

#include "cache/cache.h"
#include "codegen/codegen.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Two distinct kernels (the generic one and n = 1's), compiled on two threads. */
static const char *kg_two = "kiln-graph 1\n"
                            "dim n <= 8 specialize 1\n"
                            "input x: f32[64, n]\n"
                            "weight w: f32[64]\n"
                            "y0 = mul(x, w)\n"
                            "output y = silu(y0)\n";

/* kg_two with one more op: a kernel kg_two's cache lacks. */
static const char *kg_three = "kiln-graph 1\n"
                              "dim n <= 8 specialize 1\n"
                              "input x: f32[64, n]\n"
                              "weight w: f32[64]\n"
                              "y0 = mul(x, w)\n"
                              "y1 = silu(y0)\n"
                              "output y = sum_rows(y1)\n";

static const int write_errnos[] = {ENOSPC, EROFS, EACCES, EDQUOT};
enum { NWRITE_ERRNOS = sizeof write_errnos / sizeof *write_errnos };

#define WARNING "kiln: warning: cannot write the cache "

typedef struct {
    kiln_program      *p;
    kiln_compile_stats s;
    char              *plan; /* the serialized program: kernel table, cubins, specializations */
    size_t             plan_len;
} compiled;

/* Compiles kg for sm_90a into dir (mode, program cache as asked), logging into lc. */
static compiled compile_kg(const char *kg, const char *dir, kiln_cache_mode mode, int no_program_cache,
                           ts_log *lc) {
    kiln_ctx   *ctx;
    kiln_graph *g = ts_build(kg, &ctx);
    kiln_compile_opts o = {.arch = "sm_90a", .cache_dir = dir, .cache_mode = mode, .jobs = 4,
                           .no_program_cache = no_program_cache, .log = ts_log_line, .log_user = lc};
    compiled c = {0};
    TS_OK(kiln_compile(g, &o, &c.p));
    kiln_program_stats(c.p, &c.s);
    kb_str plan = {0};
    TS_OK(cg_plan_write(c.p, &plan));
    c.plan_len = plan.len;
    c.plan = kb_str_take(&plan);
    ts_graph_free(g, ctx);
    return c;
}

static void compiled_free(compiled *c) {
    kiln_program_free(c->p);
    free(c->plan);
    *c = (compiled){0};
}

static compiled uncached(const char *kg) {
    ts_log lc = {0};
    compiled    c = compile_kg(kg, NULL, KILN_CACHE_OFF, 0, &lc);
    ck_assert_int_eq(lc.lines, 0);
    return c;
}

static void assert_same_plan(const compiled *a, const compiled *b, const char *what) {
    ck_assert_msg(a->plan_len == b->plan_len && memcmp(a->plan, b->plan, a->plan_len) == 0,
                  "%s: the program differs from an uncached compile's", what);
}

static void expect_warning(const ts_log *lc, const char *dir, const char *reason, const char *what) {
    char want[8192];
    snprintf(want, sizeof want, WARNING "%s (%s); continuing without it\n", dir, reason);
    ck_assert_msg(lc->lines == 1 && strcmp(lc->all, want) == 0, "%s: want one warning %s, got %d lines:\n%s", what,
                  want, lc->lines, lc->all);
}

static int entries_of(void *user, const kc_entry *e) {
    (void)e;
    (*(int *)user)++;
    return 0;
}

static int count_entries(const char *dir) {
    kc_cache c = {.dir = (char *)dir, .mode = KILN_CACHE_ON};
    int      n = 0;
    TS_OK(kc_walk(&c, false, entries_of, &n));
    return n;
}

static int count_tmp(const char *dir) {
    kc_cache c = {.dir = (char *)dir, .mode = KILN_CACHE_ON};
    int      n = 0;
    TS_OK(kc_tmp_files(&c, 0, false, &n, NULL));
    return n;
}

/* ---- kiln_compile -------------------------------------------------------------------------- */

/* Each write step failing (ENOSPC), and the first (creating the temporary file) with each errno:
 * the compile succeeds with the uncached program, warns once, counts it, stores nothing and
 * leaves no temporary file. */
START_TEST(compile_goes_on_when_writes_fail) {
    compiled want = uncached(kg_two);
    ck_assert_int_eq(want.s.distinct, 2);
    for (int i = 0; i < KC_NSTEPS + NWRITE_ERRNOS - 1; i++) {
        kc_write_step step = i < KC_NSTEPS ? (kc_write_step)i : KC_STEP_CREATE;
        int           err = i < KC_NSTEPS ? ENOSPC : write_errnos[i - KC_NSTEPS + 1];
        char          what[64];
        snprintf(what, sizeof what, "step %d, %s", (int)step, strerror(err));
        char *dir = ts_tmpdir();
        kc_test_fail_writes(step, err);
        ts_log lc = {0};
        compiled    got = compile_kg(kg_two, dir, KILN_CACHE_ON, 0, &lc);
        kc_test_fail_writes(step, 0);
        expect_warning(&lc, dir, strerror(err), what);
        ck_assert_int_eq(got.s.cache_write_error, err);
        ck_assert_int_eq(got.s.compiled, 2);
        ck_assert_int_eq(got.s.cached, 0);
        assert_same_plan(&got, &want, what);
        ck_assert_int_eq(count_entries(dir), 0);
        ck_assert_int_eq(count_tmp(dir), 0);
        compiled_free(&got);
        ts_tmpdir_free(dir);
    }
    compiled_free(&want);
}
END_TEST

/* A cache that can be read but not written: what it holds still loads (kernels and whole
 * programs), silently; only a compile that has something new to store warns. */
START_TEST(read_only_cache_still_hits) {
    char       *dir = ts_tmpdir();
    ts_log lc = {0};
    compiled    first = compile_kg(kg_two, dir, KILN_CACHE_ON, 0, &lc);
    ck_assert_int_eq(lc.lines, 0);
    ck_assert_int_eq(first.s.cache_write_error, 0);

    kc_test_fail_writes(KC_STEP_MKDIR, EROFS); /* every write's first step */
    compiled kernels = compile_kg(kg_two, dir, KILN_CACHE_ON, 1, &lc);
    ck_assert_int_eq(kernels.s.cached, 2);
    ck_assert_int_eq(kernels.s.compiled, 0);
    compiled whole = compile_kg(kg_two, dir, KILN_CACHE_ON, 0, &lc);
    ck_assert_int_eq(whole.s.program_cached, 1);
    ck_assert_int_eq(lc.lines, 0);
    ck_assert_int_eq(whole.s.cache_write_error, 0);
    assert_same_plan(&kernels, &first, "kernels from a read-only cache");
    assert_same_plan(&whole, &first, "program from a read-only cache");

    compiled more = compile_kg(kg_three, dir, KILN_CACHE_ON, 0, &lc);
    kc_test_fail_writes(KC_STEP_MKDIR, 0);
    expect_warning(&lc, dir, strerror(EROFS), "a new kernel");
    ck_assert_int_eq(more.s.cache_write_error, EROFS);
    ck_assert_int_ge(more.s.compiled, 1);
    ck_assert_int_ge(more.s.cached, 1);
    compiled want = uncached(kg_three);
    assert_same_plan(&more, &want, "a new kernel");
    compiled_free(&want);
    compiled_free(&more);
    compiled_free(&whole);
    compiled_free(&kernels);
    compiled_free(&first);
    ts_tmpdir_free(dir);
}
END_TEST

/* A real failure: the cache root lies below a regular file (ENOTDIR, whoever runs the test).
 * Reading it is a plain miss; writing it, the warning. */
START_TEST(cache_root_below_a_file) {
    char *dir = ts_tmpdir();
    char  file[4096], root[4096 + 8];
    snprintf(file, sizeof file, "%s/file", dir);
    snprintf(root, sizeof root, "%s/kiln", file);
    TS_OK(kb_write_file(file, "x", 1));
    ts_log lc = {0};
    compiled    got = compile_kg(kg_two, root, KILN_CACHE_ON, 0, &lc);
    expect_warning(&lc, root, strerror(ENOTDIR), "root below a file");
    ck_assert_int_eq(got.s.cache_write_error, ENOTDIR);
    compiled want = uncached(kg_two);
    assert_same_plan(&got, &want, "root below a file");
    compiled_free(&want);
    compiled_free(&got);
    ts_tmpdir_free(dir);
}
END_TEST

/* Eviction after a compile that stored its entries fails (a two-digit entry directory that is a
 * file cannot be listed): bookkeeping, so the warning, not an error; the entries stay. */
START_TEST(eviction_failure_warns) {
    compiled want = uncached(kg_two);
    char    *dir = ts_tmpdir();
    char     sub[4096], hex[3] = {0};
    for (int v = 0; v < 256 && !hex[0]; v++) {
        snprintf(hex, sizeof hex, "%02x", v);
        for (int i = 0; i < kiln_program_kernel_count(want.p); i++)
            if (!strncmp(kiln_program_kernel_key(want.p, i), hex, 2)) hex[0] = 0;
    }
    snprintf(sub, sizeof sub, "%s/kernels", dir);
    TS_OK(kb_mkdirs(sub));
    snprintf(sub, sizeof sub, "%s/kernels/%s", dir, hex);
    TS_OK(kb_write_file(sub, "x", 1));
    ts_log lc = {0};
    compiled    got = compile_kg(kg_two, dir, KILN_CACHE_ON, 0, &lc);
    ck_assert_msg(lc.lines == 1 && strstr(lc.all, WARNING) && strstr(lc.all, sub) && strstr(lc.all, "cannot list"),
                  "log: %s", lc.all);
    ck_assert_int_eq(got.s.cache_write_error, EIO);
    assert_same_plan(&got, &want, "eviction failure");
    ck_assert_int_eq(unlink(sub), 0);
    ck_assert_int_eq(count_entries(dir), 3); /* two kernels and the program */
    compiled_free(&got);
    compiled_free(&want);
    ts_tmpdir_free(dir);
}
END_TEST

/* ---- the kiln command ---------------------------------------------------------------------- */

/* Runs `kiln ARGS` from the source tree, with env (NULL: none) in its environment. */
static int kiln(const char *env, const char *args, char **out) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cd '%s' && %s '%s' %s", ts_src_dir(), env ? env : "",
             ts_kiln_bin()[0] == '/' ? ts_kiln_bin() : "build/kiln", args);
    return ts_run(cmd, out);
}

static int count_of(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
    return n;
}

/* kiln compile with an unwritable --cache-dir: status 0, the summary line, one warning naming
 * the directory — also when one command compiles several programs (two archs and a bundle). */
START_TEST(cli_compile_warns_once) {
    char *dir = ts_tmpdir();
    char  file[4096], args[8192];
    snprintf(file, sizeof file, "%s/file", dir);
    TS_OK(kb_write_file(file, "x", 1));
    const char *roots[] = {file, "/proc/kiln-cache-test", "/sys/kiln-cache-test"};
    for (int i = 0; i < 3; i++) {
        char root[4096], *out = NULL;
        snprintf(root, sizeof root, "%s%s", roots[i], i ? "" : "/kiln");
        snprintf(args, sizeof args, "compile examples/activations.kg --cache-dir '%s' 2>&1", root);
        int rc = kiln(NULL, args, &out);
        ck_assert_msg(rc == 0, "%s: status %d: %s", root, rc, out);
        char want[8192];
        snprintf(want, sizeof want, WARNING "%s (", root);
        ck_assert_msg(count_of(out, WARNING) == 1 && strstr(out, want) && strstr(out, "); continuing without it\n"),
                      "%s: %s", root, out);
        ck_assert_msg(strstr(out, "compiled 1 kernels (1 distinct: 1 new, 0 from cache)"), "%s", out);
        free(out);
    }
    snprintf(args, sizeof args, "compile examples/activations.kg --cache-dir '%s/kiln' --arch sm_90a,sm_80 -o '%s/a.kiln' 2>&1",
             file, dir);
    char *out = NULL;
    int   rc = kiln(NULL, args, &out);
    ck_assert_msg(rc == 0 && count_of(out, WARNING) == 1 && strstr(out, "wrote bundle"), "status %d: %s", rc, out);
    free(out);
    ts_tmpdir_free(dir);
}
END_TEST

/* Errors that are not about writing stay errors: a bad KILN_CACHE, as before. */
START_TEST(cli_bad_cache_setting_still_fails) {
    char *dir = ts_tmpdir(), args[8192], *out = NULL;
    snprintf(args, sizeof args, "compile examples/activations.kg --cache-dir '%s' 2>&1", dir);
    int rc = kiln("KILN_CACHE=sometimes", args, &out);
    ck_assert_msg(rc != 0 && strstr(out, "KILN_CACHE") && strstr(out, "'sometimes'") && !strstr(out, WARNING),
                  "status %d: %s", rc, out);
    free(out);
    ts_tmpdir_free(dir);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("cache_fail",
                        TS_CASE("compile", 300),
                        TS_TESTS(compile_goes_on_when_writes_fail, read_only_cache_still_hits, cache_root_below_a_file,
                                 eviction_failure_warns),
                        TS_CASE("cli", 300), TS_TESTS(cli_compile_warns_once, cli_bad_cache_setting_still_fails));
    return ts_main_isolated(s, "cachefail");
}
