/* kiln serve: an OpenAI-compatible HTTP server for a GGUF model (serve/; issue 28). */
#include "tools/cmd.h"

#include "serve/serve.h"
#include "tools/flag.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char summary[] =
    "  serve MODEL.gguf  an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions,\n"
    "                  streaming) on 127.0.0.1:8080 ('kiln help serve')\n";

static const char help[] =
    "usage: kiln serve MODEL.gguf [--host ADDR] [--port N] [-np N] [-c N] [-b N] [--batch-small N] [--queue N]\n"
    "                  [--api-key KEY] [--alias NAME] [--chat-template NAME] [--max-body BYTES] [--tp G | --pp G]\n"
    "                  [--cpu]\n"
    "  serves the model over HTTP as OpenAI's API does, for any OpenAI client:\n"
    "    POST /v1/completions       {\"model\", \"prompt\", \"max_tokens\", \"temperature\", \"top_p\",\n"
    "                               \"seed\", \"stop\", \"stream\", ...}\n"
    "    POST /v1/chat/completions  {\"model\", \"messages\", ...}: rendered with the chat template\n"
    "    GET  /v1/models, /health, /metrics (Prometheus text: requests, tokens, queue, tok/s)\n"
    "  \"stream\": true answers with server-sent events; a client that leaves cancels its request.\n"
    "  Bad requests get an OpenAI-style JSON error (400, 401, 404, 405, 413; 429 when the queue\n"
    "  is full). Stop with Ctrl-C (SIGINT) or SIGTERM: running requests end \"cancelled\".\n"
    "  --host ADDR       a numeric address to listen on (default 127.0.0.1; any other needs --api-key)\n"
    "  --port N          0 .. 65535 (default 8080; 0: a free port, printed)\n"
    "  -np N             slots: requests generated at once, as sequences of one batched program\n"
    "                    and one KV cache (continuous batching; default 1; 1 .. 256)\n"
    "  -c N              the KV cache in tokens, all slots together; each request's context is its\n"
    "                    -np-th share, as llama-server's -c (default -np x min(4096, the model's))\n"
    "  -b N              tokens one step takes at most, decode tokens and prompt chunks together\n"
    "                    (default min(512, -c))\n"
    "  --batch-small N   also a program for steps of at most N tokens (0: none; 2 .. -b minus 1): the\n"
    "                    decode steps of a few slots replay plans made for few tokens (default 64\n"
    "                    with -np 2 or more on a GPU and -b above 64, else none)\n"
    "  --queue N         requests that may wait for a slot (default 64); more get 429\n"
    "  --api-key KEY     required as \"Authorization: Bearer KEY\" (all routes but /health)\n"
    "  --alias NAME      the model's name in requests and /v1/models (default: the file's, no .gguf)\n"
    "  --chat-template NAME  a built-in template ('kiln help run' lists them; default: the model's)\n"
    "  --max-body BYTES  the largest request body (default 1M; K, M, G suffixes)\n"
    "  --tp G            the model split over G GPUs (tensor parallelism, as kiln run --tp; docs/tp.md)\n"
    "  --pp G            the layers in G stages, a GPU each (pipeline split, as kiln run --pp)\n"
    "  --cpu             the CPU reference instead of the GPU (slow; for tests). Without a GPU the\n"
    "                    server says so and takes the CPU reference anyway\n"
    "  It needs libmicrohttpd (Debian: libmicrohttpd12), loaded when the server starts.\n";

typedef struct {
    const char *model, *host, *api_key, *alias, *tmpl;
    int64_t     port, slots, n_ctx, n_batch, n_small, queue, tp, pp;
    uint64_t    max_body;
    bool        cpu;
} serve_args;

