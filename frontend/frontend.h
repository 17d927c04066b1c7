/* frontend: tensors and graphs with ggml's semantics, shape inference, the .kg text format.
 * Prefix fe_. */
#ifndef KILN_FRONTEND_H
#define KILN_FRONTEND_H

#include "base/base.h"

#define FE_MAX_SRC 5  /* tensor operands of one op (flash_attn_ext: q, k, v, mask, sinks) */
#define FE_MAX_IP 16  /* int parameters of one op (ggml keeps 16 int32 op_params too) */
#define FE_MAX_FP 8   /* float parameters of one op (rope_ext has 6) */
#define FE_MAX_NAME 64

typedef enum {
    FE_LEAF,   /* input or weight */
    FE_VIEW,   /* aliases its source: folded into layouts by lowering */
    FE_UNARY,  /* elementwise, one operand: one IR instruction */
    FE_BINARY, /* elementwise, two operands, b broadcast to a: one IR instruction */
    FE_GLU,    /* gated unit: act(x) * g over the two halves of a, or over a and b */
    FE_COPY,   /* cpy, dup, cast, repeat: an elementwise copy into a new shape and/or type */
    FE_KERNEL, /* anything else: one IR_OP node instantiated from the template of its family */
} fe_kind;

/* The op families: the ops one kernel template serves. This is the one table of families; each
 * row of FE_OPS names its family by enum, and every layer dispatches on that enum: the frontend
 * for the file of shape rules, ir/eval.c for the CPU reference (an array of its own indexed by
 * fe_fam, since ir/ sits above frontend/), codegen for the template and its epilogue. Columns:
 *  - enum id (FE_FAM_<id>);
 *  - name: the template module (templates/NAME.lua), which is also the stem of the op's shape
 *    rules (frontend/infer_NAME.c) and CPU reference (ir/ref_NAME.c). Two exceptions: the
 *    elementwise ops' reference is ir_apply (ir/eval.c) and their CUDA a line of
 *    templates/ops.lua; matmul_id's shape rule and reference share matmul's files;
 *  - epilogue: the template applies an IR_OP node's elementwise epilogue (k.epilogue,
 *    docs/templates.md). A fusion pass may attach epilogues only to ops of these families;
 *    codegen refuses the others up front, since a template that does not know its node has
 *    extra operands cannot be trusted to fail cleanly. */
#define FE_FAMS(X)                                                                                 \
    X(NONE, "", false) /* leaves and views: no kernel of their own */                              \
    X(EW, "elementwise", false)                                                                    \
    X(ROWS, "rows", false)                                                                         \
    X(NORM, "norm", true)                                                                          \
    X(SOFTMAX, "softmax", false)                                                                   \
    X(ROPE, "rope", false)                                                                         \
    X(REDUCE, "reduce", false)                                                                     \
    X(SORT, "sort", false)                                                                         \
    X(FILL, "fill", false)                                                                         \
    X(MATMUL, "matmul", true)                                                                      \
    X(MATMUL_ID, "matmul_id", true)                                                                \
    X(ATTN, "attn", false)                                                                         \
    X(SAMPLE, "sample", false)                                                                     \
    X(COLLECTIVE, "collective", false)

typedef enum {
#define FE_X(id, name, epilogue) FE_FAM_##id,
    FE_FAMS(FE_X)
#undef FE_X
    FE_FAM_COUNT
} fe_fam;

typedef struct {
    const char *name;
    bool        epilogue;
} fe_fam_info;

extern const fe_fam_info fe_fams[FE_FAM_COUNT];

/* The one table of ops. Columns:
 *  - enum id, name in .kg and on the command line, kind;
 *  - nsrc: tensor operands (optional ones included);
 *  - sig: the parameters in order, as `name:kind` separated by spaces (frontend/sig.c reads it;
 *    docs/graph-format.md documents it). Kinds: t tensor, t? optional tensor, i int, f float,
 *    b bool, y type name, e(a|b|..) one of the names, I4 four ints, L list of ints (views only);
 *    `=value` gives a default. Builders store tensor parameters in src[], float ones in fp[]
 *    and the int-like ones (i b y e I4) in ip[], each in signature order, so the printer and
 *    the lowering can read them generically;
 *  - fam: the family (FE_FAMS below): FE_FAM_NONE for leaves and views, FE_FAM_EW for the
 *    elementwise kinds, a family of its own for each FE_KERNEL op (frontend/tensor.c checks
 *    this at compile time);
 *  - types: the element types the op accepts for its first operand (kiln ops prints them);
 *  - tol: NMSE tolerance of GPU-vs-reference tests (ggml's test-backend-ops default: 1e-7). */
