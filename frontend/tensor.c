/* Tensor builders with ggml's shape rules. Builders record the first error in the context and
 * return NULL; a NULL operand makes a builder return NULL silently (the error is already
 * recorded), so a caller checks once after building. */
#include "frontend.h"
#include "infer.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const fe_fam_info fe_fams[FE_FAM_COUNT] = {
#define FE_X(id, name, epilogue) {name, epilogue},
    FE_FAMS(FE_X)
#undef FE_X
};

const fe_op_info fe_ops[FE_OP_COUNT] = {
#define FE_X(id, name, kind, nsrc, sig, fam, types, tol) {name, kind, nsrc, sig, fam, types, tol},
    FE_OPS(FE_X)
#undef FE_X
};

/* Each op's family fits its kind: lowering makes an IR_EW node of every elementwise kind and an
 * IR_OP node, instantiated from its family's template, of every FE_KERNEL op. */
#define FE_FAM_FITS(kind, fam)                                                                     \
    ((kind) == FE_LEAF || (kind) == FE_VIEW ? (fam) == FE_FAM_NONE                                 \
     : (kind) == FE_KERNEL                  ? (fam) != FE_FAM_NONE && (fam) != FE_FAM_EW           \
                                            : (fam) == FE_FAM_EW)
#define FE_X(id, name, kind, nsrc, sig, fam, types, tol)                                           \
    _Static_assert(FE_FAM_FITS(kind, fam), "FE_OPS: the family of " name " does not fit its kind");
FE_OPS(FE_X)
#undef FE_X
#undef FE_FAM_FITS

int fe_op_from_name(const char *name, fe_op *out) {
    for (int i = 0; i < FE_OP_COUNT; i++) {
        if (strcmp(fe_ops[i].name, name) == 0) {
            *out = (fe_op)i;
            return 0;
        }
    }
    return -1;
}

/* ---- context ------------------------------------------------------------------------------ */

kiln_ctx *kiln_ctx_new(void) { return calloc(1, sizeof(kiln_ctx)); }

void kiln_ctx_free(kiln_ctx *ctx) {
    if (!ctx) return;
    for (int i = 0; i < ctx->n; i++) free(ctx->t[i]);
    free(ctx->t);
    free(ctx->index);
    kiln_status_free(ctx->err);
    free(ctx);
}

kiln_status kiln_ctx_status(const kiln_ctx *ctx) {
    if (!ctx) return kb_error(KILN_ERR_INVALID, "kiln_ctx_status: ctx is NULL");
    return kb_status_copy(ctx->err);
}

void fe_fail(kiln_ctx *ctx, kiln_status err) {
    if (ctx->err) kiln_status_free(err);
    else ctx->err = err;
}

static void vfailf(kiln_ctx *ctx, kiln_code code, const char *fmt, va_list ap) {
    if (ctx->err) return;
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (ctx->file) ctx->err = kb_error(code, "%s:%d:%d: error: %s", ctx->file, ctx->line, ctx->col, msg);
    else ctx->err = kb_error(code, "%s", msg);
}

void fe_failf(kiln_ctx *ctx, kiln_code code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfailf(ctx, code, fmt, ap);
    va_end(ap);
}

bool fe_reject(kiln_ctx *ctx, kiln_code code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfailf(ctx, code, fmt, ap);
    va_end(ap);
    return false;
}

/* ---- names: fe_find's index ---------------------------------------------------------------
 * An open-addressing table of the tensors by name, filled as names are set: a model of 3567
 * nodes spent most of its graph build, and of a program-cache hit (which parses the graph again
 * for its specialized variant), in fe_find's linear scans (name_free checks every name). A
 * rename leaves its old slot behind; lookups compare each tensor's current name, so a stale slot
 * never answers, and a rebuild from ctx->t (as the table grows) drops them. */
uint64_t fe_name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static void index_put(kiln_ctx *ctx, kiln_tensor *t) {
    size_t i = (size_t)fe_name_hash(t->name) & (size_t)(ctx->icap - 1);
    while (ctx->index[i]) i = (i + 1) & (size_t)(ctx->icap - 1);
    ctx->index[i] = t;
    ctx->iused++;
}

/* t's current name into the index (false: out of memory, recorded in ctx). */
static bool index_add(kiln_ctx *ctx, kiln_tensor *t) {
    if (2 * (ctx->iused + 1) > ctx->icap) {
        int cap = 64;
        while (cap < 4 * (ctx->n + 1)) cap *= 2;
        kiln_tensor **index = calloc((size_t)cap, sizeof *index);
        if (!index) {
            fe_fail(ctx, kb_oom());
            return false;
        }
        free(ctx->index);
        ctx->index = index, ctx->icap = cap, ctx->iused = 0;
        for (int i = 0; i < ctx->n; i++)
            if (ctx->t[i] != t) index_put(ctx, ctx->t[i]);
    }
    index_put(ctx, t);
    return true;
}

