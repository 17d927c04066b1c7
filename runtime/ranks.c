/* rt_ranks: one call of a function per rank, all ranks at once (runtime/runtime.h). A group's
 * runs (runtime/group.c) need it: an all_reduce step does not return until every rank reached
 * it, so the ranks' runs must be issued concurrently. Ranks 1.. have worker threads for the
 * runner's life, waiting for a generation counter under a mutex; rank 0 runs on the caller's
 * thread. The first failure of a run calls `fail` once, under the lock (group.c aborts the
 * communicators there, so that no rank waits on its GPU for an all-reduce that will not come),
 * and the runner is broken from then on: later runs fail at once, naming that rank. Kept apart
 * from the GPU so that make test (and its ThreadSanitizer build) exercises it. */
#include "runtime/runtime.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct {
    rt_ranks   *p;
    int         rank;
    pthread_t   thread;
    bool        started;
    kiln_status st; /* this rank's last run */
} rt_worker;

struct rt_ranks {
    int             n;
    rt_rank_fn      fn;
    rt_rank_fail_fn fail;
    void           *user;
    rt_worker      *w;
    pthread_mutex_t mu;
    pthread_cond_t  go, done;
    uint64_t        gen;    /* runs handed out */
    int             left;   /* workers still running the current one */
    bool            quit;
    int             broken; /* 1 + the rank whose failure broke the runner, or 0 */
};

/* A rank failed (under p->mu): the first failure calls fail and breaks the runner. */
static void failed_locked(rt_ranks *p, int rank) {
    if (p->broken) return;
    p->broken = rank + 1;
    if (p->fail) p->fail(p->user, rank);
}

static void *worker_main(void *arg) {
    rt_worker *w = arg;
    rt_ranks  *p = w->p;
    uint64_t   seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->gen == seen) pthread_cond_wait(&p->go, &p->mu);
        if (p->quit) break;
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        kiln_status st = p->fn(p->user, w->rank);
        pthread_mutex_lock(&p->mu);
        w->st = st;
        if (st) failed_locked(p, w->rank);
        if (--p->left == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

kiln_status rt_ranks_new(int n, rt_rank_fn fn, rt_rank_fail_fn fail, void *user, rt_ranks **out) {
    *out = NULL;
    if (n < 1 || !fn) return kb_error(KILN_ERR_INVALID, "rt_ranks_new: %d ranks", n);
    rt_ranks *p = calloc(1, sizeof *p);
    if (!p) return kb_oom();
    *p = (rt_ranks){.n = n, .fn = fn, .fail = fail, .user = user};
    if (!(p->w = calloc((size_t)n, sizeof *p->w))) {
        free(p);
        return kb_oom();
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    for (int r = 1; r < n; r++) {
        p->w[r] = (rt_worker){.p = p, .rank = r};
        if (pthread_create(&p->w[r].thread, NULL, worker_main, &p->w[r])) {
            rt_ranks_free(p);
            return kb_error(KILN_ERR_NOMEM, "rt_ranks_new: cannot start rank %d's thread", r);
        }
        p->w[r].started = true;
    }
    *out = p;
    return NULL;
}

void rt_ranks_free(rt_ranks *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = true;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int r = 1; r < p->n; r++) {
        if (p->w[r].started) pthread_join(p->w[r].thread, NULL);
        kiln_status_free(p->w[r].st);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p->w);
    free(p);
}

int rt_ranks_broken(rt_ranks *p) {
    pthread_mutex_lock(&p->mu);
    int b = p->broken - 1;
    pthread_mutex_unlock(&p->mu);
    return b;
}

kiln_status rt_ranks_run(rt_ranks *p, int *failed) {
    *failed = -1;
    pthread_mutex_lock(&p->mu);
    if (p->broken) {
        *failed = p->broken - 1;
        pthread_mutex_unlock(&p->mu);
        return kb_error(KILN_ERR_INVALID, "rank %d failed in an earlier run: the ranks cannot run again", *failed);
    }
    for (int r = 1; r < p->n; r++) {
        kiln_status_free(p->w[r].st);
        p->w[r].st = NULL;
    }
    p->left = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    kiln_status st0 = p->fn(p->user, 0);
    pthread_mutex_lock(&p->mu);
    if (st0) failed_locked(p, 0);
    while (p->left > 0) pthread_cond_wait(&p->done, &p->mu);
    /* the error of the rank that failed first (the others' may follow from its failure) */
    kiln_status st = NULL;
    if (p->broken) {
        *failed = p->broken - 1;
        if (*failed == 0) st = st0, st0 = NULL;
        else st = p->w[*failed].st, p->w[*failed].st = NULL;
    }
    pthread_mutex_unlock(&p->mu);
    kiln_status_free(st0);
    return st;
}
