/* Tests of the program cache (issue 7): a second compile of a graph loads the whole program
 * (no Lua, no NVRTC: the counters prove it), program keys change with every key input and only
 * with those, corrupt program entries are rebuilt, KILN_CACHE modes and KILN_CACHE_MAX hold for
 * whole programs, dumps are byte-identical cold and warm, thread counts change nothing,
 * kiln_cache_explain says why a compile would be cold, and the cli reports both paths.
 *
 * CPU only: NVRTC compiles (no GPU needed). main() points KILN_CACHE_DIR at a temporary
 * directory; tests that count entries use a fresh directory of their own. */
#include "tests/support.h"

#include "cache/cache.h"
#include "codegen/codegen.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers -------------------------------------------------------------------------------- */

/* Two fused elementwise kernels' worth of graph: a symbolic dim with a specialization. */
static const char *kg_spec = "kiln-graph 1\n"
                             "dim n <= 8 specialize 1\n"
                             "input x: f32[64, n]\n"
                             "weight w: f32[64]\n"
                             "y0 = mul(x, w)\n"
                             "output y = silu(y0)\n";

/* The base graph of the key tests (one kernel). */
static const char *kg_base = "kiln-graph 1\n"
                             "dim n <= 8\n"
                             "input x: f32[64, n]\n"
                             "weight w: f32[64]\n"
                             "s = scale(x, 0.5, 0.25)\n"
                             "output y = mul(s, w)\n";

/* kg_base again, written differently (comments, spacing): the same canonical graph. */
static const char *kg_base_respelled = "kiln-graph 1\n"
                                       "# the same graph as kg_base\n"
                                       "dim   n <=   8\n"
                                       "input x:  f32[64,n]     # tokens\n"
                                       "weight w: f32[64]\n"
                                       "\n"
                                       "s = scale(x,0.5,0.25)\n"
                                       "output y = mul(s,  w)\n";

typedef struct {
    kiln_ctx          *ctx;
    kiln_graph        *g;
    kiln_program      *p;
    kiln_compile_stats s;
} compiled;

static kiln_compile_opts opts_in(const char *dir) {
    return (kiln_compile_opts){.cache_dir = dir, .arch = "sm_90a"};
}

static compiled compile_with(const char *kg, const kiln_compile_opts *o) {
    compiled c = {0};
    c.ctx = ts_parse(kg);
    TS_OK(kiln_graph_new(c.ctx, &c.g));
    TS_OK(kiln_compile(c.g, o, &c.p));
    kiln_program_stats(c.p, &c.s);
    return c;
}

static void compiled_free(compiled *c) {
    kiln_program_free(c->p);
    kiln_graph_free(c->g);
    kiln_ctx_free(c->ctx);
    *c = (compiled){0};
}

static char *describe(const kiln_program *p) {
    char *t = NULL;
    TS_OK(kiln_program_describe(p, &t));
    return t;
}

/* Same describe text (IR, plan, launches and keys of every variant) and kernel table. */
static void assert_same_program(const kiln_program *a, const kiln_program *b, const char *what) {
    char *da = describe(a), *db = describe(b);
    ck_assert_msg(strcmp(da, db) == 0, "%s: describe texts differ:\n%s\n----\n%s", what, da, db);
    free(da);
    free(db);
    int n = kiln_program_kernel_count(a);
    ck_assert_int_gt(n, 0);
    ck_assert_int_eq(kiln_program_kernel_count(b), n);
    for (int i = 0; i < n; i++) {
        ck_assert_str_eq(kiln_program_kernel_source(a, i), kiln_program_kernel_source(b, i));
        ck_assert_str_eq(kiln_program_kernel_key(a, i), kiln_program_kernel_key(b, i));
        ck_assert_str_eq(kiln_program_kernel_name(a, i), kiln_program_kernel_name(b, i));
    }
}

typedef struct {
    int      n[3];  /* by kind: [KC_CUBIN], [KC_PROGRAM] */
    uint64_t bytes; /* all entries */
    char     prog_path[4096];
} walk_count;

static int count_entry(void *user, const kc_entry *e) {
    walk_count *w = user;
    if (e->kind == KC_CUBIN || e->kind == KC_PROGRAM) w->n[e->kind]++;
    w->bytes += e->bytes;
    if (e->kind == KC_PROGRAM) snprintf(w->prog_path, sizeof w->prog_path, "%s", e->path);
    return 0;
}