#define FE_F "f32 f16 bf16"
#define FE_Q "q8_0 q4_0 q5_0 q5_1 q4_K q5_K q6_K mxfp4"
#define FE_ALL "f32 f16 bf16 i32 i64 " FE_Q
#define FE_OPS(X)                                                                                  \
    X(LEAF, "leaf", FE_LEAF, 0, "", FE_FAM_NONE, FE_ALL, 0)                                        \
    X(RESHAPE, "reshape", FE_VIEW, 1, "a:t ne:L", FE_FAM_NONE, FE_ALL, 0)                          \
    X(VIEW, "view", FE_VIEW, 1, "a:t ne:L nb:L offset:i", FE_FAM_NONE, FE_ALL, 0)                  \
    X(PERMUTE, "permute", FE_VIEW, 1, "a:t ax0:i ax1:i ax2:i ax3:i", FE_FAM_NONE, FE_ALL, 0)       \
    X(TRANSPOSE, "transpose", FE_VIEW, 1, "a:t", FE_FAM_NONE, FE_ALL, 0)                           \
    X(CONT, "cont", FE_UNARY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                                     \
    X(ADD, "add", FE_BINARY, 2, "a:t b:t", FE_FAM_EW, FE_F, 1e-7)                                  \
    X(SUB, "sub", FE_BINARY, 2, "a:t b:t", FE_FAM_EW, FE_F, 1e-7)                                  \
    X(MUL, "mul", FE_BINARY, 2, "a:t b:t", FE_FAM_EW, FE_F, 1e-7)                                  \
    X(DIV, "div", FE_BINARY, 2, "a:t b:t", FE_FAM_EW, FE_F, 1e-7)                                  \
    X(ADD1, "add1", FE_BINARY, 2, "a:t b:t", FE_FAM_EW, FE_F, 1e-7)                                \
    X(SCALE, "scale", FE_UNARY, 1, "a:t s:f b:f=0", FE_FAM_EW, FE_F, 1e-7)                         \
    X(NEG, "neg", FE_UNARY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                                       \
    X(EXP, "exp", FE_UNARY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                                       \
    X(SQR, "sqr", FE_UNARY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                                       \
    X(SQRT, "sqrt", FE_UNARY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                                     \
    X(SILU, "silu", FE_UNARY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                                     \
    X(GELU, "gelu", FE_UNARY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                                     \
    X(RELU, "relu", FE_UNARY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                                     \
    X(TANH, "tanh", FE_UNARY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                                     \
    X(SIGMOID, "sigmoid", FE_UNARY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                               \
    X(ABS, "abs", FE_UNARY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                                       \
    X(SGN, "sgn", FE_UNARY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                                       \
    X(STEP, "step", FE_UNARY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                                     \
    X(ELU, "elu", FE_UNARY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                                       \
    X(LEAKY_RELU, "leaky_relu", FE_UNARY, 1, "a:t negative_slope:f", FE_FAM_EW, FE_F, 1e-7)        \
    X(GELU_ERF, "gelu_erf", FE_UNARY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                             \
    X(GELU_QUICK, "gelu_quick", FE_UNARY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                         \
    X(HARDSWISH, "hardswish", FE_UNARY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                           \
    X(HARDSIGMOID, "hardsigmoid", FE_UNARY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                       \
    X(LOG, "log", FE_UNARY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                                       \
    X(SIN, "sin", FE_UNARY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                                       \
    X(COS, "cos", FE_UNARY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                                       \
    X(SOFTPLUS, "softplus", FE_UNARY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                             \
    X(CLAMP, "clamp", FE_UNARY, 1, "a:t min:f max:f", FE_FAM_EW, FE_F, 1e-7)                       \
    X(REGLU, "reglu", FE_GLU, 2, "a:t b:t? swapped:b=false", FE_FAM_EW, FE_F, 1e-7)                \
    X(GEGLU, "geglu", FE_GLU, 2, "a:t b:t? swapped:b=false", FE_FAM_EW, FE_F, 1e-7)                \
    X(SWIGLU, "swiglu", FE_GLU, 2, "a:t b:t? swapped:b=false", FE_FAM_EW, FE_F, 1e-7)              \
    X(SWIGLU_OAI, "swiglu_oai", FE_GLU, 2, "a:t b:t? swapped:b=false alpha:f=1.702 limit:f=7",     \
      FE_FAM_EW, FE_F, 1e-7)                                                                       \
    X(GEGLU_ERF, "geglu_erf", FE_GLU, 2, "a:t b:t? swapped:b=false", FE_FAM_EW, FE_F, 1e-7)        \
    X(GEGLU_QUICK, "geglu_quick", FE_GLU, 2, "a:t b:t? swapped:b=false", FE_FAM_EW, FE_F, 1e-7)    \
    X(CPY, "cpy", FE_COPY, 2, "a:t b:t", FE_FAM_EW, FE_F, 1e-7)                                    \
    X(DUP, "dup", FE_COPY, 1, "a:t", FE_FAM_EW, FE_F, 1e-7)                                        \
    X(CAST, "cast", FE_COPY, 1, "a:t type:y", FE_FAM_EW, FE_F, 1e-7)                               \
    X(REPEAT, "repeat", FE_COPY, 2, "a:t b:t", FE_FAM_EW, FE_F, 1e-7)                              \
    X(GET_ROWS, "get_rows", FE_KERNEL, 2, "a:t ids:t", FE_FAM_ROWS, FE_F " " FE_Q, 1e-7)                    \
    X(SET_ROWS, "set_rows", FE_KERNEL, 3, "a:t b:t ids:t", FE_FAM_ROWS, FE_F, 1e-7)                \
    X(CONCAT, "concat", FE_KERNEL, 2, "a:t b:t dim:i", FE_FAM_ROWS, FE_F, 1e-7)                    \
    X(PAD, "pad", FE_KERNEL, 1, "a:t lp0:i=0 rp0:i=0 lp1:i=0 rp1:i=0 lp2:i=0 rp2:i=0 lp3:i=0 rp3:i=0", \
      FE_FAM_ROWS, FE_F, 1e-7)                                                                     \
    X(ADD_ID, "add_id", FE_KERNEL, 3, "a:t b:t ids:t", FE_FAM_ROWS, "f32", 1e-7)                   \
    X(NORM, "norm", FE_KERNEL, 1, "a:t eps:f", FE_FAM_NORM, FE_F, 1e-7)                        \
    X(RMS_NORM, "rms_norm", FE_KERNEL, 1, "a:t eps:f", FE_FAM_NORM, FE_F, 1e-7)                    \
    X(L2_NORM, "l2_norm", FE_KERNEL, 1, "a:t eps:f", FE_FAM_NORM, FE_F, 1e-7)                      \
    X(GROUP_NORM, "group_norm", FE_KERNEL, 1, "a:t n_groups:i eps:f", FE_FAM_NORM, FE_F, 1e-7)     \
    X(SOFT_MAX, "soft_max", FE_KERNEL, 1, "a:t", FE_FAM_SOFTMAX, FE_F, 1e-6)                       \
    X(SOFT_MAX_EXT, "soft_max_ext", FE_KERNEL, 3, "a:t mask:t? scale:f=1 max_bias:f=0 sinks:t?",   \
      FE_FAM_SOFTMAX, FE_F, 1e-6)                                                                  \
    X(ROPE_EXT, "rope_ext", FE_KERNEL, 3,                                                          \
      "a:t pos:t freq_factors:t? n_dims:i mode:i=0 n_ctx_orig:i=0 sections:I4=[0,0,0,0] "          \
      "freq_base:f=10000 freq_scale:f=1 ext_factor:f=0 attn_factor:f=1 beta_fast:f=32 "            \
      "beta_slow:f=1",                                                                             \
      FE_FAM_ROPE, FE_F, 1e-7)                                                                     \
    X(SUM, "sum", FE_KERNEL, 1, "a:t", FE_FAM_REDUCE, FE_F, 1e-7)                                  \
    X(SUM_ROWS, "sum_rows", FE_KERNEL, 1, "a:t", FE_FAM_REDUCE, FE_F, 1e-7)                        \
    X(MEAN, "mean", FE_KERNEL, 1, "a:t", FE_FAM_REDUCE, FE_F, 1e-7)                                \
    X(ARGMAX, "argmax", FE_KERNEL, 1, "a:t", FE_FAM_REDUCE, FE_F, 0)                               \
    X(CUMSUM, "cumsum", FE_KERNEL, 1, "a:t", FE_FAM_REDUCE, "f32", 1e-7)                           \
    X(ARGSORT, "argsort", FE_KERNEL, 1, "a:t order:e(asc|desc)=asc", FE_FAM_SORT, FE_F, 0)         \
    X(ARGSORT_TOP_K, "argsort_top_k", FE_KERNEL, 1, "a:t k:i", FE_FAM_SORT, FE_F, 0)               \
    X(TOP_K, "top_k", FE_KERNEL, 1, "a:t k:i", FE_FAM_SORT, FE_F, 0)                               \
    X(ARANGE, "arange", FE_KERNEL, 0, "start:f stop:f step:f", FE_FAM_FILL, "f32", 0)              \
    X(FILL, "fill", FE_KERNEL, 1, "a:t c:f", FE_FAM_FILL, FE_F, 0)                             \
    X(DIAG_MASK_INF, "diag_mask_inf", FE_KERNEL, 1, "a:t n_past:i", FE_FAM_FILL, FE_F, 0)          \
    X(TRI, "tri", FE_KERNEL, 1, "a:t type:e(upper_diag|upper|lower_diag|lower)", FE_FAM_FILL, FE_F, 0) \
    X(MUL_MAT, "mul_mat", FE_KERNEL, 2, "a:t b:t", FE_FAM_MATMUL, FE_F " " FE_Q, 5e-4)                      \
    X(MUL_MAT_ID, "mul_mat_id", FE_KERNEL, 3, "as:t b:t ids:t", FE_FAM_MATMUL_ID, FE_F " " FE_Q, 5e-4)      \
    X(FLASH_ATTN_EXT, "flash_attn_ext", FE_KERNEL, 5,                                              \
      "q:t k:t v:t mask:t? scale:f=1 max_bias:f=0 logit_softcap:f=0 sinks:t?", FE_FAM_ATTN, "f32", 5e-4) \
    X(SAMPLE, "sample", FE_KERNEL, 2,                                                              \
      "a:t pos:t seed_lo:i=0 seed_hi:i=0 temp:f=0.8 top_k:i=40 top_p:f=0.95 min_p:f=0.05",       \
      FE_FAM_SAMPLE, "f32", 0)                                                                     \
    X(ALL_REDUCE, "all_reduce", FE_KERNEL, 1, "a:t ranks:i", FE_FAM_COLLECTIVE, "f32", 1e-7)

typedef enum {
#define FE_X(id, name, kind, nsrc, sig, fam, types, tol) FE_OP_##id,
    FE_OPS(FE_X)
#undef FE_X
    FE_OP_COUNT
} fe_op;

typedef struct {
    const char *name;
    fe_kind     kind;
    int         nsrc;
    const char *sig;
    fe_fam      fam;
    const char *types;
    double      nmse_tol;
} fe_op_info;

extern const fe_op_info fe_ops[FE_OP_COUNT];
int fe_op_from_name(const char *name, fe_op *out); /* 0 on success */

/* ---- signatures (frontend/sig.c) ---------------------------------------------------------- */

typedef enum { FE_P_TENSOR, FE_P_INT, FE_P_FLOAT, FE_P_BOOL, FE_P_TYPE, FE_P_ENUM, FE_P_INT4, FE_P_LIST } fe_pkind;

#define FE_MAX_PARAMS 20
#define FE_MAX_ENUM 8

typedef struct {
    char     name[24];
    fe_pkind kind;
    bool     optional;  /* a tensor that may be absent, or a scalar with a default */
    int      slot;      /* index into src[] (tensors), ip[] (int-like), fp[] (floats), lists */
    int      nenum;
    char     enums[FE_MAX_ENUM][24]; /* FE_P_ENUM: the names, value = index */
    int32_t  idef[4];   /* default of int-like parameters */
    float    fdef;      /* default of float parameters */
} fe_param;

typedef struct {
    int      n;
    fe_param p[FE_MAX_PARAMS];
    int      ntensor, nint, nfloat, nlist;
} fe_sig;

/* The parsed signature of op (cached; the table is static so this cannot fail for a valid
 * table — tests/test_format.c checks every row). */
const fe_sig *fe_op_sig(fe_op op);

/* The arguments of an op in signature order, as the parser collects them and builders take. */
typedef struct {
    kiln_tensor *t[FE_MAX_SRC];
    int32_t      ip[FE_MAX_IP];
    int64_t      iw[FE_MAX_IP]; /* the same ints at full width (view's byte offset) */
    float        fp[FE_MAX_FP];
    int          nlist[2];
    int64_t      list[2][4];
} fe_args;

/* Fills every defaulted parameter of op in a with its default. */
void fe_args_defaults(fe_op op, fe_args *a);
/* The usage line of op, e.g. "soft_max(a, mask=NAME, scale=1, max_bias=0, sinks=NAME)". */
void fe_op_usage(fe_op op, char *out, size_t n);
const char *fe_op_usage_text(fe_op op); /* the same, made once for every op */

/* Builds a tensor of op from generic arguments (the parser's path; the kiln_* builders take the
 * same path). Returns NULL with the error recorded in ctx. */
kiln_tensor *fe_build(kiln_ctx *ctx, fe_op op, const fe_args *a);

/* The shape and type rules of the FE_GLU, FE_COPY and FE_KERNEL ops, one per op, named
 * fe_infer_<ID> (frontend/infer.h) and kept in frontend/infer_<family name>.c. Each checks a
 * (recording an error with fe_failf and returning false on bad input) and sets the result's
 * type, shape and n_dims (dims worth printing). fe_build then creates the node and stores a's
 * parameters in it. */
typedef bool (*fe_infer_fn)(kiln_ctx *ctx, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims);
/* op's rule; NULL for the kinds that have none (leaves, views, unary and binary ops). */
fe_infer_fn fe_infer_of(fe_op op);

struct kiln_tensor {
    int         id; /* creation index in its context: also a topological order */
    fe_op       op;
    kiln_type   type;
    kiln_role   role;
    int64_t     ne[4];   /* a symbolic dim's extent is its maximum */
    size_t      nb[4];
    uint8_t     sym[4];  /* 0: static extent; i + 1: ctx->dims[i] (frontend/dims.c) */
    const kiln_ctx *ctx; /* the context that owns it (for the names of its symbolic dims) */
    kiln_tensor *src[FE_MAX_SRC];
    /* Views alias memory: view_src is the tensor that owns the data (never itself a view, as in
     * ggml) and view_offs the byte offset into it. */
    kiln_tensor *view_src;
    size_t       view_offs;
    /* Op parameters in signature order (see FE_OPS): src[] tensors, fp[] floats, ip[] the
     * int-like ones. view: op_offs (bytes into src[0]), and ne/nb above. */
    int32_t ip[FE_MAX_IP];
    float   fp[FE_MAX_FP];
    size_t  op_offs;
    int     n_dims; /* dims the builder was given (1..4); only used for printing */
    char    name[FE_MAX_NAME];
    bool    named; /* name given by the user (else auto "_ID") */
    int     line, col; /* .kg position that defined it; 0 when built through the C API */
};

/* A symbolic dim: name, maximum, values with a specialized program of their own: spec[k] the
 * value, or with spec_upto[k] a smaller maximum (kiln_dim_specialize_upto). */
typedef struct {
    char    name[FE_MAX_NAME];
    int64_t max;
    int     nspec;
    int64_t spec[4];
    bool    spec_upto[4];
} fe_dim;

struct kiln_ctx {
    kiln_tensor **t;
    int           n, cap;
    /* fe_find's index of the tensors by name (open addressing, frontend/tensor.c) */
    kiln_tensor **index;
    int           icap, iused;
    fe_dim        dims[KILN_MAX_SYMS];
    int           ndims;
    /* kiln_ctx_bind: dims that kiln_dim turns into these values instead of declaring them */
    int           nbound;
    char          bound_name[KILN_MAX_SYMS][FE_MAX_NAME];
    int64_t       bound_val[KILN_MAX_SYMS];
    /* kiln_ctx_cap: a dim that kiln_dim declares with this smaller maximum, without its
     * specializations (a variant's graph: variants do not nest) */
    char          cap_name[FE_MAX_NAME];
    int64_t       cap_val;
    kiln_status   err;      /* first builder error (sticky) */
    const char   *file;     /* while parsing: file name for messages */
    int           line, col; /* while parsing: position of the statement being built */
};

struct kiln_graph {
    kiln_ctx     *ctx;
    kiln_tensor **nodes; /* topological order: every operand before its users */
    int           n;
};

/* Records err as ctx's error unless one is already recorded (then err is freed). */
void fe_fail(kiln_ctx *ctx, kiln_status err);
/* Like kb_error, prefixed with "file:line:col: " when ctx is parsing, and naming the op. */
void fe_failf(kiln_ctx *ctx, kiln_code code, const char *fmt, ...) KB_PRINTF(3, 4);
/* fe_failf, then false, for the checks that return bool (shape rules, operand checks):
 * `if (bad) return fe_reject(ctx, code, "...", ...);`. */
bool fe_reject(kiln_ctx *ctx, kiln_code code, const char *fmt, ...) KB_PRINTF(3, 4);

bool    fe_is_contiguous(const kiln_tensor *t);
int64_t fe_nelements(const kiln_tensor *t);
/* ggml_can_repeat: every dim of b divides the same dim of a. */
bool    fe_can_repeat(const kiln_tensor *b, const kiln_tensor *a);
kiln_tensor *fe_find(const kiln_ctx *ctx, const char *name);
uint64_t     fe_name_hash(const char *s); /* FNV-1a of a name, for tables by name */
/* A .kg identifier ([A-Za-z_][A-Za-z0-9_.]*) shorter than FE_MAX_NAME. */
bool    fe_valid_name(const char *s);
/* Two of the n tensors sharing a name (lowest ids first), or both NULL. Fails only on OOM. */
/* ctx with dim d bound to v (v > 0) or capped to -v (v < 0; kiln_ctx_bind, kiln_ctx_cap), its
 * text given when the caller printed ctx already (NULL: printed here). */
kiln_status fe_ctx_specialize(const kiln_ctx *ctx, const char *text, int d, int64_t v, kiln_ctx **out);
kiln_status fe_find_duplicate_name(kiln_tensor *const *t, int n, const kiln_tensor **first,
                                   const kiln_tensor **second);
/* ---- symbolic dims (frontend/dims.c) ---- */
/* Resolves a builder's extent: a handle of kiln_dim becomes its maximum (*sym = index + 1), a
 * plain extent stays (*sym = 0). False (error recorded, naming `what`) for a bad handle. */
bool fe_resolve_extent(kiln_ctx *ctx, const char *what, int64_t v, int64_t *ne, uint8_t *sym);
/* The symbolic dims of a binary op's result (a's), after checking that b broadcasts onto a:
 * b's symbolic dims must be a's, and b is 1 where only a is symbolic. */
bool fe_sym_binary(kiln_ctx *ctx, const char *op, const kiln_tensor *a, const kiln_tensor *b,
                   uint8_t sym[4]);
/* The symbolic dims of an inferred op's result: the shape rule is run again with each symbolic
 * dim of the operands at another value; result dims that follow it are that dim. False (error
 * recorded) when the rule rejects other values or a result dim depends on one otherwise. */
bool fe_sym_infer(kiln_ctx *ctx, fe_op op, const fe_args *a, fe_infer_fn infer,
                  const int64_t ne[4], uint8_t sym[4]);
/* reshape: each symbolic dim must keep its place (the same product of extents below it, the
 * same order), since layouts are padded to the maximum. */
bool fe_sym_reshape(kiln_ctx *ctx, const kiln_tensor *a, const int64_t ne[4], const uint8_t sym[4]);
bool fe_has_sym(const kiln_tensor *t);
/* "n_kv" or the decimal extent, for shapes in messages and text. */
const char *fe_extent_str(const kiln_ctx *ctx, const kiln_tensor *t, int d, char buf[FE_MAX_NAME]);

/* Number of dims worth printing: the highest dim with ne != 1, at least n_dims given. */
int     fe_print_dims(const kiln_tensor *t);

#endif
