/* The kiln command: help, usage errors, compile's summary line, inspect, run without a GPU. */
#include "tests/support.h"

#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *cache_dir;

static int kiln(const char *args, char **out) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cd '%s' && KILN_CACHE_DIR='%s' '%s' %s", ts_src_dir(), cache_dir,
             ts_kiln_bin()[0] == '/' ? ts_kiln_bin() : "build/kiln", args);
    return ts_run(cmd, out);
}

static void setup(void) { cache_dir = ts_tmpdir(); }
static void teardown(void) {
    ts_rmtree(cache_dir);
    free(cache_dir);
}

static const char *last_line(char *text) {
    size_t n = strlen(text);
    while (n > 0 && text[n - 1] == '\n') text[--n] = 0;
    char *nl = strrchr(text, '\n');
    return nl ? nl + 1 : text;
}

START_TEST(version_and_help) {
    char *out;
    ck_assert_int_eq(kiln("--version", &out), 0);
    ck_assert_str_eq(out, "kiln " KILN_VERSION "\n");
    free(out);
    ck_assert_int_eq(kiln("--help", &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "compile GRAPH"));
    ck_assert_ptr_nonnull(strstr(out, "inspect GRAPH"));
    ck_assert_ptr_nonnull(strstr(out, "KILN_CACHE_DIR"));
    free(out);
    ck_assert_int_eq(kiln("help run", &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "--seed"));
    free(out);
    ck_assert_int_eq(kiln("compile --help", &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "--dump-cu"));
    free(out);
}
END_TEST

START_TEST(usage_errors) {
    char *out;
    ck_assert_int_eq(kiln("", &out), 2);
    free(out);
    ck_assert_int_eq(kiln("frobnicate x.kg", &out), 2);
    ck_assert_ptr_nonnull(strstr(out, "unknown command"));
    free(out);
    ck_assert_int_eq(kiln("compile", &out), 2);
    ck_assert_ptr_nonnull(strstr(out, "no graph"));
    free(out);
    ck_assert_int_eq(kiln("compile examples/swiglu.kg --bogus", &out), 2);
    ck_assert_ptr_nonnull(strstr(out, "--bogus"));
    free(out);
    ck_assert_int_eq(kiln("compile examples/swiglu.kg --arch", &out), 2);
    free(out);
}
END_TEST

/* `kiln inspect` lists each fusion as "fused NAME: nodes"; --no-fuse=NAME turns one pass off,
 * before or after the graph; unknown names are usage errors, listed in --help. */
START_TEST(fusion_controls) {
    char *out;
    ck_assert_int_eq(kiln("inspect examples/swiglu.kg", &out), 0);
    ck_assert_msg(strstr(out, "fusions: 1\n  fused ew_chain: gg, act, y\n"), "%s", out);
    free(out);
    ck_assert_int_eq(kiln("inspect --no-fuse=ew_chain examples/swiglu.kg", &out), 0);
    ck_assert_msg(strstr(out, "fusions: 0\n") && !strstr(out, "fused ew_chain"), "%s", out);
    free(out);
    ck_assert_int_eq(kiln("inspect examples/swiglu.kg --no-fuse=ew_chain", &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "fusions: 0\n"));
    free(out);
    ck_assert_int_eq(kiln("inspect examples/swiglu.kg --no-fuse", &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "fusions: 0\n"));
    free(out);
    ck_assert_int_eq(kiln("inspect examples/swiglu.kg --no-fuse=ew_chain,nope", &out), 2);
    ck_assert_msg(strstr(out, "unknown fusion pass"), "%s", out);
    free(out);
    ck_assert_int_eq(kiln("inspect examples/swiglu.kg --no-fuse=", &out), 2);
    free(out);
    ck_assert_int_eq(kiln("help compile", &out), 0);
    ck_assert_msg(strstr(out, "fusion passes (--no-fuse=NAME):\n  get_rows_one") && strstr(out, "\n  ew_chain "), "%s", out);
    free(out);
}
END_TEST

