/* serve/ internals: `kiln serve`, an OpenAI-compatible HTTP API over kiln_gen (issue 28). This
 * header is the request/response layer (serve/api.c): a request body parsed and checked into
 * an sv_request, or an sv_error that becomes an OpenAI-style error response, and the JSON
 * bodies the API answers with. JSON through jansson (Debian's libjansson, linked statically).
 * Prefix sv_. */
#ifndef KILN_SERVE_H
#define KILN_SERVE_H

#include "kiln.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    SV_COMPLETION, /* POST /v1/completions: a prompt text */
    SV_CHAT,       /* POST /v1/chat/completions: messages rendered with the chat template */
} sv_kind;

#define SV_MAX_STOP 4 /* OpenAI's limit of stop strings */

/* A checked request. Strings are owned (sv_request_free). */
typedef struct {
    sv_kind        kind;
    char          *prompt;   /* completion: the text (NULL when given as token ids) */
    int32_t       *prompt_ids; /* completion: token ids given instead of text */
    int64_t        n_prompt_ids;
    kiln_chat_msg *msgs;     /* chat: role and content of each message */
    size_t         n_msgs;
    int64_t        max_tokens; /* -1: until a stop, an end-of-generation token or the context's end */
    kiln_sampler_params sampler; /* temperature, top_p, top_k, min_p, seed; llama.cpp's defaults */
    char          *stop[SV_MAX_STOP];
    int            n_stop;
    bool           stream;
    bool           include_usage; /* stream_options.include_usage: a last chunk with the usage */
} sv_request;

/* An error answer: the HTTP status, OpenAI's error type ("invalid_request_error", ...), the
 * message and the offending parameter ("" when none). */
typedef struct {
    int  status;
    char type[32];
    char message[320];
    char param[32];
    char code[32]; /* OpenAI's code ("model_not_found", ...; "" when none) */
} sv_error;

