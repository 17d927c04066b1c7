/* kiln bench, models: presets with random weights (kiln_model_random: the weights gen-model
 * writes, made on the device), decode and prefill through kiln_gen exactly as `kiln run` does,
 * then the same model in PyTorch (bench/torch_ref.py) after kiln has freed the GPU.
 *
 * "PRESET:FILETYPE" (llama-3-8b:q4_k_m) is the preset in that file type, each weight of the
 * type llama-quantize's mix gives it (model/ftype.c). Its quantized weights are random blocks
 * made on the device (kiln_model_random_blocks): the file's values would be quantized on the
 * host, minutes for 8B. PyTorch has no ggml quantized types, so such a row has no PyTorch
 * columns, and in --quick it skips the one-step-at-a-time loop (there only for PyTorch's ratios).
 *
 * Decode at KV position P: the cache is filled by a prefill of P tokens, then `steps` greedy
 * steps run from position P as generation runs them (kiln_gen_decode_greedy: chained, each
 * step's argmax fed to the next on the device, the host a step ahead); ms/token is their mean
 * wall time. The same steps are timed again one kiln_gen_eval_greedy call each (upload the
 * inputs, replay, read back the argmax, then the next step): the host round trip a token
 * costs a caller that needs each token before the next step. Prefill: 512 tokens from
 * an empty cache, one run, the median of a few. Compile: graph build plus kiln_compile with an
 * empty cache (cold: every kernel through NVRTC), then again from that cache (warm start). */
#include "tools/bench.h"

#include "base/base.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What `kiln bench` runs: the bf16 presets, then the quantized files of issue 25. */
static const char *const g_presets[] = {"llama-3.2-1b",        "llama-3-8b",        "qwen3-30b-a3b",
                                        "llama-3.2-1b:q4_0",   "llama-3.2-1b:q4_k_m", "llama-3.2-1b:q8_0",
                                        "llama-3-8b:q4_0",     "llama-3-8b:q4_k_m",   "llama-3-8b:q8_0",
                                        "qwen3-30b-a3b:q4_k_m"};
#define N_PRESETS ((int)(sizeof g_presets / sizeof g_presets[0]))
#define PREFILL_N 512

typedef struct {
    kt_bench       *b;
    kt_bench_model *m;
    const char     *cache_dir;
    int64_t         n_ctx, steps;
    bool            quantized; /* a quantized file type: no PyTorch, device-made blocks */
} model_run;

static bool ftype_quantized(kiln_ftype f) {
    return f != KILN_FTYPE_ALL_F32 && f != KILN_FTYPE_MOSTLY_F16 && f != KILN_FTYPE_MOSTLY_BF16;
}

kiln_status kt_bench_model_hparams(const char *name, kiln_model_hparams *hp) {
    char        preset[64];
    const char *colon = strchr(name, ':');
    snprintf(preset, sizeof preset, "%.*s", (int)(colon ? colon - name : (long)strlen(name)), name);
    kiln_status st = kiln_model_preset(NULL, preset, hp);
    if (st) return st;
    if (colon && kiln_ftype_from_name(colon + 1, &hp->ftype) != 0)
        return kb_error(KILN_ERR_INVALID, "model '%s': unknown file type '%s' (known: %s)", name, colon + 1,
                        kiln_ftype_list());
    st = kiln_model_check(hp); /* a file type whose blocks do not divide the rows */
    return st ? kb_wrap(st, "model '%s'", name) : NULL;
}

/* Bytes of all weights, and of what one decoded token reads: every weight but the embedding
 * table (one row; all of it when it is also the output matrix) and the unused experts; and the
 * KV cache's bytes a position (the states over n_ctx positions), which a token reads for each
 * position before it. */
static void weight_bytes(const kiln_graph *g, const kiln_model_hparams *hp, int64_t n_ctx, double *all, double *token,
                         double *kv_pos) {
    *all = *token = *kv_pos = 0;
    for (int i = 0; i < kiln_graph_size(g); i++) {
        const kiln_tensor *t = kiln_graph_node(g, i);
        if (kiln_tensor_role(t) == KILN_ROLE_STATE) *kv_pos += (double)kiln_tensor_nbytes(t) / (double)n_ctx;
        if (kiln_tensor_role(t) != KILN_ROLE_WEIGHT) continue;
        double      bytes = (double)kiln_tensor_nbytes(t);
        const char *name = kiln_tensor_name(t);
        *all += bytes;
        if (strstr(name, "_exps.")) bytes *= (double)hp->n_expert_used / (double)hp->n_expert;
        else if (!strcmp(name, "token_embd.weight") && !hp->tied_output) bytes /= (double)hp->n_vocab;
        *token += bytes;
    }
}

