/* kiln_gen: one sequence through a model — the graph of kiln_build_model compiled and loaded
 * with the file's weights, the KV cache held as the program's states, and the inputs of each
 * run (token ids, positions, cache slots, the causal mask, the output row) made here.
 *
 * The same loop runs on the CPU reference (cpu = true): the graph bound to each run's
 * n_tokens and n_kv and evaluated node by node, the caches kept in host memory. Tests compare
 * the two run by run. */
#include "base/base.h"
#include "model/arch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define F16_NEG_INF 0xfc00u

struct kiln_gen {
    const kiln_model         *m;
    const kiln_model_hparams *hp;
    int64_t                   n_ctx, n_batch, pos;
    int64_t                   n_small; /* kiln_gen_opts.n_small: a variant for runs of at most this many tokens */
    bool                      cpu;
    bool                      all; /* model/batch.c's: every row's logits (KILN_OUTPUTS_ALL), no argmax */
    kiln_ctx                 *ctx;
    kiln_graph               *graph;
    kiln_session             *sess;
    km_tp_gen                *tp; /* kiln_gen_opts.tp > 1: the ranks (model/gen_tp.c) instead of sess */
    km_pp_gen                *pp; /* kiln_gen_opts.pp > 1: the stages (model/gen_pp.c) instead of sess */
    kiln_ctx                 *bundle_ctx;   /* kiln_gen_opts.bundle: its graph parsed, which the */
    kiln_graph               *bundle_graph; /* program (so the session) refers to while it lives */

    /* The inputs of the current run, at its n_tokens (nt) and n_kv (nkv). */
    int64_t   nt, nkv;
    int32_t  *tokens, *positions, *out_ids; /* out_ids: the row kept (all: every row, in the order given) */
    int64_t   n_read; /* all: the logits (or argmax) rows read back, the first n_read of out_ids' order */
    int32_t   next; /* the graph's argmax (or sample) after the last run that read it */
    int32_t  *picks; /* all: every row's argmax (n_batch) */
    /* The sampler the program samples with on the GPU (output "sample"), when gpu_sample. */
    bool                gpu_sample;
    kiln_sampler_params sampler;
    int64_t  *slots;
    uint16_t *mask;
    uint16_t *mask_swa; /* gemma3's sliding-window layers' mask (hp->n_swa > 0) */
    int32_t  *iv, *iv_swa; /* all: the masks as key intervals, [2, n_batch] (km_gen_inputs) */
    float    *logits;

    km_host_state *states; /* cpu: the caches */
    int         nstates;
    kiln_status ref_err; /* cpu: a put that did not fit */
    kiln_gen_stats stats;
};

/* Whether the model runs split (over ranks or stages) rather than in one session. */
static bool split(const kiln_gen *g) { return g->tp || g->pp; }
static double split_ms(const kiln_gen *g) { return g->tp ? km_tp_gen_last_ms(g->tp) : km_pp_gen_last_ms(g->pp); }

static kiln_status warm_up(kiln_gen *g);
static kiln_status decode_sampled(kiln_gen *g, int32_t first, int64_t n, int32_t *out);

static kiln_status gen_alloc(kiln_gen *g) {
    g->tokens = malloc(sizeof *g->tokens * (size_t)g->n_batch);
    g->positions = malloc(sizeof *g->positions * (size_t)g->n_batch);
    g->slots = malloc(sizeof *g->slots * (size_t)g->n_batch);
    bool swa = g->hp->n_swa > 0;
    if (g->all) { /* key intervals: 2 numbers a row */
        g->iv = malloc(sizeof *g->iv * 2 * (size_t)g->n_batch);
        if (swa) g->iv_swa = malloc(sizeof *g->iv_swa * 2 * (size_t)g->n_batch);
    } else {
        g->mask = malloc(sizeof *g->mask * (size_t)g->n_batch * (size_t)g->n_ctx);
        if (swa) g->mask_swa = malloc(sizeof *g->mask_swa * (size_t)g->n_batch * (size_t)g->n_ctx);
    }
    g->logits = calloc((size_t)g->hp->n_vocab * (size_t)(g->all ? g->n_batch : 1), sizeof *g->logits);
    g->out_ids = malloc(sizeof *g->out_ids * (size_t)g->n_batch);
    g->picks = malloc(sizeof *g->picks * (size_t)g->n_batch);
    bool masks = g->all ? g->iv && (g->iv_swa || !swa) : g->mask && (g->mask_swa || !swa);
    return g->tokens && g->positions && g->slots && masks && g->logits && g->out_ids && g->picks
               ? NULL
               : kb_oom();
}

static kiln_build_opts build_opts(const kiln_gen *g, bool tp) {
    return (kiln_build_opts){.n_ctx = g->n_ctx, .n_tokens_max = g->n_batch,
                             .outputs = g->all ? KILN_OUTPUTS_ALL : KILN_OUTPUTS_LAST, .argmax = !g->cpu && !tp,
                             .sampler = g->gpu_sample ? &g->sampler : NULL, .mask_intervals = g->all,
                             .n_tokens_upto = g->n_small};
}

/* The whole model's graph (with tp too: it checks the file's weights, and counts their bytes). */
static kiln_status build(kiln_gen *g, bool tp) {
    if (!(g->ctx = kiln_ctx_new())) return kb_oom();
    kiln_build_opts o = build_opts(g, tp);
    kiln_status     st = kiln_model_build(g->ctx, g->m, &o);
    if (!st) st = kiln_graph_new(g->ctx, &g->graph);
    if (!st) st = kiln_model_check_weights(g->m, g->graph);
    return st;
}

static kiln_status cpu_states(kiln_gen *g) { return km_host_states(g->graph, &g->states, &g->nstates); }

static void load_progress(void *user, uint64_t done, uint64_t total) {
    const kiln_gen_opts *o = user;
    o->progress(o->progress_user, "weights", done, total);
}

/* The program of an AOT bundle (kiln_gen_opts.bundle) for the GPU of arch, when the bundle's
 * graph is this generator's: compared as text first (no GPU needed for the refusal), then the
 * program checked against the graph parsed from the bundle's text, as kiln_bundle_program
 * wants it. */
