/* kiln bench (tools/cmd_bench.c). */
#ifndef KILN_TOOLS_CMD_BENCH_H
#define KILN_TOOLS_CMD_BENCH_H

/* argv[0] is "bench"; returns the exit status (0 ok, 1 a measurement failed, 2 bad usage, 3 no
 * GPU). */
int         kiln_cmd_bench(int argc, char **argv);
const char *kiln_bench_help(void);

#endif
