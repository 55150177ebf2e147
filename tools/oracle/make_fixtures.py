#!/usr/bin/env python3
"""Build tiny random qwen35 models and the oracle fixtures under fixtures/oracle/.

Run from anywhere after ./setup.sh:
    tools/oracle/.venv/bin/python tools/oracle/make_fixtures.py [--stage STAGE ...]

Stages (default: all, in this order):
    models    train the tokenizer, build the HF models, convert to GGUF, verify
    quantize  llama.cpp Q1_0 / Q2_0 quantization (pure) + losslessness check
    hf        transformers logits (+ prefill vs. token-by-token check)
    llama     llama.cpp logits via llama-cpp-python
    long      2048-token sequence through tiny-f32 in transformers (and llama.cpp, kept in work/)
    summary   summary.json (max |dlogit|, KL, top-1)

Everything is seeded; re-running reproduces the same files (given the pinned
package versions in requirements.txt).
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
FIX = REPO / "fixtures" / "oracle"
WORK = HERE / "work"
HF_DIR = WORK / "hf"
LLAMA_SRC = WORK / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"

VOCAB = 512
SEQ_LEN = 96
SEQ_SEED = 1234
LONG_LEN = 2048
LONG_SEED = 2048
LONG_STRIDE = 16

# name -> (kind, group size, seed, GGUF outtype, commit the unquantized GGUF?)
MODELS = {
    "tiny-f32": ("normal", None, 1, "f32", True),
    "tiny-exact-q1": ("binary", 128, 2, "f16", False),
    "tiny-exact-q2g64": ("ternary", 64, 3, "f16", False),
    "tiny-exact-t128": ("ternary", 128, 4, "f16", True),
}
# quantized file -> (source model, llama_ftype name, ggml type id, group size)
QUANTS = {
    "tiny-exact-q1.Q1_0": ("tiny-exact-q1", "LLAMA_FTYPE_MOSTLY_Q1_0", 41, 128),
    "tiny-exact-q2g64.Q2_0": ("tiny-exact-q2g64", "LLAMA_FTYPE_MOSTLY_Q2_0", 42, 64),
}
# GGUF files llama.cpp runs: file stem -> (transformers model that is the exact answer, commit the logits?)
LLAMA_RUNS = {
    "tiny-f32": ("tiny-f32", True),                      # F32 weights
    "tiny-exact-q1.Q1_0": ("tiny-exact-q1", True),       # Q1_0, lossless
    "tiny-exact-q2g64.Q2_0": ("tiny-exact-q2g64", True), # Q2_0 g64, lossless
    "tiny-exact-t128": ("tiny-exact-t128", False),       # F16 weights (exact ternary g128)
    "tiny-exact-q1": ("tiny-exact-q1", False),           # F16 sources of the two quantized files;
    "tiny-exact-q2g64": ("tiny-exact-q2g64", False),     # (False: numbers only, logits stay in work/)
}

# Qwen3.5's pre-tokenizer split regex (as in its tokenizer.json)
QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

TRAIN_TEXT = """
Niwaki are Japanese garden trees, shaped slowly over many years. The gardener
removes what is not needed, so that light and air can reach the inner branches.
A pine may be pruned twice a year: in spring the candles are pinched, and in
autumn the old needles are pulled by hand. Nothing is forced; the tree is
guided. Patience matters more than strength, and a good cut is one you cannot
see a season later.

In 1987 a small nursery listed 24 species, 3 of them rare. By 2003 the list had
grown to 112 entries; prices ranged from 15 to 4,800 yen per plant. "Don't cut
the leader," the old catalogue says, "unless you've decided what the tree will
become." It's advice that still holds: we'll return to it, and you'd do well
to remember it.

Cloud pruning groups the foliage into soft pads, each one resting on a clean
branch. Between the pads there is empty space, which is as important as the
green. Maples are treated differently: their branches are thinned in winter,
when the structure is easy to read. Azaleas are clipped after flowering into
low rounded mounds. Box and holly tolerate hard cuts; cedar and yew recover
more slowly. Water early, mulch well, and check the ties every month so that
the bark is never scarred.

