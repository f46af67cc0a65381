#!/usr/bin/env python3
"""naming_derived_e2e.py — trainers that name their tensors as Megatron-core does (issue #29):
2 trainer processes, a device mesh of one dim named "tp" (size 2), each registering its tensor-
parallel shard of the global Megatron tensors (numpy, wb.Shard: column-parallel Shard(0),
row-parallel Shard(1)), in a job that names neither a trainer layout nor a naming nor mesh_tp.
The controller derives the layout, sets mesh_tp = 2 from the mesh dim "tp" and chooses the
family's naming whose trainer inventory holds every registered name; after every version each
rollout byte is compared, in the rollout's post-update hook, with what numpy computes
independently from the Hugging Face full tensors (q/k/v and gate/up concatenated, the vocab's
first vocab_size rows). The trainers' Megatron tensors are made here from the same Hugging Face
tensors by Megatron's conventions (linear_qkv per query group [q; k; v], linear_fc1 per TP rank
[gate_r; up_r], the vocab padded to a multiple of 128 x TP), not by the family's rules.

Cases: megatron_local (qwen3: input_layernorm/pre_mlp_layernorm names), megatron (TE's fused
layer-norm names), and trainers registering one name no naming has: the controller refuses the
registrations with one line naming, per naming, how many registered names it lacks and the
first of them.

Usage: naming_derived_e2e.py [case...]   (the harness: WB_BIN names the programs' directory)
"""

import json
import os
import random
import subprocess
import sys
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import numpy as np  # noqa: E402

import weightbridge as wb  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _procs  # noqa: E402  (waiting for a job's processes)

TOKEN = os.environ.setdefault("WB_E2E_TOKEN", "e2e-naming-%d" % random.randrange(1 << 30))
VERSIONS = (1, 2)
TP = 2
CONFIG = {"head_dim": 64, "hidden_size": 256, "intermediate_size": 384, "num_attention_heads": 4,
          "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 500,
          "tie_word_embeddings": False, "torch_dtype": "bfloat16", "architectures": ["Qwen3ForCausalLM"],
          "model_type": "qwen3"}
# name: (naming the trainers use, an extra registered name no naming has)
CASES = {"megatron_local": ("megatron_local", None), "megatron": ("megatron", None),
         "unknown_name": ("megatron_local", "decoder.layers.0.self_attention.linear_qkv.bias")}


def log(*a):
    print(*a, flush=True)


def hf_shapes(c):
    H, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    NH, NKV, HD, I = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["intermediate_size"]
    out = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H)}
    for l in range(L):
        p = f"model.layers.{l}."
        out.update({p + "self_attn.q_proj.weight": (NH * HD, H), p + "self_attn.k_proj.weight": (NKV * HD, H),
                    p + "self_attn.v_proj.weight": (NKV * HD, H), p + "self_attn.o_proj.weight": (H, NH * HD),
                    p + "self_attn.q_norm.weight": (HD,), p + "self_attn.k_norm.weight": (HD,),
                    p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                    p + "mlp.down_proj.weight": (H, I), p + "input_layernorm.weight": (H,),
                    p + "post_attention_layernorm.weight": (H,)})
    return out


