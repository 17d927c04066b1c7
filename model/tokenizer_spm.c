/* SentencePiece BPE ("llama" in tokenizer.ggml.model: Llama 1/2, Mistral v1-v3, Gemma) as
 * llama.cpp's llm_tokenizer_spm runs it; docs/tokenizer.md.
 *
 * The vocabulary table (text to id), the token types and the special tokens are the ones
 * tokenizer.c builds for byte-level BPE; this file adds the scores and the byte tokens. Text is
 * cut at special tokens as for BPE; each piece of text between them gets a space in front when
 * it starts the text or follows a special token (add_space_prefix), has each ' ' replaced by
 * U+2581, and is cut into UTF-8 characters. Then, again and again, the adjacent pair whose
 * concatenation is the token of highest score (leftmost of equal scores) is merged, through a
 * binary heap of candidate pairs with stale entries skipped: O(n log n). What is left is a token
 * each, or, when its text is none, one byte token <0xXX> per byte (byte fallback). */
#include "model/tokenizer.h"

#include "base/base.h"
#include "model/gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct km_spm {
    float  *score;         /* per token */
    int32_t byte_tok[256]; /* <0xXX>, else the token of the byte alone, else unk */
    int32_t bos;
    bool    add_bos, add_space_prefix;
};

#define SPACE_MARK     "\xE2\x96\x81" /* U+2581, SentencePiece's escaped space */
#define SPACE_MARK_LEN 3

/* Text for error messages: at most 48 bytes of s, with a mark when cut. */
#define SHOW(s, len) (int)((len) > 48 ? 48 : (len)), (s), ((len) > 48 ? "..." : "")

void km_spm_free(km_spm *s) {
    if (!s) return;
    free(s->score);
    free(s);
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* The byte a BYTE token stands for ("<0xHH>"), or -1 when its text is not of that form. */
static int byte_of(const char *s, size_t len) {
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>' || hexval(s[3]) < 0 || hexval(s[4]) < 0) return -1;
    return hexval(s[3]) * 16 + hexval(s[4]);
}

/* Token types and scores as a GGUF may hold them: every type one of GGUF's seven, no NaN score
 * (the merge order compares scores), every BYTE token of the form <0xHH>. */
static kiln_status check_tokens(const kiln_tokenizer *t, const km_vocab *v, int64_t *n_byte) {
    *n_byte = 0;
    for (int64_t i = 0; i < v->n_tokens; i++) {
        size_t      len;
        const char *s = km_token_text(t, (int32_t)i, &len);
        int32_t     ty = v->types ? v->types[i] : KILN_TOKEN_NORMAL;
        if (ty < 0 || ty > KILN_TOKEN_BYTE)
            return kb_error(KILN_ERR_FORMAT,
                            "token %lld ('%.*s%s') has type %d (tokenizer.ggml.token_type), not one of 0 (undefined) .. "
                            "6 (byte)", (long long)i, SHOW(s, len), ty);
        if (v->scores && isnan(v->scores[i]))
            return kb_error(KILN_ERR_FORMAT, "token %lld ('%.*s%s') has a NaN score (tokenizer.ggml.scores)",
                            (long long)i, SHOW(s, len));
        if (ty != KILN_TOKEN_BYTE) continue;
        if (byte_of(s, len) < 0)
            return kb_error(KILN_ERR_FORMAT, "token %lld ('%.*s%s') is of type byte but not of the form <0xHH>",
                            (long long)i, SHOW(s, len));
        ++*n_byte;
    }
    return NULL;
}

/* Each byte's token as llama.cpp's byte_to_token finds it: <0xHH> (upper-case hex), else the
 * byte alone as a token. A vocabulary with byte tokens (byte fallback) must have all 256; one
 * without them maps a byte it lacks to the unknown token (llama.cpp throws there). */
static kiln_status find_byte_tokens(const kiln_tokenizer *t, const km_vocab *v, int64_t n_byte, km_spm *s) {
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        char    c = (char)b;
        int32_t id = km_token_find(t, name, 6);
        if (id < 0) id = km_token_find(t, &c, 1);
        if (id < 0 && n_byte)
            return kb_error(KILN_ERR_FORMAT, "the vocabulary has byte tokens (byte fallback) but none for byte 0x%02X "
                                             "('%s')", b, name);
        if (id < 0 && v->unk < 0)
            return kb_error(KILN_ERR_FORMAT, "the vocabulary has no token for byte 0x%02X ('%s') and no unknown token "
                                             "(tokenizer.ggml.unknown_token_id): text with it could not be tokenized",
                            b, name);
        s->byte_tok[b] = id >= 0 ? id : v->unk;
    }
    return NULL;
}

