/* Chat templates: a conversation (system, user and assistant messages) rendered as the text an
 * instruct model was trained on, as llama.cpp's llm_chat_apply_template renders it, and the
 * template of a GGUF (tokenizer.chat_template, Jinja text) told by the substrings
 * llm_chat_detect_template looks for (src/llama-chat.cpp, llama.cpp 2a20c85); docs/chat.md.
 *
 * There is no Jinja engine: like llama.cpp's built-in path, each template is a row of fixed
 * pieces (KM_TEMPLATES) that one renderer (render) walks, and detection is an ordered list of
 * substring rules (KM_RULES) that mirrors llama.cpp's if/else chain. Every template of llama.cpp
 * 2a20c85 has its row. */
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
 * sys says where system messages go (km_sys_where). The rarer pieces, named in the rows that
 * have them: between (monarch's "<s>" before every message but the first), last_user (rwkv-world
 * writes "Assistant:" after a user message that ends the conversation, whatever
 * add_generation_prompt says), no_system (a system turn of the template's own, written first
 * when the conversation does not start with a system message; with no_system_empty also when
 * there is no message at all). */
typedef enum {
    SYS_INLINE, /* where they stand, with the role's pieces */
    SYS_HOLD,   /* gemma, orion (no system role): kept, joined, and written after the header of
                 * the next user message followed by "\n\n"; dropped when no user turn follows */
    SYS_FIRST,  /* gigachat, hunyuan-dense: only as the first message; later ones are dropped */
    SYS_DROP,   /* yandex: never written */
} km_sys_where;

typedef struct {
    const char  *name;
    const char  *head, *turn;
    const char  *pre[NROLES], *post[NROLES];
    const char  *gen;
    unsigned     trim;
    km_sys_where sys;
    const char  *between, *last_user, *no_system;
    bool         no_system_empty;
} km_chat_tmpl;

/* DeepSeek's and Hunyuan's full-width bar U+FF5C and SentencePiece's space U+2581, in UTF-8. */
#define FWBAR "\xEF\xBD\x9C"
#define SPM_SP "\xE2\x96\x81"
#define DS_EOS "<" FWBAR "end" SPM_SP "of" SPM_SP "sentence" FWBAR ">"
#define DS_USER "<" FWBAR "User" FWBAR ">"
#define DS_ASSISTANT "<" FWBAR "Assistant" FWBAR ">"
#define HY_ASSISTANT "<" FWBAR "hy_Assistant" FWBAR ">"
#define HY_HOLDER(n) "<" FWBAR "hy_place" SPM_SP "holder" SPM_SP "no" SPM_SP n FWBAR ">"
/* the Cyrillic and CJK words of yandex, minicpm and pangu-embedded, in UTF-8 */
/* Пользователь */
#define RU_USER "\xD0\x9F\xD0\xBE\xD0\xBB\xD1\x8C\xD0\xB7\xD0\xBE\xD0\xB2\xD0\xB0\xD1\x82\xD0\xB5\xD0\xBB\xD1\x8C"
#define RU_ASSISTANT "\xD0\x90\xD1\x81\xD1\x81\xD0\xB8\xD1\x81\xD1\x82\xD0\xB5\xD0\xBD\xD1\x82" /* Ассистент */
#define ZH_USER "\xE7\x94\xA8\xE6\x88\xB7"                                               /* 用户 */
#define ZH_SYSTEM "\xE7\xB3\xBB\xE7\xBB\x9F"                                             /* 系统 */
#define ZH_ASSISTANT "\xE5\x8A\xA9\xE6\x89\x8B"                                          /* 助手 */
#define ZH_COLON "\xEF\xBC\x9A"                                                          /* ： */
#define PANGU(who) "[unused9]" who ZH_COLON

/* Three roles written the same way with the role's name in the middle: "<|" "system" "|>\n" */
#define BY_ROLE(a, b) {a "system" b, a "user" b, a "assistant" b}
#define SAME(s) {s, s, s}

/* Field order: name, head, turn, pre {system, user, assistant}, post {...}, gen, trim, then by
 * name sys and the rarer pieces. None writes the BOS text: llama.cpp leaves it to the tokenizer
 * (add_bos_token); a "<s>" written here is one llama.cpp writes too (monarch, gigachat).
 * Order: kiln's first templates, then the others in the order of llama.cpp's name table. */
