/* The server's engine (serve/serve.h): one kiln_batch (one program, one KV cache) whose n_slots
 * sequences are the requests being answered, and one thread that steps it: each step takes the
 * next token of every request that is generating and, in what n_batch leaves, chunks of the
 * prompts of requests that just got a slot (continuous batching: requests join and leave at
 * step boundaries). Each pick is kiln_gen_generate's (argmax, or kiln_sample at the token's
 * position with the prompt and the picks as history), its text handed to the request's sink:
 * whole UTF-8 characters, held back while it may begin a stop string, cut where one appears.
 * A request's prompt is tokenized when it is submitted, so that one the context cannot hold is
 * refused at once (400) and a full queue answers 429. */
#include "serve/serve.h"

#include "base/base.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct sv_job {
    sv_request  r;
    int32_t    *ids; /* the prompt's tokens */
    int64_t     n_ids;
    sv_sink     sink;
    atomic_bool cancel;
    atomic_int  refs; /* the engine's and the submitter's */
    sv_job     *next;
};

/* The text of a generation so far: its tokens, their text (kiln_detokenize_next, a token at a
 * time), and how much of it the sink has (kiln_text_showable decides how far it may go). */
typedef struct {
    sv_job               *job;
    const kiln_tokenizer *tok;
    int32_t               prev; /* the last token (-1: none yet) */
    int64_t               n;    /* tokens */
    char                 *text;
    size_t                len, cap;
    size_t                emitted; /* bytes of the text given to the sink */
    bool                  stopped; /* a stop string ended it */
    kiln_status           err;
} gen_text;

/* A request in a slot: its sequence of the batch, how much of its prompt went in, the pick to
 * feed next, and the history its sampler's penalties count. */
typedef struct {
    sv_job  *job; /* NULL: the slot is free */
    int      seq;
    int64_t  fed;
    int32_t  next;
    bool     has_next;
    int32_t *hist;
    int64_t  nh, caph;
    gen_text text;
    double   t0;
} slot;

struct sv_engine {
    const kiln_tokenizer *tok;
    const char           *tmpl;
    int32_t              *eog;
    int64_t               n_eog, n_ctx; /* n_ctx: a request's context */
    int64_t               n_small;      /* kiln_batch_opts.n_small the batch got */
    int                   n_slots, queue_max;
    kiln_batch           *b;
    slot                 *slots;
    pthread_t             thread;
    bool                  started;
    pthread_mutex_t       mu;
    pthread_cond_t        cv;
    sv_job               *head, *tail;
    bool                  stopping;
    sv_stats              stats;
};

void sv_job_release(sv_job *j) {
    if (!j || atomic_fetch_sub(&j->refs, 1) != 1) return;
    sv_request_free(&j->r);
    free(j->ids);
    free(j);
}

void sv_job_cancel(sv_job *j) {
    if (j) atomic_store(&j->cancel, true);
}

/* ---- the text of a generation (gen_text) -------------------------------------------------- */

/* Gives the sink the text up to end. */
static void emit(gen_text *t, size_t end) {
    if (end > t->emitted) t->job->sink.on_text(t->job->sink.user, t->text + t->emitted, end - t->emitted);
    if (end > t->emitted) t->emitted = end;
}

static bool on_token(void *user, int32_t id) {
    gen_text *t = user;
    if (atomic_load(&t->job->cancel)) return true;
    char  *add = NULL;
    size_t n = 0;
    if ((t->err = kiln_detokenize_next(t->tok, t->prev, id, &add, &n))) return true;
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 1024;
        while (cap < t->len + n + 1) cap *= 2;
        char *x = realloc(t->text, cap);
        if (!x) return free(add), (t->err = kb_oom()), true;
        t->text = x, t->cap = cap;
    }
    memcpy(t->text + t->len, add, n);
    t->len += n;
    t->text[t->len] = 0;
    free(add);
    t->prev = id;
    t->n++;
    int stop;
    emit(t, kiln_text_showable(t->text, t->len, t->emitted, (const char *const *)t->job->r.stop, t->job->r.n_stop,
                               &stop));
    t->stopped = stop >= 0;
    return t->stopped;
}

