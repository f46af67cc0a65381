#!/usr/bin/env python3
"""semantic_check.py — the semantic check against transformers' own model classes.

For qwen3 (Qwen3-8B's config) and qwen3_moe (Qwen3-30B-A3B's), shrunk the way
`wb-match --check-semantics` shrinks them (matcher/semantic/tiny.py, TP 2): transformers builds
the model from that config with its own random init (seeded; norms perturbed so that they are not
all ones), `save_pretrained` writes its checkpoint, weightbridge's own programs (wb-match,
wb-broadcast readers, two wb-agent BF16 rollout ranks over libfabric tcp) move it into the vLLM
layout, and the check's vLLM-semantic forward over the rollout ranks' tensors
(matcher/semantic/forward.py, arch.py; numpy, float64) is compared with transformers' own forward
(float32, on the GPU) on the same tokens: logits cosine >= 0.999, the same top token everywhere.
Also printed: the numpy forward over the checkpoint read by Hugging Face names against
transformers' (the forward code itself against the model class).

Usage (on a lent GPU machine, after `. scripts/gpu/env.sh` and `make all`):
  python3 scripts/gpu/semantic_check.py [--bin build/bin]
Exit status 0 when every case passed.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "matcher", "semantic"))

from arch import HFWeights, Model, VllmWeights  # noqa: E402
from forward import Run, forward  # noqa: E402
from numerics import cosine  # noqa: E402
from pipeline import broadcast, inventories  # noqa: E402
from tiny import shrink  # noqa: E402

CASES = [
    ("qwen3", "configs/models/qwen3.yaml", "configs/hf/Qwen3-8B.json"),
    ("qwen3_moe", "configs/models/qwen3_moe.yaml", "configs/hf/Qwen3-30B-A3B.json"),
]
TP = 2
TOKENS = 16
BOUND = 0.999


def log(s):
    print(s, flush=True)


def checkpoint_values(path):
    """name -> ("bf16", float64 values) of every tensor in the safetensors files under path."""
    import torch
    from safetensors import safe_open

    out = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(path, f), "pt") as st:
                for k in st.keys():
                    out[k] = ("bf16", st.get_tensor(k).to(torch.float64).numpy())
    return out


def one(bindir, arch, family, config_path, tmp):
    import torch
    import transformers

    with open(os.path.join(ROOT, config_path)) as f:
        cfg = json.load(f)
    tiny = shrink(cfg, arch, TP)
    d = os.path.join(tmp, arch)
    ckpt = os.path.join(d, "ckpt")
    os.makedirs(ckpt)
    config = os.path.join(d, "config.json")
    with open(config, "w") as f:
        json.dump(tiny, f, indent=1)
    tinv, rinv = inventories(bindir, os.path.join(ROOT, family), config, [], d, 120)

    kw = {k: v for k, v in tiny.items() if k not in ("model_type", "architectures", "torch_dtype", "transformers_version")}
    hcfg = transformers.AutoConfig.for_model(tiny["model_type"], **kw)
    torch.manual_seed(1)
    model = transformers.AutoModelForCausalLM.from_config(hcfg, torch_dtype=torch.bfloat16).cuda().eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1:  # norms: not all ones, so that a norm read from the wrong place shows
                p.mul_(1 + 0.2 * torch.randn_like(p))
    log(f"== {arch}: transformers {type(model).__name__} from {os.path.basename(config_path)} shrunk "
        f"(layers {hcfg.num_hidden_layers}, hidden {hcfg.hidden_size}, heads {hcfg.num_attention_heads}/"
        f"{hcfg.num_key_value_heads}{', experts %d' % hcfg.num_experts if arch == 'qwen3_moe' else ''}); "
        f"parameters as transformers holds them: "
        + ", ".join(f"{n} {tuple(p.shape)}" for n, p in list(model.named_parameters())[2:6]) + " ...")
    model.save_pretrained(ckpt, safe_serialization=True)
    vals = checkpoint_values(ckpt)
    want = {n for n in tinv if not n.endswith("rotary_emb.inv_freq")}
    if set(vals) != want:
        extra, missing = sorted(set(vals) - want), sorted(want - set(vals))
        raise AssertionError(f"save_pretrained's names differ from the family's trainer inventory: "
                             f"{len(extra)} not in it {extra[:4]}, {len(missing)} missing {missing[:4]}")
    for n, (_, v) in vals.items():
        if list(v.shape) != list(tinv[n][1]):
            raise AssertionError(f"{n}: shape {list(v.shape)} saved, {tinv[n][1]} in the inventory")
    log(f"  save_pretrained: {len(vals)} tensors, names and shapes equal to the family's trainer inventory")

    locs = broadcast(bindir, os.path.join(ROOT, family), config, [], list(rinv), TP, 1, d, 120, lambda s: None)
    log(f"  moved by wb-broadcast into {TP} BF16 rollout ranks: {sum(len(b) for l in locs for b in l.values())} bytes")

    m = Model(tiny, arch)
    ids = np.random.default_rng(2).integers(0, m.V, TOKENS)
    hf = Run(HFWeights(m, vals), m)
    hf_logits = forward(hf, ids)[0]
    v_logits = forward(Run(VllmWeights(m, locs, rinv, TP, 1, False), m), ids, routes=hf.routes)[0]
    with torch.no_grad():
        t_logits = model.float()(torch.tensor(ids)[None].cuda()).logits[0].double().cpu().numpy()
    ok = True
    for what, a in (("rollout ranks read as vLLM reads them", v_logits),
                    ("checkpoint read by Hugging Face names (numpy)", hf_logits)):
        c = cosine(t_logits, a)
        top = int(np.sum(np.argmax(t_logits, -1) == np.argmax(a, -1)))
        good = c >= BOUND
        ok = ok and good
        log(f"  logits, transformers' forward vs the {what}: cosine {c:.6f} (bound {BOUND}), "
            f"max |diff| {np.max(np.abs(t_logits - a)):.3g}, same top token at {top} of {TOKENS}"
            f"{'' if good else '  FAIL'}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    a = ap.parse_args()
    import torch
    import transformers

    log(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name(0)}")
    tmp = tempfile.mkdtemp(prefix="wb-semantic-gpu.")
    failed = 0
    try:
        for arch, family, config in CASES:
            try:
                ok = one(a.bin, arch, family, config, tmp)
            except Exception as e:  # noqa: BLE001 - every case runs; its failure is reported
                log(f"  FAIL {arch}: {type(e).__name__}: {e}")
                ok = False
            log(f"== {arch}: {'PASS' if ok else 'FAIL'}")
            failed += not ok
    finally:
        if not os.environ.get("WB_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
    log("semantic_check: " + ("all cases passed" if not failed else f"{failed} case(s) failed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
