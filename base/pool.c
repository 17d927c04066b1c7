/* A fork-join loop over a thread pool: kiln's compile work (template instantiation, NVRTC) is
 * a list of independent items, so a shared counter hands them out and the caller waits for
 * all. Workers are numbered so that each can keep state of its own (a Lua state). */
#include "base/base.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct {
    int             n, next;
    pthread_mutex_t lock;
    void (*fn)(void *user, int item, int worker);
    void *user;
} pool;

typedef struct {
    pool *p;
    int   worker;
} worker_arg;

static void *work(void *arg) {
    worker_arg *w = arg;
    pool       *p = w->p;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        int i = p->next < p->n ? p->next++ : -1;
        pthread_mutex_unlock(&p->lock);
        if (i < 0) break;
        p->fn(p->user, i, w->worker);
    }
    return NULL;
}

int kb_default_jobs(void) {
    const char *env = getenv("KILN_JOBS");
    if (env && *env) {
        char *end;
        long  v = strtol(env, &end, 10);
        if (!*end && v >= 1 && v <= 1024) return (int)v;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n >= 1 ? (int)(n > 256 ? 256 : n) : 1;
}

int kb_parallel_for(int n, int jobs, void (*fn)(void *user, int item, int worker), void *user) {
    if (n <= 0) return 0;
    if (jobs > n) jobs = n;
    if (jobs < 1) jobs = 1;
    pool p = {.n = n, .fn = fn, .user = user};
    pthread_mutex_init(&p.lock, NULL);
    pthread_t  *th = calloc((size_t)jobs, sizeof *th);
    worker_arg *args = calloc((size_t)jobs, sizeof *args);
    int         started = 0;
    /* Worker 0 is the calling thread: a pool of one spawns nothing. */
    for (int w = 1; th && args && w < jobs; w++) {
        args[w] = (worker_arg){&p, w};
        if (pthread_create(&th[w], NULL, work, &args[w]) != 0) break;
        started = w;
    }
    worker_arg self = {&p, 0};
    work(&self);
    for (int w = 1; w <= started; w++) pthread_join(th[w], NULL);
    pthread_mutex_destroy(&p.lock);
    free(th);
    free(args);
    return started + 1;
}
