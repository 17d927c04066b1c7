/* The synthetic vocabularies of kiln gen-model: a real byte-level BPE vocabulary of any size, made
 * without a tokenizer file, and a SentencePiece one laid out as Llama 2's. Their tokens are
 * learned here, by a small BPE trainer, from an English text written for kiln (below); the rest
 * of the vocabulary is control (BPE) or unused (SentencePiece) tokens. Deterministic: the same
 * n_vocab gives the same tokens on every machine. docs/tokenizer.md. */
#include "model/tokenizer.h"

#include "base/base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Written for kiln; free to use like the rest of it. Paragraphs, joined by blank lines. */
static const char text[] =
    "A compiler is a program that reads a program and writes another one. The first is written for "
    "people: it has names, comments and structure that make it easy to read. The second is written "
    "for a machine: it is a long list of small steps, each of which the processor can do in a few "
    "cycles. Between the two stand many passes, and each pass changes the program a little while "
    "keeping what it means. The front end reads the text, checks that it is well formed and builds a "
    "tree. The middle of the compiler turns the tree into a graph of simple operations and improves "
    "it. The back end chooses instructions, assigns registers and writes the result to a file."
    "\n\n"
    "Why do we build compilers at all? Because the machine and the programmer don't speak the same "
    "language. A person thinks in loops, functions and types; a GPU thinks in warps, registers and "
    "memory transactions. It's the compiler's job to bridge that gap, and to do it well: a naive "
    "translation can be ten or a hundred times slower than a careful one. In 1957 the first FORTRAN "
    "compiler had to prove that it could match code written by hand, or nobody would have used it. "
    "Sixty years later the question is the same, only the machines have changed."
    "\n\n"
    "A graph compiler works on a different kind of program. Its input is not text but a graph of "
    "tensor operations: matrix multiplications, additions, normalizations, rotations and softmax. "
    "Each node reads a few tensors and writes one. The shapes are known before the program runs, so "
    "the compiler can specialize every kernel for them: a loop over 4096 elements becomes a loop "
    "with a constant bound, and a division by 128 becomes a shift. When two nodes are next to each "
    "other and the second only reads what the first wrote, they can be fused into one kernel, which "
    "saves a round trip through memory. Memory is the slowest part of the machine, so fusion is "
    "often the most important optimization of all."
    "\n\n"
    "Caching matters too. Compiling a kernel takes tens or hundreds of milliseconds, and a large "
    "model has more than a thousand of them. But most of them are the same: every layer of a "
    "transformer runs the same operations on tensors of the same shapes. So the compiler computes a "
    "key for each kernel from its source, its options and the target, and looks it up before doing "
    "any work. The first run pays for every distinct kernel once; the second run pays for nothing "
    "and starts in a few milliseconds. Keys must include everything that changes the output, or the "
    "cache would return the wrong program, which is worse than no cache at all."
    "\n\n"
    "Testing a compiler is hard because the space of programs is so large. We're careful to check "
    "each pass on its own, with small graphs whose results we can compute by hand, and then to check "
    "the whole pipeline against a reference: a simple, slow interpreter that evaluates the same graph "
    "on the CPU. If the two disagree by more than the rounding of the data types allows, something is "
    "wrong. Random tests help as well: they find the cases that nobody thought of, like a tensor with "
    "a dimension of one, an empty batch, or a value that is not a number."
    "\n\n"
    "Language models add one more step at each end. Before the model can run, the text must become "
    "numbers: a tokenizer cuts it into pieces and maps each piece to an id in its vocabulary. Common "
    "words get a token of their own; rare words are spelled out from smaller pieces, down to single "
    "bytes if need be, so that any text at all can be written. After the model has run, the ids it "
    "chose are turned back into text. The pieces are learned from data by merging the pair of "
    "symbols that occurs most often, again and again, until the vocabulary has the size we want. "
    "That is the whole idea of byte pair encoding, and it's simple enough to fit on a page."
    "\n\n"
    "There are many details, of course. Where may a word be cut? Are spaces part of the word that "
    "follows them? What happens to digits, to punctuation, to letters from other scripts? Each model "
    "answers these questions in its own way, and a tokenizer that answers them differently will give "
    "the model text it has never seen. So we follow the rules exactly, test them on many strings, "
    "and make sure that decoding the tokens of a text gives back the text, byte for byte."
    "\n\n"
    "Numbers deserve a word of their own. A model that sees 2024 as one token and 2025 as two has a "
    "harder time with arithmetic than one that always cuts digits the same way, so some tokenizers "
    "split numbers into groups of three digits (1, 234, 567) and others into single digits. Code is "
    "another special case: it's full of indentation, brackets and operators like ==, != and ->, and "
    "a vocabulary that has tokens for four or eight spaces saves a lot of room. In the end the choice "
    "is a trade: a larger vocabulary makes sequences shorter, but every token needs a row in the "
    "embedding table and a column in the output layer, and those cost memory and time."
    "\n\n"
    "What does this mean for a compiler of model graphs? Very little, and that's the point. The "
    "tokenizer runs on the CPU, once per prompt, and takes a fraction of a millisecond; the model runs "
    "on the GPU and takes the rest. But a wrong token at the start changes every step that follows, "
    "so the tokenizer must be exact, and it must be fast enough that nobody ever has to think about "
    "it. Both are easy to test, which is a rare luxury in this field.";

