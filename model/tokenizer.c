/* Byte-level BPE (GPT-2, Llama 3, Qwen2) as llama.cpp's llm_tokenizer_bpe runs it; the
 * pre-tokenizer is in tokenizer_pre.c, SentencePiece (which shares the vocabulary table and the
 * special tokens built here) in tokenizer_spm.c. docs/tokenizer.md.
 *
 * Tokens are found by text in an open-addressed hash table; merges by the pair of token ids
 * (rank and resulting id) in another. Text is first cut at special tokens (control, user-defined
 * and unknown types: the longest first, each at every place it is found in what is left, as
 * llama.cpp's tokenizer_st_partition), then each piece is cut into words, and each word's bytes
 * are merged: always the pair of lowest rank, leftmost first. */
#include "model/tokenizer.h"

#include "base/base.h"
#include "model/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

typedef struct {
    uint32_t hash;     /* high half of the text's hash */
    int32_t  id;       /* -1: empty */
    uint32_t off, len; /* the text, here to spare a lookup */
} tok_slot;

typedef struct {
    uint64_t key; /* left id << 32 | right id; KEY_EMPTY: empty */
    int32_t  rank;
    int32_t  res; /* the merged token, -1 when its text is not in the vocabulary */
} merge_slot;
#define KEY_EMPTY UINT64_MAX

struct kiln_tokenizer {
    int64_t     n;
    char       *text; /* token i: text + off[i], off[i + 1] - off[i] - 1 bytes, NUL-terminated */
    uint32_t   *off;
    uint8_t    *type;
    tok_slot   *tok;
    uint64_t    tok_mask;
    merge_slot *mrg;
    uint64_t    mrg_mask;
    int32_t     byte_tok[256];
    km_pre      pre;
    bool        ignore_merges, add_bos;
    int32_t     bos, eos;
    /* special tokens: for each first byte, the distinct lengths of those that start with it */
    int64_t     n_special;
    uint32_t   *lens[256];
    uint32_t    n_lens[256], cap_lens[256];
    km_spm     *spm; /* SentencePiece: tokenize and detokenize are tokenizer_spm.c's */
};

/* ---- tables ----------------------------------------------------------------------------------- */

static uint64_t pow2_at_least(uint64_t n) {
    uint64_t p = 16;
    while (p < n) p *= 2;
    return p;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static size_t tok_len(const kiln_tokenizer *t, int32_t id) { return t->off[id + 1] - t->off[id] - 1; }

/* The id of the token with this text, or -1; with insert_id >= 0, adds it when absent. */
static int32_t tok_find(const kiln_tokenizer *t, const char *s, size_t len, int32_t insert_id) {
    uint64_t h = XXH3_64bits(s, len);
    uint32_t hi = (uint32_t)(h >> 32);
    for (uint64_t i = h & t->tok_mask;; i = (i + 1) & t->tok_mask) {
        tok_slot *sl = &t->tok[i];
        if (sl->id < 0) {
            if (insert_id >= 0) *sl = (tok_slot){hi, insert_id, t->off[insert_id], (uint32_t)len};
            return -1;
        }
        if (sl->hash == hi && sl->len == len && memcmp(t->text + sl->off, s, len) == 0) return sl->id;
    }
}

static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

static const merge_slot *merge_find(const kiln_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = pair_key(a, b);
    for (uint64_t i = mix64(key) & t->mrg_mask;; i = (i + 1) & t->mrg_mask) {
        const merge_slot *sl = &t->mrg[i];
        if (sl->key == key) return sl;
        if (sl->key == KEY_EMPTY) return NULL;
    }
}

/* Adds the merge unless the pair has one already (llama.cpp keeps the first rank). */
static void merge_add(kiln_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t res) {
    uint64_t key = pair_key(a, b);
    for (uint64_t i = mix64(key) & t->mrg_mask;; i = (i + 1) & t->mrg_mask) {
        merge_slot *sl = &t->mrg[i];
        if (sl->key == key) return;
        if (sl->key == KEY_EMPTY) {
            *sl = (merge_slot){key, rank, res};
            return;
        }
    }
}

static bool grow_array(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

bool km_grow_to(void **p, size_t *cap, size_t need, size_t elem) { return grow_array(p, cap, need, elem); }

static void *heap_at(const km_heap *h, size_t i) { return (char *)h->a + i * h->es; }

bool km_heap_push(km_heap *h, const void *x) {
    if (!grow_array(&h->a, &h->cap, h->n + 1, h->es)) return false;
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!h->before(x, heap_at(h, p))) break;
        memcpy(heap_at(h, i), heap_at(h, p), h->es);
        i = p;
    }
    memcpy(heap_at(h, i), x, h->es);
    return true;
}

