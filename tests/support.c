#include "tests/support.h"

#include "codegen/codegen.h"

#include <nvrtc.h>

#include "ir/ir.h"
#include "model/tokenizer.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

char *ts_tmpdir(void) {
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    char *path = malloc(strlen(base) + 32);
    ck_assert_ptr_nonnull(path);
    sprintf(path, "%s/kiln-test-XXXXXX", base);
    ck_assert_msg(mkdtemp(path) != NULL, "mkdtemp failed");
    return path;
}

void ts_rmtree(const char *dir) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

void ts_tmpdir_free(char *dir) {
    ts_rmtree(dir);
    free(dir);
}

kiln_gguf *ts_gguf_write_read(kiln_gguf_writer *w, const char *dir, const char *name) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    TS_OK(kiln_gguf_write(w, path, NULL, NULL, NULL));
    kiln_gguf_writer_free(w);
    kiln_gguf *g = NULL;
    TS_OK(kiln_gguf_open(path, &g));
    return g;
}

void ts_ctx_error(kiln_ctx *ctx, kiln_code code, const char *needle) {
    kiln_status st = kiln_ctx_status(ctx);
    ck_assert_msg(st != NULL, "the context holds no error");
    if (code) ck_assert_int_eq(kiln_status_code(st), code);
    if (needle) ck_assert_msg(strstr(kiln_status_msg(st), needle), "\"%s\" lacks \"%s\"", kiln_status_msg(st), needle);
    kiln_status_free(st);
    kiln_ctx_free(ctx);
}

kiln_graph *ts_build(const char *kg, kiln_ctx **ctx) {
    *ctx = ts_parse(kg);
    kiln_graph *g = NULL;
    TS_OK(kiln_graph_new(*ctx, &g));
    return g;
}

