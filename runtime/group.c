/* kiln_group: the sessions of one tensor-parallel model's ranks, one per GPU, joined by one NCCL
 * communicator (docs/tp.md). One process drives every GPU: ncclCommInitAll makes the
 * communicators of all ranks at once, so no unique id travels between processes, and each
 * rank's session keeps its own context, stream and CUDA graph (NCCL's kernels are captured in
 * it with the rank's kernels).
 *
 * Runs: an all_reduce step does not return until every rank has reached it, so the ranks' runs
 * are issued concurrently (rt_ranks, runtime/ranks.c: rank 0 on the caller's thread, the others
 * on workers kept for the group's life). A rank whose run fails may never reach an all_reduce
 * the others wait for on their GPUs: the first failure aborts every communicator
 * (ncclCommAbort ends the waiting NCCL kernels, so the other ranks' runs return with errors
 * instead of hanging), and the group is then broken: its later runs fail at once, naming the
 * first error's rank. */
#include "runtime/session_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RT_GROUP_MAX 64

struct kiln_group {
    int                n;
    kiln_session     **s;
    rt_nccl_comm      *comms;
    const rt_nccl_api *nccl;
    rt_ranks          *ranks; /* the runs (runtime/ranks.c) */
    bool               aborted;
    bool               closing; /* the ranks' runs destroy their communicators (kiln_group_free) */
};

/* The number of ranks of program p's all_reduce steps (its variants' too) that is not n, or 0. */
static int other_ranks(const kiln_program *p, int n, int *step) {
    for (int i = 0; i < p->nkernels; i++)
        if (p->kernels[i].kind == CG_COLLECTIVE && p->kernels[i].coll.ranks != n) {
            *step = i;
            return p->kernels[i].coll.ranks;
        }
    for (int v = 0; v < p->nspec; v++) {
        int r = other_ranks(p->spec[v], n, step);
        if (r) return r;
    }
    return 0;
}

static kiln_status check_args(const kiln_program *const *programs, int n, const kiln_group_opts *opts) {
    static const char fn[] = "kiln_group_new";
    if (n < 2 || n > RT_GROUP_MAX)
        return kb_error(KILN_ERR_INVALID, "%s: a group has 2 .. %d ranks, not %d (one GPU: kiln_session_new)", fn,
                        RT_GROUP_MAX, n);
    if (!programs) return kb_error(KILN_ERR_INVALID, "%s: programs is NULL", fn);
    for (int r = 0; r < n; r++) {
        if (!programs[r]) return kb_error(KILN_ERR_INVALID, "%s: the program of rank %d is NULL", fn, r);
        int step = -1, other = other_ranks(programs[r], n, &step);
        if (other)
            return kb_error(KILN_ERR_INVALID, "%s: the program of rank %d has an all_reduce over %d ranks (step %d); "
                                              "the group has %d (build each rank's graph with tp_size %d)",
                            fn, r, other, step, n, n);
    }
    for (int r = 0; opts && opts->devices && r < n; r++) {
        if (opts->devices[r] < 0)
            return kb_error(KILN_ERR_INVALID, "%s: rank %d's device %d is negative", fn, r, opts->devices[r]);
        for (int q = 0; q < r; q++)
            if (opts->devices[q] == opts->devices[r])
                return kb_error(KILN_ERR_INVALID, "%s: ranks %d and %d both name device %d (one rank a GPU)", fn, q,
                                r, opts->devices[r]);
    }
    return NULL;
}

/* The GPUs present: n of them at least. */
static kiln_status check_devices(int n, const int *devices) {
    int         count = 0;
    kiln_status st = kiln_device_count(&count);
    if (st) return st;
    int need = n;
    for (int i = 0; devices && i < n; i++)
        if (devices[i] + 1 > need) need = devices[i] + 1;
    if (count < need)
        return kb_error(KILN_ERR_NO_GPU, "kiln_group_new: %d ranks need %s%d GPUs; this machine has %d", n,
                        devices ? "devices up to " : "", devices ? need - 1 : n, count);
    return NULL;
}

/* rt_ranks' function: rank r's run, or at the group's end the destruction of its communicator. */
static kiln_status run_rank(void *user, int r) {
    kiln_group *g = user;
    if (!g->closing) return kiln_session_run(g->s[r]);
    if (g->comms[r]) g->nccl->CommDestroy(g->comms[r]);
    g->comms[r] = NULL;
    return NULL;
}

/* Destroys the communicators: first the sessions' CUDA graphs, which hold references on them
 * (rt_drop_graphs), then each on its rank's thread, all at once, since a rank's destruction may
 * wait for the other ranks of the process; without the threads (kiln_group_new failed after
 * ncclCommInitAll), in one NCCL group call. */