void km_push_id(km_session *s, int32_t id) {
    if (!grow_array((void **)&s->ids, &s->cap_ids, s->n_ids + 1, sizeof *s->ids)) s->oom = true;
    else s->ids[s->n_ids++] = id;
}

kiln_status km_session_end(km_session *s, bool oom, int32_t **ids, int64_t *n) {
    free(s->heap.a);
    if (oom || s->oom || !grow_array((void **)&s->ids, &s->cap_ids, 1, sizeof *s->ids)) {
        free(s->ids);
        return kb_oom();
    }
    *ids = s->ids;
    *n = (int64_t)s->n_ids;
    return NULL;
}

void km_heap_pop(km_heap *h, void *out) {
    unsigned char last[KM_HEAP_MAX_ES];
    memcpy(out, heap_at(h, 0), h->es);
    memcpy(last, heap_at(h, --h->n), h->es);
    size_t i = 0, n = h->n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h->before(heap_at(h, c + 1), heap_at(h, c))) c++;
        if (!h->before(heap_at(h, c), last)) break;
        memcpy(heap_at(h, i), heap_at(h, c), h->es);
        i = c;
    }
    if (n) memcpy(heap_at(h, i), last, h->es);
}

int32_t km_token_find(const kiln_tokenizer *t, const char *s, size_t len) { return tok_find(t, s, len, -1); }

/* ---- building --------------------------------------------------------------------------------- */

void kiln_tokenizer_free(kiln_tokenizer *t) {
    if (!t) return;
    free(t->text);
    free(t->off);
    free(t->type);
    free(t->tok);
    free(t->mrg);
    for (int b = 0; b < 256; b++) free(t->lens[b]);
    km_spm_free(t->spm);
    free(t);
}

static bool is_special_type(int type) {
    return type == KILN_TOKEN_CONTROL || type == KILN_TOKEN_USER_DEFINED || type == KILN_TOKEN_UNKNOWN;
}

/* Text for error messages: at most 48 bytes of s, with a mark when cut. */
#define SHOW(s, len) (int)((len) > 48 ? 48 : (len)), (s), ((len) > 48 ? "..." : "")

static kiln_status build_tokens(kiln_tokenizer *t, const km_vocab *v) {
    int64_t n = v->n_tokens;
    size_t  total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!v->tokens[i].s && v->tokens[i].len) return kb_error(KILN_ERR_INVALID, "token %lld is NULL", (long long)i);
        total += (v->tokens[i].len ? v->tokens[i].len : 24) + 1;
    }
    if (total >= UINT32_MAX) return kb_error(KILN_ERR_INVALID, "the tokens' texts take %zu bytes, more than 4 GB", total);
    t->text = malloc(total);
    t->off = malloc(((size_t)n + 1) * sizeof *t->off);
    t->type = malloc((size_t)n);
    t->tok_mask = pow2_at_least((uint64_t)n * 2) - 1;
    t->tok = malloc((t->tok_mask + 1) * sizeof *t->tok);
    if (!t->text || !t->off || !t->type || !t->tok) return kb_oom();
    memset(t->tok, 0xFF, (t->tok_mask + 1) * sizeof *t->tok); /* id -1 */
    size_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        t->off[i] = (uint32_t)at;
        if (v->tokens[i].len) { /* llama.cpp names an empty token [EMPTY_i] */
            memcpy(t->text + at, v->tokens[i].s, v->tokens[i].len);
            at += v->tokens[i].len;
        } else {
            at += (size_t)snprintf(t->text + at, 24, "[EMPTY_%lld]", (long long)i);
        }
        t->text[at++] = 0;
        int32_t ty = v->types ? v->types[i] : KILN_TOKEN_NORMAL;
        t->type[i] = ty >= 0 && ty <= KILN_TOKEN_BYTE ? (uint8_t)ty : 0; /* 0: undefined */
    }
    t->off[n] = (uint32_t)at;
    for (int64_t i = 0; i < n; i++) {
        int32_t prev = tok_find(t, t->text + t->off[i], tok_len(t, (int32_t)i), (int32_t)i);
        if (prev >= 0)
            return kb_error(KILN_ERR_FORMAT, "duplicate token '%.*s%s' in the vocabulary: ids %d and %lld",
                            SHOW(t->text + t->off[i], tok_len(t, (int32_t)i)), prev, (long long)i);
    }
    for (int b = 0; b < 256 && !v->spm; b++) { /* SentencePiece's byte tokens: tokenizer_spm.c */
        uint8_t u[4];
        int     ul = km_utf8_encode(km_byte_to_cp((uint8_t)b), u);
        t->byte_tok[b] = tok_find(t, (const char *)u, (size_t)ul, -1);
        if (t->byte_tok[b] < 0)
            return kb_error(KILN_ERR_FORMAT,
                            "the vocabulary has no token for byte 0x%02X ('%.*s'): it is not a byte-level BPE vocabulary", b,
                            ul, (const char *)u);
    }
    return NULL;
}

