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
static void teardown(void) { ts_tmpdir_free(cache_dir); }

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
    ts_tmpdir_free(dir);
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
    ts_tmpdir_free(dir);
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
    ck_assert_int_eq(kiln("bench --batch-small 1", &out), 2);
    ck_assert_msg(strstr(out, "--batch-small 1: 0 (none), or 2 .. 511"), "%s", out);
    free(out);
    ck_assert_int_eq(kiln("bench --batch-small 512", &out), 2);
    ck_assert_msg(strstr(out, "--batch-small 512: must be 0 .. 511"), "%s", out);
    free(out);
    ck_assert_int_eq(kiln("serve m.gguf --batch-small 1", &out), 2);
    ck_assert_msg(strstr(out, "--batch-small 1: 0 (none), or 2 .. -b minus 1"), "%s", out);
    free(out);
    ck_assert_int_eq(kiln("bench --models llama-9z", &out), 2);
    ck_assert_msg(strstr(out, "unknown preset 'llama-9z'") && strstr(out, "qwen3-30b-a3b"), "%s", out);
    free(out);
    /* PRESET:FILETYPE: an unknown file type is named with the known ones; a known one passes
     * the checks (then, here, no driver). */
    ck_assert_int_eq(kiln("bench --models llama-3-8b,llama-3-8b:q4_k_x", &out), 2);
    ck_assert_msg(strstr(out, "model 'llama-3-8b:q4_k_x': unknown file type 'q4_k_x'") && strstr(out, "q4_k_m"), "%s",
                  out);
    free(out);
    ck_assert_int_eq(kiln("bench --models llama-9z:q8_0", &out), 2);
    ck_assert_msg(strstr(out, "unknown preset 'llama-9z'"), "%s", out);
    free(out);
    ck_assert_int_eq(kiln("help bench", &out), 0);
    ck_assert_msg(strstr(out, "llama-3-8b:q4_k_m") && strstr(out, "PyTorch has no ggml quantized types"), "%s", out);
    free(out);
    ck_assert_int_eq(kiln("bench --ops-only --models-only", &out), 2);
    free(out);
    ck_assert_int_eq(kiln("bench --dir /nonexistent", &out), 2);
    ck_assert_ptr_nonnull(strstr(out, "no bench folder '/nonexistent'"));
    free(out);
    ck_assert_int_eq(kiln("bench --seed x1", &out), 2);
    free(out);
    /* --seqs: 1 to 8 batch sizes of 1 .. 512 each */
    ck_assert_int_eq(kiln("bench --seqs 0", &out), 2);
    ck_assert_msg(strstr(out, "--seqs 0: must be 1 .. 512"), "%s", out);
    free(out);
    ck_assert_int_eq(kiln("bench --seqs 8,,64", &out), 2);
    ck_assert_msg(strstr(out, "--seqs 8,,64: 1 to 8 comma-separated batch sizes"), "%s", out);
    free(out);
    ck_assert_int_eq(kiln("bench --seqs 1,2,3,4,5,6,7,8,9", &out), 2);
    ck_assert_msg(strstr(out, "1 to 8 comma-separated batch sizes"), "%s", out);
    free(out);
    ck_assert_int_eq(kiln("bench --seqs 513", &out), 2);
    free(out);
    if (ts_run("ldconfig -p | grep -q 'libcuda.so.1'", NULL) != 0) {
        ck_assert_int_eq(kiln("bench --quick --no-torch", &out), 3);
        ck_assert_msg(strstr(out, "no CUDA driver") != NULL, "message: %s", out);
        free(out);
        ck_assert_int_eq(kiln("bench --models-only --models llama-3.2-1b:q4_0,qwen3-30b-a3b:Q4_K_M --no-torch", &out), 3);
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

/* Runs `kiln ARGS`, asserting its exit status and that its output holds each of the strings. */
static void expect(int rc, const char *args, const char *want1, const char *want2) {
    char *out;
    int   got = kiln(args, &out);
    ck_assert_msg(got == rc, "kiln %s: exit %d, not %d:\n%s", args, got, rc, out);
    ck_assert_msg(!want1 || strstr(out, want1), "kiln %s: no '%s' in:\n%s", args, want1, out);
    ck_assert_msg(!want2 || strstr(out, want2), "kiln %s: no '%s' in:\n%s", args, want2, out);
    free(out);
}

/* A tiny llama GGUF in the test's cache directory (about 1 MB, written in milliseconds). */
static void tiny_model(char *path, size_t cap) {
    char args[4300];
    snprintf(path, cap, "%s/tiny.gguf", cache_dir);
    snprintf(args, sizeof args, "gen-model --arch llama --preset tiny -o '%s'", path);
    expect(0, args, "wrote ", NULL);
}

/* Every numeric flag goes through one parser: the whole value, 64-bit overflow, the flag's
 * range; the message names the flag, the value and the range (exit 2). */
START_TEST(numeric_flags_are_range_checked) {
    expect(2, "run examples/swiglu.kg --seed -5", "kiln run: --seed -5: must be 0 .. 18446744073709551615", NULL);
    expect(2, "run examples/swiglu.kg --seed 18446744073709551616", "--seed 18446744073709551616: not an integer",
           NULL);
    expect(2, "run examples/swiglu.kg --seed 12abc", "--seed 12abc: not an integer", NULL);
    expect(2, "run examples/swiglu.kg --iters 0", "--iters 0: must be 1 .. 1000000", NULL);
    expect(2, "run examples/swiglu.kg --iters 99999999999999999999", "--iters 99999999999999999999: not an integer",
           NULL);
    expect(2, "run examples/swiglu.kg --dim n=x", "--dim n=x: not an integer in 1 ..", NULL);
    expect(2, "compile examples/swiglu.kg --jobs 0", "--jobs 0: must be 1 .. 1024", NULL);
    expect(2, "compile examples/swiglu.kg --jobs 2000", "--jobs 2000: must be 1 .. 1024", NULL);
    expect(2, "compile examples/swiglu.kg --jobs ' 4'", "not an integer in 1 .. 1024", NULL);
    expect(2, "gen-model --preset tiny -o x.gguf --seed -5", "kiln gen-model: --seed -5: must be 0 ..", NULL);
    expect(2, "gen-graph --arch llama --preset tiny --n-ctx 0", "--n-ctx 0: must be 1 .. 2147483648", NULL);
    expect(2, "gen-graph --arch llama --preset tiny --n-ctx 64 --n-tokens 128", "--n-tokens 128", "--n-ctx 64");
    expect(2, "bench --seed -5", "kiln bench: --seed -5: must be 0 ..", NULL);
    expect(2, "cache evict --max 2X", "kiln cache evict: --max: invalid size '2X'", NULL);
    expect(2, "compile examples/swiglu.kg --n-ctx 64", "--n-ctx sizes a GGUF model's graph", NULL);
    /* the library takes every CPU for a KILN_JOBS it cannot use; the command refuses it */
    setenv("KILN_JOBS", "abc", 1);
    expect(2, "compile examples/swiglu.kg", "kiln compile: KILN_JOBS abc: not an integer in 1 .. 1024", NULL);
    setenv("KILN_JOBS", "0", 1);
    expect(2, "inspect examples/swiglu.kg", "kiln inspect: KILN_JOBS 0: must be 1 .. 1024", NULL);
    unsetenv("KILN_JOBS");
}
END_TEST

/* kiln run MODEL.gguf: -n, --n-ctx, --n-batch and --tokens are range-checked, and whether the
 * prompt and -n fit the context is checked before anything compiles: without --cpu these exit
 * 2 on a machine with no GPU too (before: a crash, "out of host memory", or an error after
 * compile, upload and prefill). */
START_TEST(model_run_flags_and_context_fit) {
    char m[4200], args[4400];
    tiny_model(m, sizeof m);
    snprintf(args, sizeof args, "run '%s' --tokens 1,2,3 -n 99999999999999999999 --cpu", m);
    expect(2, args, "kiln run: -n 99999999999999999999: not an integer in -1 .. 2147483648", NULL);
    snprintf(args, sizeof args, "run '%s' --tokens 1,2,3 -n 9223372036854775807 --cpu", m);
    expect(2, args, "-n 9223372036854775807: must be -1 .. 2147483648", NULL);
    snprintf(args, sizeof args, "run '%s' --tokens 1,2,3 --n-ctx 3000000000 --cpu", m);
    expect(2, args, "--n-ctx 3000000000: must be 1 .. 2147483648", NULL);
    snprintf(args, sizeof args, "run '%s' --tokens 1,2,3 --n-ctx 2048", m);
    expect(2, args, "--n-ctx 2048: the model's training context (n_ctx_train) is 1024", NULL);
    snprintf(args, sizeof args, "run '%s' --tokens 1,2,3 -n 1000000000", m);
    expect(2, args, "plus -n 1000000000 needs a context of 1000000002", "the context (--n-ctx's default) is 1024");
    snprintf(args, sizeof args, "run '%s' --tokens 1,2,3 -n 100 --n-ctx 64", m);
    expect(2, args, "the prompt (3 tokens) plus -n 100 needs a context of 102", "but --n-ctx is 64");
    snprintf(args, sizeof args, "run '%s' --tokens 1,2,3 -n 7 --n-ctx 8", m);
    expect(2, args, "needs a context of 9", NULL);
    snprintf(args, sizeof args, "run '%s' --tokens 1,2,3 -n 6 --n-ctx 8 --n-batch 4 --cpu", m);
    expect(0, args, "decode: 5 tokens", NULL); /* exactly full: the last token is never stored */
    snprintf(args, sizeof args, "run '%s' --tokens 1,2 --n-ctx 64 --n-batch 128", m);
    expect(2, args, "--n-batch 128: a batch must fit in the context, --n-ctx 64", NULL);
    snprintf(args, sizeof args, "run '%s' --tokens 1,2,5000", m);
    expect(2, args, "--tokens: id 5000 is not a token of this model (n_vocab 1024", NULL);
    snprintf(args, sizeof args, "run '%s' --tokens 1,-2 --cpu", m);
    expect(2, args, "--tokens 1,-2: '-2' is not an integer in 0 ..", NULL);
    snprintf(args, sizeof args, "run '%s' --tokens 1,2 --jobs 0 --cpu", m);
    expect(2, args, "--jobs 0: must be 1 .. 1024", NULL);
    snprintf(args, sizeof args, "inspect '%s' --n-ctx 2048", m);
    expect(2, args, "kiln inspect: --n-ctx 2048: the model's training context (n_ctx_train) is 1024", NULL);
}
END_TEST

/* --no-fuse=NAME, listed by 'kiln help run', works for a model as for a graph. */
START_TEST(model_run_takes_no_fuse_names) {
    char m[4200], args[4400];
    tiny_model(m, sizeof m);
    snprintf(args, sizeof args, "run '%s' --tokens 1,2 -n 2 --cpu --no-fuse=ew_chain --no-fuse=rms_norm_mul", m);
    expect(0, args, "generated:", NULL);
    snprintf(args, sizeof args, "run '%s' --tokens 1,2 -n 2 --cpu --no-fuse=nope", m);
    expect(2, args, "unknown fusion pass 'nope'", NULL);
    snprintf(args, sizeof args, "run '%s' --tokens 1,2 -n 2 --cpu --no-fuse=", m);
    expect(2, args, "give pass names", NULL);
}
END_TEST

/* kiln help COMMAND (and COMMAND --help) for every command. */
START_TEST(help_for_every_command) {
    static const char *const cmds[] = {"compile", "run", "inspect", "cache", "ops", "gen-graph", "gen-model",
                                       "bench", "help"};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        char args[64], want[64];
        snprintf(want, sizeof want, "usage: kiln %s", cmds[i]);
        snprintf(args, sizeof args, "help %s", cmds[i]);
        expect(0, args, want, NULL);
        snprintf(args, sizeof args, "%s --help", cmds[i]);
        expect(0, args, want, NULL);
    }
    expect(0, "help ops", "lists every op", NULL);
    expect(2, "help frobnicate", "no help for unknown command 'frobnicate'", NULL);
    expect(2, "ops extra", "kiln ops: unexpected argument 'extra'", NULL);
}
END_TEST

