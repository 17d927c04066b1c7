/* The pre-tokenizer of byte-level BPE: UTF-8 in, words out, by the rules of GPT-2's, Llama 3's
 * and Qwen2's split patterns, written out by hand (no regex engine) over the character classes
 * of model/tokenizer_ucd.h. The patterns' alternatives are tried in order at each position, as
 * a backtracking regex engine (and llama.cpp) does; docs/tokenizer.md. */
#include "model/tokenizer.h"

#include <string.h>

#include "model/tokenizer_ucd.h"

bool km_pre_parse(const char *name, km_pre *out) {
    static const struct {
        const char *name;
        km_pre      pre;
    } names[] = {
        {"gpt2", KM_PRE_GPT2},        {"gpt-2", KM_PRE_GPT2},       {"llama-bpe", KM_PRE_LLAMA3},
        {"llama3", KM_PRE_LLAMA3},    {"llama-v3", KM_PRE_LLAMA3},  {"qwen2", KM_PRE_QWEN2},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i].name) == 0) {
            *out = names[i].pre;
            return true;
        }
    return false;
}

const char *km_pre_name(km_pre pre) {
    switch (pre) {
    case KM_PRE_GPT2: return "gpt2";
    case KM_PRE_LLAMA3: return "llama-bpe";
    case KM_PRE_QWEN2: return "qwen2";
    }
    return "?";
}

const char *km_uc_version(void) { return KM_UC_UNICODE_VERSION; }

int km_uc_class(uint32_t cp) {
    if (cp < 128) return km_uc_ascii[cp];
    if (cp > 0x10FFFF) return KM_UC_OTHER;
    size_t lo = 0, hi = KM_UC_NRANGES; /* the last range starting at or before cp */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (km_uc_start[mid] <= cp) lo = mid;
        else hi = mid;
    }
    return km_uc_cls[lo];
}

/* ---- UTF-8 ------------------------------------------------------------------------------------ */

static bool cont(uint8_t b) { return (b & 0xC0) == 0x80; }

size_t km_utf8_decode(const uint8_t *s, size_t len, uint32_t *cps) {
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint8_t  b = s[i];
        uint32_t cp = 0xFFFD;
        size_t   adv = 1;
        if (b < 0x80) {
            cp = b;
        } else if (b < 0xC0) {
            /* a stray continuation byte */
        } else if (b < 0xE0) {
            if (i + 1 < len && cont(s[i + 1])) {
                cp = (uint32_t)(b & 0x1F) << 6 | (s[i + 1] & 0x3F);
                adv = 2;
            }
        } else if (b < 0xF0) {
            if (i + 2 < len && cont(s[i + 1]) && cont(s[i + 2])) {
                cp = (uint32_t)(b & 0x0F) << 12 | (uint32_t)(s[i + 1] & 0x3F) << 6 | (s[i + 2] & 0x3F);
                adv = 3;
            }
        } else if (b < 0xF8) {
            if (i + 3 < len && cont(s[i + 1]) && cont(s[i + 2]) && cont(s[i + 3])) {
                uint32_t v = (uint32_t)(b & 0x07) << 18 | (uint32_t)(s[i + 1] & 0x3F) << 12 |
                             (uint32_t)(s[i + 2] & 0x3F) << 6 | (s[i + 3] & 0x3F);
                if (v <= 0x10FFFF) { /* llama.cpp fails on larger ones: here one U+FFFD a byte */
                    cp = v;
                    adv = 4;
                }
            }
        }
        cps[n++] = cp;
        i += adv;
    }
    return n;
}

