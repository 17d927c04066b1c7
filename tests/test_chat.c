/* Chat templates (model/chat.c), no GPU:
 *  - every template renders llama.cpp's test conversation (tests/test-chat-template.cpp:
 *    system, user, assistant, user, an assistant answer with spaces around it, user) to the
 *    text llm_chat_apply_template (src/llama-chat.cpp) gives, with and without the generation
 *    prompt; the strings are typed here by hand, from llama.cpp's test where it has the case,
 *    else worked out from the branch of llm_chat_apply_template named in the row;
 *  - gemma's held system text, llama2's opening [INST] of an empty conversation, the delta of
 *    a conversation that goes on (common_chat_format_single);
 *  - detection from excerpts of real Jinja templates holding the markers
 *    llm_chat_detect_template looks for, in its order; names as templates; llama.cpp's
 *    templates that kiln does not render, and unknown ones, refused with kiln's names;
 *  - bad roles, NULL and empty arguments refused with a message naming what is wrong;
 *  - tokenizer.chat_template read from a GGUF. */
#include "tests/support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* DeepSeek's special tokens (full-width bar U+FF5C, U+2581 for spaces) */
#define FWBAR "\xEF\xBD\x9C"
#define DS_EOS "<" FWBAR "end\xE2\x96\x81of\xE2\x96\x81sentence" FWBAR ">"
#define DS_USER "<" FWBAR "User" FWBAR ">"
#define DS_ASSISTANT "<" FWBAR "Assistant" FWBAR ">"

/* llama.cpp's conversation (main_automated_tests) */
static const kiln_chat_msg CONV[] = {
    {"system", "You are a helpful assistant"},
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you"},
    {"assistant", "   I am an assistant   "},
    {"user", "Another question"},
};
#define NCONV (sizeof CONV / sizeof CONV[0])

/* A template's rendering of CONV without the generation prompt, and what the prompt adds. */
typedef struct {
    const char *name, *text, *gen;
} rendered;