/* kiln help COMMAND and kiln COMMAND --help print the same, for every command 'kiln help help'
 * names (the command table's rows, tools/cmd.c), and 'kiln help' lists each one under
 * "commands:" and ends with the exit-code convention. */
START_TEST(help_reads_the_command_table) {
    char *list, *usage;
    ck_assert_int_eq(kiln("help help", &list), 0);
    ck_assert_int_eq(kiln("help", &usage), 0);
    ck_assert_str_eq(last_line(usage), "exit status: 0 success, 1 error, 2 bad usage, 3 no CUDA driver or GPU.");
    char *names = strstr(list, "options:\n  ");
    ck_assert_ptr_nonnull(names);
    names += strlen("options:\n  ");
    names[strcspn(names, ".")] = 0;
    int n = 0;
    for (char *save = NULL, *name = strtok_r(names, ", ", &save); name; name = strtok_r(NULL, ", ", &save), n++) {
        char args[64], want[64], *help, *dash_help;
        snprintf(want, sizeof want, "\n  %s ", name);
        ck_assert_msg(strstr(usage, want), "kiln help lists no '%s'", name);
        snprintf(want, sizeof want, "usage: kiln %s", name);
        snprintf(args, sizeof args, "help %s", name);
        expect(0, args, want, NULL);
        ck_assert_int_eq(kiln(args, &help), 0);
        snprintf(args, sizeof args, "%s --help", name);
        ck_assert_int_eq(kiln(args, &dash_help), 0);
        ck_assert_str_eq(help, dash_help);
        free(help);
        free(dash_help);
    }
    ck_assert_int_ge(n, 9); /* compile .. help */
    free(list);
    free(usage);
}
END_TEST