static const km_chat_tmpl KM_TEMPLATES[] = {
    /* ChatML: Qwen 2/2.5/3, OpenHermes, SmolLM */
    {"chatml", NULL, NULL, BY_ROLE("<|im_start|>", "\n"), SAME("<|im_end|>\n"), "<|im_start|>assistant\n", 0,
     .sys = SYS_INLINE},
    /* Llama 2 and its variants: the system message inside the first [INST] (without <<SYS>>
     * for plain llama2), a <s> before each later [INST] (sys-bos), every message stripped
     * (sys-strip) */
    {"llama2", "[INST] ", "[INST] ", {"", "", ""}, {"\n", " [/INST]", "</s>"}, NULL, 0, .sys = SYS_INLINE},
    {"llama2-sys", "[INST] ", "[INST] ", {"<<SYS>>\n", "", ""}, {"\n<</SYS>>\n\n", " [/INST]", "</s>"},
     NULL, 0, .sys = SYS_INLINE},
    {"llama2-sys-bos", "[INST] ", "<s>[INST] ", {"<<SYS>>\n", "", ""},
     {"\n<</SYS>>\n\n", " [/INST]", "</s>"}, NULL, 0, .sys = SYS_INLINE},
    {"llama2-sys-strip", "[INST] ", "[INST] ", {"<<SYS>>\n", "", ""},
     {"\n<</SYS>>\n\n", " [/INST]", "</s>"}, NULL, TRIM_ALL, .sys = SYS_INLINE},
    /* Mistral's official templates (mistralai cookbook): v1 puts spaces outside [INST] and
     * before [/INST], v3 after [INST] and before the answer (trimmed), v3-tekken none */
    {"mistral-v1", NULL, " [INST] ", {"", "", " "}, {"\n\n", " [/INST]", "</s>"}, NULL, 0, .sys = SYS_INLINE},
    {"mistral-v3", NULL, "[INST] ", {"", "", " "}, {"\n\n", "[/INST]", "</s>"}, NULL, TRIM(AST), .sys = SYS_INLINE},
    {"mistral-v3-tekken", NULL, "[INST]", {"", "", ""}, {"\n\n", "[/INST]", "</s>"}, NULL, 0, .sys = SYS_INLINE},
    /* v7: a system role of its own; tekken without the spaces */
    {"mistral-v7", NULL, NULL, {"[SYSTEM_PROMPT] ", "[INST] ", " "}, {"[/SYSTEM_PROMPT]", "[/INST]", "</s>"},
     NULL, 0, .sys = SYS_INLINE},
    {"mistral-v7-tekken", NULL, NULL, {"[SYSTEM_PROMPT]", "[INST]", ""},
     {"[/SYSTEM_PROMPT]", "[/INST]", "</s>"}, NULL, 0, .sys = SYS_INLINE},
    {"phi3", NULL, NULL, BY_ROLE("<|", "|>\n"), SAME("<|end|>\n"), "<|assistant|>\n", 0, .sys = SYS_INLINE},
    {"phi4", NULL, NULL, BY_ROLE("<|im_start|>", "<|im_sep|>"), SAME("<|im_end|>"),
     "<|im_start|>assistant<|im_sep|>", 0, .sys = SYS_INLINE},
    /* Gemma: "model" for the assistant, the system text merged into the next user turn */
    {"gemma", NULL, NULL, {"", "<start_of_turn>user\n", "<start_of_turn>model\n"},
     {"", "<end_of_turn>\n", "<end_of_turn>\n"}, "<start_of_turn>model\n", TRIM_ALL, .sys = SYS_HOLD},
    /* deepseek-coder-33b-instruct */
    {"deepseek", NULL, NULL, {"", "### Instruction:\n", "### Response:\n"}, {"", "\n", "\n<|EOT|>\n"},
     "### Response:\n", 0, .sys = SYS_INLINE},
    /* DeepSeek-V2 and V3 (R1) */
    {"deepseek2", NULL, NULL, {"", "User: ", "Assistant: "}, {"\n\n", "\n\n", DS_EOS}, "Assistant:", 0,
     .sys = SYS_INLINE},
    {"deepseek3", NULL, NULL, {"", DS_USER, DS_ASSISTANT}, {"\n\n", "", DS_EOS}, DS_ASSISTANT, 0, .sys = SYS_INLINE},
    /* Llama 3, 3.1, 3.2, 3.3 */
    {"llama3", NULL, NULL, BY_ROLE("<|start_header_id|>", "<|end_header_id|>\n\n"), SAME("<|eot_id|>"),
     "<|start_header_id|>assistant<|end_header_id|>\n\n", TRIM_ALL, .sys = SYS_INLINE},
    /* Falcon 3: each message ends with a newline only */
    {"falcon3", NULL, NULL, BY_ROLE("<|", "|>\n"), SAME("\n"), "<|assistant|>\n", 0, .sys = SYS_INLINE},
    /* Zephyr */
    {"zephyr", NULL, NULL, BY_ROLE("<|", "|>\n"), SAME("<|endoftext|>\n"), "<|assistant|>\n", 0, .sys = SYS_INLINE},
    /* AlphaMonarch: "<s>" inside the history, before every message but the first */
    {"monarch", NULL, NULL, BY_ROLE("", "\n"), SAME("</s>\n"), "<s>assistant\n", 0, .sys = SYS_INLINE,
     .between = "<s>"},
    /* Orion-14B-Chat: no system role (held as gemma's, untrimmed); the user's turn already
     * asks for the answer, so there is no generation prompt */
    {"orion", NULL, NULL, {"", "Human: ", ""}, {"", "\n\nAssistant: </s>", "</s>"}, NULL, 0, .sys = SYS_HOLD},
    /* openchat-3.5: the roles capitalized, the system text bare */
    {"openchat", NULL, NULL, {"", "GPT4 Correct User: ", "GPT4 Correct Assistant: "}, SAME("<|end_of_turn|>"),
     "GPT4 Correct Assistant:", 0, .sys = SYS_INLINE},
    /* vicuna-13b-1.1 and its Orca variant (which prefixes the system text) */
    {"vicuna", NULL, NULL, {"", "USER: ", "ASSISTANT: "}, {"\n\n", "\n", "</s>\n"}, "ASSISTANT:", 0, .sys = SYS_INLINE},
    {"vicuna-orca", NULL, NULL, {"SYSTEM: ", "USER: ", "ASSISTANT: "}, {"\n", "\n", "</s>\n"}, "ASSISTANT:", 0,
     .sys = SYS_INLINE},
    /* Command-R (+): every message trimmed */
    {"command-r", NULL, NULL,
     {"<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>", "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>",
      "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"},
     SAME("<|END_OF_TURN_TOKEN|>"), "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", TRIM_ALL, .sys = SYS_INLINE},
    /* ChatGLM 3 (a space opens each text), GLM-4, GLM-Edge: nothing closes a message */
    {"chatglm3", "[gMASK]sop", NULL, BY_ROLE("<|", "|>\n "), SAME(""), "<|assistant|>", 0, .sys = SYS_INLINE},
    {"chatglm4", "[gMASK]<sop>", NULL, BY_ROLE("<|", "|>\n"), SAME(""), "<|assistant|>\n", 0, .sys = SYS_INLINE},
    {"glmedge", NULL, NULL, BY_ROLE("<|", "|>\n"), SAME(""), "<|assistant|>", 0, .sys = SYS_INLINE},
    /* MiniCPM: the user's turn asks for the answer (<AI>); every message trimmed */
    {"minicpm", NULL, NULL, {"", "<" ZH_USER ">", ""}, {"", "<AI>", ""}, NULL, TRIM_ALL, .sys = SYS_INLINE},
    /* EXAONE 3.0 and 4.0 (the same for these roles; 4.0 adds a tool role): the user's turn
     * ends with a newline only */
    {"exaone3", NULL, NULL, BY_ROLE("[|", "|]"), {"[|endofturn|]\n", "\n", "[|endofturn|]\n"}, "[|assistant|]",
     TRIM_ALL, .sys = SYS_INLINE},
    {"exaone4", NULL, NULL, BY_ROLE("[|", "|]"), {"[|endofturn|]\n", "\n", "[|endofturn|]\n"}, "[|assistant|]",
     TRIM_ALL, .sys = SYS_INLINE},
    /* RWKV World ("\n\n" is its end of turn) */
    {"rwkv-world", NULL, NULL, {"System: ", "User: ", "Assistant: "}, SAME("\n\n"), NULL, TRIM_ALL, .sys = SYS_INLINE,
     .last_user = "Assistant:"},
    /* IBM Granite 3.x */
    {"granite", NULL, NULL, BY_ROLE("<|start_of_role|>", "<|end_of_role|>"), SAME("<|end_of_text|>\n"),
     "<|start_of_role|>assistant<|end_of_role|>", 0, .sys = SYS_INLINE},
    /* GigaChat: a system message only first, right after "<s>"; a user's turn is followed by an
     * empty list of functions */
    {"gigachat", "<s>", NULL, {"", "user<|role_sep|>", "assistant<|role_sep|>"},
     {"<|message_sep|>", "<|message_sep|>available functions<|role_sep|>[]<|message_sep|>", "<|message_sep|>"},
     "assistant<|role_sep|>", 0, .sys = SYS_FIRST},
    /* Megrez */
    {"megrez", NULL, NULL, BY_ROLE("<|role_start|>", "<|role_end|>"), SAME("<|turn_end|>"),
     "<|role_start|>assistant<|role_end|>", 0, .sys = SYS_INLINE},
    /* YandexGPT ("\n\n" is its end of turn): no system role, its messages are dropped */
    {"yandex", NULL, NULL, {"", " " RU_USER ": ", " " RU_ASSISTANT ": "}, SAME("\n\n"), " " RU_ASSISTANT ":[SEP]",
     0, .sys = SYS_DROP},
    /* Bailing (Ling): the roles upper-cased, "user" as HUMAN, nothing closes a message;
     * bailing-think opens the answer's thinking; Ling 2.0 closes each message and starts with
     * a system turn of its own when the conversation has none */
    {"bailing", NULL, NULL, {"<role>SYSTEM</role>", "<role>HUMAN</role>", "<role>ASSISTANT</role>"}, SAME(""),
     "<role>ASSISTANT</role>", 0, .sys = SYS_INLINE},
    {"bailing-think", NULL, NULL, {"<role>SYSTEM</role>", "<role>HUMAN</role>", "<role>ASSISTANT</role>"},
     SAME(""), "<role>ASSISTANT</role><think>", 0, .sys = SYS_INLINE},
    {"bailing2", NULL, NULL, {"<role>SYSTEM</role>", "<role>HUMAN</role>", "<role>ASSISTANT</role>"},
     SAME("<|role_end|>"), "<role>ASSISTANT</role>", 0, .sys = SYS_INLINE,
     .no_system = "<role>SYSTEM</role>detailed thinking off<|role_end|>", .no_system_empty = true},
    /* Llama 4: Llama 3's layout with other tokens */
    {"llama4", NULL, NULL, BY_ROLE("<|header_start|>", "<|header_end|>\n\n"), SAME("<|eot|>"),
     "<|header_start|>assistant<|header_end|>\n\n", TRIM_ALL, .sys = SYS_INLINE},
    /* SmolVLM: "<|im_start|>" is its BOS and written here, as llama.cpp does; the rest is not
     * chatml */
    {"smolvlm", "<|im_start|>", NULL, {"", "User: ", "Assistant: "},
     {"\n\n", "<end_of_utterance>\n", "<end_of_utterance>\n"}, "Assistant:", 0, .sys = SYS_INLINE},
    /* dots.llm1.inst */
    {"dots1", NULL, NULL, {"<|system|>", "<|userprompt|>", "<|response|>"},
     {"<|endofsystem|>", "<|endofuserprompt|>", "<|endofresponse|>"}, "<|response|>", 0, .sys = SYS_INLINE},
    /* Hunyuan-A13B: the user's turn asks for the answer; no generation prompt */
    {"hunyuan-moe", NULL, NULL, {"<|startoftext|>", "<|startoftext|>", ""}, {"<|extra_4|>", "<|extra_0|>", "<|eos|>"},
     NULL, 0, .sys = SYS_INLINE},
    /* gpt-oss (OpenAI's harmony format): an answer ends with <|return|> */
    {"gpt-oss", NULL, NULL, BY_ROLE("<|start|>", "<|message|>"), {"<|end|>", "<|end|>", "<|return|>"},
     "<|start|>assistant", 0, .sys = SYS_INLINE},
    /* Hunyuan dense (4B): a system message only first; the user's turn asks for the answer */
    {"hunyuan-dense", NULL, NULL, {"", "<" FWBAR "hy_User" FWBAR ">", HY_ASSISTANT},
     {HY_HOLDER("3"), HY_ASSISTANT, HY_HOLDER("2")}, NULL, 0, .sys = SYS_FIRST},
    /* Kimi K2 */
    {"kimi-k2", NULL, NULL,
     {"<|im_system|>system<|im_middle|>", "<|im_user|>user<|im_middle|>", "<|im_assistant|>assistant<|im_middle|>"},
     SAME("<|im_end|>"), "<|im_assistant|>assistant<|im_middle|>", 0, .sys = SYS_INLINE},
    /* Seed-OSS: answers trimmed */
    {"seed_oss", NULL, NULL, BY_ROLE("<seed:bos>", "\n"), SAME("<seed:eos>"), "<seed:bos>assistant\n", TRIM(AST),
     .sys = SYS_INLINE},
    /* Grok 2: system and user texts trimmed, answers not */
    {"grok-2", NULL, NULL, {"System: ", "Human: ", "Assistant: "}, SAME("<|separator|>\n\n"), "Assistant:",
     TRIM(SYS) | TRIM(USR), .sys = SYS_INLINE},
    /* openPangu-Embedded: an empty system turn first when the conversation has none */
    {"pangu-embedded", NULL, NULL, {PANGU(ZH_SYSTEM), PANGU(ZH_USER), PANGU(ZH_ASSISTANT)}, SAME("[unused10]"),
     PANGU(ZH_ASSISTANT), 0, .sys = SYS_INLINE, .no_system = PANGU(ZH_SYSTEM) "[unused10]"},
};
#define KM_NTEMPLATES (sizeof KM_TEMPLATES / sizeof KM_TEMPLATES[0])