static kiln_status build_merges(kiln_tokenizer *t, const km_vocab *v) {
    t->mrg_mask = pow2_at_least((uint64_t)v->n_merges * 3 / 2) - 1;
    t->mrg = malloc((t->mrg_mask + 1) * sizeof *t->mrg);
    if (!t->mrg) return kb_oom();
    for (uint64_t i = 0; i <= t->mrg_mask; i++) t->mrg[i].key = KEY_EMPTY;
    char  *cat = NULL;
    size_t cap = 0;
    for (int64_t i = 0; i < v->n_merges; i++) {
        const char *s = v->merges[i].s;
        size_t      len = v->merges[i].len;
        const char *sp = len > 1 && s ? memchr(s + 1, ' ', len - 1) : NULL;
        if (!sp) {
            free(cat);
            return kb_error(KILN_ERR_FORMAT, "merge %lld ('%.*s%s') is not two tokens with a space between", (long long)i,
                            SHOW(s ? s : "", s ? len : 0));
        }
        size_t  la = (size_t)(sp - s), lb = len - la - 1;
        int32_t a = tok_find(t, s, la, -1), b = tok_find(t, sp + 1, lb, -1);
        if (a < 0 || b < 0) {
            free(cat);
            const char *bad = a < 0 ? s : sp + 1;
            size_t      lbad = a < 0 ? la : lb;
            return kb_error(KILN_ERR_FORMAT, "merge %lld ('%.*s%s') names '%.*s%s', which is not in the vocabulary",
                            (long long)i, SHOW(s, len), SHOW(bad, lbad));
        }
        if (la + lb > cap) {
            cap = (la + lb) * 2;
            char *p = realloc(cat, cap);
            if (!p) {
                free(cat);
                return kb_oom();
            }
            cat = p;
        }
        memcpy(cat, s, la);
        memcpy(cat + la, sp + 1, lb);
        merge_add(t, a, b, (int32_t)i, tok_find(t, cat, la + lb, -1));
    }
    free(cat);
    return NULL;
}

static kiln_status build_specials(kiln_tokenizer *t) {
    for (int64_t i = 0; i < t->n; i++) {
        if (!is_special_type(t->type[i])) continue;
        t->n_special++;
        uint8_t  b = (uint8_t)t->text[t->off[i]];
        uint32_t len = (uint32_t)tok_len(t, (int32_t)i), k = 0;
        while (k < t->n_lens[b] && t->lens[b][k] != len) k++;
        if (k < t->n_lens[b]) continue;
        size_t cap = t->cap_lens[b];
        if (!grow_array((void **)&t->lens[b], &cap, t->n_lens[b] + 1, sizeof *t->lens[b])) return kb_oom();
        t->cap_lens[b] = (uint32_t)cap;
        t->lens[b][t->n_lens[b]++] = len;
    }
    return NULL;
}

kiln_status km_tokenizer_build(const km_vocab *v, kiln_tokenizer **out) {
    if (!out) return kb_error(KILN_ERR_INVALID, "kiln_tokenizer_new: out is NULL");
    *out = NULL;
    if (!v) return kb_error(KILN_ERR_INVALID, "kiln_tokenizer_new: spec is NULL");
    if (v->spm && (v->n_tokens < 1 || v->n_tokens >= INT32_MAX || !v->tokens))
        return kb_error(KILN_ERR_INVALID, "a SentencePiece vocabulary needs 1 to 2^31-1 tokens (it has %lld)",
                        (long long)v->n_tokens);
    if (!v->spm && (v->n_tokens < 256 || v->n_tokens >= INT32_MAX || !v->tokens))
        return kb_error(KILN_ERR_INVALID, "a byte-level BPE vocabulary needs 256 to 2^31-1 tokens (it has %lld)",
                        (long long)v->n_tokens);
    if (v->n_merges < 0 || v->n_merges >= INT32_MAX || (v->n_merges && !v->merges))
        return kb_error(KILN_ERR_INVALID, "bad merge count %lld", (long long)v->n_merges);
    km_pre_spec pre = {KM_PRE_GPT2, false, false};
    char        known[1024];
    if (v->pre && !v->spm && !km_pre_parse(v->pre, &pre)) {
        km_pre_list(known, sizeof known);
        return kb_error(KILN_ERR_INVALID, "pre-tokenizer '%s' is not supported (kiln has %s)", v->pre, known);
    }
    if (v->bos < -1 || v->bos >= v->n_tokens || v->eos < -1 || v->eos >= v->n_tokens)
        return kb_error(KILN_ERR_INVALID, "bos %d or eos %d is not a token id (the vocabulary has %lld)", v->bos, v->eos,
                        (long long)v->n_tokens);
    if (v->add_bos && v->bos < 0) return kb_error(KILN_ERR_INVALID, "add_bos is set but there is no bos token");
    kiln_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return kb_oom();
    t->n = v->n_tokens;
    t->pre = pre.pre;
    t->ignore_merges = pre.ignore_merges; /* as llama.cpp: a word that is a token stays whole */
    t->add_bos = v->add_bos;
    t->bos = v->bos;
    t->eos = v->eos;
    kiln_status st = build_tokens(t, v);
    if (!st && !v->spm) st = build_merges(t, v);
    if (!st) st = build_specials(t);
    if (!st && v->spm) st = km_spm_build(t, v, &t->spm);
    if (st) {
        kiln_tokenizer_free(t);
        return st;
    }
    *out = t;
    return NULL;
}

