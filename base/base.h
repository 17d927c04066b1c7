/* base: what every folder of kiln needs — status values, a growable string, half-precision
 * conversion, files and clocks. Prefix kb_. */
#ifndef KILN_BASE_H
#define KILN_BASE_H

#include "kiln.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define KB_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define KB_PRINTF(f, a)
#endif

/* A new status with a printf-formatted message. Never returns NULL: when the status itself
 * cannot be allocated it returns a static out-of-memory status that kiln_status_free ignores. */
kiln_status kb_error(kiln_code code, const char *fmt, ...) KB_PRINTF(2, 3);
kiln_status kb_errorv(kiln_code code, const char *fmt, va_list ap);
kiln_status kb_oom(void);
/* A status whose message is prefix + ": " + st's message; st is consumed. */
kiln_status kb_wrap(kiln_status st, const char *fmt, ...) KB_PRINTF(2, 3);
kiln_status kb_status_copy(kiln_status st);

/* Growable NUL-terminated string. On allocation failure it sets oom and stops growing. */
typedef struct {
    char  *s;
    size_t len, cap;
    bool   oom;
} kb_str;

void  kb_str_add(kb_str *b, const char *s);
void  kb_str_addn(kb_str *b, const char *s, size_t n);
void  kb_str_addf(kb_str *b, const char *fmt, ...) KB_PRINTF(2, 3);
char *kb_str_take(kb_str *b); /* the string (caller frees), or NULL if oom; b is reset */
void  kb_str_free(kb_str *b);

/* IEEE half and bfloat16, round to nearest even (NaN stays NaN). */
float    kb_f16_to_f32(uint16_t h);
uint16_t kb_f32_to_f16(float f);
float    kb_bf16_to_f32(uint16_t h);
uint16_t kb_f32_to_bf16(float f);
/* Element i of a typed array as float, and the reverse (integers convert by value). */
float kb_load_f32(const void *p, kiln_type t, int64_t i);
void  kb_store_f32(void *p, kiln_type t, int64_t i, float v);

/* The shortest "%.Ng" text (N = 1..9) that reads back as exactly f: 0.1f prints "0.1", not
 * "0.100000001". Finite values only; out needs 32 bytes. */
void kb_format_float(float f, char out[32]);

kiln_status kb_read_file(const char *path, char **data, size_t *len); /* NUL-terminated */
kiln_status kb_write_file(const char *path, const void *data, size_t len);
kiln_status kb_mkdirs(const char *path); /* mkdir -p */
double      kb_now_ms(void);             /* monotonic clock */

/* Fill with deterministic pseudo-random values in [-1, 1) (splitmix64). */
void kb_fill_random(void *p, kiln_type t, int64_t n, uint64_t seed);

#endif
