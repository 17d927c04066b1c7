/* model: the byte-level BPE tokenizer (tokenizer.c), its pre-tokenizer and text helpers
 * (tokenizer_pre.c), the SentencePiece tokenizer (tokenizer_spm.c) and the synthetic
 * vocabularies of kiln gen-model (vocab_synth.c). Prefix km_.
 * docs/tokenizer.md says how all of it follows llama.cpp. */
#ifndef KILN_MODEL_TOKENIZER_H
#define KILN_MODEL_TOKENIZER_H

#include "kiln.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- tokenizer_pre.c ------------------------------------------------------------------------ */

/* The pre-tokenizers: how text is cut into words before BPE. Each is the list of regexes
 * llama.cpp's llm_tokenizer_bpe applies in sequence for its LLAMA_VOCAB_PRE_TYPE_* (written out
 * in tokenizer_pre.c and docs/tokenizer.md); several GGUF names share one. */
typedef enum {
    KM_PRE_GPT2,           /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    KM_PRE_LLAMA3,         /* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
                              ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    KM_PRE_QWEN2,          /* LLAMA3's with \p{N} (one digit a word) */
    KM_PRE_DEEPSEEK_LLM,   /* 6 regexes: newlines, cased letters, ASCII/CJK punctuation, ... */
    KM_PRE_DEEPSEEK_CODER, /* 5 regexes: newlines, \s?\p{L}+, \s?\p{P}+, CJK, single digits */
    KM_PRE_DEEPSEEK3,      /* \p{N}{1,3}, Han and kana, then letters/marks and punctuation/symbols */
    KM_PRE_GPT4O,          /* o200k: words by ASCII case, contractions attached, \p{N}{1,3} */
    KM_PRE_TEKKEN,         /* GPT4O's without contractions, \p{N} */
    KM_PRE_STARCODER,      /* \p{N}, then GPT2's */
    KM_PRE_FALCON,         /* [\p{P}$+<=>^~|`]+, then GPT2's, then [0-9]{3} */
    KM_PRE_DEFAULT,        /* [\p{P}$+<=>^~|]+, GPT2's, \p{N}+, [0-9]{3}: llama.cpp's default */
    KM_PRE_COUNT
} km_pre;
/* What a tokenizer.ggml.pre name stands for: its pattern and llama.cpp's flags for it. */
typedef struct {
    km_pre pre;
    bool   ignore_merges; /* a word that is a token is that token (llama-bpe, tekken) */
    bool   add_bos;       /* the default of tokenizer.ggml.add_bos_token */
} km_pre_spec;
/* The spec of a GGUF name (llama.cpp's names: "gpt-2", "llama-bpe", "deepseek-llm", ...; kiln
 * also takes "gpt2"); false for any other name. */
bool        km_pre_parse(const char *name, km_pre_spec *out);
/* The names km_pre_parse takes, comma-separated, into buf (cut to cap - 1 bytes). */
void        km_pre_list(char *buf, size_t cap);
const char *km_pre_name(km_pre pre); /* the pattern's first name: "gpt2", "llama-bpe", ... */

/* Character classes of the pre-tokenizers' patterns: Unicode general categories L*, N*, P*,
 * S*, M*, and the White_Space property (which wins: U+0085 is Cc, U+00A0 Zs); everything
 * else (C*, unassigned included) is other. */
enum { KM_UC_OTHER, KM_UC_LETTER, KM_UC_NUMBER, KM_UC_SPACE, KM_UC_PUNCT, KM_UC_SYMBOL, KM_UC_MARK };
int         km_uc_class(uint32_t cp);
const char *km_uc_version(void); /* of the table: "15.1.0" */

/* UTF-8 as llama.cpp reads it: a lead byte with enough continuation bytes decodes (overlong
 * forms and surrogates included); any other byte, and a 4-byte form past U+10FFFF, is one
 * U+FFFD. Writes at most len code points to cps and returns their count. */
size_t km_utf8_decode(const uint8_t *s, size_t len, uint32_t *cps);
/* Writes cp (at most U+10FFFF) as 1-4 bytes; returns the count. */
int    km_utf8_encode(uint32_t cp, uint8_t out[4]);

/* GPT-2's byte-to-unicode map: printable bytes stand for themselves, the other 68 for
 * U+0100 + their rank among them. km_cp_to_byte is its inverse (-1 off the map). */
uint32_t km_byte_to_cp(uint8_t b);
int      km_cp_to_byte(uint32_t cp);

/* Cuts n code points (cls[i] = km_uc_class(cps[i])) into words as pre's regexes do, one
 * after the other, each on the pieces the one before left (llama.cpp's unicode_regex_split):
 * writes each word's end (exclusive) to ends, in order, and returns the number of words
 * (at most n). */
size_t km_pre_split(km_pre pre, const uint32_t *cps, const uint8_t *cls, size_t n, uint32_t *ends);

/* ---- tokenizer.c ----------------------------------------------------------------------------- */

typedef struct {
    const char *s;
    size_t      len;
} km_strv;

/* What kiln_tokenizer_new takes, with counted strings (kiln_tokenizer_from_gguf's point into
 * the file). pre NULL: gpt2. With spm, a SentencePiece vocabulary: merges and pre are not used,
 * scores (NULL: all 0), unk and add_space_prefix are. */
