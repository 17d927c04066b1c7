/* kiln gen-graph --arch A --preset P [--n-ctx N] [--n-tokens N] [--outputs last|all] [-o FILE]:
 * builds a model's graph from a preset (kiln_model_preset, kiln_build_model) and writes it as
 * .kg text. kiln gen-model --arch A --preset P -o FILE.gguf [--seed S] [--type T]: writes that
 * model with random weights as GGUF (kiln_model_write_random). Both share the option parser. */
#include "tools/cmd_gen.h"

#include "kiln.h"

#include "base/base.h"
#include "tools/flag.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { GEN_OK = 0, GEN_ERR = 1, GEN_USAGE = 2 };

static const char *gen_graph_help =
    "usage: kiln gen-graph --arch ARCH --preset NAME [--n-ctx N] [--n-tokens N] [--outputs last|all]\n"
    "                      [-o FILE.kg]\n"
    "  writes the whole graph of a model, as llama.cpp builds it for one batch of tokens with flash\n"
    "  attention and a KV cache, as .kg text (stdout without -o). Weights carry their GGUF names\n"
    "  (token_embd.weight, blk.0.attn_q.weight, ...); see docs/models.md.\n"
    "  --arch ARCH      llama, qwen2, qwen3 or qwen3moe\n"
    "  --preset NAME    hyperparameters of a known model (listed below)\n"
    "  --n-ctx N        KV cache slots: the caches' rows and the maximum of dim n_kv (default:\n"
    "                   4096, or n_ctx_train when smaller)\n"
    "  --n-tokens N     tokens per batch, at most n_ctx: the maximum of dim n_tokens, which also\n"
    "                   gets a decode program of its own (specialize 1) (default: 512, or n_ctx\n"
    "                   when smaller)\n"
    "  --outputs WHICH  last: logits of one token, the row inp_out_ids[0] (default); all: logits\n"
    "                   of every token, [n_vocab, n_tokens]\n"
    "  -o FILE          write the graph to FILE\n";

static const char *gen_model_help =
    "usage: kiln gen-model --arch ARCH --preset NAME -o FILE.gguf [--seed S] [--type f32|f16|bf16]\n"
    "  writes a GGUF model with the preset's real hyperparameters and random weights: matrices\n"
    "  uniform with variance 1/ne0, norm weights near 1, llama3 rope factors computed, and a\n"
    "  synthetic byte-level BPE vocabulary of n_vocab tokens. The same seed gives the same file.\n"
    "  It loads with 'kiln run FILE.gguf'. Sizes: tiny about 1 MB, llama-3.2-1b 2.5 GB,\n"
    "  llama-3-8b 16 GB, qwen3-30b-a3b 61 GB (bf16).\n"
    "  --arch ARCH      llama, qwen2, qwen3 or qwen3moe (default: the preset's)\n"
    "  --preset NAME    hyperparameters of a known model (listed below)\n"
    "  -o FILE.gguf     the file to write (atomically: FILE.gguf.tmp.PID, renamed at the end)\n"
    "  --seed S         random seed, 0 .. 2^64-1 (default 1)\n"
    "  --type T         weight type of matrices and embeddings (default: the preset's)\n";

typedef struct {
    const char        *cmd; /* "gen-graph" or "gen-model" */
    const char        *arch, *preset, *out;
    kiln_build_opts    opts;
    uint64_t           seed;
    const char        *type;
} gen_args;

static const char *g_cmd = "gen-graph";

static int usage(const char *fmt, const char *arg) {
    fprintf(stderr, "kiln %s: ", g_cmd);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see 'kiln help %s')\n", g_cmd);
    return GEN_USAGE;
}

static void print_help(void) {
    fputs(strcmp(g_cmd, "gen-model") ? gen_graph_help : gen_model_help, stdout);
    printf("presets:\n");
    const char *name, *arch;
    for (int i = 0; (name = kiln_model_preset_name(i, &arch)); i++) printf("  %-16s %s\n", name, arch);
}

static int parse_count(const char *opt, const char *v, int64_t *out) {
    return kt_flag_int(g_cmd, opt, v, 1, KT_FLAG_MAX_CTX, out) ? -1 : GEN_USAGE;
}

