/* The shape and type rules of the ops that fe_build infers (FE_GLU, FE_COPY, FE_KERNEL), one
 * function per op, in frontend/infer_FAMILY.c (FAMILY as in the fam column of FE_OPS, "ew" for
 * the elementwise kinds). See fe_infer_fn in frontend.h for the contract. */
#ifndef KILN_FRONTEND_INFER_H
#define KILN_FRONTEND_INFER_H

#include "frontend.h"

#define FE_INFER_DECL(id, name, kind, nsrc, sig, fam, types, tol) \
    bool fe_infer_##id(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims);
FE_OPS(FE_INFER_DECL)
#undef FE_INFER_DECL

/* Shared by the rules: "f32[4096, 8]" for messages. */
const char *fe_shape_str(const kiln_tensor *t, char *buf, size_t len);
bool        fe_is_float(kiln_type t);
/* "'name' (f32[4096, 8])": a tensor as rule messages name it, returned by value. */
typedef struct {
    char s[FE_MAX_NAME + 112];
} fe_desc;
fe_desc fe_describe(const kiln_tensor *t);

#endif
