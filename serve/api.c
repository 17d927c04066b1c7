/* The OpenAI API's requests and answers (serve/serve.h): bodies of POST /v1/completions and
 * /v1/chat/completions parsed and checked field by field, every refusal an OpenAI-style error
 * naming the parameter; the JSON of results, streamed chunks, usage, models and errors.
 *
 * What is read, as OpenAI documents it and llama.cpp's server accepts it: model (required; must
 * be the served one), prompt (a string, a one-string array, or token ids) or messages (roles
 * system, developer (as system), user, assistant; content a string, null, or text parts),
 * max_tokens / max_completion_tokens, temperature [0, 2], top_p (0, 1], top_k and min_p
 * (llama.cpp's extensions), seed, stop (a string or up to 4), stream, stream_options.include_usage,
 * n (1 only). Fields not listed are ignored, as OpenAI's clients send more (user, ...);
 * logprobs, tools and n > 1, which would change the answer, are refused. */
#include "serve/serve.h"

#include "base/base.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool sv_fail(sv_error *e, int status, const char *type, const char *param, const char *code, const char *fmt, ...) {
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

#define BAD(param, ...) sv_fail(e, 400, "invalid_request_error", (param), NULL, __VA_ARGS__)

static char *dup_str(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n), d[n] = 0;
    return d;
}

static const char *type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* A number field in [lo, hi] (lo_open: lo excluded); absent or null keeps *out. */
static bool get_number(const json_t *o, const char *key, double lo, bool lo_open, double hi, float *out, sv_error *e) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v)) return BAD(key, "'%s' must be a number, not %s", key, type_name(v));
    double x = json_number_value(v);
    if (!(lo_open ? x > lo : x >= lo) || !(x <= hi))
        return BAD(key, "'%s' is %g; it must be in %s%g, %g]", key, x, lo_open ? "(" : "[", lo, hi);
    *out = (float)x;
    return true;
}

/* An integer field in [lo, hi]; absent or null keeps *out. */
static bool get_int(const json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out, sv_error *e) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_integer(v)) return BAD(key, "'%s' must be an integer, not %s", key, type_name(v));
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return BAD(key, "'%s' is %lld; it must be in [%lld, %lld]", key, (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return true;
}

static bool get_bool(const json_t *o, const char *key, bool *out, sv_error *e) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) return BAD(key, "'%s' must be a boolean, not %s", key, type_name(v));
    *out = json_is_true(v);
    return true;
}

/* model: required, the one served (OpenAI answers another with 404 model_not_found). */
static bool check_model(const json_t *o, const char *model_id, sv_error *e) {
    const json_t *v = json_object_get(o, "model");
    if (!v) return BAD("model", "'model' is required (this server serves '%s')", model_id);
    if (!json_is_string(v)) return BAD("model", "'model' must be a string, not %s", type_name(v));
    if (strcmp(json_string_value(v), model_id) != 0)
        return sv_fail(e, 404, "invalid_request_error", "model", "model_not_found",
                       "The model '%.100s' does not exist; this server serves '%s'", json_string_value(v), model_id);
    return true;
}

/* stop: a string or an array of up to SV_MAX_STOP non-empty strings. */
static bool get_stop(const json_t *o, sv_request *r, sv_error *e) {
    const json_t *v = json_object_get(o, "stop");
    if (!v || json_is_null(v)) return true;
    const json_t *one[1] = {v};
    size_t        n = json_is_string(v) ? 1 : json_is_array(v) ? json_array_size(v) : 0;
    if (!json_is_string(v) && !json_is_array(v))
        return BAD("stop", "'stop' must be a string or an array of strings, not %s", type_name(v));
    if (n > SV_MAX_STOP) return BAD("stop", "'stop' has %zu strings; at most %d", n, SV_MAX_STOP);
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_is_string(v) ? one[0] : json_array_get(v, i);
        if (!json_is_string(s)) return BAD("stop", "'stop[%zu]' must be a string, not %s", i, type_name(s));
        if (json_string_length(s) == 0) return BAD("stop", "'stop[%zu]' is empty", i);
        if (!(r->stop[r->n_stop] = dup_str(json_string_value(s), json_string_length(s))))
            return sv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        r->n_stop++;
    }
    return true;
}

