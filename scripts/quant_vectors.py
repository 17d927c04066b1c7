#!/usr/bin/env python3
"""Test vectors of ggml's dequantize_row_* (ggml/src/ggml-quants.c) for the quantized types kiln
reads: q8_0, q4_0, q4_K, q5_K, q6_K, mxfp4, q5_0, q5_1. Writes tests/quant_vectors.h (run from the repository root:
`scripts/quant_vectors.py > tests/quant_vectors.h`), which tests/test_quant.c compares against
kb_dequant_row and kb_dequant_elem bit for bit.

The vectors are made independently of kiln's C code: the block layouts come from ggml-common.h
and the formulas from ggml's dequantize_row_*, in the same order of operations, in binary32
arithmetic. Pure Python, no numpy: every operation is done in binary64 and rounded once to
binary32 with struct (round to nearest even). That is exact binary32 arithmetic: a product of
two binary32 values is exact in binary64, and for + and - the double rounding binary64 ->
binary32 is innocuous because 53 >= 2 * 24 + 2 (Figueroa, 1995). f16 values are decoded by
struct's 'e' format (exact, subnormals, inf included).

Blocks: random bytes from a fixed seed (so every bit of the 6-bit scale/min packing of the
K-quants, j < 4 and j >= 4, every q5_K high bit and all four q6_K quarters occur), plus hand-
made edge cases: negative, zero, subnormal, largest and infinite f16 scales and mins, all-ones
and all-zero scale bytes and high bits, q6_K sub-scales -128 and 127. A NaN result (inf * 0) is
written as 0x7fc00000; the test accepts any NaN there (x86 makes a negative one).
"""
import random
import struct
import sys

SEED = 25


def f32(x):
    """x rounded to binary32 (to nearest even), overflow to +-inf, NaN kept."""
    if x != x:
        return x
    try:
        return struct.unpack('<f', struct.pack('<f', x))[0]
    except OverflowError:  # struct refuses a result that rounds to inf
        return float('inf') if x > 0 else float('-inf')


def bits(x):
    if x != x:
        return 0x7fc00000
    return struct.unpack('<I', struct.pack('<f', x))[0]


def half(b, off):
    return struct.unpack('<e', bytes(b[off:off + 2]))[0]


def i8(v):
    return v - 256 if v > 127 else v


# ---- ggml's dequantize_row_* for one block, in binary32 ----------------------------------------

def deq_q8_0(b):
    d = half(b, 0)
    return [f32(i8(b[2 + j]) * d) for j in range(32)]


def deq_q4_0(b):
    d = half(b, 0)
    y = [0.0] * 32
    for j in range(16):
        y[j] = f32(((b[2 + j] & 0xF) - 8) * d)
        y[j + 16] = f32(((b[2 + j] >> 4) - 8) * d)
    return y


def q5_codes(b, qh_off, qs_off):
    """q5_0/q5_1: ggml's xh_0 = ((qh >> j) << 4) & 0x10, xh_1 = (qh >> (j + 12)) & 0x10."""
    qh = struct.unpack('<I', bytes(b[qh_off:qh_off + 4]))[0]
    x = [0] * 32
    for j in range(16):
        x[j] = (b[qs_off + j] & 0xF) | (((qh >> j) << 4) & 0x10)
        x[j + 16] = (b[qs_off + j] >> 4) | ((qh >> (j + 12)) & 0x10)
    return x


def deq_q5_0(b):
    d = half(b, 0)
    return [f32((q - 16) * d) for q in q5_codes(b, 2, 6)]


def deq_q5_1(b):
    d, m = half(b, 0), half(b, 2)
    return [f32(f32(q * d) + m) for q in q5_codes(b, 4, 8)]


def scale_min_k4(j, q):
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def deq_qk(b, qs_off, qh_off):
    """q4_K (qh_off None) and q5_K: per 64 elements two sub-blocks, low then high nibbles."""
    d, dmin = half(b, 0), half(b, 2)
    sc_bytes = b[4:16]
    y = []
    for c in range(4):
        for hi in range(2):
            sc, m = scale_min_k4(2 * c + hi, sc_bytes)
            d1, m1 = f32(d * sc), f32(dmin * m)
            for l in range(32):
                byte = b[qs_off + 32 * c + l]
                q = byte >> 4 if hi else byte & 0xF
                if qh_off is not None and b[qh_off + l] & (1 << (2 * c + hi)):
                    q += 16
                y.append(f32(f32(d1 * q) - m1))
    return y


def deq_q4_K(b):
    return deq_qk(b, 16, None)


def deq_q5_K(b):
    return deq_qk(b, 48, 16)