const char *km_synth_text(void) { return text; }

void km_synth_free(km_synth *s) {
    if (!s) return;
    free(s->tokens);
    free(s->types);
    free(s->merges);
    free(s->scores);
    free(s->blob);
    memset(s, 0, sizeof *s);
}

/* ---- the trainer ------------------------------------------------------------------------------ */

/* A list of NUL-terminated strings in one buffer. */
typedef struct {
    kb_str  str;
    size_t *off;
    int64_t n, cap;
} strlist;

static bool strlist_add(strlist *l, const char *s, size_t len) {
    if (l->n == l->cap) {
        int64_t cap = l->cap ? l->cap * 2 : 1024;
        size_t *p = realloc(l->off, (size_t)cap * sizeof *p);
        if (!p) return false;
        l->off = p;
        l->cap = cap;
    }
    l->off[l->n++] = l->str.len;
    kb_str_addn(&l->str, s, len);
    kb_str_addn(&l->str, "", 1); /* the NUL */
    return !l->str.oom;
}

static const char *strlist_get(const strlist *l, int64_t i) { return l->str.s + l->off[i]; }

static void strlist_free(strlist *l) {
    kb_str_free(&l->str);
    free(l->off);
}

/* The training words: each distinct word of the text once, with its count, as token ids. */
typedef struct {
    int32_t *seq; /* the words back to back */
    int64_t *start, *len, *count;
    int64_t  n, n_syms;
} words;

static bool same_word(const words *w, int64_t k, const int32_t *ids, size_t m) {
    if (w->len[k] != (int64_t)m) return false;
    for (size_t j = 0; j < m; j++)
        if (w->seq[w->start[k] + (int64_t)j] != ids[j]) return false;
    return true;
}

/* Counts the word ids[0..m) (arrays of w sized by the caller). */
static void add_word(words *w, const int32_t *ids, size_t m) {
    int64_t k = 0; /* a few hundred distinct words: a scan will do */
    while (k < w->n && !same_word(w, k, ids, m)) k++;
    if (k < w->n) {
        w->count[k]++;
        return;
    }
    w->start[w->n] = w->n_syms;
    w->len[w->n] = (int64_t)m;
    w->count[w->n++] = 1;
    for (size_t j = 0; j < m; j++) w->seq[w->n_syms++] = ids[j];
}