static kiln_build_opts build_opts(const model_run *r) {
    return (kiln_build_opts){.n_ctx = r->n_ctx, .n_tokens_max = PREFILL_N, .outputs = KILN_OUTPUTS_LAST,
                             .argmax = true}; /* what kiln_gen builds: the same program key */
}

/* Graph build and compile (the program freed again): ms and the kernel count. */
static kiln_status compile_once(const model_run *r, const kiln_model_hparams *hp, double *ms, int *kernels) {
    double          t0 = kb_now_ms();
    kiln_ctx       *ctx = kiln_ctx_new();
    kiln_graph     *g = NULL;
    kiln_program   *p = NULL;
    kiln_build_opts bo = build_opts(r);
    kiln_status     st = ctx ? kiln_build_model(ctx, hp, &bo) : kb_oom();
    if (!st) st = kiln_graph_new(ctx, &g);
    kiln_compile_opts co = {.arch = r->b->dev.arch, .cache_dir = r->cache_dir};
    if (!st) st = kiln_compile(g, &co, &p);
    if (!st) {
        *ms = kb_now_ms() - t0;
        *kernels = kiln_program_kernel_count(p);
        if (r->m->weight_gb == 0) {
            double all, token, kv;
            weight_bytes(g, hp, r->n_ctx, &all, &token, &kv);
            r->m->weight_gb = all / 1e9;
            r->m->token_gb = token / 1e9;
            r->m->kv_bytes_pos = kv;
        }
    }
    kiln_program_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
    return st;
}

static void prompt_ids(int32_t *ids, int64_t n, int64_t n_vocab) {
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)((i * 7919 + 13) % n_vocab);
}

static kiln_status time_prefill(model_run *r, kiln_gen *g, const int32_t *ids) {
    double      ms[5];
    int         reps = r->b->quick ? 3 : 5;
    int32_t     next;
    kiln_status st = NULL;
    for (int i = 0; !st && i < reps; i++) {
        kiln_gen_reset(g);
        double t0 = kb_now_ms();
        st = kiln_gen_eval_greedy(g, ids, PREFILL_N, &next);
        ms[i] = kb_now_ms() - t0;
    }
    if (!st) {
        r->m->prefill_n = PREFILL_N;
        r->m->prefill_ms = kt_bench_median(ms, reps);
    }
    return st;
}

/* Fills the cache to position kv (a prefill, then 3 single steps); *next is the pick to feed. */
static kiln_status fill_to(kiln_gen *g, const int32_t *ids, int64_t kv, int32_t *next) {
    kiln_gen_reset(g);
    kiln_status st = kiln_gen_eval_greedy(g, ids, kv - 3, next);
    for (int i = 0; !st && i < 3; i++) st = kiln_gen_eval_greedy(g, next, 1, next);
    return st;
}

/* Times `steps` decode steps from position kv with llama.cpp's default sampler, against the greedy
 * chain beside it: on the GPU inside the decode program (run_kiln's kiln_gen_opts.sampler), chained,
 * where kiln_sampler_on_gpu takes it; else on the host, each step's logits read back. */
static kiln_status time_sampled(model_run *r, kiln_gen *g, const int32_t *ids, int64_t kv) {
    int32_t     next = 0;
    kiln_status st = fill_to(g, ids, kv, &next);
    kiln_sampler_params sp = kiln_sampler_params_default();
    kiln_gen_params     p = {.n_predict = r->steps, .sampler = &sp};
    int64_t             n = 0;
    double              t0 = kb_now_ms();
    if (!st) st = kiln_gen_generate(g, &next, 1, &p, &n, NULL, NULL);
    double t1 = kb_now_ms();
    if (!st && n > 1) r->m->sampled_ms = (t1 - t0) / (double)n;
    return st;
}

