/* Symbolic dims: declaration, resolution of handles, and how they follow the ops.
 *
 * A tensor keeps the maximum as its extent and remembers which dims are symbolic (sym[]), so
 * every shape rule, stride and size works on the maximum unchanged: layouts are the layouts at
 * the maximum. What a symbolic dim adds is only the knowledge of which extents vary; that is
 * what this file propagates. */
#include "frontend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t handle_of(int i) { return -(int64_t)i - 1; }

int kiln_ctx_dim_find(const kiln_ctx *ctx, const char *name) {
    if (!ctx || !name) return -1;
    for (int i = 0; i < ctx->ndims; i++)
        if (strcmp(ctx->dims[i].name, name) == 0) return i;
    return -1;
}

static int bound_find(const kiln_ctx *ctx, const char *name) {
    for (int i = 0; i < ctx->nbound; i++)
        if (strcmp(ctx->bound_name[i], name) == 0) return i;
    return -1;
}

int64_t kiln_dim(kiln_ctx *ctx, const char *name, int64_t max) {
    if (!ctx || ctx->err) return 0;
    if (!fe_valid_name(name)) {
        fe_failf(ctx, KILN_ERR_INVALID, "dim: name '%s' is not an identifier", name ? name : "(null)");
        return 0;
    }
    if (max < 1 || max > ((int64_t)1 << 40)) {
        fe_failf(ctx, KILN_ERR_SHAPE, "dim %s: maximum %lld is out of range (1 .. 2^40)", name,
                 (long long)max);
        return 0;
    }
    int b = bound_find(ctx, name);
    if (b >= 0) {
        if (ctx->bound_val[b] > max) {
            fe_failf(ctx, KILN_ERR_SHAPE, "dim %s: value %lld is over its maximum %lld", name,
                     (long long)ctx->bound_val[b], (long long)max);
            return 0;
        }
        return ctx->bound_val[b];
    }
    if (ctx->cap_val > 0 && !strcmp(ctx->cap_name, name) && ctx->cap_val < max) max = ctx->cap_val;
    int i = kiln_ctx_dim_find(ctx, name);
    if (i >= 0) {
        if (ctx->dims[i].max != max) {
            fe_failf(ctx, KILN_ERR_SHAPE, "dim %s is declared again with maximum %lld (was %lld)",
                     name, (long long)max, (long long)ctx->dims[i].max);
            return 0;
        }
        return max == 1 ? 1 : handle_of(i);
    }
    if (fe_find(ctx, name)) {
        fe_failf(ctx, KILN_ERR_INVALID, "dim %s: a tensor already has that name", name);
        return 0;
    }
    if (ctx->ndims == KILN_MAX_SYMS) {
        fe_failf(ctx, KILN_ERR_INVALID, "dim %s: at most %d symbolic dims", name, KILN_MAX_SYMS);
        return 0;
    }
    fe_dim *d = &ctx->dims[ctx->ndims];
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "%s", name);
    d->max = max;
    ctx->ndims++;
    /* A dim whose maximum is 1 can only be 1, and shape inference, which finds a result's
     * symbolic dims by probing another value, could not tell it from a static 1: its uses are
     * the static extent 1. Its name stays declared, so binding and printing it still work. */
    return max == 1 ? 1 : handle_of(ctx->ndims - 1);
}

/* Value spec (upto false) or smaller-maximum spec (upto true) of dim name. */
static void specialize(kiln_ctx *ctx, const char *name, int64_t value, bool upto) {
    if (!ctx || ctx->err || !name) return;
    if (bound_find(ctx, name) >= 0) return; /* a bound copy: the dim is a constant already */
    if (ctx->cap_val > 0 && !strcmp(ctx->cap_name, name)) return; /* a variant's graph: no nesting */
    int i = kiln_ctx_dim_find(ctx, name);
    if (i < 0) {
        fe_failf(ctx, KILN_ERR_INVALID, "specialize: no symbolic dim named '%s'", name);
        return;
    }
    fe_dim *d = &ctx->dims[i];
    if (upto && (value < 1 || value >= d->max)) {
        fe_failf(ctx, KILN_ERR_SHAPE, "specialize %s <= %lld: the smaller maximum must be in 1 .. %lld (below the "
                 "maximum %lld)", name, (long long)value, (long long)(d->max - 1), (long long)d->max);
        return;
    }
    if (value < 1 || value > d->max) {
        fe_failf(ctx, KILN_ERR_SHAPE, "specialize %s: value %lld is not in 1 .. %lld", name,
                 (long long)value, (long long)d->max);
        return;
    }
    if (d->max == 1) return; /* its one value is the general program's already */
    for (int k = 0; k < d->nspec; k++)
        if (d->spec[k] == value && d->spec_upto[k] == upto) return;
    if (d->nspec == 4) {
        fe_failf(ctx, KILN_ERR_INVALID, "specialize %s: at most 4 specializations", name);
        return;
    }
    d->spec_upto[d->nspec] = upto;
    d->spec[d->nspec++] = value;
}