/* What was held back for a stop string that never came, and an incomplete last character. */
static void flush(gen_text *t) {
    if (!t->stopped && !t->err && !atomic_load(&t->job->cancel)) emit(t, t->len);
}

static bool hist_push(slot *s, int32_t id) {
    if (s->nh == s->caph) {
        int64_t  cap = s->caph ? 2 * s->caph : 256;
        int32_t *h = realloc(s->hist, sizeof *h * (size_t)cap);
        if (!h) return false;
        s->hist = h, s->caph = cap;
    }
    s->hist[s->nh++] = id;
    return true;
}

/* The slot's request ends: the rest of its text, its on_done, its sequence closed. */
static void finish(sv_engine *e, slot *s, const char *why, const sv_error *err) {
    sv_job *j = s->job;
    if (!err && strcmp(why, "cancelled")) flush(&s->text);
    sv_error fail;
    if (!err && s->text.err) {
        sv_fail(&fail, 500, "server_error", NULL, NULL, "detokenizing failed: %s", kiln_status_msg(s->text.err));
        err = &fail;
    }
    kiln_status_free(s->text.err);
    kiln_batch_seq_close(e->b, s->seq);
    pthread_mutex_lock(&e->mu);
    e->stats.completion_tokens += (uint64_t)s->text.n;
    e->stats.busy_ms += kb_now_ms() - s->t0;
    e->stats.running--; /* before on_done: a client that saw its end sees the slot free */
    pthread_mutex_unlock(&e->mu);
    j->sink.on_done(j->sink.user, why, j->n_ids, s->text.n, err);
    free(s->text.text);
    free(s->hist);
    *s = (slot){0};
    sv_job_release(j);
}

static bool greedy(const sv_job *j) { return !(j->r.sampler.temp > 0 || kiln_sampler_penalized(&j->r.sampler)); }

/* The pick after the slot's last token (logits lg; NULL for a greedy request: the batch's pick
 * g): kiln_gen_generate's rules. Returns false when the request ended. */
static bool pick(sv_engine *e, slot *s, const float *lg, int32_t g) {
    sv_job                    *j = s->job;
    const kiln_sampler_params *sp = &j->r.sampler;
    int64_t                    nv = kiln_tokenizer_n_vocab(e->tok), pos = kiln_batch_seq_pos(e->b, s->seq);
    int32_t                    id;
    if (j->r.max_tokens == 0) return finish(e, s, "length", NULL), false;
    if (!lg) {
        id = g;
    } else if (!greedy(j)) {
        kiln_status st = kiln_sample(sp, lg, nv, s->hist, s->nh, pos, &id);
        if (st) {
            sv_error err;
            sv_fail(&err, 500, "server_error", NULL, NULL, "sampling failed: %s", kiln_status_msg(st));
            kiln_status_free(st);
            return finish(e, s, "stop", &err), false;
        }
    } else {
        id = (int32_t)kiln_argmax_f32(lg, nv);
    }
    for (int64_t i = 0; i < e->n_eog; i++)
        if (e->eog[i] == id) return finish(e, s, "stop", NULL), false;
    if (on_token(&s->text, id)) /* a stop string, a cancel, or a failure */
        return finish(e, s, atomic_load(&j->cancel) ? "cancelled" : "stop", NULL), false;
    if (j->r.max_tokens >= 0 && s->text.n >= j->r.max_tokens) return finish(e, s, "length", NULL), false;
    if (pos >= e->n_ctx) return finish(e, s, "length", NULL), false; /* no room to feed it */
    s->next = id;
    s->has_next = true;
    return true;
}