void ts_graph_free(kiln_graph *g, kiln_ctx *ctx) {
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

kiln_ctx *ts_parse(const char *text) {
    kiln_ctx *ctx = kiln_ctx_new();
    ck_assert_ptr_nonnull(ctx);
    TS_OK(kiln_parse(ctx, text, strlen(text), "test.kg"));
    return ctx;
}

int ts_run(const char *cmd, char **out) {
    char full[8192];
    snprintf(full, sizeof full, "(%s) 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (!p) return -1;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += n;
        if (cap - len < 2) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
    }
    if (buf) buf[len] = 0;
    int rc = pclose(p);
    if (out) *out = buf;
    else free(buf);
    if (rc == -1) return -1;
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

const char *ts_kiln_bin(void) {
    const char *b = getenv("KILN_BIN");
    return b && *b ? b : "build/kiln";
}

const char *ts_src_dir(void) {
    const char *s = getenv("KILN_SRC");
    return s && *s ? s : ".";
}

TCase *ts_tcase(Suite *s, const char *name, double timeout) {
    TCase *tc = tcase_create(name);
    if (timeout > 0) tcase_set_timeout(tc, timeout);
    suite_add_tcase(s, tc);
    return tc;
}

void ts_add_rows(Suite *s, const ts_row *rows) {
    TCase *tc = NULL;
    for (const ts_row *r = rows; r->tcase || r->each || r->tests; r++) {
        if (r->each) {
            for (int i = 0; r->each[i]; i++) {
                tc = ts_tcase(s, r->each[i], r->timeout);
                for (const TTest *const *t = r->tests; *t; t++) tcase_add_loop_test(tc, *t, i, i + 1);
            }
            continue;
        }
        if (r->tcase) {
            tc = ts_tcase(s, r->tcase, r->timeout);
            if (r->setup || r->teardown) tcase_add_checked_fixture(tc, r->setup, r->teardown);
        }
        if (r->tests && !tc) {
            /* a table written wrong: say so rather than hand Check a NULL case */
            fprintf(stderr, "ts_add_rows: tests before any TS_CASE in suite rows\n");
            exit(EXIT_FAILURE);
        }
        for (const TTest *const *t = r->tests; t && *t; t++) {
            if (r->loop) tcase_add_loop_test(tc, *t, r->lo, r->hi);
            else tcase_add_test(tc, *t);
        }
    }
}

Suite *ts_suite(const char *name, const ts_row *rows) {
    Suite *s = suite_create(name);
    ts_add_rows(s, rows);
    return s;
}

int ts_main(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* $TMPDIR/kiln-TAG-XXXXXX, created; NULL (perror) when mkdtemp fails. No Check asserts. */
static char *main_tmpdir(const char *tag) {
    const char *base = getenv("TMPDIR");
    char        dir[4096];
    snprintf(dir, sizeof dir, "%s/kiln-%s-XXXXXX", base && *base ? base : "/tmp", tag);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return NULL;
    }
    return strdup(dir);
}

int ts_main_isolated(Suite *s, const char *tag) {
    char *dir = main_tmpdir(tag);
    if (!dir) return EXIT_FAILURE;
    setenv("KILN_CACHE_DIR", dir, 1);
    static const char *const unset[] = {"KILN_CACHE", "KILN_CACHE_MAX", "KILN_DUMP", "KILN_TEMPLATE_DIR"};
    for (size_t i = 0; i < sizeof unset / sizeof unset[0]; i++) unsetenv(unset[i]);
    int rc = ts_main(s);
    ts_rmtree(dir);
    free(dir);
    return rc;
}

int ts_main_cache(Suite *s, const char *tag, char **cache_dir) {
    *cache_dir = main_tmpdir(tag);
    if (!*cache_dir) return EXIT_FAILURE;
    int rc = ts_main(s);
    ts_rmtree(*cache_dir);
    free(*cache_dir);
    *cache_dir = NULL;
    return rc;
}

char *ts_read_file(const char *path, size_t *len) {
    char  *data = NULL;
    size_t n = 0;
    TS_OK(kb_read_file(path, &data, &n));
    if (len) *len = n;
    return data;
}

static const void *ts_get(void *user, const char *name, kiln_type type, int64_t n) {
    ts_buf *b = user;
    for (int i = 0; b[i].name; i++)
        if (!strcmp(b[i].name, name) && b[i].data) {
            ck_assert_msg(b[i].type == type, "%s: reference wants %s", name, kiln_type_name(type));
            ck_assert_msg(!b[i].n || b[i].n == n, "%s: reference wants %lld elements", name, (long long)n);
            return b[i].data;
        }
    ck_abort_msg("reference asked for unknown input '%s'", name);
    return NULL;
}

static void ts_put(void *user, const char *name, kiln_type type, int64_t n, const void *data) {
    ts_buf *b = user;
    for (int i = 0; b[i].name; i++)
        if (!strcmp(b[i].name, name) && !b[i].data) {
            size_t bytes = kiln_row_size(type, n);
            b[i].out = malloc(bytes ? bytes : 1);
            ck_assert_ptr_nonnull(b[i].out);
            memcpy(b[i].out, data, bytes);
            b[i].type = type;
            b[i].n = n;
            return;
        }
}

/* Parses kg and evaluates it with the CPU reference through get and put. */
static void reference_with(const char *kg, kiln_ref_get_fn get, kiln_ref_put_fn put, void *user) {
    kiln_ctx   *ctx;
    kiln_graph *g = ts_build(kg, &ctx);
    TS_OK(kiln_reference(g, get, put, user));
    ts_graph_free(g, ctx);
}

void ts_reference(const char *text, ts_buf *b) { reference_with(text, ts_get, ts_put, b); }

ts_buf *ts_buf_find(ts_buf *b, const char *name) {
    for (int i = 0; b[i].name; i++)
        if (!strcmp(b[i].name, name)) return &b[i];
    ck_abort_msg("no buffer %s", name);
    return NULL;
}

void ts_buf_free(ts_buf *b) {
    for (int i = 0; b[i].name; i++) free(b[i].out);
}

ts_slot *ts_hands_find(ts_hands *h, const char *name) {
    for (int i = 0; i < h->ns; i++)
        if (!strcmp(h->s[i].name, name)) return &h->s[i];
    return NULL;
}

ts_slot *ts_hands_slot(ts_hands *h, const char *name) {
    ts_slot *s = ts_hands_find(h, name);
    ck_assert_msg(s != NULL, "no slot %s", name);
    return s;
}

float *ts_hands_add(ts_hands *h, const char *name) {
    ck_assert_int_lt(h->ns, TS_HAND_SLOTS);
    h->s[h->ns].name = name;
    return h->s[h->ns++].v;
}

static const void *hands_get(void *user, const char *name, kiln_type type, int64_t n) {
    ts_slot *s = ts_hands_find(user, name);
    ck_assert_msg(s != NULL, "no data for %s", name);
    ck_assert_int_le(n, TS_HAND_MAX);
    if (type == KILN_I32) return s->iv;
    if (type == KILN_F32) return s->v;
    for (int64_t i = 0; i < n; i++) kb_store_f32(s->raw16, type, i, s->v[i]);
    return s->raw16;
}

static void hands_put(void *user, const char *name, kiln_type type, int64_t n, const void *data) {
    ts_slot *s = ts_hands_find(user, name);
    ck_assert_msg(s != NULL, "unexpected output %s", name);
    ck_assert_int_le(n, TS_HAND_MAX);
    s->n = n;
    s->type = type;
    for (int64_t i = 0; i < n; i++) s->v[i] = kb_load_f32(data, type, i);
}

void ts_hands_run(const char *kg, ts_hands *h) { reference_with(kg, hands_get, hands_put, h); }

char *ts_nvrtc_log(const char *src, const char *name, const char *arch, bool *compiled) {
    const char *opts[CG_MAX_OPTS];
    int          n = cg_nvrtc_options(arch, opts);
    nvrtcProgram prog;
    ck_assert_int_eq(nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL), NVRTC_SUCCESS);
    nvrtcResult r = nvrtcCompileProgram(prog, n, opts);
    size_t      len = 0;
    nvrtcGetProgramLogSize(prog, &len);
    char *log = calloc(1, len + 1);
    ck_assert_ptr_nonnull(log);
    nvrtcGetProgramLog(prog, log);
    nvrtcDestroyProgram(&prog);
    *compiled = r == NVRTC_SUCCESS;
    return log;
}

void ts_nvrtc_clean(const char *src, const char *name, const char *arch) {
    if (!arch) arch = "sm_90a";
    bool  ok;
    char *log = ts_nvrtc_log(src, name, arch, &ok);
    if (!ok || log[0]) fprintf(stderr, "%s (%s): NVRTC says:\n%s\nsource:\n%s\n", name, arch, log, src);
    ck_assert_msg(ok && log[0] == 0, "%s (%s): NVRTC says:\n%.600s", name, arch, log);
    free(log);
}

kiln_program *ts_compile(const char *kg, const char *arch, const char *cache_dir, int skip_nvrtc, kiln_ctx **ctx,
                         kiln_graph **g) {
    *ctx = ts_parse(kg);
    *g = NULL;
    TS_OK(kiln_graph_new(*ctx, g));
    kiln_compile_opts o = {.arch = arch, .cache_dir = cache_dir, .skip_nvrtc = skip_nvrtc};
    kiln_program     *p = NULL;
    TS_OK(kiln_compile(*g, &o, &p));
    return p;
}

void ts_kernels_clean(const char *kg, const char *arch, const char *cache_dir, const char *const *needles, int *counts,
                      int n) {
    kiln_ctx     *ctx;
    kiln_graph   *g;
    kiln_program *p = ts_compile(kg, arch, cache_dir, 1, &ctx, &g);
    for (int j = 0; j < n; j++) counts[j] = 0;
    for (int i = 0; i < p->nkernels; i++) {
        const cg_kernel *k = &p->kernels[i];
        if (k->kind != CG_LAUNCH) continue;
        for (int j = 0; j < n; j++) counts[j] += strstr(k->source, needles[j]) != NULL;
        ts_nvrtc_clean(k->source, k->name, arch);
    }
    kiln_program_free(p);
    ts_graph_free(g, ctx);
}

/* Compiles case i's kg for arch into cache: one kernel whose source contains want and equals
 * *source when that is set (else *source gets a copy). */
static void one_kernel_arch(int i, const char *kg, const char *want, const char *arch, const char *cache,
                            char **source) {
    kiln_ctx   *ctx = ts_parse(kg);
    kiln_graph *g;
    TS_OK(kiln_graph_new(ctx, &g));
    kiln_compile_opts o = {.arch = arch, .cache_dir = cache};
    kiln_program     *p = NULL;
    kiln_status       st = kiln_compile(g, &o, &p);
    ck_assert_msg(st == NULL, "case %d (%s) for %s: %s", i, kg, arch, kiln_status_msg(st));
    ck_assert_int_eq(kiln_program_kernel_count(p), 1);
    const char *src = kiln_program_kernel_source(p, 0);
    if (!strstr(src, want)) fprintf(stderr, "case %d source:\n%s\n", i, src);
    ck_assert_msg(strstr(src, want), "case %d (%s): source lacks '%s'", i, kg, want);
    if (*source) ck_assert_str_eq(*source, src); /* the same source for every arch and every run */
    else *source = strdup(src);
    kiln_program_free(p);
    ts_graph_free(g, ctx);
}

void ts_one_kernel_case(int i, const char *kg, const char *want, const char *name) {
    char *cache = ts_tmpdir();
    char *src = NULL;
    one_kernel_arch(i, kg, want, "sm_90a", cache, &src);
    one_kernel_arch(i, kg, want, "sm_80", cache, &src);
    ts_nvrtc_clean(src, name, NULL);
    free(src);
    ts_rmtree(cache);
    free(cache);
}

ir_prog *ts_prog_new(int nnodes) {
    ir_prog *p = calloc(1, sizeof *p);
    ck_assert_ptr_nonnull(p);
    p->capbufs = 4 * IR_MAX_IN;
    p->bufs = calloc((size_t)p->capbufs, sizeof *p->bufs);
    p->capnodes = nnodes;
    p->nnodes = nnodes;
    p->nodes = calloc((size_t)nnodes, sizeof *p->nodes);
    ck_assert(p->bufs && p->nodes);
    return p;
}

void ts_prog_free(ir_prog *p) {
    free(p->bufs);
    free(p->nodes);
    free(p);
}

void ts_use_buf(ir_prog *p, const ir_ref *r, const char *name) {
    ck_assert_int_lt(r->buf, p->capbufs);
    if (r->buf >= p->nbufs) p->nbufs = r->buf + 1;
    ir_buf *b = &p->bufs[r->buf];
    b->type = r->type;
    b->kind = IR_BUF_TEMP;
    snprintf(b->name, sizeof b->name, "%s", name);
    for (int d = 0; d < 4; d++) b->ne[d] = r->ne[d];
    b->bytes = kiln_row_size(r->type, r->ne[0]) * (size_t)(r->ne[1] * r->ne[2] * r->ne[3]);
}

ir_ref ts_ref4(int buf, kiln_type t, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
    ir_ref r = {.buf = buf, .type = t, .ne = {ne0, ne1, ne2, ne3}};
    int64_t s = 1;
    for (int d = 0; d < 4; d++) {
        r.st[d] = s;
        s *= r.ne[d];
    }
    return r;
}

ir_ref ts_strided(int buf, kiln_type t, const int64_t ne[4], const int64_t st[4], int64_t offs) {
    ir_ref r = {.buf = buf, .type = t, .offs = offs};
    memcpy(r.ne, ne, sizeof r.ne);
    memcpy(r.st, st, sizeof r.st);
    return r;
}

void ts_ew_node(ir_prog *p, int i, ir_ref dst, int nin, const ir_ref *in, int ninstr, const ir_instr *ins) {
    ir_node *n = &p->nodes[i];
    memset(n, 0, sizeof *n);
    n->kind = IR_EW;
    n->dst = dst;
    n->nin = nin;
    for (int j = 0; j < nin; j++) n->in[j] = in[j];
    n->ninstr = ninstr;
    for (int j = 0; j < ninstr; j++) n->ins[j] = ins[j];
    n->nsrc = 1;
    n->src[0] = i;
    char name[64];
    snprintf(name, sizeof name, "SECRETNAME_out_%d", dst.buf);
    ts_use_buf(p, &dst, name);
    for (int j = 0; j < nin; j++) {
        snprintf(name, sizeof name, "SECRETNAME_in_%d", in[j].buf);
        ts_use_buf(p, &in[j], name);
    }
}

void ts_gen(ir_prog *p, cg_kernel *k) {
    cg_lua *L;
    TS_OK(cg_lua_new(&L));
    TS_OK(cg_generate(L, p, 0, k));
    cg_lua_free(L);
}

void ts_kernel_compiles(const cg_kernel *k) {
    ck_assert_msg(strstr(k->source, "SECRETNAME") == NULL, "graph name in source:\n%s", k->source);
    ts_nvrtc_clean(k->source, k->name, NULL);
    static const char *const archs[] = {"sm_90a", "sm_80"};
    for (int a = 0; a < 2; a++) {
        void       *cubin;
        size_t      size;
        kiln_status st = cg_nvrtc_compile(k->source, k->name, archs[a], &cubin, &size);
        ck_assert_msg(st == NULL, "%s for %s: %s\nsource:\n%s", k->name, archs[a], kiln_status_msg(st), k->source);
        ck_assert_ptr_nonnull(cubin);
        ck_assert_uint_gt(size, 0);
        free(cubin);
    }
}

void ts_parse_error(const char *kg, kiln_code code, const char *const *needles) {
    kiln_ctx   *ctx = kiln_ctx_new();
    kiln_status st = kiln_parse(ctx, kg, strlen(kg), "bad.kg");
    ck_assert_msg(st != NULL, "no error for:\n%s", kg);
    const char *msg = kiln_status_msg(st);
    ck_assert_msg(kiln_status_code(st) == code, "%s: got %s, want %s: %s", kg, kiln_code_name(kiln_status_code(st)),
                  kiln_code_name(code), msg);
    for (int i = 0; needles[i]; i++)
        ck_assert_msg(strstr(msg, needles[i]), "%s: message \"%s\" lacks \"%s\"", kg, msg, needles[i]);
    kiln_status_free(st);
    kiln_ctx_free(ctx);
}

void ts_builds(const char *kg) {
    kiln_ctx   *ctx = ts_parse(kg);
    kiln_graph *g = NULL;
    TS_OK(kiln_graph_new(ctx, &g));
    ts_graph_free(g, ctx);
}

void ts_kernels_want(const char *kg, const char *cache_dir, bool (*pick)(const ir_node *n), const char *want, int ci) {
    static const char *archs[2] = {"sm_90a", "sm_80"};
    for (int a = 0; a < 2; a++) {
        kiln_ctx     *ctx;
        kiln_graph   *g;
        kiln_program *p = ts_compile(kg, archs[a], cache_dir, 1, &ctx, &g);
        kb_str        s = {0};
        for (int i = 0; i < p->nkernels; i++)
            if (p->kernels[i].source && pick(&p->ir->nodes[p->kernels[i].node])) kb_str_add(&s, p->kernels[i].source);
        char *all = kb_str_take(&s);
        ck_assert_ptr_nonnull(all);
        if (!strstr(all, want)) fprintf(stderr, "case %d sources:\n%s\n", ci, all);
        ck_assert_msg(strstr(all, want), "case %d: missing \"%s\" (sources on stderr)", ci, want);
        ck_assert_msg(!strstr(all, "#include"), "case %d: #include in source", ci);
        free(all);
        for (int i = 0; i < p->nkernels; i++) {
            const cg_kernel *k = &p->kernels[i];
            if (k->kind == CG_LAUNCH) ts_nvrtc_clean(k->source, k->name, archs[a]);
        }
        ts_compiled_free(p, g, ctx);
    }
}

void ts_compiled_free(kiln_program *p, kiln_graph *g, kiln_ctx *ctx) {
    kiln_program_free(p);
    ts_graph_free(g, ctx);
}

void ts_compile_twice(const char *kg, const char *cache_dir, void (*check)(const kiln_program *p)) {
    kiln_ctx     *ctx[2];
    kiln_graph   *g[2];
    kiln_program *p[2];
    for (int r = 0; r < 2; r++) p[r] = ts_compile(kg, "sm_90a", cache_dir, 1, &ctx[r], &g[r]);
    ck_assert_int_eq(kiln_program_kernel_count(p[1]), kiln_program_kernel_count(p[0]));
    for (int k = 0; k < kiln_program_kernel_count(p[0]); k++)
        ck_assert_msg(strcmp(kiln_program_kernel_source(p[0], k), kiln_program_kernel_source(p[1], k)) == 0,
                      "%s: kernel %d: sources differ", kg, k);
    if (check) check(p[1]);
    for (int r = 0; r < 2; r++) ts_compiled_free(p[r], g[r], ctx[r]);
}

int ts_named_step(const kiln_program *p, const char *kernel, int steps, const char *want, int i) {
    int k = -1;
    for (int j = 0; j < kiln_program_kernel_count(p) && k < 0; j++)
        if (strcmp(kiln_program_kernel_name(p, j), kernel) == 0) k = j;
    if (k < 0)
        for (int j = 0; j < kiln_program_kernel_count(p); j++)
            fprintf(stderr, "case %d: kernel %s\n", i, kiln_program_kernel_name(p, j));
    ck_assert_msg(k >= 0, "case %d: no kernel %s (names on stderr)", i, kernel);
    ck_assert_int_eq(kiln_program_kernel_count(p), steps);
    const char *src = kiln_program_kernel_source(p, k);
    if (!strstr(src, want)) fprintf(stderr, "case %d source:\n%s\n", i, src);
    ck_assert_msg(strstr(src, want), "case %d: missing \"%s\" (source on stderr)", i, want);
    return k;
}

void ts_spread_compile(const char *kg, int no_fuse, int min_kernels, void (*each)(const kiln_program *p, int i)) {
    char       *cache = ts_tmpdir();
    kiln_ctx   *ctx;
    kiln_graph *g = ts_build(kg, &ctx);
    kiln_compile_opts o = {.arch = "sm_80", .cache_dir = cache, .no_fuse = no_fuse};
    kiln_program     *p80, *p90;
    TS_OK(kiln_compile(g, &o, &p80));
    o.arch = "sm_90a";
    o.skip_nvrtc = 1;
    TS_OK(kiln_compile(g, &o, &p90));
    int nk = kiln_program_kernel_count(p80);
    ck_assert_int_gt(nk, min_kernels);
    ck_assert_int_eq(kiln_program_kernel_count(p90), nk);
    for (int i = 0; i < nk; i++) {
        ck_assert_str_eq(kiln_program_kernel_source(p90, i), kiln_program_kernel_source(p80, i));
        each(p90, i);
    }
    kiln_program_free(p80);
    ts_compiled_free(p90, g, ctx);
    ts_rmtree(cache);
    free(cache);
}

/* FNV-1a: input data depends on the buffer's name, not on its index. */
static uint64_t name_seed(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* The outputs of kg evaluated by the CPU reference over IR lowered with passes (fuse, skip),
 * on inputs filled from seed; data[b] per buffer (caller frees with free_eval). */
static ir_prog *eval_ir(const kiln_graph *g, bool fuse, const char *skip, uint64_t seed, void ***data) {
    ir_prog *p;
    TS_OK(ir_lower(g, &p));
    TS_OK(ir_run_passes(p, fuse, skip));
    *data = calloc((size_t)p->nbufs, sizeof **data);
    for (int b = 0; b < p->nbufs; b++) {
        const ir_buf *buf = &p->bufs[b];
        (*data)[b] = calloc(1, buf->bytes + 1);
        if (buf->kind == IR_BUF_INPUT || buf->kind == IR_BUF_WEIGHT)
            kb_fill_random((*data)[b], buf->type, (int64_t)(buf->bytes / kiln_type_size(buf->type)) * kiln_type_block(buf->type),
                           seed + name_seed(buf->name));
    }
    TS_OK(ir_eval(p, *data));
    return p;
}

static void free_eval(ir_prog *p, void **data) {
    for (int b = 0; b < p->nbufs; b++) free(data[b]);
    free(data);
    ir_prog_free(p);
}

double ts_fusion_compare(const char *kg, const char *skip, int *live, char **ir_text) {
    kiln_ctx   *ctx = ts_parse(kg);
    kiln_graph *g;
    TS_OK(kiln_graph_new(ctx, &g));
    void   **df, **du;
    ir_prog *pf = eval_ir(g, true, skip, 99, &df), *pu = eval_ir(g, false, NULL, 99, &du);
    double   worst = 0;
    for (int b = 0; b < pu->nbufs; b++) {
        const ir_buf *buf = &pu->bufs[b];
        if (buf->kind != IR_BUF_OUTPUT) continue;
        int64_t n = (int64_t)(buf->bytes / kiln_type_size(buf->type)) * kiln_type_block(buf->type);
        for (int64_t i = 0; i < n; i++) {
            double a = kb_load_f32(df[b], buf->type, i), r = kb_load_f32(du[b], buf->type, i);
            double d = a == r ? 0 : fabs(a - r) / (fabs(r) > 1 ? fabs(r) : 1);
            if (d > worst || d != d) worst = d != d ? INFINITY : d;
        }
    }
    if (live) {
        *live = 0;
        for (int i = 0; i < pf->nnodes; i++) *live += !pf->nodes[i].dead;
    }
    if (ir_text) {
        kb_str o = {0};
        ir_print(pf, &o);
        *ir_text = o.s;
    }
    free_eval(pf, df);
    free_eval(pu, du);
    ts_graph_free(g, ctx);
    return worst;
}

void ts_expect_fusion(const char *kg, const char *skip, const char *want, const char *absent, int kernels) {
    int    live;
    char  *text;
    double d = ts_fusion_compare(kg, skip, &live, &text);
    ck_assert_msg(!want || strstr(text, want), "no '%s' in:\n%s\ngraph:\n%s", want, text, kg);
    ck_assert_msg(!absent || !strstr(text, absent), "'%s' in:\n%s\ngraph:\n%s", absent, text, kg);
    ck_assert_msg(kernels < 0 || live == kernels, "%d kernels, want %d:\n%s", live, kernels, text);
    ck_assert_msg(d == 0, "fused differs from unfused by %g:\n%s", d, kg);
    free(text);
}

void ts_sources_identical(const char *kg, const char *dim, int v1, int v2, const char *what) {
    char *dir = ts_tmpdir();
    char  path[512], cmd[2048], *src[2];
    snprintf(path, sizeof path, "%s/g.kg", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(kg, f);
    fclose(f);
    for (int v = 0; v < 2; v++) {
        /* Its output (and the progress lines a slow compile prints, on a loaded machine) is not
         * part of the sources compared. */
        snprintf(cmd, sizeof cmd, "%s compile %s --no-cache --dim %s=%d --dump-cu %s/cu%d >/dev/null 2>&1 && cat %s/cu%d/*.cu",
                 ts_kiln_bin(), path, dim, v ? v2 : v1, dir, v, dir, v);
        ck_assert_msg(ts_run(cmd, &src[v]) == 0, "%s: %s failed", what, cmd);
        ck_assert_msg(strlen(src[v]) > 0, "%s: no sources", what);
    }
    size_t at = 0;
    while (src[0][at] && src[0][at] == src[1][at]) at++;
    size_t from = at > 200 ? at - 200 : 0;
    ck_assert_msg(strcmp(src[0], src[1]) == 0, "%s: sources differ between %s=%d and %s=%d at byte %zu:\n%.400s\n----\n%.400s",
                  what, dim, v1, dim, v2, at, src[0] + from, src[1] + from);
    free(src[0]);
    free(src[1]);
    ts_rmtree(dir);
    free(dir);
}

const char *ts_case_label(int i) {
    static char label[32];
    snprintf(label, sizeof label, "case %d", i);
    return label;
}

void ts_dyn_kernels(const char *kg, const char *want, const char *cache_dir, bool (*mine)(const ir_node *), int flags,
                    const char *family, const char *what) {
    static const char *archs[2] = {"sm_90a", "sm_80"};
    for (int a = 0; a < 2; a++) {
        kiln_ctx     *ctx;
        kiln_graph   *g;
        kiln_program *p = ts_compile(kg, archs[a], cache_dir, 1, &ctx, &g);
        bool          found = false;
        int           n = 0;
        for (int i = 0; i < p->nkernels; i++) {
            const cg_kernel *k = &p->kernels[i];
            if (!mine(&p->ir->nodes[k->node])) continue;
            n++;
            if (strstr(k->source, want)) found = true;
            if ((flags & TS_LAUNCH_ONLY) && k->kind != CG_LAUNCH) continue;
            /* the run-time extents are the last parameter of every step of a symbolic node */
            if (!(flags & TS_KDIMS_IF_USED) || strstr(k->source, "kdims"))
                ck_assert_msg(strstr(k->source, "const int* __restrict__ kdims)"),
                              "%s: kernel %s has no kdims parameter last", what, k->name);
            ts_nvrtc_clean(k->source, k->name, archs[a]);
        }
        ck_assert_msg(n > 0, "%s: no %s kernel", what, family);
        ck_assert_msg(found, "%s: no source with \"%s\"", what, want);
        kiln_program_free(p);
        ts_graph_free(g, ctx);
    }
}

char *ts_refused_msg(const char *kg, const char *cache_dir, int parse_may_refuse, const char *what) {
    kiln_ctx *ctx = kiln_ctx_new();
    ck_assert_ptr_nonnull(ctx);
    kiln_graph *g = NULL;
    kiln_status st = kiln_parse(ctx, kg, strlen(kg), "test.kg");
    ck_assert_msg(st == NULL || parse_may_refuse, "%s: parse: %s", what, kiln_status_msg(st));
    if (st == NULL) {
        st = kiln_graph_new(ctx, &g);
        ck_assert_msg(st == NULL, "%s: graph: %s", what, kiln_status_msg(st));
        kiln_compile_opts o = {.arch = "sm_90a", .cache_dir = cache_dir, .skip_nvrtc = 1};
        kiln_program     *p = NULL;
        st = kiln_compile(g, &o, &p);
        ck_assert_msg(st != NULL, "%s: compiled:\n%s", what, kg);
    }
    char *m = strdup(kiln_status_msg(st));
    ck_assert_ptr_nonnull(m);
    kiln_status_free(st);
    ts_graph_free(g, ctx); /* g is NULL when the parse refused: ctx is freed all the same */
    return m;
}

const ts_slot *ts_hands_output(const char *kg, ts_hands *h, const char *name) {
    if (!ts_hands_find(h, name)) ts_hands_add(h, name);
    ts_hands_run(kg, h);
    return ts_hands_slot(h, name);
}

void ts_log_line(void *user, const char *line) {
    ts_log *lc = user;
    lc->lines++;
    size_t n = strlen(lc->all);
    snprintf(lc->all + n, sizeof lc->all - n, "%s\n", line);
    snprintf(lc->last, sizeof lc->last, "%s", line);
}

/* ---- large vocabularies and random text (tests/test_tokenizer.c, bench/perf_cpu.c) --------- */

uint64_t ts_rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Random text from many scripts and classes. */
size_t ts_random_text(uint64_t *r, uint8_t *out, size_t max_cps) {
    static const uint32_t ranges[][2] = {
        {0x20, 0x7E},     {'\n', '\n'},     {' ', ' '},       {'0', '9'},         {'\t', '\r'},     {0xA0, 0xFF},
        {0x370, 0x3FF},   {0x400, 0x4FF},   {0x300, 0x36F},   {0x660, 0x669},     {0x4E00, 0x4FFF}, {0x3000, 0x3003},
        {0x2000, 0x200A}, {0x1F600, 0x1F64F}, {0x10400, 0x1044F}, {0xE000, 0xE0FF}, {0x2160, 0x2188}, {0x85, 0x85},
    };
    size_t n = ts_rng_next(r) % (max_cps + 1), k = 0;
    for (size_t i = 0; i < n; i++) {
        const uint32_t *rg = ranges[ts_rng_next(r) % (sizeof ranges / sizeof ranges[0])];
        uint32_t        cp = rg[0] + (uint32_t)(ts_rng_next(r) % (rg[1] - rg[0] + 1));
        if (ts_rng_next(r) % 8 == 0) cp = '\'';
        k += (size_t)km_utf8_encode(cp, out + k);
    }
    return k;
}

/* Texts by an FNV-1a hash set (for big_vocab). */
typedef struct {
    char   **toks;
    int64_t *slot;
    uint64_t mask;
} tokset;

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ULL;
    return h;
}

/* The id of s[0..n), or -1; with add >= 0, adds it as id add when absent. */
static int64_t tokset_find(tokset *ts, const char *s, size_t n, int64_t add) {
    for (uint64_t h = fnv(s, n);; h++) {
        int64_t id = ts->slot[h & ts->mask];
        if (id < 0) {
            if (add >= 0) ts->slot[h & ts->mask] = add;
            return -1;
        }
        if (strlen(ts->toks[id]) == n && memcmp(ts->toks[id], s, n) == 0) return id;
    }
}

/* A vocabulary like a real one, of n_tokens (byte tokens, then each a token and a byte merged)
 * and n_merges: those that make the tokens, then more that split a random token in two tokens
 * (as Llama 3 has 280k merges for 128k tokens). */
static void big_vocab(int64_t n_tokens, int64_t n_merges, char **toks, char **merges) {
    uint64_t r = 99;
    int64_t  n = 0, nm = 0;
    tokset   ts = {toks, NULL, 1};
    while (ts.mask < (uint64_t)n_tokens * 2) ts.mask = ts.mask * 2 + 1;
    ts.slot = malloc((ts.mask + 1) * sizeof *ts.slot);
    memset(ts.slot, 0xFF, (ts.mask + 1) * sizeof *ts.slot);
    for (int b = 0; b < 256; b++) {
        uint8_t u[4];
        int     l = km_utf8_encode(km_byte_to_cp((uint8_t)b), u);
        toks[n] = calloc(1, 8);
        memcpy(toks[n], u, (size_t)l);
        tokset_find(&ts, toks[n], (size_t)l, n);
        n++;
    }
    while (n < n_tokens) {
        int64_t a = (int64_t)(ts_rng_next(&r) % (uint64_t)n), b = 'a' + (int64_t)(ts_rng_next(&r) % 26);
        size_t  la = strlen(toks[a]), lb = strlen(toks[b]);
        if (la + lb > 48) continue;
        char *c = malloc(la + lb + 2);
        memcpy(c, toks[a], la);
        c[la] = ' ';
        memcpy(c + la + 1, toks[b], lb + 1);
        merges[nm++] = c;
        c = malloc(la + lb + 1);
        memcpy(c, toks[a], la);
        memcpy(c + la, toks[b], lb + 1);
        toks[n] = c;
        if (tokset_find(&ts, c, la + lb, n) >= 0) free(c);
        else n++;
    }
    while (nm < n_merges) {
        const char *c = toks[256 + ts_rng_next(&r) % (uint64_t)(n - 256)];
        size_t      len = strlen(c), cut = 1 + ts_rng_next(&r) % (len - 1);
        while (cut < len && (c[cut] & 0xC0) == 0x80) cut++;
        if (cut == len || tokset_find(&ts, c, cut, -1) < 0 || tokset_find(&ts, c + cut, len - cut, -1) < 0) continue;
        char *m = malloc(len + 2);
        snprintf(m, len + 2, "%.*s %s", (int)cut, c, c + cut);
        merges[nm++] = m;
    }
    free(ts.slot);
}

void ts_big_vocab(int64_t n_tokens, int64_t n_merges, ts_vocab *v) {
    const int64_t n_normal = n_tokens - 256;
    v->n_tokens = n_tokens;
    v->n_merges = n_merges;
    v->toks = malloc(n_tokens * sizeof *v->toks);
    v->merges = malloc(n_merges * sizeof *v->merges);
    v->types = malloc(n_tokens * sizeof *v->types);
    ck_assert(v->toks && v->merges && v->types);
    big_vocab(n_normal, n_merges, v->toks, v->merges);
    for (int64_t i = 0; i < n_tokens; i++) v->types[i] = i < n_normal ? KILN_TOKEN_NORMAL : KILN_TOKEN_CONTROL;
    for (int64_t i = n_normal; i < n_tokens; i++) {
        v->toks[i] = malloc(48);
        snprintf(v->toks[i], 48, "<|reserved_special_token_%lld|>", (long long)(i - n_normal));
    }
    v->spec = (kiln_tokenizer_spec){.n_tokens = n_tokens, .tokens = (const char *const *)v->toks, .types = v->types,
                                    .n_merges = n_merges, .merges = (const char *const *)v->merges,
                                    .pre = "llama-bpe", .bos = -1, .eos = -1};
}

void ts_vocab_free(ts_vocab *v) {
    for (int64_t i = 0; i < v->n_tokens; i++) free(v->toks[i]);
    for (int64_t i = 0; i < v->n_merges; i++) free(v->merges[i]);
    free(v->toks);
    free(v->merges);
    free(v->types);
}

uint8_t *ts_big_text(size_t cap, size_t *len) {
    uint8_t *text = malloc(cap + 4096);
    uint64_t r = 7;
    ck_assert(text);
    *len = 0;
    while (*len < cap) {
        if (ts_rng_next(&r) % 2) {
            size_t l = strlen(km_synth_text());
            memcpy(text + *len, km_synth_text(), l);
            *len += l;
        } else {
            *len += ts_random_text(&r, text + *len, 400);
        }
    }
    return text;
}

void ts_expect_status(kiln_status st, kiln_code code, const char *needle) {
    ck_assert_msg(st != NULL, "expected an error naming '%s'", needle);
    ck_assert_msg(kiln_status_code(st) == code, "code %s for '%s'", kiln_code_name(kiln_status_code(st)),
                  kiln_status_msg(st));
    ck_assert_msg(strstr(kiln_status_msg(st), needle), "'%s' does not name '%s'", kiln_status_msg(st), needle);
    kiln_status_free(st);
}

/* A row of kind 0: spread logits; 1: few distinct values (ties); 2: spread with -inf, NaN, +inf,
 * -0 and +0 sprinkled; 3: no candidate (NaN and -inf only, or NaN only); 4: one dominant logit. */
void ts_logit_row(uint64_t *r, float *x, int64_t n, int kind) {
    for (int64_t i = 0; i < n; i++) {
        float u = (float)(ts_rng_next(r) >> 40) * 0x1p-24f;
        switch (kind) {
        case 0: x[i] = (u - 0.5f) * 24.0f; break;
        case 1: x[i] = (float)(int)(u * 4.0f); break;
        case 2: {
            uint64_t s = ts_rng_next(r) % 16;
            x[i] = s == 0 ? -INFINITY : s == 1 ? NAN : s == 2 ? -0.0f : s == 3 ? 0.0f : (u - 0.5f) * 8.0f;
            if (ts_rng_next(r) % 997 == 0) x[i] = INFINITY;
            break;
        }
        case 3: x[i] = ts_rng_next(r) % 3 == 0 ? -INFINITY : NAN; break;
        default: x[i] = i == n / 3 ? 30.0f : (u - 0.5f) * 2.0f; break;
        }
    }
    if (kind == 3 && ts_rng_next(r) % 2) /* NaN only: the fallback is id 0 */
        for (int64_t i = 0; i < n; i++) x[i] = NAN;
}

ir_prog *ts_lowered(const char *kg, kiln_ctx **ctx, kiln_graph **g) {
    *ctx = ts_parse(kg);
    TS_OK(kiln_graph_new(*ctx, g));
    ir_prog *p;
    TS_OK(ir_lower(*g, &p));
    TS_OK(ir_run_passes(p, true, NULL));
    return p;
}

int ts_node_named(const ir_prog *p, const char *name) {
    for (int i = 0; i < p->nnodes; i++)
        for (int s = 0; !p->nodes[i].dead && s < p->nodes[i].nsrc; s++)
            if (!strcmp(ir_node_name(p, p->nodes[i].src[s]), name)) return i;
    ck_abort_msg("no node %s", name);
    return -1;
}

void ts_expect_invalid(const ir_prog *p, const char *want) {
    kiln_status st = ir_verify(p);
    ck_assert_msg(st && strstr(kiln_status_msg(st), want), "verify: want '%s', got '%s'", want,
                  st ? kiln_status_msg(st) : "(ok)");
    kiln_status_free(st);
}

ts_server ts_serve_start(const char *model, const char *const *args, bool cpu, char *line_out) {
    int fd[2];
    ck_assert_int_eq(pipe(fd), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        const char *argv[24] = {ts_kiln_bin(), "serve", model, "--port", "0", "--alias", "tiny", "--cpu"};
        int         n = cpu ? 8 : 7;
        for (int i = 0; args[i] && n < 22; i++) argv[n++] = args[i];
        argv[n] = NULL;
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fd[1]);
    FILE *f = fdopen(fd[0], "r");
    char  line[512] = "";
    ck_assert_msg(fgets(line, sizeof line, f) != NULL, "kiln serve printed nothing (did it start?)");
    fclose(f);
    const char *p = strstr(line, "http://127.0.0.1:");
    ck_assert_msg(p != NULL, "no listening line: %s", line);
    if (line_out) snprintf(line_out, 512, "%s", line);
    return (ts_server){pid, atoi(p + 17)};
}

void ts_serve_stop(ts_server s) {
    ck_assert_int_eq(kill(s.pid, SIGTERM), 0);
    int st;
    ck_assert_int_eq(waitpid(s.pid, &st, 0), s.pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "kiln serve ended with %d", st);
}

void ts_kernels_fused(const char *kg, const char *cache_dir, const char *const *needles, int n) {
    static const char *archs[2] = {"sm_90a", "sm_80"};
    int                counts[8];
    ck_assert_int_le(n, 8);
    for (int a = 0; a < 2; a++) {
        ts_kernels_clean(kg, archs[a], cache_dir, needles, counts, n);
        for (int j = 0; j < n; j++)
            ck_assert_msg(counts[j] == (j == 0), "%s: %d kernels with '%s' (want %d)", archs[a], counts[j], needles[j],
                          j == 0);
    }
}