kiln_status kiln_tokenizer_new(const kiln_tokenizer_spec *spec, kiln_tokenizer **out) {
    if (!out) return kb_error(KILN_ERR_INVALID, "kiln_tokenizer_new: out is NULL");
    *out = NULL;
    if (!spec) return kb_error(KILN_ERR_INVALID, "kiln_tokenizer_new: spec is NULL");
    if (spec->n_tokens < 0 || spec->n_tokens >= INT32_MAX || spec->n_merges < 0 || spec->n_merges >= INT32_MAX ||
        (spec->n_tokens && !spec->tokens) || (spec->n_merges && !spec->merges))
        return kb_error(KILN_ERR_INVALID, "kiln_tokenizer_new: bad token or merge arrays");
    km_strv *tv = malloc(((size_t)spec->n_tokens + (size_t)spec->n_merges + 1) * sizeof *tv);
    if (!tv) return kb_oom();
    km_strv *mv = tv + spec->n_tokens;
    for (int64_t i = 0; i < spec->n_tokens; i++) {
        if (!spec->tokens[i]) {
            free(tv);
            return kb_error(KILN_ERR_INVALID, "kiln_tokenizer_new: token %lld is NULL", (long long)i);
        }
        tv[i] = (km_strv){spec->tokens[i], strlen(spec->tokens[i])};
    }
    for (int64_t i = 0; i < spec->n_merges; i++) {
        if (!spec->merges[i]) {
            free(tv);
            return kb_error(KILN_ERR_INVALID, "kiln_tokenizer_new: merge %lld is NULL", (long long)i);
        }
        mv[i] = (km_strv){spec->merges[i], strlen(spec->merges[i])};
    }
    bool spm = spec->model && strcmp(spec->model, "llama") == 0;
    if (spec->model && !spm && strcmp(spec->model, "gpt2") != 0) {
        free(tv);
        return kb_error(KILN_ERR_INVALID, "kiln_tokenizer_new: model '%s' is not supported (kiln has gpt2, llama)",
                        spec->model);
    }
    km_vocab v = {.n_tokens = spec->n_tokens, .tokens = tv, .types = spec->types, .n_merges = spec->n_merges,
                  .merges = mv, .pre = spec->pre, .bos = spec->bos, .eos = spec->eos, .add_bos = spec->add_bos,
                  .spm = spm, .scores = spec->scores, .unk = spec->unk, .add_space_prefix = spec->add_space_prefix};
    kiln_status st = km_tokenizer_build(&v, out);
    free(tv);
    return st;
}

int64_t kiln_tokenizer_n_vocab(const kiln_tokenizer *t) { return t ? t->n : 0; }
int32_t kiln_tokenizer_bos(const kiln_tokenizer *t) { return t ? t->bos : -1; }
int32_t kiln_tokenizer_eos(const kiln_tokenizer *t) { return t ? t->eos : -1; }

const char *km_token_text(const kiln_tokenizer *t, int32_t id, size_t *len) {
    if (!t || id < 0 || id >= t->n) return NULL;
    if (len) *len = tok_len(t, id);
    return t->text + t->off[id];
}

int km_token_type(const kiln_tokenizer *t, int32_t id) { return t && id >= 0 && id < t->n ? t->type[id] : -1; }

/* ---- tokenizing ------------------------------------------------------------------------------- */

typedef struct {
    int32_t  id; /* -1: merged text that is not a token */
    uint32_t start, len;
    int32_t  prev, next;
} sym;

typedef struct {
    int32_t  rank, left, right;
    uint32_t llen, rlen;
} bigram;

/* Growable arrays of one tokenize call. */
typedef struct {
    km_session k; /* ids, the merge queue (of bigram), oom */
    uint8_t *wb; /* the word's bytes */
    char    *enc; /* the word in the byte-to-unicode form */
    size_t   cap_wb, cap_enc;
    sym     *syms;
    size_t   cap_syms;
} session;

static void push_id(session *s, int32_t id) { km_push_id(&s->k, id); }

