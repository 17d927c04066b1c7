/* The HTTP side of `kiln serve` (serve/serve.h): libmicrohttpd, loaded with dlopen (as the CUDA
 * driver is: the kiln command runs where the library is missing, and only `kiln serve` says so),
 * one thread per connection. Routes: GET /health, GET /v1/models, GET /metrics (Prometheus
 * text), POST /v1/completions and /v1/chat/completions (JSON, or server-sent events with
 * "stream": true). Every refusal is an OpenAI-style JSON error: 400 (serve/api.c), 401 without
 * the API key, 404 for another path or model, 405 for another method, 413 for a body over the
 * limit, 429 when the queue is full. A streaming client that goes away cancels its request at
 * the next token (or keep-alive comment, every second while it waits for a slot). */
#include "serve/serve.h"

#include "base/base.h"

#include <dlfcn.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* ---- libmicrohttpd through dlopen -------------------------------------------------------------- */

typedef struct {
    struct MHD_Daemon *(*start)(unsigned int, uint16_t, MHD_AcceptPolicyCallback, void *, MHD_AccessHandlerCallback,
                                void *, ...);
    void (*stop)(struct MHD_Daemon *);
    const union MHD_DaemonInfo *(*info)(struct MHD_Daemon *, enum MHD_DaemonInfoType, ...);
    struct MHD_Response *(*from_buffer)(size_t, void *, enum MHD_ResponseMemoryMode);
    struct MHD_Response *(*from_callback)(uint64_t, size_t, MHD_ContentReaderCallback, void *,
                                          MHD_ContentReaderFreeCallback);
    enum MHD_Result (*add_header)(struct MHD_Response *, const char *, const char *);
    enum MHD_Result (*queue)(struct MHD_Connection *, unsigned int, struct MHD_Response *);
    void (*destroy)(struct MHD_Response *);
    const char *(*lookup)(struct MHD_Connection *, enum MHD_ValueKind, const char *);
} mhd_api;

static mhd_api         mhd;
static pthread_once_t  mhd_once = PTHREAD_ONCE_INIT;
static char            mhd_err[256];

static void mhd_load(void) {
    void *lib = dlopen("libmicrohttpd.so.12", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libmicrohttpd.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(mhd_err, sizeof mhd_err, "libmicrohttpd.so.12 not found (%s); install it (Debian: libmicrohttpd12)",
                 dlerror());
        return;
    }
#define SYM(field, name)                                                                                    \
    if (!(*(void **)&mhd.field = dlsym(lib, name))) {                                                       \
        snprintf(mhd_err, sizeof mhd_err, "libmicrohttpd has no %s (version 0.9.71 or newer is needed)", name); \
        return;                                                                                             \
    }
    SYM(start, "MHD_start_daemon")
    SYM(stop, "MHD_stop_daemon")
    SYM(info, "MHD_get_daemon_info")
    SYM(from_buffer, "MHD_create_response_from_buffer")
    SYM(from_callback, "MHD_create_response_from_callback")
    SYM(add_header, "MHD_add_response_header")
    SYM(queue, "MHD_queue_response")
    SYM(destroy, "MHD_destroy_response")
    SYM(lookup, "MHD_lookup_connection_value")
#undef SYM
}

/* ---- a request in flight ------------------------------------------------------------------------- */

struct sv_http {
    struct MHD_Daemon *d;
    sv_engine         *e;
    sv_http_opts       o;
    int64_t            n_vocab, started;
    atomic_ullong      next_id;
    int                port;
};

typedef struct {
    sv_http        *h;
    char           *body; /* the upload */
    size_t          len, cap;
    bool            too_big;
    /* the answer, filled by the sink (a slot's thread) and read by this connection's */
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    bool            submitted, done, stream, role_sent, include_usage;
    sv_kind         kind;
    sv_job         *job;
    char            id[48], model[128];
    sv_meta         meta;
    char           *text; /* non-streaming: the whole text; streaming: SSE bytes not yet sent */
    size_t          tlen, tcap, sent;
    char            finish[16];
    int64_t         prompt_tokens, completion_tokens;
    sv_error        err;
    bool            failed;
    atomic_int      refs; /* the request's, and a streamed response's (MHD frees each when it likes) */
} conn;

static bool append(conn *c, const char *s, size_t n) {
    if (c->tlen + n + 1 > c->tcap) {
        size_t cap = c->tcap ? c->tcap : 1024;
        while (cap < c->tlen + n + 1) cap *= 2;
        char *t = realloc(c->text, cap);
        if (!t) return false;
        c->text = t, c->tcap = cap;
    }
    memcpy(c->text + c->tlen, s, n);
    c->tlen += n;
    c->text[c->tlen] = 0;
    return true;
}

