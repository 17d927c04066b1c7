/* CPU reference of the sample family: sample. It is kiln_sample itself (model/sampler.c, the
 * specification of docs/sampling.md) with no history, so no penalties: the op and the host
 * sampler cannot drift apart. The row is copied out of its layout (it may be strided); the
 * pick's position is the last of pos plus one (frontend/infer_sample.c). */
#include "ir_internal.h"

#include <stdlib.h>

/* The op's parameters as kiln_sampler_params, the penalties off. */
static kiln_sampler_params node_params(const ir_node *n) {
    kiln_sampler_params sp = kiln_sampler_params_default();
    sp.seed = (uint64_t)(uint32_t)n->ip[1] << 32 | (uint32_t)n->ip[0];
    sp.top_k = n->ip[2];
    sp.temp = n->fp[0], sp.top_p = n->fp[1], sp.min_p = n->fp[2];
    sp.repeat_penalty = 1.0f, sp.presence_penalty = 0.0f, sp.frequency_penalty = 0.0f;
    return sp;
}

kiln_status ir_ref_sample(const ir_prog *p, const ir_node *n, void **data) {
    (void)p;
    const ir_ref *a = ir_operand(n, 0), *pos = ir_operand(n, 1);
    if (!a || !pos || n->op != FE_OP_SAMPLE)
        return kb_error(KILN_ERR_INVALID, "reference: %s is not a sample node with its operands", fe_ops[n->op].name);
    int64_t nv = a->ne[0];
    float  *row = malloc((size_t)nv * sizeof *row);
    if (!row) return kb_oom();
    for (int64_t i = 0; i < nv; i++) row[i] = kb_load_f32(data[a->buf], a->type, a->offs + i * a->st[0]);
    int32_t             last = ((const int32_t *)data[pos->buf])[pos->offs + (pos->ne[0] - 1) * pos->st[0]];
    kiln_sampler_params sp = node_params(n);
    int32_t             tok = 0;
    kiln_status         st = NULL;
    if (last < -1)
        st = kb_error(KILN_ERR_INVALID, "sample: the last position is %d: the pick's position %lld is negative",
                      (int)last, (long long)last + 1);
    if (!st) st = kiln_sample(&sp, row, nv, NULL, 0, (int64_t)last + 1, &tok);
    free(row);
    if (!st) ((int32_t *)data[n->dst.buf])[n->dst.offs] = tok;
    return st;
}