kiln_status km_spm_build(const kiln_tokenizer *t, const km_vocab *v, km_spm **out) {
    *out = NULL;
    if (v->unk < -1 || v->unk >= v->n_tokens)
        return kb_error(KILN_ERR_INVALID, "unk %d is not a token id (the vocabulary has %lld)", v->unk,
                        (long long)v->n_tokens);
    int64_t     n_byte;
    kiln_status st = check_tokens(t, v, &n_byte);
    if (st) return st;
    km_spm *s = calloc(1, sizeof *s);
    if (!s || !(s->score = calloc((size_t)v->n_tokens, sizeof *s->score))) {
        km_spm_free(s);
        return kb_oom();
    }
    if (v->scores) memcpy(s->score, v->scores, (size_t)v->n_tokens * sizeof *s->score);
    s->bos = v->bos;
    s->add_bos = v->add_bos;
    s->add_space_prefix = v->add_space_prefix;
    if ((st = find_byte_tokens(t, v, n_byte, s))) {
        km_spm_free(s);
        return st;
    }
    *out = s;
    return NULL;
}

/* ---- tokenizing ------------------------------------------------------------------------------- */

typedef struct {
    uint32_t start, len; /* bytes of the escaped text; len 0: merged into its left neighbour */
    int32_t  prev, next;
} sym;

typedef struct {
    float    score; /* of the token left + right make */
    int32_t  left, right;
    uint32_t size; /* left's and right's lengths when queued: another sum means stale */
} bigram;

/* Growable arrays of one tokenize call. */
typedef struct {
    km_session k; /* ids, the merge queue (of bigram), oom */
    char    *buf; /* the escaped text of one piece */
    size_t   cap_buf;
    sym     *syms;
    size_t   cap_syms;
} session;

static void push_id(session *s, int32_t id) { km_push_id(&s->k, id); }

/* llama.cpp's queue order: the higher score first, then the leftmost. */
static bool before(const void *x, const void *y) {
    const bigram *a = x, *b = y;
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

_Static_assert(sizeof(bigram) <= KM_HEAP_MAX_ES, "km_heap holds a bigram");

/* Queues the pair when its text is a token (of any type, as llama.cpp). */
static void try_pair(const kiln_tokenizer *t, const km_spm *m, session *s, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    uint32_t size = s->syms[l].len + s->syms[r].len;
    int32_t  id = km_token_find(t, s->buf + s->syms[l].start, size);
    if (id >= 0 && !km_heap_push(&s->k.heap, &(bigram){m->score[id], l, r, size})) s->k.oom = true;
}

/* The bytes UTF-8 says a character starting with b has (llama.cpp's unicode_len_utf8: by the top
 * four bits only; a stray continuation byte is one). */
static uint32_t char_len(uint8_t b) { return b < 0xC0 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

/* Escapes text (len bytes, no special tokens in it) into s->buf; returns its length. */
static size_t escape(session *s, const uint8_t *text, size_t len, bool prefix) {
    size_t m = prefix ? SPACE_MARK_LEN : 0;
    for (size_t i = 0; i < len; i++) m += text[i] == ' ' ? SPACE_MARK_LEN : 1;
    if (m >= INT32_MAX || !km_grow_to((void **)&s->buf, &s->cap_buf, m, 1)) { /* symbol indices are int32 */
        s->k.oom = true;
        return 0;
    }
    size_t k = 0;
    if (prefix) memcpy(s->buf, SPACE_MARK, SPACE_MARK_LEN), k = SPACE_MARK_LEN;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') memcpy(s->buf + k, SPACE_MARK, SPACE_MARK_LEN), k += SPACE_MARK_LEN;
        else s->buf[k++] = (char)text[i];
    }
    return k;
}

/* One piece of text: characters, merges by score, then a token per symbol or its bytes. */
static void spm_piece(const kiln_tokenizer *t, const km_spm *m, session *s, const uint8_t *text, size_t len,
                      bool prefix) {
    size_t blen = escape(s, text, len, prefix);
    if (!blen || !km_grow_to((void **)&s->syms, &s->cap_syms, blen, sizeof *s->syms)) {
        if (blen) s->k.oom = true;
        return;
    }
    int32_t ns = 0;
    for (size_t off = 0; off < blen; ns++) {
        uint32_t cl = char_len((uint8_t)s->buf[off]);
        if (cl > blen - off) cl = (uint32_t)(blen - off); /* a character cut by the end */
        s->syms[ns] = (sym){(uint32_t)off, cl, ns - 1, off + cl < blen ? ns + 1 : -1};
        off += cl;
    }
    s->k.heap.n = 0;
    for (int32_t i = 1; i < ns; i++) try_pair(t, m, s, i - 1, i);
    while (s->k.heap.n && !s->k.oom) {
        bigram b;
        km_heap_pop(&s->k.heap, &b);
        sym   *l = &s->syms[b.left], *r = &s->syms[b.right];
        if (!l->len || !r->len || l->len + r->len != b.size) continue; /* stale */
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) s->syms[r->next].prev = b.left;
        try_pair(t, m, s, l->prev, b.left);
        try_pair(t, m, s, b.left, l->next);
    }
    /* Merged symbols are tokens; a character that is none falls back to its bytes. (llama.cpp's
     * resegment also looks the text up among the merges made, which only ever hold tokens.) */
    for (int32_t i = 0; i >= 0 && !s->k.oom; i = s->syms[i].next) {
        const sym *x = &s->syms[i];
        int32_t    id = km_token_find(t, s->buf + x->start, x->len);
        if (id >= 0) {
            push_id(s, id);
            continue;
        }
        for (uint32_t j = 0; j < x->len; j++) push_id(s, m->byte_tok[(uint8_t)s->buf[x->start + j]]);
    }
}