static const rendered RENDERED[] = {
    /* llama.cpp's case "teknium/OpenHermes-2.5-Mistral-7B" */
    {"chatml",
     "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
     "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n"
     "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n",
     "<|im_start|>assistant\n"},
    /* "mistralai/Mistral-7B-Instruct-v0.2 (NOTE: Old pre-v1 without a system prompt)": the
     * system text without <<SYS>>, then "\n" */
    {"llama2",
     "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you [/INST]   I am an "
     "assistant   </s>[INST] Another question [/INST]",
     ""},
    /* the LLAMA_2 branch with support_system_message */
    {"llama2-sys",
     "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who are you "
     "[/INST]   I am an assistant   </s>[INST] Another question [/INST]",
     ""},
    /* "TheBloke/FusionNet_34Bx2_MoE-AWQ" */
    {"llama2-sys-bos",
     "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s><s>[INST] Who are you "
     "[/INST]   I am an assistant   </s><s>[INST] Another question [/INST]",
     ""},
    /* "bofenghuang/vigogne-2-70b-chat" */
    {"llama2-sys-strip",
     "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who are you "
     "[/INST]I am an assistant</s>[INST] Another question [/INST]",
     ""},
    /* "mistralai 'v1' template with a system prompt" */
    {"mistral-v1",
     " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]    I am an "
     "assistant   </s> [INST] Another question [/INST]",
     ""},
    /* "Mistral-Large-Instruct-2407 (mistralai 'v3' template ...)": the answer trimmed */
    {"mistral-v3",
     "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are you[/INST] I am an "
     "assistant</s>[INST] Another question[/INST]",
     ""},
    /* "Mistral-Nemo-Instruct-2407 (mistralai 'v3-tekken' template ...)" */
    {"mistral-v3-tekken",
     "[INST]You are a helpful assistant\n\nHello[/INST]Hi there</s>[INST]Who are you[/INST]   I am an "
     "assistant   </s>[INST]Another question[/INST]",
     ""},
    /* "mistralai/Mistral-Large-Instruct-2411 (mistralai 'v7' template)" */
    {"mistral-v7",
     "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>[INST] Who are "
     "you[/INST]    I am an assistant   </s>[INST] Another question[/INST]",
     ""},
    /* the MISTRAL_V7 branch with trailing_space "" */
    {"mistral-v7-tekken",
     "[SYSTEM_PROMPT]You are a helpful assistant[/SYSTEM_PROMPT][INST]Hello[/INST]Hi there</s>[INST]Who are "
     "you[/INST]   I am an assistant   </s>[INST]Another question[/INST]",
     ""},
    /* "Phi-3-small" */
    {"phi3",
     "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n"
     "<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\nAnother "
     "question<|end|>\n",
     "<|assistant|>\n"},
    /* "phi-4" */
    {"phi4",
     "<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|><|im_start|>user<|im_sep|>Hello<|im_end|>"
     "<|im_start|>assistant<|im_sep|>Hi there<|im_end|><|im_start|>user<|im_sep|>Who are you<|im_end|>"
     "<|im_start|>assistant<|im_sep|>   I am an assistant   <|im_end|><|im_start|>user<|im_sep|>Another "
     "question<|im_end|>",
     "<|im_start|>assistant<|im_sep|>"},
    /* "google/gemma-7b-it": the system text opens the first user turn */
    {"gemma",
     "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model\nHi "
     "there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an "
     "assistant<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n",
     "<start_of_turn>model\n"},
    /* "deepseek-ai/deepseek-coder-33b-instruct" */
    {"deepseek",
     "You are a helpful assistant### Instruction:\nHello\n### Response:\nHi there\n<|EOT|>\n### "
     "Instruction:\nWho are you\n### Response:\n   I am an assistant   \n<|EOT|>\n### Instruction:\nAnother "
     "question\n",
     "### Response:\n"},
    /* "DeepSeek-V2" */
    {"deepseek2",
     "You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi there" DS_EOS "User: Who are you\n\nAssistant: "
     "   I am an assistant   " DS_EOS "User: Another question\n\n",
     "Assistant:"},
    /* the DEEPSEEK_3 branch: system + "\n\n", <｜User｜> before a question, <｜Assistant｜>
     * before an answer and end-of-sentence after it */
    {"deepseek3",
     "You are a helpful assistant\n\n" DS_USER "Hello" DS_ASSISTANT "Hi there" DS_EOS DS_USER "Who are you" DS_ASSISTANT
     "   I am an assistant   " DS_EOS DS_USER "Another question",
     DS_ASSISTANT},
    /* "Llama-3": no <|begin_of_text|> (the tokenizer adds bos), every message trimmed */
    {"llama3",
     "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>user"
     "<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
     "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant"
     "<|end_header_id|>\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother "
     "question<|eot_id|>",
     "<|start_header_id|>assistant<|end_header_id|>\n\n"},
};
#define NRENDERED (int)(sizeof RENDERED / sizeof RENDERED[0])

/* The message of st (which must be an error of code) holds every needle; frees st. */
static void expect_err(kiln_status st, kiln_code code, const char *const *needles, const char *what) {
    ck_assert_msg(st != NULL, "%s: no error", what);
    const char *msg = kiln_status_msg(st);
    ck_assert_msg(kiln_status_code(st) == code, "%s: code %s (%s)", what, kiln_code_name(kiln_status_code(st)), msg);
    for (int i = 0; needles[i]; i++)
        ck_assert_msg(strstr(msg, needles[i]), "%s: '%s' lacks '%s'", what, msg, needles[i]);
    kiln_status_free(st);
}
#define EXPECT_ERR(st, code, what, ...) expect_err((st), (code), (const char *const[]){__VA_ARGS__, NULL}, (what))

static void expect_render(const char *name, const kiln_chat_msg *m, size_t n, bool gen, const char *want) {
    char *out = NULL;
    TS_OK(kiln_chat_apply(name, m, n, gen, &out));
    ck_assert_msg(strcmp(out, want) == 0, "%s (gen %d):\n got  [%s]\n want [%s]", name, gen, out, want);
    free(out);
}

