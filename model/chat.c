/* Chat templates: a conversation (system, user and assistant messages) rendered as the text an
 * instruct model was trained on, as llama.cpp's llm_chat_apply_template renders it, and the
 * template of a GGUF (tokenizer.chat_template, Jinja text) told by the substrings
 * llm_chat_detect_template looks for (src/llama-chat.cpp, llama.cpp 2a20c85); docs/chat.md.
 *
 * There is no Jinja engine: like llama.cpp's built-in path, each template is a row of fixed
 * pieces (KM_TEMPLATES) that one renderer (render) walks, and detection is an ordered list of
 * substring rules (KM_RULES) that mirrors llama.cpp's if/else chain, the families kiln does not
 * render included, so that a template is never taken for a later family in the chain. */
#include "base/base.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* ---- templates ------------------------------------------------------------------------------- */

enum { SYS, USR, AST, NROLES };
static const char *const role_names[NROLES] = {"system", "user", "assistant"};
#define TRIM(r) (1u << (r))
#define TRIM_ALL (TRIM(SYS) | TRIM(USR) | TRIM(AST))

/* One template. Each message is pre[role] + content + post[role], its content trimmed of
 * C-locale white space when the role's trim bit is set (llama.cpp's trim()). Before the
 * messages comes head; after them, when add_generation_prompt is set, gen (NULL: the template
 * has none, as in llama.cpp, and the model writes right after the last message).
 *
 * turn (the [INST] families): the text that opens a turn, written before a message when no turn
 * is open; an assistant message closes the turn. A head opens the first turn (llama2 writes
 * "[INST] " even before no message at all; mistral writes nothing until a message comes).
 *
 * hold_system (gemma, which has no system role): system messages are kept, joined, and written
 * after the header of the next user message, followed by "\n\n". */
typedef struct {
    const char *name;
    const char *head, *turn;
    const char *pre[NROLES], *post[NROLES];
    const char *gen;
    unsigned    trim;
    bool        hold_system;
} km_chat_tmpl;

/* DeepSeek's full-width bar U+FF5C and SentencePiece's space U+2581, in UTF-8. */
#define FWBAR "\xEF\xBD\x9C"
#define SPM_SP "\xE2\x96\x81"
#define DS_EOS "<" FWBAR "end" SPM_SP "of" SPM_SP "sentence" FWBAR ">"
#define DS_USER "<" FWBAR "User" FWBAR ">"
#define DS_ASSISTANT "<" FWBAR "Assistant" FWBAR ">"

/* Field order: name, head, turn, pre {system, user, assistant}, post {...}, gen, trim, hold.
 * None writes the BOS text: llama.cpp leaves it to the tokenizer (add_bos_token). */