static kiln_status bundle_program(kiln_gen *g, const kiln_bundle *b, const char *arch, kiln_program **out) {
    char       *text = NULL;
    kiln_status st = kiln_print(g->ctx, &text);
    if (!st && strcmp(text, kiln_bundle_graph_text(b)))
        st = kb_error(KILN_ERR_INVALID, "the bundle's graph is not this model's at n_ctx %lld and n_batch %lld (greedy "
                                        "or host sampling): compile one with 'kiln compile MODEL.gguf --n-ctx %lld "
                                        "--n-batch %lld -o FILE.kiln'", (long long)g->n_ctx, (long long)g->n_batch,
                      (long long)g->n_ctx, (long long)g->n_batch);
    free(text);
    if (st || !arch) return st;
    const char *bt = kiln_bundle_graph_text(b);
    g->bundle_ctx = kiln_ctx_new(); /* (freed with the generator, after its session) */
    st = g->bundle_ctx ? kiln_parse(g->bundle_ctx, bt, strlen(bt), "<bundle graph>") : kb_oom();
    if (!st) st = kiln_graph_new(g->bundle_ctx, &g->bundle_graph);
    if (!st) st = kiln_bundle_program(b, g->bundle_graph, arch, out);
    return st;
}

static kiln_status gpu_open(kiln_gen *g, const kiln_gen_opts *o) {
    kiln_session_opts so = {0};
    if (o->session) so = *o->session;
    kiln_compile_opts co = {0};
    if (o->compile) co = *o->compile;
    char        arch[16];
    kiln_status st = o->bundle ? bundle_program(g, o->bundle, NULL, NULL) : NULL; /* (before the GPU) */
    if (st) return st;
    if (!co.arch || o->bundle) {
        if ((st = kiln_device_arch(so.device, arch, sizeof arch))) return st;
        co.arch = arch;
    }
    double        t0 = kb_now_ms();
    kiln_program *p;
    if ((st = o->bundle ? bundle_program(g, o->bundle, arch, &p) : kiln_compile(g->graph, &co, &p))) return st;
    kiln_program_stats(p, &g->stats.compile);
    g->stats.compile_ms = kb_now_ms() - t0;
    st = kiln_session_new(p, &so, &g->sess);
    kiln_program_free(p);
    if (st) return st;
    double t1 = kb_now_ms();
    st = kiln_model_load(g->m, g->sess, o->progress ? load_progress : NULL, (void *)o);
    g->stats.load_ms = kb_now_ms() - t1;
    return st;
}

static int64_t weight_bytes(const kiln_graph *gr) {
    int64_t n = 0;
    for (int i = 0; i < kiln_graph_size(gr); i++) {
        const kiln_tensor *t = kiln_graph_node(gr, i);
        if (kiln_tensor_role(t) == KILN_ROLE_WEIGHT) n += (int64_t)kiln_tensor_nbytes(t);
    }
    return n;
}

/* What g's programs are built from, as o asks: sizes, the CPU reference, the small program, and
 * whether the program samples. */
static void plan_from(kiln_gen *g, const kiln_gen_opts *o) {
    g->cpu = o->cpu;
    g->n_ctx = o->n_ctx > 0 ? o->n_ctx : kiln_default_n_ctx(g->hp);
    g->n_batch = o->n_batch > 0 ? o->n_batch : kiln_default_n_batch(g->n_ctx);
    g->n_small = o->n_small;
    bool parts = o->tp > 1 || o->pp > 1; /* (a split model: the logits read to the host) */
    /* A sampler the kernels can run ends the program with `sample` too (any other stays on the
     * host, as does the CPU reference, whose generation samples the logits it reads, and the
     * ranks of a split model, whose logits are gathered first). */
    if (o->sampler && !o->cpu && !parts && !o->bundle && kiln_sampler_on_gpu(o->sampler, g->hp->n_vocab))
        g->gpu_sample = true, g->sampler = *o->sampler;
}

void km_part_opts(const kiln_model_hparams *hp, const kiln_build_opts *whole, int tp, int pp, int part,
                  kiln_build_opts *out) {
    *out = *whole;
    if (tp > 1) out->tp_size = tp, out->tp_rank = part;
    else if (pp > 1) km_stage_layers(hp->n_layer, pp, part, &out->layer_first, &out->layer_end);
}

kiln_status kiln_gen_part_opts(const kiln_model *m, const kiln_gen_opts *o, int part, kiln_build_opts *out) {
    if (!m || !o || !out) return kb_error(KILN_ERR_INVALID, "kiln_gen_part_opts: NULL argument");
    int parts = o->tp > 1 ? o->tp : o->pp > 1 ? o->pp : 1;
    if (o->tp > 1 && o->pp > 1)
        return kb_error(KILN_ERR_INVALID, "kiln_gen_part_opts: tp %d and pp %d: one split or the other", o->tp, o->pp);
    if (o->tp > 64 || o->pp > 64 || part < 0 || part >= parts)
        return kb_error(KILN_ERR_INVALID, "kiln_gen_part_opts: part %d of %d (tp %d, pp %d; 64 at most)", part, parts,
                        o->tp, o->pp);
    kiln_gen g = {.m = m, .hp = kiln_model_get_hparams(m)};
    plan_from(&g, o);
    if (o->pp > 1 && (o->pp > g.hp->n_layer))
        return kb_error(KILN_ERR_INVALID, "pipeline split: %d stages of %lld layers (at most a layer a stage)", o->pp,
                        (long long)g.hp->n_layer);
    kiln_build_opts whole = build_opts(&g, parts > 1);
    if (g.gpu_sample) whole.sampler = o->sampler; /* (not g's copy, gone on return) */
    km_part_opts(g.hp, &whole, o->tp, o->pp, part, out);
    return NULL;
}