START_TEST(compile_summary_line_and_cache) {
    regex_t re;
    ck_assert_int_eq(regcomp(&re, "^compiled ([0-9]+) kernels \\(([0-9]+) distinct: ([0-9]+) new, ([0-9]+) from cache\\) in "
                                  "[0-9]+ ms$",
                             REG_EXTENDED), 0);
    char *out;
    regmatch_t m[5];
    ck_assert_int_eq(kiln("compile examples/swiglu.kg", &out), 0);
    const char *line = last_line(out);
    ck_assert_msg(regexec(&re, line, 5, m, 0) == 0, "last line: '%s'", line);
    int n = atoi(line + m[1].rm_so), distinct = atoi(line + m[2].rm_so), fresh = atoi(line + m[3].rm_so),
        cached = atoi(line + m[4].rm_so);
    ck_assert_int_gt(n, 0);
    ck_assert_int_eq(distinct, n);
    ck_assert_int_eq(fresh, n);
    ck_assert_int_eq(cached, 0);
    free(out);
    /* Options may come before the graph; the second compile loads the whole program. */
    ck_assert_int_eq(kiln("compile --arch sm_90a examples/swiglu.kg", &out), 0);
    line = last_line(out);
    char want[128];
    snprintf(want, sizeof want, "loaded %d kernels (%d distinct) from the program cache in ", n, n);
    ck_assert_msg(strncmp(line, want, strlen(want)) == 0, "last line: '%s'", line);
    free(out);
    /* Without the program cache entry, every kernel comes from the kernel cache. */
    char rm[4200];
    snprintf(rm, sizeof rm, "rm -rf '%s/programs'", cache_dir);
    ck_assert_int_eq(ts_run(rm, NULL), 0);
    ck_assert_int_eq(kiln("compile examples/swiglu.kg", &out), 0);
    line = last_line(out);
    ck_assert_msg(regexec(&re, line, 5, m, 0) == 0, "last line: '%s'", line);
    ck_assert_int_eq(atoi(line + m[3].rm_so), 0);
    ck_assert_int_eq(atoi(line + m[4].rm_so), n);
    free(out);
    regfree(&re);
}
END_TEST

