/* kiln run GRAPH | --bundle FILE.kiln: compiles what is missing (JIT, cached) or loads the
 * bundle, runs on the GPU with random inputs (--seed) or --input files, prints each output's
 * checksum and the timing; --check compares with the CPU reference. kiln run MODEL.gguf goes to
 * tools/cmd_model.c. */
#include "tools/cmd.h"
#include "tools/cmd_model.h"
#include "tools/compile_args.h"
#include "tools/graph_file.h"

#include "runtime/runtime.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char summary[] =
    "  run GRAPH       compile what is missing (JIT, cached), then run on the GPU: inputs random\n"
    "                  (--seed) or from files (--input); prints a checksum of each output and\n"
    "                  the timing. 'kiln run --bundle FILE.kiln' runs a bundle instead\n"
    "  run MODEL.gguf --tokens 1,2,3 -n 64   generate greedily with a GGUF model (llama, qwen2,\n"
    "                  qwen3, qwen3moe, granite, smollm3, phi3, gemma2/3, gpt-oss, deepseek2);\n"
    "                  prints the ids\n"
    "                  and prefill/decode speed ('kiln help run')\n";

static const char help[] =
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

/* After the graph options, the model's (a GGUF takes other flags), then the passes. */
static void help_more(void) {
    printf("\n%s", kt_run_model_help);
    kt_print_fusion_passes();
}

typedef struct {
    const kiln_graph *g;
    const kt_args    *c;
    void            **host; /* per graph node: host data of leaves */
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
        size_t bytes = kiln_row_size(kiln_tensor_type(t), kiln_tensor_nelements(t));
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
        size_t bytes = kiln_row_size(kiln_tensor_type(t), kiln_tensor_nelements(t));
        kiln_status st = kiln_session_set(s, kiln_tensor_name(t), d->host[i], bytes);
        if (st) return st;
    }
    return NULL;
}

static kiln_status time_runs(const kt_args *c, kiln_session *s, const kiln_program *p) {
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
static kiln_status load_bundle(const kt_args *c, const char *arch, kiln_ctx **ctx, kiln_graph **g, kiln_program **p) {
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

static int run_graph(const kt_args *c) {
    kiln_ctx *ctx = NULL;
    kiln_graph *g = NULL;
    kiln_program *p = NULL;
    kiln_session *s = NULL;
    run_data d = {0};
    bool check_failed = false;
    kiln_ctx *bctx = NULL;
    kiln_graph *bg = NULL;
    /* The graph before the GPU: a file that holds none is that error, on any machine. */
    int rc = c->bundle ? -1 : kt_args_graph(c, &ctx, &g);
    if (rc != KT_GO_ON) return rc;
    kt_graph_kind kind = KT_GRAPH_BUNDLE;
    kiln_status st = c->bundle ? kt_graph_kind_of(c->bundle, &kind) : NULL;
    if (!st && kind != KT_GRAPH_BUNDLE)
        st = kb_error(KILN_ERR_FORMAT, "--bundle %s: not a kiln bundle (it does not start with KILNBNDL)", c->bundle);
    if (st) return kt_fail(NULL, st);
    st = rt_driver_init();
    char arch[16] = "sm_90a";
    if (!st) st = kiln_device_arch(0, arch, sizeof arch);
    kiln_compile_opts o = kt_args_compile_opts(c, arch);
    if (!st && c->bundle) st = load_bundle(c, arch, &ctx, &g, &p);
    if (!st) st = kt_args_bind_dims(c, ctx, &bctx, &bg);
    if (!st) kt_args_print_dims(c, ctx);
    if (!st && !c->bundle) st = kiln_compile(g, &o, &p);
    if (!st && !c->bundle) kt_print_program(p);
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
    if (st) return kt_fail(NULL, st);
    return check_failed ? KT_EXIT_ERR : KT_EXIT_OK;
}

/* The first argument of `kiln run` that is not an option (or an option's value) is a GGUF model,
 * or -m/--model names one. */
static bool model_arg(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (kt_run_model_path_flag(argv[i])) return true;
        if (kt_args_takes_value(argv[i]) || kt_run_model_takes_value(argv[i])) i++;
        else if (argv[i][0] != '-') return kt_graph_is_gguf(argv[i]);
    }
    return false;
}

static int run(int argc, char **argv) {
    if (model_arg(argc, argv)) return kt_run_model(argc, argv);
    kt_args c = {0};
    int     rc = kt_args_parse(argc, argv, &c);
    return rc != KT_GO_ON ? rc : run_graph(&c);
}

const kt_cmd kt_cmd_run = {"run", summary, help, help_more, run};
