/* kiln run MODEL.gguf: generation with a GGUF model (tools/cmd_model.c). */
#ifndef KILN_TOOLS_CMD_MODEL_H
#define KILN_TOOLS_CMD_MODEL_H

#include <stdbool.h>

extern const char *kiln_run_model_help;
/* argv[0] is "run"; returns the exit status (0 ok, 1 error, 2 bad usage, 3 no GPU). */
int  kiln_cmd_run_model(int argc, char **argv);

#endif
