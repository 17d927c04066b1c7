/* kiln chat MODEL.gguf: a conversation, as 'kiln run MODEL.gguf -cnv' (tools/cmd_model.c), and
 * the chat-template side of a model run: the template chosen, a text prompt rendered as a user
 * turn (-sys, --chat-template), and the conversation loop (kt_chat_converse). */
#include "tools/cmd.h"
#include "tools/cmd_model.h"

#include "base/base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- chat templates ---------------------------------------------------------------------------- */

/* The template: --chat-template, else the one the GGUF's tokenizer.chat_template is, else chatml
 * (llama.cpp's choice for a model without one). Says which. */
static kiln_status chat_template(const kt_model_args *a, const kiln_model *m, const char **name) {
    if (a->chat_template) {
        *name = a->chat_template;
        printf("chat template: %s (--chat-template)\n", *name);
        return NULL;
    }
    char       *text = NULL;
    kiln_status st = kiln_chat_template_from_gguf(kiln_model_gguf(m), &text);
    if (!st && !text) {
        *name = "chatml";
        printf("chat template: chatml (the model has none; choose one with --chat-template)\n");
        return NULL;
    }
    if (!st) st = kiln_chat_template_detect(text, name);
    free(text);
    if (st) return kb_wrap(st, "the model's tokenizer.chat_template (choose a template with --chat-template)");
    printf("chat template: %s (the model's)\n", *name);
    return NULL;
}

/* Messages of a conversation: the texts are owned. */
typedef struct {
    kiln_chat_msg *m;
    size_t         n, cap;
} chat_log;

static kiln_status chat_push(chat_log *c, const char *role, const char *text, size_t len) {
    if (c->n == c->cap) {
        size_t         cap = c->cap ? 2 * c->cap : 8;
        kiln_chat_msg *m = realloc(c->m, cap * sizeof *m);
        if (!m) return kb_oom();
        c->m = m, c->cap = cap;
    }
    char *t = malloc(len + 1);
    if (!t) return kb_oom();
    memcpy(t, text, len);
    t[len] = 0;
    c->m[c->n++] = (kiln_chat_msg){role, t};
    return NULL;
}

static void chat_free(chat_log *c) {
    for (size_t i = 0; i < c->n; i++) free((char *)c->m[i].content);
    free(c->m);
}

/* -sys or --chat-template with a text prompt: the prompt as the user's one turn (after the
 * system message), rendered with the template and the assistant's header. */
kiln_status kt_chat_prompt(const kt_model_args *a, const kiln_model *m, char **text) {
    const char *name;
    chat_log    c = {0};
    kiln_status st = chat_template(a, m, &name);
    if (!st && a->system) st = chat_push(&c, "system", a->system, strlen(a->system));
    if (!st) st = chat_push(&c, "user", a->prompt, strlen(a->prompt));
    if (!st) st = kiln_chat_apply(name, c.m, c.n, true, text);
    chat_free(&c);
    return st;
}

/* ---- conversation: -cnv, kiln chat -------------------------------------------------------------- */

/* The next user message (a line of stdin, the first one -p/-f's text); false at end of input. */
static bool next_message(const kt_model_args *a, bool first, char **line, size_t *cap, size_t *len) {
    if (first && a->prompt) {
        *len = strlen(a->prompt);
        if (*cap < *len + 1) {
            free(*line);
            if (!(*line = malloc(*cap = *len + 1))) return false;
        }
        memcpy(*line, a->prompt, *len + 1);
        return true;
    }
    for (;;) {
        if (isatty(0)) fputs("\n> ", stderr);
        ssize_t got = getline(line, cap, stdin);
        if (got < 0) return false;
        while (got > 0 && ((*line)[got - 1] == '\n' || (*line)[got - 1] == '\r')) (*line)[--got] = 0;
        if (got > 0) {
            *len = (size_t)got;
            return true;
        }
    }
}

/* Tokens of text to append to the cache: no bos (it is there already). */
static kiln_status turn_ids(const kiln_tokenizer *tok, const char *text, bool with_bos, int32_t **ids, int64_t *n) {
    kiln_status st = kiln_tokenize(tok, text, strlen(text), ids, n);
    int32_t     bos = kiln_tokenizer_bos(tok);
    if (!st && !with_bos && *n > 0 && bos >= 0 && (*ids)[0] == bos) memmove(*ids, *ids + 1, sizeof **ids * (size_t)--*n);
    return st;
}

typedef struct {
    kiln_gen       *g;
    const char     *tmpl;
    chat_log        log;
    char           *fed;      /* the text the cache holds: a prefix of the next rendering, usually */
    char           *reply_fed; /* of the last reply, the text the cache holds */
    bool            shifted;  /* a context shift dropped some of it: no longer a prefix */
    kiln_gen_stats  total;
    int             turns;
} chat_state;

