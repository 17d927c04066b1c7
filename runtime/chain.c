/* Chained runs: a sequence of runs in which output `out` of each run is input `in` of the
 * next, fed on the device, with the host one run ahead of the GPU.
 *
 * Why: greedy decoding feeds each step's argmax to the next step. Read on the host first, every
 * token costs a round trip with the GPU idle — the wake-up after the step, the input window's
 * copy and the graph launch of the next: 13-16 us on the H100, 1.5% of a 1B model's step. A
 * copy queued between two steps would still cost its latency, so nothing sits between them.
 *
 * How: run k (parity p = k % 2) reads its input window from device window win[p] (win[0] is
 * the unit's own, win[1] the chain's; one CUDA graph per parity, captured once per (out, in)
 * pair with the window's kernel arguments rebased). Its `out` is pointed at the `in` slot of
 * win[1-p], in device memory: run k+1's token is there when run k ends. Three streams:
 * - s_in copies host twin p (the inputs the caller set for run k) into win[p] but for the `in`
 *   slot (run k-1 wrote it; the first run copies it too), once run k-2, the last reader of
 *   win[p], has ended: the copy overlaps run k-1 instead of sitting between two runs;
 * - the session's stream waits for that copy and runs the graph between two timing events;
 * - s_out copies run k's `out` back to pinned host memory after it ends, for the host.
 * The host returns from queuing run k once run k-1's value is back, having copied twin p into
 * twin 1-p, so inputs keep their values from run to run as with kiln_session_run; the caller
 * then sets run k+1's inputs in twin 1-p while run k is on the GPU. Run k's `out` slot in
 * win[1-p] is written again by run k+2, which waits for s_out's read of it. */
#include "runtime/session_int.h"

#include <stdlib.h>
#include <string.h>

#define RT_CHAIN_MAX_OUT ((size_t)1024) /* at most an output-window item (runtime/io.c) */

typedef struct rt_chain {
    int            out, in; /* buffers of the unit that exec[] were captured for (-1: none yet) */
    size_t         bytes;   /* of out and in at the dims the chain began with */
    void          *twin[2]; /* pinned host twins of the input window */
    rt_cuptr       win[2];  /* device input windows; win[0] is the unit's own */
    void          *back;    /* pinned: parity p's `out` value at p * RT_CHAIN_MAX_OUT */
    rt_custream    s_in, s_out;
    rt_cugraphexec exec[2];
    rt_cuevent     start[2], end[2], in_done[2], out_done[2];
    float          ms[2]; /* GPU time of the last finished run of each parity */
    void          *own;   /* the unit's own window twin, set aside while the chain is open */
    int64_t        k;     /* runs queued since the chain began */
    bool           failed; /* a call failed after queuing work: only _end may follow */
} rt_chain;

static size_t in_off(const kiln_session *u) { return u->win_off[u->chain->in] - 1; }
static size_t win_n(const kiln_session *u) { return u->win_bytes[RT_WIN_IN]; }

static kiln_status chain_alloc(kiln_session *u) {
    rt_chain *c = calloc(1, sizeof *c);
    if (!c) return kb_oom();
    c->out = c->in = -1;
    u->chain = c;
    const rt_cuda_api *cu = u->cu;
    size_t             n = win_n(u);
    rt_cures           r = RT_CUDA_SUCCESS;
    for (int p = 0; p < 2 && r == RT_CUDA_SUCCESS; p++) r = cu->MemAllocHost(&c->twin[p], n);
    if (r == RT_CUDA_SUCCESS) r = cu->MemAllocHost(&c->back, 2 * RT_CHAIN_MAX_OUT);
    if (r != RT_CUDA_SUCCESS) return rt_cuda_error(r, "cuMemAllocHost", "allocating the host twins of chained runs");
    c->win[0] = u->win_dev[RT_WIN_IN];
    if ((r = cu->MemAlloc(&c->win[1], n)) != RT_CUDA_SUCCESS) {
        c->win[1] = 0;
        return rt_cuda_error(r, "cuMemAlloc", "allocating the %zu-byte second input window of chained runs", n);
    }
    if ((r = cu->StreamCreate(&c->s_in, RT_CU_STREAM_NON_BLOCKING)) == RT_CUDA_SUCCESS)
        r = cu->StreamCreate(&c->s_out, RT_CU_STREAM_NON_BLOCKING);
    if (r != RT_CUDA_SUCCESS) return rt_cuda_error(r, "cuStreamCreate", "creating the copy streams of chained runs");
    for (int p = 0; p < 2 && r == RT_CUDA_SUCCESS; p++) {
        r = cu->EventCreate(&c->start[p], RT_CU_EVENT_DEFAULT);
        if (r == RT_CUDA_SUCCESS) r = cu->EventCreate(&c->end[p], RT_CU_EVENT_DEFAULT);
        if (r == RT_CUDA_SUCCESS) r = cu->EventCreate(&c->in_done[p], RT_CU_EVENT_DISABLE_TIMING);
        if (r == RT_CUDA_SUCCESS) r = cu->EventCreate(&c->out_done[p], RT_CU_EVENT_DISABLE_TIMING);
    }
    if (r != RT_CUDA_SUCCESS) return rt_cuda_error(r, "cuEventCreate", "creating the events of chained runs");
    return NULL;
}

