/* CPU reference of the sort family: argsort, argsort_top_k, top_k.
 *
 * ggml's CPU backend (ggml/src/ggml-cpu/ops.cpp) argsorts each row with std::sort comparing
 * a[i] < a[j] (asc) or a[i] > a[j] (desc), which leaves the order of equal values unspecified,
 * and computes top_k with std::partial_sort, then swaps the first two results "to emphasize
 * that the order is not important". kiln pins one order for all three, so the GPU can be held
 * to exact equality:
 *  - values compare as f32 numbers (-0 equals +0), NaN above +inf;
 *  - equal values keep their index order (a stable sort), in both directions;
 *  - argsort_top_k and top_k are the first k of the descending argsort.
 * Each element gets a 64-bit key that orders like that when compared as an unsigned integer:
 * the high half the value's order-preserving bit pattern (complemented for desc), the low half
 * the index. The generated kernels build the same key (templates/sort.lua). */
#include "ir_internal.h"

#include <stdlib.h>
#include <string.h>

/* The order-preserving 32-bit pattern of v: unsigned comparison of patterns orders values as
 * numbers, with -0 == +0 and every NaN above +inf. */
static uint32_t value_key(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu; /* NaN */
    if (u == 0x80000000u) u = 0;                              /* -0 -> +0 */
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static int cmp_u64(const void *x, const void *y) {
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

kiln_status ir_ref_sort(const ir_prog *p, const ir_node *n, void **data) {
    (void)p;
    const ir_ref *a = ir_operand(n, 0);
    if (!a) return kb_error(KILN_ERR_INVALID, "reference: %s without an operand", fe_ops[n->op].name);
    bool    desc = n->op == FE_OP_ARGSORT ? n->ip[0] == 1 : true;
    int64_t len = a->ne[0], keep = n->dst.ne[0];
    uint64_t *keys = malloc((size_t)len * sizeof *keys);
    if (!keys) return kb_oom();
    int32_t *out = data[n->dst.buf];
    int64_t  c[4] = {0, 0, 0, 0}, row = 0;
    for (c[3] = 0; c[3] < a->ne[3]; c[3]++)
        for (c[2] = 0; c[2] < a->ne[2]; c[2]++)
            for (c[1] = 0; c[1] < a->ne[1]; c[1]++, row++) {
                for (int64_t i = 0; i < len; i++) {
                    c[0] = i;
                    uint32_t k = value_key(kb_load_f32(data[a->buf], a->type, ir_offset_at(a, c)));
                    if (desc) k = ~k;
                    keys[i] = (uint64_t)k << 32 | (uint64_t)i;
                }
                c[0] = 0;
                /* Keys are distinct (the index is part of each), so any sort gives one order. */
                qsort(keys, (size_t)len, sizeof *keys, cmp_u64);
                int64_t base = n->dst.offs + row * keep; /* dst is its own contiguous buffer */
                for (int64_t i = 0; i < keep; i++) out[base + i] = (int32_t)(keys[i] & 0xffffffffu);
            }
    free(keys);
    return NULL;
}