static kiln_status gen_new(const kiln_model *m, const kiln_gen_opts *o, bool all, kiln_gen **out) {
    if (out) *out = NULL;
    if (!m || !out) return kb_error(KILN_ERR_INVALID, "kiln_gen_new: NULL argument");
    kiln_gen_opts def = {0};
    if (!o) o = &def;
    kiln_gen *g = calloc(1, sizeof *g);
    if (!g) return kb_oom();
    g->m = m;
    g->all = all;
    g->hp = kiln_model_get_hparams(m);
    plan_from(g, o);
    bool tp = o->tp > 1, parts = tp || o->pp > 1;
    kiln_status st = NULL;
    if (o->n_ctx < 0 || o->n_batch < 0 || g->n_batch > g->n_ctx)
        st = kb_error(KILN_ERR_INVALID, "kiln_gen_new: n_batch %lld must be 1 .. n_ctx (%lld)", (long long)g->n_batch,
                      (long long)g->n_ctx);
    if (!st && (o->tp < 0 || o->tp > 64)) st = kb_error(KILN_ERR_INVALID, "kiln_gen_new: tp %d must be 0 .. 64", o->tp);
    if (!st && (o->pp < 0 || o->pp > 64)) st = kb_error(KILN_ERR_INVALID, "kiln_gen_new: pp %d must be 0 .. 64", o->pp);
    if (!st && o->bundle && (o->cpu || parts || o->n_small))
        st = kb_error(KILN_ERR_INVALID, "kiln_gen_new: a bundle's program runs on one GPU: not with %s",
                      o->cpu ? "cpu (the CPU reference)" : parts ? "tp or pp" : "n_small");
    if (!st && tp && o->pp > 1)
        st = kb_error(KILN_ERR_INVALID, "kiln_gen_new: tp %d and pp %d: one split or the other, not both", o->tp,
                      o->pp);
    if (!st) st = gen_alloc(g);
    if (!st) st = build(g, parts);
    if (!st) g->stats.weight_bytes = (uint64_t)weight_bytes(g->graph);
    if (!st && tp) {
        kiln_build_opts bo = build_opts(g, true);
        st = km_tp_gen_open(m, o->tp, &bo, o, &g->stats, &g->tp);
    } else if (!st && parts) {
        kiln_build_opts bo = build_opts(g, true);
        st = km_pp_gen_open(m, o->pp, &bo, o, &g->stats, &g->pp);
    } else if (!st) {
        st = g->cpu ? cpu_states(g) : gpu_open(g, o);
    }
    if (!st && !g->cpu) st = warm_up(g);
    if (st) {
        kiln_gen_free(g);
        return st;
    }
    *out = g;
    return NULL;
}

kiln_status kiln_gen_new(const kiln_model *m, const kiln_gen_opts *o, kiln_gen **out) { return gen_new(m, o, false, out); }

kiln_status km_gen_new_rows(const kiln_model *m, const kiln_gen_opts *o, kiln_gen **out) {
    kiln_gen_opts one = o ? *o : (kiln_gen_opts){0};
    one.sampler = NULL; /* rows are sampled on the host */
    return gen_new(m, &one, true, out);
}

void kiln_gen_free(kiln_gen *g) {
    if (!g) return;
    km_tp_gen_free(g->tp);
    km_pp_gen_free(g->pp);
    kiln_session_free(g->sess);
    kiln_graph_free(g->bundle_graph);
    kiln_ctx_free(g->bundle_ctx);
    kiln_graph_free(g->graph);
    kiln_ctx_free(g->ctx);
    km_host_states_free(g->states, g->nstates);
    free(g->tokens);
    free(g->positions);
    free(g->slots);
    free(g->mask);
    free(g->mask_swa);
    free(g->iv);
    free(g->iv_swa);
    free(g->logits);
    free(g->out_ids);
    free(g->picks);
    kiln_status_free(g->ref_err);
    free(g);
}

int64_t kiln_gen_pos(const kiln_gen *g) { return g ? g->pos : 0; }
int64_t kiln_gen_n_ctx(const kiln_gen *g) { return g ? g->n_ctx : 0; }
void    kiln_gen_reset(kiln_gen *g) {
    if (g) g->pos = 0;
}

static kiln_status check_tokens(const kiln_gen *g, const int32_t *tokens, int64_t nt) {
    for (int64_t t = 0; t < nt; t++)
        if (tokens[t] < 0 || tokens[t] >= g->hp->n_vocab)
            return kb_error(KILN_ERR_INVALID, "kiln_gen_eval: token %lld (position %lld) is %d, outside the "
                                              "vocabulary 0 .. %lld", (long long)t, (long long)(g->pos + t), tokens[t],
                            (long long)g->hp->n_vocab - 1);
    return NULL;
}

/* The inputs other than the tokens of a run of nt tokens at g->pos: slots follow positions,
 * and token t sees the slots up to its own (the cache holds this sequence only, in order). */
static void place_inputs(kiln_gen *g, int64_t nt) {
    g->nt = nt;
    g->nkv = g->pos + nt;
    for (int64_t t = 0; t < nt; t++) {
        g->positions[t] = (int32_t)(g->pos + t);
        g->slots[t] = g->pos + t;
        if (g->all) { /* key intervals: the same cells */
            km_key_interval(g->iv + 2 * t, 0, g->pos + t, 0);
            if (g->iv_swa) km_key_interval(g->iv_swa + 2 * t, 0, g->pos + t, g->hp->n_swa);
            continue;
        }
        uint16_t *row = g->mask + t * g->nkv;
        for (int64_t j = 0; j < g->nkv; j++) row[j] = j <= g->pos + t ? 0 : F16_NEG_INF;
        /* the window (llama.cpp's is_masked_swa, standard): a key n_swa or more positions
         * behind the query is masked too */
        if (!g->mask_swa) continue;
        uint16_t *sw = g->mask_swa + t * g->nkv;
        for (int64_t j = 0; j < g->nkv; j++) sw[j] = j <= g->pos + t && g->pos + t - j < g->hp->n_swa ? 0 : F16_NEG_INF;
    }
    if (g->all)
        for (int64_t t = 0; t < nt; t++) g->out_ids[t] = (int32_t)t;
    else g->out_ids[0] = (int32_t)(nt - 1);
    g->n_read = nt;
}

static kiln_status make_inputs(kiln_gen *g, const int32_t *tokens, int64_t nt) {
    kiln_status st = check_tokens(g, tokens, nt);
    if (st) return st;
    memcpy(g->tokens, tokens, sizeof *tokens * (size_t)nt);
    place_inputs(g, nt);
    return NULL;
}

typedef enum { READ_NOTHING, READ_LOGITS, READ_ARGMAX, READ_SAMPLE } run_read;

/* The session's inputs of the run place_inputs made; the tokens too unless with_tokens is off. */
static kiln_status set_inputs(kiln_gen *g, bool with_tokens) {
    kiln_session *s = g->sess;
    kiln_status   st = kiln_session_set_dim(s, "n_tokens", g->nt);
    if (!st) st = kiln_session_set_dim(s, "n_kv", g->nkv);
    if (!st && with_tokens) st = kiln_session_set(s, "inp_tokens", g->tokens, sizeof *g->tokens * (size_t)g->nt);
    if (!st) st = kiln_session_set(s, "inp_pos", g->positions, sizeof *g->positions * (size_t)g->nt);
    if (!st) st = kiln_session_set(s, "kv_idxs", g->slots, sizeof *g->slots * (size_t)g->nt);
    if (g->all) { /* key intervals */
        if (!st) st = kiln_session_set(s, "kq_mask", g->iv, sizeof *g->iv * 2 * (size_t)g->nt);
        if (!st && g->iv_swa) st = kiln_session_set(s, "kq_mask_swa", g->iv_swa, sizeof *g->iv_swa * 2 * (size_t)g->nt);
    } else {
        if (!st) st = kiln_session_set(s, "kq_mask", g->mask, sizeof *g->mask * (size_t)(g->nt * g->nkv));
        if (!st && g->mask_swa)
            st = kiln_session_set(s, "kq_mask_swa", g->mask_swa, sizeof *g->mask_swa * (size_t)(g->nt * g->nkv));
    }
    if (!st) st = kiln_session_set(s, "inp_out_ids", g->out_ids, sizeof *g->out_ids * (size_t)(g->all ? g->nt : 1));
    return st;
}

