/* Chat templates (model/chat.c), no GPU:
 *  - every template renders llama.cpp's test conversation (tests/test-chat-template.cpp:
 *    system, user, assistant, user, an assistant answer with spaces around it, user) to the
 *    text llm_chat_apply_template (src/llama-chat.cpp) gives, with and without the generation
 *    prompt; the strings are typed here by hand, from llama.cpp's test where it has the case,
 *    else worked out from the branch of llm_chat_apply_template named in the row;
 *  - gemma's and orion's held system text, llama2's opening [INST] of an empty conversation,
 *    the system messages that gigachat, hunyuan-dense and yandex drop, monarch's inner <s>,
 *    rwkv-world's "Assistant:", the system turns bailing2 and pangu-embedded add;
 *  - the delta of a conversation that goes on (common_chat_format_single), for every template;
 *  - detection from excerpts of real Jinja templates holding the markers
 *    llm_chat_detect_template looks for, one or more per rule, in its order; names as
 *    templates; unknown templates refused with kiln's names;
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
    /* the FALCON_3 branch: "<|role|>\n" + text + "\n" */
    {"falcon3",
     "<|system|>\nYou are a helpful assistant\n<|user|>\nHello\n<|assistant|>\nHi there\n<|user|>\nWho are you\n"
     "<|assistant|>\n   I am an assistant   \n<|user|>\nAnother question\n",
     "<|assistant|>\n"},
    /* the ZEPHYR branch: "<|role|>\n" + text + "<|endoftext|>\n" */
    {"zephyr",
     "<|system|>\nYou are a helpful assistant<|endoftext|>\n<|user|>\nHello<|endoftext|>\n<|assistant|>\nHi "
     "there<|endoftext|>\n<|user|>\nWho are you<|endoftext|>\n<|assistant|>\n   I am an assistant   "
     "<|endoftext|>\n<|user|>\nAnother question<|endoftext|>\n",
     "<|assistant|>\n"},
    /* "mlabonne/AlphaMonarch-7B": no <s> before the first message */
    {"monarch",
     "system\nYou are a helpful assistant</s>\n<s>user\nHello</s>\n<s>assistant\nHi there</s>\n<s>user\nWho are "
     "you</s>\n<s>assistant\n   I am an assistant   </s>\n<s>user\nAnother question</s>\n",
     "<s>assistant\n"},
    /* "OrionStarAI/Orion-14B-Chat": the system text opens the first user turn; no generation
     * prompt */
    {"orion",
     "Human: You are a helpful assistant\n\nHello\n\nAssistant: </s>Hi there</s>Human: Who are you\n\nAssistant: "
     "</s>   I am an assistant   </s>Human: Another question\n\nAssistant: </s>",
     ""},
    /* "openchat/openchat-3.5-0106" */
    {"openchat",
     "You are a helpful assistant<|end_of_turn|>GPT4 Correct User: Hello<|end_of_turn|>GPT4 Correct Assistant: Hi "
     "there<|end_of_turn|>GPT4 Correct User: Who are you<|end_of_turn|>GPT4 Correct Assistant:    I am an "
     "assistant   <|end_of_turn|>GPT4 Correct User: Another question<|end_of_turn|>",
     "GPT4 Correct Assistant:"},
    /* "eachadea/vicuna-13b-1.1" */
    {"vicuna",
     "You are a helpful assistant\n\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\nASSISTANT:    I am "
     "an assistant   </s>\nUSER: Another question\n",
     "ASSISTANT:"},
    /* "Orca-Vicuna" */
    {"vicuna-orca",
     "SYSTEM: You are a helpful assistant\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\nASSISTANT:    "
     "I am an assistant   </s>\nUSER: Another question\n",
     "ASSISTANT:"},
    /* "CohereForAI/c4ai-command-r-plus": every message trimmed */
    {"command-r",
     "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a helpful assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
     "<|USER_TOKEN|>Hello<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
     "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Who are you<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>I "
     "am an assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Another question<|END_OF_TURN_TOKEN|>",
     "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"},
    /* "ChatGLM3" */
    {"chatglm3",
     "[gMASK]sop<|system|>\n You are a helpful assistant<|user|>\n Hello<|assistant|>\n Hi there<|user|>\n Who are "
     "you<|assistant|>\n    I am an assistant   <|user|>\n Another question",
     "<|assistant|>"},
    /* "ChatGLM4" */
    {"chatglm4",
     "[gMASK]<sop><|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\nHi there<|user|>\nWho are "
     "you<|assistant|>\n   I am an assistant   <|user|>\nAnother question",
     "<|assistant|>\n"},
    /* "GLMEdge" */
    {"glmedge",
     "<|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\nHi there<|user|>\nWho are "
     "you<|assistant|>\n   I am an assistant   <|user|>\nAnother question",
     "<|assistant|>"},
    /* "MiniCPM-3B-OpenHermes-2.5-v2-GGUF": no generation prompt (<AI> ends each user turn) */
    {"minicpm", "You are a helpful assistant<用户>Hello<AI>Hi there<用户>Who are you<AI>I am an assistant<用户>Another "
                "question<AI>",
     ""},
    /* the EXAONE_3 branch: every message trimmed; the user's turn ends with "\n" only */
    {"exaone3",
     "[|system|]You are a helpful assistant[|endofturn|]\n[|user|]Hello\n[|assistant|]Hi there[|endofturn|]\n"
     "[|user|]Who are you\n[|assistant|]I am an assistant[|endofturn|]\n[|user|]Another question\n",
     "[|assistant|]"},
    /* the EXAONE_4 branch: EXAONE_3's for these roles */
    {"exaone4",
     "[|system|]You are a helpful assistant[|endofturn|]\n[|user|]Hello\n[|assistant|]Hi there[|endofturn|]\n"
     "[|user|]Who are you\n[|assistant|]I am an assistant[|endofturn|]\n[|user|]Another question\n",
     "[|assistant|]"},
    /* the RWKV_WORLD branch: trimmed; "Assistant:" after the last message, a user's, with or
     * without the generation prompt */
    {"rwkv-world",
     "System: You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi there\n\nUser: Who are you\n\nAssistant: "
     "I am an assistant\n\nUser: Another question\n\nAssistant:",
     ""},
    /* "ibm-granite/granite-3.0-8b-instruct" */
    {"granite",
     "<|start_of_role|>system<|end_of_role|>You are a helpful assistant<|end_of_text|>\n<|start_of_role|>user"
     "<|end_of_role|>Hello<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>Hi there<|end_of_text|>\n"
     "<|start_of_role|>user<|end_of_role|>Who are you<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>   I "
     "am an assistant   <|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Another question<|end_of_text|>\n",
     "<|start_of_role|>assistant<|end_of_role|>"},
    /* "ai-sage/GigaChat-20B-A3B-instruct" */
    {"gigachat",
     "<s>You are a helpful assistant<|message_sep|>user<|role_sep|>Hello<|message_sep|>available "
     "functions<|role_sep|>[]<|message_sep|>assistant<|role_sep|>Hi there<|message_sep|>user<|role_sep|>Who are "
     "you<|message_sep|>available functions<|role_sep|>[]<|message_sep|>assistant<|role_sep|>   I am an assistant   "
     "<|message_sep|>user<|role_sep|>Another question<|message_sep|>available functions<|role_sep|>[]<|message_sep|>",
     "assistant<|role_sep|>"},
    /* "Infinigence/Megrez-3B-Instruct" */
    {"megrez",
     "<|role_start|>system<|role_end|>You are a helpful assistant<|turn_end|><|role_start|>user<|role_end|>Hello"
     "<|turn_end|><|role_start|>assistant<|role_end|>Hi there<|turn_end|><|role_start|>user<|role_end|>Who are "
     "you<|turn_end|><|role_start|>assistant<|role_end|>   I am an assistant   <|turn_end|><|role_start|>user"
     "<|role_end|>Another question<|turn_end|>",
     "<|role_start|>assistant<|role_end|>"},
    /* "yandex/YandexGPT-5-Lite-8B-instruct": the system message dropped */
    {"yandex",
     " Пользователь: Hello\n\n Ассистент: Hi there\n\n Пользователь: Who are you\n\n Ассистент:    I am an "
     "assistant   \n\n Пользователь: Another question\n\n",
     " Ассистент:[SEP]"},
    /* "inclusionAI/Ling-lite" */
    {"bailing",
     "<role>SYSTEM</role>You are a helpful assistant<role>HUMAN</role>Hello<role>ASSISTANT</role>Hi "
     "there<role>HUMAN</role>Who are you<role>ASSISTANT</role>   I am an assistant   <role>HUMAN</role>Another "
     "question",
     "<role>ASSISTANT</role>"},
    /* the BAILING_THINK branch: bailing's, the prompt opening <think> */
    {"bailing-think",
     "<role>SYSTEM</role>You are a helpful assistant<role>HUMAN</role>Hello<role>ASSISTANT</role>Hi "
     "there<role>HUMAN</role>Who are you<role>ASSISTANT</role>   I am an assistant   <role>HUMAN</role>Another "
     "question",
     "<role>ASSISTANT</role><think>"},
    /* the BAILING2 branch: <|role_end|> after each message; the conversation starts with a
     * system message, so no "detailed thinking off" turn */
    {"bailing2",
     "<role>SYSTEM</role>You are a helpful assistant<|role_end|><role>HUMAN</role>Hello<|role_end|><role>ASSISTANT"
     "</role>Hi there<|role_end|><role>HUMAN</role>Who are you<|role_end|><role>ASSISTANT</role>   I am an "
     "assistant   <|role_end|><role>HUMAN</role>Another question<|role_end|>",
     "<role>ASSISTANT</role>"},
    /* the LLAMA4 branch: Llama 3's with <|header_start|>, <|header_end|>, <|eot|>; trimmed */
    {"llama4",
     "<|header_start|>system<|header_end|>\n\nYou are a helpful assistant<|eot|><|header_start|>user<|header_end|>"
     "\n\nHello<|eot|><|header_start|>assistant<|header_end|>\n\nHi there<|eot|><|header_start|>user<|header_end|>"
     "\n\nWho are you<|eot|><|header_start|>assistant<|header_end|>\n\nI am an assistant<|eot|><|header_start|>user"
     "<|header_end|>\n\nAnother question<|eot|>",
     "<|header_start|>assistant<|header_end|>\n\n"},
    /* the SMOLVLM branch: <|im_start|> once, then "User: " / "Assistant: " turns */
    {"smolvlm",
     "<|im_start|>You are a helpful assistant\n\nUser: Hello<end_of_utterance>\nAssistant: Hi "
     "there<end_of_utterance>\nUser: Who are you<end_of_utterance>\nAssistant:    I am an assistant   "
     "<end_of_utterance>\nUser: Another question<end_of_utterance>\n",
     "Assistant:"},
    /* the DOTS1 branch */
    {"dots1",
     "<|system|>You are a helpful assistant<|endofsystem|><|userprompt|>Hello<|endofuserprompt|><|response|>Hi "
     "there<|endofresponse|><|userprompt|>Who are you<|endofuserprompt|><|response|>   I am an assistant   "
     "<|endofresponse|><|userprompt|>Another question<|endofuserprompt|>",
     "<|response|>"},
    /* the HUNYUAN_MOE branch: no generation prompt */
    {"hunyuan-moe",
     "<|startoftext|>You are a helpful assistant<|extra_4|><|startoftext|>Hello<|extra_0|>Hi there<|eos|>"
     "<|startoftext|>Who are you<|extra_0|>   I am an assistant   <|eos|><|startoftext|>Another question<|extra_0|>",
     ""},
    /* the OPENAI_MOE branch (gpt-oss): answers end with <|return|> */
    {"gpt-oss",
     "<|start|>system<|message|>You are a helpful assistant<|end|><|start|>user<|message|>Hello<|end|><|start|>"
     "assistant<|message|>Hi there<|return|><|start|>user<|message|>Who are you<|end|><|start|>assistant<|message|>"
     "   I am an assistant   <|return|><|start|>user<|message|>Another question<|end|>",
     "<|start|>assistant"},
    /* the HUNYUAN_DENSE branch: the user's turn ends with <｜hy_Assistant｜> and the answer
     * starts with it again; no generation prompt */
    {"hunyuan-dense",
     "You are a helpful assistant<｜hy_place▁holder▁no▁3｜><｜hy_User｜>Hello<｜hy_Assistant｜><｜hy_Assistant｜>Hi "
     "there<｜hy_place▁holder▁no▁2｜><｜hy_User｜>Who are you<｜hy_Assistant｜><｜hy_Assistant｜>   I am an assistant   "
     "<｜hy_place▁holder▁no▁2｜><｜hy_User｜>Another question<｜hy_Assistant｜>",
     ""},
    /* the KIMI_K2 branch */
    {"kimi-k2",
     "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|><|im_user|>user<|im_middle|>Hello"
     "<|im_end|><|im_assistant|>assistant<|im_middle|>Hi there<|im_end|><|im_user|>user<|im_middle|>Who are you"
     "<|im_end|><|im_assistant|>assistant<|im_middle|>   I am an assistant   <|im_end|><|im_user|>user<|im_middle|>"
     "Another question<|im_end|>",
     "<|im_assistant|>assistant<|im_middle|>"},
    /* "ByteDance-Seed/Seed-OSS-36B-Instruct": answers trimmed */
    {"seed_oss",
     "<seed:bos>system\nYou are a helpful assistant<seed:eos><seed:bos>user\nHello<seed:eos><seed:bos>assistant\nHi "
     "there<seed:eos><seed:bos>user\nWho are you<seed:eos><seed:bos>assistant\nI am an assistant<seed:eos>"
     "<seed:bos>user\nAnother question<seed:eos>",
     "<seed:bos>assistant\n"},
    /* the GROK_2 branch: system and user texts trimmed, answers not */
    {"grok-2",
     "System: You are a helpful assistant<|separator|>\n\nHuman: Hello<|separator|>\n\nAssistant: Hi "
     "there<|separator|>\n\nHuman: Who are you<|separator|>\n\nAssistant:    I am an assistant   "
     "<|separator|>\n\nHuman: Another question<|separator|>\n\n",
     "Assistant:"},
    /* the PANGU_EMBED branch: the conversation opens with a system message, so no empty one */
    {"pangu-embedded",
     "[unused9]系统：You are a helpful assistant[unused10][unused9]用户：Hello[unused10][unused9]助手：Hi "
     "there[unused10][unused9]用户：Who are you[unused10][unused9]助手：   I am an assistant   [unused10]"
     "[unused9]用户：Another question[unused10]",
     "[unused9]助手："},
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

