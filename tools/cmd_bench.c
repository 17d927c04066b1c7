/* kiln bench [--quick] [--ops-only | --models-only | --batch-only] [--models LIST] [--batch LIST] [--json FILE] [--no-torch]:
 * the machine and its measured roofline, per-op kernels at decode shapes, whole models (decode
 * at two KV positions, prefill, compile times), each beside PyTorch on the same GPU in the same
 * run, so that the ratios hold on a noisy machine. `make bench` runs it. */
#include "tools/bench.h"

#include "base/base.h"
#include "tools/cmd.h"
#include "tools/flag.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char summary[] =
    "  bench           per-op roofline, model decode/prefill and compile times beside PyTorch\n"
    "                  on this GPU ('kiln help bench'; make bench)\n";

static const char help[] =
    "usage: kiln bench [--quick] [--ops-only | --models-only | --batch-only] [--models LIST]\n"
    "                  [--batch LIST] [--seqs LIST] [--batch-small N] [--kv LIST] [--tp G | --pp G]\n"
    "                  [--json FILE] [--no-torch] [--python PY] [--dir DIR] [--seed S]\n"
    "  measures kiln on this GPU beside PyTorch, in one run (docs/bench.md):\n"
    "  - the GPU and its device-to-device copy bandwidth (bytes read + written), the roofline;\n"
    "  - ops and fusions at decode shapes (DIR/ops, DIR/fusion): median CUDA-graph replay in us,\n"
    "    GB/s of the bytes they must move, % of the roofline, and PyTorch's time (torch_ops.py);\n"
    "  - models llama-3.2-1b, llama-3-8b, qwen3-30b-a3b in bf16 with random weights (those\n"
    "    'kiln gen-model' writes, made on the GPU), and the quantized files llama-3.2-1b and\n"
    "    llama-3-8b in q4_0, q4_k_m, q8_0 and qwen3-30b-a3b in q4_k_m (random blocks made on the\n"
    "    GPU, each weight of the type llama-quantize's mix gives it): decode ms/token at KV\n"
    "    positions 512, 4096 and 32768 (--kv), prefill tok/s at 512 tokens, cold compile and warm\n"
    "    start, the limit (the weight bytes and the position's K and V read per token at the\n"
    "    roofline); beside PyTorch eager and\n"
    "    torch.compile(mode=\"reduce-overhead\") of the same model (torch_ref.py; bf16 only:\n"
    "    PyTorch has no ggml quantized types);\n"
    "  - batched decode (kiln_batch, issue 28): llama-3-8b in bf16 and q4_k_m at 1, 8, 32 and 64\n"
    "    sequences, each a 512-token prompt then 128 greedy tokens (32 with --quick): generated\n"
    "    tok/s of all sequences, a step's ms, prompt tok/s, mean time to first token, the limit\n"
    "    (the weights read once a step and each sequence's KV cache, at the roofline).\n"
    "  Needs a GPU. PyTorch is optional: without it the PyTorch columns say why they are empty.\n"
    "  --quick         fewer repetitions, no torch.compile, quantized models without the\n"
    "                  one-step-at-a-time loop (torch.compile is most of a full run's time)\n"
    "  --ops-only      only the machine and the ops; --models-only: only the machine and models;\n"
    "                  --batch-only: only the machine and the batched rows\n"
    "  --models LIST   comma-separated presets, PRESET:TYPE for a file type (llama-3-8b:q4_k_m;\n"
    "                  types f32, f16, bf16, q8_0, q4_0, q5_0, q5_1, q4_k_m, q5_k_m, q6_k); default: all above\n"
    "  --batch LIST    the batched rows' models (as --models; default llama-3-8b,llama-3-8b:q4_k_m)\n"
    "  --seqs LIST     the batched rows' sequence counts, 1 .. 512 each (default 1,8,32,64);\n"
    "                  '--seqs 64' with KILN_PROFILE=1 KILN_PROFILE_SKIP=64 (the prompt steps, one\n"
    "                  a sequence) times the kernels of a decode step of 64 sequences\n"
    "  --batch-small N also a program for steps of at most N tokens (2 .. 511; kiln_batch_opts.n_small;\n"
    "                  default 64, as kiln serve's; 0: none): the decode steps then take plans made\n"
    "                  for few tokens\n"
    "  --kv LIST       the model rows' decode positions, 1 to 3 (default 512,4096,32768); the limit\n"
    "                  column counts the weights and, at each position, the K and V the token reads\n"
    "  --tp G          the model rows split over G GPUs (with --models-only; kiln run --tp, docs/tp.md):\n"
    "                  random weights of each GPU's share made on it; the limit column is a GPU's\n"
    "                  share of the bytes at the roofline (the all-reduces not counted)\n"
    "  --pp G          the model rows' layers in G stages, a GPU each (with --models-only; kiln run\n"
    "                  --pp): each GPU's layers' random weights made on it; the stages run one\n"
    "                  after another, so the limit column is one GPU's\n"
    "  --json FILE     also write the results as JSON (make bench: build/bench.json)\n"
    "  --no-torch      kiln only\n"
    "  --python PY     the Python that has PyTorch (default: python3)\n"
    "  --dir DIR       the bench folder with the graphs and scripts (default: bench)\n"
    "  --seed S        seed of the random weights and inputs, 0 .. 2^64-1 (default 1)\n";