static kiln_status gpu_run(kiln_gen *g, run_read read) {
    kiln_session *s = g->sess;
    double        t0 = kb_now_ms();
    kiln_status   st = set_inputs(g, true);
    double        t1 = kb_now_ms();
    if (!st) st = kiln_session_run(s);
    double t2 = kb_now_ms();
    if (!st && read == READ_LOGITS)
        st = kiln_session_get_prefix(s, "logits", g->logits,
                                     sizeof *g->logits * (size_t)(g->hp->n_vocab * (g->all ? g->n_read : 1)));
    else if (!st && read == READ_ARGMAX && g->all)
        st = kiln_session_get_prefix(s, "argmax", g->picks, sizeof *g->picks * (size_t)g->n_read);
    else if (!st && (read == READ_ARGMAX || read == READ_SAMPLE))
        st = kiln_session_get(s, read == READ_SAMPLE ? "sample" : "argmax", &g->next, sizeof g->next);
    g->stats.inputs_ms += t1 - t0;
    g->stats.run_ms += t2 - t1;
    g->stats.readback_ms += kb_now_ms() - t2;
    return st;
}

/* One run of each program before anything is timed: the first run of a program captures its
 * CUDA graph and makes the driver load its kernels, tens of milliseconds that would otherwise
 * land in the first prefill or decode step. The cache rows written are overwritten later
 * (positions restart at 0) and never read before that (the mask hides them). */
static kiln_status warm_up(kiln_gen *g) {
    double       t0 = kb_now_ms();
    int32_t      zeros[2] = {0, 0};
    int32_t      next;
    if (g->all) { /* model/batch.c's: a run of each program, the logits of every row read */
        const float *lg;
        kiln_status  st = g->n_batch > 1 ? kiln_gen_eval(g, zeros, 2, &lg) : NULL;
        g->pos = 0;
        if (!st) st = kiln_gen_eval(g, zeros, 1, &lg);
        g->pos = 0;
        g->stats.warmup_ms = kb_now_ms() - t0;
        return st;
    }
    kiln_status  st = g->n_batch > 1 ? kiln_gen_eval_greedy(g, zeros, 2, &next) : NULL;
    g->pos = 0;
    if (!st) st = kiln_gen_eval_greedy(g, zeros, 1, &next);
    /* Chained decoding captures CUDA graphs of its own at its first chain (one pair per output
     * fed back). */
    if (!st && g->n_ctx > 1) st = kiln_gen_decode_greedy(g, 0, 1, &next);
    g->pos = 0;
    if (!st && g->n_ctx > 1 && g->gpu_sample) st = decode_sampled(g, 0, 1, &next);
    g->pos = 0;
    kiln_gen_stats keep = g->stats;
    memset(&g->stats, 0, sizeof g->stats);
    g->stats.compile = keep.compile;
    g->stats.compile_ms = keep.compile_ms;
    g->stats.load_ms = keep.load_ms;
    g->stats.weight_bytes = keep.weight_bytes;
    g->stats.warmup_ms = kb_now_ms() - t0;
    return st;
}

static const void *ref_get(void *user, const char *name, kiln_type type, int64_t n) {
    kiln_gen *g = user;
    if (strcmp(name, "inp_tokens") == 0) return g->tokens;
    if (strcmp(name, "inp_pos") == 0) return g->positions;
    if (strcmp(name, "kv_idxs") == 0) return g->slots;
    if (strcmp(name, "kq_mask") == 0) return g->all ? (const void *)g->iv : g->mask;
    if (strcmp(name, "kq_mask_swa") == 0) return g->all ? (const void *)g->iv_swa : g->mask_swa;
    if (strcmp(name, "inp_out_ids") == 0) return g->out_ids;
    for (int i = 0; i < g->nstates; i++)
        if (strcmp(g->states[i].name, name) == 0) return g->states[i].data;
    return kiln_model_weight(g->m, name, type, n);
}

static void ref_put(void *user, const char *name, kiln_type type, int64_t n, const void *data) {
    kiln_gen *g = user;
    size_t    bytes = (size_t)n * kiln_type_size(type);
    if (strcmp(name, "logits") == 0 && bytes == sizeof *g->logits * (size_t)(g->hp->n_vocab * (g->all ? g->nt : 1))) {
        memcpy(g->logits, data, bytes);
        return;
    }
    for (int i = 0; i < g->nstates; i++)
        if (strcmp(g->states[i].name, name) == 0 && g->states[i].bytes == bytes) {
            memcpy(g->states[i].data, data, bytes);
            return;
        }
    if (!g->ref_err) g->ref_err = kb_error(KILN_ERR_INVALID, "kiln_gen: the reference gave '%s' (%lld values), which "
                                                             "the generator does not expect", name, (long long)n);
}

/* The run place_inputs made, on the ranks (model/gen_tp.c) or the stages (model/gen_pp.c): the
 * first n_read rows' logits. */
static kiln_status split_run(kiln_gen *g) {
    km_tp_run in = {.tokens = g->tokens, .positions = g->positions, .out_ids = g->out_ids, .slots = g->slots,
                    .mask = g->mask, .mask_swa = g->mask_swa, .iv = g->iv, .iv_swa = g->iv_swa, .nt = g->nt,
                    .nkv = g->nkv, .n_out = g->all ? g->nt : 1, .n_read = g->all ? g->n_read : 1};
    double    t0 = kb_now_ms();
    kiln_status st = g->tp ? km_tp_gen_run(g->tp, &in, g->logits) : km_pp_gen_run(g->pp, &in, g->logits);
    g->stats.run_ms += kb_now_ms() - t0;
    return st;
}

static kiln_status cpu_run(kiln_gen *g) {
    kiln_status st = km_ref_run(g->ctx, g->nt, g->nkv, ref_get, ref_put, g);
    if (!st && g->ref_err) st = g->ref_err, g->ref_err = NULL;
    return st;
}

