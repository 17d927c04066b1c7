/* The server's engine (serve/engine.c) on a tiny model and the CPU reference: 16 requests over
 * 4 slots each give the text the same request gives alone (greedy, and sampled with a seed);
 * stop strings cut the text before the first one; max_tokens ends with "length"; a prompt the
 * context cannot hold is refused (400); a full queue answers 429; a cancelled request ends
 * "cancelled"; chat requests render with the template. */
#include "tests/support.h"

#include "serve/serve.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char           *g_dir;
static kiln_model     *g_model;
static kiln_tokenizer *g_tok;

/* What a sink received. A gate, when set, holds on_text until opened (a slot kept busy). */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    char            text[4096];
    size_t          len;
    char            finish[16];
    int64_t         prompt_tokens, completion_tokens;
    int             status; /* an error's, else 0 */
    bool            done, gated, open, entered;
} result;

static void res_init(result *r, bool gated) {
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->gated = gated;
}

static void on_text(void *user, const char *text, size_t len) {
    result *r = user;
    pthread_mutex_lock(&r->mu);
    r->entered = true;
    pthread_cond_broadcast(&r->cv);
    while (r->gated && !r->open) pthread_cond_wait(&r->cv, &r->mu);
    ck_assert(r->len + len < sizeof r->text);
    memcpy(r->text + r->len, text, len);
    r->len += len;
    r->text[r->len] = 0;
    pthread_mutex_unlock(&r->mu);
}

