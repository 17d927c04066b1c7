/* kiln gen-model --arch A --preset P -o FILE.gguf [--seed S] [--type T] [--vocab V]: writes a
 * preset's model with random weights as GGUF (kiln_model_write_random_vocab). */
#include "tools/cmd.h"
#include "tools/gen_args.h"

#include <stdio.h>

static const char summary[] =
    "  gen-model       write a GGUF model of a preset with random weights (-o FILE.gguf)\n";

static const char help[] =
    "usage: kiln gen-model --arch ARCH --preset NAME -o FILE.gguf [--seed S]\n"
    "                      [--type f32|f16|bf16|q8_0|q4_0|q5_0|q5_1|q4_k_m|q5_k_m|q6_k|mxfp4_moe] [--vocab bpe|spm]\n"
    "  writes a GGUF model with the preset's real hyperparameters and random weights: matrices\n"
    "  uniform with variance 1/ne0, norm weights near 1, llama3 rope factors computed, and a\n"
    "  synthetic vocabulary of n_vocab tokens. The same seed gives the same file.\n"
    "  It loads with 'kiln run FILE.gguf' (and with llama.cpp). Sizes: tiny about 1 MB,\n"
    "  llama-3.2-1b 2.5 GB, llama-3-8b 16 GB, qwen3-30b-a3b 61 GB (bf16; q4_k_m about 30%).\n"
    "  --arch ARCH      llama, qwen2, qwen3, qwen3moe, granite, smollm3, phi3, gemma3, gemma2, gpt-oss or deepseek2 (default: the preset's)\n"
    "  --preset NAME    hyperparameters of a known model (listed below)\n"
    "  -o FILE.gguf     the file to write (atomically: FILE.gguf.tmp.PID, renamed at the end)\n"
    "  --seed S         random seed, 0 .. 2^64-1 (default 1)\n"
    "  --type T         the file type (default: the preset's): f32, f16 or bf16 for every matrix\n"
    "                   and embedding, or a quantized mix as llama-quantize makes it: q8_0, q4_0,\n"
    "                   q5_0, q5_1 (q6_K output), q4_k_m, q5_k_m (q6_K output and some attn_v and\n"
    "                   ffn_down), q6_k, or mxfp4_moe (mxfp4 experts, every other matrix q8_0:\n"
    "                   gpt-oss's file type). The same random values, quantized by kiln's own\n"
    "                   quantizer. Rows a K-quant's 256 does not divide take llama-quantize's\n"
    "                   fallback: q5_0 for q4_K, q5_1 for q5_K, q8_0 for q6_K (docs/models.md).\n"
    "                   Norms, biases and the MoE router stay f32.\n"
    "  --vocab V        the synthetic vocabulary: bpe (default), byte-level BPE as Llama 3's\n"
    "                   (tokenizer.ggml.model gpt2, pre llama-bpe), or spm, SentencePiece with byte\n"
    "                   fallback as Llama 2's (model llama: <unk>, <s>, </s>, <0x00>..<0xFF>,\n"
    "                   scored pieces). Both learned from the same built-in English text.\n";

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

static int run(int argc, char **argv) {
    kt_gen_args g = {.seed = 1};
    int         rc = kt_gen_parse(argc, argv, &g);
    if (rc != KT_GO_ON) return rc;
    kiln_model_hparams hp;
    kiln_status        st = kiln_model_preset(g.arch, g.preset, &hp);
    if (st) return kt_fail(g.cmd, st);
    if (g.type && kiln_ftype_from_name(g.type, &hp.ftype) != 0)
        return kt_usage(g.cmd, "--type wants %s, got '%s'", kiln_ftype_list(), g.type);
    write_progress_state ps = {kb_now_ms(), kb_now_ms()};
    if ((st = kiln_model_write_random_vocab(&hp, g.seed, g.vocab, g.out, write_progress, &ps)))
        return kt_fail(g.cmd, st);
    printf("wrote %s: %s preset %s, %s weights, seed %llu, %s vocabulary, in %.1f s\n", g.out, hp.arch, g.preset,
           kiln_ftype_name(hp.ftype), (unsigned long long)g.seed,
           g.vocab == KILN_VOCAB_SPM ? "SentencePiece" : "byte-level BPE", (kb_now_ms() - ps.t0) / 1000);
    return KT_EXIT_OK;
}

const kt_cmd kt_cmd_gen_model = {"gen-model", summary, help, kt_gen_print_presets, run};
