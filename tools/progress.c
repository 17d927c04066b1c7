/* Progress lines of the kiln command on stderr (tools/progress.h). */
#include "tools/progress.h"

#include "base/base.h"

#include <stdio.h>

static void draw(kt_progress *ps, double now, bool end, double frac, const char *text) {
    if (ps->tty) {
        int  width = 30, fill = (int)(frac * width);
        char bar[64];
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
        bar[width] = 0;
        fprintf(stderr, "\rkiln: [%s] %s", bar, text);
        if (end) fputc('\n', stderr);
    } else {
        fprintf(stderr, "kiln: %s\n", text);
    }
    fflush(stderr);
    ps->last = now;
    ps->shown = !end;
}

/* Whether to draw now: not in the first half second (quick work shows nothing), then at most
 * every 0.1 s on a terminal and every 2 s otherwise, and always the end of a shown bar. */
static bool due(kt_progress *ps, double now, bool end) {
    if (!ps->t0) ps->t0 = now;
    if (now - ps->t0 < 500 && !(end && ps->shown)) return false;
    if (end) return true;
    return now - ps->last >= (ps->tty ? 100 : 2000);
}

void kt_progress_count(void *user, const char *what, int done, int total) {
    kt_progress *ps = user;
    double       now = kb_now_ms();
    bool         end = done == total;
    if (!due(ps, now, end)) return;
    char text[160];
    snprintf(text, sizeof text, "%d/%d %s", done, total, what);
    draw(ps, now, end, total ? (double)done / total : 1.0, text);
}

void kt_progress_bytes(void *user, const char *what, uint64_t done, uint64_t total) {
    kt_progress *ps = user;
    double       now = kb_now_ms();
    bool         end = done == total;
    if (!due(ps, now, end)) return;
    char   text[160];
    double s = (now - ps->t0) / 1000;
    snprintf(text, sizeof text, "%.2f/%.2f GB %s (%.1f GB/s)", (double)done / 1e9, (double)total / 1e9, what,
             s > 0 ? (double)done / 1e9 / s : 0.0);
    draw(ps, now, end, total ? (double)done / (double)total : 1.0, text);
}
