/* `kiln cache ls|stats|clear|verify|evict|explain`: looking after the on-disk cache
 * (docs/cache.md, "kiln cache"). Everything goes through cache/cache.h; nothing here knows the
 * entry format. */
#include "tools/cmd_cache.h"

#include "cache/cache.h"
#include "tools/cmd.h"
#include "tools/flag.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static const char summary[] =
    "  cache SUB       the cache: ls, stats, clear, verify, explain GRAPH ('kiln help cache')\n";

static const char help[] =
    "usage: kiln cache SUBCOMMAND [--cache-dir DIR]\n"
    "  ls [--kernels|--programs]  one line per entry: kind, key, bytes, last use (UTC), and the\n"
    "                             first line of what the key was made of; totals at the end\n"
    "  stats                      entries and bytes per kind, the size limit and its use, the\n"
    "                             oldest and newest use, temporary files\n"
    "  clear                      remove every entry and temporary file\n"
    "  verify [--repair]          read and check every entry; prints each bad one with why and\n"
    "                             exits 1 if any (--repair removes them, and temporary files\n"
    "                             older than an hour, and exits 0)\n"
    "  evict [--max SIZE]         remove least recently used entries until the cache fits in SIZE\n"
    "                             (default KILN_CACHE_MAX)\n"
    "  explain GRAPH [--arch A] [--no-fuse[=NAME,...]] [--n-ctx N] [--n-batch N]\n"
    "                             for each kernel of GRAPH (a .kg graph, or a GGUF model's graph\n"
    "                             as compile builds it): cached or not, and why not\n"
    "  --cache-dir DIR            the cache directory (default: $KILN_CACHE_DIR, else\n"
    "                             $XDG_CACHE_HOME/kiln, else ~/.cache/kiln)\n"
    "Environment: KILN_CACHE_MAX (size limit, e.g. 512M, 2G; default 2G; 0: none),\n"
    "KILN_CACHE=on|off|readonly|refresh (how compiles use the cache).\n";

typedef struct {
    const char *sub, *dir_opt, *max;
    uint64_t    max_bytes; /* --max, parsed */
    bool        kernels, programs, repair;
    char       *dir;
    kc_cache    cache;
} cache_cli;

/* "12.3 MiB" */
static void human(uint64_t bytes, char out[32]) {
    static const char *units[] = {"KiB", "MiB", "GiB", "TiB"};
    if (bytes < 1024) {
        snprintf(out, 32, "%llu B", (unsigned long long)bytes);
        return;
    }
    double v = (double)bytes / 1024;
    int u = 0;
    while (v >= 1024 && u < 3) v /= 1024, u++;
    snprintf(out, 32, "%.1f %s", v, units[u]);
}

/* ISO 8601, UTC: "2025-01-31T12:00:00Z". */
static void iso_time(int64_t ns, char out[32]) {
    time_t t = (time_t)(ns / 1000000000);
    struct tm tm;
    if (!gmtime_r(&t, &tm) || !strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm)) snprintf(out, 32, "?");
}

static const char *kind_name(kc_kind k) { return k == KC_PROGRAM ? "program" : "kernel"; }

/* ---- ls ----------------------------------------------------------------------------------- */

typedef struct {
    const cache_cli *cli;
    int              n;
    uint64_t         bytes;
} ls_state;

static void ls_header(void) {
    printf("%-8s %-32s %10s  %-20s  %s\n", "KIND", "KEY", "BYTES", "LAST USE (UTC)", "WHAT");
}

static int ls_one(void *user, const kc_entry *e) {
    ls_state *s = user;
    if ((s->cli->kernels && e->kind != KC_CUBIN) || (s->cli->programs && e->kind != KC_PROGRAM)) return 0;
    if (!s->n) ls_header();
    char when[32];
    iso_time(e->mtime_ns, when);
    printf("%-8s %s %10llu  %s  ", kind_name(e->kind), e->key_hex, (unsigned long long)e->bytes, when);
    if (e->corrupt) printf("CORRUPT: %s\n", e->corrupt);
    else if (!e->meta) printf("(format version %u: another kiln build's)\n", (unsigned)e->version);
    else if (!*e->meta) printf("-\n");
    else printf("%.*s\n", (int)strcspn(e->meta, "\n"), e->meta);
    s->n++;
    s->bytes += e->bytes;
    return 0;
}

static int cmd_ls(const cache_cli *c) {
    ls_state s = {.cli = c};
    kiln_status st = kc_walk(&c->cache, true, ls_one, &s);
    if (st) return kt_fail(NULL, st);
    if (!s.n) ls_header();
    char h[32];
    human(s.bytes, h);
    printf("%d entr%s, %llu bytes (%s)\n", s.n, s.n == 1 ? "y" : "ies", (unsigned long long)s.bytes, h);
    return KT_EXIT_OK;
}

