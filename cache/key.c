/* Kernel cache keys: XXH3-128 over tagged, length-framed inputs (docs/cache.md, "Key"). */
#include "cache/cache.h"

#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* One field: 4-byte ASCII tag, u64 little-endian length, then the bytes. */
static void put_field(XXH3_state_t *st, const char tag[4], const void *data, size_t len) {
    uint8_t hdr[12];
    memcpy(hdr, tag, 4);
    uint64_t n = (uint64_t)len;
    for (int i = 0; i < 8; i++) hdr[4 + i] = (uint8_t)(n >> (8 * i));
    XXH3_128bits_update(st, hdr, sizeof hdr);
    if (len) XXH3_128bits_update(st, data, len);
}

static void put_str(XXH3_state_t *st, const char tag[4], const char *s) {
    if (!s) s = "";
    put_field(st, tag, s, strlen(s));
}

/* Integers are 8 bytes, two's complement, little-endian. */
static void put_int(XXH3_state_t *st, const char tag[4], int64_t v) {
    uint64_t u = (uint64_t)v;
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(u >> (8 * i));
    put_field(st, tag, b, sizeof b);
}

static kc_key digest(XXH3_state_t *st);

kc_key kc_kernel_key(const char *source, const char *const *opts, int nopts, const char *arch,
                     int nvrtc_major, int nvrtc_minor, int codegen_version) {
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_128bits_reset(&st);
    if (nopts < 0 || !opts) nopts = 0;
    put_str(&st, "KVER", KILN_VERSION);
    put_int(&st, "CGEN", codegen_version);
    put_int(&st, "NVMA", nvrtc_major);
    put_int(&st, "NVMI", nvrtc_minor);
    put_str(&st, "ARCH", arch);
    put_int(&st, "NOPT", nopts);
    for (int i = 0; i < nopts; i++) put_str(&st, "OPT ", opts[i]);
    put_str(&st, "SRC ", source);
    return digest(&st);
}

static kc_key digest(XXH3_state_t *st) {
    XXH128_hash_t h = XXH3_128bits_digest(st);
    /* Canonical form is big-endian: high 64 bits first, so hex(bytes) reads as the number. */
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    kc_key k;
    memcpy(k.b, c.digest, 16);
    return k;
}

kc_key kc_program_key(const char *graph_text, const char *opts_text, const char *arch, int nvrtc_major,
                      int nvrtc_minor, const char *build_id, int plan_version) {
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_128bits_reset(&st);
    put_str(&st, "PROG", "program"); /* never equal to a kernel key's stream */
    put_str(&st, "KVER", KILN_VERSION);
    put_str(&st, "BILD", build_id);
    put_int(&st, "PLAN", plan_version);
    put_int(&st, "NVMA", nvrtc_major);
    put_int(&st, "NVMI", nvrtc_minor);
    put_str(&st, "ARCH", arch);
    put_str(&st, "OPTS", opts_text);
    put_str(&st, "GRPH", graph_text);
    return digest(&st);
}

void kc_key_hex(kc_key k, char out[33]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = digits[k.b[i] >> 4];
        out[2 * i + 1] = digits[k.b[i] & 15];
    }
    out[32] = 0;
}
