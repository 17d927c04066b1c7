/* Op signatures: the `sig` column of FE_OPS read into fe_sig, once per op.
 *
 * One description of an op's parameters drives the parser (positional and name=value
 * arguments, defaults, usage lines in errors), the printer (canonical text) and `kiln ops`, so
 * adding an op is a table row plus its shape rule, never an edit of the parser. */
#include "frontend.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static fe_sig         g_sigs[FE_OP_COUNT];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* Reads "[a,b,c,d]" into v; returns the count read. */
static int read_ints(const char *s, int32_t *v, int max) {
    int n = 0;
    if (*s == '[') s++;
    while (*s && *s != ']' && n < max) {
        char *end;
        v[n++] = (int32_t)strtol(s, &end, 10);
        s = end;
        if (*s == ',') s++;
    }
    return n;
}

static void parse_default(fe_param *p, const char *def) {
    switch (p->kind) {
    case FE_P_INT: p->idef[0] = (int32_t)strtol(def, NULL, 10); break;
    case FE_P_FLOAT: p->fdef = strtof(def, NULL); break;
    case FE_P_BOOL: p->idef[0] = strcmp(def, "true") == 0; break;
    case FE_P_TYPE: {
        kiln_type t = KILN_F32;
        kiln_type_from_name(def, &t);
        p->idef[0] = (int32_t)t;
        break;
    }
    case FE_P_ENUM:
        for (int i = 0; i < p->nenum; i++)
            if (strcmp(p->enums[i], def) == 0) p->idef[0] = i;
        break;
    case FE_P_INT4: read_ints(def, p->idef, 4); break;
    default: break;
    }
}

/* One "name:kind[?][=default]" word. */
static void parse_param(fe_sig *s, const char *w, size_t len) {
    char buf[128];
    if (len >= sizeof buf) len = sizeof buf - 1;
    memcpy(buf, w, len);
    buf[len] = 0;
    fe_param *p = &s->p[s->n++];
    memset(p, 0, sizeof *p);
    char *colon = strchr(buf, ':');
    if (!colon) return;
    *colon = 0;
    snprintf(p->name, sizeof p->name, "%.23s", buf);
    char *kind = colon + 1, *def = strchr(kind, '=');
    if (def) *def++ = 0;
    size_t kl = strlen(kind);
    if (kl && kind[kl - 1] == '?') {
        p->optional = true;
        kind[--kl] = 0;
    }
    if (strcmp(kind, "t") == 0) p->kind = FE_P_TENSOR, p->slot = s->ntensor++;
    else if (strcmp(kind, "f") == 0) p->kind = FE_P_FLOAT, p->slot = s->nfloat++;
    else if (strcmp(kind, "L") == 0) p->kind = FE_P_LIST, p->slot = s->nlist++;
    else if (strcmp(kind, "I4") == 0) p->kind = FE_P_INT4, p->slot = s->nint, s->nint += 4;
    else {
        p->slot = s->nint++;
        if (strcmp(kind, "i") == 0) p->kind = FE_P_INT;
        else if (strcmp(kind, "b") == 0) p->kind = FE_P_BOOL;
        else if (strcmp(kind, "y") == 0) p->kind = FE_P_TYPE;
        else if (kind[0] == 'e' && kind[1] == '(') {
            p->kind = FE_P_ENUM;
            const char *c = kind + 2;
            while (*c && *c != ')' && p->nenum < FE_MAX_ENUM) {
                size_t n = strcspn(c, "|)");
                snprintf(p->enums[p->nenum++], sizeof p->enums[0], "%.*s", (int)n, c);
                c += n;
                if (*c == '|') c++;
            }
        }
    }
    if (def) {
        p->optional = true;
        parse_default(p, def);
    }
}

static void read_all(void) {
    for (int op = 0; op < FE_OP_COUNT; op++) {
        fe_sig *s = &g_sigs[op];
        const char *c = fe_ops[op].sig;
        while (*c && s->n < FE_MAX_PARAMS) {
            while (*c == ' ') c++;
            size_t n = strcspn(c, " ");
            if (n) parse_param(s, c, n);
            c += n;
        }
    }
}

const fe_sig *fe_op_sig(fe_op op) {
    if ((unsigned)op >= FE_OP_COUNT) return NULL;
    pthread_once(&g_once, read_all);
    return &g_sigs[op];
}

void fe_args_defaults(fe_op op, fe_args *a) {
    const fe_sig *s = fe_op_sig(op);
    for (int i = 0; s && i < s->n; i++) {
        const fe_param *p = &s->p[i];
        if (!p->optional) continue;
        switch (p->kind) {
        case FE_P_TENSOR: a->t[p->slot] = NULL; break;
        case FE_P_FLOAT: a->fp[p->slot] = p->fdef; break;
        case FE_P_INT4:
            for (int k = 0; k < 4; k++) a->ip[p->slot + k] = p->idef[k];
            break;
        case FE_P_LIST: break;
        default: a->ip[p->slot] = p->idef[0]; break;
        }
    }
}

void fe_op_usage(fe_op op, char *out, size_t n) {
    const fe_sig *s = fe_op_sig(op);
    size_t    len = 0;
    #define PUT(...) do { int w_ = snprintf(out + len, len < n ? n - len : 0, __VA_ARGS__); if (w_ > 0) len += (size_t)w_; } while (0)
    PUT("%s(", fe_ops[op].name);
    for (int i = 0; s && i < s->n; i++) {
        const fe_param *p = &s->p[i];
        PUT("%s", i ? ", " : "");
        switch (p->kind) {
        case FE_P_TENSOR: PUT(p->optional ? "%s=NAME" : "%s", p->name); break;
        case FE_P_LIST: PUT("[%s...]", p->name); break;
        case FE_P_ENUM:
            PUT("%s", p->name);
            if (p->optional) PUT("=%s", p->enums[p->idef[0]]);
            else {
                PUT(" (");
                for (int k = 0; k < p->nenum; k++) PUT("%s%s", k ? "|" : "", p->enums[k]);
                PUT(")");
            }
            break;
        default:
            PUT("%s", p->name);
            if (p->optional) {
                if (p->kind == FE_P_FLOAT) PUT("=%g", (double)p->fdef);
                else if (p->kind == FE_P_BOOL) PUT("=%s", p->idef[0] ? "true" : "false");
                else if (p->kind == FE_P_TYPE) PUT("=%s", kiln_type_name((kiln_type)p->idef[0]));
                else if (p->kind == FE_P_INT4)
                    PUT("=[%d, %d, %d, %d]", p->idef[0], p->idef[1], p->idef[2], p->idef[3]);
                else PUT("=%d", p->idef[0]);
            }
            break;
        }
    }
    PUT(")");
    #undef PUT
    if (n && len >= n) out[n - 1] = 0;
}

/* Every op's usage, made once: the parser quotes it in its errors, and making it for every op
 * it read took 7% of a program-cache hit (a model's graph is parsed again for each variant). */
static char           usage_text[FE_OP_COUNT][512];
static pthread_once_t usage_once = PTHREAD_ONCE_INIT;

static void make_usages(void) {
    for (int i = 0; i < FE_OP_COUNT; i++) fe_op_usage((fe_op)i, usage_text[i], sizeof usage_text[i]);
}

const char *fe_op_usage_text(fe_op op) {
    pthread_once(&usage_once, make_usages);
    return (unsigned)op < FE_OP_COUNT ? usage_text[op] : "";
}