/* ---- detection ------------------------------------------------------------------------------- */

/* One rule of llm_chat_detect_template, in its order: the template matches when it holds every
 * string of all, at least one of any (when any[0] is set) and, with inst, passes the gate of
 * llama.cpp's [INST] branch (it starts with "mistral" or holds "[INST]"). That branch ends with
 * llama2, which takes whatever passed the gate, as llama.cpp does. Each rule names a row of
 * KM_TEMPLATES. */
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
    {"minicpm", false, {"<" ZH_USER ">"}, {NULL}},
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
    {"yandex", false, {" " RU_ASSISTANT ":"}, {NULL}},
    {"bailing", false, {"<role>ASSISTANT</role>", "'HUMAN'"}, {NULL}},
    {"bailing-think", false, {"<role>ASSISTANT</role>", "\"HUMAN\"", "<think>"}, {NULL}},
    {"bailing2", false, {"<role>ASSISTANT</role>", "<role>HUMAN</role>", "<|role_end|>"}, {NULL}},
    {"llama4", false, {"<|header_start|>", "<|header_end|>"}, {NULL}},
    {"dots1", false, {"<|endofuserprompt|>"}, {NULL}},
    {"hunyuan-moe", false, {"<|extra_0|>", "<|extra_4|>"}, {NULL}},
    {"gpt-oss", false, {"<|start|>", "<|channel|>"}, {NULL}},
    {"hunyuan-dense", false, {HY_ASSISTANT, HY_HOLDER("3")}, {NULL}},
    {"kimi-k2", false, {"<|im_assistant|>assistant<|im_middle|>"}, {NULL}},
    {"seed_oss", false, {"<seed:bos>"}, {NULL}},
    {"grok-2", false, {"'Assistant: '  + message['content'] + '<|separator|>"}, {NULL}},
    {"pangu-embedded", false, {PANGU(ZH_SYSTEM) "[unused10]"}, {NULL}},
};
#define KM_NRULES (sizeof KM_RULES / sizeof KM_RULES[0])

