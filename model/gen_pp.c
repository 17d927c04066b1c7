/* kiln_gen over the stages of a pipeline (layer) split (issue 30; docs/tp.md): kiln_gen_opts.pp
 * = n cuts the model's layers into n stages of consecutive layers (kiln_build_opts.layer_first,
 * layer_end), stage s on GPU s, or all of them on the CPU reference. A run goes through the
 * stages one after another: the first takes the tokens, each hands its hidden state (f32
 * [n_embd, n_tokens]) to the next through host memory, and the last gives the logits. No
 * collective and no fast link between the GPUs is needed (a decode step moves n_embd floats a
 * stage), and each GPU holds its layers' weights and caches only; a token's time is the stages'
 * sum, so the split serves models one GPU cannot hold, not speed. gen.c makes the run's inputs
 * as for one GPU (km_tp_run). */
#include "base/base.h"
#include "model/arch.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    struct km_pp_gen *p;
    int               index, first, end; /* layers first .. end - 1 */
    kiln_ctx         *ctx;
    kiln_graph       *graph;   /* unbound (the CPU reference binds it a run); the GPU's program */
    km_host_state    *states;  /* cpu: the stage's caches */
    int               nstates;
    kiln_session     *sess;    /* gpu */
    kiln_status       err;     /* a put that failed */
} pp_stage;

struct km_pp_gen {
    const kiln_model         *m;
    const kiln_model_hparams *hp;
    int                       n;
    bool                      cpu, intervals;
    pp_stage                 *s;
    float                    *hidden[2]; /* [n_embd, n_tokens_max]: into stage s, out of it */
    float                    *logits;    /* the caller's, during a run */
    const km_tp_run          *in;        /* the current run's */
    double                    last_ms;
};

void km_stage_layers(int64_t L, int n, int s, int *first, int *end) {
    int64_t base = L / n, extra = L % n;
    *first = (int)(s * base + (s < extra ? s : extra));
    *end = (int)(*first + base + (s < extra));
}

static const void *ref_get(void *user, const char *name, kiln_type type, int64_t n) {
    pp_stage        *st = user;
    const km_tp_run *in = st->p->in;
    if (!strcmp(name, "inp_tokens")) return in->tokens;
    if (!strcmp(name, "inp_hidden")) return st->p->hidden[0];
    const void *input = km_run_input(in, st->p->intervals, name);
    if (input) return input;
    for (int i = 0; i < st->nstates; i++)
        if (!strcmp(st->states[i].name, name)) return st->states[i].data;
    return kiln_model_weight(st->p->m, name, type, n);
}

static void ref_put(void *user, const char *name, kiln_type type, int64_t n, const void *data) {
    pp_stage  *st = user;
    km_pp_gen *p = st->p;
    size_t     bytes = (size_t)n * kiln_type_size(type);
    if (!strcmp(name, "hidden") && bytes == sizeof(float) * (size_t)(p->hp->n_embd * p->in->nt)) {
        memcpy(p->hidden[1], data, bytes);
        return;
    }
    if (!strcmp(name, "logits") && bytes == sizeof(float) * (size_t)(p->hp->n_vocab * p->in->n_out)) {
        memcpy(p->logits, data, sizeof(float) * (size_t)(p->hp->n_vocab * p->in->n_read));
        return;
    }
    for (int i = 0; i < st->nstates; i++)
        if (!strcmp(st->states[i].name, name) && st->states[i].bytes == bytes) {
            memcpy(st->states[i].data, data, bytes);
            return;
        }
    if (!st->err) st->err = kb_error(KILN_ERR_INVALID, "kiln_gen: stage %d's reference gave '%s' (%lld values), which "
                                                       "the generator does not expect", st->index, name, (long long)n);
}

static kiln_status cpu_stage(pp_stage *st) {
    kiln_status s = km_ref_run(st->ctx, st->p->in->nt, st->p->in->nkv, ref_get, ref_put, st);
    if (!s && st->err) s = st->err, st->err = NULL;
    return s;
}

/* The run's inputs into stage st's session: the tokens (the first) or the hidden state. */
static kiln_status gpu_set(pp_stage *st) {
    const km_tp_run *in = st->p->in;
    kiln_session    *s = st->sess;
    size_t           nt = (size_t)in->nt;
    kiln_status      e = km_run_set_inputs(s, in, st->p->intervals, st->end == st->p->hp->n_layer);
    if (!e && st->first == 0) e = kiln_session_set(s, "inp_tokens", in->tokens, sizeof(int32_t) * nt);
    if (!e && st->first > 0)
        e = kiln_session_set(s, "inp_hidden", st->p->hidden[0], sizeof(float) * nt * (size_t)st->p->hp->n_embd);
    return e;
}