km_gen_inputs km_gen_rows_inputs(kiln_gen *g) {
    return (km_gen_inputs){g->tokens, g->positions, g->slots, g->iv, g->iv_swa, g->out_ids, g->n_batch};
}

kiln_status km_gen_rows_run(kiln_gen *g, int64_t nt, int64_t nkv, int64_t n_read, const float **logits,
                            const int32_t **picks) {
    g->nt = nt, g->nkv = nkv, g->n_read = n_read;
    kiln_status st = split(g) ? split_run(g) : g->cpu ? cpu_run(g) : gpu_run(g, picks ? READ_ARGMAX : READ_LOGITS);
    if (!st && !g->cpu) g->stats.decode_gpu_ms += split(g) ? split_ms(g) : kiln_session_last_ms(g->sess);
    /* the CPU reference and split models have no argmax output: the rows' picks from the logits */
    for (int64_t t = 0; !st && picks && (g->cpu || split(g)) && t < n_read; t++)
        g->picks[t] = (int32_t)kiln_argmax_f32(g->logits + t * g->hp->n_vocab, g->hp->n_vocab);
    if (logits) *logits = st || picks ? NULL : g->logits;
    if (picks) *picks = st ? NULL : g->picks;
    return st;
}

/* prefill: the runs' GPU time is the prompt's, else a decode step's. Not decided by a run's
 * size: with n_batch = 1 a prompt runs one token at a time. */
static kiln_status eval(kiln_gen *g, const int32_t *tokens, int64_t n, run_read last_read, bool prefill) {
    if (g->pos + n > g->n_ctx)
        return kb_error(KILN_ERR_INVALID, "kiln_gen_eval: %lld more tokens after %lld do not fit in the cache of %lld "
                                          "(n_ctx)", (long long)n, (long long)g->pos, (long long)g->n_ctx);
    for (int64_t done = 0; done < n;) {
        int64_t     nt = n - done < g->n_batch ? n - done : g->n_batch;
        bool        last = done + nt == n;
        kiln_status st = make_inputs(g, tokens + done, nt);
        if (!st) st = split(g) ? split_run(g) : g->cpu ? cpu_run(g) : gpu_run(g, last ? last_read : READ_NOTHING);
        if (st) return st;
        double gpu_ms = split(g) ? split_ms(g) : g->cpu ? 0.0 : kiln_session_last_ms(g->sess);
        if (prefill) g->stats.prefill_gpu_ms += gpu_ms;
        else g->stats.decode_gpu_ms += gpu_ms;
        g->pos += nt;
        done += nt;
    }
    return NULL;
}

kiln_status kiln_gen_eval(kiln_gen *g, const int32_t *tokens, int64_t n, const float **logits) {
    if (!g || !tokens || !logits || n < 1)
        return kb_error(KILN_ERR_INVALID, "kiln_gen_eval: %s", n < 1 ? "no tokens" : "NULL argument");
    *logits = NULL;
    kiln_status st = eval(g, tokens, n, READ_LOGITS, n > 1);
    if (!st) *logits = g->logits;
    return st;
}

static kiln_status eval_greedy(kiln_gen *g, const int32_t *tokens, int64_t n, int32_t *next, bool prefill) {
    if (!g || !tokens || !next || n < 1)
        return kb_error(KILN_ERR_INVALID, "kiln_gen_eval_greedy: %s", n < 1 ? "no tokens" : "NULL argument");
    bool        host = g->cpu || split(g); /* (no argmax output: the logits are read) */
    kiln_status st = eval(g, tokens, n, host ? READ_LOGITS : READ_ARGMAX, prefill);
    if (st) return st;
    double t0 = kb_now_ms();
    *next = host ? (int32_t)kiln_argmax_f32(g->logits, g->hp->n_vocab) : g->next;
    g->stats.sample_ms += kb_now_ms() - t0;
    return NULL;
}

/* A call of several tokens is a prompt; of one, a decode step. */
kiln_status kiln_gen_eval_greedy(kiln_gen *g, const int32_t *tokens, int64_t n, int32_t *next) {
    return eval_greedy(g, tokens, n, next, n > 1);
}

/* The pick after tokens: the argmax, or with `sample` the program's own sample (gpu_sample). */
static kiln_status eval_pick(kiln_gen *g, const int32_t *tokens, int64_t n, int32_t *next, bool prefill,
                             bool sample) {
    if (!sample) return eval_greedy(g, tokens, n, next, prefill);
    kiln_status st = eval(g, tokens, n, READ_SAMPLE, prefill);
    if (!st) *next = g->next;
    return st;
}

int64_t kiln_argmax_f32(const float *x, int64_t n) {
    /* One compare per element (NaN compares false, so it never wins); a vocabulary of 150k
     * logits is scanned once per generated token. */
    int64_t best = -1;
    float   v = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (x[i] > v) v = x[i], best = i;
    if (best >= 0) return best;
    for (int64_t i = 0; i < n; i++) /* all -inf or NaN: the first -inf, else 0 */
        if (x[i] == -INFINITY) return i;
    return 0;
}

/* KILN_CHAIN=0: decode one step at a time (an A/B switch, and a way around any trouble with
 * the chain's streams on some driver). */
static bool chain_wanted(void) {
    const char *e = getenv("KILN_CHAIN");
    return !e || !(!strcmp(e, "0") || !strcmp(e, "off") || !strcmp(e, "no") || !strcmp(e, "false"));
}

/* Receives each pick in order; false stops generation after it. */
typedef bool (*pick_fn)(void *user, int32_t id);

/* Up to n decode steps chained on the GPU (kiln_session_chain_*): each step's argmax is the next
 * step's token on the device, and the host makes and sets step i+1's inputs while step i runs.
 * pick gets each step's pick as the host learns it, one step late; when it stops, the step
 * queued meanwhile (fed the stopping pick) is dropped and the position set back over it, so
 * the cache holds every pick but the last, as after n steps. *chained is false when the
 * program cannot chain (nothing ran: decode one step at a time). */