/* The text pre-tokenized as llama-bpe does, as byte token ids (= the bytes). */
static bool split_words(const char *text, words *w) {
    size_t    len = strlen(text);
    uint32_t *cps = malloc(len * sizeof *cps), *ends = malloc(len * sizeof *ends);
    uint8_t  *cls = malloc(len), *bytes = malloc(len * 4);
    int32_t  *ids = malloc(len * 4 * sizeof *ids);
    w->seq = malloc(len * 4 * sizeof *w->seq);
    w->start = malloc(len * sizeof *w->start);
    w->len = malloc(len * sizeof *w->len);
    w->count = malloc(len * sizeof *w->count);
    bool ok = cps && ends && cls && bytes && ids && w->seq && w->start && w->len && w->count;
    if (ok) {
        size_t n = km_utf8_decode((const uint8_t *)text, len, cps);
        for (size_t i = 0; i < n; i++) cls[i] = (uint8_t)km_uc_class(cps[i]);
        size_t nw = km_pre_split(KM_PRE_LLAMA3, cps, cls, n, ends), start = 0;
        for (size_t i = 0; i < nw; i++) {
            size_t m = 0;
            for (size_t c = start; c < ends[i]; c++) m += (size_t)km_utf8_encode(cps[c], bytes + m);
            start = ends[i];
            for (size_t j = 0; j < m; j++) ids[j] = bytes[j];
            add_word(w, ids, m);
        }
    }
    free(cps);
    free(ends);
    free(cls);
    free(bytes);
    free(ids);
    return ok;
}

static void words_free(words *w) {
    free(w->seq);
    free(w->start);
    free(w->len);
    free(w->count);
}

typedef struct {
    uint64_t key;   /* a << 32 | b */
    int64_t  count;
    uint32_t stamp; /* the round that counted it; another: empty */
} pair_slot;

/* The most frequent pair of adjacent tokens in the words (ties: the smallest ids), or false
 * when none occurs twice. */
static bool best_pair(const words *w, pair_slot *tab, uint64_t mask, uint32_t round, int32_t *a, int32_t *b) {
    uint64_t best = 0;
    int64_t  best_count = 1;
    for (int64_t k = 0; k < w->n; k++) {
        const int32_t *s = w->seq + w->start[k];
        for (int64_t i = 0; i + 1 < w->len[k]; i++) {
            uint64_t key = (uint64_t)(uint32_t)s[i] << 32 | (uint32_t)s[i + 1];
            uint64_t h = key * 0x9E3779B97F4A7C15ULL;
            uint64_t j = (h ^ h >> 29) & mask;
            while (tab[j].stamp == round && tab[j].key != key) j = (j + 1) & mask;
            if (tab[j].stamp != round) tab[j] = (pair_slot){key, 0, round};
            tab[j].count += w->count[k];
            if (tab[j].count > best_count || (tab[j].count == best_count && best_count > 1 && key < best)) {
                best = key;
                best_count = tab[j].count;
            }
        }
    }
    *a = (int32_t)(best >> 32);
    *b = (int32_t)(uint32_t)best;
    return best_count > 1;
}

/* Replaces each pair a b in the words, left to right, by c. */
static void apply_merge(words *w, int32_t a, int32_t b, int32_t c) {
    for (int64_t k = 0; k < w->n; k++) {
        int32_t *s = w->seq + w->start[k];
        int64_t  j = 0;
        for (int64_t i = 0; i < w->len[k];) {
            if (i + 1 < w->len[k] && s[i] == a && s[i + 1] == b) {
                s[j++] = c;
                i += 2;
            } else {
                s[j++] = s[i++];
            }
        }
        w->len[k] = j;
    }
}

/* Learns up to max_new tokens from the words w, whose symbols are the first n_base tokens of
 * vocab: adds them to vocab and the merges that make them (and any that remake one) to merges
 * (if not NULL). */
