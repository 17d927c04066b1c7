/* kiln gen-graph --arch A --preset P [--n-ctx N] [--n-tokens N] [--outputs last|all] [-o FILE]:
 * builds a model's graph from a preset (kiln_model_preset, kiln_build_model) and writes it as
 * .kg text. */
#include "tools/cmd.h"
#include "tools/gen_args.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char summary[] =
    "  gen-graph       write a model's whole graph from a preset (--arch, --preset) as .kg\n";

static const char help[] =
    "usage: kiln gen-graph --arch ARCH --preset NAME [--n-ctx N] [--n-tokens N] [--outputs last|all]\n"
    "                      [-o FILE.kg]\n"
    "  writes the whole graph of a model, as llama.cpp builds it for one batch of tokens with flash\n"
    "  attention and a KV cache, as .kg text (stdout without -o). Weights carry their GGUF names\n"
    "  (token_embd.weight, blk.0.attn_q.weight, ...); see docs/models.md.\n"
    "  --arch ARCH      llama, qwen2, qwen3, qwen3moe, granite, smollm3, phi3, gemma3, gemma2, gpt-oss or deepseek2\n"
    "  --preset NAME    hyperparameters of a known model (listed below)\n"
    "  --n-ctx N        KV cache slots: the caches' rows and the maximum of dim n_kv (default:\n"
    "                   4096, or n_ctx_train when smaller)\n"
    "  --n-tokens N     tokens per batch, at most n_ctx: the maximum of dim n_tokens, which also\n"
    "                   gets a decode program of its own (specialize 1) (default: 512, or n_ctx\n"
    "                   when smaller)\n"
    "  --outputs WHICH  last: logits of one token, the row inp_out_ids[0] (default); all: logits\n"
    "                   of every token, [n_vocab, n_tokens]\n"
    "  -o FILE          write the graph to FILE\n";

static int run(int argc, char **argv) {
    kt_gen_args g = {0};
    int         rc = kt_gen_parse(argc, argv, &g);
    if (rc != KT_GO_ON) return rc;
    kiln_model_hparams hp;
    kiln_status        st = kiln_model_preset(g.arch, g.preset, &hp);
    if (st) return kt_fail(g.cmd, st);
    kiln_ctx *ctx = kiln_ctx_new();
    char     *text = NULL;
    st = ctx ? kiln_build_model(ctx, &hp, &g.opts) : kb_oom();
    if (!st) st = kiln_print(ctx, &text);
    if (!st && g.out) st = kb_write_file(g.out, text, strlen(text));
    else if (!st && fputs(text, stdout) < 0) st = kb_error(KILN_ERR_IO, "writing the graph to stdout failed");
    free(text);
    kiln_ctx_free(ctx);
    return st ? kt_fail(g.cmd, st) : KT_EXIT_OK;
}

const kt_cmd kt_cmd_gen_graph = {"gen-graph", summary, help, kt_gen_print_presets, run};