static kiln_status gpu_stage(pp_stage *st) {
    km_pp_gen  *p = st->p;
    kiln_status e = gpu_set(st);
    if (!e) e = kiln_session_run(st->sess);
    if (!e) p->last_ms += kiln_session_last_ms(st->sess);
    if (!e && st->end < p->hp->n_layer)
        e = kiln_session_get_prefix(st->sess, "hidden", p->hidden[1],
                                    sizeof(float) * (size_t)(p->hp->n_embd * p->in->nt));
    else if (!e)
        e = kiln_session_get_prefix(st->sess, "logits", p->logits,
                                    sizeof(float) * (size_t)(p->hp->n_vocab * p->in->n_read));
    return e;
}

kiln_status km_pp_gen_run(km_pp_gen *p, const km_tp_run *in, float *logits) {
    p->in = in, p->logits = logits, p->last_ms = 0;
    kiln_status st = NULL;
    for (int s = 0; !st && s < p->n; s++) {
        st = p->cpu ? cpu_stage(&p->s[s]) : gpu_stage(&p->s[s]);
        if (st) st = kb_wrap(st, "pipeline stage %d (layers %d .. %d)", s, p->s[s].first, p->s[s].end - 1);
        float *t = p->hidden[0]; /* the output is the next stage's input */
        p->hidden[0] = p->hidden[1], p->hidden[1] = t;
    }
    p->in = NULL, p->logits = NULL;
    return st;
}

/* Compiles stage st's graph into a session on GPU st->index and loads its layers' weights. */
static kiln_status gpu_open(pp_stage *st, const kiln_gen_opts *o, kiln_gen_stats *stats) {
    kiln_compile_opts co = o->compile ? *o->compile : (kiln_compile_opts){0};
    kiln_session_opts so = o->session ? *o->session : (kiln_session_opts){0};
    char              arch[16];
    so.device = st->index;
    kiln_status e = NULL;
    if (!co.arch) {
        if ((e = kiln_device_arch(so.device, arch, sizeof arch))) return e;
        co.arch = arch;
    }
    double        t0 = kb_now_ms();
    kiln_program *prog = NULL;
    if ((e = kiln_compile(st->graph, &co, &prog))) return e;
    if (st->index == 0) kiln_program_stats(prog, &stats->compile);
    stats->compile_ms += kb_now_ms() - t0;
    e = kiln_session_new(prog, &so, &st->sess);
    kiln_program_free(prog);
    double t1 = kb_now_ms();
    if (!e) e = kiln_model_load(st->p->m, st->sess, NULL, NULL);
    stats->load_ms += kb_now_ms() - t1;
    return e;
}

kiln_status km_pp_gen_open(const kiln_model *m, int n, const kiln_build_opts *bo, const kiln_gen_opts *o,
                           kiln_gen_stats *stats, km_pp_gen **out) {
    *out = NULL;
    const kiln_model_hparams *hp = kiln_model_get_hparams(m);
    if (n < 2 || n > 64 || n > hp->n_layer)
        return kb_error(KILN_ERR_INVALID, "pipeline split: %d stages of %lld layers (2 .. 64, at most a layer a stage)",
                        n, (long long)hp->n_layer);
    int         count = 0;
    kiln_status st = o->cpu ? NULL : kiln_device_count(&count);
    if (st) return st;
    if (!o->cpu && count < n)
        return kb_error(KILN_ERR_NO_GPU, "pipeline split over %d GPUs: this machine has %d", n, count);
    km_pp_gen *p = calloc(1, sizeof *p);
    if (!p) return kb_oom();
    p->m = m, p->hp = hp, p->n = n, p->cpu = o->cpu, p->intervals = bo->mask_intervals;
    size_t hb = sizeof(float) * (size_t)(hp->n_embd * bo->n_tokens_max);
    p->s = calloc((size_t)n, sizeof *p->s);
    p->hidden[0] = malloc(hb), p->hidden[1] = malloc(hb);
    if (!p->s || !p->hidden[0] || !p->hidden[1]) st = kb_oom();
    for (int s = 0; !st && s < n; s++) {
        pp_stage *k = &p->s[s];
        k->p = p, k->index = s;
        kiln_build_opts sb;
        km_part_opts(hp, bo, 0, n, s, &sb);
        k->first = sb.layer_first, k->end = sb.layer_end;
        if (!(k->ctx = kiln_ctx_new())) st = kb_oom();
        if (!st) st = kiln_model_build(k->ctx, m, &sb);
        if (!st) st = kiln_graph_new(k->ctx, &k->graph);
        if (!st) st = p->cpu ? km_host_states(k->graph, &k->states, &k->nstates) : gpu_open(k, o, stats);
        if (st) st = kb_wrap(st, "pipeline stage %d of %d (layers %d .. %d)", s, n, k->first, k->end - 1);
    }
    if (st) {
        km_pp_gen_free(p);
        return st;
    }
    *out = p;
    return NULL;
}