/* After a context shift the cache holds no prefix of the rendering, but it ends with the last
 * reply as fed: the text to evaluate is what the rendering has after that reply's fed part
 * (the rest of the reply, its end of turn) and then what the new message adds (llama.cpp's
 * common_chat_format_single). NULL in *text when the reply cannot be found in the rendering (a
 * template that rewrites it): the caller starts over. */
static kiln_status shifted_text(const chat_state *c, char **text) {
    *text = NULL;
    size_t n = c->log.n;
    if (n < 2 || strcmp(c->log.m[n - 2].role, "assistant") != 0) return NULL;
    const char *reply = c->log.m[n - 2].content;
    size_t      rf = strlen(c->reply_fed);
    if (strncmp(reply, c->reply_fed, rf) != 0) return NULL;
    char       *prev = NULL, *delta = NULL;
    kiln_status st = kiln_chat_apply(c->tmpl, c->log.m, n - 1, false, &prev);
    if (!st) st = kiln_chat_apply_delta(c->tmpl, c->log.m, n, true, &delta);
    const char *at = NULL;
    for (const char *p = prev ? strstr(prev, reply) : NULL; p; p = strstr(p + 1, reply)) at = p; /* the last */
    if (!st && at && (*text = malloc(strlen(at + rf) + strlen(delta) + 1))) sprintf(*text, "%s%s", at + rf, delta);
    else if (!st && at) st = kb_oom();
    free(prev);
    free(delta);
    return st;
}

/* --context-shift before a turn of n new tokens: shifts until they fit with room to answer. */
static kiln_status make_room(const kt_model_args *a, chat_state *c, int64_t n) {
    int64_t ctx = kiln_gen_n_ctx(c->g);
    while (kiln_gen_pos(c->g) + n >= ctx) {
        int64_t pos = kiln_gen_pos(c->g), keep = a->keep > 0 && a->keep < pos ? a->keep : 0, drop = (pos - keep) / 2;
        if (drop < 1) return kb_error(KILN_ERR_INVALID, "the turn needs %lld tokens, more than the context of %lld (-c)",
                                      (long long)n, (long long)ctx);
        kiln_status st = kiln_gen_shift(c->g, keep, drop);
        if (st) return st;
        c->shifted = true;
    }
    return NULL;
}

/* One turn: the conversation rendered with the assistant's header; when it starts with the text
 * in the cache, only the rest is evaluated (llama.cpp's common_chat_format_single), else the
 * cache starts over (a template that rewrites earlier turns, e.g. trimming a reply). */
static kiln_status chat_turn(const kt_model_args *a, chat_state *c, const kiln_tokenizer *tok, kt_stream *s,
                             const int32_t *eog, int64_t neog, kiln_stop *why) {
    char       *full = NULL;
    int32_t    *ids = NULL;
    int64_t     n = 0;
    kiln_status st = kiln_chat_apply(c->tmpl, c->log.m, c->log.n, true, &full);
    if (st) return st;
    size_t fl = strlen(c->fed);
    char  *after_shift = NULL;
    if (c->shifted) st = shifted_text(c, &after_shift);
    bool keep = !st && kiln_gen_pos(c->g) > 0 &&
                (after_shift ? *after_shift != 0 : !c->shifted && strncmp(full, c->fed, fl) == 0 && full[fl]);
    if (!keep) kiln_gen_reset(c->g), c->shifted = false;
    if (!st) st = turn_ids(tok, keep ? (after_shift ? after_shift : full + fl) : full, !keep, &ids, &n);
    free(after_shift);
    if (!st && a->context_shift) st = make_room(a, c, n);
    if (!st && kiln_gen_pos(c->g) + n >= kiln_gen_n_ctx(c->g))
        st = kb_error(KILN_ERR_INVALID, "the conversation needs %lld tokens, more than the context of %lld (-c; "
                      "--context-shift drops old turns)", (long long)(kiln_gen_pos(c->g) + n),
                      (long long)kiln_gen_n_ctx(c->g));
    if (!st && a->verbose_prompt)
        printf("turn %d: %lld new tokens (%s), %lld in the context before\n", ++c->turns, (long long)n,
               keep ? "the cache kept" : "the cache started over", (long long)kiln_gen_pos(c->g));
    fflush(stdout);
    kiln_gen_stats gs;
    if (!st) {
        kiln_gen_params gp = {.n_predict = a->n_new, .eog = eog, .n_eog = neog, .on_token = kt_stream_token, .user = s,
                              .sampler = a->sampling ? &a->sampler : NULL};
        st = kiln_gen_generate(c->g, ids, n, &gp, NULL, why, &gs);
        while (!st && !s->err && *why == KILN_STOP_CONTEXT && a->context_shift && s->n > 0) {
            st = kt_model_shift_go_on(a, c->g, 0, false, s, &gp, why, &gs);
            c->shifted = true;
        }
    }
    if (!st) st = s->err;
    kt_stream_finish(s);
    free(ids);
    if (st) {
        free(full);
        return st;
    }
    c->total.prefill_tokens += gs.prefill_tokens, c->total.prefill_ms += gs.prefill_ms;
    c->total.decode_tokens += gs.decode_tokens, c->total.decode_ms += gs.decode_ms;
    c->total.prefill_gpu_ms += gs.prefill_gpu_ms, c->total.decode_gpu_ms += gs.decode_gpu_ms;
    /* The reply as shown (up to a stop string), and the text now in the cache: every pick but
     * the last, which an end of generation is (it is not among the ids). */
    char  *reply = NULL, *fed_tail = NULL;
    size_t rl = 0, fl2 = 0;
    int64_t nfed = *why == KILN_STOP_EOG || s->n == 0 ? s->n : s->n - 1;
    st = kiln_detokenize(tok, s->ids, s->n, &reply, &rl);
    if (!st) st = kiln_detokenize(tok, s->ids, nfed, &fed_tail, &fl2);
    if (!st) st = chat_push(&c->log, "assistant", reply, s->stop >= 0 ? s->shown : rl);
    if (!st) {
        char *f = malloc(strlen(full) + fl2 + 1);
        if (!f) st = kb_oom();
        else {
            sprintf(f, "%s%.*s", full, (int)fl2, fed_tail);
            free(c->fed);
            c->fed = f;
        }
    }
    if (!st) {
        free(c->reply_fed);
        c->reply_fed = fed_tail, fed_tail = NULL;
    }
    free(reply);
    free(fed_tail);
    free(full);
    return st;
}