/* ---- stats -------------------------------------------------------------------------------- */

typedef struct {
    int      n[3];
    uint64_t bytes[3];
    int64_t  oldest, newest;
} stats_state;

static int stats_one(void *user, const kc_entry *e) {
    stats_state *s = user;
    int k = e->kind == KC_PROGRAM ? 1 : 0;
    s->n[k]++, s->n[2]++;
    s->bytes[k] += e->bytes, s->bytes[2] += e->bytes;
    if (s->n[2] == 1 || e->mtime_ns < s->oldest) s->oldest = e->mtime_ns;
    if (s->n[2] == 1 || e->mtime_ns > s->newest) s->newest = e->mtime_ns;
    return 0;
}

static int cmd_stats(const cache_cli *c) {
    uint64_t max;
    kiln_status st = kc_max_bytes(&max);
    stats_state s = {0};
    int tmp = 0, stale = 0;
    uint64_t tmp_bytes = 0;
    if (!st) st = kc_walk(&c->cache, false, stats_one, &s);
    if (!st) st = kc_tmp_files(&c->cache, 0, false, &tmp, &tmp_bytes);
    if (!st) st = kc_tmp_files(&c->cache, KC_STALE_TMP_S, false, &stale, NULL);
    if (st) return kt_fail(NULL, st);
    struct stat ds;
    printf("cache directory: %s%s\n", c->dir, stat(c->dir, &ds) != 0 ? " (does not exist yet)" : "");
    static const char *labels[] = {"kernels:", "programs:", "total:"};
    char h[32];
    for (int k = 0; k < 3; k++) {
        human(s.bytes[k], h);
        printf("%-16s %d entr%s, %llu bytes (%s)\n", labels[k], s.n[k], s.n[k] == 1 ? "y" : "ies",
               (unsigned long long)s.bytes[k], h);
    }
    human(max, h);
    if (max) printf("%-16s %llu bytes (%s, KILN_CACHE_MAX), %.1f%% used\n", "limit:", (unsigned long long)max, h,
                    100.0 * (double)s.bytes[2] / (double)max);
    else printf("%-16s none (KILN_CACHE_MAX=0)\n", "limit:");
    char t[32];
    iso_time(s.oldest, t);
    printf("%-16s %s\n", "oldest use:", s.n[2] ? t : "-");
    iso_time(s.newest, t);
    printf("%-16s %s\n", "newest use:", s.n[2] ? t : "-");
    printf("%-16s %d (%llu bytes), %d older than an hour\n", "temporary files:", tmp, (unsigned long long)tmp_bytes,
           stale);
    return KT_EXIT_OK;
}

/* ---- clear, evict ------------------------------------------------------------------------- */

static int cmd_clear(const cache_cli *c) {
    stats_state s = {0};
    int removed = 0, tmp = 0;
    kiln_status st = kc_walk(&c->cache, false, stats_one, &s);
    if (!st) st = kc_tmp_files(&c->cache, 0, false, &tmp, NULL);
    if (!st) st = kc_clear(&c->cache, &removed);
    if (st) return kt_fail(NULL, st);
    char h[32];
    human(s.bytes[2], h);
    printf("removed %d entr%s (%llu bytes, %s) and %d temporary file%s from %s\n", removed, removed == 1 ? "y" : "ies",
           (unsigned long long)s.bytes[2], h, tmp, tmp == 1 ? "" : "s", c->dir);
    return KT_EXIT_OK;
}

static int cmd_evict(const cache_cli *c) {
    uint64_t max, total = 0;
    int removed = 0;
    kiln_status st = NULL;
    if (c->max) max = c->max_bytes;
    else st = kc_max_bytes(&max);
    if (!st) st = kc_evict(&c->cache, max, &removed, &total);
    if (st) return kt_fail(NULL, st);
    char h[32], hm[32];
    human(total, h);
    human(max, hm);
    printf("evicted %d entr%s; %llu bytes (%s) left, limit %s\n", removed, removed == 1 ? "y" : "ies",
           (unsigned long long)total, h, max ? hm : "none");
    return KT_EXIT_OK;
}

/* ---- verify ------------------------------------------------------------------------------- */

typedef struct {
    const cache_cli *cli;
    int              good, bad, other, repaired;
    kiln_status      err;
} verify_state;

static void quiet_log(void *user, const char *line) { (void)user, (void)line; }

/* Removes a bad entry through kc_get, which removes a corrupt file only if it is still the one
 * it read (a concurrent writer may have replaced it with a good one meanwhile). */
static kiln_status repair(const cache_cli *c, const kc_entry *e) {
    kc_cache on = c->cache;
    on.mode = KILN_CACHE_ON;
    on.log = quiet_log;
    void *data = NULL;
    size_t size;
    kiln_status st = kc_get(&on, e->kind, e->key, &data, &size, NULL);
    free(data);
    return st;
}

