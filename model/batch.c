/* kiln_batch: several sequences through one program and one KV cache (kiln.h; issue 28). The
 * program is kiln_gen's with every row's logits kept (km_gen_new_rows); what this file adds is
 * the cache on the host side: sequence s owns the cells s * cap .. s * cap + cap - 1 (cap =
 * n_ctx / n_seq, llama.cpp's default of a KV stream per sequence), its token at position p in
 * cell s * cap + p, so that a token sees an interval of cells: its own sequence's up to its
 * position (and, in sliding-window layers, within the window). The masks are those intervals
 * (km_gen_inputs: 2 numbers a token), and attention reads each token's own cells only: with a
 * unified cache and f16 masks every token scanned every sequence's cells, which made 64
 * sequences of 640 tokens take 29 of a step's 40 ms in attention (H100, Llama-3-8B). */
#include "base/base.h"
#include "model/arch.h"

#include <stdlib.h>
#include <string.h>

struct kiln_batch {
    kiln_gen                 *g;
    const kiln_model_hparams *hp;
    int64_t                   n_ctx, n_batch, cap; /* cap: cells a sequence */
    int                       n_seq;
    int64_t                  *seq_pos; /* -1: closed */
    int64_t                   tokens, steps;
    double                    step_ms;
};

static kiln_status too_few_cells(int64_t n_ctx, int n_seq) {
    return kb_error(KILN_ERR_INVALID, "kiln_batch_new: n_ctx %lld cells for %d sequences: each needs one at least",
                    (long long)n_ctx, n_seq);
}

kiln_status kiln_batch_new(const kiln_model *m, const kiln_batch_opts *o, kiln_batch **out) {
    if (out) *out = NULL;
    if (!m || !out) return kb_error(KILN_ERR_INVALID, "kiln_batch_new: NULL argument");
    kiln_batch_opts d = {0};
    if (!o) o = &d;
    if (o->n_seq < 0 || o->n_seq > 4096)
        return kb_error(KILN_ERR_INVALID, "kiln_batch_new: n_seq %d is out of range (1 .. 4096)", o->n_seq);
    kiln_batch *b = calloc(1, sizeof *b);
    if (!b) return kb_oom();
    b->hp = kiln_model_get_hparams(m);
    b->n_seq = o->n_seq ? o->n_seq : 16;
    if (o->n_ctx > 0 && o->n_ctx < b->n_seq) { /* before compiling anything */
        int n_seq = b->n_seq;
        free(b);
        return too_few_cells(o->n_ctx, n_seq);
    }
    kiln_gen_opts go = {.n_ctx = o->n_ctx, .n_batch = o->n_batch, .cpu = o->cpu, .compile = o->compile,
                        .session = o->session, .n_small = o->n_small, .tp = o->tp,
                        .pp = o->pp};
    kiln_status st = km_gen_new_rows(m, &go, &b->g);
    if (!st) {
        b->n_ctx = kiln_gen_n_ctx(b->g);
        b->cap = b->n_ctx / b->n_seq;
        b->n_batch = km_gen_rows_inputs(b->g).n_batch;
        b->seq_pos = malloc(sizeof *b->seq_pos * (size_t)b->n_seq);
        if (!b->seq_pos) st = kb_oom();
        else if (b->cap < 1) st = too_few_cells(b->n_ctx, b->n_seq); /* the default n_ctx */
    }
    if (st) {
        kiln_batch_free(b);
        return st;
    }
    for (int s = 0; s < b->n_seq; s++) b->seq_pos[s] = -1;
    *out = b;
    return NULL;
}

void kiln_batch_free(kiln_batch *b) {
    if (!b) return;
    kiln_gen_free(b->g);
    free(b->seq_pos);
    free(b);
}

kiln_status kiln_batch_seq_open(kiln_batch *b, int *seq) {
    if (!b || !seq) return kb_error(KILN_ERR_INVALID, "kiln_batch_seq_open: NULL argument");
    for (int s = 0; s < b->n_seq; s++)
        if (b->seq_pos[s] < 0) {
            b->seq_pos[s] = 0;
            *seq = s;
            return NULL;
        }
    return kb_error(KILN_ERR_INVALID, "kiln_batch_seq_open: all %d sequences are open (n_seq)", b->n_seq);
}

void kiln_batch_seq_close(kiln_batch *b, int seq) {
    if (!b || seq < 0 || seq >= b->n_seq) return;
    b->seq_pos[seq] = -1;
}

int64_t kiln_batch_seq_pos(const kiln_batch *b, int seq) {
    return b && seq >= 0 && seq < b->n_seq && b->seq_pos[seq] > 0 ? b->seq_pos[seq] : 0;
}

int64_t kiln_batch_n_batch(const kiln_batch *b) { return b ? b->n_batch : 0; }
int64_t kiln_batch_seq_cells(const kiln_batch *b) { return b ? b->cap : 0; }

int64_t kiln_batch_free_cells(const kiln_batch *b) {
    int64_t n = 0;
    for (int s = 0; b && s < b->n_seq; s++) n += b->cap - (b->seq_pos[s] > 0 ? b->seq_pos[s] : 0);
    return n;
}

/* The items checked: open sequences, each once, tokens in the vocabulary, n_batch and each
 * sequence's cells enough. *nt gets the step's tokens. */
