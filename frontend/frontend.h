/* frontend: tensors and graphs with ggml's semantics, shape inference, the .kg text format.
 * Prefix fe_. */
#ifndef KILN_FRONTEND_H
#define KILN_FRONTEND_H

#include "base/base.h"

#define FE_MAX_SRC 2
#define FE_MAX_NAME 64

typedef enum {
    FE_LEAF,   /* input or weight */
    FE_VIEW,   /* aliases its source: folded into layouts by lowering */
    FE_UNARY,  /* elementwise, one operand */
    FE_BINARY, /* elementwise, two operands, b broadcast to a */
} fe_kind;

/* The one table of ops. Columns: enum id, name in .kg and CLI, kind, operand count, float
 * parameters (fp[] of the tensor, f[] of an IR instruction), NMSE tolerance for GPU-vs-reference
 * tests (ggml's test-backend-ops uses 1e-7 by default). */
#define FE_OPS(X)                                        \
    X(LEAF, "leaf", FE_LEAF, 0, 0, 0)                    \
    X(RESHAPE, "reshape", FE_VIEW, 1, 0, 0)              \
    X(VIEW, "view", FE_VIEW, 1, 0, 0)                    \
    X(PERMUTE, "permute", FE_VIEW, 1, 0, 0)              \
    X(TRANSPOSE, "transpose", FE_VIEW, 1, 0, 0)          \
    X(CONT, "cont", FE_UNARY, 1, 0, 1e-7)                \
    X(ADD, "add", FE_BINARY, 2, 0, 1e-7)                 \
    X(SUB, "sub", FE_BINARY, 2, 0, 1e-7)                 \
    X(MUL, "mul", FE_BINARY, 2, 0, 1e-7)                 \
    X(DIV, "div", FE_BINARY, 2, 0, 1e-7)                 \
    X(SCALE, "scale", FE_UNARY, 1, 2, 1e-7)              \
    X(NEG, "neg", FE_UNARY, 1, 0, 1e-7)                  \
    X(EXP, "exp", FE_UNARY, 1, 0, 1e-7)                  \
    X(SQR, "sqr", FE_UNARY, 1, 0, 1e-7)                  \
    X(SQRT, "sqrt", FE_UNARY, 1, 0, 1e-7)                \
    X(SILU, "silu", FE_UNARY, 1, 0, 1e-7)                \
    X(GELU, "gelu", FE_UNARY, 1, 0, 1e-7)                \
    X(RELU, "relu", FE_UNARY, 1, 0, 1e-7)                \
    X(TANH, "tanh", FE_UNARY, 1, 0, 1e-7)                \
    X(SIGMOID, "sigmoid", FE_UNARY, 1, 0, 1e-7)          \
    X(ABS, "abs", FE_UNARY, 1, 0, 1e-7)                  \
    X(SGN, "sgn", FE_UNARY, 1, 0, 1e-7)                  \
    X(STEP, "step", FE_UNARY, 1, 0, 1e-7)                \
    X(ELU, "elu", FE_UNARY, 1, 0, 1e-7)                  \
    X(LEAKY_RELU, "leaky_relu", FE_UNARY, 1, 1, 1e-7)    \
    X(GELU_ERF, "gelu_erf", FE_UNARY, 1, 0, 1e-7)        \
    X(GELU_QUICK, "gelu_quick", FE_UNARY, 1, 0, 1e-7)    \
    X(HARDSWISH, "hardswish", FE_UNARY, 1, 0, 1e-7)      \
    X(HARDSIGMOID, "hardsigmoid", FE_UNARY, 1, 0, 1e-7)  \
    X(LOG, "log", FE_UNARY, 1, 0, 1e-7)                  \
    X(SIN, "sin", FE_UNARY, 1, 0, 1e-7)                  \
    X(COS, "cos", FE_UNARY, 1, 0, 1e-7)                  \
    X(SOFTPLUS, "softplus", FE_UNARY, 1, 0, 1e-7)        \
    X(CLAMP, "clamp", FE_UNARY, 1, 2, 1e-7)

typedef enum {
#define FE_X(id, name, kind, nsrc, nfp, tol) FE_OP_##id,
    FE_OPS(FE_X)
#undef FE_X
    FE_OP_COUNT
} fe_op;

typedef struct {
    const char *name;
    fe_kind     kind;
    int         nsrc;
    int         nfp;
    double      nmse_tol;
} fe_op_info;

extern const fe_op_info fe_ops[FE_OP_COUNT];
int fe_op_from_name(const char *name, fe_op *out); /* 0 on success */

struct kiln_tensor {
    int         id; /* creation index in its context: also a topological order */
    fe_op       op;
    kiln_type   type;
    kiln_role   role;
    int64_t     ne[4];
    size_t      nb[4];
    kiln_tensor *src[FE_MAX_SRC];
    /* Views alias memory: view_src is the tensor that owns the data (never itself a view, as in
     * ggml) and view_offs the byte offset into it. */
    kiln_tensor *view_src;
    size_t       view_offs;
    /* Op parameters. permute: ip[0..3] axes. view: op_offs (bytes into src[0]), and ne/nb
     * above. scale: fp[0] = s, fp[1] = b. leaky_relu: fp[0] = negative slope. clamp: fp[0] =
     * min, fp[1] = max. */
    int32_t ip[4];
    float   fp[2];
    size_t  op_offs;
    int     n_dims; /* dims the builder was given (1..4); only used for printing */
    char    name[FE_MAX_NAME];
    bool    named; /* name given by the user (else auto "_ID") */
    int     line, col; /* .kg position that defined it; 0 when built through the C API */
};

struct kiln_ctx {
    kiln_tensor **t;
    int           n, cap;
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

bool    fe_is_contiguous(const kiln_tensor *t);
int64_t fe_nelements(const kiln_tensor *t);
/* ggml_can_repeat: every dim of b divides the same dim of a. */
bool    fe_can_repeat(const kiln_tensor *b, const kiln_tensor *a);
kiln_tensor *fe_find(const kiln_ctx *ctx, const char *name);
/* A .kg identifier ([A-Za-z_][A-Za-z0-9_.]*) shorter than FE_MAX_NAME. */
bool    fe_valid_name(const char *s);
/* Two of the n tensors sharing a name (lowest ids first), or both NULL. Fails only on OOM. */
kiln_status fe_find_duplicate_name(kiln_tensor *const *t, int n, const kiln_tensor **first,
                                   const kiln_tensor **second);
/* Number of dims worth printing: the highest dim with ne != 1, at least n_dims given. */
int     fe_print_dims(const kiln_tensor *t);

#endif