/* The sampling and length fields both kinds share. */
static bool common_fields(const json_t *o, sv_request *r, sv_error *e) {
    int64_t max = -1, seed = (int64_t)r->sampler.seed, top_k = r->sampler.top_k;
    const json_t *n = json_object_get(o, "n");
    if (n && !json_is_null(n) && !(json_is_integer(n) && json_integer_value(n) == 1))
        return BAD("n", "'n' must be 1: one choice per request");
    /* max_completion_tokens is the newer name (chat); either may be given */
    if (!get_int(o, "max_tokens", 0, INT32_MAX, &max, e) || !get_int(o, "max_completion_tokens", 0, INT32_MAX, &max, e))
        return false;
    r->max_tokens = max;
    if (!get_number(o, "temperature", 0, false, 2, &r->sampler.temp, e) ||
        !get_number(o, "top_p", 0, true, 1, &r->sampler.top_p, e) ||
        !get_number(o, "min_p", 0, false, 1, &r->sampler.min_p, e) || !get_int(o, "top_k", 0, INT32_MAX, &top_k, e) ||
        !get_int(o, "seed", INT64_MIN, INT64_MAX, &seed, e) || !get_bool(o, "stream", &r->stream, e) ||
        !get_stop(o, r, e))
        return false;
    r->sampler.top_k = (int32_t)top_k;
    r->sampler.seed = (uint64_t)seed;
    kiln_status st = kiln_sampler_check(&r->sampler); /* (the ranges above hold it; kept as the guard) */
    if (st) {
        BAD(NULL, "%s", kiln_status_msg(st));
        kiln_status_free(st);
        return false;
    }
    const json_t *so = json_object_get(o, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return BAD("stream_options", "'stream_options' must be an object, not %s", type_name(so));
        if (!get_bool(so, "include_usage", &r->include_usage, e)) return false;
    }
    const json_t *lp = json_object_get(o, "logprobs");
    if (lp && !json_is_null(lp) && !json_is_false(lp) && !(json_is_integer(lp) && json_integer_value(lp) == 0))
        return BAD("logprobs", "'logprobs' is not supported");
    const json_t *tools = json_object_get(o, "tools");
    if (tools && !json_is_null(tools) && !(json_is_array(tools) && json_array_size(tools) == 0))
        return BAD("tools", "'tools' (function calling) is not supported");
    return true;
}

/* prompt: a string, an array of one string, or an array of token ids in [0, n_vocab). */
static bool get_prompt(const json_t *o, int64_t n_vocab, sv_request *r, sv_error *e) {
    const json_t *v = json_object_get(o, "prompt");
    if (!v) return BAD("prompt", "'prompt' is required");
    if (json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0))) v = json_array_get(v, 0);
    if (json_is_string(v)) {
        if (!(r->prompt = dup_str(json_string_value(v), json_string_length(v))))
            return sv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        return true;
    }
    if (!json_is_array(v) || json_array_size(v) == 0)
        return BAD("prompt", "'prompt' must be a string, an array of one string or a non-empty array of token ids, not "
                             "%s%s", json_is_array(v) ? "an empty or multi-prompt array" : type_name(v), "");
    size_t n = json_array_size(v);
    if (!(r->prompt_ids = malloc(sizeof *r->prompt_ids * n))) return sv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *t = json_array_get(v, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= n_vocab)
            return BAD("prompt", "'prompt[%zu]' must be a token id in [0, %lld) (one prompt per request)", i,
                       (long long)n_vocab);
        r->prompt_ids[i] = (int32_t)json_integer_value(t);
    }
    r->n_prompt_ids = (int64_t)n;
    return true;
}

/* A message's content: a string, null (an assistant turn of tool calls: empty), or an array of
 * parts of type "text", joined. */
