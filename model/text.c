/* Generated text as a client shows it, token by token (kiln.h): the text a token adds to the
 * one before, and how much of the text may be shown while stop strings may still appear. Shared
 * by `kiln run -r` / `kiln chat` (tools/cmd_model.c) and `kiln serve` (serve/engine.c). */
#include "base/base.h"
#include "kiln.h"

#include <stdlib.h>
#include <string.h>

kiln_status kiln_detokenize_next(const kiln_tokenizer *t, int32_t prev, int32_t id, char **out, size_t *len) {
    if (!t || !out || !len) return kb_error(KILN_ERR_INVALID, "kiln_detokenize_next: NULL argument");
    *out = NULL;
    int32_t     pair[2] = {prev, id};
    int64_t     k = prev >= 0 ? 2 : 1;
    char       *both = NULL, *one = NULL;
    size_t      lb = 0, l1 = 0;
    kiln_status st = kiln_detokenize(t, pair + 2 - k, k, &both, &lb);
    if (!st && k == 2) st = kiln_detokenize(t, pair, 1, &one, &l1);
    if (!st && l1 > lb) st = kb_error(KILN_ERR_INVALID, "detokenizing token %d shortened the text", id);
    if (!st && !(*out = malloc(lb - l1 + 1))) st = kb_oom();
    if (!st) {
        memcpy(*out, both + l1, lb - l1);
        (*out)[lb - l1] = 0;
        *len = lb - l1;
    }
    free(both);
    free(one);
    return st;
}

/* Bytes at the end of t[0..n) that begin a UTF-8 character the text does not finish yet. */
static size_t utf8_partial(const char *t, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned char c = (unsigned char)t[n - k];
        if ((c & 0xC0) == 0x80) continue; /* a continuation byte: look further back */
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > k ? k : 0;
    }
    return 0;
}

/* The longest tail of t[0..n) that begins some stop string (it may yet become one: held back). */
static size_t stop_prefix(const char *t, size_t n, const char *const *stops, int n_stops) {
    size_t best = 0;
    for (int i = 0; i < n_stops; i++) {
        size_t ls = strlen(stops[i]);
        for (size_t k = ls - 1 < n ? ls - 1 : n; k > best; k--)
            if (memcmp(t + n - k, stops[i], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

size_t kiln_text_showable(const char *text, size_t n, size_t shown, const char *const *stops, int n_stops, int *stop) {
    size_t upto = n;
    *stop = -1;
    for (int i = 0; i < n_stops; i++) {
        const char *hit = memmem(text + shown, n - shown, stops[i], strlen(stops[i]));
        if (hit && (size_t)(hit - text) < upto) upto = (size_t)(hit - text), *stop = i;
    }
    if (*stop >= 0) return upto;
    size_t held = stop_prefix(text, n, stops, n_stops), part = utf8_partial(text, n);
    return n - (held > part ? held : part);
}
