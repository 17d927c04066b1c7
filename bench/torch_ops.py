#!/usr/bin/env python3
"""PyTorch's time for the computation of kiln bench graphs (bench/ops/*.kg, bench/fusion/*.kg),
for side-by-side tables (scripts/bench-ops.sh, make bench).

Usage: torch_ops.py [--iters N] [--device cuda|cpu] GRAPH.kg ...

Prints exactly one line per graph, in the order given:
  <path> ms=<median ms, 4 decimals> flops=<useful flops>          timed as a CUDA-graph replay
  <path> ms=<median ms, 4 decimals> flops=<useful flops> eager    could not be captured: eager
  <path> skip: <why>                                              no PyTorch program, or it failed
Without PyTorch every graph gets `skip: no PyTorch (<exception>)`, without a GPU (and no
`--device cpu`) `skip: PyTorch sees no GPU`; the exit status is 0 either way. torch is imported
once for all graphs.

The graph is read with a small parser of the .kg subset the bench graphs use (input/weight
declarations, one op per line, `# bench-ids: T U E`). Its ops are evaluated in order over an
environment of named values, so an operand may be a leaf or an earlier op's result. ggml dims
reversed are torch dims; every value is held as a 4-D tensor (ne3, ne2, ne1, ne0). The torch
program is what a PyTorch user would write for the same math, in the leaves' dtypes (results
keep the dtype torch gives them, e.g. bf16 out of a bf16 matmul where ggml has f32):
  mul_mat         F.linear(b.to(w.dtype), w)                   (b cast included)
  mul_mat_id      torch._grouped_mm over the (token, slot) rows sorted by expert, offsets from a
                  scatter_add count and cumsum on the device (routing included); where
                  _grouped_mm is missing or fails on the device, gather + bmm
  flash_attn_ext  F.scaled_dot_product_attention(q.to(k.dtype), k, v, enable_gqa=True); causal
                  when the graph has a mask and n_q == n_kv > 1, no mask otherwise
  rms_norm, norm  F.rms_norm, F.layer_norm (no affine)
  soft_max(_ext)  torch.softmax (of x * scale + mask);  argsort_top_k  torch.topk (indices, i32)
  add/sub/mul/div torch's operators, b repeated over a as ggml broadcasts
  swiglu          F.silu(gate) * up
  rope_ext        modes 0 (adjacent pairs) and 2 (neox halves): cos/sin of pos * inv_freq
                  computed each call (inv_freq precomputed), x * cos + rotate(x) * sin
  get_rows        index_select / gather;  set_rows  index_copy_ into the destination, in place
  reshape, sum_rows, silu, scale, cont, transpose: the obvious one-liners
Integer leaves get contents by use: mul_mat_id ids U distinct random experts per token (the
top-U of random router logits; `# bench-ids: T U E`), rope positions 0..n-1, set_rows slots
distinct random rows, get_rows ids random rows (distinct where possible).
Flops: 2*M*N*K for matrix products, 2*2*heads*n_q*n_kv*D for attention (halved when causal),
0 for the rest.
Timing: the whole graph captured once in a CUDA graph and replayed: the median over N replays
(default 50), each timed with CUDA events, after 3 eager and 5 replay warm-ups; before each
timed replay the L2 is flushed (a read of 4x its size, outside the timed span), as kiln bench
does for kiln's replays. A graph whose
ops cannot be captured (host syncs) is timed the same way, eagerly. `--device cpu` (for testing
the programs) times eager calls with time.perf_counter.
"""
import argparse
import re
import sys
import time

DT = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "i32": "int32", "i64": "int64"}


# ---------------------------------------------------------------- parsing

def split_args(text):
    """Top-level comma-separated arguments, keeping [..] lists whole."""
    args, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
            continue
        depth += (ch == "[") - (ch == "]")
        cur += ch
    if cur.strip():
        args.append(cur.strip())
    return args


def parse(path):
    """(leaves {name: (type, dims)}, ops [(out, op, positional, keyword)], bench_ids or None)."""
    leaves, ops, bench_ids = {}, [], None
    for raw in open(path):
        m = re.match(r"\s*#\s*bench-ids:\s*(\d+)\s+(\d+)\s+(\d+)", raw)
        if m:
            bench_ids = tuple(int(x) for x in m.groups())
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("kiln-graph"):
            continue
        m = re.match(r"(input|weight|state)\s+(\w+)\s*:\s*(\w+)\[([^\]]*)\]", line)
        if m:
            leaves[m.group(2)] = (m.group(3), [int(x) for x in m.group(4).split(",") if x.strip()])
            continue
        m = re.match(r"(?:output\s+)?([\w.]+)\s*=\s*(\w+)\((.*)\)$", line)
        if m:
            pos, kw = [], {}
            for a in split_args(m.group(3)):
                k = re.match(r"([A-Za-z_]\w*)\s*=\s*(.*)$", a)
                if k:
                    kw[k.group(1)] = k.group(2).strip()
                else:
                    pos.append(a)
            ops.append((m.group(1), m.group(2), pos, kw))
    return leaves, ops, bench_ids


