/* kiln run MODEL.gguf: greedy generation from token ids or a prompt (tools/cmd_model.h). */
#include "tools/cmd_model.h"

#include "kiln.h"

#include "base/base.h"
#include "tools/cmd.h"
#include "tools/compile_args.h"
#include "tools/flag.h"
#include "tools/graph_file.h"
#include "tools/progress.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char kt_run_model_help[] =
    "usage: kiln run MODEL.gguf (--tokens ID,ID,... | --prompt TEXT) [-n N] [-r TEXT]... [--ignore-eos]\n"
    "                           [--raw] [--verbose-prompt] [-sys TEXT] [--chat-template NAME] [-cnv]\n"
    "                           [--n-ctx N] [--n-batch N] [--tp G | --pp G] [--bundle FILE.kiln]\n"
    "                           [--check] [--cpu] [--stats] [--no-cuda-graph] [--dump-logits FILE]\n"
    "                           [compile options]\n"
    "  builds the model's graph from the GGUF's hyperparameters (llama, qwen2, qwen3, qwen3moe,\n"
    "  granite, smollm3, phi3, gemma3, gemma2, gpt-oss, deepseek2; f32/f16/bf16 weights or the quantized q8_0, q4_0, q5_0, q5_1, q4_K, q5_K, q6_K of\n"
    "  Q8_0, Q4_0, Q5_0, Q5_1, Q4_K_M, Q5_K_M and Q6_K files and the mxfp4 experts of MXFP4_MOE files, each tensor\n"
    "  in its own type), compiles it\n"
    "  (cached), uploads the weights, evaluates the prompt\n"
    "  (prefill) and generates greedily (decode): the text streams token by token on the 'text:'\n"
    "  line (escaped; whole UTF-8 characters) when the GGUF has a tokenizer, then the generated\n"
    "  ids, why generation stopped, and prefill and decode speed. Generation stops after N tokens,\n"
    "  at an end-of-generation token (eos, eot, eom and the end-of-turn tokens llama.cpp knows by\n"
    "  their text: <|eot_id|>, <|im_end|>, <end_of_turn>, ...), at a stop string, or when the\n"
    "  context is full.\n"
    "  --tokens LIST    the prompt as token ids, comma-separated, each 0 .. n_vocab - 1\n"
    "  --prompt TEXT    the prompt as text, tokenized with the GGUF's vocabulary (byte-level BPE,\n"
    "                   or SentencePiece: tokenizer.ggml.model gpt2 or llama)\n"
    "  -n N             tokens to generate at most (default 32; -1: until an end-of-generation\n"
    "                   token, a stop string or a full context)\n"
    "  -r, --reverse-prompt TEXT  a stop string (up to 16): generation ends where one appears in\n"
    "                   the text, which is printed up to it (llama.cpp's server 'stop')\n"
    "  --ignore-eos     do not stop at end-of-generation tokens\n"
    "  --context-shift  when the context is full, drop half of the tokens after the first --keep\n"
    "                   and go on (llama.cpp's shift: the rest move down, their K re-roped); -n may\n"
    "                   then exceed the context, and a conversation drops its oldest turns as it\n"
    "                   grows. Without it a full context ends generation (or the conversation)\n"
    "  --keep N         tokens of the prompt a shift keeps besides its bos (default 0; -1: the\n"
    "                   whole prompt)\n"
    "  --raw            print only the generated text, raw (as llama-cli), on stdout; everything\n"
    "                   else goes to stderr\n"
    "  --verbose-prompt list the prompt's tokens, each id with its text (a conversation: each\n"
    "                   turn's new tokens and whether the cache was kept)\n"
    "  -sys, --system-prompt TEXT  a system message: the prompt becomes the user's turn of a\n"
    "                   conversation, rendered with the chat template\n"
    "  --chat-template NAME  the template (default: the model's tokenizer.chat_template, else\n"
    "                   chatml): chatml, llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip,\n"
    "                   mistral-v1, mistral-v3, mistral-v3-tekken, mistral-v7,\n"
    "                   mistral-v7-tekken, phi3, phi4, gemma, deepseek, deepseek2, deepseek3,\n"
    "                   llama3, falcon3, zephyr, monarch, orion, openchat, vicuna, vicuna-orca,\n"
    "                   command-r, chatglm3, chatglm4, glmedge, minicpm, exaone3, exaone4,\n"
    "                   rwkv-world, granite, gigachat, megrez, yandex, bailing, bailing-think,\n"
    "                   bailing2, llama4, smolvlm, dots1, hunyuan-moe, gpt-oss, hunyuan-dense,\n"
    "                   kimi-k2, seed_oss, grok-2, pangu-embedded (docs/chat.md);\n"
    "                   with a text prompt, renders it as the user's turn\n"
    "  sampling (llama.cpp's flags and defaults; docs/sampling.md): any of them samples, without\n"
    "  them kiln run is greedy (a conversation samples); --temp 0 is greedy:\n"
    "  -s, --seed N     the draw's seed, 0 .. 2^64-1 (default 0): the same seed, the same tokens\n"
    "  --temp T         temperature (0.8)        --top-k K   the K likeliest (40; <= 0: all)\n"
    "  --top-p P        nucleus, 0 .. 1 (0.95)   --min-p P   relative to the likeliest (0.05)\n"
    "  --repeat-penalty R (1: off)  --repeat-last-n N (64; 0: off, -1: all)\n"
    "  --presence-penalty X (0)     --frequency-penalty X (0)\n"
    "                   the penalties count the prompt and the tokens generated; sampling reads\n"
    "                   the logits back each step (the GPU's chained greedy steps do not)\n"
    "  -cnv, --conversation  talk: each line of stdin is a user message (-p/-f, if given, the\n"
    "                   first), each reply streams raw on stdout until its end of turn (-n per\n"
    "                   reply, default -1); the cache keeps the conversation, so a turn\n"
    "                   evaluates only its new tokens. Also 'kiln chat MODEL'\n"
    "  --n-ctx N        KV cache slots, at most the model's training context (default: 4096, or\n"
    "                   that context when smaller); the prompt plus N - 1 tokens must fit (the\n"
    "                   last token generated is not stored), checked before anything compiles\n"
    "  --n-batch N      tokens per prefill run, at most n_ctx (default: 512, or n_ctx when smaller)\n"
    "  --check          also run every step on the CPU reference, fed the same tokens, and print\n"
    "                   the worst logits NMSE and whether each greedy pick agrees (tiny models:\n"
    "                   the CPU evaluates node by node)\n"
    "  --cpu            run on the CPU reference only (no GPU needed)\n"
    "  --tp G           tensor parallelism over G GPUs (devices 0 .. G-1; docs/tp.md): each GPU\n"
    "                   holds its share of the heads, FFN columns and vocabulary and reads only\n"
    "                   its part of the file; NCCL sums the partial products (loaded with dlopen).\n"
    "                   With --cpu the CPU reference evaluates the G graphs together. Every arch\n"
    "                   above; 'kiln inspect MODEL.gguf --tp G' shows the split\n"
    "  --bundle FILE.kiln  the program compiled ahead of time by 'kiln compile MODEL.gguf [--n-ctx N]\n"
    "                   [--n-batch N] -o FILE.kiln' instead of compiling (no NVRTC needed); its\n"
    "                   graph must be this run's (the same model, --n-ctx and --n-batch; sampling\n"
    "                   then stays on the host). One GPU\n"
    "  --pp G           pipeline split over G GPUs (docs/tp.md): consecutive layers a GPU, run\n"
    "                   one after another, each GPU's hidden state handed on through host memory;\n"
    "                   for a model no one GPU holds, on GPUs without a fast link (no faster than\n"
    "                   one GPU). With --cpu the CPU reference runs the G stages\n"
    "  --stats          where the time went: warm-up, and per evaluation the inputs, the run,\n"
    "                   reading the logits back and picking the token\n"
    "  --no-cuda-graph  launch kernels one by one instead of replaying CUDA graphs\n"
    "  llama.cpp's spellings: -m/--model MODEL.gguf, -p PROMPT (--prompt), -f/--file FILE (the\n"
    "                   prompt is the file's text), --n-predict N (-n), -c/--ctx-size N (--n-ctx),\n"
    "                   -b/--batch-size N (--n-batch)\n"
    "  --dump-logits FILE  also write the prompt's logits (its last token's: n_vocab f32,\n"
    "                   little-endian) to FILE, evaluated again after the generation\n"
    "  compile options: --arch, --cache-dir DIR, --no-cache, --jobs N, --dump-cu DIR, --no-fuse,\n"
    "  --no-fuse=NAME[,NAME]\n"
    "  (see 'kiln help compile')\n";


