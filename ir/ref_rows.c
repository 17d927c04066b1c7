/* CPU reference of the rows family: get_rows, set_rows, concat, pad, add_id. Semantics of ggml's
 * CPU backend (ggml/src/ggml-cpu/ops.cpp: ggml_compute_forward_get_rows_*, _set_rows_f32,
 * _concat, _pad_f32, _add_id_f32). Values are copied bit for bit where ggml copies (same type),
 * converted once where ggml converts (get_rows to f32, set_rows from f32), and add_id adds in
 * f32. An index out of range is an error here, where ggml asserts. */
#include "ir_internal.h"

#include <string.h>

/* Copies element si of src into element di of dst, both of type t, bit for bit. */
static void copy_elem(void *dst, int64_t di, const void *src, int64_t si, kiln_type t) {
    size_t sz = kiln_type_size(t);
    memcpy((char *)dst + (size_t)di * sz, (const char *)src + (size_t)si * sz, sz);
}

/* Element i of an i32 or i64 array. */
static int64_t load_index(const void *p, kiln_type t, int64_t i) {
    return t == KILN_I64 ? ((const int64_t *)p)[i] : ((const int32_t *)p)[i];
}

/* Loops c[1..3] over the rows of ne (c[0] = 0). */
#define FOR_ROWS(c, ne)                                                                            \
    for (c[3] = 0; c[3] < (ne)[3]; c[3]++)                                                         \
        for (c[2] = 0; c[2] < (ne)[2]; c[2]++)                                                     \
            for (c[1] = 0; c[1] < (ne)[1]; c[1]++)

/* dst[:, i10, i11, i12] = f32(a[:, ids[i10, i11, i12], i11, i12]). */
static kiln_status get_rows(const ir_prog *p, const ir_node *n, void **data) {
    const ir_ref *a = ir_operand(n, 0), *ids = ir_operand(n, 1), *d = &n->dst;
    int64_t       c[4] = {0}, ic[4] = {0}, ac[4] = {0};
    FOR_ROWS(c, d->ne) {
        ic[0] = c[1], ic[1] = c[2], ic[2] = c[3];
        int64_t r = load_index(data[ids->buf], ids->type, ir_offset_at(ids, ic));
        if (r < 0 || r >= a->ne[1])
            return kb_error(KILN_ERR_INVALID,
                            "get_rows '%s': ids[%lld, %lld, %lld] = %lld is out of range (the source has "
                            "%lld rows)",
                            ir_node_name(p, n->src[0]), (long long)ic[0], (long long)ic[1],
                            (long long)ic[2], (long long)r, (long long)a->ne[1]);
        ac[1] = r, ac[2] = c[2], ac[3] = c[3];
        for (ac[0] = c[0] = 0; c[0] < d->ne[0]; ac[0] = ++c[0])
            kb_store_f32(data[d->buf], d->type, ir_offset_at(d, c),
                         kb_load_f32(data[a->buf], a->type, ir_offset_at(a, ac)));
        c[0] = 0;
    }
    return NULL;
}

/* dst = a; then, in ggml's order (i03, i02, i), dst[:, ids[i, i02 % ne11, i03 % ne12], i02, i03] =
 * b[:, i, i02, i03] converted to dst's type: the last i naming a row wins. */
static kiln_status set_rows(const ir_prog *p, const ir_node *n, void **data) {
    const ir_ref *a = ir_operand(n, 0), *b = ir_operand(n, 1), *ids = ir_operand(n, 2), *d = &n->dst;
    int64_t       c[4] = {0};
    /* In place (a state: ir/state.c), dst is a itself and keeps its other rows. */
    FOR_ROWS(c, d->ne) {
        for (c[0] = 0; a->buf != d->buf && c[0] < d->ne[0]; c[0]++)
            copy_elem(data[d->buf], ir_offset_at(d, c), data[a->buf], ir_offset_at(a, c), d->type);
        c[0] = 0;
    }
    int64_t bc[4] = {0}, ic[4] = {0};
    for (bc[3] = 0; bc[3] < b->ne[3]; bc[3]++)
        for (bc[2] = 0; bc[2] < b->ne[2]; bc[2]++)
            for (bc[1] = 0; bc[1] < b->ne[1]; bc[1]++) {
                /* ir_offset_at takes each coordinate modulo ids' extent: ggml's broadcast. */
                ic[0] = bc[1], ic[1] = bc[2], ic[2] = bc[3];
                int64_t r = load_index(data[ids->buf], ids->type, ir_offset_at(ids, ic));
                if (r < 0 || r >= d->ne[1])
                    return kb_error(KILN_ERR_INVALID,
                                    "set_rows '%s': ids[%lld, %lld, %lld] = %lld is out of range (the "
                                    "destination has %lld rows)",
                                    ir_node_name(p, n->src[0]), (long long)bc[1],
                                    (long long)(bc[2] % ids->ne[1]), (long long)(bc[3] % ids->ne[2]),
                                    (long long)r, (long long)d->ne[1]);
                c[1] = r, c[2] = bc[2], c[3] = bc[3];
                for (bc[0] = c[0] = 0; c[0] < d->ne[0]; bc[0] = ++c[0])
                    kb_store_f32(data[d->buf], d->type, ir_offset_at(d, c),
                                 kb_load_f32(data[b->buf], b->type, ir_offset_at(b, bc)));
                bc[0] = 0;
            }
    return NULL;
}

