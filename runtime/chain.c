/* Chained runs: a sequence of runs in which output `out` of each run is input `in` of the
 * next, fed on the device, with the host one run ahead of the GPU.
 *
 * Why: greedy decoding feeds each step's argmax to the next step. Read on the host first, every
 * token costs a round trip with the GPU idle — the wake-up after the step, the input window's
 * copy and the graph launch of the next: 13-16 us on the H100, 1.5% of a 1B model's step.
 *
 * How: the unit's input window (runtime/io.c) gets two pinned, device-mapped host twins. Run k
 * copies twin k%2 into the device window as a plain run copies its one twin. Its CUDA graph (one
 * per parity, captured once per (out, in) pair) has `out` pointed at the `in` slot of the other
 * twin: the kernel writes the value over PCIe into the twin that run k+1's window copy, queued
 * behind run k, carries to the device. The host reads that slot once run k's end event has
 * passed and before it queues run k+2, the only run that writes the slot again: no read races a
 * write. After queuing run k, the host copies its twin into the other one (all but the `in`
 * slot), so inputs keep their values from run to run as with kiln_session_run, and the caller
 * sets run k+1's inputs while run k is on the GPU. */
#include "runtime/session_int.h"

#include <stdlib.h>
#include <string.h>

typedef struct rt_chain {
    int            out, in; /* buffers of the unit that exec[] were captured for (-1: none yet) */
    size_t         bytes;   /* of out and in at the dims the chain began with */
    void          *twin[2];
    rt_cuptr       twin_dev[2];
    rt_cugraphexec exec[2];
    rt_cuevent     start[2], end[2];
    void          *own;    /* the unit's own window twin, set aside while the chain is open */
    int64_t        k;      /* runs queued since the chain began */
    double         t_run;  /* host time (us) when the newest run began queuing */
} rt_chain;

static size_t in_off(const kiln_session *u) { return u->win_off[u->chain->in] - 1; }

static kiln_status chain_alloc(kiln_session *u) {
    rt_chain *c = calloc(1, sizeof *c);
    if (!c) return kb_oom();
    c->out = c->in = -1;
    u->chain = c;
    const rt_cuda_api *cu = u->cu;
    size_t             n = u->win_bytes[RT_WIN_IN];
    for (int p = 0; p < 2; p++) {
        rt_cures r = cu->MemHostAlloc(&c->twin[p], n, RT_CU_MEMHOSTALLOC_DEVICEMAP);
        if (r != RT_CUDA_SUCCESS) {
            c->twin[p] = NULL;
            return rt_cuda_error(r, "cuMemHostAlloc", "allocating a %zu-byte input twin for chained runs", n);
        }
        if ((r = cu->MemHostGetDevicePointer(&c->twin_dev[p], c->twin[p], 0)) != RT_CUDA_SUCCESS)
            return rt_cuda_error(r, "cuMemHostGetDevicePointer", "mapping an input twin for chained runs");
        r = cu->EventCreate(&c->start[p], RT_CU_EVENT_DEFAULT);
        if (r == RT_CUDA_SUCCESS) r = cu->EventCreate(&c->end[p], RT_CU_EVENT_DEFAULT);
        if (r != RT_CUDA_SUCCESS) return rt_cuda_error(r, "cuEventCreate", "creating the events of chained runs");
    }
    return NULL;
}

void rt_chain_free(kiln_session *u) {
    rt_chain *c = u->chain;
    if (!c) return;
    const rt_cuda_api *cu = u->cu;
    for (int p = 0; p < 2; p++) {
        if (c->exec[p]) cu->GraphExecDestroy(c->exec[p]);
        if (c->start[p]) cu->EventDestroy(c->start[p]);
        if (c->end[p]) cu->EventDestroy(c->end[p]);
        if (c->twin[p]) cu->MemFreeHost(c->twin[p]);
    }
    free(c);
    u->chain = NULL;
}

/* Points every kernel parameter that addresses `out` at `to`. */
static void redirect_out(kiln_session *u, int out, rt_cuptr to) {
    for (int i = 0; i < u->nlaunches; i++) {
        rt_launch *l = &u->launches[i];
        for (int j = 0; j < l->nparams; j++)
            if (l->pbuf[j] == out) l->argv[j] = to;
    }
}