void rt_chain_free(kiln_session *u) {
    rt_chain *c = u->chain;
    if (!c) return;
    const rt_cuda_api *cu = u->cu;
    if (c->s_in) cu->StreamSynchronize(c->s_in);
    if (c->s_out) cu->StreamSynchronize(c->s_out);
    for (int p = 0; p < 2; p++) {
        if (c->exec[p]) cu->GraphExecDestroy(c->exec[p]);
        rt_cuevent ev[4] = {c->start[p], c->end[p], c->in_done[p], c->out_done[p]};
        for (int i = 0; i < 4; i++)
            if (ev[i]) cu->EventDestroy(ev[i]);
        if (c->twin[p]) cu->MemFreeHost(c->twin[p]);
    }
    if (c->back) cu->MemFreeHost(c->back);
    if (c->s_in) cu->StreamDestroy(c->s_in);
    if (c->s_out) cu->StreamDestroy(c->s_out);
    if (c->win[1]) cu->MemFree(c->win[1]);
    free(c);
    u->chain = NULL;
}

/* The argument (or library-call operand) a as run parity p sees it: input-window addresses
 * rebased onto win[p], `out` at the `in` slot of win[1-p]. */
static rt_cuptr for_parity(const kiln_session *u, int p, int buf, rt_cuptr a) {
    const rt_chain *c = u->chain;
    if (buf == c->out) return c->win[1 - p] + in_off(u);
    if (a >= c->win[0] && a < c->win[0] + win_n(u)) return a - c->win[0] + c->win[p];
    return a;
}

/* Points u's launches at parity p's windows (p < 0: back at their own). */
static void redirect(kiln_session *u, int p) {
    for (int i = 0; i < u->nlaunches; i++) {
        rt_launch *l = &u->launches[i];
        for (int j = 0; j < l->nparams; j++) {
            rt_cuptr home = l->pbuf[j] >= 0 ? u->dptr[l->pbuf[j]] : l->pbuf[j] == RT_PBUF_DIMS ? u->dims_dev : l->argv[j];
            l->argv[j] = p < 0 ? home : for_parity(u, p, l->pbuf[j], home);
        }
        rt_library_ptrs(l);
    }
}

static kiln_status chain_graphs(kiln_session *u, kiln_session_stats *stats) {
    rt_chain *c = u->chain;
    for (int p = 0; p < 2; p++) {
        if (c->exec[p]) u->cu->GraphExecDestroy(c->exec[p]);
        c->exec[p] = NULL;
    }
    if (!u->use_graphs) return NULL; /* plain launches are redirected run by run */
    kiln_status st = NULL;
    for (int p = 0; !st && p < 2; p++) {
        redirect(u, p);
        if (!(st = rt_capture(u, &c->exec[p]))) stats->captures++;
    }
    redirect(u, -1);
    if (st) c->out = c->in = -1;
    return st;
}

/* A buffer whose current elements are a prefix of its window slot: fixed, or one dimension. */
static bool prefix_layout(const ir_buf *b) {
    return !rt_buf_symbolic(b) || (b->ne[1] == 1 && b->ne[2] == 1 && b->ne[3] == 1);
}

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
    if (bo->bytes > bi->bytes)
        return kb_error(KILN_ERR_INVALID, "%s: output '%s' may grow to %zu bytes, past input '%s' (%zu)", fn, out_name,
                        bo->bytes, in_name, bi->bytes);
    if (!rt_io_placed(u, out) || !rt_io_placed(u, in) || bo->bytes > RT_CHAIN_MAX_OUT)
        return kb_error(KILN_ERR_INVALID, "%s: '%s' must be a small output that no kernel reads and '%s' a small "
                                          "input (the I/O windows' items), to be fed on the device",
                        fn, out_name, in_name);
    for (int i = 0; i < u->nlaunches; i++)
        if (u->launches[i].kind != CG_LAUNCH)
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
    if (u->ncoll) /* (one rank's chained runs would wait for the others' all_reduce) */
        return kb_error(KILN_ERR_INVALID, "%s: the program has all_reduce steps: a group's runs go through "
                                          "kiln_group_run", fn);
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
    memcpy(c->twin[0], c->own, win_n(u));
    u->win_host[RT_WIN_IN] = c->twin[0];
    if (u->ndims) u->dims_host = c->twin[0];
    c->k = 0;
    c->failed = false;
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

