/* fuzz_compile: parse -> lower -> passes -> codegen, without NVRTC: kiln_compile with
 * skip_nvrtc (as kiln inspect runs it: every template instantiated to CUDA source, no cache),
 * then the program described. Inputs are bounded so that one execution stays fast: text up to
 * -max_len, at most FZ_MAX_NODES graph nodes and FZ_MAX_SPECS specialized variants (each
 * variant is a whole compile of its own). */
#include "tests/fuzz/fuzz.h"

#include "frontend/frontend.h"

#include <string.h>

#define FZ_MAX_NODES 48
#define FZ_MAX_SPECS 2

static bool small_enough(const kiln_ctx *ctx, const kiln_graph *g) {
    int specs = 0;
    for (int d = 0; d < ctx->ndims; d++) specs += ctx->dims[d].nspec;
    return kiln_graph_size(g) <= FZ_MAX_NODES && specs <= FZ_MAX_SPECS;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_ctx *ctx = kiln_ctx_new();
    kiln_graph *g = NULL;
    kiln_program *p = NULL;
    if (!ctx) return 0;
    kiln_status st = kiln_parse(ctx, (const char *)data, size, "fuzz.kg");
    if (!st) st = kiln_graph_new(ctx, &g);
    if (!st && small_enough(ctx, g)) {
        kiln_compile_opts o = fz_sources_only();
        /* The fusion passes on, or (by the input's first byte) off, or all but one. */
        int pick = size ? data[0] % 4 : 0;
        const char *what;
        o.no_fuse = pick == 1;
        if (pick >= 2) o.no_fuse_passes = kiln_fusion_pass((size ? data[size - 1] : 0) % 8, &what);
        st = kiln_compile(g, &o, &p);
        char *text = NULL;
        if (!st) st = kiln_program_describe(p, &text);
        free(text);
        for (int i = 0; !st && i < kiln_program_kernel_count(p); i++) {
            (void)strlen(kiln_program_kernel_source(p, i));
            (void)kiln_program_kernel_key(p, i);
        }
        (void)kiln_program_io_bytes(p);
    }
    (void)kiln_status_msg(st);
    fz_drop(st);
    kiln_program_free(p);
    kiln_graph_free(g);
    kiln_ctx_free(ctx);
    return 0;
}
