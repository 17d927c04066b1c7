/* The .kg text format, reading half: text -> builder calls (docs/graph-format.md).
 *
 * A hand-written recursive-descent parser over a one-token lexer. The text is one statement
 * per line; every statement becomes one call of a public builder (kiln_add, ...), so the
 * parser checks syntax, names and argument kinds while the builders keep the only copy of the
 * shape rules. Before each builder call the statement's position goes into ctx->file/line/col,
 * which is how a builder's shape error comes out as "f.kg:3:5: ...".
 *
 * Nothing here has a fixed-size buffer that input can overflow: tokens are (pointer, length)
 * slices of the text, which need not be NUL-terminated and may contain NUL bytes. */
#include "frontend/frontend.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ARGS 16    /* the most parameters any op has is 13 (rope_ext) */
#define MAX_NUM_LEN 63 /* a printed f32 never needs more than 16; longer numbers are typos */

/* ---- lexer ------------------------------------------------------------------------------ */

typedef enum {
    TK_IDENT, /* [A-Za-z_][A-Za-z0-9_.]*, and the header word kiln-graph */
    TK_NUM,   /* starts with [0-9.+-]; the whole run of [A-Za-z0-9_.+-] so "1e-5" is one token */
    TK_PUNCT, /* one of : = ( ) [ ] , < */
    TK_NL,    /* end of line: statements end here */
    TK_EOF,
    TK_BAD, /* any other byte */
} tk_kind;

typedef struct {
    tk_kind     kind;
    const char *s; /* first byte, inside the text */
    size_t      len;
    int         col; /* 1-based byte column */
} token;

typedef struct {
    kiln_tensor *t;
    int          line; /* where it was defined; 0 for tensors that were in ctx before parsing */
} sym;

typedef struct {
    kiln_ctx   *ctx;
    const char *file;
    const char *end;        /* one past the last byte of the text */
    const char *line_start; /* first byte of the current line, for columns */
    int         line;
    token       tok;        /* the current token */
    int         nstmt;      /* statements parsed so far; the header must come first */
    sym        *syms;       /* open addressing on the name, power-of-two capacity */
    size_t      nsyms, cap;
} parser;

static bool is_ident_start(int c) { return isalpha(c) || c == '_'; }
static bool is_ident_char(int c) { return isalnum(c) || c == '_' || c == '.'; }
static bool is_num_char(int c) { return isalnum(c) || c == '_' || c == '.' || c == '+' || c == '-'; }

/* The token starting at or after s on the current line. Pure: it does not move the parser,
 * so it also serves as a one-token peek. */
static token lex_at(const parser *P, const char *s) {
    const char *e = P->end;
    for (;;) {
        while (s < e && (*s == ' ' || *s == '\t' || *s == '\r')) s++;
        if (s < e && *s == '#') {
            while (s < e && *s != '\n') s++;
            continue;
        }
        break;
    }
    token t = {TK_EOF, s, 0, (int)(s - P->line_start) + 1};
    if (s >= e) return t;
    unsigned char c = (unsigned char)*s;
    const char *q = s + 1;
    static const char header[] = "kiln-graph";
    size_t hl = sizeof header - 1;
    if (c == '\n') {
        t.kind = TK_NL;
    } else if ((size_t)(e - s) >= hl && memcmp(s, header, hl) == 0 &&
               (s + hl == e || !is_ident_char((unsigned char)s[hl]))) {
        t.kind = TK_IDENT;
        q = s + hl;
    } else if (is_ident_start(c)) {
        t.kind = TK_IDENT;
        while (q < e && is_ident_char((unsigned char)*q)) q++;
    } else if (isdigit(c) || c == '.' || c == '-' || c == '+') {
        t.kind = TK_NUM;
        while (q < e && is_num_char((unsigned char)*q)) q++;
    } else if (strchr(":=()[],<", c) && c != 0) {
        t.kind = TK_PUNCT;
    } else {
        t.kind = TK_BAD;
    }
    t.len = (size_t)(q - s);
    return t;
}

static void advance(parser *P) {
    if (P->tok.kind == TK_EOF) return;
    if (P->tok.kind == TK_NL) {
        P->line++;
        P->line_start = P->tok.s + 1;
    }
    P->tok = lex_at(P, P->tok.s + P->tok.len);
}

static token peek(const parser *P) {
    if (P->tok.kind == TK_NL || P->tok.kind == TK_EOF) return P->tok;
    return lex_at(P, P->tok.s + P->tok.len);
}

static bool tok_is(const token *t, const char *word) {
    size_t n = strlen(word);
    return t->len == n && memcmp(t->s, word, n) == 0;
}

static bool is_punct(const token *t, char c) { return t->kind == TK_PUNCT && *t->s == c; }