static kiln_status gpu_decode_chain(kiln_gen *g, int32_t first, int64_t n, pick_fn pick, void *user, bool sample,
                                    bool *chained) {
    kiln_session *s = g->sess;
    double        t0 = kb_now_ms();
    g->tokens[0] = first;
    place_inputs(g, 1);
    kiln_status st = set_inputs(g, true);
    g->stats.inputs_ms += kb_now_ms() - t0;
    if (!st) st = kiln_session_chain_begin(s, sample ? "sample" : "argmax", "inp_tokens");
    *chained = !st;
    if (st && (kiln_status_code(st) == KILN_ERR_INVALID || kiln_status_code(st) == KILN_ERR_NOT_FOUND)) {
        kiln_status_free(st);
        return NULL;
    }
    if (st) return st;
    int64_t queued = 0;
    bool    stopped = false;
    int32_t prev = -1;
    for (int64_t i = 0; !st && !stopped && i < n; i++) {
        if (i > 0) {
            double t1 = kb_now_ms();
            place_inputs(g, 1);
            st = set_inputs(g, false);
            g->stats.inputs_ms += kb_now_ms() - t1;
        }
        bool   got = false;
        double t2 = kb_now_ms();
        if (!st) st = kiln_session_chain_run(s, &prev, sizeof prev, &got);
        g->stats.run_ms += kb_now_ms() - t2;
        if (st) break;
        queued++;
        g->pos++;
        if (got) {
            g->stats.decode_gpu_ms += kiln_session_last_ms(s);
            if (!pick(user, prev)) {
                stopped = true;
                g->pos--; /* the step just queued was fed the stopping pick */
            }
        }
    }
    double      t3 = kb_now_ms();
    kiln_status end = kiln_session_chain_end(s, st || stopped ? NULL : &prev, sizeof prev);
    g->stats.run_ms += kb_now_ms() - t3;
    if (!st && !end && queued > 0 && !stopped) {
        g->stats.decode_gpu_ms += kiln_session_last_ms(s);
        g->next = prev;
        pick(user, prev);
    }
    if (!st) st = end;
    else kiln_status_free(end);
    return st;
}

/* Up to n decode steps from `first`, each fed the pick of the one before (the argmax, or with
 * `sample` the program's sample): chained on the GPU, else one at a time. */
static kiln_status decode_picks(kiln_gen *g, int32_t first, int64_t n, pick_fn pick, void *user, bool sample) {
    kiln_status st = check_tokens(g, &first, 1);
    if (st || n == 0) return st;
    if (g->pos + n > g->n_ctx)
        return kb_error(KILN_ERR_INVALID, "kiln_gen_decode_greedy: %lld steps after %lld do not fit in the cache of "
                                          "%lld (n_ctx)", (long long)n, (long long)g->pos, (long long)g->n_ctx);
    bool chained = false;
    if (!g->cpu && !split(g) && chain_wanted() &&
        ((st = gpu_decode_chain(g, first, n, pick, user, sample, &chained)) || chained))
        return st;
    int32_t tok = first, next;
    for (int64_t i = 0; !st && i < n; i++) {
        st = eval_pick(g, &tok, 1, &next, false, sample);
        if (!st && !pick(user, tok = next)) break;
    }
    return st;
}

typedef struct {
    int32_t *out;
    int64_t  n;
} pick_store;

static bool store_pick(void *user, int32_t id) {
    pick_store *p = user;
    p->out[p->n++] = id;
    return true;
}

kiln_status kiln_gen_decode_greedy(kiln_gen *g, int32_t first, int64_t n, int32_t *out) {
    if (!g || !out || n < 0) return kb_error(KILN_ERR_INVALID, "kiln_gen_decode_greedy: %s", n < 0 ? "n < 0" : "NULL argument");
    pick_store ps = {out, 0};
    return decode_picks(g, first, n, store_pick, &ps, false);
}

/* kiln_gen_decode_greedy's twin over the program's sample (gpu_sample): the warm-up's chain. */
static kiln_status decode_sampled(kiln_gen *g, int32_t first, int64_t n, int32_t *out) {
    pick_store ps = {out, 0};
    return decode_picks(g, first, n, store_pick, &ps, true);
}

/* Counts this call's share of g's stats into *stats (when not NULL). */
static void stats_since(const kiln_gen *g, const kiln_gen_stats *before, kiln_gen_stats *stats) {
    if (!stats) return;
    *stats = g->stats;
    stats->prefill_tokens -= before->prefill_tokens;
    stats->decode_tokens -= before->decode_tokens;
    stats->prefill_ms -= before->prefill_ms;
    stats->decode_ms -= before->decode_ms;
    stats->prefill_gpu_ms -= before->prefill_gpu_ms;
    stats->decode_gpu_ms -= before->decode_gpu_ms;
    stats->inputs_ms -= before->inputs_ms;
    stats->run_ms -= before->run_ms;
    stats->readback_ms -= before->readback_ms;
    stats->sample_ms -= before->sample_ms;
}

/* kiln_gen_generate's picks: end of generation, the caller's stop, the limit. */
typedef struct {
    const kiln_gen_params *p;
    int64_t                count;
    kiln_stop              why;
} gen_run;

static bool run_pick(void *user, int32_t id) {
    gen_run *r = user;
    for (int64_t i = 0; i < r->p->n_eog; i++)
        if (r->p->eog[i] == id) {
            r->why = KILN_STOP_EOG;
            return false;
        }
    r->count++;
    if (r->p->on_token && r->p->on_token(r->p->user, id)) r->why = KILN_STOP_CALLER;
    else if (r->p->n_predict >= 0 && r->count >= r->p->n_predict) r->why = KILN_STOP_LIMIT;
    return r->why == KILN_STOP_NONE;
}

/* The tokens a sampled generation has seen: this call's prompt, then its picks (the history of
 * the penalties). */
typedef struct {
    int32_t *ids;
    int64_t  n, cap;
} token_log;

static kiln_status log_push(token_log *l, const int32_t *ids, int64_t n) {
    if (l->n + n > l->cap) {
        int64_t  cap = l->cap ? l->cap : 256;
        while (cap < l->n + n) cap *= 2;
        int32_t *v = realloc(l->ids, sizeof *v * (size_t)cap);
        if (!v) return kb_oom();
        l->ids = v, l->cap = cap;
    }
    memcpy(l->ids + l->n, ids, sizeof *ids * (size_t)n);
    l->n += n;
    return NULL;
}

/* Evaluates tokens and samples the pick after them (the logits read back). */
static kiln_status eval_sample(kiln_gen *g, const kiln_sampler_params *sp, const int32_t *tokens, int64_t n,
                               bool prefill, token_log *hist, int32_t *next) {
    kiln_status st = eval(g, tokens, n, READ_LOGITS, prefill);
    if (!st) st = log_push(hist, tokens, n);
    if (st) return st;
    double t0 = kb_now_ms();
    st = kiln_sample(sp, g->logits, g->hp->n_vocab, hist->ids, hist->n, g->pos, next);
    g->stats.sample_ms += kb_now_ms() - t0;
    return st;
}