/* Every name of a --models or --batch list is a preset (PRESET:TYPE) the rows take. */
static bool known_models(const char *list, const char *flag) {
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ',');
        char        name[64];
        snprintf(name, sizeof name, "%.*s", (int)(e ? e - p : (long)strlen(p)), p);
        kiln_model_hparams hp;
        kiln_status        st = kt_bench_model_hparams(name, &hp);
        if (st) {
            kt_fail("bench", kb_wrap(st, "%s", flag));
            return false;
        }
        p = e ? e + 1 : NULL;
    }
    return true;
}

/* A comma-separated LIST of 1 .. max integers, each lo .. hi, into out[0 .. *n): the flag's
 * usage error names what the items are. */
static bool parse_list(const char *flag, const char *v, int max, int32_t lo, int32_t hi, const char *what,
                       int32_t *out, int *n) {
    *n = 0;
    for (const char *p = v;;) {
        char        item[24];
        const char *e = strchr(p, ',');
        size_t      len = e ? (size_t)(e - p) : strlen(p);
        if (*n == max || len == 0 || len >= sizeof item) {
            kt_usage("bench", "%s %s: 1 to %d comma-separated %s", flag, v, max, what);
            return false;
        }
        memcpy(item, p, len);
        item[len] = 0;
        if (!kt_flag_int32("bench", flag, item, lo, hi, &out[(*n)++])) return false;
        if (!e) return true;
        p = e + 1;
    }
}

/* --seqs LIST: up to 8 batch sizes, each 1 .. 512 (a step takes 512 tokens, the prompt's). */
static bool parse_seqs(kt_bench *b, const char *v) {
    return parse_list("--seqs", v, 8, 1, 512, "batch sizes", b->seqs, &b->n_seqs);
}

/* --kv LIST: 1 to 3 cache positions for the decode rows (a row fills the cache to its position
 * first: a prefill of all but 3 of them). */
static bool parse_kvs(kt_bench *b, const char *v) {
    int32_t kv[KT_BENCH_KVS];
    int     n;
    if (!parse_list("--kv", v, KT_BENCH_KVS, 16, 1 << 20, "cache positions", kv, &n)) return false;
    for (b->nkvs = 0; b->nkvs < n; b->nkvs++) b->kvs[b->nkvs] = kv[b->nkvs];
    return true;
}