/* The lower merge rank first, then the leftmost (llama.cpp's BPE queue order). */
static bool bigram_less(const void *x, const void *y) {
    const bigram *a = x, *b = y;
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

_Static_assert(sizeof(bigram) <= KM_HEAP_MAX_ES, "km_heap holds a bigram");

static void try_pair(const kiln_tokenizer *t, session *s, int32_t l, int32_t r) {
    if (l < 0 || r < 0 || s->syms[l].id < 0 || s->syms[r].id < 0) return;
    const merge_slot *m = merge_find(t, s->syms[l].id, s->syms[r].id);
    if (m && !km_heap_push(&s->k.heap, &(bigram){m->rank, l, r, s->syms[l].len, s->syms[r].len})) s->k.oom = true;
}

/* The byte-to-unicode form of bytes b[0..n): at most 2 bytes a byte. */
static size_t encode_bytes(const uint8_t *b, size_t n, char *out) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += (size_t)km_utf8_encode(km_byte_to_cp(b[i]), (uint8_t *)out + k);
    return k;
}

/* BPE over one word of m bytes in s->wb. */
static void bpe_word(const kiln_tokenizer *t, session *s, size_t m) {
    if (t->ignore_merges) {
        int32_t whole = tok_find(t, s->enc, encode_bytes(s->wb, m, s->enc), -1);
        if (whole >= 0) {
            push_id(s, whole);
            return;
        }
    }
    if (m == 1) {
        push_id(s, t->byte_tok[s->wb[0]]);
        return;
    }
    if (!grow_array((void **)&s->syms, &s->cap_syms, m, sizeof *s->syms)) {
        s->k.oom = true;
        return;
    }
    for (size_t i = 0; i < m; i++)
        s->syms[i] = (sym){t->byte_tok[s->wb[i]], (uint32_t)i, 1, (int32_t)i - 1, i + 1 < m ? (int32_t)i + 1 : -1};
    s->k.heap.n = 0;
    for (size_t i = 1; i < m; i++) try_pair(t, s, (int32_t)i - 1, (int32_t)i);
    while (s->k.heap.n && !s->k.oom) {
        bigram b;
        km_heap_pop(&s->k.heap, &b);
        sym   *l = &s->syms[b.left], *r = &s->syms[b.right];
        if (!l->len || !r->len || l->len != b.llen || r->len != b.rlen) continue; /* stale */
        l->id = merge_find(t, l->id, r->id)->res;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) s->syms[r->next].prev = b.left;
        try_pair(t, s, l->prev, b.left);
        try_pair(t, s, b.left, l->next);
    }
    for (int32_t i = 0; i >= 0; i = s->syms[i].next) {
        const sym *x = &s->syms[i];
        if (x->id >= 0) {
            push_id(s, x->id);
            continue;
        }
        /* a merge made text that is not a token: as llama.cpp, each byte of its byte-to-unicode
         * form that is a token by itself */
        char   e[8];
        size_t el = 0;
        for (uint32_t j = x->start; j < x->start + x->len; j++) {
            el = encode_bytes(s->wb + j, 1, e);
            for (size_t k = 0; k < el; k++) {
                int32_t id = tok_find(t, e + k, 1, -1);
                if (id >= 0) push_id(s, id);
            }
        }
    }
}

/* Pre-tokenizes and merges raw text (no special tokens in it). cps, cls and ends hold len. */
static void bpe_text(const kiln_tokenizer *t, session *s, const uint8_t *text, size_t len, uint32_t *cps, uint8_t *cls,
                     uint32_t *ends) {
    size_t n = km_utf8_decode(text, len, cps);
    for (size_t i = 0; i < n; i++) cls[i] = (uint8_t)km_uc_class(cps[i]);
    size_t nw = km_pre_split(t->pre, cps, cls, n, ends);
    size_t start = 0;
    for (size_t w = 0; w < nw && !s->k.oom; w++) {
        size_t end = ends[w];
        /* the word's bytes: its code points written back as UTF-8, as llama.cpp does */
        if (!grow_array((void **)&s->wb, &s->cap_wb, (end - start) * 4, 1) ||
            !grow_array((void **)&s->enc, &s->cap_enc, (end - start) * 8, 1)) {
            s->k.oom = true;
            break;
        }
        size_t m = 0;
        for (size_t i = start; i < end; i++) m += (size_t)km_utf8_encode(cps[i], s->wb + m);
        bpe_word(t, s, m);
        start = end;
    }
}

typedef km_span span;

/* llama.cpp's order of special tokens: the longest first, then (its sort is not stable; here)
 * by id; then places left to right. */
static int cand_cmp(const void *pa, const void *pb) {
    const span *a = pa, *b = pb;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    if (a->id != b->id) return a->id < b->id ? -1 : 1;
    return a->pos < b->pos ? -1 : a->pos > b->pos;
}