/* The address run parity p writes `out` to: the `in` slot of the other parity's twin. */
static rt_cuptr out_target(const kiln_session *u, int p) { return u->chain->twin_dev[1 - p] + in_off(u); }

static kiln_status chain_graphs(kiln_session *u, kiln_session_stats *stats) {
    rt_chain *c = u->chain;
    if (!u->use_graphs) return NULL; /* plain launches are redirected run by run */
    for (int p = 0; p < 2; p++) {
        if (c->exec[p]) u->cu->GraphExecDestroy(c->exec[p]);
        c->exec[p] = NULL;
    }
    kiln_status st = NULL;
    for (int p = 0; !st && p < 2; p++) {
        redirect_out(u, c->out, out_target(u, p));
        if (!(st = rt_capture(u, &c->exec[p]))) stats->captures++;
    }
    redirect_out(u, c->out, u->dptr[c->out]);
    if (st) c->out = c->in = -1;
    return st;
}

/* A buffer whose current elements are a prefix of its window slot: fixed, or one dimension. */
static bool prefix_layout(const ir_buf *b) { return !rt_buf_symbolic(b) || (b->ne[1] == 1 && b->ne[2] == 1 && b->ne[3] == 1); }

/* out and in must be window buffers of the unit, of one size now; no library call may write out. */
static kiln_status check_pair(const kiln_session *u, const char *out_name, const char *in_name, int out, int in) {
    static const char fn[] = "kiln_session_chain_begin";
    if (out < 0 || u->bufs[out].kind != IR_BUF_OUTPUT)
        return kb_error(KILN_ERR_NOT_FOUND, "%s: the program has no output named '%s'", fn, out_name);
    if (in < 0 || u->bufs[in].kind != IR_BUF_INPUT)
        return kb_error(KILN_ERR_NOT_FOUND, "%s: the program has no input named '%s'", fn, in_name);
    const ir_buf *bo = &u->bufs[out], *bi = &u->bufs[in];
    size_t        no = rt_current_bytes(u, bo), ni = rt_current_bytes(u, bi);
    if (no != ni)
        return kb_error(KILN_ERR_INVALID, "%s: output '%s' (%zu bytes at the current dims) and input '%s' (%zu "
                                          "bytes) must have one size", fn, out_name, no, in_name, ni);
    if (!prefix_layout(bo) || !prefix_layout(bi))
        return kb_error(KILN_ERR_INVALID, "%s: '%s' and '%s' must be fixed or have one dimension", fn, out_name,
                        in_name);
    if (!rt_io_placed(u, out) || !rt_io_placed(u, in))
        return kb_error(KILN_ERR_INVALID, "%s: '%s' must be a small output that no kernel reads and '%s' a small "
                                          "input (the I/O windows' items), to be fed on the device",
                        fn, out_name, in_name);
    for (int i = 0; i < u->nlaunches; i++)
        if (u->launches[i].kind == CG_GEMM)
            for (int j = 0; j < u->launches[i].nparams; j++)
                if (u->launches[i].pbuf[j] == out)
                    return kb_error(KILN_ERR_INVALID, "%s: '%s' is written by a library call ('%s')", fn, out_name,
                                    u->launches[i].name);
    return NULL;
}

kiln_status kiln_session_chain_begin(kiln_session *s, const char *out_name, const char *in_name) {
    static const char fn[] = "kiln_session_chain_begin";
    if (!s || !out_name || !in_name) return kb_error(KILN_ERR_INVALID, "%s: NULL argument", fn);
    if (s->chain_unit) return kb_error(KILN_ERR_INVALID, "%s: a chain is already open", fn);
    int           variant;
    kiln_session *u = rt_unit(s, &variant);
    if (u->broken)
        return kb_error(KILN_ERR_CUDA, "%s: an earlier run failed on the GPU and left the CUDA context unusable", fn);
    int         out = rt_buf_named(u, out_name), in = rt_buf_named(u, in_name);
    kiln_status st = check_pair(u, out_name, in_name, out, in);
    if (!st) st = rt_make_current(u);
    if (!st && !u->chain && (st = chain_alloc(u))) rt_chain_free(u);
    if (st) return st;
    rt_chain *c = u->chain;
    c->bytes = rt_current_bytes(u, &u->bufs[out]);
    if (c->out != out || c->in != in) {
        c->out = out;
        c->in = in;
        if ((st = chain_graphs(u, &s->stats))) return st;
    }
    c->own = u->win_host[RT_WIN_IN];
    for (int p = 0; p < 2; p++) memcpy(c->twin[p], c->own, u->win_bytes[RT_WIN_IN]);
    u->win_host[RT_WIN_IN] = c->twin[0];
    if (u->ndims) u->dims_host = c->twin[0];
    c->k = 0;
    s->chain_unit = u;
    return NULL;
}

