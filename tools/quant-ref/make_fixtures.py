#!/usr/bin/env python3
"""Writes the bit-exactness fixtures of the `quant` crate from llama.cpp's own reference code.

usage: make_fixtures.py LIBGGML_BASE [--gguf-py DIR] [--out DIR]

  LIBGGML_BASE  path to llama.cpp's libggml-base.so (mainline, with Q1_0 and Q2_0)
  --gguf-py     directory holding llama.cpp's `gguf` Python package (for the TQ1_0 codec);
                without it, `import gguf` must work
  --out         output folder (default: fixtures/quant next to this script's repository root)

For Q1_0, Q2_0 (g64), Q8_0 and Q4_1 it calls `quantize_row_*_ref` and `dequantize_row_*` on seeded
inputs and edge cases; for F16 and BF16 the row converters. For PTQ1_0 (a PrismML fork type that
mainline lacks) it packs trit vectors with gguf-py's TQ1_0 codec, which shares PTQ1_0's base-3 byte
arithmetic, and records the bytes (see `ptq1_0_cases`). Needs numpy. Deterministic: rerunning
produces identical files.
"""

import argparse
import ctypes
import json
import pathlib
import sys

import numpy as np

SEED = 20240613

# name -> (block values, block bytes, quantizer symbol, dequantizer symbol)
BLOCK_FORMATS = {
    "Q1_0": (128, 18, "quantize_row_q1_0_ref", "dequantize_row_q1_0"),
    "Q2_0": (64, 18, "quantize_row_q2_0_ref", "dequantize_row_q2_0"),
    "Q8_0": (32, 34, "quantize_row_q8_0_ref", "dequantize_row_q8_0"),
    "Q4_1": (32, 20, "quantize_row_q4_1_ref", "dequantize_row_q4_1"),
}

F32P = ctypes.POINTER(ctypes.c_float)
U8P = ctypes.POINTER(ctypes.c_uint8)
U16P = ctypes.POINTER(ctypes.c_uint16)


def hexf32(a):
    return np.ascontiguousarray(a, dtype="<f4").tobytes().hex()


