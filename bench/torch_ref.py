#!/usr/bin/env python3
"""PyTorch's speed on whole models (Llama, Qwen3-MoE), eager and torch.compile, as the baseline
for kiln's model numbers (make bench).

Usage:
  torch_ref.py --arch llama|qwen3moe --n-vocab V --n-embd E --n-layer L --n-head H
               --n-head-kv HKV --head-dim D --n-ff F [--n-expert NE --n-expert-used K
               --n-ff-exp FE] [--qk-norm] [--tied] --rms-eps EPS --rope-base B
               [--kv 512,4096] [--prefill 512] [--steps 64] [--modes eager,compile]
               [--device cuda|cpu] [--dtype bf16|f16|f32] [--max-seconds S]
               [--moe auto|grouped|gather|loop]

Prints on stdout, one line each, flushed (everything else goes to stderr), exit status 0:
  eager decode kv=P ms=<wall ms per token> gpu_ms=<CUDA-event ms per token>
  eager prefill n=N ms=<wall ms for the N tokens> tok_s=<tokens/s>
  compile compile_s=<s>           then the same decode and prefill lines for torch.compile
  <mode> skip: <why>              torch missing, OOM, compile failed, time budget, ...
stderr says the weights' size, which expert path ran, each mode's peak GPU memory, how the
decode compiled, the number of graphs compiled and whether CUDA graphs were skipped.

The model is what a PyTorch user writes (nn.Module, F.linear, no fused custom kernels): token
embedding; per layer RMSNorm (F.rms_norm) -> q/k/v projections without bias -> (qwen3moe /
--qk-norm, implied by qwen3moe: RMSNorm of each q and k head) -> rotary (HF style: rotate_half, cos/sin tables
indexed by position) -> K/V written into a static bf16 cache with index_copy_ ->
F.scaled_dot_product_attention(enable_gqa=True) -> o projection -> residual -> RMSNorm -> FFN ->
residual; final RMSNorm of the last token, lm_head (the embedding when --tied), argmax.
FFN: llama SwiGLU with gate/up/down Linear; qwen3moe a router Linear, softmax (f32) -> top-k ->
renormalized weights, and the experts as one stacked weight per projection [NE, ...]:
torch._grouped_mm over the (token, slot) rows sorted by expert, with offsets counted on the
device (scatter_add + cumsum, no host sync, so it can be captured in a CUDA graph), where
_grouped_mm runs on the device (probed once: bf16 on sm90 on the GPU); otherwise gather +
bmm of the selected experts' weights for decode and a loop over experts (host sync) for prefill
(--moe forces one: grouped, gather or loop).
Weights are random on the device (torch.randn * 1/sqrt(in_features), norms 1; no files),
allocated once and shared by both modes.

Decode at KV position P: a cache of P+1 slots per layer (static shape); a step embeds one token,
writes slot P and attends over all P+1 slots (the same work as a real step at position P), then
argmax and .item() on the host, the token fed back as the next input (as a generation loop
does; kiln's number includes its 4-byte readback too). After warm-up (eager: 3 steps;
compile: the 2 first calls, then 2 more) the step runs --steps times: ms = wall time per step; gpu_ms = the sum over steps of CUDA-event time from the step's
launch to its argmax, per step (the host's .item() and refill between steps excluded).
Prefill: N tokens from position 0, causal (is_causal=True), a cache of N slots, logits of the
last token only (as kiln's KILN_OUTPUTS_LAST); ms = the median wall time of 5 runs after 2
warm-ups, each ending with .item().
torch.compile: torch.compile(step, mode="reduce-overhead") (CUDA graphs), one compiled function
for decode with the caches' length marked dynamic (torch._dynamo.mark_dynamic), so every kv
shares one compile (where that fails, one compile per kv), and one for prefill. compile_s is the
wall time of the first two calls of every shape (compilation, then CUDA-graph recording), all
shapes together. On a CPU, where CUDA graphs do not exist, reduce-overhead runs as default
mode (or falls back to it). --max-seconds S stops with `skip: time budget` rather than run
past S seconds from the start. Between modes everything but the weights is freed.
"""
import argparse
import math
import signal
import sys
import time

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
    TORCH_ERR = None
