/* kiln_session_load_weights: every weight of a program uploaded in one streaming pass.
 *
 * A model's weights are gigabytes in a mapped file. Copying from pageable memory makes the
 * driver stage through its own small buffer, one synchronous copy per call; instead the data is
 * copied (on several threads, which also spreads the page faults of a cold mapping) into one of
 * two pinned blocks, and the block goes to the device with an async copy while the other block
 * is being filled. An event per block says when it may be refilled. */
#include "runtime/session_int.h"

#include <stdlib.h>
#include <string.h>

#define STAGE_BYTES ((size_t)64 << 20)
#define COPY_PIECES 8 /* threads share a block in pieces of STAGE_BYTES / COPY_PIECES */

typedef struct {
    const rt_cuda_api *cu;
    void              *host[2];
    rt_cuevent         ready[2]; /* recorded after the block's copy to the device */
    bool               used[2];
} stage;

typedef struct {
    uint8_t       *dst;
    const uint8_t *src;
    size_t         n;
} copy_job;

static void copy_piece(void *user, int item, int worker) {
    (void)worker;
    const copy_job *j = user;
    size_t piece = (j->n + COPY_PIECES - 1) / COPY_PIECES;
    size_t at = (size_t)item * piece;
    if (at >= j->n) return;
    memcpy(j->dst + at, j->src + at, j->n - at < piece ? j->n - at : piece);
}

static void stage_free(stage *st) {
    for (int k = 0; k < 2; k++) {
        if (st->ready[k]) st->cu->EventDestroy(st->ready[k]);
        if (st->host[k]) st->cu->MemFreeHost(st->host[k]);
    }
}

static kiln_status stage_init(stage *st, const rt_cuda_api *cu) {
    memset(st, 0, sizeof *st);
    st->cu = cu;
    for (int k = 0; k < 2; k++) {
        rt_cures r = cu->MemAllocHost(&st->host[k], STAGE_BYTES);
        if (r == RT_CUDA_SUCCESS) r = cu->EventCreate(&st->ready[k], RT_CU_EVENT_DEFAULT);
        if (r != RT_CUDA_SUCCESS) {
            stage_free(st);
            return rt_cuda_error(r, "cuMemAllocHost", "allocating %zu MB of pinned staging memory for the weights",
                                 STAGE_BYTES >> 20);
        }
    }
    return NULL;
}

/* Sends n bytes of src to dst through staging block k. */
static kiln_status send_block(kiln_session *s, stage *st, int k, rt_cuptr dst, const uint8_t *src, size_t n,
                              int jobs, const char *name) {
    const rt_cuda_api *cu = s->cu;
    rt_cures r = RT_CUDA_SUCCESS;
    if (st->used[k] && (r = cu->EventSynchronize(st->ready[k])) != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuEventSynchronize", "waiting for a staging block while uploading '%s'", name);
    copy_job j = {st->host[k], src, n};
    kb_parallel_for(COPY_PIECES, jobs, copy_piece, &j);
    if ((r = cu->MemcpyHtoDAsync(dst, st->host[k], n, s->stream)) != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuMemcpyHtoDAsync", "uploading %zu bytes of weight '%s'", n, name);
    if ((r = cu->EventRecord(st->ready[k], s->stream)) != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuEventRecord", "uploading weight '%s'", name);
    st->used[k] = true;
    return NULL;
}

static uint64_t weight_bytes(const kiln_session *s) {
    uint64_t total = 0;
    for (int i = 0; i < s->nbufs; i++)
        if (s->bufs[i].kind == IR_BUF_WEIGHT) total += s->bufs[i].bytes;
    return total;
}

kiln_status kiln_session_load_weights(kiln_session *s, kiln_weight_fn get, void *user,
                                      void (*progress)(void *user, uint64_t done, uint64_t total),
                                      void *progress_user) {
    static const char fn[] = "kiln_session_load_weights";
    if (!s || !get) return kb_error(KILN_ERR_INVALID, "%s: %s is NULL", fn, s ? "get" : "session");
    if (s->primary) return kb_error(KILN_ERR_INVALID, "%s: a variant session shares its primary's weights", fn);
    if (s->chain_unit) return kb_error(KILN_ERR_INVALID, "%s: a chain is open (kiln_session_chain_end first)", fn);
    kiln_status st = rt_make_current(s);
    if (st) return st;
    stage sg;
    if ((st = stage_init(&sg, s->cu))) return st;
    int      jobs = kb_default_jobs() < 8 ? kb_default_jobs() : 8;
    uint64_t total = weight_bytes(s), done = 0;
    int      k = 0;
    if (progress) progress(progress_user, 0, total);
    for (int i = 0; !st && i < s->nbufs; i++) {
        const ir_buf *b = &s->bufs[i];
        if (b->kind != IR_BUF_WEIGHT || b->bytes == 0) continue;
        const uint8_t *src = get(user, b->name, b->type, b->bytes);
        if (!src) {
            char shape[96];
            rt_describe_buf(b, shape, sizeof shape);
            st = kb_error(KILN_ERR_NOT_FOUND, "%s: no data for weight '%s' (%s, %zu bytes)", fn, b->name, shape,
                          b->bytes);
            break;
        }
        /* q8_0, q4_0 and q6_K go to the device in its layout (templates/quant.lua): converted
         * here in one piece, since a block's scale moves to the end of the buffer. */
        uint8_t *conv = NULL;
        if (kb_quant_split(b->type)) {
            if (!(conv = malloc(b->bytes))) {
                st = kb_oom();
                break;
            }
            kb_quant_to_device(b->type, src, conv, b->bytes);
            src = conv;
        }
        for (size_t at = 0; !st && at < b->bytes; at += STAGE_BYTES, k ^= 1) {
            size_t n = b->bytes - at < STAGE_BYTES ? b->bytes - at : STAGE_BYTES;
            st = send_block(s, &sg, k, s->dptr[i] + at, src + at, n, jobs, b->name);
            done += n;
            if (!st && progress) progress(progress_user, done, total);
        }
        free(conv); /* send_block copied it into pinned staging before returning */
    }
    rt_cures r = s->cu->StreamSynchronize(s->stream);
    if (!st && r != RT_CUDA_SUCCESS) st = rt_cuda_error(r, "cuStreamSynchronize", "finishing the weight upload");
    stage_free(&sg);
    return st;
}