/* A token for messages: 'text' (cut at 40 bytes), "end of line", or an escaped bad byte. */
static const char *describe(const token *t, char buf[64]) {
    switch (t->kind) {
    case TK_NL: return "end of line";
    case TK_EOF: return "end of file";
    case TK_BAD: {
        unsigned char c = (unsigned char)*t->s;
        if (isprint(c)) snprintf(buf, 64, "character '%c'", c);
        else snprintf(buf, 64, "character '\\x%02x'", c);
        return buf;
    }
    default:
        if (t->len > 40) snprintf(buf, 64, "'%.40s...'", t->s);
        else snprintf(buf, 64, "'%.*s'", (int)t->len, t->s);
        return buf;
    }
}

/* ---- errors ------------------------------------------------------------------------------ */

/* FILE:LINE:COL: error: <what>, always KILN_ERR_PARSE. */
KB_PRINTF(3, 4)
static kiln_status errf(const parser *P, int col, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kiln_status what = kb_errorv(KILN_ERR_PARSE, fmt, ap);
    va_end(ap);
    kiln_status st = kb_error(KILN_ERR_PARSE, "%s:%d:%d: error: %s", P->file, P->line, col,
                              kiln_status_msg(what));
    kiln_status_free(what);
    return st;
}

/* "expected X, got Y" at the current token; a bad byte is reported as itself, since the
 * stray character is the real problem whatever was expected there. */
static kiln_status expected(const parser *P, const char *what) {
    char buf[64];
    if (P->tok.kind == TK_BAD)
        return errf(P, P->tok.col, "unexpected %s", describe(&P->tok, buf));
    return errf(P, P->tok.col, "expected %s, got %s", what, describe(&P->tok, buf));
}

/* "missing ']': expected ',' or ']', got Y", for unclosed lists. */
static kiln_status missing(const parser *P, char c) {
    char buf[64];
    if (P->tok.kind == TK_BAD)
        return errf(P, P->tok.col, "unexpected %s", describe(&P->tok, buf));
    return errf(P, P->tok.col, "missing '%c': expected ',' or '%c', got %s", c, c, describe(&P->tok, buf));
}

/* ---- symbol table ------------------------------------------------------------------------ */

static uint64_t hash_name(const char *s, size_t n) {
    uint64_t h = 1469598103934665603u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211u;
    return h;
}

static sym *sym_find(const parser *P, const char *s, size_t n) {
    if (!P->cap) return NULL;
    for (size_t i = hash_name(s, n) & (P->cap - 1);; i = (i + 1) & (P->cap - 1)) {
        sym *e = &P->syms[i];
        if (!e->t) return NULL;
        if (strlen(e->t->name) == n && memcmp(e->t->name, s, n) == 0) return e;
    }
}

/* Adds t under its current name; the first definition of a name wins. */
static kiln_status sym_add(parser *P, kiln_tensor *t, int line) {
    if (2 * (P->nsyms + 1) > P->cap) {
        size_t cap = P->cap ? 2 * P->cap : 64;
        sym *old = P->syms, *syms = calloc(cap, sizeof *syms);
        if (!syms) return kb_oom();
        size_t oldcap = P->cap;
        P->syms = syms;
        P->cap = cap;
        P->nsyms = 0;
        for (size_t i = 0; i < oldcap; i++)
            if (old[i].t) sym_add(P, old[i].t, old[i].line); /* cannot grow again */
        free(old);
    }
    size_t n = strlen(t->name);
    for (size_t i = hash_name(t->name, n) & (P->cap - 1);; i = (i + 1) & (P->cap - 1)) {
        sym *e = &P->syms[i];
        if (e->t && strcmp(e->t->name, t->name) == 0) return NULL;
        if (!e->t) {
            e->t = t;
            e->line = line;
            P->nsyms++;
            return NULL;
        }
    }
}

/* ---- numbers ----------------------------------------------------------------------------- */

/* int := '-'? [0-9]+   (decimal, fits int64) */
static kiln_status to_int(const parser *P, const token *t, int64_t *out) {
    char buf[64];
    bool ok = t->kind == TK_NUM && t->len <= MAX_NUM_LEN;
    for (size_t i = 0; ok && i < t->len; i++)
        ok = isdigit((unsigned char)t->s[i]) || (i == 0 && t->s[i] == '-' && t->len > 1);
    if (!ok) return errf(P, t->col, "bad number: expected an integer, got %s", describe(t, buf));
    char num[MAX_NUM_LEN + 1];
    memcpy(num, t->s, t->len);
    num[t->len] = 0;
    errno = 0;
    long long v = strtoll(num, NULL, 10);
    if (errno == ERANGE) return errf(P, t->col, "bad number: %s is out of range", num);
    *out = v;
    return NULL;
}

/* float := anything strtof reads whole: 0.5, -1e-05, 0x1p-3, inf, -inf, nan. A bare name
 * inf or nan is a TK_IDENT, accepted here too. Overflow is an error; underflow to a subnormal
 * or zero is not, since the printer writes subnormals and they must read back. */