static walk_count count_entries(const char *dir) {
    kc_cache   c = {.dir = (char *)dir, .mode = KILN_CACHE_ON};
    walk_count w;
    memset(&w, 0, sizeof w);
    TS_OK(kc_walk(&c, false, count_entry, &w));
    return w;
}

static uint64_t g_tree_bytes;
static int      g_tree_files;
static int add_file(const char *path, const struct stat *sb, int flag, struct FTW *f) {
    (void)path, (void)f;
    if (flag == FTW_F) g_tree_bytes += (uint64_t)sb->st_size, g_tree_files++;
    return 0;
}

/* Bytes of every regular file under dir (entries, temporary files, anything). */
static uint64_t tree_bytes(const char *dir, int *files) {
    g_tree_bytes = 0;
    g_tree_files = 0;
    nftw(dir, add_file, 16, FTW_PHYS);
    if (files) *files = g_tree_files;
    return g_tree_bytes;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

/* Sets or unsets an environment variable for the length of a test; restore_env puts it back. */
typedef struct {
    const char *name;
    char       *old;
} saved_env;

static saved_env set_env(const char *name, const char *value) {
    saved_env s = {name, getenv(name) ? strdup(getenv(name)) : NULL};
    if (value) setenv(name, value, 1);
    else unsetenv(name);
    return s;
}

static void restore_env(saved_env *s) {
    if (s->old) setenv(s->name, s->old, 1);
    else unsetenv(s->name);
    free(s->old);
    s->old = NULL;
}

/* ---- hits ----------------------------------------------------------------------------------- */

/* A variant with a smaller maximum (kiln_dim_specialize_upto) is part of the program: a hit
 * gives the same program, variants included, and the dump writes it under DIR/n<=64. */
START_TEST(upto_variant_is_part_of_the_program) {
    static const char kg[] = "dim n <= 512 specialize 1, <= 64\nweight a: q4_K[4096, 1024]\ninput b: f32[4096, n]\n"
                             "output y = mul_mat(a, b)\n";
    char             *dir = ts_tmpdir();
    kiln_compile_opts o = opts_in(dir);
    compiled          a = compile_with(kg, &o);
    char    *d = describe(a.p);
    ck_assert_msg(strstr(d, "specialization 1: n = 1") && strstr(d, "specialization 2: n <= 64"), "%s", d);
    free(d);
    compiled b = compile_with(kg, &o);
    ck_assert_int_eq(b.s.program_cached, 1);
    assert_same_program(a.p, b.p, "upto variant hit");
    compiled_free(&a);
    compiled_free(&b);
    ts_tmpdir_free(dir);
}
END_TEST

/* A plan whose variant names n <= INT64_MIN is refused as a format error: the reader checked
 * -v >= max, and -INT64_MIN overflows (a libFuzzer input of fuzz_cache found it). */
START_TEST(upto_variant_value_out_of_range_is_refused) {
    static const char kg[] = "dim n <= 512 specialize <= 64\nweight a: q4_K[4096, 1024]\ninput b: f32[4096, n]\n"
                             "output y = mul_mat(a, b)\n";
    char             *dir = ts_tmpdir();
    kiln_compile_opts o = opts_in(dir);
    compiled          a = compile_with(kg, &o);
    kb_str            b = {0};
    ck_assert_ptr_null(cg_plan_write(a.p, &b));
    /* the variant's value as stored: -64, little-endian */
    uint8_t want[8], worst[8] = {0, 0, 0, 0, 0, 0, 0, 0x80};
    for (int i = 0; i < 8; i++) want[i] = (uint8_t)((uint64_t)-64 >> (8 * i));
    int hits = 0;
    for (size_t i = 0; i + 8 <= b.len; i++)
        if (!memcmp(b.s + i, want, 8)) {
            memcpy(b.s + i, worst, 8);
            hits++;
        }
    ck_assert_int_eq(hits, 1);
    kiln_program *p = NULL;
    kiln_status   st = cg_plan_read(b.s, b.len, a.g, &o, &p);
    ck_assert_ptr_nonnull(st);
    ck_assert_msg(strstr(kiln_status_msg(st), "which the graph does not have"), "%s", kiln_status_msg(st));
    ck_assert_ptr_null(p);
    kiln_status_free(st);
    free(b.s);
    compiled_free(&a);
    ts_tmpdir_free(dir);
}
END_TEST

START_TEST(second_compile_is_a_program_hit) {
    char             *dir = ts_tmpdir();
    kiln_compile_opts o = opts_in(dir);
    compiled          a = compile_with(kg_spec, &o);
    ck_assert_int_eq(a.s.program_cached, 0);
    ck_assert_int_eq(a.s.distinct, 2); /* the general kernel and the n = 1 one */
    ck_assert_int_eq(a.s.compiled, 2);
    ck_assert_int_eq(a.s.generated, a.s.kernels);
    ck_assert_int_eq(count_entries(dir).n[KC_PROGRAM], 1);

    compiled b = compile_with(kg_spec, &o);
    ck_assert_int_eq(b.s.program_cached, 1);
    ck_assert_int_eq(b.s.generated, 0); /* no template ran */
    ck_assert_int_eq(b.s.compiled, 0);  /* no NVRTC */
    ck_assert_int_eq(b.s.corrupt, 0);
    ck_assert_int_eq(b.s.kernels, a.s.kernels);
    ck_assert_int_eq(b.s.distinct, a.s.distinct);
    assert_same_program(a.p, b.p, "program hit");
    /* The specialization came back with the program. */
    char *d = describe(b.p);
    ck_assert_msg(strstr(d, "specialization 1: n = 1") != NULL, "no specialization in:\n%s", d);
    free(d);
    ck_assert_int_eq(count_entries(dir).n[KC_PROGRAM], 1);
    compiled_free(&a);
    compiled_free(&b);
    ts_tmpdir_free(dir);
}
END_TEST

/* A hit takes the IR stored in the plan (codegen/plan_ir.c) instead of lowering again: for
 * whole model graphs of every feature the passes produce (fusions, MoE routing, MLA, sinks,
 * sliding windows, the gemv_rope tails of the n_tokens = 1 variant), the loaded program
 * describes (IR, plan, launches, keys) exactly as the compiled one. */
static const char *const model_archs[] = {"llama", "qwen3moe", "gemma3", "gpt-oss", "deepseek2"};

START_TEST(model_program_hit_has_the_same_ir) {
    char              *dir = ts_tmpdir();
    kiln_compile_opts  o = opts_in(dir);
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset(model_archs[_i], "tiny", &hp));
    compiled        c[2];
    kiln_build_opts bo = {.n_ctx = 64, .n_tokens_max = 16, .argmax = true};
    for (int k = 0; k < 2; k++) {
        c[k] = (compiled){.ctx = kiln_ctx_new()};
        TS_OK(kiln_build_model(c[k].ctx, &hp, &bo));
        TS_OK(kiln_graph_new(c[k].ctx, &c[k].g));
        TS_OK(kiln_compile(c[k].g, &o, &c[k].p));
        kiln_program_stats(c[k].p, &c[k].s);
    }
    ck_assert_int_eq(c[0].s.program_cached, 0);
    ck_assert_int_eq(c[1].s.program_cached, 1);
    assert_same_program(c[0].p, c[1].p, model_archs[_i]);
    compiled_free(&c[0]);
    compiled_free(&c[1]);
    ts_tmpdir_free(dir);
}
END_TEST

