/* kiln: the command-line driver. */
#include "kiln.h"

#include "base/base.h"
#include "runtime/runtime.h"
#include "tools/cmd_cache.h"
#include "tools/cmd_bench.h"
#include "tools/cmd_gen.h"
#include "tools/cmd_model.h"
#include "tools/flag.h"
#include "tools/graph_file.h"
#include "tools/progress.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { EXIT_OK = 0, EXIT_ERR = 1, EXIT_USAGE = 2, EXIT_NO_GPU = 3 };

static const char *usage_text =
    "usage: kiln COMMAND [OPTIONS] GRAPH\n"
    "\n"
    "kiln compiles ggml-style compute graphs (.kg text, see docs/graph-format.md) into\n"
    "specialized CUDA kernels, caches them, and runs them as one CUDA graph.\n"
    "\n"
    "commands:\n"
    "  compile GRAPH   generate and compile every kernel (NVRTC; no GPU needed) into the cache;\n"
    "                  with -o FILE.kiln, write an AOT bundle that runs without NVRTC\n"
    "  run GRAPH       compile what is missing (JIT, cached), then run on the GPU: inputs random\n"
    "                  (--seed) or from files (--input); prints a checksum of each output and\n"
    "                  the timing. 'kiln run --bundle FILE.kiln' runs a bundle instead\n"
    "  run MODEL.gguf --tokens 1,2,3 -n 64   generate greedily with a GGUF model (llama, qwen2,\n"
    "                  qwen3, qwen3moe); prints the ids and prefill/decode speed ('kiln help run')\n"
    "  inspect GRAPH   print the IR after passes, the memory plan and the kernel list;\n"
    "  inspect FILE.kiln  verify a bundle (checksum, signature, programs) and describe it\n"
    "  cache SUB       the cache: ls, stats, clear, verify, explain GRAPH ('kiln help cache')\n"
    "  ops             list every supported op with its kind and accepted types\n"
    "  gen-graph       write a model's whole graph from a preset (--arch, --preset) as .kg\n"
    "  gen-model       write a GGUF model of a preset with random weights (-o FILE.gguf)\n"
    "  bench           per-op roofline, model decode/prefill and compile times beside PyTorch\n"
    "                  on this GPU ('kiln help bench'; make bench)\n"
    "\n"
    "GRAPH is a .kg file or, for compile and inspect, a GGUF model (its whole graph, built from\n"
    "its hyperparameters; --n-ctx N, at most the model's training context, and --n-batch N, at\n"
    "most n_ctx, size the cache and the batch).\n"
    "  help [COMMAND]  this text, or a command's options\n"
    "\n"
    "Symbolic dims (\"dim n_kv <= 4096\" in the graph) are compiled once for every value; give\n"
    "values with --dim NAME=VALUE (default: the maximum).\n"
    "\n"
    "options: --version, --help. Environment: KILN_CACHE_DIR (the cache, default\n"
    "$XDG_CACHE_HOME/kiln or ~/.cache/kiln), KILN_CACHE=on|off|readonly|refresh (cache policy),\n"
    "KILN_CACHE_MAX=SIZE (default 2G; least recently used entries go first), KILN_JOBS=N\n"
    "(compile threads, default all CPUs), KILN_DUMP=DIR (like --dump-cu), KILN_TEMPLATE_DIR\n"
    "(load templates from a directory), KILN_CUDA_GRAPHS=0 (plain launches), KILN_PDL=0 (no\n"
    "programmatic dependent launch), KILN_CHAIN=0 (decode one step at a time: each token read on\n"
    "the host before the next step), KILN_PROFILE=1 (time per kernel, printed at exit).\n"
    "exit status: 0 success, 1 error, 2 bad usage, 3 no CUDA driver or GPU.\n";

static const char *compile_help =
    "usage: kiln compile GRAPH [--arch sm_90a[,sm_80...]] [--dump-cu DIR] [-o FILE.kiln]\n"
    "                          [--no-fuse[=NAME,...]] [--cache-dir DIR] [--no-cache] [--jobs N]\n"
    "                          [--dim NAME=VALUE]...\n"
    "  --arch LIST     target GPU architectures, comma-separated (default sm_90a; e.g. sm_80):\n"
    "                  sm_XY[a|f] or compute_XY[a|f] with XY >= 80 (kiln needs Ampere or newer)\n"
    "  --dump-cu DIR   write each kernel as DIR/NNN_name_KEY8.cu (a header comment gives the graph\n"
    "                  nodes, fusion, static shapes, launch and key) and DIR/program.txt (IR after\n"
    "                  passes, memory plan, launches); the same graph gives byte-identical files\n"
    "  -o FILE.kiln    write an AOT bundle: the graph, a program per arch (cubins) plus PTX for\n"
    "                  later GPUs, signed with the kiln version that built it ('kiln run --bundle')\n"
    "  --jobs N        compile threads, 1 .. 1024 (default $KILN_JOBS, else every CPU)\n"
    "  --no-fuse       disable every fusion pass\n"
    "  --no-fuse=NAME[,NAME]  disable the named passes only (listed below; may repeat)\n"
    "  --cache-dir DIR kernel cache directory (default: see 'kiln help')\n"
    "  --no-cache      neither read nor write the kernel cache\n"
    "  --dim NAME=V    a value for symbolic dim NAME, 1 .. its maximum; the program\n"
    "                  does not depend on it (kernels read symbolic dims at run time), so\n"
    "                  compiles that differ only in V share every kernel. A dim declared with\n"
    "                  'specialize V' also gets a program of its own for that value.\n";