def deq_q6_K(b):
    d = half(b, 208)
    y = [0.0] * 256
    for n in range(2):
        ql, qh, sc = 64 * n, 128 + 32 * n, 192 + 8 * n
        for l in range(32):
            s = l // 16
            q1 = ((b[ql + l] & 0xF) | (((b[qh + l] >> 0) & 3) << 4)) - 32
            q2 = ((b[ql + l + 32] & 0xF) | (((b[qh + l] >> 2) & 3) << 4)) - 32
            q3 = ((b[ql + l] >> 4) | (((b[qh + l] >> 4) & 3) << 4)) - 32
            q4 = ((b[ql + l + 32] >> 4) | (((b[qh + l] >> 6) & 3) << 4)) - 32
            for k, q in enumerate((q1, q2, q3, q4)):
                y[128 * n + l + 32 * k] = f32(f32(d * i8(b[sc + s + 2 * k])) * q)
    return y


KVALUES_MXFP4 = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]


def e8m0_half(e):
    """ggml's GGML_E8M0_TO_FP32_HALF: 2^(e - 128), exact in binary32 (e 0, 1 subnormal)."""
    return 2.0 ** (e - 128)


def deq_mxfp4(b):
    d = e8m0_half(b[0])
    y = [0.0] * 32
    for j in range(16):
        y[j] = f32(KVALUES_MXFP4[b[1 + j] & 0xF] * d)
        y[j + 16] = f32(KVALUES_MXFP4[b[1 + j] >> 4] * d)
    return y


# ---- blocks ------------------------------------------------------------------------------------

def h16(v):
    return list(struct.pack('<H', v))


# f16 bit patterns for scales: ordinary, negative, zero, -0, smallest and largest subnormal,
# smallest normal, largest finite, +-inf.
EDGE_HALVES = [0x3c00, 0x2e66, 0xb0a3, 0x0000, 0x8000, 0x0001, 0x03ff, 0x0400, 0x7bff, 0x7c00, 0xfc00]


def random_half(r):
    """A finite f16, not subnormal, either sign, magnitude 2^-10 .. 2^3."""
    return (r.getrandbits(1) << 15) | (r.randrange(5, 18) << 10) | r.getrandbits(10)


def blocks_q8_0(r):
    out = []
    for d in EDGE_HALVES:
        out.append(h16(d) + [r.getrandbits(8) for _ in range(32)])
    out.append(h16(0x3c00) + list(range(128, 160)))  # -128 .. -97
    out.append(h16(0x3c00) + list(range(96, 128)))   # 96 .. 127
    for _ in range(4):
        out.append(h16(random_half(r)) + [r.getrandbits(8) for _ in range(32)])
    return out


def blocks_q4_0(r):
    out = []
    for d in EDGE_HALVES:
        out.append(h16(d) + [r.getrandbits(8) for _ in range(16)])
    out.append(h16(0x3c00) + [(15 - j) << 4 | j for j in range(16)])  # every nibble, both halves
    for _ in range(4):
        out.append(h16(random_half(r)) + [r.getrandbits(8) for _ in range(16)])
    return out


def blocks_q5(r, mins):
    """q5_0 (mins False) and q5_1: d [m] qh[4] qs[16]; every qh bit both ways, every nibble."""
    def block(d, m=0x3c00, qh=None, qs=None):
        h = qh if qh is not None else [r.getrandbits(8) for _ in range(4)]
        q = qs if qs is not None else [r.getrandbits(8) for _ in range(16)]
        return h16(d) + (h16(m) if mins else []) + h + q
    out = []
    for d in EDGE_HALVES:
        out.append(block(d, random_half(r)))
    every = [(15 - j) << 4 | j for j in range(16)]
    out.append(block(0x3c00, 0xb800, [0xff] * 4, every))          # all high bits set
    out.append(block(0x3c00, 0x0000, [0x00] * 4, every))          # none
    out.append(block(0x3c00, 0x3c00, [0xa5, 0x5a, 0x0f, 0xf0]))   # mixed, halves differ
    out.append(block(0x2e66, 0x7c00))                              # m = inf
    out.append(block(0x2e66, 0xfc00))                              # m = -inf
    out.append(block(0x7bff, 0x7bff, [0xff] * 4, [0xff] * 16))     # largest: 31 * 65504 + 65504 overflows
    for _ in range(4):
        out.append(block(random_half(r), random_half(r)))
    return out