/* The tensor named name, the first made when several are (as a scan of ctx->t finds it). */
kiln_tensor *fe_find(const kiln_ctx *ctx, const char *name) {
    kiln_tensor *best = NULL;
    if (!ctx->index) return NULL;
    for (size_t i = (size_t)fe_name_hash(name) & (size_t)(ctx->icap - 1); ctx->index[i]; i = (i + 1) & (size_t)(ctx->icap - 1))
        if (strcmp(ctx->index[i]->name, name) == 0 && (!best || ctx->index[i]->id < best->id)) best = ctx->index[i];
    return best;
}

/* ---- shapes ------------------------------------------------------------------------------- */

int64_t fe_nelements(const kiln_tensor *t) { return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; }

/* A quantized type's dim 0 counts elements but steps by blocks (nb0 is the block's bytes, as
 * in ggml), so a contiguous row takes kiln_row_size bytes. */
bool fe_is_contiguous(const kiln_tensor *t) {
    size_t expect = kiln_type_size(t->type);
    for (int i = 0; i < 4; i++) {
        if (t->ne[i] != 1 && t->nb[i] != expect) return false;
        expect = i == 0 ? kiln_row_size(t->type, t->ne[0]) : expect * (size_t)t->ne[i];
    }
    return true;
}

bool fe_can_repeat(const kiln_tensor *b, const kiln_tensor *a) {
    for (int i = 0; i < 4; i++)
        if (b->ne[i] == 0 || a->ne[i] % b->ne[i] != 0) return false;
    return true;
}

int fe_print_dims(const kiln_tensor *t) {
    int n = 1;
    for (int i = 1; i < 4; i++)
        if (t->ne[i] != 1) n = i + 1;
    return n > t->n_dims ? n : t->n_dims;
}

static void set_contiguous_strides(kiln_tensor *t) {
    t->nb[0] = kiln_type_size(t->type);
    t->nb[1] = kiln_row_size(t->type, t->ne[0]);
    for (int i = 2; i < 4; i++) t->nb[i] = t->nb[i - 1] * (size_t)t->ne[i - 1];
}

/* Bytes from the tensor's first element to one past its last, as ggml_nbytes (dim 0 of a
 * quantized type spans ne0 / block blocks). */
static size_t span_bytes(const kiln_tensor *t) {
    int64_t blk = kiln_type_block(t->type);
    size_t  n = (size_t)(t->ne[0] / blk) * t->nb[0];
    if (blk == 1) n = kiln_type_size(t->type) + (size_t)(t->ne[0] - 1) * t->nb[0];
    for (int i = 1; i < 4; i++) n += (size_t)(t->ne[i] - 1) * t->nb[i];
    return n;
}

/* "f32[4096, 8]" into buf. */
static const char *shape_str(const kiln_tensor *t, char *buf, size_t len) {
    int n = snprintf(buf, len, "%s[", kiln_type_name(t->type));
    int dims = fe_print_dims(t);
    for (int i = 0; i < dims && n > 0 && (size_t)n < len; i++) {
        char e[FE_MAX_NAME];
        n += snprintf(buf + n, len - (size_t)n, "%s%s", i ? ", " : "", fe_extent_str(t->ctx, t, i, e));
    }
    if (n > 0 && (size_t)n < len) snprintf(buf + n, len - (size_t)n, "]");
    return buf;
}

/* A quantized tensor, or a view of one, is addressed by whole blocks: its rows must be whole
 * blocks (ne0 a multiple of the block), dim 0 must stay dim 0 with consecutive blocks, and every
 * stride and offset must be a whole number of blocks. */
static bool quant_layout_ok(kiln_ctx *ctx, const char *what, const char *name, const kiln_tensor *t) {
    if (!kiln_type_is_quantized(t->type)) return true;
    int64_t blk = kiln_type_block(t->type);
    size_t  sz = kiln_type_size(t->type);
    bool    ok = t->ne[0] % blk == 0 && t->nb[0] == sz && t->view_offs % sz == 0;
    for (int i = 1; i < 4; i++) ok = ok && t->nb[i] % sz == 0;
    if (ok) return true;
    char sa[96];
    fe_failf(ctx, KILN_ERR_SHAPE,
             "%s '%s' (%s): a %s tensor holds rows of whole %lld-element blocks (%zu bytes): ne0 must be a "
             "multiple of %lld, dim 0 must stay dim 0, and strides and offsets must be whole blocks",
             what, name, shape_str(t, sa, sizeof sa), kiln_type_name(t->type), (long long)blk, sz,
             (long long)blk);
    return false;
}

