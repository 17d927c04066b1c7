/* End-of-generation tokens (issue 26): the ids at which generation stops, counted as llama.cpp's
 * vocabulary loader counts them (src/llama-vocab.cpp, special_eog_ids), because GGUF files mark
 * them unevenly: an instruct model's eos is often the base model's end of text, while its turns
 * end with <|eot_id|>, <|im_end|> or <end_of_turn>, found by their text. */
#include "model/tokenizer.h"

#include "base/base.h"
#include "model/gguf.h"

#include <stdlib.h>
#include <string.h>

/* Texts llama.cpp takes for end of turn, end of message and end of text. */
static const char *const EOG_TEXTS[] = {
    "<|eot_id|>",  "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",        "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>",  "_<EOT>",     "<|end_of_text|>", "<end_of_utterance>",
};

/* Fill-in-the-middle pad, repository and file-separator tokens also end generation; each is the
 * GGUF's key, else the first token with one of the texts. */
static const struct {
    const char *key;
    const char *texts[5];
} FIM[] = {
    {"tokenizer.ggml.fim_pad_token_id", {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"}},
    {"tokenizer.ggml.fim_rep_token_id", {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}},
    {"tokenizer.ggml.fim_sep_token_id", {"<|file_sep|>"}},
};

static bool text_is(const kiln_tokenizer *t, int32_t id, const char *s) {
    size_t      len;
    const char *x = km_token_text(t, id, &len);
    return x && len == strlen(s) && memcmp(x, s, len) == 0;
}

/* The first token whose text is one of texts (NULL-terminated list of at most 5), or -1. */
static int32_t find_text(const kiln_tokenizer *t, const char *const *texts, size_t n) {
    for (int32_t id = 0; id < (int32_t)kiln_tokenizer_n_vocab(t); id++)
        for (size_t k = 0; k < n && texts[k]; k++)
            if (text_is(t, id, texts[k])) return id;
    return -1;
}

static void add(int32_t *ids, int64_t *n, int32_t id) {
    if (id < 0) return;
    for (int64_t i = 0; i < *n; i++)
        if (ids[i] == id) return;
    ids[(*n)++] = id;
}

/* The GGUF's id under key (-1 when absent or without a file). */
static kiln_status key_id(const kiln_tokenizer *t, const kiln_gguf *g, const char *key, int32_t *id) {
    *id = -1;
    return g ? km_gguf_token_id(g, key, (uint64_t)kiln_tokenizer_n_vocab(t), id) : NULL;
}

kiln_status kiln_tokenizer_eog(const kiln_tokenizer *t, const kiln_gguf *g, int32_t **ids, int64_t *n) {
    if (!t || !ids || !n) return kb_error(KILN_ERR_INVALID, "kiln_tokenizer_eog: NULL argument");
    *ids = NULL;
    *n = 0;
    size_t   cap = 3 + sizeof FIM / sizeof FIM[0] + 8 * (sizeof EOG_TEXTS / sizeof EOG_TEXTS[0]);
    int32_t *v = malloc(cap * sizeof *v), end = -1;
    int64_t  m = 0;
    bool     has_return = false, has_call = false;
    if (!v) return kb_oom();
    kiln_status st = NULL;
    for (size_t f = 0; !st && f < sizeof FIM / sizeof FIM[0]; f++) {
        int32_t id;
        st = key_id(t, g, FIM[f].key, &id);
        add(v, &m, id >= 0 ? id : find_text(t, FIM[f].texts, 5));
    }
    /* Every token with an end-of-turn text (a vocabulary may hold one text twice). */
    for (int32_t id = 0; !st && id < (int32_t)kiln_tokenizer_n_vocab(t); id++)
        for (size_t k = 0; k < sizeof EOG_TEXTS / sizeof EOG_TEXTS[0]; k++)
            if (text_is(t, id, EOG_TEXTS[k]) && (size_t)m < cap) {
                add(v, &m, id);
                has_return |= k == 3, has_call |= k == 4;
                if (k == 2) end = id;
            }
    static const char *const keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                       "tokenizer.ggml.eom_token_id"};
    add(v, &m, kiln_tokenizer_eos(t));
    for (size_t k = 0; !st && k < sizeof keys / sizeof keys[0]; k++) {
        int32_t id;
        st = key_id(t, g, keys[k], &id);
        add(v, &m, id);
    }
    /* gpt-oss (o200k_harmony): <|end|> ends a message, not the generation, when <|return|> and
     * <|call|> are tokens. */
    if (has_return && has_call && end >= 0)
        for (int64_t i = 0; i < m; i++)
            if (v[i] == end) v[i] = v[--m];
    if (st) {
        free(v);
        return st;
    }
    *ids = v;
    *n = m;
    return NULL;
}