static void destroy_comms(kiln_group *g) {
    if (!g->comms || !g->nccl || g->aborted) return; /* (aborted ones are freed already) */
    for (int r = 0; g->s && r < g->n; r++)
        if (g->s[r]) rt_drop_graphs(g->s[r]);
    if (g->ranks && rt_ranks_broken(g->ranks) < 0) {
        int failed;
        g->closing = true;
        kiln_status_free(rt_ranks_run(g->ranks, &failed));
        return;
    }
    g->nccl->GroupStart();
    for (int r = 0; r < g->n; r++)
        if (g->comms[r]) g->nccl->CommDestroy(g->comms[r]);
    g->nccl->GroupEnd();
}

/* The first failure: abort every communicator (under rt_ranks' lock), so that no rank waits on
 * its GPU for an all_reduce that will not come. */
static void abort_all(void *user, int rank) {
    kiln_group *g = user;
    (void)rank;
    g->aborted = true;
    for (int r = 0; r < g->n; r++)
        if (g->comms[r]) g->nccl->CommAbort(g->comms[r]);
}

/* Gives session s (and its variants) rank r's communicator. */
static void join(kiln_group *g, int r) {
    kiln_session *s = g->s[r];
    for (int v = -1; v < s->nspec; v++) {
        kiln_session *u = v < 0 ? s : s->spec[v];
        u->nccl = g->nccl, u->comm = g->comms[r], u->rank = r, u->nranks = g->n;
    }
}

kiln_status kiln_group_new(const kiln_program *const *programs, int n, const kiln_group_opts *opts, kiln_group **out) {
    if (!out) return kb_error(KILN_ERR_INVALID, "kiln_group_new: out is NULL");
    *out = NULL;
    kiln_status st = check_args(programs, n, opts);
    const int  *devs = opts ? opts->devices : NULL;
    if (!st) st = check_devices(n, devs);
    kiln_group *g = NULL;
    if (!st && !(g = calloc(1, sizeof *g))) st = kb_oom();
    if (st) return st;
    g->n = n;
    g->s = calloc((size_t)n, sizeof *g->s);
    g->comms = calloc((size_t)n, sizeof *g->comms);
    int *list = calloc((size_t)n, sizeof *list);
    if (!g->s || !g->comms || !list) st = kb_oom();
    for (int r = 0; !st && r < n; r++) {
        list[r] = devs ? devs[r] : r;
        kiln_session_opts so = {.no_cuda_graph = opts ? opts->no_cuda_graph : 0, .device = list[r]};
        if ((st = kiln_session_new(programs[r], &so, &g->s[r])))
            st = kb_wrap(st, "kiln_group_new: rank %d (device %d)", r, list[r]);
    }
    if (!st) st = rt_nccl_init(&g->nccl);
    if (!st) {
        int res = g->nccl->CommInitAll(g->comms, n, list);
        if (res) {
            char what[96];
            snprintf(what, sizeof what, "creating the communicators of %d GPUs", n);
            st = rt_nccl_error(res, "ncclCommInitAll", what);
            memset(g->comms, 0, (size_t)n * sizeof *g->comms);
        }
    }
    free(list);
    for (int r = 0; !st && r < n; r++) join(g, r);
    if (!st) st = rt_ranks_new(n, run_rank, abort_all, g, &g->ranks);
    if (st) {
        kiln_group_free(g);
        return st;
    }
    *out = g;
    return NULL;
}

void kiln_group_free(kiln_group *g) {
    if (!g) return;
    /* The sessions' streams are idle (every run waits for its work); the communicators go
     * before the contexts the sessions release. */
    destroy_comms(g);
    rt_ranks_free(g->ranks); /* (its threads joined: no run is in flight) */
    for (int r = 0; g->s && r < g->n; r++) kiln_session_free(g->s[r]);
    free(g->s);
    free(g->comms);
    free(g);
}

int kiln_group_size(const kiln_group *g) { return g ? g->n : 0; }

kiln_session *kiln_group_session(const kiln_group *g, int rank) {
    return g && rank >= 0 && rank < g->n ? g->s[rank] : NULL;
}

kiln_status kiln_group_run(kiln_group *g) {
    if (!g) return kb_error(KILN_ERR_INVALID, "kiln_group_run: group is NULL");
    int         failed;
    kiln_status st = rt_ranks_run(g->ranks, &failed);
    if (!st) return NULL;
    return kb_wrap(st, "kiln_group_run: rank %d%s", failed,
                   g->aborted ? " (the group's communicators are aborted: make a new group)" : "");
}