static int usage(const char *fmt, const char *arg) {
    fprintf(stderr, "kiln run: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see 'kiln run --help' with a .gguf file, or 'kiln help run')\n");
    return KT_EXIT_USAGE;
}

/* --tokens: ids in 0 .. INT32_MAX here; against the model's n_vocab once it is open. */
static bool parse_tokens(kt_model_args *a, const char *v) {
    int64_t cap = kt_flag_list_count(v);
    free(a->ids);
    if (!(a->ids = malloc(sizeof *a->ids * (size_t)cap))) return kt_flag_usage("run", "--tokens: out of memory");
    return kt_flag_int_list("run", "--tokens", v, 0, INT32_MAX, a->ids, cap, &a->nids);
}

bool kt_run_model_path_flag(const char *o) { return !strcmp(o, "-m") || !strcmp(o, "--model"); }

/* -f/--file: the prompt is the file's text (read whole, NUL-terminated). */
static bool read_prompt_file(kt_model_args *a, const char *path) {
    size_t      len;
    kiln_status st = kb_read_file(path, &a->file_text, &len);
    if (st) {
        kt_flag_usage("run", "-f %s: %s", path, kiln_status_msg(st));
        kiln_status_free(st);
        return false;
    }
    if (strlen(a->file_text) != len) return kt_flag_usage("run", "-f %s: the file holds a NUL byte (not a text prompt)", path);
    a->prompt = a->file_text;
    return true;
}

