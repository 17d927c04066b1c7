/* Shape and type rule of the sample family (see frontend/infer.h): sample.
 *
 * sample(a, pos, seed_lo, seed_hi, temp, top_k, top_p, min_p) picks one token from one row of
 * logits with kiln's sampler (docs/sampling.md) — kiln_sample without penalties — and gives it
 * as i32 [1]. a is f32 [n_vocab] (one row: ne1 = ne2 = ne3 = 1); pos is i32 [n] (n may be
 * symbolic), the positions of the tokens that produced the logits, so the pick's position, the
 * draw's Philox counter, is pos[n - 1] + 1 (a model's inp_pos: the pick follows its last token).
 * The seed is the two 32-bit halves of kiln_sampler_params.seed (op parameters are int32). The
 * parameters get kiln_sampler_check's ranges and messages. Whether a GPU kernel exists for a
 * top_k is codegen's business (templates/sample.lua), not the graph's. */
#include "infer.h"

#include <stdint.h>

bool fe_infer_SAMPLE(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    const kiln_tensor *x = a->t[0], *pos = a->t[1];
    if (x->type != KILN_F32)
        return fe_reject(ctx, KILN_ERR_SHAPE, "sample: logits %s must be f32", fe_describe(x).s);
    if (x->ne[1] != 1 || x->ne[2] != 1 || x->ne[3] != 1)
        return fe_reject(ctx, KILN_ERR_SHAPE, "sample: logits %s must be one row (ne1 = ne2 = ne3 = 1)",
                         fe_describe(x).s);
    if (x->ne[0] > INT32_MAX)
        return fe_reject(ctx, KILN_ERR_SHAPE, "sample: logits %s: a row longer than INT32_MAX has no i32 token ids",
                         fe_describe(x).s);
    if (pos->type != KILN_I32 || pos->ne[1] != 1 || pos->ne[2] != 1 || pos->ne[3] != 1)
        return fe_reject(ctx, KILN_ERR_SHAPE, "sample: pos %s must be an i32 vector (the tokens' positions)",
                         fe_describe(pos).s);
    kiln_sampler_params sp = kiln_sampler_params_default();
    sp.temp = a->fp[0], sp.top_p = a->fp[1], sp.min_p = a->fp[2];
    kiln_status st = kiln_sampler_check(&sp);
    if (st) {
        fe_failf(ctx, KILN_ERR_INVALID, "sample: %s", kiln_status_msg(st));
        kiln_status_free(st);
        return false;
    }
    ne[0] = ne[1] = ne[2] = ne[3] = 1;
    *type = KILN_I32;
    *n_dims = 1;
    return true;
}