class Ggml:
    def __init__(self, path):
        self.lib = ctypes.CDLL(str(path))
        for _, (_, _, q, dq) in BLOCK_FORMATS.items():
            getattr(self.lib, q).argtypes = [F32P, U8P, ctypes.c_int64]
            getattr(self.lib, q).restype = None
            getattr(self.lib, dq).argtypes = [U8P, F32P, ctypes.c_int64]
            getattr(self.lib, dq).restype = None
        for name, a, b in [
            ("ggml_fp32_to_fp16_row", F32P, U16P),
            ("ggml_fp32_to_bf16_row_ref", F32P, U16P),
            ("ggml_fp16_to_fp32_row", U16P, F32P),
            ("ggml_bf16_to_fp32_row", U16P, F32P),
        ]:
            getattr(self.lib, name).argtypes = [a, b, ctypes.c_int64]
            getattr(self.lib, name).restype = None

    def quantize(self, fmt, x):
        qk, bb, sym, _ = BLOCK_FORMATS[fmt]
        x = np.ascontiguousarray(x, dtype=np.float32)
        assert x.size % qk == 0
        out = np.zeros(x.size // qk * bb, dtype=np.uint8)
        getattr(self.lib, sym)(x.ctypes.data_as(F32P), out.ctypes.data_as(U8P), x.size)
        return out

    def dequantize(self, fmt, q):
        qk, bb, _, sym = BLOCK_FORMATS[fmt]
        q = np.ascontiguousarray(q, dtype=np.uint8)
        assert q.size % bb == 0
        out = np.zeros(q.size // bb * qk, dtype=np.float32)
        getattr(self.lib, sym)(q.ctypes.data_as(U8P), out.ctypes.data_as(F32P), out.size)
        return out

    def to_half(self, name, x):
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.zeros(x.size, dtype=np.uint16)
        getattr(self.lib, name)(x.ctypes.data_as(F32P), out.ctypes.data_as(U16P), x.size)
        return out

    def from_half(self, name, h):
        h = np.ascontiguousarray(h, dtype=np.uint16)
        out = np.zeros(h.size, dtype=np.float32)
        getattr(self.lib, name)(h.ctypes.data_as(U16P), out.ctypes.data_as(F32P), h.size)
        return out


def input_cases(fmt, qk, rng):
    """Named f32 inputs, each a few whole blocks."""
    n = 4 * qk
    f = np.float32
    cases = []
    for scale in (1e-3, 1.0, 37.5, 3e3):
        cases.append((f"normal x{scale:g}", rng.standard_normal(n).astype(f) * f(scale)))
    cases.append(("uniform [-1, 1]", rng.uniform(-1, 1, n).astype(f)))
    cases.append(("all zeros", np.zeros(n, f)))
    cases.append(("negative zeros", np.full(n, -0.0, f)))
    mixed = np.zeros(n, f)
    mixed[1::2] = -0.0
    mixed[::7] = 0.25
    cases.append(("signed zeros with a few values", mixed))
    x = rng.standard_normal(n).astype(f)
    x[3] = 1e4
    x[qk + 5] = -2e4
    cases.append(("one huge outlier per block", x))
    cases.append(("equal positive values", np.full(n, 0.3, f)))
    cases.append(("equal negative values", np.full(n, -7.25, f)))
    x = rng.standard_normal(n).astype(f) * f(1e-7)
    cases.append(("tiny values (fp16 scale underflows)", x))
    x = rng.standard_normal(n).astype(f) * f(1e-9)
    x[::5] = 0.0
    cases.append(("subnormal-scale values", x))
    cases.append(("scale overflows fp16", rng.standard_normal(n).astype(f) * f(1e6)))
    # Values exactly at (and one ulp around) the rounding boundaries of each code grid.
    half_steps = np.arange(n, dtype=f) % 8 - f(3.5)
    if fmt == "Q8_0":
        b = (np.arange(n) % 254 - 126.5).astype(f)
        b[::qk] = 127.0  # amax 127: d = 1, id = 1, x·id = k + 0.5 exactly
    elif fmt == "Q4_1":
        b = (np.arange(n) % 15 + 0.5).astype(f)
        b[::qk] = 0.0
        b[1::qk] = 15.0  # min 0, max 15: d = 1, (x − min)·id + 0.5 = k + 1 exactly
    elif fmt == "Q2_0":
        b = (half_steps / f(3.5)).astype(f)  # ±1 reached; many values at ±0.5·k/3.5
        b[::4] = f(0.5)
        b[1::4] = f(-0.5)
        b[::qk] = 1.0
    else:  # Q1_0: the sign boundary
        b = half_steps * f(0.5)
    cases.append(("rounding boundaries", b))
    cases.append(("just below the boundaries", np.nextafter(b, f(-np.inf)).astype(f)))
    cases.append(("just above the boundaries", np.nextafter(b, f(np.inf)).astype(f)))
    x = rng.standard_normal(n).astype(f)
    x[7] = np.inf
    x[qk + 1] = -np.inf
    x[2 * qk + 2] = np.nan
    x[3 * qk :] = np.nan
    cases.append(("infinities and NaN", x))
    return cases


def block_format_fixture(g, fmt, rng):
    qk, bb, _, _ = BLOCK_FORMATS[fmt]
    cases = []
    for name, x in input_cases(fmt, qk, rng):
        q = g.quantize(fmt, x)
        y = g.dequantize(fmt, q)
        cases.append({"name": name, "input": hexf32(x), "quantized": q.tobytes().hex(),
                      "dequantized": hexf32(y)})
    decode = []
    raw = rng.integers(0, 256, 64 * bb, dtype=np.uint8)
    decode.append(("random bytes, any scale bits", raw))
    raw = raw.copy().reshape(64, bb)
    scales = (rng.standard_normal(64) * 0.05).astype(np.float16).view(np.uint8).reshape(64, 2)
    raw[:, 0:2] = scales
    decode.append(("random codes, small scales", raw.reshape(-1)))
    dcases = [{"name": n, "bytes": b.tobytes().hex(), "dequantized": hexf32(g.dequantize(fmt, b))}
              for n, b in decode]
    return {"format": fmt, "block_len": qk, "block_bytes": bb, "cases": cases, "decode": dcases}


def float_fixture(g, rng):
    f = np.float32
    x = np.concatenate([
        rng.standard_normal(256).astype(f) * f(100.0),
        rng.integers(0, 2**32, 256, dtype=np.uint64).astype(np.uint32).view(f),
        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 65504.0, 65519.99, 65520.0,
                  2.0**-24, 2.0**-25, 3 * 2.0**-26, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11,
                  np.finfo(f).max, np.finfo(f).tiny, 1e-45], dtype=f),
        np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x7F800001, 0xFF810000, 0x7FFFFFFF,
                  0x007FFFFF, 0x00008000], dtype=np.uint32).view(f),
    ])
    halves = rng.integers(0, 2**16, 512, dtype=np.uint64).astype(np.uint16)
    out = {"input": hexf32(x)}
    for fmt, enc, dec in [("F16", "ggml_fp32_to_fp16_row", "ggml_fp16_to_fp32_row"),
                          ("BF16", "ggml_fp32_to_bf16_row_ref", "ggml_bf16_to_fp32_row")]:
        out[fmt] = {
            "encoded": g.to_half(enc, x).astype("<u2").tobytes().hex(),
            "random_bits": halves.astype("<u2").tobytes().hex(),
            "random_decoded": hexf32(g.from_half(dec, halves)),
        }
    return out


