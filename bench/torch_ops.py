#!/usr/bin/env python3
"""PyTorch's time for the computation of a one-op kiln graph (bench/ops/*.kg), for side-by-side
tables (scripts/bench-ops.sh). Prints one line: `ms=<median ms> flops=<useful flops>`, or
`skip: <why>` when PyTorch or the op is not available.

The graph is read with a small parser of the .kg subset the bench graphs use (input/weight
declarations and one op). ggml dims reversed are torch dims. The torch program is what a
PyTorch user would write for the same math, in the weights' dtype:
  mul_mat        F.linear(b.to(w.dtype), w)                       (b cast included)
  mul_mat_id     torch._grouped_mm over tokens sorted by expert   (routing included), else
                 gather + bmm
  flash_attn_ext F.scaled_dot_product_attention(enable_gqa=True); causal when the graph has a
                 mask and n_q == n_kv > 1, no mask otherwise
  other ops      skipped
Timing: the op captured in a CUDA graph, replayed; median of the replays (kiln's bench also
replays a CUDA graph), after warm-up.
"""
import re
import sys

DT = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "i32": "int32", "i64": "int64"}


def parse(path):
    leaves, op = {}, None
    for raw in open(path):
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("kiln-graph"):
            continue
        m = re.match(r"(input|weight)\s+(\w+)\s*:\s*(\w+)\[([^\]]*)\]", line)
        if m:
            leaves[m.group(2)] = (m.group(3), [int(x) for x in m.group(4).split(",") if x.strip()])
            continue
        m = re.match(r"(?:output\s+)?(\w+)\s*=\s*(\w+)\((.*)\)", line)
        if m:
            pos, kw = [], {}
            for a in [x.strip() for x in m.group(3).split(",") if x.strip()]:
                if "=" in a:
                    k, v = a.split("=", 1)
                    kw[k.strip()] = v.strip()
                else:
                    pos.append(a)
            op = (m.group(2), pos, kw)
    return leaves, op


def main():
    if len(sys.argv) != 2:
        print("usage: torch_ops.py GRAPH.kg", file=sys.stderr)
        return 2
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001
        print(f"skip: no PyTorch ({e.__class__.__name__})")
        return 0
    if not torch.cuda.is_available():
        print("skip: PyTorch sees no GPU")
        return 0
    leaves, op = parse(sys.argv[1])
    if not op:
        print("skip: no op in graph")
        return 0
    name, pos, kw = op
    gen = torch.Generator(device="cuda").manual_seed(1)

    def leaf(n, scale=1.0):
        t, dims = leaves[n]
        shape = list(reversed(dims))
        if t in ("i32", "i64"):
            raise ValueError("integer leaf")
        x = (torch.rand(shape, generator=gen, device="cuda") * 2 - 1) * scale
        return x.to(getattr(torch, DT[t]))

    if name == "mul_mat":
        w, b = leaf(pos[0]), leaf(pos[1])
        M, K = w.shape[-2], w.shape[-1]
        N = b.numel() // K
        if w.dim() > 2 and any(s != 1 for s in w.shape[:-2]):
            print("skip: batched weights")
            return 0
        w2 = w.reshape(M, K)
        fn = lambda: F.linear(b.to(w2.dtype), w2)  # noqa: E731
        flops = 2 * M * N * K
    elif name == "mul_mat_id":
        As, b = leaf(pos[0]), leaf(pos[1])
        E, M, K = As.shape
        U, T = leaves[pos[2]][1][0], leaves[pos[2]][1][1]
        # Distinct random experts per token, like a router's top-k.
        ids = torch.stack([torch.randperm(E, generator=gen, device="cuda")[:U] for _ in range(T)]).int()
        B1 = b.shape[1]
        grouped = hasattr(torch, "_grouped_mm")
        wt = As.transpose(1, 2)  # (E, K, M), column-major inner dims, as grouped mm wants

        def moe():
            flat = ids.flatten().long()
            order = torch.argsort(flat, stable=True)
            x = b[order // U, (order % U) % B1].to(As.dtype)
            if grouped:
                counts = torch.zeros(E, dtype=torch.int32, device="cuda").scatter_add_(
                    0, flat, torch.ones_like(flat, dtype=torch.int32))
                offs = torch.cumsum(counts, 0, dtype=torch.int32)
                y = torch._grouped_mm(x, wt, offs=offs)
            else:
                y = torch.bmm(As[flat[order]], x.unsqueeze(-1)).squeeze(-1)
            out = torch.empty_like(y)
            out[order] = y
            return out

        fn = moe
        flops = 2 * T * U * M * K
    elif name == "flash_attn_ext":
        q, k, v = leaf(pos[0]), leaf(pos[1]), leaf(pos[2])
        scale = float(kw.get("scale", pos[4] if len(pos) > 4 else 1.0))
        has_mask = "mask" in kw or (len(pos) > 3 and pos[3] in leaves)
        nq, nkv = q.shape[-2], k.shape[-2]
        causal = has_mask and nq == nkv and nq > 1
        qd = q.to(k.dtype)
        fn = lambda: F.scaled_dot_product_attention(qd, k, v, is_causal=causal, scale=scale,  # noqa: E731
                                                    enable_gqa=q.shape[1] != k.shape[1])
        pairs = nq * nkv / (2 if causal else 1)
        flops = int(2 * 2 * q.shape[0] * q.shape[1] * pairs * q.shape[-1])
    else:
        print(f"skip: no PyTorch program for {name}")
        return 0

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    times = []
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    except Exception:  # noqa: BLE001  (ops that sync cannot be captured: time them eagerly)
        run = fn
    for _ in range(5):
        run()
    for _ in range(50):
        a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        e.record()
        e.synchronize()
        times.append(a.elapsed_time(e))
    times.sort()
    print(f"ms={times[len(times) // 2]:.4f} flops={flops}" + ("" if run is not fn else " eager"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
