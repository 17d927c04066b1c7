/* CPU reference of the collective family: all_reduce, and kiln_reference_group, which evaluates
 * a tensor-parallel group's graphs together.
 *
 * Each rank's graph runs on a thread of its own (kiln_reference as for one graph) with the
 * group and its rank in thread-local storage. At an all_reduce node a rank copies its operand
 * (any layout) contiguous, publishes it and waits at the group's barrier; then every rank adds
 * all ranks' values in rank order, so each gets the same sums bit for bit (as NCCL's all-reduce
 * gives every rank one result), and waits again before its copy may be freed.
 *
 * No rank may wait forever: a rank whose evaluation ends (an error, or a graph with fewer
 * all_reduce nodes) leaves the group, and a barrier that would need a rank that left fails
 * every rank still waiting at it with an error naming the node. */
#include "ir_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    int             n;       /* ranks */
    int             arrived; /* at the current barrier */
    unsigned long   gen;     /* barriers passed */
    int             left;    /* ranks whose evaluation has ended */
    const float   **vals;    /* [n]: each rank's contiguous operand at the current all_reduce */
    int64_t        *counts;  /* [n]: its element count */
} group;

typedef struct {
    group *g;
    int    rank;
} member;

static _Thread_local member tl_member;
/* Whether this thread's all_reduce failed because another rank ended first (its error is not
 * the cause: kiln_reference_group reports the cause's). */
static _Thread_local bool tl_waited;

/* The group's barrier: true when every rank arrived; false when a rank has left instead. */
static bool barrier(group *g) {
    pthread_mutex_lock(&g->mu);
    unsigned long gen = g->gen;
    bool          ok;
    if (++g->arrived == g->n) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
        ok = true;
    } else {
        while (g->gen == gen && g->left == 0) pthread_cond_wait(&g->cv, &g->mu);
        ok = g->gen != gen;
        if (!ok) g->arrived--; /* (the barrier will not complete: nobody counts on this arrival) */
    }
    pthread_mutex_unlock(&g->mu);
    return ok;
}

