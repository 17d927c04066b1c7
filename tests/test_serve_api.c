/* The server's request and answer layer (serve/api.c): requests parsed into their fields, each
 * bad request refused with the status, OpenAI's error type, the parameter and a message that
 * names the fault, and the answers' JSON in OpenAI's shapes (read back with jansson). */
#include "tests/support.h"

#include "serve/serve.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

#define MODEL "tiny"

static sv_request parse_ok(sv_kind kind, const char *body) {
    sv_request r;
    sv_error   e;
    ck_assert_msg(sv_parse(kind, body, strlen(body), MODEL, 1024, &r, &e), "%s: refused: %d %s", body, e.status,
                  e.message);
    return r;
}

/* body is refused with status, the parameter param ("" none) and a message holding needle. */
static void refused(sv_kind kind, const char *body, int status, const char *param, const char *needle) {
    sv_request r;
    sv_error   e;
    ck_assert_msg(!sv_parse(kind, body, strlen(body), MODEL, 1024, &r, &e), "%s: accepted", body);
    ck_assert_msg(e.status == status, "%s: status %d, not %d (%s)", body, e.status, status, e.message);
    ck_assert_msg(!strcmp(e.param, param), "%s: param '%s', not '%s'", body, e.param, param);
    ck_assert_msg(strstr(e.message, needle), "%s: message '%s' lacks '%s'", body, e.message, needle);
    ck_assert_ptr_null(r.prompt);
    ck_assert_ptr_null(r.msgs);
}

START_TEST(completion_fields) {
    sv_request r = parse_ok(SV_COMPLETION, "{\"model\": \"tiny\", \"prompt\": \"Once upon\", \"max_tokens\": 16, "
                                           "\"temperature\": 0, \"top_p\": 0.5, \"seed\": 42, \"stop\": [\"\\n\", \"end\"], "
                                           "\"stream\": true, \"stream_options\": {\"include_usage\": true}, \"user\": \"x\"}");
    ck_assert_str_eq(r.prompt, "Once upon");
    ck_assert_int_eq(r.max_tokens, 16);
    ck_assert(r.sampler.temp == 0.0f && r.sampler.top_p == 0.5f && r.sampler.seed == 42);
    ck_assert_int_eq(r.n_stop, 2);
    ck_assert_str_eq(r.stop[0], "\n");
    ck_assert_str_eq(r.stop[1], "end");
    ck_assert(r.stream && r.include_usage);
    sv_request_free(&r);
    /* defaults: llama.cpp's sampler, no limit, no stream */
    r = parse_ok(SV_COMPLETION, "{\"model\": \"tiny\", \"prompt\": [\"one\"], \"stop\": \"x\"}");
    kiln_sampler_params d = kiln_sampler_params_default();
    ck_assert(r.sampler.temp == d.temp && r.sampler.top_k == d.top_k && r.sampler.top_p == d.top_p);
    ck_assert_int_eq(r.max_tokens, -1);
    ck_assert(!r.stream && r.n_stop == 1);
    ck_assert_str_eq(r.prompt, "one");
    sv_request_free(&r);
    /* token ids, and a negative seed (two's complement, as a 64-bit key) */
    r = parse_ok(SV_COMPLETION, "{\"model\": \"tiny\", \"prompt\": [1, 2, 1023], \"seed\": -1, \"n\": 1}");
    ck_assert_int_eq(r.n_prompt_ids, 3);
    ck_assert_int_eq(r.prompt_ids[2], 1023);
    ck_assert(r.sampler.seed == UINT64_MAX);
    sv_request_free(&r);
}
END_TEST

START_TEST(chat_fields) {
    sv_request r = parse_ok(SV_CHAT, "{\"model\": \"tiny\", \"messages\": [{\"role\": \"developer\", \"content\": \"Be brief.\"}, "
                                     "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hi \"}, "
                                     "{\"type\": \"text\", \"text\": \"there\"}]}, {\"role\": \"assistant\", \"content\": null}], "
                                     "\"max_completion_tokens\": 5}");
    ck_assert_int_eq(r.n_msgs, 3);
    ck_assert_str_eq(r.msgs[0].role, "system");
    ck_assert_str_eq(r.msgs[0].content, "Be brief.");
    ck_assert_str_eq(r.msgs[1].content, "Hi there");
    ck_assert_str_eq(r.msgs[2].role, "assistant");
    ck_assert_str_eq(r.msgs[2].content, "");
    ck_assert_int_eq(r.max_tokens, 5);
    sv_request_free(&r);
}
END_TEST

