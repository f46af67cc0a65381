#!/usr/bin/env python3
"""parallel_e2e.py — trainers on 2-D device meshes registering placements the controller derives
the layout from (no trainer layout file): HSDP (mesh (replicate 2, shard 2), four trainer
processes, each tensor Replicate x Shard(0)) where the plan reads from both replicas, pipeline
stages (wb.At(stage) on the pp dim: layers 0-1 and the embedding on stage 0, layers 2-3, the
final norm and lm_head on stage 1), and FSDP x EP (mesh (ep 2, fsdp 2): expert e only on ep
rank e // (experts / 2), split by rows over fsdp; everything else Replicate on ep, Shard(0) over fsdp).

The trainers are real processes holding numpy shards, changed in place between versions; after
every version the rollout's post-update hook compares every byte it holds with what numpy
computes independently from the HF-named full tensors (tests/python/_hf.py: q/k/v and gate/up
fused, experts stacked, FP8 by DeepGEMM's per_block_cast_to_fp8). Each case also checks the
plan (`wb-ctl plan`: its meshes, its pieces, no trainer idle) and what every trainer rank
reports it wrote (Push.result().bytes): each wrote part of every version and together exactly
the rollout's bytes — for HSDP, so, both replicas of every shard are sources.

Usage: parallel_e2e.py [case...]   (the harness: WB_BIN names the programs' directory)
"""

import json
import os
import random
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import numpy as np  # noqa: E402

import weightbridge as wb  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _hf  # noqa: E402  (the model, independently)
import _procs  # noqa: E402  (waiting for a job's processes)

TOKEN = os.environ.setdefault("WB_E2E_TOKEN", "e2e-par-%d" % random.randrange(1 << 30))
VERSIONS = (1, 2)
NP = {"bf16": np.uint16, "fp8_e4m3": np.uint8, "fp32": np.float32}


def log(*a):
    print(*a, flush=True)


