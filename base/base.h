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
/* v in decimal, as "%lld" prints it, into buf (returned); kb_str_add_i64 appends it. Without
 * printf's machinery: a model's graph text is mostly extents. */
char *kb_fmt_i64(int64_t v, char buf[24]);
void  kb_str_add_i64(kb_str *b, int64_t v);
char *kb_str_take(kb_str *b); /* the string (caller frees), or NULL if oom; b is reset */
/* In "key value" lines (cache metas, bundle signatures; a line "--- NAME" starts a body that
 * is not searched): the value of the first line for key, cut to cap - 1 bytes. out is "" and
 * the result false when there is none. */
bool  kb_text_field(const char *text, const char *key, char *out, size_t cap);
void  kb_str_free(kb_str *b);

/* IEEE half and bfloat16, round to nearest even (NaN stays NaN). */
float    kb_f16_to_f32(uint16_t h);
uint16_t kb_f32_to_f16(float f);
float    kb_bf16_to_f32(uint16_t h);
uint16_t kb_f32_to_bf16(float f);
/* Element i of a typed array as float, and the reverse (integers convert by value). */
float kb_load_f32(const void *p, kiln_type t, int64_t i);
void  kb_store_f32(void *p, kiln_type t, int64_t i, float v);
/* Quantized types (base/quant.c): element i (counted from p, which is block-aligned) as ggml's
 * dequantize_row_* gives it; n elements from p (n a multiple of the block) into y; and x's n
 * elements quantized into p with kiln's own quantizer (false for a type that is not quantized
 * or n not a multiple of the block). kb_load_f32 reads quantized types through the first. */
float kb_dequant_elem(const void *p, kiln_type t, int64_t i);
void  kb_dequant_row(const void *p, kiln_type t, float *y, int64_t n);
bool  kb_quant_row(const float *x, kiln_type t, void *p, int64_t n);
/* The device layout of quantized weights (templates/quant.lua): q8_0, q4_0 and q6_K buffers are
 * tiles of KB_QTILE blocks, each the tile's blocks without their f16 scales, then the scales
 * (the last tile as many as it holds); q5_0 and q5_1 the same with their 16 bytes of low parts
 * as the body and their head (d, q5_1's m, the 4 bytes of high bits: 6 or 8 bytes) as the scale; mxfp4 the same with tiles of 16 blocks and its one-byte
 * scales (kb_quant_tile: a type's tile); the other types keep the file's layout. kb_quant_split
 * says whether t is tiled so; to/from convert `bytes` (whole
 * blocks) between the file's layout and the device's (false, nothing written, for a type that
 * is not split or a size that is not whole blocks). src and dst must not overlap. */
#define KB_QTILE 8
bool  kb_quant_split(kiln_type t);
int   kb_quant_tile(kiln_type t);
bool  kb_quant_to_device(kiln_type t, const void *src, void *dst, size_t bytes);
bool  kb_quant_from_device(kiln_type t, const void *src, void *dst, size_t bytes);
/* sum (got - ref)^2 / sum ref^2 over n values of type t (the plain sum when ref is all zero):
 * how kiln compares the GPU with the CPU reference. */
double kb_nmse(const void *ref, const void *got, kiln_type t, int64_t n);

/* The shortest "%.Ng" text (N = 1..9) that reads back as exactly f: 0.1f prints "0.1", not
 * "0.100000001". Finite values only; out needs 32 bytes. */
void kb_format_float(float f, char out[32]);

kiln_status kb_read_file(const char *path, char **data, size_t *len); /* NUL-terminated */
kiln_status kb_write_file(const char *path, const void *data, size_t len);
kiln_status kb_mkdirs(const char *path); /* mkdir -p */
int         kb_mkdirs_errno(const char *path); /* mkdir -p: 0, or the errno (ENOTDIR: path or a parent is a file) */
double      kb_now_ms(void);             /* monotonic clock */

/* Fill with deterministic pseudo-random values in [-1, 1) (splitmix64); quantized types get
 * such values quantized, block by block (n a multiple of the block). */
void kb_fill_random(void *p, kiln_type t, int64_t n, uint64_t seed);

/* Little-endian binary records (base/bytes.c). Writers append to a kb_str (binary-safe). */
void kb_put_u32(kb_str *b, uint32_t v);
void kb_put_u64(kb_str *b, uint64_t v);
void kb_put_blob(kb_str *b, const void *data, size_t n); /* u64 length, then the bytes */
void kb_put_cstr(kb_str *b, const char *s);               /* a blob without the NUL */
/* A reader never reads past len: the first read that would sets err (the `what` of that read)
 * and err_at (its offset); every later read returns 0/NULL. Check err once at the end. */
typedef struct {
    const uint8_t *p;
    size_t         len, pos;
    const char    *err;
    size_t         err_at;
} kb_reader;
uint32_t    kb_get_u32(kb_reader *r, const char *what);
uint64_t    kb_get_u64(kb_reader *r, const char *what);
const void *kb_get_blob(kb_reader *r, size_t *n, const char *what); /* points into r->p */
char       *kb_get_str(kb_reader *r, const char *what);  /* malloc'd; a NUL inside is an error */
bool        kb_get_str_into(kb_reader *r, char *out, size_t cap, const char *what);

/* Threads for parallel work: $KILN_JOBS when it is a number 1..1024, else the online CPUs. */
int kb_default_jobs(void);
/* Calls fn(user, i, worker) for i in 0..n-1 on up to `jobs` threads (the caller is worker 0;
 * workers are 0..jobs-1) and returns when all are done; returns the workers used. fn must be
 * thread-safe; the order of items is unspecified. */
int kb_parallel_for(int n, int jobs, void (*fn)(void *user, int item, int worker), void *user);

/* GPU architecture names (base/arch.c): "sm_90a" (cubin), "compute_80" (PTX). */
typedef struct {
    int  major, minor;
    char suffix; /* 0, 'a' (arch-specific) or 'f' (family) */
    bool ptx;    /* compute_XY: PTX for the driver to compile */
} kb_arch;
bool kb_arch_parse(const char *name, kb_arch *out);
/* Whether code built for `code` runs on a GPU of compute capability cc_major.cc_minor. */
bool kb_arch_fits(const kb_arch *code, int cc_major, int cc_minor);

#endif
