/* fuzz_request: kiln serve's request bodies (serve/api.c) on arbitrary bytes. The first byte
 * picks completion or chat; the rest is the body: parsed and checked, and when it is accepted,
 * its fields rendered into every kind of answer (result, chunk, usage) as the server would; when
 * it is refused, the error rendered. Every refusal must be an sv_error, never a crash. */
#include "tests/fuzz/fuzz.h"

#include "serve/serve.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    sv_kind    kind = data[0] & 1 ? SV_CHAT : SV_COMPLETION;
    sv_request r;
    sv_error   e;
    const char *body = (const char *)data + 1;
    if (!sv_parse(kind, body, size - 1, "tiny", 1024, &r, &e)) {
        free(sv_render_error(&e));
        return 0;
    }
    sv_meta     m = {.id = "cmpl-1", .model = "tiny", .created = 1};
    const char *text = r.prompt ? r.prompt : r.n_msgs ? r.msgs[r.n_msgs - 1].content : "";
    size_t      len = strlen(text);
    free(sv_render_result(kind, &m, text, len, "stop", r.n_prompt_ids, (int64_t)len));
    free(sv_render_chunk(kind, &m, text, len, r.stream, NULL));
    free(sv_render_chunk(kind, &m, r.n_stop ? r.stop[0] : NULL, r.n_stop ? strlen(r.stop[0]) : 0, false, "length"));
    free(sv_render_usage(kind, &m, 1, 2));
    sv_request_free(&r);
    return 0;
}
