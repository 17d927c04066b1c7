/* `kiln cache explain GRAPH`: a placeholder until the program cache lands (issue 7); the lead
 * replaces this file. */
#include "tools/cmd_cache.h"

#include <stdio.h>

int kiln_cmd_cache_explain(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "kiln cache explain: not implemented yet\n");
    return 1;
}