/* The sampling flags, llama.cpp's names: each sets one field of kiln_sampler_params. */
typedef enum { SF_SEED, SF_FLOAT, SF_INT } sf_kind;
static const struct {
    const char *name, *alias;
    sf_kind     kind;
    size_t      at;
} SAMPLER_FLAGS[] = {
    {"--seed", "-s", SF_SEED, offsetof(kiln_sampler_params, seed)},
    {"--temp", NULL, SF_FLOAT, offsetof(kiln_sampler_params, temp)},
    {"--top-k", NULL, SF_INT, offsetof(kiln_sampler_params, top_k)},
    {"--top-p", NULL, SF_FLOAT, offsetof(kiln_sampler_params, top_p)},
    {"--min-p", NULL, SF_FLOAT, offsetof(kiln_sampler_params, min_p)},
    {"--repeat-penalty", NULL, SF_FLOAT, offsetof(kiln_sampler_params, repeat_penalty)},
    {"--repeat-last-n", NULL, SF_INT, offsetof(kiln_sampler_params, repeat_last_n)},
    {"--presence-penalty", NULL, SF_FLOAT, offsetof(kiln_sampler_params, presence_penalty)},
    {"--frequency-penalty", NULL, SF_FLOAT, offsetof(kiln_sampler_params, frequency_penalty)},
};

static int sampler_flag_index(const char *o) {
    for (size_t i = 0; i < sizeof SAMPLER_FLAGS / sizeof SAMPLER_FLAGS[0]; i++)
        if (!strcmp(o, SAMPLER_FLAGS[i].name) || (SAMPLER_FLAGS[i].alias && !strcmp(o, SAMPLER_FLAGS[i].alias)))
            return (int)i;
    return -1;
}

static bool sampler_flag(const char *o) { return sampler_flag_index(o) >= 0; }

/* Parses sampling flag o's value into a->sampler (its range is kiln_sampler_check's, after). */
static bool parse_sampler_flag(kt_model_args *a, const char *o, const char *v) {
    int   i = sampler_flag_index(o);
    char *field = (char *)&a->sampler + SAMPLER_FLAGS[i].at;
    a->sampling = true;
    switch (SAMPLER_FLAGS[i].kind) {
    case SF_SEED: return kt_flag_uint("run", o, v, UINT64_MAX, (uint64_t *)(void *)field);
    case SF_FLOAT: return kt_flag_float("run", o, v, (float *)(void *)field);
    default: {
        int64_t x;
        if (!kt_flag_int("run", o, v, INT32_MIN, INT32_MAX, &x)) return false;
        *(int32_t *)(void *)field = (int32_t)x;
        return true;
    }
    }
}

bool kt_run_model_takes_value(const char *o) {
    return !strcmp(o, "--tokens") || !strcmp(o, "--prompt") || !strcmp(o, "-n") || !strcmp(o, "--n-ctx") || !strcmp(o, "--tp") || !strcmp(o, "--pp") || !strcmp(o, "--bundle") ||
           !strcmp(o, "-p") || !strcmp(o, "-f") || !strcmp(o, "--file") || !strcmp(o, "--n-predict") ||
           !strcmp(o, "-c") || !strcmp(o, "--ctx-size") || !strcmp(o, "-b") || !strcmp(o, "--batch-size") ||
           !strcmp(o, "-r") || !strcmp(o, "--reverse-prompt") || !strcmp(o, "-sys") ||
           !strcmp(o, "--system-prompt") || !strcmp(o, "--chat-template") || sampler_flag(o) || !strcmp(o, "--keep") ||
           kt_run_model_path_flag(o) ||
           !strcmp(o, "--n-batch") || !strcmp(o, "--arch") || !strcmp(o, "--cache-dir") || !strcmp(o, "--jobs") ||
           !strcmp(o, "--dump-cu") || !strcmp(o, "--dump-logits");
}

/* -r/--reverse-prompt TEXT: a stop string (llama.cpp's name; as its server's "stop", generation
 * ends where one appears and the text stops before it). */
static bool add_stop(kt_model_args *a, const char *o, const char *v) {
    if (!*v) return kt_flag_usage("run", "%s: the stop string is empty", o);
    if (a->nstops == KT_MODEL_MAX_STOPS) return kt_flag_usage("run", "%s: at most %d stop strings", o, KT_MODEL_MAX_STOPS);
    a->stops[a->nstops++] = v;
    return true;
}

/* --chat-template NAME: one of kiln's templates (the error lists them). */
static bool check_template(const char *name) {
    kiln_status st = kiln_chat_template_by_name(name);
    if (!st) return true;
    kt_flag_usage("run", "--chat-template %s", kiln_status_msg(st));
    kiln_status_free(st);
    return false;
}

/* A second prompt option (--prompt, -p, -f): a usage error naming it. */
static bool dup_prompt(const char *o) { return kt_flag_usage("run", "%s: the prompt is given twice", o); }