START_TEST(compile_dump_and_output_file) {
    char *dir = ts_tmpdir(), args[4200], *out;
    snprintf(args, sizeof args, "compile examples/swiglu.kg --dump-cu '%s/dump' -o '%s/prog.kiln'", dir, dir);
    ck_assert_int_eq(kiln(args, &out), 0);
    ck_assert_msg(strstr(out, "wrote bundle"), "%s", out);
    free(out);
    snprintf(args, sizeof args, "ls '%s/dump' && cat '%s/dump/program.txt'", dir, dir);
    ck_assert_int_eq(ts_run(args, &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "000_ew_"));
    ck_assert_ptr_nonnull(strstr(out, "kernels:"));
    ck_assert_ptr_nonnull(strstr(out, "launches:"));
    free(out);
    snprintf(args, sizeof args, "inspect '%s/prog.kiln'", dir);
    ck_assert_int_eq(kiln(args, &out), 0);
    ck_assert_msg(strstr(out, "checksum ok") && strstr(out, "target sm_90a: cubins"), "%s", out);
    free(out);
    ts_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(parse_errors_name_the_position) {
    char *dir = ts_tmpdir(), path[4200], args[4300], *out;
    snprintf(path, sizeof path, "%s/bad.kg", dir);
    FILE *f = fopen(path, "w");
    fputs("input x: f32[4]\noutput y = sulu(x)\n", f);
    fclose(f);
    snprintf(args, sizeof args, "compile '%s'", path);
    ck_assert_int_eq(kiln(args, &out), 1);
    ck_assert_ptr_nonnull(strstr(out, "bad.kg:2:"));
    ck_assert_ptr_nonnull(strstr(out, "sulu"));
    free(out);
    ck_assert_int_eq(kiln("compile /nonexistent/graph.kg", &out), 1);
    ck_assert_ptr_nonnull(strstr(out, "/nonexistent/graph.kg"));
    free(out);
    ts_rmtree(dir);
    free(dir);
}
END_TEST

START_TEST(inspect_prints_ir) {
    char *out;
    ck_assert_int_eq(kiln("inspect examples/swiglu.kg", &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "buffers:"));
    ck_assert_ptr_nonnull(strstr(out, "kernels:"));
    ck_assert_ptr_nonnull(strstr(out, "fused ew_chain"));
    ck_assert_ptr_nonnull(strstr(out, "launches:"));
    free(out);
    ck_assert_int_eq(kiln("inspect --no-fuse examples/swiglu.kg", &out), 0);
    ck_assert_ptr_null(strstr(out, "fused"));
    free(out);
}
END_TEST

/* On a machine without a CUDA driver (CI), run must fail plainly with status 3. */
START_TEST(run_without_gpu) {
    if (ts_run("ldconfig -p | grep -q 'libcuda.so.1'", NULL) == 0) {
        printf("run_without_gpu: a CUDA driver is installed here; not applicable\n");
        return;
    }
    char *out;
    ck_assert_int_eq(kiln("run examples/swiglu.kg", &out), 3);
    ck_assert_msg(strstr(out, "no CUDA driver") != NULL, "message: %s", out);
    free(out);
}
END_TEST

/* kiln bench: help and usage errors (before any GPU work); without a driver, status 3. */
START_TEST(bench_usage) {
    char *out;
    ck_assert_int_eq(kiln("help bench", &out), 0);
    ck_assert_ptr_nonnull(strstr(out, "--quick"));
    ck_assert_ptr_nonnull(strstr(out, "reduce-overhead"));
    free(out);
    ck_assert_int_eq(kiln("bench --models llama-9z", &out), 2);
    ck_assert_msg(strstr(out, "unknown preset 'llama-9z'") && strstr(out, "qwen3-30b-a3b"), "%s", out);
    free(out);
    ck_assert_int_eq(kiln("bench --ops-only --models-only", &out), 2);
    free(out);
    ck_assert_int_eq(kiln("bench --dir /nonexistent", &out), 2);
    ck_assert_ptr_nonnull(strstr(out, "no bench folder '/nonexistent'"));
    free(out);
    ck_assert_int_eq(kiln("bench --seed x1", &out), 2);
    free(out);
    if (ts_run("ldconfig -p | grep -q 'libcuda.so.1'", NULL) != 0) {
        ck_assert_int_eq(kiln("bench --quick --no-torch", &out), 3);
        ck_assert_msg(strstr(out, "no CUDA driver") != NULL, "message: %s", out);
        free(out);
    }
}
END_TEST

START_TEST(ops_lists_every_op) {
    char *out;
    ck_assert_int_eq(kiln("ops", &out), 0);
    static const char *names[] = {"add ", "view ", "silu ", "gelu_erf ", "leaky_relu ", "clamp ", "softplus "};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char line[64];
        snprintf(line, sizeof line, "\n%s", names[i]);
        ck_assert_msg(strstr(out, line) || !strncmp(out, names[i], strlen(names[i])), "no line for %s", names[i]);
    }
    ck_assert_ptr_nonnull(strstr(out, "f32 f16 bf16"));
    ck_assert_ptr_null(strstr(out, "leaf"));
    free(out);
}
END_TEST

int main(void) {
    Suite *s = suite_create("cli");
    TCase *tc = tcase_create("cli");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, version_and_help);
    tcase_add_test(tc, usage_errors);
    tcase_add_test(tc, compile_summary_line_and_cache);
    tcase_add_test(tc, compile_dump_and_output_file);
    tcase_add_test(tc, parse_errors_name_the_position);
    tcase_add_test(tc, inspect_prints_ir);
    tcase_add_test(tc, fusion_controls);
    tcase_add_test(tc, run_without_gpu);
    tcase_add_test(tc, bench_usage);
    tcase_add_test(tc, ops_lists_every_op);
    suite_add_tcase(s, tc);
    return ts_main(s);
}