/* kiln_gen_generate with a sampler: a step at a time, each pick sampled on the host. */
static kiln_status generate_sampled(kiln_gen *g, const int32_t *prompt, int64_t n_prompt, gen_run *r) {
    const kiln_sampler_params *sp = r->p->sampler;
    token_log                  hist = {0};
    int32_t                    next;
    double                     t0 = kb_now_ms();
    kiln_status                st = eval_sample(g, sp, prompt, n_prompt, true, &hist, &next);
    g->stats.prefill_ms += kb_now_ms() - t0;
    if (!st) g->stats.prefill_tokens += n_prompt;
    if (r->p->n_predict == 0) r->why = KILN_STOP_LIMIT;
    bool more = !st && r->p->n_predict != 0 && run_pick(r, next);
    double t1 = kb_now_ms();
    for (; !st && more; more = run_pick(r, next)) {
        if (g->pos == g->n_ctx) {
            r->why = KILN_STOP_CONTEXT;
            break;
        }
        int32_t tok = next;
        if ((st = check_tokens(g, &tok, 1))) break;
        st = eval_sample(g, sp, &tok, 1, false, &hist, &next);
        if (!st) g->stats.decode_tokens++;
    }
    g->stats.decode_ms += kb_now_ms() - t1;
    free(hist.ids);
    return st;
}

/* Whether p picks what the program's sample (built with q) picks: the op's parameters alike. */
static bool same_sampler(const kiln_sampler_params *p, const kiln_sampler_params *q, int64_t n_vocab) {
    return kiln_sampler_on_gpu(p, n_vocab) && p->seed == q->seed && p->temp == q->temp && p->top_k == q->top_k &&
           p->top_p == q->top_p && p->min_p == q->min_p;
}

kiln_status kiln_gen_generate(kiln_gen *g, const int32_t *prompt, int64_t n_prompt, const kiln_gen_params *p,
                              int64_t *n_out, kiln_stop *why, kiln_gen_stats *stats) {
    if (!g || !prompt || !p || n_prompt < 1 || (p->n_eog && !p->eog))
        return kb_error(KILN_ERR_INVALID, "kiln_gen_generate: %s", n_prompt < 1 ? "an empty prompt" : "bad argument");
    kiln_gen_stats before = g->stats;
    gen_run        r = {.p = p, .why = KILN_STOP_NONE};
    kiln_status    st = p->sampler ? kiln_sampler_check(p->sampler) : NULL;
    if (st) return st;
    /* The graph's argmax serves greedy picks unless penalties change the logits first; its
     * sample serves the sampler it was built with; any other sampler reads the logits back. */
    const kiln_sampler_params *sp = p->sampler;
    bool sampled = sp && (sp->temp > 0 || kiln_sampler_penalized(sp));
    bool on_gpu = sampled && g->gpu_sample && same_sampler(sp, &g->sampler, g->hp->n_vocab);
    if (sampled && !on_gpu) {
        st = generate_sampled(g, prompt, n_prompt, &r);
        if (n_out) *n_out = r.count;
        if (why) *why = r.why;
        stats_since(g, &before, stats);
        return st;
    }
    double  t0 = kb_now_ms();
    int32_t next;
    st = eval_pick(g, prompt, n_prompt, &next, true, on_gpu);
    g->stats.prefill_ms += kb_now_ms() - t0;
    if (!st) g->stats.prefill_tokens += n_prompt;
    if (p->n_predict == 0) r.why = KILN_STOP_LIMIT; /* the prompt is in the cache: a prefill alone */
    if (!st && p->n_predict != 0 && run_pick(&r, next)) {
        /* Each step feeds the last pick; the cache's room bounds the steps (and so does -n). */
        int64_t room = g->n_ctx - g->pos, left = p->n_predict < 0 ? room : p->n_predict - r.count;
        int64_t steps = left < room ? left : room;
        double  t1 = kb_now_ms();
        int64_t pos0 = g->pos;
        st = decode_picks(g, next, steps, run_pick, &r, on_gpu);
        g->stats.decode_ms += kb_now_ms() - t1;
        g->stats.decode_tokens += g->pos - pos0; /* the steps whose picks were taken */
        if (!st && r.why == KILN_STOP_NONE) r.why = KILN_STOP_CONTEXT;
    }
    if (n_out) *n_out = r.count;
    if (why) *why = r.why;
    stats_since(g, &before, stats);
    return st;
}

kiln_status kiln_gen_greedy(kiln_gen *g, const int32_t *prompt, int64_t n_prompt, int64_t n_new, int32_t *out,
                            kiln_gen_stats *stats) {
    if (!g || !prompt || (n_new > 0 && !out) || n_prompt < 1 || n_new < 0)
        return kb_error(KILN_ERR_INVALID, "kiln_gen_greedy: %s", n_prompt < 1 ? "an empty prompt" : "bad argument");
    kiln_gen_stats before = g->stats;
    double      t0 = kb_now_ms();
    int32_t     next;
    kiln_status st = eval_greedy(g, prompt, n_prompt, &next, true);
    if (st) return st;
    g->stats.prefill_ms += kb_now_ms() - t0;
    g->stats.prefill_tokens += n_prompt;
    if (n_new > 0) out[0] = next;
    double t1 = kb_now_ms();
    if (n_new > 1 && (st = kiln_gen_decode_greedy(g, out[0], n_new - 1, out + 1))) return st;
    g->stats.decode_ms += kb_now_ms() - t1;
    g->stats.decode_tokens += n_new > 1 ? n_new - 1 : 0;
    stats_since(g, &before, stats);
    return NULL;
}

/* ---- context shift (issue 26): llama.cpp's K-shift ------------------------------------------- */

/* The CPU reference's inputs and output of the re-rope graph. */
typedef struct {
    const float   *x, *freqs;
    const int32_t *pos;
    float         *y;
    int64_t        n;
} shift_io;

static const void *shift_get(void *user, const char *name, kiln_type type, int64_t n) {
    const shift_io *io = user;
    if (!strcmp(name, "x")) return io->x;
    if (!strcmp(name, "pos")) return io->pos;
    return !strcmp(name, "freqs") ? io->freqs : NULL;
}

static void shift_put(void *user, const char *name, kiln_type type, int64_t n, const void *data) {
    shift_io *io = user;
    if (!strcmp(name, "y") && type == KILN_F32 && n == io->n) memcpy(io->y, data, sizeof *io->y * (size_t)n);
}