/* One server-sent event: "data: JSON\n\n" (the JSON owned, freed here). */
static void event(conn *c, char *json) {
    if (!json) return;
    append(c, "data: ", 6);
    append(c, json, strlen(json));
    append(c, "\n\n", 2);
    free(json);
}

static void sink_text(void *user, const char *text, size_t len) {
    conn *c = user;
    pthread_mutex_lock(&c->mu);
    if (!c->stream) {
        append(c, text, len);
    } else {
        if (c->kind == SV_CHAT && !c->role_sent) event(c, sv_render_chunk(c->kind, &c->meta, NULL, 0, true, NULL));
        c->role_sent = true;
        event(c, sv_render_chunk(c->kind, &c->meta, text, len, false, NULL));
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void sink_done(void *user, const char *finish, int64_t p, int64_t n, const sv_error *err) {
    conn *c = user;
    pthread_mutex_lock(&c->mu);
    snprintf(c->finish, sizeof c->finish, "%s", finish);
    c->prompt_tokens = p, c->completion_tokens = n;
    if (err) c->err = *err, c->failed = true;
    if (c->stream) {
        if (c->failed) {
            event(c, sv_render_error(&c->err));
        } else {
            if (c->kind == SV_CHAT && !c->role_sent) event(c, sv_render_chunk(c->kind, &c->meta, NULL, 0, true, NULL));
            event(c, sv_render_chunk(c->kind, &c->meta, NULL, 0, false, finish));
            if (c->include_usage) event(c, sv_render_usage(c->kind, &c->meta, p, n));
        }
        append(c, "data: [DONE]\n\n", 14);
    }
    c->done = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* The job ends before its sink goes: cancelled if it runs still, then waited for. Called by the
 * last of the request and its streamed response to let go of the context (conn_free). */
static void finish_job(conn *c) {
    if (!c->submitted) return;
    sv_job_cancel(c->job);
    pthread_mutex_lock(&c->mu);
    while (!c->done) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    sv_job_release(c->job);
    c->submitted = false;
}

static void conn_free(conn *c) {
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1) return;
    finish_job(c);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c->body);
    free(c->text);
    free(c);
}

/* ---- answers ------------------------------------------------------------------------------------- */

/* Browsers' chat UIs call from another origin: every answer allows it (as llama-server's), and
 * a preflight (OPTIONS) gets the methods and headers the API takes. */
static void cors(struct MHD_Response *r) {
    mhd.add_header(r, "Access-Control-Allow-Origin", "*");
    mhd.add_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    mhd.add_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
}

static enum MHD_Result reply(struct MHD_Connection *k, unsigned status, const char *type, char *body) {
    if (!body) return MHD_NO;
    struct MHD_Response *r = mhd.from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    cors(r);
    if (type) mhd.add_header(r, "Content-Type", type);
    enum MHD_Result ok = mhd.queue(k, status, r);
    mhd.destroy(r);
    return ok;
}

static enum MHD_Result reply_json(struct MHD_Connection *k, unsigned status, char *json) {
    return reply(k, status, "application/json", json);
}

static enum MHD_Result reply_error(struct MHD_Connection *k, const sv_error *e) {
    return reply_json(k, (unsigned)e->status, sv_render_error(e));
}

static enum MHD_Result fail(struct MHD_Connection *k, int status, const char *type, const char *code, const char *fmt,
                            const char *arg) {
    sv_error e;
    sv_fail(&e, status, type, NULL, code, fmt, arg);
    return reply_error(k, &e);
}

static char *metrics(sv_http *h) {
    sv_stats s;
    sv_engine_stats(h->e, &s);
    kb_str b = {0};
    kb_str_addf(&b, "# HELP kiln_requests_total Requests accepted.\n# TYPE kiln_requests_total counter\n"
                    "kiln_requests_total %llu\n", (unsigned long long)s.requests);
    kb_str_addf(&b, "# HELP kiln_requests_rejected_total Requests refused after parsing (queue full, prompt too long).\n"
                    "# TYPE kiln_requests_rejected_total counter\nkiln_requests_rejected_total %llu\n",
                (unsigned long long)s.rejected);
    kb_str_addf(&b, "# HELP kiln_prompt_tokens_total Prompt tokens evaluated.\n# TYPE kiln_prompt_tokens_total counter\n"
                    "kiln_prompt_tokens_total %llu\n", (unsigned long long)s.prompt_tokens);
    kb_str_addf(&b, "# HELP kiln_completion_tokens_total Tokens generated.\n"
                    "# TYPE kiln_completion_tokens_total counter\nkiln_completion_tokens_total %llu\n",
                (unsigned long long)s.completion_tokens);
    kb_str_addf(&b, "# HELP kiln_queue_depth Requests waiting for a slot.\n# TYPE kiln_queue_depth gauge\n"
                    "kiln_queue_depth %d\n", s.waiting);
    kb_str_addf(&b, "# HELP kiln_batch_size Requests generating now (one per slot).\n# TYPE kiln_batch_size gauge\n"
                    "kiln_batch_size %d\n", s.running);
    kb_str_addf(&b, "# HELP kiln_tokens_per_second Tokens generated per second of slot time, since the start.\n"
                    "# TYPE kiln_tokens_per_second gauge\nkiln_tokens_per_second %.3f\n",
                s.busy_ms > 0 ? (double)s.completion_tokens * 1000.0 / s.busy_ms : 0.0);
    return kb_str_take(&b);
}

/* The SSE body: events as the sink makes them; a keep-alive comment each second of silence,
 * which also finds a client that left (its write fails, the response is freed: cancel). */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    conn *c = cls;
    pthread_mutex_lock(&c->mu);
    while (c->sent == c->tlen && !c->done) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) != 0 && c->sent == c->tlen && !c->done) {
            pthread_mutex_unlock(&c->mu);
            static const char ping[] = ": waiting\n\n";
            size_t            n = sizeof ping - 1 < max ? sizeof ping - 1 : max;
            memcpy(buf, ping, n);
            return (ssize_t)n;
        }
    }
    ssize_t n;
    if (c->sent < c->tlen) {
        n = (ssize_t)(c->tlen - c->sent < max ? c->tlen - c->sent : max);
        memcpy(buf, c->text + c->sent, (size_t)n);
        c->sent += (size_t)n;
    } else {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    }
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* The response is done with, or the client left: the job ends now (the connection's context
 * goes with the last of the request and the response). */
