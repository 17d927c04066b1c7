/* kiln compile GRAPH: every kernel generated and compiled into the cache (NVRTC; no GPU needed);
 * with -o FILE.kiln, an AOT bundle for one or more architectures. */
#include "tools/cmd.h"
#include "tools/compile_args.h"
#include "tools/graph_file.h"

#include <stdio.h>
#include <string.h>

static const char summary[] =
    "  compile GRAPH   generate and compile every kernel (NVRTC; no GPU needed) into the cache;\n"
    "                  with -o FILE.kiln, write an AOT bundle that runs without NVRTC\n";

static const char help[] =
    "usage: kiln compile GRAPH [--arch sm_90a[,sm_80...]] [--dump-cu DIR] [-o FILE.kiln]\n"
    "                          [--no-fuse[=NAME,...]] [--cache-dir DIR] [--no-cache] [--jobs N]\n"
    "                          [--dim NAME=VALUE]...\n"
    "       kiln compile MODEL.gguf --tp G | --pp G [--n-ctx N] [--n-batch N] [--arch ...] [--dump-cu DIR]\n"
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
    "  --tp G, --pp G  a GGUF model split over G GPUs, as 'kiln run MODEL.gguf --tp G' (or --pp G)\n"
    "                  builds it: each rank's (stage's) program compiled into the cache, so that the\n"
    "                  run finds every kernel there; --dump-cu DIR writes part N under DIR/partN.\n"
    "                  --n-ctx and --n-batch as the run's (default: the run's). No -o: a bundle\n"
    "                  holds one program\n"
    "  --dim NAME=V    a value for symbolic dim NAME, 1 .. its maximum; the program\n"
    "                  does not depend on it (kernels read symbolic dims at run time), so\n"
    "                  compiles that differ only in V share every kernel. A dim declared with\n"
    "                  'specialize V' also gets a program of its own for that value.\n";

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

static kiln_status write_bundle(const kt_args *c, const kiln_graph *g, kiln_compile_opts o, int narchs,
                                const char **archs) {
    double      t0 = kb_now_ms();
    kiln_status st = kiln_bundle_write(g, &o, narchs, archs, c->out);
    if (st) return st;
    printf("wrote bundle %s for", c->out);
    for (int i = 0; i < narchs; i++) printf(" %s", archs[i]);
    printf(" (cubins, plus PTX of each) in %.0f ms\n", kb_now_ms() - t0);
    return NULL;
}

/* The --dim values checked against the graph's dims (the program does not depend on them). */
static kiln_status check_dims(const kt_args *c, const kiln_ctx *ctx) {
    kiln_ctx   *bctx = NULL;
    kiln_graph *bg = NULL;
    kiln_status st = c->ndims ? kt_args_bind_dims(c, ctx, &bctx, &bg) : NULL;
    kiln_graph_free(bg);
    kiln_ctx_free(bctx);
    return st;
}

/* A program per --arch (dumps of the first); the last one is kept in *p. */
static kiln_status compile_each(const kt_args *c, const kiln_graph *g, kiln_compile_opts o, int narchs,
                                const char **archs, kiln_program **p) {
    kiln_status st = NULL;
    for (int i = 0; !st && i < narchs; i++) {
        o.arch = archs[i];
        o.dump_dir = i == 0 ? c->dump : NULL;
        kiln_program_free(*p);
        *p = NULL;
        if (!(st = kiln_compile(g, &o, p))) {
            if (narchs > 1) printf("%s: ", archs[i]);
            kt_print_program(*p);
        }
    }
    return st;
}

/* Part `part` of the split c asks for, built as kiln_gen_new would and compiled for each arch
 * (dumps of the first under --dump-cu DIR/partN). */