/* A GRAPH that holds no graph says what it holds: empty, a bundle (run it with --bundle), a
 * .kiln that is no bundle, binary data; before, an empty file "had no outputs". */
START_TEST(unusable_graph_files_are_named) {
    char dir[4200], args[4400], mk[6 * 4200 + 256];
    snprintf(dir, sizeof dir, "%s/files", cache_dir);
    snprintf(mk, sizeof mk, "mkdir -p '%s' && : > '%s/e.kiln' && : > '%s/e.kg' && printf 'KILNBNDLxx' > '%s/b.kiln'"
             " && printf 'abc\\000def' > '%s/g.kiln' && printf 'ab\\000cd' > '%s/g.bin'", dir, dir, dir, dir, dir, dir);
    ck_assert_int_eq(ts_run(mk, NULL), 0);
    static const char *const cmds[] = {"compile", "inspect", "run"};
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "%s '%s/e.kiln'", cmds[i], dir);
        expect(1, args, "e.kiln: empty file", NULL);
        snprintf(args, sizeof args, "%s '%s/e.kg'", cmds[i], dir);
        expect(1, args, "e.kg: empty file", NULL);
        snprintf(args, sizeof args, "%s '%s/g.kiln'", cmds[i], dir);
        expect(1, args, "g.kiln: not a kiln bundle", NULL);
        snprintf(args, sizeof args, "%s '%s/g.bin'", cmds[i], dir);
        expect(1, args, "g.bin: not a .kg graph (binary data)", NULL);
    }
    snprintf(args, sizeof args, "compile '%s/b.kiln'", dir);
    expect(1, args, "b.kiln is an AOT bundle, not a graph: run it with 'kiln run --bundle", NULL);
    snprintf(args, sizeof args, "run '%s/b.kiln'", dir);
    expect(1, args, "b.kiln is an AOT bundle", NULL);
    snprintf(args, sizeof args, "inspect '%s/b.kiln'", dir); /* a bundle: verified, and damaged */
    expect(1, args, "b.kiln: not a kiln bundle (too short)", NULL);
    snprintf(args, sizeof args, "run --bundle '%s/e.kg'", dir);
    expect(1, args, "e.kg: empty file", NULL);
    snprintf(args, sizeof args, "cache explain '%s/e.kg'", dir);
    expect(1, args, "e.kg: empty file", NULL);
}
END_TEST