static const km_chat_tmpl KM_TEMPLATES[] = {
    /* ChatML: Qwen 2/2.5/3, OpenHermes, SmolLM */
    {"chatml", NULL, NULL,
     {"<|im_start|>system\n", "<|im_start|>user\n", "<|im_start|>assistant\n"},
     {"<|im_end|>\n", "<|im_end|>\n", "<|im_end|>\n"}, "<|im_start|>assistant\n", 0, false},
    /* Llama 2 and its variants: the system message inside the first [INST] (without <<SYS>>
     * for plain llama2), a <s> before each later [INST] (sys-bos), every message stripped
     * (sys-strip) */
    {"llama2", "[INST] ", "[INST] ", {"", "", ""}, {"\n", " [/INST]", "</s>"}, NULL, 0, false},
    {"llama2-sys", "[INST] ", "[INST] ", {"<<SYS>>\n", "", ""}, {"\n<</SYS>>\n\n", " [/INST]", "</s>"},
     NULL, 0, false},
    {"llama2-sys-bos", "[INST] ", "<s>[INST] ", {"<<SYS>>\n", "", ""},
     {"\n<</SYS>>\n\n", " [/INST]", "</s>"}, NULL, 0, false},
    {"llama2-sys-strip", "[INST] ", "[INST] ", {"<<SYS>>\n", "", ""},
     {"\n<</SYS>>\n\n", " [/INST]", "</s>"}, NULL, TRIM_ALL, false},
    /* Mistral's official templates (mistralai cookbook): v1 puts spaces outside [INST] and
     * before [/INST], v3 after [INST] and before the answer (trimmed), v3-tekken none */
    {"mistral-v1", NULL, " [INST] ", {"", "", " "}, {"\n\n", " [/INST]", "</s>"}, NULL, 0, false},
    {"mistral-v3", NULL, "[INST] ", {"", "", " "}, {"\n\n", "[/INST]", "</s>"}, NULL, TRIM(AST), false},
    {"mistral-v3-tekken", NULL, "[INST]", {"", "", ""}, {"\n\n", "[/INST]", "</s>"}, NULL, 0, false},
    /* v7: a system role of its own; tekken without the spaces */
    {"mistral-v7", NULL, NULL, {"[SYSTEM_PROMPT] ", "[INST] ", " "}, {"[/SYSTEM_PROMPT]", "[/INST]", "</s>"},
     NULL, 0, false},
    {"mistral-v7-tekken", NULL, NULL, {"[SYSTEM_PROMPT]", "[INST]", ""},
     {"[/SYSTEM_PROMPT]", "[/INST]", "</s>"}, NULL, 0, false},
    {"phi3", NULL, NULL, {"<|system|>\n", "<|user|>\n", "<|assistant|>\n"},
     {"<|end|>\n", "<|end|>\n", "<|end|>\n"}, "<|assistant|>\n", 0, false},
    {"phi4", NULL, NULL,
     {"<|im_start|>system<|im_sep|>", "<|im_start|>user<|im_sep|>", "<|im_start|>assistant<|im_sep|>"},
     {"<|im_end|>", "<|im_end|>", "<|im_end|>"}, "<|im_start|>assistant<|im_sep|>", 0, false},
    /* Gemma: "model" for the assistant, the system text merged into the next user turn */
    {"gemma", NULL, NULL, {"", "<start_of_turn>user\n", "<start_of_turn>model\n"},
     {"", "<end_of_turn>\n", "<end_of_turn>\n"}, "<start_of_turn>model\n", TRIM_ALL, true},
    /* deepseek-coder-33b-instruct */
    {"deepseek", NULL, NULL, {"", "### Instruction:\n", "### Response:\n"}, {"", "\n", "\n<|EOT|>\n"},
     "### Response:\n", 0, false},
    /* DeepSeek-V2 and V3 (R1) */
    {"deepseek2", NULL, NULL, {"", "User: ", "Assistant: "}, {"\n\n", "\n\n", DS_EOS}, "Assistant:", 0,
     false},
    {"deepseek3", NULL, NULL, {"", DS_USER, DS_ASSISTANT}, {"\n\n", "", DS_EOS}, DS_ASSISTANT, 0, false},
    /* Llama 3, 3.1, 3.2, 3.3 */
    {"llama3", NULL, NULL,
     {"<|start_header_id|>system<|end_header_id|>\n\n", "<|start_header_id|>user<|end_header_id|>\n\n",
      "<|start_header_id|>assistant<|end_header_id|>\n\n"},
     {"<|eot_id|>", "<|eot_id|>", "<|eot_id|>"}, "<|start_header_id|>assistant<|end_header_id|>\n\n",
     TRIM_ALL, false},
};
#define KM_NTEMPLATES (sizeof KM_TEMPLATES / sizeof KM_TEMPLATES[0])

/* ---- detection ------------------------------------------------------------------------------- */

/* One rule of llm_chat_detect_template, in its order: the template matches when it holds every
 * string of all, at least one of any (when any[0] is set) and, with inst, passes the gate of
 * llama.cpp's [INST] branch (it starts with "mistral" or holds "[INST]"). That branch ends with
 * llama2, which takes whatever passed the gate, as llama.cpp does. Names kiln does not render
 * are here too (render_name finds no template for them). */
