/* The .kg text format, writing half: a context -> canonical text (docs/graph-format.md).
 *
 * Canonical means one spelling per graph: the header, then every tensor in creation order, one
 * statement per line, single spaces, every op parameter written out (no defaults), floats as
 * the shortest text that reads back as the same f32. The parser reads it back to the same graph,
 * so printing the parsed text again gives the same bytes. */
#include "frontend/frontend.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A name the parser reads back as one name token: [A-Za-z_][A-Za-z0-9_.]*. */
/* Text only names tensors, so every name must be spellable and unique. A C API user can break
 * both (kiln_set_name(ctx, t, "a b"), or naming a tensor "_3" when another's auto name is
 * "_3"); that is an error here rather than text that does not parse back. */
static kiln_status check_names(const kiln_ctx *ctx) {
    for (int i = 0; i < ctx->n; i++)
        if (!fe_valid_name(ctx->t[i]->name))
            return kb_error(KILN_ERR_INVALID,
                            "cannot print tensor %d: its name '%s' is not a .kg name ([A-Za-z_][A-Za-z0-9_.]*)",
                            ctx->t[i]->id, ctx->t[i]->name);
    const kiln_tensor *a, *b;
    kiln_status st = fe_find_duplicate_name(ctx->t, ctx->n, &a, &b);
    if (!st && a)
        st = kb_error(KILN_ERR_INVALID, "cannot print: tensors %d and %d are both named '%s'", a->id,
                      b->id, a->name);
    return st;
}

/* The shortest text that reads back as the same f32; inf and nan are spelled so on every libc
 * ("-nan" is not). */
static void add_float(kb_str *b, float f) {
    char buf[32];
    if (isnan(f)) kb_str_add(b, "nan");
    else if (isinf(f)) kb_str_add(b, f > 0 ? "inf" : "-inf");
    else {
        kb_format_float(f, buf);
        kb_str_add(b, buf);
    }
}

static void add_ne(kb_str *b, const kiln_tensor *t, int n) {
    kb_str_add(b, "[");
    for (int i = 0; i < n; i++) {
        char e[FE_MAX_NAME];
        if (i) kb_str_add(b, ", ");
        kb_str_add(b, fe_extent_str(t->ctx, t, i, e));
    }
    kb_str_add(b, "]");
}

/* dim n_tokens <= 512 specialize 1, <= 64 */
static void print_dims(kb_str *b, const kiln_ctx *ctx) {
    for (int i = 0; i < ctx->ndims; i++) {
        const fe_dim *d = &ctx->dims[i];
        kb_str_addf(b, "dim %s <= %" PRId64, d->name, d->max);
        for (int k = 0; k < d->nspec; k++)
            kb_str_addf(b, "%s%s%" PRId64, k ? ", " : " specialize ", d->spec_upto[k] ? "<= " : "", d->spec[k]);
        kb_str_add(b, "\n");
    }
}

/* leaf: input x: f32[4096, 8]   (dims as fe_print_dims says) */
static kiln_status print_leaf(kb_str *b, const kiln_tensor *t) {
    const char *kw = t->role == KILN_ROLE_INPUT    ? "input"
                     : t->role == KILN_ROLE_WEIGHT ? "weight"
                     : t->role == KILN_ROLE_STATE  ? "state"
                                                   : NULL;
    if (!kw)
        return kb_error(KILN_ERR_INVALID,
                        "cannot print leaf '%s': .kg leaves are inputs, weights or states, this one is %s",
                        t->name, t->role == KILN_ROLE_OUTPUT ? "an output" : "neither");
    kb_str_addf(b, "%s %s: %s", kw, t->name, kiln_type_name(t->type));
    add_ne(b, t, fe_print_dims(t));
    return NULL;
}