except Exception as e:  # noqa: BLE001  (no torch: every mode prints a skip line)
    torch, F, nn = None, None, None
    TORCH_ERR = e

DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}


def emit(line):
    print(line, flush=True)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def one_line(e):
    text = f"{e.__class__.__name__}: {e}".replace("\n", " ")
    return text[:300]


# ---------------------------------------------------------------- time budget

class TimeBudget(Exception):
    """--max-seconds ran out."""


DEADLINE = [None]


def check_budget():
    """Raise TimeBudget once past the deadline (also after an exception that hid the alarm's)."""
    if DEADLINE[0] is not None and time.monotonic() >= DEADLINE[0]:
        raise TimeBudget()


def failure(what, e, compiling=False):
    """The text of a skip line for exception e (or TimeBudget, raised, when the time is up)."""
    check_budget()
    kind = "OOM: " if is_oom(e) else ("compile failed: " if compiling else "")
    return f"{what}: {kind}{one_line(e)}"


def arm_budget(seconds):
    if seconds and seconds > 0:
        DEADLINE[0] = time.monotonic() + seconds
    if seconds and seconds > 0 and hasattr(signal, "SIGALRM"):
        def over(signum, frame):
            raise TimeBudget()
        signal.signal(signal.SIGALRM, over)
        signal.setitimer(signal.ITIMER_REAL, seconds)


def disarm_budget():
    if hasattr(signal, "SIGALRM"):
        signal.setitimer(signal.ITIMER_REAL, 0)


# ---------------------------------------------------------------- the model

Module = nn.Module if nn else object


def weight(cfg, *shape, fan_in=None):
    """Random weight on the device: randn * 1/sqrt(in_features) (the last dim by default)."""
    w = torch.randn(*shape, device=cfg.device, dtype=cfg.dtype)
    w.mul_(1.0 / math.sqrt(fan_in or shape[-1]))
    return nn.Parameter(w, requires_grad=False)


def ones(cfg, n):
    return nn.Parameter(torch.ones(n, device=cfg.device, dtype=cfg.dtype), requires_grad=False)


