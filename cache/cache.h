/* cache: key derivation, the on-disk cache of kernels (cubins) and programs, and its
 * management (listing, verifying, LRU eviction, clearing). Prefix kc_.
 *
 * Entry file, format version 2 (docs/cache.md): an 80-byte header — magic "KILNCACH", format
 * version (u32), header size (u32), kind (u32), reserved (u32), key (16 bytes), meta length
 * (u64), payload length (u64), XXH3-64 of the meta, of the payload and of the header's first
 * 72 bytes — then the meta text, then the payload. Written to a temporary file in the same
 * directory and renamed into place, so readers never see half an entry. */
#ifndef KILN_CACHE_H
#define KILN_CACHE_H

#include "base/base.h"

#define KC_FORMAT_VERSION 2u

typedef struct {
    uint8_t b[16];
} kc_key;

/* What an entry holds. Entries live at DIR/kernels/xx/<hex>.cubin (KC_CUBIN) and
 * DIR/programs/xx/<hex>.prog (KC_PROGRAM), xx being the key's first two hex digits. */
typedef enum { KC_CUBIN = 1, KC_PROGRAM = 2 } kc_kind;

/* XXH3-128 over (source, NVRTC options, arch, NVRTC version, kiln version, codegen version),
 * each framed by its length so that no two inputs collide by concatenation. */
kc_key kc_kernel_key(const char *source, const char *const *opts, int nopts, const char *arch,
                     int nvrtc_major, int nvrtc_minor, int codegen_version);
void   kc_key_hex(kc_key k, char out[33]);
/* Whole programs: XXH3-128 over (kiln version, build id, plan format, NVRTC version, arch,
 * compile options text, canonical graph text), framed like kernel keys. */
kc_key kc_program_key(const char *graph_text, const char *opts_text, const char *arch, int nvrtc_major,
                      int nvrtc_minor, const char *build_id, int plan_version);

typedef struct {
    char           *dir; /* root; entries under dir/kernels/ and dir/programs/ */
    kiln_cache_mode mode;
    void (*log)(void *user, const char *line); /* NULL: stderr */
    void           *log_user;
    /* 0 while writing works; else the errno of the first write that failed (kc_put, or
     * kc_write_failed): from then on kc_put stores nothing. Set atomically, since kc_put runs
     * on a compile's worker threads; zero-initialize it with the rest. */
    _Atomic int     write_errno;
} kc_cache;

/* One line through c->log, else on stderr. */
void kc_log(const kc_cache *c, const char *line);
/* Turns writing c's directory off after a failure to write it (errno err; reason, when not
 * NULL, says why instead of strerror(err)), so that a compile goes on without the cache, as
 * ccache does: later kc_put calls on c store nothing and succeed. The first call on c warns,
 * "kiln: warning: cannot write the cache DIR (REASON); continuing without it", through c->log
 * (once per kc_cache: once per compile), else on stderr once per process for each such line
 * (a command that compiles several programs says it once); later calls, on any thread, say
 * nothing. */
void kc_write_failed(kc_cache *c, int err, const char *reason);

/* Resolves the directory: explicit, else $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else
 * $HOME/.cache/kiln. Caller frees *out. */
kiln_status kc_default_dir(const char *explicit_dir, char **out);

/* Looks up (kind, key). A miss (or mode off/refresh) gives *data = NULL and no error: no file,
 * or a path through a file (ENOTDIR, e.g. a cache root that is a file). So does
 * an entry of another format version (another kiln build may share the directory): it is left
 * alone. A corrupt entry (bad magic, header, kind, key, lengths or checksums) is reported
 * through log, removed (not in READONLY mode), counted in *corrupt, and treated as a miss. A hit
 * gives the payload in *data from malloc (caller frees; non-NULL even when empty) and its
 * length in *size, and marks the entry used (mtime = now; not in READONLY mode) for LRU
 * eviction. corrupt may be NULL. */
kiln_status kc_get(const kc_cache *c, kc_kind kind, kc_key key, void **data, size_t *size, int *corrupt);
/* Stores an entry atomically (not in modes off and readonly), replacing any entry of that
 * kind and key, of whatever format version. meta: NUL-terminated text kept with the entry
 * (what the key was made of, for `kiln cache ls` and `explain`); NULL means empty. When the
 * directory cannot be written (creating a directory, creating, writing, closing or renaming
 * the temporary file fails: ENOSPC, EROFS, EACCES, EDQUOT, ENOTDIR, EMFILE...) the temporary
 * file is removed, kc_write_failed turns writing off, and kc_put succeeds without storing;
 * so does every later kc_put on c. Errors are only bad arguments and lack of memory. */