/* m rows of a K cache (f16, cache rows of km_cache_row values) rotated by delta positions with
 * the model's own rope on the CPU reference: rope is a rotation, so R(p + delta) = R(delta) R(p).
 * In f32, rounded back to f16, as ggml ropes an f16 cache. A row holds n_head_kv heads of
 * head_dim; deepseek2's (MLA) the latent, then the one rope key of n_rot, the part rotated. */
static kiln_status rerope(const kiln_gen *g, const kiln_model_hparams *rank, int64_t il, uint16_t *rows, int64_t m,
                          int64_t delta) {
    /* The rotation only: longrope's attn_factor scaled K when it was roped at its position, and
     * R(delta) must not scale it again (llama.cpp's shift passes the factor again; kiln keeps K
     * equal to K roped anew at the shifted position). */
    kiln_model_hparams one = *rank;
    one.rope_attn_factor = 0.0f;
    /* YaRN: ggml's rope multiplies by 1 + 0.1 ln(factor) whatever attn_factor is; cancel it
     * (km_arch_rope does for deepseek2 already) */
    if (one.rope_scaling == KILN_ROPE_SCALING_YARN && !km_mla(&one))
        one.rope_attn_factor = 1.0f / (1.0f + 0.1f * logf(one.rope_factor));
    const kiln_model_hparams *hp = &one;
    int64_t     hd = km_rot(hp), heads = km_mla(hp) ? 1 : hp->n_head_kv, n = hd * heads * m;
    int64_t     row = km_cache_row(hp), off = km_mla(hp) ? hp->kv_lora_rank : 0, per = hd * heads;
    float      *x = malloc(sizeof *x * (size_t)n * 2);
    int32_t    *pos = malloc(sizeof *pos * (size_t)m);
    kiln_ctx   *ctx = kiln_ctx_new();
    kiln_graph *gr = NULL;
    kiln_status st = x && pos && ctx ? NULL : kb_oom();
    if (!st) {
        for (int64_t i = 0; i < n; i++) x[i] = kb_f16_to_f32(rows[i / per * row + off + i % per]);
        for (int64_t i = 0; i < m; i++) pos[i] = (int32_t)delta;
        const char  *fname = km_rope_factors(hp, g->n_ctx); /* the factors the graph ropes with */
        const float *freqs = fname ? kiln_model_weight(g->m, fname, KILN_F32, hd / 2) : NULL;
        int64_t      ne[3] = {hd, heads, m}, nf = hd / 2;
        kiln_tensor *tx = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "x", 3, ne);
        kiln_tensor *tp = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_I32, "pos", 1, &m);
        kiln_tensor *tf = freqs ? kiln_new_tensor(ctx, KILN_ROLE_WEIGHT, KILN_F32, "freqs", 1, &nf) : NULL;
        kiln_set_output(ctx, km_layer_rope(ctx, hp, il, tx, tp, tf), "y"); /* (gemma3: the layer's base) */
        shift_io io = {.x = x, .freqs = freqs, .pos = pos, .y = x + n, .n = n};
        st = kiln_graph_new(ctx, &gr);
        if (!st) st = kiln_reference(gr, shift_get, shift_put, &io);
        for (int64_t i = 0; !st && i < n; i++) rows[i / per * row + off + i % per] = kb_f32_to_f16(x[n + i]);
    }
    kiln_graph_free(gr);
    kiln_ctx_free(ctx);
    free(x);
    free(pos);
    return st;
}

/* Rank r's cache state of layer il: the rank's (tensor parallelism), its stage's (pipeline),
 * the host copy (cpu), else through the session. */
static kiln_status state_io(kiln_gen *g, int r, int64_t il, const char *name, void *data, size_t bytes, bool write) {
    if (g->tp) return km_tp_gen_state(g->tp, r, name, data, bytes, write);
    if (g->pp) return km_pp_gen_state(g->pp, il, name, data, bytes, write);
    if (!g->cpu) return write ? kiln_session_set(g->sess, name, data, bytes) : kiln_session_get(g->sess, name, data, bytes);
    if (km_host_state_io(g->states, g->nstates, name, data, bytes, write)) return NULL;
    return kb_error(KILN_ERR_NOT_FOUND, "kiln_gen_shift: no cache state %s of %zu bytes", name, bytes);
}

const void *km_gen_cpu_state(const kiln_gen *g, const char *name, size_t *bytes) {
    for (int i = 0; g && g->cpu && i < g->nstates; i++)
        if (!strcmp(g->states[i].name, name)) {
            *bytes = g->states[i].bytes;
            return g->states[i].data;
        }
    return NULL;
}

kiln_status kiln_gen_shift(kiln_gen *g, int64_t n_keep, int64_t n_discard) {
    if (!g || n_keep < 0 || n_discard < 1 || n_keep + n_discard > g->pos)
        return kb_error(KILN_ERR_INVALID, "kiln_gen_shift: keep %lld and discard %lld of %lld tokens",
                        (long long)n_keep, (long long)n_discard, (long long)(g ? g->pos : 0));
    /* Over G ranks each cache holds its n_head_kv / G heads (MLA's latent: whole on every
     * rank), shifted and re-roped as one GPU's. */
    int                G = g->tp ? km_tp_gen_ranks(g->tp) : 1;
    kiln_model_hparams rank = *g->hp;
    if (!km_mla(&rank)) rank.n_head_kv /= G;
    const kiln_model_hparams *hp = &rank;
    int64_t     row = km_cache_row(hp), m = g->pos - n_keep - n_discard;
    size_t      bytes = sizeof(uint16_t) * (size_t)(row * g->n_ctx);
    uint16_t   *c = malloc(bytes);
    kiln_status st = c ? NULL : kb_oom();
    for (int r = 0; !st && r < G; r++)
        for (int64_t il = 0; !st && il < hp->n_layer; il++)
            for (int kv = 0; !st && kv < (km_mla(hp) ? 1 : 2); kv++) { /* (MLA: V is within K's rows) */
                char name[32];
                snprintf(name, sizeof name, "cache_%c_l%lld", kv ? 'v' : 'k', (long long)il);
                st = state_io(g, r, il, name, c, bytes, false);
                if (st) break;
                memmove(c + row * n_keep, c + row * (n_keep + n_discard), sizeof *c * (size_t)(row * m));
                if (!kv && m > 0 && km_layer_ropes(hp, il)) st = rerope(g, hp, il, c + row * n_keep, m, -n_discard);
                if (!st) st = state_io(g, r, il, name, c, bytes, true);
            }
    free(c);
    if (!st) g->pos -= n_discard;
    return st;
}

void kiln_gen_get_stats(const kiln_gen *g, kiln_gen_stats *out) {
    if (g && out) *out = g->stats;
}
