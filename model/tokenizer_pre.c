/* The pre-tokenizers of byte-level BPE: UTF-8 in, words out, by the split patterns llama.cpp
 * names (GPT-2's, Llama 3's, Qwen2's, DeepSeek's, GPT-4o's, Tekken's, ...), written out by hand
 * (no regex engine) over the character classes of model/tokenizer_ucd.h. A pattern is the list
 * of regexes llama.cpp applies one after the other, each to the pieces the one before left;
 * each regex is a function that tries its alternatives in order at a position, as a
 * backtracking regex engine (and llama.cpp) does; docs/tokenizer.md. */
#include "model/tokenizer.h"

#include <stdio.h>
#include <string.h>

#include "model/tokenizer_ucd.h"

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

/* ---- character classes ------------------------------------------------------------------- */

static bool is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }

/* A class of the patterns, asked of a code point and its km_uc_class. */
typedef bool class_fn(uint32_t cp, int c);

static bool c_letter(uint32_t cp, int c) { return (void)cp, c == KM_UC_LETTER; }
static bool c_number(uint32_t cp, int c) { return (void)cp, c == KM_UC_NUMBER; }
static bool c_space(uint32_t cp, int c) { return (void)cp, c == KM_UC_SPACE; }
static bool c_punct(uint32_t cp, int c) { return (void)cp, c == KM_UC_PUNCT; }
/* [^\s\p{L}\p{N}] */
static bool c_rest(uint32_t cp, int c) { return (void)cp, c != KM_UC_LETTER && c != KM_UC_NUMBER && c != KM_UC_SPACE; }
/* [\p{L}\p{M}] and [\p{P}\p{S}] (deepseek-v3) */
static bool c_letter_mark(uint32_t cp, int c) { return (void)cp, c == KM_UC_LETTER || c == KM_UC_MARK; }
static bool c_punct_symbol(uint32_t cp, int c) { return (void)cp, c == KM_UC_PUNCT || c == KM_UC_SYMBOL; }
/* llama.cpp's gpt-4o and tekken patterns stand for [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and
 * [\p{Ll}\p{Lm}\p{Lo}\p{M}] with "a letter but a-z" and "a letter but A-Z" (its classes have no
 * letter cases), so every letter outside ASCII is both. */
static bool c_upper(uint32_t cp, int c) { return c == KM_UC_LETTER && !(cp >= 'a' && cp <= 'z'); }
static bool c_lower(uint32_t cp, int c) { return c == KM_UC_LETTER && !(cp >= 'A' && cp <= 'Z'); }
static bool c_ascii_alpha(uint32_t cp, int c) { return (void)c, (cp | 32) >= 'a' && (cp | 32) <= 'z'; }
static bool c_ascii_digit(uint32_t cp, int c) { return (void)c, cp >= '0' && cp <= '9'; }
/* !"#$%&'()*+,-./:;<=>?@[\]^_`{|}~ */
static bool ascii_punct(uint32_t cp) {
    return (cp > ' ' && cp < '0') || (cp > '9' && cp < 'A') || (cp > 'Z' && cp < 'a') || (cp > 'z' && cp < 0x7F);
}
/* [\p{P}\$\+<=>\^~\|`] (falcon) and the same without ` (default) */
static bool c_falcon(uint32_t cp, int c) {
    return c == KM_UC_PUNCT || (cp < 0x80 && cp && strchr("$+<=>^~|`", (int)cp));
}
static bool c_default(uint32_t cp, int c) {
    return c == KM_UC_PUNCT || (cp < 0x80 && cp && strchr("$+<=>^~|", (int)cp));
}

typedef struct {
    uint32_t lo, hi;
} cp_range;

/* Whether cp is in one of the n sorted ranges r. Classes written as literal ranges are matched
 * by llama.cpp with std::wregex over the text with every white space past ASCII made U+000B:
 * so such white space (U+3000 in deepseek-llm's punctuation, U+2000.. in its CJK) is never in
 * them. */
