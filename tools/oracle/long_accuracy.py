"""llama.cpp's accuracy on the lossless Q1_0 / Q2_0 fixtures over the 2048-token sequence.

96 positions (the main fixtures) are too few to rank two engines by top-1 agreement: one
position is a whole percent there. This records llama.cpp's mean KL and top-1 agreement over
all 2048 positions of `tiny-f32.long-2048.json`, against the exact logits of the same lossless
weights. The exact logits come from niwaki's exact kernels (`niwaki logits --kernels exact`),
which the main fixtures pin to transformers (KL ~1e-11, top-1 100% on these files).

    cargo build --release
    tools/oracle/.venv/bin/python tools/oracle/long_accuracy.py   # writes fixtures/oracle/long-2048-llamacpp.json
"""
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import llama_cpp

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures" / "oracle"
NIWAKI = ROOT / "target" / "release" / "niwaki"
FILES = ["tiny-exact-q1.Q1_0.gguf", "tiny-exact-q2g64.Q2_0.gguf"]


def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def compare(ref, got):
    lr, lg = log_softmax(ref.astype(np.float64)), log_softmax(got.astype(np.float64))
    kl = (np.exp(lr) * (lr - lg)).sum(-1)
    return {"mean_kl": float(kl.mean()), "top1": float((ref.argmax(-1) == got.argmax(-1)).mean())}


def main():
    ids = json.loads((FIX / "tiny-f32.long-2048.json").read_text())["ids"]
    out = {"note": __doc__.strip().splitlines()[0], "positions": len(ids), "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        toks = Path(tmp) / "ids.json"
        toks.write_text(json.dumps(ids))
        for name in FILES:
            exact = Path(tmp) / "exact.npy"
            subprocess.run([str(NIWAKI), "logits", "--model", str(FIX / name), "--tokens-file",
                            str(toks), "--out", str(exact), "--kernels", "exact"], check=True,
                           capture_output=True)
            llm = llama_cpp.Llama(model_path=str(FIX / name), logits_all=True, n_ctx=len(ids),
                                  n_batch=512, n_threads=2, seed=0, verbose=False)
            llm.eval(ids)
            peer = np.array(llm.scores[:len(ids)], dtype=np.float32)
            out["runs"][name] = {"llama.cpp": compare(np.load(exact), peer)}
            print(name, out["runs"][name])
    (FIX / "long-2048-llamacpp.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
