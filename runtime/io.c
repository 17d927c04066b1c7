/* The session's I/O windows: small inputs and outputs without a driver call per buffer.
 *
 * A decode step sets a few tiny inputs (tokens, positions, cache slots, a mask row) and reads
 * back a few bytes (the argmax). Each of those as its own cuMemcpy costs microseconds of host
 * time, with the GPU idle, for every buffer of every variant: 40-110 us a token, where the
 * whole step of a 1B model is about a millisecond. So the small buffers live in two windows:
 *
 * - Inputs of at most RT_WIN_ITEM bytes: one device block with a pinned host twin.
 *   kiln_session_set writes the input's place in the twin (a memcpy); a run whose window
 *   changed since the last one starts with one async copy of the whole window to the device.
 *   The symbolic dims' values sit at its start. (A copy node inside the CUDA graph instead
 *   would cost every replay the copy, inputs changed or not: about 10 us on the H100 for a
 *   single-op program.)
 * - Outputs of at most RT_WIN_OUT_ITEM bytes that no kernel reads (an argmax, a few scalars):
 *   mapped pinned host memory that the kernels write directly over PCIe; kiln_session_get
 *   reads them after the run, with no copy. Larger outputs would make their kernels wait on
 *   PCIe writes, so they stay in device memory.
 *
 * Runs are synchronous (kiln_session_run waits for the stream), so the caller never touches a
 * window while a run uses it. */
#include "runtime/session_int.h"

#include <stdlib.h>
#include <string.h>

#define RT_WIN_ITEM ((size_t)64 << 10)    /* largest input placed in the window */
#define RT_WIN_OUT_ITEM ((size_t)1 << 10) /* largest output placed in its window */
#define RT_WIN_MAX ((size_t)1 << 20)      /* most bytes of one window */
#define RT_WIN_ALIGN ((size_t)256)        /* as cuMemAlloc aligns: kernels' vector loads rely on it */

static size_t align_up(size_t n) { return (n + RT_WIN_ALIGN - 1) / RT_WIN_ALIGN * RT_WIN_ALIGN; }

/* The window buffer b goes in, or -1. `read`: some kernel reads b. */
static int window_of(const ir_buf *b, bool read) {
    if (b->bytes == 0) return -1;
    if (b->kind == IR_BUF_INPUT && b->bytes <= RT_WIN_ITEM) return RT_WIN_IN;
    return b->kind == IR_BUF_OUTPUT && !read && b->bytes <= RT_WIN_OUT_ITEM ? RT_WIN_OUT : -1;
}