static bool learn(words *w, int64_t n_base, int64_t max_new, strlist *vocab, strlist *merges) {
    uint64_t size = 16;
    while (size < (uint64_t)w->n_syms * 2) size *= 2;
    pair_slot *tab = calloc(size, sizeof *tab);
    bool       ok = tab != NULL;
    kb_str     cat = {0};
    for (uint32_t round = 1; ok && vocab->n - n_base < max_new; round++) {
        int32_t a, b;
        if (!best_pair(w, tab, size - 1, round, &a, &b)) break;
        const char *sa = strlist_get(vocab, a), *sb = strlist_get(vocab, b);
        cat.len = 0;
        kb_str_addf(&cat, "%s%s", sa, sb);
        if (cat.oom) {
            ok = false;
            break;
        }
        int64_t c = n_base; /* the text may be a token already, made another way */
        while (c < vocab->n && strcmp(strlist_get(vocab, c), cat.s) != 0) c++;
        if (c == vocab->n) ok = strlist_add(vocab, cat.s, cat.len);
        sa = strlist_get(vocab, a); /* the list may have moved */
        sb = strlist_get(vocab, b);
        cat.len = 0;
        kb_str_addf(&cat, "%s %s", sa, sb);
        ok = ok && !cat.oom && (!merges || strlist_add(merges, cat.s, cat.len));
        apply_merge(w, a, b, (int32_t)c);
    }
    kb_str_free(&cat);
    free(tab);
    return ok;
}

/* The byte-level trainer: the words as llama-bpe cuts them, of the 256 byte tokens in vocab. */
static bool train(int64_t max_new, strlist *vocab, strlist *merges) {
    words w = {0};
    bool  ok = split_words(km_synth_text(), &w) && learn(&w, 256, max_new, vocab, merges);
    words_free(&w);
    return ok;
}

kiln_status km_synth_make(int64_t n_vocab, km_synth *out) {
    if (!out) return kb_error(KILN_ERR_INVALID, "km_synth_make: out is NULL");
    memset(out, 0, sizeof *out);
    if (n_vocab < 258 || n_vocab > (1 << 24))
        return kb_error(KILN_ERR_INVALID,
                        "n_vocab %lld: a synthetic byte-level vocabulary has 258 (256 bytes, bos, eos) to 16777216 tokens",
                        (long long)n_vocab);
    strlist vocab = {0}, merges = {0};
    bool    ok = true;
    for (int b = 0; b < 256 && ok; b++) {
        uint8_t u[4];
        ok = strlist_add(&vocab, (const char *)u, (size_t)km_utf8_encode(km_byte_to_cp((uint8_t)b), u));
    }
    ok = ok && train(n_vocab - 258, &vocab, &merges);
    int64_t learned = vocab.n - 256;
    out->bos = (int32_t)vocab.n;
    out->eos = (int32_t)vocab.n + 1;
    ok = ok && strlist_add(&vocab, "<|begin_of_text|>", 17) && strlist_add(&vocab, "<|end_of_text|>", 15);
    char name[48];
    for (int64_t r = 0; ok && vocab.n < n_vocab; r++)
        ok = strlist_add(&vocab, name, (size_t)snprintf(name, sizeof name, "<|reserved_%lld|>", (long long)r));
    out->tokens = ok ? malloc((size_t)n_vocab * sizeof *out->tokens) : NULL;
    out->types = ok ? malloc((size_t)n_vocab * sizeof *out->types) : NULL;
    out->merges = ok ? malloc(((size_t)merges.n + 1) * sizeof *out->merges) : NULL;
    /* one blob: the tokens, then the merges */
    out->blob = ok ? malloc(vocab.str.len + merges.str.len + 1) : NULL;
    if (!out->tokens || !out->types || !out->merges || !out->blob) {
        strlist_free(&vocab);
        strlist_free(&merges);
        km_synth_free(out);
        return kb_oom();
    }
    memcpy(out->blob, vocab.str.s, vocab.str.len);
    if (merges.str.len) memcpy(out->blob + vocab.str.len, merges.str.s, merges.str.len);
    for (int64_t i = 0; i < n_vocab; i++) {
        out->tokens[i] = out->blob + vocab.off[i];
        out->types[i] = i < out->bos ? KILN_TOKEN_NORMAL : KILN_TOKEN_CONTROL;
    }
    for (int64_t i = 0; i < merges.n; i++) out->merges[i] = out->blob + vocab.str.len + merges.off[i];
    out->n_tokens = n_vocab;
    out->n_merges = merges.n;
    out->n_learned = learned;
    strlist_free(&vocab);
    strlist_free(&merges);
    return NULL;
}

