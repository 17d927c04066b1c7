/*
 * kiln — a compiler from ggml-style compute graphs to specialized CUDA programs.
 *
 * Usage (error handling shortened; every fallible call returns a kiln_status, NULL on success):
 *
 *     kiln_ctx *ctx = kiln_ctx_new();
 *     int64_t ne[2] = {4096, 8};
 *     kiln_tensor *x = kiln_new_tensor(ctx, KILN_ROLE_INPUT, KILN_F32, "x", 2, ne);
 *     kiln_tensor *w = kiln_new_tensor(ctx, KILN_ROLE_WEIGHT, KILN_F16, "w", 1, ne);
 *     kiln_tensor *y = kiln_silu(ctx, kiln_mul(ctx, x, w));       // w broadcasts over rows
 *     kiln_set_output(ctx, y, "y");
 *
 *     kiln_graph *g;   kiln_status st = kiln_graph_new(ctx, &g);  // builder errors surface here
 *     kiln_program *p; if (!st) st = kiln_compile(g, NULL, &p);   // Lua codegen + NVRTC + cache
 *     kiln_session *s; if (!st) st = kiln_session_new(p, NULL, &s); // needs a GPU
 *     if (!st) st = kiln_session_set(s, "x", host_x, sizeof host_x);
 *     if (!st) st = kiln_session_set(s, "w", host_w, sizeof host_w);
 *     if (!st) st = kiln_session_run(s);                          // first run captures a CUDA graph
 *     if (!st) st = kiln_session_get(s, "y", host_y, sizeof host_y);
 *     if (st) { fprintf(stderr, "%s\n", kiln_status_msg(st)); kiln_status_free(st); }
 *
 * Tensors follow ggml: ne[0] is the innermost (fastest) dimension, nb[i] is the stride of
 * dimension i in bytes, and op semantics (broadcasting, views, ...) are ggml's.
 */
#ifndef KILN_H
#define KILN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_VERSION "0.1.0"
#define KILN_MAX_DIMS 4

/* ---- status ------------------------------------------------------------------------------- */

typedef enum {
    KILN_OK = 0,
    KILN_ERR_INVALID,   /* bad argument to an API call */
    KILN_ERR_PARSE,     /* .kg text could not be parsed */
    KILN_ERR_SHAPE,     /* shapes or types do not fit the op */
    KILN_ERR_IO,        /* file system */
    KILN_ERR_NOMEM,     /* host allocation failed */
    KILN_ERR_CODEGEN,   /* a template failed (Lua error) */
    KILN_ERR_NVRTC,     /* NVRTC missing or compilation failed */
    KILN_ERR_CACHE,     /* cache entry corrupt or unusable */
    KILN_ERR_NO_GPU,    /* no CUDA driver or no GPU */
    KILN_ERR_CUDA,      /* a CUDA driver call failed */
    KILN_ERR_NOT_FOUND, /* a name that is not in the graph or program */
    KILN_ERR_FORMAT,    /* a serialized program or bundle is malformed, or does not fit (arch, version) */
} kiln_code;

/* NULL means success; otherwise an owned object the caller frees with kiln_status_free. */
typedef struct kiln_status_s *kiln_status;

kiln_code   kiln_status_code(kiln_status st);
const char *kiln_status_msg(kiln_status st);          /* "" for NULL */
void        kiln_status_free(kiln_status st);
const char *kiln_code_name(kiln_code code);

/* ---- types and tensors -------------------------------------------------------------------- */

/* Element types. The quantized ones are ggml's block formats (ggml-common.h): a row of ne0
 * elements is ne0 / block blocks of kiln_type_size bytes each, so ne0 must be a multiple of the
 * block (32 for q8_0, q4_0, q5_0, q5_1 and mxfp4, 256 for the K-quants). They hold weights only: mul_mat's a,
 * mul_mat_id's as and get_rows' a accept them (and views that keep whole rows), nothing else. */
typedef enum {
    KILN_F32,
    KILN_F16,
    KILN_BF16,
    KILN_I32,
    KILN_I64,
    KILN_Q8_0, /* 32 elements in 34 bytes: f16 scale, 32 int8 */
    KILN_Q4_0, /* 32 elements in 18 bytes: f16 scale, 32 4-bit values offset by 8 */
    KILN_Q4_K, /* 256 elements in 144 bytes: f16 scale and min, 8 × 6-bit sub-scales and mins, 4-bit */
    KILN_Q5_K, /* 256 elements in 176 bytes: as q4_K, plus one high bit per element */
    KILN_Q6_K, /* 256 elements in 210 bytes: 16 int8 sub-scales, f16 scale, 6-bit values offset by 32 */
    KILN_MXFP4, /* 32 elements in 17 bytes: an E8M0 power-of-two scale, 32 4-bit FP4 (E2M1) codes (gpt-oss) */
    KILN_Q5_0,  /* 32 elements in 22 bytes: f16 scale, 32 high bits, 32 4-bit low parts; 5-bit values offset by 16 */
    KILN_Q5_1,  /* 32 elements in 24 bytes: f16 scale and min, 32 high bits, 32 4-bit low parts; x = d·q + m */
    KILN_TYPE_COUNT
} kiln_type;

typedef enum {
    KILN_ROLE_NONE,   /* an intermediate value */
    KILN_ROLE_INPUT,  /* data supplied per run */
    KILN_ROLE_WEIGHT, /* data supplied once */
    KILN_ROLE_OUTPUT, /* a result read back after a run */
    KILN_ROLE_STATE,  /* memory that persists from run to run (a KV cache): zero at first, set
                         and read by name like an input; set_rows into it writes in place */
} kiln_role;

const char *kiln_type_name(kiln_type t);     /* "f32", ..., "q4_K" (ggml's names) */
size_t      kiln_type_size(kiln_type t);     /* bytes of one element, or of one block */
int64_t     kiln_type_block(kiln_type t);    /* elements per block: 1 unless quantized */
bool        kiln_type_is_quantized(kiln_type t);
/* Bytes of n elements of type t (ggml_row_size): n / block blocks; n must be a multiple of the
 * block (0 is returned otherwise, and for an unknown type). */
size_t      kiln_row_size(kiln_type t, int64_t n);
/* 0 on success. Names match without regard to case: "q4_k" is q4_K. */
int         kiln_type_from_name(const char *name, kiln_type *out);

typedef struct kiln_ctx kiln_ctx;
typedef struct kiln_tensor kiln_tensor;
typedef struct kiln_graph kiln_graph;
typedef struct kiln_program kiln_program;
typedef struct kiln_session kiln_session;

kiln_ctx *kiln_ctx_new(void);
void      kiln_ctx_free(kiln_ctx *ctx);

/* Builders never fail loudly: on bad arguments they return NULL and record the first error in
 * the context; any later builder given a NULL operand returns NULL too. The recorded error is
 * returned by kiln_ctx_status and by kiln_graph_new, so one check after building suffices. */
kiln_status kiln_ctx_status(const kiln_ctx *ctx); /* a copy of the first error, or NULL */

kiln_tensor *kiln_new_tensor(kiln_ctx *ctx, kiln_role role, kiln_type type, const char *name,
                             int n_dims, const int64_t *ne);
void         kiln_set_name(kiln_ctx *ctx, kiln_tensor *t, const char *name);
void         kiln_set_output(kiln_ctx *ctx, kiln_tensor *t, const char *name); /* name may be NULL */

/* ---- symbolic dims ---------------------------------------------------------------------------
 * A symbolic dim is an extent known only at run time, up to a maximum (the KV length n_kv, the
 * token count n_tokens). kiln_dim returns a handle that stands for it wherever builders take an
 * extent (kiln_new_tensor, kiln_reshape, kiln_view); shapes derived from it follow it through
 * every op. Kernels are compiled once for the maximum, read the value at run time, and never
 * bake it into their source or cache key; the value is set per run (kiln_session_set_dim).
 * Layouts are those at the maximum (a tensor [n_kv, 4] has rows of max(n_kv) elements).
 * Returns the handle (a negative number), or 0 with the error recorded in ctx. When ctx is a
 * bound copy (kiln_ctx_bind) that binds name, it returns the bound value: a plain extent. */
#define KILN_MAX_SYMS 8
int64_t     kiln_dim(kiln_ctx *ctx, const char *name, int64_t max);
/* Also compile a program in which dim `name` is fixed to value (decode: n_tokens = 1). Runs
 * whose value is `value` use it; others use the general program. At most 4 per dim. */
void        kiln_dim_specialize(kiln_ctx *ctx, const char *name, int64_t value);
/* Also compile a program in which dim `name` stays symbolic with the smaller maximum max (1 ..
 * its maximum - 1): its kernels are specialized for at most max (a batched decode of at most 64
 * sequences takes plans that a prefill of 512 tokens cannot). Runs whose value is at most max
 * use it, unless a value specialization matches; the 4 per dim count both kinds. */
void        kiln_dim_specialize_upto(kiln_ctx *ctx, const char *name, int64_t max);
int         kiln_ctx_dim_count(const kiln_ctx *ctx);
const char *kiln_ctx_dim_name(const kiln_ctx *ctx, int i);   /* NULL if out of range */
int64_t     kiln_ctx_dim_max(const kiln_ctx *ctx, int i);
/* Index of dim `name` in ctx, or -1. */
int         kiln_ctx_dim_find(const kiln_ctx *ctx, const char *name);
/* A new context holding ctx's graph with the n dims names[i] fixed to values[i] (checked
 * against their maximum): the graph as it is at those values, symbolic in the other dims. */
kiln_status kiln_ctx_bind(const kiln_ctx *ctx, int n, const char *const *names,
                          const int64_t *values, kiln_ctx **out);
/* A new context holding ctx's graph with dim `name` symbolic up to the smaller maximum max
 * (layouts at max), without specializations: the graph of a kiln_dim_specialize_upto variant. */
kiln_status kiln_ctx_cap(const kiln_ctx *ctx, const char *name, int64_t max, kiln_ctx **out);
/* The symbolic dim of t's dim d (its name), or NULL when that extent is static. */
const char *kiln_tensor_dim_name(const kiln_tensor *t, int d);

kiln_type    kiln_tensor_type(const kiln_tensor *t);
int64_t      kiln_tensor_ne(const kiln_tensor *t, int dim); /* symbolic dims: the maximum */
size_t       kiln_tensor_nb(const kiln_tensor *t, int dim);
int64_t      kiln_tensor_nelements(const kiln_tensor *t);
size_t       kiln_tensor_nbytes(const kiln_tensor *t); /* bytes spanned by the layout */
const char  *kiln_tensor_name(const kiln_tensor *t);
kiln_role    kiln_tensor_role(const kiln_tensor *t);

/* Views (alias their source, like ggml): */
kiln_tensor *kiln_reshape(kiln_ctx *ctx, kiln_tensor *a, int n_dims, const int64_t *ne);
kiln_tensor *kiln_view(kiln_ctx *ctx, kiln_tensor *a, int n_dims, const int64_t *ne,
                       const size_t *nb /* nb[1..n_dims-1], n_dims-1 entries */, size_t offset);
kiln_tensor *kiln_permute(kiln_ctx *ctx, kiln_tensor *a, int ax0, int ax1, int ax2, int ax3);
kiln_tensor *kiln_transpose(kiln_ctx *ctx, kiln_tensor *a);
/* A contiguous copy (an op, not a view). */
kiln_tensor *kiln_cont(kiln_ctx *ctx, kiln_tensor *a);