kiln_status rt_chain_check_set(kiln_session *s, const char *name) {
    kiln_session *u = s->chain_unit;
    if (!u || u->chain->k == 0 || strcmp(name, u->bufs[u->chain->in].name) != 0) return NULL;
    return kb_error(KILN_ERR_INVALID, "kiln_session_set: '%s' is fed by the open chain from '%s'; it can be set "
                                      "only before the chain's first run",
                    name, u->bufs[u->chain->out].name);
}

static kiln_status enqueue(kiln_session *u, int p) {
    const rt_cuda_api *cu = u->cu;
    rt_chain          *c = u->chain;
    kiln_status        st = rt_make_current(u);
    if (!st) st = rt_flush_pending(u);
    if (st) return st;
    rt_cures r = cu->MemcpyHtoDAsync(u->win_dev[RT_WIN_IN], c->twin[p], u->win_bytes[RT_WIN_IN], u->stream);
    if (r != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuMemcpyHtoDAsync", "copying the %zu-byte window of small inputs",
                             u->win_bytes[RT_WIN_IN]);
    u->win_dirty = false;
    if ((r = cu->EventRecord(c->start[p], u->stream)) != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuEventRecord", "starting a chained run's timer");
    if (c->exec[p]) {
        if ((r = cu->GraphLaunch(c->exec[p], u->stream)) != RT_CUDA_SUCCESS)
            return rt_cuda_error(r, "cuGraphLaunch", "launching the CUDA graph of %d kernels", u->nlaunches);
    } else {
        redirect_out(u, c->out, out_target(u, p));
        st = rt_launch_all(u, "launching");
        redirect_out(u, c->out, u->dptr[c->out]);
        if (st) return st;
    }
    if ((r = cu->EventRecord(c->end[p], u->stream)) != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuEventRecord", "stopping a chained run's timer");
    return NULL;
}

/* Waits for the run of parity p and takes its GPU time. */
static kiln_status finish(kiln_session *s, kiln_session *u, int p) {
    const rt_cuda_api *cu = u->cu;
    rt_chain          *c = u->chain;
    rt_cures           r = cu->EventSynchronize(c->end[p]);
    if (r != RT_CUDA_SUCCESS) {
        u->broken = true;
        return rt_cuda_error(r, "cuEventSynchronize", "waiting for a chained run of %d kernels on device %d (%s); "
                                                      "to find the failing kernel, run with KILN_CUDA_GRAPHS=0 "
                                                      "CUDA_LAUNCH_BLOCKING=1",
                             u->nlaunches, u->device, u->dev_name);
    }
    float ms = 0;
    if ((r = cu->EventElapsedTime(&ms, c->start[p], c->end[p])) != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuEventElapsedTime", "timing a chained run");
    u->last_ms = s->last_ms = ms;
    s->stats.runs++;
    if (c->exec[p]) s->stats.replays++;
    else s->stats.plain_runs++;
    return NULL;
}

/* The unit and chain of s's open chain, or an error naming fn. */
static kiln_status open_unit(kiln_session *s, const char *fn, kiln_session **u) {
    if (!s) return kb_error(KILN_ERR_INVALID, "%s: session is NULL", fn);
    if (!(*u = s->chain_unit)) return kb_error(KILN_ERR_INVALID, "%s: no chain is open (kiln_session_chain_begin)", fn);
    return NULL;
}

static kiln_status check_out_bytes(const kiln_session *u, const char *fn, size_t bytes) {
    size_t want = u->chain->bytes;
    if (bytes == want) return NULL;
    return kb_error(KILN_ERR_INVALID, "%s: output '%s' is %zu bytes; got room for %zu", fn,
                    u->bufs[u->chain->out].name, want, bytes);
}

kiln_status kiln_session_chain_run(kiln_session *s, void *prev, size_t bytes, bool *got) {
    static const char fn[] = "kiln_session_chain_run";
    kiln_session     *u;
    kiln_status       st = open_unit(s, fn, &u);
    if (got) *got = false;
    if (st) return st;
    if (prev && (st = check_out_bytes(u, fn, bytes))) return st;
    int variant;
    rt_chain *c = u->chain;
    if (rt_unit(s, &variant) != u || rt_current_bytes(u, &u->bufs[c->in]) != c->bytes)
        return kb_error(KILN_ERR_INVALID, "%s: the dims changed since the chain began (they select program variant "
                                          "%d, '%s' is %zu bytes); end the chain before changing them",
                        fn, variant, u->bufs[c->in].name, rt_current_bytes(u, &u->bufs[c->in]));
    if (u->broken)
        return kb_error(KILN_ERR_CUDA, "%s: an earlier run failed on the GPU and left the CUDA context unusable", fn);
    int       p = (int)(c->k & 1);
    double    t0 = kb_now_ms();
    if ((st = enqueue(u, p))) return st;
    s->stats.host_us_last = 1e3 * (kb_now_ms() - t0);
    s->stats.host_us_total += s->stats.host_us_last;
    s->stats.variant = variant;
    s->last = u;
    if (u->profile) { /* one set of per-launch events: one run in flight */
        if ((st = finish(s, u, p))) return st;
        rt_profile_collect(u);
    }
    if (c->k > 0) {
        if (!u->profile && (st = finish(s, u, 1 - p))) return st;
        if (prev) memcpy(prev, (char *)c->twin[p] + in_off(u), c->bytes);
        if (got) *got = true;
    }
    /* Run k+1 starts from run k's inputs; the `in` slot of twin 1-p is run k's to write. */
    size_t off = in_off(u), n = u->bufs[c->in].bytes, all = u->win_bytes[RT_WIN_IN];
    memcpy(c->twin[1 - p], c->twin[p], off);
    memcpy((char *)c->twin[1 - p] + off + n, (char *)c->twin[p] + off + n, all - off - n);
    u->win_host[RT_WIN_IN] = c->twin[1 - p];
    if (u->ndims) u->dims_host = c->twin[1 - p];
    c->k++;
    return NULL;
}

kiln_status kiln_session_chain_end(kiln_session *s, void *last, size_t bytes) {
    static const char fn[] = "kiln_session_chain_end";
    kiln_session     *u;
    kiln_status       st = open_unit(s, fn, &u);
    if (st) return st;
    rt_chain *c = u->chain;
    if (last) st = check_out_bytes(u, fn, bytes);
    kiln_status cst = rt_make_current(u);
    if (cst && !st) st = cst;
    else kiln_status_free(cst);
    int p = (int)((c->k - 1) & 1); /* the newest run's parity; its output is in the current twin */
    if (c->k > 0 && !u->broken) {
        kiln_status fst = u->profile ? NULL : finish(s, u, p);
        if (!st) st = fst;
        else kiln_status_free(fst);
    }
    if (!u->broken) u->cu->StreamSynchronize(u->stream); /* idle, as after any run */
    void  *cur = u->win_host[RT_WIN_IN];
    size_t n = c->bytes;
    if (c->k > 0 && !u->broken) {
        /* kiln_session_get of `out` gives the last run's value, as after kiln_session_run. */
        memcpy((char *)u->win_host[RT_WIN_OUT] + (u->win_off[c->out] - 1), (char *)cur + in_off(u), n);
        u->out_fresh = true;
        if (last && !st) memcpy(last, (char *)cur + in_off(u), n);
    }
    memcpy(c->own, cur, u->win_bytes[RT_WIN_IN]);
    u->win_host[RT_WIN_IN] = c->own;
    if (u->ndims) u->dims_host = c->own;
    u->win_dirty = true;
    c->k = 0;
    s->chain_unit = NULL;
    return st;
}