static int pos_cmp(const void *pa, const void *pb) {
    const span *a = pa, *b = pb;
    return a->pos < b->pos ? -1 : a->pos > b->pos;
}

/* Where special tokens stand in text, as llama.cpp's tokenizer_st_partition finds them: for each
 * special token in its order, every leftmost non-overlapping place in the text that no token
 * before it took. Returns the spans in text order (caller frees), or NULL with *n = 0. */
static span *find_specials(const kiln_tokenizer *t, const uint8_t *text, size_t len, size_t *n_out, bool *oom) {
    *n_out = 0;
    if (!t->n_special) return NULL;
    span  *sp = NULL; /* every place any special token matches */
    size_t n = 0, cap = 0;
    for (size_t p = 0; p < len; p++) {
        const uint32_t *ls = t->lens[text[p]];
        for (uint32_t k = 0; k < t->n_lens[text[p]]; k++) {
            if (ls[k] > len - p) continue;
            int32_t id = tok_find(t, (const char *)text + p, ls[k], -1);
            if (id < 0 || !is_special_type(t->type[id])) continue;
            if (!grow_array((void **)&sp, &cap, n + 1, sizeof *sp)) {
                free(sp);
                *oom = true;
                return NULL;
            }
            sp[n++] = (span){ls[k], (uint32_t)p, id};
        }
    }
    if (!n) return NULL;
    qsort(sp, n, sizeof *sp, cand_cmp);
    uint8_t *taken = calloc(len, 1);
    if (!taken) {
        free(sp);
        *oom = true;
        return NULL;
    }
    size_t kept = 0;
    for (size_t c = 0; c < n; c++) {
        size_t k = 0;
        while (k < sp[c].len && !taken[sp[c].pos + k]) k++;
        if (k < sp[c].len) continue;
        memset(taken + sp[c].pos, 1, sp[c].len);
        sp[kept++] = sp[c];
    }
    free(taken);
    qsort(sp, kept, sizeof *sp, pos_cmp);
    *n_out = kept;
    return sp;
}

km_span *km_find_specials(const kiln_tokenizer *t, const uint8_t *text, size_t len, size_t *n, bool *oom) {
    return find_specials(t, text, len, n, oom);
}

kiln_status kiln_tokenize(const kiln_tokenizer *t, const char *text, size_t len, int32_t **ids, int64_t *n) {
    if (!t || !ids || !n || (!text && len)) return kb_error(KILN_ERR_INVALID, "kiln_tokenize: NULL argument");
    *ids = NULL;
    *n = 0;
    if (len >= UINT32_MAX) return kb_error(KILN_ERR_INVALID, "kiln_tokenize: text of %zu bytes is too long", len);
    if (t->spm) return km_spm_tokenize(t, t->spm, text, len, ids, n);
    const uint8_t *u = (const uint8_t *)text;
    session        s = {.k = {.heap = {.es = sizeof(bigram), .before = bigram_less}}};
    if (t->add_bos) push_id(&s, t->bos);
    size_t    nsp = 0;
    bool      oom = false;
    span     *sp = find_specials(t, u, len, &nsp, &oom);
    uint32_t *cps = malloc((len + 1) * sizeof *cps), *ends = malloc((len + 1) * sizeof *ends);
    uint8_t  *cls = malloc(len + 1);
    if (!cps || !ends || !cls) oom = true;
    size_t at = 0;
    for (size_t k = 0; k <= nsp && !oom && !s.k.oom; k++) {
        size_t end = k < nsp ? sp[k].pos : len;
        if (end > at) bpe_text(t, &s, u + at, end - at, cps, cls, ends);
        if (k < nsp) {
            push_id(&s, sp[k].id);
            at = end + sp[k].len;
        }
    }
    free(sp);
    free(cps);
    free(ends);
    free(cls);
    free(s.wb);
    free(s.enc);
    free(s.syms);
    return km_session_end(&s.k, oom, ids, n);
}

/* ---- detokenizing ----------------------------------------------------------------------------- */