static kiln_status to_float(const parser *P, const token *t, float *out) {
    char buf[64];
    if ((t->kind != TK_NUM && t->kind != TK_IDENT) || t->len > MAX_NUM_LEN)
        return errf(P, t->col, "bad number: expected a number, got %s", describe(t, buf));
    char num[MAX_NUM_LEN + 1];
    memcpy(num, t->s, t->len);
    num[t->len] = 0;
    char *end;
    errno = 0;
    float v = strtof(num, &end);
    if (end != num + t->len || end == num)
        return errf(P, t->col, "bad number: expected a number, got %s", describe(t, buf));
    if (errno == ERANGE && isinf(v) && !isinf(strtod(num, NULL)))
        return errf(P, t->col, "bad number: %s is out of range for f32", num);
    *out = v;
    return NULL;
}

/* ---- lists and arguments ----------------------------------------------------------------- */

typedef enum { ARG_NAME, ARG_NUM, ARG_LIST } arg_kind;

typedef struct {
    arg_kind kind;
    bool     keyed; /* written name=value */
    token    key;   /* the name, when keyed */
    token    tok; /* the name or number, or the '[' of a list */
    int      n;   /* list entries */
    int64_t  v[KILN_MAX_DIMS];
    int      nsym;    /* entries that name a symbolic dim (v holds its kiln_dim handle) */
    int      neg_col; /* column of a negative entry, or 0 */
} arg;

/* A list entry that names a symbolic dim: its kiln_dim handle (or its value, in a bound copy). */
static kiln_status dim_entry(const parser *P, const token *t, int64_t *v) {
    char name[FE_MAX_NAME], buf[64];
    if (t->len >= FE_MAX_NAME) return errf(P, t->col, "unknown dim %s", describe(t, buf));
    memcpy(name, t->s, t->len);
    name[t->len] = 0;
    int i = kiln_ctx_dim_find(P->ctx, name);
    for (int b = 0; i < 0 && b < P->ctx->nbound; b++)
        if (strcmp(P->ctx->bound_name[b], name) == 0) {
            *v = P->ctx->bound_val[b];
            return NULL;
        }
    if (i < 0)
        return errf(P, t->col, "%s is not a symbolic dim (declare it first: dim %s <= MAX)",
                    describe(t, buf), name);
    /* the same value kiln_dim gives: a handle, or 1 for a dim of maximum 1 (frontend/dims.c) */
    *v = P->ctx->dims[i].max == 1 ? 1 : -(int64_t)i - 1;
    return NULL;
}

/* list := '[' [ entry { ',' entry } ] ']'   entry := int | dim-name
 * (at most 4 entries: shapes and strides) */
static kiln_status parse_list(parser *P, arg *a) {
    a->kind = ARG_LIST;
    a->tok = P->tok;
    a->n = 0;
    a->nsym = 0;
    a->neg_col = 0;
    advance(P); /* '[' */
    if (is_punct(&P->tok, ']')) {
        advance(P);
        return NULL;
    }
    for (;;) {
        if (P->tok.kind != TK_NUM && P->tok.kind != TK_IDENT)
            return expected(P, "an integer or a dim name in the list");
        if (a->n == KILN_MAX_DIMS)
            return errf(P, P->tok.col, "too many dims: at most %d", KILN_MAX_DIMS);
        kiln_status st;
        if (P->tok.kind == TK_IDENT) {
            st = dim_entry(P, &P->tok, &a->v[a->n]);
            a->nsym += a->v[a->n] < 0;
            a->n++;
        } else {
            st = to_int(P, &P->tok, &a->v[a->n]);
            if (!st && a->v[a->n] < 0 && !a->neg_col) a->neg_col = P->tok.col;
            a->n++;
        }
        if (st) return st;
        advance(P);
        if (is_punct(&P->tok, ']')) break;
        if (!is_punct(&P->tok, ',')) return missing(P, ']');
        advance(P);
    }
    advance(P); /* ']' */
    return NULL;
}

/* arg := [ name '=' ] ( name | number | list ) */
static kiln_status parse_arg(parser *P, arg *a) {
    a->keyed = false;
    if (P->tok.kind == TK_IDENT) {
        token next = peek(P);
        if (next.kind == TK_PUNCT && *next.s == '=') {
            a->keyed = true;
            a->key = P->tok;
            advance(P);
            advance(P);
        }
    }
    if (is_punct(&P->tok, '[')) return parse_list(P, a);
    if (P->tok.kind != TK_IDENT && P->tok.kind != TK_NUM)
        return expected(P, "a tensor name, number or list");
    a->kind = P->tok.kind == TK_IDENT ? ARG_NAME : ARG_NUM;
    a->tok = P->tok;
    advance(P);
    return NULL;
}

static kiln_status lookup_tensor(const parser *P, const token *t, kiln_tensor **out);

/* ---- arguments against the op's signature (frontend/sig.c) --------------------------------- */

/* The converted arguments, and the list arguments as written (for position-exact errors). */
typedef struct {
    fe_args    a;
    const arg *list[2];
    const arg *at[FE_MAX_PARAMS]; /* the argument given for each parameter, or NULL */
} op_params;

