/* kiln_batch: several sequences through one program and one KV cache (kiln.h; issue 28). The
 * program is kiln_gen's with every row's logits kept (km_gen_new_rows); what this file adds is
 * llama.cpp's unified cache on the host side: each cell's sequence and position, the lowest
 * free cells taken by a step's tokens, and the mask that lets a token see only its own
 * sequence's cells up to its position (and, in sliding-window layers, within the window). */
#include "base/base.h"
#include "model/arch.h"

#include <stdlib.h>
#include <string.h>

#define F16_NEG_INF 0xfc00u

struct kiln_batch {
    kiln_gen                 *g;
    const kiln_model_hparams *hp;
    int64_t                   n_ctx, n_batch, used; /* used: cells 0 .. used-1 may hold tokens */
    int                       n_seq;
    int                      *cell_seq; /* -1: free */
    int32_t                  *cell_pos;
    int64_t                  *seq_pos;  /* -1: closed */
    int64_t                   tokens, steps;
    double                    step_ms;
    int64_t                  *list_start, *list_fill, *list_cells; /* a step's cells by sequence (make_masks) */
    int                      *item_of;
};

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
    kiln_gen_opts go = {.n_ctx = o->n_ctx, .n_batch = o->n_batch, .cpu = o->cpu, .compile = o->compile,
                        .session = o->session};
    kiln_status st = km_gen_new_rows(m, &go, &b->g);
    if (!st) {
        b->n_ctx = kiln_gen_n_ctx(b->g);
        b->n_batch = km_gen_rows_inputs(b->g).n_batch;
        b->cell_seq = malloc(sizeof *b->cell_seq * (size_t)b->n_ctx);
        b->cell_pos = malloc(sizeof *b->cell_pos * (size_t)b->n_ctx);
        b->seq_pos = malloc(sizeof *b->seq_pos * (size_t)b->n_seq);
        b->list_start = malloc(sizeof *b->list_start * (size_t)(b->n_seq + 1));
        b->list_cells = malloc(sizeof *b->list_cells * (size_t)b->n_ctx);
        b->list_fill = malloc(sizeof *b->list_fill * (size_t)b->n_seq);
        b->item_of = malloc(sizeof *b->item_of * (size_t)b->n_seq);
        if (!b->cell_seq || !b->cell_pos || !b->seq_pos || !b->list_start || !b->list_cells || !b->list_fill ||
            !b->item_of)
            st = kb_oom();
    }
    if (st) {
        kiln_batch_free(b);
        return st;
    }
    for (int64_t c = 0; c < b->n_ctx; c++) b->cell_seq[c] = -1;
    for (int s = 0; s < b->n_seq; s++) b->seq_pos[s] = -1;
    *out = b;
    return NULL;
}

void kiln_batch_free(kiln_batch *b) {
    if (!b) return;
    kiln_gen_free(b->g);
    free(b->cell_seq);
    free(b->cell_pos);
    free(b->seq_pos);
    free(b->list_start);
    free(b->list_cells);
    free(b->list_fill);
    free(b->item_of);
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
    if (!b || seq < 0 || seq >= b->n_seq || b->seq_pos[seq] < 0) return;
    for (int64_t c = 0; c < b->used; c++)
        if (b->cell_seq[c] == seq) b->cell_seq[c] = -1;
    while (b->used > 0 && b->cell_seq[b->used - 1] < 0) b->used--; /* n_kv shrinks with the cache */
    b->seq_pos[seq] = -1;
}

int64_t kiln_batch_seq_pos(const kiln_batch *b, int seq) {
    return b && seq >= 0 && seq < b->n_seq && b->seq_pos[seq] > 0 ? b->seq_pos[seq] : 0;
}

int64_t kiln_batch_n_batch(const kiln_batch *b) { return b ? b->n_batch : 0; }

int64_t kiln_batch_free_cells(const kiln_batch *b) {
    int64_t n = 0;
    for (int64_t c = 0; b && c < b->n_ctx; c++) n += b->cell_seq[c] < 0;
    return n;
}

/* The items checked: open sequences, each once, tokens in the vocabulary, n_batch and the free
 * cells enough. *nt gets the step's tokens. */
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
        *nt += it->n;
    }
    if (*nt > b->n_batch)
        return kb_error(KILN_ERR_INVALID, "kiln_batch_step: %lld tokens; a step takes %lld at most (n_batch)",
                        (long long)*nt, (long long)b->n_batch);
    if (*nt > kiln_batch_free_cells(b))
        return kb_error(KILN_ERR_INVALID, "kiln_batch_step: %lld tokens, %lld free cells of %lld (n_ctx): close a "
                                          "sequence", (long long)*nt, (long long)kiln_batch_free_cells(b),
                        (long long)b->n_ctx);
    return NULL;
}

