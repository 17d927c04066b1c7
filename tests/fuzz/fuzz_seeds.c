/* fuzz_seeds DIR: writes seed inputs made by this build of kiln into DIR/<target>/ — the
 * committed corpus (tests/fuzz/corpus/) was made with it, and scripts/fuzz.sh runs it again
 * into each scratch corpus, so that seeds whose validity depends on the build (plan
 * fingerprints of the IR, the version in a bundle's signature) stay valid as kiln changes.
 *   fuzz_gguf:   tiny models of every arch (random weights, a synthetic 260-token vocabulary)
 *   fuzz_bundle: a bundle of a small graph for sm_80 (needs NVRTC; skipped with a warning
 *                without it)
 *   fuzz_cache:  plans of fz_plan_graph (code faked: NVRTC is not needed) and the program
 *                and kernel cache entries holding them */
#include "tests/fuzz/fuzz.h"

#include "cache/internal.h"
#include "codegen/codegen.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

static int failed;

static void report(const char *what, kiln_status st) {
    if (!st) return;
    fprintf(stderr, "fuzz_seeds: %s: %s\n", what, kiln_status_msg(st));
    kiln_status_free(st);
    failed = 1;
}

static char *path_of(const char *dir, const char *target, const char *name) {
    char *p = NULL;
    if (asprintf(&p, "%s/%s", dir, target) < 0) return NULL;
    mkdir(p, 0777);
    free(p);
    return asprintf(&p, "%s/%s/%s", dir, target, name) < 0 ? NULL : p;
}

/* A model of arch small enough for a corpus (a few kilobytes of weights), with a vocabulary of
 * kind vocab (SentencePiece needs about 340 tokens: bytes, specials, characters). */
static void write_model(const char *dir, const char *arch, kiln_ftype ftype, kiln_vocab_kind vocab) {
    kiln_model_hparams hp;
    kiln_status st = kiln_model_preset(arch, "tiny", &hp);
    if (!st) {
        hp.n_vocab = vocab == KILN_VOCAB_SPM ? 400 : 260;
        hp.n_ctx_train = 64;
        hp.n_embd = 8;
        hp.n_layer = 1;
        hp.n_head = 2;
        hp.n_head_kv = 1;
        hp.head_dim = 4;
        hp.n_ff = 16;
        if (hp.n_expert) hp.n_expert = 4, hp.n_expert_used = 2, hp.n_ff_exp = 4;
        hp.ftype = ftype;
        char name[64];
        snprintf(name, sizeof name, "tiny-%s-%s%s", arch, kiln_ftype_name(ftype),
                 vocab == KILN_VOCAB_SPM ? "-spm" : ""); /* no .gguf: a seed, not a model to ship */
        char *path = path_of(dir, "fuzz_gguf", name);
        st = path ? kiln_model_write_random_vocab(&hp, 1, vocab, path, NULL, NULL) : kb_oom();
        free(path);
    }
    report(arch, st);
}