static void decode_token(kb_str *b, const char *s, size_t len) {
    uint32_t cps[64];
    uint8_t  tmp[64];
    for (size_t at = 0; at < len;) {
        size_t chunk = len - at < sizeof tmp / 4 ? len - at : sizeof tmp / 4;
        /* do not cut a character: back up to a lead byte */
        while (chunk < len - at && chunk > 1 && (((const uint8_t *)s)[at + chunk] & 0xC0) == 0x80) chunk--;
        size_t nc = km_utf8_decode((const uint8_t *)s + at, chunk, cps), k = 0;
        for (size_t i = 0; i < nc; i++) {
            int byte = km_cp_to_byte(cps[i]);
            if (byte >= 0) tmp[k++] = (uint8_t)byte;
            else k += (size_t)km_utf8_encode(cps[i], tmp + k); /* not in the map: as it is */
        }
        kb_str_addn(b, (const char *)tmp, k);
        at += chunk;
    }
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

kiln_status kiln_detokenize(const kiln_tokenizer *t, const int32_t *ids, int64_t n, char **text, size_t *len) {
    if (!t || !text || n < 0 || (!ids && n)) return kb_error(KILN_ERR_INVALID, "kiln_detokenize: bad argument");
    *text = NULL;
    if (len) *len = 0;
    if (t->spm) return km_spm_detokenize(t, t->spm, ids, n, text, len);
    kb_str b = {0};
    kb_str_add(&b, "");
    for (int64_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n) {
            kb_str_free(&b);
            return kb_error(KILN_ERR_INVALID, "token id %d at position %lld is not in the vocabulary of %lld tokens", id,
                            (long long)i, (long long)t->n);
        }
        const char *s = t->text + t->off[id];
        size_t      len = tok_len(t, id);
        switch (t->type[id]) {
        case KILN_TOKEN_NORMAL: decode_token(&b, s, len); break;
        case KILN_TOKEN_USER_DEFINED: kb_str_addn(&b, s, len); break;
        case KILN_TOKEN_BYTE:
            if (len == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' && hexval(s[3]) >= 0 && hexval(s[4]) >= 0) {
                char c = (char)(hexval(s[3]) * 16 + hexval(s[4]));
                kb_str_addn(&b, &c, 1);
            } else {
                decode_token(&b, s, len);
            }
            break;
        default: break; /* control, unknown, unused, undefined: nothing, as llama.cpp */
        }
    }
    size_t l = b.len;
    char  *out = kb_str_take(&b);
    if (!out) return kb_oom();
    *text = out;
    if (len) *len = l;
    return NULL;
}

/* ---- from a GGUF ------------------------------------------------------------------------------ */

static kiln_status gguf_string_array(const kiln_gguf *g, const char *key, bool required, km_strv **out, uint64_t *n) {
    *out = NULL;
    *n = 0;
    kiln_gguf_type elem;
    const void    *data;
    kiln_status    st = kiln_gguf_get_arr(g, key, &elem, n, &data);
    if (st) {
        if (kiln_status_code(st) == KILN_ERR_NOT_FOUND && !required) {
            kiln_status_free(st);
            return NULL;
        }
        return st;
    }
    if (elem != KILN_GGUF_STRING)
        return kb_error(KILN_ERR_FORMAT, "%s: %s is an array of %s, not of strings", km_gguf_label(g), key,
                        kiln_gguf_type_name(elem));
    if (*n >= INT32_MAX)
        return kb_error(KILN_ERR_FORMAT, "%s: %s has %llu strings, too many", km_gguf_label(g), key,
                        (unsigned long long)*n);
    km_strv *v = malloc((*n + 1) * sizeof *v);
    if (!v) return kb_oom();
    for (uint64_t i = 0; i < *n; i++) {
        if ((st = kiln_gguf_get_arr_str(g, key, i, &v[i].s, &v[i].len))) {
            free(v);
            return st;
        }
    }
    *out = v;
    return NULL;
}

kiln_status km_gguf_strings(const kiln_gguf *g, const char *key, bool required, km_strv **out, uint64_t *n) {
    return gguf_string_array(g, key, required, out, n);
}

static kiln_status gguf_token_id(const kiln_gguf *g, const char *key, uint64_t n_tokens, int32_t *out) {
    int64_t     v;
    kiln_status st = kiln_gguf_get_int(g, key, &v);
    *out = -1;
    if (st) {
        if (kiln_status_code(st) != KILN_ERR_NOT_FOUND) return st;
        kiln_status_free(st);
        return NULL;
    }
    if (v < 0 || (uint64_t)v >= n_tokens)
        return kb_error(KILN_ERR_FORMAT, "%s: %s is %lld, not a token id (the vocabulary has %llu tokens)",
                        km_gguf_label(g), key, (long long)v, (unsigned long long)n_tokens);
    *out = (int32_t)v;
    return NULL;
}

kiln_status km_gguf_token_id(const kiln_gguf *g, const char *key, uint64_t n_tokens, int32_t *out) {
    return gguf_token_id(g, key, n_tokens, out);
}