static const char *run_help =
    "usage: kiln run GRAPH|--bundle FILE.kiln [--seed N] [--input NAME=FILE]... [--output NAME=FILE]...\n"
    "                      [--iters N] [--no-cuda-graph] [--check] [--stats] [--dim NAME=V]...\n"
    "                      [compile options]\n"
    "  --bundle FILE.kiln   run a bundle from 'kiln compile -o' (no NVRTC, no cache): the\n"
    "                       program for this GPU's arch, else its PTX; refused when neither fits\n"
    "  --seed N             seed for random inputs, weights and states, 0 .. 2^64-1 (default\n"
    "                       1; weight matrices are scaled by 1/sqrt(ne0), as models are\n"
    "                       initialized)\n"
    "  --input NAME=FILE    raw little-endian contents of input/weight NAME (its type, contiguous)\n"
    "  --output NAME=FILE   write output NAME's raw contents to FILE\n"
    "  --iters N            runs to time, 1 .. 1000000 (default 20); the first captures the\n"
    "                       CUDA graph\n"
    "  --no-cuda-graph      launch kernels one by one instead of replaying a CUDA graph\n"
    "  --check              also evaluate on the CPU reference and print each output's and\n"
    "                       state's NMSE (the reference runs the graph with the --dim values)\n"
    "  --stats              print the runtime counters: kernels compiled, CUDA graph captures,\n"
    "                       replays, plain runs, and the host time per run\n"
    "  --dim NAME=V         run with symbolic dim NAME = V (1 .. its maximum; default the maximum);\n"
    "                       inputs and outputs have the shapes at these values\n"
    "  compile options: --arch (one; default: this GPU's), --dump-cu, --no-fuse, --cache-dir,\n"
    "                  --no-cache, --jobs (see compile)\n";

static const char *inspect_help =
    "usage: kiln inspect GRAPH [--no-fuse[=NAME,...]]\n"
    "       kiln inspect FILE.kiln\n"
    "  prints every fusion applied, one per line (\"fused NAME: node, node, ...\"), the IR after\n"
    "  passes (kernels, fused graph nodes, layouts), the memory plan and the generated kernels'\n"
    "  names, launch configs and keys. Needs neither NVRTC nor a GPU.\n"
    "  A bundle is verified (checksum, signature, each program against the graph) and described:\n"
    "  what built it, its targets, its graph; exit 1 when it is damaged or foreign.\n";

static const char *ops_help =
    "usage: kiln ops\n"
    "  lists every op kiln compiles, one per line: its name in .kg, its kind (view, unary,\n"
    "  binary, glu, copy or kernel), the tensor types it accepts and how a .kg line calls it,\n"
    "  e.g. \"permute  view  f32 f16 bf16 i32 i64  permute(a, ax0, ax1, ax2, ax3)\". An op not\n"
    "  listed is refused by the parser, by name. Needs neither NVRTC nor a GPU.\n";

static const char *help_help =
    "usage: kiln help [COMMAND]\n"
    "  without COMMAND, what kiln is and its commands; with one, that command's options:\n"
    "  compile, run, inspect, cache, ops, gen-graph, gen-model, bench, help.\n"
    "  'kiln COMMAND --help' prints the same.\n";

#define MAX_FILES 64

typedef struct {
    const char *cmd, *graph, *arch, *dump, *out, *cache_dir, *bundle;
    int jobs;
    char no_fuse_passes[256]; /* --no-fuse=NAME[,NAME]: the names, comma-separated */
    bool no_fuse, no_cache, no_graph, check;
    uint64_t seed;
    int iters;
    int64_t n_ctx, n_batch; /* a GGUF model's graph */
    const char *inputs[MAX_FILES], *outputs[MAX_FILES];
    int ninputs, noutputs;
    bool stats;
    int ndims;
    char dim_name[KILN_MAX_SYMS][64];
    const char *dim_names[KILN_MAX_SYMS];
    int64_t dim_val[KILN_MAX_SYMS];
} cli;

static int fail(kiln_status st) {
    int code = kiln_status_code(st) == KILN_ERR_NO_GPU ? EXIT_NO_GPU : EXIT_ERR;
    fprintf(stderr, "kiln: %s\n", kiln_status_msg(st));
    kiln_status_free(st);
    return code;
}

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "kiln: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see 'kiln help')\n");
    return EXIT_USAGE;
}

/* --iters' bound: a timing per run is kept (8 MB at most), and a million runs is already hours. */
#define MAX_ITERS 1000000