typedef struct {
    const char *name;
    bool        inst;
    const char *all[4], *any[2];
} km_chat_rule;

#define V13_GATE "' [INST] ' + system_message", "[AVAILABLE_TOOLS]"
static const km_chat_rule KM_RULES[] = {
    {"phi4", false, {"<|im_start|>", "<|im_sep|>"}, {NULL}},
    {"smolvlm", false, {"<|im_start|>", "<end_of_utterance>"}, {NULL}},
    {"chatml", false, {"<|im_start|>"}, {NULL}},
    {"mistral-v7", true, {"[SYSTEM_PROMPT]"}, {NULL}},
    {"mistral-v1", true, {" [INST]"}, {V13_GATE}},
    {"mistral-v3-tekken", true, {"\"[INST]\""}, {V13_GATE}},
    {"mistral-v3", true, {NULL}, {V13_GATE}},
    {"llama2-sys-strip", true, {"content.strip()"}, {NULL}},
    {"llama2-sys-bos", true, {"bos_token + '[INST]"}, {NULL}},
    {"llama2-sys", true, {"<<SYS>>"}, {NULL}},
    {"llama2", true, {NULL}, {NULL}},
    {"phi3", false, {"<|assistant|>", "<|end|>"}, {NULL}},
    {"chatglm4", false, {"[gMASK]<sop>"}, {NULL}},
    {"falcon3", false, {"<|assistant|>", "<|user|>", "</s>"}, {NULL}},
    {"glmedge", false, {"<|assistant|>", "<|user|>"}, {NULL}},
    {"glmedge", false, {"<|{{ item['role'] }}|>", "<|begin_of_image|>"}, {NULL}},
    {"zephyr", false, {"<|user|>", "<|endoftext|>"}, {NULL}},
    {"monarch", false, {"bos_token + message['role']"}, {NULL}},
    {"gemma", false, {"<start_of_turn>"}, {NULL}},
    {"orion", false, {"'\\n\\nAssistant: ' + eos_token"}, {NULL}},
    {"openchat", false, {"GPT4 Correct "}, {NULL}},
    {"vicuna-orca", false, {"USER: ", "ASSISTANT: ", "SYSTEM: "}, {NULL}},
    {"vicuna", false, {"USER: ", "ASSISTANT: "}, {NULL}},
    {"deepseek", false, {"### Instruction:", "<|EOT|>"}, {NULL}},
    {"command-r", false, {"<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"}, {NULL}},
    {"llama3", false, {"<|start_header_id|>", "<|end_header_id|>"}, {NULL}},
    {"chatglm3", false, {"[gMASK]sop"}, {NULL}},
    {"minicpm", false, {"<\xE7\x94\xA8\xE6\x88\xB7>"}, {NULL}}, /* <用户> */
    {"deepseek2", false, {"'Assistant: ' + message['content'] + eos_token"}, {NULL}},
    {"deepseek3", false, {DS_ASSISTANT, DS_USER, DS_EOS}, {NULL}},
    {"exaone4", false, {"[|system|]", "[|assistant|]", "[|endofturn|]", "[|tool|]"}, {NULL}},
    {"exaone3", false, {"[|system|]", "[|assistant|]", "[|endofturn|]"}, {NULL}},
    {"rwkv-world", false, {NULL}, {"rwkv-world", "{{- 'User: ' + message['content']|trim + '\\n\\n' -}}"}},
    {"granite", false, {"<|start_of_role|>"}, {NULL}},
    {"gigachat", false,
     {"message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1]"},
     {NULL}},
    {"megrez", false, {"<|role_start|>"}, {NULL}},
    /* " Ассистент:" */
    {"yandex", false, {" \xD0\x90\xD1\x81\xD1\x81\xD0\xB8\xD1\x81\xD1\x82\xD0\xB5\xD0\xBD\xD1\x82:"}, {NULL}},
    {"bailing", false, {"<role>ASSISTANT</role>", "'HUMAN'"}, {NULL}},
    {"bailing-think", false, {"<role>ASSISTANT</role>", "\"HUMAN\"", "<think>"}, {NULL}},
    {"bailing2", false, {"<role>ASSISTANT</role>", "<role>HUMAN</role>", "<|role_end|>"}, {NULL}},
    {"llama4", false, {"<|header_start|>", "<|header_end|>"}, {NULL}},
    {"dots1", false, {"<|endofuserprompt|>"}, {NULL}},
    {"hunyuan-moe", false, {"<|extra_0|>", "<|extra_4|>"}, {NULL}},
    {"gpt-oss", false, {"<|start|>", "<|channel|>"}, {NULL}},
    {"hunyuan-dense", false,
     {"<" FWBAR "hy_Assistant" FWBAR ">", "<" FWBAR "hy_place" SPM_SP "holder" SPM_SP "no" SPM_SP "3" FWBAR ">"},
     {NULL}},
    {"kimi-k2", false, {"<|im_assistant|>assistant<|im_middle|>"}, {NULL}},
    {"seed_oss", false, {"<seed:bos>"}, {NULL}},
    {"grok-2", false, {"'Assistant: '  + message['content'] + '<|separator|>"}, {NULL}},
    /* [unused9]系统：[unused10] */
    {"pangu-embedded", false, {"[unused9]\xE7\xB3\xBB\xE7\xBB\x9F\xEF\xBC\x9A[unused10]"}, {NULL}},
};
#define KM_NRULES (sizeof KM_RULES / sizeof KM_RULES[0])