kiln_status kiln_tokenizer_from_gguf(const kiln_gguf *g, kiln_tokenizer **out) {
    if (!g || !out) return kb_error(KILN_ERR_INVALID, "kiln_tokenizer_from_gguf: NULL argument");
    *out = NULL;
    const char *s, *file = km_gguf_label(g); /* every message names the file; the getters' do already */
    size_t      len;
    kiln_status st = kiln_gguf_get_str(g, "tokenizer.ggml.model", &s, &len);
    if (st) {
        if (kiln_status_code(st) != KILN_ERR_NOT_FOUND) return st;
        kiln_status_free(st);
        return kb_error(KILN_ERR_FORMAT, "%s: the file has no tokenizer (no tokenizer.ggml.model)", file);
    }
    if (len == 5 && memcmp(s, "llama", 5) == 0) return km_spm_from_gguf(g, out);
    if (len != 4 || memcmp(s, "gpt2", 4) != 0) {
        static const char *const kinds[][2] = {{"bert", "WordPiece"}, {"t5", "Unigram"}, {"rwkv", "RWKV"},
                                               {"plamo2", "PLaMo-2"}};
        const char *kind = "unknown";
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
            if (strlen(kinds[i][0]) == len && memcmp(s, kinds[i][0], len) == 0) kind = kinds[i][1];
        return kb_error(KILN_ERR_FORMAT,
                        "%s: tokenizer.ggml.model '%.*s%s' (%s) is not supported: kiln reads byte-level BPE ('gpt2') "
                        "and SentencePiece ('llama')",
                        file, SHOW(s, len), kind);
    }
    char pre[64], known[1024];
    if ((st = kiln_gguf_get_str(g, "tokenizer.ggml.pre", &s, &len))) {
        if (kiln_status_code(st) != KILN_ERR_NOT_FOUND) return st;
        kiln_status_free(st);
        return kb_error(KILN_ERR_FORMAT, "%s: tokenizer.ggml.pre is missing (llama.cpp guesses its 'default' "
                                         "pre-tokenizer then; kiln wants the name)", file);
    }
    km_pre_spec p;
    snprintf(pre, sizeof pre, "%.*s", (int)(len < sizeof pre - 1 ? len : sizeof pre - 1), s);
    if (len >= sizeof pre || strlen(pre) != len || !km_pre_parse(pre, &p)) {
        km_pre_list(known, sizeof known);
        return kb_error(KILN_ERR_FORMAT, "%s: tokenizer.ggml.pre '%.*s%s' is not supported (kiln has %s)", file,
                        SHOW(s, len), known);
    }
    km_strv *tokens = NULL, *merges = NULL;
    uint64_t n_tokens, n_merges;
    int32_t *types = NULL;
    km_vocab v = {.pre = pre, .add_bos = p.add_bos}; /* llama.cpp's default: true for llama-bpe, tekken */
    if ((st = gguf_string_array(g, "tokenizer.ggml.tokens", true, &tokens, &n_tokens))) goto done;
    if ((st = gguf_string_array(g, "tokenizer.ggml.merges", true, &merges, &n_merges))) goto done;
    kiln_gguf_type elem;
    uint64_t       nt;
    const void    *data;
    if ((st = kiln_gguf_get_arr(g, "tokenizer.ggml.token_type", &elem, &nt, &data))) {
        if (kiln_status_code(st) != KILN_ERR_NOT_FOUND) goto done;
        kiln_status_free(st);
        st = NULL;
    } else {
        if (elem != KILN_GGUF_I32 || nt < n_tokens) {
            st = kb_error(KILN_ERR_FORMAT, "%s: tokenizer.ggml.token_type is %llu values of %s, not %llu of i32", file,
                          (unsigned long long)nt, kiln_gguf_type_name(elem), (unsigned long long)n_tokens);
            goto done;
        }
        if (!(types = malloc(n_tokens * sizeof *types + 1))) {
            st = kb_oom();
            goto done;
        }
        memcpy(types, data, n_tokens * sizeof *types); /* the file's little-endian, maybe unaligned */
    }
    if ((st = gguf_token_id(g, "tokenizer.ggml.bos_token_id", n_tokens, &v.bos))) goto done;
    if ((st = gguf_token_id(g, "tokenizer.ggml.eos_token_id", n_tokens, &v.eos))) goto done;
    bool add_bos;
    if ((st = kiln_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos))) {
        if (kiln_status_code(st) != KILN_ERR_NOT_FOUND) goto done;
        kiln_status_free(st);
        st = NULL;
    } else {
        v.add_bos = add_bos;
    }
    if (v.add_bos && v.bos < 0) {
        st = kb_error(KILN_ERR_FORMAT, "%s: tokenizer.ggml.add_bos_token is true but there is no "
                                       "tokenizer.ggml.bos_token_id", file);
        goto done;
    }
    v.n_tokens = (int64_t)n_tokens;
    v.tokens = tokens;
    v.types = types;
    v.n_merges = (int64_t)n_merges;
    v.merges = merges;
    if ((st = km_tokenizer_build(&v, out))) st = kb_wrap(st, "%s: tokenizer", file);
done:
    free(tokens);
    free(merges);
    free(types);
    return st;
}