/* A key input changed gives a new program entry; a graph that is the same (parsed again,
 * spelled differently) or another thread count gives a hit. */
static void expect_key(const char *dir, const char *kg, const kiln_compile_opts *o, bool hit, int *entries,
                       const char *what) {
    compiled c = compile_with(kg, o);
    ck_assert_msg(c.s.program_cached == (hit ? 1 : 0), "%s: expected a program %s, program_cached %d", what,
                  hit ? "hit" : "miss", c.s.program_cached);
    if (!hit) (*entries)++;
    int n = count_entries(dir).n[KC_PROGRAM];
    ck_assert_msg(n == *entries, "%s: %d program entries, expected %d", what, n, *entries);
    compiled_free(&c);
}

/* kg_base with `from` replaced by `to` (which must occur once). */
static char *variant(const char *from, const char *to) {
    const char *at = strstr(kg_base, from);
    ck_assert_msg(at && !strstr(at + 1, from), "'%s' not once in the base graph", from);
    size_t n = strlen(kg_base) - strlen(from) + strlen(to) + 1;
    char  *s = malloc(n);
    snprintf(s, n, "%.*s%s%s", (int)(at - kg_base), kg_base, to, at + strlen(from));
    return s;
}

START_TEST(keys_change_with_key_inputs_only) {
    char             *dir = ts_tmpdir();
    kiln_compile_opts o = opts_in(dir);
    int               entries = 0;
    expect_key(dir, kg_base, &o, false, &entries, "cold");
    expect_key(dir, kg_base, &o, true, &entries, "same text parsed again");
    expect_key(dir, kg_base_respelled, &o, true, &entries, "same graph, other comments and spacing");
    kiln_compile_opts oj = o;
    oj.jobs = 1;
    expect_key(dir, kg_base, &oj, true, &entries, "jobs 1");
    oj.jobs = 3;
    expect_key(dir, kg_base, &oj, true, &entries, "jobs 3");

    static const struct {
        const char *from, *to, *what;
    } changes[] = {
        {"scale(x, 0.5, 0.25)", "scale(x, 0.5, 0.75)", "an op param"},
        {"weight w: f32[64]", "weight w: f16[64]", "a type"},
        {"input x: f32[64, n]\nweight w: f32[64]", "input x: f32[32, n]\nweight w: f32[32]", "a static dim"},
        {"dim n <= 8\ninput x: f32[64, n]", "dim m <= 8\ninput x: f32[64, m]", "a symbolic dim's name"},
        {"dim n <= 8", "dim n <= 16", "a symbolic dim's max"},
        {"weight w: f32[64]", "input w: f32[64]", "a tensor role"},
    };
    for (size_t i = 0; i < sizeof changes / sizeof changes[0]; i++) {
        char *kg = variant(changes[i].from, changes[i].to);
        expect_key(dir, kg, &o, false, &entries, changes[i].what);
        expect_key(dir, kg, &o, true, &entries, changes[i].what); /* and it is cached now */
        free(kg);
    }
    kiln_compile_opts on = o;
    on.no_fuse = 1;
    expect_key(dir, kg_base, &on, false, &entries, "no_fuse");
    on = o;
    on.no_fuse_passes = "ew_chain";
    expect_key(dir, kg_base, &on, false, &entries, "no_fuse_passes ew_chain");
    on.no_fuse_passes = "add_chain";
    expect_key(dir, kg_base, &on, false, &entries, "no_fuse_passes add_chain");
    on = o;
    on.arch = "sm_80";
    expect_key(dir, kg_base, &on, false, &entries, "arch sm_80");
    expect_key(dir, kg_base, &o, true, &entries, "back to the base graph");
    ts_tmpdir_free(dir);
}
END_TEST