Questions people ask: How long does it take? Which tools are best? Can any tree
be trained? The honest answers are: a decade or more; sharp, clean ones; and
almost any, if you start young and work with the tree's own habit. Measure
twice -- cut once! Keep notes: date, weather, what was removed (and why).
Tools: shears, saws, knives, ropes, bamboo poles, ladders, tripods, brushes.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 100 250 1000.
"""


# --------------------------------------------------------------------------
# tokenizer

def build_tokenizer(out_dir: Path):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    text = TRAIN_TEXT * 4
    tok.train_from_iterator([text[i:i + 400] for i in range(0, len(text), 400)], trainer=trainer)
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    fast.save_pretrained(str(out_dir))
    return fast


# --------------------------------------------------------------------------
# models

def text_config():
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        rope_parameters=dict(
            rope_type="default",
            rope_theta=1.0e7,
            partial_rotary_factor=0.25,
            mrope_section=[3, 3, 2],  # sums to rotary_dim / 2 = 8 (text-only: plain NEOX RoPE)
            mrope_interleaved=True,
        ),
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        max_position_embeddings=4096,
        bos_token_id=None,
        eos_token_id=VOCAB - 1,
        pad_token_id=VOCAB - 3,
    )


def fp16(t):
    """Round a float32 tensor to the nearest float16-representable value (kept as float32)."""
    import torch
    return t.to(torch.float16).to(torch.float32)


def exact_matrix(shape, std, kind, group, gen):
    """A [out, in] matrix whose every `group` consecutive values along `in` are
    {-d,+d} (binary) or {-d,0,+d} (ternary, at least one non-zero) with one fp16 d per group."""
    import torch
    rows, cols = shape
    assert cols % group == 0
    ng = cols // group
    if kind == "binary":
        base = std
        codes = torch.randint(0, 2, (rows, ng, group), generator=gen).to(torch.float32) * 2 - 1
    else:
        base = std / math.sqrt(2.0 / 3.0)
        codes = (torch.randint(0, 3, (rows, ng, group), generator=gen) - 1).to(torch.float32)
        empty = (codes != 0).sum(-1) == 0
        codes[..., 0] = torch.where(empty, torch.ones_like(codes[..., 0]), codes[..., 0])
    spread = torch.exp((torch.rand((rows, ng, 1), generator=gen) - 0.5) * 0.8)  # x0.67 .. x1.49
    d = fp16(base * spread)
    assert bool((d > 0).all())
    return (codes * d).reshape(rows, cols)


def build_model(name: str):
    import torch
    from transformers import Qwen3_5ForCausalLM

    kind, group, seed, _, _ = MODELS[name]
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(1000 + seed)
    cfg = text_config()
    model = Qwen3_5ForCausalLM(cfg).to(torch.float32).eval()

    def rnd(shape, std, mean=0.0):
        return torch.randn(shape, generator=gen) * std + mean

    def uni(shape, lo, hi):
        return torch.rand(shape, generator=gen) * (hi - lo) + lo

    with torch.no_grad():
        for pname, p in model.named_parameters():
            shape = tuple(p.shape)
            if pname.endswith("A_log"):
                v = torch.log(uni(shape, 0.05, 8.0))
            elif pname.endswith("dt_bias"):
                v = rnd(shape, 1.0)
            elif pname.endswith("conv1d.weight"):
                v = rnd(shape, 0.5)
            elif pname.endswith("linear_attn.norm.weight"):
                v = rnd(shape, 0.2, 1.0)  # plain weight (not 1+w)
            elif p.ndim == 1:  # (1+w)-style RMSNorm weights
                v = rnd(shape, 0.2)
            elif p.ndim == 2:
                fan_in = shape[1]
                if pname.endswith("embed_tokens.weight"):
                    std = 1.0
                elif pname.startswith("lm_head"):
                    std = 1.5 / math.sqrt(fan_in)
                else:
                    std = 1.0 / math.sqrt(fan_in)
                if kind == "normal":
                    v = rnd(shape, std)
                else:
                    v = exact_matrix(shape, std, kind, group, gen)
            else:
                raise RuntimeError(f"unexpected parameter {pname} {shape}")
            if kind != "normal":
                v = fp16(v)
            p.copy_(v.to(torch.float32))
    return model


def run_convert(model_dir: Path, out: Path, outtype: str):
    cmd = [sys.executable, str(HERE / "convert_gguf.py"), str(LLAMA_SRC), str(model_dir), str(out), outtype]
    print("+", " ".join(str(c) for c in cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


# --------------------------------------------------------------------------
# GGUF helpers (vendored gguf-py)

def gguf_module():
    p = str(LLAMA_SRC / "gguf-py")
    if p not in sys.path:
        sys.path.insert(0, p)
    import gguf
    return gguf


def read_gguf(path: Path):
    gguf = gguf_module()
    r = gguf.GGUFReader(str(path))
    out = {}
    for t in r.tensors:
        out[t.name] = (t.tensor_type, [int(x) for x in t.shape], np.array(t.data))
    return r, out


def is_quantizable(name: str, ne) -> bool:
    return len(ne) == 2 and "ssm_conv1d" not in name


def check_exact_groups(path: Path, kind: str, group: int):
    """Fail loudly unless every quantizable 2-D tensor is exactly {±d} / {-d,0,d} per group."""
    gguf = gguf_module()
    _, tensors = read_gguf(path)
    n_checked = 0
    for name, (ttype, ne, data) in tensors.items():
        if len(ne) == 1:
            if ttype != gguf.GGMLQuantizationType.F32:
                raise SystemExit(f"{path.name}: 1-D tensor {name} is {ttype.name}, expected F32")
            continue
        if ttype not in (gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32):
            raise SystemExit(f"{path.name}: {name} has type {ttype.name}")
        vals = data.astype(np.float32)
        if not np.array_equal(vals.astype(np.float16).astype(np.float32), vals):
            raise SystemExit(f"{path.name}: {name} is not fp16-representable")
        if not is_quantizable(name, ne):
            continue
        g = vals.reshape(-1, group)
        a = np.abs(g)
        d = a.max(axis=1, keepdims=True)
        if not (d > 0).all():
            raise SystemExit(f"{path.name}: {name} has an all-zero group")
        ok = (a == d) | ((a == 0) & (kind == "ternary"))
        if not ok.all():
            bad = int(np.argwhere(~ok.all(axis=1))[0][0])
            raise SystemExit(f"{path.name}: {name} group {bad} is not {kind} with one scale: {g[bad][:8]}")
        n_checked += 1
    print(f"  exactness OK: {n_checked} matrices of {path.name} are {kind}, group {group}, fp16 scales")


def tiled(x: np.ndarray, axis: int, hk: int, hv: int, hd: int) -> np.ndarray:
    """Reorder value heads along `axis` from grouped (HF: head j = k*r + i) to tiled (GGUF: i*hk + k)."""
    x = np.moveaxis(x, axis, 0)
    rest = x.shape[1:]
    x = x.reshape(hk, hv // hk, hd, *rest).swapaxes(0, 1).reshape(hv * hd, *rest)
    return np.moveaxis(x, 0, axis)


def expected_gguf_tensors(model, cfg) -> dict:
    """What the converter should write for each tensor, derived independently from the HF weights.
    Used to check (and document) the converter's conventions."""
    sd = {k: v.detach().cpu().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    exp = {
        "token_embd.weight": sd["model.embed_tokens.weight"],
        "output.weight": sd["lm_head.weight"],
        "output_norm.weight": 1.0 + sd["model.norm.weight"],
    }
    for i, lt in enumerate(cfg.layer_types):
        p = f"model.layers.{i}."
        b = f"blk.{i}."
        exp[b + "attn_norm.weight"] = 1.0 + sd[p + "input_layernorm.weight"]
        exp[b + "post_attention_norm.weight"] = 1.0 + sd[p + "post_attention_layernorm.weight"]
        exp[b + "ffn_gate.weight"] = sd[p + "mlp.gate_proj.weight"]
        exp[b + "ffn_up.weight"] = sd[p + "mlp.up_proj.weight"]
        exp[b + "ffn_down.weight"] = sd[p + "mlp.down_proj.weight"]
        if lt == "linear_attention":
            la = p + "linear_attn."
            qkv = sd[la + "in_proj_qkv.weight"]
            nqk = 2 * hk * dk
            exp[b + "attn_qkv.weight"] = np.concatenate([qkv[:nqk], tiled(qkv[nqk:], 0, hk, hv, dv)], 0)
            exp[b + "attn_gate.weight"] = tiled(sd[la + "in_proj_z.weight"], 0, hk, hv, dv)
            exp[b + "ssm_alpha.weight"] = tiled(sd[la + "in_proj_a.weight"], 0, hk, hv, 1)
            exp[b + "ssm_beta.weight"] = tiled(sd[la + "in_proj_b.weight"], 0, hk, hv, 1)
            exp[b + "ssm_a"] = tiled(-np.exp(sd[la + "A_log"]), 0, hk, hv, 1)
            exp[b + "ssm_dt.bias"] = tiled(sd[la + "dt_bias"], 0, hk, hv, 1)
            conv = sd[la + "conv1d.weight"][:, 0, :]
            exp[b + "ssm_conv1d.weight"] = np.concatenate([conv[:nqk], tiled(conv[nqk:], 0, hk, hv, dv)], 0)
            exp[b + "ssm_norm.weight"] = sd[la + "norm.weight"]
            exp[b + "ssm_out.weight"] = tiled(sd[la + "out_proj.weight"], 1, hk, hv, dv)
        else:
            sa = p + "self_attn."
            exp[b + "attn_q.weight"] = sd[sa + "q_proj.weight"]
            exp[b + "attn_k.weight"] = sd[sa + "k_proj.weight"]
            exp[b + "attn_v.weight"] = sd[sa + "v_proj.weight"]
            exp[b + "attn_output.weight"] = sd[sa + "o_proj.weight"]
            exp[b + "attn_q_norm.weight"] = 1.0 + sd[sa + "q_norm.weight"]
            exp[b + "attn_k_norm.weight"] = 1.0 + sd[sa + "k_norm.weight"]
    return exp


def check_layout(path: Path, model, cfg):
    """Compare every tensor of the converted GGUF with our own derivation of the converter's conventions."""
    _, tensors = read_gguf(path)
    exp = expected_gguf_tensors(model, cfg)
    missing = sorted(set(exp) - set(tensors))
    extra = sorted(set(tensors) - set(exp))
    if missing or extra:
        raise SystemExit(f"{path.name}: tensor names differ: missing {missing}, extra {extra}")
    worst = 0.0
    for name, e in exp.items():
        _, ne, data = tensors[name]
        got = data.astype(np.float32).reshape(e.shape)
        # ssm_a = -exp(A_log) is computed by the converter in torch; allow 1 ulp
        tol = 1e-6 * np.abs(e).max() if name.endswith("ssm_a") else 0.0
        diff = float(np.abs(got - e).max())
        if diff > tol:
            raise SystemExit(f"{path.name}: {name} differs from expected layout by {diff}")
        worst = max(worst, diff)
    print(f"  layout OK: all {len(exp)} tensors of {path.name} match the documented conventions (max diff {worst:g})")


# --------------------------------------------------------------------------
# stages

def stage_models():
    import torch
    FIX.mkdir(parents=True, exist_ok=True)
    HF_DIR.mkdir(parents=True, exist_ok=True)
    tok_dir = WORK / "tokenizer"
    tok = build_tokenizer(tok_dir)
    print(f"tokenizer: {len(tok)} tokens")
    tok_fix = FIX / "tokenizer"
    tok_fix.mkdir(exist_ok=True)
    shutil.copy(tok_dir / "tokenizer.json", tok_fix / "tokenizer.json")
    cfg = text_config()
    for name, (kind, group, _, outtype, commit) in MODELS.items():
        print(f"== {name}")
        model = build_model(name)
        mdir = HF_DIR / name
        if mdir.exists():
            shutil.rmtree(mdir)
        model.save_pretrained(str(mdir), safe_serialization=True)
        tok.save_pretrained(str(mdir))
        out = (FIX if commit else WORK) / f"{name}.gguf"
        run_convert(mdir, out, outtype)
        if kind == "normal":
            check_layout(out, model, cfg)
        else:
            check_layout(out, model, cfg)
            check_exact_groups(out, kind, group)
        print(f"  wrote {out.relative_to(REPO)} ({out.stat().st_size} bytes)")
    (FIX / "config.json").write_text((HF_DIR / "tiny-f32" / "config.json").read_text())


def source_gguf(name: str) -> Path:
    commit = MODELS[name][4]
    return (FIX if commit else WORK) / f"{name}.gguf"


def dequant_q(ttype_id: int, raw: np.ndarray, n: int) -> np.ndarray:
    """Dequantize Q1_0 (41, block 128) or Q2_0 (42, block 64) bytes; our own reading of the format."""
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if ttype_id == 41:
        blk = raw.reshape(-1, 18)
        d = blk[:, :2].copy().view(np.float16).astype(np.float32)
        bits = np.unpackbits(blk[:, 2:], axis=1, bitorder="little").astype(np.float32)
        w = (bits * 2 - 1) * d
    elif ttype_id == 42:
        blk = raw.reshape(-1, 18)
        d = blk[:, :2].copy().view(np.float16).astype(np.float32)
        q = blk[:, 2:]
        codes = np.stack([(q >> (2 * j)) & 3 for j in range(4)], axis=-1).reshape(len(blk), 64)
        if (codes == 3).any():
            raise SystemExit("Q2_0 code 3 found in a ternary-exact model")
        w = (codes.astype(np.float32) - 1) * d
    else:
        raise ValueError(ttype_id)
    w = w.reshape(-1)
    assert w.size == n
    return w


def stage_quantize():
    import llama_cpp
    gguf = gguf_module()
    for qname, (src, ftype_name, type_id, group) in QUANTS.items():
        src_path = source_gguf(src)
        out = FIX / f"{qname}.gguf"
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, ftype_name)
        params.nthread = 2
        params.pure = True
        rc = llama_cpp.llama_model_quantize(str(src_path).encode(), str(out).encode(), params)
        if rc != 0:
            raise SystemExit(f"llama_model_quantize failed for {qname}: {rc}")
        print(f"== {qname}: ftype {ftype_name}={params.ftype} -> {out.relative_to(REPO)} ({out.stat().st_size} bytes)")
        # check: every quantizable matrix is type_id and dequantizes exactly to the f16 source
        _, qt = read_gguf(out)
        _, st = read_gguf(src_path)
        n_q = 0
        for name, (ttype, ne, data) in qt.items():
            sv = st[name][2].astype(np.float32).reshape(-1)
            if is_quantizable(name, ne):
                if int(ttype) != type_id:
                    raise SystemExit(f"{qname}: {name} is {ttype.name}, expected type {type_id}")
                w = dequant_q(type_id, data, sv.size)
                n_q += 1
            else:
                w = data.astype(np.float32).reshape(-1)
            if not np.array_equal(w, sv):
                raise SystemExit(f"{qname}: {name} is not lossless (max diff {np.abs(w - sv).max()})")
        print(f"  lossless OK: {n_q} matrices in type {type_id}, all tensors dequantize to the exact source")
        # check: llama.cpp's reference row quantizer, applied to the exact values, reproduces the file's bytes
        ref = ggml_ref_quantizer(type_id)
        for name, (ttype, ne, data) in qt.items():
            if is_quantizable(name, ne):
                src_vals = np.ascontiguousarray(st[name][2].astype(np.float32).reshape(-1))
                want = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
                if not np.array_equal(ref(src_vals), want):
                    raise SystemExit(f"{qname}: {name}: reference quantizer bytes differ from the file")
        print(f"  bytes OK: quantize_row_q{1 if type_id == 41 else 2}_0_ref reproduces every quantized tensor")