/* KT_GO_ON when b is complete, else the exit status. */
static int parse(int argc, char **argv, kt_bench *b) {
    b->torch = true;
    b->do_ops = b->do_models = b->do_batch = true;
    b->dir = "bench";
    b->python = "python3";
    b->seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool        valued = !strcmp(a, "--models") || !strcmp(a, "--json") || !strcmp(a, "--python") ||
                      !strcmp(a, "--dir") || !strcmp(a, "--seed") || !strcmp(a, "--batch") || !strcmp(a, "--seqs") ||
                      !strcmp(a, "--batch-small") || !strcmp(a, "--tp") || !strcmp(a, "--pp") || !strcmp(a, "--kv");
        if (valued && !v) return kt_usage("bench", "%s needs a value", a);
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return kt_print_help("bench");
        if (!strcmp(a, "--quick")) b->quick = true;
        else if (!strcmp(a, "--ops-only")) b->do_models = b->do_batch = false;
        else if (!strcmp(a, "--models-only")) b->do_ops = b->do_batch = false;
        else if (!strcmp(a, "--batch-only")) b->do_ops = b->do_models = false;
        else if (!strcmp(a, "--batch")) b->batch_models = v;
        else if (!strcmp(a, "--seqs")) {
            if (!parse_seqs(b, v)) return KT_EXIT_USAGE;
        }
        else if (!strcmp(a, "--batch-small")) {
            if (!kt_flag_int32("bench", a, v, 0, 511, &b->batch_small)) return KT_EXIT_USAGE; /* (below the prompt steps' 512) */
            if (b->batch_small == 1) return kt_usage("bench", "%s", "--batch-small 1: 0 (none), or 2 .. 511");
        }
        else if (!strcmp(a, "--kv")) {
            if (!parse_kvs(b, v)) return KT_EXIT_USAGE;
        }
        else if (!strcmp(a, "--tp")) {
            if (!kt_flag_int32("bench", a, v, 2, 64, &b->tp)) return KT_EXIT_USAGE;
        }
        else if (!strcmp(a, "--pp")) {
            if (!kt_flag_int32("bench", a, v, 2, 64, &b->pp)) return KT_EXIT_USAGE;
        }
        else if (!strcmp(a, "--no-torch")) b->torch = false;
        else if (!strcmp(a, "--models")) b->models = v;
        else if (!strcmp(a, "--json")) b->json = v;
        else if (!strcmp(a, "--python")) b->python = v;
        else if (!strcmp(a, "--dir")) b->dir = v;
        else if (!strcmp(a, "--seed")) {
            if (!kt_flag_uint("bench", a, v, UINT64_MAX, &b->seed)) return KT_EXIT_USAGE;
        } else return kt_usage("bench", "unknown option '%s'", a);
        if (valued) i++;
    }
    if (!b->do_ops + !b->do_models + !b->do_batch > 2)
        return kt_usage("bench", "--ops-only, --models-only and --batch-only exclude each other");
    if (b->tp && (b->do_ops || b->do_batch))
        return kt_usage("bench", "--tp %d splits the model rows only: give --models-only", b->tp);
    if (b->pp && (b->do_ops || b->do_batch))
        return kt_usage("bench", "--pp %d splits the model rows only: give --models-only", b->pp);
    if (b->tp && b->pp) return kt_usage("bench", "%s", "--tp and --pp: one split or the other, not both");
    struct stat sb;
    if (stat(b->dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return kt_usage("bench", "no bench folder '%s' (run from the source tree, or give --dir)", b->dir);
    if (!known_models(b->models, "--models") || !known_models(b->batch_models, "--batch")) return KT_EXIT_USAGE;
    return KT_GO_ON;
}

/* PyTorch beside us: its version line, or why not (b->torch_why). */
typedef struct {
    char line[100];
} probe;

static void probe_line(void *user, const char *text) {
    probe *p = user;
    if (!p->line[0]) snprintf(p->line, sizeof p->line, "%s", text);
}

static void probe_torch(kt_bench *b) {
    if (!b->torch) {
        snprintf(b->torch_why, sizeof b->torch_why, "--no-torch");
        return;
    }
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "%s -c 'import torch; print(\"torch\", torch.__version__, \"cuda\" if torch.cuda.is_available() else "
             "\"nocuda\")' 2>/dev/null",
             b->python);
    probe p = {{0}};
    int   rc = kt_bench_lines(cmd, probe_line, &p);
    if (rc != 0 || strncmp(p.line, "torch ", 6) != 0)
        snprintf(b->torch_why, sizeof b->torch_why, "no PyTorch in %s", b->python);
    else if (strstr(p.line, " nocuda"))
        snprintf(b->torch_why, sizeof b->torch_why, "PyTorch (%s) sees no GPU", p.line + 6);
    if (b->torch_why[0]) {
        b->torch = false;
        fprintf(stderr, "bench: PyTorch columns skipped: %s\n", b->torch_why);
    } else fprintf(stderr, "bench: beside %s\n", p.line);
}

static kiln_status machine(kt_bench *b) {
    kiln_status st = kiln_device_get_info(0, &b->dev);
    /* 2 GiB each way: 80x the H100's L2, so no copy runs from cache. */
    if (!st) st = kiln_device_copy_bandwidth(0, (size_t)2 << 30, b->quick ? 10 : 30, &b->copy_gbs);
    if (!st)
        fprintf(stderr, "bench: %s (%s, %d SMs): device-to-device copy %.0f GB/s\n", b->dev.name, b->dev.arch,
                b->dev.sm_count, b->copy_gbs);
    return st;
}

static int run(int argc, char **argv) {
    kt_bench b = {.batch_small = 64}; /* kiln serve's default small program */
    int      rc = parse(argc, argv, &b);
    if (rc != KT_GO_ON) return rc;
    double      t0 = kb_now_ms();
    kiln_status st = machine(&b);
    if (st) return kt_fail("bench", st);
    probe_torch(&b);
    kt_bench_op    *ops = NULL;
    kt_bench_model *models = NULL;
    kt_bench_batch *batch = NULL;
    int             nops = 0, nmodels = 0, nbatch = 0;
    if (b.do_ops) st = kt_bench_ops(&b, &ops, &nops);
    if (!st && b.do_models) st = kt_bench_models(&b, &models, &nmodels);
    if (!st && b.do_batch) st = kt_bench_batches(&b, &batch, &nbatch);
    kt_bench_results res = {ops, nops, models, nmodels, batch, nbatch};
    if (!st) {
        kt_bench_print(&b, &res);
        printf("\nkiln bench took %.0f s\n", (kb_now_ms() - t0) / 1e3);
        if (b.json) st = kt_bench_write_json(&b, &res);
        if (!st && b.json) printf("results: %s\n", b.json);
    }
    bool failed = false;
    for (int i = 0; i < nops; i++) failed |= ops[i].err[0] != 0;
    for (int i = 0; i < nmodels; i++) failed |= models[i].err[0] != 0;
    for (int i = 0; i < nbatch; i++) failed |= batch[i].err[0] != 0;
    free(ops);
    free(models);
    free(batch);
    if (st) {
        kt_fail("bench", st);
        return KT_EXIT_ERR; /* a measurement's failure, whatever its cause: the GPU was there */
    }
    if (failed) fputs("kiln bench: some measurements failed (their rows say why)\n", stderr);
    return failed ? KT_EXIT_ERR : KT_EXIT_OK;
}

const kt_cmd kt_cmd_bench = {"bench", summary, help, NULL, run};