void kiln_dim_specialize(kiln_ctx *ctx, const char *name, int64_t value) { specialize(ctx, name, value, false); }

void kiln_dim_specialize_upto(kiln_ctx *ctx, const char *name, int64_t max) { specialize(ctx, name, max, true); }

int kiln_ctx_dim_count(const kiln_ctx *ctx) { return ctx ? ctx->ndims : 0; }

const char *kiln_ctx_dim_name(const kiln_ctx *ctx, int i) {
    return ctx && i >= 0 && i < ctx->ndims ? ctx->dims[i].name : NULL;
}

int64_t kiln_ctx_dim_max(const kiln_ctx *ctx, int i) {
    return ctx && i >= 0 && i < ctx->ndims ? ctx->dims[i].max : 0;
}

const char *kiln_tensor_dim_name(const kiln_tensor *t, int d) {
    if (!t || (unsigned)d >= 4 || !t->sym[d] || !t->ctx) return NULL;
    return t->ctx->dims[t->sym[d] - 1].name;
}

bool fe_resolve_extent(kiln_ctx *ctx, const char *what, int64_t v, int64_t *ne, uint8_t *sym) {
    *sym = 0;
    *ne = v;
    if (v >= 0) return true;
    int64_t i = -v - 1;
    if (i >= ctx->ndims)
        return fe_reject(ctx, KILN_ERR_SHAPE, "%s: extent %lld is neither >= 1 nor a kiln_dim handle", what,
                         (long long)v);
    *ne = ctx->dims[i].max;
    *sym = (uint8_t)(i + 1);
    return true;
}

bool fe_has_sym(const kiln_tensor *t) { return t->sym[0] | t->sym[1] | t->sym[2] | t->sym[3]; }

const char *fe_extent_str(const kiln_ctx *ctx, const kiln_tensor *t, int d, char buf[FE_MAX_NAME]) {
    if (t->sym[d] && ctx && t->sym[d] <= ctx->ndims) return ctx->dims[t->sym[d] - 1].name;
    return kb_fmt_i64(t->ne[d], buf); /* (FE_MAX_NAME holds its 24) */
}

static const char *dim_name(const kiln_ctx *ctx, int s) {
    return s > 0 && s <= ctx->ndims ? ctx->dims[s - 1].name : "?";
}

bool fe_sym_binary(kiln_ctx *ctx, const char *op, const kiln_tensor *a, const kiln_tensor *b,
                   uint8_t sym[4]) {
    for (int d = 0; d < 4; d++) {
        sym[d] = a->sym[d];
        if (b->sym[d] && b->sym[d] != a->sym[d])
            return fe_reject(ctx, KILN_ERR_SHAPE,
                             "%s: '%s' has symbolic dim %s in dim %d, where '%s' has %s: a symbolic dim "
                             "broadcasts only onto the same dim", op, b->name, dim_name(ctx, b->sym[d]), d, a->name,
                             a->sym[d] ? dim_name(ctx, a->sym[d]) : "a static extent");
        if (a->sym[d] && !b->sym[d] && b->ne[d] != 1)
            return fe_reject(ctx, KILN_ERR_SHAPE,
                             "%s: dim %d of '%s' is symbolic (%s), so '%s' must have 1 or %s there, not %lld", op, d,
                             a->name, dim_name(ctx, a->sym[d]), b->name, dim_name(ctx, a->sym[d]), (long long)b->ne[d]);
    }
    return true;
}

/* Another value of a dim of maximum max, unlikely to satisfy by accident a rule that holds only
 * at the maximum (a divisibility, an equality with a static extent). */
static int64_t probe_value(int64_t max) { return max > 2 ? max - 1 : 1; }