/* Free slots take waiting requests (in order). Under e->mu. */
static void admit(sv_engine *e) {
    for (int i = 0; i < e->n_slots && e->head; i++) {
        slot *s = &e->slots[i];
        if (s->job) continue;
        sv_job *j = e->head;
        e->head = j->next;
        if (!e->head) e->tail = NULL;
        e->stats.waiting--;
        e->stats.running++;
        kiln_status st = kiln_batch_seq_open(e->b, &s->seq); /* (a slot is a sequence: cannot fail) */
        kiln_status_free(st);
        *s = (slot){.job = j, .seq = s->seq, .t0 = kb_now_ms(), .text = {.job = j, .tok = e->tok, .prev = -1}};
    }
}

/* One step over every slot in use: decode tokens first, then prompt chunks in what n_batch
 * leaves. */
static void step(sv_engine *e, int64_t n_batch) {
    kiln_batch_item items[256];
    int             who[256], n = 0;
    int64_t         budget = n_batch;
    for (int i = 0; i < e->n_slots; i++) {
        slot *s = &e->slots[i];
        if (s->job && atomic_load(&s->job->cancel)) finish(e, s, "cancelled", NULL);
        if (!s->job || !s->has_next || !budget) continue;
        items[n] = (kiln_batch_item){s->seq, &s->next, 1};
        who[n++] = i, budget--;
    }
    for (int i = 0; i < e->n_slots && budget; i++) {
        slot *s = &e->slots[i];
        if (!s->job || s->fed == s->job->n_ids) continue;
        int64_t k = s->job->n_ids - s->fed < budget ? s->job->n_ids - s->fed : budget;
        items[n] = (kiln_batch_item){s->seq, s->job->ids + s->fed, k};
        who[n++] = i, budget -= k;
    }
    if (!n) return;
    /* every request greedy: only the picks come back (4 bytes a row, not the logits) */
    bool all_greedy = true;
    for (int i = 0; i < n; i++) all_greedy &= greedy(e->slots[who[i]].job);
    const float *lg[256] = {0};
    int32_t      picks[256];
    kiln_status  st = all_greedy ? kiln_batch_step_greedy(e->b, items, n, picks) : kiln_batch_step(e->b, items, n, lg);
    for (int i = 0; i < n; i++) {
        slot *s = &e->slots[who[i]];
        if (st) {
            sv_error err;
            sv_fail(&err, 500, "server_error", NULL, NULL, "generation failed: %s", kiln_status_msg(st));
            finish(e, s, "stop", &err);
            continue;
        }
        bool ok = true;
        for (int64_t k = 0; k < items[i].n && ok; k++) ok = hist_push(s, items[i].tokens[k]);
        if (!ok) {
            sv_error err;
            finish(e, s, "stop", (sv_fail(&err, 500, "server_error", NULL, NULL, "out of memory"), &err));
            continue;
        }
        if (s->has_next) s->has_next = false;
        else s->fed += items[i].n;
        if (s->fed == s->job->n_ids) pick(e, s, all_greedy ? NULL : lg[i], all_greedy ? picks[i] : 0);
    }
    kiln_status_free(st);
}