def layer_of(name):
    m = re.search(r"\.layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def expert_of(name):
    m = re.search(r"\.experts\.(\d+)\.", name)
    return int(m.group(1)) if m else None


# Placements per HF name, per case: a list with one entry per mesh dim (None, a dim, wb.At(i)).


def place_hsdp(family, c, name):
    return [None, 0]


def place_pp(family, c, name):
    L = c["num_hidden_layers"]
    layer = layer_of(name)
    if layer is not None:
        stage = layer * 2 // L
    else:
        stage = 0 if name == "model.embed_tokens.weight" else 1
    return [wb.At(stage), 0]


def place_fsdp_ep(family, c, name):
    e = expert_of(name)
    per = c["num_experts"] // 2
    return [wb.At(e // per) if e is not None else None, 0]


# name: (family, FP8 rollout, mesh, placement function, the plan's "meshes" and "pieces" lines)
CASES = {
    "hsdp_qwen3_bf16": ("qwen3", False, [("replicate", 2), ("shard", 2)], place_hsdp,
                        "1 in 1 mesh groups (phases): 1 meshes of <= 4 ranks", "35 direct, 0 amax, 0 gather"),
    "hsdp_qwen3_fp8": ("qwen3", True, [("replicate", 2), ("shard", 2)], place_hsdp,
                       "1 in 1 mesh groups (phases): 1 meshes of <= 4 ranks", "27 direct, 8 amax, 0 gather"),
    "pp2_qwen3_bf16": ("qwen3", False, [("pp", 2), ("fsdp", 2)], place_pp,
                       "2 in 1 mesh groups (phases): 2 meshes of <= 2 ranks", "35 direct, 0 amax, 0 gather"),
    "fsdp_ep_qwen3_moe_fp8": ("qwen3_moe", True, [("ep", 2), ("fsdp", 2)], place_fsdp_ep,
                              "3 in 2 mesh groups (phases): 1 meshes of <= 4 ranks; 2 meshes of <= 2 ranks",
                              "35 direct, 12 amax, 0 gather"),
}


def coords(mesh, rank):
    out = []
    for _, size in reversed(mesh):
        out.append(rank % size)
        rank //= size
    return out[::-1]


def box(mesh, rank, shape, place):
    """(offset, local shape) of rank's piece of a tensor, or None where it holds none (At)."""
    off, ext = [0] * len(shape), list(shape)
    for (_, size), c, p in zip(mesh, coords(mesh, rank), place):
        if isinstance(p, wb.At):
            if p.index != c:
                return None
        elif p is not None:
            o, n = _procs.chunk(ext[p], size, c)
            off[p] += o
            ext[p] = n
    return tuple(off), tuple(ext)


def registrations(case, rank):
    """{name: (global shape, offset, local shape, placement)} of trainer `rank`."""
    family, _, mesh, place, _, _ = CASES[case]
    c = _hf.CONFIGS[family]
    out = {}
    for name, shape in _hf.named_parameters(family, c):
        p = place(family, c, name)
        b = box(mesh, rank, shape, p)
        if b is not None:
            out[name] = (shape, b[0], b[1], p)
    return out


# ---------------------------------------------------------------- the processes


def run_trainer(case, rank, url, tmp):
    mesh = CASES[case][2]
    regs = registrations(case, rank)
    arrays = {n: np.zeros(r[2], np.uint16) for n, r in regs.items()}
    tensors = {n: wb.Shard(arrays[n], r[0], r[1], r[3]) for n, r in regs.items()}
    t = wb.Trainer(url, tensors=tensors, rank=rank, token=TOKEN, dtypes={n: "bf16" for n in tensors},
                   tx_domain="lo", timeout=60, mesh=mesh)
    sent = {}
    for v in VERSIONS:
        for n, (shape, off, ext, _) in regs.items():
            arrays[n][...] = _hf.full_tensor(n, shape, v)[tuple(slice(o, o + e) for o, e in zip(off, ext))]
        p = t.push(v)
        p.sources(60)
        res = p.result(60)
        assert res.version == v
        sent[v] = res.bytes
    t.close()
    with open(os.path.join(tmp, f"trainer{rank}.json"), "w") as f:  # what this rank wrote
        json.dump(sent, f)


def run_rollout(case, rank, url, tmp):
    family = CASES[case][0]
    c = _hf.CONFIGS[family]
    with open(os.path.join(tmp, "locals.json")) as f:
        local = json.load(f)
    bufs = {l["name"]: np.zeros(l["shape"], NP[l["dtype"]]) for l in local}
    total = sum(b.nbytes for b in bufs.values())
    differ = {}

    def hook(v):
        want = _hf.expected(family, c, local, v)
        bad, differ[v] = [], 0
        for name, b in bufs.items():
            n = int((b.view(np.uint8) != want[name].astype(b.dtype).view(np.uint8)).sum())
            if n:
                bad.append(f"{name}: {n} of {b.nbytes} bytes")
                differ[v] += n
        log(f"case {case}: rollout {rank} version {v}: {differ[v]} of {total} bytes differ")
        if bad:
            raise ValueError(f"{len(bad)} of {len(bufs)} tensors differ: " + "; ".join(bad[:12]))

    r = wb.Rollout(url, bufs, rank=rank, token=TOKEN, dtypes={l["name"]: l["dtype"] for l in local},
                   hook=hook, tx_domain="lo", timeout=60)
    for v in VERSIONS:
        assert r.wait(v, 60) >= v
    assert sorted(differ) == list(VERSIONS) and not any(differ.values()), differ
    r.close()


# ---------------------------------------------------------------- the harness


def write_case(case, tmp):
    family, fp8, mesh, _, _, _ = CASES[case]
    cfg = dict(_hf.CONFIGS[family])
    if fp8:
        cfg["quantization_config"] = _hf.FP8_QC
    paths = {k: os.path.join(tmp, f"{case}.{k}") for k in ("config.json", "trainer.yaml", "rollout.yaml", "job.yaml")}
    with open(paths["config.json"], "w") as f:
        json.dump(cfg, f)
    with open(paths["rollout.yaml"], "w") as f:
        f.write("replicas: 1\ngpus_per_replica: 1\ntp: 1\n")
    with open(paths["trainer.yaml"], "w") as f:  # for wb.plan's rollout list only
        f.write("world_size: 1\nmesh:\n  - {name: d0, size: 1}\nplacements:\n  - match: \"*\"\n    place: {d0: replicate}\n")
    world = 1
    for _, s in mesh:
        world *= s
    with open(paths["job.yaml"], "w") as f:  # no trainer_layout: derived from the placements
        f.write(f"""name: par-{case}
model:
  rules: {ROOT}/configs/models/{family}.yaml
  hf_config: {paths["config.json"]}
trainers: {world}
rollout_layout: {paths["rollout.yaml"]}
mode: auto
mem_cap: 1GiB
""")
    return paths, world


def spawn(*args):
    return subprocess.Popen([sys.executable, __file__, *map(str, args)], env=dict(os.environ, WB_TOKEN=TOKEN),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def ctl(url, *args):
    return subprocess.run([os.path.join(BIN, "wb-ctl"), "-c", url, "--timeout", "10s", *args],
                          env=dict(os.environ, WB_TOKEN=TOKEN), capture_output=True, text=True, timeout=30)


def run_case(case, tmp):
    family, _, _, _, meshes, pieces = CASES[case]
    d = os.path.join(tmp, case)
    os.makedirs(d)
    paths, world = write_case(case, d)
    plan = wb.plan(os.path.join(ROOT, "configs/models", family + ".yaml"), paths["config.json"],
                   paths["trainer.yaml"], paths["rollout.yaml"], tables=True)
    local = plan["receive"][0]["local"]
    with open(os.path.join(d, "locals.json"), "w") as f:
        json.dump(local, f)
    url = f"tcp://127.0.0.1:{20000 + random.randrange(12000)}"
    clog = open(os.path.join(d, "controller.log"), "w")
    cp = subprocess.Popen([os.path.join(BIN, "wb-controller"), "--config", paths["job.yaml"], "--listen", url],
                          env=dict(os.environ, WB_TOKEN=TOKEN), stdout=clog, stderr=subprocess.STDOUT)
    procs = []
    try:
        procs = [("rollout", 0, spawn("rollout", case, 0, url, d))]
        procs += [("trainer", r, spawn("trainer", case, r, url, d)) for r in range(world)]
        _procs.wait_all(procs, 180, log)
        summary = ctl(url, "plan").stdout
        for key, want in (("meshes", meshes), ("pieces (item x rollout GPU)", pieces),
                          ("per sender", f"(0 of {world} senders idle)")):
            if f"  {key}: " not in summary or want not in summary.split(f"  {key}: ")[1].split("\n")[0]:
                raise AssertionError(f"expected {key}: ... {want} in the plan:\n{summary}")
        # every rank wrote part of every version, together every byte the rollout holds once:
        # with HSDP both replicas of each shard are sources (the plan balances over them)
        total = sum(int(np.prod(l["shape"])) * np.dtype(NP[l["dtype"]]).itemsize for l in local)
        sent = []
        for r in range(world):
            with open(os.path.join(d, f"trainer{r}.json")) as f:
                sent.append({int(v): b for v, b in json.load(f).items()})
        for v in VERSIONS:
            per = [sent[r][v] for r in range(world)]
            log(f"    version {v}: bytes per trainer rank {per}, {sum(per)} of {total}")
            if sum(per) != total or min(per) == 0:
                raise AssertionError(f"version {v}: trainer ranks wrote {per} bytes, the rollout holds {total}")
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


def at_errors():
    """wb.At and a Shard's placement entries, checked before anything is registered."""
    _procs.raises(ValueError, "At(-1): a mesh coordinate is an int >= 0", wb.At, -1)
    _procs.raises(ValueError, "At('1'): a mesh coordinate is an int >= 0", wb.At, "1")
    a = np.zeros((2, 2), np.float32)
    assert wb.info(wb.Shard(a, (4, 2), (2, 0), [wb.At(1), 0, None])).placement == (-3, 0, -1)
    _procs.raises(ValueError, "placement entry 'x': None (replicated), a tensor dim >= 0 or At(i)",
                  wb.info, wb.Shard(a, (4, 2), (2, 0), ["x"]))


def main():
    tests = [("at_errors", lambda _t: at_errors())]
    tests += [(c, lambda t, c=c: run_case(c, t)) for c in CASES]
    return _procs.run_tests("python_parallel", tests, sys.argv[1:], "wb-py-par.")


BIN = os.environ.get("WB_BIN", os.path.join(ROOT, "build/bin"))

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("trainer", "rollout"):
        role, case, rank, url, tmp = sys.argv[1:6]
        try:
            (run_trainer if role == "trainer" else run_rollout)(case, int(rank), url, tmp)
        except wb.WeightbridgeError as e:
            print(e, flush=True)
            sys.exit(3)
    else:
        sys.exit(main())
