/* kiln bench: the table on stdout, the JSON file, and running the PyTorch scripts. */
#include "tools/bench.h"

#include "base/base.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

int kt_bench_lines(const char *cmd, void (*line)(void *user, const char *text), void *user) {
    fflush(stdout);
    fflush(stderr);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    char buf[4096];
    while (fgets(buf, sizeof buf, f)) {
        buf[strcspn(buf, "\r\n")] = 0;
        line(user, buf);
    }
    int rc = pclose(f);
    return rc == -1 ? -1 : WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static int by_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double kt_bench_median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, by_double);
    return x[n / 2];
}

double kt_bench_field(const char *text, const char *key) {
    size_t n = strlen(key);
    for (const char *p = strstr(text, key); p; p = strstr(p + 1, key))
        if ((p == text || p[-1] == ' ') && p[n] == '=') return strtod(p + n + 1, NULL);
    return 0;
}

/* "12.3" or "-" for 0 (not measured). */
static const char *num(char *buf, size_t n, double v, int prec) {
    if (v <= 0 || !isfinite(v)) snprintf(buf, n, "-");
    else snprintf(buf, n, "%.*f", prec, v);
    return buf;
}

static const char *ratio(char *buf, size_t n, double theirs, double ours) {
    if (theirs <= 0 || ours <= 0) snprintf(buf, n, "-");
    else snprintf(buf, n, "%.2fx", theirs / ours);
    return buf;
}

static void print_ops(const kt_bench *b, const kt_bench_op *ops, int n) {
    char a[32], c[32], d[32];
    printf("\nops at decode shapes (median of CUDA-graph replays; GB/s of the bytes each must move)\n");
    printf("%-20s %-20s %9s %8s %7s %9s %8s\n", "op", "shape", "kiln us", "GB/s", "% roof", "torch us", "speedup");
    for (int i = 0; i < n; i++) {
        const kt_bench_op *o = &ops[i];
        if (o->err[0]) {
            printf("%-20s %-20s FAILED: %s\n", o->name, o->shape, o->err);
            continue;
        }
        printf("%-20s %-20s %9.1f %8.0f %6.1f%% %9s %8s\n", o->name, o->shape, o->us, o->gbs, o->pct,
               num(a, sizeof a, o->torch_us, 1), ratio(c, sizeof c, o->torch_us, o->us));
    }
    bool note = false;
    for (int i = 0; i < n; i++)
        if (ops[i].torch_us == 0 && ops[i].torch_note[0] && !ops[i].err[0]) {
            if (!note) printf("torch: ");
            printf("%s%s %s: %s", note ? "; " : "", ops[i].name, ops[i].shape, ops[i].torch_note);
            note = true;
        }
    if (note) printf("\n");
    (void)b, (void)d;
}

