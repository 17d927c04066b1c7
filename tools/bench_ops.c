/* kiln bench, ops: each op or fusion at decode shapes from a one-op graph in bench/ (the files
 * say what they model), timed as CUDA-graph replays, against the measured roofline; PyTorch's
 * time for the same computation from bench/torch_ops.py in one process afterwards.
 *
 * Bytes moved are the program's inputs, weights and outputs, each once, unless the graph says
 * otherwise with "# bench-bytes: N" (mul_mat_id reads 8 of its 128 experts; set_rows writes one
 * row of its cache). Weights are made on the device; inputs are random, integer ones small
 * (0..15), and "# bench-ids: T U E" gives each of T tokens U distinct experts of E. */
#include "tools/bench.h"

#include "base/base.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name, *shape, *graph; /* graph: relative to the bench folder */
} op_entry;

static const op_entry g_ops[] = {
    {"rms_norm_mul", "4096 f32 +res", "fusion/rms_norm_mul.kg"},
    {"gemv bf16", "4096 -> 4096", "ops/mul_mat_gemv_bf16_4096x4096.kg"},
    {"gemv f16", "4096 -> 4096", "ops/mul_mat_gemv_f16_4096x4096.kg"},
    {"gemv bf16", "4096 -> 14336", "ops/mul_mat_gemv_bf16_4096x14336.kg"},
    {"gemv f16", "4096 -> 14336", "ops/mul_mat_gemv_f16_4096x14336.kg"},
    {"gemv bf16", "14336 -> 4096", "ops/mul_mat_gemv_bf16_14336x4096.kg"},
    {"gemv f16", "14336 -> 4096", "ops/mul_mat_gemv_f16_14336x4096.kg"},
    {"gemv q8_0", "4096 -> 14336", "ops/mul_mat_gemv_q8_0_4096x14336.kg"},
    {"gemv q8_0", "14336 -> 4096", "ops/mul_mat_gemv_q8_0_14336x4096.kg"},
    {"gemv q4_0", "4096 -> 14336", "ops/mul_mat_gemv_q4_0_4096x14336.kg"},
    {"gemv q4_0", "14336 -> 4096", "ops/mul_mat_gemv_q4_0_14336x4096.kg"},
    {"gemv q5_0", "4096 -> 14336", "ops/mul_mat_gemv_q5_0_4096x14336.kg"},
    {"gemv q5_0", "14336 -> 4096", "ops/mul_mat_gemv_q5_0_14336x4096.kg"},
    {"gemv q5_1", "4096 -> 14336", "ops/mul_mat_gemv_q5_1_4096x14336.kg"},
    {"gemv q5_1", "14336 -> 4096", "ops/mul_mat_gemv_q5_1_14336x4096.kg"},
    {"gemv q4_K", "4096 -> 14336", "ops/mul_mat_gemv_q4_K_4096x14336.kg"},
    {"gemv q4_K", "14336 -> 4096", "ops/mul_mat_gemv_q4_K_14336x4096.kg"},
    {"gemv q5_K", "4096 -> 14336", "ops/mul_mat_gemv_q5_K_4096x14336.kg"},
    {"gemv q5_K", "14336 -> 4096", "ops/mul_mat_gemv_q5_K_14336x4096.kg"},
    {"gemv q6_K", "4096 -> 14336", "ops/mul_mat_gemv_q6_K_4096x14336.kg"},
    {"gemv q6_K", "14336 -> 4096", "ops/mul_mat_gemv_q6_K_14336x4096.kg"},
    {"gemv mxfp4", "4096 -> 14336", "ops/mul_mat_gemv_mxfp4_4096x14336.kg"},
    {"gemv mxfp4", "14336 -> 4096", "ops/mul_mat_gemv_mxfp4_14336x4096.kg"},
    {"mul_mat_id q8_0", "8/128 x 768x2048 x3", "ops/mul_mat_id_decode_q8_0.kg"},
    {"mul_mat_id q4_0", "8/128 x 768x2048 x3", "ops/mul_mat_id_decode_q4_0.kg"},
    {"mul_mat_id q5_0", "8/128 x 768x2048 x3", "ops/mul_mat_id_decode_q5_0.kg"},
    {"mul_mat_id q5_1", "8/128 x 768x2048 x3", "ops/mul_mat_id_decode_q5_1.kg"},
    {"mul_mat_id q4_K", "8/128 x 768x2048 x3", "ops/mul_mat_id_decode_q4_K.kg"},
    {"mul_mat_id q5_K", "8/128 x 768x2048 x3", "ops/mul_mat_id_decode_q5_K.kg"},
    {"mul_mat_id q6_K", "8/128 x 768x2048 x3", "ops/mul_mat_id_decode_q6_K.kg"},
    {"mul_mat_id mxfp4", "8/128 x 768x2048 x3", "ops/mul_mat_id_decode_mxfp4.kg"},
    {"mul_mat_glu bf16", "4096 -> 2x14336", "ops/mul_mat_glu_bf16_4096x14336.kg"},
    {"topk_moe", "128 experts, top 8", "ops/topk_moe_e128_k8_t1.kg"},
    {"mul_mat_id bf16", "8/128 x 768x2048 x3", "ops/mul_mat_id_decode_bf16.kg"},
    {"flash_attn_ext bf16", "n_kv 512", "ops/flash_attn_dec_bf16_512.kg"},
    {"flash_attn_ext bf16", "n_kv 4096", "ops/flash_attn_dec_bf16_4096.kg"},
    {"flash_attn_ext bf16", "n_kv 16384", "ops/flash_attn_dec_bf16_16384.kg"},
    {"rope_set_rows", "8x128 f32 -> f16", "fusion/rope_set_rows.kg"},
};
#define N_OPS ((int)(sizeof g_ops / sizeof g_ops[0]))