int km_utf8_encode(uint32_t cp, uint8_t out[4]) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | cp >> 6);
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | cp >> 12);
        out[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | cp >> 18);
    out[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---- GPT-2's byte-to-unicode map -------------------------------------------------------------- */

/* Printable: '!'..'~', U+00A1..U+00AC, U+00AE..U+00FF. The 68 others, in byte order: 0x00-0x20
 * (33), 0x7F-0xA0 (34), 0xAD (1), become U+0100... */
uint32_t km_byte_to_cp(uint8_t b) {
    if (b <= 0x20) return 0x100u + b;
    if (b >= 0x7F && b <= 0xA0) return 0x100u + 33 + (b - 0x7Fu);
    if (b == 0xAD) return 0x100u + 67;
    return b;
}

int km_cp_to_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return (int)cp;
    if (cp >= 0x100 && cp < 0x100 + 33) return (int)(cp - 0x100);
    if (cp >= 0x100 + 33 && cp < 0x100 + 67) return (int)(cp - 0x100 - 33 + 0x7F);
    if (cp == 0x100 + 67) return 0xAD;
    return -1;
}

/* ---- the split ------------------------------------------------------------------------------ */

static uint32_t lower_ascii(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* The length of a contraction 's 't 'm 'd 're 've 'll at i (ASCII letters, any case when
 * fold), or 0. */
static size_t contraction(const uint32_t *cps, size_t i, size_t n, bool fold) {
    if (cps[i] != '\'' || i + 1 >= n) return 0;
    uint32_t a = fold ? lower_ascii(cps[i + 1]) : cps[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (i + 2 >= n) return 0;
    uint32_t b = fold ? lower_ascii(cps[i + 2]) : cps[i + 2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* The end of the run of class c from i. */
static size_t run(const uint8_t *cls, size_t i, size_t n, int c) {
    while (i < n && cls[i] == c) i++;
    return i;
}

static bool is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }

/* The end of the word at i (i < n). */
static size_t gpt2_word(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n) {
    size_t k = contraction(cps, i, n, false);
    if (k) return i + k;
    /* ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': a space joins the run after it */
    size_t j = cps[i] == ' ' && i + 1 < n && cls[i + 1] != KM_UC_SPACE ? i + 1 : i;
    if (cls[j] != KM_UC_SPACE) return run(cls, j, n, cls[j]);
    /* '\s+(?!\S)', '\s+' */
    size_t e = run(cls, i, n, KM_UC_SPACE);
    return e < n && e - i > 1 ? e - 1 : e;
}

static size_t llama3_word(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n, size_t max_digits) {
    size_t k = contraction(cps, i, n, true);
    if (k) return i + k;
    int c = cls[i];
    /* '[^\r\n\p{L}\p{N}]?\p{L}+' */
    if (c == KM_UC_LETTER) return run(cls, i, n, KM_UC_LETTER);
    if (c != KM_UC_NUMBER && !is_crlf(cps[i]) && i + 1 < n && cls[i + 1] == KM_UC_LETTER)
        return run(cls, i + 1, n, KM_UC_LETTER);
    /* '\p{N}{1,3}' (qwen2: '\p{N}') */
    if (c == KM_UC_NUMBER) {
        size_t e = run(cls, i, n, KM_UC_NUMBER);
        return e - i > max_digits ? i + max_digits : e;
    }
    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' */
    size_t j = cps[i] == ' ' && i + 1 < n && cls[i + 1] == KM_UC_OTHER ? i + 1 : i;
    if (cls[j] == KM_UC_OTHER) {
        size_t e = run(cls, j, n, KM_UC_OTHER);
        while (e < n && is_crlf(cps[e])) e++;
        return e;
    }
    /* white space from i: '\s*[\r\n]+' ends after its last \r or \n; else '\s+(?!\S)', '\s+' */
    size_t e = run(cls, i, n, KM_UC_SPACE);
    for (size_t x = e; x > i; x--)
        if (is_crlf(cps[x - 1])) return x;
    return e < n && e - i > 1 ? e - 1 : e;
}

size_t km_pre_split(km_pre pre, const uint32_t *cps, const uint8_t *cls, size_t n, uint32_t *ends) {
    size_t nw = 0;
    for (size_t i = 0; i < n;) {
        size_t e = pre == KM_PRE_GPT2     ? gpt2_word(cps, cls, i, n)
                   : pre == KM_PRE_LLAMA3 ? llama3_word(cps, cls, i, n, 3)
                                          : llama3_word(cps, cls, i, n, 1);
        ends[nw++] = (uint32_t)e;
        i = e;
    }
    return nw;
}