static void print_model(const kt_bench_model *m) {
    char a[32], c[32], d[32], e[32], f[32];
    if (m->err[0]) {
        printf("%-20s FAILED: %s\n", m->name, m->err);
        return;
    }
    for (int k = 0; k < m->nkv; k++) {
        /* PyTorch reads each step's token on the host: its ratios are to kiln doing the same. The
         * limit: the weights and the kv positions' K and V at the roofline. */
        double like = m->step_ms[k] > 0 ? m->step_ms[k] : m->decode_ms[k], lim = m->limit_kv_ms[k];
        printf("%-20s decode kv %-6lld %8.3f %7.0f %8.3f %8.3f %6.0f%% %9s %9s %8s %8s\n", k ? "" : m->name,
               (long long)m->kv[k], m->decode_ms[k], m->decode_ms[k] > 0 ? 1e3 / m->decode_ms[k] : 0,
               m->decode_gpu_ms[k], lim, m->decode_ms[k] > 0 ? 100 * lim / m->decode_ms[k] : 0,
               num(a, sizeof a, m->t_decode_ms[0][k], 3), num(c, sizeof c, m->t_decode_ms[1][k], 3),
               ratio(d, sizeof d, m->t_decode_ms[0][k], like), ratio(e, sizeof e, m->t_decode_ms[1][k], like));
    }
    double tok_s = m->prefill_ms > 0 ? 1e3 * (double)m->prefill_n / m->prefill_ms : 0;
    double te = m->t_prefill_ms[0] > 0 ? 1e3 * (double)m->prefill_n / m->t_prefill_ms[0] : 0;
    double tc = m->t_prefill_ms[1] > 0 ? 1e3 * (double)m->prefill_n / m->t_prefill_ms[1] : 0;
    printf("%-20s prefill %-5lld %8.3f %7.0f %8s %8s %7s %9s %9s %8s %8s   (ms per %lld tokens; tok/s)\n", "",
           (long long)m->prefill_n, m->prefill_ms, tok_s, "", "", "", num(a, sizeof a, te, 0), num(c, sizeof c, tc, 0),
           ratio(d, sizeof d, m->t_prefill_ms[0], m->prefill_ms), ratio(e, sizeof e, m->t_prefill_ms[1], m->prefill_ms),
           (long long)m->prefill_n);
    printf("%-20s weights %.2f GB (%.2f GB read per token); cold compile %.2f s (%d kernels), warm start %.0f ms, "
           "weights made on the GPU in %.0f ms; torch.compile %s s\n",
           "", m->weight_gb, m->token_gb, m->cold_ms / 1e3, m->kernels, m->warm_ms, m->fill_ms,
           num(f, sizeof f, m->t_compile_s, 1));
    if (m->step_ms[0] > 0 && m->nkv > 1) /* not measured for quantized files in --quick */
        printf("%-20s one step at a time (a host round trip a token): %.3f / %.3f ms at kv %lld / %lld; at kv %lld: "
               "inputs %.0f us, run %.0f us, argmax readback %.0f us\n", "", m->step_ms[0], m->step_ms[1],
               (long long)m->kv[0], (long long)m->kv[1], (long long)m->kv[0], m->host_us[0][0], m->host_us[0][1],
               m->host_us[0][2]);
    if (m->sampled_ms > 0)
        printf("%-20s default sampler (temp 0.8, top-k 40, top-p 0.95, min-p 0.05; on the %s): %.3f ms/token at "
               "kv %lld (greedy, chained: %.3f)\n", "", m->sampled_gpu ? "GPU" : "host", m->sampled_ms, (long long)m->kv[0], m->decode_ms[0]);
    if (m->torch_note[0][0] && !strcmp(m->torch_note[0], m->torch_note[1])) /* one reason for both */
        printf("%-20s torch: %s\n", "", m->torch_note[0]);
    else
        for (int mode = 0; mode < 2; mode++)
            if (m->torch_note[mode][0])
                printf("%-20s torch %s: %s\n", "", mode ? "compile" : "eager", m->torch_note[mode]);
}

static void print_models(const kt_bench_model *ms, int n) {
    printf("\nmodels, random weights, batch 1, greedy: bf16, or the file type after the colon with random quantized\n"
           "blocks (kiln: wall ms per token of kiln_gen's decode loop, steps chained on the GPU, and its GPU time;\n"
           "limit: the file's weight bytes read per token at the roofline; torch: eager and torch.compile\n"
           "reduce-overhead, each step's token read on the host; vs: their ms over kiln's one step at a time,\n"
           "which reads each token on the host too)\n");
    printf("%-20s %-16s %8s %7s %8s %8s %7s %9s %9s %8s %8s\n", "model", "", "kiln ms", "tok/s", "GPU ms", "limit",
           "% lim", "eager ms", "compile", "vs eager", "vs comp");
    for (int i = 0; i < n; i++) print_model(&ms[i]);
}

/* The batch rows: aggregate generation, one step, the batch filling, time to first token, limit. */
static void print_batch(const kt_bench_batch *rows, int n, int small) {
    printf("\nbatched decode (kiln_batch: each sequence a %lld-token prompt, then greedy tokens; tok/s of all "
           "sequences together; ", n ? (long long)rows[0].prompt_n : 512LL);
    if (small) printf("steps of at most %d tokens take their own program, --batch-small)\n", small);
    else printf("one program for every step, --batch-small 0)\n");
    printf("%-20s %6s %12s %10s %12s %10s %12s %6s\n", "model", "seqs", "gen tok/s", "step ms", "prompt tok/s",
           "ttft ms", "limit tok/s", "%");
    for (int i = 0; i < n; i++) {
        const kt_bench_batch *r = &rows[i];
        if (r->err[0]) {
            printf("%-20s error: %s\n", r->name, r->err);
            continue;
        }
        for (int k = 0; k < r->n_seqs; k++)
            printf("%-20s %6d %12.0f %10.3f %12.0f %10.1f %12.0f %5.0f%%\n", k ? "" : r->name, r->seqs[k],
                   r->gen_tok_s[k], r->step_ms[k], r->prompt_tok_s[k], r->ttft_ms[k], r->limit_tok_s[k],
                   r->limit_tok_s[k] > 0 ? 100.0 * r->gen_tok_s[k] / r->limit_tok_s[k] : 0.0);
    }
}