/* The edges of the branches with pieces of their own (the rarer fields of KM_TEMPLATES). */
START_TEST(render_edges_more) {
    const kiln_chat_msg us[] = {{"user", " U "}, {"system", "S"}, {"assistant", " A "}, {"system", "T"}};
    /* monarch: no <s> before the first message, even a user's; none at all before the prompt */
    expect_render("monarch", us, 1, true, "user\n U </s>\n<s>assistant\n");
    expect_render("monarch", NULL, 0, true, "<s>assistant\n");
    /* gigachat and hunyuan-dense write a system message only first; yandex never */
    expect_render("gigachat", us, 3, true,
                  "<s>user<|role_sep|> U <|message_sep|>available functions<|role_sep|>[]<|message_sep|>"
                  "assistant<|role_sep|> A <|message_sep|>assistant<|role_sep|>");
    expect_render("gigachat", NULL, 0, false, "<s>");
    expect_render("hunyuan-dense", us + 1, 3, false,
                  "S<｜hy_place▁holder▁no▁3｜><｜hy_Assistant｜> A <｜hy_place▁holder▁no▁2｜>");
    expect_render("yandex", us, 4, true, " Пользователь:  U \n\n Ассистент:  A \n\n Ассистент:[SEP]");
    /* orion holds the system texts (untrimmed, joined) for the next user turn */
    const kiln_chat_msg held[] = {{"system", " S1 "}, {"system", "S2"}, {"user", "U"}};
    expect_render("orion", held, 3, true, "Human:  S1 S2\n\nU\n\nAssistant: </s>");
    /* rwkv-world: "Assistant:" only after a user message that ends the conversation */
    expect_render("rwkv-world", us, 1, false, "User: U\n\nAssistant:");
    expect_render("rwkv-world", us, 3, true, "User: U\n\nSystem: S\n\nAssistant: A\n\n");
    /* bailing2 opens with its own system turn when the conversation does not (also when it is
     * empty); pangu-embedded only before a first message that is not the system's */
    expect_render("bailing2", us, 1, true,
                  "<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role> U <|role_end|>"
                  "<role>ASSISTANT</role>");
    expect_render("bailing2", NULL, 0, false, "<role>SYSTEM</role>detailed thinking off<|role_end|>");
    expect_render("bailing2", us + 1, 1, false, "<role>SYSTEM</role>S<|role_end|>");
    expect_render("pangu-embedded", us, 1, false, "[unused9]系统：[unused10][unused9]用户： U [unused10]");
    expect_render("pangu-embedded", NULL, 0, true, "[unused9]助手：");
    /* the GLM heads come before no message too */
    expect_render("chatglm3", NULL, 0, true, "[gMASK]sop<|assistant|>");
    /* a bad role after the first message is still refused where an own system turn is chosen */
    const kiln_chat_msg bad[] = {{"tool", "x"}};
    char               *out = NULL;
    EXPECT_ERR(kiln_chat_apply("bailing2", bad, 1, true, &out), KILN_ERR_INVALID, "bailing2 role", "message 0",
               "'tool'");
    ck_assert_ptr_null(out);
}
END_TEST

