/* fuzz_bundle: the AOT bundle reader (codegen/bundle.c): kiln_bundle_open, then
 * kiln_bundle_describe (every program read against the bundle's graph) and
 * kiln_bundle_program for a few GPUs. The input goes through as it is (the checksum check), and
 * once more with its last 20 bytes replaced by the right checksum, so that mutations reach the
 * sections, the signature and the programs behind it. */
#include "tests/fuzz/fuzz.h"

#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

static void read_bundle(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fz_memfd(data, size, path);
    if (fd < 0) return;
    kiln_bundle *b = NULL;
    char *text = NULL;
    kiln_status st = kiln_bundle_open(path, &b);
    if (!st) st = kiln_bundle_describe(b, &text);
    (void)kiln_status_msg(st);
    fz_drop(st);
    free(text);
    if (b) {
        (void)kiln_bundle_graph_text(b);
        kiln_ctx *ctx = kiln_ctx_new();
        kiln_graph *g = NULL;
        const char *gt = kiln_bundle_graph_text(b);
        st = ctx ? kiln_parse(ctx, gt, strlen(gt), "bundle graph") : NULL;
        if (!st && ctx) st = kiln_graph_new(ctx, &g);
        static const char *const devs[] = {"sm_80", "sm_90", "sm_100", "sm_75"};
        for (int i = 0; !st && i < 4; i++) {
            kiln_program *p = NULL;
            fz_drop(kiln_bundle_program(b, g, devs[i], &p));
            kiln_program_free(p);
        }
        fz_drop(st);
        kiln_graph_free(g);
        kiln_ctx_free(ctx);
    }
    kiln_bundle_free(b);
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    read_bundle(data, size);
    if (size < 20 + 16) return 0;
    uint8_t *fixed = malloc(size);
    if (!fixed) return 0;
    memcpy(fixed, data, size);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(fixed, size - 20));
    memcpy(fixed + size - 20, "SUM ", 4);
    memcpy(fixed + size - 16, c.digest, 16);
    if (memcmp(fixed, data, size) != 0) read_bundle(fixed, size);
    free(fixed);
    return 0;
}
