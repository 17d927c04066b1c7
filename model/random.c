/* kiln_model_write_random: a GGUF model with real hyperparameters and random weights (kiln
 * gen-model), for tests and benchmarks without downloading a model.
 *
 * The tensors are those of the graph kiln_build_model builds, in graph order, so the file loads
 * by construction. Element e of a tensor is a hash of (seed, the tensor's name, e): a counter-based
 * generator, so any chunking by the writer and any thread count give the same bytes. Scales keep a
 * random model numerically tame: matrices have variance 1/ne0 (activations keep their size
 * through each projection), norm weights are near 1, biases small. A quantized weight's values
 * are made the same way, as f32, and then quantized by kb_quant_row, whole blocks at a time (a
 * row is whole blocks, so this is row by row): the types are those of the file type's mix
 * (model/ftype.c), since the graph's weights have them. */
#include "base/base.h"
#include "model/gguf.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PIECE ((int64_t)1 << 16) /* elements per job of a chunk */

typedef enum { INIT_MATRIX, INIT_EMBD, INIT_NORM, INIT_BIAS, INIT_ROPE_FREQS } init_kind;

typedef struct {
    const char *name;
    kiln_type   type;
    int64_t     ne[4];
    init_kind   kind;
} weight_spec;

typedef struct {
    const kiln_model_hparams *hp;
    uint64_t                  seed;
    weight_spec              *w;
    int64_t                   nw;
    kiln_ctx                 *ctx2; /* the second graph's (longrope), which owns some names */
    void (*progress)(void *user, uint64_t done, uint64_t total);
    void *progress_user;
} gen_ctx;

static void write_progress(void *user, uint64_t done, uint64_t total) {
    const gen_ctx *g = user;
    if (g->progress) g->progress(g->progress_user, done, total);
}

