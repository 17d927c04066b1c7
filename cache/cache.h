/* cache: key derivation and the on-disk kernel cache. Prefix kc_.
 *
 * Entry file (docs/cache.md): a 64-byte header — magic "KILNCACH", format version (u32),
 * payload kind (u32), key (16 bytes), payload length (u64), XXH3-64 of the payload (u64),
 * XXH3-64 of the header's first 48 bytes (u64), reserved — then the payload. Written to a
 * temporary file in the same directory and renamed into place, so readers never see half an
 * entry. */
#ifndef KILN_CACHE_H
#define KILN_CACHE_H

#include "base/base.h"

typedef struct {
    uint8_t b[16];
} kc_key;

/* XXH3-128 over (source, NVRTC options, arch, NVRTC version, kiln version, codegen version),
 * each framed by its length so that no two inputs collide by concatenation. */
kc_key kc_kernel_key(const char *source, const char *const *opts, int nopts, const char *arch,
                     int nvrtc_major, int nvrtc_minor, int codegen_version);
void   kc_key_hex(kc_key k, char out[33]);

typedef struct {
    char           *dir; /* root; entries under dir/kernels/xx/<hex>.cubin */
    kiln_cache_mode mode;
    void (*log)(void *user, const char *line);
    void           *log_user;
} kc_cache;

/* Resolves the directory: explicit, else $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else
 * $HOME/.cache/kiln. Caller frees *out. */
kiln_status kc_default_dir(const char *explicit_dir, char **out);

/* Looks up key. A miss (or mode off/refresh) gives *data = NULL and no error. A corrupt entry
 * (bad magic, version, key, length or checksum) is reported through log, removed, counted in
 * *corrupt, and treated as a miss. A hit gives *data from malloc (caller frees; non-NULL even
 * for an empty payload) and its length in *size. corrupt may be NULL. */
kiln_status kc_get(const kc_cache *c, kc_key key, void **data, size_t *size, int *corrupt);
/* Stores an entry atomically (not in modes off and readonly). */
kiln_status kc_put(const kc_cache *c, kc_key key, const void *data, size_t size);
/* Path of key's entry (for tests and messages). Caller frees. */
char       *kc_entry_path(const kc_cache *c, kc_key key);

#endif
