/* kiln bench's batch rows (issue 28): aggregate decode throughput of one kiln_batch at 1, 8, 32
 * and 64 sequences, as llama.cpp's `llama-batched-bench -npp 512 -ntg 128` measures it: every
 * sequence's 512-token prompt (all arriving at once, a prompt a step), then 128 greedy decode
 * steps of all of them together (kiln_batch_step_greedy). Reported: generated tokens per second
 * of all sequences, one step's time, prompt tokens per second while the batch fills, the mean
 * time to first token of requests that arrive together, and the limit: the weights read once a
 * step plus each sequence's KV cache, at the measured roofline. Weights random, made on the GPU
 * (quantized file types: random blocks), as the model rows'. */
#include "tools/bench.h"

#include "base/base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const int default_seqs[4] = {1, 8, 32, 64};
#define PROMPT_N 512

/* Bytes of weights one decode step reads (every weight but the unused experts and, untied,
 * the embedding table) and of one token's KV cache, from the batch program's graph. */
static kiln_status step_bytes(const kiln_model_hparams *hp, double *weights, double *kv_token) {
    kiln_ctx       *ctx = kiln_ctx_new();
    kiln_graph     *g = NULL;
    kiln_build_opts bo = {.n_ctx = 1024, .n_tokens_max = 64};
    kiln_status     st = ctx ? kiln_build_model(ctx, hp, &bo) : kb_oom();
    if (!st) st = kiln_graph_new(ctx, &g);
    *weights = *kv_token = 0;
    for (int i = 0; !st && i < kiln_graph_size(g); i++) {
        const kiln_tensor *t = kiln_graph_node(g, i);
        const char        *name = kiln_tensor_name(t);
        double             bytes = (double)kiln_tensor_nbytes(t);
        if (kiln_tensor_role(t) == KILN_ROLE_STATE) *kv_token += bytes / (double)bo.n_ctx;
        if (kiln_tensor_role(t) != KILN_ROLE_WEIGHT) continue;
        if (strstr(name, "_exps.")) bytes *= (double)hp->n_expert_used / (double)hp->n_expert;
        else if (!strcmp(name, "token_embd.weight") && !hp->tied_output) bytes /= (double)hp->n_vocab;
        *weights += bytes;
    }
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
    return st;
}

/* One row: the batch sizes in turn on one batch of the largest. */
static kiln_status run_row(kt_bench *b, kt_bench_batch *r, const kiln_model_hparams *hp) {
    const int *counts = b->n_seqs ? b->seqs : default_seqs;
    int        nc = b->n_seqs ? b->n_seqs : 4;
    int64_t    gen = b->quick ? 32 : 128, max_seqs = 1;
    for (int k = 0; k < nc; k++)
        if (counts[k] > max_seqs) max_seqs = counts[k];
    r->prompt_n = PROMPT_N;
    r->gen_n = gen;
    double      wbytes, kvtok;
    kiln_status st = step_bytes(hp, &wbytes, &kvtok);
    bool        quant = strcmp(r->file_type, "bf16") && strcmp(r->file_type, "f16") && strcmp(r->file_type, "f32");
    kiln_model *m = NULL;
    kiln_batch *bt = NULL;
    if (!st) st = (quant ? kiln_model_random_blocks : kiln_model_random)(hp, b->seed, &m);
    kiln_compile_opts co = {.arch = b->dev.arch};
    kiln_batch_opts   bo = {.n_ctx = max_seqs * (PROMPT_N + gen + 8), .n_batch = PROMPT_N, .n_seq = (int)max_seqs,
                            .compile = &co, .n_small = b->batch_small};
    if (!st) fprintf(stderr, "bench: %s: a batch of %lld sequences (%lld cache cells)\n", r->name, (long long)max_seqs,
                     (long long)bo.n_ctx);
    if (!st) st = kiln_batch_new(m, &bo, &bt);
    int32_t         *prompt = malloc(sizeof *prompt * PROMPT_N);
    int32_t         *next = malloc(sizeof *next * (size_t)max_seqs);
    int             *seq = malloc(sizeof *seq * (size_t)max_seqs);
    kiln_batch_item *it = malloc(sizeof *it * (size_t)max_seqs);
    if (!st && (!prompt || !next || !seq || !it)) st = kb_oom();
    for (int64_t i = 0; !st && i < PROMPT_N; i++) prompt[i] = (int32_t)((i * 7919 + 13) % hp->n_vocab);
    for (int k = 0; !st && k < nc; k++) {
        int n = counts[k];
        r->seqs[k] = n;
        r->n_seqs = k + 1;
        fprintf(stderr, "bench: %s: %d sequence%s\n", r->name, n, n > 1 ? "s" : "");
        /* the prompts, arriving together: a prompt a step, each request's first token after it */
        double t0 = kb_now_ms(), ttft = 0;
        for (int s = 0; !st && s < n; s++) {
            st = kiln_batch_seq_open(bt, &seq[s]);
            kiln_batch_item p = {seq[s], prompt, PROMPT_N};
            if (!st) st = kiln_batch_step_greedy(bt, &p, 1, &next[s]);
            ttft += kb_now_ms() - t0;
        }
        double fill = kb_now_ms() - t0;
        /* the decode steps of all n together */
        double t1 = kb_now_ms();
        for (int64_t step = 1; !st && step < gen; step++) {
            for (int s = 0; s < n; s++) it[s] = (kiln_batch_item){seq[s], &next[s], 1};
            st = kiln_batch_step_greedy(bt, it, n, next);
        }
        double dec = kb_now_ms() - t1;
        for (int s = 0; s < n; s++) kiln_batch_seq_close(bt, seq[s]);
        if (st) break;
        r->prompt_tok_s[k] = 1e3 * (double)(n * PROMPT_N) / fill;
        r->ttft_ms[k] = ttft / n;
        r->step_ms[k] = dec / (double)(gen - 1);
        r->gen_tok_s[k] = 1e3 * (double)(n * (gen - 1)) / dec;
        /* a step reads the weights once and each sequence's cache at its mean length */
        double bytes = wbytes + n * kvtok * (double)(PROMPT_N + gen / 2);
        r->limit_tok_s[k] = b->copy_gbs > 0 ? n / (bytes / (b->copy_gbs * 1e9)) : 0;
    }
    free(prompt), free(next), free(seq), free(it);
    kiln_batch_free(bt);
    kiln_model_close(m);
    return st;
}

kiln_status kt_bench_batches(kt_bench *b, kt_bench_batch **rows, int *n) {
    const char *list = b->batch_models ? b->batch_models : "llama-3-8b,llama-3-8b:q4_k_m";
    int         cap = 1;
    for (const char *p = list; *p; p++) cap += *p == ',';
    kt_bench_batch *r = calloc((size_t)cap, sizeof *r);
    if (!r) return kb_oom();
    int count = 0;
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ',');
        kt_bench_batch *row = &r[count++];
        snprintf(row->name, sizeof row->name, "%.*s", (int)(e ? e - p : (long)strlen(p)), p);
        kiln_model_hparams hp;
        kiln_status        st = kt_bench_model_hparams(row->name, &hp);
        if (!st) snprintf(row->file_type, sizeof row->file_type, "%s", kiln_ftype_name(hp.ftype));
        if (!st) st = run_row(b, row, &hp);
        if (st) {
            snprintf(row->err, sizeof row->err, "%s", kiln_status_msg(st));
            fprintf(stderr, "bench: %s: %s\n", row->name, row->err);
            kiln_status_free(st);
        }
        p = e ? e + 1 : NULL;
    }
    *rows = r;
    *n = count;
    return NULL;
}