/* KT_GO_ON when a is complete, else the exit status. */
static int parse(int argc, char **argv, kt_model_args *a) {
    a->n_new = 32;
    a->sampler = kiln_sampler_params_default();
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool        ok = true;
        bool        val = kt_run_model_takes_value(o);
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            fputs(kt_run_model_help, stdout);
            return KT_EXIT_OK;
        }
        if (val && !v) return usage("option %s needs a value", o);
        if (val) i++;
        if (!strcmp(o, "--tokens")) ok = parse_tokens(a, a->tokens = v);
        else if (!strcmp(o, "--prompt") || !strcmp(o, "-p")) {
            ok = !a->prompt || dup_prompt(o);
            a->prompt = v;
        }
        else if (!strcmp(o, "-f") || !strcmp(o, "--file")) ok = (!a->prompt || dup_prompt(o)) && read_prompt_file(a, v);
        else if (!strcmp(o, "-n") || !strcmp(o, "--n-predict"))
            ok = kt_flag_int("run", o, v, -1, KT_FLAG_MAX_CTX, &a->n_new), a->n_given = true;
        else if (!strcmp(o, "-sys") || !strcmp(o, "--system-prompt")) a->system = v;
        else if (!strcmp(o, "--chat-template")) ok = check_template(a->chat_template = v);
        else if (!strcmp(o, "-cnv") || !strcmp(o, "--conversation")) a->conversation = true;
        else if (!strcmp(o, "--context-shift")) a->context_shift = true;
        else if (!strcmp(o, "--keep")) ok = kt_flag_int("run", o, v, -1, KT_FLAG_MAX_CTX, &a->keep);
        else if (sampler_flag(o)) ok = parse_sampler_flag(a, o, v);
        else if (!strcmp(o, "-r") || !strcmp(o, "--reverse-prompt")) ok = add_stop(a, o, v);
        else if (!strcmp(o, "--n-ctx") || !strcmp(o, "-c") || !strcmp(o, "--ctx-size"))
            ok = kt_flag_int("run", o, v, 1, KT_FLAG_MAX_CTX, &a->n_ctx);
        else if (!strcmp(o, "--n-batch") || !strcmp(o, "-b") || !strcmp(o, "--batch-size"))
            ok = kt_flag_int("run", o, v, 1, KT_FLAG_MAX_CTX, &a->n_batch);
        else if (kt_run_model_path_flag(o)) {
            if (a->path) return usage("more than one model given ('%s')", v);
            a->path = v;
        }
        else if (!strcmp(o, "--jobs")) ok = kt_flag_int32("run", o, v, 1, KT_FLAG_MAX_JOBS, &a->jobs);
        else if (!strcmp(o, "--arch")) ok = kt_flag_arch("run", o, a->arch = v, false);
        else if (!strncmp(o, "--no-fuse=", 10))
            ok = kt_flag_no_fuse("run", o, a->no_fuse_passes, sizeof a->no_fuse_passes);
        else if (!strcmp(o, "--cache-dir")) a->cache_dir = v;
        else if (!strcmp(o, "--dump-cu")) a->dump = v;
        else if (!strcmp(o, "--dump-logits")) a->dump_logits = v;
        else if (!strcmp(o, "--check")) a->check = true;
        else if (!strcmp(o, "--stats")) a->stats = true;
        else if (!strcmp(o, "--cpu")) a->cpu = true;
        else if (!strcmp(o, "--ignore-eos")) a->ignore_eos = true;
        else if (!strcmp(o, "--raw")) a->raw = true;
        else if (!strcmp(o, "--verbose-prompt")) a->verbose_prompt = true;
        else if (!strcmp(o, "--no-cuda-graph")) a->no_graph = true;
        else if (!strcmp(o, "--no-cache")) a->no_cache = true;
        else if (!strcmp(o, "--no-fuse")) a->no_fuse = true;
        else if (!strcmp(o, "--tp")) ok = kt_flag_int32("run", o, v, 1, 64, &a->tp);
        else if (!strcmp(o, "--pp")) ok = kt_flag_int32("run", o, v, 1, 64, &a->pp);
        else if (!strcmp(o, "--bundle")) a->bundle_path = v;
        else if (o[0] == '-' && o[1]) return usage("unknown option '%s' for a model", o);
        else if (a->path) return usage("more than one model given ('%s')", o);
        else a->path = o;
        if (!ok) return KT_EXIT_USAGE;
    }
    if (!a->path) return usage("%s", "no model given");
    if (a->conversation) {
        if (a->tokens) return usage("%s", "a conversation takes text: --tokens does not go with -cnv (kiln chat)");
        if (a->check) return usage("%s", "--check does not go with a conversation (-cnv, kiln chat)");
        if (!a->n_given) a->n_new = -1; /* a reply runs to its end of turn */
        a->raw = true;                  /* the replies on stdout, the rest on stderr */
    } else if (!a->tokens == !a->prompt) {
        return usage("%s", "give the prompt as --tokens ID,ID,... or --prompt TEXT (one)");
    }
    if (a->conversation) a->sampling = true; /* as llama-cli: a chat samples (--temp 0: greedy) */
    kiln_status ss = kiln_sampler_check(&a->sampler);
    if (ss) {
        int rc = usage("%s", kiln_status_msg(ss));
        kiln_status_free(ss);
        return rc;
    }
    if (a->check && a->sampling && a->sampler.temp > 0)
        return usage("%s", "--check compares greedy picks; it does not go with sampling (--temp 0 is greedy)");
    if (a->tokens && (a->system || a->chat_template))
        return usage("%s", "-sys and --chat-template format a text prompt; they do not go with --tokens");
    if (a->check && a->cpu) return usage("%s", "--check compares the GPU with the CPU; it does not go with --cpu");
    if (a->tp > 1 && a->pp > 1) return usage("%s", "--tp and --pp: one split or the other, not both");
    if (a->bundle_path && (a->cpu || a->tp > 1 || a->pp > 1))
        return usage("%s", "--bundle runs its program on one GPU: not with --cpu, --tp or --pp");
    return KT_GO_ON;
}

/* " (f32 65, q4_K 145, q6_K 36)": how many of the file's tensors have each type (a quantized
 * file mixes them). */
