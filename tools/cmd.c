/* The command table and what every command shares: help, failures, usage errors (tools/cmd.h). */
#include "tools/cmd.h"

#include "tools/flag.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Every command, one word each, in the order 'kiln help' lists them: the row kt_cmd_NAME is
 * defined in tools/cmd_NAME.c. */
#define KT_COMMANDS(X) X(compile) X(run) X(chat) X(serve) X(inspect) X(cache) X(ops) X(gen_graph) X(gen_model) X(bench) X(help)

#define KT_DECLARE(name) extern const kt_cmd kt_cmd_##name;
KT_COMMANDS(KT_DECLARE)
#define KT_ROW(name) &kt_cmd_##name,
const kt_cmd *const kt_cmds[] = {KT_COMMANDS(KT_ROW) NULL};

const char kt_exit_text[] = "exit status: 0 success, 1 error, 2 bad usage, 3 no CUDA driver or GPU.\n";

const kt_cmd *kt_cmd_find(const char *name) {
    for (const kt_cmd *const *c = kt_cmds; *c; c++)
        if (!strcmp((*c)->name, name)) return *c;
    return NULL;
}

int kt_print_help(const char *name) {
    const kt_cmd *c = kt_cmd_find(name);
    fputs(c->help, stdout);
    if (c->help_more) c->help_more();
    return KT_EXIT_OK;
}

int kt_fail(const char *cmd, kiln_status st) {
    int code = kiln_status_code(st) == KILN_ERR_NO_GPU ? KT_EXIT_NO_GPU : KT_EXIT_ERR;
    if (cmd) fprintf(stderr, "kiln %s: %s\n", cmd, kiln_status_msg(st));
    else fprintf(stderr, "kiln: %s\n", kiln_status_msg(st));
    kiln_status_free(st);
    return code;
}

int kt_usage(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kt_flag_vusage(cmd, fmt, ap);
    va_end(ap);
    return KT_EXIT_USAGE;
}