/* dst[i] = i[dim] < a.ne[dim] ? a[i] : b[i - a.ne[dim] along dim]. */
static kiln_status concat(const ir_node *n, void **data) {
    const ir_ref *a = ir_operand(n, 0), *b = ir_operand(n, 1), *d = &n->dst;
    int           dim = n->ip[0];
    int64_t       c[4], s[4];
    for (c[3] = 0; c[3] < d->ne[3]; c[3]++)
        for (c[2] = 0; c[2] < d->ne[2]; c[2]++)
            for (c[1] = 0; c[1] < d->ne[1]; c[1]++)
                for (c[0] = 0; c[0] < d->ne[0]; c[0]++) {
                    memcpy(s, c, sizeof s);
                    const ir_ref *src = a;
                    if (c[dim] >= a->ne[dim]) {
                        src = b;
                        s[dim] -= a->ne[dim];
                    }
                    copy_elem(data[d->buf], ir_offset_at(d, c), data[src->buf], ir_offset_at(src, s), d->type);
                }
    return NULL;
}

/* dst[i] = a[i - lp] inside the source's box, 0 outside. */
static kiln_status pad(const ir_node *n, void **data) {
    const ir_ref *a = ir_operand(n, 0), *d = &n->dst;
    int64_t       c[4], s[4];
    for (c[3] = 0; c[3] < d->ne[3]; c[3]++)
        for (c[2] = 0; c[2] < d->ne[2]; c[2]++)
            for (c[1] = 0; c[1] < d->ne[1]; c[1]++)
                for (c[0] = 0; c[0] < d->ne[0]; c[0]++) {
                    bool inside = true;
                    for (int k = 0; k < 4; k++) {
                        s[k] = c[k] - n->ip[2 * k];
                        if (s[k] < 0 || s[k] >= a->ne[k]) inside = false;
                    }
                    if (inside) copy_elem(data[d->buf], ir_offset_at(d, c), data[a->buf], ir_offset_at(a, s), d->type);
                    else kb_store_f32(data[d->buf], d->type, ir_offset_at(d, c), 0.0f);
                }
    return NULL;
}

/* dst[:, i1, i2, i3] = a[:, i1, i2, i3] + b[:, ids[i1, i2]] (b's dims 2 and 3 at 0, as ggml). */
static kiln_status add_id(const ir_prog *p, const ir_node *n, void **data) {
    const ir_ref *a = ir_operand(n, 0), *b = ir_operand(n, 1), *ids = ir_operand(n, 2), *d = &n->dst;
    int64_t       c[4] = {0}, ic[4] = {0}, bc[4] = {0};
    FOR_ROWS(c, d->ne) {
        ic[0] = c[1], ic[1] = c[2];
        int64_t e = load_index(data[ids->buf], ids->type, ir_offset_at(ids, ic));
        if (e < 0 || e >= b->ne[1])
            return kb_error(KILN_ERR_INVALID,
                            "add_id '%s': ids[%lld, %lld] = %lld is out of range (the bias has %lld rows)",
                            ir_node_name(p, n->src[0]), (long long)ic[0], (long long)ic[1], (long long)e,
                            (long long)b->ne[1]);
        bc[1] = e;
        for (bc[0] = c[0] = 0; c[0] < d->ne[0]; bc[0] = ++c[0]) {
            float v = kb_load_f32(data[a->buf], a->type, ir_offset_at(a, c)) +
                      kb_load_f32(data[b->buf], b->type, ir_offset_at(b, bc));
            kb_store_f32(data[d->buf], d->type, ir_offset_at(d, c), v);
        }
        c[0] = 0;
    }
    return NULL;
}

kiln_status ir_ref_rows(const ir_prog *p, const ir_node *n, void **data) {
    switch (n->op) {
    case FE_OP_GET_ROWS: return get_rows(p, n, data);
    case FE_OP_SET_ROWS: return set_rows(p, n, data);
    case FE_OP_CONCAT: return concat(n, data);
    case FE_OP_PAD: return pad(n, data);
    case FE_OP_ADD_ID: return add_id(p, n, data);
    default:
        return kb_error(KILN_ERR_INVALID, "reference: %s is not an op of the rows family", fe_ops[n->op].name);
    }
}