static void print_type_counts(const kiln_model *m) {
    const kiln_gguf *g = kiln_model_gguf(m);
    int64_t          count[KILN_TYPE_COUNT] = {0};
    for (int64_t i = 0; g && i < kiln_gguf_tensor_count(g); i++) {
        kiln_gguf_tensor t;
        kiln_status      st = kiln_gguf_tensor_info(g, i, &t);
        if (!st && t.has_kiln_type) count[t.type]++;
        kiln_status_free(st);
    }
    const char *sep = " (";
    for (int t = 0; t < KILN_TYPE_COUNT; t++)
        if (count[t]) printf("%s%s %lld", sep, kiln_type_name((kiln_type)t), (long long)count[t]), sep = ", ";
    if (*sep == ',') printf(")");
}

static void print_model(const kt_model_args *a, const kiln_model *m) {
    const kiln_model_hparams *hp = kiln_model_get_hparams(m);
    printf("model %s: %s, %lld layers, n_embd %lld, %lld heads (%lld kv), n_vocab %lld, %s weights", a->path,
           hp->arch, (long long)hp->n_layer, (long long)hp->n_embd, (long long)hp->n_head, (long long)hp->n_head_kv,
           (long long)hp->n_vocab, kiln_ftype_name(hp->ftype));
    print_type_counts(m);
    if (hp->n_expert) printf(", %lld experts (%lld used)", (long long)hp->n_expert, (long long)hp->n_expert_used);
    printf("\n");
}

static void print_ids(const char *label, const int32_t *ids, int64_t n) {
    printf("%s:", label);
    for (int64_t i = 0; i < n; i++) printf(" %d", ids[i]);
    printf("\n");
}

/* Text on one line: control bytes escaped (random-weight models emit anything). */
static void print_escaped(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '\\') fputs("\\\\", stdout);
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c);
    }
}

static void print_text(const kiln_tokenizer *tok, const char *label, const int32_t *ids, int64_t n) {
    char  *text = NULL;
    size_t len = 0;
    if (!tok) return;
    kiln_status st = kiln_detokenize(tok, ids, n, &text, &len);
    if (st) {
        printf("%s: (not decodable: %s)\n", label, kiln_status_msg(st));
        kiln_status_free(st);
        return;
    }
    printf("%s: \"", label);
    print_escaped(text, len);
    printf("\"\n");
    free(text);
}

/* --verbose-prompt: each prompt token and its text, as llama.cpp lists them. */
static void print_prompt_tokens(const kiln_tokenizer *tok, const int32_t *ids, int64_t n) {
    printf("number of tokens in prompt = %lld\n", (long long)n);
    for (int64_t i = 0; i < n; i++) {
        char  *t = NULL;
        size_t len = 0;
        printf("%6d -> '", ids[i]);
        kiln_status st = tok ? kiln_detokenize(tok, &ids[i], 1, &t, &len) : NULL;
        if (!st && t) print_escaped(t, len);
        kiln_status_free(st);
        free(t);
        printf("'\n");
    }
}

static void print_breakdown(const kiln_gen_stats *s) {
    int64_t evals = s->prefill_tokens ? 1 + s->decode_tokens : s->decode_tokens;
    if (evals < 1) return;
    double n = (double)evals;
    printf("stats: warm-up %.1f ms; per evaluation: inputs %.1f us, run %.1f us, logits readback %.1f us, "
           "token pick %.1f us (%lld evaluations)\n", s->warmup_ms, 1000 * s->inputs_ms / n, 1000 * s->run_ms / n,
           1000 * s->readback_ms / n, s->decode_tokens ? 1000 * s->sample_ms / (double)s->decode_tokens : 0.0,
           (long long)evals);
}

void kt_model_print_speed(const kiln_gen_stats *s, bool gpu) {
    printf("prefill: %lld tokens in %.2f ms, %.1f tok/s", (long long)s->prefill_tokens, s->prefill_ms,
           s->prefill_ms > 0 ? 1000.0 * (double)s->prefill_tokens / s->prefill_ms : 0.0);
    if (gpu) printf(" (GPU %.2f ms)", s->prefill_gpu_ms);
    printf("\n");
    if (!s->decode_tokens) return;
    double per = s->decode_ms / (double)s->decode_tokens;
    printf("decode: %lld tokens in %.2f ms, %.1f tok/s, %.3f ms/token", (long long)s->decode_tokens, s->decode_ms,
           1000.0 / per, per);
    if (gpu) printf(" (GPU %.3f ms/token)", s->decode_gpu_ms / (double)s->decode_tokens);
    printf("\n");
}

/* --check: the CPU reference fed the GPU's tokens, step by step. */
typedef struct {
    double worst_nmse;
    int    steps, picks_agree;
} check_result;

static kiln_status check_step(kiln_gen *gpu, kiln_gen *cpu, const int32_t *tok, int64_t n, int64_t n_vocab,
                              check_result *r) {
    const float *lg, *lc;
    kiln_status  st = kiln_gen_eval(gpu, tok, n, &lg);
    if (!st) st = kiln_gen_eval(cpu, tok, n, &lc);
    if (st) return st;
    double e = kb_nmse(lc, lg, KILN_F32, n_vocab);
    if (e > r->worst_nmse || isnan(e)) r->worst_nmse = e;
    r->steps++;
    r->picks_agree += kiln_argmax_f32(lg, n_vocab) == kiln_argmax_f32(lc, n_vocab);
    return NULL;
}