bool fe_valid_name(const char *s) {
    if (!s || !(isalpha((unsigned char)*s) || *s == '_')) return false;
    size_t n = 0;
    for (; *s; s++, n++)
        if (!(isalnum((unsigned char)*s) || *s == '_' || *s == '.')) return false;
    return n < FE_MAX_NAME;
}

static bool is_float(kiln_type t) { return t == KILN_F32 || t == KILN_F16 || t == KILN_BF16; }

/* ---- creation ----------------------------------------------------------------------------- */

static kiln_tensor *new_node(kiln_ctx *ctx, fe_op op, kiln_type type, const int64_t ne[4]) {
    if (ctx->n == ctx->cap) {
        int cap = ctx->cap ? ctx->cap * 2 : 64;
        kiln_tensor **t = realloc(ctx->t, (size_t)cap * sizeof *t);
        if (!t) {
            fe_fail(ctx, kb_oom());
            return NULL;
        }
        ctx->t = t;
        ctx->cap = cap;
    }
    kiln_tensor *t = calloc(1, sizeof *t);
    if (!t) {
        fe_fail(ctx, kb_oom());
        return NULL;
    }
    t->id = ctx->n;
    t->ctx = ctx;
    t->op = op;
    t->type = type;
    for (int i = 0; i < 4; i++) t->ne[i] = ne[i];
    t->n_dims = 1;
    set_contiguous_strides(t);
    t->name[0] = '_'; /* the auto name "_ID" (a printf call a node cost a twentieth of a cache hit) */
    kb_fmt_i64(t->id, t->name + 1);
    t->line = ctx->file ? ctx->line : 0;
    t->col = ctx->file ? ctx->col : 0;
    ctx->t[ctx->n++] = t;
    return index_add(ctx, t) ? t : NULL;
}

/* The extents a builder was given: kiln_dim handles become their maximum, marked in sym. */
static bool read_dims(kiln_ctx *ctx, const char *what, int n_dims, const int64_t *ne, int64_t out[4],
                      uint8_t sym[4]) {
    if (n_dims < 1 || n_dims > KILN_MAX_DIMS || !ne)
        return fe_reject(ctx, KILN_ERR_SHAPE, "%s: %d dims given; kiln tensors have 1 to 4", what, n_dims);
    int64_t total = 1;
    for (int i = 0; i < 4; i++) {
        sym[i] = 0;
        if (i < n_dims && !fe_resolve_extent(ctx, what, ne[i], &out[i], &sym[i])) return false;
        if (i >= n_dims) out[i] = 1;
        if (out[i] < 1)
            return fe_reject(ctx, KILN_ERR_SHAPE, "%s: dim %d is %lld; dims must be >= 1", what, i, (long long)out[i]);
        if (out[i] > ((int64_t)1 << 48) / total)
            return fe_reject(ctx, KILN_ERR_SHAPE, "%s: shape too large (more than 2^48 elements)", what);
        total *= out[i];
    }
    return true;
}

static bool name_free(kiln_ctx *ctx, const char *name, const kiln_tensor *self) {
    kiln_tensor *other = fe_find(ctx, name);
    if (!other || other == self) return true;
    if (other->line)
        fe_failf(ctx, KILN_ERR_INVALID, "name '%s' is already defined (line %d)", name, other->line);
    else
        fe_failf(ctx, KILN_ERR_INVALID, "name '%s' is already used by another tensor", name);
    return false;
}

/* name into t->name, cut to FE_MAX_NAME - 1 bytes as snprintf would (callers check names). */
static void copy_name(kiln_tensor *t, const char *name) {
    size_t n = strnlen(name, sizeof t->name - 1);
    memcpy(t->name, name, n);
    t->name[n] = 0;
}