/* Times `steps` greedy decode steps from position kv: chained, then one call each. */
static kiln_status time_decode(model_run *r, kiln_gen *g, const int32_t *ids, int k) {
    int64_t     kv = r->m->kv[k];
    int32_t     next = 0, *picks = malloc(sizeof *picks * (size_t)r->steps);
    kiln_status st = picks ? fill_to(g, ids, kv, &next) : kb_oom();
    kiln_gen_stats s0, s1;
    kiln_gen_get_stats(g, &s0);
    double t0 = kb_now_ms();
    if (!st) st = kiln_gen_decode_greedy(g, next, r->steps, picks);
    double t1 = kb_now_ms();
    kiln_gen_get_stats(g, &s1);
    free(picks);
    if (!st) {
        r->m->decode_ms[k] = (t1 - t0) / (double)r->steps;
        r->m->decode_gpu_ms[k] = (s1.decode_gpu_ms - s0.decode_gpu_ms) / (double)r->steps;
    }
    if (r->quantized && r->b->quick) return st; /* no PyTorch ratio to take against it */
    if (!st) st = fill_to(g, ids, kv, &next);
    kiln_gen_get_stats(g, &s0);
    t0 = kb_now_ms();
    for (int64_t i = 0; !st && i < r->steps; i++) st = kiln_gen_eval_greedy(g, &next, 1, &next);
    t1 = kb_now_ms();
    kiln_gen_get_stats(g, &s1);
    if (!st) {
        r->m->step_ms[k] = (t1 - t0) / (double)r->steps;
        r->m->host_us[k][0] = 1e3 * (s1.inputs_ms - s0.inputs_ms) / (double)r->steps;
        r->m->host_us[k][1] = 1e3 * (s1.run_ms - s0.run_ms) / (double)r->steps;
        r->m->host_us[k][2] = 1e3 * (s1.readback_ms - s0.readback_ms) / (double)r->steps;
    }
    return st;
}

static kiln_status run_kiln(model_run *r, const kiln_model_hparams *hp) {
    kt_bench_model *m = r->m;
    fprintf(stderr, "bench: %s: compile (cold, then warm)\n", m->name);
    kiln_status st = compile_once(r, hp, &m->cold_ms, &m->kernels);
    int         k2;
    if (!st) st = compile_once(r, hp, &m->warm_ms, &k2);
    kiln_model *model = NULL;
    kiln_gen   *g = NULL;
    if (!st) st = (r->quantized ? kiln_model_random_blocks : kiln_model_random)(hp, r->b->seed, &model);
    kiln_compile_opts co = {.arch = r->b->dev.arch, .cache_dir = r->cache_dir};
    kiln_gen_opts     go = {.n_ctx = r->n_ctx, .n_batch = PREFILL_N, .compile = &co, .tp = r->b->tp, .pp = r->b->pp};
    if (!st) fprintf(stderr, "bench: %s: weights on the device, prefill, decode\n", m->name);
    if (!st) st = kiln_gen_new(model, &go, &g);
    int32_t *ids = malloc(sizeof *ids * (size_t)r->n_ctx);
    if (!st && !ids) st = kb_oom();
    if (!st) {
        kiln_gen_stats s;
        kiln_gen_get_stats(g, &s);
        m->fill_ms = s.load_ms;
        prompt_ids(ids, r->n_ctx, hp->n_vocab);
        st = time_prefill(r, g, ids);
    }
    for (int k = 0; !st && k < m->nkv; k++) st = time_decode(r, g, ids, k);
    /* The sampler in a program of its own (op `sample` beside argmax: its kernels run every step),
     * so that the greedy figures above are the greedy program's. */
    kiln_gen_free(g);
    g = NULL;
    kiln_sampler_params sp = kiln_sampler_params_default();
    go.sampler = &sp;
    m->sampled_gpu = kiln_sampler_on_gpu(&sp, hp->n_vocab) && !go.tp && !go.pp; /* (split: the host samples) */
    if (!st) st = kiln_gen_new(model, &go, &g);
    if (!st) st = time_sampled(r, g, ids, m->kv[0]);
    free(ids);
    kiln_gen_free(g);
    kiln_model_close(model);
    return st;
}