static kiln_status run_check(const kiln_model *m, const kiln_gen_opts *go, const int32_t *prompt, int64_t np,
                             const int32_t *out, int64_t n_new) {
    kiln_gen_opts co = *go;
    co.cpu = true;
    co.progress = NULL;
    kiln_gen   *cpu = NULL, *gpu = NULL;
    kiln_status st = kiln_gen_new(m, &co, &cpu);
    if (!st) st = kiln_gen_new(m, go, &gpu);
    check_result r = {0};
    int64_t      nv = kiln_model_get_hparams(m)->n_vocab;
    if (!st) st = check_step(gpu, cpu, prompt, np, nv, &r);
    for (int64_t i = 0; !st && i + 1 < n_new; i++) st = check_step(gpu, cpu, &out[i], 1, nv, &r);
    if (!st)
        printf("check: %d steps against the CPU reference: worst logits NMSE %.3g, greedy picks agree in %d of %d\n",
               r.steps, r.worst_nmse, r.picks_agree, r.steps);
    kiln_gen_free(cpu);
    kiln_gen_free(gpu);
    if (!st && (r.picks_agree != r.steps || !(r.worst_nmse <= 5e-4)))
        st = kb_error(KILN_ERR_INVALID, "check failed: the GPU and the CPU reference disagree");
    return st;
}

/* The prompt's ids (malloc'd): --tokens as parsed, or --prompt tokenized. */
static kiln_status prompt_ids(const kt_model_args *a, const kiln_model *m, const kiln_tokenizer *tok, int32_t **ids,
                              int64_t *n) {
    if (a->tokens) {
        *n = a->nids;
        *ids = malloc(sizeof **ids * (size_t)a->nids);
        if (*ids) memcpy(*ids, a->ids, sizeof **ids * (size_t)a->nids);
        return *ids ? NULL : kb_oom();
    }
    if (!tok) return kb_error(KILN_ERR_INVALID, "--prompt: the model has no tokenizer kiln can use; give --tokens");
    char       *text = NULL;
    kiln_status st = a->system || a->chat_template ? kt_chat_prompt(a, m, &text) : NULL;
    const char *p = text ? text : a->prompt;
    if (!st) st = kiln_tokenize(tok, p, strlen(p), ids, n);
    if (!st && *n == 0) st = kb_error(KILN_ERR_INVALID, "--prompt: the text gives no tokens");
    free(text);
    return st;
}

kiln_gen_opts kt_model_gen_opts(const kt_model_args *a, kiln_compile_opts *co, kiln_session_opts *so, kt_progress *ps) {
    co->arch = a->arch;
    co->cache_dir = a->cache_dir;
    co->dump_dir = a->dump;
    co->jobs = a->jobs;
    co->no_fuse = a->no_fuse;
    co->no_fuse_passes = a->no_fuse_passes[0] ? a->no_fuse_passes : NULL;
    co->cache_mode = a->no_cache ? KILN_CACHE_OFF : KILN_CACHE_ON;
    co->progress = kt_progress_count;
    co->progress_user = ps;
    so->no_cuda_graph = a->no_graph;
    /* the sampler, so that kiln_gen_new builds the decode program's "sample" output when the
     * GPU can run it (kiln_sampler_on_gpu: no penalties, top_k 1 .. 256) */
    return (kiln_gen_opts){.n_ctx = a->n_ctx, .n_batch = a->n_batch, .cpu = a->cpu, .tp = a->tp, .pp = a->pp, .compile = co, .session = so, .bundle = a->bundle,
                           .progress = kt_progress_bytes, .progress_user = ps + 1,
                           .sampler = a->sampling ? &a->sampler : NULL};
}

void kt_model_print_load(const kiln_gen *g, bool gpu) {
    kiln_gen_stats s;
    kiln_gen_get_stats(g, &s);
    if (!gpu) return;
    kt_print_compile(&s.compile, s.compile_ms);
    printf("weights: %.3f GB uploaded in %.0f ms (%.1f GB/s)\n", (double)s.weight_bytes / 1e9, s.load_ms,
           s.load_ms > 0 ? (double)s.weight_bytes / 1e6 / s.load_ms : 0.0);
}

/* Whether the run fits the model, checked before anything compiles: each id is a token of
 * the model, --n-ctx and --n-batch fit its context (kt_model_ctx, which resolves them), and the
 * context holds the prompt and every generated token but the last (which is never fed back).
 * False after a usage message naming the flags and the numbers. */
static bool fits(kt_model_args *a, const kiln_model_hparams *hp, const int32_t *prompt, int64_t np) {
    for (int64_t i = 0; i < np; i++)
        if (prompt[i] >= hp->n_vocab)
            return kt_flag_usage("run", "%s: id %d is not a token of this model (n_vocab %lld: ids 0 .. %lld)",
                                 a->tokens ? "--tokens" : "--prompt", prompt[i], (long long)hp->n_vocab,
                                 (long long)hp->n_vocab - 1);
    bool    given = a->n_ctx > 0;
    if (!kt_model_ctx("run", hp, &a->n_ctx, &a->n_batch)) return false;
    /* --context-shift frees room as generation needs it: the prompt alone must fit. */
    int64_t need = np + (a->n_new > 0 && !a->context_shift ? a->n_new - 1 : 0);
    if (need > a->n_ctx)
        return kt_flag_usage("run", "the prompt (%lld tokens) plus -n %lld needs a context of %lld (the last token "
                             "generated is not stored), but %s is %lld%s", (long long)np, (long long)a->n_new,
                             (long long)need, given ? "--n-ctx" : "the context (--n-ctx's default)",
                             (long long)a->n_ctx, a->context_shift || np > a->n_ctx ? "" : " (or --context-shift)");
    return true;
}