static kiln_status check_items(const kiln_batch *b, const kiln_batch_item *items, int n, int64_t *nt) {
    *nt = 0;
    for (int i = 0; i < n; i++) {
        const kiln_batch_item *it = &items[i];
        if (it->seq < 0 || it->seq >= b->n_seq || b->seq_pos[it->seq] < 0)
            return kb_error(KILN_ERR_INVALID, "kiln_batch_step: item %d: sequence %d is not open", i, it->seq);
        for (int j = 0; j < i; j++)
            if (items[j].seq == it->seq)
                return kb_error(KILN_ERR_INVALID, "kiln_batch_step: items %d and %d are both sequence %d (one item "
                                                  "a sequence: put its tokens together)", j, i, it->seq);
        if (it->n < 1 || !it->tokens) return kb_error(KILN_ERR_INVALID, "kiln_batch_step: item %d has no tokens", i);
        for (int64_t t = 0; t < it->n; t++)
            if (it->tokens[t] < 0 || it->tokens[t] >= b->hp->n_vocab)
                return kb_error(KILN_ERR_INVALID, "kiln_batch_step: item %d: token %lld is %d, outside the vocabulary "
                                                  "0 .. %lld", i, (long long)t, it->tokens[t],
                                (long long)b->hp->n_vocab - 1);
        if (b->seq_pos[it->seq] + it->n > b->cap)
            return kb_error(KILN_ERR_INVALID, "kiln_batch_step: item %d: sequence %d holds %lld tokens; %lld more "
                                              "pass its %lld cells (n_ctx / n_seq)", i, it->seq,
                            (long long)b->seq_pos[it->seq], (long long)it->n, (long long)b->cap);
        *nt += it->n;
    }
    if (*nt > b->n_batch)
        return kb_error(KILN_ERR_INVALID, "kiln_batch_step: %lld tokens; a step takes %lld at most (n_batch)",
                        (long long)*nt, (long long)b->n_batch);
    return NULL;
}

/* A step: logits[i] the rows after each item, or (picks non-NULL) only their argmax. */
static kiln_status step(kiln_batch *b, const kiln_batch_item *items, int n, const float **logits, int32_t *picks) {
    if (!b || !items || (!logits && !picks) || n < 1) return kb_error(KILN_ERR_INVALID, "kiln_batch_step: no items");
    int64_t     nt;
    kiln_status st = check_items(b, items, n, &nt);
    if (st) return st;
    double        t0 = kb_now_ms();
    km_gen_inputs in = km_gen_rows_inputs(b->g);
    /* cells: the sequence's, by position; keys: its cells up to the token (and the window) */
    int64_t t = 0, nkv = 0;
    for (int i = 0; i < n; i++) {
        int64_t base = items[i].seq * b->cap;
        for (int64_t k = 0; k < items[i].n; k++, t++) {
            int64_t p = b->seq_pos[items[i].seq] + k;
            in.tokens[t] = items[i].tokens[k];
            in.positions[t] = (int32_t)p;
            in.slots[t] = base + p;
            km_key_interval(in.iv + 2 * t, base, p, 0);
            if (in.iv_swa) km_key_interval(in.iv_swa + 2 * t, base, p, b->hp->n_swa);
        }
        if (base + b->seq_pos[items[i].seq] + items[i].n > nkv) nkv = base + b->seq_pos[items[i].seq] + items[i].n;
    }
    /* output rows: each item's last token first, the only rows read back (a prompt chunk's other
     * rows after them: n rows of logits cross the bus, not nt) */
    int64_t r = n;
    t = 0;
    for (int i = 0; i < n; i++) {
        for (int64_t k = 0; k + 1 < items[i].n; k++) in.out_ids[r++] = (int32_t)(t + k);
        t += items[i].n;
        in.out_ids[i] = (int32_t)(t - 1);
    }
    const float   *lg = NULL;
    const int32_t *pk = NULL;
    st = km_gen_rows_run(b->g, nt, nkv, n, picks ? NULL : &lg, picks ? &pk : NULL);
    if (st) return st; /* nothing changed: positions move only after a run */
    for (int i = 0; i < n; i++) {
        b->seq_pos[items[i].seq] += items[i].n;
        if (picks) picks[i] = pk[i];
        else logits[i] = lg + i * b->hp->n_vocab;
    }
    b->tokens += nt;
    b->steps++;
    b->step_ms += kb_now_ms() - t0;
    return NULL;
}

kiln_status kiln_batch_step(kiln_batch *b, const kiln_batch_item *items, int n, const float **logits) {
    return logits ? step(b, items, n, logits, NULL) : kb_error(KILN_ERR_INVALID, "kiln_batch_step: NULL logits");
}

kiln_status kiln_batch_step_greedy(kiln_batch *b, const kiln_batch_item *items, int n, int32_t *picks) {
    return picks ? step(b, items, n, NULL, picks) : kb_error(KILN_ERR_INVALID, "kiln_batch_step_greedy: NULL picks");
}

void kiln_batch_get_stats(const kiln_batch *b, kiln_gen_stats *out) {
    if (!b || !out) return;
    kiln_gen_get_stats(b->g, out);
    out->decode_tokens = b->tokens;
    out->decode_ms = b->step_ms;
}
