/* `kiln cache SUB`: listing, statistics, clearing, verifying and evicting the on-disk cache
 * (tools/cmd_cache.c), and `kiln cache explain` (tools/cmd_cache_explain.c). */
#ifndef KILN_CMD_CACHE_H
#define KILN_CMD_CACHE_H

/* The text of `kiln help cache`. */
extern const char kiln_cache_help[];

/* `kiln cache ...`: argv is main's (argv[1] is "cache", argv[2] the subcommand). Returns the
 * process exit status: 0 success, 1 error (or bad entries found by verify), 2 bad usage. */
int kiln_cmd_cache(int argc, char **argv);

/* `kiln cache explain GRAPH [options]`, with main's argv (argv[2] is "explain"). */
int kiln_cmd_cache_explain(int argc, char **argv);

#endif