/* Help text, and for the commands that compile, the fusion passes --no-fuse=NAME knows. */
static void print_help(const char *cmd, const char *text) {
    fputs(text, stdout);
    if (cmd && !strcmp(cmd, "run")) printf("\n%s", kiln_run_model_help);
    if (!cmd || !strcmp(cmd, "help")) return;
    printf("fusion passes (--no-fuse=NAME):\n");
    const char *what, *name;
    for (int i = 0; (name = kiln_fusion_pass(i, &what)); i++) printf("  %-14s %s\n", name, what);
}

static const char *help_for(const char *cmd) {
    if (!cmd) return usage_text;
    if (!strcmp(cmd, "compile")) return compile_help;
    if (!strcmp(cmd, "run")) return run_help;
    if (!strcmp(cmd, "inspect")) return inspect_help;
    return NULL;
}

/* kiln help [COMMAND]: every command's help, wherever its text lives. */
static int help(const char *cmd) {
    if (cmd && !strcmp(cmd, "cache")) return fputs(kiln_cache_help, stdout) < 0;
    if (cmd && !strcmp(cmd, "bench")) return fputs(kiln_bench_help(), stdout) < 0;
    if (cmd && !strcmp(cmd, "ops")) return fputs(ops_help, stdout) < 0;
    if (cmd && (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")))
        return fputs(help_help, stdout) < 0;
    char *argv[] = {"help", NULL};
    if (cmd && !strcmp(cmd, "gen-graph")) return kiln_cmd_gen_graph(1, argv);
    if (cmd && !strcmp(cmd, "gen-model")) return kiln_cmd_gen_model(1, argv);
    const char *h = help_for(cmd);
    if (!h) return usage_error("no help for unknown command '%s'", cmd);
    print_help(cmd, h);
    return EXIT_OK;
}

/* kiln ops: the op table (kiln_describe_ops). */
static int cmd_ops(int argc, char **argv) {
    if (argc > 2 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) return help("ops");
    if (argc > 2) {
        kt_flag_usage("ops", "unexpected argument '%s'", argv[2]);
        return EXIT_USAGE;
    }
    char *text;
    kiln_status st = kiln_describe_ops(&text);
    if (st) return fail(st);
    fputs(text, stdout);
    free(text);
    return EXIT_OK;
}

/* Options may stand before or after the graph argument. */
static int parse_args(int argc, char **argv, cli *c) {
    c->cmd = argv[1];
    c->seed = 1;
    c->iters = 20;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDS_VALUE() \
    if (!v) return usage_error("option %s needs a value", a); \
    i++
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            print_help(c->cmd, help_for(c->cmd));
            exit(EXIT_OK);
        } else if (!strcmp(a, "--arch")) {
            NEEDS_VALUE();
            c->arch = v;
            if (!kt_flag_arch(c->cmd, a, v, !strcmp(c->cmd, "compile"))) return EXIT_USAGE;
        } else if (!strcmp(a, "--dump-cu")) { NEEDS_VALUE(); c->dump = v;
        } else if (!strcmp(a, "-o")) { NEEDS_VALUE(); c->out = v;
        } else if (!strcmp(a, "--cache-dir")) { NEEDS_VALUE(); c->cache_dir = v;
        } else if (!strcmp(a, "--bundle")) { NEEDS_VALUE(); c->bundle = v;
        } else if (!strcmp(a, "--jobs")) {
            NEEDS_VALUE();
            if (!kt_flag_int32(c->cmd, a, v, 1, KT_FLAG_MAX_JOBS, &c->jobs)) return EXIT_USAGE;
        } else if (!strcmp(a, "--no-fuse")) { c->no_fuse = true;
        } else if (!strncmp(a, "--no-fuse=", 10)) {
            if (!kt_flag_no_fuse(c->cmd, a, c->no_fuse_passes, sizeof c->no_fuse_passes)) return EXIT_USAGE;
        } else if (!strcmp(a, "--no-cache")) { c->no_cache = true;
        } else if (!strcmp(a, "--no-cuda-graph")) { c->no_graph = true;
        } else if (!strcmp(a, "--check")) { c->check = true;
        } else if (!strcmp(a, "--stats")) { c->stats = true;
        } else if (!strcmp(a, "--dim")) {
            NEEDS_VALUE();
            const char *eq = strchr(v, '=');
            char        flag[80];
            if (!eq || eq == v || (size_t)(eq - v) >= sizeof c->dim_name[0])
                return usage_error("expected NAME=VALUE after --dim, got '%s'", v);
            if (c->ndims == KILN_MAX_SYMS) return usage_error("too many --dim options (at most 8): '%s'", v);
            snprintf(flag, sizeof flag, "--dim %.*s=", (int)(eq - v), v);
            /* the dim's own maximum is checked when the graph is bound (bind_dims) */
            if (!kt_flag_int(c->cmd, flag, eq + 1, 1, INT64_MAX, &c->dim_val[c->ndims])) return EXIT_USAGE;
            snprintf(c->dim_name[c->ndims], sizeof c->dim_name[0], "%.*s", (int)(eq - v), v);
            c->dim_names[c->ndims] = c->dim_name[c->ndims];
            c->ndims++;
        } else if (!strcmp(a, "--seed")) {
            NEEDS_VALUE();
            if (!kt_flag_uint(c->cmd, a, v, UINT64_MAX, &c->seed)) return EXIT_USAGE;
        } else if (!strcmp(a, "--n-ctx") || !strcmp(a, "--n-batch")) {
            NEEDS_VALUE();
            if (!kt_flag_int(c->cmd, a, v, 1, KT_FLAG_MAX_CTX, !strcmp(a, "--n-ctx") ? &c->n_ctx : &c->n_batch))
                return EXIT_USAGE;
        } else if (!strcmp(a, "--iters")) {
            NEEDS_VALUE();
            if (!kt_flag_int32(c->cmd, a, v, 1, MAX_ITERS, &c->iters)) return EXIT_USAGE;
        } else if (!strcmp(a, "--input") || !strcmp(a, "--output")) {
            NEEDS_VALUE();
            bool in = !strcmp(a, "--input");
            if (!strchr(v, '=')) return usage_error("expected NAME=FILE after --input/--output, got '%s'", v);
            if ((in ? c->ninputs : c->noutputs) == MAX_FILES) return usage_error("too many %s options", a);
            if (in) c->inputs[c->ninputs++] = v;
            else c->outputs[c->noutputs++] = v;
        } else if (a[0] == '-' && a[1]) {
            return usage_error("unknown option '%s'", a);
        } else if (c->graph) {
            return usage_error("more than one graph given ('%s')", a);
        } else {
            c->graph = a;
        }
#undef NEEDS_VALUE
    }
    if (c->bundle && strcmp(c->cmd, "run") != 0) return usage_error("--bundle: only 'kiln run' takes a bundle (%s)", c->bundle);
    if (c->bundle && c->graph) return usage_error("give a graph or --bundle, not both ('%s')", c->graph);
    if (!c->graph && !c->bundle) return usage_error("%s: no graph file given", c->cmd);
    return -1;
}

