/* fuzz_cache: cache entries and program plans.
 * - The bytes as a cache entry file (kc_check, cache/store.c: header, format versions, meta,
 *   payload, checksums), for both kinds, under the key the header names.
 * - The same bytes with the header's checksums recomputed (XXH3 of the meta, the payload and
 *   the header), so that mutations reach the length and body checks behind them; a valid
 *   program entry's payload then goes to the plan reader.
 * - Bytes that start as a plan ("KILNPLAN") straight to cg_plan_read (codegen/plan.c), read
 *   against fz_plan_graph, the graph fuzz_seeds wrote the plans for. */
#include "tests/fuzz/fuzz.h"

#include "cache/internal.h"
#include "codegen/codegen.h"

#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* The graph plans are read against: built once, kept for the process. */
static const kiln_graph *plan_graph(void) {
    static kiln_ctx *ctx;
    static kiln_graph *g;
    if (g || ctx) return g;
    ctx = kiln_ctx_new();
    kiln_status st = kiln_parse(ctx, fz_plan_graph, strlen(fz_plan_graph), "fz_plan_graph");
    if (!st) st = kiln_graph_new(ctx, &g);
    if (st) {
        fprintf(stderr, "fuzz_cache: fz_plan_graph: %s\n", kiln_status_msg(st));
        abort(); /* the harness's own graph: not a finding in kiln */
    }
    return g;
}

static void read_plan(const uint8_t *data, size_t size) {
    kiln_compile_opts o = {0};
    kiln_program *p = NULL;
    kiln_status st = cg_plan_read(data, size, plan_graph(), &o, &p);
    (void)kiln_status_msg(st);
    fz_drop(st);
    if (p) {
        char *text = NULL;
        fz_drop(kiln_program_describe(p, &text));
        free(text);
        for (int i = 0; i <= kiln_program_kernel_count(p); i++) {
            (void)kiln_program_kernel_source(p, i);
            (void)kiln_program_kernel_name(p, i);
        }
    }
    kiln_program_free(p);
}

/* kc_check for each kind, keyed by the header's own key field; the payload of a valid program
 * entry to the plan reader. */
static void check_entry(const uint8_t *buf, size_t len) {
    kc_key key = {{0}};
    if (len >= 40) memcpy(key.b, buf + 24, 16);
    for (int kind = KC_CUBIN; kind <= KC_PROGRAM; kind++) {
        kc_parsed p;
        const char *reason;
        char rbuf[256];
        kc_verdict v = kc_check(buf, len, (kc_kind)kind, key, &p, &reason, rbuf, sizeof rbuf);
        if (v == KC_CORRUPT && reason) (void)strlen(reason);
        if (v == KC_VALID && p.meta_len) (void)memchr(p.meta, '\n', p.meta_len);
        if (v == KC_VALID && kind == KC_PROGRAM) read_plan(p.payload, p.payload_len);
    }
}

static void wr64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t rd64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* The entry with its checksums made right for the lengths its header states (clamped to what
 * follows the header). */
static void check_fixed(const uint8_t *data, size_t size) {
    if (size < KC_HEADER_SIZE) return;
    uint8_t *buf = malloc(size);
    if (!buf) return;
    memcpy(buf, data, size);
    size_t have = size - KC_HEADER_SIZE;
    uint64_t mlen = rd64(buf + 40);
    if (mlen > have) mlen = have;
    uint64_t plen = have - mlen;
    wr64(buf + 56, XXH3_64bits(buf + KC_HEADER_SIZE, (size_t)mlen));
    wr64(buf + 64, XXH3_64bits(buf + KC_HEADER_SIZE + mlen, (size_t)plen));
    wr64(buf + 72, XXH3_64bits(buf, 72));
    if (memcmp(buf, data, size) != 0) check_entry(buf, size);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size >= 8 && memcmp(data, "KILNPLAN", 8) == 0) {
        read_plan(data, size);
        return 0;
    }
    check_entry(data, size);
    check_fixed(data, size);
    return 0;
}
