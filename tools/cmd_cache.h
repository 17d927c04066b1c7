/* `kiln cache explain` (tools/cmd_cache_explain.c), a subcommand of `kiln cache`
 * (tools/cmd_cache.c). Prefix kt_. */
#ifndef KILN_TOOLS_CMD_CACHE_H
#define KILN_TOOLS_CMD_CACHE_H

/* `kiln cache explain GRAPH [options]`: argv[0] is "cache", argv[1] "explain". Returns a
 * kt_exit (tools/cmd.h). */
int kt_cache_explain(int argc, char **argv);

#endif