def rms_norm(x, w, eps):
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def grouped_mm_available(cfg):
    """torch._grouped_mm for this device and dtype: bf16 on sm90+ on CUDA, probed once."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    if cfg.device == "cuda" and (cfg.dtype != torch.bfloat16 or torch.cuda.get_device_capability() < (9, 0)):
        return False
    try:
        x = torch.ones(32, 64, device=cfg.device, dtype=cfg.dtype)
        w = torch.ones(2, 32, 64, device=cfg.device, dtype=cfg.dtype).transpose(1, 2)
        torch._grouped_mm(x, w, offs=torch.tensor([16, 32], device=cfg.device, dtype=torch.int32))
        return True
    except Exception as e:  # noqa: BLE001
        log(f"torch._grouped_mm unavailable here: {one_line(e)}")
        return False


class Attention(Module):
    def __init__(self, cfg):
        super().__init__()
        E, H, HKV, D = cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim
        self.cfg = cfg
        self.norm = ones(cfg, E)
        self.wq = weight(cfg, H * D, E)
        self.wk = weight(cfg, HKV * D, E)
        self.wv = weight(cfg, HKV * D, E)
        self.wo = weight(cfg, E, H * D)
        if cfg.qk_norm:
            self.q_norm = ones(cfg, D)
            self.k_norm = ones(cfg, D)

    def forward(self, x, cos, sin, pos, cache_k, cache_v, causal):
        c = self.cfg
        B, T, _ = x.shape
        h = rms_norm(x, self.norm, c.rms_eps)
        q = F.linear(h, self.wq).view(B, T, c.n_head, c.head_dim)
        k = F.linear(h, self.wk).view(B, T, c.n_head_kv, c.head_dim)
        v = F.linear(h, self.wv).view(B, T, c.n_head_kv, c.head_dim)
        if c.qk_norm:
            q = rms_norm(q, self.q_norm, c.rms_eps)
            k = rms_norm(k, self.k_norm, c.rms_eps)
        q = (q * cos + rotate_half(q) * sin).transpose(1, 2)        # (B, H, T, D)
        k = (k * cos + rotate_half(k) * sin).transpose(1, 2)
        cache_k.index_copy_(2, pos, k)
        cache_v.index_copy_(2, pos, v.transpose(1, 2))
        o = F.scaled_dot_product_attention(q, cache_k, cache_v, is_causal=causal, enable_gqa=True)
        return x + F.linear(o.transpose(1, 2).reshape(B, T, -1), self.wo)


class DenseFFN(Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.norm = ones(cfg, cfg.n_embd)
        self.gate = weight(cfg, cfg.n_ff, cfg.n_embd)
        self.up = weight(cfg, cfg.n_ff, cfg.n_embd)
        self.down = weight(cfg, cfg.n_embd, cfg.n_ff)

    def forward(self, x):
        h = rms_norm(x, self.norm, self.cfg.rms_eps)
        return x + F.linear(F.silu(F.linear(h, self.gate)) * F.linear(h, self.up), self.down)


class MoEFFN(Module):
    def __init__(self, cfg):
        super().__init__()
        NE, E, FE = cfg.n_expert, cfg.n_embd, cfg.n_ff_exp
        self.cfg = cfg
        self.norm = ones(cfg, E)
        self.router = weight(cfg, NE, E)
        self.gate = weight(cfg, NE, FE, E)                           # stacked [NE, out, in]
        self.up = weight(cfg, NE, FE, E)
        self.down = weight(cfg, NE, E, FE)

    def route(self, h):
        probs = torch.softmax(F.linear(h, self.router).float(), dim=-1)
        w, ids = torch.topk(probs, self.cfg.n_expert_used, dim=-1)
        return (w / w.sum(-1, keepdim=True)).to(h.dtype), ids          # (T, K)

    def experts_grouped(self, h, ids):
        """_grouped_mm over the rows sorted by expert; offsets from a device-side count."""
        K, NE = self.cfg.n_expert_used, self.cfg.n_expert
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(NE, dtype=torch.int32, device=h.device).scatter_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32))
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        x = h[order // K]
        g = torch._grouped_mm(x, self.gate.transpose(1, 2), offs=offs)
        u = torch._grouped_mm(x, self.up.transpose(1, 2), offs=offs)
        y = torch._grouped_mm(F.silu(g) * u, self.down.transpose(1, 2), offs=offs)
        return torch.empty_like(y).index_copy_(0, order, y)           # (T*K, E), token-major

    def experts_gather(self, h, ids):
        """Each (token, slot) row through its expert's weights, gathered: decode-sized batches."""
        flat = ids.reshape(-1)
        x = h.repeat_interleave(self.cfg.n_expert_used, dim=0).unsqueeze(-1)
        g = torch.bmm(self.gate[flat], x)
        u = torch.bmm(self.up[flat], x)
        return torch.bmm(self.down[flat], F.silu(g) * u).squeeze(-1)

    def experts_loop(self, h, ids):
        """A loop over the experts that have rows (host sync): the fallback for prefill."""
        flat = ids.reshape(-1)
        x = h.repeat_interleave(self.cfg.n_expert_used, dim=0)
        y = torch.empty_like(x)
        for e in flat.unique().tolist():
            rows = (flat == e).nonzero().squeeze(-1)
            xe = x[rows]
            ye = F.linear(F.silu(F.linear(xe, self.gate[e])) * F.linear(xe, self.up[e]), self.down[e])
            y.index_copy_(0, rows, ye)
        return y

    def forward(self, x):
        c = self.cfg
        B, T, E = x.shape
        h = rms_norm(x, self.norm, c.rms_eps).reshape(B * T, E)
        w, ids = self.route(h)
        impl = c.moe
        if impl == "auto":
            impl = "gather" if B * T * c.n_expert_used <= 64 else "loop"
        y = getattr(self, "experts_" + impl)(h, ids)
        y = (y.view(B * T, c.n_expert_used, E) * w.unsqueeze(-1)).sum(1)
        return x + y.view(B, T, E)