static kiln_status compile_part(const kt_args *c, const kiln_model *m, const kiln_gen_opts *go, int part, int narchs,
                                const char **archs) {
    kiln_build_opts bo;
    kiln_ctx       *ctx = NULL;
    kiln_graph     *g = NULL;
    kiln_program   *p = NULL;
    kiln_status     st = kiln_gen_part_opts(m, go, part, &bo);
    if (!st && !(ctx = kiln_ctx_new())) st = kb_error(KILN_ERR_NOMEM, "out of memory");
    if (!st) st = kiln_model_build(ctx, m, &bo);
    if (!st) st = kiln_graph_new(ctx, &g);
    char dump[4096];
    if (c->dump) snprintf(dump, sizeof dump, "%s/part%d", c->dump, part);
    kiln_compile_opts o = kt_args_compile_opts(c, NULL);
    for (int i = 0; !st && i < narchs; i++) {
        o.arch = archs[i];
        o.dump_dir = i == 0 && c->dump ? dump : NULL;
        kiln_program_free(p);
        p = NULL;
        if (!(st = kiln_compile(g, &o, &p))) {
            printf("%s %d of %d%s%s: ", go->tp > 1 ? "rank" : "stage", part, go->tp > 1 ? go->tp : go->pp,
                   narchs > 1 ? ", " : "", narchs > 1 ? archs[i] : "");
            kt_print_program(p);
        }
    }
    kiln_program_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
    return st ? kb_wrap(st, "%s %d", go->tp > 1 ? "rank" : "stage", part) : NULL;
}

/* kiln compile MODEL.gguf --tp G | --pp G: every part's program, as kiln run builds them. */
static int compile_split(const kt_args *c) {
    const char *flag = c->tp > 1 ? "--tp" : "--pp";
    int         parts = c->tp > 1 ? c->tp : c->pp;
    if (!kt_graph_is_gguf(c->graph)) return kt_usage(c->cmd, "%s splits a GGUF model; %s is not one", flag, c->graph);
    if (c->out) return kt_usage(c->cmd, "-o with %s: a bundle holds one program, a split has %d", flag, parts);
    if (c->ndims) return kt_usage(c->cmd, "--dim with %s: the parts' dims are the run's", flag);
    kiln_model *m = NULL;
    kiln_status st = kiln_model_open(c->graph, &m);
    if (st) return kt_fail(NULL, st);
    int64_t n_ctx = c->n_ctx, n_batch = c->n_batch;
    if (!kt_model_ctx(c->cmd, kiln_model_get_hparams(m), &n_ctx, &n_batch)) {
        kiln_model_close(m);
        return KT_EXIT_USAGE;
    }
    kiln_gen_opts go = {.n_ctx = n_ctx, .n_batch = n_batch, .tp = c->tp, .pp = c->pp};
    char          abuf[256];
    const char   *archs[MAX_ARCHS];
    int           narchs = 0;
    st = split_archs(c->arch ? c->arch : "sm_90a", abuf, archs, &narchs);
    for (int part = 0; !st && part < parts; part++) st = compile_part(c, m, &go, part, narchs, archs);
    if (!st && c->dump) printf("wrote each part's kernel sources and program.txt under %s/partN\n", c->dump);
    kiln_model_close(m);
    return st ? kt_fail(NULL, st) : KT_EXIT_OK;
}

static int run(int argc, char **argv) {
    kt_args c = {0};
    int     rc = kt_args_parse(argc, argv, &c);
    if (rc != KT_GO_ON) return rc;
    if (c.tp > 1 || c.pp > 1) return compile_split(&c);
    kiln_ctx     *ctx;
    kiln_graph   *g;
    kiln_program *p = NULL;
    if ((rc = kt_args_graph(&c, &ctx, &g)) != KT_GO_ON) return rc;
    kiln_compile_opts o = kt_args_compile_opts(&c, NULL);
    kiln_status       st = check_dims(&c, ctx);
    if (!st) kt_args_print_dims(&c, ctx);
    char        abuf[256];
    const char *archs[MAX_ARCHS];
    int         narchs = 0;
    if (!st) st = split_archs(c.arch ? c.arch : "sm_90a", abuf, archs, &narchs);
    if (!st) st = compile_each(&c, g, o, narchs, archs, &p);
    if (!st && c.dump) printf("wrote %d kernel sources and program.txt to %s\n", kiln_program_kernel_count(p), c.dump);
    if (!st && c.out) {
        o.arch = archs[narchs - 1]; /* as the last compile had it, without dumps */
        o.dump_dir = NULL;
        st = write_bundle(&c, g, o, narchs, archs);
    }
    kiln_program_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
    return st ? kt_fail(NULL, st) : KT_EXIT_OK;
}

const kt_cmd kt_cmd_compile = {"compile", summary, help, kt_print_fusion_passes, run};