/* Every template's deltas of the test conversation (no generation prompt) joined are its
 * rendering, and the last user message's delta with the prompt is what the rendering adds
 * after the first five messages, led by "\n" when those end with one (common_chat_format_single). */
START_TEST(delta_every_template) {
    const rendered *r = &RENDERED[_i];
    char            joined[4096] = "", *out, *past;
    for (size_t n = 1; n <= NCONV; n++) {
        TS_OK(kiln_chat_apply_delta(r->name, CONV, n, false, &out));
        ck_assert_msg(strlen(joined) + strlen(out) < sizeof joined, "%s: too long", r->name);
        strcat(joined, out);
        free(out);
    }
    ck_assert_msg(strcmp(joined, r->text) == 0, "%s: joined deltas\n got  [%s]\n want [%s]", r->name, joined,
                  r->text);
    TS_OK(kiln_chat_apply(r->name, CONV, NCONV - 1, false, &past));
    size_t np = strlen(past);
    ck_assert_msg(strncmp(r->text, past, np) == 0, "%s: the rendering does not go on from the past", r->name);
    char want[4096];
    snprintf(want, sizeof want, "%s%s%s", np && past[np - 1] == '\n' ? "\n" : "", r->text + np, r->gen);
    free(past);
    TS_OK(kiln_chat_apply_delta(r->name, CONV, NCONV, true, &out));
    ck_assert_msg(strcmp(out, want) == 0, "%s: delta\n got  [%s]\n want [%s]", r->name, out, want);
    free(out);
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
    /* SmolVLM: <|im_start|> is its BOS, <end_of_utterance> tells it from chatml */
    {"<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}{{': '}}{{ message['content'] }}"
     "<end_of_utterance>\n{% endfor %}",
     "smolvlm", "SmolVLM"},
    /* "ChatGLM4" (its <|assistant|> does not make it falcon3 or glmedge: [gMASK]<sop> comes first) */
    {"[gMASK]<sop>{% for item in messages %}{% if item['content'] %}<|{{ item['role'] }}|>{{ item['metadata'] }}\n"
     "{{ item['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
     "chatglm4", "GLM-4"},
    /* Falcon 3: <|user|>, <|assistant|> and </s> */
    {"{% if message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + '\\n' }}{% else %}{{ "
     "'<|assistant|>\\n' + message['content'] + '</s>' }}{% endif %}",
     "falcon3", "Falcon 3"},
    /* "GLMEdge": the same markers without </s> */
    {"{% for item in messages %}{% if item['role'] == 'user' %}<|user|>\n{{ item['content'] }}{% elif item['role'] "
     "== 'assistant' %}<|assistant|>\n{{ item['content'] }}{% endif %}{% endfor %}<|assistant|>",
     "glmedge", "GLM-Edge"},
    /* GLM-Edge-V: the role in the token, an image marker */
    {"<|{{ item['role'] }}|>\n{% if item['image'] %}<|begin_of_image|>{% endif %}{{ item['content'] }}", "glmedge",
     "GLM-Edge-V"},
    /* zephyr-7b-beta */
    {"{% if message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + '<|endoftext|>' }}{% endif %}",
     "zephyr", "Zephyr"},
    /* "mlabonne/AlphaMonarch-7B" */
    {"{% for message in messages %}{{bos_token + message['role'] + '\\n' + message['content'] + eos_token + "
     "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ bos_token + 'assistant\\n' }}{% endif %}",
     "monarch", "Monarch"},
    /* "OrionStarAI/Orion-14B-Chat" */
    {"{% if message['role'] == 'user' %}{{ 'Human: ' + message['content'] + '\\n\\nAssistant: ' + eos_token }}{% "
     "elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}",
     "orion", "Orion"},
    /* "openchat/openchat-3.5-0106" */
    {"{{ bos_token }}{% for message in messages %}{{ 'GPT4 Correct ' + message['role'].title() + ': ' + "
     "message['content'] + '<|end_of_turn|>'}}{% endfor %}",
     "openchat", "OpenChat"},
    /* "eachadea/vicuna-13b-1.1" and "Orca-Vicuna" */
    {"{%- if message['role'] == 'user' -%}{{-'USER: ' + message['content'] + '\\n'-}}{%- else -%}{{-'ASSISTANT: ' + "
     "message['content'] + '</s>\\n' -}}{%- endif -%}",
     "vicuna", "Vicuna"},
    {"{%- if message['role'] == 'system' -%}{{-'SYSTEM: ' + message['content'] + '\\n' -}}{%- elif message['role'] "
     "== 'user' -%}{{-'USER: ' + message['content'] + '\\n'-}}{%- else -%}{{-'ASSISTANT: ' + message['content'] "
     "-}}{%- endif -%}",
     "vicuna-orca", "Orca-Vicuna"},
    /* Command-R's markers win over Llama 3's, which come later in the chain */
    {"<|START_OF_TURN_TOKEN|><|USER_TOKEN|> <|start_header_id|><|end_header_id|>", "command-r", "Command-R"},
    /* "ChatGLM3" */
    {"{% for message in messages %}{% if loop.first %}[gMASK]sop<|{{ message['role'] }}|>\n {{ message['content'] "
     "}}{% else %}<|{{ message['role'] }}|>\n {{ message['content'] }}{% endif %}{% endfor %}{% if "
     "add_generation_prompt %}<|assistant|>{% endif %}",
     "chatglm3", "ChatGLM3"},
    /* "MiniCPM-3B-OpenHermes-2.5-v2-GGUF" */
    {"{% for message in messages %}{% if message['role'] == 'user' %}{{'<用户>' + message['content'].strip() + "
     "'<AI>'}}{% else %}{{message['content'].strip()}}{% endif %}{% endfor %}",
     "minicpm", "MiniCPM"},
    /* EXAONE 3.0; 4.0 has a tool role */
    {"{{ '[|system|]' + message['content'] + '[|endofturn|]\\n' }}{{ '[|assistant|]' + message['content'] + "
     "'[|endofturn|]\\n' }}",
     "exaone3", "EXAONE 3"},
    {"{{ '[|system|]' + message['content'] + '[|endofturn|]\\n' }}{{ '[|tool|]' + message['content'] }}{{ "
     "'[|assistant|]' + message['content'] + '[|endofturn|]\\n' }}",
     "exaone4", "EXAONE 4"},
    /* RWKV World */
    {"{%- for message in messages %}{{- 'User: ' + message['content']|trim + '\\n\\n' -}}{%- endfor %}", "rwkv-world",
     "RWKV World"},
    /* "ibm-granite/granite-3.0-8b-instruct" */
    {"{{- '<|start_of_role|>system<|end_of_role|>' + message['content'] + '<|end_of_text|>\\n' }}", "granite",
     "Granite"},
    /* "ai-sage/GigaChat-20B-A3B-instruct" */
    {"{{ message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1] -}}",
     "gigachat", "GigaChat"},
    /* "Infinigence/Megrez-3B-Instruct" */
    {"{{ '<|role_start|>' + message['role'] + '<|role_end|>' + message['content'] + '<|turn_end|>' }}", "megrez",
     "Megrez"},
    /* "yandex/YandexGPT-5-Lite-8B-instruct" */
    {"<s>{%- set names = {'assistant': ' Ассистент:', 'user': ' Пользователь:'} %}", "yandex", "YandexGPT"},
    /* "inclusionAI/Ling-lite"; Ring (thinking) and Ling 2.0 */
    {"{% if role == 'user' %}{% set role = 'HUMAN' %}{% endif %}{{ '<role>' + role + '</role>' + message['content'] "
     "}}{% if add_generation_prompt %}{{ '<role>ASSISTANT</role>' }}{% endif %}",
     "bailing", "Ling"},
    {"{% if role == \"user\" %}{% set role = \"HUMAN\" %}{% endif %}{{ '<role>ASSISTANT</role>' + '<think>' }}",
     "bailing-think", "Ring"},
    {"{{ '<role>HUMAN</role>' + message['content'] + '<|role_end|>' }}{{ '<role>ASSISTANT</role>' }}", "bailing2",
     "Ling 2.0"},
    /* Llama 4 */
    {"{{- '<|header_start|>' + message['role'] + '<|header_end|>\\n\\n' }}", "llama4", "Llama 4"},
    /* dots.llm1 */
    {"{{ '<|userprompt|>' + message['content'] + '<|endofuserprompt|>' }}", "dots1", "dots1"},
    /* Hunyuan-A13B */
    {"{{ '<|startoftext|>' + message['content'] + '<|extra_4|>' }}{{ '<|startoftext|>' + message['content'] + "
     "'<|extra_0|>' }}",
     "hunyuan-moe", "Hunyuan MoE"},
    /* gpt-oss */
    {"{{- '<|start|>assistant<|channel|>final<|message|>' }}", "gpt-oss", "gpt-oss"},
    /* Hunyuan-4B */
    {"{{ '<｜hy_Assistant｜>' + message['content'] + '<｜hy_place▁holder▁no▁2｜>' }}{{ message['content'] + "
     "'<｜hy_place▁holder▁no▁3｜>' }}",
     "hunyuan-dense", "Hunyuan dense"},
    /* Kimi-K2-Instruct */
    {"{%- if message['role'] == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}", "kimi-k2",
     "Kimi K2"},
    /* "ByteDance-Seed/Seed-OSS-36B-Instruct" */
    {"{# <seed:bos> #}{{ bos_token + message.role + \"\\n\" + message.content + eos_token }}", "seed_oss",
     "Seed-OSS"},
    /* Grok 2 (two spaces before the +, as in its template) */
    {"{{ 'Assistant: '  + message['content'] + '<|separator|>\\n\\n' }}", "grok-2", "Grok 2"},
    /* openPangu-Embedded */
    {"{{ '[unused9]系统：[unused10]' }}", "pangu-embedded", "Pangu"},
    /* llama.cpp does not take dots1 as a name; kiln does (docs/chat.md) */
    {"dots1", "dots1", "dots1 by name"},
};
#define NDETECT (int)(sizeof DETECT / sizeof DETECT[0])