kiln_tensor *kiln_new_tensor(kiln_ctx *ctx, kiln_role role, kiln_type type, const char *name,
                             int n_dims, const int64_t *ne) {
    if (!ctx || ctx->err) return NULL;
    if (role != KILN_ROLE_INPUT && role != KILN_ROLE_WEIGHT && role != KILN_ROLE_STATE) {
        fe_failf(ctx, KILN_ERR_INVALID, "new tensor '%s': role must be input, weight or state",
                 name ? name : "?");
        return NULL;
    }
    if ((unsigned)type >= KILN_TYPE_COUNT) {
        fe_failf(ctx, KILN_ERR_INVALID, "new tensor '%s': unknown type %d", name ? name : "?", (int)type);
        return NULL;
    }
    if (!fe_valid_name(name)) {
        fe_failf(ctx, KILN_ERR_INVALID,
                 "new tensor: name '%s' is not an identifier ([A-Za-z_][A-Za-z0-9_.]*, < %d chars)",
                 name ? name : "(null)", FE_MAX_NAME);
        return NULL;
    }
    if (!name_free(ctx, name, NULL)) return NULL;
    if (kiln_type_is_quantized(type) && role != KILN_ROLE_WEIGHT) {
        /* Quantized data is made once (a file's weights) and converted to the device layout on
         * upload (templates/quant.lua); per-run inputs and states are f32, f16 or bf16. */
        fe_failf(ctx, KILN_ERR_INVALID, "new tensor '%s': a %s tensor must be a weight (inputs and states are "
                                        "f32, f16, bf16, i32 or i64)", name, kiln_type_name(type));
        return NULL;
    }
    int64_t d[4];
    uint8_t sym[4];
    char what[FE_MAX_NAME + 16];
    snprintf(what, sizeof what, "tensor '%s'", name);
    if (!read_dims(ctx, what, n_dims, ne, d, sym)) return NULL;
    if (role != KILN_ROLE_INPUT && (sym[0] | sym[1] | sym[2] | sym[3])) {
        /* Weights and states are memory laid out once: their size cannot vary. */
        fe_failf(ctx, KILN_ERR_SHAPE, "%s: a %s cannot have a symbolic dim (only inputs can)", what,
                 role == KILN_ROLE_WEIGHT ? "weight" : "state");
        return NULL;
    }
    kiln_tensor *t = new_node(ctx, FE_OP_LEAF, type, d);
    if (!t) return NULL;
    memcpy(t->sym, sym, sizeof sym);
    t->role = role;
    t->n_dims = n_dims;
    copy_name(t, name);
    t->named = true;
    if (!index_add(ctx, t)) return NULL;
    return quant_layout_ok(ctx, "new tensor", name, t) ? t : NULL;
}

void kiln_set_name(kiln_ctx *ctx, kiln_tensor *t, const char *name) {
    if (!ctx || ctx->err || !t) return;
    if (!fe_valid_name(name)) {
        fe_failf(ctx, KILN_ERR_INVALID, "set name: '%s' is not an identifier", name ? name : "(null)");
        return;
    }
    if (!name_free(ctx, name, t)) return;
    copy_name(t, name);
    t->named = true;
    index_add(ctx, t);
}

void kiln_set_output(kiln_ctx *ctx, kiln_tensor *t, const char *name) {
    if (!ctx || ctx->err || !t) return;
    if (t->op == FE_OP_LEAF) {
        fe_failf(ctx, KILN_ERR_INVALID, "'%s' is an %s and cannot also be an output", t->name,
                 t->role == KILN_ROLE_INPUT ? "input" : "weight");
        return;
    }
    if (name) kiln_set_name(ctx, t, name);
    if (!ctx->err) t->role = KILN_ROLE_OUTPUT;
}

kiln_type   kiln_tensor_type(const kiln_tensor *t) { return t->type; }
int64_t     kiln_tensor_ne(const kiln_tensor *t, int d) { return (unsigned)d < 4 ? t->ne[d] : 1; }
size_t      kiln_tensor_nb(const kiln_tensor *t, int d) { return (unsigned)d < 4 ? t->nb[d] : 0; }
int64_t     kiln_tensor_nelements(const kiln_tensor *t) { return fe_nelements(t); }
size_t      kiln_tensor_nbytes(const kiln_tensor *t) { return span_bytes(t); }
const char *kiln_tensor_name(const kiln_tensor *t) { return t->name; }
kiln_role   kiln_tensor_role(const kiln_tensor *t) { return t->role; }

/* ---- views -------------------------------------------------------------------------------- */

static kiln_tensor *new_view(kiln_ctx *ctx, fe_op op, kiln_tensor *a, const int64_t ne[4],
                             size_t offset) {
    kiln_tensor *t = new_node(ctx, op, a->type, ne);
    if (!t) return NULL;
    t->src[0] = a;
    t->view_src = a->view_src ? a->view_src : a;
    t->view_offs = a->view_offs + offset;
    t->op_offs = offset;
    return t;
}

