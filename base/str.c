#include "base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool grow(kb_str *b, size_t extra) {
    if (b->oom) return false;
    if (b->len + extra + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    char *s = realloc(b->s, cap);
    if (!s) {
        b->oom = true;
        return false;
    }
    b->s = s;
    b->cap = cap;
    return true;
}

void kb_str_addn(kb_str *b, const char *s, size_t n) {
    if (!grow(b, n)) return;
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}

void kb_str_add(kb_str *b, const char *s) { kb_str_addn(b, s, strlen(s)); }

/* One formatting pass when the text fits the room left (the usual case: printing a model's
 * graph took two vsnprintf calls an item), a second after growing when it does not. */
void kb_str_addf(kb_str *b, const char *fmt, ...) {
    if (b->oom) return;
    size_t  room = b->cap - b->len; /* (with the NUL's byte; 0 before the first growth) */
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(room ? b->s + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0) {
        if (room) b->s[b->len] = 0; /* (an encoding error: nothing added) */
        return;
    }
    if ((size_t)n < room) {
        b->len += (size_t)n;
        return;
    }
    if (!grow(b, (size_t)n)) {
        if (room) b->s[b->len] = 0; /* (the partial text undone) */
        return;
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

char *kb_fmt_i64(int64_t v, char buf[24]) {
    char     tmp[24];
    int      n = 0;
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v; /* (INT64_MIN too) */
    do tmp[n++] = (char)('0' + u % 10); while (u /= 10);
    int k = 0;
    if (v < 0) buf[k++] = '-';
    while (n) buf[k++] = tmp[--n];
    buf[k] = 0;
    return buf;
}

void kb_str_add_i64(kb_str *b, int64_t v) {
    char buf[24];
    kb_str_add(b, kb_fmt_i64(v, buf));
}

char *kb_str_take(kb_str *b) {
    char *s = b->oom ? NULL : b->s;
    if (!s && !b->oom) s = calloc(1, 1);
    if (b->oom) free(b->s);
    b->s = NULL;
    b->len = b->cap = 0;
    b->oom = false;
    return s;
}

void kb_str_free(kb_str *b) {
    free(b->s);
    b->s = NULL;
    b->len = b->cap = 0;
    b->oom = false;
}

bool kb_text_field(const char *text, const char *key, char *out, size_t cap) {
    size_t kl = strlen(key);
    out[0] = 0;
    for (const char *l = text; l && *l && strncmp(l, "--- ", 4) != 0;) {
        const char *e = strchr(l, '\n');
        if (!strncmp(l, key, kl) && l[kl] == ' ') {
            const char *v = l + kl + 1;
            size_t      n = e ? (size_t)(e - v) : strlen(v);
            if (n >= cap) n = cap - 1;
            memcpy(out, v, n);
            out[n] = 0;
            return true;
        }
        l = e ? e + 1 : NULL;
    }
    return false;
}
