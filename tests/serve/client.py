"""kiln serve exercised by a real client: OpenAI's Python package (tests/test_serve.c starts the
server on a tiny model with the CPU reference and 4 slots, then runs this with the server's URL
and the tests to run: client.py URL TEST...).

Checks: models, completions and chat (whole and streamed, the stream's text equal to the whole
answer's), max_tokens, stop, seeds, every bad request (OpenAI-style JSON errors with their
status), the API's error classes in the client, 16 concurrent streaming clients each equal to
the same request alone (greedy), a client that leaves mid-stream (its request cancelled, the
slot free again), and 429 from a full queue. Exits 0 when all hold; prints what failed."""
import json
import sys
import threading
import time
import urllib.error
import urllib.request

import openai

BASE = sys.argv[1]
MODEL = "tiny"
client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=120)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def raw(method, path, body=None, headers=None):
    """(status, parsed JSON or text) of a request made by hand (urllib)."""
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(BASE + path, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def error_of(status, body, want_status, want_param=None, needle=""):
    check(status == want_status, f"status {status}, not {want_status}: {body}")
    check(isinstance(body, dict) and "error" in body, f"not an OpenAI error: {body}")
    e = body["error"]
    check(isinstance(e.get("message"), str) and needle in e["message"], f"message {e.get('message')!r} lacks {needle!r}")
    check(e.get("type"), f"no type: {e}")
    if want_param is not None:
        check(e.get("param") == want_param, f"param {e.get('param')!r}, not {want_param!r}")


def prompt(i):
    return f"The story number {i} begins when"


def complete(p, **kw):
    r = client.completions.create(model=MODEL, prompt=p, **kw)
    return r.choices[0].text, r.choices[0].finish_reason, r.usage


def stream_text(p, chat=False, **kw):
    text, finish, usage = "", None, None
    if chat:
        s = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": p}], stream=True,
                                           stream_options={"include_usage": True}, **kw)
        for ch in s:
            if ch.usage:
                usage = ch.usage
            for c in ch.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
    else:
        for ch in client.completions.create(model=MODEL, prompt=p, stream=True, **kw):
            for c in ch.choices:
                text += c.text
                finish = c.finish_reason or finish
    return text, finish, usage


def test_basics():
    check([m.id for m in client.models.list().data] == [MODEL], "models")
    text, finish, usage = complete(prompt(1), max_tokens=8, temperature=0)
    check(finish == "length" and usage.completion_tokens == 8, f"max_tokens: {finish} {usage}")
    check(usage.total_tokens == usage.prompt_tokens + 8, f"usage {usage}")
    s, sf, _ = stream_text(prompt(1), max_tokens=8, temperature=0)
    check(s == text and sf == "length", f"stream {s!r} vs whole {text!r}")
    c = client.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": "Be short."},
                                                              {"role": "user", "content": "Hello"}],
                                       max_tokens=6, temperature=0)
    check(c.choices[0].message.role == "assistant" and c.usage.completion_tokens == 6, f"chat {c}")
    cs, cf, cu = stream_text("Hello", chat=True, max_tokens=6, temperature=0)
    c2 = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=6,
                                        temperature=0)
    check(cs == c2.choices[0].message.content and cu.completion_tokens == 6, f"chat stream {cs!r} vs {c2}")
    # stop: a piece of the greedy text; the answer ends right before its first place
    full, _, _ = complete(prompt(3), max_tokens=16, temperature=0)
    letters = [i for i in range(2, len(full) - 1) if full[i:i + 2].isalpha() and full[i:i + 2].isascii()]
    check(letters, f"no two letters in {full!r}")
    stop = full[letters[0]:letters[0] + 2]
    cut, f, _ = complete(prompt(3), max_tokens=16, temperature=0, stop=["zzzz", stop])
    check(f == "stop" and cut == full[:full.index(stop)], f"stop {stop!r}: {cut!r} of {full!r} ({f})")
    scut, sf, _ = stream_text(prompt(3), max_tokens=16, temperature=0, stop=stop)
    check(scut == cut and sf == "stop", f"streamed stop: {scut!r} vs {cut!r}")
    # a seed gives the same draw again
    a = complete(prompt(4), max_tokens=10, temperature=0.9, seed=11)[0]
    b = complete(prompt(4), max_tokens=10, temperature=0.9, seed=11)[0]
    check(a == b, f"seed 11: {a!r} then {b!r}")


