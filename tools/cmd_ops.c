/* kiln ops: the op table (kiln_describe_ops). */
#include "tools/cmd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char summary[] =
    "  ops             list every supported op with its kind and accepted types\n";

static const char help[] =
    "usage: kiln ops\n"
    "  lists every op kiln compiles, one per line: its name in .kg, its kind (view, unary,\n"
    "  binary, glu, copy or kernel), the tensor types it accepts and how a .kg line calls it,\n"
    "  e.g. \"permute  view  f32 f16 bf16 i32 i64  permute(a, ax0, ax1, ax2, ax3)\". An op not\n"
    "  listed is refused by the parser, by name. Needs neither NVRTC nor a GPU.\n";

static int run(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) return kt_print_help("ops");
    if (argc > 1) return kt_usage("ops", "unexpected argument '%s'", argv[1]);
    char       *text;
    kiln_status st = kiln_describe_ops(&text);
    if (st) return kt_fail(NULL, st);
    fputs(text, stdout);
    free(text);
    return KT_EXIT_OK;
}

const kt_cmd kt_cmd_ops = {"ops", summary, help, NULL, run};