static bool in_ranges(uint32_t cp, int c, const cp_range *r, size_t n) {
    if (c == KM_UC_SPACE && cp > 0x7F) return false;
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp > r[mid].hi) lo = mid + 1;
        else if (cp < r[mid].lo) hi = mid;
        else return true;
    }
    return false;
}
#define IN_RANGES(cp, c, r) in_ranges(cp, c, r, sizeof r / sizeof r[0])

/* deepseek-llm's letters: the cased letters (Lu Ll Lt) of its tokenizer.json's
 * [A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯ...𞤀-𞥃], code point by code point (escaped there as \uXXXX;
 * lookalikes such as U+1F7D and U+03CE differ). */
static const cp_range ds_letters[] = {
    {0x0041, 0x005A},   {0x0061, 0x007A},   {0x00B5, 0x00B5},   {0x00C0, 0x00D6},   {0x00D8, 0x00F6},
    {0x00F8, 0x01BA},   {0x01BC, 0x01BF},   {0x01C4, 0x0293},   {0x0295, 0x02AF},   {0x0370, 0x0373},
    {0x0376, 0x0377},   {0x037B, 0x037D},   {0x037F, 0x037F},   {0x0386, 0x0386},   {0x0388, 0x038A},
    {0x038C, 0x038C},   {0x038E, 0x03A1},   {0x03A3, 0x03F5},   {0x03F7, 0x0481},   {0x048A, 0x052F},
    {0x0531, 0x0556},   {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},   {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},   {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},
    {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},   {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},
    {0x1F5B, 0x1F5B},   {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},   {0x1FD6, 0x1FDB},
    {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},   {0x2102, 0x2102},   {0x2107, 0x2107},
    {0x210A, 0x2113},   {0x2115, 0x2115},   {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},
    {0x2128, 0x2128},   {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},   {0x2C7E, 0x2CE4},
    {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},   {0xA680, 0xA69B},   {0xA722, 0xA76F},
    {0xA771, 0xA787},   {0xA78B, 0xA78E},   {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},
    {0xFF21, 0xFF3A},   {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};
/* deepseek-llm's [!-/:-~！-／：-～‘-‟　-。] (ASCII letters included), sorted */
static const cp_range ds_punct[] = {
    {0x0021, 0x002F}, {0x003A, 0x007E}, {0x2018, 0x201F}, {0x3000, 0x3002}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E},
};
/* deepseek-llm's and deepseek-coder's [一-龥ࠀ-一가-퟿] */
static const cp_range ds_cjk[] = {{0x0800, 0x9FA5}, {0xAC00, 0xD7FF}};
/* deepseek-v3's [一-龥぀-ゟ゠-ヿ]: Han, hiragana, katakana */
static const cp_range ds3_cjk[] = {{0x3040, 0x309F}, {0x30A0, 0x30FF}, {0x4E00, 0x9FA5}};

static bool c_ds_letter(uint32_t cp, int c) { return IN_RANGES(cp, c, ds_letters); }
static bool c_ds_punct(uint32_t cp, int c) { return IN_RANGES(cp, c, ds_punct); }
static bool c_ds_cjk(uint32_t cp, int c) { return IN_RANGES(cp, c, ds_cjk); }
static bool c_ds3_cjk(uint32_t cp, int c) { return IN_RANGES(cp, c, ds3_cjk); }

/* ---- the regexes -------------------------------------------------------------------------- */

/* Each regex of a pattern is a function: the end of its match at i in a piece of n code points,
 * or i when it does not match there. The piece starts at index 0, so a function may look back
 * within it. */
typedef size_t regex_fn(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n);

/* The end of the run of class in from i. */
static size_t span(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n, class_fn *in) {
    while (i < n && in(cps[i], cls[i])) i++;
    return i;
}

static bool at(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n, class_fn *in) {
    return i < n && in(cps[i], cls[i]);
}

/* '\s?X+' (and ' ?X+' when any_space is false), X a class without white space. */
static size_t opt_space_run(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n, class_fn *in,
                            bool any_space) {
    bool   sp = any_space ? cls[i] == KM_UC_SPACE : cps[i] == ' ';
    size_t j = sp && at(cps, cls, i + 1, n, in) ? i + 1 : i;
    return in(cps[j], cls[j]) ? span(cps, cls, j, n, in) : i;
}

