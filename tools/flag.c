/* Values of command-line flags, checked whole (tools/flag.h). strtoll and atoi are not enough
 * for user input: atoi has no error at all, strtoll saturates at LLONG_MAX (a size computed
 * from it then overflows), skips leading blanks, and strtoull takes "-5" as 2^64 - 5. Digits
 * are read here one by one with the overflow check before each step. */
#include "tools/flag.h"

#include "kiln.h"

#include "cache/cache.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "run" -> "kiln help run"; "cache evict" -> "kiln help cache"; NULL -> "kiln help". */
static void see_help(const char *cmd) {
    if (!cmd) {
        fputs("\n(see 'kiln help')\n", stderr);
        return;
    }
    size_t n = strcspn(cmd, " ");
    fprintf(stderr, "\n(see 'kiln help %.*s')\n", (int)n, cmd);
}

void kt_flag_vusage(const char *cmd, const char *fmt, va_list ap) {
    if (cmd) fprintf(stderr, "kiln %s: ", cmd);
    else fputs("kiln: ", stderr);
    vfprintf(stderr, fmt, ap);
    see_help(cmd);
}

bool kt_flag_usage(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kt_flag_vusage(cmd, fmt, ap);
    va_end(ap);
    return false;
}

/* Between a flag and its value in messages: none after "--dim NAME=", else a space. */
static const char *sep(const char *flag) {
    size_t n = strlen(flag);
    return n && flag[n - 1] == '=' ? "" : " ";
}

/* Digits of text[0..len) as a magnitude; false when there are none, a non-digit, or more than
 * fits in 64 bits. */
static bool magnitude(const char *text, size_t len, uint64_t *out) {
    uint64_t v = 0;
    if (len == 0) return false;
    for (size_t i = 0; i < len; i++) {
        if (text[i] < '0' || text[i] > '9') return false;
        unsigned d = (unsigned)(text[i] - '0');
        if (v > (UINT64_MAX - d) / 10) return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

/* text[0..len) as a signed 64-bit value; false when it is not one. */
static bool parse_int(const char *text, size_t len, int64_t *out) {
    bool     neg = len > 0 && text[0] == '-';
    uint64_t m;
    if (!magnitude(text + neg, len - neg, &m)) return false;
    if (m > (uint64_t)INT64_MAX + neg) return false;
    *out = neg ? (int64_t)(0 - m) : (int64_t)m; /* 0 - m: INT64_MIN without signed overflow */
    return true;
}

static bool int_in(const char *cmd, const char *flag, const char *text, size_t len, int64_t min, int64_t max,
                   int64_t *out) {
    int64_t v;
    if (!parse_int(text, len, &v))
        return kt_flag_usage(cmd, "%s%s%s: not an integer in %lld .. %lld", flag, sep(flag), text, (long long)min,
                             (long long)max);
    if (v < min || v > max)
        return kt_flag_usage(cmd, "%s%s%s: must be %lld .. %lld", flag, sep(flag), text, (long long)min,
                             (long long)max);
    *out = v;
    return true;
}

bool kt_flag_int(const char *cmd, const char *flag, const char *text, int64_t min, int64_t max, int64_t *out) {
    return int_in(cmd, flag, text, strlen(text), min, max, out);
}

bool kt_flag_float(const char *cmd, const char *flag, const char *text, float *out) {
    char *end = NULL;
    errno = 0;
    float v = strtof(text, &end);
    if (!*text || *end || errno == ERANGE || !isfinite(v))
        return kt_flag_usage(cmd, "%s %s: not a finite number", flag, text);
    *out = v;
    return true;
}

bool kt_flag_int32(const char *cmd, const char *flag, const char *text, int min, int max, int *out) {
    int64_t v;
    if (!kt_flag_int(cmd, flag, text, min, max, &v)) return false;
    *out = (int)v;
    return true;
}

bool kt_flag_uint(const char *cmd, const char *flag, const char *text, uint64_t max, uint64_t *out) {
    uint64_t v;
    if (text[0] == '-')
        return kt_flag_usage(cmd, "%s %s: must be 0 .. %llu", flag, text, (unsigned long long)max);
    if (!magnitude(text, strlen(text), &v))
        return kt_flag_usage(cmd, "%s %s: not an integer in 0 .. %llu", flag, text, (unsigned long long)max);
    if (v > max) return kt_flag_usage(cmd, "%s %s: must be 0 .. %llu", flag, text, (unsigned long long)max);
    *out = v;
    return true;
}

bool kt_flag_size(const char *cmd, const char *flag, const char *text, uint64_t *out) {
    kiln_status st = kc_parse_size(text, out); /* the one size syntax, KILN_CACHE_MAX's */
    if (!st) return true;
    kt_flag_usage(cmd, "%s: %s", flag, kiln_status_msg(st));
    kiln_status_free(st);
    return false;
}

int64_t kt_flag_list_count(const char *text) {
    int64_t n = 1;
    for (const char *p = text; *p; p++) n += *p == ',';
    return n;
}

bool kt_flag_int_list(const char *cmd, const char *flag, const char *text, int64_t min, int64_t max, int32_t *out,
                      int64_t cap, int64_t *n) {
    *n = 0;
    for (const char *p = text;; p++) {
        size_t  len = strcspn(p, ",");
        int64_t v;
        if (!parse_int(p, len, &v) || v < min || v > max || *n == cap)
            return kt_flag_usage(cmd, "%s %s: '%.*s' is not an integer in %lld .. %lld", flag, text, (int)len, p,
                                 (long long)min, (long long)max);
        out[(*n)++] = (int32_t)v;
        p += len;
        if (!*p) return true;
    }
}

bool kt_flag_no_fuse(const char *cmd, const char *arg, char *list, size_t cap) {
    const char *names = strchr(arg, '=') + 1;
    size_t      len = strlen(list);
    if (!*names) return kt_flag_usage(cmd, "%s: give pass names after '=' (listed by 'kiln help compile')", arg);
    kiln_status bad = kiln_check_fusion_passes(names);
    if (bad) {
        kt_flag_usage(cmd, "%s", kiln_status_msg(bad));
        kiln_status_free(bad);
        return false;
    }
    if (len + strlen(names) + 2 > cap) return kt_flag_usage(cmd, "%s: too many pass names", arg);
    snprintf(list + len, cap - len, "%s%s", len ? "," : "", names);
    return true;
}

bool kt_flag_arch(const char *cmd, const char *flag, const char *value, bool list) {
    if (!*value) return kt_flag_usage(cmd, "%s: no architecture given", flag);
    if (!list && strchr(value, ','))
        return kt_flag_usage(cmd, "%s %s: one architecture (only compile takes a list)", flag, value);
    for (const char *p = value;; p++) {
        size_t len = strcspn(p, ",");
        char   name[32];
        if (len >= sizeof name) return kt_flag_usage(cmd, "%s %.*s: not a GPU architecture", flag, (int)len, p);
        snprintf(name, sizeof name, "%.*s", (int)len, p);
        kiln_status st = kiln_check_arch(name);
        if (st) {
            kt_flag_usage(cmd, "%s %s: %s", flag, name, kiln_status_msg(st));
            kiln_status_free(st);
            return false;
        }
        p += len;
        if (!*p) return true;
    }
}