#define CU_TRY(call, what)                                                                                             \
    do {                                                                                                               \
        rt_cures r_ = (call);                                                                                          \
        if (r_ != RT_CUDA_SUCCESS) return rt_cuda_error(r_, #call, "%s", what);                                        \
    } while (0)

/* s_in: twin p into win[p] once run k-2 (its last reader) has ended; all but the `in` slot,
 * which run k-1 wrote, after the first run. */
static kiln_status queue_inputs(kiln_session *u, int p) {
    const rt_cuda_api *cu = u->cu;
    rt_chain          *c = u->chain;
    size_t             n = win_n(u), off = in_off(u), slot = u->bufs[c->in].bytes;
    if (c->k >= 2) CU_TRY(cu->StreamWaitEvent(c->s_in, c->end[p], 0), "ordering a window copy after its last reader");
    if (c->k == 0) {
        CU_TRY(cu->MemcpyHtoDAsync(c->win[p], c->twin[p], n, c->s_in), "copying the window of small inputs");
    } else {
        if (off > 0)
            CU_TRY(cu->MemcpyHtoDAsync(c->win[p], c->twin[p], off, c->s_in), "copying the window of small inputs");
        if (off + slot < n)
            CU_TRY(cu->MemcpyHtoDAsync(c->win[p] + off + slot, (char *)c->twin[p] + off + slot, n - off - slot,
                                       c->s_in),
                   "copying the window of small inputs");
    }
    CU_TRY(cu->EventRecord(c->in_done[p], c->s_in), "marking a window copy");
    return NULL;
}

/* The session's stream: the graph of parity p after its inputs, and after s_out has read the
 * slot it writes (run k-2's value); then s_out reads this run's value back. */
static kiln_status queue_run(kiln_session *u, int p) {
    const rt_cuda_api *cu = u->cu;
    rt_chain          *c = u->chain;
    kiln_status        st = rt_flush_pending(u);
    if (st) return st;
    CU_TRY(cu->StreamWaitEvent(u->stream, c->in_done[p], 0), "ordering a chained run after its inputs");
    if (c->k >= 2) CU_TRY(cu->StreamWaitEvent(u->stream, c->out_done[p], 0), "ordering a chained run after a read-back");
    CU_TRY(cu->EventRecord(c->start[p], u->stream), "starting a chained run's timer");
    if (c->exec[p]) {
        CU_TRY(cu->GraphLaunch(c->exec[p], u->stream), "launching a chained run's CUDA graph");
    } else {
        redirect(u, p);
        st = rt_launch_all(u, "launching");
        redirect(u, -1);
        if (st) return st;
    }
    CU_TRY(cu->EventRecord(c->end[p], u->stream), "stopping a chained run's timer");
    CU_TRY(cu->StreamWaitEvent(c->s_out, c->end[p], 0), "ordering a read-back after its run");
    CU_TRY(cu->MemcpyDtoHAsync((char *)c->back + (size_t)p * RT_CHAIN_MAX_OUT, c->win[1 - p] + in_off(u), c->bytes,
                               c->s_out),
           "reading a chained run's output back");
    CU_TRY(cu->EventRecord(c->out_done[p], c->s_out), "marking a read-back");
    return NULL;
}

/* Waits for the run of parity p and its read-back, and takes its GPU time. */
static kiln_status finish(kiln_session *s, kiln_session *u, int p) {
    const rt_cuda_api *cu = u->cu;
    rt_chain          *c = u->chain;
    rt_cures           r = cu->EventSynchronize(c->out_done[p]);
    if (r != RT_CUDA_SUCCESS) {
        u->broken = true;
        return rt_cuda_error(r, "cuEventSynchronize", "waiting for a chained run of %d kernels on device %d (%s); "
                                                      "to find the failing kernel, run with KILN_CUDA_GRAPHS=0 "
                                                      "CUDA_LAUNCH_BLOCKING=1",
                             u->nlaunches, u->device, u->dev_name);
    }
    if ((r = cu->EventElapsedTime(&c->ms[p], c->start[p], c->end[p])) != RT_CUDA_SUCCESS)
        return rt_cuda_error(r, "cuEventElapsedTime", "timing a chained run");
    s->stats.runs++;
    if (c->exec[p]) s->stats.replays++;
    else s->stats.plain_runs++;
    return NULL;
}

static const void *back_of(const rt_chain *c, int p) { return (const char *)c->back + (size_t)p * RT_CHAIN_MAX_OUT; }

/* The unit of s's open chain, or an error naming fn. */
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

/* The run of parity p is the one whose value the caller gets: its time is the session's last. */
static void publish(kiln_session *s, kiln_session *u, int p) { u->last_ms = s->last_ms = u->chain->ms[p]; }

static kiln_status chain_step(kiln_session *s, kiln_session *u, void *prev, bool *got) {
    rt_chain   *c = u->chain;
    int         p = (int)(c->k & 1);
    double      t0 = kb_now_ms();
    kiln_status st = rt_make_current(u);
    if (st || (st = queue_inputs(u, p)) || (st = queue_run(u, p))) return st;
    s->stats.host_us_last = 1e3 * (kb_now_ms() - t0);
    s->stats.host_us_total += s->stats.host_us_last;
    s->last = u;
    if (u->profile) { /* one set of per-launch events: one run in flight */
        if ((st = finish(s, u, p))) return st;
        rt_profile_collect(u);
    }
    if (c->k > 0) {
        if (!u->profile && (st = finish(s, u, 1 - p))) return st;
        publish(s, u, 1 - p);
        if (prev) memcpy(prev, back_of(c, 1 - p), c->bytes);
        if (got) *got = true;
    }
    /* Run k+1 starts from run k's inputs. Twin 1-p's last copy (run k-1's) is done: run k-1 ended. */
    memcpy(c->twin[1 - p], c->twin[p], win_n(u));
    u->win_host[RT_WIN_IN] = c->twin[1 - p];
    if (u->ndims) u->dims_host = c->twin[1 - p];
    c->k++;
    return NULL;
}

kiln_status kiln_session_chain_run(kiln_session *s, void *prev, size_t bytes, bool *got) {
    static const char fn[] = "kiln_session_chain_run";
    kiln_session     *u;
    kiln_status       st = open_unit(s, fn, &u);
    if (got) *got = false;
    if (st) return st;
    if (prev && (st = check_out_bytes(u, fn, bytes))) return st;
    int       variant;
    rt_chain *c = u->chain;
    if (c->failed)
        return kb_error(KILN_ERR_INVALID, "%s: an earlier call of this chain failed; end it (kiln_session_chain_end)",
                        fn);
    size_t in_now = rt_current_bytes(u, &u->bufs[c->in]), out_now = rt_current_bytes(u, &u->bufs[c->out]);
    if (rt_unit(s, &variant) != u || in_now != c->bytes || out_now != c->bytes)
        return kb_error(KILN_ERR_INVALID, "%s: the dims changed since the chain began (they select program variant "
                                          "%d; '%s' is %zu bytes, '%s' %zu, for %zu); end the chain before changing "
                                          "them",
                        fn, variant, u->bufs[c->in].name, in_now, u->bufs[c->out].name, out_now, c->bytes);
    if (u->broken)
        return kb_error(KILN_ERR_CUDA, "%s: an earlier run failed on the GPU and left the CUDA context unusable", fn);
    s->stats.variant = variant;
    if ((st = chain_step(s, u, prev, got))) c->failed = true;
    return st;
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
    int  p = (int)((c->k - 1) & 1); /* the newest run's parity */
    bool have = c->k > 0 && !u->broken && !c->failed;
    if (have && !u->profile) {
        kiln_status fst = finish(s, u, p);
        if (fst) have = false;
        if (!st) st = fst;
        else kiln_status_free(fst);
    }
    if (!u->broken) { /* idle, as after any run */
        rt_custream all[3] = {c->s_in, u->stream, c->s_out};
        for (int i = 0; i < 3; i++) {
            rt_cures r = u->cu->StreamSynchronize(all[i]);
            if (r != RT_CUDA_SUCCESS) {
                u->broken = true;
                have = false;
                if (!st) st = rt_cuda_error(r, "cuStreamSynchronize", "ending a chain of runs");
                break;
            }
        }
        if (!u->broken) rt_pins_idle(u);
    }
    void *cur = u->win_host[RT_WIN_IN];
    if (have) {
        /* A plain run after the chain reads the last value as `in`; kiln_session_get of `out`
         * gives it, as after kiln_session_run. */
        publish(s, u, p);
        memcpy((char *)cur + in_off(u), back_of(c, p), c->bytes);
        memcpy((char *)u->win_host[RT_WIN_OUT] + (u->win_off[c->out] - 1), back_of(c, p), c->bytes);
        u->out_fresh = true;
        if (last && !st) memcpy(last, back_of(c, p), c->bytes);
    }
    memcpy(c->own, cur, win_n(u));
    u->win_host[RT_WIN_IN] = c->own;
    if (u->ndims) u->dims_host = c->own;
    u->win_dirty = true;
    c->k = 0;
    c->failed = false;
    s->chain_unit = NULL;
    return st;
}