static bool content_text(const json_t *c, size_t i, char **out, sv_error *e) {
    char param[32];
    snprintf(param, sizeof param, "messages[%zu]", i);
    if (!c || json_is_null(c)) return (*out = dup_str("", 0)) ? true : sv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    if (json_is_string(c)) {
        *out = dup_str(json_string_value(c), json_string_length(c));
        return *out ? true : sv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    if (!json_is_array(c)) return BAD(param, "'%s.content' must be a string or an array of text parts, not %s", param, type_name(c));
    kb_str s = {0};
    for (size_t k = 0; k < json_array_size(c); k++) {
        const json_t *part = json_array_get(c, k), *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text") != 0 ||
            !json_is_string(text)) {
            free(kb_str_take(&s));
            return BAD(param, "'%s.content[%zu]' must be {\"type\": \"text\", \"text\": \"...\"} (only text is supported)",
                       param, k);
        }
        kb_str_add(&s, json_string_value(text));
    }
    *out = kb_str_take(&s);
    if (!*out) *out = dup_str("", 0);
    return *out ? true : sv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
}

static bool get_messages(const json_t *o, sv_request *r, sv_error *e) {
    const json_t *v = json_object_get(o, "messages");
    if (!v) return BAD("messages", "'messages' is required");
    if (!json_is_array(v) || json_array_size(v) == 0)
        return BAD("messages", "'messages' must be a non-empty array of messages, not %s",
                   json_is_array(v) ? "an empty array" : type_name(v));
    size_t n = json_array_size(v);
    if (!(r->msgs = calloc(n, sizeof *r->msgs))) return sv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *m = json_array_get(v, i), *role = json_object_get(m, "role");
        char          param[32];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(m)) return BAD(param, "'%s' must be an object, not %s", param, type_name(m));
        if (!json_is_string(role)) return BAD(param, "'%s.role' must be a string", param);
        const char *rs = json_string_value(role);
        /* developer: OpenAI's newer name for the system turn */
        const char *known = !strcmp(rs, "system") || !strcmp(rs, "developer") ? "system"
                          : !strcmp(rs, "user") ? "user" : !strcmp(rs, "assistant") ? "assistant" : NULL;
        if (!known)
            return BAD(param, "'%s.role' is '%.40s'; kiln takes system, developer, user and assistant turns", param, rs);
        r->msgs[i].role = known; /* static */
        r->n_msgs = i + 1;
        char *text = NULL;
        if (!content_text(json_object_get(m, "content"), i, &text, e)) return false;
        r->msgs[i].content = text;
    }
    return true;
}

bool sv_parse(sv_kind kind, const char *body, size_t len, const char *model_id, int64_t n_vocab, sv_request *out,
              sv_error *e) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->max_tokens = -1;
    out->sampler = kiln_sampler_params_default();
    json_error_t jerr;
    json_t      *o = json_loadb(body ? body : "", len, 0, &jerr);
    if (!o) return BAD(NULL, "the body is not JSON: %s (line %d, column %d)", jerr.text, jerr.line, jerr.column);
    bool ok = json_is_object(o) ? true : BAD(NULL, "the body must be a JSON object, not %s", type_name(o));
    ok = ok && check_model(o, model_id, e) && common_fields(o, out, e);
    ok = ok && (kind == SV_CHAT ? get_messages(o, out, e) : get_prompt(o, n_vocab, out, e));
    json_decref(o);
    if (!ok) sv_request_free(out);
    return ok;
}

void sv_request_free(sv_request *r) {
    if (!r) return;
    free(r->prompt);
    free(r->prompt_ids);
    for (size_t i = 0; i < r->n_msgs; i++) free((char *)r->msgs[i].content);
    free(r->msgs);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    memset(r, 0, sizeof *r);
}

/* ---- answers ---------------------------------------------------------------------------------- */