/* ---- corruption ----------------------------------------------------------------------------- */

static void damage_and_recompile(const char *dir, bool truncate_it) {
    ts_log       lc = {0};
    kiln_compile_opts o = opts_in(dir);
    o.log = ts_log_line;
    o.log_user = &lc;
    compiled a = compile_with(kg_spec, &o);
    walk_count w = count_entries(dir);
    ck_assert_int_eq(w.n[KC_PROGRAM], 1);
    size_t len;
    char  *bytes = ts_read_file(w.prog_path, &len);
    ck_assert_uint_gt(len, 200);
    if (truncate_it) {
        ck_assert_int_eq(truncate(w.prog_path, (off_t)(len * 2 / 3)), 0);
    } else {
        int fd = open(w.prog_path, O_WRONLY);
        ck_assert_int_ge(fd, 0);
        char b = (char)(bytes[len - 10] ^ 0x10); /* inside the payload (the plan's end) */
        ck_assert_int_eq(pwrite(fd, &b, 1, (off_t)(len - 10)), 1);
        close(fd);
    }
    free(bytes);
    compiled b = compile_with(kg_spec, &o);
    ck_assert_int_eq(b.s.program_cached, 0);
    ck_assert_msg(b.s.corrupt >= 1, "%s program entry not counted as corrupt (stats.corrupt %d)",
                  truncate_it ? "truncated" : "bit-flipped", b.s.corrupt);
    ck_assert_msg(lc.lines >= 1 && strstr(lc.all, w.prog_path), "the log does not name %s:\n%s", w.prog_path, lc.all);
    assert_same_program(a.p, b.p, "rebuilt after corruption");
    ck_assert_int_eq(count_entries(dir).n[KC_PROGRAM], 1);
    compiled c = compile_with(kg_spec, &o);
    ck_assert_int_eq(c.s.program_cached, 1);
    ck_assert_int_eq(c.s.corrupt, 0);
    assert_same_program(a.p, c.p, "hit after the rebuild");
    compiled_free(&a);
    compiled_free(&b);
    compiled_free(&c);
}

START_TEST(corrupt_program_entry_is_rebuilt) {
    char *dir = ts_tmpdir();
    damage_and_recompile(dir, false);
    damage_and_recompile(dir, true);
    ts_tmpdir_free(dir);
}
END_TEST