/* kiln cache explain MODEL.gguf explains the graph kiln compile builds from the model. */
START_TEST(cache_explain_takes_a_model) {
    char m[4200], args[4400];
    tiny_model(m, sizeof m);
    snprintf(args, sizeof args, "cache explain '%s'", m); /* before: parsed as .kg, "unexpected character" */
    expect(0, args, "mul_mat", "not cached");
    snprintf(args, sizeof args, "cache explain '%s' --n-ctx 64 --n-batch 8 --no-fuse=ew_chain", m);
    expect(0, args, "mul_mat", "not cached");
    snprintf(args, sizeof args, "cache explain '%s' --n-ctx 4096", m);
    expect(2, args, "--n-ctx 4096: the model's training context (n_ctx_train) is 1024", NULL);
}
END_TEST

/* kiln needs sm_80 or newer: each --arch name is checked before any work, naming the flag. */
START_TEST(arch_below_sm80_is_a_usage_error) {
    expect(2, "compile examples/swiglu.kg --arch sm_90a,sm_75", "kiln compile: --arch sm_75: GPU architecture "
           "'sm_75' is too old", "sm_80");
    expect(2, "compile examples/swiglu.kg --arch compute_70", "--arch compute_70", NULL);
    expect(2, "compile examples/swiglu.kg --arch sm_9x", "--arch sm_9x: unknown GPU architecture", NULL);
    expect(2, "inspect examples/swiglu.kg --arch sm_75", "--arch sm_75", NULL);
    expect(2, "run examples/swiglu.kg --arch sm_75", "--arch sm_75", NULL);
    expect(2, "run examples/swiglu.kg --arch sm_90a,sm_80", "--arch sm_90a,sm_80: one architecture", NULL);
    expect(2, "cache explain examples/swiglu.kg --arch sm_75", "kiln cache explain: --arch sm_75", NULL);
    expect(0, "compile examples/swiglu.kg --arch sm_80,sm_90a", NULL, NULL);
}
END_TEST