/* --dump-logits: the prompt evaluated again from an empty context, its last token's logits into
 * `path` as they are in memory (f32; kiln supports little-endian hosts only). */
static kiln_status dump_logits(kiln_gen *g, const int32_t *prompt, int64_t np, int64_t n_vocab, const char *path) {
    const float *lg;
    kiln_gen_reset(g);
    kiln_status st = kiln_gen_eval(g, prompt, np, &lg);
    if (!st) st = kb_write_file(path, lg, sizeof *lg * (size_t)n_vocab);
    return st ? kb_wrap(st, "--dump-logits %s", path) : NULL;
}

/* ---- streaming: the text of the generated tokens, printed as they come ----------------------- */


static void emit(kt_stream *s, const char *t, size_t upto) {
    if (upto <= s->shown) return;
    if (s->a->raw) fwrite(t + s->shown, 1, upto - s->shown, s->out);
    else print_escaped(t + s->shown, upto - s->shown);
    fflush(s->out);
    s->shown = upto;
}

/* Appends the text the newest id adds (kiln_detokenize_next: a constant cost a token). */
static kiln_status append_text(kt_stream *s) {
    char       *add = NULL;
    size_t      n = 0;
    kiln_status st = kiln_detokenize_next(s->tok, s->n >= 2 ? s->ids[s->n - 2] : -1, s->ids[s->n - 1], &add, &n);
    if (!st && s->len + n + 1 > s->tcap) {
        size_t cap = s->tcap ? s->tcap : 4096;
        while (cap < s->len + n + 1) cap *= 2;
        char *t = realloc(s->text, cap);
        if (!t) st = kb_oom();
        else s->text = t, s->tcap = cap;
    }
    if (!st) {
        memcpy(s->text + s->len, add, n);
        s->len += n;
        s->text[s->len] = 0;
    }
    free(add);
    return st;
}

bool kt_stream_token(void *user, int32_t id) {
    kt_stream *s = user;
    if (s->n == s->cap) {
        int64_t  cap = s->cap ? 2 * s->cap : 256;
        int32_t *ids = realloc(s->ids, sizeof *ids * (size_t)cap);
        if (!ids) {
            s->err = kb_oom();
            return true;
        }
        s->ids = ids, s->cap = cap;
    }
    s->ids[s->n++] = id;
    if (!s->tok) return false;
    if ((s->err = append_text(s))) return true;
    emit(s, s->text, kiln_text_showable(s->text, s->len, s->shown, s->a->stops, s->a->nstops, &s->stop));
    return s->stop >= 0;
}

void kt_stream_finish(kt_stream *s) {
    if (s->tok && s->stop < 0 && !s->err && s->text) emit(s, s->text, s->len);
}

static void print_stop(const kt_model_args *a, const kt_stream *s, kiln_stop why, const kiln_gen *g) {
    switch (why) {
    case KILN_STOP_EOG: printf("stop: end of generation token\n"); break;
    case KILN_STOP_CALLER: printf("stop: stop string \"%s\" (-r)\n", a->stops[s->stop >= 0 ? s->stop : 0]); break;
    case KILN_STOP_CONTEXT: printf("stop: the context is full (%lld tokens)\n", (long long)kiln_gen_pos(g)); break;
    default: printf("stop: -n %lld tokens\n", (long long)a->n_new); break;
    }
}

/* --context-shift, when the cache is full: llama.cpp's shift (the first --keep tokens stay, half
 * of the rest go), then generation goes on from the last token (never fed back), up to what -n
 * leaves. gs gathers the stats of both parts. */
kiln_status kt_model_shift_go_on(const kt_model_args *a, kiln_gen *g, int64_t np, bool bos, kt_stream *s,
                                 kiln_gen_params *gp, kiln_stop *why, kiln_gen_stats *gs) {
    /* as llama-cli: a prompt's bos is always kept */
    int64_t keep = a->keep < 0 || a->keep > np ? np : a->keep + (bos && a->keep < np), pos = kiln_gen_pos(g);
    int64_t discard = (pos - keep) / 2;
    if (discard < 1) return kb_error(KILN_ERR_INVALID, "--context-shift: --keep %lld leaves nothing to drop of %lld tokens",
                                     (long long)keep, (long long)pos);
    kiln_status st = kiln_gen_shift(g, keep, discard);
    if (st) return st;
    s->shifts++, s->shift_keep = keep, s->dropped += discard; /* said after the text */
    kiln_gen_params more = *gp;
    if (gp->n_predict >= 0) more.n_predict = gp->n_predict - s->n;
    int32_t        last = s->ids[s->n - 1]; /* the prompt of the rest: a prompt is not reported */
    kiln_gen_stats g2;
    st = kiln_gen_generate(g, &last, 1, &more, NULL, why, &g2);
    gs->decode_tokens += g2.decode_tokens + g2.prefill_tokens, gs->decode_ms += g2.decode_ms + g2.prefill_ms;
    gs->decode_gpu_ms += g2.decode_gpu_ms + g2.prefill_gpu_ms;
    return st;
}