static int parse(int argc, char **argv, serve_args *a) {
    const char *cmd = "serve";
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) return kt_print_help("serve");
        if (!strcmp(f, "--cpu")) {
            a->cpu = true;
            continue;
        }
        if (f[0] != '-') {
            if (a->model) return kt_usage(cmd, "one model, got '%s' and '%s'", a->model, f);
            a->model = f;
            continue;
        }
        if (!v) return kt_usage(cmd, "%s wants a value", f);
        i++;
        bool ok = true;
        if (!strcmp(f, "--host")) a->host = v;
        else if (!strcmp(f, "--api-key")) a->api_key = v;
        else if (!strcmp(f, "--alias")) a->alias = v;
        else if (!strcmp(f, "--chat-template")) a->tmpl = v;
        else if (!strcmp(f, "--port")) ok = kt_flag_int(cmd, f, v, 0, 65535, &a->port);
        else if (!strcmp(f, "-np") || !strcmp(f, "--parallel")) ok = kt_flag_int(cmd, f, v, 1, 256, &a->slots);
        else if (!strcmp(f, "-c") || !strcmp(f, "--ctx-size")) ok = kt_flag_int(cmd, f, v, 1, KT_FLAG_MAX_CTX, &a->n_ctx);
        else if (!strcmp(f, "--batch-small")) {
            ok = kt_flag_int(cmd, f, v, 0, KT_FLAG_MAX_CTX, &a->n_small);
            if (ok && a->n_small == 1) return kt_usage(cmd, "%s", "--batch-small 1: 0 (none), or 2 .. -b minus 1");
        } else if (!strcmp(f, "--queue")) ok = kt_flag_int(cmd, f, v, 1, 1 << 20, &a->queue);
        else if (!strcmp(f, "-b") || !strcmp(f, "--batch-size")) ok = kt_flag_int(cmd, f, v, 1, KT_FLAG_MAX_CTX, &a->n_batch);
        else if (!strcmp(f, "--max-body")) ok = kt_flag_size(cmd, f, v, &a->max_body);
        else if (!strcmp(f, "--tp")) ok = kt_flag_int(cmd, f, v, 1, 64, &a->tp);
        else if (!strcmp(f, "--pp")) ok = kt_flag_int(cmd, f, v, 1, 64, &a->pp);
        else return kt_usage(cmd, "unknown option '%s'", f);
        if (!ok) return KT_EXIT_USAGE;
    }
    if (!a->model) return kt_usage(cmd, "which model? kiln serve MODEL.gguf");
    if (a->tp > 1 && a->pp > 1) return kt_usage(cmd, "%s", "--tp and --pp: one split or the other, not both");
    /* listening beyond this machine needs a key (issue 28): anyone could use the GPU otherwise */
    if (strcmp(a->host, "127.0.0.1") && strcmp(a->host, "::1") && !a->api_key)
        return kt_usage(cmd, "--host %s listens beyond this machine: give --api-key KEY too", a->host);
    if (a->max_body < 1024) return kt_usage(cmd, "--max-body %llu: at least 1K", (unsigned long long)a->max_body);
    return KT_GO_ON;
}

/* The file's name without its folders and .gguf: the model's id. */
static void model_id(const char *path, char *out, size_t n) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t len = strlen(b);
    if (len > 5 && !strcmp(b + len - 5, ".gguf")) len -= 5;
    snprintf(out, n, "%.*s", (int)len, b);
}

static int run(int argc, char **argv) {
    serve_args a = {.host = "127.0.0.1", .port = 8080, .slots = 1, .n_small = -1, .queue = 64, .max_body = 1 << 20};
    int        rc = parse(argc, argv, &a);
    if (rc != KT_GO_ON) return rc;
    char id[128];
    if (a.alias) snprintf(id, sizeof id, "%s", a.alias);
    else model_id(a.model, id, sizeof id);
    /* SIGINT and SIGTERM are waited for below: blocked here, in every thread the server starts */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN); /* a client that leaves: a failed write, not the end of the server */
    kiln_model     *m = NULL;
    kiln_tokenizer *tok = NULL;
    sv_engine      *e = NULL;
    sv_http        *h = NULL;
    kiln_status     st = kiln_model_open(a.model, &m);
    if (!st) st = kiln_tokenizer_from_gguf(kiln_model_gguf(m), &tok);
    sv_engine_opts eo = {.n_slots = (int)a.slots, .queue_max = (int)a.queue, .n_ctx = a.n_ctx, .n_batch = a.n_batch,
                         .n_small = a.n_small,
                         .cpu = a.cpu, .tp = (int)a.tp, .pp = (int)a.pp,
                         .chat_template = a.tmpl};
    if (!st) st = sv_engine_new(m, tok, &eo, &e);
    if (st && !a.cpu && kiln_status_code(st) == KILN_ERR_NO_GPU) { /* (issue 28: it works, slowly) */
        fprintf(stderr, "kiln serve: %s: serving on the CPU reference instead (slow; --cpu says so)\n",
                kiln_status_msg(st));
        kiln_status_free(st);
        a.cpu = eo.cpu = true;
        st = sv_engine_new(m, tok, &eo, &e);
    }
    sv_http_opts ho = {.host = a.host, .port = (int)a.port, .api_key = a.api_key, .model_id = id,
                       .max_body = (size_t)a.max_body};
    if (!st) st = sv_http_start(e, kiln_tokenizer_n_vocab(tok), &ho, &h);
    if (!st) {
        const char *fmt = strchr(a.host, ':') ? "kiln serve: listening on http://[%s]:%d" : "kiln serve: listening on http://%s:%d";
        printf(fmt, a.host, sv_http_port(h));
        printf(" (model '%s', %lld slot%s, %s", id, (long long)a.slots, a.slots == 1 ? "" : "s",
               a.cpu ? "CPU reference" : "GPU");
        if (sv_engine_small(e)) printf(", steps of at most %lld tokens in a program of their own", (long long)sv_engine_small(e));
        printf(", chat template %s)\n", sv_engine_template(e));
        fflush(stdout);
        int sig = 0;
        sigwait(&sigs, &sig);
        fprintf(stderr, "kiln serve: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    }
    sv_engine_shutdown(e); /* requests end "cancelled"; then the connections close */
    sv_http_stop(h);
    sv_engine_free(e);
    kiln_tokenizer_free(tok);
    kiln_model_close(m);
    return st ? kt_fail("serve", st) : KT_EXIT_OK;
}

const kt_cmd kt_cmd_serve = {"serve", summary, help, NULL, run};