/* ---- rendering ------------------------------------------------------------------------------- */

START_TEST(renders_conversation) {
    const rendered *r = &RENDERED[_i];
    TS_OK(kiln_chat_template_by_name(r->name));
    expect_render(r->name, CONV, NCONV, false, r->text);
    char want[4096];
    snprintf(want, sizeof want, "%s%s", r->text, r->gen);
    expect_render(r->name, CONV, NCONV, true, want);
}
END_TEST

/* every template kiln lists has a row above, and each row is a template */
START_TEST(every_template_pinned) {
    int n = kiln_chat_template_count();
    ck_assert_int_eq(n, NRENDERED);
    for (int i = 0; i < n; i++) {
        const char *name = kiln_chat_template_name(i);
        bool        found = false;
        for (int j = 0; j < NRENDERED; j++) found |= strcmp(RENDERED[j].name, name) == 0;
        ck_assert_msg(found, "template %s has no expected rendering", name);
    }
    ck_assert_ptr_null(kiln_chat_template_name(n));
    ck_assert_ptr_null(kiln_chat_template_name(-1));
}
END_TEST

/* The edges of llm_chat_apply_template's branches. */
START_TEST(render_edges) {
    /* no message: llama2 still opens its [INST], mistral does not; the others give only the
     * generation prompt */
    expect_render("llama2", NULL, 0, true, "[INST] ");
    expect_render("mistral-v3", NULL, 0, true, "");
    expect_render("chatml", NULL, 0, true, "<|im_start|>assistant\n");
    expect_render("chatml", NULL, 0, false, "");
    /* gemma: system texts are trimmed and joined, held over an answer until a user turn, and
     * dropped when none comes */
    const kiln_chat_msg g1[] = {{"system", "  S1 "}, {"system", "S2"}, {"assistant", "A"}, {"user", " U "}};
    expect_render("gemma", g1, 4, false,
                  "<start_of_turn>model\nA<end_of_turn>\n<start_of_turn>user\nS1S2\n\nU<end_of_turn>\n");
    expect_render("gemma", g1, 2, true, "<start_of_turn>model\n");
    /* llama2 without <<SYS>> support and a system message in a later turn */
    const kiln_chat_msg l2[] = {{"user", "a"}, {"assistant", "b"}, {"system", "s"}, {"user", "c"}};
    expect_render("llama2", l2, 4, false, "[INST] a [/INST]b</s>[INST] s\nc [/INST]");
    /* mistral-v3 trims only the answers; llama3 trims tabs and CRs too */
    const kiln_chat_msg sp[] = {{"user", " q "}, {"assistant", "\t a \r\n"}};
    expect_render("mistral-v3", sp, 2, false, "[INST]  q [/INST] a</s>");
    expect_render("llama3", sp, 2, false,
                  "<|start_header_id|>user<|end_header_id|>\n\nq<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\na<|eot_id|>");
    /* UTF-8 and empty contents pass through untouched */
    const kiln_chat_msg u[] = {{"user", "h\xC3\xA9llo \xE4\xB8\xAD"}, {"assistant", ""}};
    expect_render("chatml", u, 2, false,
                  "<|im_start|>user\nh\xC3\xA9llo \xE4\xB8\xAD<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n");
}
END_TEST