static void stream_free(void *cls) { conn_free(cls); }

static enum MHD_Result generate(sv_http *h, struct MHD_Connection *k, conn *c, sv_kind kind) {
    sv_request r;
    sv_error   e;
    if (c->too_big) {
        char lim[32];
        snprintf(lim, sizeof lim, "%zu", h->o.max_body);
        return fail(k, 413, "invalid_request_error", NULL, "the body is over the limit of %s bytes", lim);
    }
    if (!sv_parse(kind, c->body, c->len, h->o.model_id, h->n_vocab, &r, &e)) return reply_error(k, &e);
    c->kind = kind;
    c->stream = r.stream;
    c->include_usage = r.include_usage;
    snprintf(c->id, sizeof c->id, "%s-%llu", kind == SV_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)atomic_fetch_add(&h->next_id, 1));
    c->meta = (sv_meta){.id = c->id, .model = h->o.model_id, .created = (int64_t)time(NULL)};
    sv_sink sink = {sink_text, sink_done, c};
    if (!sv_engine_submit(h->e, &r, &sink, &c->job, &e)) return reply_error(k, &e);
    c->submitted = true;
    if (c->stream) {
        atomic_fetch_add(&c->refs, 1);
        struct MHD_Response *resp = mhd.from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, c, stream_free);
        if (!resp) {
            atomic_fetch_sub(&c->refs, 1);
            return MHD_NO;
        }
        cors(resp);
        mhd.add_header(resp, "Content-Type", "text/event-stream");
        mhd.add_header(resp, "Cache-Control", "no-cache");
        enum MHD_Result ok = mhd.queue(k, 200, resp);
        mhd.destroy(resp);
        return ok;
    }
    /* one thread per connection: this one waits for the whole answer */
    pthread_mutex_lock(&c->mu);
    while (!c->done) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    if (c->failed) return reply_error(k, &c->err);
    return reply_json(k, 200, sv_render_result(kind, &c->meta, c->text, c->tlen, c->finish, c->prompt_tokens,
                                              c->completion_tokens));
}

/* "Authorization: Bearer KEY" when the server has a key (every route but /health). */
static bool authorized(sv_http *h, struct MHD_Connection *k) {
    if (!h->o.api_key) return true;
    const char *a = mhd.lookup(k, MHD_HEADER_KIND, "Authorization");
    return a && !strncmp(a, "Bearer ", 7) && !strcmp(a + 7, h->o.api_key);
}

