#!/usr/bin/env python3
"""Expert ids for the mul_mat_id benchmarks (bench/ops/mul_mat_id_*.kg), and PyTorch's time for
the same MoE products with the same ids, for a same-run comparison.

  moe-ids.py ids T U E SEED FILE
      Writes ids i32 [U, T] in ggml order (token t's U experts at t*U .. t*U+U-1), raw
      little-endian, for `kiln run GRAPH --input ids=FILE`: per token U distinct experts drawn
      uniformly, i.e. the top-U of random router logits.
  moe-ids.py torch T FILE [ITERS]
      Times PyTorch (bf16 weights, CUDA graphs) on the Qwen3-30B-A3B-like shapes of the bench
      graphs (128 experts, top-8; gate/up [E, 768, 2048], down [E, 2048, 768]) with the ids in
      FILE (T tokens, U = 8):
        T == 1: per used expert one F.linear (8 GEMVs), gate + up + down in one graph, and each;
        T > 1:  a loop over experts (index_select of the tokens, matmul, index_put), and
                torch._grouped_mm over the tokens sorted by expert (if this torch has it).
      Activations enter as f32 and are converted to bf16 inside the timed region, as kiln does.
"""
import random
import statistics
import struct
import sys

E, U, D_MODEL, D_FF = 128, 8, 2048, 768


def make_ids(T, U_, E_, seed):
    r = random.Random(seed)
    ids = []
    for _ in range(T):
        ids += r.sample(range(E_), U_)
    return ids


def cmd_ids(args):
    T, U_, E_, seed = (int(a) for a in args[:4])
    ids = make_ids(T, U_, E_, seed)
    with open(args[4], "wb") as f:
        f.write(struct.pack("<%di" % len(ids), *ids))


def timed(torch, fn, iters):
    """Median ms of one replay of fn captured in a CUDA graph (and of fn run eagerly)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def med(run):
        ts = []
        for _ in range(iters):
            a.record()
            run()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        return statistics.median(ts)

    return med(g.replay), med(fn)


def cmd_torch(args):
    import torch
    import torch.nn.functional as F

    T = int(args[0])
    iters = int(args[2]) if len(args) > 2 else 50
    with open(args[1], "rb") as f:
        raw = f.read()
    ids_host = list(struct.unpack("<%di" % (len(raw) // 4), raw))
    assert len(ids_host) == T * U, "ids file has %d ids, want %d" % (len(ids_host), T * U)
    dev = "cuda"
    torch.manual_seed(0)
    bf = torch.bfloat16
    wg = torch.randn(E, D_FF, D_MODEL, device=dev, dtype=bf)  # [E, M, K], ggml's as [K, M, E]
    wu = torch.randn(E, D_FF, D_MODEL, device=dev, dtype=bf)
    wd = torch.randn(E, D_MODEL, D_FF, device=dev, dtype=bf)
    x = torch.randn(T, D_MODEL, device=dev)      # b [2048, 1, T]
    h = torch.randn(T, U, D_FF, device=dev)      # b [768, 8, T]
    ids = torch.tensor(ids_host, device=dev, dtype=torch.long).view(T, U)
    print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name()))
    read_bytes = lambda m, k: len(set(ids_host)) * m * k * 2  # each used expert's weights once

    if T == 1:
        used = ids_host[:U]
        og = torch.empty(U, D_FF, device=dev)
        ou = torch.empty(U, D_FF, device=dev)
        od = torch.empty(U, D_MODEL, device=dev)

        def gate():
            xb = x[0].to(bf)
            for u, e in enumerate(used):
                og[u] = F.linear(xb, wg[e])

        def up():
            xb = x[0].to(bf)
            for u, e in enumerate(used):
                ou[u] = F.linear(xb, wu[e])

        def down():
            hb = h[0].to(bf)
            for u, e in enumerate(used):
                od[u] = F.linear(hb[u], wd[e])

        def all3():
            gate()
            up()
            down()

        tot = 3 * U * D_FF * D_MODEL * 2
        for name, fn, nbytes in (("gate+up+down", all3, tot), ("gate", gate, tot // 3), ("down", down, tot // 3)):
            g_ms, e_ms = timed(torch, fn, iters)
            print("torch decode %-13s loop of F.linear: %.4f ms (graph) %.4f ms (eager); %.1f MB read -> %.0f GB/s"
                  % (name, g_ms, e_ms, nbytes / 1e6, nbytes / 1e6 / g_ms))
        return

    # Prefill: the (token, slot) pairs of each expert, found once outside the timed region.
    flat = ids.view(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=E)
    offs = torch.cumsum(counts, 0).to(torch.int32)
    tok, slot = order // U, order % U
    lists = []
    start = 0
    for e, c in enumerate(counts.tolist()):
        if c:
            lists.append((e, tok[start:start + c], slot[start:start + c]))
        start += c

    def loop(w, xin, per_slot, out):
        xb = xin.to(bf)
        for e, tt, uu in lists:
            xe = xb[tt, uu] if per_slot else xb.index_select(0, tt)
            out[tt, uu] = xe @ w[e].t()

    def grouped(w_t, xin, per_slot, out):
        xb = xin.to(bf)
        xs = xb[tok, slot] if per_slot else xb.index_select(0, tok)
        ys = torch._grouped_mm(xs, w_t, offs=offs)
        out[tok, slot] = ys

    for name, w, xin, per_slot, m, k in (("gate", wg, x, False, D_FF, D_MODEL), ("down", wd, h, True, D_MODEL, D_FF)):
        out = torch.empty(T, U, m, device=dev, dtype=bf)
        nbytes = read_bytes(m, k)
        flops = 2 * T * U * m * k
        g_ms, e_ms = timed(torch, lambda: loop(w, xin, per_slot, out), iters)
        print("torch prefill %s loop over experts: %.4f ms (graph) %.4f ms (eager); %.0f GB/s, %.1f TFLOP/s"
              % (name, g_ms, e_ms, nbytes / 1e6 / g_ms, flops / 1e9 / g_ms))
        if hasattr(torch, "_grouped_mm"):
            try:
                w_t = w.transpose(1, 2)  # [E, K, M], column-major
                g_ms, e_ms = timed(torch, lambda: grouped(w_t, xin, per_slot, out), iters)
                print("torch prefill %s _grouped_mm: %.4f ms (graph) %.4f ms (eager); %.0f GB/s, %.1f TFLOP/s"
                      % (name, g_ms, e_ms, nbytes / 1e6 / g_ms, flops / 1e9 / g_ms))
            except Exception as ex:  # an older torch, or shapes it does not take
                print("torch prefill %s _grouped_mm failed: %s" % (name, str(ex).splitlines()[0]))


def main():
    if len(sys.argv) >= 7 and sys.argv[1] == "ids":
        cmd_ids(sys.argv[2:])
    elif len(sys.argv) >= 4 and sys.argv[1] == "torch":
        cmd_torch(sys.argv[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