/* Binary ops: b is broadcast to a's shape (a.ne[i] % b.ne[i] == 0); the result has a's type. */
kiln_tensor *kiln_add(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_sub(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_mul(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_div(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b);
/* a*s + b, as ggml_scale_bias. */
kiln_tensor *kiln_scale(kiln_ctx *ctx, kiln_tensor *a, float s, float b);

/* Unary ops, elementwise, result of a's type. gelu is ggml's tanh approximation. */
kiln_tensor *kiln_neg(kiln_ctx *ctx, kiln_tensor *a);
kiln_tensor *kiln_exp(kiln_ctx *ctx, kiln_tensor *a);
kiln_tensor *kiln_sqr(kiln_ctx *ctx, kiln_tensor *a);
kiln_tensor *kiln_sqrt(kiln_ctx *ctx, kiln_tensor *a);
kiln_tensor *kiln_silu(kiln_ctx *ctx, kiln_tensor *a);
kiln_tensor *kiln_gelu(kiln_ctx *ctx, kiln_tensor *a);
kiln_tensor *kiln_relu(kiln_ctx *ctx, kiln_tensor *a);
kiln_tensor *kiln_tanh(kiln_ctx *ctx, kiln_tensor *a);
kiln_tensor *kiln_sigmoid(kiln_ctx *ctx, kiln_tensor *a);
kiln_tensor *kiln_abs(kiln_ctx *ctx, kiln_tensor *a);
kiln_tensor *kiln_sgn(kiln_ctx *ctx, kiln_tensor *a);   /* -1, 0 or 1 */
kiln_tensor *kiln_step(kiln_ctx *ctx, kiln_tensor *a);  /* x > 0 ? 1 : 0 */
kiln_tensor *kiln_elu(kiln_ctx *ctx, kiln_tensor *a);   /* x > 0 ? x : expm1(x) */
kiln_tensor *kiln_gelu_erf(kiln_ctx *ctx, kiln_tensor *a);   /* exact GELU, with erf */
kiln_tensor *kiln_gelu_quick(kiln_ctx *ctx, kiln_tensor *a); /* x * sigmoid(1.702 x) */
kiln_tensor *kiln_hardswish(kiln_ctx *ctx, kiln_tensor *a);
kiln_tensor *kiln_hardsigmoid(kiln_ctx *ctx, kiln_tensor *a);
kiln_tensor *kiln_log(kiln_ctx *ctx, kiln_tensor *a);
kiln_tensor *kiln_sin(kiln_ctx *ctx, kiln_tensor *a);
kiln_tensor *kiln_cos(kiln_ctx *ctx, kiln_tensor *a);
kiln_tensor *kiln_softplus(kiln_ctx *ctx, kiln_tensor *a); /* x > 20 ? x : log(1 + exp(x)) */
/* max(x, 0) + negative_slope * min(x, 0) */
kiln_tensor *kiln_leaky_relu(kiln_ctx *ctx, kiln_tensor *a, float negative_slope);
/* max(min(x, max), min), as ggml_clamp */
kiln_tensor *kiln_clamp(kiln_ctx *ctx, kiln_tensor *a, float min, float max);

/* a + b where b has one element (ggml_add1). */
kiln_tensor *kiln_add1(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b);

/* Gated linear units, as ggml_glu / ggml_glu_split. With b NULL, a's ne0 is even and its first
 * half is the activation input x, its second half the gate g (exchanged when swapped); with b,
 * x = a and g = b (same shape; swapped must be false). The result is act(x) * g, of a's type,
 * ne0 halved in the one-tensor form. swiglu_oai (gpt-oss): x' = min(x, limit),
 * g' = clamp(g, -limit, limit), out = x' * sigmoid(alpha x') * (g' + 1). */
kiln_tensor *kiln_reglu(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b, bool swapped);
kiln_tensor *kiln_geglu(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b, bool swapped);
kiln_tensor *kiln_swiglu(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b, bool swapped);
kiln_tensor *kiln_geglu_erf(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b, bool swapped);
kiln_tensor *kiln_geglu_quick(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b, bool swapped);
kiln_tensor *kiln_swiglu_oai(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b, bool swapped,
                             float alpha, float limit);

/* Copies. cpy: a's values in b's shape and type (same element count; b's data is not read).
 * dup: a contiguous copy. cast: a contiguous copy converted to `type`. repeat: a tiled to b's
 * shape (each dim of a divides b's). */
kiln_tensor *kiln_cpy(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_dup(kiln_ctx *ctx, kiln_tensor *a);
kiln_tensor *kiln_cast(kiln_ctx *ctx, kiln_tensor *a, kiln_type type);
kiln_tensor *kiln_repeat(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b);

/* Data movement, as ggml. get_rows: rows ids[i] of a -> [a.ne0, ids.ne0, ids.ne1, ids.ne2] (f32).
 * set_rows: a copy of a with rows ids[i] replaced by the rows of b (converted to a's type).
 * concat: a and b joined along dim. pad: zeros appended (pad) or on both sides (pad_ext).
 * add_id: a[:, i, t] + b[:, ids[i, t]] (mixture-of-experts biases). */
kiln_tensor *kiln_get_rows(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *ids);
kiln_tensor *kiln_set_rows(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b, kiln_tensor *ids);
kiln_tensor *kiln_concat(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b, int dim);
kiln_tensor *kiln_pad(kiln_ctx *ctx, kiln_tensor *a, int p0, int p1, int p2, int p3);
kiln_tensor *kiln_pad_ext(kiln_ctx *ctx, kiln_tensor *a, int lp0, int rp0, int lp1, int rp1,
                          int lp2, int rp2, int lp3, int rp3);
kiln_tensor *kiln_add_id(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b, kiln_tensor *ids);

/* Normalization over rows (dim 0), as ggml; group_norm over groups of ne2. */
kiln_tensor *kiln_norm(kiln_ctx *ctx, kiln_tensor *a, float eps);
kiln_tensor *kiln_rms_norm(kiln_ctx *ctx, kiln_tensor *a, float eps);
kiln_tensor *kiln_l2_norm(kiln_ctx *ctx, kiln_tensor *a, float eps);
kiln_tensor *kiln_group_norm(kiln_ctx *ctx, kiln_tensor *a, int n_groups, float eps);

/* soft_max(a * scale + mask * slope) over rows, as ggml_soft_max_ext; mask (f16 or f32) and
 * sinks (f32, one per head) may be NULL; max_bias > 0 enables ALiBi slopes. */
kiln_tensor *kiln_soft_max(kiln_ctx *ctx, kiln_tensor *a);
kiln_tensor *kiln_soft_max_ext(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *mask, float scale,
                               float max_bias, kiln_tensor *sinks);

/* Rotary embeddings, as ggml_rope_ext / ggml_rope_multi. pos: i32 positions (4 per token for
 * mrope/vision); freq_factors may be NULL. */
#define KILN_ROPE_NORMAL 0
#define KILN_ROPE_NEOX 2
#define KILN_ROPE_MROPE 8
#define KILN_ROPE_VISION 24
kiln_tensor *kiln_rope_ext(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *pos, kiln_tensor *freq_factors,
                           int n_dims, int mode, int n_ctx_orig, float freq_base, float freq_scale,
                           float ext_factor, float attn_factor, float beta_fast, float beta_slow);
kiln_tensor *kiln_rope_multi(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *pos, kiln_tensor *freq_factors,
                             int n_dims, const int sections[4], int mode, int n_ctx_orig,
                             float freq_base, float freq_scale, float ext_factor, float attn_factor,
                             float beta_fast, float beta_slow);

/* Reductions and selection, as ggml. argmax, argsort, argsort_top_k and top_k give i32. */
typedef enum { KILN_SORT_ASC, KILN_SORT_DESC } kiln_sort_order;
kiln_tensor *kiln_sum(kiln_ctx *ctx, kiln_tensor *a);
kiln_tensor *kiln_sum_rows(kiln_ctx *ctx, kiln_tensor *a);
kiln_tensor *kiln_mean(kiln_ctx *ctx, kiln_tensor *a);
kiln_tensor *kiln_argmax(kiln_ctx *ctx, kiln_tensor *a);
kiln_tensor *kiln_cumsum(kiln_ctx *ctx, kiln_tensor *a);
kiln_tensor *kiln_argsort(kiln_ctx *ctx, kiln_tensor *a, kiln_sort_order order);
kiln_tensor *kiln_argsort_top_k(kiln_ctx *ctx, kiln_tensor *a, int k);
kiln_tensor *kiln_top_k(kiln_ctx *ctx, kiln_tensor *a, int k);

/* Constructors and masks, as ggml. */
typedef enum { KILN_TRI_UPPER_DIAG, KILN_TRI_UPPER, KILN_TRI_LOWER_DIAG, KILN_TRI_LOWER } kiln_tri_type;
kiln_tensor *kiln_arange(kiln_ctx *ctx, float start, float stop, float step);
kiln_tensor *kiln_fill(kiln_ctx *ctx, kiln_tensor *a, float c);
kiln_tensor *kiln_diag_mask_inf(kiln_ctx *ctx, kiln_tensor *a, int n_past);
kiln_tensor *kiln_tri(kiln_ctx *ctx, kiln_tensor *a, kiln_tri_type type);
/* Tensor parallelism (docs/tp.md): the elementwise sum of a over the `ranks` programs of a
 * tensor-parallel group, each holding its own a (NCCL's all-reduce; a kiln op, not ggml's).
 * Over one rank the sum is a: a itself is returned. A graph holding one is evaluated by
 * kiln_reference_group with its group's other graphs; compiling one for the GPU is refused
 * until the NCCL step exists. */
kiln_tensor *kiln_all_reduce(kiln_ctx *ctx, kiln_tensor *a, int ranks);

/* Matrix products, as ggml. mul_mat(a, b) = b·aᵀ: a [K, M, A2, A3] (f32, f16, bf16; rows
 * contiguous), b f32 [K, N, B2, B3] (any layout), a broadcast over dims 2 and 3; result f32
 * [M, N, B2, B3]. mul_mat_id(as, b, ids): as [K, M, n_expert], b f32 [K, 1 or n_used, T],
 * ids i32 [n_used, T]; result f32 [M, n_used, T]. */
kiln_tensor *kiln_mul_mat(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_mul_mat_id(kiln_ctx *ctx, kiln_tensor *as, kiln_tensor *b, kiln_tensor *ids);

/* Attention, as ggml_flash_attn_ext (+ ggml_flash_attn_ext_add_sinks): q f32 [Dk, n_q, n_head,
 * n_seq], k/v [Dk|Dv, n_kv, n_head_kv, n_seq] (f32, f16 or bf16), mask f16 [n_kv, >= n_q, ...]
 * or NULL, sinks f32 [n_head] or NULL; result f32 [Dv, n_head, n_q, n_seq] (heads before
 * tokens). */
kiln_tensor *kiln_flash_attn_ext(kiln_ctx *ctx, kiln_tensor *q, kiln_tensor *k, kiln_tensor *v,
                                 kiln_tensor *mask, float scale, float max_bias, float logit_softcap,
                                 kiln_tensor *sinks);

/* Every supported op, one per line: name, kind, accepted types, .kg usage. Caller frees. */
kiln_status kiln_describe_ops(char **text);

/* ---- text graph format (.kg, docs/graph-format.md) ----------------------------------------- */

/* Parses text into ctx (which should be empty). filename only labels errors ("f.kg:3:7: ..."). */
kiln_status kiln_parse(kiln_ctx *ctx, const char *text, size_t len, const char *filename);
kiln_status kiln_load(kiln_ctx *ctx, const char *path);
/* Canonical text of every tensor in ctx; print(parse(print(g))) == print(g). Caller frees. */
kiln_status kiln_print(const kiln_ctx *ctx, char **text);

/* ---- graph, compile, run ------------------------------------------------------------------ */

/* The outputs of ctx and everything they depend on, in topological order. Fails when ctx holds
 * a builder error or no output. The graph refers to ctx, which must outlive it. */
kiln_status kiln_graph_new(kiln_ctx *ctx, kiln_graph **out);
void        kiln_graph_free(kiln_graph *g);
int          kiln_graph_size(const kiln_graph *g);
kiln_tensor *kiln_graph_node(const kiln_graph *g, int i); /* NULL if out of range */
/* The NMSE within which the GPU must agree with the CPU reference on g's f32 outputs: the
 * loosest tolerance of g's ops (as ggml's test-backend-ops sets them; mul_mat 5e-4), at least
 * 1e-6 so that last-bit differences of math functions pass. */
double       kiln_graph_nmse_tol(const kiln_graph *g);

typedef enum { KILN_CACHE_ON, KILN_CACHE_OFF, KILN_CACHE_READONLY, KILN_CACHE_REFRESH } kiln_cache_mode;

typedef struct {
    const char     *arch;       /* "sm_90a" (default), "sm_80", ... */
    const char     *dump_dir;   /* write each kernel's .cu and program.txt here (NULL: $KILN_DUMP) */
    const char     *cache_dir;  /* NULL: $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln */
    kiln_cache_mode cache_mode;
    int             no_fuse;    /* disable all fusion passes */
    const char     *no_fuse_passes; /* or only these: comma-separated pass names (kiln_fusion_pass) */
    int             skip_nvrtc; /* generate sources only (for inspect/tests); program cannot run */
    void (*log)(void *user, const char *line); /* warnings; NULL: stderr */
    void           *log_user;
    int             jobs;       /* threads for templates and NVRTC (0: $KILN_JOBS, else all CPUs) */
    int             no_program_cache; /* look up and store kernels only, never whole programs */
    /* Called as work completes (from worker threads, one call at a time): `what` is "kernels
     * generated" (templates) or "kernels compiled" (distinct kernels, from cache or NVRTC). */
    void (*progress)(void *user, const char *what, int done, int total);
    void           *progress_user;
} kiln_compile_opts;

/* The fusion passes, in pipeline order: name i (NULL past the last) and what it fuses. */
const char *kiln_fusion_pass(int i, const char **what);
/* NULL when every comma-separated name in list names a fusion pass; else an error that names
 * the unknown one and lists the passes. */
kiln_status kiln_check_fusion_passes(const char *list);
/* NULL when arch is a GPU architecture kiln generates code for: sm_XY, sm_XYa or sm_XYf
 * (cubins), compute_XY[a|f] (PTX), with XY at least 80 (Ampere: the kernels use bf16 tensor
 * cores and cp.async). Else KILN_ERR_INVALID naming it. kiln_compile and kiln_bundle_write
 * check their archs with it before any work. */
kiln_status kiln_check_arch(const char *arch);

typedef struct {
    int    kernels;        /* kernel launches and library calls in the program (all variants) */
    int    compiled;       /* distinct kernels compiled by NVRTC in this call */
    int    cached;         /* distinct kernels whose code came from the cache */
    int    corrupt;        /* cache entries found corrupt, removed and rebuilt */
    double ms;             /* wall time of kiln_compile */
    int    distinct;       /* distinct kernels (identical layers share one) */
    int    generated;      /* kernels instantiated from templates in this call (0 on a program hit) */
    int    program_cached; /* 1: the whole program came from the program cache (no Lua, no NVRTC) */
    int    cache_write_error; /* 0, or the errno (ENOSPC, EROFS, EACCES...) of a cache write that
                                 failed: the compile went on without writing the cache and
                                 warned once through log (docs/cache.md) */
} kiln_compile_stats;

/* Compiles g: a whole-program cache hit loads it; otherwise every distinct kernel comes from the
 * kernel cache or NVRTC, on `jobs` threads (docs/cache.md). */
kiln_status kiln_compile(const kiln_graph *g, const kiln_compile_opts *opts, kiln_program **out);
/* For each distinct kernel of g's program (compiled with opts: arch, fusion, cache_dir), whether
 * the cache holds it and, if not, which input of its key (kiln or codegen version, NVRTC
 * version, arch, options, or the source, with its first differing line) differs from the
 * nearest cached entry; the same for the whole program. Reads the cache, changes nothing, needs
 * no GPU. Caller frees *text. */
kiln_status kiln_cache_explain(const kiln_graph *g, const kiln_compile_opts *opts, char **text);
/* 16 hex digits identifying the sources kiln was built from (part of every program key). */
const char *kiln_build_id(void);
void        kiln_program_free(kiln_program *p);
void        kiln_program_stats(const kiln_program *p, kiln_compile_stats *stats);
/* The IR after passes and the memory plan, as deterministic text. Caller frees. */
kiln_status kiln_program_describe(const kiln_program *p, char **text);
/* Kernel i's generated CUDA source and 128-bit cache key as 32 hex digits; NULL if out of range. */
int         kiln_program_kernel_count(const kiln_program *p);
/* The target it was compiled for: "sm_90a" (cubins) or "compute_80" (PTX). */
const char *kiln_program_arch(const kiln_program *p);
const char *kiln_program_kernel_source(const kiln_program *p, int i);
const char *kiln_program_kernel_key(const kiln_program *p, int i);
const char *kiln_program_kernel_name(const kiln_program *p, int i);
/* Bytes of the program's inputs, weights and outputs: what a run must at least move through
 * memory (read once, written once), the numerator of an achieved-bandwidth figure. A buffer
 * read only as mul_mat_id's experts counts only the experts a run can select: at most
 * n_used x n_tokens of them (decode reads 8 of 128, not all). */
size_t      kiln_program_io_bytes(const kiln_program *p);

/* ---- AOT bundles (docs/bundles.md) ----------------------------------------------------------- */

/* One file with a graph, its programs for several GPU architectures and a signature of the
 * kiln that built it; running one needs neither NVRTC nor the templates. */
typedef struct kiln_bundle kiln_bundle;
/* Compiles g for each arch ("sm_90a", "sm_80"; none: sm_90a) and writes path (atomically): a
 * cubin program per arch plus a PTX program (compute_XY) that the driver can compile for later
 * GPUs. Uses and fills the caches like kiln_compile. */
kiln_status kiln_bundle_write(const kiln_graph *g, const kiln_compile_opts *opts, int narchs,
                              const char *const *archs, const char *path);
/* Reads path and checks its checksum and signature (this kiln version and program format, the
 * graph, the targets). No GPU or NVRTC needed. */
kiln_status kiln_bundle_open(const char *path, kiln_bundle **out);
void        kiln_bundle_free(kiln_bundle *b);
const char *kiln_bundle_graph_text(const kiln_bundle *b); /* the .kg text of its graph */
/* The program for a GPU of arch device_arch (kiln_device_arch): the best fitting cubin, else
 * PTX; refused, naming what the bundle holds, when nothing fits. g must be parsed from
 * kiln_bundle_graph_text (the program is checked against it). */
kiln_status kiln_bundle_program(const kiln_bundle *b, const kiln_graph *g, const char *device_arch,
                                kiln_program **out);
/* Verifies every program against the graph and describes the bundle. Caller frees. */
kiln_status kiln_bundle_describe(const kiln_bundle *b, char **text);
/* The arch kiln compiles for on CUDA device `device`: "sm_90a" for compute capability 9.0
 * (arch-specific from 9.0 on), "sm_80" for 8.0. Needs the driver (KILN_ERR_NO_GPU without). */
kiln_status kiln_device_arch(int device, char *arch, size_t cap);
/* The CUDA devices of this machine (KILN_ERR_NO_GPU without a driver or a GPU). */
kiln_status kiln_device_count(int *n);
typedef struct {
    char     name[128]; /* "NVIDIA H100 80GB HBM3" */
    char     arch[16];  /* as kiln_device_arch */
    int      sm_count;
    uint64_t memory_bytes;
} kiln_device_info;
kiln_status kiln_device_get_info(int device, kiln_device_info *out);
/* The device's copy bandwidth, the roofline of memory-bound kernels: a device-to-device copy
 * of `bytes` (several times the L2) repeated `iters` times; GB/s counts the bytes read plus
 * the bytes written (1 GB = 1e9 B), of the median copy. */
kiln_status kiln_device_copy_bandwidth(int device, size_t bytes, int iters, double *gb_per_s);
/* Evicts the device's L2 cache (reads a buffer of four times its size, kept for the process,
 * so that no dirty line is left for the next kernel to write back) and waits, so that the next run reads its data from memory: for timing working sets smaller
 * than the L2, as a model's weights never are at decode. */
kiln_status kiln_device_flush_l2(int device);

typedef struct {
    int no_cuda_graph; /* launch kernels one by one instead of replaying a captured CUDA graph */
    int device;        /* CUDA device ordinal */
} kiln_session_opts;

/* Loads the program on the GPU. Fails with KILN_ERR_NO_GPU when no driver or device exists. */
kiln_status kiln_session_new(const kiln_program *p, const kiln_session_opts *opts, kiln_session **out);
void        kiln_session_free(kiln_session *s);
/* Copies host data into the input or weight named name; bytes must equal its contiguous size. */
kiln_status kiln_session_set(kiln_session *s, const char *name, const void *data, size_t bytes);
/* Runs the program once and waits for it. The first run with CUDA graphs captures; later ones replay. */
kiln_status kiln_session_run(kiln_session *s);
kiln_status kiln_session_get(kiln_session *s, const char *name, void *data, size_t bytes);
/* The first `bytes` (at most its contiguous size) of output `name`: the first rows of the
 * logits, say, without copying the rest. */
kiln_status kiln_session_get_prefix(kiln_session *s, const char *name, void *data, size_t bytes);
/* Uploads every weight of the program in one pass: get returns the host data of weight `name`
 * (its contiguous bytes, e.g. in a mapped GGUF file; NULL is an error naming the weight). The
 * data goes through two pinned staging buffers, copied on several threads while the previous
 * block is in flight, so a weight file streams from the page cache at PCIe speed. progress
 * (may be NULL) gets bytes done and total. */
typedef const void *(*kiln_weight_fn)(void *user, const char *name, kiln_type type, size_t bytes);
kiln_status kiln_session_load_weights(kiln_session *s, kiln_weight_fn get, void *user,
                                      void (*progress)(void *user, uint64_t done, uint64_t total),
                                      void *progress_user);
/* Weights made on the device instead of uploaded (random models: benchmarks, tests). For each
 * weight init(user, name, type, ne, out) sets out: out->host non-NULL uploads those bytes as they
 * are; otherwise element e (in contiguous order) becomes base + scale * u(e), rounded to nearest
 * even into the weight's type (f32, f16 or bf16), with u(e) = (mix(key + e * 0x9e3779b97f4a7c15)
 * >> 40) * 2^-23 - 1 in [-1, 1) and mix splitmix64's finalizer: the values kiln_model_write_random
 * writes into a file, bit for bit. A kernel writes them at memory speed. */
typedef struct {
    const void *host;
    uint64_t    key;
    float       scale, base;
} kiln_weight_init;
typedef kiln_status (*kiln_weight_init_fn)(void *user, const char *name, kiln_type type, const int64_t ne[4],
                                           kiln_weight_init *out);
kiln_status kiln_session_fill_weights(kiln_session *s, kiln_weight_init_fn init, void *user);
/* Chained runs: greedy decoding without a host round trip a step. Between
 * kiln_session_chain_begin and _end, output `out` of each run is fed on the device into input
 * `in` of the next (an argmax into the token ids: one size, small, fixed or of one dimension;
 * the bytes are copied as they are), and the host stays one run ahead: kiln_session_chain_run
 * queues a run with the inputs set since the last one, then waits for the run before it and
 * gives its `out` (prev, bytes; *got says whether there was one: not at the first run). So the
 * caller sets run k+1's inputs while the GPU runs run k. Inputs keep their values from run to
 * run, as with kiln_session_run; `in` may be set only before the first run (inputs over 64 KiB
 * may be set too, but each such set waits for the runs in flight). kiln_session_chain_end
 * waits for the last run and gives its `out` (last may be NULL; untouched when no run was
 * queued), and always closes the chain, also after an error (after a failed _run, only _end is
 * accepted). While a chain is open, kiln_session_run, _get, _load_weights and _fill_weights
 * are errors, and the dims must keep the program variant and the sizes of out and in they had
 * at _begin.
 * kiln_session_last_ms gives the GPU time of the run whose `out` _run or _end just gave. */
kiln_status kiln_session_chain_begin(kiln_session *s, const char *out, const char *in);
kiln_status kiln_session_chain_run(kiln_session *s, void *prev, size_t bytes, bool *got);
kiln_status kiln_session_chain_end(kiln_session *s, void *last, size_t bytes);
/* Milliseconds of GPU time of the last run (events around it). */
double      kiln_session_last_ms(const kiln_session *s);
int         kiln_session_captures(const kiln_session *s); /* CUDA graphs captured so far */

/* Sets symbolic dim `name` for the following runs (1 .. its maximum; initially the maximum).
 * Set dims before the inputs whose shape they change: kiln_session_set and kiln_session_get
 * take and give symbolic inputs and outputs contiguous at the current values. A change of
 * value neither recompiles nor re-captures: kernels read the values from device memory that
 * the captured graph refreshes at each replay. A program specialized for a value
 * (kiln_dim_specialize) runs whenever the dims have that value. */
kiln_status kiln_session_set_dim(kiln_session *s, const char *name, int64_t value);

typedef struct {
    int64_t runs;          /* kiln_session_run calls that succeeded */
    int64_t captures;      /* CUDA graphs captured (one per program variant, at its first run) */
    int64_t replays;       /* runs that replayed a captured graph */
    int64_t plain_runs;    /* runs that launched kernel by kernel (KILN_CUDA_GRAPHS=0, or a
                              variant with a library call whose size varies) */
    double  host_us_last;  /* host time of the last run until its work was queued (excludes
                              waiting for the GPU) */
    double  host_us_total;
    int     variant;       /* program variant of the last run: 0 general, i > 0 specialization i */
} kiln_session_stats;
void kiln_session_get_stats(const kiln_session *s, kiln_session_stats *out);

/* ---- groups: one program per GPU, joined by NCCL (tensor parallelism, docs/tp.md) ----------- */

/* A group runs n programs, one per GPU, whose all_reduce steps sum over the group: the programs
 * of the n ranks of a split model (kiln_build_opts.tp_size = n, tp_rank = r), program r on
 * devices[r] (NULL: devices 0 .. n-1). One process drives every GPU: kiln_group_new creates a
 * session per rank and one NCCL communicator spanning them (ncclCommInitAll; NCCL is loaded with
 * dlopen, and NCCL_NVLS_ENABLE=0 is set unless the environment sets it). Each rank's session is
 * used as any other for its inputs, weights, dims and outputs (kiln_group_session); only its
 * runs go through kiln_group_run, which runs every rank at once (a thread each: an all_reduce
 * waits for all ranks) and returns the first rank's error. Fails with KILN_ERR_NO_GPU without a
 * driver, NCCL or n GPUs, and KILN_ERR_INVALID when a program's all_reduce is over another
 * number of ranks. */
typedef struct kiln_group kiln_group;
typedef struct {
    int        no_cuda_graph; /* as kiln_session_opts */
    const int *devices;       /* n device ordinals, or NULL */
} kiln_group_opts;
kiln_status   kiln_group_new(const kiln_program *const *programs, int n, const kiln_group_opts *opts, kiln_group **out);
void          kiln_group_free(kiln_group *g);
int           kiln_group_size(const kiln_group *g);
kiln_session *kiln_group_session(const kiln_group *g, int rank); /* NULL out of range */
kiln_status   kiln_group_run(kiln_group *g);

/* ---- CPU reference -------------------------------------------------------------------------- */

/* Evaluates g on the CPU with ggml semantics, node by node, nothing fused. Inputs and weights
 * come from get(user, name, type, nelements) returning contiguous host data of that type. Each
 * output's contiguous values are passed to put. */
typedef const void *(*kiln_ref_get_fn)(void *user, const char *name, kiln_type type, int64_t n);
typedef void (*kiln_ref_put_fn)(void *user, const char *name, kiln_type type, int64_t n,
                                const void *data);
kiln_status kiln_reference(const kiln_graph *g, kiln_ref_get_fn get, kiln_ref_put_fn put, void *user);
/* The CPU reference of a tensor-parallel group's n graphs (rank i: g[i], with get, put and
 * user[i]), evaluated together, one thread a rank: an all_reduce node of every rank waits for
 * the others' and gives each of them the sum of all ranks' values, added in rank order. The
 * ranks' graphs must reach the same all_reduce nodes in the same order, each over n ranks; a
 * rank that fails or ends early makes the others' waiting all_reduce fail. */
kiln_status kiln_reference_group(const kiln_graph *const *g, int n, kiln_ref_get_fn get, kiln_ref_put_fn put,
                                 void *const *user);

/* ---- model builders (docs/models.md) -------------------------------------------------------
 * Whole-model graphs of one ubatch, node for node as llama.cpp builds them with flash attention
 * and a KV cache, weights named as in GGUF ("blk.0.attn_q.weight"), so that a GGUF file's
 * tensors bind by name. Hyperparameters come from a preset or (issue 8) a GGUF header. */

typedef enum {
    KILN_ROPE_SCALING_NONE,
    KILN_ROPE_SCALING_LINEAR, /* positions divided by rope_factor (freq_scale = 1 / factor) */
    KILN_ROPE_SCALING_YARN,   /* freq_scale 1 / rope_factor, ext_factor 1, n_ctx_orig rope_orig_ctx,
                                 attn_factor rope_attn_factor (0: 1) */
    KILN_ROPE_SCALING_LLAMA3, /* per-frequency factors, the weight "rope_freqs.weight" */
    KILN_ROPE_SCALING_LONGROPE, /* phi3: per-frequency factors "rope_factors_long.weight" (caches
                                   longer than rope_orig_ctx) or "rope_factors_short.weight", and
                                   the rotation scaled by rope_attn_factor */
} kiln_rope_scaling;

/* File types: llama.cpp's llama_ftype numbers, the value of GGUF's general.file_type. Each gives
 * every weight a type by llama-quantize's rules (kiln_model_weight_type; docs/models.md): the
 * float ones one type for all matrices, the quantized ones a mix (Q4_K_M: q4_K, with q6_K for
 * the output and for attn_v and ffn_down in some layers). Norms, biases and the router stay f32. */
typedef enum {
    KILN_FTYPE_ALL_F32 = 0,
    KILN_FTYPE_MOSTLY_F16 = 1,
    KILN_FTYPE_MOSTLY_Q4_0 = 2,
    KILN_FTYPE_MOSTLY_Q8_0 = 7,
    KILN_FTYPE_MOSTLY_Q5_0 = 8,
    KILN_FTYPE_MOSTLY_Q5_1 = 9,
    KILN_FTYPE_MOSTLY_Q4_K_M = 15,
    KILN_FTYPE_MOSTLY_Q5_K_M = 17,
    KILN_FTYPE_MOSTLY_Q6_K = 18,
    KILN_FTYPE_MOSTLY_BF16 = 32,
    KILN_FTYPE_MOSTLY_MXFP4_MOE = 38, /* experts (3-D weights) mxfp4, the other matrices q8_0 */
} kiln_ftype;
/* "f32", "f16", "bf16", "q8_0", "q4_0", "q5_0", "q5_1", "q4_k_m", "q5_k_m", "q6_k", "mxfp4_moe" ("?" for another value), and
 * back (case-insensitive; 0, or -1 for an unknown name). */
const char *kiln_ftype_name(kiln_ftype f);
int         kiln_ftype_from_name(const char *name, kiln_ftype *out);
/* "f32, f16, bf16, q8_0, q4_0, q5_0, q5_1, q4_k_m, q5_k_m, q6_k, mxfp4_moe", for messages. */
const char *kiln_ftype_list(void);

/* How routed experts are chosen from the router's logits (GGUF ARCH.expert_gating_func, with
 * llama.cpp's numbers; 0: the arch's own, softmax). */
typedef enum {
    KILN_GATING_DEFAULT = 0,
    KILN_GATING_SOFTMAX = 1,
    KILN_GATING_SIGMOID = 2,
} kiln_expert_gating;

typedef struct {
    char     arch[32];        /* "llama", "qwen2", "qwen3", "qwen3moe", ... (km_arch_list) */
    int64_t  n_vocab;
    int64_t  n_ctx_train;     /* also rope's n_ctx_orig */
    int64_t  n_embd;
    int64_t  n_layer;
    int64_t  n_head;
    int64_t  n_head_kv;       /* divides n_head (GQA) */
    int64_t  head_dim;        /* n_embd_head_k (= n_embd_head_v and n_rot unless head_dim_v, n_rot say) */
    int64_t  n_ff;            /* dense FFN width (unused by qwen3moe's expert layers) */
    float    rms_norm_eps;
    float    rope_freq_base;
    kiln_rope_scaling rope_scaling;
    float    rope_factor;     /* linear and llama3: the scaling factor */
    float    rope_low_freq_factor, rope_high_freq_factor; /* llama3 */
    int64_t  rope_orig_ctx;   /* llama3, longrope: original_max_position_embeddings */
    float    rope_attn_factor; /* longrope: GGUF rope.scaling.attn_factor (0: 1), ggml_rope_ext's
                                  attn_factor */
    bool     tied_output;     /* no "output.weight": the logits use "token_embd.weight" */
    bool     qk_norm;         /* qwen3, qwen3moe: RMS norm of each Q and K head */
    bool     attn_bias;       /* qwen2 (llama optionally): Q, K and V biases */
    int64_t  n_expert;        /* qwen3moe: experts, of which n_expert_used per token */
    int64_t  n_expert_used;
    int64_t  n_ff_exp;        /* one expert's FFN width */
    bool     norm_topk_prob;  /* the selected experts' weights renormalized to sum 1 */
    /* granite's multipliers (0: absent; GGUF ARCH.embedding_scale, .residual_scale,
     * .attention.scale, .logit_scale): the embeddings times embedding_scale, each residual
     * branch times residual_scale before its add, attention scores times attention_scale
     * instead of 1/sqrt(head_dim), the logits divided by logit_scale. */
    float    embedding_scale, residual_scale, attention_scale, logit_scale;
    /* gemma2/3's interleaved sliding-window attention (0: none; GGUF ARCH.attention.sliding_window):
     * layers il with il % swa_pattern < swa_pattern - 1 (llama.cpp's set_swa_pattern; gemma3: 6,
     * gemma2: 2, constants of its loader) see only the n_swa newest positions (a query at p, a key
     * at p0 <= p - n_swa masked) and rope with base rope_freq_base_swa and no scaling (gemma3:
     * 10000; gemma2: its rope_freq_base, unscaled as its global layers). */
    int64_t  n_swa, swa_pattern;
    float    rope_freq_base_swa;
    /* gemma3: Q times query_scale after its rope, attention then unscaled (llama.cpp's
     * f_attention_scale: 1/sqrt(head_dim), 27B 1/sqrt(n_embd / n_head); 0: none) */
    float    query_scale;
    /* gemma2's soft-capping (0: none; GGUF ARCH.attn_logit_softcapping, .final_logit_softcapping,
     * defaults 50 and 30 as llama.cpp's hparams): attention scores s -> c tanh(s / c) (flash
     * attention's logit_softcap), the logits likewise (scale, tanh, scale) */
    float    attn_softcap, final_softcap;
    /* deepseek2's multi-head latent attention (kv_lora_rank 0: none; llama.cpp's MLA path):
     * head_dim is a Q/K head's size before absorption (key_length_mla: nope + rope part),
     * head_dim_v a V head's (value_length_mla), n_rot the rope part at the end of each Q head
     * and of the shared K. K/V are cached as kv_lora_rank latent + n_rot roped values per token
     * (one KV head: n_head_kv 1); q_lora_rank > 0: Q through attn_q_a, its norm and attn_q_b. */
    int64_t  kv_lora_rank, q_lora_rank;
    int64_t  head_dim_v;      /* 0: head_dim */
    int64_t  n_rot;           /* rotary dims of a head (0: head_dim) */
    /* deepseek2's YaRN attention factor (GGUF rope.scaling.yarn_log_multiplier / 0.1, as llama.cpp
     * loads it; 0: none): scores times (1 + 0.1 m ln factor)^2, the rope itself unscaled */
    float    rope_yarn_log_mul;
    /* deepseek2's FFNs: the first n_layer_dense_lead layers dense (n_ff), the rest routed experts
     * plus n_expert_shared shared ones (one FFN of n_ff_exp * n_expert_shared, unweighted);
     * routing by softmax or sigmoid of the router's logits, exp_probs_b (expert_probs_bias)
     * added for the choice only, the chosen weights times expert_weights_scale (0: none). */
    int64_t  n_layer_dense_lead, n_expert_shared;
    kiln_expert_gating expert_gating;
    bool     expert_probs_bias;
    float    expert_weights_scale;
    /* group-limited routing (0 or 1: none): experts in n_expert_groups groups, a group scored by
     * the sum of its two best, experts only from the n_group_used best groups */
    int64_t  n_expert_groups, n_group_used;
    kiln_ftype ftype;         /* the weights' types (kiln_model_weight_type); from a GGUF file:
                                 its general.file_type, and each weight's type is the file's */
} kiln_model_hparams;

/* The hyperparameters of preset `name` ("tiny", "llama-3-8b", ...; sources in docs/models.md).
 * arch may be NULL (the preset's own arch); "tiny" exists for every arch. An unknown arch or
 * preset, or a preset of another arch, is an error listing the known ones. */
kiln_status kiln_model_preset(const char *arch, const char *name, kiln_model_hparams *out);
/* Preset i (NULL past the last) and its arch, for listings. */
const char *kiln_model_preset_name(int i, const char **arch);
/* Checks hp as kiln_build_model does; the error names the field. */
kiln_status kiln_model_check(const kiln_model_hparams *hp);
/* The type hp->ftype gives weight `name` ("blk.3.attn_v.weight", "output.weight", ...) of a
 * model of hp, as llama-quantize picks it (docs/models.md: the mix, and where kiln deviates);
 * KILN_TYPE_COUNT for a name that is not one of the model's weights. */
kiln_type   kiln_model_weight_type(const kiln_model_hparams *hp, const char *name);
/* The values of "rope_freqs.weight" for KILN_ROPE_SCALING_LLAMA3 (head_dim / 2 floats, as
 * llama.cpp's converter computes them), for a GGUF writer or random-weight runs. */
kiln_status kiln_model_rope_freqs(const kiln_model_hparams *hp, float *out, int64_t n);

typedef enum {
    KILN_OUTPUTS_LAST, /* logits of one token: inp_out_ids i32[1] picks the row (n_tokens - 1) */
    KILN_OUTPUTS_ALL,  /* logits of every token: inp_out_ids i32[n_tokens] (0, 1, ...) */
} kiln_model_outputs;

typedef struct {
    int64_t n_ctx;        /* KV cache slots: the caches' rows and n_kv's maximum (0: 4096,
                             at most n_ctx_train) */
    int64_t n_tokens_max; /* tokens of one ubatch: n_tokens' maximum (0: 512) */
    kiln_model_outputs outputs;
    bool    argmax;       /* also output "argmax", i32 [n_outputs]: the index of each logits
                             row's largest value (ggml_argmax), what greedy decoding reads back */
    /* NULL, or also output "sample", i32 [1]: the token these parameters sample from the
     * logits (op sample, kiln_sample_row; outputs must be KILN_OUTPUTS_LAST, and the parameters
     * kiln_sampler_on_gpu's), keyed by the seed and the position after the last token. Points
     * to kiln_sampler_params (include/kiln.h, section "sampling"). */
    const struct kiln_sampler_params *sampler;
    /* kq_mask (and kq_mask_swa) as key intervals, i32 [2, n_tokens]: token t sees the cells
     * kq_mask[0, t] <= j < kq_mask[1, t], instead of an f16 [n_kv, n_tokens] mask. A batch of
     * sequences, each in its own range of cells (kiln_batch), then moves 8 bytes a token, and
     * attention reads only each token's own cells. */
    bool mask_intervals;
    /* Tensor parallelism (docs/tp.md): 0 or 1 for the whole model; g > 1 for the graph of rank
     * tp_rank of g, Megatron-style: its share of the heads, kv heads (and caches), FFN columns
     * and vocabulary (weights named as the model's, shaped km_tp_rank_shape), an all_reduce over
     * g after the attention output and FFN down products and after the embedding lookup, and
     * "logits" its vocabulary rows tp_rank*n_vocab/g .. (the host concatenates the ranks'). Its
     * "inp_tokens" are rank-local rows (a token outside the shard: any row in it) and the input
     * "inp_tok_shard" f32 [1, n_tokens] is 1 where the token is in the shard, else 0 (the lookup's
     * rows elsewhere count as zero). Not yet: experts, MLA, biases after a row-parallel product,
     * argmax and sampler outputs (they need the whole vocabulary). */
    int  tp_size, tp_rank;
    /* Pipeline (layer) split (docs/tp.md): 0 and 0 for every layer; else the graph of layers
     * layer_first .. layer_end - 1 alone (layer_end 0: to the last), a stage of the model. A
     * stage after the first takes the input "inp_hidden" f32 [n_embd, n_tokens] (the stage
     * before's output) instead of inp_tokens; a stage before the last outputs "hidden" f32
     * [n_embd, n_tokens] (every token's row) instead of the logits. Its states are its layers'
     * caches. Not with tp_size > 1; argmax and the sampler only in the last stage. */
    int  layer_first, layer_end;
    /* 0, or 2 .. n_tokens_max - 1: also a program for ubatches of at most this many tokens
     * (kiln_dim_specialize_upto of n_tokens): batched decode steps take plans made for few
     * columns, such as quantized products read once for all tokens, without the steps that
     * serve a prefill of n_tokens_max tokens. */
    int64_t n_tokens_upto;
} kiln_build_opts;

/* Adds the model's graph to ctx (which should be empty): dims n_tokens (specialize 1: the decode
 * program) and n_kv; inputs inp_tokens, inp_pos, kv_idxs, kq_mask, inp_out_ids; states
 * cache_k_lN, cache_v_lN; GGUF-named weights; the output "logits" f32 [n_vocab, n_outputs].
 * o may be NULL (defaults). Unknown arch or bad hyperparameters: an error naming them. */
kiln_status kiln_build_model(kiln_ctx *ctx, const kiln_model_hparams *hp, const kiln_build_opts *o);
/* The context a build gets for n_ctx 0: 4096 slots, or n_ctx_train when smaller. */
int64_t     kiln_default_n_ctx(const kiln_model_hparams *hp);
/* The batch a build (and kiln_gen, kiln_batch, kiln serve's -b) gets for n_tokens_max 0 in a
 * context of n_ctx: 512 tokens, or n_ctx when smaller. */
int64_t     kiln_default_n_batch(int64_t n_ctx);

/* ---- GGUF files (docs/gguf.md) ---------------------------------------------------------------
 * GGUF v2 and v3 (ggml's model format), read over mmap. kiln_gguf_open checks the whole file
 * before it returns: every count, string length, dimension, offset and size against the file
 * and for overflow, each tensor inside the data section, aligned, and overlapping no other. A
 * malformed file is an error (KILN_ERR_FORMAT) naming the field and its byte offset, never a
 * crash. Strings are not NUL-terminated in the file: getters give pointer and length. An open
 * kiln_gguf does not change: its getters may run on many threads. */

typedef struct kiln_gguf kiln_gguf;

/* Value types, numbered as in the file. */
typedef enum {
    KILN_GGUF_U8 = 0, KILN_GGUF_I8, KILN_GGUF_U16, KILN_GGUF_I16, KILN_GGUF_U32, KILN_GGUF_I32,
    KILN_GGUF_F32, KILN_GGUF_BOOL, KILN_GGUF_STRING, KILN_GGUF_ARRAY, KILN_GGUF_U64,
    KILN_GGUF_I64, KILN_GGUF_F64, KILN_GGUF_TYPE_COUNT
} kiln_gguf_type;
const char *kiln_gguf_type_name(kiln_gguf_type t); /* "u32", "string", ...; "?" if unknown */

kiln_status kiln_gguf_open(const char *path, kiln_gguf **out);
/* The same checks over bytes in memory (copied; label names it in errors), for tests and tools. */
kiln_status kiln_gguf_open_memory(const void *data, size_t size, const char *label, kiln_gguf **out);
void        kiln_gguf_close(kiln_gguf *g);
uint32_t    kiln_gguf_version(const kiln_gguf *g);
size_t      kiln_gguf_alignment(const kiln_gguf *g);   /* general.alignment, default 32 */
size_t      kiln_gguf_data_offset(const kiln_gguf *g); /* where the tensor data section starts */

/* Key-value metadata, in file order. Past the end: key NULL, type KILN_GGUF_TYPE_COUNT. */
int64_t        kiln_gguf_kv_count(const kiln_gguf *g);
const char    *kiln_gguf_kv_key(const kiln_gguf *g, int64_t i);  /* NUL-terminated copy */
kiln_gguf_type kiln_gguf_kv_type(const kiln_gguf *g, int64_t i);
int64_t        kiln_gguf_find_kv(const kiln_gguf *g, const char *key); /* index or -1 */
/* Typed getters: KILN_ERR_NOT_FOUND when the key is absent, KILN_ERR_FORMAT (naming the key,
 * its type and the value) when it has another type or does not fit. get_int takes any integer
 * type (and bool); get_float takes f32 or f64. */
kiln_status kiln_gguf_get_int(const kiln_gguf *g, const char *key, int64_t *out);
kiln_status kiln_gguf_get_float(const kiln_gguf *g, const char *key, double *out);
kiln_status kiln_gguf_get_bool(const kiln_gguf *g, const char *key, bool *out);
kiln_status kiln_gguf_get_str(const kiln_gguf *g, const char *key, const char **s, size_t *len);
/* An array: its element type and count (each out may be NULL). Numeric elements are contiguous
 * little-endian at *data (NULL for string arrays), NOT necessarily aligned: read them with
 * memcpy. String element i through kiln_gguf_get_arr_str (O(1); i >= n: KILN_ERR_INVALID). */
kiln_status kiln_gguf_get_arr(const kiln_gguf *g, const char *key, kiln_gguf_type *elem, uint64_t *n,
                              const void **data);
kiln_status kiln_gguf_get_arr_str(const kiln_gguf *g, const char *key, uint64_t i, const char **s,
                                  size_t *len);

/* Tensors, in file order. ggml_type is the file's type code; type_name ggml's name of it ("f16",
 * "q4_K", ...); kiln_type is set when the type is one kiln computes with (f32, f16, bf16, i32,
 * i64), else has_kiln_type is false (and type is KILN_F32). Quantized types are read (their
 * sizes checked) but not refused here. data points into the mapping, valid until close. */
typedef struct {
    const char *name;
    uint32_t    ggml_type;
    const char *type_name;
    bool        has_kiln_type;
    kiln_type   type;
    int         n_dims;
    int64_t     ne[KILN_MAX_DIMS]; /* 1 past n_dims */
    uint64_t    offset;            /* relative to the data section */
    size_t      bytes;
    const void *data;
} kiln_gguf_tensor;
int64_t     kiln_gguf_tensor_count(const kiln_gguf *g);
int64_t     kiln_gguf_find_tensor(const kiln_gguf *g, const char *name); /* index or -1 */
kiln_status kiln_gguf_tensor_info(const kiln_gguf *g, int64_t i, kiln_gguf_tensor *out);

/* The writer: metadata and tensors in the order added, written in one pass. Tensor data is given
 * at add time or, with data NULL, produced by `fill` while writing (models larger than memory).
 * Setting a key again replaces its value (and type) where it stands. Errors (bad name, duplicate
 * tensor, too many dims, general.alignment not a u32 power of 2) are recorded and returned by
 * kiln_gguf_write. */
typedef struct kiln_gguf_writer kiln_gguf_writer;
kiln_gguf_writer *kiln_gguf_writer_new(void);
void kiln_gguf_writer_free(kiln_gguf_writer *w);
void kiln_gguf_set_u32(kiln_gguf_writer *w, const char *key, uint32_t v);
void kiln_gguf_set_i32(kiln_gguf_writer *w, const char *key, int32_t v);
void kiln_gguf_set_u64(kiln_gguf_writer *w, const char *key, uint64_t v);
void kiln_gguf_set_f32(kiln_gguf_writer *w, const char *key, float v);
void kiln_gguf_set_bool(kiln_gguf_writer *w, const char *key, bool v);
void kiln_gguf_set_str(kiln_gguf_writer *w, const char *key, const char *v);
/* A scalar of any numeric type or bool (not string or array): *v is one value of that type
 * (a bool is one byte, 0 or 1). */
void kiln_gguf_set_scalar(kiln_gguf_writer *w, const char *key, kiln_gguf_type type, const void *v);
/* Numeric arrays: n elements of type elem (not string or array) copied from data. */
void kiln_gguf_set_arr(kiln_gguf_writer *w, const char *key, kiln_gguf_type elem, uint64_t n, const void *data);
void kiln_gguf_set_arr_str(kiln_gguf_writer *w, const char *key, uint64_t n, const char *const *v);
/* A tensor of a kiln type; ne has n_dims (1..4) extents. data (nbytes of it) is copied, or NULL. */
void kiln_gguf_add_tensor(kiln_gguf_writer *w, const char *name, kiln_type type, int n_dims,
                          const int64_t *ne, const void *data);
/* Produces bytes [offset, offset + bytes) of tensor i (in the order tensors were added) into buf.
 * Each tensor's chunks come in order, cover it, hold whole elements (whole blocks of a quantized
 * type) and are at most 32 MiB: the
 * writer's buffer, so a model of any size streams through bounded memory. A non-NULL status
 * aborts the write. */
typedef kiln_status (*kiln_gguf_fill_fn)(void *user, int64_t i, const char *name, uint64_t offset, void *buf,
                                         size_t bytes);
/* Writes version 3 to path atomically (PATH.tmp.PID renamed at the end, removed on error). The
 * same calls give the same bytes. progress, if not NULL, is called with bytes written so far
 * and the total, last with done == total. The writer may be written again. */
kiln_status kiln_gguf_write(kiln_gguf_writer *w, const char *path, kiln_gguf_fill_fn fill, void *user,
                            void (*progress)(void *user, uint64_t done, uint64_t total));

/* ---- tokenizer (docs/tokenizer.md) -----------------------------------------------------------
 * Byte-level BPE as GPT-2, Llama 3 and Qwen use it ("gpt2" in tokenizer.ggml.model), giving
 * llama.cpp's ids: text is split by the pre-tokenizer's rules, each piece's bytes mapped to
 * printable characters, then merged by rank. Invalid UTF-8 is read as llama.cpp reads it (a bad
 * byte is U+FFFD), never an error. SentencePiece BPE as Llama 2, Mistral and Gemma use it
 * ("llama"): spaces become U+2581, a space is put before the text, characters are merged by
 * the score of the token they make, and what is left that is no token becomes byte tokens
 * <0xXX> (byte fallback). In both, special tokens (control, user-defined and unknown types)
 * match as whole strings, longest first. A tokenizer does not change once built: tokenize and
 * detokenize may run on many threads. */
typedef struct kiln_tokenizer kiln_tokenizer;
typedef enum { KILN_TOKEN_NORMAL = 1, KILN_TOKEN_UNKNOWN, KILN_TOKEN_CONTROL, KILN_TOKEN_USER_DEFINED,
               KILN_TOKEN_UNUSED, KILN_TOKEN_BYTE } kiln_token_type; /* GGUF's numbering */
typedef struct {
    int64_t            n_tokens;
    const char *const *tokens;   /* n_tokens strings, in the byte-to-unicode form */
    const int32_t     *types;    /* n_tokens kiln_token_type values, or NULL (all normal) */
    int64_t            n_merges;
    const char *const *merges;   /* "a b": rank i merges a and b */
    const char        *pre;      /* "llama-bpe" (or "llama3"), "qwen2", "gpt2" (or "gpt-2"); NULL: gpt2 */
    int32_t            bos, eos; /* -1: none */
    bool               add_bos;
    /* SentencePiece: model "llama" (NULL or "gpt2": byte-level BPE, and the fields below are not
     * used); tokens are then plain text with U+2581 for spaces, no merges or pre. */
    const char        *model;
    const float       *scores;   /* n_tokens scores, or NULL (all 0) */
    int32_t            unk;      /* the unknown token, -1: none */
    bool               add_space_prefix; /* a space before the text (llama.cpp's default: true) */
} kiln_tokenizer_spec;
kiln_status kiln_tokenizer_new(const kiln_tokenizer_spec *spec, kiln_tokenizer **out);
/* From a GGUF's tokenizer.ggml.* keys (model, pre, tokens, token_type, merges, bos/eos ids,
 * add_bos_token; for "llama": scores, unknown_token_id, add_space_prefix); an unsupported model
 * (e.g. "bert" WordPiece) or pre-tokenizer is refused by name. The GGUF may be closed after. */
kiln_status kiln_tokenizer_from_gguf(const kiln_gguf *g, kiln_tokenizer **out);
void        kiln_tokenizer_free(kiln_tokenizer *t);
int64_t     kiln_tokenizer_n_vocab(const kiln_tokenizer *t);
int32_t     kiln_tokenizer_bos(const kiln_tokenizer *t); /* -1: none */
int32_t     kiln_tokenizer_eos(const kiln_tokenizer *t);
/* End-of-generation ids as llama.cpp's vocabulary loader counts them (src/llama-vocab.cpp):
 * eos, and from g (may be NULL) tokenizer.ggml.eot_token_id and eom_token_id; the
 * fill-in-the-middle pad, repo and file-separator tokens (their keys, else their texts); every
 * token whose text is <|eot_id|>, <|im_end|>, <|end|>, <|return|>, <|call|>, <end_of_turn>,
 * <|endoftext|>, <|eom_id|>, <EOT>, _<EOT>, <|end_of_text|> or <end_of_utterance>; without
 * <|end|> when <|return|> and <|call|> are tokens (gpt-oss). Caller frees *ids. */
kiln_status kiln_tokenizer_eog(const kiln_tokenizer *t, const kiln_gguf *g, int32_t **ids, int64_t *n);
/* Token ids of text (bos first when the spec says add_bos). Caller frees *ids. */
kiln_status kiln_tokenize(const kiln_tokenizer *t, const char *text, size_t len, int32_t **ids, int64_t *n);
/* The text of ids (control and unknown tokens omitted), NUL-terminated, its length in *len (may
 * be NULL; the text can hold NUL bytes). Caller frees *text. SentencePiece with add_space_prefix:
 * the first token's text, or the second's after a leading bos, loses one leading space (the one
 * tokenize put there). */
kiln_status kiln_detokenize(const kiln_tokenizer *t, const int32_t *ids, int64_t n, char **text, size_t *len);
/* The text token id adds after token prev (-1: none; model/text.c): the text of (prev, id) less
 * prev's, so that a token whose text depends on the one before (SentencePiece's leading space
 * after a first token) comes out as in the whole text, at a constant cost a token. Caller frees
 * *out (NUL-terminated, *len bytes). */
kiln_status kiln_detokenize_next(const kiln_tokenizer *t, int32_t prev, int32_t id, char **out, size_t *len);
/* Of generated text[0..n), of which shown bytes are shown already: how far it may be shown now.
 * Up to the first of the n_stops stop strings found past shown (*stop gets its index), else all
 * but a tail that may begin a stop string or ends inside a UTF-8 character (*stop: -1). */
size_t      kiln_text_showable(const char *text, size_t n, size_t shown, const char *const *stops, int n_stops,
                               int *stop);
/* For kiln gen-model: writes a byte-level BPE vocabulary of exactly n_vocab tokens (256 byte
 * tokens, merges learned from a built-in English text, control tokens, then reserved
 * placeholders) as tokenizer.ggml.* keys, with bos and eos. */
kiln_status kiln_tokenizer_write_synthetic(kiln_gguf_writer *w, int64_t n_vocab);
/* The same for a SentencePiece vocabulary laid out as Llama 2's (<unk>, <s>, </s>, the 256 byte
 * tokens, pieces learned from the same text with scores, its characters, <unused_N> to n_vocab). */
kiln_status kiln_tokenizer_write_synthetic_spm(kiln_gguf_writer *w, int64_t n_vocab);
typedef enum { KILN_VOCAB_BPE, KILN_VOCAB_SPM } kiln_vocab_kind; /* which synthetic vocabulary */

/* ---- models from GGUF files, and generation (docs/models.md) ---------------------------------
 * A model is a GGUF file whose general.architecture kiln builds (kiln_build_model): its
 * hyperparameters from the file's "ARCH.*" keys (as llama.cpp reads them) and its weights bound
 * by name. */
typedef struct kiln_model kiln_model;

/* The hyperparameters of g (general.architecture and its keys; the tensors decide tied output,
 * attention biases and llama3 RoPE scaling), bounded as kiln_model_check bounds them. Unknown
 * architectures, per-layer arrays, partial rotary dims, K/V head sizes that differ, values out
 * of range: an error naming the file and the key. The other tensors are not checked here but by
 * kiln_model_open / kiln_model_from_gguf. */
kiln_status kiln_model_hparams_from_gguf(const kiln_gguf *g, kiln_model_hparams *hp);
/* The keys kiln_model_hparams_from_gguf reads (and general.name, general.file_type), for a writer. */
void        kiln_model_hparams_to_gguf(const kiln_model_hparams *hp, kiln_gguf_writer *w);
/* Opens path (kiln_gguf_open) and reads its hyperparameters. Refuses a tensor of a type kiln
 * lacks (q3_K, iq4_xs, ...), naming the first such tensor and its type, and, before anything is
 * built, a file whose tensors do not match the hyperparameters (each weight of each layer up to
 * block_count, shape, and type: matrices and embeddings of any type kiln runs, each its own,
 * norms, biases and the router f32; no layer past it): the error names the file, the tensor and
 * the key at fault. */
kiln_status kiln_model_open(const char *path, kiln_model **out);
/* The same over an open file, which the model takes over (closed with it, also on error). */
kiln_status kiln_model_from_gguf(kiln_gguf *g, kiln_model **out);
void        kiln_model_close(kiln_model *m);
/* A model of hp whose weights are those kiln_model_write_random(hp, seed) writes, without the
 * file: kiln_model_load makes them on the device at memory speed (a 61 GB model in well under a
 * second), kiln_model_weight in host memory on first use. kiln_model_gguf is NULL for it. */
kiln_status kiln_model_random(const kiln_model_hparams *hp, uint64_t seed, kiln_model **out);
/* kiln_model_random, but each quantized weight is random blocks of its type made on the device
 * (kiln_session_fill_weights' fill_quant: values spanning about the weight's scale), not the
 * file's values, which are quantized on the host (minutes for a model of several GB): for
 * benchmarks of quantized file types (kiln bench). Float weights are kiln_model_random's.
 * kiln_model_weight gives NULL for its quantized weights, so the CPU reference refuses it. */
kiln_status kiln_model_random_blocks(const kiln_model_hparams *hp, uint64_t seed, kiln_model **out);
/* Puts m's weights into a session of its graph's program: streamed from the file
 * (kiln_session_load_weights; progress gets bytes), or made on the device for a random model. */
kiln_status kiln_model_load(const kiln_model *m, kiln_session *s,
                            void (*progress)(void *user, uint64_t done, uint64_t total), void *user);
const kiln_model_hparams *kiln_model_get_hparams(const kiln_model *m);
const kiln_gguf          *kiln_model_gguf(const kiln_model *m);
/* kiln_build_model for m: each weight takes the type it has in m's file (a random model's: the
 * mix of its ftype), so that files whose types differ from kiln's mix (llama-quantize's of
 * another version, an imatrix, --pure) build as they are. */
kiln_status kiln_model_build(kiln_ctx *ctx, const kiln_model *m, const kiln_build_opts *o);
/* Checks that every weight of g (a graph from kiln_model_build of m) is in
 * the file with its type and shape; the error names the tensor and both shapes. */
kiln_status kiln_model_check_weights(const kiln_model *m, const kiln_graph *g);
/* The data of weight `name` when the file holds it with `type` and n elements, else NULL: a
 * kiln_ref_get_fn / kiln_weight_fn-style lookup into the mapped file. */
const void *kiln_model_weight(const kiln_model *m, const char *name, kiln_type type, int64_t n);
/* Tensor parallelism's plan for m over g GPUs, as text (caller frees; docs/tp.md): each weight's
 * type, shape and a GPU's shape and how it is cut, a GPU's weight and KV cache bytes at n_ctx,
 * the collectives, and whether a GPU's graph builds yet. An error when m cannot split over g
 * (the hyperparameter named) or a quantized weight's rows would not hold whole blocks. */
kiln_status kiln_model_tp_describe(const kiln_model *m, int g, int64_t n_ctx, char **text);
/* The pipeline split in g stages (kiln_gen_opts.pp), for kiln inspect --pp: each stage's layers,
 * weight and KV cache bytes at n_ctx (one GPU's), its input and output. Caller frees *text. An
 * error when g is not 2 .. min(64, n_layer). */
kiln_status kiln_model_pp_describe(const kiln_model *m, int g, int64_t n_ctx, char **text);

/* Writes a model of hp with random weights (deterministic in seed: matrices uniform with
 * variance 1/ne0, norms near 1, llama3 rope_freqs computed) and a synthetic tokenizer
 * (kiln_tokenizer_write_synthetic) to path, as kiln gen-model does. */
kiln_status kiln_model_write_random(const kiln_model_hparams *hp, uint64_t seed, const char *path,
                                    void (*progress)(void *user, uint64_t done, uint64_t total), void *user);
/* The same with the synthetic vocabulary of kind vocab (kiln gen-model --vocab). */
kiln_status kiln_model_write_random_vocab(const kiln_model_hparams *hp, uint64_t seed, kiln_vocab_kind vocab,
                                          const char *path,
                                          void (*progress)(void *user, uint64_t done, uint64_t total), void *user);

/* ---- sampling (docs/sampling.md) -------------------------------------------------------------
 * The token sampler: a CPU reference that a GPU kernel reproduces bit for bit. The chain is
 * llama.cpp's default one with its samplers at their defaults (dry, top-n-sigma, typical and
 * xtc off): penalties -> top-k -> top-p -> min-p -> temperature -> a draw. The draw takes a
 * uniform number from Philox4x32-10 keyed by (seed, position): no state between calls, the same
 * seed gives the same tokens run after run. Every float operation and its order is specified in
 * docs/sampling.md. Usage, after each kiln_gen_eval (history: the prompt and the tokens so far):
 *
 *     kiln_sampler_params sp = kiln_sampler_params_default();
 *     sp.seed = 7; sp.temp = 0.7f;
 *     kiln_status st = kiln_sampler_check(&sp);          // once: names the bad flag
 *     if (!st) st = kiln_sample(&sp, logits, n_vocab, hist, n_hist, kiln_gen_pos(g), &next);
 */

/* kiln's seed when none is given (llama.cpp's LLAMA_DEFAULT_SEED asks for a random one). */
#define KILN_SAMPLER_DEFAULT_SEED 0u

typedef struct kiln_sampler_params {
    uint64_t seed;              /* -s/--seed: Philox's key */
    float    temp;              /* --temp: > 0 divides the logits; <= 0 is greedy (argmax) */
    int32_t  top_k;             /* --top-k: the k largest logits; <= 0: all */
    float    top_p;             /* --top-p: [0, 1], 1: off */
    float    min_p;             /* --min-p: [0, 1], 0: off */
    float    repeat_penalty;    /* --repeat-penalty: > 0, 1: off */
    int32_t  repeat_last_n;     /* --repeat-last-n: the penalties' window, 0: off, -1: all */
    float    presence_penalty;  /* --presence-penalty: 0: off */
    float    frequency_penalty; /* --frequency-penalty: 0: off */
} kiln_sampler_params;

/* llama.cpp's defaults (temp 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1,
 * repeat_last_n 64, presence and frequency 0), seed KILN_SAMPLER_DEFAULT_SEED. */
kiln_sampler_params kiln_sampler_params_default(void);
/* The ranges above (NaN and infinities refused everywhere); the error (KILN_ERR_INVALID) names
 * the flag and the value, e.g. "--top-p 1.5: must be in [0, 1]". */
kiln_status kiln_sampler_check(const kiln_sampler_params *p);
/* Picks the token that follows: the chain over logits[0..n_vocab), the penalties counting the
 * last repeat_last_n ids of history[0..n_history) (ids in [0, n_vocab)), the draw keyed by
 * (p->seed, position) where position is the index of the token being picked in its sequence
 * (kiln_gen_pos after the eval that gave the logits). logits are not modified. */
kiln_status kiln_sample(const kiln_sampler_params *p, const float *logits, int64_t n_vocab,
                        const int32_t *history, int64_t n_history, int64_t position, int32_t *out);
/* Whether p's penalties are on (they change the logits before the other stages): repeat_last_n
 * != 0 and any of repeat_penalty != 1, presence_penalty != 0, frequency_penalty != 0. */
bool        kiln_sampler_penalized(const kiln_sampler_params *p);

/* ---- sampling on the GPU (docs/sampling.md, "On the GPU") ----
 * The op `sample` picks what kiln_sample picks, inside a program: the token of one row of logits
 * without penalties, so chained decoding feeds it back with no host round trip. Its kernels keep
 * at most KILN_SAMPLE_GPU_MAX_K candidates: top_k in [1, KILN_SAMPLE_GPU_MAX_K], or any top_k
 * when n_vocab is that small (temp <= 0, greedy, needs one). */
#define KILN_SAMPLE_GPU_MAX_K 256
/* Whether p samples (temp > 0), without penalties, within the kernels' top-k: what makes
 * kiln_gen_opts.sampler end the decode program with `sample` instead of `argmax`. */
bool         kiln_sampler_on_gpu(const kiln_sampler_params *p, int64_t n_vocab);
/* The op: i32 [1], the token sampled from logits (f32 [n_vocab], one row) by p without its
 * penalties (an error if p has them on, or fails kiln_sampler_check), keyed by p->seed and the
 * pick's position pos[n - 1] + 1, where pos (i32 [n], n may be symbolic) holds the positions of
 * the tokens that gave the logits (a model's inp_pos). .kg: sample(a, pos, seed_lo=0,
 * seed_hi=0, temp=0.8, top_k=40, top_p=0.95, min_p=0.05), the seed as two 32-bit halves. */
kiln_tensor *kiln_sample_row(kiln_ctx *ctx, kiln_tensor *logits, kiln_tensor *pos, const kiln_sampler_params *p);

/* A generator: the model's graph compiled and loaded (or, with cpu, evaluated by the CPU
 * reference), the KV cache, and the position in one sequence. */
typedef struct kiln_gen kiln_gen;
typedef struct {
    int64_t n_ctx;    /* KV cache slots (0: min(4096, n_ctx_train)) */
    int64_t n_batch;  /* tokens per prefill run, n_tokens' maximum (0: min(512, n_ctx)) */
    bool    cpu;      /* the CPU reference instead of the GPU (slow: for tests of tiny models) */
    const kiln_compile_opts *compile; /* NULL: defaults */
    const kiln_session_opts *session; /* NULL: defaults */
    /* Called during kiln_gen_new with what ("weights": bytes uploaded), done and total. */
    void (*progress)(void *user, const char *what, uint64_t done, uint64_t total);
    void   *progress_user;
    /* NULL, or the sampler kiln_gen_generate will be given (copied): when kiln_sampler_on_gpu
     * accepts it, the program also samples on the GPU (output "sample") and kiln_gen_generate
     * with sampler parameters equal to these picks there, decode steps chained, no logits read
     * back. Other parameters, or other calls, keep the host sampler. */
    const struct kiln_sampler_params *sampler;
    /* 0, or also a program for runs of at most n_small tokens (2 .. n_batch - 1; the build's
     * n_tokens_upto): a batch of decode steps then takes plans made for few tokens. */
    int64_t n_small;
    /* 0 or 1, or tensor parallelism over tp ranks (docs/tp.md): each rank's graph on a GPU of its
     * own (devices 0 .. tp-1, a kiln_group; with cpu, the CPU reference evaluates them together),
     * the logits gathered on the host, where greedy picks and samples are made. Each GPU reads its
     * part of a model file; a random model (kiln_model_random*) gets random weights of each rank's
     * shapes made on its GPU (benchmarks), not the whole model's slices (the CPU reference's are
     * the slices). kiln_gen_shift shifts each rank's cache (its share of the kv heads). */
    int tp;
    /* 0 or 1, or a pipeline (layer) split over pp stages (docs/tp.md): consecutive layers a
     * stage, stage s on GPU s (with cpu, the CPU reference), run one after another with each
     * stage's hidden state handed to the next through host memory: models one GPU cannot hold,
     * on GPUs without a fast link. Greedy picks and samples on the host, as with tp. Not with
     * tp; 2 .. 64 stages, at most n_layer. */
    int pp;
    /* NULL, or the program from an AOT bundle (kiln compile MODEL.gguf -o FILE.kiln;
     * kiln_bundle_open) instead of compiling: neither NVRTC nor the templates are needed. Its
     * graph must be this generator's (the same model, n_ctx and n_batch; greedy decoding or
     * host sampling: a sampler then stays on the host), else an error saying how to compile a
     * matching one. One GPU only (not with cpu, tp, pp or n_small). */
    const kiln_bundle *bundle;
} kiln_gen_opts;
kiln_status kiln_gen_new(const kiln_model *m, const kiln_gen_opts *o, kiln_gen **out);
/* The build options kiln_gen_new gives part `part` of m under o: with o->tp > 1 rank `part` of
 * the tensor-parallel split (0 .. tp - 1), with o->pp > 1 stage `part` of the pipeline, else
 * (part 0) the one program. Building and compiling them (kiln_model_build, kiln_compile) ahead of
 * time fills the kernel cache with what kiln_gen_new will ask for: `kiln compile MODEL.gguf --tp
 * G`. out->sampler may point into *o. */
kiln_status kiln_gen_part_opts(const kiln_model *m, const kiln_gen_opts *o, int part, kiln_build_opts *out);
void        kiln_gen_free(kiln_gen *g);
/* Appends n tokens to the sequence (prefill in runs of n_batch tokens; one token: the decode
 * program) and gives the logits of the last one: n_vocab floats owned by g, valid until the
 * next call. A token id out of range or a full cache is an error. */
kiln_status kiln_gen_eval(kiln_gen *g, const int32_t *tokens, int64_t n, const float **logits);
/* The same, giving only the greedy pick after the last token (on the GPU the graph's argmax:
 * 4 bytes read back instead of the logits). */
kiln_status kiln_gen_eval_greedy(kiln_gen *g, const int32_t *tokens, int64_t n, int32_t *next);
int64_t     kiln_gen_pos(const kiln_gen *g); /* tokens in the cache */
int64_t     kiln_gen_n_ctx(const kiln_gen *g); /* its slots */
/* llama.cpp's context shift: of the pos tokens in the cache, the first n_keep stay, the next
 * n_discard go, and the rest move down by n_discard with their K re-roped by -n_discard (the
 * model's rope on the CPU reference, in f32, rounded to the cache's f16), so generation goes on
 * at pos - n_discard. The caches pass through host memory (a rare event: it frees half the
 * context). n_keep + n_discard <= pos. With tensor parallelism, every rank's cache. */
kiln_status kiln_gen_shift(kiln_gen *g, int64_t n_keep, int64_t n_discard);
void        kiln_gen_reset(kiln_gen *g);     /* start a new sequence (the cache is overwritten) */
/* Index of the largest of x[0..n) (the first on ties; NaN never wins unless all are NaN). */
int64_t     kiln_argmax_f32(const float *x, int64_t n);

typedef struct {
    kiln_compile_stats compile;
    double  compile_ms, load_ms;       /* kiln_gen_new: compile, weight upload */
    uint64_t weight_bytes;
    int64_t prefill_tokens, decode_tokens;
    double  prefill_ms, decode_ms;     /* wall time of the evaluations (host and GPU) */
    double  prefill_gpu_ms, decode_gpu_ms; /* GPU time of the runs (0 on the CPU) */
    double  warmup_ms;                 /* kiln_gen_new: one run of each program (CUDA graph
                                          capture, lazy module loading) before any timing */
    /* Where the wall time of all evaluations went: making and uploading inputs, the runs
     * (launch until the GPU is done), reading the logits back, and picking tokens. */
    double  inputs_ms, run_ms, readback_ms, sample_ms;
} kiln_gen_stats;
/* Greedy decoding from the current position: n steps, the first fed `first`, each later one
 * the pick of the step before; out[i] gets the pick after step i. On the GPU the steps are
 * chained (kiln_session_chain_run): the picks stay on the device and the host queues step i+1
 * while step i runs. After an error the position is unknown: kiln_gen_reset. */
kiln_status kiln_gen_decode_greedy(kiln_gen *g, int32_t first, int64_t n, int32_t *out);
/* Greedy generation: evaluates the prompt, then picks the argmax n_new times, each pick fed
 * back (n_new - 1 decode steps, kiln_gen_decode_greedy); out gets the n_new ids. Stats (may be
 * NULL) count this call. */
kiln_status kiln_gen_greedy(kiln_gen *g, const int32_t *prompt, int64_t n_prompt, int64_t n_new,
                            int32_t *out, kiln_gen_stats *stats);
/* Compile and load figures of kiln_gen_new, and totals of every evaluation so far. */
void        kiln_gen_get_stats(const kiln_gen *g, kiln_gen_stats *out);

/* Why kiln_gen_generate stopped. */
typedef enum {
    KILN_STOP_NONE,    /* (not stopped) */
    KILN_STOP_LIMIT,   /* n_predict tokens generated */
    KILN_STOP_EOG,     /* an end-of-generation token was picked (not reported) */
    KILN_STOP_CALLER,  /* on_token asked to stop (a stop string, an interrupted chat) */
    KILN_STOP_CONTEXT, /* the cache is full */
} kiln_stop;
typedef struct {
    int64_t        n_predict; /* tokens to generate at most; -1: until a stop or a full cache */
    const int32_t *eog;       /* end-of-generation ids (kiln_tokenizer_eog); none: n_eog 0 */
    int64_t        n_eog;
    /* Each generated token, in order (an end-of-generation pick is not one); returning true
     * stops generation after it. NULL: none. */
    bool (*on_token)(void *user, int32_t id);
    void          *user;
    /* NULL, or temp <= 0 without penalties: greedy (on the GPU, chained steps). Parameters
     * equal to kiln_gen_opts.sampler's, when the program samples on the GPU with them: the
     * program's "sample" (chained steps too, no logits read back). Else each pick is
     * kiln_sample's from the logits read back (on the host, a step at a time), its history
     * this call's prompt and the tokens generated since, its position the pick's index in the
     * sequence. */
    const kiln_sampler_params *sampler;
} kiln_gen_params;
/* Evaluates the prompt (appended at the current position) and generates greedily until
 * n_predict tokens (0: the prompt is evaluated, nothing generated), an end-of-generation pick,
 * on_token's stop or a full cache; *n_out gets the tokens reported and *why the reason (each
 * may be NULL). Afterwards the cache holds the prompt and every pick but the last (the last is
 * never fed back: the end-of-generation pick, or else the last token reported), so a
 * conversation goes on from kiln_gen_pos. On the GPU the decode steps are chained; the host
 * learns each pick one step late, so after a stop one queued step is dropped. Stats (may be
 * NULL) count this call: decode_tokens are the steps whose picks were taken. */
kiln_status kiln_gen_generate(kiln_gen *g, const int32_t *prompt, int64_t n_prompt, const kiln_gen_params *p,
                              int64_t *n_out, kiln_stop *why, kiln_gen_stats *stats);

/* ---- several sequences at once (issue 28) --------------------------------------------------
 * A batch: one program and one KV cache shared by up to n_seq sequences, each step evaluating
 * tokens of several sequences together: prefill chunks and decode steps mixed, the weights read
 * once for all of them. The cache's n_ctx cells are split evenly: sequence id s holds up to
 * n_ctx / n_seq tokens in cells of its own (llama.cpp's default, a KV stream per sequence), so a
 * token's attention reads its own sequence's cells only. A sequence opens, takes steps, and
 * closes; its cells go to the next sequence opened with its id (no recompile, no CUDA graph
 * capture: n_tokens and n_kv are the program's symbolic dims). Each sequence's logits are the
 * ones it gets alone (kiln_gen), up to the rounding of a batched run.
 *
 *     kiln_batch *b;  kiln_batch_new(m, &(kiln_batch_opts){.n_ctx = 8192, .n_seq = 8}, &b);
 *     int a, c;       kiln_batch_seq_open(b, &a); kiln_batch_seq_open(b, &c);
 *     kiln_batch_item it[2] = {{a, prompt_a, n_a}, {c, &next_c, 1}};
 *     const float *lg[2];  kiln_batch_step(b, it, 2, lg);   // lg[i]: after item i's last token
 */
typedef struct kiln_batch kiln_batch;
typedef struct {
    int64_t n_ctx;   /* cache cells, all sequences together, n_ctx / n_seq a sequence
                        (0: min(4096, n_ctx_train)) */
    int64_t n_batch; /* tokens per step, all items together (0: min(512, n_ctx)) */
    int     n_seq;   /* sequences open at once at most (0: 16) */
    bool    cpu;     /* the CPU reference */
    const kiln_compile_opts *compile;
    const kiln_session_opts *session;
    int64_t n_small; /* kiln_gen_opts.n_small: also a program for steps of at most n_small tokens */
    int     tp;      /* kiln_gen_opts.tp: the model split over tp GPUs (0, 1: one) */
    int     pp;      /* kiln_gen_opts.pp: the layers in pp stages, a GPU each (0, 1: one) */
} kiln_batch_opts;
typedef struct {
    int            seq;    /* an open sequence */
    const int32_t *tokens; /* appended to it, in order */
    int64_t        n;      /* >= 1 */
} kiln_batch_item;
kiln_status kiln_batch_new(const kiln_model *m, const kiln_batch_opts *o, kiln_batch **out);
void        kiln_batch_free(kiln_batch *b);
/* A new, empty sequence (its id in *seq, 0 .. n_seq-1); an error when n_seq are open. */
kiln_status kiln_batch_seq_open(kiln_batch *b, int *seq);
/* Ends sequence seq: its cells are free for the next sequence opened with its id. */
void        kiln_batch_seq_close(kiln_batch *b, int seq);
int64_t     kiln_batch_seq_pos(const kiln_batch *b, int seq);   /* its tokens so far */
int64_t     kiln_batch_free_cells(const kiln_batch *b);      /* all sequences' together */
int64_t     kiln_batch_seq_cells(const kiln_batch *b);      /* the tokens a sequence holds at most */
int64_t     kiln_batch_n_batch(const kiln_batch *b);   /* tokens a step takes at most */
/* One step: the tokens of each item appended to its sequence (an item per sequence at most;
 * at most n_batch tokens in all, and room for them in each sequence's cells), evaluated together; logits[i] gets
 * the logits after item i's last token (n_vocab floats owned by b, valid until the next step).
 * Nothing changes when it fails. */
kiln_status kiln_batch_step(kiln_batch *b, const kiln_batch_item *items, int n, const float **logits);
/* The same, giving only the greedy pick after each item: on the GPU the program's argmax (4 bytes
 * a row read back instead of the logits; ggml's rule, the last of equal maxima), on the CPU
 * reference kiln_argmax_f32 of the logits (the first): they differ only on exact ties, as
 * kiln_gen's greedy picks do. */
kiln_status kiln_batch_step_greedy(kiln_batch *b, const kiln_batch_item *items, int n, int32_t *picks);
/* Figures of all steps: tokens evaluated, steps, and GPU time (kiln_gen_stats' decode fields). */
void        kiln_batch_get_stats(const kiln_batch *b, kiln_gen_stats *out);

/* ---- chat templates (docs/chat.md) ---------------------------------------------------------
 * A conversation rendered as the text an instruct model was trained on, exactly as llama.cpp's
 * built-in templates render it (llm_chat_apply_template, src/llama-chat.cpp; not its Jinja
 * engine), and a GGUF's tokenizer.chat_template (Jinja text) told by the substrings llama.cpp's
 * llm_chat_detect_template looks for. Names are llama.cpp's, all of its built-in templates:
 * chatml, llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip, mistral-v1, mistral-v3,
 * mistral-v3-tekken, mistral-v7, mistral-v7-tekken, phi3, phi4, gemma, deepseek, deepseek2,
 * deepseek3, llama3, falcon3, zephyr, monarch, orion, openchat, vicuna, vicuna-orca, command-r,
 * chatglm3, chatglm4, glmedge, minicpm, exaone3, exaone4, rwkv-world, granite, gigachat,
 * megrez, yandex, bailing, bailing-think, bailing2, llama4, smolvlm, dots1, hunyuan-moe,
 * gpt-oss, hunyuan-dense, kimi-k2, seed_oss, grok-2, pangu-embedded.
 * The rendered text never starts with the BOS text (no "<|begin_of_text|>", "<s>", "<bos>"):
 * as in llama.cpp, the tokenizer adds bos (add_bos_token), and the text is tokenized with
 * special tokens parsed. */
typedef struct {
    const char *role;    /* "system", "user" or "assistant" */
    const char *content;
} kiln_chat_msg;
/* kiln's templates, i in [0, count): names for help text (NULL past the end). */
int         kiln_chat_template_count(void);
const char *kiln_chat_template_name(int i);
/* NULL when name is one of kiln's templates, else KILN_ERR_NOT_FOUND naming it with the list of
 * kiln's names. */
kiln_status kiln_chat_template_by_name(const char *name);
/* The template of Jinja text tmpl (or tmpl itself when it is a name), in *name (static). None
 * found: KILN_ERR_NOT_FOUND with kiln's names.
 * (llama.cpp uses chatml when a model has no template: the caller's choice.) */
kiln_status kiln_chat_template_detect(const char *tmpl, const char **name);
/* g's tokenizer.chat_template, NUL-terminated, in *tmpl (caller frees); *tmpl NULL (and no
 * error) when g is NULL or has none. */
kiln_status kiln_chat_template_from_gguf(const kiln_gguf *g, char **tmpl);
/* Renders msgs[0..n) with template name into *out (caller frees); n may be 0. With
 * add_generation_prompt, the assistant's header follows (templates that have none, the [INST]
 * families and mistral-v7, add nothing). A NULL role or content, or a role other than system,
 * user and assistant, is an error naming the message's index. */
kiln_status kiln_chat_apply(const char *name, const kiln_chat_msg *msgs, size_t n, bool add_generation_prompt,
                            char **out);
/* For a conversation that goes on (kiln chat): the text message n-1 adds to msgs[0..n-1)
 * rendered without generation prompt, as llama.cpp's common_chat_format_single gives it: the
 * rendering of all n (add_generation_prompt as given) past that of the first n-1, behind a
 * "\n" when add_generation_prompt is set and the first n-1 end with one (the newline after an
 * end-of-turn token that generation stopped at). n >= 1; caller frees *out. */
kiln_status kiln_chat_apply_delta(const char *name, const kiln_chat_msg *msgs, size_t n, bool add_generation_prompt,
                                  char **out);


#ifdef __cplusplus
}
#endif
#endif
