/* What store.c (entries) and admin.c (walking, eviction, settings) share; not part of the
 * cache's API. */
#ifndef KILN_CACHE_INTERNAL_H
#define KILN_CACHE_INTERNAL_H

#include "cache/cache.h"

#include <sys/stat.h>

#define KC_HEADER_SIZE 80
#define KC_TMP_PREFIX ".tmp."

/* The directory below the root, and the file extension, of a kind; NULL for an unknown kind. */
const char *kc_kind_dir(kc_kind kind);
const char *kc_kind_ext(kc_kind kind);

/* What kc_check found in an entry's bytes. */
typedef enum { KC_VALID, KC_CORRUPT, KC_OTHER_VERSION } kc_verdict;

typedef struct {
    uint32_t       version;
    const uint8_t *meta, *payload;
    size_t         meta_len, payload_len;
} kc_parsed;

/* Checks buf (a whole entry file) as the entry of (kind, key). KC_VALID fills *p; KC_CORRUPT
 * sets *reason (pointing into rbuf or at a literal); KC_OTHER_VERSION sets p->version. */
kc_verdict kc_check(const uint8_t *buf, size_t len, kc_kind kind, kc_key key, kc_parsed *p,
                    const char **reason, char *rbuf, size_t rcap);

/* Opens path (a FIFO cannot hang it), checks it is a regular file and reads it whole. A missing
 * file gives *buf = NULL and no error; *fd (when fd is not NULL) stays open for the caller, who
 * closes it, else it is closed. *st gets fstat's result. Errors name the path, prefixed with
 * what (e.g. "kernel cache"). */
kiln_status kc_load(const char *path, const char *what, uint8_t **buf, size_t *len, struct stat *st, int *fd);

#endif