/* "# NAME: a b c" in the graph's text: the numbers (up to n), or 0 found. */
static int directive(const char *text, const char *name, int64_t *v, int n) {
    char        key[64];
    snprintf(key, sizeof key, "# %s:", name);
    const char *p = strstr(text, key);
    if (!p) return 0;
    p += strlen(key);
    int k = 0;
    for (char *end; k < n; k++, p = end) {
        v[k] = strtoll(p, &end, 10);
        if (end == p) break;
    }
    return k;
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

/* Weights on the device: uniform with variance 1/ne0 for matrices, as models are initialized. */
static kiln_status weight_init(void *user, const char *name, kiln_type type, const int64_t ne[4],
                               kiln_weight_init *out) {
    memset(out, 0, sizeof *out);
    out->key = *(const uint64_t *)user ^ fnv1a(name);
    out->scale = ne[1] > 1 ? sqrtf(3.0f / (float)ne[0]) : 1.0f;
    return NULL;
}

/* ids [U, T] i32: per token U distinct experts of E (a partial Fisher-Yates shuffle). */
static void moe_ids(int32_t *ids, int64_t t, int64_t u, int64_t e, uint64_t seed) {
    int32_t *perm = malloc(sizeof *perm * (size_t)e);
    if (!perm) return;
    for (int64_t tok = 0; tok < t; tok++) {
        for (int64_t i = 0; i < e; i++) perm[i] = (int32_t)i;
        for (int64_t i = 0; i < u; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            int64_t j = i + (int64_t)((seed >> 33) % (uint64_t)(e - i));
            int32_t x = perm[i];
            perm[i] = perm[j];
            perm[j] = x;
            ids[tok * u + i] = perm[i];
        }
    }
    free(perm);
}

static kiln_status set_inputs(kiln_session *s, const kiln_graph *g, const char *text, uint64_t seed) {
    int64_t     ids[3];
    bool        moe = directive(text, "bench-ids", ids, 3) == 3;
    kiln_status st = NULL;
    for (int i = 0; !st && i < kiln_graph_size(g); i++) {
        const kiln_tensor *t = kiln_graph_node(g, i);
        kiln_role          r = kiln_tensor_role(t);
        if (r != KILN_ROLE_INPUT && r != KILN_ROLE_STATE) continue;
        int64_t n = kiln_tensor_nelements(t);
        size_t  bytes = kiln_row_size(kiln_tensor_type(t), n);
        void   *data = malloc(bytes ? bytes : 1);
        if (!data) return kb_oom();
        kb_fill_random(data, kiln_tensor_type(t), n, seed + (uint64_t)i);
        if (moe && !strcmp(kiln_tensor_name(t), "ids") && n == ids[0] * ids[1])
            moe_ids(data, ids[0], ids[1], ids[2], seed);
        st = kiln_session_set(s, kiln_tensor_name(t), data, bytes);
        free(data);
    }
    return st;
}

/* Median GPU time of iters replays after warm-up (the first run captures the CUDA graph), each
 * from a cold L2: a 4096x4096 bf16 matrix (34 MB) would otherwise be read from the H100's 50 MB
 * L2 on every replay after the first, which no layer of a model ever sees. */
static kiln_status time_replays(kiln_session *s, int iters, double *median_ms) {
    double     *ms = calloc((size_t)iters, sizeof *ms);
    kiln_status st = ms ? NULL : kb_oom();
    for (int i = 0; !st && i < 3; i++) st = kiln_session_run(s);
    for (int i = 0; !st && i < iters; i++) {
        st = kiln_device_flush_l2(0);
        if (!st) st = kiln_session_run(s);
        ms[i] = kiln_session_last_ms(s);
    }
    if (!st) {
        *median_ms = kt_bench_median(ms, iters);
    }
    free(ms);
    return st;
}

static kiln_status measure(kt_bench *b, kt_bench_op *op) {
    char       *text = NULL;
    size_t      len = 0;
    kiln_ctx   *ctx = kiln_ctx_new();
    kiln_graph *g = NULL;
    kiln_program *p = NULL;
    kiln_session *s = NULL;
    kiln_status st = ctx ? kb_read_file(op->graph, &text, &len) : kb_oom();
    if (!st) st = kiln_parse(ctx, text, len, op->graph);
    if (!st) st = kiln_graph_new(ctx, &g);
    kiln_compile_opts co = {.arch = b->dev.arch};
    if (!st) st = kiln_compile(g, &co, &p);
    if (!st) st = kiln_session_new(p, NULL, &s);
    if (!st) st = kiln_session_fill_weights(s, weight_init, &b->seed);
    if (!st) st = set_inputs(s, g, text, b->seed);
    double ms = 0;
    if (!st) st = time_replays(s, b->quick ? 30 : 200, &ms);
    if (!st) {
        int64_t v;
        op->bytes = directive(text, "bench-bytes", &v, 1) == 1 ? (double)v : (double)kiln_program_io_bytes(p);
        op->us = ms * 1e3;
        op->gbs = ms > 0 ? op->bytes / (ms * 1e6) : 0;
        op->pct = b->copy_gbs > 0 ? 100 * op->gbs / b->copy_gbs : 0;
    }
    kiln_session_free(s);
    kiln_program_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
    free(text);
    return st;
}

typedef struct {
    kt_bench_op *ops;
    int          n;
} torch_ops_ctx;

static void torch_op_line(void *user, const char *text) {
    torch_ops_ctx *c = user;
    for (int i = 0; i < c->n; i++) {
        kt_bench_op *op = &c->ops[i];
        size_t       n = strlen(op->graph);
        if (strncmp(text, op->graph, n) != 0 || text[n] != ' ') continue;
        const char *rest = text + n + 1;
        if (!strncmp(rest, "ms=", 3)) op->torch_us = kt_bench_field(rest, "ms") * 1e3;
        else snprintf(op->torch_note, sizeof op->torch_note, "%s", rest);
    }
}

static void torch_ops(kt_bench *b, kt_bench_op *ops, int n) {
    kb_str cmd = {0};
    kb_str_addf(&cmd, "%s %s/torch_ops.py --iters %d", b->python, b->dir, b->quick ? 30 : 200);
    for (int i = 0; i < n; i++) kb_str_addf(&cmd, " %s", ops[i].graph);
    char *c = kb_str_take(&cmd);
    if (!c) return;
    torch_ops_ctx tc = {ops, n};
    fprintf(stderr, "bench: PyTorch ops ...\n");
    int rc = kt_bench_lines(c, torch_op_line, &tc);
    for (int i = 0; i < n; i++)
        if (ops[i].torch_us == 0 && !ops[i].torch_note[0])
            snprintf(ops[i].torch_note, sizeof ops[i].torch_note, "no result (torch_ops.py exited with %d)", rc);
    free(c);
}

kiln_status kt_bench_ops(kt_bench *b, kt_bench_op **out, int *nout) {
    kt_bench_op *ops = calloc(N_OPS, sizeof *ops);
    if (!ops) return kb_oom();
    for (int i = 0; i < N_OPS; i++) {
        kt_bench_op *op = &ops[i];
        snprintf(op->name, sizeof op->name, "%s", g_ops[i].name);
        snprintf(op->shape, sizeof op->shape, "%s", g_ops[i].shape);
        snprintf(op->graph, sizeof op->graph, "%s/%s", b->dir, g_ops[i].graph);
        fprintf(stderr, "bench: %s %s\n", op->name, op->shape);
        kiln_status st = measure(b, op);
        if (st) {
            snprintf(op->err, sizeof op->err, "%s", kiln_status_msg(st));
            kiln_status_free(st);
        }
    }
    if (b->torch) torch_ops(b, ops, N_OPS);
    else
        for (int i = 0; i < N_OPS; i++) snprintf(ops[i].torch_note, sizeof ops[i].torch_note, "%s", b->torch_why);
    *out = ops;
    *nout = N_OPS;
    return NULL;
}