def shape4(dims):
    """ggml ne list -> torch shape of 4 dims."""
    d = list(dims) + [1] * (4 - len(dims))
    return list(reversed(d))


def int_list(text):
    return [int(x) for x in text.strip("[] ").split(",") if x.strip()]


def arg(op, i, name, default=None):
    """Operand/parameter i of op (positional), or by name, or the default."""
    _, _, pos, kw = op
    if name in kw:
        return kw[name]
    return pos[i] if len(pos) > i else default


class Unsupported(Exception):
    """No PyTorch program for this op or these parameters."""


# ---------------------------------------------------------------- leaves

def integer_roles(ops):
    """{leaf name: (role, op)} from the first op that reads an integer operand."""
    roles = {}
    for op in ops:
        name = op[1]
        slot = {"mul_mat_id": (2, "ids"), "rope_ext": (1, "pos"), "set_rows": (2, "slots"),
                "get_rows": (1, "rows")}.get(name)
        if slot and len(op[2]) > slot[0]:
            roles.setdefault(op[2][slot[0]], (slot[1], op))
    return roles


def make_leaf(g, name, kind, dims, role):
    torch = g.torch
    shape = shape4(dims)
    if kind not in DT:
        raise Unsupported(f"PyTorch has no {kind} (ggml's quantized block format) for '{name}'")
    if kind not in ("i32", "i64"):
        x = torch.rand(shape, generator=g.gen, device=g.dev) * 2 - 1
        return x.to(getattr(torch, DT[kind]))
    dt = getattr(torch, DT[kind])
    n = dims[0]
    what = role[0] if role else None
    if what == "ids":
        E = g.leaves[role[1][2][0]][1][2]
        T = dims[1] if len(dims) > 1 else 1
        if g.bench_ids:
            T, U, E = g.bench_ids
            if U != n or T != (dims[1] if len(dims) > 1 else 1):
                raise Unsupported(f"bench-ids {T} {U} {E} disagree with {name} {dims}")
        ids = torch.stack([torch.randperm(E, generator=g.gen, device=g.dev)[:n] for _ in range(T)])
        return ids.to(dt).reshape(shape)
    if what == "pos":
        return torch.arange(n, device=g.dev, dtype=dt).reshape(shape)
    if what in ("slots", "rows"):
        src = g.leaves.get(role[1][2][0])
        rows = src[1][1] if src and len(src[1]) > 1 else n
        groups = shape[0] * shape[1] * shape[2]  # one id vector per matrix

        def pick():
            if n <= rows:
                return torch.randperm(rows, generator=g.gen, device=g.dev)[:n]
            return torch.randint(rows, (n,), generator=g.gen, device=g.dev)
        return torch.stack([pick() for _ in range(groups)]).to(dt).reshape(shape)
    return torch.zeros(shape, dtype=dt, device=g.dev)


# ---------------------------------------------------------------- ops
# Each builder gets the graph state g, the op and its operand tensors (as built so far), and
# returns (fn, flops): fn(*operands) computes the result; set-up work happens in the builder.