void kt_bench_print(const kt_bench *b, const kt_bench_results *r) {
    const kt_bench_op    *ops = r->ops;
    const kt_bench_model *models = r->models;
    int                   nops = r->nops, nmodels = r->nmodels;
    printf("kiln bench%s on %s (%s, %d SMs, %.1f GB): device-to-device copy %.0f GB/s (read + write) is the "
           "roofline\n", b->quick ? " --quick" : "", b->dev.name, b->dev.arch, b->dev.sm_count,
           (double)b->dev.memory_bytes / 1e9, b->copy_gbs);
    if (!b->torch) printf("PyTorch: %s\n", b->torch_why);
    if (nops) print_ops(b, ops, nops);
    if (nmodels) print_models(models, nmodels);
    if (r->nbatch) print_batch(r->batch, r->nbatch, b->batch_small);
}

/* ---- JSON ------------------------------------------------------------------------------------ */

static void json_str(kb_str *j, const char *s) {
    kb_str_add(j, "\"");
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') kb_str_addf(j, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) kb_str_addf(j, "\\u%04x", *s);
        else kb_str_addn(j, s, 1);
    }
    kb_str_add(j, "\"");
}

/* A number, or null when not measured. */
static void json_num(kb_str *j, const char *key, double v, bool more) {
    kb_str_addf(j, "\"%s\": ", key);
    if (v > 0 && isfinite(v)) kb_str_addf(j, "%.6g", v);
    else kb_str_add(j, "null");
    if (more) kb_str_add(j, ", ");
}

static void json_ops(kb_str *j, const kt_bench_op *ops, int n) {
    kb_str_add(j, "  \"ops\": [\n");
    for (int i = 0; i < n; i++) {
        const kt_bench_op *o = &ops[i];
        kb_str_add(j, "    {\"op\": ");
        json_str(j, o->name);
        kb_str_add(j, ", \"shape\": ");
        json_str(j, o->shape);
        kb_str_add(j, ", \"graph\": ");
        json_str(j, o->graph);
        kb_str_add(j, ", ");
        json_num(j, "us", o->us, true);
        json_num(j, "bytes", o->bytes, true);
        json_num(j, "gb_s", o->gbs, true);
        json_num(j, "roofline_pct", o->pct, true);
        json_num(j, "torch_us", o->torch_us, true);
        kb_str_add(j, "\"torch_note\": ");
        json_str(j, o->torch_note);
        kb_str_add(j, ", \"error\": ");
        json_str(j, o->err);
        kb_str_addf(j, "}%s\n", i + 1 < n ? "," : "");
    }
    kb_str_add(j, "  ],\n");
}

static void json_model(kb_str *j, const kt_bench_model *m) {
    kb_str_add(j, "    {\"model\": ");
    json_str(j, m->name);
    kb_str_add(j, ", \"file_type\": ");
    json_str(j, m->file_type);
    kb_str_add(j, ", ");
    json_num(j, "weights_gb", m->weight_gb, true);
    json_num(j, "read_per_token_gb", m->token_gb, true);
    json_num(j, "limit_ms", m->limit_ms, true);
    json_num(j, "cold_compile_ms", m->cold_ms, true);
    json_num(j, "warm_start_ms", m->warm_ms, true);
    kb_str_addf(j, "\"kernels\": %d, ", m->kernels);
    json_num(j, "weights_fill_ms", m->fill_ms, true);
    json_num(j, "sampled_ms", m->sampled_ms, true);
    kb_str_addf(j, "\"sampled_on_gpu\": %s, ", m->sampled_gpu ? "true" : "false");
    kb_str_add(j, "\n     \"decode\": [");
    for (int k = 0; k < m->nkv; k++) {
        kb_str_addf(j, "%s{\"kv\": %lld, ", k ? ", " : "", (long long)m->kv[k]);
        json_num(j, "limit_ms", m->limit_kv_ms[k], true);
        json_num(j, "ms", m->decode_ms[k], true);
        json_num(j, "tok_s", m->decode_ms[k] > 0 ? 1e3 / m->decode_ms[k] : 0, true);
        json_num(j, "gpu_ms", m->decode_gpu_ms[k], true);
        json_num(j, "step_ms", m->step_ms[k], true);
        json_num(j, "inputs_us", m->host_us[k][0], true);
        json_num(j, "run_us", m->host_us[k][1], true);
        json_num(j, "readback_us", m->host_us[k][2], true);
        json_num(j, "torch_eager_ms", m->t_decode_ms[0][k], true);
        json_num(j, "torch_compile_ms", m->t_decode_ms[1][k], false);
        kb_str_add(j, "}");
    }
    kb_str_addf(j, "],\n     \"prefill\": {\"tokens\": %lld, ", (long long)m->prefill_n);
    json_num(j, "ms", m->prefill_ms, true);
    json_num(j, "tok_s", m->prefill_ms > 0 ? 1e3 * (double)m->prefill_n / m->prefill_ms : 0, true);
    json_num(j, "torch_eager_ms", m->t_prefill_ms[0], true);
    json_num(j, "torch_compile_ms", m->t_prefill_ms[1], false);
    kb_str_add(j, "},\n     ");
    json_num(j, "torch_compile_s", m->t_compile_s, true);
    kb_str_add(j, "\"torch_eager_note\": ");
    json_str(j, m->torch_note[0]);
    kb_str_add(j, ", \"torch_compile_note\": ");
    json_str(j, m->torch_note[1]);
    kb_str_add(j, ", \"error\": ");
    json_str(j, m->err);
    kb_str_add(j, "}");
}

