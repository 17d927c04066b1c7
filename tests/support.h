/* Helpers shared by the Check test programs (tests/test_*.c, tests/gpu/test_*.c). Prefix ts_. */
#ifndef KILN_TEST_SUPPORT_H
#define KILN_TEST_SUPPORT_H

#include <check.h>

#include "kiln.h"

#include "codegen/codegen.h"
#include "ir/ir.h"

#include <stdbool.h>
#include <sys/types.h>

/* Fails the test with the status message when st is an error; frees st. */
#define TS_OK(expr)                                                                           \
    do {                                                                                      \
        kiln_status ts_st_ = (expr);                                                          \
        ck_assert_msg(ts_st_ == NULL, "%s failed: %s", #expr, kiln_status_msg(ts_st_));       \
    } while (0)

/* A new empty directory under $TMPDIR (or /tmp). Caller frees the string. */
char *ts_tmpdir(void);
/* rm -rf */
void  ts_rmtree(const char *dir);
/* The end of a ts_tmpdir: removes the tree and frees the string. */
void  ts_tmpdir_free(char *dir);
/* Writes w (and frees it) to dir/name, then opens that file as a GGUF; fails the test on error. */
kiln_gguf *ts_gguf_write_read(kiln_gguf_writer *w, const char *dir, const char *name);
/* Asserts that a builder call failed on ctx: its status has code (unless 0) and a message holding
 * needle (unless NULL). Frees the status and ctx. */
void ts_ctx_error(kiln_ctx *ctx, kiln_code code, const char *needle);
/* Parses kg into a new context (*ctx) and builds its graph; fails the test on error. */
kiln_graph *ts_build(const char *kg, kiln_ctx **ctx);
/* Frees a graph and then its context. */
void ts_graph_free(kiln_graph *g, kiln_ctx *ctx);
/* Parses .kg text into a new context; fails the test on error. */
kiln_ctx *ts_parse(const char *text);
/* Runs a shell command, capturing stdout and stderr together into *out (caller frees; may be
 * NULL). Returns the exit status, or -1 if it could not be run. */
int ts_run(const char *cmd, char **out);
/* The kiln binary ($KILN_BIN, else build/kiln) and the source tree ($KILN_SRC, else "."). */
const char *ts_kiln_bin(void);
const char *ts_src_dir(void);
/* A new test case named name, added to s, with a timeout of that many seconds unless 0 (Check's
 * default). Tests may be added to it after. */
TCase *ts_tcase(Suite *s, const char *name, double timeout);

/* A test program's suite as a table: a list of rows, each opening a test case or adding tests
 * to the case opened last, in order (Check runs them in that order; CK_RUN_CASE picks cases by
 * name). Written with the macros below, e.g. in main:
 *     Suite *s = TS_SUITE("ops_attn", TS_CASE("frontend", 0), TS_TESTS(errors, accepted),
 *                         TS_CASE("kernels", 120), TS_LOOP(0, NCASES, kernels_compile));
 *     return ts_main(s);
 * A row whose tcase is set opens a case with that timeout (ts_tcase) and, when setup or teardown
 * is set, that checked fixture; a row with tests adds them, as loop tests over [lo, hi) when
 * loop is set. A row with each opens one case per name instead, case i running its tests as
 * loop index i alone (one case per type, say, so that CK_RUN_CASE can pick one or a GPU machine
 * can run them in parallel). The list ends with a zeroed row. */
typedef struct {
    const char        *tcase;
    const char *const *each; /* NULL-ended */
    double             timeout;
    void              (*setup)(void), (*teardown)(void);
    const TTest *const *tests; /* NULL-ended */
    bool               loop;
    int                lo, hi;
} ts_row;
/* Opens case name (timeout in seconds, 0: Check's default); with a checked fixture. */
#define TS_CASE(name, timeout_s) {.tcase = (name), .timeout = (timeout_s)}
#define TS_CASE_FIXTURE(name, timeout_s, set_up, tear_down)                                   \
    {.tcase = (name), .timeout = (timeout_s), .setup = (set_up), .teardown = (tear_down)}
/* Opens a case per name (a string literal each): case i runs test with loop index i only. */
#define TS_CASE_EACH(timeout_s, test, ...)                                                    \
    {.each = (const char *const[]){__VA_ARGS__, NULL}, .timeout = (timeout_s),               \
     .tests = (const TTest *const[]){test, NULL}}
/* Adds tests to the case opened last: each once, or each as a loop test over [from, to). */
#define TS_TESTS(...) {.tests = (const TTest *const[]){__VA_ARGS__, NULL}}
#define TS_LOOP(from, to, ...)                                                                \
    {.tests = (const TTest *const[]){__VA_ARGS__, NULL}, .loop = true, .lo = (from), .hi = (to)}
/* A row list (a compound literal: it lives in the block that writes it, e.g. main; the tests
 * are Check's `static const TTest *` variables, not constants, so the list can't be static). */
#define TS_ROWS(...) ((const ts_row[]){__VA_ARGS__, {0}})
/* Adds the cases and tests of rows to s (after the cases it has). */
void   ts_add_rows(Suite *s, const ts_row *rows);
/* A new suite named name of the rows. */
Suite *ts_suite(const char *name, const ts_row *rows);
#define TS_SUITE(name, ...) ts_suite((name), TS_ROWS(__VA_ARGS__))
/* Runs one suite with CK_NORMAL output; returns the process exit status. */
int ts_main(Suite *s);
/* ts_main with every compile going to a new temporary cache (KILN_CACHE_DIR), removed after,
 * and the cache, dump and template variables unset: the tests never see the user's settings.
 * tag names the directory. Uses no Check asserts (main() may call it). */
int ts_main_isolated(Suite *s, const char *tag);
/* ts_main with a new temporary directory $TMPDIR/kiln-TAG-XXXXXX in *cache_dir for the tests'
 * explicit cache_dir (the environment is left as it is), removed after; *cache_dir is NULL
 * again on return. Uses no Check asserts (main() may call it). */
int ts_main_cache(Suite *s, const char *tag, char **cache_dir);
/* The whole file, NUL-terminated (kb_read_file); *len may be NULL. Fails the test on error. */
char *ts_read_file(const char *path, size_t *len);

/* Host buffers for kiln_reference, a list ended by an entry with a NULL name. An input has
 * data (and type; n when it should be checked); an output has data NULL and receives out
 * (malloc'd), type and n. */
typedef struct {
    const char *name;
    kiln_type   type;
    const void *data; /* inputs */
    void       *out;  /* outputs */
    int64_t     n;
} ts_buf;

/* An output slot of a ts_buf list. */
#define TS_OUT(n) {.name = (n)}

/* Parses text and evaluates it with the CPU reference over the buffers in b. */
void    ts_reference(const char *text, ts_buf *b);
ts_buf *ts_buf_find(ts_buf *b, const char *name); /* fails the test when absent */
void    ts_buf_free(ts_buf *b);                   /* frees the outputs */

/* Host data of tests that check kiln_reference against values worked out by hand
 * (tests/test_ops_*.c): named slots of f32 values. An input is handed to the reference in the
 * type the graph gives it (f32 as is, f16/bf16 converted, i32 from iv); an output comes back
 * converted to f32, with its element count and the type the reference gave. */
#define TS_HAND_MAX   512 /* values a slot holds */
#define TS_HAND_SLOTS 8
typedef struct {
    const char *name;
    float       v[TS_HAND_MAX];     /* inputs: the values; outputs: what the reference produced */
    int32_t     iv[TS_HAND_MAX];    /* i32 inputs (rope positions) */
    int64_t     n;                  /* outputs */
    kiln_type   type;               /* outputs */
    uint16_t    raw16[TS_HAND_MAX]; /* an input's f16/bf16 copy */
} ts_slot;

typedef struct {
    ts_slot s[TS_HAND_SLOTS];
    int     ns;
} ts_hands;

/* The slot named name, or NULL. */
ts_slot *ts_hands_find(ts_hands *h, const char *name);
/* The slot named name; fails the test when there is none. */
ts_slot *ts_hands_slot(ts_hands *h, const char *name);
/* A new slot named name (kept, not copied: a literal): an input, whose values the returned
 * array receives, or an output. */
float   *ts_hands_add(ts_hands *h, const char *name);
/* Parses kg and evaluates it with the CPU reference on h's inputs; each output lands in the
 * slot of its name (one without a slot fails the test). */
void     ts_hands_run(const char *kg, ts_hands *h);
/* ts_hands_run with output `name` declared in h (when it is not yet): returns its slot. */
const ts_slot *ts_hands_output(const char *kg, ts_hands *h, const char *name);

/* Compiles src with NVRTC and kiln's options for arch; returns the log (caller frees; "" when
 * NVRTC said nothing) and whether it compiled. */
char *ts_nvrtc_log(const char *src, const char *name, const char *arch, bool *compiled);
/* Compiles src with NVRTC and kiln's options for arch (NULL: sm_90a) and fails the test on any
 * error or warning, printing the source to stderr (Check's messages are short). */
void ts_nvrtc_clean(const char *src, const char *name, const char *arch);
/* Parses kg and compiles it for arch into cache_dir (sources only when skip_nvrtc); the caller
 * frees the program, *g and *ctx. */
kiln_program *ts_compile(const char *kg, const char *arch, const char *cache_dir, int skip_nvrtc, kiln_ctx **ctx,
                         kiln_graph **g);
/* For sm_90a and sm_80: compiles kg (ts_compile, then NVRTC per kernel), checks that the sources
 * of the kernels whose node `pick` selects contain `want` (case ci: else they go to stderr) and
 * no #include, and that every launched kernel compiles without a warning. */
void ts_kernels_want(const char *kg, const char *cache_dir, bool (*pick)(const ir_node *n), const char *want, int ci);
/* Frees what ts_compile returned. */
void ts_compiled_free(kiln_program *p, kiln_graph *g, kiln_ctx *ctx);
/* Asserts that kg parses and its graph builds. */
void ts_builds(const char *kg);
/* Compiles kg twice for sm_90a into cache_dir (sources only) and asserts that the two programs
 * have the same kernels, source for source (codegen is deterministic); then check (unless NULL)
 * looks at the program. */
void ts_compile_twice(const char *kg, const char *cache_dir, void (*check)(const kiln_program *p));
/* The step of p named kernel (loop case i; the names go to stderr when there is none), after
 * asserting that p has `steps` steps and that step's source contains want. */
int ts_named_step(const kiln_program *p, const char *kernel, int steps, const char *want, int i);
/* A graph of every variant of an op family: compiles kg (unfused with no_fuse) for sm_80 through
 * kiln_compile (NVRTC and a new cache) and for sm_90a (sources only), asserts they have the same
 * number of kernels, more than min_kernels, with the same sources, and calls each(p, i) on every
 * kernel i of the sm_90a program (kiln's default target). */
void ts_spread_compile(const char *kg, int no_fuse, int min_kernels, void (*each)(const kiln_program *p, int i));
/* Compiles kg for arch (sources), checks that every generated kernel compiles with NVRTC without
 * a warning, and sets counts[j] to the number of kernels whose source contains needles[j]. */
void ts_kernels_clean(const char *kg, const char *arch, const char *cache_dir, const char *const *needles, int *counts,
                      int n);

/* Loop case i of a table of one-kernel graphs (tests/test_ops_*.c): kg compiles for sm_90a and
 * sm_80 (in a new cache) to one kernel whose source contains want, the same source for both,
 * and that source compiles with NVRTC (as `name`) without a warning. */
void ts_one_kernel_case(int i, const char *kg, const char *want, const char *name);

/* Hand-built IR for codegen tests (tests/test_codegen.c, tests/test_ew_vector.c). A program of
 * nnodes zeroed nodes and room for 4 * IR_MAX_IN buffers; ts_prog_free frees it. */
ir_prog *ts_prog_new(int nnodes);
/* A `kiln serve` started by ts_serve_start. */
typedef struct {
    pid_t pid;
    int   port;
} ts_server;
/* Starts kiln serve MODEL --port 0 --alias tiny [--cpu] ARGS (NULL-terminated; its stdout read up
 * to the "listening" line, for the port; that line in line_out[512] when non-NULL). */
ts_server ts_serve_start(const char *model, const char *const *args, bool cpu, char *line_out);
/* SIGTERM, then asserts exit status 0. */
void      ts_serve_stop(ts_server s);

/* kg parsed, built and lowered with every pass (ts_graph_free(*g, *ctx) after the program). */
ir_prog *ts_lowered(const char *kg, kiln_ctx **ctx, kiln_graph **g);
/* The live node that implements graph node `name` (aborts the test when none does). */
int      ts_node_named(const ir_prog *p, const char *name);
/* Asserts that ir_verify(p) fails with a message containing want. */
void     ts_expect_invalid(const ir_prog *p, const char *want);
void     ts_prog_free(ir_prog *p);
/* Registers r's buffer (named name) as a temporary large enough for r. */
void     ts_use_buf(ir_prog *p, const ir_ref *r, const char *name);
/* A contiguous ref of buffer buf; a ref of the given extents, strides and offset. */
ir_ref   ts_ref4(int buf, kiln_type t, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3);
ir_ref   ts_strided(int buf, kiln_type t, const int64_t ne[4], const int64_t st[4], int64_t offs);
/* Sets node i of p to an elementwise node of those operands and instructions, its buffers
 * named SECRETNAME_* (a name that must never reach a kernel). */
void     ts_ew_node(ir_prog *p, int i, ir_ref dst, int nin, const ir_ref *in, int ninstr, const ir_instr *ins);
/* Generates node 0 of p with a fresh Lua state. */
void     ts_gen(ir_prog *p, cg_kernel *k);
/* k's source names no graph buffer, compiles with NVRTC without a warning, and compiles to a
 * cubin for sm_90a and sm_80. */
void     ts_kernel_compiles(const cg_kernel *k);

/* Asserts that parsing kg (as bad.kg) fails with code and a message holding every one of
 * needles (a list ended by NULL). */
void ts_parse_error(const char *kg, kiln_code code, const char *const *needles);
/* st is an error of code `code` whose message contains `needle`; frees it. */
void ts_expect_status(kiln_status st, kiln_code code, const char *needle);
#define TS_NEEDLES(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Evaluates kg with the CPU reference twice on the same random inputs (by input name): over IR
 * after every fusion pass but those in skip (NULL: none), and over unfused IR. Returns the
 * largest difference of any output element, relative where |ref| > 1 (0: identical; inf on a
 * NaN). *live gets the fused program's kernel count, *ir_text (caller frees) its ir_print. */
/* Compiles graph text kg with `kiln compile --dim DIM=V` for V = v1 and v2 and asserts that the
 * dumped kernel sources are byte-identical (a symbolic dim's value never enters a kernel);
 * `what` labels failures. */
void ts_sources_identical(const char *kg, const char *dim, int v1, int v2, const char *what);

/* "case I" in a static buffer, valid until the next call: the label of loop test I. */
const char *ts_case_label(int i);
/* Symbolic-dim template checks (tests/test_dyn_*.c). Compiles kg for sm_90a and sm_80 into
 * cache_dir without NVRTC and checks the kernels whose node mine() accepts (with TS_LAUNCH_ONLY,
 * of those only CG_LAUNCH steps take the kdims and NVRTC checks): there is at least one ("no
 * `family` kernel"), some source contains want, each takes the run-time extents (kdims) as its
 * last parameter (with TS_KDIMS_IF_USED, only when it mentions kdims at all), and each compiles
 * with NVRTC without a warning. `what` labels failures. */
enum { TS_LAUNCH_ONLY = 1, TS_KDIMS_IF_USED = 2 };
/* The fusion tests' check: kg's kernels compile cleanly (ts_kernels_clean) for sm_90a and sm_80,
 * exactly one source holds needles[0] (the fused kernel) and none needles[1..n) (kernels the
 * fusion removed). */
void ts_kernels_fused(const char *kg, const char *cache_dir, const char *const *needles, int n);
void ts_dyn_kernels(const char *kg, const char *want, const char *cache_dir, bool (*mine)(const ir_node *), int flags,
                    const char *family, const char *what);
/* Asserts that kg is refused: it parses, its graph builds, and kiln_compile (sm_90a, cache_dir,
 * no NVRTC) fails; with parse_may_refuse a kiln_parse error counts as the refusal too. Returns
 * the error message for the caller's checks (caller frees). `what` labels failures. */
char *ts_refused_msg(const char *kg, const char *cache_dir, int parse_may_refuse, const char *what);

double ts_fusion_compare(const char *kg, const char *skip, int *live, char **ir_text);
/* ts_fusion_compare of kg (passes but skip), asserting: the IR text holds `want` (unless NULL)
 * and not `absent` (unless NULL), it has `kernels` live kernels (unless -1), and the outputs
 * are bit-identical to the unfused graph's. */
void   ts_expect_fusion(const char *kg, const char *skip, const char *want, const char *absent, int kernels);

/* A log callback (kiln_compile_opts.log, the cache's log) that counts the lines it is given and
 * keeps them: all of them (up to 8 KB), and the last one whole. */
typedef struct {
    int  lines;
    char all[8192], last[8192];
} ts_log;
void ts_log_line(void *user, const char *line);

/* Deterministic random numbers (splitmix64) for test data. */
uint64_t ts_rng_next(uint64_t *s);
/* A row of logits for the samplers' tests, of kind 0: spread; 1: few distinct values (ties); 2:
 * spread with -inf, NaN, +inf, -0 and +0 sprinkled; 3: no candidate (NaN and -inf only, or NaN
 * only); 4: one dominant logit. */
void     ts_logit_row(uint64_t *r, float *x, int64_t n, int kind);
/* Up to max_cps random code points of many scripts and classes, as UTF-8 into out (4 bytes a
 * code point at most); returns the bytes written. */
size_t ts_random_text(uint64_t *r, uint8_t *out, size_t max_cps);
/* A vocabulary like a real one (llama-bpe): n_tokens - 256 normal tokens (the byte tokens, then
 * each a token and a byte merged), 256 reserved control tokens, and n_merges merges: those that
 * make the tokens, then more that split a random token in two (as Llama 3 has 280k merges for
 * 128k tokens). spec points into the rest. Deterministic. */
typedef struct {
    kiln_tokenizer_spec spec;
    char              **toks, **merges;
    int32_t            *types;
    int64_t             n_tokens, n_merges;
} ts_vocab;
void ts_big_vocab(int64_t n_tokens, int64_t n_merges, ts_vocab *v);
void ts_vocab_free(ts_vocab *v);
/* About cap bytes (malloc'd, *len exact) of the synthetic English text and random text of many
 * scripts, alternating at random. */
uint8_t *ts_big_text(size_t cap, size_t *len);

#endif