static int verify_one(void *user, const kc_entry *e) {
    verify_state *s = user;
    if (!e->corrupt) {
        if (e->meta) s->good++;
        else {
            s->other++;
            printf("kept: %s: format version %u (another kiln build's)\n", e->path, (unsigned)e->version);
        }
        return 0;
    }
    s->bad++;
    printf("bad: %s: %s\n", e->path, e->corrupt);
    if (!s->cli->repair) return 0;
    s->err = repair(s->cli, e);
    if (!s->err) s->repaired++;
    return s->err != NULL;
}

static int cmd_verify(const cache_cli *c) {
    verify_state s = {.cli = c};
    int tmp = 0, stale = 0;
    kiln_status st = kc_walk(&c->cache, true, verify_one, &s);
    if (!st) st = s.err;
    if (!st) st = kc_tmp_files(&c->cache, 0, false, &tmp, NULL);
    if (!st) st = kc_tmp_files(&c->cache, KC_STALE_TMP_S, c->repair, &stale, NULL);
    if (st) return kt_fail(NULL, st);
    if (tmp)
        printf("temporary files: %d (of writers still running, or that died); %d older than an hour%s\n", tmp,
               stale, c->repair && stale ? ": removed" : "");
    printf("verified %d entr%s: %d good, %d bad", s.good + s.bad + s.other, s.good + s.bad + s.other == 1 ? "y" : "ies",
           s.good, s.bad);
    if (s.other) printf(", %d of other format versions (kept)", s.other);
    printf("\n");
    if (c->repair && s.bad) printf("removed %d bad entr%s\n", s.repaired, s.repaired == 1 ? "y" : "ies");
    return s.bad && !c->repair ? KT_EXIT_ERR : KT_EXIT_OK;
}

/* ---- dispatch ----------------------------------------------------------------------------- */

static const char *const subs[] = {"ls", "stats", "clear", "verify", "evict"};

static int parse(int argc, char **argv, cache_cli *c) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            return kt_print_help("cache");
        } else if (!strcmp(a, "--cache-dir") || !strcmp(a, "--max")) {
            if (i + 1 == argc) return kt_usage("cache", "option %s needs a value", a);
            *(!strcmp(a, "--max") ? &c->max : &c->dir_opt) = argv[++i];
            if (!strcmp(a, "--max") && !kt_flag_size("cache evict", a, c->max, &c->max_bytes)) return KT_EXIT_USAGE;
        } else if (!strcmp(a, "--kernels")) { c->kernels = true;
        } else if (!strcmp(a, "--programs")) { c->programs = true;
        } else if (!strcmp(a, "--repair")) { c->repair = true;
        } else if (a[0] == '-') {
            return kt_usage("cache", "unknown option '%s'", a);
        } else if (c->sub) {
            return kt_usage("cache", "unexpected argument '%s'", a);
        } else {
            c->sub = a;
        }
    }
    if (!c->sub) return kt_usage("cache", "give a subcommand: ls, stats, clear, verify, evict or explain");
    bool known = false;
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) known |= !strcmp(c->sub, subs[i]);
    if (!known) return kt_usage("cache", "unknown subcommand '%s'", c->sub);
    if ((c->kernels || c->programs) && strcmp(c->sub, "ls"))
        return kt_usage("cache", "%s: --kernels/--programs are for ls", c->sub);
    if (c->kernels && c->programs) return kt_usage("cache", "give --kernels or --programs, not both");
    if (c->repair && strcmp(c->sub, "verify")) return kt_usage("cache", "%s: --repair is for verify", c->sub);
    if (c->max && strcmp(c->sub, "evict")) return kt_usage("cache", "%s: --max is for evict", c->sub);
    return KT_GO_ON;
}

static int run(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "explain")) return kt_cache_explain(argc, argv);
    cache_cli c = {0};
    int rc = parse(argc, argv, &c);
    if (rc != KT_GO_ON) return rc;
    kiln_status st = kc_default_dir(c.dir_opt, &c.dir);
    if (st) return kt_fail(NULL, st);
    c.cache = (kc_cache){.dir = c.dir, .mode = KILN_CACHE_ON}; /* kc_walk only reads, whatever the mode */
    if (!strcmp(c.sub, "ls")) rc = cmd_ls(&c);
    else if (!strcmp(c.sub, "stats")) rc = cmd_stats(&c);
    else if (!strcmp(c.sub, "clear")) rc = cmd_clear(&c);
    else if (!strcmp(c.sub, "verify")) rc = cmd_verify(&c);
    else rc = cmd_evict(&c);
    free(c.dir);
    return rc;
}

const kt_cmd kt_cmd_cache = {"cache", summary, help, NULL, run};
