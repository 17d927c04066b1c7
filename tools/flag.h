/* Values of command-line flags, checked whole (tools/flag.c). Prefix kt_flag_.
 *
 * Every numeric flag of every kiln command goes through these, so that each one refuses
 * the same things the same way: an empty value, trailing characters, a sign where none
 * belongs, a value that does not fit 64 bits, a value outside the flag's range. On failure
 * they print the usage message to stderr, naming the command, the flag, what it got and
 * the range:
 *
 *     kiln run: -n 99999999999999999999: not an integer in 0 .. 2147483648
 *     (see 'kiln help run')
 *
 * and return false; the caller exits with status 2 (bad usage). */
#ifndef KILN_TOOLS_FLAG_H
#define KILN_TOOLS_FLAG_H

#include "base/base.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Largest context (KV cache slots) and batch the model builder accepts (2^31): the bound of
 * --n-ctx, --n-batch, --n-tokens and -n. */
#define KT_FLAG_MAX_CTX ((int64_t)1 << 31)
/* Compile threads: as many as KILN_JOBS accepts (base/pool.c). */
#define KT_FLAG_MAX_JOBS 1024

/* cmd names the command in messages ("run", "cache evict"); flag names the flag ("-n"). */

/* A decimal integer in min .. max ("-" only when min < 0). */
bool kt_flag_int(const char *cmd, const char *flag, const char *text, int64_t min, int64_t max, int64_t *out);
/* kt_flag_int for an int-sized value (--jobs, --iters). */
bool kt_flag_int32(const char *cmd, const char *flag, const char *text, int min, int max, int *out);
/* A decimal integer in 0 .. max, never negative (seeds: the whole of uint64_t). */
bool kt_flag_uint(const char *cmd, const char *flag, const char *text, uint64_t max, uint64_t *out);
/* A finite decimal number ("0.8", "1e-3"); its range is the caller's (kiln_sampler_check). */
bool kt_flag_float(const char *cmd, const char *flag, const char *text, float *out);
/* A size in bytes with an optional K, M, G or T suffix ("512M", "2G"), as KILN_CACHE_MAX. */
bool kt_flag_size(const char *cmd, const char *flag, const char *text, uint64_t *out);
/* A comma-separated list of integers in min .. max ("1,2,3"), at most cap of them; *n gets
 * the count. An empty list or an empty item is refused. */
bool kt_flag_int_list(const char *cmd, const char *flag, const char *text, int64_t min, int64_t max, int32_t *out,
                      int64_t cap, int64_t *n);
/* How many items kt_flag_int_list may find in text (commas + 1): the capacity to allocate. */
int64_t kt_flag_list_count(const char *text);

/* --no-fuse=NAME[,NAME] (arg is the whole argument): checks the pass names and appends them to
 * list (cap bytes, comma-separated, "" at first); false after a usage message. */
bool kt_flag_no_fuse(const char *cmd, const char *arg, char *list, size_t cap);
/* --arch: an architecture kiln generates code for (kiln_check_arch), or with list several,
 * comma-separated (only compile builds for several). */
bool kt_flag_arch(const char *cmd, const char *flag, const char *value, bool list);

/* Prints "kiln CMD: " + the formatted message + "(see 'kiln help CMD')" to stderr and returns
 * false: the usage error of a check that spans several flags ("--n-batch 64 exceeds --n-ctx").
 * With cmd NULL, "kiln: " and "(see 'kiln help')". */
bool kt_flag_usage(const char *cmd, const char *fmt, ...) KB_PRINTF(2, 3);
/* kt_flag_usage with a va_list (kt_usage, tools/cmd.h, returns the exit status instead). */
void kt_flag_vusage(const char *cmd, const char *fmt, va_list ap);

#endif