static void write_bundle(const char *dir) {
    static const char text[] = "kiln-graph 1\n"
                               "dim n <= 4 specialize 1\n"
                               "input x: f32[16, n]\n"
                               "weight s: f32[16]\n"
                               "m = mul(x, s)\n"
                               "output y = silu(m)\n";
    kiln_ctx *ctx = kiln_ctx_new();
    kiln_graph *g = NULL;
    kiln_status st = kiln_parse(ctx, text, strlen(text), "seed bundle");
    if (!st) st = kiln_graph_new(ctx, &g);
    kiln_compile_opts o = {.cache_mode = KILN_CACHE_OFF, .jobs = 1, .dump_dir = ""};
    const char *arch = "sm_80";
    char *path = path_of(dir, "fuzz_bundle", "small-sm_80.bundle");
    if (!st) st = path ? kiln_bundle_write(g, &o, 1, &arch, path) : kb_oom();
    if (st && kiln_status_code(st) == KILN_ERR_NVRTC) {
        fprintf(stderr, "fuzz_seeds: no bundle seed (NVRTC: %s)\n", kiln_status_msg(st));
        kiln_status_free(st);
        st = NULL;
    }
    report("bundle", st);
    free(path);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

/* Stand-in code for every kernel that launches: plans hold code, and NVRTC is not needed for a
 * reader's seed. */
static kiln_status fake_code(kiln_program *p) {
    for (int i = 0; i < p->nkernels; i++) {
        cg_kernel *k = &p->kernels[i];
        if (k->kind != CG_LAUNCH || k->cubin_borrowed || k->cubin) continue;
        if (!(k->cubin = strdup("fake cubin"))) return kb_oom();
        k->cubin_size = strlen(k->cubin);
    }
    for (int i = 0; i < p->nkernels; i++) {
        cg_kernel *k = &p->kernels[i];
        if (k->cubin_borrowed)
            for (int j = 0; j < i; j++)
                if (!memcmp(p->kernels[j].key, k->key, 16) && !p->kernels[j].cubin_borrowed) {
                    k->cubin = p->kernels[j].cubin;
                    k->cubin_size = p->kernels[j].cubin_size;
                    break;
                }
    }
    for (int i = 0; i < p->nspec; i++) {
        kiln_status st = fake_code(p->spec[i]);
        if (st) return st;
    }
    return NULL;
}

static kiln_status write_bytes(const char *dir, const char *name, const void *data, size_t n) {
    char *path = path_of(dir, "fuzz_cache", name);
    kiln_status st = path ? kb_write_file(path, data, n) : kb_oom();
    free(path);
    return st;
}

/* An entry file as kc_put writes it, copied into the corpus. */
static kiln_status write_entry(const char *dir, const char *name, kc_kind kind, const void *data, size_t n) {
    char tmpl[] = "/tmp/kiln-fuzz-seeds-XXXXXX";
    if (!mkdtemp(tmpl)) return kb_error(KILN_ERR_IO, "mkdtemp: %s", strerror(errno));
    kc_cache c = {.dir = tmpl, .mode = KILN_CACHE_ON};
    kc_key key = {{0x6b, 0x69, 0x6c, 0x6e}};
    kiln_status st = kc_put(&c, kind, key, "graph fz_plan_graph\narch sm_80\n", data, n);
    char *path = kc_entry_path(&c, kind, key);
    char *bytes = NULL;
    size_t len = 0;
    if (!st) st = path ? kb_read_file(path, &bytes, &len) : kb_oom();
    if (!st) st = write_bytes(dir, name, bytes, len);
    free(bytes);
    free(path);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpl);
    if (system(cmd) != 0) fprintf(stderr, "fuzz_seeds: could not remove %s\n", tmpl);
    return st;
}

static void write_plans(const char *dir) {
    kiln_ctx *ctx = kiln_ctx_new();
    kiln_graph *g = NULL;
    kiln_program *p = NULL;
    kb_str plan = {0};
    kiln_compile_opts o = fz_sources_only();
    o.arch = "sm_80";
    kiln_status st = kiln_parse(ctx, fz_plan_graph, strlen(fz_plan_graph), "fz_plan_graph");
    if (!st) st = kiln_graph_new(ctx, &g);
    if (!st) st = kiln_compile(g, &o, &p);
    if (!st) st = fake_code(p);
    if (!st) st = cg_plan_write(p, &plan);
    if (!st && plan.oom) st = kb_oom();
    /* The plan must read back: otherwise the seeds teach the fuzzer nothing. */
    kiln_program *back = NULL;
    kiln_compile_opts ro = {0};
    if (!st) st = cg_plan_read(plan.s, plan.len, g, &ro, &back);
    kiln_program_free(back);
    if (!st) st = write_bytes(dir, "plan-sm_80", plan.s, plan.len);
    if (!st) st = write_entry(dir, "entry-program", KC_PROGRAM, plan.s, plan.len);
    if (!st) st = write_entry(dir, "entry-kernel", KC_CUBIN, "fake cubin", 10);
    report("plans", st);
    kb_str_free(&plan);
    kiln_program_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_seeds DIR\n");
        return 2;
    }
    mkdir(argv[1], 0777);
    write_model(argv[1], "llama", KILN_FTYPE_MOSTLY_BF16, KILN_VOCAB_BPE);
    write_model(argv[1], "llama", KILN_FTYPE_MOSTLY_F16, KILN_VOCAB_SPM);
    write_model(argv[1], "qwen2", KILN_FTYPE_MOSTLY_F16, KILN_VOCAB_BPE);
    write_model(argv[1], "qwen3", KILN_FTYPE_ALL_F32, KILN_VOCAB_BPE);
    write_model(argv[1], "qwen3moe", KILN_FTYPE_MOSTLY_BF16, KILN_VOCAB_BPE);
    write_plans(argv[1]);
    write_bundle(argv[1]);
    return failed;
}