START_TEST(bad_requests) {
    refused(SV_COMPLETION, "{\"model\": \"tiny\", \"prompt\": ", 400, "", "the body is not JSON");
    refused(SV_COMPLETION, "", 400, "", "the body is not JSON");
    refused(SV_COMPLETION, "[1, 2]", 400, "", "must be a JSON object, not an array");
    refused(SV_COMPLETION, "{\"prompt\": \"x\"}", 400, "model", "'model' is required");
    refused(SV_COMPLETION, "{\"model\": 3, \"prompt\": \"x\"}", 400, "model", "must be a string, not an integer");
    refused(SV_COMPLETION, "{\"model\": \"gpt-4\", \"prompt\": \"x\"}", 404, "model", "The model 'gpt-4' does not exist");
    refused(SV_COMPLETION, "{\"model\": \"tiny\"}", 400, "prompt", "'prompt' is required");
    refused(SV_COMPLETION, "{\"model\": \"tiny\", \"prompt\": {}}", 400, "prompt", "must be a string");
    refused(SV_COMPLETION, "{\"model\": \"tiny\", \"prompt\": [\"a\", \"b\"]}", 400, "prompt", "must be a token id");
    refused(SV_COMPLETION, "{\"model\": \"tiny\", \"prompt\": [5, 1024]}", 400, "prompt", "'prompt[1]' must be a token id in [0, 1024)");
    refused(SV_COMPLETION, "{\"model\": \"tiny\", \"prompt\": \"x\", \"temperature\": \"hot\"}", 400, "temperature",
            "must be a number, not a string");
    refused(SV_COMPLETION, "{\"model\": \"tiny\", \"prompt\": \"x\", \"temperature\": 2.5}", 400, "temperature",
            "is 2.5; it must be in [0, 2]");
    refused(SV_COMPLETION, "{\"model\": \"tiny\", \"prompt\": \"x\", \"top_p\": 0}", 400, "top_p", "it must be in (0, 1]");
    refused(SV_COMPLETION, "{\"model\": \"tiny\", \"prompt\": \"x\", \"max_tokens\": -3}", 400, "max_tokens", "is -3");
    refused(SV_COMPLETION, "{\"model\": \"tiny\", \"prompt\": \"x\", \"max_tokens\": 1.5}", 400, "max_tokens",
            "must be an integer, not a number");
    refused(SV_COMPLETION, "{\"model\": \"tiny\", \"prompt\": \"x\", \"seed\": \"1\"}", 400, "seed", "must be an integer");
    refused(SV_COMPLETION, "{\"model\": \"tiny\", \"prompt\": \"x\", \"stop\": [\"a\", \"b\", \"c\", \"d\", \"e\"]}", 400,
            "stop", "has 5 strings; at most 4");
    refused(SV_COMPLETION, "{\"model\": \"tiny\", \"prompt\": \"x\", \"stop\": [\"\"]}", 400, "stop", "'stop[0]' is empty");
    refused(SV_COMPLETION, "{\"model\": \"tiny\", \"prompt\": \"x\", \"stop\": 7}", 400, "stop", "must be a string or an array");
    refused(SV_COMPLETION, "{\"model\": \"tiny\", \"prompt\": \"x\", \"stream\": \"yes\"}", 400, "stream", "must be a boolean");
    refused(SV_COMPLETION, "{\"model\": \"tiny\", \"prompt\": \"x\", \"n\": 2}", 400, "n", "'n' must be 1");
    refused(SV_COMPLETION, "{\"model\": \"tiny\", \"prompt\": \"x\", \"logprobs\": 3}", 400, "logprobs", "not supported");
    refused(SV_COMPLETION, "{\"model\": \"tiny\", \"prompt\": \"x\", \"stream_options\": 1}", 400, "stream_options",
            "must be an object");
    refused(SV_CHAT, "{\"model\": \"tiny\"}", 400, "messages", "'messages' is required");
    refused(SV_CHAT, "{\"model\": \"tiny\", \"messages\": []}", 400, "messages", "not an empty array");
    refused(SV_CHAT, "{\"model\": \"tiny\", \"messages\": [\"hi\"]}", 400, "messages[0]", "must be an object, not a string");
    refused(SV_CHAT, "{\"model\": \"tiny\", \"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}", 400, "messages[0]",
            "'messages[0].role' is 'tool'");
    refused(SV_CHAT, "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": 5}]}", 400, "messages[0]",
            "must be a string or an array of text parts");
    refused(SV_CHAT, "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}",
            400, "messages[0]", "only text is supported");
    refused(SV_CHAT, "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{}]}", 400,
            "tools", "not supported");
    /* a NUL inside a string: jansson refuses it (no text of ours holds one) */
    refused(SV_COMPLETION, "{\"model\": \"tiny\", \"prompt\": \"a\\u0000b\"}", 400, "", "the body is not JSON");
}
END_TEST