def ggml_ref_quantizer(type_id: int):
    """quantize_row_q{1,2}_0_ref from the llama-cpp-python build's libggml-base.so, via ctypes."""
    import ctypes
    import llama_cpp
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    fn = lib.quantize_row_q1_0_ref if type_id == 41 else lib.quantize_row_q2_0_ref
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = None
    qk = 128 if type_id == 41 else 64

    def run(x: np.ndarray) -> np.ndarray:
        out = np.zeros(x.size // qk * 18, dtype=np.uint8)
        fn(x.ctypes.data, out.ctypes.data, x.size)
        return out
    return run


def seq_ids(n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.integers(0, VOCAB, size=n)]


def load_hf(name: str):
    import torch
    from transformers import Qwen3_5ForCausalLM
    m = Qwen3_5ForCausalLM.from_pretrained(str(HF_DIR / name), dtype=torch.float32).eval()
    return m


def stage_hf():
    import torch
    ids = seq_ids(SEQ_LEN, SEQ_SEED)
    (FIX / "tokens-96.json").write_text(json.dumps({"seed": SEQ_SEED, "vocab": VOCAB, "ids": ids}) + "\n")
    x = torch.tensor([ids])
    checks = {}
    for name in MODELS:
        m = load_hf(name)
        with torch.no_grad():
            full = m(x, use_cache=False).logits[0].float().numpy()
            out = m(x[:, :1], use_cache=True)
            steps = [out.logits[0, -1].float().numpy()]
            pkv = out.past_key_values
            for t in range(1, SEQ_LEN):
                out = m(x[:, t:t + 1], past_key_values=pkv, use_cache=True)
                pkv = out.past_key_values
                steps.append(out.logits[0, -1].float().numpy())
        steps = np.stack(steps)
        dd = float(np.abs(full - steps).max())
        # the same model in float64: how far the f32 reference itself is from exact arithmetic
        m64 = m.to(torch.float64)
        with torch.no_grad():
            full64 = m64(x, use_cache=False).logits[0].numpy()
        d64 = float(np.abs(full.astype(np.float64) - full64).max())
        print(f"== {name}: logit std {full.std():.3f}, prefill vs token-by-token max|d| = {dd:.3e}, "
              f"f32 vs f64 max|d| = {d64:.3e}")
        if dd > 1e-4:
            raise SystemExit(f"{name}: prefill and cached decoding disagree ({dd})")
        np.save(FIX / f"{name}.hf-logits.npy", full.astype(np.float32))
        checks[name] = {
            "logit_std": float(full.std()),
            "prefill_vs_token_by_token_max_abs": dd,
            "f32_vs_f64_max_abs": d64,
            "f32_vs_f64": compare(full64, full),
        }
    (FIX / "hf-checks.json").write_text(json.dumps(checks, indent=2) + "\n")


def gguf_path(stem: str) -> Path:
    for d in (FIX, WORK):
        if (d / f"{stem}.gguf").exists():
            return d / f"{stem}.gguf"
    raise SystemExit(f"{stem}.gguf not found (run the models and quantize stages)")


def llama_logits_path(stem: str) -> Path:
    return (FIX if LLAMA_RUNS[stem][1] else WORK) / f"{stem}.llamacpp-logits.npy"


def stage_llama():
    import llama_cpp
    ids = json.loads((FIX / "tokens-96.json").read_text())["ids"]
    for stem in LLAMA_RUNS:
        llm = llama_cpp.Llama(model_path=str(gguf_path(stem)), logits_all=True, n_ctx=256, n_batch=256,
                              n_threads=2, seed=0, verbose=False)
        assert llm.n_vocab() == VOCAB
        llm.eval(ids)
        scores = np.array(llm.scores[:len(ids)], dtype=np.float32)
        np.save(llama_logits_path(stem), scores)
        print(f"== {stem}: llama.cpp logits {scores.shape}")
        del llm


def compare(ref: np.ndarray, got: np.ndarray) -> dict:
    ref = ref.astype(np.float64)
    got = got.astype(np.float64)

    def logsm(z):
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    lr, lg = logsm(ref), logsm(got)
    kl = (np.exp(lr) * (lr - lg)).sum(-1)
    return {
        "max_abs_dlogit": float(np.abs(ref - got).max()),
        "mean_kl": float(kl.mean()),
        "max_kl": float(kl.max()),
        "top1_agreement": float((ref.argmax(-1) == got.argmax(-1)).mean()),
        "positions": int(ref.shape[0]),
    }


def stage_summary():
    summary = {
        "note": "reference = transformers f32 logits of the named model; KL(reference || engine) "
                "per position (softmax in float64); mean/max over the positions of tokens-96.json",
        "runs": {},
        "llama.cpp quantized vs llama.cpp F16 of the same (lossless) weights": {},
        "transformers": json.loads((FIX / "hf-checks.json").read_text()),
    }
    for stem, (ref_name, saved) in LLAMA_RUNS.items():
        ref = np.load(FIX / f"{ref_name}.hf-logits.npy")
        got = np.load(llama_logits_path(stem))
        r = compare(ref, got)
        r.update({"gguf": f"{stem}.gguf" + ("" if gguf_path(stem).parent == FIX else " (not committed)"),
                  "engine": "llama.cpp (llama-cpp-python 0.3.36, CPU, 2 threads)",
                  "reference": f"{ref_name}.hf-logits.npy",
                  "engine_logits": f"{stem}.llamacpp-logits.npy" if saved else None})
        summary["runs"][f"{stem}/llama.cpp"] = r
        print(f"{stem:>22} llama.cpp vs HF: max|d| {r['max_abs_dlogit']:.6g}  mean KL {r['mean_kl']:.6g}  "
              f"max KL {r['max_kl']:.6g}  top1 {r['top1_agreement']:.6f}")
    for q, src in (("tiny-exact-q1.Q1_0", "tiny-exact-q1"), ("tiny-exact-q2g64.Q2_0", "tiny-exact-q2g64")):
        r = compare(np.load(llama_logits_path(src)), np.load(llama_logits_path(q)))
        summary["llama.cpp quantized vs llama.cpp F16 of the same (lossless) weights"][q] = r
        print(f"{q:>22} llama.cpp vs llama.cpp F16: max|d| {r['max_abs_dlogit']:.6g}  mean KL {r['mean_kl']:.6g}  "
              f"top1 {r['top1_agreement']:.6f}")
    long_json = json.loads((FIX / "tiny-f32.long-2048.json").read_text())
    pos = long_json["logit_positions"]
    lc = np.load(WORK / "tiny-f32.long-2048.llamacpp-logits.npy")
    r = compare(np.load(FIX / "tiny-f32.long-2048.hf-logits.npy"), lc[pos])
    am = np.array(long_json["argmax"])
    margin = np.array(long_json["top2_margin"])
    r["argmax_agreement_all_2048"] = float((lc.argmax(-1) == am).mean())
    r["argmax_agreement_where_margin_ge_1e-3"] = float((lc.argmax(-1) == am)[margin >= 1e-3].mean())
    r["max_abs_dlogit_by_position_bucket"] = {
        f"{lo}-{lo + 511}": float(np.abs(np.load(FIX / "tiny-f32.long-2048.hf-logits.npy")[
            [i for i, p in enumerate(pos) if lo <= p < lo + 512]] - lc[[p for p in pos if lo <= p < lo + 512]]).max())
        for lo in range(0, LONG_LEN, 512)}
    r["note"] = "llama.cpp F32 (tiny-f32.gguf, n_batch 512) vs transformers on tiny-f32.long-2048.json; " \
                "logit metrics over the 129 saved positions"
    summary["long-2048/tiny-f32/llama.cpp"] = r
    print(f"long-2048 tiny-f32 llama.cpp vs HF: max|d| {r['max_abs_dlogit']:.6g} mean KL {r['mean_kl']:.3g} "
          f"argmax agreement {r['argmax_agreement_all_2048']:.6f} (margin>=1e-3: "
          f"{r['argmax_agreement_where_margin_ge_1e-3']:.6f}) by bucket {r['max_abs_dlogit_by_position_bucket']}")
    (FIX / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def stage_long():
    import torch
    ids = seq_ids(LONG_LEN, LONG_SEED)
    m = load_hf("tiny-f32")
    with torch.no_grad():
        logits = m(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()
    top2 = np.sort(logits, axis=-1)[:, -2:]
    positions = list(range(0, LONG_LEN, LONG_STRIDE))
    if positions[-1] != LONG_LEN - 1:
        positions.append(LONG_LEN - 1)
    np.save(FIX / "tiny-f32.long-2048.hf-logits.npy", logits[positions].astype(np.float32))
    (FIX / "tiny-f32.long-2048.json").write_text(json.dumps({
        "seed": LONG_SEED,
        "vocab": VOCAB,
        "ids": ids,
        "logit_positions": positions,
        "argmax": [int(a) for a in logits.argmax(-1)],
        "top2_margin": [round(float(m), 5) for m in top2[:, 1] - top2[:, 0]],
    }) + "\n")
    # llama.cpp on the same sequence (F32 GGUF), kept in work/ for the summary
    import llama_cpp
    llm = llama_cpp.Llama(model_path=str(FIX / "tiny-f32.gguf"), logits_all=True, n_ctx=LONG_LEN,
                          n_batch=512, n_threads=2, seed=0, verbose=False)
    llm.eval(ids)
    np.save(WORK / "tiny-f32.long-2048.llamacpp-logits.npy", np.array(llm.scores[:LONG_LEN], dtype=np.float32))
    del llm
    print(f"== long: {LONG_LEN} tokens, logits saved at {len(positions)} positions, std {logits.std():.3f}, "
          f"{int((top2[:, 1] - top2[:, 0] < 1e-3).sum())} positions with top-2 margin < 1e-3")


STAGES = {
    "models": stage_models,
    "quantize": stage_quantize,
    "hf": stage_hf,
    "llama": stage_llama,
    "long": stage_long,
    "summary": stage_summary,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stage", action="append", choices=list(STAGES), help="run only these stages")
    args = ap.parse_args()
    if not LLAMA_SRC.is_dir():
        raise SystemExit(f"vendored llama.cpp source not found at {LLAMA_SRC}; run setup.sh first")
    for s in args.stage or list(STAGES):
        STAGES[s]()


if __name__ == "__main__":
    main()