static void on_done(void *user, const char *finish, int64_t p, int64_t c, const sv_error *e) {
    result *r = user;
    pthread_mutex_lock(&r->mu);
    snprintf(r->finish, sizeof r->finish, "%s", finish);
    r->prompt_tokens = p, r->completion_tokens = c;
    r->status = e ? e->status : 0;
    r->done = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void wait_until(result *r, bool *flag) {
    pthread_mutex_lock(&r->mu);
    while (!*flag) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

static void open_gate(result *r) {
    pthread_mutex_lock(&r->mu);
    r->open = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void *open_later(void *arg) {
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
    open_gate(arg);
    return NULL;
}

/* n_ctx: each request's context (the cache holds slots x n_ctx) */
static sv_engine *engine(int slots, int queue, int64_t n_ctx) {
    sv_engine_opts o = {.n_slots = slots, .queue_max = queue, .n_ctx = n_ctx * slots, .cpu = true};
    sv_engine     *e;
    TS_OK(sv_engine_new(g_model, g_tok, &o, &e));
    return e;
}

/* Submits body (a completion unless it has "messages"); false with the error's status in *status. */
static bool submit(sv_engine *e, const char *body, result *r, sv_job **job, int *status) {
    sv_kind    kind = strstr(body, "\"messages\"") ? SV_CHAT : SV_COMPLETION;
    sv_request q;
    sv_error   err;
    ck_assert_msg(sv_parse(kind, body, strlen(body), "tiny", kiln_tokenizer_n_vocab(g_tok), &q, &err), "%s: %s", body,
                  err.message);
    sv_sink sink = {on_text, on_done, r};
    bool    ok = sv_engine_submit(e, &q, &sink, job, &err);
    if (!ok && status) *status = err.status;
    if (!ok) fprintf(stderr, "refused (%d): %s\n", err.status, err.message);
    return ok;
}

static void body_for(char *out, size_t n, int i, const char *extra) {
    snprintf(out, n, "{\"model\": \"tiny\", \"prompt\": \"The story number %d begins when\", \"max_tokens\": 10%s}", i,
             extra);
}

/* The request alone on a one-slot engine. */
static void alone(const char *body, result *r) {
    sv_engine *e = engine(1, 4, 128);
    res_init(r, false);
    ck_assert(submit(e, body, r, NULL, NULL));
    wait_until(r, &r->done);
    sv_engine_free(e);
}

START_TEST(concurrent_equals_alone) {
    enum { N = 16 };
    static result got[N], want[N];
    static char   body[N][256];
    for (int i = 0; i < N; i++)
        body_for(body[i], sizeof body[i], i, i % 2 ? ", \"temperature\": 0" : ", \"temperature\": 0.9, \"seed\": 7");
    sv_engine *e = engine(4, 32, 128);
    for (int i = 0; i < N; i++) {
        res_init(&got[i], false);
        ck_assert(submit(e, body[i], &got[i], NULL, NULL));
    }
    for (int i = 0; i < N; i++) wait_until(&got[i], &got[i].done);
    sv_stats s;
    sv_engine_stats(e, &s);
    ck_assert_int_eq(s.requests, N);
    ck_assert_int_eq(s.waiting + s.running, 0);
    sv_engine_free(e);
    for (int i = 0; i < N; i++) {
        alone(body[i], &want[i]);
        ck_assert_msg(got[i].status == 0 && !strcmp(got[i].finish, "length"), "%d: %d %s", i, got[i].status,
                      got[i].finish);
        ck_assert_int_eq(got[i].completion_tokens, 10);
        ck_assert_msg(got[i].len == want[i].len && !memcmp(got[i].text, want[i].text, got[i].len),
                      "request %d: 4 slots gave \"%s\", alone \"%s\"", i, got[i].text, want[i].text);
    }
}
END_TEST

START_TEST(stop_strings_cut) {
    char body[256];
    body_for(body, sizeof body, 3, ", \"temperature\": 0, \"max_tokens\": 16");
    result full;
    alone(body, &full);
    ck_assert_msg(full.len >= 6, "too short: \"%s\"", full.text);
    /* a stop string from the middle of the text (two ASCII letters or spaces past the first
     * bytes): the answer ends right before its first place */
    size_t i = 2;
    while (i + 1 < full.len && !(strchr(" abcdefghijklmnopqrstuvwxyz", full.text[i]) && full.text[i] &&
                                 strchr("abcdefghijklmnopqrstuvwxyz", full.text[i + 1]) && full.text[i + 1]))
        i++;
    ck_assert_msg(i + 1 < full.len, "no two ASCII letters in \"%s\"", full.text);
    char stop[3] = {full.text[i], full.text[i + 1], 0};
    size_t at = (size_t)(strstr(full.text, stop) - full.text);
    char   with[320];
    snprintf(with, sizeof with, "{\"model\": \"tiny\", \"prompt\": \"The story number 3 begins when\", \"max_tokens\": 16, "
                                "\"temperature\": 0, \"stop\": [\"zzzz\", \"%s\"]}", stop);
    result r;
    alone(with, &r);
    ck_assert_str_eq(r.finish, "stop");
    ck_assert_int_eq(r.len, at);
    ck_assert(!memcmp(r.text, full.text, at));
}
END_TEST

START_TEST(refusals_and_cancel) {
    /* a small program (--batch-small) that steps of -b tokens would not leave below them */
    sv_engine_opts so = {.n_slots = 2, .n_ctx = 256, .n_batch = 32, .n_small = 32, .cpu = true};
    sv_engine     *e = NULL;
    kiln_status    st = sv_engine_new(g_model, g_tok, &so, &e);
    ck_assert_msg(st && strstr(kiln_status_msg(st), "--batch-small 32: 0 (none), or 2 .. 31 (below -b 32)"), "%s",
                  st ? kiln_status_msg(st) : "(ok)");
    ck_assert_ptr_null(e);
    kiln_status_free(st);
    /* a prompt longer than the context (64 slots) */
    e = engine(1, 1, 64);
    char       big[4096] = "{\"model\": \"tiny\", \"prompt\": \"";
    for (int i = 0; i < 60; i++) strcat(big, "many different words ");
    strcat(big, "\"}");
    result r0;
    res_init(&r0, false);
    int status = 0;
    ck_assert(!submit(e, big, &r0, NULL, &status));
    ck_assert_int_eq(status, 400);
    /* a slot held (its sink gated), one request waiting: the next is 429 */
    char b1[256], b2[256], b3[256];
    body_for(b1, sizeof b1, 1, "");
    body_for(b2, sizeof b2, 2, "");
    body_for(b3, sizeof b3, 3, "");
    result  a, b, c;
    sv_job *ja, *jb;
    res_init(&a, true), res_init(&b, false), res_init(&c, false);
    ck_assert(submit(e, b1, &a, &ja, NULL));
    wait_until(&a, &a.entered); /* a runs, held in its first on_text */
    ck_assert(submit(e, b2, &b, &jb, NULL));
    status = 0;
    ck_assert(!submit(e, b3, &c, NULL, &status));
    ck_assert_int_eq(status, 429);
    /* a's client leaves: it ends "cancelled" at its next token; b then runs to its end */
    sv_job_cancel(ja);
    open_gate(&a);
    wait_until(&a, &a.done);
    ck_assert_str_eq(a.finish, "cancelled");
    wait_until(&b, &b.done);
    ck_assert_str_eq(b.finish, "length");
    /* cancelled while waiting: it never runs */
    result d, f;
    sv_job *jd;
    res_init(&d, true), res_init(&f, false);
    ck_assert(submit(e, b1, &d, &jd, NULL));
    wait_until(&d, &d.entered);
    sv_job *jf;
    ck_assert(submit(e, b2, &f, &jf, NULL));
    sv_job_cancel(jf);
    open_gate(&d);
    wait_until(&f, &f.done);
    ck_assert_str_eq(f.finish, "cancelled");
    ck_assert_int_eq(f.completion_tokens, 0);
    wait_until(&d, &d.done);
    sv_stats s;
    sv_engine_stats(e, &s);
    ck_assert_int_eq(s.rejected, 2);
    sv_job_release(ja), sv_job_release(jb), sv_job_release(jd), sv_job_release(jf);
    sv_engine_free(e);
}
END_TEST

START_TEST(chat_and_free_while_busy) {
    result r;
    alone("{\"model\": \"tiny\", \"messages\": [{\"role\": \"system\", \"content\": \"Be short.\"}, "
          "{\"role\": \"user\", \"content\": \"Hello\"}], \"max_tokens\": 4, \"temperature\": 0}", &r);
    ck_assert_int_eq(r.status, 0);
    ck_assert_int_eq(r.completion_tokens, 4);
    ck_assert_int_gt(r.prompt_tokens, 5);
    /* freeing the engine with a request running and one waiting: both end "cancelled" */
    sv_engine *e = engine(1, 4, 128);
    char       b1[256];
    body_for(b1, sizeof b1, 5, "");
    result a, b;
    res_init(&a, true), res_init(&b, false);
    ck_assert(submit(e, b1, &a, NULL, NULL));
    wait_until(&a, &a.entered);
    ck_assert(submit(e, b1, &b, NULL, NULL));
    /* the gate opens from another thread while free waits for the slot (free takes b off the
     * queue and cancels a before it waits) */
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, open_later, &a), 0);
    sv_engine_free(e);
    pthread_join(t, NULL);
    ck_assert(a.done && b.done);
    ck_assert_str_eq(a.finish, "cancelled");
    ck_assert_str_eq(b.finish, "cancelled");
}
END_TEST

static void setup(void) {
    g_dir = ts_tmpdir();
    kiln_model_hparams hp;
    TS_OK(kiln_model_preset("llama", "tiny", &hp));
    char path[512];
    snprintf(path, sizeof path, "%s/tiny.gguf", g_dir);
    TS_OK(kiln_model_write_random(&hp, 3, path, NULL, NULL));
    TS_OK(kiln_model_open(path, &g_model));
    TS_OK(kiln_tokenizer_from_gguf(kiln_model_gguf(g_model), &g_tok));
}

static void teardown(void) {
    kiln_tokenizer_free(g_tok);
    kiln_model_close(g_model);
    ts_tmpdir_free(g_dir);
}

int main(void) {
    Suite *s = TS_SUITE("serve_engine", TS_CASE_FIXTURE("serve_engine", 120, setup, teardown),
                        TS_TESTS(concurrent_equals_alone, stop_strings_cut, refusals_and_cancel, chat_and_free_while_busy));
    return ts_main_isolated(s, "serve_engine");
}