/* Copies of the operands with dim s at its probe value (contiguous ones stay contiguous). */
static void probe_args(const kiln_ctx *ctx, const fe_args *a, int s, kiln_tensor *copies,
                       fe_args *out) {
    *out = *a;
    int64_t pv = probe_value(ctx->dims[s - 1].max);
    for (int i = 0; i < FE_MAX_SRC; i++) {
        const kiln_tensor *t = a->t[i];
        if (!t) continue;
        bool uses = false;
        for (int d = 0; d < 4; d++) uses |= t->sym[d] == s;
        if (!uses) continue;
        copies[i] = *t;
        bool contiguous = fe_is_contiguous(t);
        for (int d = 0; d < 4; d++)
            if (t->sym[d] == s) copies[i].ne[d] = pv;
        if (contiguous)
            for (int d = 1; d < 4; d++) copies[i].nb[d] = copies[i].nb[d - 1] * (size_t)copies[i].ne[d - 1];
        out->t[i] = &copies[i];
    }
}

bool fe_sym_infer(kiln_ctx *ctx, fe_op op, const fe_args *a, fe_infer_fn infer, const int64_t ne[4],
                  uint8_t sym[4]) {
    memset(sym, 0, 4);
    bool used[KILN_MAX_SYMS + 1] = {0};
    for (int i = 0; i < FE_MAX_SRC; i++)
        for (int d = 0; a->t[i] && d < 4; d++) used[a->t[i]->sym[d]] = true;
    for (int s = 1; s <= ctx->ndims; s++) {
        if (!used[s]) continue;
        kiln_tensor copies[FE_MAX_SRC];
        fe_args     pa;
        probe_args(ctx, a, s, copies, &pa);
        kiln_type type;
        int64_t   pne[4] = {1, 1, 1, 1};
        int       nd = 1;
        /* The rule records its error in ctx: run it on the side and keep ours. */
        const char *file = ctx->file;
        ctx->file = NULL;
        bool ok = infer(ctx, &pa, &type, pne, &nd);
        ctx->file = file;
        char why[512] = "";
        if (ctx->err) {
            snprintf(why, sizeof why, ": %s", kiln_status_msg(ctx->err));
            kiln_status_free(ctx->err);
            ctx->err = NULL;
            ok = false;
        }
        const fe_dim *dim = &ctx->dims[s - 1];
        int64_t       pv = probe_value(dim->max);
        if (!ok)
            return fe_reject(ctx, KILN_ERR_SHAPE,
                             "%s: the shapes fit only at the maximum of symbolic dim %s (%lld), not at other "
                             "values (at %lld%s)", fe_ops[op].name, dim->name, (long long)dim->max, (long long)pv, why);
        for (int d = 0; d < 4; d++) {
            if (pne[d] == ne[d]) continue;
            if (ne[d] == dim->max && pne[d] == pv && !sym[d]) {
                sym[d] = (uint8_t)s;
                continue;
            }
            fe_failf(ctx, KILN_ERR_SHAPE,
                     "%s: dim %d of the result depends on symbolic dim %s other than by being it "
                     "(%lld at the maximum %lld, %lld at %lld)",
                     fe_ops[op].name, d, dim->name, (long long)ne[d], (long long)dim->max,
                     (long long)pne[d], (long long)pv);
            return false;
        }
    }
    return true;
}

/* The symbolic dims of a shape as (dim, product of the extents below it), in order. */
static int sym_places(const int64_t ne[4], const uint8_t sym[4], int s_out[4], int64_t below[4]) {
    int     n = 0;
    int64_t p = 1;
    for (int d = 0; d < 4; d++) {
        if (sym[d]) {
            s_out[n] = sym[d];
            below[n++] = p;
        }
        p *= ne[d];
    }
    return n;
}

bool fe_sym_reshape(kiln_ctx *ctx, const kiln_tensor *a, const int64_t ne[4], const uint8_t sym[4]) {
    int     sa[4], sb[4];
    int64_t pa[4], pb[4];
    int     na = sym_places(a->ne, a->sym, sa, pa), nb = sym_places(ne, sym, sb, pb);
    bool    same = na == nb;
    for (int i = 0; same && i < na; i++) same = sa[i] == sb[i] && pa[i] == pb[i];
    if (same) return true;
    fe_failf(ctx, KILN_ERR_SHAPE,
             "reshape of '%s': its symbolic dims must keep their places (the same extents below "
             "each, in the same order); a reshape cannot merge or split a symbolic dim",
             a->name);
    return false;
}

