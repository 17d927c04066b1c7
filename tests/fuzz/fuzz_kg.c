/* fuzz_kg: the .kg parser and printer round trip. Any text: kiln_parse returns a status. Text
 * that parses prints; the printed text must parse again and print byte-identically
 * (print(parse(print(g))) == print(g), kiln.h) — a mismatch traps: that is a finding. */
#include "tests/fuzz/fuzz.h"

#include <string.h>

/* Parses text into a new context and prints it: *out (caller frees) or NULL when it does not
 * parse. */
static kiln_ctx *parse_print(const char *text, size_t len, char **out) {
    *out = NULL;
    kiln_ctx *ctx = kiln_ctx_new();
    if (!ctx) return NULL;
    kiln_status st = kiln_parse(ctx, text, len, "fuzz.kg");
    if (!st) st = kiln_print(ctx, out);
    if (st) {
        (void)kiln_status_msg(st);
        fz_drop(st);
        kiln_ctx_free(ctx);
        return NULL;
    }
    return ctx;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *first = NULL, *second = NULL;
    kiln_ctx *a = parse_print((const char *)data, size, &first);
    if (!a) return 0;
    /* The graph of what parsed (may fail: no outputs) — walked by kiln_graph_new's checks. */
    kiln_graph *g = NULL;
    fz_drop(kiln_graph_new(a, &g));
    kiln_graph_free(g);
    kiln_ctx *b = parse_print(first, strlen(first), &second);
    if (!b || strcmp(first, second) != 0) {
        fprintf(stderr, "round trip failed: the printed text %s\n--- printed:\n%s\n--- printed again:\n%s\n",
                b ? "prints differently" : "does not parse", first, second ? second : "(none)");
        __builtin_trap();
    }
    free(first);
    free(second);
    kiln_ctx_free(a);
    kiln_ctx_free(b);
    return 0;
}