/* ---- kiln_model_pp_describe: the stages, for kiln inspect --pp ------------------------------ */

/* The bytes of graph gr's tensors of role r. */
static double role_bytes(const kiln_graph *gr, kiln_role r) {
    double n = 0;
    for (int i = 0; i < kiln_graph_size(gr); i++) {
        const kiln_tensor *t = kiln_graph_node(gr, i);
        if (kiln_tensor_role(t) == r) n += (double)kiln_tensor_nbytes(t);
    }
    return n;
}

kiln_status kiln_model_pp_describe(const kiln_model *m, int g, int64_t n_ctx, char **text) {
    if (!m || !text) return kb_error(KILN_ERR_INVALID, "kiln_model_pp_describe: NULL argument");
    *text = NULL;
    const kiln_model_hparams *hp = kiln_model_get_hparams(m);
    if (g < 2 || g > 64 || g > hp->n_layer)
        return kb_error(KILN_ERR_INVALID, "pipeline split: %d stages of %lld layers (2 .. 64, at most a layer a stage)",
                        g, (long long)hp->n_layer);
    kb_str o = {0};
    kb_str_addf(&o, "pipeline split in %d stages, a GPU each (docs/tp.md): %s, %lld layers, run one after another, "
                    "each stage's hidden state (n_embd %lld floats a token) handed to the next through host memory\n",
                g, hp->arch, (long long)hp->n_layer, (long long)hp->n_embd);
    kiln_status st = NULL;
    double      most = 0;
    for (int s = 0; s < g && !st; s++) {
        int first, end;
        km_stage_layers(hp->n_layer, g, s, &first, &end);
        kiln_ctx       *ctx = kiln_ctx_new();
        kiln_graph     *gr = NULL;
        kiln_build_opts bo = {.n_ctx = n_ctx, .n_tokens_max = 1, .layer_first = first, .layer_end = end};
        st = ctx ? kiln_model_build(ctx, m, &bo) : kb_oom();
        if (!st) st = kiln_graph_new(ctx, &gr);
        if (!st) {
            double w = role_bytes(gr, KILN_ROLE_WEIGHT), kv = role_bytes(gr, KILN_ROLE_STATE);
            most = w + kv > most ? w + kv : most;
            kb_str_addf(&o, "  stage %d (GPU %d): layers %d .. %d, %.3f GB of weights, %.1f MB of KV cache at n_ctx %lld; "
                            "takes %s, gives %s\n",
                        s, s, first, end - 1, w / 1e9, kv / 1e6, (long long)n_ctx, s ? "the hidden state" : "the tokens",
                        end < hp->n_layer ? "its hidden state" : "the logits");
        } else {
            st = kb_wrap(st, "stage %d (layers %d .. %d)", s, first, end - 1);
        }
        kiln_graph_free(gr);
        kiln_ctx_free(ctx);
    }
    if (st) {
        kb_str_free(&o);
        return st;
    }
    kb_str_addf(&o, "the fullest GPU holds %.3f GB; 'kiln run MODEL.gguf --pp %d' runs the stages (with --cpu on the "
                    "CPU reference)\n", most / 1e9, g);
    *text = kb_str_take(&o);
    return *text ? NULL : kb_oom();
}

double km_pp_gen_last_ms(const km_pp_gen *p) { return p ? p->last_ms : 0.0; }

int km_pp_gen_stage_of(const km_pp_gen *p, int64_t il) {
    for (int s = 0; p && s < p->n; s++)
        if (il >= p->s[s].first && il < p->s[s].end) return s;
    return -1;
}

kiln_status km_pp_gen_state(km_pp_gen *p, int64_t il, const char *name, void *data, size_t bytes, bool write) {
    int s = km_pp_gen_stage_of(p, il);
    if (s < 0) return kb_error(KILN_ERR_NOT_FOUND, "kiln_gen_shift: no pipeline stage holds layer %lld", (long long)il);
    pp_stage *k = &p->s[s];
    if (!p->cpu)
        return write ? kiln_session_set(k->sess, name, data, bytes) : kiln_session_get(k->sess, name, data, bytes);
    if (km_host_state_io(k->states, k->nstates, name, data, bytes, write)) return NULL;
    return kb_error(KILN_ERR_NOT_FOUND, "kiln_gen_shift: stage %d has no cache state %s of %zu bytes", s, name, bytes);
}

void km_pp_gen_free(km_pp_gen *p) {
    if (!p) return;
    for (int s = 0; p->s && s < p->n; s++) {
        pp_stage *k = &p->s[s];
        kiln_session_free(k->sess);
        kiln_graph_free(k->graph);
        kiln_ctx_free(k->ctx);
        km_host_states_free(k->states, k->nstates);
        kiln_status_free(k->err);
    }
    free(p->s);
    free(p->hidden[0]);
    free(p->hidden[1]);
    free(p);
}