/* The graph of c->graph (-1), else the exit status, the error printed (kt_graph_load). */
static int build(const cli *c, kiln_ctx **ctx, kiln_graph **g) {
    return kt_graph_load(c->cmd, c->graph, c->n_ctx, c->n_batch, ctx, g);
}

/* The graph at the --dim values (every dim given is fixed; checked against its maximum): what
 * a run computes, so the shapes of its inputs and outputs and its CPU reference. */
static kiln_status bind_dims(const cli *c, const kiln_ctx *ctx, kiln_ctx **bctx, kiln_graph **bg) {
    *bg = NULL;
    kiln_status st = kiln_ctx_bind(ctx, c->ndims, c->dim_names, c->dim_val, bctx);
    if (st) return kb_error(kiln_status_code(st), "--dim: %s", kiln_status_msg(st));
    return kiln_graph_new(*bctx, bg);
}

/* "dims: n_kv = 37 (max 4096, symbolic), n_tokens = 512 (max 512)" */
static void print_dims(const cli *c, const kiln_ctx *ctx) {
    int n = kiln_ctx_dim_count(ctx);
    if (!n) return;
    printf("dims:");
    for (int i = 0; i < n; i++) {
        const char *name = kiln_ctx_dim_name(ctx, i);
        int64_t v = kiln_ctx_dim_max(ctx, i);
        for (int k = 0; k < c->ndims; k++)
            if (!strcmp(c->dim_names[k], name)) v = c->dim_val[k];
        printf("%s %s = %lld (max %lld)", i ? "," : "", name, (long long)v, (long long)kiln_ctx_dim_max(ctx, i));
    }
    printf("\n");
}

static kt_progress g_progress;

static kiln_compile_opts compile_opts(const cli *c, const char *arch) {
    kiln_compile_opts o = {0};
    g_progress.tty = isatty(2);
    o.progress = kt_progress_count;
    o.progress_user = &g_progress;
    o.jobs = c->jobs;
    o.arch = c->arch ? c->arch : arch;
    o.dump_dir = c->dump;
    o.cache_dir = c->cache_dir;
    o.cache_mode = c->no_cache ? KILN_CACHE_OFF : KILN_CACHE_ON;
    o.no_fuse = c->no_fuse;
    o.no_fuse_passes = c->no_fuse_passes[0] ? c->no_fuse_passes : NULL;
    return o;
}

static void print_compile_line(const kiln_program *p) {
    kiln_compile_stats s;
    kiln_program_stats(p, &s);
    if (s.program_cached)
        printf("loaded %d kernels (%d distinct) from the program cache in %.0f ms\n", s.kernels, s.distinct, s.ms);
    else
        printf("compiled %d kernels (%d distinct: %d new, %d from cache) in %.0f ms\n", s.kernels, s.distinct,
               s.compiled, s.cached, s.ms);
}

#define MAX_ARCHS 8

