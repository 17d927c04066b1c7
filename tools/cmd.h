/* The kiln command's commands: one table (tools/cmd.c), one exit-code convention. Prefix kt_.
 *
 * Each command lives in a file of its own (tools/cmd_NAME.c) that defines its row,
 *
 *     const kt_cmd kt_cmd_ops = {"ops", summary, help, NULL, run};
 *
 * and tools/cmd.c lists the row once (KT_COMMANDS). main (tools/main.c) dispatches through
 * the table; 'kiln help', 'kiln help NAME' and 'kiln NAME --help' print from it. Adding a
 * command is that file and one word in KT_COMMANDS. */
#ifndef KILN_TOOLS_CMD_H
#define KILN_TOOLS_CMD_H

#include "kiln.h"

#include "base/base.h"

#include <stdio.h>

/* What every command exits with ('kiln help' says it: kt_exit_text). */
typedef enum {
    KT_EXIT_OK = 0,     /* success */
    KT_EXIT_ERR = 1,    /* an error: a file, a graph, a compile, a failed check */
    KT_EXIT_USAGE = 2,  /* bad usage: an unknown command or option, a value out of range */
    KT_EXIT_NO_GPU = 3, /* no CUDA driver or GPU (a KILN_ERR_NO_GPU status) */
} kt_exit;

/* Not an exit status: what a command's option parser returns when the command goes on (it
 * returns a kt_exit when it is done: help printed, or a usage error). */
#define KT_GO_ON (-1)

/* The line of 'kiln help' that documents kt_exit. */
extern const char kt_exit_text[];

typedef struct {
    const char *name;    /* kiln NAME */
    const char *summary; /* its lines under "commands:" in 'kiln help' */
    const char *help;    /* 'kiln help NAME' and 'kiln NAME --help' */
    void (*help_more)(void); /* printed after help: what the library lists (passes, presets); or NULL */
    int (*run)(int argc, char **argv); /* argv[0] is NAME; returns a kt_exit */
} kt_cmd;

/* Every command, in the order 'kiln help' lists them; NULL ends it. */
extern const kt_cmd *const kt_cmds[];

/* The row named name, or NULL. */
const kt_cmd *kt_cmd_find(const char *name);

/* 'kiln help': what kiln is, every command's summary, the environment and kt_exit_text
 * (tools/cmd_help.c). */
void kt_print_usage(FILE *f);

/* Prints command name's help (help, then help_more) to stdout; KT_EXIT_OK. name must be in
 * the table. */
int kt_print_help(const char *name);

/* Prints "kiln: MESSAGE" ("kiln CMD: MESSAGE" when cmd is not NULL) to stderr, frees st and
 * returns the exit status of st: KT_EXIT_NO_GPU for KILN_ERR_NO_GPU, else KT_EXIT_ERR. */
int kt_fail(const char *cmd, kiln_status st);

/* kt_flag_usage (tools/flag.h), returning KT_EXIT_USAGE. */
int kt_usage(const char *cmd, const char *fmt, ...) KB_PRINTF(2, 3);

#endif