static int leading_tensors(const fe_sig *sig) {
    int n = 0;
    while (n < sig->n && sig->p[n].kind == FE_P_TENSOR && !sig->p[n].optional) n++;
    return n;
}

static bool all_tensors(const fe_sig *sig) {
    for (int i = 0; i < sig->n; i++)
        if (sig->p[i].kind != FE_P_TENSOR) return false;
    return true;
}

/* Does a name fit parameter kind k (tensors; floats spelled inf/nan; bools, types, enums)? */
static bool name_fits(fe_pkind k) { return k != FE_P_INT && k != FE_P_INT4 && k != FE_P_LIST; }

static kiln_status convert(const parser *P, fe_op op, const fe_param *q, const arg *x, int argno,
                           const char *usage, op_params *out) {
    const char *name = fe_ops[op].name;
    char        buf[64];
    int64_t     v;
    kiln_status st;
    switch (q->kind) {
    case FE_P_TENSOR:
        if (x->kind != ARG_NAME)
            return errf(P, x->tok.col, "argument %d of %s (%s) must be a tensor name (usage: %s)", argno,
                        name, q->name, usage);
        return lookup_tensor(P, &x->tok, &out->a.t[q->slot]);
    case FE_P_LIST:
        if (x->kind != ARG_LIST)
            return errf(P, x->tok.col, "argument %d of %s must be a list like [4, 8], got %s (usage: %s)",
                        argno, name, describe(&x->tok, buf), usage);
        out->list[q->slot] = x;
        out->a.nlist[q->slot] = x->n;
        memcpy(out->a.list[q->slot], x->v, sizeof x->v);
        return NULL;
    case FE_P_INT4:
        if (x->kind != ARG_LIST || x->n != 4 || x->nsym)
            return errf(P, x->tok.col, "argument %d of %s (%s) must be a list of 4 integers (usage: %s)",
                        argno, name, q->name, usage);
        for (int k = 0; k < 4; k++) {
            if (x->v[k] < INT32_MIN || x->v[k] > INT32_MAX)
                return errf(P, x->tok.col, "bad number: %" PRId64 " is out of range", x->v[k]);
            out->a.ip[q->slot + k] = (int32_t)x->v[k];
        }
        return NULL;
    case FE_P_INT:
        if (x->kind != ARG_NUM)
            return errf(P, x->tok.col, "argument %d of %s must be an integer, got %s (usage: %s)", argno,
                        name, x->kind == ARG_LIST ? "a list" : describe(&x->tok, buf), usage);
        if ((st = to_int(P, &x->tok, &v))) return st;
        out->a.iw[q->slot] = v;
        if (op == FE_OP_VIEW) return NULL; /* a byte offset: 64 bits, checked below */
        if (v < INT32_MIN || v > INT32_MAX)
            return errf(P, x->tok.col, "bad number: %" PRId64 " is out of range", v);
        out->a.ip[q->slot] = (int32_t)v;
        return NULL;
    case FE_P_FLOAT:
        if (x->kind == ARG_LIST)
            return errf(P, x->tok.col, "argument %d of %s must be a number, got a list (usage: %s)", argno,
                        name, usage);
        return to_float(P, &x->tok, &out->a.fp[q->slot]);
    case FE_P_BOOL:
        if (tok_is(&x->tok, "true") || tok_is(&x->tok, "1")) out->a.ip[q->slot] = 1;
        else if (tok_is(&x->tok, "false") || tok_is(&x->tok, "0")) out->a.ip[q->slot] = 0;
        else
            return errf(P, x->tok.col, "argument %d of %s (%s) must be true or false, got %s", argno, name,
                        q->name, describe(&x->tok, buf));
        return NULL;
    case FE_P_TYPE: {
        char tn[16];
        kiln_type t;
        if (x->kind == ARG_NAME && x->tok.len < sizeof tn) {
            memcpy(tn, x->tok.s, x->tok.len);
            tn[x->tok.len] = 0;
            if (kiln_type_from_name(tn, &t) == 0) {
                out->a.ip[q->slot] = (int32_t)t;
                return NULL;
            }
        }
        return errf(P, x->tok.col, "argument %d of %s (%s) must be a type (f32, f16, bf16, i32 or i64), got %s",
                    argno, name, q->name, describe(&x->tok, buf));
    }
    case FE_P_ENUM:
        for (int k = 0; x->kind == ARG_NAME && k < q->nenum; k++)
            if (tok_is(&x->tok, q->enums[k])) {
                out->a.ip[q->slot] = k;
                return NULL;
            }
        return errf(P, x->tok.col, "argument %d of %s (%s) must be one of the names in %s, got %s", argno,
                    name, q->name, usage, describe(&x->tok, buf));
    }
    return NULL;
}

/* Matches args to op's signature: positional arguments fill the parameters in order, name=value
 * ones by name; parameters left out take their defaults. */