static void add_param(kb_str *b, const kiln_tensor *t, const fe_param *q) {
    switch (q->kind) {
    case FE_P_TENSOR: kb_str_add(b, t->src[q->slot]->name); break;
    case FE_P_FLOAT: add_float(b, t->fp[q->slot]); break;
    case FE_P_BOOL: kb_str_add(b, t->ip[q->slot] ? "true" : "false"); break;
    case FE_P_TYPE: kb_str_add(b, kiln_type_name((kiln_type)t->ip[q->slot])); break;
    case FE_P_ENUM: {
        int v = t->ip[q->slot];
        if (v >= 0 && v < q->nenum) kb_str_add(b, q->enums[v]);
        else kb_str_add_i64(b, v); /* the parser refuses it: a C API misuse shows */
        break;
    }
    case FE_P_INT4:
        kb_str_addf(b, "[%d, %d, %d, %d]", (int)t->ip[q->slot], (int)t->ip[q->slot + 1],
                    (int)t->ip[q->slot + 2], (int)t->ip[q->slot + 3]);
        break;
    case FE_P_LIST: break; /* views only, printed by print_op */
    default: kb_str_add_i64(b, (int)t->ip[q->slot]); break;
    }
}

/* op: [output ] name = op(params)   Every parameter is written, defaults included: positionally
 * up to the first optional tensor, as name=value from there on (absent tensors left out). */
static kiln_status print_op(kb_str *b, const kiln_tensor *t) {
    const fe_op_info *info = &fe_ops[t->op];
    const fe_sig     *sig = fe_op_sig(t->op);
    for (int i = 0; i < sig->n; i++)
        if (sig->p[i].kind == FE_P_TENSOR && !sig->p[i].optional && !t->src[sig->p[i].slot])
            return kb_error(KILN_ERR_INVALID, "cannot print '%s': operand %s is missing", t->name,
                            sig->p[i].name);
    if (t->n_dims < 1 || t->n_dims > KILN_MAX_DIMS)
        return kb_error(KILN_ERR_INVALID, "cannot print '%s': it has %d dims", t->name, t->n_dims);
    if (t->role == KILN_ROLE_OUTPUT) kb_str_add(b, "output ");
    kb_str_add(b, t->name);
    kb_str_add(b, " = ");
    kb_str_add(b, info->name);
    kb_str_add(b, "(");
    if (t->op == FE_OP_RESHAPE || t->op == FE_OP_VIEW) {
        kb_str_add(b, t->src[0]->name);
        kb_str_add(b, ", ");
        add_ne(b, t, t->n_dims);
        if (t->op == FE_OP_VIEW) {
            kb_str_add(b, ", [");
            for (int i = 1; i < t->n_dims; i++) kb_str_addf(b, "%s%zu", i > 1 ? ", " : "", t->nb[i]);
            kb_str_addf(b, "], %zu", t->op_offs);
        }
        kb_str_add(b, ")");
        return NULL;
    }
    bool keyed = false, first = true;
    for (int i = 0; i < sig->n; i++) {
        const fe_param *q = &sig->p[i];
        if (q->kind == FE_P_TENSOR && q->optional) keyed = true;
        if (q->kind == FE_P_TENSOR && !t->src[q->slot]) continue;
        kb_str_add(b, first ? "" : ", ");
        first = false;
        if (keyed) {
            kb_str_add(b, q->name);
            kb_str_add(b, "=");
        }
        add_param(b, t, q);
    }
    kb_str_add(b, ")");
    return NULL;
}

kiln_status kiln_print(const kiln_ctx *ctx, char **text) {
    if (!text) return kb_error(KILN_ERR_INVALID, "kiln_print: text is NULL");
    *text = NULL;
    if (!ctx) return kb_error(KILN_ERR_INVALID, "kiln_print: ctx is NULL");
    kiln_status st = check_names(ctx);
    if (st) return st;
    kb_str b = {0};
    kb_str_add(&b, "kiln-graph 1\n");
    print_dims(&b, ctx);
    for (int i = 0; i < ctx->n && !st; i++) {
        const kiln_tensor *t = ctx->t[i];
        if ((unsigned)t->op >= FE_OP_COUNT) {
            st = kb_error(KILN_ERR_INVALID, "cannot print '%s': bad op %d", t->name, (int)t->op);
            break;
        }
        st = t->op == FE_OP_LEAF ? print_leaf(&b, t) : print_op(&b, t);
        kb_str_add(&b, "\n");
    }
    if (st) {
        kb_str_free(&b);
        return st;
    }
    char *s = kb_str_take(&b);
    if (!s) return kb_oom();
    *text = s;
    return NULL;
}