static const km_chat_tmpl *find_template(const char *name) {
    for (size_t i = 0; i < KM_NTEMPLATES; i++)
        if (strcmp(KM_TEMPLATES[i].name, name) == 0) return &KM_TEMPLATES[i];
    return NULL;
}

/* Whether name is one of llama.cpp's template names (LLM_CHAT_TEMPLATES: every rule's name but
 * dots1, which llama.cpp detects but does not take by name), so that a name kiln does not
 * render is told apart from a typo. */
static bool llama_knows(const char *name) {
    for (size_t i = 0; i < KM_NRULES; i++)
        if (strcmp(KM_RULES[i].name, name) == 0) return strcmp(name, "dots1") != 0;
    return false;
}

/* "chatml, llama2, ...": kiln's templates, for error messages (caller frees; NULL: no memory) */
static char *names_list(void) {
    kb_str b = {0};
    for (size_t i = 0; i < KM_NTEMPLATES; i++) {
        if (i) kb_str_add(&b, ", ");
        kb_str_add(&b, KM_TEMPLATES[i].name);
    }
    return kb_str_take(&b);
}

/* Why a name or template text is not one of kiln's templates. */
typedef enum {
    NOT_A_NAME,    /* a name no one knows */
    NOT_RENDERED,  /* a name of llama.cpp's that kiln does not render */
    DETECTED_ONLY, /* a template text detected as such a name */
    NO_RULE,       /* a template text that matches no rule */
} why_unknown;

/* The error for name, with kiln's names so that the user can pick one. */
static kiln_status unknown(why_unknown what, const char *name) {
    char *list = names_list();
    if (!list) return kb_oom();
    kiln_status st;
    if (what == NOT_A_NAME)
        st = kb_error(KILN_ERR_NOT_FOUND, "unknown chat template '%s' (kiln's templates: %s)", name, list);
    else if (what == NOT_RENDERED)
        st = kb_error(KILN_ERR_NOT_FOUND,
                      "chat template '%s' is llama.cpp's, but kiln does not render it (kiln's templates: %s)", name,
                      list);
    else if (what == DETECTED_ONLY)
        st = kb_error(KILN_ERR_NOT_FOUND,
                      "the chat template is llama.cpp's '%s', which kiln does not render (kiln's templates: %s)",
                      name, list);
    else
        st = kb_error(KILN_ERR_NOT_FOUND, "the chat template%s matches none that kiln knows (kiln's templates: %s)",
                      *name ? "" : " (empty)", list);
    free(list);
    return st;
}

