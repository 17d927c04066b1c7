/* kiln: the command-line driver. Finds the command in the table (tools/cmd.c) and runs it. */
#include "kiln.h"

#include "tools/cmd.h"
#include "tools/flag.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        kt_print_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? KT_EXIT_USAGE : KT_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("kiln %s\n", KILN_VERSION);
        return KT_EXIT_OK;
    }
    /* The library ignores a KILN_JOBS it cannot use (it takes every CPU); the command says so.
     * Help reads nothing of the environment. */
    const char *jobs = getenv("KILN_JOBS");
    int         njobs;
    if (strcmp(argv[1], "help") && jobs && *jobs &&
        !kt_flag_int32(argv[1], "KILN_JOBS", jobs, 1, KT_FLAG_MAX_JOBS, &njobs))
        return KT_EXIT_USAGE;
    const kt_cmd *cmd = kt_cmd_find(argv[1]);
    if (!cmd) return kt_usage(NULL, "unknown command '%s'", argv[1]);
    return cmd->run(argc - 1, argv + 1);
}