static enum MHD_Result route(sv_http *h, struct MHD_Connection *k, conn *c, const char *url, const char *method) {
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    struct {
        const char *path;
        bool        post;
    } const routes[] = {{"/health", false}, {"/v1/models", false}, {"/metrics", false},
                        {"/v1/completions", true}, {"/v1/chat/completions", true}};
    int r = -1;
    for (int i = 0; i < (int)(sizeof routes / sizeof routes[0]); i++)
        if (!strcmp(url, routes[i].path)) r = i;
    if (r < 0) return fail(k, 404, "invalid_request_error", NULL, "no route %s (kiln serves /v1/completions, "
                                   "/v1/chat/completions, /v1/models, /health and /metrics)", url);
    if (!strcmp(method, "OPTIONS")) return reply(k, 204, NULL, strdup("")); /* a preflight */
    if (routes[r].post ? !post : !get)
        return fail(k, 405, "invalid_request_error", NULL, "%s takes another method", url);
    if (r != 0 && !authorized(h, k))
        return fail(k, 401, "invalid_request_error", "invalid_api_key", "%s: missing or wrong API key (Authorization: "
                                                                     "Bearer KEY)", url);
    switch (r) {
    case 0: return reply_json(k, 200, strdup("{\"status\":\"ok\"}"));
    case 1: return reply_json(k, 200, sv_render_models(h->o.model_id, h->started));
    case 2: return reply(k, 200, "text/plain; version=0.0.4", metrics(h));
    case 3: return generate(h, k, c, SV_COMPLETION);
    default: return generate(h, k, c, SV_CHAT);
    }
}

static enum MHD_Result access_cb(void *cls, struct MHD_Connection *k, const char *url, const char *method,
                                 const char *version, const char *data, size_t *size, void **con_cls) {
    sv_http *h = cls;
    conn    *c = *con_cls;
    if (!c) { /* the headers: a context for the body to come */
        if (!(c = calloc(1, sizeof *c))) return MHD_NO;
        c->h = h;
        atomic_init(&c->refs, 1);
        pthread_mutex_init(&c->mu, NULL);
        pthread_cond_init(&c->cv, NULL);
        *con_cls = c;
        return MHD_YES;
    }
    if (*size) { /* a piece of the body: kept up to the limit, the rest dropped (413) */
        if (c->len + *size > h->o.max_body) c->too_big = true;
        if (!c->too_big) {
            if (c->len + *size + 1 > c->cap) {
                size_t cap = c->cap ? c->cap : 4096;
                while (cap < c->len + *size + 1) cap *= 2;
                char *b = realloc(c->body, cap);
                if (!b) return MHD_NO;
                c->body = b, c->cap = cap;
            }
            memcpy(c->body + c->len, data, *size);
            c->len += *size;
        }
        *size = 0;
        return MHD_YES;
    }
    return route(h, k, c, url, method);
}

/* libmicrohttpd's own messages (a client gone mid-answer, ...), marked as the server's. */
static void log_cb(void *cls, const char *fmt, va_list ap) {
    fputs("kiln serve: http: ", stderr);
    vfprintf(stderr, fmt, ap);
}

static void completed_cb(void *cls, struct MHD_Connection *k, void **con_cls, enum MHD_RequestTerminationCode why) {
    conn_free(*con_cls);
    *con_cls = NULL;
}

kiln_status sv_http_start(sv_engine *e, int64_t n_vocab, const sv_http_opts *o, sv_http **out) {
    pthread_once(&mhd_once, mhd_load);
    if (mhd_err[0]) return kb_error(KILN_ERR_NOT_FOUND, "serve: %s", mhd_err);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST}, *ai;
    char            port[16];
    snprintf(port, sizeof port, "%d", o->port);
    int gai = getaddrinfo(o->host, port, &hints, &ai);
    if (gai) return kb_error(KILN_ERR_INVALID, "serve: --host %s: %s (a numeric address: 127.0.0.1, 0.0.0.0, ::1)",
                             o->host, gai_strerror(gai));
    sv_http *h = calloc(1, sizeof *h);
    if (!h) {
        freeaddrinfo(ai);
        return kb_oom();
    }
    h->e = e, h->o = *o, h->n_vocab = n_vocab, h->started = (int64_t)time(NULL);
    atomic_init(&h->next_id, 1);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
                     (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    h->d = mhd.start(flags, (uint16_t)o->port, NULL, NULL, access_cb, h, MHD_OPTION_EXTERNAL_LOGGER, log_cb, NULL,
                     MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, completed_cb, h,
                     MHD_OPTION_CONNECTION_LIMIT,
                     (unsigned)(o->max_conns ? o->max_conns : 256), MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!h->d) {
        free(h);
        return kb_error(KILN_ERR_IO, "serve: could not listen on %s port %d (in use, or not an address of this "
                                     "machine)", o->host, o->port);
    }
    const union MHD_DaemonInfo *di = mhd.info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : o->port;
    *out = h;
    return NULL;
}

int sv_http_port(const sv_http *h) { return h ? h->port : 0; }

void sv_http_stop(sv_http *h) {
    if (!h) return;
    mhd.stop(h->d);
    free(h);
}