static void json_batch(kb_str *j, const kt_bench_batch *rows, int n, int small) {
    kb_str_addf(j, "  \"batch_small\": %d,\n", small);
    kb_str_add(j, "  \"batch\": [\n");
    for (int i = 0; i < n; i++) {
        const kt_bench_batch *r = &rows[i];
        kb_str_add(j, "    {\"model\": ");
        json_str(j, r->name);
        kb_str_add(j, ", \"file_type\": ");
        json_str(j, r->file_type);
        kb_str_addf(j, ", \"prompt_tokens\": %lld, \"gen_tokens\": %lld, \"rows\": [", (long long)r->prompt_n,
                    (long long)r->gen_n);
        for (int k = 0; k < r->n_seqs && !r->err[0]; k++) {
            kb_str_addf(j, "%s{\"seqs\": %d, ", k ? ", " : "", r->seqs[k]);
            json_num(j, "gen_tok_s", r->gen_tok_s[k], true);
            json_num(j, "step_ms", r->step_ms[k], true);
            json_num(j, "prompt_tok_s", r->prompt_tok_s[k], true);
            json_num(j, "ttft_ms", r->ttft_ms[k], true);
            json_num(j, "limit_tok_s", r->limit_tok_s[k], false);
            kb_str_add(j, "}");
        }
        kb_str_add(j, "], \"error\": ");
        json_str(j, r->err);
        kb_str_addf(j, "}%s\n", i + 1 < n ? "," : "");
    }
    kb_str_add(j, "  ],\n");
}

kiln_status kt_bench_write_json(const kt_bench *b, const kt_bench_results *r) {
    const kt_bench_op    *ops = r->ops;
    const kt_bench_model *models = r->models;
    int                   nops = r->nops, nmodels = r->nmodels;
    kb_str j = {0};
    kb_str_addf(&j, "{\n  \"kiln\": \"%s\", \"mode\": \"%s\",\n  \"machine\": {\"gpu\": ", KILN_VERSION,
                b->quick ? "quick" : "full");
    json_str(&j, b->dev.name);
    kb_str_add(&j, ", \"arch\": ");
    json_str(&j, b->dev.arch);
    kb_str_addf(&j, ", \"sms\": %d, ", b->dev.sm_count);
    json_num(&j, "memory_gb", (double)b->dev.memory_bytes / 1e9, true);
    json_num(&j, "copy_gb_s", b->copy_gbs, true);
    kb_str_add(&j, "\"torch\": ");
    json_str(&j, b->torch ? "yes" : b->torch_why);
    kb_str_add(&j, "},\n");
    json_ops(&j, ops, nops);
    json_batch(&j, r->batch, r->nbatch, b->batch_small);
    kb_str_add(&j, "  \"models\": [\n");
    for (int i = 0; i < nmodels; i++) {
        json_model(&j, &models[i]);
        kb_str_add(&j, i + 1 < nmodels ? ",\n" : "\n");
    }
    kb_str_add(&j, "  ]\n}\n");
    char *text = kb_str_take(&j);
    if (!text) return kb_oom();
    FILE *f = fopen(b->json, "w");
    kiln_status st = NULL;
    if (!f || fputs(text, f) < 0) st = kb_error(KILN_ERR_IO, "kiln bench: could not write %s", b->json);
    if (f && fclose(f) != 0 && !st) st = kb_error(KILN_ERR_IO, "kiln bench: could not write %s", b->json);
    free(text);
    return st;
}