/* "sm_90a,sm_80" into archs (pointing into buf). */
static kiln_status split_archs(const char *list, char buf[256], const char *archs[MAX_ARCHS], int *n) {
    *n = 0;
    if ((size_t)snprintf(buf, 256, "%s", list) >= 256) return kb_error(KILN_ERR_INVALID, "--arch: list too long");
    for (char *save = NULL, *a = strtok_r(buf, ",", &save); a; a = strtok_r(NULL, ",", &save)) {
        if (*n == MAX_ARCHS) return kb_error(KILN_ERR_INVALID, "--arch: at most %d architectures", MAX_ARCHS);
        archs[(*n)++] = a;
    }
    if (!*n) return kb_error(KILN_ERR_INVALID, "--arch: no architecture given");
    return NULL;
}

static kiln_status write_bundle(const cli *c, const kiln_graph *g, kiln_compile_opts o, int narchs, const char **archs) {
    double      t0 = kb_now_ms();
    kiln_status st = kiln_bundle_write(g, &o, narchs, archs, c->out);
    if (st) return st;
    printf("wrote bundle %s for", c->out);
    for (int i = 0; i < narchs; i++) printf(" %s", archs[i]);
    printf(" (cubins, plus PTX of each) in %.0f ms\n", kb_now_ms() - t0);
    return NULL;
}

static int cmd_compile(const cli *c) {
    kiln_ctx *ctx;
    kiln_graph *g;
    kiln_program *p = NULL;
    int rc = build(c, &ctx, &g);
    if (rc >= 0) return rc;
    kiln_status st = NULL;
    kiln_compile_opts o = compile_opts(c, NULL);
    kiln_ctx *bctx = NULL;
    kiln_graph *bg = NULL;
    if (!st && c->ndims) st = bind_dims(c, ctx, &bctx, &bg); /* checks the values only */
    kiln_graph_free(bg);
    kiln_ctx_free(bctx);
    if (!st) print_dims(c, ctx);
    char        abuf[256];
    const char *archs[MAX_ARCHS];
    int         narchs = 0;
    if (!st) st = split_archs(c->arch ? c->arch : "sm_90a", abuf, archs, &narchs);
    for (int i = 0; !st && i < narchs; i++) {
        o.arch = archs[i];
        o.dump_dir = i == 0 ? c->dump : NULL; /* dumps of the first arch */
        kiln_program_free(p);
        p = NULL;
        if (!(st = kiln_compile(g, &o, &p))) {
            if (narchs > 1) printf("%s: ", archs[i]);
            print_compile_line(p);
        }
    }
    if (!st && c->dump) printf("wrote %d kernel sources and program.txt to %s\n", kiln_program_kernel_count(p), c->dump);
    o.dump_dir = NULL;
    if (!st && c->out) st = write_bundle(c, g, o, narchs, archs);
    kiln_program_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
    return st ? fail(st) : EXIT_OK;
}

static int inspect_bundle(const char *path) {
    kiln_bundle *b = NULL;
    char        *text = NULL;
    kiln_status  st = kiln_bundle_open(path, &b);
    if (!st) st = kiln_bundle_describe(b, &text);
    if (!st) fputs(text, stdout);
    free(text);
    kiln_bundle_free(b);
    return st ? fail(st) : EXIT_OK;
}

static int cmd_inspect(const cli *c) {
    kt_graph_kind kind;
    kiln_status st = kt_graph_kind_of(c->graph, &kind);
    if (st) return fail(st);
    if (kind == KT_GRAPH_BUNDLE) return inspect_bundle(c->graph);
    kiln_ctx *ctx;
    kiln_graph *g;
    kiln_program *p = NULL;
    int rc = build(c, &ctx, &g);
    if (rc >= 0) return rc;
    kiln_compile_opts o = compile_opts(c, NULL);
    o.skip_nvrtc = 1;
    o.cache_mode = KILN_CACHE_OFF;
    if (!st) st = kiln_compile(g, &o, &p);
    char *text = NULL;
    if (!st) st = kiln_program_describe(p, &text);
    if (!st) fputs(text, stdout);
    free(text);
    kiln_program_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
    return st ? fail(st) : EXIT_OK;
}

/* ---- run ---------------------------------------------------------------------------------- */

typedef struct {
    const kiln_graph *g;
    const cli        *c;
    void            **host;   /* per graph node: host data of leaves */
    kiln_status       err;
} run_data;

static bool is_leaf_named(const kiln_tensor *t, const char *name) {
    kiln_role r = kiln_tensor_role(t);
    return (r == KILN_ROLE_INPUT || r == KILN_ROLE_WEIGHT || r == KILN_ROLE_STATE) &&
           !strcmp(kiln_tensor_name(t), name);
}

static const char *file_for(const char *const *list, int n, const char *name) {
    size_t len = strlen(name);
    for (int i = 0; i < n; i++)
        if (!strncmp(list[i], name, len) && list[i][len] == '=') return list[i] + len + 1;
    return NULL;
}