typedef struct {
    kt_bench_model *m;
} torch_model_ctx;

static void torch_model_line(void *user, const char *text) {
    kt_bench_model *m = ((torch_model_ctx *)user)->m;
    int             mode = !strncmp(text, "eager ", 6) ? 0 : !strncmp(text, "compile ", 8) ? 1 : -1;
    if (mode < 0) return;
    const char *rest = text + (mode ? 8 : 6);
    if (!strncmp(rest, "skip:", 5)) {
        snprintf(m->torch_note[mode], sizeof m->torch_note[mode], "%s", rest + 5 + (rest[5] == ' '));
    } else if (!strncmp(rest, "decode ", 7)) {
        int64_t kv = (int64_t)kt_bench_field(rest, "kv");
        for (int k = 0; k < m->nkv; k++)
            if (m->kv[k] == kv) m->t_decode_ms[mode][k] = kt_bench_field(rest, "ms");
    } else if (!strncmp(rest, "prefill ", 8)) {
        m->t_prefill_ms[mode] = kt_bench_field(rest, "ms");
    } else if (!strncmp(rest, "compile_s=", 10)) {
        m->t_compile_s = kt_bench_field(rest, "compile_s");
    }
}

static void run_torch(model_run *r, const kiln_model_hparams *hp) {
    kt_bench       *b = r->b;
    kt_bench_model *m = r->m;
    bool            moe = hp->n_expert > 0;
    /* torch_ref.py builds llama's and qwen3moe's graphs: another family's row would time a
     * model of other shapes (deepseek2's MLA, gemma's norms, ...), so it says so instead */
    if (strcmp(hp->arch, "llama") && strcmp(hp->arch, "qwen3moe") && strcmp(hp->arch, "qwen3")) {
        for (int mode = 0; mode < 2; mode++)
            snprintf(m->torch_note[mode], sizeof m->torch_note[mode], "torch_ref.py has no %s graph", hp->arch);
        return;
    }
    kb_str          cmd = {0};
    kb_str_addf(&cmd, "%s %s/torch_ref.py --arch %s --n-vocab %lld --n-embd %lld --n-layer %lld --n-head %lld "
                      "--n-head-kv %lld --head-dim %lld --n-ff %lld --rms-eps %g --rope-base %g",
                b->python, b->dir, moe ? "qwen3moe" : "llama", (long long)hp->n_vocab, (long long)hp->n_embd,
                (long long)hp->n_layer, (long long)hp->n_head, (long long)hp->n_head_kv, (long long)hp->head_dim,
                (long long)hp->n_ff, (double)hp->rms_norm_eps, (double)hp->rope_freq_base);
    if (moe)
        kb_str_addf(&cmd, " --n-expert %lld --n-expert-used %lld --n-ff-exp %lld", (long long)hp->n_expert,
                    (long long)hp->n_expert_used, (long long)hp->n_ff_exp);
    if (hp->qk_norm) kb_str_add(&cmd, " --qk-norm");
    if (hp->tied_output) kb_str_add(&cmd, " --tied");
    kb_str_add(&cmd, " --kv ");
    for (int k = 0; k < m->nkv; k++) kb_str_addf(&cmd, "%s%lld", k ? "," : "", (long long)m->kv[k]);
    kb_str_addf(&cmd, " --prefill %d --steps %lld --modes %s --max-seconds %d", PREFILL_N, (long long)r->steps,
                b->quick ? "eager" : "eager,compile",
                b->quick ? 90 : 300);
    char *c = kb_str_take(&cmd);
    if (!c) return;
    fprintf(stderr, "bench: %s: PyTorch (%s)\n", m->name, b->quick ? "eager" : "eager, then torch.compile");
    torch_model_ctx tc = {m};
    int             rc = kt_bench_lines(c, torch_model_line, &tc);
    for (int mode = 0; mode < 2; mode++)
        if (!m->torch_note[mode][0] && m->t_decode_ms[mode][0] == 0)
            snprintf(m->torch_note[mode], sizeof m->torch_note[mode], "%s",
                     mode && b->quick ? "not in --quick (torch.compile takes about a minute a model)"
                                      : rc ? "torch_ref.py failed (its stderr is above)" : "no result");
    free(c);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static kiln_status bench_model(kt_bench *b, kt_bench_model *m, const char *cache_dir) {
    kiln_model_hparams hp;
    kiln_status        st = kt_bench_model_hparams(m->name, &hp);
    if (st) return st;
    snprintf(m->file_type, sizeof m->file_type, "%s", kiln_ftype_name(hp.ftype));
    model_run r = {.b = b, .m = m, .cache_dir = cache_dir, .steps = b->quick ? 32 : 128,
                   .quantized = ftype_quantized(hp.ftype)};
    static const int64_t defaults[3] = {512, 4096, 32768};
    m->nkv = b->nkvs ? b->nkvs : 3;
    int64_t top = 0;
    for (int k = 0; k < m->nkv; k++) {
        m->kv[k] = b->nkvs ? b->kvs[k] : defaults[k];
        if (m->kv[k] > top) top = m->kv[k];
    }
    r.n_ctx = top + r.steps + 8;
    st = run_kiln(&r, &hp);
    /* over tp GPUs each reads its share of the bytes at once; at kv positions a token also reads
     * the cache's K and V of each */
    double tp = b->tp > 1 ? b->tp : 1, bw = b->copy_gbs * 1e6; /* bytes a ms */
    m->limit_ms = bw > 0 ? m->token_gb * 1e9 / bw / tp : 0;
    for (int k = 0; k < m->nkv; k++)
        m->limit_kv_ms[k] = bw > 0 ? (m->token_gb * 1e9 + m->kv_bytes_pos * (double)m->kv[k]) / bw / tp : 0;
    if (b->tp > 1 || b->pp > 1) { /* a split model: its name says how ("llama-3-8b tp2") */
        const char *how = b->tp > 1 ? "tp" : "pp";
        int         g = b->tp > 1 ? b->tp : b->pp;
        size_t      len = strlen(m->name);
        snprintf(m->name + len, sizeof m->name - len, " %s%d", how, g);
        for (int mode = 0; mode < 2; mode++)
            snprintf(m->torch_note[mode], sizeof m->torch_note[mode], "torch_ref.py runs on one GPU (--%s %d)", how, g);
    } else if (r.quantized)
        for (int mode = 0; mode < 2; mode++)
            snprintf(m->torch_note[mode], sizeof m->torch_note[mode], "PyTorch has no ggml quantized types (%s)",
                     m->file_type);
    else if (b->torch) run_torch(&r, &hp);
    else
        for (int mode = 0; mode < 2; mode++) snprintf(m->torch_note[mode], sizeof m->torch_note[mode], "%s", b->torch_why);
    return st;
}

kiln_status kt_bench_models(kt_bench *b, kt_bench_model **out, int *nout) {
    const char *names[16];
    int         n = 0;
    char        list[256];
    snprintf(list, sizeof list, "%s", b->models ? b->models : "");
    if (b->models)
        for (char *save = NULL, *t = strtok_r(list, ",", &save); t && n < 16; t = strtok_r(NULL, ",", &save)) names[n++] = t;
    else
        for (; n < N_PRESETS; n++) names[n] = g_presets[n];
    kt_bench_model *ms = calloc((size_t)n + 1, sizeof *ms);
    if (!ms) return kb_oom();
    char dir[] = "/tmp/kiln-bench-XXXXXX"; /* an empty cache: cold compiles are cold */
    if (!mkdtemp(dir)) {
        free(ms);
        return kb_error(KILN_ERR_IO, "kiln bench: could not make a temporary cache folder under /tmp");
    }
    for (int i = 0; i < n; i++) {
        snprintf(ms[i].name, sizeof ms[i].name, "%s", names[i]);
        char sub[64]; /* a cache per model: kernels that two models share stay cold for both */
        snprintf(sub, sizeof sub, "%s/%d", dir, i);
        kiln_status st = bench_model(b, &ms[i], sub);
        if (st) {
            snprintf(ms[i].err, sizeof ms[i].err, "%s", kiln_status_msg(st));
            fprintf(stderr, "bench: %s: %s\n", ms[i].name, ms[i].err);
            kiln_status_free(st);
        }
    }
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    *out = ms;
    *nout = n;
    return NULL;
}
