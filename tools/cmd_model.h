/* kiln run MODEL.gguf: generation with a GGUF model (tools/cmd_model.c); part of the run
 * command (tools/cmd_run.c), which hands it a command line naming a GGUF file. */
#ifndef KILN_TOOLS_CMD_MODEL_H
#define KILN_TOOLS_CMD_MODEL_H

#include <stdbool.h>

/* 'kiln run MODEL.gguf --help', and the end of 'kiln help run'. */
extern const char kt_run_model_help[];
/* Whether option arg of a model run takes a value (the next argument). */
bool kt_run_model_takes_value(const char *arg);
/* -m/--model (llama.cpp's): its value is the model, so `kiln run -m FILE.gguf` is a model run. */
bool kt_run_model_path_flag(const char *arg);
/* argv[0] is "run"; returns a kt_exit (tools/cmd.h). */
int  kt_run_model(int argc, char **argv);

/* ---- shared by kiln run MODEL (tools/cmd_model.c) and kiln chat (tools/cmd_chat.c) ---------- */

#include "kiln.h"
#include "tools/progress.h"

#include <stdint.h>
#include <stdio.h>

#define KT_MODEL_MAX_STOPS 16

typedef struct {
    const char *path, *tokens, *prompt, *arch, *cache_dir, *dump, *dump_logits;
    char       *file_text; /* -f/--file: the prompt read from a file (owned) */
    int32_t    *ids; /* --tokens, parsed */
    int64_t     nids;
    int64_t     n_new, n_ctx, n_batch;
    int         jobs;
    int         tp; /* --tp G: tensor parallelism over G GPUs (0: none) */
    int         pp; /* --pp G: pipeline split over G GPUs (0: none) */
    const char  *bundle_path;  /* --bundle FILE.kiln: the program from kiln compile MODEL.gguf -o */
    kiln_bundle *bundle;       /* it, opened by run_model */
    bool        check, cpu, no_graph, no_cache, no_fuse, stats, ignore_eos, raw, verbose_prompt;
    char        no_fuse_passes[256]; /* --no-fuse=NAME[,NAME]: the names, comma-separated */
    const char *stops[KT_MODEL_MAX_STOPS]; /* -r/--reverse-prompt */
    int         nstops;
    const char *system, *chat_template; /* -sys, --chat-template */
    bool        conversation, n_given;   /* -cnv (kiln chat); -n was given */
    bool        context_shift;           /* --context-shift */
    int64_t     keep;                    /* --keep: tokens of the prompt a shift keeps (-1: all) */
    kiln_sampler_params sampler;         /* the sampling flags (llama.cpp's defaults) */
    bool        sampling;                /* one was given (a conversation samples anyway) */
} kt_model_args;

/* The generated text, printed as it comes (kiln_gen_params.on_token = kt_stream_token, user =
 * the stream): whole UTF-8 characters, text that may begin a -r stop string held back, and
 * generation stopped at one (the text ends before it). kt_stream_finish prints what was held
 * back for a stop string that never came. */
typedef struct {
    const kt_model_args  *a;
    const kiln_tokenizer *tok;  /* NULL: ids only */
    FILE                 *out;  /* the text's stream */
    int32_t              *ids;  /* the generated tokens */
    int64_t               n, cap;
    char                 *text;  /* their text (owned), len bytes, NUL-terminated */
    size_t                len, tcap;
    size_t                shown; /* bytes of the text printed so far */
    int                   stop;  /* the -r string that ended generation, or -1 */
    kiln_status           err;   /* a detokenizing failure: generation stops */
    int                   shifts;  /* --context-shift: shifts made, tokens kept by each, dropped in all */
    int64_t               shift_keep, dropped;
} kt_stream;
bool          kt_stream_token(void *user, int32_t id);
void          kt_stream_finish(kt_stream *s);
/* The generator's options from the flags (co, so and ps[2] hold what it points to). */
kiln_gen_opts kt_model_gen_opts(const kt_model_args *a, kiln_compile_opts *co, kiln_session_opts *so, kt_progress *ps);
void          kt_model_print_load(const kiln_gen *g, bool gpu);
void          kt_model_print_speed(const kiln_gen_stats *s, bool gpu);
/* --context-shift after generation stopped at a full cache: kiln_gen_shift (the first --keep
 * tokens of the np-token prompt stay, and its bos; half of the rest go), then generation goes on
 * from the last token reported, for what gp's -n leaves; gs gathers the stats. */
kiln_status   kt_model_shift_go_on(const kt_model_args *a, kiln_gen *g, int64_t np, bool bos, kt_stream *s,
                                   kiln_gen_params *gp, kiln_stop *why, kiln_gen_stats *gs);
/* -sys / --chat-template with a text prompt: the prompt rendered as the user's turn (caller
 * frees *text). */
kiln_status   kt_chat_prompt(const kt_model_args *a, const kiln_model *m, char **text);
/* -cnv / kiln chat: the conversation over stdin, replies streamed to text. */
kiln_status   kt_chat_converse(const kt_model_args *a, const kiln_model *m, const kiln_tokenizer *tok, FILE *text);

#endif
