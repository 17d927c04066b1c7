/* kiln_gen over the ranks of a tensor-parallel model (issue 30; docs/tp.md): kiln_gen_opts.tp =
 * g builds the graph of each rank (kiln_build_opts.tp_size, tp_rank), and runs them together:
 * on g GPUs, a kiln_group (one session a rank, NCCL's all_reduce steps in their programs) with
 * each rank's share of the file's weights uploaded (km_tp_weight_data: a rank reads its ranges
 * only); on the CPU reference, kiln_reference_group. gen.c makes the run's inputs as for one
 * GPU; here each rank gets them with its own view of the tokens (a token of its vocabulary shard
 * as its row there, any other as row 0 with inp_tok_shard 0), and the ranks' logits rows (each
 * its ceil(n_vocab / g), the last rank's zero padding dropped) are concatenated into the whole
 * vocabulary's. */
#include "base/base.h"
#include "model/arch.h"

#include <stdlib.h>
#include <string.h>

/* A rank's weights assembled from several ranges (the CPU reference reads them every run). The
 * name is a copy: a reference run's names live as long as that run's IR. */
typedef struct {
    char *name;
    void *data;
} tp_copy;

typedef struct {
    struct km_tp_gen *t;
    int               rank;
    kiln_ctx         *ctx;
    kiln_graph       *graph; /* unbound: the states' sizes; the GPU's program */
    int32_t          *tokens; /* [n_batch]: the run's tokens as this rank's rows */
    float            *shard;  /* [n_batch]: 1 where the token is in this rank's shard */
    float            *logits; /* [vs, n_tokens_max]: the rank's rows of the run's outputs */
    km_host_state    *states; /* cpu: the rank's caches */
    int               nstates;
    tp_copy          *copies; /* cpu: assembled weights; gpu: during the upload */
    int               ncopies, capcopies;
    kiln_status       err; /* a get or put that failed */
} tp_rank;

struct km_tp_gen {
    const kiln_model         *m;
    const kiln_model_hparams *hp;
    int                       g;
    bool                      cpu;
    int64_t                   vs; /* vocabulary rows a rank (km_tp_vocab_share: the last rank's padded) */
    bool                      intervals; /* the masks as key intervals (bo->mask_intervals) */
    tp_rank                  *r;
    kiln_group               *group;
    const km_tp_run          *in; /* the current run's */
};

static kiln_status keep_copy(tp_rank *r, const char *name, void *data) {
    if (r->ncopies == r->capcopies) {
        int      cap = r->capcopies ? 2 * r->capcopies : 64;
        tp_copy *c = realloc(r->copies, sizeof *c * (size_t)cap);
        if (!c) return kb_oom();
        r->copies = c, r->capcopies = cap;
    }
    char *own = strdup(name);
    if (!own) return kb_oom();
    r->copies[r->ncopies++] = (tp_copy){own, data};
    return NULL;
}

static void free_copies(tp_rank *r) {
    for (int i = 0; i < r->ncopies; i++) free(r->copies[i].name), free(r->copies[i].data);
    free(r->copies);
    r->copies = NULL, r->ncopies = r->capcopies = 0;
}

/* Rank r's data of weight `name` (kept while r's copies live). */
static const void *rank_weight(tp_rank *r, const char *name, kiln_type type) {
    for (int i = 0; i < r->ncopies; i++)
        if (!strcmp(r->copies[i].name, name)) return r->copies[i].data;
    const void *data;
    void       *own;
    kiln_status st = km_tp_weight_data(r->t->m, name, type, r->t->g, r->rank, &data, &own);
    if (!st && own) st = keep_copy(r, name, own);
    if (st) {
        free(own);
        if (!r->err) r->err = st;
        else kiln_status_free(st);
        return NULL;
    }
    return data;
}

/* kiln_session_load_weights' source: the rank's share of each weight. */
static const void *load_get(void *user, const char *name, kiln_type type, size_t bytes) {
    (void)bytes;
    return rank_weight(user, name, type);
}

static const void *ref_get(void *user, const char *name, kiln_type type, int64_t n) {
    tp_rank         *r = user;
    const km_tp_run *in = r->t->in;
    (void)n;
    if (!strcmp(name, "inp_tokens")) return r->tokens;
    if (!strcmp(name, "inp_tok_shard")) return r->shard;
    const void *input = km_run_input(in, r->t->intervals, name);
    if (input) return input;
    for (int i = 0; i < r->nstates; i++)
        if (!strcmp(r->states[i].name, name)) return r->states[i].data;
    return rank_weight(r, name, type);
}

static void ref_put(void *user, const char *name, kiln_type type, int64_t n, const void *data) {
    tp_rank *r = user;
    size_t   bytes = (size_t)n * kiln_type_size(type);
    if (!strcmp(name, "logits") && bytes == sizeof *r->logits * (size_t)(r->t->vs * r->t->in->n_out)) {
        memcpy(r->logits, data, bytes);
        return;
    }
    for (int i = 0; i < r->nstates; i++)
        if (!strcmp(r->states[i].name, name) && r->states[i].bytes == bytes) {
            memcpy(r->states[i].data, data, bytes);
            return;
        }
    if (!r->err) r->err = kb_error(KILN_ERR_INVALID, "kiln_gen: rank %d's reference gave '%s' (%lld values), which the "
                                                     "generator does not expect", r->rank, name, (long long)n);
}