static kiln_status check_args(const parser *P, fe_op op, const arg *args, int nargs,
                              const token *close, op_params *out) {
    const char   *name = fe_ops[op].name;
    const fe_sig *sig = fe_op_sig(op);
    const char   *usage = fe_op_usage_text(op);
    char          buf[64];
    memset(out, 0, sizeof *out);
    fe_args_defaults(op, &out->a);

    int npos = 0;
    while (npos < nargs && !args[npos].keyed) npos++;
    for (int k = npos; k < nargs; k++)
        if (!args[k].keyed)
            return errf(P, args[k].tok.col, "positional argument after a name=value one in %s (usage: %s)",
                        name, usage);
    int nreq = 0, nt = leading_tensors(sig);
    for (int i = 0; i < sig->n; i++) nreq += !sig->p[i].optional;

    /* Operands: the leading names, except where a parameter other than a tensor takes a name. */
    int names = 0;
    while (names < npos && args[names].kind == ARG_NAME &&
           (names >= sig->n ? all_tensors(sig) : sig->p[names].kind == FE_P_TENSOR))
        names++;
    if (names < nt || (names > sig->n && all_tensors(sig))) {
        int at = names < nt ? names : sig->n;
        int col = at < nargs ? args[at].tok.col : close->col;
        return errf(P, col, "%s takes %d operand%s, got %d (usage: %s)", name, nt, nt == 1 ? "" : "s",
                    names, usage);
    }
    if (npos > sig->n) {
        int col = args[sig->n].tok.col;
        if (all_tensors(sig))
            return errf(P, col, "%s takes no parameters after its operand%s (usage: %s)", name,
                        nt == 1 ? "" : "s", usage);
        return errf(P, col, "wrong number of arguments to %s: got %d, expected %s%d (usage: %s)", name,
                    nargs, nreq == sig->n ? "" : "at most ", sig->n, usage);
    }
    for (int k = 0; k < npos; k++) {
        const fe_param *q = &sig->p[k];
        if (q->kind == FE_P_TENSOR && args[k].kind != ARG_NAME && !q->optional)
            return errf(P, args[k].tok.col, "%s takes %d operand%s (usage: %s)", name, nt, nt == 1 ? "" : "s",
                        usage);
        if (q->kind == FE_P_TENSOR && args[k].kind != ARG_NAME)
            return errf(P, args[k].tok.col,
                        "argument %d of %s is the tensor '%s': name a tensor there, or pass the "
                        "parameters after it as name=value (usage: %s)",
                        k + 1, name, q->name, usage);
        if (args[k].kind == ARG_NAME && !name_fits(q->kind) && q->kind != FE_P_TENSOR)
            return errf(P, args[k].tok.col, "argument %d of %s (%s) must be %s, got %s (usage: %s)", k + 1,
                        name, q->name, q->kind == FE_P_INT ? "an integer" : "a list", describe(&args[k].tok, buf),
                        usage);
        out->at[k] = &args[k];
    }
    for (int k = npos; k < nargs; k++) {
        int i = 0;
        while (i < sig->n && !tok_is(&args[k].key, sig->p[i].name)) i++;
        if (i == sig->n)
            return errf(P, args[k].key.col, "%s has no parameter %s (usage: %s)", name,
                        describe(&args[k].key, buf), usage);
        if (out->at[i])
            return errf(P, args[k].key.col, "%s: parameter '%s' is given twice", name, sig->p[i].name);
        out->at[i] = &args[k];
    }
    for (int i = 0; i < sig->n; i++) {
        if (out->at[i] || sig->p[i].optional) continue;
        if (npos < nargs)
            return errf(P, close->col, "%s: missing parameter '%s' (usage: %s)", name, sig->p[i].name, usage);
        return errf(P, close->col, "wrong number of arguments to %s: got %d, expected %s%d (usage: %s)", name,
                    nargs, nreq == sig->n ? "" : "at least ", nreq, usage);
    }
    for (int i = 0; i < sig->n; i++) {
        if (!out->at[i]) continue;
        int         argno = (int)(out->at[i] - args) + 1;
        kiln_status st = convert(P, op, &sig->p[i], out->at[i], argno, usage, out);
        if (st) return st;
    }
    return NULL;
}

/* ---- statements -------------------------------------------------------------------------- */

/* An edit distance small enough to call a typo (Levenshtein, names of up to 31 bytes). */
static int distance(const char *a, size_t na, const char *b) {
    size_t nb = strlen(b);
    if (na > 31 || nb > 31) return 99;
    int row[32];
    for (size_t j = 0; j <= nb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int up = row[j];
            int sub = diag + (tolower((unsigned char)a[i - 1]) != b[j - 1]);
            int v = up + 1 < row[j - 1] + 1 ? up + 1 : row[j - 1] + 1;
            row[j] = sub < v ? sub : v;
            diag = up;
        }
    }
    return row[nb];
}

