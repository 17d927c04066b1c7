#!/usr/bin/env python3
"""kiln against ggml's own Python GGUF package (gguf-py, from llama.cpp): files it writes and
quantizes load in kiln, and kiln's quantized files read the same through its dequantizer.

usage: gguf_py.py KILN_BINARY

Each case runs `kiln run FILE --cpu` (the CPU reference: ggml's dequantization, sums in double)
on a quantized file and on the same model with every tensor dequantized to f32 by gguf-py
(gguf.quants.dequantize, ggml's reference in numpy), and requires the same generated tokens
and the same prompt logits bit for bit (`--dump-logits`, f32 little-endian). The quantized side is:
  - gguf-py: kiln gen-model's f32 tiny llama rewritten by gguf.GGUFWriter, its matrices
    quantized by gguf.quants.quantize to q8_0, q4_0, q5_0 and q5_1 (the file types llama-quantize
    names 7, 2, 8 and 9);
  - gguf-py: kiln gen-model's f32 tiny gpt-oss with its experts (the 3-D weights) quantized by
    gguf.quants.quantize to mxfp4 (file type 38, MXFP4_MOE);
  - kiln: kiln gen-model --type q4_k_m, q5_k_m, q6_k (gguf-py reads them; it has no K-quant
    quantizer, so for these types the check is kiln's dequantization against gguf-py's; the tiny
    llama's rows of 128 make these files mostly q5_0 and q5_1, llama-quantize's fallback), q8_0,
    q4_0, q5_0, q5_1, and the tiny gpt-oss as mxfp4_moe.
Exit status 0 when every case agrees; each case prints one line.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import gguf

PROMPT = "1,17,300,5,999,42"
N_GEN = 8


def run(kiln, *args):
    p = subprocess.run([kiln, *args], capture_output=True, text=True, errors="replace")
    if p.returncode != 0:
        sys.exit(f"kiln {' '.join(args)} failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    return p.stdout


def generate(kiln, path, logits):
    out = run(kiln, "run", path, "--cpu", "--tokens", PROMPT, "-n", str(N_GEN), "--dump-logits", logits)
    for line in out.splitlines():
        if line.startswith("generated:"):
            return line.split(":", 1)[1].split()
    sys.exit(f"kiln run {path}: no 'generated:' line in\n{out}")


def copy_metadata(r, w, file_type):
    """Every key of reader r into writer w, as gguf-py's own gguf_new_metadata.py copies them."""
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == gguf.Keys.General.ARCHITECTURE:
            continue
        if f.name == gguf.Keys.General.FILE_TYPE and file_type is not None:
            w.add_uint32(f.name, file_type)
            continue
        sub = f.types[1] if len(f.types) > 1 else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub)


def rewrite(src, dst, tensor_fn, file_type=None):
    """dst = src with each tensor's data from tensor_fn(tensor) -> (array, qtype or None)."""
    r = gguf.GGUFReader(src)
    arch = r.fields[gguf.Keys.General.ARCHITECTURE].contents()
    w = gguf.GGUFWriter(dst, arch)
    copy_metadata(r, w, file_type)
    for t in r.tensors:
        data, qtype = tensor_fn(t)
        if qtype is None:
            w.add_tensor(t.name, data)
        else:
            w.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantizable(t):
    """The matrices llama-quantize quantizes: 2-D weights but the norms (1-D anyway)."""
    return len(t.shape) >= 2 and t.tensor_type == gguf.GGMLQuantizationType.F32


def as_f32(t):
    if t.tensor_type == gguf.GGMLQuantizationType.F32:
        return np.array(t.data, dtype=np.float32), None
    return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32), None


def check(kiln, label, qpath, tmp):
    fpath = os.path.join(tmp, "f32_" + os.path.basename(qpath))
    rewrite(qpath, fpath, as_f32, file_type=0)
    lq, lf = os.path.join(tmp, "lq.bin"), os.path.join(tmp, "lf.bin")
    tq, tf = generate(kiln, qpath, lq), generate(kiln, fpath, lf)
    if tq != tf:
        sys.exit(f"{label}: tokens {tq} from the quantized file, {tf} from gguf-py's dequantization")
    a, b = np.fromfile(lq, dtype="<f4"), np.fromfile(lf, dtype="<f4")
    if a.size == 0 or a.size != b.size or not np.array_equal(a, b):
        bad = int(np.argmax(a != b)) if a.size == b.size and a.size else -1
        sys.exit(f"{label}: prompt logits differ ({a.size} vs {b.size} values, first at {bad})")
    print(f"ok  {label}: {N_GEN} tokens and {a.size} prompt logits identical to gguf-py's dequantization")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    kiln = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "base.gguf")
        run(kiln, "gen-model", "--arch", "llama", "--preset", "tiny", "--type", "f32", "-o", base)
        for name, qtype, ftype in (("q8_0", gguf.GGMLQuantizationType.Q8_0, 7),
                                   ("q4_0", gguf.GGMLQuantizationType.Q4_0, 2),
                                   ("q5_0", gguf.GGMLQuantizationType.Q5_0, 8),
                                   ("q5_1", gguf.GGMLQuantizationType.Q5_1, 9)):
            def quantize(t, qtype=qtype):
                data = np.array(t.data, dtype=np.float32)
                if not quantizable(t):
                    return data, None
                return gguf.quants.quantize(data, qtype), qtype
            q = os.path.join(tmp, f"gguf_py_{name}.gguf")
            rewrite(base, q, quantize, file_type=ftype)
            check(kiln, f"gguf-py {name} file", q, tmp)
        moe = os.path.join(tmp, "base_moe.gguf")
        run(kiln, "gen-model", "--arch", "gpt-oss", "--preset", "tiny", "--type", "f32", "-o", moe)

        def experts_mxfp4(t):
            data = np.array(t.data, dtype=np.float32)
            if len(t.shape) != 3 or t.tensor_type != gguf.GGMLQuantizationType.F32:
                return data, None
            return gguf.quants.quantize(data, gguf.GGMLQuantizationType.MXFP4), gguf.GGMLQuantizationType.MXFP4
        q = os.path.join(tmp, "gguf_py_mxfp4.gguf")
        rewrite(moe, q, experts_mxfp4, file_type=38)
        check(kiln, "gguf-py gpt-oss with mxfp4 experts", q, tmp)
        for arch, ftype in (("llama", "q4_k_m"), ("llama", "q5_k_m"), ("llama", "q6_k"), ("llama", "q8_0"),
                            ("llama", "q4_0"), ("llama", "q5_0"), ("llama", "q5_1"),
                            ("gpt-oss", "mxfp4_moe")):
            q = os.path.join(tmp, f"kiln_{arch}_{ftype}.gguf")
            run(kiln, "gen-model", "--arch", arch, "--preset", "tiny", "--type", ftype, "-o", q)
            kinds = sorted({gguf.GGMLQuantizationType(t.tensor_type).name for t in gguf.GGUFReader(q).tensors})
            check(kiln, f"kiln {arch} {ftype} file ({', '.join(kinds)})", q, tmp)


if __name__ == "__main__":
    main()
