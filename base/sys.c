#include "base.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

kiln_status kb_read_file(const char *path, char **data, size_t *len) {
    *data = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return kb_error(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    kb_str b = {0};
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) kb_str_addn(&b, buf, n);
    int err = ferror(f);
    fclose(f);
    if (err) {
        kb_str_free(&b);
        return kb_error(KILN_ERR_IO, "%s: read error", path);
    }
    size_t l = b.len;
    char *s = kb_str_take(&b);
    if (!s) return kb_oom();
    *data = s;
    *len = l;
    return NULL;
}

kiln_status kb_write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return kb_error(KILN_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    size_t w = fwrite(data, 1, len, f);
    int bad = (w != len) | (fclose(f) != 0);
    if (bad) return kb_error(KILN_ERR_IO, "%s: write failed", path);
    return NULL;
}

int kb_mkdirs_errno(const char *path) {
    if (!*path) return ENOENT;
    char *tmp = strdup(path);
    if (!tmp) return ENOMEM;
    int err = 0;
    for (char *s = tmp + 1; !err; s++) {
        if (*s && *s != '/') continue;
        char c = *s;
        *s = 0;
        if (mkdir(tmp, 0777) != 0 && errno != EEXIST) err = errno;
        *s = c;
        if (!c) break;
    }
    free(tmp);
    struct stat st;
    if (!err && stat(path, &st) != 0) err = errno;
    if (!err && !S_ISDIR(st.st_mode)) err = ENOTDIR;
    return err;
}

kiln_status kb_mkdirs(const char *path) {
    int err = kb_mkdirs_errno(path);
    if (err) return kb_error(KILN_ERR_IO, "%s: cannot create directory: %s", path, strerror(err));
    return NULL;
}

double kb_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}
