/* The options of kiln gen-graph and gen-model (tools/gen_args.h). */
#include "tools/gen_args.h"

#include "tools/cmd.h"
#include "tools/flag.h"

#include <stdio.h>
#include <string.h>

void kt_gen_print_presets(void) {
    printf("presets:\n");
    const char *name, *arch;
    for (int i = 0; (name = kiln_model_preset_name(i, &arch)); i++) printf("  %-16s %s\n", name, arch);
}

static int parse_count(const char *cmd, const char *opt, const char *v, int64_t *out) {
    return kt_flag_int(cmd, opt, v, 1, KT_FLAG_MAX_CTX, out) ? KT_GO_ON : KT_EXIT_USAGE;
}

int kt_gen_parse(int argc, char **argv, kt_gen_args *g) {
    g->cmd = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return kt_print_help(g->cmd);
        bool model = !strcmp(g->cmd, "gen-model");
        bool takes = !strcmp(a, "--arch") || !strcmp(a, "--preset") || !strcmp(a, "-o") ||
                     (!model && (!strcmp(a, "--n-ctx") || !strcmp(a, "--n-tokens") || !strcmp(a, "--outputs"))) ||
                     (model && (!strcmp(a, "--seed") || !strcmp(a, "--type") || !strcmp(a, "--vocab")));
        if (!takes) return kt_usage(g->cmd, "unknown argument '%s'", a);
        if (!v) return kt_usage(g->cmd, "option %s needs a value", a);
        i++;
        int rc = KT_GO_ON;
        if (!strcmp(a, "--arch")) g->arch = v;
        else if (!strcmp(a, "--preset")) g->preset = v;
        else if (!strcmp(a, "-o")) g->out = v;
        else if (!strcmp(a, "--type")) g->type = v;
        else if (!strcmp(a, "--vocab") && (!strcmp(v, "bpe") || !strcmp(v, "spm")))
            g->vocab = !strcmp(v, "spm") ? KILN_VOCAB_SPM : KILN_VOCAB_BPE;
        else if (!strcmp(a, "--vocab")) return kt_usage(g->cmd, "--vocab wants bpe or spm, got '%s'", v);
        else if (!strcmp(a, "--seed")) rc = kt_flag_uint(g->cmd, a, v, UINT64_MAX, &g->seed) ? KT_GO_ON : KT_EXIT_USAGE;
        else if (!strcmp(a, "--n-ctx")) rc = parse_count(g->cmd, a, v, &g->opts.n_ctx);
        else if (!strcmp(a, "--n-tokens")) rc = parse_count(g->cmd, a, v, &g->opts.n_tokens_max);
        else if (!strcmp(v, "last")) g->opts.outputs = KILN_OUTPUTS_LAST;
        else if (!strcmp(v, "all")) g->opts.outputs = KILN_OUTPUTS_ALL;
        else return kt_usage(g->cmd, "--outputs wants last or all, got '%s'", v);
        if (rc != KT_GO_ON) return rc;
    }
    if (!g->preset) return kt_usage(g->cmd, "no --preset given");
    if (g->opts.n_ctx && g->opts.n_tokens_max > g->opts.n_ctx)
        return kt_usage(g->cmd, "--n-tokens %lld: a batch must fit in the context, --n-ctx %lld",
                        (long long)g->opts.n_tokens_max, (long long)g->opts.n_ctx);
    if (!strcmp(g->cmd, "gen-model") && !g->out) return kt_usage(g->cmd, "no -o FILE.gguf given");
    return KT_GO_ON;
}