START_TEST(detects) {
    const detect_case *c = &DETECT[_i];
    const char        *name = NULL;
    kiln_status        st = kiln_chat_template_detect(c->tmpl, &name);
    ck_assert_msg(st == NULL, "%s: %s", c->why, kiln_status_msg(st));
    ck_assert_msg(name && strcmp(name, c->name) == 0, "%s: detected %s, want %s", c->why, name, c->name);
    /* every detected name is a template kiln renders */
    TS_OK(kiln_chat_template_by_name(name));
}
END_TEST

START_TEST(detect_refusals) {
    const char *name = "x";
    /* nothing known: an error listing kiln's names */
    EXPECT_ERR(kiln_chat_template_detect("{{ messages | tojson }}", &name), KILN_ERR_NOT_FOUND, "unknown",
               "matches none", "chatml", "deepseek3", "llama3", "mistral-v7-tekken", "zephyr", "pangu-embedded");
    ck_assert_ptr_null(name);
    /* "<|user|>" alone is no family's (zephyr also needs <|endoftext|>, glmedge <|assistant|>) */
    EXPECT_ERR(kiln_chat_template_detect("{{ '<|user|>' + message['content'] }}", &name), KILN_ERR_NOT_FOUND,
               "user marker only", "matches none");
    EXPECT_ERR(kiln_chat_template_detect("", &name), KILN_ERR_NOT_FOUND, "empty", "(empty)");
    EXPECT_ERR(kiln_chat_template_detect(NULL, &name), KILN_ERR_INVALID, "NULL tmpl", "tmpl is NULL");
    EXPECT_ERR(kiln_chat_template_detect("chatml", NULL), KILN_ERR_INVALID, "NULL name", "name is NULL");
}
END_TEST

START_TEST(by_name) {
    for (int i = 0; i < kiln_chat_template_count(); i++) TS_OK(kiln_chat_template_by_name(kiln_chat_template_name(i)));
    EXPECT_ERR(kiln_chat_template_by_name("llama-3"), KILN_ERR_NOT_FOUND, "typo", "unknown chat template 'llama-3'",
               "chatml, llama2, ", "grok-2, pangu-embedded)");
    EXPECT_ERR(kiln_chat_template_by_name("vicuna-13b"), KILN_ERR_NOT_FOUND, "model name", "'vicuna-13b'",
               "vicuna, vicuna-orca");
    /* dots1 is detected by llama.cpp but not taken by name there; kiln takes it (docs/chat.md) */
    TS_OK(kiln_chat_template_by_name("dots1"));
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
                        TS_TESTS(every_template_pinned, render_edges, render_edges_more, delta),
                        TS_LOOP(0, NRENDERED, delta_every_template), TS_LOOP(0, NDETECT, detects),
                        TS_TESTS(detect_refusals, by_name, apply_refusals, from_gguf));
    return ts_main(s);
}