kiln_status kiln_tokenizer_write_synthetic(kiln_gguf_writer *w, int64_t n_vocab) {
    if (!w) return kb_error(KILN_ERR_INVALID, "kiln_tokenizer_write_synthetic: the writer is NULL");
    km_synth    s;
    kiln_status st = km_synth_make(n_vocab, &s);
    if (st) return st;
    kiln_gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
    kiln_gguf_set_str(w, "tokenizer.ggml.pre", "llama-bpe");
    kiln_gguf_set_arr_str(w, "tokenizer.ggml.tokens", (uint64_t)s.n_tokens, s.tokens);
    kiln_gguf_set_arr(w, "tokenizer.ggml.token_type", KILN_GGUF_I32, (uint64_t)s.n_tokens, s.types);
    kiln_gguf_set_arr_str(w, "tokenizer.ggml.merges", (uint64_t)s.n_merges, s.merges);
    kiln_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)s.bos);
    kiln_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)s.eos);
    kiln_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    km_synth_free(&s);
    return NULL;
}

/* ---- SentencePiece ---------------------------------------------------------------------------- */

#define SPACE_MARK "\xE2\x96\x81" /* U+2581 */

/* The id of character c (len bytes) in chars, added when new. */
static int32_t char_id(strlist *chars, const char *c, size_t len, bool *ok) {
    for (int64_t i = 0; i < chars->n; i++) /* about 70 characters: a scan will do */
        if (strlen(strlist_get(chars, i)) == len && memcmp(strlist_get(chars, i), c, len) == 0) return (int32_t)i;
    *ok = *ok && strlist_add(chars, c, len);
    return (int32_t)chars->n - 1;
}

/* The text as SentencePiece trains on it: a space before it, each word its characters with
 * U+2581 for the space before it; a newline ends a word and is no character (it takes the byte
 * token <0x0A>). chars gets the characters in the order they first come. */
static bool split_words_spm(const char *text, words *w, strlist *chars) {
    size_t   len = strlen(text);
    int32_t *ids = malloc((len + 1) * sizeof *ids);
    w->seq = malloc((len + 1) * sizeof *w->seq);
    w->start = malloc((len + 1) * sizeof *w->start);
    w->len = malloc((len + 1) * sizeof *w->len);
    w->count = malloc((len + 1) * sizeof *w->count);
    bool   ok = ids && w->seq && w->start && w->len && w->count;
    size_t m = 0;
    if (ok) ids[m++] = char_id(chars, SPACE_MARK, 3, &ok);
    for (size_t i = 0; ok && i <= len; i++) {
        char c = text[i];
        if (c == ' ' || c == '\n' || c == 0) {
            if (m) add_word(w, ids, m);
            m = 0;
            if (c == ' ') ids[m++] = char_id(chars, SPACE_MARK, 3, &ok);
            continue;
        }
        size_t cl = (uint8_t)c < 0xC0 ? 1 : (uint8_t)c < 0xE0 ? 2 : (uint8_t)c < 0xF0 ? 3 : 4;
        ids[m++] = char_id(chars, text + i, cl, &ok);
        i += cl - 1;
    }
    free(ids);
    return ok;
}

/* Copies the strings of lists into out->blob and points out->tokens at them. */
static bool spm_tokens(const strlist *special, const strlist *vocab, int64_t n_chars, km_synth *out) {
    size_t total = special->str.len + vocab->str.len;
    out->blob = malloc(total + 1);
    if (!out->blob) return false;
    memcpy(out->blob, special->str.s, special->str.len);
    memcpy(out->blob + special->str.len, vocab->str.s, vocab->str.len);
    int64_t k = 0, n_learned = vocab->n - n_chars;
    for (int64_t i = 0; i < 259; i++) out->tokens[k++] = out->blob + special->off[i];
    for (int64_t i = 0; i < vocab->n; i++) { /* the learned pieces, then the characters, as Llama 2 */
        int64_t j = i < n_learned ? n_chars + i : i - n_learned;
        out->scores[k] = -(float)i;
        out->tokens[k++] = out->blob + special->str.len + vocab->off[j];
    }
    for (int64_t i = 259; i < special->n; i++) out->tokens[k++] = out->blob + special->off[i];
    return true;
}