static bool rule_matches(const km_chat_rule *r, const char *tmpl) {
    if (r->inst && strncmp(tmpl, "mistral", 7) != 0 && !strstr(tmpl, "[INST]")) return false;
    for (int i = 0; i < 4 && r->all[i]; i++)
        if (!strstr(tmpl, r->all[i])) return false;
    if (!r->any[0]) return true;
    for (int i = 0; i < 2 && r->any[i]; i++)
        if (strstr(tmpl, r->any[i])) return true;
    return false;
}

int kiln_chat_template_count(void) { return (int)KM_NTEMPLATES; }

const char *kiln_chat_template_name(int i) {
    return i >= 0 && (size_t)i < KM_NTEMPLATES ? KM_TEMPLATES[i].name : NULL;
}

kiln_status kiln_chat_template_by_name(const char *name) {
    if (!name) return kb_error(KILN_ERR_INVALID, "kiln_chat_template_by_name: name is NULL");
    if (find_template(name)) return NULL;
    return unknown(llama_knows(name) ? NOT_RENDERED : NOT_A_NAME, name);
}

kiln_status kiln_chat_template_detect(const char *tmpl, const char **name) {
    if (!tmpl || !name)
        return kb_error(KILN_ERR_INVALID, "kiln_chat_template_detect: %s is NULL", tmpl ? "name" : "tmpl");
    *name = NULL;
    /* a template's text may be a name, as in llm_chat_detect_template */
    const km_chat_tmpl *t = find_template(tmpl);
    if (t) return *name = t->name, NULL;
    if (llama_knows(tmpl)) return unknown(NOT_RENDERED, tmpl);
    for (size_t i = 0; i < KM_NRULES; i++) {
        if (!rule_matches(&KM_RULES[i], tmpl)) continue;
        if (!(t = find_template(KM_RULES[i].name))) return unknown(DETECTED_ONLY, KM_RULES[i].name);
        return *name = t->name, NULL;
    }
    return unknown(NO_RULE, tmpl);
}

/* ---- rendering ------------------------------------------------------------------------------- */

/* isspace() of the C locale, which llama.cpp's trim() uses */
static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'; }

static void add_content(kb_str *b, const char *s, bool trim) {
    size_t n = strlen(s);
    if (trim) {
        while (n && is_space(*s)) s++, n--;
        while (n && is_space(s[n - 1])) n--;
    }
    kb_str_addn(b, s, n);
}

/* The role of message i, or an error naming it and its index. */
static kiln_status check_msg(const kiln_chat_msg *m, size_t i, int *role) {
    if (!m->role || !m->content)
        return kb_error(KILN_ERR_INVALID, "chat message %zu: %s is NULL", i, m->role ? "content" : "role");
    for (int r = 0; r < NROLES; r++)
        if (strcmp(m->role, role_names[r]) == 0) return *role = r, NULL;
    return kb_error(KILN_ERR_INVALID, "chat message %zu: unknown role '%s' (system, user or assistant)", i,
                    m->role);
}

/* One message of t into b; *inside: a turn is open; held: gemma's system text so far. */
static void render_msg(const km_chat_tmpl *t, int role, const char *content, bool *inside, kb_str *b,
                       kb_str *held) {
    bool trim = t->trim & TRIM(role);
    if (t->hold_system && role == SYS) {
        add_content(held, content, trim);
        return;
    }
    if (t->turn && !*inside) kb_str_add(b, t->turn), *inside = true;
    kb_str_add(b, t->pre[role]);
    if (t->hold_system && role == USR && held->len) {
        kb_str_addn(b, held->s, held->len);
        kb_str_add(b, "\n\n");
        held->len = 0;
    }
    add_content(b, content, trim);
    kb_str_add(b, t->post[role]);
    if (role == AST) *inside = false;
}