def full_tensor(name, shape, version):
    """A Hugging Face tensor at `version`, as BF16 bits."""
    rng = np.random.default_rng([zlib.crc32(name.encode()), version])
    x = rng.standard_normal(shape, dtype=np.float32)
    b = x.view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def megatron(c, naming, version):
    """{Megatron global tensor name: (bits, tp dim or None)} from the Hugging Face tensors."""
    hf = {n: full_tensor(n, s, version) for n, s in hf_shapes(c).items()}
    NH, NKV, HD, V = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["vocab_size"]
    mult = 128 * TP
    PV = -(-V // mult) * mult

    def padded(a):
        return np.concatenate([a, np.full((PV - V, a.shape[1]), 0x3F80, np.uint16)])

    out = {"embedding.word_embeddings.weight": (padded(hf["model.embed_tokens.weight"]), 0),
           "output_layer.weight": (padded(hf["lm_head.weight"]), 0),
           "decoder.final_layernorm.weight": (hf["model.norm.weight"], None)}
    qg = NH // NKV * HD
    for l in range(c["num_hidden_layers"]):
        h, d = f"model.layers.{l}.", f"decoder.layers.{l}."
        q, k, v = (hf[h + f"self_attn.{x}_proj.weight"] for x in "qkv")
        qkv = np.concatenate([p for g in range(NKV) for p in (q[g * qg:(g + 1) * qg], k[g * HD:(g + 1) * HD],
                                                               v[g * HD:(g + 1) * HD])])
        gate, up = hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"]
        s = gate.shape[0] // TP
        fc1 = np.concatenate([p for r in range(TP) for p in (gate[r * s:(r + 1) * s], up[r * s:(r + 1) * s])])
        te = naming == "megatron"
        out.update({d + "self_attention.linear_qkv.weight": (qkv, 0),
                    d + "self_attention.linear_proj.weight": (hf[h + "self_attn.o_proj.weight"], 1),
                    d + "self_attention.q_layernorm.weight": (hf[h + "self_attn.q_norm.weight"], None),
                    d + "self_attention.k_layernorm.weight": (hf[h + "self_attn.k_norm.weight"], None),
                    d + "mlp.linear_fc1.weight": (fc1, 0),
                    d + "mlp.linear_fc2.weight": (hf[h + "mlp.down_proj.weight"], 1),
                    d + ("self_attention.linear_qkv.layer_norm_weight" if te else "input_layernorm.weight"):
                        (hf[h + "input_layernorm.weight"], None),
                    d + ("mlp.linear_fc1.layer_norm_weight" if te else "pre_mlp_layernorm.weight"):
                        (hf[h + "post_attention_layernorm.weight"], None)})
    return out


def expected(c, local, version):
    """{rollout tensor: bits} for a TP-1 rollout's locals, from the Hugging Face tensors (the
    vocab's padding rows, up to a multiple of 64, are never written: zeros)."""
    hf = {n: full_tensor(n, s, version) for n, s in hf_shapes(c).items()}
    fuse = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    want = {}
    for l in local:
        name = l["name"]
        t = None
        for f, parts in fuse.items():
            if f".{f}." in name:
                t = np.concatenate([hf[name.replace(f, p)] for p in parts])
        t = hf[name] if t is None else t
        if name.endswith("embed_tokens.weight") or name == "lm_head.weight":  # vLLM's padding rows
            t = np.concatenate([t, np.zeros((l["shape"][0] - t.shape[0], t.shape[1]), np.uint16)])
        if list(t.shape) != list(l["shape"]):
            raise AssertionError(f"{name}: expected shape {t.shape}, the plan says {l['shape']}")
        want[name] = t
    return want


def run_trainer(case, rank, url, tmp):
    naming, extra = CASES[case]
    arrays, tensors, dims = {}, {}, {}
    for name, (full, dim) in megatron(CONFIG, naming, VERSIONS[0]).items():
        dims[name] = dim
        shape = full.shape
        if dim is None:
            off, n = 0, shape[0]
            arrays[name] = np.zeros(shape, np.uint16)
            offset = (0,) * len(shape)
        else:
            off, n = _procs.chunk(shape[dim], TP, rank)
            local = list(shape)
            local[dim] = n
            arrays[name] = np.zeros(local, np.uint16)
            offset = tuple(off if k == dim else 0 for k in range(len(shape)))
        tensors[name] = wb.Shard(arrays[name], shape, offset, (dim,))
    if extra:
        arrays[extra] = np.zeros((8,), np.uint16)
        tensors[extra] = wb.Shard(arrays[extra], (8,), (0,), (None,))
    t = wb.Trainer(url, tensors=tensors, rank=rank, token=TOKEN, dtypes={n: "bf16" for n in tensors},
                   tx_domain="lo", timeout=60, mesh=[("tp", TP)])
    for v in VERSIONS:
        for name, (full, dim) in megatron(CONFIG, naming, v).items():
            if dim is None:
                arrays[name][...] = full
            else:
                off, n = _procs.chunk(full.shape[dim], TP, rank)
                arrays[name][...] = full[off:off + n] if dim == 0 else full[:, off:off + n]
        p = t.push(v)
        p.sources(60)
        assert p.result(60).version == v
    t.close()




def run_rollout(case, rank, url, tmp):
    with open(os.path.join(tmp, "locals.json")) as f:
        local = json.load(f)
    _procs.checked_rollout(wb, url, rank, TOKEN, case, local, lambda v: expected(CONFIG, local, v), VERSIONS, log)


def spawn(*args):
    return subprocess.Popen([sys.executable, __file__, *map(str, args)], env=dict(os.environ, WB_TOKEN=TOKEN),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def ctl(url, *args):
    return subprocess.run([os.path.join(BIN, "wb-ctl"), "-c", url, "--timeout", "10s", *args],
                          env=dict(os.environ, WB_TOKEN=TOKEN), capture_output=True, text=True, timeout=30)


def run_case(case, tmp):
    naming, extra = CASES[case]
    d = os.path.join(tmp, case)
    os.makedirs(d)
    paths = {k: os.path.join(d, k) for k in ("config.json", "trainer.yaml", "rollout.yaml", "job.yaml")}
    with open(paths["config.json"], "w") as f:
        json.dump(CONFIG, f)
    with open(paths["rollout.yaml"], "w") as f:
        f.write("replicas: 1\ngpus_per_replica: 1\ntp: 1\n")
    with open(paths["trainer.yaml"], "w") as f:  # for wb.plan's list of the rollout's tensors only
        f.write(f"world_size: {TP}\nmesh:\n  - {{name: tp, size: {TP}}}\nplacements:\n"
                "  - match: \"*\"\n    place: {tp: replicate}\n")
    family = os.path.join(ROOT, "configs/models/qwen3.yaml")
    with open(paths["job.yaml"], "w") as f:  # no trainer_layout, naming or vars: all derived
        f.write(f"name: naming-{case}\nmodel:\n  rules: {family}\n  hf_config: {paths['config.json']}\n"
                f"trainers: {TP}\nrollout_layout: {paths['rollout.yaml']}\nmode: auto\nmem_cap: 1GiB\n")
    plan = wb.plan(family, paths["config.json"], paths["trainer.yaml"], paths["rollout.yaml"], tables=True,
                   naming=naming, vars="mesh_tp=%d" % TP)
    with open(os.path.join(d, "locals.json"), "w") as f:
        json.dump(plan["receive"][0]["local"], f)
    url = f"tcp://127.0.0.1:{20000 + random.randrange(12000)}"
    clog_path = os.path.join(d, "controller.log")
    clog = open(clog_path, "w")
    cp = subprocess.Popen([os.path.join(BIN, "wb-controller"), "--config", paths["job.yaml"], "--listen", url],
                          env=dict(os.environ, WB_TOKEN=TOKEN, WB_LOG="info"), stdout=clog,
                          stderr=subprocess.STDOUT)
    procs = []
    try:
        if extra:  # refused: every agent exits with the controller's refusal
            procs = [("rollout", 0, spawn("rollout", case, 0, url, d))]
            procs += [("trainer", r, spawn("trainer", case, r, url, d)) for r in range(TP)]
            for role, r, p in procs:
                out = p.communicate(timeout=120)[0].decode()
                if p.returncode != 3 or "the trainers' registrations cannot be planned (1 problem)" not in out:
                    raise AssertionError(f"{role} {r}: exit {p.returncode}, expected 3 (refused):\n{out}")
            with open(clog_path) as f:
                text = f.read()
            want = ("the trainers registered names that no naming of %s has (20 names): hf lacks 20 "
                    "(decoder.final_layernorm.weight, decoder.layers.0.input_layernorm.weight, "
                    "decoder.layers.0.mlp.linear_fc1.weight, ...); megatron lacks 5 "
                    "(decoder.layers.0.input_layernorm.weight, decoder.layers.0.pre_mlp_layernorm.weight, "
                    "decoder.layers.0.self_attention.linear_qkv.bias, ...); megatron_local lacks 1 "
                    "(decoder.layers.0.self_attention.linear_qkv.bias)" % family)
            if want not in text:
                raise AssertionError(f"the controller's log lacks the line:\n{want}\n---\n{text[-3000:]}")
            log(f"case {case}: refused, naming per naming what it lacks")
            return
        procs = [("rollout", 0, spawn("rollout", case, 0, url, d))]
        procs += [("trainer", r, spawn("trainer", case, r, url, d)) for r in range(TP)]
        _procs.wait_all(procs, 120, log)
        st = ctl(url, "status").stdout
        if f"version {VERSIONS[-1]}, in flight: none" not in st:
            raise AssertionError("status: " + st)
        with open(clog_path) as f:
            text = f.read()
        line = f"trainer naming {naming} (the registered names are its own)"
        if line not in text:
            raise AssertionError(f"the controller's log lacks: {line}\n{text[-3000:]}")
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


def main():
    tests = [(c, lambda t, c=c: run_case(c, t)) for c in CASES]
    return _procs.run_tests("python_naming", tests, sys.argv[1:], "wb-py-naming.")


BIN = os.environ.get("WB_BIN", os.path.join(ROOT, "build/bin"))

if __name__ == "__main__":
    sys.exit(_procs.child_or_main(sys.argv, run_trainer, run_rollout, main, wb.WeightbridgeError))
