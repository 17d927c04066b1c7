/* kiln chat MODEL.gguf: a conversation, as 'kiln run MODEL.gguf -cnv' (tools/cmd_model.c). */
#include "tools/cmd.h"
#include "tools/cmd_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char summary[] =
    "  chat MODEL.gguf talk with a model: lines of stdin are user messages, replies stream on\n"
    "                  stdout, rendered with the model's chat template ('kiln run MODEL -cnv')\n";

static const char help[] =
    "usage: kiln chat MODEL.gguf [-sys TEXT] [--chat-template NAME] [-n N] [-c N] [run options]\n"
    "  the same as 'kiln run MODEL.gguf -cnv': each line of stdin is a user message (-p TEXT, if\n"
    "  given, is the first), each reply streams on stdout until the model ends its turn (or -n N\n"
    "  tokens); everything else goes to stderr. The KV cache keeps the conversation, so each\n"
    "  turn evaluates only its new tokens. End the conversation with end of input (Ctrl-D).\n"
    "  The options are kiln run's for a model ('kiln help run').\n";

static int chat(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return kt_print_help("chat");
    char **args = malloc(sizeof *args * (size_t)(argc + 2));
    if (!args) return kt_fail("chat", kb_oom());
    memcpy(args, argv, sizeof *args * (size_t)argc);
    args[argc] = "-cnv";
    args[argc + 1] = NULL;
    int rc = kt_run_model(argc + 1, args);
    free(args);
    return rc;
}

const kt_cmd kt_cmd_chat = {"chat", summary, help, NULL, chat};