static kiln_status render(const km_chat_tmpl *t, const kiln_chat_msg *msgs, size_t n, bool gen, char **out) {
    kb_str b = {0}, held = {0};
    kb_str_add(&b, t->head ? t->head : "");
    kb_str_add(&held, "");
    bool inside = t->head != NULL;
    for (size_t i = 0; i < n; i++) {
        int         role;
        kiln_status st = check_msg(&msgs[i], i, &role);
        if (st) {
            kb_str_free(&b);
            kb_str_free(&held);
            return st;
        }
        render_msg(t, role, msgs[i].content, &inside, &b, &held);
    }
    if (gen && t->gen) kb_str_add(&b, t->gen);
    bool oom = held.oom;
    kb_str_free(&held);
    if (oom) kb_str_free(&b);
    return (*out = oom ? NULL : kb_str_take(&b)) ? NULL : kb_oom();
}

kiln_status kiln_chat_apply(const char *name, const kiln_chat_msg *msgs, size_t n, bool add_generation_prompt,
                            char **out) {
    if (!out) return kb_error(KILN_ERR_INVALID, "kiln_chat_apply: out is NULL");
    *out = NULL;
    if (!name || (n && !msgs))
        return kb_error(KILN_ERR_INVALID, "kiln_chat_apply: %s is NULL", name ? "msgs" : "name");
    const km_chat_tmpl *t = find_template(name);
    if (!t) return kiln_chat_template_by_name(name);
    return render(t, msgs, n, add_generation_prompt, out);
}

kiln_status kiln_chat_apply_delta(const char *name, const kiln_chat_msg *msgs, size_t n, bool add_generation_prompt,
                                  char **out) {
    if (!out) return kb_error(KILN_ERR_INVALID, "kiln_chat_apply_delta: out is NULL");
    *out = NULL;
    if (n == 0) return kb_error(KILN_ERR_INVALID, "kiln_chat_apply_delta: n = 0 (no new message)");
    char       *past = NULL, *all = NULL;
    kiln_status st = n > 1 ? kiln_chat_apply(name, msgs, n - 1, false, &past) : NULL;
    if (!st) st = kiln_chat_apply(name, msgs, n, add_generation_prompt, &all);
    /* common_chat_format_single renders no past as "" (not llama2's lone "[INST] ") */
    size_t np = past ? strlen(past) : 0, na = all ? strlen(all) : 0;
    if (!st && na < np) st = kb_error(KILN_ERR_INVALID, "kiln_chat_apply_delta: the conversation got shorter");
    if (!st) {
        /* llama.cpp puts back the newline after the last turn that the model never saw: its
         * generation stopped at the end-of-turn token before it */
        kb_str b = {0};
        kb_str_add(&b, add_generation_prompt && np && past[np - 1] == '\n' ? "\n" : "");
        kb_str_addn(&b, all + np, na - np);
        if (!(*out = kb_str_take(&b))) st = kb_oom();
    }
    free(past);
    free(all);
    return st;
}

kiln_status kiln_chat_template_from_gguf(const kiln_gguf *g, char **tmpl) {
    if (!tmpl) return kb_error(KILN_ERR_INVALID, "kiln_chat_template_from_gguf: tmpl is NULL");
    *tmpl = NULL;
    if (!g || kiln_gguf_find_kv(g, "tokenizer.chat_template") < 0) return NULL;
    const char *s;
    size_t      len;
    kiln_status st = kiln_gguf_get_str(g, "tokenizer.chat_template", &s, &len);
    if (st) return st;
    if (memchr(s, 0, len))
        return kb_error(KILN_ERR_FORMAT, "tokenizer.chat_template holds a NUL byte at offset %zu",
                        (size_t)((const char *)memchr(s, 0, len) - s));
    if (!(*tmpl = malloc(len + 1))) return kb_oom();
    memcpy(*tmpl, s, len);
    (*tmpl)[len] = 0;
    return NULL;
}