/* A random weight matrix (ne1 > 1) is scaled by 1/sqrt(ne0), as models are initialized, so
 * that whole layers stay in range: with weights in [-1, 1) attention logits reach thousands. */
static void scale_matrix(const kiln_tensor *t, void *data) {
    kiln_type ty = kiln_tensor_type(t);
    if (kiln_tensor_role(t) != KILN_ROLE_WEIGHT || kiln_tensor_ne(t, 1) == 1 ||
        (ty != KILN_F32 && ty != KILN_F16 && ty != KILN_BF16))
        return;
    float s = 1.0f / sqrtf((float)kiln_tensor_ne(t, 0));
    for (int64_t j = 0; j < kiln_tensor_nelements(t); j++) kb_store_f32(data, ty, j, s * kb_load_f32(data, ty, j));
}

/* Host contents of every leaf: from --input files, else random from the seed. */
static kiln_status make_leaves(run_data *d) {
    const kiln_graph *g = d->g;
    d->host = calloc((size_t)kiln_graph_size(g) + 1, sizeof *d->host);
    if (!d->host) return kb_oom();
    for (int i = 0; i < d->c->ninputs; i++) {
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(strchr(d->c->inputs[i], '=') - d->c->inputs[i]), d->c->inputs[i]);
        bool found = false;
        for (int j = 0; j < kiln_graph_size(g); j++)
            found |= is_leaf_named(kiln_graph_node(g, j), name);
        if (!found) return kb_error(KILN_ERR_NOT_FOUND, "--input %s: the graph has no input or weight '%s'", d->c->inputs[i], name);
    }
    for (int i = 0; i < kiln_graph_size(g); i++) {
        kiln_tensor *t = kiln_graph_node(g, i);
        kiln_role r = kiln_tensor_role(t);
        if (r != KILN_ROLE_INPUT && r != KILN_ROLE_WEIGHT && r != KILN_ROLE_STATE) continue;
        size_t bytes = (size_t)kiln_tensor_nelements(t) * kiln_type_size(kiln_tensor_type(t));
        const char *file = file_for(d->c->inputs, d->c->ninputs, kiln_tensor_name(t));
        if (file) {
            char *data;
            size_t len;
            kiln_status st = kb_read_file(file, &data, &len);
            if (st) return st;
            if (len != bytes) {
                free(data);
                return kb_error(KILN_ERR_INVALID, "%s: %zu bytes, but %s '%s' needs %zu (%lld %s values)", file, len,
                                r == KILN_ROLE_INPUT ? "input" : r == KILN_ROLE_WEIGHT ? "weight" : "state",
                                kiln_tensor_name(t), bytes,
                                (long long)kiln_tensor_nelements(t), kiln_type_name(kiln_tensor_type(t)));
            }
            d->host[i] = data;
        } else {
            d->host[i] = malloc(bytes ? bytes : 1);
            if (!d->host[i]) return kb_oom();
            kb_fill_random(d->host[i], kiln_tensor_type(t), kiln_tensor_nelements(t), d->c->seed * 1000003u + (uint64_t)i);
            scale_matrix(t, d->host[i]);
        }
    }
    return NULL;
}

/* One output compared with the CPU reference: the reference evaluates the whole graph and
 * hands over every output; put keeps the one named. */
typedef struct {
    run_data   *d;
    const char *name;
    const void *gpu;
    double      nmse;
} ref_check;

static const void *ref_get(void *user, const char *name, kiln_type type, int64_t n) {
    run_data *d = ((ref_check *)user)->d;
    for (int i = 0; i < kiln_graph_size(d->g); i++)
        if (d->host[i] && !strcmp(kiln_tensor_name(kiln_graph_node(d->g, i)), name)) return d->host[i];
    return NULL;
}

static void ref_put(void *user, const char *name, kiln_type type, int64_t n, const void *data) {
    ref_check *rc = user;
    if (strcmp(rc->name, name) != 0) return;
    rc->nmse = kb_nmse(data, rc->gpu, type, n);
}

static int by_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static kiln_status upload(run_data *d, kiln_session *s) {
    for (int i = 0; i < kiln_graph_size(d->g); i++) {
        if (!d->host[i]) continue;
        kiln_tensor *t = kiln_graph_node(d->g, i);
        size_t bytes = (size_t)kiln_tensor_nelements(t) * kiln_type_size(kiln_tensor_type(t));
        kiln_status st = kiln_session_set(s, kiln_tensor_name(t), d->host[i], bytes);
        if (st) return st;
    }
    return NULL;
}