/* ---- KILN_CACHE and KILN_CACHE_MAX ------------------------------------------------------------ */

/* A compile that read nothing from the cache: every distinct kernel went through NVRTC. */
static void expect_all_compiled(const char *kg, const kiln_compile_opts *o, int distinct, const char *what) {
    compiled r = compile_with(kg, o);
    ck_assert_msg(r.s.program_cached == 0 && r.s.cached == 0 && r.s.compiled == distinct,
                  "%s: program_cached %d, cached %d, compiled %d (expected %d)", what, r.s.program_cached, r.s.cached,
                  r.s.compiled, distinct);
    compiled_free(&r);
}

START_TEST(cache_modes) {
    char             *warm = ts_tmpdir(), *empty = ts_tmpdir();
    kiln_compile_opts o = opts_in(warm);
    compiled          a = compile_with(kg_spec, &o);
    compiled_free(&a);
    walk_count before = count_entries(warm);

    saved_env env = set_env("KILN_CACHE", "readonly");
    kiln_compile_opts oe = opts_in(empty);
    compiled          r = compile_with(kg_spec, &oe);
    ck_assert_int_eq(r.s.program_cached, 0);
    ck_assert_int_eq(r.s.compiled, 2);
    compiled_free(&r);
    int files = -1;
    tree_bytes(empty, &files);
    ck_assert_msg(files == 0, "readonly wrote %d files", files);
    r = compile_with(kg_spec, &o); /* readonly still reads */
    ck_assert_int_eq(r.s.program_cached, 1);
    compiled_free(&r);

    setenv("KILN_CACHE", "off", 1);
    expect_all_compiled(kg_spec, &o, 2, "off");
    r = compile_with(kg_spec, &oe);
    compiled_free(&r);
    tree_bytes(empty, &files);
    ck_assert_msg(files == 0, "off wrote %d files", files);

    setenv("KILN_CACHE", "refresh", 1);
    expect_all_compiled(kg_spec, &o, 2, "refresh");
    walk_count after = count_entries(warm);
    ck_assert_int_eq(after.n[KC_PROGRAM], before.n[KC_PROGRAM]);
    ck_assert_int_eq(after.n[KC_CUBIN], before.n[KC_CUBIN]);

    setenv("KILN_CACHE", "sometimes", 1);
    kiln_ctx   *ctx;
    kiln_graph *g = ts_build(kg_spec, &ctx);
    kiln_program *p = NULL;
    kiln_status   st = kiln_compile(g, &o, &p);
    ck_assert_msg(st != NULL, "KILN_CACHE=sometimes accepted");
    ck_assert_msg(strstr(kiln_status_msg(st), "sometimes") && strstr(kiln_status_msg(st), "KILN_CACHE"),
                  "the error does not name the value: %s", kiln_status_msg(st));
    ck_assert_ptr_null(p);
    kiln_status_free(st);
    ts_graph_free(g, ctx);

    setenv("KILN_CACHE", "on", 1);
    r = compile_with(kg_spec, &o);
    ck_assert_int_eq(r.s.program_cached, 1);
    compiled_free(&r);
    restore_env(&env);
    ts_rmtree(warm);
    ts_rmtree(empty);
    free(warm);
    free(empty);
}
END_TEST

START_TEST(size_limit_after_compile) {
    char             *dir = ts_tmpdir();
    kiln_compile_opts o = opts_in(dir);
    saved_env         env = set_env("KILN_CACHE_MAX", NULL);
    compiled          a = compile_with(kg_base, &o);
    compiled_free(&a);
    walk_count first = count_entries(dir);
    ck_assert_int_eq(first.n[KC_PROGRAM], 1);
    ck_assert_int_gt(first.bytes, 0);

    /* Room for about one graph's entries: the next graph's compile evicts the first's. */
    ts_log lc = {0};
    o.log = ts_log_line;
    o.log_user = &lc;
    char limit[32];
    snprintf(limit, sizeof limit, "%llu", (unsigned long long)(first.bytes * 3 / 2));
    setenv("KILN_CACHE_MAX", limit, 1);
    char    *kg2 = variant("scale(x, 0.5, 0.25)", "scale(x, 0.5, 0.125)");
    compiled b = compile_with(kg2, &o);
    ck_assert_int_eq(b.s.program_cached, 0);
    compiled_free(&b);
    walk_count second = count_entries(dir);
    ck_assert_msg(second.bytes <= first.bytes * 3 / 2, "cache holds %llu bytes, limit %s",
                  (unsigned long long)second.bytes, limit);
    ck_assert_uint_le(tree_bytes(dir, NULL), first.bytes * 3 / 2);
    ck_assert_msg(strstr(lc.all, "KILN_CACHE_MAX") && strstr(lc.all, "removed"), "eviction not logged:\n%s", lc.all);
    /* The newest program survived: it compiles warm. */
    b = compile_with(kg2, &o);
    ck_assert_int_eq(b.s.program_cached, 1);
    compiled_free(&b);

    /* A tiny limit: whatever is written is removed again. */
    setenv("KILN_CACHE_MAX", "1k", 1);
    b = compile_with(kg_spec, &o);
    compiled_free(&b);
    ck_assert_uint_le(count_entries(dir).bytes, 1024);
    ck_assert_uint_le(tree_bytes(dir, NULL), 1024);
    free(kg2);
    restore_env(&env);
    ts_tmpdir_free(dir);
}
END_TEST