static kiln_status lookup_op(const parser *P, const token *t, fe_op *op) {
    char name[32], buf[64];
    if (t->len < sizeof name) {
        memcpy(name, t->s, t->len);
        name[t->len] = 0;
        if (fe_op_from_name(name, op) == 0) {
            if (*op != FE_OP_LEAF) return NULL;
            return errf(P, t->col, "'leaf' is not an op; declare leaves with 'input' or 'weight'");
        }
    }
    int best = 3, besti = -1; /* suggest only within 2 edits */
    for (int i = 1; i < FE_OP_COUNT; i++) {
        int d = distance(t->s, t->len, fe_ops[i].name);
        if (d < best) best = d, besti = i;
    }
    if (besti >= 0)
        return errf(P, t->col, "unknown op %s (did you mean '%s'?)", describe(t, buf), fe_ops[besti].name);
    return errf(P, t->col, "unknown op %s", describe(t, buf));
}

/* The operand called t, defined by an earlier statement. */
static kiln_status lookup_tensor(const parser *P, const token *t, kiln_tensor **out) {
    char buf[64];
    sym *e = sym_find(P, t->s, t->len);
    if (!e) return errf(P, t->col, "undefined name %s", describe(t, buf));
    *out = e->t;
    return NULL;
}

/* A name about to be defined: not too long for a tensor, not defined before. */
static kiln_status check_new_name(const parser *P, const token *t) {
    char buf[64];
    if (t->len >= FE_MAX_NAME)
        return errf(P, t->col, "name %s is too long (at most %d characters)", describe(t, buf),
                    FE_MAX_NAME - 1);
    sym *e = sym_find(P, t->s, t->len);
    if (e && e->line > 0)
        return errf(P, t->col, "duplicate name %s: first defined at line %d", describe(t, buf), e->line);
    if (e) return errf(P, t->col, "duplicate name %s: already defined in the context", describe(t, buf));
    char name[FE_MAX_NAME];
    memcpy(name, t->s, t->len);
    name[t->len] = 0;
    if (kiln_ctx_dim_find(P->ctx, name) >= 0)
        return errf(P, t->col, "duplicate name %s: it names a symbolic dim", describe(t, buf));
    return NULL;
}

/* Points builder errors at the statement: fe_failf prefixes "file:line:col: ". */
static void locate(parser *P, int col) {
    P->ctx->file = P->file;
    P->ctx->line = P->line;
    P->ctx->col = col;
}

/* After a builder call: its error if it failed, else NULL. */
static kiln_status builder_status(const parser *P, const kiln_tensor *t, const token *at) {
    if (P->ctx->err) return kb_status_copy(P->ctx->err);
    if (!t) return errf(P, at->col, "internal error: builder failed without an error");
    return NULL;
}

/* Range checks the builders cannot do, because the values are narrowed on the way to them. */
static kiln_status check_params(const parser *P, fe_op op, const arg *args, const op_params *p) {
    (void)args;
    if (op == FE_OP_RESHAPE || op == FE_OP_VIEW) {
        const arg *ne = p->list[0];
        if (ne->n == 0) return errf(P, ne->tok.col, "empty shape: %s needs 1 to %d dims", fe_ops[op].name, KILN_MAX_DIMS);
        if (ne->neg_col) return errf(P, ne->neg_col, "bad number: a dim is negative; dims must be >= 1");
    }
    if (op == FE_OP_VIEW && p->list[1]->nsym)
        return errf(P, p->list[1]->tok.col, "a view's strides are bytes, not symbolic dims");
    if (op == FE_OP_VIEW) {
        const arg *ne = p->list[0], *nb = p->list[1];
        if (nb->n != ne->n - 1)
            return errf(P, nb->tok.col, "a view of %d dim%s takes %d stride%s (nb1..), got %d", ne->n,
                        ne->n == 1 ? "" : "s", ne->n - 1, ne->n == 2 ? "" : "s", nb->n);
        for (int i = 0; i < nb->n; i++)
            if (nb->v[i] < 0) return errf(P, nb->tok.col, "bad number: stride %" PRId64 " is negative", nb->v[i]);
        if (p->a.iw[0] < 0)
            return errf(P, p->at[3]->tok.col, "bad number: offset %" PRId64 " is negative", p->a.iw[0]);
    }
    return NULL;
}

/* Defines name as t: the statement's name (output: also marks it a graph output). */
static kiln_status bind(parser *P, kiln_tensor *t, const token *name, bool output) {
    char s[FE_MAX_NAME];
    memcpy(s, name->s, name->len); /* check_new_name bounded the length */
    s[name->len] = 0;
    if (output) kiln_set_output(P->ctx, t, s);
    else kiln_set_name(P->ctx, t, s);
    kiln_status st = builder_status(P, t, name);
    if (st) return st;
    return sym_add(P, t, P->line);
}

/* def := [ 'output' ] name '=' op '(' [ arg { ',' arg } ] ')'
 * (the 'output' keyword, if any, is already consumed) */
