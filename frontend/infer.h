/* The shape and type rules of the ops that fe_build infers (FE_GLU, FE_COPY, FE_KERNEL), one
 * function per op, in frontend/infer_NAME.c (NAME the name of the op's family in FE_FAMS). See
 * fe_infer_fn in frontend.h for the contract. */
#ifndef KILN_FRONTEND_INFER_H
#define KILN_FRONTEND_INFER_H

#include "frontend.h"

#define FE_INFER_DECL(id, name, kind, nsrc, sig, fam, types, tol) \
    bool fe_infer_##id(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims);
FE_OPS(FE_INFER_DECL)
#undef FE_INFER_DECL

/* FE_INFER_RULE(kind, id): the rule of op id, of that kind, for a table built from FE_OPS (the
 * kinds that have one name fe_infer_<ID>, so a missing rule is a link error, not a NULL). */
#define FE_INFER_RULE(kind, id) FE_INFER_RULE_##kind(id)
#define FE_INFER_RULE_FE_LEAF(id) NULL
#define FE_INFER_RULE_FE_VIEW(id) NULL
#define FE_INFER_RULE_FE_UNARY(id) NULL
#define FE_INFER_RULE_FE_BINARY(id) NULL
#define FE_INFER_RULE_FE_GLU(id) fe_infer_##id
#define FE_INFER_RULE_FE_COPY(id) fe_infer_##id
#define FE_INFER_RULE_FE_KERNEL(id) fe_infer_##id

/* Shared by the rules: "f32[4096, 8]" for messages. */
const char *fe_shape_str(const kiln_tensor *t, char *buf, size_t len);
bool        fe_is_float(kiln_type t);
/* "'name' (f32[4096, 8])": a tensor as rule messages name it, returned by value. */
typedef struct {
    char s[FE_MAX_NAME + 112];
} fe_desc;
fe_desc fe_describe(const kiln_tensor *t);
/* The rule of ops whose result copies a's shape and type (norms, masks, tri ...): a (the first
 * operand) must be a float tensor, else an error naming op and a. */
bool fe_like_float_a(kiln_ctx *ctx, const char *op, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims);

#endif