static json_t *load(char *s) {
    ck_assert_ptr_nonnull(s);
    json_error_t err;
    json_t      *o = json_loads(s, 0, &err);
    ck_assert_msg(o != NULL, "not JSON: %s: %s", s, err.text);
    free(s);
    return o;
}

static const char *str_at(json_t *o, const char *path) {
    json_t *v = o;
    char    key[64];
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, ".");
        snprintf(key, sizeof key, "%.*s", (int)n, p);
        v = key[0] >= '0' && key[0] <= '9' ? json_array_get(v, (size_t)atoi(key)) : json_object_get(v, key);
        ck_assert_msg(v != NULL, "no %s", path);
        p += n + (p[n] == '.');
    }
    return json_is_string(v) ? json_string_value(v) : json_is_null(v) ? "(null)" : "(other)";
}

START_TEST(answers_shapes) {
    sv_meta m = {.id = "chatcmpl-7", .model = "tiny", .created = 1700000000};
    json_t *o = load(sv_render_result(SV_CHAT, &m, "Hello!", 6, "stop", 5, 2));
    ck_assert_str_eq(str_at(o, "object"), "chat.completion");
    ck_assert_str_eq(str_at(o, "choices.0.message.role"), "assistant");
    ck_assert_str_eq(str_at(o, "choices.0.message.content"), "Hello!");
    ck_assert_str_eq(str_at(o, "choices.0.finish_reason"), "stop");
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(o, "usage"), "total_tokens")), 7);
    json_decref(o);
    m.id = "cmpl-8";
    o = load(sv_render_result(SV_COMPLETION, &m, "abc", 3, "length", 1, 3));
    ck_assert_str_eq(str_at(o, "object"), "text_completion");
    ck_assert_str_eq(str_at(o, "choices.0.text"), "abc");
    ck_assert_str_eq(str_at(o, "choices.0.logprobs"), "(null)");
    ck_assert_str_eq(str_at(o, "choices.0.finish_reason"), "length");
    json_decref(o);
    /* chunks: the chat's first names the role, the last carries finish_reason */
    o = load(sv_render_chunk(SV_CHAT, &m, "", 0, true, NULL));
    ck_assert_str_eq(str_at(o, "object"), "chat.completion.chunk");
    ck_assert_str_eq(str_at(o, "choices.0.delta.role"), "assistant");
    ck_assert_str_eq(str_at(o, "choices.0.finish_reason"), "(null)");
    json_decref(o);
    o = load(sv_render_chunk(SV_CHAT, &m, "lo", 2, false, NULL));
    ck_assert_str_eq(str_at(o, "choices.0.delta.content"), "lo");
    json_decref(o);
    o = load(sv_render_chunk(SV_CHAT, &m, NULL, 0, false, "stop"));
    ck_assert_str_eq(str_at(o, "choices.0.finish_reason"), "stop");
    ck_assert_ptr_null(json_object_get(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "delta"), "content"));
    json_decref(o);
    o = load(sv_render_usage(SV_COMPLETION, &m, 4, 9));
    ck_assert_int_eq(json_array_size(json_object_get(o, "choices")), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(o, "usage"), "completion_tokens")), 9);
    json_decref(o);
    /* bytes that are not UTF-8 (a token ending inside a character) become U+FFFD */
    o = load(sv_render_chunk(SV_COMPLETION, &m, "a\xe2\x82" "b\xc3\xa9", 6, false, NULL));
    ck_assert_str_eq(str_at(o, "choices.0.text"), "a\xef\xbf\xbd\xef\xbf\xbd" "b\xc3\xa9");
    json_decref(o);
    o = load(sv_render_models("tiny", 5));
    ck_assert_str_eq(str_at(o, "data.0.id"), "tiny");
    ck_assert_str_eq(str_at(o, "data.0.object"), "model");
    json_decref(o);
    sv_error e;
    sv_fail(&e, 404, "invalid_request_error", "model", "model_not_found", "The model '%s' does not exist", "x");
    o = load(sv_render_error(&e));
    ck_assert_str_eq(str_at(o, "error.message"), "The model 'x' does not exist");
    ck_assert_str_eq(str_at(o, "error.param"), "model");
    ck_assert_str_eq(str_at(o, "error.code"), "model_not_found");
    json_decref(o);
    sv_fail(&e, 400, "invalid_request_error", NULL, NULL, "bad");
    o = load(sv_render_error(&e));
    ck_assert_str_eq(str_at(o, "error.param"), "(null)");
    json_decref(o);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("serve_api", TS_CASE("serve_api", 30),
                        TS_TESTS(completion_fields, chat_fields, bad_requests, answers_shapes));
    return ts_main_isolated(s, "serve_api");
}