static kiln_status parse_def(parser *P, bool output) {
    token name = P->tok;
    kiln_status st = check_new_name(P, &name);
    if (st) return st;
    advance(P);
    if (!is_punct(&P->tok, '=')) {
        if (is_punct(&P->tok, ':'))
            return errf(P, P->tok.col, "expected '=' after %.*s, got ':' (declare leaves with 'input' or 'weight')",
                        (int)name.len, name.s);
        char what[96];
        snprintf(what, sizeof what, "'=' after '%.*s'", (int)(name.len > 40 ? 40 : name.len), name.s);
        return expected(P, what);
    }
    advance(P);
    if (P->tok.kind != TK_IDENT) return expected(P, "an op name");
    token optok = P->tok;
    fe_op op;
    if ((st = lookup_op(P, &optok, &op))) return st;
    advance(P);
    if (!is_punct(&P->tok, '(')) return expected(P, "'(' after the op name");
    advance(P);

    arg args[MAX_ARGS];
    int nargs = 0;
    if (!is_punct(&P->tok, ')')) {
        for (;;) {
            if (nargs == MAX_ARGS)
                return errf(P, P->tok.col, "too many arguments to %s", fe_ops[op].name);
            if ((st = parse_arg(P, &args[nargs++]))) return st;
            if (is_punct(&P->tok, ')')) break;
            if (!is_punct(&P->tok, ',')) return missing(P, ')');
            advance(P);
        }
    }
    token close = P->tok;
    advance(P); /* ')' */

    op_params p;
    if ((st = check_args(P, op, args, nargs, &close, &p))) return st;
    if ((st = check_params(P, op, args, &p))) return st;

    locate(P, optok.col);
    kiln_tensor *t = fe_build(P->ctx, op, &p.a);
    if ((st = builder_status(P, t, &optok))) return st;
    return bind(P, t, &name, output);
}

/* decl := ( 'input' | 'weight' | 'state' ) name ':' type list
 * (the keyword is already consumed) */
static kiln_status parse_decl(parser *P, kiln_role role) {
    token name = P->tok;
    kiln_status st = check_new_name(P, &name);
    if (st) return st;
    advance(P);
    if (!is_punct(&P->tok, ':')) return expected(P, "':' and a type after the name");
    advance(P);
    if (P->tok.kind != TK_IDENT) return expected(P, "a type (f32, f16, bf16, i32 or i64)");
    kiln_type type;
    char tn[16], buf[64];
    bool ok = P->tok.len < sizeof tn;
    if (ok) {
        memcpy(tn, P->tok.s, P->tok.len);
        tn[P->tok.len] = 0;
        ok = kiln_type_from_name(tn, &type) == 0;
    }
    if (!ok)
        return errf(P, P->tok.col, "unknown type %s (expected f32, f16, bf16, i32 or i64)",
                    describe(&P->tok, buf));
    advance(P);
    if (!is_punct(&P->tok, '[')) return expected(P, "'[' and the shape after the type");
    arg shape;
    if ((st = parse_list(P, &shape))) return st;
    if (shape.n == 0) return errf(P, shape.tok.col, "empty shape: a tensor has 1 to %d dims", KILN_MAX_DIMS);
    if (shape.neg_col) return errf(P, shape.neg_col, "bad number: a dim is negative; dims must be >= 1");

    char s[FE_MAX_NAME];
    memcpy(s, name.s, name.len);
    s[name.len] = 0;
    locate(P, name.col);
    kiln_tensor *t = kiln_new_tensor(P->ctx, role, type, s, shape.n, shape.v);
    if ((st = builder_status(P, t, &name))) return st;
    return sym_add(P, t, P->line);
}

/* dim := 'dim' name '<=' int [ 'specialize' spec { ',' spec } ], spec := int | '<=' int
 * (the keyword is consumed) */
static kiln_status parse_dim(parser *P) {
    token name = P->tok;
    kiln_status st = check_new_name(P, &name);
    if (st) return st;
    char s[FE_MAX_NAME];
    memcpy(s, name.s, name.len);
    s[name.len] = 0;
    advance(P);
    token eq = peek(P);
    if (!is_punct(&P->tok, '<') || !is_punct(&eq, '='))
        return expected(P, "'<=' and the maximum after the dim name");
    advance(P);
    advance(P);
    int64_t max;
    token   at = P->tok;
    if (P->tok.kind != TK_NUM) return expected(P, "the dim's maximum (an integer)");
    if ((st = to_int(P, &P->tok, &max))) return st;
    advance(P);
    locate(P, name.col);
    kiln_dim(P->ctx, s, max);
    if (P->ctx->err) return kb_status_copy(P->ctx->err);
    if (!tok_is(&P->tok, "specialize") || P->tok.kind != TK_IDENT) return NULL;
    advance(P);
    for (;;) {
        int64_t v;
        bool    upto = false;
        token   eq2 = peek(P);
        if (is_punct(&P->tok, '<') && is_punct(&eq2, '=')) { /* '<=' V: a smaller maximum */
            upto = true;
            advance(P);
            advance(P);
        }
        at = P->tok;
        if (P->tok.kind != TK_NUM)
            return expected(P, upto ? "a smaller maximum to specialize for (an integer)" : "a value to specialize for (an integer)");
        if ((st = to_int(P, &P->tok, &v))) return st;
        locate(P, at.col);
        if (upto) kiln_dim_specialize_upto(P->ctx, s, v);
        else kiln_dim_specialize(P->ctx, s, v);
        if (P->ctx->err) return kb_status_copy(P->ctx->err);
        advance(P);
        if (!is_punct(&P->tok, ',')) return NULL;
        advance(P);
    }
}