# PTQ1_0 element order (see crates/quant/src/ptq1_0.rs): trit n of packed byte `byte`.
def ptq_element(byte, n):
    if byte < 16:
        return 16 * n + byte
    if byte < 24:
        return 80 + 8 * n + (byte - 16)
    return 120 + 2 * n + (byte - 24)


def digits(v, count):
    """Base-3 digits of v, most significant first."""
    return [(v // 3 ** (count - 1 - i)) % 3 for i in range(count)]


def ptq1_0_cases(gguf_quants, rng):
    """Packs PTQ1_0 blocks through gguf-py's TQ1_0 codec.

    TQ1_0 (256 values) and PTQ1_0 (128) pack bytes the same way: byte m of TQ1_0's 32-byte run
    holds values m + 32n (n < 5) and qh byte j holds 240 + 4n + j (n < 4). Each PTQ1_0 five-trit
    byte is placed in a TQ1_0 run byte, each PTQ1_0 qh byte in a TQ1_0 qh byte; with d = 1 the
    codec's rounding is exact, so the bytes it writes are the PTQ1_0 bytes of those trits.
    """
    blocks = []
    for b in range(64):
        t = np.zeros(128, dtype=np.int64)
        for byte in range(26):
            count = 5 if byte < 24 else 4
            if b < 48:  # every 5-trit value within 11 blocks, every 4-trit value within 41
                v = (b * 24 + byte) % 243 if count == 5 else (b * 2 + byte - 24) % 81
            else:
                v = int(rng.integers(0, 3 ** count))
            for n, digit in enumerate(digits(v, count)):
                t[ptq_element(byte, n)] = digit
        blocks.append(t)

    tq = np.zeros((len(blocks), 256), dtype=np.float32)
    for i, t in enumerate(blocks):
        for byte in range(24):
            for n in range(5):
                tq[i, byte + 32 * n] = t[ptq_element(byte, n)] - 1
        for h in range(2):
            for n in range(4):
                tq[i, 240 + 4 * n + h] = t[ptq_element(24 + h, n)] - 1
        tq[i, 160] = 1.0  # an unused slot pins d = max|x| = 1
    packed = gguf_quants.quantize(tq, gguf_quants.GGMLQuantizationType.TQ1_0).reshape(len(blocks), 54)
    decoded = gguf_quants.dequantize(packed, gguf_quants.GGMLQuantizationType.TQ1_0).reshape(-1, 256)
    assert np.all(packed[:, 52:54].view(np.float16) == 1.0)

    out = []
    for i, t in enumerate(blocks):
        ptq = np.concatenate([packed[i, 0:24], packed[i, 48:50]])
        back = np.zeros(128, dtype=np.int64)
        for byte in range(24):
            for n in range(5):
                back[ptq_element(byte, n)] = int(decoded[i, byte + 32 * n]) + 1
        for h in range(2):
            for n in range(4):
                back[ptq_element(24 + h, n)] = int(decoded[i, 240 + 4 * n + h]) + 1
        out.append({
            "trits": "".join(map(str, t)),
            "packed": ptq.tobytes().hex(),
            "decoded_trits": "".join(map(str, back)),
        })
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("lib", type=pathlib.Path, help="path to libggml-base.so")
    ap.add_argument("--gguf-py", type=pathlib.Path, help="directory holding the gguf package")
    default_out = pathlib.Path(__file__).resolve().parent.parent.parent / "fixtures" / "quant"
    ap.add_argument("--out", type=pathlib.Path, default=default_out)
    args = ap.parse_args()

    if args.gguf_py:
        sys.path.insert(0, str(args.gguf_py))
    import gguf.quants as gguf_quants  # noqa: E402
    import gguf.constants  # noqa: E402
    gguf_quants.GGMLQuantizationType = gguf.constants.GGMLQuantizationType

    g = Ggml(args.lib)
    rng = np.random.default_rng(SEED)
    args.out.mkdir(parents=True, exist_ok=True)

    def write(name, obj):
        path = args.out / name
        path.write_text(json.dumps(obj, indent=1) + "\n")
        print(f"wrote {path.name} ({path.stat().st_size} bytes)")

    for fmt in BLOCK_FORMATS:
        write(f"{fmt.lower()}.json", block_format_fixture(g, fmt, rng))
    write("float.json", float_fixture(g, rng))
    write("ptq1_0_tq1_0.json", {
        "note": "PTQ1_0 trits (element order) packed by gguf-py's TQ1_0 codec",
        "blocks": ptq1_0_cases(gguf_quants, rng),
    })


if __name__ == "__main__":
    main()