static const km_chat_tmpl *find_template(const char *name) {
    for (size_t i = 0; i < KM_NTEMPLATES; i++)
        if (strcmp(KM_TEMPLATES[i].name, name) == 0) return &KM_TEMPLATES[i];
    return NULL;
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

/* The error for a name (what: NULL) or a template text (what: the text) that is none of kiln's
 * templates, with kiln's names so that the user can pick one. */
static kiln_status unknown(const char *name, const char *text) {
    char *list = names_list();
    if (!list) return kb_oom();
    kiln_status st;
    if (name)
        st = kb_error(KILN_ERR_NOT_FOUND, "unknown chat template '%s' (kiln's templates: %s)", name, list);
    else
        st = kb_error(KILN_ERR_NOT_FOUND, "the chat template%s matches none that kiln knows (kiln's templates: %s)",
                      *text ? "" : " (empty)", list);
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
    return find_template(name) ? NULL : unknown(name, NULL);
}

kiln_status kiln_chat_template_detect(const char *tmpl, const char **name) {
    if (!tmpl || !name)
        return kb_error(KILN_ERR_INVALID, "kiln_chat_template_detect: %s is NULL", tmpl ? "name" : "tmpl");
    *name = NULL;
    /* a template's text may be a name, as in llm_chat_detect_template */
    const km_chat_tmpl *t = find_template(tmpl);
    if (t) return *name = t->name, NULL;
    /* every rule names a template (test_chat renders each detected name) */
    for (size_t i = 0; i < KM_NRULES; i++)
        if (rule_matches(&KM_RULES[i], tmpl)) return *name = KM_RULES[i].name, NULL;
    return unknown(NULL, tmpl);
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

/* One message of t, message i of the conversation, into b; *inside: a turn is open; held: the
 * system text kept for the next user turn (SYS_HOLD). */
static void render_msg(const km_chat_tmpl *t, size_t i, int role, const char *content, bool *inside, kb_str *b,
                       kb_str *held) {
    bool trim = t->trim & TRIM(role);
    if (role == SYS && (t->sys == SYS_DROP || (t->sys == SYS_FIRST && i > 0))) return;
    if (role == SYS && t->sys == SYS_HOLD) {
        add_content(held, content, trim);
        return;
    }
    if (t->between && i > 0) kb_str_add(b, t->between);
    if (t->turn && !*inside) kb_str_add(b, t->turn), *inside = true;
    kb_str_add(b, t->pre[role]);
    if (t->sys == SYS_HOLD && role == USR && held->len) {
        kb_str_addn(b, held->s, held->len);
        kb_str_add(b, "\n\n");
        held->len = 0;
    }
    add_content(b, content, trim);
    kb_str_add(b, t->post[role]);
    if (role == AST) *inside = false;
}

/* The template's own system turn goes first when the conversation does not open with one
 * (bailing2 also before no message at all, pangu-embedded not). msgs[0]'s role is checked
 * here only for being "system": a bad role is refused by the loop after. */
static bool needs_own_system(const km_chat_tmpl *t, const kiln_chat_msg *msgs, size_t n) {
    if (!t->no_system) return false;
    if (n == 0) return t->no_system_empty;
    return !msgs[0].role || strcmp(msgs[0].role, role_names[SYS]) != 0;
}

static kiln_status render(const km_chat_tmpl *t, const kiln_chat_msg *msgs, size_t n, bool gen, char **out) {
    kb_str b = {0}, held = {0};
    kb_str_add(&b, t->head ? t->head : "");
    kb_str_add(&held, "");
    if (needs_own_system(t, msgs, n)) kb_str_add(&b, t->no_system);
    bool inside = t->head != NULL;
    int  role = -1;
    for (size_t i = 0; i < n; i++) {
        kiln_status st = check_msg(&msgs[i], i, &role);
        if (st) {
            kb_str_free(&b);
            kb_str_free(&held);
            return st;
        }
        render_msg(t, i, role, msgs[i].content, &inside, &b, &held);
    }
    if (t->last_user && role == USR) kb_str_add(&b, t->last_user);
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