static kiln_status alloc_in(kiln_session *s) {
    size_t   n = s->win_bytes[RT_WIN_IN];
    rt_cures r = s->cu->MemAllocHost(&s->win_host[RT_WIN_IN], n);
    if (r != RT_CUDA_SUCCESS) {
        s->win_host[RT_WIN_IN] = NULL;
        return rt_cuda_error(r, "cuMemAllocHost", "allocating the %zu-byte pinned window of small inputs", n);
    }
    memset(s->win_host[RT_WIN_IN], 0, n);
    if ((r = s->cu->MemAlloc(&s->win_dev[RT_WIN_IN], n)) != RT_CUDA_SUCCESS) {
        s->win_dev[RT_WIN_IN] = 0;
        return rt_cuda_error(r, "cuMemAlloc", "allocating the %zu-byte device window of small inputs", n);
    }
    if ((r = s->cu->MemsetD8(s->win_dev[RT_WIN_IN], 0, n)) != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuMemsetD8", "clearing the device window of small inputs");
    return NULL;
}

static kiln_status alloc_out(kiln_session *s) {
    size_t   n = s->win_bytes[RT_WIN_OUT];
    void    *h = NULL;
    rt_cures r = s->cu->MemHostAlloc(&h, n, RT_CU_MEMHOSTALLOC_DEVICEMAP);
    if (r != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuMemHostAlloc", "allocating the %zu-byte mapped window of small outputs", n);
    s->win_host[RT_WIN_OUT] = h;
    memset(h, 0, n);
    if ((r = s->cu->MemHostGetDevicePointer(&s->win_dev[RT_WIN_OUT], h, 0)) != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuMemHostGetDevicePointer", "mapping the window of small outputs");
    return NULL;
}

kiln_status rt_io_setup(kiln_session *s, const ir_prog *ir) {
    bool *read = calloc((size_t)(s->nbufs ? s->nbufs : 1), sizeof *read);
    if (!read || (s->nbufs > 0 && !(s->win_off = calloc((size_t)s->nbufs, sizeof *s->win_off)))) {
        free(read);
        return kb_oom();
    }
    for (int i = 0; i < ir->nnodes; i++)
        for (int k = 0; !ir->nodes[i].dead && k < ir->nodes[i].nin; k++) read[ir->nodes[i].in[k].buf] = true;
    size_t dims = sizeof(int32_t) * KILN_MAX_SYMS;
    s->win_bytes[RT_WIN_IN] = s->ndims ? align_up(dims) : 0;
    for (int i = 0; i < s->nbufs; i++) {
        int w = window_of(&s->bufs[i], read[i]);
        if (w < 0 || s->win_bytes[w] + align_up(s->bufs[i].bytes) > RT_WIN_MAX) continue;
        s->win_off[i] = s->win_bytes[w] + 1;
        s->win_bytes[w] += align_up(s->bufs[i].bytes);
    }
    free(read);
    kiln_status st = s->win_bytes[RT_WIN_IN] ? alloc_in(s) : NULL;
    if (!st && s->win_bytes[RT_WIN_OUT]) st = alloc_out(s);
    if (st) return st;
    if (s->ndims) {
        s->dims_host = s->win_host[RT_WIN_IN];
        s->dims_dev = s->win_dev[RT_WIN_IN];
        for (int i = 0; i < s->ndims; i++) s->dims_host[i] = (int32_t)s->dim_max[i];
    }
    s->win_dirty = true;
    return NULL;
}

static int win_kind(const kiln_session *s, int i) { return s->bufs[i].kind == IR_BUF_OUTPUT ? RT_WIN_OUT : RT_WIN_IN; }

bool rt_io_placed(const kiln_session *s, int i) { return s->win_off && s->win_off[i] > 0; }

rt_cuptr rt_io_dptr(const kiln_session *s, int i) { return s->win_dev[win_kind(s, i)] + (s->win_off[i] - 1); }

static void *host_of(const kiln_session *s, int i) { return (char *)s->win_host[win_kind(s, i)] + (s->win_off[i] - 1); }

kiln_status rt_io_copy_in(kiln_session *s) {
    if (!s->win_bytes[RT_WIN_IN] || !s->win_dirty) return NULL;
    rt_cures r = s->cu->MemcpyHtoDAsync(s->win_dev[RT_WIN_IN], s->win_host[RT_WIN_IN], s->win_bytes[RT_WIN_IN], s->stream);
    if (r != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuMemcpyHtoDAsync", "copying the %zu-byte window of small inputs",
                             s->win_bytes[RT_WIN_IN]);
    s->win_dirty = false;
    return NULL;
}

void rt_io_set(kiln_session *s, int i, const void *data, size_t bytes) {
    s->win_dirty = true;
    rt_host_copy(s, i, host_of(s, i), (void *)data, bytes, true);
}

/* An output's twin holds the last run's values once a run has finished (before that, the
 * device's, which the caller reads the slow way); an input's holds what was set last. */
bool rt_io_get(kiln_session *s, int i, void *data, size_t bytes) {
    if (s->bufs[i].kind == IR_BUF_OUTPUT && !s->out_fresh) return false;
    rt_host_copy(s, i, host_of(s, i), data, bytes, false);
    return true;
}

/* The first bytes of an output's twin, as it lies there (the caller checked that its prefix is
 * the data's). */
bool rt_io_get_prefix(kiln_session *s, int i, void *data, size_t bytes) {
    if (s->bufs[i].kind != IR_BUF_OUTPUT || !s->out_fresh) return false;
    memcpy(data, host_of(s, i), bytes);
    return true;
}

void rt_io_free(kiln_session *s) {
    if (s->win_dev[RT_WIN_IN]) s->cu->MemFree(s->win_dev[RT_WIN_IN]);
    for (int w = 0; w < 2; w++) {
        if (s->win_host[w]) s->cu->MemFreeHost(s->win_host[w]); /* cuMemHostAlloc's too */
        s->win_dev[w] = 0;
        s->win_host[w] = NULL;
    }
    s->dims_host = NULL;
    s->dims_dev = 0;
    free(s->win_off);
    s->win_off = NULL;
}
