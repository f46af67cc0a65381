#!/usr/bin/env python3
"""transpose_e2e.py — transposed experts moved by real processes (issue #33): gpt-oss-shaped
experts, Hugging Face's gate_up_proj [E, H, 2I] and down_proj [E, I, H] in two or three trainer
processes (numpy shards, registered as DTensor-style wb.Shard placements), become vLLM's
w13_weight [E, 2I, H] and w2_weight [E, H, I] on two rollout processes over libfabric tcp, by
the rules of the shipped configs/models/gpt_oss.yaml (its two expert rules, `permute: [0, 2, 1]`,
taken from the file as they are). Rollouts of TP 2 and of EP 2, in BF16 and in FP8 (128x128
blocks over the rollout tensor's last two dims: vLLM's gpt-oss holds MXFP4 experts, which
weightbridge does not make; FP8 here is the block-quantization path of a transposed source),
from trainers that shard the experts (Shard(0)) or the very dims the transpose moves (Shard(2)
of gate_up_proj, Shard(1) of down_proj: FP8 blocks straddle the owners, amax exchanges), in
direct, auto and gather modes.

After every version every rollout byte is compared, inside the rollout's post-update hook,
with what numpy computes independently from the trainers' full tensors: the expert's slice
transposed (np.transpose), for TP rank r of 2 gate_up_proj's columns [r I, (r + 1) I) and
down_proj's rows [r I/2, (r + 1) I/2), for EP rank r the experts [2r, 2r + 2) whole, and for
FP8 each expert's matrix quantized with DeepGEMM's per_block_cast_to_fp8 rule (the reference of
tests/python/_hf.py, self-checked there and here).

Usage: transpose_e2e.py [case...]   (the harness: WB_BIN names the programs' directory)
Prints harness lines, "case X: rollout R version V: 0 of N bytes differ", and the tally.
"""

import json
import os
import random
import re
import subprocess
import sys
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import numpy as np  # noqa: E402

import weightbridge as wb  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _procs  # noqa: E402  (waiting for a job's processes)
from _hf import per_block_cast_to_fp8, self_check  # noqa: E402  (the DeepGEMM reference)

TOKEN = os.environ.setdefault("WB_E2E_TOKEN", "e2e-transpose-%d" % random.randrange(1 << 30))
VERSIONS = (1, 2)
FP8_QC = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
E, H, I, LAYERS = 4, 256, 512, 2
CONFIG = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": H,
          "intermediate_size": I, "num_local_experts": E, "experts_per_token": 2, "num_hidden_layers": LAYERS,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 512,
          "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
# name: (FP8 rollout, tp, ep, trainer shards: "experts" (Shard(0) over 2 trainers) or "moved"
# (over 3, so that 2I = 1024 and I = 512 are cut inside 128-blocks), mode)
CASES = {
    "bf16_tp2": (False, 2, 1, "experts", "auto"),
    "bf16_ep2_moved": (False, 2, 2, "moved", "direct"),
    "fp8_tp2": (True, 2, 1, "experts", "auto"),
    "fp8_tp2_moved": (True, 2, 1, "moved", "direct"),
    "fp8_ep2_moved_gather": (True, 2, 2, "moved", "gather"),
}


def trainers(case):
    return 3 if CASES[case][3] == "moved" else 2


def log(*a):
    print(*a, flush=True)