/* The masks of a step's rows over nkv cells: a row sees its own sequence's cells up to its
 * position (and, in sliding-window layers, within the window). Each row starts all -inf and
 * opens its sequence's cells, bucketed by sequence in one pass over the cells: rows x nkv
 * stores, but compares only for a sequence's own cells (64 sequences over 41k cells: a
 * fraction of a millisecond a step instead of milliseconds). */
static void make_masks(kiln_batch *b, const kiln_batch_item *items, int n, const km_gen_inputs *in, int64_t nkv) {
    /* cells of items[i].seq: cells[start[i] .. start[i+1]), bucketed in one pass over the cells */
    int64_t *start = b->list_start, *cells = b->list_cells, *fill = b->list_fill;
    int     *item = b->item_of;
    for (int s = 0; s < b->n_seq; s++) item[s] = -1;
    for (int i = 0; i <= n; i++) start[i] = 0;
    for (int i = 0; i < n; i++) item[items[i].seq] = i;
    for (int64_t j = 0; j < nkv; j++)
        if (b->cell_seq[j] >= 0 && item[b->cell_seq[j]] >= 0) start[item[b->cell_seq[j]] + 1]++;
    for (int i = 0; i < n; i++) start[i + 1] += start[i], fill[i] = start[i];
    for (int64_t j = 0; j < nkv; j++)
        if (b->cell_seq[j] >= 0 && item[b->cell_seq[j]] >= 0) cells[fill[item[b->cell_seq[j]]]++] = j;
    int64_t t = 0;
    for (int i = 0; i < n; i++)
        for (int64_t k = 0; k < items[i].n; k++, t++) {
            int32_t   p = in->positions[t];
            uint16_t *row = in->mask + t * nkv, *sw = in->mask_swa ? in->mask_swa + t * nkv : NULL;
            for (int64_t j = 0; j < nkv; j++) row[j] = F16_NEG_INF;
            if (sw)
                for (int64_t j = 0; j < nkv; j++) sw[j] = F16_NEG_INF;
            for (int64_t c = start[i]; c < start[i + 1]; c++) {
                int64_t j = cells[c];
                if (b->cell_pos[j] > p) continue;
                row[j] = 0;
                if (sw && p - b->cell_pos[j] < b->hp->n_swa) sw[j] = 0;
            }
        }
}

/* A step: logits[i] the rows after each item, or (picks non-NULL) only their argmax. */
static kiln_status step(kiln_batch *b, const kiln_batch_item *items, int n, const float **logits, int32_t *picks) {
    if (!b || !items || (!logits && !picks) || n < 1) return kb_error(KILN_ERR_INVALID, "kiln_batch_step: no items");
    int64_t     nt;
    kiln_status st = check_items(b, items, n, &nt);
    if (st) return st;
    double        t0 = kb_now_ms();
    km_gen_inputs in = km_gen_rows_inputs(b->g);
    /* cells: the lowest free ones, in token order (taken back if the run fails) */
    int64_t t = 0, c = 0, used = b->used;
    for (int i = 0; i < n; i++)
        for (int64_t k = 0; k < items[i].n; k++, t++) {
            while (b->cell_seq[c] >= 0) c++;
            b->cell_seq[c] = items[i].seq;
            b->cell_pos[c] = (int32_t)(b->seq_pos[items[i].seq] + k);
            in.tokens[t] = items[i].tokens[k];
            in.positions[t] = b->cell_pos[c];
            in.slots[t] = c;
            if (c + 1 > b->used) b->used = c + 1;
        }
    int64_t nkv = b->used;
    make_masks(b, items, n, &in, nkv);
    const float   *lg = NULL;
    const int32_t *pk = NULL;
    st = km_gen_rows_run(b->g, nt, nkv, picks ? NULL : &lg, picks ? &pk : NULL);
    if (st) { /* the cells go back: nothing changed */
        for (int64_t u = 0; u < nt; u++) b->cell_seq[in.slots[u]] = -1;
        b->used = used;
        return st;
    }
    t = 0;
    for (int i = 0; i < n; i++) {
        t += items[i].n;
        b->seq_pos[items[i].seq] += items[i].n;
        if (picks) picks[i] = pk[t - 1];
        else logits[i] = lg + (t - 1) * b->hp->n_vocab;
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
