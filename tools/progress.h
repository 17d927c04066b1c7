/* Progress of long work on stderr, for the kiln command (tools/progress.c). Prefix kt_. */
#ifndef KILN_TOOLS_PROGRESS_H
#define KILN_TOOLS_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

/* One bar or line of progress: tty draws a bar redrawn in place (set it from isatty(2)),
 * otherwise plain lines at most every 2 s. Zero-initialize, set tty. */
typedef struct {
    double t0, last;
    bool   tty, shown;
} kt_progress;

/* "12/40 kernels compiled": a kiln_compile_opts progress callback (user: a kt_progress). */
void kt_progress_count(void *user, const char *what, int done, int total);
/* "1.20/16.06 GB weights (5.1 GB/s)" */
void kt_progress_bytes(void *user, const char *what, uint64_t done, uint64_t total);

#endif