static kiln_status time_runs(const cli *c, kiln_session *s, const kiln_program *p) {
    double *ms = calloc((size_t)c->iters, sizeof *ms);
    if (!ms) return kb_oom();
    kiln_status st = NULL;
    for (int i = 0; i < c->iters && !st; i++) {
        st = kiln_session_run(s);
        ms[i] = kiln_session_last_ms(s);
    }
    kiln_session_stats ss;
    kiln_session_get_stats(s, &ss);
    bool plain = c->no_graph || ss.plain_runs > 0; /* a run-time library GEMM launches plainly */
    if (!st) {
        printf("run 1: %.3f ms%s\n", ms[0], plain ? " (plain launches)" : " (includes CUDA graph capture)");
        if (c->iters > 1) {
            qsort(ms + 1, (size_t)c->iters - 1, sizeof *ms, by_double);
            double med = ms[1 + (c->iters - 1) / 2];
            printf("runs 2..%d: median %.3f ms (GPU time, %s)\n", c->iters, med,
                   plain ? "plain launches" : "CUDA graph replay");
            double mb = (double)kiln_program_io_bytes(p) / 1e6;
            if (med > 0)
                printf("bandwidth: %.1f MB of inputs, weights and outputs in %.3f ms = %.0f GB/s\n", mb, med,
                       mb / med);
        }
    }
    free(ms);
    return st;
}

/* Prints each output's checksum; writes --output files; compares with the CPU reference. */
static kiln_status report_outputs(run_data *d, kiln_session *s, bool *check_failed) {
    kiln_status st = NULL;
    for (int i = 0; i < kiln_graph_size(d->g) && !st; i++) {
        kiln_tensor *t = kiln_graph_node(d->g, i);
        if (kiln_tensor_role(t) != KILN_ROLE_OUTPUT && kiln_tensor_role(t) != KILN_ROLE_STATE) continue;
        kiln_type ty = kiln_tensor_type(t);
        int64_t n = kiln_tensor_nelements(t);
        size_t bytes = (size_t)n * kiln_type_size(ty);
        void *buf = malloc(bytes ? bytes : 1);
        if (!buf) return kb_oom();
        st = kiln_session_get(s, kiln_tensor_name(t), buf, bytes);
        double sum = 0, asum = 0;
        for (int64_t j = 0; !st && j < n; j++) {
            double v = kb_load_f32(buf, ty, j);
            sum += v;
            asum += fabs(v);
        }
        const char *what = kiln_tensor_role(t) == KILN_ROLE_STATE ? "state" : "output";
        if (!st) printf("%s %s %s x %lld: sum %.6g, abs sum %.6g\n", what, kiln_tensor_name(t), kiln_type_name(ty), (long long)n, sum, asum);
        const char *file = file_for(d->c->outputs, d->c->noutputs, kiln_tensor_name(t));
        if (!st && file) st = kb_write_file(file, buf, bytes);
        if (!st && d->c->check) {
            ref_check it = {d, kiln_tensor_name(t), buf, NAN};
            st = kiln_reference(d->g, ref_get, ref_put, &it);
            /* Integer results (indices) must match exactly; f32 within the loosest tolerance
             * of the graph's ops (test-backend-ops' thresholds: matrix products 5e-4), which
             * catches wrong kernels, not last-bit differences of math functions. */
            double tol = ty == KILN_I32 || ty == KILN_I64 ? 0 : ty == KILN_F32 ? kiln_graph_nmse_tol(d->g) : 1e-3;
            if (!st) {
                bool ok = it.nmse <= tol;
                printf("check %s: NMSE vs CPU reference %.3g (%s, limit %g)\n", it.name, it.nmse, ok ? "ok" : "FAILED", tol);
                *check_failed |= !ok;
            }
        }
        free(buf);
    }
    return st;
}

static void print_stats(const kiln_session *s, const kiln_program *p) {
    kiln_compile_stats cs;
    kiln_session_stats ss;
    kiln_program_stats(p, &cs);
    kiln_session_get_stats(s, &ss);
    printf("stats: kernels compiled %d (cached %d), graph captures %lld, graph replays %lld, plain runs "
           "%lld, host time per run %.1f us (mean of %lld), last %.1f us, variant %d\n",
           cs.compiled, cs.cached, (long long)ss.captures, (long long)ss.replays, (long long)ss.plain_runs,
           ss.runs ? ss.host_us_total / (double)ss.runs : 0.0, (long long)ss.runs, ss.host_us_last, ss.variant);
}

/* The bundle's graph and its program for this GPU. */
static kiln_status load_bundle(const cli *c, const char *arch, kiln_ctx **ctx, kiln_graph **g, kiln_program **p) {
    double       t0 = kb_now_ms();
    kiln_bundle *b = NULL;
    kiln_status  st = kiln_bundle_open(c->bundle, &b);
    *ctx = kiln_ctx_new();
    *g = NULL;
    if (!st && !*ctx) st = kb_oom();
    if (!st) st = kiln_parse(*ctx, kiln_bundle_graph_text(b), strlen(kiln_bundle_graph_text(b)), c->bundle);
    if (!st) st = kiln_graph_new(*ctx, g);
    if (!st) st = kiln_bundle_program(b, *g, arch, p);
    if (!st)
        printf("loaded bundle %s: %d kernels, code for %s (this GPU: %s) in %.0f ms\n", c->bundle,
               kiln_program_kernel_count(*p), kiln_program_arch(*p), arch, kb_now_ms() - t0);
    kiln_bundle_free(b);
    return st;
}