kiln_status km_synth_spm_make(int64_t n_vocab, km_synth *out) {
    if (!out) return kb_error(KILN_ERR_INVALID, "km_synth_spm_make: out is NULL");
    memset(out, 0, sizeof *out);
    strlist vocab = {0}, special = {0};
    words   w = {0};
    bool    ok = split_words_spm(km_synth_text(), &w, &vocab);
    int64_t n_chars = vocab.n, min = 259 + n_chars;
    if (ok && (n_vocab < min || n_vocab > (1 << 24))) {
        words_free(&w);
        strlist_free(&vocab);
        return kb_error(KILN_ERR_INVALID,
                        "n_vocab %lld: a synthetic SentencePiece vocabulary has %lld (<unk>, <s>, </s>, 256 bytes, %lld "
                        "characters) to 16777216 tokens", (long long)n_vocab, (long long)min, (long long)n_chars);
    }
    ok = ok && learn(&w, n_chars, n_vocab - min, &vocab, NULL);
    words_free(&w);
    /* <unk> <s> </s>, the byte tokens, then (after the pieces) <unused_N> */
    ok = ok && strlist_add(&special, "<unk>", 5) && strlist_add(&special, "<s>", 3) && strlist_add(&special, "</s>", 4);
    char name[48];
    for (int b = 0; ok && b < 256; b++) ok = strlist_add(&special, name, (size_t)snprintf(name, sizeof name, "<0x%02X>", b));
    for (int64_t r = 0; ok && special.n + vocab.n < n_vocab; r++)
        ok = strlist_add(&special, name, (size_t)snprintf(name, sizeof name, "<unused_%lld>", (long long)r));
    out->tokens = ok ? malloc((size_t)n_vocab * sizeof *out->tokens) : NULL;
    out->types = ok ? malloc((size_t)n_vocab * sizeof *out->types) : NULL;
    out->scores = ok ? calloc((size_t)n_vocab, sizeof *out->scores) : NULL;
    ok = ok && out->tokens && out->types && out->scores && spm_tokens(&special, &vocab, n_chars, out);
    if (ok) {
        for (int64_t i = 0; i < n_vocab; i++)
            out->types[i] = i == 0 ? KILN_TOKEN_UNKNOWN : i < 3 ? KILN_TOKEN_CONTROL : i < 259 ? KILN_TOKEN_BYTE
                          : i < 259 + vocab.n ? KILN_TOKEN_NORMAL : KILN_TOKEN_UNUSED;
        out->n_tokens = n_vocab;
        out->n_learned = vocab.n - n_chars;
        out->unk = 0;
        out->bos = 1;
        out->eos = 2;
    }
    strlist_free(&vocab);
    strlist_free(&special);
    if (!ok) {
        km_synth_free(out);
        return kb_oom();
    }
    return NULL;
}

kiln_status kiln_tokenizer_write_synthetic_spm(kiln_gguf_writer *w, int64_t n_vocab) {
    if (!w) return kb_error(KILN_ERR_INVALID, "kiln_tokenizer_write_synthetic_spm: the writer is NULL");
    km_synth    s;
    kiln_status st = km_synth_spm_make(n_vocab, &s);
    if (st) return st;
    kiln_gguf_set_str(w, "tokenizer.ggml.model", "llama");
    kiln_gguf_set_arr_str(w, "tokenizer.ggml.tokens", (uint64_t)s.n_tokens, s.tokens);
    kiln_gguf_set_arr(w, "tokenizer.ggml.scores", KILN_GGUF_F32, (uint64_t)s.n_tokens, s.scores);
    kiln_gguf_set_arr(w, "tokenizer.ggml.token_type", KILN_GGUF_I32, (uint64_t)s.n_tokens, s.types);
    kiln_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)s.bos);
    kiln_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)s.eos);
    kiln_gguf_set_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)s.unk);
    kiln_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    kiln_gguf_set_bool(w, "tokenizer.ggml.add_space_prefix", true);
    km_synth_free(&s);
    return NULL;
}