/* splitmix64's output function: a bijective mix of a 64-bit counter. */
static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t name_hash(const char *s) { /* FNV-1a */
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static init_kind kind_of(const char *name) {
    if (strcmp(name, "rope_freqs.weight") == 0) return INIT_ROPE_FREQS;
    if (strcmp(name, "token_embd.weight") == 0) return INIT_EMBD;
    /* longrope's factors: positive, near 1, as the norms' weights */
    if (ends_with(name, "norm.weight") || strncmp(name, "rope_factors_", 13) == 0) return INIT_NORM;
    if (ends_with(name, ".bias")) return INIT_BIAS;
    return INIT_MATRIX;
}

typedef struct {
    const gen_ctx     *g;
    const weight_spec *w;
    void              *buf;
    int64_t            first, n; /* elements first .. first + n - 1 of the tensor, into buf */
    float             *scratch;  /* a quantized type: PIECE floats per worker, quantized into buf */
} fill_job;

/* The generator's parameters of weight w: element e is base + scale * u(key, e). Matrices are
 * uniform with variance 1/ne0 (scale sqrt(3/ne0)), embeddings in [-1, 1), norms 1 +- 0.1,
 * biases +- 0.1. kiln_session_fill_weights documents the same generator for the device. */
static void spec_params(uint64_t seed, const weight_spec *w, uint64_t *key, float *scale, float *base) {
    *key = mix(seed ^ name_hash(w->name));
    *scale = w->kind == INIT_MATRIX ? sqrtf(3.0f / (float)w->ne[0]) : w->kind == INIT_EMBD ? 1.0f : 0.1f;
    *base = w->kind == INIT_NORM ? 1.0f : 0.0f;
}

static void fill_piece(void *user, int item, int worker) {
    const fill_job    *j = user;
    const weight_spec *w = j->w;
    int64_t            lo = (int64_t)item * PIECE, hi = lo + PIECE < j->n ? lo + PIECE : j->n;
    uint64_t           key;
    float              scale, base;
    spec_params(j->g->seed, w, &key, &scale, &base);
    float             *x = j->scratch ? j->scratch + (size_t)worker * PIECE : NULL;
    for (int64_t i = lo; i < hi; i++) {
        uint64_t r = mix(key + (uint64_t)(j->first + i) * 0x9e3779b97f4a7c15ull);
        float    u = (float)(r >> 40) * (1.0f / 8388608.0f) - 1.0f; /* [-1, 1) */
        if (x) x[i - lo] = base + scale * u;
        else kb_store_f32(j->buf, w->type, i, base + scale * u);
    }
    /* PIECE and the chunk's start are whole blocks (the writer cuts chunks so). */
    if (x) kb_quant_row(x, w->type, (uint8_t *)j->buf + (size_t)(lo / kiln_type_block(w->type)) * kiln_type_size(w->type),
                        hi - lo);
}

static kiln_status fill(void *user, int64_t i, const char *name, uint64_t offset, void *buf, size_t bytes) {
    const gen_ctx *g = user;
    if (i < 0 || i >= g->nw || strcmp(name, g->w[i].name) != 0)
        return kb_error(KILN_ERR_INVALID, "gen-model: the writer asked for tensor %lld '%s', which was not added so",
                        (long long)i, name);
    const weight_spec *w = &g->w[i];
    size_t             es = kiln_type_size(w->type); /* of an element, or of a block */
    int64_t            blk = kiln_type_block(w->type);
    int64_t            first = (int64_t)(offset / es) * blk, n = (int64_t)(bytes / es) * blk;
    if (offset % es || bytes % es)
        return kb_error(KILN_ERR_INVALID, "gen-model: tensor '%s' asked for in a chunk of part of a %s %s", name,
                        kiln_type_name(w->type), blk > 1 ? "block" : "element");
    if (w->kind == INIT_ROPE_FREQS) {
        int64_t all = w->ne[0];
        if (w->type != KILN_F32 || offset != 0 || n != all)
            return kb_error(KILN_ERR_INVALID, "gen-model: rope_freqs.weight must be f32 and written in one piece");
        return kiln_model_rope_freqs(g->hp, buf, n);
    }
    int      jobs = kb_default_jobs();
    fill_job j = {g, w, buf, first, n, NULL};
    if (blk > 1 && !(j.scratch = malloc(sizeof *j.scratch * PIECE * (size_t)jobs))) return kb_oom();
    kb_parallel_for((int)((n + PIECE - 1) / PIECE), jobs, fill_piece, &j);
    free(j.scratch);
    return NULL;
}

/* The weights of hp's graph, in graph order. */
/* The weights of the graph built with a cache of n_ctx rows, those not listed yet, into g. */
static kiln_status add_graph_weights(const kiln_model_hparams *hp, kiln_ctx *ctx, int64_t n_ctx, gen_ctx *g) {
    kiln_build_opts o = {.n_ctx = n_ctx, .n_tokens_max = 2};
    kiln_status     st = kiln_build_model(ctx, hp, &o);
    kiln_graph     *gr = NULL;
    if (!st) st = kiln_graph_new(ctx, &gr);
    weight_spec *more = st ? NULL : realloc(g->w, sizeof *g->w * (size_t)(g->nw + kiln_graph_size(gr)));
    if (!st && !more) st = kb_oom();
    if (!st) g->w = more;
    for (int i = 0; !st && i < kiln_graph_size(gr); i++) {
        const kiln_tensor *t = kiln_graph_node(gr, i);
        if (kiln_tensor_role(t) != KILN_ROLE_WEIGHT) continue;
        bool seen = false;
        for (int64_t j = 0; j < g->nw && !seen; j++) seen = !strcmp(g->w[j].name, kiln_tensor_name(t));
        if (seen) continue;
        weight_spec *w = &g->w[g->nw++];
        w->name = kiln_tensor_name(t);
        w->type = kiln_tensor_type(t);
        for (int d = 0; d < 4; d++) w->ne[d] = kiln_tensor_ne(t, d);
        w->kind = kind_of(w->name);
    }
    kiln_graph_free(gr);
    return st;
}

static kiln_status collect_weights(const kiln_model_hparams *hp, kiln_ctx **ctx_out, gen_ctx *g) {
    kiln_ctx *ctx = kiln_ctx_new();
    if (!ctx) return kb_oom();
    /* A small graph: the weights do not depend on the cache or batch sizes (a maximum of 1
     * would make n_tokens a plain extent, which the builder's reshapes do not expect), but for
     * longrope's factors: a cache past the original context reads the long ones, so a second
     * graph adds them (g->ctx2 owns their names; freed with g's weights). */
    kiln_status st = add_graph_weights(hp, ctx, 2, g);
    if (!st && hp->rope_scaling == KILN_ROPE_SCALING_LONGROPE) {
        if (!(g->ctx2 = kiln_ctx_new())) st = kb_oom();
        if (!st) st = add_graph_weights(hp, g->ctx2, hp->rope_orig_ctx + 1, g);
    }
    *ctx_out = ctx;
    return st;
}

kiln_status kiln_model_write_random(const kiln_model_hparams *hp, uint64_t seed, const char *path,
                                    void (*progress)(void *user, uint64_t done, uint64_t total), void *user) {
    return kiln_model_write_random_vocab(hp, seed, KILN_VOCAB_BPE, path, progress, user);
}

kiln_status kiln_model_write_random_vocab(const kiln_model_hparams *hp, uint64_t seed, kiln_vocab_kind vocab,
                                          const char *path,
                                          void (*progress)(void *user, uint64_t done, uint64_t total), void *user) {
    if (!hp || !path) return kb_error(KILN_ERR_INVALID, "kiln_model_write_random: NULL argument");
    if (vocab != KILN_VOCAB_BPE && vocab != KILN_VOCAB_SPM)
        return kb_error(KILN_ERR_INVALID, "kiln_model_write_random: vocabulary kind %d is not bpe or spm", (int)vocab);
    kiln_status st = kiln_model_check(hp);
    if (st) return st;
    gen_ctx   g = {.hp = hp, .seed = seed, .progress = progress, .progress_user = user};
    kiln_ctx *ctx = NULL;
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    if (!w) return kb_oom();
    st = collect_weights(hp, &ctx, &g);
    if (!st) {
        kiln_model_hparams_to_gguf(hp, w);
        st = vocab == KILN_VOCAB_SPM ? kiln_tokenizer_write_synthetic_spm(w, hp->n_vocab)
                                     : kiln_tokenizer_write_synthetic(w, hp->n_vocab);
    }
    for (int64_t i = 0; !st && i < g.nw; i++)
        kiln_gguf_add_tensor(w, g.w[i].name, g.w[i].type, km_n_dims(g.w[i].ne), g.w[i].ne, NULL);
    if (!st) st = kiln_gguf_write(w, path, fill, &g, write_progress);
    kiln_gguf_writer_free(w);
    free(g.w);
    kiln_ctx_free(g.ctx2);
    kiln_ctx_free(ctx);
    return st;
}

/* ---- random models without a file (kiln_model_random) ----------------------------------------
 * The same weights, made where they are needed: on the device by kiln_session_fill_weights, or
 * in host memory on first use (the CPU reference). With quant_blocks (kiln_model_random_blocks,
 * for benchmarks) a quantized weight is random blocks made on the device (fill_quant): its
 * file values would be quantized on the host, minutes for a model of several GB. */

struct km_random {
    kiln_model_hparams hp;
    gen_ctx            g;
    bool               quant_blocks;
    kiln_ctx          *ctx;  /* owns the weight names */
    void             **host; /* per weight: host data made on first use */
};

kiln_status km_random_new(const kiln_model_hparams *hp, uint64_t seed, bool quant_blocks, km_random **out) {
    *out = NULL;
    kiln_status st = kiln_model_check(hp);
    if (st) return st;
    km_random *r = calloc(1, sizeof *r);
    if (!r) return kb_oom();
    r->hp = *hp;
    r->quant_blocks = quant_blocks;
    r->g.hp = &r->hp;
    r->g.seed = seed;
    st = collect_weights(&r->hp, &r->ctx, &r->g);
    if (!st && !(r->host = calloc((size_t)r->g.nw + 1, sizeof *r->host))) st = kb_oom();
    if (st) {
        km_random_free(r);
        return st;
    }
    *out = r;
    return NULL;
}

void km_random_free(km_random *r) {
    if (!r) return;
    for (int64_t i = 0; r->host && i < r->g.nw; i++) free(r->host[i]);
    free(r->host);
    free(r->g.w);
    kiln_ctx_free(r->g.ctx2);
    kiln_ctx_free(r->ctx);
    free(r);
}

/* The weight named so with this type and shape, else NULL. */
static const weight_spec *find_spec(const km_random *r, const char *name, kiln_type type, const int64_t *ne,
                                    int64_t n, int64_t *index) {
    for (int64_t i = 0; i < r->g.nw; i++) {
        const weight_spec *w = &r->g.w[i];
        if (strcmp(w->name, name) != 0 || w->type != type) continue;
        if (ne && memcmp(w->ne, ne, sizeof w->ne) != 0) return NULL;
        if (!ne && w->ne[0] * w->ne[1] * w->ne[2] * w->ne[3] != n) return NULL;
        *index = i;
        return w;
    }
    return NULL;
}

kiln_status km_random_init_rank(km_random *r, const char *name, kiln_type type, const int64_t ne[4],
                                kiln_weight_init *out) {
    const weight_spec *w = NULL;
    for (int64_t i = 0; i < r->g.nw && !w; i++)
        if (!strcmp(r->g.w[i].name, name) && r->g.w[i].type == type) w = &r->g.w[i];
    memset(out, 0, sizeof *out);
    if (!w) return km_random_check(r, name, type, ne);
    if (!memcmp(w->ne, ne, sizeof w->ne) && w->kind == INIT_ROPE_FREQS) return km_random_init(r, name, type, ne, out);
    if (kiln_type_is_quantized(type) && !r->quant_blocks)
        return kb_error(KILN_ERR_INVALID, "random weights over several GPUs: '%s' is %s, quantized on the host for the "
                                          "whole model; split random models are bf16 or kiln_model_random_blocks", name,
                        kiln_type_name(type));
    spec_params(r->g.seed, w, &out->key, &out->scale, &out->base);
    return NULL;
}

const void *km_random_host(km_random *r, const char *name, kiln_type type, int64_t n) {
    int64_t            i;
    const weight_spec *w = find_spec(r, name, type, NULL, n, &i);
    if (!w || (r->quant_blocks && kiln_type_is_quantized(type))) return NULL; /* no host values match */
    if (r->host[i]) return r->host[i];
    size_t bytes = kiln_row_size(type, n);
    if (!(r->host[i] = malloc(bytes ? bytes : 1))) return NULL;
    kiln_status st = fill(&r->g, i, w->name, 0, r->host[i], bytes);
    if (st) {
        kiln_status_free(st);
        free(r->host[i]);
        r->host[i] = NULL;
    }
    return r->host[i];
}

kiln_status km_random_check(const km_random *r, const char *name, kiln_type type, const int64_t ne[4]) {
    int64_t i;
    if (find_spec(r, name, type, ne, 0, &i)) return NULL;
    return kb_error(KILN_ERR_NOT_FOUND, "random model: the graph's weight '%s' (%s) is not one of the model's (%s "
                                        "with these hyperparameters)", name, kiln_type_name(type), r->hp.arch);
}

kiln_status km_random_init(km_random *r, const char *name, kiln_type type, const int64_t ne[4],
                           kiln_weight_init *out) {
    int64_t            i;
    const weight_spec *w = find_spec(r, name, type, ne, 0, &i);
    memset(out, 0, sizeof *out);
    if (!w) return km_random_check(r, name, type, ne);
    /* rope_freqs is computed, not random; a quantized weight is quantized on the host (the
     * device's fill_quant writes random blocks, not these values): both made on the host and
     * uploaded, unless quant_blocks asks for the device's blocks. */
    if (w->kind == INIT_ROPE_FREQS || (kiln_type_is_quantized(type) && !r->quant_blocks)) {
        out->host = km_random_host(r, name, type, w->ne[0] * w->ne[1] * w->ne[2] * w->ne[3]);
        return out->host ? NULL : kb_oom();
    }
    spec_params(r->g.seed, w, &out->key, &out->scale, &out->base);
    return NULL;
}