static kiln_status generate(const kt_model_args *a, const kiln_model *m, const kiln_tokenizer *tok, const int32_t *prompt,
                            int64_t np, FILE *text) {
    kiln_compile_opts co = {0};
    kiln_session_opts so = {0};
    kt_progress       ps[2] = {{.tty = isatty(2)}, {.tty = isatty(2)}};
    kiln_gen_opts     go = kt_model_gen_opts(a, &co, &so, ps);
    kiln_gen         *g = NULL;
    kiln_gen_stats    gs;
    int32_t          *eog = NULL;
    int64_t           neog = 0, n = 0;
    kiln_stop         why = KILN_STOP_NONE;
    kt_stream         s = {.a = a, .tok = tok, .out = text, .stop = -1};
    kiln_status       st = kiln_gen_new(m, &go, &g);
    if (!st && tok && !a->ignore_eos) st = kiln_tokenizer_eog(tok, kiln_model_gguf(m), &eog, &neog);
    if (!st) {
        kt_model_print_load(g, !a->cpu);
        print_ids("prompt", prompt, np);
        print_text(tok, "prompt text", prompt, np);
        if (a->verbose_prompt) print_prompt_tokens(tok, prompt, np);
        if (tok && !a->raw) printf("text: \"");
        fflush(stdout);
        kiln_gen_params gp = {.n_predict = a->n_new, .eog = eog, .n_eog = neog, .on_token = kt_stream_token, .user = &s,
                              .sampler = a->sampling ? &a->sampler : NULL};
        st = kiln_gen_generate(g, prompt, np, &gp, &n, &why, &gs);
        while (!st && !s.err && why == KILN_STOP_CONTEXT && a->context_shift && s.n > 0)
            st = kt_model_shift_go_on(a, g, np, tok && np > 0 && prompt[0] == kiln_tokenizer_bos(tok), &s, &gp, &why, &gs);
        if (!st) st = s.err;
        kt_stream_finish(&s);
        if (tok && !a->raw) printf("\"\n");
        if (tok && a->raw) fputc('\n', text), fflush(text);
    }
    if (!st) {
        print_ids("generated", s.ids, s.n);
        print_stop(a, &s, why, g);
        if (s.shifts)
            printf("context shifts: %d (each kept the first %lld tokens; %lld tokens dropped in all)\n", s.shifts,
                   (long long)s.shift_keep, (long long)s.dropped);
        kt_model_print_speed(&gs, !a->cpu);
        if (a->stats) print_breakdown(&gs);
    }
    if (!st && a->dump_logits) st = dump_logits(g, prompt, np, kiln_model_get_hparams(m)->n_vocab, a->dump_logits);
    kiln_gen_free(g); /* before --check's sessions: one model's weights on the GPU at a time */
    if (!st && a->check) st = run_check(m, &go, prompt, np, s.ids, s.n);
    free(eog);
    free(s.ids);
    free(s.text);
    return st;
}

/* --raw: the generated text alone on stdout, as llama-cli prints it, and everything else (the
 * model, compile and speed lines of the shared printers) on stderr. Gives the text's stream. */
static FILE *raw_streams(bool raw, int *saved) {
    *saved = -1;
    if (!raw) return stdout;
    fflush(stdout);
    int   fd = dup(1);
    FILE *text = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!text) {
        if (fd >= 0) close(fd);
        return stdout;
    }
    *saved = dup(1);
    dup2(2, 1);
    return text;
}

static void raw_restore(FILE *text, int saved) {
    if (saved < 0) return;
    fflush(stdout);
    fclose(text);
    dup2(saved, 1);
    close(saved);
}

static int run_model(kt_model_args *a) {
    kiln_model     *m = NULL;
    kiln_tokenizer *tok = NULL;
    int32_t        *prompt = NULL;
    int64_t         np = 0;
    int             rc = KT_EXIT_OK;
    int             saved;
    FILE           *text = raw_streams(a->raw, &saved);
    kiln_status     st = a->bundle_path ? kiln_bundle_open(a->bundle_path, &a->bundle) : NULL;
    if (st) st = kb_wrap(st, "--bundle %s", a->bundle_path);
    if (!st) st = kiln_model_open(a->path, &m);
    if (!st) print_model(a, m);
    kiln_status ts = st ? NULL : kiln_tokenizer_from_gguf(kiln_model_gguf(m), &tok);
    if (ts && a->prompt) st = kb_wrap(ts, "--prompt");
    else kiln_status_free(ts); /* without a usable vocabulary ids are printed alone */
    if (!st && !a->conversation) st = prompt_ids(a, m, tok, &prompt, &np);
    if (!st && !fits(a, kiln_model_get_hparams(m), prompt, np)) rc = KT_EXIT_USAGE;
    if (!st && rc == KT_EXIT_OK) st = a->conversation ? kt_chat_converse(a, m, tok, text) : generate(a, m, tok, prompt, np, text);
    free(prompt);
    kiln_tokenizer_free(tok);
    kiln_model_close(m);
    kiln_bundle_free(a->bundle);
    a->bundle = NULL;
    raw_restore(text, saved);
    return st ? kt_fail(NULL, st) : rc;
}

int kt_run_model(int argc, char **argv) {
    kt_model_args a = {0};
    int     rc = parse(argc, argv, &a);
    if (rc == KT_GO_ON) rc = run_model(&a);
    free(a.ids);
    free(a.file_text);
    return rc;
}
