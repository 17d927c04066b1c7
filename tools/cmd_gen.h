/* kiln gen-graph and gen-model: a model's whole graph as .kg text, or the model with random
 * weights as GGUF (tools/cmd_gen.c). */
#ifndef KILN_TOOLS_CMD_GEN_H
#define KILN_TOOLS_CMD_GEN_H

/* argv[0] is "gen-graph" (or "help", for kiln help gen-graph); returns the process exit status (0 ok, 1 error, 2 bad usage). */
int kiln_cmd_gen_graph(int argc, char **argv);
/* kiln gen-model: argv[0] is "gen-model" (or "help"). */
int kiln_cmd_gen_model(int argc, char **argv);

#endif
