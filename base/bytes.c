/* Little-endian binary records (serialized programs and bundles): a writer appending to a
 * kb_str and a reader that checks every length against what is left, so that no file content
 * can make it read out of bounds. */
#include "base/base.h"

#include <stdlib.h>
#include <string.h>

void kb_put_u32(kb_str *b, uint32_t v) {
    char p[4];
    for (int i = 0; i < 4; i++) p[i] = (char)(v >> (8 * i));
    kb_str_addn(b, p, 4);
}

void kb_put_u64(kb_str *b, uint64_t v) {
    char p[8];
    for (int i = 0; i < 8; i++) p[i] = (char)(v >> (8 * i));
    kb_str_addn(b, p, 8);
}

void kb_put_blob(kb_str *b, const void *data, size_t n) {
    kb_put_u64(b, (uint64_t)n);
    if (n) kb_str_addn(b, data, n);
}

void kb_put_cstr(kb_str *b, const char *s) { kb_put_blob(b, s ? s : "", s ? strlen(s) : 0); }

/* Records the first failure only: later reads return zeros and keep it. */
static bool take(kb_reader *r, size_t n, const char *what, const uint8_t **out) {
    *out = NULL;
    if (r->err) return false;
    if (n > r->len - r->pos) {
        r->err = what;
        r->err_at = r->pos;
        return false;
    }
    *out = r->p + r->pos;
    r->pos += n;
    return true;
}

/* The values are little-endian: one load where the machine is too (a byte loop was a fifth of
 * reading a stored program, which is millions of these). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define KB_LE32(v) __builtin_bswap32(v)
#define KB_LE64(v) __builtin_bswap64(v)
#else
#define KB_LE32(v) (v)
#define KB_LE64(v) (v)
#endif

uint32_t kb_get_u32(kb_reader *r, const char *what) {
    const uint8_t *p;
    if (!take(r, 4, what, &p)) return 0;
    uint32_t v;
    memcpy(&v, p, 4);
    return KB_LE32(v);
}

uint64_t kb_get_u64(kb_reader *r, const char *what) {
    const uint8_t *p;
    if (!take(r, 8, what, &p)) return 0;
    uint64_t v;
    memcpy(&v, p, 8);
    return KB_LE64(v);
}

const void *kb_get_blob(kb_reader *r, size_t *n, const char *what) {
    uint64_t len = kb_get_u64(r, what);
    const uint8_t *p;
    *n = 0;
    if (r->err || len > SIZE_MAX || !take(r, (size_t)len, what, &p)) return NULL;
    *n = (size_t)len;
    return p;
}

char *kb_get_str(kb_reader *r, const char *what) {
    size_t      n;
    const char *p = kb_get_blob(r, &n, what);
    if (r->err) return NULL;
    if (memchr(p, 0, n)) {
        r->err = what;
        r->err_at = r->pos - n;
        return NULL;
    }
    char *s = malloc(n + 1);
    if (!s) {
        r->err = "out of memory";
        return NULL;
    }
    if (n) memcpy(s, p, n);
    s[n] = 0;
    return s;
}

bool kb_get_str_into(kb_reader *r, char *out, size_t cap, const char *what) {
    size_t      n;
    const char *p = kb_get_blob(r, &n, what);
    if (r->err) return false;
    if (n >= cap || memchr(p, 0, n)) {
        r->err = what;
        r->err_at = r->pos - n;
        return false;
    }
    memcpy(out, p, n);
    out[n] = 0;
    return true;
}
