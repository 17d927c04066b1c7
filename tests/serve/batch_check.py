"""kiln serve's batch against single requests, with Python's standard library only (the GPU
machines have no package registry, so no OpenAI client: tests/gpu/test_gpu_serve.c runs this).

batch_check.py URL N MAX_TOKENS: each of N prompts completed alone (greedy, not streamed), one
after another; then the N prompts streamed at once, from N threads (server-sent events, read
by hand). Every stream's text and finish reason must equal its prompt's answer alone, and most
answers must say something (an answer that ends at once proves little). Exits 0 when all hold;
prints what failed."""
import json
import sys
import threading
import urllib.request

BASE = sys.argv[1]
N = int(sys.argv[2])
MAX_TOKENS = int(sys.argv[3])
MIN_EQUAL = int(sys.argv[4]) if len(sys.argv) > 4 else N


def prompt(i):
    return f"The story number {i} begins when"


def post(body):
    req = urllib.request.Request(BASE + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=300)


def alone(i):
    with post({"model": "tiny", "prompt": prompt(i), "max_tokens": MAX_TOKENS, "temperature": 0}) as r:
        c = json.loads(r.read().decode())["choices"][0]
    return c["text"], c["finish_reason"]


def streamed(i):
    text, finish = "", None
    with post({"model": "tiny", "prompt": prompt(i), "max_tokens": MAX_TOKENS, "temperature": 0,
               "stream": True}) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for c in json.loads(line[6:]).get("choices", []):
                text += c.get("text") or ""
                finish = c.get("finish_reason") or finish
    return text, finish


def main():
    want = [alone(i) for i in range(N)]
    got, errors = [None] * N, []

    def one(i):
        try:
            got[i] = streamed(i)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(f"{i}: {e!r}")

    ts = [threading.Thread(target=one, args=(i,)) for i in range(N)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    bad, equal = list(errors), 0
    for i in range(N):
        if got[i] is None:
            continue
        if got[i] == want[i]:
            equal += 1
            continue
        print(f"differs: stream {i}: {got[i]!r}, alone {want[i]!r}")
        if got[i][1] != want[i][1] or not got[i][0]:
            bad.append(f"stream {i} ended otherwise: {got[i]!r}, alone {want[i]!r}")
    if equal < MIN_EQUAL:
        bad.append(f"{equal} of {N} streams equal their request alone, fewer than {MIN_EQUAL}")
    if sum(1 for w in want if w[0]) < N // 2:
        bad.append(f"only {sum(1 for w in want if w[0])} of {N} answers say anything: {want!r}")
    for b in bad:
        print("FAIL", b)
    print(f"{equal} of {N} streams equal their request alone")
    sys.exit(1 if bad else 0)


main()