kiln_status kc_put(kc_cache *c, kc_kind kind, kc_key key, const char *meta, const void *data, size_t size);
/* Path of the entry (for tests and messages); NULL for an unknown kind. Caller frees. */
char       *kc_entry_path(const kc_cache *c, kc_kind kind, kc_key key);

typedef struct {
    kc_kind     kind;
    kc_key      key;
    char        key_hex[33];
    const char *path;
    uint64_t    bytes;    /* file size */
    int64_t     mtime_ns; /* last use (a hit sets it; see kc_evict) */
    const char *meta;     /* with_meta: the entry's meta text (NULL if corrupt or of another
                             format version), else NULL */
    const char *corrupt;  /* with_meta: NULL if the entry verified (or is of another format
                             version), else why ("payload checksum mismatch") */
    uint32_t    version;  /* with_meta: the entry's format version — KC_FORMAT_VERSION, or
                             another kiln build's (meta and corrupt NULL); 0 when not read or
                             when the version field itself is damaged */
} kc_entry;

/* Calls fn for every entry (both kinds; stray .tmp.* files are not entries) in a deterministic
 * order (kind, then key). with_meta reads and fully verifies each file; it never removes or
 * touches anything. Strings in *e live until fn returns. fn returns nonzero to stop. A cache
 * directory that does not exist has no entries. */
kiln_status kc_walk(const kc_cache *c, bool with_meta, int (*fn)(void *user, const kc_entry *e), void *user);
/* Removes least-recently-used entries until the total size of entries is <= max_bytes (0 = no
 * limit): oldest mtime first (ties by kind, then key), skipping entries used in the last
 * KC_EVICT_GRACE_S seconds unless the limit cannot be met otherwise. Also removes .tmp.* files
 * older than an hour. Reports how many entries were removed and the total after (both may be
 * NULL). Safe while other processes read and write: an entry used or replaced since it was
 * listed is kept. */
#define KC_EVICT_GRACE_S 2
kiln_status kc_evict(const kc_cache *c, uint64_t max_bytes, int *removed, uint64_t *total_after);
/* Removes every entry (both kinds, any format version) and every .tmp.* file; *removed (may
 * be NULL) counts the entries. */
kiln_status kc_clear(const kc_cache *c, int *removed);
/* Temporary files (.tmp.*) in the entry directories: counts those at least min_age_s seconds
 * old (0: all) and their bytes, and removes them when remove is set. Young ones may belong to
 * a writer still running; those older than KC_STALE_TMP_S were left by one that died. */
#define KC_STALE_TMP_S 3600
kiln_status kc_tmp_files(const kc_cache *c, int64_t min_age_s, bool remove, int *count, uint64_t *bytes);

/* "2G" "2GiB" "512M" "100k" "12345": a number with an optional K, M, G or T suffix (binary
 * multiples; case-insensitive; "iB" or "B" may follow). Errors name the text. */
kiln_status kc_parse_size(const char *text, uint64_t *bytes);
/* $KILN_CACHE_MAX (unset or empty: the default, 2 GiB = 2^31 bytes; 0: no limit). */
#define KC_DEFAULT_MAX_BYTES (UINT64_C(1) << 31)
kiln_status kc_max_bytes(uint64_t *bytes);
/* on|off|readonly|refresh; errors name the text and the choices. */
kiln_status kc_parse_mode(const char *text, kiln_cache_mode *mode);
/* The mode from $KILN_CACHE when set (non-empty), else fallback; a bad value is an error naming
 * it and the choices. */
kiln_status kc_env_mode(kiln_cache_mode fallback, kiln_cache_mode *mode);

/* Tests only (in the manner of SQLite's and Lua's test hooks): makes every later write step
 * `step` of kc_put fail with errno err, as a full disk or a read-only directory would; err 0
 * turns it off. KC_STEP_WRITE fails after the header is written, so a temporary file is left
 * half written for kc_put to remove. Process-wide; not for use beside other writers. */
typedef enum { KC_STEP_MKDIR, KC_STEP_CREATE, KC_STEP_WRITE, KC_STEP_CLOSE, KC_STEP_RENAME, KC_NSTEPS } kc_write_step;
void kc_test_fail_writes(kc_write_step step, int err);

#endif