def repeat_like(b, a):
    """b repeated to a's shape where ggml's broadcast tiles a dim (b dim dividing a dim, not 1)."""
    reps = [sa // sb if sb not in (1, sa) else 1 for sa, sb in zip(a.shape, b.shape)]
    return b.repeat(reps) if any(r != 1 for r in reps) else b


def binary(fn):
    def build(g, op, a, b):
        def run(a, b):
            y = fn(a, repeat_like(b, a))
            return y if y.dtype == a.dtype else y.to(a.dtype)
        return run, 0
    return build


def b_mul_mat(g, op, w, b):
    F = g.F
    M, K = w.shape[-2:]
    N = b.numel() // K
    if any(s != 1 for s in w.shape[:2]):
        if w.shape[:2] != b.shape[:2]:
            raise Unsupported("mul_mat with broadcast batched weights")
        return (lambda w, b: g.torch.matmul(b.to(w.dtype), w.transpose(-1, -2))), 2 * M * N * K
    return (lambda w, b: F.linear(b.to(w.dtype), w.reshape(M, K))), 2 * M * N * K


def grouped_mm_ok(g, dtype):
    """Whether torch._grouped_mm runs on this device for this dtype (probed once)."""
    torch = g.torch
    key = str(dtype)
    if key not in g.grouped:
        ok = hasattr(torch, "_grouped_mm")
        if ok:
            try:
                x = torch.ones(32, 64, device=g.dev, dtype=dtype)
                w = torch.ones(2, 32, 64, device=g.dev, dtype=dtype).transpose(1, 2)
                offs = torch.tensor([16, 32], device=g.dev, dtype=torch.int32)
                torch._grouped_mm(x, w, offs=offs)
            except Exception:  # noqa: BLE001  (no kernel for this device or dtype)
                ok = False
        g.grouped[key] = ok
    return g.grouped[key]


def b_mul_mat_id(g, op, As, b, ids):
    torch = g.torch
    E, M, K = As.shape[1:]
    T, U = ids.shape[-2:]
    B1 = b.shape[-2]
    W = As[0]                                    # (E, M, K)
    flops = 2 * T * U * M * K
    if grouped_mm_ok(g, As.dtype):
        Wt = W.transpose(1, 2)                   # (E, K, M), column-major inner dims
        ones = torch.ones(T * U, dtype=torch.int32, device=g.dev)

        def grouped(As, b, ids):
            flat = ids.reshape(-1).long()
            order = torch.argsort(flat, stable=True)
            x = b.reshape(T, B1, K)[order // U, (order % U) % B1].to(As.dtype)
            counts = torch.zeros(E, dtype=torch.int32, device=g.dev).scatter_add_(0, flat, ones)
            offs = torch.cumsum(counts, 0, dtype=torch.int32)
            y = torch._grouped_mm(x, Wt, offs=offs)
            return torch.empty_like(y).index_copy_(0, order, y).reshape(1, T, U, M)
        try:
            grouped(As, b, ids)
            return grouped, flops
        except RuntimeError:                     # shapes it does not take (alignment): bmm
            pass
    tok = torch.arange(T * U, device=g.dev) // U
    slot = torch.arange(T * U, device=g.dev) % U % B1

    def gathered(As, b, ids):
        flat = ids.reshape(-1).long()
        x = b.reshape(T, B1, K)[tok, slot].to(As.dtype)
        return torch.bmm(W[flat], x.unsqueeze(-1)).reshape(1, T, U, M)
    return gathered, flops


def b_flash_attn_ext(g, op, q, k, v, *_):
    F = g.F
    if float(arg(op, 5, "max_bias", 0)) != 0 or float(arg(op, 6, "logit_softcap", 0)) != 0:
        raise Unsupported("flash_attn_ext with max_bias or logit_softcap")
    scale = float(arg(op, 4, "scale", 1.0))
    m = arg(op, 3, "mask")
    has_mask = m is not None and (m in g.leaves or m in g.defined)
    nq, nkv = q.shape[-2], k.shape[-2]
    causal = has_mask and nq == nkv and nq > 1
    hq, hkv = q.shape[1], k.shape[1]
    pairs = nq * nkv / (2 if causal else 1)
    flops = int(2 * 2 * q.shape[0] * hq * pairs * q.shape[-1])

    def attn(q, k, v, *_):
        o = F.scaled_dot_product_attention(q.to(k.dtype), k, v, is_causal=causal, scale=scale,
                                           enable_gqa=hq != hkv)
        return o.transpose(1, 2)                 # ggml's result is [D, heads, n_q, seq]
    return attn, flops


def b_rms_norm(g, op, x):
    F = g.F
    eps = float(arg(op, 1, "eps", 1e-6))
    if hasattr(F, "rms_norm"):
        return (lambda x: F.rms_norm(x, (x.shape[-1],), eps=eps)), 0
    torch = g.torch
    return (lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)), 0


def b_norm(g, op, x):
    eps = float(arg(op, 1, "eps", 1e-5))
    return (lambda x: g.F.layer_norm(x, (x.shape[-1],), eps=eps)), 0


def b_swiglu(g, op, a, b=None):
    F = g.F
    if b is None:                                # swiglu(x): halves of x
        n = a.shape[-1] // 2
        return (lambda a: F.silu(a[..., :n]) * a[..., n:]), 0
    return (lambda a, b: F.silu(a) * b), 0


def b_soft_max_ext(g, op, x, *rest):
    torch = g.torch
    if float(arg(op, 3, "max_bias", 0)) != 0 or "sinks" in op[3]:
        raise Unsupported("soft_max_ext with max_bias or sinks")
    scale = float(arg(op, 2, "scale", 1.0))
    if not rest:
        return (lambda x: torch.softmax(x * scale if scale != 1 else x, dim=-1)), 0
    n1 = x.shape[-2]
    return (lambda x, m: torch.softmax(x * scale + m[..., :n1, :].to(x.dtype), dim=-1)), 0


def b_argsort_top_k(g, op, x):
    torch = g.torch
    k = int(arg(op, 1, "k"))
    return (lambda x: torch.topk(x, k, dim=-1).indices.to(torch.int32)), 0


def b_reshape(g, op, x):
    shape = shape4(int_list(arg(op, 1, "ne")))
    return (lambda x: x.reshape(shape)), 0


def b_get_rows(g, op, a, idx):
    torch = g.torch
    if idx.shape[1] == 1 and idx.shape[2] == 1:  # one id vector: an embedding lookup
        return (lambda a, idx: a.index_select(2, idx.reshape(-1))), 0
    D = a.shape[-1]

    def gather(a, idx):
        i = idx[0].unsqueeze(-1).long()          # (ne3, ne2, n, 1)
        return torch.gather(a, 2, i.expand(*i.shape[:3], D))
    return gather, 0


def b_set_rows(g, op, dst, rows, idx):
    if idx.shape[1] != 1 or idx.shape[2] != 1 or dst.shape[:2] != rows.shape[:2]:
        raise Unsupported("set_rows with per-matrix ids")
    return (lambda dst, rows, idx: dst.index_copy_(2, idx.reshape(-1).long(), rows.to(dst.dtype))), 0


def b_rope_ext(g, op, x, pos, *_):
    torch = g.torch
    mode = int(arg(op, 4, "mode", 0))
    n = int(arg(op, 3, "n_dims"))
    if mode not in (0, 2):
        raise Unsupported(f"rope_ext mode {mode}")
    ff = arg(op, 2, "freq_factors")
    if (ff in g.leaves or ff in g.defined) or float(arg(op, 9, "ext_factor", 0)) != 0:
        raise Unsupported("rope_ext with freq_factors or YaRN")
    base = float(arg(op, 7, "freq_base", 10000))
    fscale = float(arg(op, 8, "freq_scale", 1))
    inv_freq = fscale / base ** (torch.arange(0, n, 2, device=g.dev, dtype=torch.float32) / n)
    D = x.shape[-1]

    def rotate(r):
        if mode == 2:                            # neox: (i, i + n/2)
            return torch.cat((-r[..., n // 2:], r[..., :n // 2]), dim=-1)
        return torch.stack((-r[..., 1::2], r[..., 0::2]), dim=-1).flatten(-2)  # (2i, 2i+1)

    def rope(x, pos, *_):
        ang = pos.reshape(-1, 1).float() * inv_freq                  # (tokens, n/2)
        ang = torch.cat((ang, ang), -1) if mode == 2 else ang.repeat_interleave(2, -1)
        cos, sin = ang.cos()[:, None, :].to(x.dtype), ang.sin()[:, None, :].to(x.dtype)
        r = x[..., :n]
        y = r * cos + rotate(r) * sin
        return y if n == D else torch.cat((y, x[..., n:]), dim=-1)
    return rope, 0


def b_scale(g, op, x):
    s, bias = float(arg(op, 1, "s", 1)), float(arg(op, 2, "b", 0))
    return (lambda x: x * s + bias), 0


def simple(fn):
    return lambda g, op, *t: (fn(g), 0)


BUILDERS = {
    "mul_mat": b_mul_mat,
    "mul_mat_id": b_mul_mat_id,
    "flash_attn_ext": b_flash_attn_ext,
    "rms_norm": b_rms_norm,
    "norm": b_norm,
    "add": binary(lambda a, b: a + b),
    "sub": binary(lambda a, b: a - b),
    "mul": binary(lambda a, b: a * b),
    "div": binary(lambda a, b: a / b),
    "swiglu": b_swiglu,
    "soft_max": b_soft_max_ext,
    "soft_max_ext": b_soft_max_ext,
    "argsort_top_k": b_argsort_top_k,
    "reshape": b_reshape,
    "get_rows": b_get_rows,
    "set_rows": b_set_rows,
    "rope_ext": b_rope_ext,
    "sum_rows": simple(lambda g: lambda x: x.sum(-1, keepdim=True)),
    "silu": simple(lambda g: g.F.silu),
    "scale": b_scale,
    "cont": simple(lambda g: lambda x: x.contiguous()),
    "transpose": simple(lambda g: lambda x: x.transpose(-1, -2)),
}


# ---------------------------------------------------------------- graphs

class Graph:
    """One graph's leaves, built op programs and values."""

    def __init__(self, torch, F, dev, path, grouped_cache):
        self.torch, self.F, self.dev = torch, F, dev
        self.leaves, self.ops, self.bench_ids = parse(path)
        self.gen = torch.Generator(device=dev).manual_seed(1)
        self.grouped = grouped_cache
        self.defined = set()
        self.values = {}
        self.steps = []                          # (out, fn, operand names)
        self.flops = 0

    def operands(self, op):
        """Names of op's tensor operands: positional names and named tensor parameters."""
        _, _, pos, kw = op
        names = [a for a in pos if a in self.leaves or a in self.defined]
        names += [v for k, v in kw.items() if k in ("mask", "sinks", "freq_factors", "b")
                  and (v in self.leaves or v in self.defined)]
        return names

    def build(self):
        """Make the leaves, then each op's program, running it once (eagerly) for the shapes."""
        if not self.ops:
            raise Unsupported("no op in graph")
        roles = integer_roles(self.ops)
        for name, (kind, dims) in self.leaves.items():
            self.values[name] = make_leaf(self, name, kind, dims, roles.get(name))
        for op in self.ops:
            out, name = op[0], op[1]
            if name not in BUILDERS:
                raise Unsupported(f"no PyTorch program for {name}")
            names = self.operands(op)
            fn, flops = BUILDERS[name](self, op, *(self.values[n] for n in names))
            self.values[out] = fn(*(self.values[n] for n in names))
            self.defined.add(out)
            self.steps.append((out, fn, names))
            self.flops += flops

    def run(self):
        env = dict(self.values)
        for out, fn, names in self.steps:
            env[out] = fn(*(env[n] for n in names))
        return env


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


class L2Flush:
    """Evicts the L2 before a timed run, as kiln bench's flush does: a read of 4x its size (a
    write would leave dirty lines that the timed kernel would have to write back)."""

    def __init__(self, torch):
        l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0)
        self.buf = torch.full((4 * (l2 or 64 << 20) // 4,), 1, dtype=torch.int32, device="cuda")
        self.torch = torch

    def __call__(self):
        self.buf.max()
        self.torch.cuda.synchronize()


def time_cuda(torch, fn, iters, flush):
    """(median ms, captured): fn replayed from a CUDA graph, else run eagerly; the L2 flushed
    (outside the timed span) before each timed run."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    run, captured = fn, False
    try:
        cg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cg):
            fn()
        cg.replay()
        torch.cuda.synchronize()
        run, captured = cg.replay, True
    except Exception:  # noqa: BLE001  (ops that sync cannot be captured: time them eagerly)
        torch.cuda.synchronize()
    for _ in range(5):
        run()
    times = []
    a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(iters):
        flush()
        a.record()
        run()
        e.record()
        e.synchronize()
        times.append(a.elapsed_time(e))
    return median(times), captured


def time_cpu(fn, iters):
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return median(times), False


def one_line(text):
    return text.replace("\n", " ")[:200]


def bench_graph(torch, F, path, dev, iters, grouped_cache, flush):
    """The output line for one graph."""
    g = None
    try:
        g = Graph(torch, F, dev, path, grouped_cache)
        g.build()
        if dev == "cuda":
            ms, captured = time_cuda(torch, g.run, iters, flush)
        else:
            ms, captured = time_cpu(g.run, iters)
        return f"{path} ms={ms:.4f} flops={g.flops}{'' if captured else ' eager'}"
    except Unsupported as e:
        return f"{path} skip: {e}"
    except Exception as e:  # noqa: BLE001  (OOM, a shape torch refuses, ...: one line, go on)
        return f"{path} skip: {one_line(f'{e.__class__.__name__}: {e}')}"
    finally:
        del g
        if dev == "cuda":
            try:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            except Exception:  # noqa: BLE001
                pass


def main(argv):
    ap = argparse.ArgumentParser(description="PyTorch's time for kiln bench graphs")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("graphs", nargs="+")
    a = ap.parse_args(argv)
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001
        for p in a.graphs:
            print(f"{p} skip: no PyTorch ({e.__class__.__name__})", flush=True)
        return 0
    if a.device == "cuda" and not torch.cuda.is_available():
        for p in a.graphs:
            print(f"{p} skip: PyTorch sees no GPU", flush=True)
        return 0
    grouped_cache = {}
    flush = L2Flush(torch) if a.device == "cuda" else None
    for p in a.graphs:
        print(bench_graph(torch, F, p, a.device, max(1, a.iters), grouped_cache, flush), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