/* header := 'kiln-graph' int      (version 1; only before every other statement) */
static kiln_status parse_header(parser *P) {
    if (P->nstmt > 0)
        return errf(P, P->tok.col, "the 'kiln-graph' header must come before any statement");
    advance(P);
    if (P->tok.kind != TK_NUM) return expected(P, "a format version after 'kiln-graph'");
    int64_t v;
    kiln_status st = to_int(P, &P->tok, &v);
    if (st) return st;
    if (v != 1) return errf(P, P->tok.col, "unsupported format version %" PRId64 " (this kiln reads 1)", v);
    advance(P);
    return NULL;
}

/* stmt := header | dim | decl | def
 * The keywords input, weight, state, dim and output are keywords only when a name follows them, so they
 * remain usable as tensor names ("output = add(a, b)", "output output = ..."). */
static kiln_status parse_stmt(parser *P) {
    if (P->tok.kind != TK_IDENT) return expected(P, "a statement (input, weight, or name = op(...))");
    if (tok_is(&P->tok, "kiln-graph")) return parse_header(P);
    token next = peek(P);
    if (next.kind == TK_IDENT) {
        bool in = tok_is(&P->tok, "input"), w = tok_is(&P->tok, "weight"), out = tok_is(&P->tok, "output");
        bool state = tok_is(&P->tok, "state"), dim = tok_is(&P->tok, "dim");
        if (in || w || out || state || dim) advance(P);
        if (in) return parse_decl(P, KILN_ROLE_INPUT);
        if (w) return parse_decl(P, KILN_ROLE_WEIGHT);
        if (state) return parse_decl(P, KILN_ROLE_STATE);
        if (dim) return parse_dim(P);
        if (out) return parse_def(P, true);
    }
    /* Any other "a b" is a def missing its '=', which parse_def reports. */
    return parse_def(P, false);
}

/* file := { [ stmt ] [ '#' comment ] '\n' } */
static kiln_status parse_file(parser *P) {
    for (;;) {
        if (P->tok.kind == TK_EOF) return NULL;
        if (P->tok.kind != TK_NL) {
            kiln_status st = parse_stmt(P);
            if (st) return st;
            P->nstmt++;
            if (P->tok.kind != TK_NL && P->tok.kind != TK_EOF) {
                char buf[64];
                if (P->tok.kind == TK_BAD)
                    return errf(P, P->tok.col, "unexpected %s", describe(&P->tok, buf));
                return errf(P, P->tok.col, "trailing junk after the statement: %s", describe(&P->tok, buf));
            }
        }
        advance(P);
    }
}

kiln_status kiln_parse(kiln_ctx *ctx, const char *text, size_t len, const char *filename) {
    if (!ctx) return kb_error(KILN_ERR_INVALID, "kiln_parse: ctx is NULL");
    if (!text && len) return kb_error(KILN_ERR_INVALID, "kiln_parse: text is NULL");
    if (ctx->err) return kb_status_copy(ctx->err);
    if (!text) text = "";
    parser P = {.ctx = ctx, .file = filename ? filename : "<input>", .end = text + len,
                .line_start = text, .line = 1};
    kiln_status st = NULL;
    /* Names already in ctx may be used as operands (and may not be redefined). */
    for (int i = 0; i < ctx->n && !st; i++) st = sym_add(&P, ctx->t[i], 0);
    if (!st) {
        P.tok = lex_at(&P, text);
        st = parse_file(&P);
    }
    free(P.syms);
    ctx->file = NULL; /* filename belongs to the caller: later C API errors get no location */
    ctx->line = ctx->col = 0;
    /* A failed parse leaves ctx failed too, as a builder error would, so a caller that only
     * checks kiln_graph_new still sees it. */
    if (st && !ctx->err) fe_fail(ctx, kb_status_copy(st));
    return st;
}

kiln_status kiln_load(kiln_ctx *ctx, const char *path) {
    if (!ctx || !path) return kb_error(KILN_ERR_INVALID, "kiln_load: NULL argument");
    char *text;
    size_t len;
    kiln_status st = kb_read_file(path, &text, &len);
    if (st) return st;
    st = kiln_parse(ctx, text, len, path);
    free(text);
    return st;
}