typedef struct {
    int64_t        n_tokens;
    const km_strv *tokens;
    const int32_t *types; /* or NULL: all normal */
    int64_t        n_merges;
    const km_strv *merges;
    const char    *pre;
    int32_t        bos, eos;
    bool           add_bos;
    bool           spm;
    const float   *scores;
    int32_t        unk; /* -1: none */
    bool           add_space_prefix;
} km_vocab;
kiln_status km_tokenizer_build(const km_vocab *v, kiln_tokenizer **out);

/* Shared with tokenizer_spm.c. The id of the token with this text, or -1. */
int32_t km_token_find(const kiln_tokenizer *t, const char *s, size_t len);
/* Grows *p (of *cap elements of elem bytes) to hold need; false when out of memory. */
bool    km_grow_to(void **p, size_t *cap, size_t need, size_t elem);
/* A binary heap of elements of es bytes (at most KM_HEAP_MAX_ES), the one that before(a, b) puts
 * first on top: the merge queues of both tokenizers (pairs ordered by rank or by score). */
#define KM_HEAP_MAX_ES 64
typedef struct {
    void  *a;
    size_t n, cap, es;
    bool (*before)(const void *a, const void *b);
} km_heap;
bool km_heap_push(km_heap *h, const void *x); /* false when out of memory (h unchanged) */
void km_heap_pop(km_heap *h, void *out);      /* the top into out; h->n must be > 0 */
/* What both tokenizers' tokenize calls grow: the ids made, the merge queue, and whether memory
 * ran out on the way. */
typedef struct {
    int32_t *ids;
    size_t   n_ids, cap_ids;
    km_heap  heap;
    bool     oom;
} km_session;
void        km_push_id(km_session *s, int32_t id); /* sets oom when out of memory */
/* Ends a tokenize call: frees the queue; the ids (never NULL, even for none) into *ids and *n,
 * or an out-of-memory error when memory ran out (oom: the caller's own failures too). */
kiln_status km_session_end(km_session *s, bool oom, int32_t **ids, int64_t *n);
/* Special tokens found in text (tokenizer_st_partition): len bytes at pos are token id. */
typedef struct {
    uint32_t len, pos;
    int32_t  id;
} km_span;
/* The spans in text order (caller frees), or NULL with *n = 0; *oom set when out of memory. */
km_span    *km_find_specials(const kiln_tokenizer *t, const uint8_t *text, size_t len, size_t *n, bool *oom);
/* The GGUF's string array key as counted strings (caller frees *out; absent and not required:
 * NULL and 0), and a token id key (-1 when absent; out of range: an error naming the key). */
kiln_status km_gguf_strings(const kiln_gguf *g, const char *key, bool required, km_strv **out, uint64_t *n);
kiln_status km_gguf_token_id(const kiln_gguf *g, const char *key, uint64_t n_tokens, int32_t *out);

/* ---- tokenizer_spm.c ------------------------------------------------------------------------- */

/* SentencePiece BPE (tokenizer.ggml.model "llama"): what it adds to a kiln_tokenizer built by
 * km_tokenizer_build (the tokens, their types and the special-token table are the tokenizer's). */
typedef struct km_spm km_spm;
kiln_status km_spm_build(const kiln_tokenizer *t, const km_vocab *v, km_spm **out);
void        km_spm_free(km_spm *s);
/* kiln_tokenize and kiln_detokenize of a SentencePiece tokenizer (arguments checked). */
kiln_status km_spm_tokenize(const kiln_tokenizer *t, const km_spm *s, const char *text, size_t len, int32_t **ids,
                            int64_t *n);
kiln_status km_spm_detokenize(const kiln_tokenizer *t, const km_spm *s, const int32_t *ids, int64_t n, char **text,
                              size_t *len);
/* kiln_tokenizer_from_gguf for tokenizer.ggml.model "llama". */
kiln_status km_spm_from_gguf(const kiln_gguf *g, kiln_tokenizer **out);

/* The text of token id (not NUL-terminated; NULL if out of range) and its type. */
const char *km_token_text(const kiln_tokenizer *t, int32_t id, size_t *len);
int         km_token_type(const kiln_tokenizer *t, int32_t id);

/* ---- vocab_synth.c --------------------------------------------------------------------------- */

/* A synthetic vocabulary of exactly n_vocab tokens: the 256 byte tokens (id = byte), the tokens
 * of merges learned from km_synth_text() as pre-tokenized by llama-bpe, <|begin_of_text|> (bos)
 * and <|end_of_text|> (eos), then <|reserved_N|> (control) to n_vocab. Strings are in `blob`. */
typedef struct {
    int64_t      n_tokens, n_merges, n_learned; /* n_learned: tokens the merges added */
    const char **tokens;
    int32_t     *types;
    const char **merges;
    float       *scores; /* km_synth_spm_make only */
    int32_t      bos, eos, unk;
    char        *blob;
} km_synth;
kiln_status km_synth_make(int64_t n_vocab, km_synth *out);
/* A synthetic SentencePiece vocabulary of exactly n_vocab tokens, laid out as Llama 2's: <unk>
 * (0, unknown), <s> (1, bos), </s> (2, eos), the 256 byte-fallback tokens <0x00>..<0xFF>, the
 * pieces learned from km_synth_text() (words with a leading U+2581 for the space, merged as BPE
 * does; score -k for the k-th), each character of the text but the newline (lower scores),
 * then <unused_N> (unused) to n_vocab. No merges. */
kiln_status km_synth_spm_make(int64_t n_vocab, km_synth *out);
void        km_synth_free(km_synth *s);
/* The built-in English text the merges are learned from (a few KB, NUL-terminated). */
const char *km_synth_text(void);

#endif