def blocks_qk(r, size, qh_len):
    """q4_K (qh_len 0) and q5_K: d, dmin, scales[12], [qh[32]], qs[128]."""
    def block(d, dmin, scales=None, qh=None):
        sc = scales if scales is not None else [r.getrandbits(8) for _ in range(12)]
        h = (qh if qh is not None else [r.getrandbits(8) for _ in range(qh_len)]) if qh_len else []
        b = h16(d) + h16(dmin) + sc + h + [r.getrandbits(8) for _ in range(128)]
        assert len(b) == size
        return b
    out = []
    out.append(block(random_half(r), random_half(r)))
    out.append(block(0x2e66, 0x2a00, [0xff] * 12, [0xff] * qh_len))     # every scale and min 63
    out.append(block(0x2e66, 0x2a00, [0xc0] * 12, [0x00] * qh_len))     # only the j >= 4 high bits
    out.append(block(0x2e66, 0x2a00, [0x3f] * 8 + [0xf0, 0x0f, 0xa5, 0x5a], [0xaa, 0x55] * (qh_len // 2)))
    out.append(block(0xb0a3, 0xa800))                                   # negative d and dmin
    out.append(block(0x0000, 0x2a00))                                   # d = 0: x = -dmin * m
    out.append(block(0x0001, 0x03ff))                                   # subnormal d and dmin
    out.append(block(0x7bff, 0x7bff))                                   # largest finite
    out.append(block(0x7c00, 0x3c00))                                   # d = inf (sc 0: NaN)
    out.append(block(0x3c00, 0xfc00))                                   # dmin = -inf
    return out


def blocks_q6_K(r):
    def block(d, scales=None):
        sc = scales if scales is not None else [r.getrandbits(8) for _ in range(16)]
        return [r.getrandbits(8) for _ in range(192)] + sc + h16(d)
    out = [block(random_half(r))]
    out.append(block(0x2e66, [0x80, 0x7f, 0x00, 0xff, 0x01, 0x81, 0x40, 0xc0] * 2))  # -128, 127, 0, -1 ...
    out.append(block(0xb0a3))
    out.append(block(0x0000))
    out.append(block(0x0001))
    out.append(block(0x03ff))
    out.append(block(0x7bff, [0x7f, 0x80] * 8))
    out.append(block(0x7c00))
    out.append(block(0xfc00, [0x00] * 4 + [0x01] * 12))
    return out


def blocks_mxfp4(r):
    """Every code in both nibbles; exponents at the subnormal edge (0, 1, 2), around 1 (127, 128)
    and at the top (254; 255, where 12 overflows to inf); random blocks."""
    out = []
    for e in (0, 1, 2, 126, 127, 128, 129, 254, 255):
        out.append([e] + [r.getrandbits(8) for _ in range(16)])
    out.append([128] + [(15 - j) << 4 | j for j in range(16)])
    for _ in range(4):
        out.append([r.randrange(100, 160)] + [r.getrandbits(8) for _ in range(16)])
    return out


TYPES = [
    ('q8_0', 'KILN_Q8_0', 34, 32, deq_q8_0, blocks_q8_0),
    ('q4_0', 'KILN_Q4_0', 18, 32, deq_q4_0, blocks_q4_0),
    ('q4_K', 'KILN_Q4_K', 144, 256, deq_q4_K, lambda r: blocks_qk(r, 144, 0)),
    ('q5_K', 'KILN_Q5_K', 176, 256, deq_q5_K, lambda r: blocks_qk(r, 176, 32)),
    ('q6_K', 'KILN_Q6_K', 210, 256, deq_q6_K, blocks_q6_K),
    ('mxfp4', 'KILN_MXFP4', 17, 32, deq_mxfp4, blocks_mxfp4),
    ('q5_0', 'KILN_Q5_0', 22, 32, deq_q5_0, lambda r: blocks_q5(r, False)),
    ('q5_1', 'KILN_Q5_1', 24, 32, deq_q5_1, lambda r: blocks_q5(r, True)),
]


def c_array(ctype, name, values, fmt, per_line):
    lines = ['static const %s %s[%d] = {' % (ctype, name, len(values))]
    for i in range(0, len(values), per_line):
        lines.append('    ' + ', '.join(fmt % v for v in values[i:i + per_line]) + ',')
    lines.append('};')
    return '\n'.join(lines)


def main():
    r = random.Random(SEED)
    out = ['/* Generated by scripts/quant_vectors.py (seed %d): blocks of ggml\'s quantized types and the' % SEED,
           ' * binary32 bit patterns ggml\'s dequantize_row_* gives for them (0x7fc00000: any NaN). Do not',
           ' * edit; run `scripts/quant_vectors.py > tests/quant_vectors.h` again. */',
           '#include <stdint.h>', '']
    table = []
    for name, enum, size, blk, deq, make in TYPES:
        blocks = make(r)
        data, want = [], []
        for b in blocks:
            assert len(b) == size, name
            y = deq(b)
            assert len(y) == blk
            data += b
            want += [bits(v) for v in y]
        out.append(c_array('uint8_t', 'qv_%s_blocks' % name, data, '0x%02x', 16))
        out.append(c_array('uint32_t', 'qv_%s_want' % name, want, '0x%08x', 8))
        out.append('')
        table.append('    {%s, "%s", %d, qv_%s_blocks, qv_%s_want},' % (enum, name, len(blocks), name, name))
    out.append('typedef struct {\n    int            type; /* kiln_type */\n    const char    *name;\n'
               '    int            nblocks;\n    const uint8_t *blocks;\n    const uint32_t *want;\n} qv_case;')
    out.append('static const qv_case qv_cases[] = {')
    out += table
    out.append('};')
    sys.stdout.write('\n'.join(out) + '\n')


if __name__ == '__main__':
    main()