static void leave(group *g) {
    pthread_mutex_lock(&g->mu);
    g->left++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static kiln_status all_reduce(const ir_node *n, void **data) {
    const ir_ref *a = ir_operand(n, 0), *d = &n->dst;
    const int     ranks = n->ip[0];
    member        m = tl_member;
    if (!m.g)
        return kb_error(KILN_ERR_INVALID, "reference: all_reduce over %d ranks outside a group: evaluate the group's "
                                          "graphs together (kiln_reference_group)", ranks);
    if (m.g->n != ranks)
        return kb_error(KILN_ERR_INVALID, "reference: all_reduce over %d ranks in a group of %d graphs", ranks, m.g->n);
    int64_t cnt = d->ne[0] * d->ne[1] * d->ne[2] * d->ne[3];
    float  *mine = malloc((size_t)(cnt ? cnt : 1) * sizeof *mine);
    if (!mine) return kb_oom();
    int64_t c[4], i = 0;
    for (c[3] = 0; c[3] < d->ne[3]; c[3]++)
        for (c[2] = 0; c[2] < d->ne[2]; c[2]++)
            for (c[1] = 0; c[1] < d->ne[1]; c[1]++)
                for (c[0] = 0; c[0] < d->ne[0]; c[0]++) mine[i++] = kb_load_f32(data[a->buf], a->type, ir_offset_at(a, c));
    m.g->vals[m.rank] = mine, m.g->counts[m.rank] = cnt;
    kiln_status st = NULL;
    if (!barrier(m.g)) {
        tl_waited = true;
        st = kb_error(KILN_ERR_INVALID, "reference: all_reduce: rank %d waited for a rank whose evaluation had ended "
                                        "(an error, or fewer all_reduce nodes in its graph)", m.rank);
    } else {
        for (int r = 0; r < ranks && !st; r++)
            if (m.g->counts[r] != cnt)
                st = kb_error(KILN_ERR_INVALID, "reference: all_reduce of %lld elements on rank %d, %lld on rank %d",
                              (long long)cnt, m.rank, (long long)m.g->counts[r], r);
        i = 0;
        for (c[3] = 0; !st && c[3] < d->ne[3]; c[3]++)
            for (c[2] = 0; c[2] < d->ne[2]; c[2]++)
                for (c[1] = 0; c[1] < d->ne[1]; c[1]++)
                    for (c[0] = 0; c[0] < d->ne[0]; c[0]++, i++) {
                        float s = m.g->vals[0][i];
                        for (int r = 1; r < ranks; r++) s += m.g->vals[r][i];
                        kb_store_f32(data[d->buf], d->type, ir_offset_at(d, c), s);
                    }
        /* the others may still be reading this rank's values */
        if (!barrier(m.g)) {
            tl_waited = true;
            if (!st) st = kb_error(KILN_ERR_INVALID, "reference: all_reduce: rank %d's group lost a rank after the sums",
                                   m.rank);
        }
    }
    free(mine);
    return st;
}

kiln_status ir_ref_collective(const ir_prog *p, const ir_node *n, void **data) {
    (void)p;
    if (n->op != FE_OP_ALL_REDUCE || !ir_operand(n, 0))
        return kb_error(KILN_ERR_INVALID, "reference: %s is not an all_reduce node with its operand", fe_ops[n->op].name);
    return all_reduce(n, data);
}

typedef struct {
    group            *g;
    int               rank;
    const kiln_graph *graph;
    kiln_ref_get_fn   get;
    kiln_ref_put_fn   put;
    void             *user;
    kiln_status       st;
    bool              waited; /* its error came from a rank that ended first */
} rank_job;

static void *rank_main(void *arg) {
    rank_job *j = arg;
    tl_member = (member){j->g, j->rank};
    tl_waited = false;
    j->st = kiln_reference(j->graph, j->get, j->put, j->user);
    j->waited = tl_waited;
    tl_member = (member){NULL, 0};
    leave(j->g);
    return NULL;
}

kiln_status kiln_reference_group(const kiln_graph *const *g, int n, kiln_ref_get_fn get, kiln_ref_put_fn put,
                                 void *const *user) {
    if (!g || !get || !put || !user) return kb_error(KILN_ERR_INVALID, "kiln_reference_group: NULL argument");
    if (n < 1 || n > 64) return kb_error(KILN_ERR_INVALID, "kiln_reference_group: %d graphs; a group has 1 .. 64", n);
    for (int r = 0; r < n; r++)
        if (!g[r]) return kb_error(KILN_ERR_INVALID, "kiln_reference_group: graph %d is NULL", r);
    group      grp = {.n = n};
    rank_job  *jobs = calloc((size_t)n, sizeof *jobs);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    grp.vals = calloc((size_t)n, sizeof *grp.vals);
    grp.counts = calloc((size_t)n, sizeof *grp.counts);
    kiln_status st = NULL;
    if (!jobs || !th || !grp.vals || !grp.counts) st = kb_oom();
    if (!st) {
        pthread_mutex_init(&grp.mu, NULL);
        pthread_cond_init(&grp.cv, NULL);
        int started = 0;
        for (int r = 0; r < n; r++) {
            jobs[r] = (rank_job){&grp, r, g[r], get, put, user[r], NULL, false};
            if (pthread_create(&th[r], NULL, rank_main, &jobs[r]) != 0) {
                st = kb_error(KILN_ERR_NOMEM, "kiln_reference_group: cannot start the thread of rank %d", r);
                leave(&grp); /* (the started ranks' barriers fail instead of waiting for it) */
                break;
            }
            started++;
        }
        for (int r = 0; r < started; r++) pthread_join(th[r], NULL);
        /* the cause: the first rank's error that is not a wait for an ended rank */
        int cause = -1;
        for (int r = 0; r < started && cause < 0; r++)
            if (jobs[r].st && !jobs[r].waited) cause = r;
        for (int r = 0; r < started && cause < 0; r++)
            if (jobs[r].st) cause = r;
        for (int r = 0; r < started; r++) {
            if (!jobs[r].st) continue;
            if (r == cause && !st) st = kb_wrap(jobs[r].st, "rank %d", r);
            else kiln_status_free(jobs[r].st);
        }
        pthread_cond_destroy(&grp.cv);
        pthread_mutex_destroy(&grp.mu);
    }
    free(grp.counts);
    free(grp.vals);
    free(th);
    free(jobs);
    return st;
}
