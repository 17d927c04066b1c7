/* kiln help [COMMAND]: what kiln is and its commands (each row's summary, tools/cmd.c), or one
 * command's help. */
#include "tools/cmd.h"

#include <stdio.h>
#include <string.h>

static const char usage_head[] =
    "usage: kiln COMMAND [OPTIONS] GRAPH\n"
    "\n"
    "kiln compiles ggml-style compute graphs (.kg text, see docs/graph-format.md) into\n"
    "specialized CUDA kernels, caches them, and runs them as one CUDA graph.\n"
    "\n"
    "commands:\n";

/* The argument the commands before it take; help, which takes none, comes after. */
static const char graph_note[] =
    "\n"
    "GRAPH is a .kg file or, for compile and inspect, a GGUF model (its whole graph, built from\n"
    "its hyperparameters; --n-ctx N, at most the model's training context, and --n-batch N, at\n"
    "most n_ctx, size the cache and the batch).\n";

static const char usage_tail[] =
    "\n"
    "Symbolic dims (\"dim n_kv <= 4096\" in the graph) are compiled once for every value; give\n"
    "values with --dim NAME=VALUE (default: the maximum).\n"
    "\n"
    "options: --version, --help. Environment: KILN_CACHE_DIR (the cache, default\n"
    "$XDG_CACHE_HOME/kiln or ~/.cache/kiln), KILN_CACHE=on|off|readonly|refresh (cache policy),\n"
    "KILN_CACHE_MAX=SIZE (default 2G; least recently used entries go first), KILN_JOBS=N\n"
    "(compile threads, default all CPUs), KILN_DUMP=DIR (like --dump-cu), KILN_TEMPLATE_DIR\n"
    "(load templates from a directory), KILN_CUDA_GRAPHS=0 (plain launches), KILN_PDL=0 (no\n"
    "programmatic dependent launch), KILN_CHAIN=0 (decode one step at a time: each token read on\n"
    "the host before the next step), KILN_PROFILE=1 (time per kernel, printed at exit;\n"
    "KILN_PROFILE_SKIP=N leaves each program's first N runs out).\n";

static const char summary[] = "  help [COMMAND]  this text, or a command's options\n";

static const char help[] =
    "usage: kiln help [COMMAND]\n"
    "  without COMMAND, what kiln is and its commands; with one, that command's options:\n";

extern const kt_cmd kt_cmd_help; /* this file's row, at its end */

/* Every command's summary, the note on GRAPH after those that take one, then help's. */
void kt_print_usage(FILE *f) {
    fputs(usage_head, f);
    for (const kt_cmd *const *c = kt_cmds; *c; c++)
        if (*c != &kt_cmd_help) fputs((*c)->summary, f);
    fputs(graph_note, f);
    fputs(kt_cmd_help.summary, f);
    fputs(usage_tail, f);
    fputs(kt_exit_text, f);
}

/* The commands 'kiln help COMMAND' knows, from the table. */
static void help_more(void) {
    fputs("  ", stdout);
    for (const kt_cmd *const *c = kt_cmds; *c; c++) printf("%s%s", (*c)->name, c[1] ? ", " : ".\n");
    fputs("  'kiln COMMAND --help' prints the same.\n", stdout);
}

static int run(int argc, char **argv) {
    const char *name = argc > 1 ? argv[1] : NULL;
    if (!name) {
        kt_print_usage(stdout);
        return KT_EXIT_OK;
    }
    if (!strcmp(name, "--help") || !strcmp(name, "-h")) name = "help";
    if (!kt_cmd_find(name)) return kt_usage(NULL, "no help for unknown command '%s'", name);
    return kt_print_help(name);
}

const kt_cmd kt_cmd_help = {"help", summary, help, help_more, run};
