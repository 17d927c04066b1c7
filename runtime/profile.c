/* KILN_PROFILE=1: where a program's GPU time goes, kernel by kernel. The session launches
 * plainly (no CUDA graph) with an event after each kernel; when it is freed it prints, on
 * stderr, the average time per run of each kernel name, largest first. Times between events
 * include the gap to the previous kernel, so launch-bound stretches show up as such. */
#include "runtime/session_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool rt_profile_wanted(void) {
    const char *e = getenv("KILN_PROFILE");
    return e && *e && strcmp(e, "0") != 0;
}

static kiln_status profile_alloc(kiln_session *s) {
    int n = s->nlaunches + 1;
    if (!(s->prof_ev = calloc((size_t)n, sizeof *s->prof_ev)) || !(s->prof_ms = calloc((size_t)n, sizeof *s->prof_ms)))
        return kb_oom();
    for (int i = 0; i < n; i++) {
        rt_cures r = s->cu->EventCreate(&s->prof_ev[i], RT_CU_EVENT_DEFAULT);
        if (r != RT_CUDA_SUCCESS) return rt_cuda_error(r, "cuEventCreate", "setting up KILN_PROFILE");
    }
    return NULL;
}

kiln_status rt_profile_mark(kiln_session *s, int i) {
    if (!s->profile) return NULL;
    kiln_status st = s->prof_ev ? NULL : profile_alloc(s);
    if (st) return st;
    rt_cures r = s->cu->EventRecord(s->prof_ev[i], s->stream);
    return r == RT_CUDA_SUCCESS ? NULL : rt_cuda_error(r, "cuEventRecord", "KILN_PROFILE after kernel %d", i - 1);
}

/* KILN_PROFILE_SKIP=N leaves a session's first N runs out of the average: a batch's prompt
 * steps before the decode steps one wants to see (kiln bench --batch-only --seqs 64). */
static int64_t profile_skip(void) {
    const char *e = getenv("KILN_PROFILE_SKIP");
    return e && *e ? strtoll(e, NULL, 10) : 0;
}

void rt_profile_collect(kiln_session *s) {
    if (!s->profile || !s->prof_ev) return;
    if (s->prof_seen++ < profile_skip()) return;
    for (int i = 0; i < s->nlaunches; i++) {
        float ms = 0;
        if (s->cu->EventElapsedTime(&ms, s->prof_ev[i], s->prof_ev[i + 1]) == RT_CUDA_SUCCESS) s->prof_ms[i] += ms;
    }
    s->prof_runs++;
}

typedef struct {
    const char *name;
    double      ms;
    int         count;
} prof_row;

static int by_ms(const void *a, const void *b) {
    double x = ((const prof_row *)a)->ms, y = ((const prof_row *)b)->ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

void rt_profile_report(kiln_session *s) {
    if (!s->profile || s->prof_runs == 0) return;
    prof_row *rows = calloc((size_t)s->nlaunches + 1, sizeof *rows);
    int       n = 0;
    double    total = 0;
    for (int i = 0; rows && i < s->nlaunches; i++) {
        int j = 0;
        while (j < n && strcmp(rows[j].name, s->launches[i].name) != 0) j++;
        if (j == n) rows[n++].name = s->launches[i].name;
        rows[j].ms += s->prof_ms[i] / (double)s->prof_runs;
        rows[j].count++;
        total += s->prof_ms[i] / (double)s->prof_runs;
    }
    if (rows) {
        qsort(rows, (size_t)n, sizeof *rows, by_ms);
        fprintf(stderr, "kiln profile: %s%d launches per run, %lld runs (%lld skipped), %.3f ms per run (plain launches)\n",
                s->primary ? "decode variant, " : "", s->nlaunches, (long long)s->prof_runs,
                (long long)(s->prof_seen - s->prof_runs), total);
        fprintf(stderr, "  %10s %6s %7s %9s  %s\n", "us/run", "%", "count", "us each", "kernel");
        for (int j = 0; j < n; j++)
            fprintf(stderr, "  %10.1f %5.1f%% %7d %9.2f  %s\n", rows[j].ms * 1e3, 100 * rows[j].ms / total, rows[j].count,
                    rows[j].ms * 1e3 / rows[j].count, rows[j].name);
    }
    free(rows);
}

void rt_profile_free(kiln_session *s) {
    for (int i = 0; s->prof_ev && i <= s->nlaunches; i++)
        if (s->prof_ev[i]) s->cu->EventDestroy(s->prof_ev[i]);
    free(s->prof_ev);
    free(s->prof_ms);
}
