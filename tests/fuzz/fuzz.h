/* What the fuzz targets (tests/fuzz/fuzz_*.c, docs/fuzzing.md) share: each is one
 * LLVMFuzzerTestOneInput over kiln's library. Every failure there must be a returned status;
 * a crash, a sanitizer report, a leak or a timeout is a finding. */
#ifndef KILN_FUZZ_H
#define KILN_FUZZ_H

#include "kiln.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A status the target does not look at: only that it came back instead of a crash. With
 * KILN_FUZZ_VERBOSE=1 in the environment it is printed (to see how far an input gets). */
static inline void fz_drop(kiln_status st) {
    static int verbose = -1;
    if (verbose < 0) verbose = getenv("KILN_FUZZ_VERBOSE") && *getenv("KILN_FUZZ_VERBOSE") == '1';
    if (st && verbose) fprintf(stderr, "status: %s\n", kiln_status_msg(st));
    kiln_status_free(st);
}

/* data as a file that path-taking readers can open (/proc/self/fd/N of a memfd: no disk, no
 * name to clean up). Returns the fd (close it after), or -1. */
static inline int fz_memfd(const uint8_t *data, size_t size, char path[64]) {
    int fd = memfd_create("kiln-fuzz", MFD_CLOEXEC);
    if (fd < 0) return -1;
    size_t done = 0;
    while (done < size) {
        ssize_t n = write(fd, data + done, size - done);
        if (n <= 0) {
            close(fd);
            return -1;
        }
        done += (size_t)n;
    }
    snprintf(path, 64, "/proc/self/fd/%d", fd);
    return fd;
}

/* Compile options for generating sources only: no NVRTC, no cache, no dump, one thread. */
static inline kiln_compile_opts fz_sources_only(void) {
    kiln_compile_opts o = {0};
    o.skip_nvrtc = 1;
    o.cache_mode = KILN_CACHE_OFF;
    o.no_program_cache = 1;
    o.jobs = 1;
    o.dump_dir = "";
    return o;
}

/* The graph whose serialized programs fuzz_cache reads (a plan is only read against the graph
 * it was built for): a symbolic dim with a specialization, a matmul and a fused elementwise
 * tail, so that plans hold several kernels, a shared key and a specialized variant.
 * fuzz_seeds writes its plans and cache entries from the same text. */
static const char fz_plan_graph[] =
    "kiln-graph 1\n"
    "dim n <= 8 specialize 1\n"
    "input x: f32[64, n]\n"
    "weight w: f16[64, 32]\n"
    "weight b: f32[32]\n"
    "h = mul_mat(w, x)\n"
    "hb = add(h, b)\n"
    "output y = silu(hb)\n"
    "output z = rms_norm(x, 1e-6)\n";

#endif
