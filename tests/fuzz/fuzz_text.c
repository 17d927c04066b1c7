/* fuzz_text: the text side of generation (issue 26) on arbitrary bytes. The first byte picks a
 * pre-tokenizer (every pattern kiln has, and SentencePiece), a chat template and sampler
 * settings; the rest is text: tokenized and detokenized; taken as a GGUF's chat template and
 * detected; split into messages rendered and rendered as a delta by the picked template; and
 * read as logits for kiln_sample. No GPU, no file. */
#include "tests/fuzz/fuzz.h"

#include "model/tokenizer.h"

#include <string.h>

/* The synthetic vocabularies (made once): byte-level BPE of 1024 tokens under every
 * pre-tokenizer pattern, and SentencePiece. */
#define FZ_MAX_TOK 64
static kiln_tokenizer *g_tok[FZ_MAX_TOK];
static int             g_ntok;

static void make_tokenizers(void) {
    km_synth bpe, spm;
    if (km_synth_make(1024, &bpe) || km_synth_spm_make(1024, &spm)) abort(); /* a bug of the target */
    for (int i = 0; i < KM_PRE_COUNT && g_ntok < FZ_MAX_TOK - 1; i++) {
        kiln_tokenizer_spec spec = {.n_tokens = bpe.n_tokens, .tokens = bpe.tokens, .types = bpe.types,
                                    .n_merges = bpe.n_merges, .merges = bpe.merges, .pre = km_pre_name((km_pre)i),
                                    .bos = bpe.bos, .eos = bpe.eos, .add_bos = i % 2 == 0};
        if (kiln_tokenizer_new(&spec, &g_tok[g_ntok])) abort();
        g_ntok++;
    }
    kiln_tokenizer_spec s = {.n_tokens = spm.n_tokens, .tokens = spm.tokens, .types = spm.types, .model = "llama",
                             .scores = spm.scores, .bos = spm.bos, .eos = spm.eos, .unk = spm.unk, .add_bos = true,
                             .add_space_prefix = true};
    if (kiln_tokenizer_new(&s, &g_tok[g_ntok])) abort();
    g_ntok++;
    km_synth_free(&bpe);
    km_synth_free(&spm);
}

static void tokenize(const kiln_tokenizer *t, const char *text, size_t len) {
    int32_t *ids = NULL;
    int64_t  n = 0;
    kiln_status st = kiln_tokenize(t, text, len, &ids, &n);
    if (!st) {
        char  *back = NULL;
        size_t bl = 0;
        fz_drop(kiln_detokenize(t, ids, n, &back, &bl));
        free(back);
        int32_t *eog = NULL;
        int64_t  ne = 0;
        fz_drop(kiln_tokenizer_eog(t, NULL, &eog, &ne));
        free(eog);
    }
    fz_drop(st);
    free(ids);
}

/* The text as up to 6 messages (split at 0x1e bytes), roles cycling system, user, assistant. */
static void chat(int which, const char *text, size_t len) {
    static const char *const roles[] = {"system", "user", "assistant", "user"};
    kiln_chat_msg m[6];
    char         *parts = malloc(len + 1);
    if (!parts) return;
    memcpy(parts, text, len);
    parts[len] = 0;
    size_t n = 0;
    for (char *p = parts; n < 6;) {
        char *e = strchr(p, 0x1e);
        if (e) *e = 0;
        m[n] = (kiln_chat_msg){roles[n % 4], p};
        n++;
        if (!e) break;
        p = e + 1;
    }
    const char *name = kiln_chat_template_name(which % kiln_chat_template_count());
    for (int gen = 0; gen < 2; gen++) {
        char *out = NULL;
        fz_drop(kiln_chat_apply(name, m, n, gen, &out));
        free(out);
        out = NULL;
        fz_drop(kiln_chat_apply_delta(name, m, n, gen, &out));
        free(out);
    }
    const char *found;
    fz_drop(kiln_chat_template_detect(parts, &found));
    fz_drop(kiln_chat_template_by_name(parts));
    free(parts);
}

/* The bytes as floats (NaN and infinities included) and the sampler's settings from sel. */
static void sample(uint8_t sel, const uint8_t *data, size_t size) {
    int64_t n = (int64_t)(size / 4);
    if (n < 1) return;
    float *logits = malloc(sizeof *logits * (size_t)n);
    if (!logits) return;
    memcpy(logits, data, sizeof *logits * (size_t)n);
    kiln_sampler_params p = kiln_sampler_params_default();
    p.seed = sel;
    p.temp = (sel & 3) == 0 ? 0.0f : 0.3f * (float)(sel & 3);
    p.top_k = (sel >> 2) & 7 ? (sel >> 2) & 7 : -1;
    p.top_p = sel & 32 ? 0.5f : 1.0f;
    p.min_p = sel & 64 ? 0.2f : 0.0f;
    p.repeat_penalty = sel & 128 ? 1.3f : 1.0f;
    int32_t hist[4] = {0, (int32_t)(n - 1), 0, (int32_t)(n / 2)}, out;
    if (!kiln_sampler_check(&p)) fz_drop(kiln_sample(&p, logits, n, hist, 4, (int64_t)sel * 977, &out));
    free(logits);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_ntok) make_tokenizers();
    if (size < 1) return 0;
    uint8_t     sel = data[0];
    const char *text = (const char *)data + 1;
    size_t      len = size - 1;
    tokenize(g_tok[sel % g_ntok], text, len);
    chat(sel, text, len);
    sample(sel, data + 1, len);
    return 0;
}