/* -1 when the arguments are complete, else the exit status (help printed, or a usage error). */
static int parse_args(int argc, char **argv, gen_args *g) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            print_help();
            return GEN_OK;
        }
        bool model = !strcmp(g->cmd, "gen-model");
        bool takes = !strcmp(a, "--arch") || !strcmp(a, "--preset") || !strcmp(a, "-o") ||
                     (!model && (!strcmp(a, "--n-ctx") || !strcmp(a, "--n-tokens") || !strcmp(a, "--outputs"))) ||
                     (model && (!strcmp(a, "--seed") || !strcmp(a, "--type")));
        if (!takes) return usage("unknown argument '%s'", a);
        if (!v) return usage("option %s needs a value", a);
        i++;
        int rc = -1;
        if (!strcmp(a, "--arch")) g->arch = v;
        else if (!strcmp(a, "--preset")) g->preset = v;
        else if (!strcmp(a, "-o")) g->out = v;
        else if (!strcmp(a, "--type")) g->type = v;
        else if (!strcmp(a, "--seed")) rc = kt_flag_uint(g_cmd, a, v, UINT64_MAX, &g->seed) ? -1 : GEN_USAGE;
        else if (!strcmp(a, "--n-ctx")) rc = parse_count(a, v, &g->opts.n_ctx);
        else if (!strcmp(a, "--n-tokens")) rc = parse_count(a, v, &g->opts.n_tokens_max);
        else if (!strcmp(v, "last")) g->opts.outputs = KILN_OUTPUTS_LAST;
        else if (!strcmp(v, "all")) g->opts.outputs = KILN_OUTPUTS_ALL;
        else return usage("--outputs wants last or all, got '%s'", v);
        if (rc >= 0) return rc;
    }
    if (!g->preset) return usage("%s", "no --preset given");
    if (g->opts.n_ctx && g->opts.n_tokens_max > g->opts.n_ctx) {
        kt_flag_usage(g_cmd, "--n-tokens %lld: a batch must fit in the context, --n-ctx %lld",
                      (long long)g->opts.n_tokens_max, (long long)g->opts.n_ctx);
        return GEN_USAGE;
    }
    if (!strcmp(g->cmd, "gen-model") && !g->out) return usage("%s", "no -o FILE.gguf given");
    return -1;
}

static int fail(kiln_status st) {
    fprintf(stderr, "kiln %s: %s\n", g_cmd, kiln_status_msg(st));
    kiln_status_free(st);
    return GEN_ERR;
}

int kiln_cmd_gen_graph(int argc, char **argv) {
    if (argc > 0 && !strcmp(argv[0], "help")) { /* kiln help gen-graph */
        print_help();
        return GEN_OK;
    }
    g_cmd = "gen-graph";
    gen_args g = {.cmd = g_cmd};
    int      rc = parse_args(argc, argv, &g);
    if (rc >= 0) return rc;
    kiln_model_hparams hp;
    kiln_status        st = kiln_model_preset(g.arch, g.preset, &hp);
    if (st) return fail(st);
    kiln_ctx *ctx = kiln_ctx_new();
    char     *text = NULL;
    st = ctx ? kiln_build_model(ctx, &hp, &g.opts) : kb_oom();
    if (!st) st = kiln_print(ctx, &text);
    if (!st && g.out) st = kb_write_file(g.out, text, strlen(text));
    else if (!st && fputs(text, stdout) < 0) st = kb_error(KILN_ERR_IO, "writing the graph to stdout failed");
    free(text);
    kiln_ctx_free(ctx);
    return st ? fail(st) : GEN_OK;
}

/* Progress of a long write on stderr: a line every 2 s (files of gigabytes take a while). */
typedef struct {
    double t0, last;
} write_progress_state;

static void write_progress(void *user, uint64_t done, uint64_t total) {
    write_progress_state *ps = user;
    double                now = kb_now_ms();
    if (now - ps->last < 2000 || done == total) return;
    ps->last = now;
    fprintf(stderr, "kiln gen-model: %.1f of %.1f GB written (%.0f%%, %.0f s)\n", (double)done / 1e9,
            (double)total / 1e9, total ? 100.0 * (double)done / (double)total : 100.0, (now - ps->t0) / 1000);
}

int kiln_cmd_gen_model(int argc, char **argv) {
    g_cmd = "gen-model";
    if (argc > 0 && !strcmp(argv[0], "help")) { /* kiln help gen-model */
        print_help();
        return GEN_OK;
    }
    gen_args g = {.cmd = g_cmd, .seed = 1};
    int      rc = parse_args(argc, argv, &g);
    if (rc >= 0) return rc;
    kiln_model_hparams hp;
    kiln_status        st = kiln_model_preset(g.arch, g.preset, &hp);
    if (st) return fail(st);
    if (g.type && kiln_type_from_name(g.type, &hp.wtype) != 0)
        return usage("--type wants f32, f16 or bf16, got '%s'", g.type);
    write_progress_state ps = {kb_now_ms(), kb_now_ms()};
    if ((st = kiln_model_write_random(&hp, g.seed, g.out, write_progress, &ps))) return fail(st);
    printf("wrote %s: %s preset %s, %s weights, seed %llu, in %.1f s\n", g.out, hp.arch, g.preset,
           kiln_type_name(hp.wtype), (unsigned long long)g.seed, (kb_now_ms() - ps.t0) / 1000);
    return GEN_OK;
}