static int cmd_run(const cli *c) {
    kiln_ctx *ctx = NULL;
    kiln_graph *g = NULL;
    kiln_program *p = NULL;
    kiln_session *s = NULL;
    run_data d = {0};
    bool check_failed = false;
    kiln_ctx *bctx = NULL;
    kiln_graph *bg = NULL;
    /* The graph before the GPU: a file that holds none is that error, on any machine. */
    int rc = c->bundle ? -1 : build(c, &ctx, &g);
    if (rc >= 0) return rc;
    kt_graph_kind kind = KT_GRAPH_BUNDLE;
    kiln_status st = c->bundle ? kt_graph_kind_of(c->bundle, &kind) : NULL;
    if (!st && kind != KT_GRAPH_BUNDLE)
        st = kb_error(KILN_ERR_FORMAT, "--bundle %s: not a kiln bundle (it does not start with KILNBNDL)", c->bundle);
    if (st) return fail(st);
    st = rt_driver_init();
    char arch[16] = "sm_90a";
    if (!st) st = kiln_device_arch(0, arch, sizeof arch);
    kiln_compile_opts o = compile_opts(c, arch);
    if (!st && c->bundle) st = load_bundle(c, arch, &ctx, &g, &p);
    if (!st) st = bind_dims(c, ctx, &bctx, &bg);
    if (!st) print_dims(c, ctx);
    if (!st && !c->bundle) st = kiln_compile(g, &o, &p);
    if (!st && !c->bundle) print_compile_line(p);
    kiln_session_opts so = {.no_cuda_graph = c->no_graph};
    if (!st) st = kiln_session_new(p, &so, &s);
    for (int i = 0; !st && i < c->ndims; i++) st = kiln_session_set_dim(s, c->dim_names[i], c->dim_val[i]);
    d.g = bg; /* host data, outputs and the reference have the shapes at the --dim values */
    d.c = c;
    if (!st) st = make_leaves(&d);
    if (!st) st = upload(&d, s);
    if (!st) st = time_runs(c, s, p);
    if (!st && c->stats) print_stats(s, p);
    if (!st) st = report_outputs(&d, s, &check_failed);
    for (int i = 0; bg && d.host && i < kiln_graph_size(bg); i++) free(d.host[i]);
    free(d.host);
    kiln_session_free(s);
    kiln_program_free(p);
    kiln_graph_free(bg);
    kiln_ctx_free(bctx);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
    if (st) return fail(st);
    return check_failed ? EXIT_ERR : EXIT_OK;
}

/* The first argument of `kiln run` that is not an option (or an option's value) is a GGUF model. */
static bool model_arg(int argc, char **argv) {
    static const char *const valued[] = {"--arch", "--dump-cu", "-o", "--cache-dir", "--bundle", "--jobs", "--dim",
                                         "--seed", "--iters", "--input", "--output", "--tokens", "--prompt", "-n",
                                         "--n-ctx", "--n-batch"};
    for (int i = 2; i < argc; i++) {
        bool skip = false;
        for (size_t k = 0; k < sizeof valued / sizeof *valued; k++) skip |= !strcmp(argv[i], valued[k]);
        if (skip) i++;
        else if (argv[i][0] != '-') return kt_graph_is_gguf(argv[i]);
    }
    return false;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(usage_text, argc < 2 ? stderr : stdout);
        return argc < 2 ? EXIT_USAGE : EXIT_OK;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("kiln %s\n", KILN_VERSION);
        return EXIT_OK;
    }
    if (!strcmp(argv[1], "help")) return help(argc > 2 ? argv[2] : NULL);
    /* The library ignores a KILN_JOBS it cannot use (it takes every CPU); the command says so. */
    const char *jobs = getenv("KILN_JOBS");
    int         njobs;
    if (jobs && *jobs && !kt_flag_int32(argv[1], "KILN_JOBS", jobs, 1, KT_FLAG_MAX_JOBS, &njobs)) return EXIT_USAGE;
    if (!strcmp(argv[1], "cache")) return kiln_cmd_cache(argc, argv);
    if (!strcmp(argv[1], "gen-graph")) return kiln_cmd_gen_graph(argc - 1, argv + 1);
    if (!strcmp(argv[1], "gen-model")) return kiln_cmd_gen_model(argc - 1, argv + 1);
    if (!strcmp(argv[1], "bench")) return kiln_cmd_bench(argc - 1, argv + 1);
    if (!strcmp(argv[1], "ops")) return cmd_ops(argc, argv);
    if (!strcmp(argv[1], "run") && model_arg(argc, argv)) return kiln_cmd_run_model(argc - 1, argv + 1);
    if (!help_for(argv[1]) || argv[1][0] == '-') return usage_error("unknown command '%s'", argv[1]);
    cli c = {0};
    int rc = parse_args(argc, argv, &c);
    if (rc >= 0) return rc;
    if (!strcmp(c.cmd, "compile")) return cmd_compile(&c);
    if (!strcmp(c.cmd, "inspect")) return cmd_inspect(&c);
    return cmd_run(&c);
}
