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
  other ops      skipped; a graph of several ops runs them one after the other
Timing: the op captured in a CUDA graph, replayed; median of the replays (kiln's bench also
replays a CUDA graph), after warm-up.
"""
import re
import sys

DT = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "i32": "int32", "i64": "int64"}


def parse(path):
    leaves, ops = {}, []
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
            ops.append((m.group(2), pos, kw))
    return leaves, ops


def program(torch, F, gen, leaves, op):
    """(fn, flops) that computes op in PyTorch, or a string saying why there is none."""
    name, pos, kw = op

    def leaf(n):
        t, dims = leaves[n]
        if t in ("i32", "i64"):
            raise ValueError(f"integer leaf {n}")
        x = torch.rand(list(reversed(dims)), generator=gen, device="cuda") * 2 - 1
        return x.to(getattr(torch, DT[t]))

    if name == "mul_mat":
        w, b = leaf(pos[0]), leaf(pos[1])
        M, K = w.shape[-2], w.shape[-1]
        N = b.numel() // K
        if w.dim() > 2 and any(s != 1 for s in w.shape[:-2]):
            return "batched weights"
        w2 = w.reshape(M, K)
        return (lambda: F.linear(b.to(w2.dtype), w2)), 2 * M * N * K
    if name == "mul_mat_id":
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

        return moe, 2 * T * U * M * K
    if name == "flash_attn_ext":
        # ggml [D, n, heads, seq] reversed is torch's (seq, heads, n, D): make it 4-D.
        q, k, v = (leaf(pos[i]).reshape([1] * (4 - len(leaves[pos[i]][1])) + list(reversed(leaves[pos[i]][1])))
                   for i in range(3))
        scale = float(kw.get("scale", pos[4] if len(pos) > 4 else 1.0))
        has_mask = "mask" in kw or (len(pos) > 3 and pos[3] in leaves)
        nq, nkv = q.shape[-2], k.shape[-2]
        causal = has_mask and nq == nkv and nq > 1
        qd = q.to(k.dtype)
        hq, hkv = q.shape[1], k.shape[1]
        pairs = nq * nkv / (2 if causal else 1)
        flops = int(2 * 2 * q.shape[0] * hq * pairs * q.shape[-1])
        return (lambda: F.scaled_dot_product_attention(qd, k, v, is_causal=causal, scale=scale,
                                                       enable_gqa=hq != hkv)), flops
    return f"no PyTorch program for {name}"


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
    leaves, ops = parse(sys.argv[1])
    if not ops:
        print("skip: no op in graph")
        return 0
    gen = torch.Generator(device="cuda").manual_seed(1)
    fns, flops = [], 0
    for op in ops:  # the graph's ops, one after the other (bench graphs read leaves only)
        try:
            got = program(torch, F, gen, leaves, op)
        except Exception as e:  # noqa: BLE001
            got = f"{op[0]}: {e.__class__.__name__}: {e}".replace("\n", " ")[:200]
        if isinstance(got, str):
            print(f"skip: {got}")
            return 0
        fns.append(got[0])
        flops += got[1]

    def fn():
        for f in fns:
            f()

    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        print(f"skip: {e.__class__.__name__}: {e}".replace("\n", " ")[:200])
        return 0
    run, how = fn, " eager"
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        torch.cuda.synchronize()
        run, how = g.replay, ""
    except Exception:  # noqa: BLE001  (ops that sync cannot be captured: time them eagerly)
        torch.cuda.synchronize()
    times = []
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
    print(f"ms={times[len(times) // 2]:.4f} flops={flops}{how}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