kiln_status km_spm_tokenize(const kiln_tokenizer *t, const km_spm *m, const char *text, size_t len, int32_t **ids,
                            int64_t *n) {
    const uint8_t *u = (const uint8_t *)text;
    session        s = {.k = {.heap = {.es = sizeof(bigram), .before = before}}};
    if (m->add_bos) push_id(&s, m->bos);
    size_t   nsp = 0;
    bool     oom = false, prev_special = true; /* as llama.cpp: the text's start counts as special */
    km_span *sp = km_find_specials(t, u, len, &nsp, &oom);
    size_t   at = 0;
    for (size_t k = 0; k <= nsp && !oom && !s.k.oom; k++) {
        size_t end = k < nsp ? sp[k].pos : len;
        if (end > at) {
            spm_piece(t, m, &s, u + at, end - at, m->add_space_prefix && prev_special);
            prev_special = false;
        }
        if (k < nsp) {
            push_id(&s, sp[k].id);
            prev_special = true;
            at = end + sp[k].len;
        }
    }
    free(sp);
    free(s.buf);
    free(s.syms);
    return km_session_end(&s.k, oom, ids, n);
}

/* ---- detokenizing ----------------------------------------------------------------------------- */

/* A normal token's text with each U+2581 a space. */
static void add_unescaped(kb_str *b, const char *s, size_t len) {
    size_t from = 0;
    for (size_t i = 0; i + SPACE_MARK_LEN <= len; i++) {
        if (memcmp(s + i, SPACE_MARK, SPACE_MARK_LEN) != 0) continue;
        kb_str_addn(b, s + from, i - from);
        kb_str_addn(b, " ", 1);
        i += SPACE_MARK_LEN - 1;
        from = i + 1;
    }
    kb_str_addn(b, s + from, len - from);
}

/* The text of token id, as llama.cpp's token_to_piece with special = false, into piece. */
static void piece_of(const kiln_tokenizer *t, int32_t id, kb_str *piece) {
    size_t      l;
    const char *s = km_token_text(t, id, &l);
    switch (km_token_type(t, id)) {
    case KILN_TOKEN_NORMAL: add_unescaped(piece, s, l); break;
    case KILN_TOKEN_USER_DEFINED: kb_str_addn(piece, s, l); break; /* as it is: no U+2581 to space */
    case KILN_TOKEN_BYTE: {
        char c = (char)byte_of(s, l); /* the form was checked when built */
        kb_str_addn(piece, &c, 1);
        break;
    }
    default: break; /* control, unknown, unused, undefined: nothing */
    }
}

kiln_status km_spm_detokenize(const kiln_tokenizer *t, const km_spm *m, const int32_t *ids, int64_t n, char **text,
                              size_t *len) {
    kb_str  b = {0}, piece = {0};
    int64_t n_tok = kiln_tokenizer_n_vocab(t);
    /* the space tokenize put before the text: in the first token, or the one after a leading bos */
    int64_t first = n > 0 && m->bos >= 0 && ids[0] == m->bos ? 1 : 0;
    kb_str_add(&b, "");
    for (int64_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= n_tok) {
            kb_str_free(&b);
            kb_str_free(&piece);
            return kb_error(KILN_ERR_INVALID, "token id %d at position %lld is not in the vocabulary of %lld tokens", id,
                            (long long)i, (long long)n_tok);
        }
        piece.len = 0;
        piece_of(t, id, &piece);
        size_t skip = m->add_space_prefix && i == first && piece.len && piece.s[0] == ' ';
        if (piece.len > skip) kb_str_addn(&b, piece.s + skip, piece.len - skip);
    }
    bool   oom = piece.oom;
    size_t l = b.len;
    kb_str_free(&piece);
    char *out = kb_str_take(&b);
    if (!out || oom) {
        free(out);
        return kb_oom();
    }
    *text = out;
    if (len) *len = l;
    return NULL;
}