/* ctx's graph printed (or its text, when the caller has it: kiln_print(ctx) already) and parsed
 * again into c, whose bound or capped dims make it another graph of the same text: *out = c, or
 * c freed and the error returned. */
static kiln_status reparse(const kiln_ctx *ctx, const char *given, kiln_ctx *c, const char *what, kiln_ctx **out) {
    char       *text = NULL;
    kiln_status st = given ? NULL : kiln_print(ctx, &text);
    if (!st) {
        const char *t = given ? given : text;
        st = kiln_parse(c, t, strlen(t), what);
        free(text);
    }
    if (st) {
        kiln_ctx_free(c);
        return st;
    }
    *out = c;
    return NULL;
}

static kiln_status bind_text(const kiln_ctx *ctx, const char *text, int n, const char *const *names,
                             const int64_t *values, kiln_ctx **out) {
    if (!out) return kb_error(KILN_ERR_INVALID, "kiln_ctx_bind: out is NULL");
    *out = NULL;
    if (!ctx || n < 0 || (n && (!names || !values)))
        return kb_error(KILN_ERR_INVALID, "kiln_ctx_bind: bad arguments");
    if (n > KILN_MAX_SYMS) return kb_error(KILN_ERR_INVALID, "kiln_ctx_bind: more than %d dims", KILN_MAX_SYMS);
    if (ctx->err) return kb_status_copy(ctx->err);
    for (int i = 0; i < n; i++) {
        int d = kiln_ctx_dim_find(ctx, names[i]);
        if (d < 0) return kb_error(KILN_ERR_NOT_FOUND, "no symbolic dim named '%s'", names[i]);
        if (values[i] < 1 || values[i] > ctx->dims[d].max)
            return kb_error(KILN_ERR_SHAPE, "dim %s = %lld is not in 1 .. %lld (its maximum)", names[i],
                            (long long)values[i], (long long)ctx->dims[d].max);
    }
    kiln_ctx *c = kiln_ctx_new();
    if (!c) return kb_oom();
    for (int i = 0; i < n; i++) {
        snprintf(c->bound_name[i], FE_MAX_NAME, "%s", names[i]);
        c->bound_val[i] = values[i];
    }
    c->nbound = n;
    return reparse(ctx, text, c, "<bound graph>", out);
}

kiln_status kiln_ctx_bind(const kiln_ctx *ctx, int n, const char *const *names, const int64_t *values,
                          kiln_ctx **out) {
    return bind_text(ctx, NULL, n, names, values, out);
}

static kiln_status cap_text(const kiln_ctx *ctx, const char *text, const char *name, int64_t max, kiln_ctx **out) {
    if (!out) return kb_error(KILN_ERR_INVALID, "kiln_ctx_cap: out is NULL");
    *out = NULL;
    if (!ctx || !name) return kb_error(KILN_ERR_INVALID, "kiln_ctx_cap: bad arguments");
    if (ctx->err) return kb_status_copy(ctx->err);
    int d = kiln_ctx_dim_find(ctx, name);
    if (d < 0) return kb_error(KILN_ERR_NOT_FOUND, "no symbolic dim named '%s'", name);
    if (max < 1 || max >= ctx->dims[d].max)
        return kb_error(KILN_ERR_SHAPE, "dim %s <= %lld: the smaller maximum must be in 1 .. %lld", name, (long long)max,
                        (long long)(ctx->dims[d].max - 1));
    kiln_ctx *c = kiln_ctx_new();
    if (!c) return kb_oom();
    snprintf(c->cap_name, FE_MAX_NAME, "%s", name);
    c->cap_val = max;
    return reparse(ctx, text, c, "<capped graph>", out);
}

kiln_status kiln_ctx_cap(const kiln_ctx *ctx, const char *name, int64_t max, kiln_ctx **out) {
    return cap_text(ctx, NULL, name, max, out);
}

kiln_status fe_ctx_specialize(const kiln_ctx *ctx, const char *text, int d, int64_t v, kiln_ctx **out) {
    if (!ctx || d < 0 || d >= ctx->ndims) return kb_error(KILN_ERR_INVALID, "fe_ctx_specialize: bad arguments");
    const char *name = ctx->dims[d].name;
    return v < 0 ? cap_text(ctx, text, name, -v, out) : bind_text(ctx, text, 1, &name, &v, out);
}