/* ---- dumps ---------------------------------------------------------------------------------- */

static void check_dump_names(const char *dir, const kiln_program *p) {
    regex_t re;
    ck_assert_int_eq(regcomp(&re, "^([0-9]{3})_([a-z0-9_]+)_([0-9a-f]{8})\\.cu$", REG_EXTENDED), 0);
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int            ncu = 0;
    bool           program_txt = false;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (!strcmp(e->d_name, "program.txt")) {
            program_txt = true;
            continue;
        }
        if (strchr(e->d_name, '=')) continue; /* a specialization's directory */
        regmatch_t m[4];
        ck_assert_msg(regexec(&re, e->d_name, 4, m, 0) == 0, "dump file name %s is not NNN_name_KEY8.cu", e->d_name);
        int i = atoi(e->d_name);
        ck_assert_int_lt(i, kiln_program_kernel_count(p));
        ck_assert_int_eq(strncmp(e->d_name + m[2].rm_so, kiln_program_kernel_name(p, i), (size_t)(m[2].rm_eo - m[2].rm_so)), 0);
        ck_assert_int_eq((int)strlen(kiln_program_kernel_name(p, i)), m[2].rm_eo - m[2].rm_so);
        ck_assert_int_eq(strncmp(e->d_name + m[3].rm_so, kiln_program_kernel_key(p, i), 8), 0);
        char *path = NULL;
        ck_assert_int_ge(asprintf(&path, "%s/%s", dir, e->d_name), 0);
        char *text = ts_read_file(path, NULL);
        free(path);
        static const char *const want[] = {"graph nodes:", "fusion:", "buffers", "key:"};
        for (int k = 0; k < 4; k++) ck_assert_msg(strstr(text, want[k]), "%s has no '%s'", e->d_name, want[k]);
        ck_assert_msg(strstr(text, kiln_program_kernel_key(p, i)), "%s does not give its full key", e->d_name);
        ck_assert_msg(strstr(text, kiln_program_kernel_source(p, i)), "%s does not hold the kernel source", e->d_name);
        free(text);
        ncu++;
    }
    closedir(d);
    regfree(&re);
    ck_assert_int_eq(ncu, kiln_program_kernel_count(p));
    ck_assert_msg(program_txt, "no program.txt in %s", dir);
}

START_TEST(dumps_identical_cold_and_warm) {
    char *dir = ts_tmpdir();
    char  cache[4200], d[3][4200], cmd[9000];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    for (int i = 0; i < 3; i++) snprintf(d[i], sizeof d[i], "%s/dump%d", dir, i);
    kiln_compile_opts o = opts_in(cache);
    o.dump_dir = d[0];
    compiled a = compile_with(kg_spec, &o);
    ck_assert_int_eq(a.s.program_cached, 0);
    o.dump_dir = d[1];
    compiled b = compile_with(kg_spec, &o);
    ck_assert_int_eq(b.s.program_cached, 1);
    /* KILN_DUMP does the same when no dump_dir is given. */
    saved_env env = set_env("KILN_DUMP", d[2]);
    o.dump_dir = NULL;
    compiled c = compile_with(kg_spec, &o);
    restore_env(&env);
    ck_assert_int_eq(c.s.program_cached, 1);
    for (int i = 1; i < 3; i++) {
        char *out = NULL;
        snprintf(cmd, sizeof cmd, "diff -r '%s' '%s'", d[0], d[i]);
        int rc = ts_run(cmd, &out);
        ck_assert_msg(rc == 0, "dumps differ (%s):\n%s", cmd, out ? out : "");
        free(out);
    }
    check_dump_names(d[0], a.p);
    char sub[4300];
    snprintf(sub, sizeof sub, "%s/n=1/program.txt", d[0]);
    ck_assert_msg(access(sub, F_OK) == 0, "no dump of the specialization (%s)", sub);
    /* program.txt is the program's description (first variant). */
    snprintf(sub, sizeof sub, "%s/program.txt", d[0]);
    char *txt = ts_read_file(sub, NULL), *desc = describe(a.p);
    ck_assert_msg(strncmp(desc, txt, strlen(txt)) == 0, "program.txt is not the start of describe:\n%s", txt);
    ck_assert_ptr_nonnull(strstr(txt, "program for sm_90a"));
    free(txt);
    free(desc);
    compiled_free(&a);
    compiled_free(&b);
    compiled_free(&c);
    ts_tmpdir_free(dir);
}
END_TEST