kiln_tensor *kiln_reshape(kiln_ctx *ctx, kiln_tensor *a, int n_dims, const int64_t *ne) {
    if (!ctx || ctx->err || !a) return NULL;
    int64_t d[4];
    uint8_t sym[4];
    if (!read_dims(ctx, "reshape", n_dims, ne, d, sym)) return NULL;
    char sa[96];
    if (!fe_is_contiguous(a)) {
        fe_failf(ctx, KILN_ERR_SHAPE, "reshape: '%s' (%s) is not contiguous; use cont first", a->name,
                 shape_str(a, sa, sizeof sa));
        return NULL;
    }
    if (d[0] * d[1] * d[2] * d[3] != fe_nelements(a)) {
        fe_failf(ctx, KILN_ERR_SHAPE, "reshape: '%s' (%s) has %lld elements, the new shape %lld",
                 a->name, shape_str(a, sa, sizeof sa), (long long)fe_nelements(a),
                 (long long)(d[0] * d[1] * d[2] * d[3]));
        return NULL;
    }
    if (!fe_sym_reshape(ctx, a, d, sym)) return NULL;
    kiln_tensor *t = new_view(ctx, FE_OP_RESHAPE, a, d, 0);
    if (!t) return NULL;
    t->n_dims = n_dims;
    memcpy(t->sym, sym, sizeof sym); /* strides: contiguous at the maximum, like a's */
    return quant_layout_ok(ctx, "reshape of", a->name, t) ? t : NULL;
}

kiln_tensor *kiln_view(kiln_ctx *ctx, kiln_tensor *a, int n_dims, const int64_t *ne, const size_t *nb,
                       size_t offset) {
    if (!ctx || ctx->err || !a) return NULL;
    int64_t d[4];
    uint8_t sym[4];
    if (!read_dims(ctx, "view", n_dims, ne, d, sym)) return NULL;
    size_t es = kiln_type_size(a->type);
    size_t strides[4];
    strides[0] = es;
    for (int i = 1; i < 4; i++) {
        if (i < n_dims) {
            if (!nb) {
                fe_failf(ctx, KILN_ERR_SHAPE, "view: %d strides expected", n_dims - 1);
                return NULL;
            }
            strides[i] = nb[i - 1];
        } else {
            strides[i] = i == 1 ? kiln_row_size(a->type, d[0]) : strides[i - 1] * (size_t)d[i - 1];
        }
        if (strides[i] % es != 0) {
            fe_failf(ctx, KILN_ERR_SHAPE, "view: stride nb[%d] = %zu is not a multiple of the %s size %zu",
                     i, strides[i], kiln_type_name(a->type), es);
            return NULL;
        }
    }
    if (offset % es != 0) {
        fe_failf(ctx, KILN_ERR_SHAPE, "view: offset %zu is not a multiple of the %s size %zu", offset,
                 kiln_type_name(a->type), es);
        return NULL;
    }
    kiln_tensor *t = new_view(ctx, FE_OP_VIEW, a, d, offset);
    if (!t) return NULL;
    memcpy(t->nb, strides, sizeof strides);
    memcpy(t->sym, sym, sizeof sym);
    t->n_dims = n_dims;
    size_t need = t->view_offs + span_bytes(t), have = span_bytes(t->view_src);
    if (need > have) {
        fe_failf(ctx, KILN_ERR_SHAPE,
                 "view: reaches byte %zu of '%s', which has only %zu bytes", need,
                 t->view_src->name, have);
        return NULL;
    }
    return quant_layout_ok(ctx, "view of", a->name, t) ? t : NULL;
}

kiln_tensor *kiln_permute(kiln_ctx *ctx, kiln_tensor *a, int ax0, int ax1, int ax2, int ax3) {
    if (!ctx || ctx->err || !a) return NULL;
    int ax[4] = {ax0, ax1, ax2, ax3};
    int seen = 0;
    for (int i = 0; i < 4; i++) {
        if (ax[i] < 0 || ax[i] > 3 || (seen & (1 << ax[i]))) {
            fe_failf(ctx, KILN_ERR_SHAPE, "permute: axes (%d, %d, %d, %d) are not a permutation of 0..3",
                     ax0, ax1, ax2, ax3);
            return NULL;
        }
        seen |= 1 << ax[i];
    }
    int64_t ne[4];
    size_t nb[4];
    uint8_t sym[4];
    for (int i = 0; i < 4; i++) {
        ne[ax[i]] = a->ne[i];
        nb[ax[i]] = a->nb[i];
        sym[ax[i]] = a->sym[i];
    }
    kiln_tensor *t = new_view(ctx, FE_OP_PERMUTE, a, ne, 0);
    if (!t) return NULL;
    memcpy(t->nb, nb, sizeof nb);
    memcpy(t->sym, sym, sizeof sym);
    memcpy(t->ip, ax, sizeof ax);
    t->n_dims = a->n_dims;
    return quant_layout_ok(ctx, "permute of", a->name, t) ? t : NULL;
}