/* X{1,max} */
static size_t run_max(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n, class_fn *in, size_t max) {
    return span(cps, cls, i, i + max < n ? i + max : n, in);
}

/* The length of a contraction 's 't 'm 'd 're 've 'll at i (ASCII letters, any case when
 * fold), or 0. */
static size_t contraction(const uint32_t *cps, size_t i, size_t n, bool fold) {
    if (i >= n || cps[i] != '\'' || i + 1 >= n) return 0;
    uint32_t a = fold && cps[i + 1] < 0x80 ? cps[i + 1] | 32 : cps[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (i + 2 >= n) return 0;
    uint32_t b = fold && cps[i + 2] < 0x80 ? cps[i + 2] | 32 : cps[i + 2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* '\s+(?!\S)|\s+' from i: a run of white space but its last one when \S follows */
static size_t space_run(const uint8_t *cls, size_t i, size_t n) {
    size_t e = i;
    while (e < n && cls[e] == KM_UC_SPACE) e++;
    return e < n && e - i > 1 ? e - 1 : e;
}

/* '\s*[\r\n]+|\s+(?!\S)|\s+' from i: after the last \r or \n of the run of white space, else
 * space_run */
static size_t space_word(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n) {
    size_t e = i;
    while (e < n && cls[e] == KM_UC_SPACE) e++;
    for (size_t x = e; x > i; x--)
        if (is_crlf(cps[x - 1])) return x;
    return space_run(cls, i, n);
}

/* ' ?[^\s\p{L}\p{N}]+[\r\n]*' ([\r\n/]* when slash) */
static size_t rest_word(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n, bool slash) {
    size_t e = opt_space_run(cps, cls, i, n, c_rest, false);
    if (e == i) return i;
    while (e < n && (is_crlf(cps[e]) || (slash && cps[e] == '/'))) e++;
    return e;
}

/* gpt2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ (the last
 * is llama.cpp's: its regex leaves a lone white space before \S unmatched, a piece of its own) */
static size_t gpt2_word(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n) {
    size_t k = contraction(cps, i, n, false);
    if (k) return i + k;
    size_t j = cps[i] == ' ' && i + 1 < n && cls[i + 1] != KM_UC_SPACE ? i + 1 : i; /* a space joins the run after it */
    if (cls[j] == KM_UC_LETTER) return span(cps, cls, j, n, c_letter);
    if (cls[j] == KM_UC_NUMBER) return span(cps, cls, j, n, c_number);
    if (cls[j] != KM_UC_SPACE) return span(cps, cls, j, n, c_rest);
    return space_run(cls, i, n);
}

/* llama-bpe: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ ; qwen2: the same with \p{N} */
static size_t llama3_like(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n, size_t max_digits) {
    size_t k = contraction(cps, i, n, true);
    if (k) return i + k;
    int c = cls[i];
    if (c == KM_UC_LETTER) return span(cps, cls, i, n, c_letter);
    if (c != KM_UC_NUMBER && !is_crlf(cps[i]) && at(cps, cls, i + 1, n, c_letter))
        return span(cps, cls, i + 1, n, c_letter);
    if (c == KM_UC_NUMBER) return run_max(cps, cls, i, n, c_number, max_digits);
    size_t e = rest_word(cps, cls, i, n, false);
    return e > i ? e : space_word(cps, cls, i, n);
}
static size_t llama3_word(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n) {
    return llama3_like(cps, cls, i, n, 3);
}
static size_t qwen2_word(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n) {
    return llama3_like(cps, cls, i, n, 1);
}

/* gpt-4o's and tekken's words of letters, as llama.cpp has them (U: a letter but a-z, W: a
 * letter but A-Z; C: (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]), gpt-4o only):
 *   [^\r\n\p{L}\p{N}]?U*W+C?|[^\r\n\p{L}\p{N}]?U+W*C?
 * The first alternative takes the run of U, then the run of W after it; when no W follows, it
 * backtracks to the run's last letter that is W too (one outside ASCII) and ends after it; a
 * run of A-Z alone is the second alternative's. i when there is no letter at i or after a
 * prefix at i. */
static size_t cased_word(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n, bool contractions) {
    size_t s = i;
    if (cls[i] != KM_UC_LETTER) {
        if (cls[i] == KM_UC_NUMBER || is_crlf(cps[i]) || !at(cps, cls, i + 1, n, c_letter)) return i;
        s = i + 1;
    }
    size_t u = span(cps, cls, s, n, c_upper), e = u;
    if (at(cps, cls, u, n, c_lower)) {
        e = span(cps, cls, u, n, c_lower);
    } else {
        size_t j = u;
        while (j > s && !c_lower(cps[j - 1], cls[j - 1])) j--;
        if (j > s) e = j;
    }
    return contractions ? e + contraction(cps, e, n, true) : e;
}

/* gpt-4o: the cased words with C, \p{N}{1,3}, ' ?[^\s\p{L}\p{N}]+[\r\n/]*', \s*[\r\n]+,
 * \s+(?!\S), \s+; tekken: the cased words without C, \p{N}, and the same. */
static size_t gpt4o_like(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n, bool contractions,
                         size_t max_digits) {
    size_t e = cased_word(cps, cls, i, n, contractions);
    if (e > i) return e;
    if (cls[i] == KM_UC_NUMBER) return run_max(cps, cls, i, n, c_number, max_digits);
    e = rest_word(cps, cls, i, n, true);
    return e > i ? e : space_word(cps, cls, i, n);
}
static size_t gpt4o_word(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n) {
    return gpt4o_like(cps, cls, i, n, true, 3);
}
static size_t tekken_word(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n) {
    return gpt4o_like(cps, cls, i, n, false, 1);
}

/* deepseek-v3's third: [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|
 * [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * (digits, other code points (C*) not before a letter or mark: no match) */
static size_t deepseek3_word(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n) {
    if (ascii_punct(cps[i]) && at(cps, cls, i + 1, n, c_ascii_alpha)) return span(cps, cls, i + 1, n, c_ascii_alpha);
    int c = cls[i];
    if (c == KM_UC_LETTER || c == KM_UC_MARK) return span(cps, cls, i, n, c_letter_mark);
    if (!is_crlf(cps[i]) && c != KM_UC_PUNCT && c != KM_UC_SYMBOL && at(cps, cls, i + 1, n, c_letter_mark))
        return span(cps, cls, i + 1, n, c_letter_mark);
    size_t e = opt_space_run(cps, cls, i, n, c_punct_symbol, false);
    if (e > i) {
        while (e < n && is_crlf(cps[e])) e++;
        return e;
    }
    return space_word(cps, cls, i, n);
}

/* [\r\n] */
static size_t newline(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n) {
    return (void)cls, (void)n, is_crlf(cps[i]) ? i + 1 : i;
}
/* \p{N}, \p{N}{1,3}, \p{N}+, [0-9][0-9][0-9] */
static size_t digit(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n) {
    return run_max(cps, cls, i, n, c_number, 1);
}
static size_t digits3(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n) {
    return run_max(cps, cls, i, n, c_number, 3);
}
static size_t digits(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n) {
    return span(cps, cls, i, n, c_number);
}
static size_t ascii_digits3(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n) {
    return run_max(cps, cls, i, n, c_ascii_digit, 3) == i + 3 ? i + 3 : i;
}
/* \s+$ : the white space that ends the piece. Inside a run of it, the start of the run was
 * tried first: if that failed, the rest fails too (so a long run costs one scan). */
static size_t trailing_space(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n) {
    if (cls[i] != KM_UC_SPACE || (i > 0 && cls[i - 1] == KM_UC_SPACE)) return i;
    return span(cps, cls, i, n, c_space) == n ? n : i;
}
/* deepseek-llm: \s?[letters]+, \s?[punctuation]+, [CJK]+; deepseek-coder: \s?\p{L}+,
 * \s?\p{P}+; deepseek-v3: [Han, kana]+; falcon, default: their punctuation runs */
static size_t ds_letter_word(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n) {
    return opt_space_run(cps, cls, i, n, c_ds_letter, true);
}
static size_t ds_punct_word(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n) {
    return opt_space_run(cps, cls, i, n, c_ds_punct, true);
}
static size_t ds_cjk_word(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n) {
    return span(cps, cls, i, n, c_ds_cjk);
}
static size_t letter_word(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n) {
    return opt_space_run(cps, cls, i, n, c_letter, true);
}
static size_t punct_word(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n) {
    return opt_space_run(cps, cls, i, n, c_punct, true);
}
static size_t ds3_cjk_word(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n) {
    return span(cps, cls, i, n, c_ds3_cjk);
}
static size_t falcon_punct(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n) {
    return span(cps, cls, i, n, c_falcon);
}
static size_t default_punct(const uint32_t *cps, const uint8_t *cls, size_t i, size_t n) {
    return span(cps, cls, i, n, c_default);
}

/* ---- the patterns and their names ----------------------------------------------------------- */

#define MAX_REGEXES 6

/* Each pattern: its first name and llama.cpp's regexes for it, in order (src/llama-vocab.cpp,
 * llm_tokenizer_bpe); docs/tokenizer.md has them as text. */
static const struct {
    const char *name;
    regex_fn   *regex[MAX_REGEXES + 1]; /* NULL-terminated */
} patterns[KM_PRE_COUNT] = {
    [KM_PRE_GPT2] = {"gpt2", {gpt2_word}},
    [KM_PRE_LLAMA3] = {"llama-bpe", {llama3_word}},
    [KM_PRE_QWEN2] = {"qwen2", {qwen2_word}},
    [KM_PRE_DEEPSEEK_LLM] = {"deepseek-llm",
                             {newline, ds_letter_word, ds_punct_word, trailing_space, ds_cjk_word, digits}},
    [KM_PRE_DEEPSEEK_CODER] = {"deepseek-coder", {newline, letter_word, punct_word, ds_cjk_word, digit}},
    [KM_PRE_DEEPSEEK3] = {"deepseek-v3", {digits3, ds3_cjk_word, deepseek3_word}},
    [KM_PRE_GPT4O] = {"gpt-4o", {gpt4o_word}},
    [KM_PRE_TEKKEN] = {"tekken", {tekken_word}},
    [KM_PRE_STARCODER] = {"starcoder", {digit, gpt2_word}},
    [KM_PRE_FALCON] = {"falcon", {falcon_punct, gpt2_word, ascii_digits3}},
    [KM_PRE_DEFAULT] = {"default", {default_punct, gpt2_word, digits, ascii_digits3}},
};

/* tokenizer.ggml.pre names as llama.cpp's llama_vocab::load reads them (those whose only
 * other effect is on clean_spaces, which kiln never applies, included; those that add a sep
 * token or drop bos are not). ignore_merges and add_bos as llama.cpp sets them. */
static const struct {
    const char *name;
    km_pre      pre;
    bool        ignore_merges, add_bos;
} names[] = {
    {"gpt2", KM_PRE_GPT2, false, false}, /* kiln's spelling */
    {"gpt-2", KM_PRE_GPT2, false, false},
    {"phi-2", KM_PRE_GPT2, false, false},
    {"jina-es", KM_PRE_GPT2, false, false},
    {"jina-de", KM_PRE_GPT2, false, false},
    {"gigachat", KM_PRE_GPT2, false, false},
    {"jina-v2-es", KM_PRE_GPT2, false, false},
    {"jina-v2-de", KM_PRE_GPT2, false, false},
    {"a.x-4.0", KM_PRE_GPT2, false, false},
    {"mellum", KM_PRE_GPT2, false, false},
    {"mpt", KM_PRE_GPT2, false, false},
    {"olmo", KM_PRE_GPT2, false, false},
    {"jais", KM_PRE_GPT2, false, false},
    {"trillion", KM_PRE_GPT2, false, false},
    {"granite-docling", KM_PRE_GPT2, false, false},
    {"exaone4", KM_PRE_GPT2, false, false},
    {"llama-bpe", KM_PRE_LLAMA3, true, true},
    {"llama3", KM_PRE_LLAMA3, true, true},
    {"llama-v3", KM_PRE_LLAMA3, true, true},
    {"falcon3", KM_PRE_LLAMA3, true, true},
    {"falcon-h1", KM_PRE_LLAMA3, true, true},
    {"pixtral", KM_PRE_LLAMA3, true, true},
    {"midm-2.0", KM_PRE_LLAMA3, true, true},
    {"lfm2", KM_PRE_LLAMA3, true, true},
    {"dbrx", KM_PRE_LLAMA3, false, false},
    {"smaug-bpe", KM_PRE_LLAMA3, false, false},
    {"qwen2", KM_PRE_QWEN2, false, false},
    {"deepseek-r1-qwen", KM_PRE_QWEN2, false, false},
    {"kormo", KM_PRE_QWEN2, false, false},
    {"megrez", KM_PRE_QWEN2, false, false},
    {"stablelm2", KM_PRE_QWEN2, false, false},
    {"hunyuan", KM_PRE_QWEN2, false, false},
    {"deepseek-llm", KM_PRE_DEEPSEEK_LLM, false, false},
    {"deepseek-coder", KM_PRE_DEEPSEEK_CODER, false, false},
    {"deepseek-v3", KM_PRE_DEEPSEEK3, false, false},
    {"hunyuan-dense", KM_PRE_DEEPSEEK3, false, false},
    {"gpt-4o", KM_PRE_GPT4O, false, false},
    {"llama4", KM_PRE_GPT4O, false, false},
    {"minimax-m2", KM_PRE_GPT4O, false, false},
    {"tekken", KM_PRE_TEKKEN, true, true},
    {"starcoder", KM_PRE_STARCODER, false, false},
    {"refact", KM_PRE_STARCODER, false, false},
    {"command-r", KM_PRE_STARCODER, false, false},
    {"smollm", KM_PRE_STARCODER, false, false},
    {"codeshell", KM_PRE_STARCODER, false, false},
    {"exaone", KM_PRE_STARCODER, false, false},
    {"minerva-7b", KM_PRE_STARCODER, false, false},
    {"falcon", KM_PRE_FALCON, false, false},
    {"default", KM_PRE_DEFAULT, false, false},
};

bool km_pre_parse(const char *name, km_pre_spec *out) {
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i].name) == 0) {
            *out = (km_pre_spec){names[i].pre, names[i].ignore_merges, names[i].add_bos};
            return true;
        }
    return false;
}

