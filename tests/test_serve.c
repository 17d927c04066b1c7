/* kiln serve end to end (issue 28): the command on a tiny model with the CPU reference, driven by
 * OpenAI's Python client (tests/serve/client.py, from the virtual environment make test builds:
 * build/pyenv-serve, or KILN_SERVE_PYTHON). Servers of 4 slots: with a long queue for the
 * answers, bad requests and 16 concurrent streams; the same streams with the program for steps
 * of at most 8 tokens (--batch-small 8); with a queue of 4 for a client that leaves mid-stream
 * and for 429. Each server stops on SIGTERM with exit status 0. The command's
 * usage errors are checked too. */
#include "tests/support.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char *g_dir;

/* ts_serve_start with --cpu. */
static ts_server start(const char *model, const char *const *args) { return ts_serve_start(model, args, true, NULL); }

static const char *python(void) {
    const char *p = getenv("KILN_SERVE_PYTHON");
    return p && *p ? p : "build/pyenv-serve/bin/python";
}

static void client(ts_server s, const char *tests) {
    ck_assert_msg(access(python(), X_OK) == 0, "%s is missing: make test builds it (a virtual environment with "
                                                "OpenAI's package from PyPI), or set KILN_SERVE_PYTHON", python());
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/serve/client.py' http://127.0.0.1:%d %s", python(), ts_src_dir(), s.port,
             tests);
    int rc = ts_run(cmd, &out);
    fprintf(stderr, "%s", out ? out : "");
    ck_assert_msg(rc == 0, "client.py %s: exit %d:\n%s", tests, rc, out ? out : "");
    free(out);
}

static char *model(void) {
    static char path[512];
    snprintf(path, sizeof path, "%s/tiny.gguf", g_dir);
    if (access(path, R_OK) != 0) {
        kiln_model_hparams hp;
        TS_OK(kiln_model_preset("llama", "tiny", &hp));
        TS_OK(kiln_model_write_random(&hp, 3, path, NULL, NULL));
    }
    return path;
}

START_TEST(openai_client) {
    const char *args[] = {"-np", "4", "-c", "1024", NULL};
    ts_server   s = start(model(), args);
    client(s, "test_basics test_bad_requests test_concurrent");
    ts_serve_stop(s);
}
END_TEST

/* The batch with a program for steps of at most 8 tokens (--batch-small; kiln serve's default on
 * a GPU is 64): on the CPU reference too, 16 streams each equal to its request alone. */
START_TEST(small_program) {
    const char *args[] = {"-np", "4", "-c", "1024", "--batch-small", "8", NULL};
    char        line[512];
    ts_server   s = ts_serve_start(model(), args, true, line);
    ck_assert_msg(strstr(line, "steps of at most 8 tokens in a program of their own"), "%s", line);
    client(s, "test_concurrent");
    ts_serve_stop(s);
}
END_TEST

START_TEST(leave_and_queue_full) {
    const char *args[] = {"-np", "4", "--queue", "4", "-c", "2048", NULL};
    ts_server   s = start(model(), args);
    client(s, "test_disconnect_and_queue");
    ts_serve_stop(s);
}
END_TEST

START_TEST(usage_errors) {
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "'%s' serve '%s' --host 0.0.0.0", ts_kiln_bin(), model());
    ck_assert_int_eq(ts_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "--host 0.0.0.0 listens beyond this machine: give --api-key KEY too"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' serve '%s' -np 0", ts_kiln_bin(), model());
    ck_assert_int_eq(ts_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "-np 0"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' serve '%s' --cpu --host not-an-address --api-key k --port 0", ts_kiln_bin(), model());
    ck_assert_int_eq(ts_run(cmd, &out), 1);
    ck_assert_msg(strstr(out, "--host not-an-address"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' serve '%s' --cpu -np 4 -c 7", ts_kiln_bin(), model());
    ck_assert_int_eq(ts_run(cmd, &out), 1);
    ck_assert_msg(strstr(out, "-c 7 over -np 4 slots leaves 1 tokens a request"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' serve", ts_kiln_bin());
    ck_assert_int_eq(ts_run(cmd, &out), 2);
    ck_assert_msg(strstr(out, "which model?"), "%s", out);
    free(out);
}
END_TEST

/* An API key: 401 without it (or with another), /health open. */
START_TEST(api_key) {
    const char *args[] = {"--api-key", "sekret", NULL};
    ts_server   s = start(model(), args);
    char        cmd[512], *out;
    snprintf(cmd, sizeof cmd, "curl -s -o /dev/null -w '%%{http_code}' http://127.0.0.1:%d/v1/models", s.port);
    bool curl = ts_run("command -v curl", NULL) == 0;
    if (curl) {
        ts_run(cmd, &out);
        ck_assert_str_eq(out, "401");
        free(out);
        snprintf(cmd, sizeof cmd, "curl -s -o /dev/null -w '%%{http_code}' -H 'Authorization: Bearer sekret' "
                                  "http://127.0.0.1:%d/v1/models", s.port);
        ts_run(cmd, &out);
        ck_assert_str_eq(out, "200");
        free(out);
        snprintf(cmd, sizeof cmd, "curl -s -o /dev/null -w '%%{http_code}' http://127.0.0.1:%d/health", s.port);
        ts_run(cmd, &out);
        ck_assert_str_eq(out, "200");
        free(out);
    } else { /* the same through Python's urllib */
        snprintf(cmd, sizeof cmd, "'%s' -c \"import urllib.request as u, urllib.error as e\n"
                                  "try: u.urlopen('http://127.0.0.1:%d/v1/models'); print(200)\n"
                                  "except e.HTTPError as x: print(x.code)\"", python(), s.port);
        ts_run(cmd, &out);
        ck_assert_msg(!strncmp(out, "401", 3), "%s", out);
        free(out);
    }
    ts_serve_stop(s);
}
END_TEST

/* Without --cpu: the GPU when there is one, else the CPU reference (the server says why on
 * stderr and serves anyway). Either way a request is answered. */
START_TEST(without_cpu_flag) {
    const char *args[] = {NULL};
    char        line[512];
    ts_server   s = ts_serve_start(model(), args, false, line);
    ck_assert_msg(strstr(line, "CPU reference") || strstr(line, ", GPU,"), "%s", line);
    client(s, "test_health");
    ts_serve_stop(s);
}
END_TEST

static void setup(void) { g_dir = ts_tmpdir(); }
static void teardown(void) { ts_tmpdir_free(g_dir); }

int main(void) {
    Suite *s = TS_SUITE("serve", TS_CASE_FIXTURE("serve", 240, setup, teardown),
                        TS_TESTS(usage_errors, api_key, without_cpu_flag, openai_client, small_program, leave_and_queue_full));
    return ts_main_isolated(s, "serve");
}