static void progress_cb(void *user, uint64_t done, uint64_t total) {
    const kiln_gen_opts *o = user;
    o->progress(o->progress_user, "weights", done, total);
}

/* Compiles each rank's graph, makes the group, uploads each rank's weights. */
static kiln_status gpu_open(km_tp_gen *t, const kiln_gen_opts *o, kiln_gen_stats *stats) {
    kiln_compile_opts co = o->compile ? *o->compile : (kiln_compile_opts){0};
    char              arch[16];
    int               count = 0;
    kiln_status       st = kiln_device_count(&count); /* before compiling g programs */
    if (st) return st;
    if (count < t->g)
        return kb_error(KILN_ERR_NO_GPU, "tensor parallelism over %d GPUs: this machine has %d", t->g, count);
    if (!co.arch) {
        if ((st = kiln_device_arch(0, arch, sizeof arch))) return st;
        co.arch = arch;
    }
    const kiln_program **ps = calloc((size_t)t->g, sizeof *ps);
    if (!ps) return kb_oom();
    double t0 = kb_now_ms();
    for (int r = 0; !st && r < t->g; r++) {
        kiln_program *p = NULL;
        if ((st = kiln_compile(t->r[r].graph, &co, &p))) st = kb_wrap(st, "rank %d of %d", r, t->g);
        ps[r] = p;
    }
    if (!st) kiln_program_stats(ps[0], &stats->compile);
    stats->compile_ms = kb_now_ms() - t0;
    kiln_group_opts go = {.no_cuda_graph = o->session ? o->session->no_cuda_graph : 0};
    if (!st) st = kiln_group_new(ps, t->g, &go, &t->group);
    for (int r = 0; r < t->g; r++) kiln_program_free((kiln_program *)ps[r]);
    free(ps);
    double t1 = kb_now_ms();
    for (int r = 0; !st && r < t->g; r++) {
        tp_rank      *k = &t->r[r];
        kiln_session *s = kiln_group_session(t->group, r);
        /* A random model (no file: kiln bench's) has its weights made on each GPU in the rank's
         * shapes, at memory speed: values of the same distributions, not the whole model's
         * slices (a 70B model's slices would first be made whole in host memory). */
        if (!kiln_model_gguf(t->m)) {
            st = km_model_fill_rank(t->m, s);
            if (st) st = kb_wrap(st, "rank %d's weights", r);
            continue;
        }
        st = kiln_session_load_weights(s, load_get, k, o->progress ? progress_cb : NULL, (void *)o);
        if (k->err) kiln_status_free(st), st = k->err, k->err = NULL;
        free_copies(k); /* (uploaded) */
        if (st) st = kb_wrap(st, "rank %d's weights", r);
    }
    stats->load_ms = kb_now_ms() - t1;
    return st;
}

kiln_status km_tp_gen_open(const kiln_model *m, int g, const kiln_build_opts *bo, const kiln_gen_opts *o,
                           kiln_gen_stats *stats, km_tp_gen **out) {
    *out = NULL;
    const kiln_model_hparams *hp = kiln_model_get_hparams(m);
    kiln_status               st = km_tp_check(hp, g);
    if (st) return st;
    km_tp_gen *t = calloc(1, sizeof *t);
    if (!t) return kb_oom();
    t->m = m, t->hp = hp, t->g = g, t->cpu = o->cpu, t->vs = km_tp_vocab_share(hp, g), t->intervals = bo->mask_intervals;
    int64_t nb = bo->n_tokens_max;
    if (!(t->r = calloc((size_t)g, sizeof *t->r))) st = kb_oom();
    for (int r = 0; !st && r < g; r++) {
        tp_rank *k = &t->r[r];
        k->t = t, k->rank = r;
        k->tokens = malloc(sizeof *k->tokens * (size_t)nb);
        k->shard = malloc(sizeof *k->shard * (size_t)nb);
        k->logits = malloc(sizeof *k->logits * (size_t)(t->vs * nb));
        k->ctx = kiln_ctx_new();
        if (!k->tokens || !k->shard || !k->logits || !k->ctx) {
            st = kb_oom();
            break;
        }
        kiln_build_opts rb;
        km_part_opts(hp, bo, g, 0, r, &rb);
        st = kiln_model_build(k->ctx, m, &rb);
        if (!st) st = kiln_graph_new(k->ctx, &k->graph);
        if (!st && t->cpu) st = km_host_states(k->graph, &k->states, &k->nstates);
        if (st) st = kb_wrap(st, "rank %d of %d", r, g);
    }
    if (!st && !t->cpu) st = gpu_open(t, o, stats);
    if (st) {
        km_tp_gen_free(t);
        return st;
    }
    *out = t;
    return NULL;
}