def family(tmp):
    """A family of gpt-oss's experts alone: their names and shapes from configs/models/gpt_oss.yaml's
    rollout and trainer lists, and its two expert rules copied as they are."""
    src = open(os.path.join(ROOT, "configs/models/gpt_oss.yaml")).read()
    rules = []
    for name in ("w13_weight", "w2_weight"):
        m = re.search(r"(  - rollout: model\.layers\.\{L\}\.mlp\.experts\.%s\n(?:    .*\n)+)" % name, src)
        if not m or "permute: [0, 2, 1]" not in m.group(1):
            raise AssertionError("configs/models/gpt_oss.yaml: no %s rule with permute [0, 2, 1]" % name)
        rules.append(m.group(1))
    text = f"""# gpt-oss's experts, for transpose_e2e.py (rules from configs/models/gpt_oss.yaml)
model_type: gpt_oss
family: gpt_oss_experts
description: gpt-oss experts only
quant:
  fp8: ["*.mlp.experts.w13_weight", "*.mlp.experts.w2_weight"]
trainer:
  - for: {{layer: num_hidden_layers}}
    tensors:
      model.layers.{{layer}}.mlp.experts.gate_up_proj: [num_local_experts, hidden_size, 2*intermediate_size]
      model.layers.{{layer}}.mlp.experts.down_proj: [num_local_experts, intermediate_size, hidden_size]
rollout:
  - for: {{layer: num_hidden_layers}}
    fp8: defined(quantization_config)
    tensors:
      model.layers.{{layer}}.mlp.experts.w13_weight: [num_local_experts, 2*intermediate_size, hidden_size]
      model.layers.{{layer}}.mlp.experts.w2_weight: [num_local_experts, hidden_size, intermediate_size]
rules:
""" + "".join(rules)
    path = os.path.join(tmp, "gpt_oss_experts.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def parameters():
    """(name, global shape, the dim "moved" trainers shard) in named_parameters() order."""
    out = []
    for l in range(LAYERS):
        p = f"model.layers.{l}.mlp.experts."
        out += [(p + "gate_up_proj", (E, H, 2 * I), 2), (p + "down_proj", (E, I, H), 1)]
    return out


def full_tensor(name, shape, version):
    """The trainers' full tensor at `version`, BF16 bits: normal values whose magnitude changes
    every 128 elements along each of the last two dims, so that the rollout's FP8 block scales
    differ whichever way the blocks lie."""
    rng = np.random.default_rng([zlib.crc32(name.encode()), version])
    x = rng.standard_normal(shape, dtype=np.float32)
    for d in (-2, -1):
        n = shape[d]
        mag = np.float32(2.0) ** rng.integers(-9, 3, size=-(-n // 128)).astype(np.float32)
        m = np.repeat(mag, 128)[:n]
        x *= m.reshape((n, 1)) if d == -2 else m
    b = x.view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


def expected(case, g, version):
    """{rollout tensor: expected array} of rollout rank g (numpy alone)."""
    fp8, tp, ep, _, _ = CASES[case]
    want = {}
    for l in range(LAYERS):
        p = f"model.layers.{l}.mlp.experts."
        gu = full_tensor(p + "gate_up_proj", (E, H, 2 * I), version)
        dn = full_tensor(p + "down_proj", (E, I, H), version)
        if ep > 1:  # whole experts [r E/ep, (r + 1) E/ep)
            per = E // ep
            es = slice((g % ep) * per, (g % ep + 1) * per)
            w13, w2 = gu[es], dn[es]
        else:  # every expert, the rank's share along the dim vLLM splits: 2I as one block, I
            r = g % tp
            w13 = gu[:, :, r * 2 * I // tp:(r + 1) * 2 * I // tp]
            w2 = dn[:, r * I // tp:(r + 1) * I // tp, :]
        for name, t in ((p + "w13_weight", np.transpose(w13, (0, 2, 1))), (p + "w2_weight", np.transpose(w2, (0, 2, 1)))):
            t = np.ascontiguousarray(t)
            if not fp8:
                want[name] = t
                continue
            qs = [per_block_cast_to_fp8(t[e]) for e in range(t.shape[0])]
            want[name] = np.stack([q for q, _ in qs])
            want[name + "_scale_inv"] = np.stack([s for _, s in qs])
    return want



# ---------------------------------------------------------------- the processes


def run_trainer(case, rank, url, tmp):
    moved, nt = CASES[case][3] == "moved", trainers(case)
    arrays, tensors = {}, {}
    for name, shape, mdim in parameters():
        d = mdim if moved else 0
        off, n = _procs.chunk(shape[d], nt, rank)
        lshape = list(shape)
        lshape[d] = n
        arrays[name] = (np.zeros(lshape, np.uint16), d, off, n)
        o = [0] * len(shape)
        o[d] = off
        tensors[name] = wb.Shard(arrays[name][0], shape, tuple(o), (d,))
    t = wb.Trainer(url, tensors=tensors, rank=rank, token=TOKEN, dtypes={n: "bf16" for n in tensors},
                   tx_domain="lo", timeout=60, mesh=[("d0", nt)])
    for v in VERSIONS:
        for name, shape, _ in parameters():  # the optimizer step, in place
            a, d, off, n = arrays[name]
            a[...] = np.take(full_tensor(name, shape, v), range(off, off + n), axis=d)
        p = t.push(v)
        p.sources(60)
        assert p.result(60).version == v
    t.close()


def run_rollout(case, rank, url, tmp):
    with open(os.path.join(tmp, "locals.json")) as f:
        local = json.load(f)[rank]

    def want_of(v):
        want = expected(case, rank, v)
        if sorted(want) != sorted(l["name"] for l in local):
            raise ValueError(f"rank {rank} holds {sorted(l['name'] for l in local)}, expected {sorted(want)}")
        return want

    _procs.checked_rollout(wb, url, rank, TOKEN, case, local, want_of, VERSIONS, log)


# ---------------------------------------------------------------- the harness


def write_case(case, tmp):
    fp8, tp, ep, shards, mode = CASES[case]
    cfg = dict(CONFIG)
    if fp8:
        cfg["quantization_config"] = FP8_QC
    paths = {k: os.path.join(tmp, f"{case}.{k}") for k in ("config.json", "trainer.yaml", "rollout.yaml", "job.yaml")}
    paths["family"] = family(tmp)
    with open(paths["config.json"], "w") as f:
        json.dump(cfg, f)
    with open(paths["rollout.yaml"], "w") as f:
        f.write(f"replicas: 1\ngpus_per_replica: {tp}\ntp: {tp}\nep: {ep}\n")
    with open(paths["trainer.yaml"], "w") as f:  # what the derived layout is, for wb.plan only
        f.write(f"world_size: {trainers(case)}\nmesh:\n  - {{name: d0, size: {trainers(case)}}}\nplacements:\n")
        if shards == "moved":
            f.write("  - match: \"*.gate_up_proj\"\n    place: {d0: shard(2)}\n"
                    "  - match: \"*.down_proj\"\n    place: {d0: shard(1)}\n")
        f.write("  - match: \"*\"\n    place: {d0: shard(0)}\n")
    with open(paths["job.yaml"], "w") as f:  # no trainer_layout: derived from the placements
        f.write(f"""name: transpose-{case}
model:
  rules: {paths["family"]}
  hf_config: {paths["config.json"]}
trainers: {trainers(case)}
rollout_layout: {paths["rollout.yaml"]}
mode: {mode}
mem_cap: 1GiB
""")
    return paths


def spawn(*args):
    return subprocess.Popen([sys.executable, __file__, *map(str, args)], env=dict(os.environ, WB_TOKEN=TOKEN),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def ctl(url, *args):
    return subprocess.run([os.path.join(BIN, "wb-ctl"), "-c", url, "--timeout", "10s", *args],
                          env=dict(os.environ, WB_TOKEN=TOKEN), capture_output=True, text=True, timeout=30)


def run_case(case, tmp):
    fp8, tp, ep, shards, mode = CASES[case]
    d = os.path.join(tmp, case)
    os.makedirs(d)
    paths = write_case(case, d)
    plan = wb.plan(paths["family"], paths["config.json"], paths["trainer.yaml"], paths["rollout.yaml"], tables=True,
                   mode=mode)
    # the plan transposes: every trainer's table has permute ops, [0, 2, 1]
    perms = [op for t in plan["tables"] for op in t["ops"] if op[0] == "permute"]
    if not perms or any(op[6] != [0, 2, 1] for op in perms):
        raise AssertionError(f"expected permute ops [0, 2, 1] in the plan, got {[op[6] for op in perms][:4]}")
    amax = [op for t in plan["tables"] for op in t["ops"] if op[0] == "amax"]
    if bool(amax) != (fp8 and shards == "moved" and mode == "direct"):
        raise AssertionError(f"{len(amax)} amax ops in a {mode} plan ({'FP8' if fp8 else 'BF16'}, {shards} shards)")
    with open(os.path.join(d, "locals.json"), "w") as f:
        json.dump([plan["receive"][g]["local"] for g in range(tp)], f)
    url = f"tcp://127.0.0.1:{20000 + random.randrange(12000)}"
    clog = open(os.path.join(d, "controller.log"), "w")
    cp = subprocess.Popen([os.path.join(BIN, "wb-controller"), "--config", paths["job.yaml"], "--listen", url],
                          env=dict(os.environ, WB_TOKEN=TOKEN), stdout=clog, stderr=subprocess.STDOUT)
    procs = []
    try:
        procs = [("rollout", r, spawn("rollout", case, r, url, d)) for r in range(tp)]
        procs += [("trainer", r, spawn("trainer", case, r, url, d)) for r in range(trainers(case))]
        _procs.wait_all(procs, 120, log)
        st = ctl(url, "status").stdout
        if f"version {VERSIONS[-1]}, in flight: none" not in st:
            raise AssertionError("status: " + st)
    finally:
        for _, _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        ctl(url, "shutdown")
        try:
            cp.wait(20)
        except subprocess.TimeoutExpired:
            cp.kill()
            cp.wait()
        clog.close()


def reference_check():
    """The expected arrays against a hand-made case: TP rank 1's w13 of expert 0 is gate_up_proj
    columns [I, 2I) transposed (element (i, j) = gate_up[0][j][I + i]), and EP rank 1's w2
    starts with expert 2's down_proj transposed."""
    self_check()
    w = expected("bf16_tp2", 1, 1)["model.layers.0.mlp.experts.w13_weight"]
    gu = full_tensor("model.layers.0.mlp.experts.gate_up_proj", (E, H, 2 * I), 1)
    assert w.shape == (E, I, H) and w[0, 5, 7] == gu[0, 7, I + 5] and w[3, I - 1, H - 1] == gu[3, H - 1, 2 * I - 1]
    w2 = expected("bf16_ep2_moved", 1, 1)["model.layers.1.mlp.experts.w2_weight"]
    dn = full_tensor("model.layers.1.mlp.experts.down_proj", (E, I, H), 1)
    assert w2.shape == (2, H, I) and w2[0, 3, 9] == dn[2, 9, 3] and w2[1, H - 1, 0] == dn[3, 0, H - 1]


def main():
    tests = [("reference", lambda _t: reference_check())]
    tests += [(c, lambda t, c=c: run_case(c, t)) for c in CASES]
    return _procs.run_tests("python_transpose", tests, sys.argv[1:], "wb-py-transpose.")


BIN = os.environ.get("WB_BIN", os.path.join(ROOT, "build/bin"))

if __name__ == "__main__":
    sys.exit(_procs.child_or_main(sys.argv, run_trainer, run_rollout, main, wb.WeightbridgeError))