class Layer(Module):
    def __init__(self, cfg):
        super().__init__()
        self.attn = Attention(cfg)
        self.ffn = MoEFFN(cfg) if cfg.arch == "qwen3moe" else DenseFFN(cfg)

    def forward(self, x, cos, sin, pos, cache_k, cache_v, causal):
        return self.ffn(self.attn(x, cos, sin, pos, cache_k, cache_v, causal))


class Model(Module):
    def __init__(self, cfg, max_pos):
        super().__init__()
        self.cfg = cfg
        self.embed = weight(cfg, cfg.n_vocab, cfg.n_embd)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.n_layer))
        self.norm = ones(cfg, cfg.n_embd)
        self.lm_head = self.embed if cfg.tied else weight(cfg, cfg.n_vocab, cfg.n_embd)
        D = cfg.head_dim
        inv_freq = 1.0 / cfg.rope_base ** (torch.arange(0, D, 2, device=cfg.device).float() / D)
        ang = torch.arange(max_pos, device=cfg.device).float()[:, None] * inv_freq[None, :]
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos().to(cfg.dtype), persistent=False)
        self.register_buffer("sin", ang.sin().to(cfg.dtype), persistent=False)

    def forward(self, tokens, pos, caches_k, caches_v, causal):
        """Next token (argmax of the last position's logits) for tokens (1, T) at positions pos."""
        x = F.embedding(tokens, self.embed)
        cos = self.cos[pos][None, :, None, :]                         # (1, T, 1, D)
        sin = self.sin[pos][None, :, None, :]
        for layer, ck, cv in zip(self.layers, caches_k, caches_v):
            x = layer(x, cos, sin, pos, ck, cv, causal)
        x = rms_norm(x[:, -1:], self.norm, self.cfg.rms_eps)
        return F.linear(x, self.lm_head).argmax(dim=-1)               # (1, 1)


# ---------------------------------------------------------------- measuring

def sync(cfg):
    if cfg.device == "cuda":
        torch.cuda.synchronize()


def new_caches(cfg, n, dynamic=False):
    """Per layer K and V caches (1, HKV, n, D); static addresses (and a dynamic length) for compile."""
    shape = (1, cfg.n_head_kv, n, cfg.head_dim)
    ks = [torch.zeros(shape, device=cfg.device, dtype=cfg.dtype) for _ in range(cfg.n_layer)]
    vs = [torch.zeros(shape, device=cfg.device, dtype=cfg.dtype) for _ in range(cfg.n_layer)]
    for c in ks + vs:
        if dynamic:
            torch._dynamo.mark_dynamic(c, 2)
        if cfg.compiling and hasattr(torch._dynamo, "mark_static_address"):
            torch._dynamo.mark_static_address(c)
    return ks, vs