def test_bad_requests():
    ok = {"model": MODEL, "prompt": "x"}
    error_of(*raw("POST", "/v1/completions", b'{"model": "tiny", "prompt": '), 400, None, "not JSON")
    error_of(*raw("POST", "/v1/completions", {"prompt": "x"}), 400, "model", "'model' is required")
    error_of(*raw("POST", "/v1/completions", {**ok, "temperature": "hot"}), 400, "temperature", "must be a number")
    error_of(*raw("POST", "/v1/completions", {**ok, "max_tokens": -1}), 400, "max_tokens", "")
    error_of(*raw("POST", "/v1/completions", {**ok, "model": "gpt-4o"}), 404, "model", "does not exist")
    error_of(*raw("POST", "/v1/chat/completions", {"model": MODEL, "messages": []}), 400, "messages", "")
    error_of(*raw("POST", "/v1/completions", {**ok, "prompt": "word " * 3000}), 400, "prompt", "context holds")
    error_of(*raw("POST", "/v1/completions", {**ok, "prompt": "x" * (2 << 20)}), 413, None, "over the limit")
    error_of(*raw("GET", "/v1/nothing"), 404, None, "no route")
    error_of(*raw("GET", "/v1/completions"), 405, None, "another method")
    # the client's own classes for them
    for exc, kw in ((openai.BadRequestError, {"temperature": 5}), (openai.NotFoundError, {"model": "nope"})):
        try:
            client.completions.create(**{"model": MODEL, "prompt": "x", **kw})
            check(False, f"{kw}: no error")
        except exc:
            pass
    st, body = raw("GET", "/health")
    check(st == 200 and body == {"status": "ok"}, f"health {st} {body}")
    # a browser's preflight, and the origin allowed on answers
    req = urllib.request.Request(BASE + "/v1/chat/completions", method="OPTIONS")
    with urllib.request.urlopen(req, timeout=30) as r:
        check(r.status == 204 and r.headers.get("Access-Control-Allow-Origin") == "*", f"preflight {r.status}")
        check("POST" in r.headers.get("Access-Control-Allow-Methods", ""), "preflight methods")
    with urllib.request.urlopen(BASE + "/v1/models", timeout=30) as r:
        check(r.headers.get("Access-Control-Allow-Origin") == "*", "no CORS header on answers")
    st, text = raw("GET", "/metrics")
    check(st == 200 and "kiln_requests_total" in text and "kiln_queue_depth" in text, f"metrics: {text!r}")


def test_concurrent():
    n = 16
    want = [complete(prompt(i), max_tokens=12, temperature=0)[0] for i in range(n)]
    got = [None] * n
    errors = []

    def one(i):
        try:
            got[i] = stream_text(prompt(i), max_tokens=12, temperature=0)[0]
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(f"{i}: {e!r}")

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    check(not errors, f"errors: {errors}")
    for i in range(n):
        check(got[i] == want[i], f"stream {i}: {got[i]!r}, alone {want[i]!r}")


def test_health():
    st, body = raw("GET", "/health")
    check(st == 200 and body == {"status": "ok"}, f"health {st} {body}")
    text, finish, _ = complete("Hello", max_tokens=2, temperature=0)
    check(finish == "length", f"finish {finish}")


def metric(name):
    _, text = raw("GET", "/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def test_disconnect_and_queue():
    # a client that leaves after two chunks: its request ends at once, the slot is free again
    before = metric("kiln_completion_tokens_total")
    s = client.completions.create(model=MODEL, prompt=prompt(5), max_tokens=2000, temperature=0, stream=True)
    it = iter(s)
    next(it), next(it)
    s.close()
    for _ in range(100):
        if metric("kiln_batch_size") == 0:
            break
        time.sleep(0.05)
    check(metric("kiln_batch_size") == 0, "the left stream still runs")
    check(metric("kiln_completion_tokens_total") - before < 1000, "the left stream ran to its end")
    # 4 slots busy (their requests admitted first), then the queue (4) full: the next is 429
    holders = [threading.Thread(target=lambda i=i: complete(prompt(i), max_tokens=400, temperature=0)) for i in range(8)]

    def wait_for(name, value):
        for _ in range(400):
            if metric(name) == value:
                return
            time.sleep(0.01)
        check(False, f"{name} never reached {value}")

    for t in holders[:4]:
        t.start()
    wait_for("kiln_batch_size", 4)
    for t in holders[4:]:
        t.start()
    wait_for("kiln_queue_depth", 4)
    st, body = raw("POST", "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1})
    error_of(st, body, 429, None, "wait for a slot")
    for t in holders:
        t.join()


def main():
    failed = 0
    tests = {t.__name__: t for t in (test_basics, test_bad_requests, test_concurrent, test_disconnect_and_queue,
                                     test_health)}
    for t in (tests[n] for n in sys.argv[2:]):
        try:
            t()
            print(f"ok   {t.__name__}")
        except Exception as e:  # noqa: BLE001
            failed += 1
            print(f"FAIL {t.__name__}: {e}")
    sys.exit(1 if failed else 0)


main()