kiln_tensor *kiln_transpose(kiln_ctx *ctx, kiln_tensor *a) {
    kiln_tensor *t = kiln_permute(ctx, a, 1, 0, 2, 3);
    if (t) {
        t->op = FE_OP_TRANSPOSE;
        t->n_dims = a->n_dims < 2 ? 2 : a->n_dims;
    }
    return t;
}

/* ---- compute ops -------------------------------------------------------------------------- */

static kiln_tensor *unary(kiln_ctx *ctx, fe_op op, kiln_tensor *a) {
    if (!ctx || ctx->err || !a) return NULL;
    char sa[96];
    if (!is_float(a->type)) {
        fe_failf(ctx, KILN_ERR_SHAPE, "%s: '%s' is %s; this op takes f32, f16 or bf16", fe_ops[op].name,
                 a->name, shape_str(a, sa, sizeof sa));
        return NULL;
    }
    kiln_tensor *t = new_node(ctx, op, a->type, a->ne);
    if (!t) return NULL;
    t->src[0] = a;
    t->n_dims = a->n_dims;
    memcpy(t->sym, a->sym, sizeof t->sym);
    return t;
}

static kiln_tensor *binary(kiln_ctx *ctx, fe_op op, kiln_tensor *a, kiln_tensor *b) {
    if (!ctx || ctx->err || !a || !b) return NULL;
    char sa[96], sb[96];
    if (!is_float(a->type) || !is_float(b->type)) {
        fe_failf(ctx, KILN_ERR_SHAPE, "%s: operands '%s' (%s) and '%s' (%s) must be f32, f16 or bf16",
                 fe_ops[op].name, a->name, shape_str(a, sa, sizeof sa), b->name,
                 shape_str(b, sb, sizeof sb));
        return NULL;
    }
    if (!fe_can_repeat(b, a)) {
        fe_failf(ctx, KILN_ERR_SHAPE,
                 "%s: cannot broadcast '%s' (%s) to '%s' (%s): each dim of the second operand must "
                 "divide the first's",
                 fe_ops[op].name, b->name, shape_str(b, sb, sizeof sb), a->name,
                 shape_str(a, sa, sizeof sa));
        return NULL;
    }
    if (op == FE_OP_ADD1 && fe_nelements(b) != 1) {
        fe_failf(ctx, KILN_ERR_SHAPE, "add1: '%s' (%s) must be a scalar (one element)", b->name,
                 shape_str(b, sb, sizeof sb));
        return NULL;
    }
    uint8_t sym[4];
    if (!fe_sym_binary(ctx, fe_ops[op].name, a, b, sym)) return NULL;
    kiln_tensor *t = new_node(ctx, op, a->type, a->ne);
    if (!t) return NULL;
    memcpy(t->sym, sym, sizeof sym);
    t->src[0] = a;
    t->src[1] = b;
    t->n_dims = a->n_dims > b->n_dims ? a->n_dims : b->n_dims;
    return t;
}

kiln_tensor *kiln_cont(kiln_ctx *ctx, kiln_tensor *a) { return unary(ctx, FE_OP_CONT, a); }
kiln_tensor *kiln_add(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b) { return binary(ctx, FE_OP_ADD, a, b); }
kiln_tensor *kiln_sub(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b) { return binary(ctx, FE_OP_SUB, a, b); }
kiln_tensor *kiln_mul(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b) { return binary(ctx, FE_OP_MUL, a, b); }
kiln_tensor *kiln_div(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b) { return binary(ctx, FE_OP_DIV, a, b); }
kiln_tensor *kiln_add1(kiln_ctx *ctx, kiln_tensor *a, kiln_tensor *b) { return binary(ctx, FE_OP_ADD1, a, b); }

kiln_tensor *kiln_scale(kiln_ctx *ctx, kiln_tensor *a, float s, float b) {
    kiln_tensor *t = unary(ctx, FE_OP_SCALE, a);
    if (t) {
        t->fp[0] = s;
        t->fp[1] = b;
    }
    return t;
}