class Decode:
    """The decode step at KV position P (a cache of P+1 slots), and its inputs."""

    def __init__(self, cfg, fn, P, dynamic):
        self.cfg, self.fn = cfg, fn
        self.ks, self.vs = new_caches(cfg, P + 1, dynamic)
        self.tok = torch.zeros(1, 1, dtype=torch.long, device=cfg.device)
        self.pos = torch.tensor([P], dtype=torch.long, device=cfg.device)

    def step(self):
        """One step: the next token read on the host and fed back."""
        nxt = self.fn(self.tok, self.pos, self.ks, self.vs).item()
        self.tok.fill_(nxt)
        return nxt

    def measure(self, steps):
        """(wall ms per step, CUDA-event ms per step or None)."""
        cuda = self.cfg.device == "cuda"
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
               for _ in range(steps)] if cuda else []
        sync(self.cfg)
        t0 = time.perf_counter()
        for i in range(steps):
            if cuda:
                evs[i][0].record()
            out = self.fn(self.tok, self.pos, self.ks, self.vs)
            if cuda:
                evs[i][1].record()
            self.tok.fill_(out.item())
        sync(self.cfg)
        wall = (time.perf_counter() - t0) * 1e3 / steps
        gpu = sum(a.elapsed_time(b) for a, b in evs) / steps if cuda else None
        return wall, gpu