/* ---- jobs ----------------------------------------------------------------------------------- */

/* Three nodes that do not fuse into one kernel (a reduction between elementwise ops). */
static const char *kg_three = "kiln-graph 1\n"
                              "dim n <= 8 specialize 1, 2\n"
                              "input x: f32[64, n]\n"
                              "weight w: f32[64]\n"
                              "a = mul(x, w)\n"
                              "r = soft_max(a)\n"
                              "b = exp(r)\n"
                              "output y = sum_rows(b)\n";

typedef struct {
    int  calls, last_done, last_total;
    bool monotonic;
    char what[64];
} progress_log;

static void on_progress(void *user, const char *what, int done, int total) {
    progress_log *pl = user;
    if (!strcmp(what, "kernels generated")) {
        if (done != pl->last_done + 1) pl->monotonic = false;
        pl->last_done = done;
        pl->last_total = total;
    }
    pl->calls++;
}

START_TEST(jobs_change_nothing) {
    char         *dir = ts_tmpdir();
    compiled      c[3];
    int           jobs[3] = {1, 4, 2};
    progress_log  pl[3];
    for (int i = 0; i < 3; i++) {
        kiln_compile_opts o = opts_in(dir);
        o.skip_nvrtc = 1; /* sources and keys only; the program cache is not used */
        o.jobs = jobs[i];
        pl[i] = (progress_log){.monotonic = true};
        o.progress = on_progress;
        o.progress_user = &pl[i];
        c[i] = compile_with(kg_three, &o);
        ck_assert_int_eq(c[i].s.program_cached, 0);
        ck_assert_int_gt(c[i].s.generated, 3);
        ck_assert_msg(pl[i].monotonic && pl[i].last_done == pl[i].last_total && pl[i].last_total > 0,
                      "jobs %d: progress ended at %d/%d", jobs[i], pl[i].last_done, pl[i].last_total);
    }
    assert_same_program(c[0].p, c[1].p, "jobs 1 vs 4");
    assert_same_program(c[0].p, c[2].p, "jobs 1 vs 2");
    for (int i = 0; i < 3; i++) compiled_free(&c[i]);
    ts_tmpdir_free(dir);
}
END_TEST

/* ---- kiln_cache_explain --------------------------------------------------------------------- */

static char *explain(const char *kg, const kiln_compile_opts *o) {
    kiln_ctx   *ctx;
    kiln_graph *g = ts_build(kg, &ctx);
    char *text = NULL;
    TS_OK(kiln_cache_explain(g, o, &text));
    ts_graph_free(g, ctx);
    return text;
}