void km_pre_list(char *buf, size_t cap) {
    size_t len = 0;
    if (cap) buf[0] = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && len + 1 < cap; i++) {
        int w = snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", names[i].name);
        if (w < 0) break;
        len += (size_t)w;
    }
}

const char *km_pre_name(km_pre pre) { return (unsigned)pre < KM_PRE_COUNT ? patterns[pre].name : "?"; }

/* ---- the split ------------------------------------------------------------------------------ */

/* Cuts the piece [a, b) by regex k of pre and each resulting piece by the regexes after it, as
 * llama.cpp's unicode_regex_split: the matches, leftmost first, and the text between them are
 * the pieces (so unmatched text stays, as one piece per gap). */
static void split(regex_fn *const *regex, const uint32_t *cps, const uint8_t *cls, size_t a, size_t b,
                  uint32_t *ends, size_t *nw) {
    if (!regex[0]) {
        ends[(*nw)++] = (uint32_t)b;
        return;
    }
    size_t gap = a;
    for (size_t i = a; i < b;) {
        size_t e = a + regex[0](cps + a, cls + a, i - a, b - a);
        if (e == i) {
            i++;
            continue;
        }
        if (gap < i) split(regex + 1, cps, cls, gap, i, ends, nw);
        split(regex + 1, cps, cls, i, e, ends, nw);
        gap = i = e;
    }
    if (gap < b) split(regex + 1, cps, cls, gap, b, ends, nw);
}

size_t km_pre_split(km_pre pre, const uint32_t *cps, const uint8_t *cls, size_t n, uint32_t *ends) {
    size_t nw = 0;
    if ((unsigned)pre >= KM_PRE_COUNT) pre = KM_PRE_GPT2;
    if (n) split(patterns[pre].regex, cps, cls, 0, n, ends, &nw);
    return nw;
}