int km_tp_gen_ranks(const km_tp_gen *t) { return t ? t->g : 0; }

kiln_status km_tp_gen_state(km_tp_gen *t, int rank, const char *name, void *data, size_t bytes, bool write) {
    if (!t->cpu) {
        kiln_session *s = kiln_group_session(t->group, rank);
        return write ? kiln_session_set(s, name, data, bytes) : kiln_session_get(s, name, data, bytes);
    }
    tp_rank *r = &t->r[rank];
    if (km_host_state_io(r->states, r->nstates, name, data, bytes, write)) return NULL;
    return kb_error(KILN_ERR_NOT_FOUND, "kiln_gen_shift: rank %d has no cache state %s of %zu bytes", rank, name, bytes);
}

void km_tp_gen_free(km_tp_gen *t) {
    if (!t) return;
    kiln_group_free(t->group);
    for (int r = 0; t->r && r < t->g; r++) {
        tp_rank *k = &t->r[r];
        kiln_graph_free(k->graph);
        kiln_ctx_free(k->ctx);
        free(k->tokens), free(k->shard), free(k->logits);
        km_host_states_free(k->states, k->nstates);
        free_copies(k);
        kiln_status_free(k->err);
    }
    free(t->r);
    free(t);
}

/* Each rank's view of the run's tokens. */
static void rank_tokens(km_tp_gen *t, const km_tp_run *in) {
    for (int r = 0; r < t->g; r++)
        for (int64_t i = 0; i < in->nt; i++) {
            bool mine = in->tokens[i] / t->vs == r;
            t->r[r].tokens[i] = mine ? (int32_t)(in->tokens[i] - r * t->vs) : 0;
            t->r[r].shard[i] = mine ? 1.0f : 0.0f;
        }
}

static kiln_status cpu_run(km_tp_gen *t) {
    static const char *const names[2] = {"n_tokens", "n_kv"};
    const int64_t            values[2] = {t->in->nt, t->in->nkv};
    kiln_ctx                *bound[64] = {0};
    kiln_graph              *gs[64] = {0};
    void                    *users[64];
    kiln_status              st = NULL;
    for (int r = 0; !st && r < t->g; r++) {
        st = kiln_ctx_bind(t->r[r].ctx, 2, names, values, &bound[r]);
        if (!st) st = kiln_graph_new(bound[r], &gs[r]);
        users[r] = &t->r[r];
    }
    if (!st) st = kiln_reference_group((const kiln_graph *const *)gs, t->g, ref_get, ref_put, users);
    for (int r = 0; r < t->g; r++) {
        if (!st && t->r[r].err) st = t->r[r].err, t->r[r].err = NULL;
        kiln_graph_free(gs[r]);
        kiln_ctx_free(bound[r]);
    }
    return st;
}

static kiln_status gpu_set(km_tp_gen *t, int r) {
    const km_tp_run *in = t->in;
    kiln_session    *s = kiln_group_session(t->group, r);
    size_t           nt = (size_t)in->nt;
    kiln_status      st = km_run_set_inputs(s, in, t->intervals, true);
    if (!st) st = kiln_session_set(s, "inp_tokens", t->r[r].tokens, sizeof(int32_t) * nt);
    if (!st) st = kiln_session_set(s, "inp_tok_shard", t->r[r].shard, sizeof(float) * nt);
    return st ? kb_wrap(st, "rank %d", r) : NULL;
}

static kiln_status gpu_run(km_tp_gen *t) {
    kiln_status st = NULL;
    for (int r = 0; !st && r < t->g; r++) st = gpu_set(t, r);
    if (!st) st = kiln_group_run(t->group);
    for (int r = 0; !st && r < t->g; r++)
        st = kiln_session_get_prefix(kiln_group_session(t->group, r), "logits", t->r[r].logits,
                                     sizeof *t->r[r].logits * (size_t)(t->vs * t->in->n_read));
    return st;
}

kiln_status km_tp_gen_run(km_tp_gen *t, const km_tp_run *in, float *logits) {
    t->in = in;
    rank_tokens(t, in);
    kiln_status st = t->cpu ? cpu_run(t) : gpu_run(t);
    const int64_t nv = t->hp->n_vocab;
    for (int r = 0; !st && r < t->g; r++) { /* each rank's real rows (the last rank's padding dropped) */
        int64_t n = nv - r * t->vs;
        n = n < 0 ? 0 : n > t->vs ? t->vs : n;
        for (int64_t row = 0; row < in->n_read; row++)
            memcpy(logits + row * nv + r * t->vs, t->r[r].logits + row * t->vs, sizeof *logits * (size_t)n);
    }
    t->in = NULL;
    return st;
}

double km_tp_gen_last_ms(const km_tp_gen *t) {
    return t && t->group ? kiln_session_last_ms(kiln_group_session(t->group, 0)) : 0.0;
}