/* ---- from a GGUF ------------------------------------------------------------------------------ */

/* An optional array of n_tokens numbers of type want (the file's bytes, little-endian, copied
 * out: they may be unaligned); absent: *out NULL. */
static kiln_status gguf_numbers(const kiln_gguf *g, const char *key, kiln_gguf_type want, uint64_t n_tokens,
                                void **out) {
    *out = NULL;
    kiln_gguf_type elem;
    uint64_t       n;
    const void    *data;
    kiln_status    st = kiln_gguf_get_arr(g, key, &elem, &n, &data);
    if (st) {
        if (kiln_status_code(st) != KILN_ERR_NOT_FOUND) return st;
        kiln_status_free(st);
        return NULL;
    }
    if (elem != want || n != n_tokens)
        return kb_error(KILN_ERR_FORMAT, "%s: %s is %llu values of %s, not %llu of %s (one per token)", km_gguf_label(g),
                        key, (unsigned long long)n, kiln_gguf_type_name(elem), (unsigned long long)n_tokens,
                        kiln_gguf_type_name(want));
    if (!(*out = malloc(n * 4 + 1))) return kb_oom();
    memcpy(*out, data, n * 4);
    return NULL;
}

static kiln_status gguf_bool(const kiln_gguf *g, const char *key, bool *v) {
    kiln_status st = kiln_gguf_get_bool(g, key, v);
    if (st && kiln_status_code(st) == KILN_ERR_NOT_FOUND) {
        kiln_status_free(st);
        return NULL; /* *v keeps its default */
    }
    return st;
}

/* A special token id: the key's, else llama.cpp's default for "llama" when the vocabulary has it. */
static kiln_status gguf_special(const kiln_gguf *g, const char *key, uint64_t n_tokens, int32_t def, int32_t *out) {
    kiln_status st = km_gguf_token_id(g, key, n_tokens, out);
    if (!st && *out < 0 && (uint64_t)def < n_tokens) *out = def;
    return st;
}

kiln_status km_spm_from_gguf(const kiln_gguf *g, kiln_tokenizer **out) {
    const char *file = km_gguf_label(g);
    km_strv    *tokens = NULL;
    float      *scores = NULL;
    int32_t    *types = NULL;
    uint64_t    n_tokens = 0;
    km_vocab    v = {.spm = true, .add_bos = true, .add_space_prefix = true}; /* llama.cpp's defaults */
    kiln_status st = km_gguf_strings(g, "tokenizer.ggml.tokens", true, &tokens, &n_tokens);
    if (!st && !n_tokens) st = kb_error(KILN_ERR_FORMAT, "%s: tokenizer.ggml.tokens is empty", file);
    if (!st) st = gguf_numbers(g, "tokenizer.ggml.scores", KILN_GGUF_F32, n_tokens, (void **)&scores);
    if (!st) st = gguf_numbers(g, "tokenizer.ggml.token_type", KILN_GGUF_I32, n_tokens, (void **)&types);
    if (!st) st = gguf_special(g, "tokenizer.ggml.bos_token_id", n_tokens, 1, &v.bos);
    if (!st) st = gguf_special(g, "tokenizer.ggml.eos_token_id", n_tokens, 2, &v.eos);
    if (!st) st = gguf_special(g, "tokenizer.ggml.unknown_token_id", n_tokens, 0, &v.unk);
    if (!st) st = gguf_bool(g, "tokenizer.ggml.add_bos_token", &v.add_bos);
    if (!st) st = gguf_bool(g, "tokenizer.ggml.add_space_prefix", &v.add_space_prefix);
    if (!st && v.add_bos && v.bos < 0)
        st = kb_error(KILN_ERR_FORMAT, "%s: tokenizer.ggml.add_bos_token is true but there is no bos token", file);
    if (!st) {
        v.n_tokens = (int64_t)n_tokens;
        v.tokens = tokens;
        v.types = types;
        v.scores = scores;
        if ((st = km_tokenizer_build(&v, out))) st = kb_wrap(st, "%s: tokenizer", file);
    }
    free(tokens);
    free(scores);
    free(types);
    return st;
}