kiln_tensor *kiln_neg(kiln_ctx *ctx, kiln_tensor *a) { return unary(ctx, FE_OP_NEG, a); }
kiln_tensor *kiln_exp(kiln_ctx *ctx, kiln_tensor *a) { return unary(ctx, FE_OP_EXP, a); }
kiln_tensor *kiln_sqr(kiln_ctx *ctx, kiln_tensor *a) { return unary(ctx, FE_OP_SQR, a); }
kiln_tensor *kiln_sqrt(kiln_ctx *ctx, kiln_tensor *a) { return unary(ctx, FE_OP_SQRT, a); }
kiln_tensor *kiln_silu(kiln_ctx *ctx, kiln_tensor *a) { return unary(ctx, FE_OP_SILU, a); }
kiln_tensor *kiln_gelu(kiln_ctx *ctx, kiln_tensor *a) { return unary(ctx, FE_OP_GELU, a); }
kiln_tensor *kiln_relu(kiln_ctx *ctx, kiln_tensor *a) { return unary(ctx, FE_OP_RELU, a); }
kiln_tensor *kiln_tanh(kiln_ctx *ctx, kiln_tensor *a) { return unary(ctx, FE_OP_TANH, a); }
kiln_tensor *kiln_sigmoid(kiln_ctx *ctx, kiln_tensor *a) { return unary(ctx, FE_OP_SIGMOID, a); }
kiln_tensor *kiln_abs(kiln_ctx *ctx, kiln_tensor *a) { return unary(ctx, FE_OP_ABS, a); }
kiln_tensor *kiln_sgn(kiln_ctx *ctx, kiln_tensor *a) { return unary(ctx, FE_OP_SGN, a); }
kiln_tensor *kiln_step(kiln_ctx *ctx, kiln_tensor *a) { return unary(ctx, FE_OP_STEP, a); }
kiln_tensor *kiln_elu(kiln_ctx *ctx, kiln_tensor *a) { return unary(ctx, FE_OP_ELU, a); }
kiln_tensor *kiln_gelu_erf(kiln_ctx *ctx, kiln_tensor *a) { return unary(ctx, FE_OP_GELU_ERF, a); }
kiln_tensor *kiln_gelu_quick(kiln_ctx *ctx, kiln_tensor *a) { return unary(ctx, FE_OP_GELU_QUICK, a); }
kiln_tensor *kiln_hardswish(kiln_ctx *ctx, kiln_tensor *a) { return unary(ctx, FE_OP_HARDSWISH, a); }
kiln_tensor *kiln_hardsigmoid(kiln_ctx *ctx, kiln_tensor *a) { return unary(ctx, FE_OP_HARDSIGMOID, a); }
kiln_tensor *kiln_log(kiln_ctx *ctx, kiln_tensor *a) { return unary(ctx, FE_OP_LOG, a); }
kiln_tensor *kiln_sin(kiln_ctx *ctx, kiln_tensor *a) { return unary(ctx, FE_OP_SIN, a); }
kiln_tensor *kiln_cos(kiln_ctx *ctx, kiln_tensor *a) { return unary(ctx, FE_OP_COS, a); }
kiln_tensor *kiln_softplus(kiln_ctx *ctx, kiln_tensor *a) { return unary(ctx, FE_OP_SOFTPLUS, a); }

kiln_tensor *kiln_leaky_relu(kiln_ctx *ctx, kiln_tensor *a, float negative_slope) {
    kiln_tensor *t = unary(ctx, FE_OP_LEAKY_RELU, a);
    if (t) t->fp[0] = negative_slope;
    return t;
}

kiln_tensor *kiln_clamp(kiln_ctx *ctx, kiln_tensor *a, float min, float max) {
    kiln_tensor *t = unary(ctx, FE_OP_CLAMP, a);
    if (t) {
        t->fp[0] = min;
        t->fp[1] = max;
    }
    return t;
}

/* ---- generic building (the parser's path) ------------------------------------------------ */

/* An op with its own shape rule: checks and infers through fe_infer_of, then stores every
 * parameter in signature order. */