/* kiln_chat_apply_delta: what each new message adds, as common_chat_format_single cuts it. */
START_TEST(delta) {
    const kiln_chat_msg m[] = {{"system", "S"}, {"user", "U"}, {"assistant", "A"}, {"user", "V"}};
    char               *out;
    /* the first message: no past, so llama2's lone "[INST] " is not cut away */
    TS_OK(kiln_chat_apply_delta("llama2", m + 1, 1, true, &out));
    ck_assert_str_eq(out, "[INST] U [/INST]");
    free(out);
    /* a user message after a past that ends with "\n": the newline comes back in front */
    TS_OK(kiln_chat_apply_delta("chatml", m, 2, true, &out));
    ck_assert_str_eq(out, "\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
    free(out);
    /* the assistant's answer (no generation prompt: no newline in front) */
    TS_OK(kiln_chat_apply_delta("chatml", m, 3, false, &out));
    ck_assert_str_eq(out, "<|im_start|>assistant\nA<|im_end|>\n");
    free(out);
    /* llama3 ends a turn with <|eot_id|>, not "\n" */
    TS_OK(kiln_chat_apply_delta("llama3", m, 4, true, &out));
    ck_assert_str_eq(out, "<|start_header_id|>user<|end_header_id|>\n\nV<|eot_id|>"
                          "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(out);
    /* gemma: the system message adds nothing; the user turn after it carries it */
    TS_OK(kiln_chat_apply_delta("gemma", m, 1, false, &out));
    ck_assert_str_eq(out, "");
    free(out);
    TS_OK(kiln_chat_apply_delta("gemma", m, 2, true, &out));
    ck_assert_str_eq(out, "<start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\n");
    free(out);
    /* the deltas of a whole conversation, joined, are its rendering (mistral-v7: no "\n") */
    char joined[1024] = "";
    for (size_t n = 1; n <= 4; n++) {
        TS_OK(kiln_chat_apply_delta("mistral-v7", m, n, m[n - 1].role[0] == 'u', &out));
        strcat(joined, out);
        free(out);
    }
    expect_render("mistral-v7", m, 4, true, joined);
    EXPECT_ERR(kiln_chat_apply_delta("chatml", m, 0, true, &out), KILN_ERR_INVALID, "no message", "n = 0");
    ck_assert_ptr_null(out);
    EXPECT_ERR(kiln_chat_apply_delta("chatml", m, 2, true, NULL), KILN_ERR_INVALID, "NULL out", "out is NULL");
    EXPECT_ERR(kiln_chat_apply_delta("nope", m, 2, true, &out), KILN_ERR_NOT_FOUND, "bad name", "'nope'");
}
END_TEST

/* ---- detection ------------------------------------------------------------------------------- */

typedef struct {
    const char *tmpl, *name, *why;
} detect_case;

static const detect_case DETECT[] = {
    /* Meta-Llama-3-8B-Instruct */
    {"{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
     "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
     "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}",
     "llama3", "Llama 3"},
    /* Llama 3.1 / 3.2 */
    {"{{- bos_token }}\n{%- if custom_tools is defined %}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}"
     "\n{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n{{- \"<|eot_id|>\" }}",
     "llama3", "Llama 3.1"},
    /* Qwen2.5-Instruct */
    {"{%- for message in messages %}\n{%- if (message.role == \"user\") %}\n{{- '<|im_start|>' + message.role + "
     "'\\n' + message.content + '<|im_end|>' + '\\n' }}\n{%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt "
     "%}\n{{- '<|im_start|>assistant\\n' }}\n{%- endif %}",
     "chatml", "Qwen 2.5"},
    /* Qwen3 (thinking) */
    {"{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif "
     "%}{{- '<|im_start|>' + message.role + '\\n' + content }}",
     "chatml", "Qwen 3"},
    /* chatml markers win over any later family's */
    {"<|im_start|> <|start_header_id|> <|end_header_id|> [INST]", "chatml", "first rule first"},
    /* phi-4 */
    {"{% for message in messages %}{% if (message['role'] == 'system') %}{{'<|im_start|>system<|im_sep|>' + "
     "message['content'] + '<|im_end|>'}}{% endif %}{% endfor %}",
     "phi4", "Phi-4"},
    /* Phi-3-mini */
    {"{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|user|>' + '\n' + "
     "message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}{% endif %}{% endfor %}",
     "phi3", "Phi-3"},
    /* gemma-7b-it / gemma-2 / gemma-3 */
    {"{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% endif %}{{ '<start_of_turn>' + role + "
     "'\\n' + message['content'] | trim + '<end_of_turn>\\n' }}",
     "gemma", "Gemma"},
    /* Mistral-Large-Instruct-2411 */
    {"{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
     "message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' + "
     "message['content'] + '[/SYSTEM_PROMPT]' }}{% endif %}{% endfor %}",
     "mistral-v7", "Mistral v7"},
    /* Mistral-Large-Instruct-2407 */
    {"{{- \"[AVAILABLE_TOOLS] [\" }}{%- if loop.last and system_message is defined %}{{- \"[INST] \" + "
     "system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}{%- endif %}",
     "mistral-v3", "Mistral v3"},
    /* Mistral-Nemo-Instruct-2407 */
    {"{{- \"[AVAILABLE_TOOLS][\" }}{%- if loop.last and system_message is defined %}{{- \"[INST]\" + "
     "system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}{%- endif %}",
     "mistral-v3-tekken", "Mistral v3 tekken"},
    /* Mistral-7B-Instruct-v0.2, v1 template with a system prompt */
    {"{%- if loop.first and system_message is defined %}{{- ' [INST] ' + system_message + '\\n\\n' + "
     "message['content'] + ' [/INST]' }}{%- else %}{{- ' [INST] ' + message['content'] + ' [/INST]' }}{%- endif %}",
     "mistral-v1", "Mistral v1"},
    /* Mistral-7B-Instruct-v0.2, old */
    {"{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
     "message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + "
     "eos_token}}{% endif %}{% endfor %}",
     "llama2", "Llama 2 without system"},
    /* the gate of llama.cpp's [INST] branch also takes a text that starts with "mistral" */
    {"mistral-like template without the marker", "llama2", "mistral prefix"},
    {"{%- if messages[idx]['role'] == 'system' -%}{{- '[INST] <<SYS>>\\n' + messages[idx]['content'] + "
     "'\\n<</SYS>>\\n\\n' -}}{%- endif -%}",
     "llama2-sys", "Llama 2 with <<SYS>>"},
    /* TheBloke/FusionNet_34Bx2_MoE-AWQ */
    {"{%- if idx > 1 -%}{{- bos_token + '[INST] ' + messages[idx]['content'] + ' [/INST]' -}}{%- endif -%}"
     "{{- '[INST] <<SYS>>\\n' + messages[idx]['content'] + '\\n<</SYS>>\\n\\n' -}}",
     "llama2-sys-bos", "Llama 2, bos inside"},
    /* Llama-2-7b-chat: strip() wins over bos_token + '[INST] */
    {"{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% if "
     "message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% endif %}",
     "llama2-sys-strip", "Llama 2 chat"},
    /* deepseek-coder-33b-instruct */
    {"{%- if message['role'] == 'user' %}\n{{'### Instruction:\\n' + message['content'] + '\\n'}}\n{%- else %}\n"
     "{{'### Response:\\n' + message['content'] + '\\n<|EOT|>\\n'}}\n{%- endif %}",
     "deepseek", "DeepSeek Coder"},
    /* DeepSeek-V2 */
    {"{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ 'User: ' + "
     "message['content'] + '\n\n' }}{% elif message['role'] == 'assistant' %}{{ 'Assistant: ' + message['content'] "
     "+ eos_token }}{% endif %}{% endfor %}",
     "deepseek2", "DeepSeek V2"},
    /* DeepSeek-V3 / R1 */
    {"{%- if message['role'] == 'user' %}{{'" DS_USER "' + message['content']}}{%- endif %}{%- if "
     "message['role'] == 'assistant' %}{{'" DS_ASSISTANT "' + content + '" DS_EOS "'}}{%- endif %}",
     "deepseek3", "DeepSeek V3"},
    /* a name is taken as it is, also one only reachable by name */
    {"llama3", "llama3", "name"},
    {"mistral-v7-tekken", "mistral-v7-tekken", "name only"},
};
#define NDETECT (int)(sizeof DETECT / sizeof DETECT[0])

START_TEST(detects) {
    const detect_case *c = &DETECT[_i];
    const char        *name = NULL;
    kiln_status        st = kiln_chat_template_detect(c->tmpl, &name);
    ck_assert_msg(st == NULL, "%s: %s", c->why, kiln_status_msg(st));
    ck_assert_msg(name && strcmp(name, c->name) == 0, "%s: detected %s, want %s", c->why, name, c->name);
}
END_TEST

START_TEST(detect_refusals) {
    const char *name = "x";
    /* families llama.cpp knows and kiln does not render: named, never taken for a later one */
    EXPECT_ERR(kiln_chat_template_detect("{{ '<|user|>\n' + message['content'] + '<|endoftext|>' }}", &name),
               KILN_ERR_NOT_FOUND, "zephyr", "llama.cpp's 'zephyr'", "kiln does not render", "chatml, llama2");
    ck_assert_ptr_null(name);
    EXPECT_ERR(kiln_chat_template_detect("<|START_OF_TURN_TOKEN|><|USER_TOKEN|> <|start_header_id|><|end_header_id|>",
                                         &name),
               KILN_ERR_NOT_FOUND, "command-r", "'command-r'");
    EXPECT_ERR(kiln_chat_template_detect("zephyr", &name), KILN_ERR_NOT_FOUND, "zephyr as a name",
               "'zephyr' is llama.cpp's");
    /* nothing known */
    EXPECT_ERR(kiln_chat_template_detect("{{ messages | tojson }}", &name), KILN_ERR_NOT_FOUND, "unknown",
               "matches none", "chatml", "deepseek3", "llama3", "mistral-v7-tekken");
    EXPECT_ERR(kiln_chat_template_detect("", &name), KILN_ERR_NOT_FOUND, "empty", "(empty)");
    EXPECT_ERR(kiln_chat_template_detect(NULL, &name), KILN_ERR_INVALID, "NULL tmpl", "tmpl is NULL");
    EXPECT_ERR(kiln_chat_template_detect("chatml", NULL), KILN_ERR_INVALID, "NULL name", "name is NULL");
}
END_TEST

START_TEST(by_name) {
    for (int i = 0; i < kiln_chat_template_count(); i++) TS_OK(kiln_chat_template_by_name(kiln_chat_template_name(i)));
    EXPECT_ERR(kiln_chat_template_by_name("llama-3"), KILN_ERR_NOT_FOUND, "typo", "unknown chat template 'llama-3'",
               "deepseek3, llama3)");
    EXPECT_ERR(kiln_chat_template_by_name("vicuna"), KILN_ERR_NOT_FOUND, "llama.cpp's", "'vicuna' is llama.cpp's",
               "does not render");
    /* dots1 is detected by llama.cpp but not taken by name there */
    EXPECT_ERR(kiln_chat_template_by_name("dots1"), KILN_ERR_NOT_FOUND, "dots1", "unknown chat template 'dots1'");
    EXPECT_ERR(kiln_chat_template_by_name(""), KILN_ERR_NOT_FOUND, "empty", "unknown chat template ''");
    EXPECT_ERR(kiln_chat_template_by_name(NULL), KILN_ERR_INVALID, "NULL", "name is NULL");
}
END_TEST

/* ---- refusals of kiln_chat_apply ------------------------------------------------------------ */

START_TEST(apply_refusals) {
    char               *out = (char *)"untouched";
    const kiln_chat_msg tool[] = {{"system", "s"}, {"user", "u"}, {"tool", "{}"}};
    EXPECT_ERR(kiln_chat_apply("chatml", tool, 3, true, &out), KILN_ERR_INVALID, "role", "message 2",
               "unknown role 'tool'", "system, user or assistant");
    ck_assert_ptr_null(out);
    const kiln_chat_msg upper[] = {{"User", "u"}};
    EXPECT_ERR(kiln_chat_apply("llama3", upper, 1, true, &out), KILN_ERR_INVALID, "case", "message 0",
               "'User'");
    const kiln_chat_msg no_role[] = {{"user", "u"}, {NULL, "x"}};
    EXPECT_ERR(kiln_chat_apply("gemma", no_role, 2, true, &out), KILN_ERR_INVALID, "NULL role", "message 1",
               "role is NULL");
    const kiln_chat_msg no_content[] = {{"user", NULL}};
    EXPECT_ERR(kiln_chat_apply("gemma", no_content, 1, true, &out), KILN_ERR_INVALID, "NULL content",
               "message 0", "content is NULL");
    EXPECT_ERR(kiln_chat_apply("chatml", NULL, 2, true, &out), KILN_ERR_INVALID, "NULL msgs", "msgs is NULL");
    EXPECT_ERR(kiln_chat_apply(NULL, CONV, 1, true, &out), KILN_ERR_INVALID, "NULL name", "name is NULL");
    EXPECT_ERR(kiln_chat_apply("chatml", CONV, 1, true, NULL), KILN_ERR_INVALID, "NULL out", "out is NULL");
    EXPECT_ERR(kiln_chat_apply("chat-ml", CONV, 1, true, &out), KILN_ERR_NOT_FOUND, "unknown name", "'chat-ml'",
               "chatml");
    EXPECT_ERR(kiln_chat_apply("", CONV, 1, true, &out), KILN_ERR_NOT_FOUND, "empty name", "''");
    ck_assert_ptr_null(out);
}
END_TEST

/* ---- GGUF ------------------------------------------------------------------------------------ */

static kiln_gguf *gguf_with(const char *dir, const char *file, void (*set)(kiln_gguf_writer *w)) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    kiln_gguf_writer *w = kiln_gguf_writer_new();
    kiln_gguf_set_str(w, "general.architecture", "llama");
    if (set) set(w);
    TS_OK(kiln_gguf_write(w, path, NULL, NULL, NULL));
    kiln_gguf_writer_free(w);
    kiln_gguf *g = NULL;
    TS_OK(kiln_gguf_open(path, &g));
    return g;
}

static void set_qwen(kiln_gguf_writer *w) {
    kiln_gguf_set_str(w, "tokenizer.chat_template", DETECT[2].tmpl);
}
static void set_u32(kiln_gguf_writer *w) { kiln_gguf_set_u32(w, "tokenizer.chat_template", 7); }

START_TEST(from_gguf) {
    char      *dir = ts_tmpdir();
    char      *t = (char *)"untouched";
    kiln_gguf *g = gguf_with(dir, "qwen.gguf", set_qwen);
    TS_OK(kiln_chat_template_from_gguf(g, &t));
    ck_assert_str_eq(t, DETECT[2].tmpl);
    const char *name;
    TS_OK(kiln_chat_template_detect(t, &name));
    ck_assert_str_eq(name, "chatml");
    free(t);
    kiln_gguf_close(g);
    /* no template: NULL, no error (the caller picks a default) */
    g = gguf_with(dir, "none.gguf", NULL);
    t = (char *)"untouched";
    TS_OK(kiln_chat_template_from_gguf(g, &t));
    ck_assert_ptr_null(t);
    kiln_gguf_close(g);
    TS_OK(kiln_chat_template_from_gguf(NULL, &t));
    ck_assert_ptr_null(t);
    /* a value of another type names the key */
    g = gguf_with(dir, "u32.gguf", set_u32);
    EXPECT_ERR(kiln_chat_template_from_gguf(g, &t), KILN_ERR_FORMAT, "u32", "tokenizer.chat_template");
    ck_assert_ptr_null(t);
    EXPECT_ERR(kiln_chat_template_from_gguf(g, NULL), KILN_ERR_INVALID, "NULL out", "tmpl is NULL");
    kiln_gguf_close(g);
    ts_tmpdir_free(dir);
}
END_TEST

int main(void) {
    Suite *s = TS_SUITE("chat", TS_CASE("chat", 0), TS_LOOP(0, NRENDERED, renders_conversation),
                        TS_TESTS(every_template_pinned, render_edges, delta), TS_LOOP(0, NDETECT, detects),
                        TS_TESTS(detect_refusals, by_name, apply_refusals, from_gguf));
    return ts_main(s);
}