static void *engine_main(void *arg) {
    sv_engine *e = arg;
    int64_t    n_batch = kiln_batch_n_batch(e->b);
    for (;;) {
        pthread_mutex_lock(&e->mu);
        admit(e);
        bool stopping = e->stopping, busy = false;
        for (int i = 0; i < e->n_slots; i++) busy |= e->slots[i].job != NULL;
        if (!busy && e->stopping) {
            pthread_mutex_unlock(&e->mu);
            return NULL;
        }
        if (!busy) {
            pthread_cond_wait(&e->cv, &e->mu);
            pthread_mutex_unlock(&e->mu);
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        for (int i = 0; stopping && i < e->n_slots; i++)
            if (e->slots[i].job) sv_job_cancel(e->slots[i].job); /* (step finishes them) */
        step(e, n_batch);
    }
}

/* ---- the engine ------------------------------------------------------------------------------- */

/* The template: the one named, else the model's (detected as llama.cpp does), else chatml. */
static kiln_status pick_template(const kiln_model *m, const char *name, const char **out) {
    if (name) {
        kiln_status st = kiln_chat_template_by_name(name);
        if (!st) *out = name;
        return st;
    }
    char       *text = NULL;
    kiln_status st = kiln_chat_template_from_gguf(kiln_model_gguf(m), &text);
    *out = "chatml";
    if (!st && text) {
        st = kiln_chat_template_detect(text, out);
        if (st) kiln_status_free(st), st = NULL, *out = "chatml"; /* llama.cpp's fallback too */
    }
    free(text);
    return st;
}

kiln_status sv_engine_new(const kiln_model *m, const kiln_tokenizer *tok, const sv_engine_opts *o, sv_engine **out) {
    if (!m || !tok || !out) return kb_error(KILN_ERR_INVALID, "sv_engine_new: NULL argument");
    sv_engine_opts d = {0};
    if (!o) o = &d;
    if (o->n_slots < 0 || o->n_slots > 256 || o->queue_max < 0)
        return kb_error(KILN_ERR_INVALID, "serve: -np %d is out of range (1 .. 256)", o->n_slots);
    sv_engine *e = calloc(1, sizeof *e);
    if (!e) return kb_oom();
    e->tok = tok;
    e->n_slots = o->n_slots ? o->n_slots : 1;
    e->queue_max = o->queue_max ? o->queue_max : 64;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    kiln_status st = pick_template(m, o->chat_template, &e->tmpl);
    if (!st) st = kiln_tokenizer_eog(tok, kiln_model_gguf(m), &e->eog, &e->n_eog);
    if (!st && !(e->slots = calloc((size_t)e->n_slots, sizeof *e->slots))) st = kb_oom();
    /* the cache: n_ctx cells in all (llama-server's -c), each request's context its share */
    const kiln_model_hparams *hp = kiln_model_get_hparams(m);
    int64_t total = o->n_ctx > 0 ? o->n_ctx : kiln_default_n_ctx(hp) * e->n_slots;
    e->n_ctx = total / e->n_slots;
    if (!st && e->n_ctx < 2)
        st = kb_error(KILN_ERR_INVALID, "serve: -c %lld over -np %d slots leaves %lld tokens a request (2 at least)",
                      (long long)total, e->n_slots, (long long)e->n_ctx);
    if (e->n_ctx > hp->n_ctx_train) e->n_ctx = hp->n_ctx_train; /* (rope positions past training) */
    kiln_batch_opts bo = {.n_ctx = e->n_ctx * e->n_slots, .n_seq = e->n_slots, .cpu = o->cpu, .n_batch = o->n_batch,
                          .tp = o->tp, .pp = o->pp, .n_small = o->n_small};
    int64_t nb = o->n_batch > 0 ? o->n_batch : kiln_default_n_batch(bo.n_ctx);
    if (o->n_small < 0) /* auto: where steps of several sequences take more than it */
        bo.n_small = e->n_slots > 1 && !o->cpu && nb > SV_SMALL_AUTO ? SV_SMALL_AUTO : 0;
    else if (!st && o->n_small >= nb)
        st = kb_error(KILN_ERR_INVALID, "serve: --batch-small %lld: 0 (none), or 2 .. %lld (below -b %lld)",
                      (long long)o->n_small, (long long)nb - 1, (long long)nb);
    e->n_small = bo.n_small;
    if (!st) st = kiln_batch_new(m, &bo, &e->b);
    if (!st && pthread_create(&e->thread, NULL, engine_main, e) != 0)
        st = kb_error(KILN_ERR_NOMEM, "serve: could not start the engine's thread");
    e->started = !st;
    if (st) {
        sv_engine_free(e);
        return st;
    }
    *out = e;
    return NULL;
}

void sv_engine_shutdown(sv_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    if (e->stopping) {
        pthread_mutex_unlock(&e->mu);
        return;
    }
    e->stopping = true; /* the engine's thread cancels what runs (the slots are its own) */
    sv_job *q = e->head;
    e->head = e->tail = NULL;
    e->stats.waiting = 0;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    while (q) { /* the waiting ones end here */
        sv_job *next = q->next;
        q->sink.on_done(q->sink.user, "cancelled", q->n_ids, 0, NULL);
        sv_job_release(q);
        q = next;
    }
    if (e->started) pthread_join(e->thread, NULL), e->started = false;
}

void sv_engine_free(sv_engine *e) {
    if (!e) return;
    sv_engine_shutdown(e);
    kiln_batch_free(e->b);
    free(e->slots);
    free(e->eog);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

const char *sv_engine_template(const sv_engine *e) { return e ? e->tmpl : NULL; }

int64_t sv_engine_small(const sv_engine *e) { return e ? e->n_small : 0; }

/* The prompt's tokens: a chat's messages rendered with the template first. */
static bool tokenize(sv_engine *e, sv_job *j, sv_error *err) {
    const sv_request *r = &j->r;
    const char       *param = r->kind == SV_CHAT ? "messages" : "prompt";
    if (r->prompt_ids) {
        if (!(j->ids = malloc(sizeof *j->ids * (size_t)r->n_prompt_ids)))
            return sv_fail(err, 500, "server_error", NULL, NULL, "out of memory");
        memcpy(j->ids, r->prompt_ids, sizeof *j->ids * (size_t)r->n_prompt_ids);
        j->n_ids = r->n_prompt_ids;
    } else {
        char       *chat = NULL;
        kiln_status st = r->kind == SV_CHAT ? kiln_chat_apply(e->tmpl, r->msgs, r->n_msgs, true, &chat) : NULL;
        const char *text = r->kind == SV_CHAT ? chat : r->prompt;
        if (!st) st = kiln_tokenize(e->tok, text, strlen(text), &j->ids, &j->n_ids);
        free(chat);
        if (st) {
            sv_fail(err, 400, "invalid_request_error", param, NULL, "the %s does not tokenize: %s", param,
                    kiln_status_msg(st));
            kiln_status_free(st);
            return false;
        }
    }
    if (j->n_ids == 0) return sv_fail(err, 400, "invalid_request_error", param, NULL, "the %s is empty", param);
    /* one slot is kept for the first generated token */
    if (j->n_ids >= e->n_ctx)
        return sv_fail(err, 400, "invalid_request_error", param, "context_length_exceeded",
                       "the %s is %lld tokens; this server's context holds %lld (less one to generate)", param,
                       (long long)j->n_ids, (long long)e->n_ctx);
    return true;
}

bool sv_engine_submit(sv_engine *e, sv_request *r, const sv_sink *sink, sv_job **job, sv_error *err) {
    if (job) *job = NULL;
    sv_job *j = calloc(1, sizeof *j);
    if (!j) {
        sv_request_free(r);
        return sv_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    }
    j->r = *r;
    memset(r, 0, sizeof *r);
    j->sink = *sink;
    atomic_init(&j->cancel, false);
    atomic_init(&j->refs, job ? 2 : 1);
    bool ok = tokenize(e, j, err);
    pthread_mutex_lock(&e->mu);
    if (ok && e->stats.waiting >= e->queue_max)
        ok = sv_fail(err, 429, "rate_limit_exceeded", NULL, NULL,
                     "%d requests wait for a slot already (the queue holds %d); try again later", e->stats.waiting,
                     e->queue_max);
    if (ok && e->stopping) ok = sv_fail(err, 503, "server_error", NULL, NULL, "the server is stopping");
    if (!ok) {
        e->stats.rejected++;
        pthread_mutex_unlock(&e->mu);
        atomic_store(&j->refs, 1);
        sv_job_release(j);
        return false;
    }
    e->stats.requests++;
    e->stats.prompt_tokens += (uint64_t)j->n_ids;
    e->stats.waiting++;
    if (e->tail) e->tail->next = j;
    else e->head = j;
    e->tail = j;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (job) *job = j;
    return true;
}

void sv_engine_stats(sv_engine *e, sv_stats *out) {
    pthread_mutex_lock(&e->mu);
    *out = e->stats;
    pthread_mutex_unlock(&e->mu);
}
