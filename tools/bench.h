/* kiln bench: per-op roofline, whole models, compile times, beside PyTorch (tools/cmd_bench.c
 * runs it; bench_ops.c and bench_models.c measure; bench_report.c prints and writes JSON).
 * Prefix kt_bench. */
#ifndef KILN_TOOLS_BENCH_H
#define KILN_TOOLS_BENCH_H

#include "kiln.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    bool        quick;
    bool        torch;      /* run bench/torch_*.py beside kiln */
    bool        do_ops, do_models, do_batch;
    const char *dir;        /* the bench folder: graphs and PyTorch scripts */
    const char *python;
    const char *json;       /* write the results here (NULL: not written) */
    const char *models;     /* comma-separated presets, PRESET:FILETYPE for another file type
                               (NULL: the bf16 presets and the quantized files of issue 25) */
    const char *batch_models; /* the batch rows' models (NULL: llama-3-8b in bf16 and q4_k_m) */
    int         n_seqs, seqs[8]; /* the batch sizes (--seqs; n_seqs 0: 1, 8, 32 and 64) */
    int         batch_small;     /* --batch-small N: kiln_batch_opts.n_small (0: none) */
    int         tp;              /* --tp G: the model rows over G GPUs (kiln_gen_opts.tp; 0: one GPU) */
    int         pp;              /* --pp G: the model rows' layers in G stages (kiln_gen_opts.pp; 0: one GPU) */
    int         nkvs;            /* --kv LIST: the decode rows' cache positions (0: 512, 4096, 32768) */
    int64_t     kvs[3];
    uint64_t    seed;
    kiln_device_info dev;
    double      copy_gbs;   /* measured roofline */
    char        torch_why[160]; /* why PyTorch is not beside us (empty when it is) */
} kt_bench;

typedef struct {
    char   name[48], shape[48], graph[256];
    double us, bytes, gbs, pct; /* median replay; bytes moved; GB/s; % of the roofline */
    double torch_us;            /* 0: none (torch_note says why) */
    char   torch_note[160];
    char   err[256];            /* non-empty: kiln failed on this op */
} kt_bench_op;

#define KT_BENCH_KVS 3 /* decode rows a model at most (kt_bench_model.nkv of them) */
typedef struct {
    char     name[32];            /* "llama-3-8b" or "llama-3-8b:q4_k_m" */
    char     file_type[16];       /* "bf16", "q4_k_m" (kiln_ftype_name) */
    double   weight_gb, token_gb; /* all weights; read per decoded token (active experts only) */
    double   limit_ms;            /* token_gb at the roofline */
    double   kv_bytes_pos;        /* bytes of K and V cache a position, all layers (read per token) */
    double   limit_kv_ms[KT_BENCH_KVS]; /* the weights and kv[k] positions' K/V at the roofline */
    int      nkv;
    double   cold_ms, warm_ms;    /* graph build + compile with an empty cache, then from it */
    int      kernels;
    double   fill_ms;             /* random weights made on the device */
    int64_t  kv[KT_BENCH_KVS];
    /* Decode: kiln_gen_decode_greedy's chained steps (wall and GPU time per token), and the
     * same steps one kiln_gen_eval_greedy call each (a host round trip per token). */
    double   decode_ms[KT_BENCH_KVS], decode_gpu_ms[KT_BENCH_KVS], step_ms[KT_BENCH_KVS];
    double   host_us[KT_BENCH_KVS][3]; /* one step at a time, per token: inputs, run (launch until
                                          done), readback */
    bool     sampled_gpu;         /* the default sampler ran on the GPU (op sample), not the host */
    double   sampled_ms;          /* at kv[0]: kiln_gen_generate with llama.cpp's default sampler
                                     (op sample, chained, or kiln_sample on the host: sampled_gpu), wall
                                     per token */
    int64_t  prefill_n;
    double   prefill_ms;
    /* PyTorch, eager [0] and torch.compile reduce-overhead [1]; 0 where not measured */
    double   t_decode_ms[2][KT_BENCH_KVS], t_prefill_ms[2], t_compile_s;
    char     torch_note[2][200];
    char     err[256];
} kt_bench_model;

/* A batch row (tools/bench_batch.c, issue 28): one kiln_batch at 1, 8, 32 and 64 sequences, each
 * a 512-token prompt then gen_n greedy tokens, as llama.cpp's llama-batched-bench measures. */
#define KT_BENCH_SEQS 8 /* the most batch sizes a row takes (--seqs) */
typedef struct {
    char    name[32], file_type[16];
    int64_t prompt_n, gen_n;
    int     n_seqs, seqs[KT_BENCH_SEQS];
    double  gen_tok_s[KT_BENCH_SEQS];    /* generated tokens per second, all sequences together */
    double  step_ms[KT_BENCH_SEQS];      /* one decode step of all of them */
    double  prompt_tok_s[KT_BENCH_SEQS]; /* prompt tokens per second while the batch fills */
    double  ttft_ms[KT_BENCH_SEQS];      /* mean time to first token, the requests arriving together */
    double  limit_tok_s[KT_BENCH_SEQS];  /* the weights read once a step and each sequence's KV, at
                                            the roofline */
    char    err[256];
} kt_bench_batch;

/* Ops: measured into *ops (n of them), each error kept in its row. */
kiln_status kt_bench_ops(kt_bench *b, kt_bench_op **ops, int *n);
/* Models: b->models (or the default list), kiln then PyTorch for each. */
kiln_status kt_bench_models(kt_bench *b, kt_bench_model **models, int *n);
/* The batch rows: b->batch_models (or the default), each error kept in its row. */
kiln_status kt_bench_batches(kt_bench *b, kt_bench_batch **rows, int *n);
/* The hyperparameters of a --models name: a preset, or PRESET:FILETYPE (llama-3-8b:q4_k_m) for
 * the preset in that file type; an unknown preset or file type, or one the rows do not take, is
 * an error naming it. */
kiln_status kt_bench_model_hparams(const char *name, kiln_model_hparams *hp);

/* Runs a shell command, handing each line of its stdout to line(); its stderr passes through.
 * Returns the exit status (-1 when it could not start). */
int kt_bench_lines(const char *cmd, void (*line)(void *user, const char *text), void *user);
/* The median of x[0..n) (sorts x). */
double kt_bench_median(double *x, int n);
/* "3.14" after "key=" in text, or 0 when absent. */
double kt_bench_field(const char *text, const char *key);

/* What a run measured, for the report. */
typedef struct {
    const kt_bench_op    *ops;
    int                   nops;
    const kt_bench_model *models;
    int                   nmodels;
    const kt_bench_batch *batch;
    int                   nbatch;
} kt_bench_results;
void        kt_bench_print(const kt_bench *b, const kt_bench_results *r);
kiln_status kt_bench_write_json(const kt_bench *b, const kt_bench_results *r);

#endif