/* --tp: kiln inspect MODEL.gguf --tp G prints the split (exit 0), refuses a G the model cannot
 * split over naming the hyperparameter (exit 1) and a .kg graph (exit 2); kiln run --tp 2 --cpu
 * (the CPU reference evaluating both ranks' graphs together) generates the tokens the whole
 * model does, a prompt longer than --n-batch included, and with --context-shift; so does --pp 2
 * (a pipeline of 2 stages), which --tp excludes; kiln compile
 * --tp is not built (exit 2);
 * G is range-checked. */
START_TEST(tensor_parallel_flag) {
    char m[4200], args[4400];
    tiny_model(m, sizeof m);
    snprintf(args, sizeof args, "inspect '%s' --tp 2", m);
    expect(0, args, "blk.*.attn_output.weight", "input cut (row-parallel: all_reduce after)");
    expect(0, args, "a GPU's graph: builds", "5 a ubatch");
    snprintf(args, sizeof args, "inspect '%s' --tp 3", m);
    expect(1, args, "is not a multiple of 3", NULL);
    expect(2, "inspect examples/swiglu.kg --tp 2", "--tp splits a GGUF model", NULL);
    char *whole = NULL, *split = NULL;
    snprintf(args, sizeof args, "run '%s' --tokens 1,17,300,5,9,42 --n-batch 4 -n 6 --cpu", m);
    ck_assert_int_eq(kiln(args, &whole), 0);
    snprintf(args, sizeof args, "run '%s' --tokens 1,17,300,5,9,42 --n-batch 4 -n 6 --cpu --tp 2", m);
    ck_assert_int_eq(kiln(args, &split), 0);
    const char *gw = strstr(whole, "generated:"), *gs = strstr(split, "generated:");
    ck_assert_msg(gw && gs, "%s\n%s", whole, split);
    ck_assert_msg(!strncmp(gw, gs, strcspn(gw, "\n") + 1), "--tp 2 generated\n%s\nthe whole model\n%s", gs, gw);
    free(whole), free(split);
    /* --pp 2: the layers in 2 stages, the whole model's tokens; not with --tp */
    snprintf(args, sizeof args, "run '%s' --tokens 1,17,300,5,9,42 --n-batch 4 -n 6 --cpu --pp 2", m);
    ck_assert_int_eq(kiln(args, &split), 0);
    snprintf(args, sizeof args, "run '%s' --tokens 1,17,300,5,9,42 --n-batch 4 -n 6 --cpu", m);
    ck_assert_int_eq(kiln(args, &whole), 0);
    gw = strstr(whole, "generated:"), gs = strstr(split, "generated:");
    ck_assert_msg(gw && gs && !strncmp(gw, gs, strcspn(gw, "\n") + 1), "--pp 2 generated\n%s\nthe whole model\n%s", split,
                  whole);
    free(whole), free(split);
    snprintf(args, sizeof args, "run '%s' --tokens 1,2 --tp 2 --pp 2 --cpu", m);
    expect(2, args, "--tp and --pp: one split or the other", NULL);
    snprintf(args, sizeof args, "run '%s' --tokens 1,2 --pp 3 --cpu", m);
    expect(1, args, "3 stages of 2 layers", NULL);
    snprintf(args, sizeof args, "inspect '%s' --pp 2", m);
    expect(0, args, "stage 0 (GPU 0): layers 0 .. 0", "stage 1 (GPU 1): layers 1 .. 1");
    snprintf(args, sizeof args, "inspect '%s' --pp 3", m);
    expect(1, args, "3 stages of 2 layers", NULL);
    snprintf(args, sizeof args, "compile '%s' --pp 2", m); /* each stage's program, into the cache */
    expect(0, args, "stage 0 of 2: ", "stage 1 of 2: ");
    snprintf(args, sizeof args, "run '%s' --tokens 1,2 --tp 3 --cpu", m);
    expect(1, args, "n_head 4 is not a multiple of 3", NULL);
    /* --context-shift over the ranks: the whole model's tokens after the same shifts */
    snprintf(args, sizeof args, "run '%s' --tokens 1,17,300,5,9,42 -n 20 --n-ctx 12 --context-shift --cpu", m);
    ck_assert_int_eq(kiln(args, &whole), 0);
    snprintf(args, sizeof args, "run '%s' --tokens 1,17,300,5,9,42 -n 20 --n-ctx 12 --context-shift --cpu --tp 2", m);
    ck_assert_int_eq(kiln(args, &split), 0);
    gw = strstr(whole, "generated:"), gs = strstr(split, "generated:");
    ck_assert_msg(gw && gs && strstr(split, "context shifts: "), "%s\n%s", whole, split);
    ck_assert_msg(!strncmp(gw, gs, strcspn(gw, "\n") + 1), "--tp 2 --context-shift generated\n%s\nthe whole model\n%s",
                  gs, gw);
    free(whole), free(split);
    snprintf(args, sizeof args, "compile '%s' --tp 2", m); /* each rank's program, into the cache */
    expect(0, args, "rank 0 of 2: ", "rank 1 of 2: ");
    snprintf(args, sizeof args, "compile '%s/examples/activations.kg' --tp 2", ts_src_dir());
    expect(2, args, "--tp splits a GGUF model;", "is not one");
    snprintf(args, sizeof args, "inspect '%s' --tp 65", m);
    expect(2, args, "--tp 65: must be 1 .. 64", NULL);
}
END_TEST

