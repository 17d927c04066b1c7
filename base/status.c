#include "base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kiln_status_s {
    kiln_code code;
    char      msg[];
};

/* Returned when even the error cannot be allocated; never freed. */
static struct {
    kiln_code code;
    char      msg[32];
} oom_status = {KILN_ERR_NOMEM, "out of host memory"};

kiln_status kb_oom(void) { return (kiln_status)&oom_status; }

kiln_status kb_errorv(kiln_code code, const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) n = 0;
    kiln_status st = malloc(sizeof *st + (size_t)n + 1);
    if (!st) return kb_oom();
    st->code = code;
    vsnprintf(st->msg, (size_t)n + 1, fmt, ap);
    return st;
}

kiln_status kb_error(kiln_code code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kiln_status st = kb_errorv(code, fmt, ap);
    va_end(ap);
    return st;
}

kiln_status kb_wrap(kiln_status st, const char *fmt, ...) {
    if (!st) return NULL;
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    kiln_status w = kb_error(st->code, "%s: %s", prefix, st->msg);
    kiln_status_free(st);
    return w;
}

kiln_status kb_status_copy(kiln_status st) {
    if (!st) return NULL;
    return kb_error(st->code, "%s", st->msg);
}

kiln_code kiln_status_code(kiln_status st) { return st ? st->code : KILN_OK; }

const char *kiln_status_msg(kiln_status st) { return st ? st->msg : ""; }

void kiln_status_free(kiln_status st) {
    if (st && st != (kiln_status)&oom_status) free(st);
}

const char *kiln_code_name(kiln_code code) {
    static const char *names[] = {"ok",    "invalid", "parse",  "shape",  "io",     "nomem",
                                  "codegen", "nvrtc", "cache", "no-gpu", "cuda", "not-found",
                                  "format"};
    if ((unsigned)code < sizeof names / sizeof names[0]) return names[code];
    return "unknown";
}