kiln_status kt_chat_converse(const kt_model_args *a, const kiln_model *m, const kiln_tokenizer *tok, FILE *text) {
    if (!tok) return kb_error(KILN_ERR_INVALID, "a conversation needs the model's tokenizer, and kiln cannot use it");
    kiln_compile_opts co = {0};
    kiln_session_opts so = {0};
    kt_progress       ps[2] = {{.tty = isatty(2)}, {.tty = isatty(2)}};
    kiln_gen_opts     go = kt_model_gen_opts(a, &co, &so, ps);
    chat_state        c = {.fed = strdup("")};
    int32_t          *eog = NULL;
    int64_t           neog = 0;
    char             *line = NULL;
    size_t            cap = 0, len = 0;
    kiln_status       st = c.fed ? chat_template(a, m, &c.tmpl) : kb_oom();
    if (!st) st = kiln_gen_new(m, &go, &c.g);
    if (!st && !a->ignore_eos) st = kiln_tokenizer_eog(tok, kiln_model_gguf(m), &eog, &neog);
    if (!st) kt_model_print_load(c.g, !a->cpu);
    if (!st && a->system) st = chat_push(&c.log, "system", a->system, strlen(a->system));
    for (bool first = true; !st && next_message(a, first, &line, &cap, &len); first = false) {
        kt_stream s = {.a = a, .tok = tok, .out = text, .stop = -1};
        kiln_stop why = KILN_STOP_NONE;
        st = chat_push(&c.log, "user", line, len);
        if (!st) st = chat_turn(a, &c, tok, &s, eog, neog, &why);
        fputc('\n', text);
        fflush(text);
        free(s.ids);
        free(s.text);
        if (!st && why == KILN_STOP_CONTEXT)
            st = kb_error(KILN_ERR_INVALID, "the context is full (%lld tokens, -c; --context-shift drops old turns)",
                          (long long)kiln_gen_pos(c.g));
    }
    if (!st) kt_model_print_speed(&c.total, !a->cpu);
    free(line);
    free(eog);
    free(c.fed);
    free(c.reply_fed);
    chat_free(&c.log);
    kiln_gen_free(c.g);
    return st;
}


static const char summary[] =
    "  chat MODEL.gguf talk with a model: lines of stdin are user messages, replies stream on\n"
    "                  stdout, rendered with the model's chat template ('kiln run MODEL -cnv')\n";

static const char help[] =
    "usage: kiln chat MODEL.gguf [-sys TEXT] [--chat-template NAME] [-n N] [-c N] [run options]\n"
    "  the same as 'kiln run MODEL.gguf -cnv': each line of stdin is a user message (-p TEXT, if\n"
    "  given, is the first), each reply streams on stdout until the model ends its turn (or -n N\n"
    "  tokens); everything else goes to stderr. The KV cache keeps the conversation, so each\n"
    "  turn evaluates only its new tokens. End the conversation with end of input (Ctrl-D).\n"
    "  The options are kiln run's for a model ('kiln help run').\n";

static int chat(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return kt_print_help("chat");
    char **args = malloc(sizeof *args * (size_t)(argc + 2));
    if (!args) return kt_fail("chat", kb_oom());
    memcpy(args, argv, sizeof *args * (size_t)argc);
    args[argc] = "-cnv";
    args[argc + 1] = NULL;
    int rc = kt_run_model(argc + 1, args);
    free(args);
    return rc;
}

const kt_cmd kt_cmd_chat = {"chat", summary, help, NULL, chat};