static char *dump(json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

char *sv_render_error(const sv_error *e) {
    json_t *err = json_pack("{s:s, s:s, s:o, s:o}", "message", e->message, "type", e->type, "param",
                            e->param[0] ? json_string(e->param) : json_null(), "code",
                            e->code[0] ? json_string(e->code) : json_null());
    return dump(err ? json_pack("{s:o}", "error", err) : NULL);
}

static json_t *head(sv_kind kind, const sv_meta *m, bool chunk) {
    const char *object = kind == SV_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    return json_pack("{s:s, s:s, s:I, s:s}", "id", m->id, "object", object, "created", (json_int_t)m->created, "model",
                     m->model);
}

static json_t *usage(int64_t p, int64_t c) {
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)p, "completion_tokens", (json_int_t)c,
                     "total_tokens", (json_int_t)(p + c));
}

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 when invalid: no overlongs, no
 * surrogates, nothing past U+10FFFF, no NUL (JSON text from jansson must not hold one). */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c >= 0x01 && c < 0x80) return 1;
    size_t k = c >= 0xc2 && c < 0xe0 ? 2 : c >= 0xe0 && c < 0xf0 ? 3 : c >= 0xf0 && c < 0xf5 ? 4 : 0;
    if (!k || k > n) return 0;
    for (size_t i = 1; i < k; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0) || (c == 0xf0 && s[1] < 0x90) ||
        (c == 0xf4 && s[1] >= 0x90))
        return 0;
    return k;
}

/* The generated text as a JSON string: a model may emit bytes that are not UTF-8 (a token
 * sequence that ends inside a character), which JSON cannot carry: each such byte becomes
 * U+FFFD, as llama.cpp's server does. */
static json_t *text_value(const char *text, size_t len) {
    const unsigned char *u = (const unsigned char *)(text ? text : "");
    if (!text) len = 0;
    kb_str s = {0};
    size_t i = 0, from = 0;
    bool   clean = true;
    while (i < len) {
        size_t k = utf8_len(u + i, len - i);
        if (k) {
            i += k;
            continue;
        }
        clean = false;
        kb_str_addf(&s, "%.*s\xEF\xBF\xBD", (int)(i - from), (const char *)u + from);
        from = ++i;
    }
    if (clean) return json_stringn((const char *)u, len);
    kb_str_addf(&s, "%.*s", (int)(len - from), (const char *)u + from);
    char   *t = kb_str_take(&s);
    json_t *v = t ? json_string(t) : NULL;
    free(t);
    return v;
}

char *sv_render_result(sv_kind kind, const sv_meta *m, const char *text, size_t len, const char *finish,
                       int64_t prompt_tokens, int64_t completion_tokens) {
    json_t *o = head(kind, m, false), *choice;
    if (kind == SV_CHAT)
        choice = json_pack("{s:i, s:{s:s, s:o}, s:s}", "index", 0, "message", "role", "assistant", "content",
                           text_value(text, len), "finish_reason", finish);
    else
        choice = json_pack("{s:i, s:o, s:n, s:s}", "index", 0, "text", text_value(text, len), "logprobs",
                           "finish_reason", finish);
    if (!o || !choice) {
        json_decref(o), json_decref(choice);
        return NULL;
    }
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    json_object_set_new(o, "usage", usage(prompt_tokens, completion_tokens));
    return dump(o);
}

char *sv_render_chunk(sv_kind kind, const sv_meta *m, const char *text, size_t len, bool role, const char *finish) {
    json_t *o = head(kind, m, true), *choice;
    json_t *fin = finish ? json_string(finish) : json_null();
    if (kind == SV_CHAT) {
        json_t *delta = json_object();
        if (role) json_object_set_new(delta, "role", json_string("assistant"));
        if (len || (!role && !finish)) json_object_set_new(delta, "content", text_value(text, len));
        choice = json_pack("{s:i, s:o, s:o}", "index", 0, "delta", delta, "finish_reason", fin);
    } else {
        choice = json_pack("{s:i, s:o, s:n, s:o}", "index", 0, "text", text_value(text, len), "logprobs",
                           "finish_reason", fin);
    }
    if (!o || !choice) {
        json_decref(o), json_decref(choice);
        return NULL;
    }
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    return dump(o);
}

char *sv_render_usage(sv_kind kind, const sv_meta *m, int64_t prompt_tokens, int64_t completion_tokens) {
    json_t *o = head(kind, m, true);
    if (!o) return NULL;
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", usage(prompt_tokens, completion_tokens));
    return dump(o);
}

char *sv_render_models(const char *model_id, int64_t created) {
    return dump(json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object", "list", "data", "id", model_id, "object", "model",
                          "created", (json_int_t)created, "owned_by", "kiln"));
}