class Prefill:
    """Prefill of n tokens from position 0 into a cache of n slots."""

    def __init__(self, cfg, fn, n):
        self.cfg, self.fn = cfg, fn
        self.ks, self.vs = new_caches(cfg, n)
        g = torch.Generator(device="cpu").manual_seed(1)
        self.tok = torch.randint(cfg.n_vocab, (1, n), generator=g).to(cfg.device)
        self.pos = torch.arange(n, device=cfg.device)

    def step(self):
        return self.fn(self.tok, self.pos, self.ks, self.vs).item()

    def measure(self, runs=5):
        times = []
        for _ in range(runs):
            sync(self.cfg)
            t0 = time.perf_counter()
            self.step()
            times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times)[len(times) // 2]


def decode_line(mode, P, wall, gpu):
    g = f"{gpu:.4f}" if gpu is not None else "-"
    return f"{mode} decode kv={P} ms={wall:.4f} gpu_ms={g}"


def prefill_line(mode, n, ms):
    return f"{mode} prefill n={n} ms={ms:.4f} tok_s={n / ms * 1e3:.1f}"


def is_oom(e):
    return "out of memory" in str(e).lower() or e.__class__.__name__ == "OutOfMemoryError"


def free(cfg):
    import gc
    gc.collect()
    if cfg.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def run_eager(cfg, model, args):
    cfg.compiling = False
    decode = lambda t, p, k, v: model(t, p, k, v, False)   # noqa: E731
    prefill = lambda t, p, k, v: model(t, p, k, v, True)   # noqa: E731
    with torch.inference_mode():
        for P in args.kv:
            try:
                d = Decode(cfg, decode, P, False)
                for _ in range(3):
                    d.step()
                emit(decode_line("eager", P, *d.measure(args.steps)))
            except TimeBudget:
                raise
            except Exception as e:  # noqa: BLE001
                emit("eager skip: " + failure(f"decode kv={P}", e))
            d = None
            free(cfg)
        if args.prefill:
            try:
                p = Prefill(cfg, prefill, args.prefill)
                for _ in range(2):
                    p.step()
                emit(prefill_line("eager", args.prefill, p.measure()))
            except TimeBudget:
                raise
            except Exception as e:  # noqa: BLE001
                emit("eager skip: " + failure(f"prefill n={args.prefill}", e))
            p = None
            free(cfg)


def compile_fn(cfg, fn, dynamic=None):
    mode = "reduce-overhead" if cfg.device == "cuda" else cfg.cpu_compile_mode
    return torch.compile(fn, mode=mode, dynamic=dynamic)


def first_calls(runner):
    """Wall seconds of a shape's first two calls (compilation, CUDA-graph recording)."""
    t0 = time.perf_counter()
    for _ in range(2):
        runner.step()
    sync(runner.cfg)
    return time.perf_counter() - t0


def compile_decodes(cfg, model, kvs):
    """{P: Decode} compiled with a dynamic KV length (one compile), else one compile per kv; and
    the seconds their first calls took. Raises when neither compiles."""
    decode = lambda t, p, k, v: model(t, p, k, v, False)   # noqa: E731
    for dynamic in (True, False):
        secs, runs = 0.0, {}
        try:
            fn = compile_fn(cfg, decode, None if dynamic else False)
            for P in kvs:
                runs[P] = Decode(cfg, fn, P, dynamic)
                secs += first_calls(runs[P])
            log(f"compile: decode compiled {'with a dynamic KV length' if dynamic else 'per kv'}")
            return runs, secs
        except TimeBudget:
            raise
        except Exception as e:  # noqa: BLE001
            check_budget()
            if not dynamic:
                raise
            log(f"compile: decode with a dynamic KV length failed ({one_line(e)}); one compile per kv")
            runs = None
            torch._dynamo.reset()
            free(cfg)


def run_compile(cfg, model, args):
    cfg.compiling = True
    prefill = lambda t, p, k, v: model(t, p, k, v, True)   # noqa: E731
    runs, secs, problems = {}, 0.0, []
    with torch.no_grad():
        try:
            runs, secs = compile_decodes(cfg, model, args.kv)
        except TimeBudget:
            raise
        except Exception as e:  # noqa: BLE001
            problems.append("compile skip: " + failure("decode", e, True))
            torch._dynamo.reset()
            free(cfg)
        pre = None
        if args.prefill:
            try:
                pre = Prefill(cfg, compile_fn(cfg, prefill), args.prefill)
                secs += first_calls(pre)
            except TimeBudget:
                raise
            except Exception as e:  # noqa: BLE001
                problems.append("compile skip: " + failure(f"prefill n={args.prefill}", e, True))
                pre = None
        if runs or pre:
            emit(f"compile compile_s={secs:.2f}")
        for line in problems:
            emit(line)
        for P, d in runs.items():
            try:
                for _ in range(2):
                    d.step()
                emit(decode_line("compile", P, *d.measure(args.steps)))
            except TimeBudget:
                raise
            except Exception as e:  # noqa: BLE001
                emit("compile skip: " + failure(f"decode kv={P}", e))
        if pre:
            try:
                emit(prefill_line("compile", args.prefill, pre.measure()))
            except TimeBudget:
                raise
            except Exception as e:  # noqa: BLE001
                emit("compile skip: " + failure(f"prefill n={args.prefill}", e))
    runs = pre = None
    torch._dynamo.reset()
    free(cfg)


# ---------------------------------------------------------------- main

def parse_args(argv):
    ap = argparse.ArgumentParser(description="PyTorch eager / torch.compile baseline for kiln's models")
    ap.add_argument("--arch", choices=("llama", "qwen3moe"), required=True)
    for name in ("n-vocab", "n-embd", "n-layer", "n-head", "n-head-kv", "head-dim"):
        ap.add_argument("--" + name, type=int, required=True)
    ap.add_argument("--n-ff", type=int, default=0)
    ap.add_argument("--n-expert", type=int, default=0)
    ap.add_argument("--n-expert-used", type=int, default=0)
    ap.add_argument("--n-ff-exp", type=int, default=0)
    ap.add_argument("--qk-norm", action="store_true")
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--rms-eps", type=float, default=1e-5)
    ap.add_argument("--rope-base", type=float, default=10000.0)
    ap.add_argument("--kv", default="512,4096", help="decode KV positions, comma-separated")
    ap.add_argument("--prefill", type=int, default=512, help="prefill tokens (0: none)")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    ap.add_argument("--max-seconds", type=float, default=0)
    ap.add_argument("--moe", choices=("auto", "grouped", "gather", "loop"), default="auto",
                    help="experts: auto = _grouped_mm where it runs, else gather/loop")
    a = ap.parse_args(argv)
    a.kv = [int(x) for x in a.kv.split(",") if x.strip()]
    a.modes = [m for m in a.modes.split(",") if m.strip()]
    if a.arch == "qwen3moe":
        a.qk_norm = True
        if not (a.n_expert and a.n_expert_used and a.n_ff_exp):
            ap.error("qwen3moe needs --n-expert, --n-expert-used and --n-ff-exp")
    elif not a.n_ff:
        ap.error("llama needs --n-ff")
    return a


class Config:
    """The model's hyperparameters plus where and how it runs."""

    def __init__(self, a):
        for k in ("arch", "n_vocab", "n_embd", "n_layer", "n_head", "n_head_kv", "head_dim", "n_ff",
                  "n_expert", "n_expert_used", "n_ff_exp", "qk_norm", "tied", "rms_eps", "rope_base"):
            setattr(self, k, getattr(a, k))
        self.device = a.device
        self.dtype = getattr(torch, DTYPES[a.dtype])
        self.moe = a.moe
        self.compiling = False
        self.cpu_compile_mode = "reduce-overhead"


def report_mode(cfg, mode):
    """On stderr: the mode's peak GPU memory and, for compile, why CUDA graphs were skipped."""
    if cfg.device == "cuda":
        log(f"{mode}: peak GPU memory {torch.cuda.max_memory_allocated() / 1e9:.2f} GB")
        torch.cuda.reset_peak_memory_stats()
    if mode == "compile":
        try:
            from torch._dynamo.utils import counters
            skips = dict(counters["inductor"]).get("cudagraph_skips", 0)
            graphs = dict(counters["stats"]).get("unique_graphs", "?")
            log(f"compile: {graphs} graph(s) compiled; CUDA graphs skipped {skips} time(s)"
                + (" (TORCH_LOGS=perf_hints says why)" if skips else ""))
        except Exception:  # noqa: BLE001
            pass


def check_cpu_compile(cfg):
    """On a CPU, reduce-overhead should run as default mode; if it raises, use default mode."""
    try:
        f = torch.compile(lambda x: x * 2 + 1, mode="reduce-overhead")
        f(torch.ones(4))
    except Exception as e:  # noqa: BLE001
        log(f"compile: reduce-overhead on the CPU failed ({one_line(e)}); default mode")
        cfg.cpu_compile_mode = "default"


def run(a):
    if torch is None:
        for m in a.modes:
            emit(f"{m} skip: no PyTorch ({TORCH_ERR.__class__.__name__})")
        return
    if a.device == "cuda" and not torch.cuda.is_available():
        for m in a.modes:
            emit(f"{m} skip: PyTorch sees no GPU")
        return
    arm_budget(a.max_seconds)
    done = []
    try:
        cfg = Config(a)
        if cfg.arch == "qwen3moe" and cfg.moe == "auto" and grouped_mm_available(cfg):
            cfg.moe = "grouped"
        torch.manual_seed(0)
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                model = Model(cfg, max(a.kv + [a.prefill]) + 1)
        except TimeBudget:
            raise
        except Exception as e:  # noqa: BLE001
            for m in a.modes:
                emit(f"{m} skip: " + failure("weights", e))
            return
        nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        log(f"weights: {nbytes / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s; experts: {cfg.moe}; "
            f"torch {torch.__version__}" + (f", {torch.cuda.get_device_name()}" if a.device == "cuda" else ""))
        if a.device == "cpu" and "compile" in a.modes:
            check_cpu_compile(cfg)
        for m in a.modes:
            if m == "eager":
                run_eager(cfg, model, a)
            elif m == "compile":
                run_compile(cfg, model, a)
            else:
                emit(f"{m} skip: unknown mode")
            done.append(m)
            report_mode(cfg, m)
            free(cfg)
    except TimeBudget:
        for m in a.modes:
            if m not in done:
                emit(f"{m} skip: time budget")
    finally:
        disarm_budget()


def main(argv):
    a = parse_args(argv)
    try:
        run(a)
    except Exception as e:  # noqa: BLE001  (the last resort: still one skip line, status 0)
        emit(f"{','.join(a.modes)} skip: {one_line(e)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