/* Fills e (returns false, for `return sv_fail(...)`). */
bool sv_fail(sv_error *e, int status, const char *type, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* Parses and checks body (len bytes) as a request of kind for the model served as model_id:
 * true with *out filled, else false with *e (400 for a malformed body, a wrong type or a value
 * out of range, naming the parameter; 404 for another model). n_vocab bounds token ids. */
bool sv_parse(sv_kind kind, const char *body, size_t len, const char *model_id, int64_t n_vocab, sv_request *out,
              sv_error *e);
void sv_request_free(sv_request *r);

/* The answers, NUL-terminated JSON the caller frees (NULL: out of memory). created is a Unix
 * time, id the request's ("cmpl-..." or "chatcmpl-..."). finish: "stop" or "length". */
typedef struct {
    const char *id, *model;
    int64_t     created;
} sv_meta;
char *sv_render_error(const sv_error *e);
char *sv_render_result(sv_kind kind, const sv_meta *m, const char *text, size_t len, const char *finish,
                       int64_t prompt_tokens, int64_t completion_tokens);
/* One streamed chunk: a piece of text (role: the chat's first chunk, which names the
 * assistant's role; finish non-NULL: the last, with an empty delta). */
char *sv_render_chunk(sv_kind kind, const sv_meta *m, const char *text, size_t len, bool role, const char *finish);
/* The usage chunk of stream_options.include_usage (no choices). */
char *sv_render_usage(sv_kind kind, const sv_meta *m, int64_t prompt_tokens, int64_t completion_tokens);
/* GET /v1/models: the one model served. */
char *sv_render_models(const char *model_id, int64_t created);

/* ---- the engine (serve/engine.c): slots of one batch, and a queue -------------------------
 * n_slots sequences of one kiln_batch (one program, one KV cache; on the CPU reference with cpu)
 * stepped together by one thread, each slot taking a request from a queue of at most queue_max
 * waiting ones; a request's text reaches its sink as it is generated. */
typedef struct sv_engine sv_engine;
typedef struct sv_job    sv_job;
typedef struct {
    /* A piece of the answer's text: whole UTF-8 characters, never a part that may begin a stop
     * string. Called from a slot's thread. */
    void (*on_text)(void *user, const char *text, size_t len);
    /* Once, at the end: finish "stop" (an end-of-generation token or a stop string), "length"
     * (max_tokens, or the context full) or "cancelled" (sv_job_cancel), the token counts, and
     * err non-NULL when generation failed. After it the engine touches nothing of the sink's. */
    void (*on_done)(void *user, const char *finish, int64_t prompt_tokens, int64_t completion_tokens,
                    const sv_error *err);
    void *user;
} sv_sink;
typedef struct {
    int         n_slots;       /* sequences generated at once (default 1) */
    int         queue_max;     /* requests that may wait for a slot (default 64); more: 429 */
    int64_t     n_ctx;         /* cache cells in all, each request's context its n_slots-th share
                                  (llama-server's -c; 0: n_slots x kiln_gen's default) */
    int64_t     n_batch;       /* tokens a step takes at most (0: kiln_batch's default, 512) */
    /* also a program for steps of at most n_small tokens (kiln_batch_opts.n_small): 0 none, -1
     * SV_SMALL_AUTO tokens when several slots run on a GPU and steps take more */
    int64_t     n_small;
    bool        cpu;           /* the CPU reference */
    int         tp;            /* the model split over tp GPUs (kiln_batch_opts.tp; 0: one) */
    int         pp;            /* the layers in pp stages, a GPU each (kiln_batch_opts.pp; 0: one) */
    const char *chat_template; /* a name (kiln_chat_template_name), or NULL: the model's, else chatml */
} sv_engine_opts;
/* The default small program: the decode steps of up to 64 sequences replay CUDA graphs of plans
 * made for few tokens instead of the general program's (docs/serve.md: Llama-3-8B Q4_K_M, 8 to
 * 64 sequences, 13-31% more tokens a second on an H200). */
#define SV_SMALL_AUTO 64
kiln_status sv_engine_new(const kiln_model *m, const kiln_tokenizer *tok, const sv_engine_opts *o, sv_engine **out);
/* Cancels what waits or runs (their on_done: "cancelled") and stops the slots; later submits
 * are refused (503). The engine stays valid until sv_engine_free (which shuts down first). */
void        sv_engine_shutdown(sv_engine *e);
void        sv_engine_free(sv_engine *e);
/* The chat template in use (static). */
const char *sv_engine_template(const sv_engine *e);
/* The small program's tokens (kiln_batch_opts.n_small, 0: none) the engine's batch has. */
int64_t     sv_engine_small(const sv_engine *e);
/* Takes r (the engine frees it): its prompt tokenized (a chat's rendered first), then queued.
 * false with *err and nothing queued: 400 for a prompt the context cannot hold (or that does not
 * tokenize), 429 when queue_max requests wait already. *job (may be NULL) is the handle for
 * sv_job_cancel, valid until sv_job_release. */
bool        sv_engine_submit(sv_engine *e, sv_request *r, const sv_sink *sink, sv_job **job, sv_error *err);
/* The client left: the job stops at its next token (or leaves the queue) and its on_done says
 * "cancelled". Safe at any time before sv_job_release. */
void        sv_job_cancel(sv_job *j);
void        sv_job_release(sv_job *j);
/* Counters for /metrics. */
typedef struct {
    uint64_t requests, rejected, prompt_tokens, completion_tokens;
    int      waiting, running;
    double   busy_ms; /* slot time spent generating, summed */
} sv_stats;
void        sv_engine_stats(sv_engine *e, sv_stats *out);

/* ---- HTTP (serve/http.c): libmicrohttpd through dlopen, one thread per connection ---------- */
typedef struct {
    const char *host;      /* a numeric address (127.0.0.1, 0.0.0.0, ::1) */
    int         port;      /* 0: any free one (sv_http_port) */
    const char *api_key;   /* NULL: none; else "Authorization: Bearer KEY" on every route but /health */
    const char *model_id;  /* the name requests give as "model" */
    size_t      max_body;  /* bytes; larger bodies get 413 */
    int         max_conns; /* connections at once (0: 256) */
} sv_http_opts;
typedef struct sv_http sv_http;
/* Listens; an error names a missing libmicrohttpd, a bad address or a port in use. */
kiln_status sv_http_start(sv_engine *e, int64_t n_vocab, const sv_http_opts *o, sv_http **out);
int         sv_http_port(const sv_http *h);
/* Stops listening and waits for the connections (shut the engine down first: their requests
 * end "cancelled"). */
void        sv_http_stop(sv_http *h);

#endif
