/* kiln run MODEL.gguf: generation with a GGUF model (tools/cmd_model.c); part of the run
 * command (tools/cmd_run.c), which hands it a command line naming a GGUF file. */
#ifndef KILN_TOOLS_CMD_MODEL_H
#define KILN_TOOLS_CMD_MODEL_H

#include <stdbool.h>

/* 'kiln run MODEL.gguf --help', and the end of 'kiln help run'. */
extern const char kt_run_model_help[];
/* Whether option arg of a model run takes a value (the next argument). */
bool kt_run_model_takes_value(const char *arg);
/* -m/--model (llama.cpp's): its value is the model, so `kiln run -m FILE.gguf` is a model run. */
bool kt_run_model_path_flag(const char *arg);
/* argv[0] is "run"; returns a kt_exit (tools/cmd.h). */
int  kt_run_model(int argc, char **argv);

#endif