static kiln_tensor *build_inferred(kiln_ctx *ctx, fe_op op, const fe_args *a) {
    fe_infer_fn infer = fe_infer_of(op);
    if (!infer) {
        fe_failf(ctx, KILN_ERR_INVALID, "%s: not implemented", fe_ops[op].name);
        return NULL;
    }
    const fe_sig *sig = fe_op_sig(op);
    for (int i = 0; i < sig->n; i++) {
        const fe_param *p = &sig->p[i];
        if (p->kind == FE_P_TENSOR && !p->optional && !a->t[p->slot]) return NULL; /* error recorded */
    }
    kiln_type type = KILN_F32;
    int64_t   ne[4] = {1, 1, 1, 1};
    int       n_dims = 1;
    if (!infer(ctx, a, &type, ne, &n_dims)) return NULL;
    if (!ctx->err) {
        int64_t total = 1;
        for (int d = 0; d < 4; d++) {
            if (ne[d] < 1 || ne[d] > ((int64_t)1 << 48) / total) {
                fe_failf(ctx, KILN_ERR_SHAPE, "%s: result dim %d is %lld (out of range)",
                         fe_ops[op].name, d, (long long)ne[d]);
                return NULL;
            }
            total *= ne[d];
        }
    }
    if (ctx->err) return NULL;
    uint8_t sym[4];
    if (!fe_sym_infer(ctx, op, a, infer, ne, sym)) return NULL;
    kiln_tensor *t = new_node(ctx, op, type, ne);
    if (!t) return NULL;
    memcpy(t->sym, sym, sizeof sym);
    for (int i = 0; i < FE_MAX_SRC; i++) t->src[i] = a->t[i];
    memcpy(t->ip, a->ip, sizeof t->ip);
    memcpy(t->fp, a->fp, sizeof t->fp);
    t->n_dims = n_dims < 1 ? 1 : n_dims > 4 ? 4 : n_dims;
    return t;
}

kiln_tensor *fe_build(kiln_ctx *ctx, fe_op op, const fe_args *a) {
    if (!ctx || ctx->err || !a || (unsigned)op >= FE_OP_COUNT) return NULL;
    kiln_tensor *t = NULL;
    switch (fe_ops[op].kind) {
    case FE_LEAF: fe_failf(ctx, KILN_ERR_INVALID, "leaf: not an op"); return NULL;
    case FE_VIEW:
        switch (op) {
        case FE_OP_RESHAPE: return kiln_reshape(ctx, a->t[0], a->nlist[0], a->list[0]);
        case FE_OP_VIEW: {
            size_t nb[KILN_MAX_DIMS] = {0};
            for (int i = 0; i < a->nlist[1] && i < KILN_MAX_DIMS; i++) nb[i] = (size_t)a->list[1][i];
            return kiln_view(ctx, a->t[0], a->nlist[0], a->list[0], nb, (size_t)a->iw[0]);
        }
        case FE_OP_PERMUTE: return kiln_permute(ctx, a->t[0], a->ip[0], a->ip[1], a->ip[2], a->ip[3]);
        default: return kiln_transpose(ctx, a->t[0]);
        }
    case FE_UNARY:
        t = unary(ctx, op, a->t[0]);
        if (t) memcpy(t->fp, a->fp, sizeof t->fp);
        return t;
    case FE_BINARY: return binary(ctx, op, a->t[0], a->t[1]);
    case FE_GLU:
    case FE_COPY:
    case FE_KERNEL: return build_inferred(ctx, op, a);
    }
    return NULL;
}

/* ---- op listing --------------------------------------------------------------------------- */

kiln_status kiln_describe_ops(char **text) {
    static const char *kinds[] = {"leaf", "view", "unary", "binary", "glu", "copy", "kernel"};
    if (!text) return kb_error(KILN_ERR_INVALID, "kiln_describe_ops: text is NULL");
    kb_str o = {0};
    for (int i = 0; i < FE_OP_COUNT; i++) {
        const fe_op_info *op = &fe_ops[i];
        if (op->kind == FE_LEAF) continue;
        char usage[512];
        fe_op_usage((fe_op)i, usage, sizeof usage);
        kb_str_addf(&o, "%-14s %-7s %-21s %s\n", op->name, kinds[op->kind], op->types, usage);
    }
    *text = kb_str_take(&o);
    return *text ? NULL : kb_oom();
}

const char *fe_shape_str(const kiln_tensor *t, char *buf, size_t len) { return shape_str(t, buf, len); }
bool        fe_is_float(kiln_type t) { return is_float(t); }

bool fe_like_float_a(kiln_ctx *ctx, const char *op, const fe_args *a, kiln_type *type, int64_t ne[4], int *n_dims) {
    const kiln_tensor *x = a->t[0];
    if (!is_float(x->type)) {
        char s[96];
        fe_failf(ctx, KILN_ERR_SHAPE, "%s: operand '%s' is %s; it must be f32, f16 or bf16", op, x->name,
                 shape_str(x, s, sizeof s));
        return false;
    }
    for (int d = 0; d < 4; d++) ne[d] = x->ne[d];
    *type = x->type;
    *n_dims = x->n_dims;
    return true;
}

fe_desc fe_describe(const kiln_tensor *t) {
    fe_desc d;
    char    sh[96];
    snprintf(d.s, sizeof d.s, "'%s' (%s)", t->name, shape_str(t, sh, sizeof sh));
    return d;
}