/* kiln run MODEL.gguf --bundle FILE.kiln (kiln_gen_opts.bundle): a bundle compiled at another
 * n_ctx is refused before any GPU work, naming the compile command of a matching one (exit 1);
 * a matching one passes that check, host sampling included (without a driver the run then ends
 * for want of a GPU, exit 3; with one it generates); a missing file is named; --bundle with
 * --cpu, --tp or --pp is a usage error. */
START_TEST(model_bundle) {
    char m[4200], b1[4300], b2[4300], args[9000];
    tiny_model(m, sizeof m);
    snprintf(b1, sizeof b1, "%s/tiny.kiln", cache_dir);
    snprintf(b2, sizeof b2, "%s/tiny64.kiln", cache_dir);
    snprintf(args, sizeof args, "compile '%s' --arch sm_90a -o '%s'", m, b1);
    expect(0, args, "wrote bundle", NULL);
    snprintf(args, sizeof args, "compile '%s' --arch sm_90a --n-ctx 64 -o '%s'", m, b2);
    expect(0, args, "wrote bundle", NULL);
    snprintf(args, sizeof args, "run '%s' --bundle '%s' --tokens 1,2,3 -n 2", m, b2);
    expect(1, args, "the bundle's graph is not this model's at n_ctx 1024 and n_batch 512",
           "'kiln compile MODEL.gguf --n-ctx 1024 --n-batch 512 -o FILE.kiln'");
    bool gpu = ts_run("ldconfig -p | grep -q 'libcuda.so.1'", NULL) == 0;
    static const char *const how[] = {"", "--temp 0.7"};
    for (int i = 0; i < 2; i++) {
        char *out;
        snprintf(args, sizeof args, "run '%s' --bundle '%s' --tokens 1,2,3 -n 2 %s", m, b1, how[i]);
        int rc = kiln(args, &out);
        ck_assert_msg(!strstr(out, "the bundle's graph is not"), "%s: %s", args, out);
        if (gpu) ck_assert_msg(rc == 0 && strstr(out, "generated:"), "%s: exit %d\n%s", args, rc, out);
        else ck_assert_msg(rc == 3 && strstr(out, "no CUDA driver"), "%s: exit %d\n%s", args, rc, out);
        free(out);
    }
    snprintf(args, sizeof args, "run '%s' --bundle '%s' --tokens 1,2,3 -n 2 --n-ctx 64", m, b2);
    char *out;
    int   rc = kiln(args, &out);
    ck_assert_msg(!strstr(out, "the bundle's graph is not") && (gpu ? rc == 0 : rc == 3), "%s: exit %d\n%s", args, rc,
                  out);
    free(out);
    snprintf(args, sizeof args, "run '%s' --bundle '%s.none' --tokens 1", m, b1);
    expect(1, args, "--bundle", "cannot open");
    snprintf(args, sizeof args, "run '%s' --bundle '%s' --tokens 1 --cpu", m, b1);
    expect(2, args, "--bundle runs its program on one GPU", NULL);
    snprintf(args, sizeof args, "run '%s' --bundle '%s' --tokens 1 --pp 2", m, b1);
    expect(2, args, "not with --cpu, --tp or --pp", NULL);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("cli",
                        TS_CASE_FIXTURE("cli", 120, setup, teardown),
                        TS_TESTS(version_and_help, usage_errors, compile_summary_line_and_cache,
                                 compile_dump_and_output_file, parse_errors_name_the_position, inspect_prints_ir,
                                 fusion_controls, run_without_gpu, bench_usage, ops_lists_every_op,
                                 numeric_flags_are_range_checked, model_run_flags_and_context_fit,
                                 model_run_takes_no_fuse_names, help_for_every_command, help_reads_the_command_table,
                                 unusable_graph_files_are_named, cache_explain_takes_a_model,
                                 arch_below_sm80_is_a_usage_error, tensor_parallel_flag, model_bundle));
    return ts_main(s);
}
