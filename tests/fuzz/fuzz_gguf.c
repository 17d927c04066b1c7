/* fuzz_gguf: the GGUF reader (kiln_gguf_open_memory and every getter), the hyperparameters
 * (kiln_model_hparams_from_gguf), the model graph they give (kiln_build_model as kiln inspect
 * builds it, then the weights checked against the file's tensors), and the tokenizer
 * (kiln_tokenizer_from_gguf; fixed strings and a slice of the input tokenized and detokenized).
 * No GPU, no file. */
#include "tests/fuzz/fuzz.h"

#include <string.h>

/* Building costs time in proportion to the layers; a header may claim any number. The check of
 * hyperparameters against the tensors the file holds (issue 23) refuses most such files; this
 * bound keeps one execution fast whatever the reader accepts. */
#define FZ_MAX_LAYERS 4

/* Every key through the getter of its type, and every tensor's info: what a tool listing the
 * file would touch. */
static void walk(const kiln_gguf *g) {
    (void)kiln_gguf_version(g);
    (void)kiln_gguf_alignment(g);
    (void)kiln_gguf_data_offset(g);
    for (int64_t i = 0; i < kiln_gguf_kv_count(g) + 1; i++) {
        const char *key = kiln_gguf_kv_key(g, i);
        kiln_gguf_type t = kiln_gguf_kv_type(g, i);
        (void)kiln_gguf_type_name(t);
        if (!key) continue;
        (void)kiln_gguf_find_kv(g, key);
        int64_t iv;
        double dv;
        bool bv;
        const char *s;
        size_t len;
        fz_drop(kiln_gguf_get_int(g, key, &iv));
        fz_drop(kiln_gguf_get_float(g, key, &dv));
        fz_drop(kiln_gguf_get_bool(g, key, &bv));
        fz_drop(kiln_gguf_get_str(g, key, &s, &len));
        kiln_gguf_type elem;
        uint64_t n = 0;
        const void *arr;
        kiln_status st = kiln_gguf_get_arr(g, key, &elem, &n, &arr);
        if (!st && elem == KILN_GGUF_STRING) {
            /* first, last and one past the end */
            uint64_t idx[3] = {0, n ? n - 1 : 0, n};
            for (int k = 0; k < 3; k++) fz_drop(kiln_gguf_get_arr_str(g, key, idx[k], &s, &len));
        }
        fz_drop(st);
    }
    for (int64_t i = 0; i < kiln_gguf_tensor_count(g) + 1; i++) {
        kiln_gguf_tensor t;
        kiln_status st = kiln_gguf_tensor_info(g, i, &t);
        if (!st && t.name) (void)kiln_gguf_find_tensor(g, t.name);
        fz_drop(st);
    }
}

static void tokens(const kiln_gguf *g, const uint8_t *data, size_t size) {
    kiln_tokenizer *tk = NULL;
    kiln_status st = kiln_tokenizer_from_gguf(g, &tk);
    if (st) {
        fz_drop(st);
        return;
    }
    static const char *const fixed[] = {"", "Hello, world!", " \t\n  x  ", "<|begin_of_text|>a<|eot_id|>",
                                        "123456 can't I'm", "\xff\xfe\xc3(\xe2\x82", "日本語 ünïcödé 🙂",
                                        "\xff  <s></s><unk> a", "\xe2\x96\x81 \xf0"};
    size_t nfixed = sizeof fixed / sizeof fixed[0];
    size_t slice = size < 256 ? size : 256; /* the input's tail: bytes of every kind */
    for (size_t i = 0; i <= nfixed; i++) {
        const char *text = i < nfixed ? fixed[i] : (const char *)data + size - slice;
        size_t len = i < nfixed ? strlen(fixed[i]) : slice;
        int32_t *ids = NULL;
        int64_t n = 0;
        char *back = NULL;
        size_t blen;
        st = kiln_tokenize(tk, text, len, &ids, &n);
        if (!st) st = kiln_detokenize(tk, ids, n, &back, &blen);
        fz_drop(st);
        free(back);
        free(ids);
    }
    /* ids straight from the input, out of range ones included */
    int32_t raw[16];
    int64_t n = (int64_t)(slice / 4 < 16 ? slice / 4 : 16);
    memcpy(raw, data + size - slice, (size_t)n * 4);
    char *back = NULL;
    fz_drop(kiln_detokenize(tk, raw, n, &back, NULL));
    free(back);
    (void)kiln_tokenizer_n_vocab(tk);
    (void)kiln_tokenizer_bos(tk);
    (void)kiln_tokenizer_eos(tk);
    kiln_tokenizer_free(tk);
}

/* The graph kiln inspect builds from the hyperparameters (small context: the shapes, not the
 * sizes, are what varies), then the weights against the file as kiln run checks them. g is
 * taken over. */
static void model(kiln_gguf *g) {
    kiln_model_hparams hp;
    kiln_status st = kiln_model_hparams_from_gguf(g, &hp);
    if (st) {
        fz_drop(st);
        kiln_gguf_close(g);
        return;
    }
    kiln_ctx *ctx = kiln_ctx_new();
    kiln_graph *graph = NULL;
    kiln_model *m = NULL;
    kiln_build_opts o = {.n_ctx = 64, .n_tokens_max = 8, .argmax = true};
    if (hp.n_layer > FZ_MAX_LAYERS || !ctx) {
        kiln_gguf_close(g);
    } else {
        st = kiln_build_model(ctx, &hp, &o);
        if (!st) st = kiln_graph_new(ctx, &graph);
        if (!st) st = kiln_model_from_gguf(g, &m); /* closes g on error */
        else kiln_gguf_close(g);
        if (!st) st = kiln_model_check_weights(m, graph);
        fz_drop(st);
        /* The graph with the file's own types (a quantized file's mix may not be kiln's). */
        kiln_ctx   *fctx = m ? kiln_ctx_new() : NULL;
        kiln_graph *fgraph = NULL;
        if (fctx) {
            st = kiln_model_build(fctx, m, &o);
            if (!st) st = kiln_graph_new(fctx, &fgraph);
            if (!st) st = kiln_model_check_weights(m, fgraph);
            fz_drop(st);
        }
        kiln_graph_free(fgraph);
        kiln_ctx_free(fctx);
    }
    kiln_model_close(m);
    kiln_graph_free(graph);
    kiln_ctx_free(ctx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_gguf *g = NULL;
    kiln_status st = kiln_gguf_open_memory(data, size, "fuzz.gguf", &g);
    if (st) {
        (void)kiln_status_msg(st);
        fz_drop(st);
        return 0;
    }
    walk(g);
    tokens(g, data, size);
    model(g);
    return 0;
}
