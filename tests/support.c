#include "tests/support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

char *ts_tmpdir(void) {
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    char *path = malloc(strlen(base) + 32);
    ck_assert_ptr_nonnull(path);
    sprintf(path, "%s/kiln-test-XXXXXX", base);
    ck_assert_msg(mkdtemp(path) != NULL, "mkdtemp failed");
    return path;
}

void ts_rmtree(const char *dir) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

kiln_ctx *ts_parse(const char *text) {
    kiln_ctx *ctx = kiln_ctx_new();
    ck_assert_ptr_nonnull(ctx);
    TS_OK(kiln_parse(ctx, text, strlen(text), "test.kg"));
    return ctx;
}

int ts_run(const char *cmd, char **out) {
    char full[8192];
    snprintf(full, sizeof full, "(%s) 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (!p) return -1;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += n;
        if (cap - len < 2) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
    }
    if (buf) buf[len] = 0;
    int rc = pclose(p);
    if (out) *out = buf;
    else free(buf);
    if (rc == -1) return -1;
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

const char *ts_kiln_bin(void) {
    const char *b = getenv("KILN_BIN");
    return b && *b ? b : "build/kiln";
}

const char *ts_src_dir(void) {
    const char *s = getenv("KILN_SRC");
    return s && *s ? s : ".";
}

int ts_main(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