START_TEST(explain_says_why) {
    char             *dir = ts_tmpdir();
    kiln_compile_opts o = opts_in(dir);
    compiled          a = compile_with(kg_base, &o);
    compiled_free(&a);
    walk_count before = count_entries(dir);

    char *t = explain(kg_base, &o);
    ck_assert_msg(strstr(t, "program") && strstr(t, ": cached"), "same graph not cached:\n%s", t);
    ck_assert_msg(!strstr(t, ": not cached"), "same graph:\n%s", t);
    ck_assert_msg(strstr(t, "1 distinct, 1 cached, 0 not cached"), "same graph:\n%s", t);
    free(t);

    kiln_compile_opts o80 = o;
    o80.arch = "sm_80";
    t = explain(kg_base, &o80);
    ck_assert_msg(strstr(t, "not cached") && strstr(t, "arch (cached sm_90a, now sm_80)"), "sm_80:\n%s", t);
    ck_assert_msg(strstr(t, "1 distinct, 0 cached, 1 not cached"), "sm_80:\n%s", t);
    free(t);

    /* One static shape changed (line 3 of the graph text, and the kernel's source). */
    char *kg = variant("input x: f32[64, n]\nweight w: f32[64]", "input x: f32[32, n]\nweight w: f32[32]");
    t = explain(kg, &o);
    ck_assert_msg(strstr(t, "not cached"), "changed shape:\n%s", t);
    ck_assert_msg(strstr(t, "graph (line 3: cached `input x: f32[64, n]`, now `input x: f32[32, n]`)"),
                  "the program's difference is not named:\n%s", t);
    ck_assert_msg(strstr(t, "source (line "), "the kernel's difference is not named:\n%s", t);
    ck_assert_msg(!strstr(t, "arch (cached"), "only the source differs:\n%s", t);
    free(t);
    free(kg);
    /* explain changes nothing. */
    walk_count after = count_entries(dir);
    ck_assert_int_eq(after.n[KC_PROGRAM], before.n[KC_PROGRAM]);
    ck_assert_int_eq(after.n[KC_CUBIN], before.n[KC_CUBIN]);
    ts_tmpdir_free(dir);
}
END_TEST

/* ---- the cli -------------------------------------------------------------------------------- */

static int kiln_cli(const char *cache, const char *args, char **out) {
    char *cmd = NULL;
    if (asprintf(&cmd, "KILN_CACHE_DIR='%s' '%s' %s", cache, ts_kiln_bin(), args) < 0) return -1;
    int rc = ts_run(cmd, out);
    free(cmd);
    return rc;
}

START_TEST(cli_reports_cold_and_warm) {
    char *dir = ts_tmpdir();
    char  g[4200], cache[4200], args[9000];
    snprintf(g, sizeof g, "%s/g.kg", dir);
    snprintf(cache, sizeof cache, "%s/cache", dir);
    write_text(g, kg_spec);
    char *out = NULL;
    snprintf(args, sizeof args, "compile '%s' --dim n=3", g);
    ck_assert_int_eq(kiln_cli(cache, args, &out), 0);
    int  n = -1, d = -1, c = -1, h = -1;
    double ms = -1;
    const char *line = strstr(out, "compiled ");
    ck_assert_msg(line && sscanf(line, "compiled %d kernels (%d distinct: %d new, %d from cache) in %lf ms", &n, &d, &c,
                                 &h, &ms) == 5,
                  "cold: %s", out);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(d, 2);
    ck_assert_int_eq(c, 2);
    ck_assert_int_eq(h, 0);
    ck_assert(ms >= 0);
    free(out);

    /* Another --dim value: the same program (values are not part of it). */
    snprintf(args, sizeof args, "compile '%s' --dim n=5", g);
    ck_assert_int_eq(kiln_cli(cache, args, &out), 0);
    line = strstr(out, "loaded ");
    n = d = -1;
    ck_assert_msg(line && sscanf(line, "loaded %d kernels (%d distinct) from the program cache in %lf ms", &n, &d, &ms) == 3,
                  "warm: %s", out);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(d, 2);
    free(out);

    snprintf(args, sizeof args, "cache explain '%s'", g);
    ck_assert_int_eq(kiln_cli(cache, args, &out), 0);
    ck_assert_msg(strstr(out, "cached (a run loads it"), "explain: %s", out);
    free(out);
    snprintf(args, sizeof args, "cache explain '%s' --arch sm_80", g);
    ck_assert_int_eq(kiln_cli(cache, args, &out), 0);
    ck_assert_msg(strstr(out, "arch (cached sm_90a, now sm_80)"), "explain sm_80: %s", out);
    free(out);
    ck_assert_int_eq(count_entries(cache).n[KC_PROGRAM], 1);
    ts_tmpdir_free(dir);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("program_cache",
                        TS_CASE("program_cache", 120),
                        TS_TESTS(second_compile_is_a_program_hit, upto_variant_is_part_of_the_program,
                        upto_variant_value_out_of_range_is_refused, keys_change_with_key_inputs_only,
                                 corrupt_program_entry_is_rebuilt, cache_modes, size_limit_after_compile,
                                 dumps_identical_cold_and_warm, jobs_change_nothing, explain_says_why,
                                 cli_reports_cold_and_warm),
                        TS_LOOP(0, (int)(sizeof model_archs / sizeof model_archs[0]), model_program_hit_has_the_same_ir));
    return ts_main_isolated(s, "progcache");
}
