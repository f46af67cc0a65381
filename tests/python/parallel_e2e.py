#!/usr/bin/env python3
"""parallel_e2e.py — trainers on 2-D device meshes registering placements the controller derives
the layout from (no trainer layout file): HSDP (mesh (replicate 2, shard 2), four trainer
processes, each tensor Replicate x Shard(0)) where the plan reads from both replicas, pipeline
stages (wb.At(stage) on the pp dim: layers 0-1 and the embedding on stage 0, layers 2-3, the
final norm and lm_head on stage 1), and FSDP x EP (mesh (ep 2, fsdp 2): expert e only on ep
rank e // (experts / 2), split by rows over fsdp; everything else Replicate on ep, Shard(0) over fsdp).

Megatron-core trainers (wb.megatron.shards, the numpy entry of weightbridge/megatron.py): the
test builds a Megatron model from the HF full tensors by Megatron's own layouts, written here
(linear_qkv per query group, linear_fc1 [gate_r; up_r] per TP rank, padded vocab rows holding
junk), cuts it per rank as model chunks hold it (local layer and expert numbers, TP pieces,
virtual pipeline chunks) and registers that: TP 2, PP 2, virtual PP x TP, EP 2 and EP x TP, qwen3
and qwen3_moe, llama3 with tied embeddings over PP 2 (the last stage's copy not registered), the
megatron (TE) and megatron_local namings, BF16 and FP8 rollouts; the controller picks the naming
and sets mesh_tp from the registrations. Fused experts (transformers >= 5, the fused naming)
sharded over 2 trainers along dim 0 (experts) and dim 1.

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
import weightbridge.megatron  # noqa: E402,F401

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


def place_fused(dim):
    """transformers >= 5's fused experts split along `dim` over 2 trainers (0: the experts, 1:
    gate_up's rows / down's rows), everything else Shard(0)."""
    return lambda family, c, name: [dim if name.endswith(("gate_up_proj", "down_proj")) else 0]


def fused_parameters(family, c, version=None):
    """(name, global shape[, full tensor]) as transformers >= 5 holds a MoE model: a layer's
    experts as gate_up_proj [E, 2I, H] (per expert [gate; up]) and down_proj [E, H, I]."""
    out, E = [], c["num_experts"]
    for name, shape in _hf.named_parameters(family, c):
        m = re.match(r"(model\.layers\.\d+\.mlp\.experts\.)(\d+)\.(\w+)\.weight$", name)
        if not m:
            out.append((name, shape, (lambda n=name, s=shape: _hf.full_tensor(n, s, version))))
            continue
        if m.group(2) != "0" or m.group(3) == "up_proj":
            continue
        p = m.group(1)
        if m.group(3) == "gate_proj":
            out.append((p + "gate_up_proj", (E, 2 * shape[0], shape[1]), (lambda p=p, s=shape: np.stack([
                np.concatenate([_hf.full_tensor(f"{p}{e}.{q}.weight", s, version) for q in ("gate_proj", "up_proj")])
                for e in range(E)]))))
        else:
            out.append((p + "down_proj", (E,) + tuple(shape), (lambda p=p, s=shape: np.stack([
                _hf.full_tensor(f"{p}{e}.down_proj.weight", s, version) for e in range(E)]))))
    return out


def case(family, fp8, mesh, meshes, pieces, place=None, mcore=None, config=None, fused=False):
    """A case: the family and its config.json, FP8 rollout or not, the trainers' mesh, the plan's
    "meshes" and "pieces" lines, and either a placement per HF name (`place`) or a Megatron
    setup (`mcore`: naming, tp, pp, ep, vpp chunks per stage)."""
    return dict(family=family, fp8=fp8, mesh=mesh, meshes=meshes, pieces=pieces, place=place,
                mcore=mcore, config=config or _hf.CONFIGS[family], fused=fused)


# Megatron cases: head_dim 128 and 256-row gate/up pieces (FP8 rollouts need the grouped
# pieces on 128-row block edges), a vocab Megatron pads (500 -> 512 rows at TP 2).
MCORE = dict(_hf.CONFIGS["qwen3"], head_dim=128, intermediate_size=512, vocab_size=500)
MCORE_MOE = dict(_hf.CONFIGS["qwen3_moe"], head_dim=128, intermediate_size=512, vocab_size=500,
                 num_experts=4, moe_intermediate_size=512)
G1 = "1 in 1 mesh groups (phases): 1 meshes of <= 2 ranks"

CASES = {
    "hsdp_qwen3_bf16": case("qwen3", False, [("replicate", 2), ("shard", 2)],
                            "1 in 1 mesh groups (phases): 1 meshes of <= 4 ranks", "35 direct, 0 amax, 0 gather",
                            place=place_hsdp),
    "hsdp_qwen3_fp8": case("qwen3", True, [("replicate", 2), ("shard", 2)],
                           "1 in 1 mesh groups (phases): 1 meshes of <= 4 ranks", "27 direct, 8 amax, 0 gather",
                           place=place_hsdp),
    "pp2_qwen3_bf16": case("qwen3", False, [("pp", 2), ("fsdp", 2)],
                           "2 in 1 mesh groups (phases): 2 meshes of <= 2 ranks", "35 direct, 0 amax, 0 gather",
                           place=place_pp),
    "fsdp_ep_qwen3_moe_fp8": case("qwen3_moe", True, [("ep", 2), ("fsdp", 2)],
                                  "3 in 2 mesh groups (phases): 1 meshes of <= 4 ranks; 2 meshes of <= 2 ranks",
                                  "35 direct, 12 amax, 0 gather", place=place_fsdp_ep),
    "fused_dim0_qwen3_moe_fp8": case("qwen3_moe", True, [("fsdp", 2)], G1, "35 direct, 4 amax, 0 gather", place=place_fused(0),
                                     fused=True),
    "fused_dim1_qwen3_moe_fp8": case("qwen3_moe", True, [("fsdp", 2)], G1, "35 direct, 4 amax, 0 gather", place=place_fused(1),
                                     fused=True),
    "fused_dim0_qwen3_moe_bf16": case("qwen3_moe", False, [("fsdp", 2)], G1, "39 direct, 0 amax, 0 gather", place=place_fused(0),
                                      fused=True),
    "mcore_qwen3_tp2_bf16": case("qwen3", False, None, G1, "27 direct, 0 amax, 8 gather", config=MCORE,
                                 mcore=dict(naming="megatron", tp=2, pp=1, ep=1, vpp=1)),
    "mcore_qwen3_tp2_fp8_local": case("qwen3", True, None, G1, "27 direct, 0 amax, 8 gather", config=MCORE,
                                      mcore=dict(naming="megatron_local", tp=2, pp=1, ep=1, vpp=1)),
    "mcore_qwen3_pp2_fp8": case("qwen3", True, None, "2 in 1 mesh groups (phases): 2 meshes of <= 1 ranks",
                                "35 direct, 0 amax, 0 gather", config=MCORE,
                                mcore=dict(naming="megatron", tp=1, pp=2, ep=1, vpp=1)),
    "mcore_qwen3_vpp2_tp2_bf16": case("qwen3", False, None, "2 in 1 mesh groups (phases): 2 meshes of <= 2 ranks",
                                      "27 direct, 0 amax, 8 gather", config=MCORE,
                                      mcore=dict(naming="megatron", tp=2, pp=2, ep=1, vpp=2)),
    "mcore_llama3_pp2_tied_bf16": case("llama3", False, None, "2 in 1 mesh groups (phases): 2 meshes of <= 1 ranks",
                                       "26 direct, 0 amax, 0 gather", mcore=dict(naming="megatron", tp=1, pp=2, ep=1, vpp=1)),
    "mcore_qwen3_moe_ep2_fp8": case("qwen3_moe", True, None,
                                    "3 in 2 mesh groups (phases): 1 meshes of <= 2 ranks; 2 meshes of <= 1 ranks",
                                    "47 direct, 0 amax, 0 gather", config=MCORE_MOE,
                                    mcore=dict(naming="megatron", tp=1, pp=1, ep=2, vpp=1)),
    "mcore_qwen3_moe_ep2_tp2_bf16_local": case("qwen3_moe", False, None,
                                               "3 in 2 mesh groups (phases): 1 meshes of <= 4 ranks; 2 meshes of <= 2 ranks",
                                               "35 direct, 0 amax, 12 gather", config=MCORE_MOE,
                                               mcore=dict(naming="megatron_local", tp=2, pp=1, ep=2, vpp=1)),
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


def cut(full, off, ext):
    return full[tuple(slice(o, o + e) for o, e in zip(off, ext))]


def world_of(k):
    m = k["mcore"]
    if m:
        return m["tp"] * m["pp"] * m["ep"]
    w = 1
    for _, s in k["mesh"]:
        w *= s
    return w


# ---------------------------------------------------------------- Megatron, independently


def mcore_full(k, version):
    """The Megatron-core model's GLOBAL tensors (global layer and expert numbers), built from
    the HF full tensors by Megatron's own layouts: linear_qkv per query group [q heads; k; v],
    linear_fc1 [gate_r; up_r] per TP rank r, the vocab padded to a multiple of 128 x TP (pad
    rows hold values the rollout must never see)."""
    family, c, m = k["family"], k["config"], k["mcore"]
    te, T = m["naming"] == "megatron", m["tp"]
    shapes = dict(_hf.named_parameters(family, c))

    def hf(n):
        return _hf.full_tensor(n, shapes[n], version)

    V = c["vocab_size"]
    padded = -(-V // (128 * T)) * 128 * T

    def pad(x):
        junk = _hf.full_tensor("padding", (padded - V,) + x.shape[1:], version)
        return np.concatenate([x, junk])

    def fc1(gate, up):
        return np.concatenate([np.concatenate([np.array_split(g, T)[r], np.array_split(u, T)[r]])
                               for r in range(T) for g, u in [(gate, up)]])

    out = {"embedding.word_embeddings.weight": pad(hf("model.embed_tokens.weight")),
           "decoder.final_layernorm.weight": hf("model.norm.weight")}
    # tied: the last stage holds a copy of the embedding as output_layer.weight (not registered)
    out["output_layer.weight"] = out["embedding.word_embeddings.weight"] if c["tie_word_embeddings"] \
        else pad(hf("lm_head.weight"))
    NH, NKV = c["num_attention_heads"], c["num_key_value_heads"]
    HD = c.get("head_dim", c["hidden_size"] // NH)
    R = NH // NKV
    for L in range(c["num_hidden_layers"]):
        h, d = f"model.layers.{L}.", f"decoder.layers.{L}."
        q, kk, v = hf(h + "self_attn.q_proj.weight"), hf(h + "self_attn.k_proj.weight"), hf(h + "self_attn.v_proj.weight")
        out[d + "self_attention.linear_qkv.weight"] = np.concatenate(
            [np.concatenate([q[g * R * HD:(g + 1) * R * HD], kk[g * HD:(g + 1) * HD], v[g * HD:(g + 1) * HD]])
             for g in range(NKV)])
        out[d + ("self_attention.linear_qkv.layer_norm_weight" if te else "input_layernorm.weight")] = \
            hf(h + "input_layernorm.weight")
        if family != "llama3":
            out[d + "self_attention.q_layernorm.weight"] = hf(h + "self_attn.q_norm.weight")
            out[d + "self_attention.k_layernorm.weight"] = hf(h + "self_attn.k_norm.weight")
        out[d + "self_attention.linear_proj.weight"] = hf(h + "self_attn.o_proj.weight")
        if family == "qwen3_moe":
            out[d + "pre_mlp_layernorm.weight"] = hf(h + "post_attention_layernorm.weight")
            out[d + "mlp.router.weight"] = hf(h + "mlp.gate.weight")
            for e in range(c["num_experts"]):
                x = f"{h}mlp.experts.{e}."
                g1, g2 = fc1(hf(x + "gate_proj.weight"), hf(x + "up_proj.weight")), hf(x + "down_proj.weight")
                if te:
                    out[f"{d}mlp.experts.linear_fc1.weight{e}"] = g1
                    out[f"{d}mlp.experts.linear_fc2.weight{e}"] = g2
                else:
                    out[f"{d}mlp.experts.local_experts.{e}.linear_fc1.weight"] = g1
                    out[f"{d}mlp.experts.local_experts.{e}.linear_fc2.weight"] = g2
        else:
            out[d + ("mlp.linear_fc1.layer_norm_weight" if te else "pre_mlp_layernorm.weight")] = \
                hf(h + "post_attention_layernorm.weight")
            out[d + "mlp.linear_fc1.weight"] = fc1(hf(h + "mlp.gate_proj.weight"), hf(h + "mlp.up_proj.weight"))
            out[d + "mlp.linear_fc2.weight"] = hf(h + "mlp.down_proj.weight")
    return out


def mcore_tp_dim(name):
    """Megatron's tensor-parallel split of a parameter (column: 0, row: 1), by its layer type."""
    if re.search(r"(linear_qkv|linear_fc1)\.weight\d*$|word_embeddings\.weight$|output_layer\.weight$", name):
        return 0
    if re.search(r"(linear_proj|linear_fc2)\.weight\d*$", name):
        return 1
    return None


def mcore_locals(k, rank, version):
    """What trainer `rank` holds, as its model chunks' named_parameters() give it: local layer
    numbers per chunk, local expert numbers, its TP piece. Returns ([named locals per chunk],
    [global layer of each chunk's layer 0], (tp, pp, ep) coordinates)."""
    c, m = k["config"], k["mcore"]
    T, P, E, V = m["tp"], m["pp"], m["ep"], m["vpp"]
    tp, ep, pp = rank % T, (rank // T) % E, rank // (T * E)
    Lc = c["num_hidden_layers"] // (P * V)
    per = c.get("num_experts", E) // E
    chunks, offsets = [[] for _ in range(V)], [(v * P + pp) * Lc for v in range(V)]
    for name, full in mcore_full(k, version).items():
        lm = re.match(r"decoder\.layers\.(\d+)\.(.*)", name)
        if lm:
            j, local = divmod(int(lm.group(1)), Lc)
            if j % P != pp:
                continue
            ci, rest = j // P, lm.group(2)
            em = re.search(r"(local_experts\.|linear_fc[12]\.weight)(\d+)", rest)
            if em:
                e = int(em.group(2))
                if e // per != ep:
                    continue
                rest = rest[:em.start(2)] + str(e % per) + rest[em.end(2):]
            lname = f"decoder.layers.{local}.{rest}"
        elif name.startswith("embedding."):
            if pp != 0:
                continue
            ci, lname = 0, name
        else:
            if pp != P - 1:
                continue
            ci, lname = V - 1, name
        d = mcore_tp_dim(name)
        x = np.array_split(full, T, axis=d)[tp] if d is not None else full
        chunks[ci].append((lname, np.ascontiguousarray(x)))
    return chunks, offsets, (tp, pp, ep)


def build(case, rank, version):
    """(mesh, {name: wb.Shard}) trainer `rank` registers, holding `version`'s values."""
    k = CASES[case]
    c = k["config"]
    if k["mcore"]:
        m = k["mcore"]
        chunks, offsets, (tp, pp, ep) = mcore_locals(k, rank, version)
        return wb.megatron.shards(chunks, tp=(tp, m["tp"]), pp=(pp, m["pp"]), ep=(ep, m["ep"]),
                                  layer_offset=offsets, num_experts=c.get("num_experts"),
                                  tied_embeddings=c["tie_word_embeddings"], dtype="bf16")
    out = {}
    if k["fused"]:
        params = fused_parameters(k["family"], c, version)
    else:
        params = [(n, s, (lambda n=n, s=s: _hf.full_tensor(n, s, version)))
                  for n, s in _hf.named_parameters(k["family"], c)]
    for name, shape, full in params:
        p = k["place"](k["family"], c, name)
        b = box(k["mesh"], rank, shape, p)
        if b is not None:
            local = np.ascontiguousarray(cut(full(), *b))
            out[name] = wb.Shard(local, shape, b[0], p, "bf16")
    return k["mesh"], out


# ---------------------------------------------------------------- the processes


def run_trainer(case, rank, url, tmp):
    mesh, tensors = build(case, rank, VERSIONS[0])
    t = wb.Trainer(url, tensors=tensors, rank=rank, token=TOKEN, tx_domain="lo", timeout=60, mesh=mesh)
    sent = {}
    for v in VERSIONS:
        if v != VERSIONS[0]:  # the optimizer step, in place
            for n, s in build(case, rank, v)[1].items():
                tensors[n].local[...] = s.local
        p = t.push(v)
        p.sources(60)
        res = p.result(60)
        assert res.version == v
        sent[v] = res.bytes
    t.close()
    with open(os.path.join(tmp, f"trainer{rank}.json"), "w") as f:  # what this rank wrote
        json.dump(sent, f)


def run_rollout(case, rank, url, tmp):
    family, c = CASES[case]["family"], CASES[case]["config"]
    with open(os.path.join(tmp, "locals.json")) as f:
        local = json.load(f)
    _procs.checked_rollout(wb, url, rank, TOKEN, case, local, lambda v: _hf.expected(family, c, local, v), VERSIONS, log)


# ---------------------------------------------------------------- the harness


def write_case(case, tmp):
    k = CASES[case]
    family, fp8 = k["family"], k["fp8"]
    cfg = dict(k["config"])
    if fp8:
        cfg["quantization_config"] = _hf.FP8_QC
    paths = {k: os.path.join(tmp, f"{case}.{k}") for k in ("config.json", "trainer.yaml", "rollout.yaml", "job.yaml")}
    with open(paths["config.json"], "w") as f:
        json.dump(cfg, f)
    with open(paths["rollout.yaml"], "w") as f:
        f.write("replicas: 1\ngpus_per_replica: 1\ntp: 1\n")
    with open(paths["trainer.yaml"], "w") as f:  # for wb.plan's rollout list only
        f.write("world_size: 1\nmesh:\n  - {name: d0, size: 1}\nplacements:\n  - match: \"*\"\n    place: {d0: replicate}\n")
    world = world_of(k)
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
    family, meshes, pieces = CASES[case]["family"], CASES[case]["meshes"], CASES[case]["pieces"]
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
            if want is None:  # (not pinned for this case)
                log(f"    {key}: " + summary.split(f"  {key}: ")[1].split("\n")[0])
            elif f"  {key}: " not in summary or want not in summary.split(f"  {key}: ")[1].split("\n")[0]:
                raise AssertionError(f"expected {key}: ... {want} in the plan:\n{summary}")
        # every rank wrote part of every version, together every byte the rollout holds once:
        # with HSDP both replicas of each shard are sources (the plan balances over them)
        vocab = CASES[case]["config"]["vocab_size"]
        total = sum((vocab if l["name"] in ("model.embed_tokens.weight", "lm_head.weight") else l["shape"][0])
                    * int(np.prod(l["shape"][1:])) * np.dtype(NP[l["dtype"]]).itemsize
                    for l in local)  # (vLLM's vocab padding rows are not written)
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


def megatron_shards():
    """wb.megatron.shards: names renumbered, global shapes, offsets and placements exactly; every
    Megatron case's registrations put back together are the global tensors; and the refusals,
    each naming the parameter and why."""
    a = lambda *s: np.zeros(s, np.uint16)  # noqa: E731
    mesh, t = wb.megatron.shards(
        [("decoder.layers.0.self_attention.linear_qkv.weight", a(4, 8)),
         ("decoder.layers.1.mlp.experts.linear_fc1.weight1", a(6, 8)),
         ("decoder.layers.1.mlp.experts.local_experts.0.linear_fc2.weight", a(8, 3)),
         ("decoder.layers.1.pre_mlp_layernorm.weight", a(8)),
         ("output_layer.weight", a(5, 8))],
        tp=(1, 2), pp=(1, 2), ep=(1, 2), layer_offset=2, num_experts=4, dtype="bf16", tied_embeddings=True)
    assert mesh == [("pp", 2), ("edp", 1), ("ep", 2), ("tp", 2)], mesh
    got = {n: (list(x.shape), list(x.offset), x.placement) for n, x in t.items()}
    At = wb.At
    assert got == {
        "decoder.layers.2.self_attention.linear_qkv.weight": ([8, 8], [4, 0], [At(1), None, None, 0]),
        "decoder.layers.3.mlp.experts.linear_fc1.weight3": ([12, 8], [6, 0], [At(1), None, At(1), 0]),
        "decoder.layers.3.mlp.experts.local_experts.2.linear_fc2.weight": ([8, 6], [0, 3], [At(1), None, At(1), 1]),
        "decoder.layers.3.pre_mlp_layernorm.weight": ([8], [0], [At(1), None, None, None]),
    }, got  # (the tied output layer's copy is not registered)
    for name, shape, why in [
        ("decoder.layers.0.foo.weight", (2,), "not a Megatron-core GPT layer parameter this module "
         "knows (its tensor-parallel split is unknown)"),
        ("mtp.layers.0.enorm.weight", (2,), "multi-token prediction layers are not described"),
        ("decoder.layers.0.mlp.experts.linear_fc2.weight2", (2, 2),
         "local expert 2, but each of the 2 expert-parallel ranks holds 2 of 4"),
        ("embedding.word_embeddings.weight", (2, 2),
         "an embedding on pipeline stage 1, not the first (multi-token prediction layers are not described)"),
        ("vision_model.patch_embed.weight", (2,), "not a Megatron-core GPT parameter this module knows"),
    ]:
        _procs.raises(ValueError, f"{name}: {why}", wb.megatron.shards, [(name, a(*shape))],
                      tp=(0, 2), pp=(1, 2), ep=(0, 2), num_experts=4)
    _procs.raises(ValueError, "decoder.layers.0.mlp.experts.linear_fc1.weight0: a routed expert's "
                  "parameter, and the number of experts is not known", wb.megatron.shards,
                  [("decoder.layers.0.mlp.experts.linear_fc1.weight0", a(2, 2))])
    _procs.raises(ValueError, "num_experts 3 cannot be split evenly over 2 expert-parallel ranks",
                  wb.megatron.shards, [], ep=(0, 2), num_experts=3)
    _procs.raises(ValueError, "tp: rank 2 of size 2: expected 0 <= rank < size", wb.megatron.shards, [], tp=(2, 2))
    _procs.raises(ValueError, "2 model chunks and 1 layer offsets", wb.megatron.shards, [[], []], layer_offset=[0])
    # what the mesh assumes of Megatron's parallel state (from_model reads it from megatron)
    cp = wb.megatron.check_parallel
    cp(13, (1, 2), (0, 2), (1, 2), (1, 2), [5, 13])  # tp-cp-ep-dp-pp: 1 + 2 * (0 + 2 * (1 + 2 * 1))
    _procs.raises(ValueError, "rank 5: Megatron's rank order is not its default tp-cp-ep-dp-pp (this rank "
                  "is tp 1/2, ep 0/2, expert data-parallel 0/1, pp 1/2, which that order numbers 5, pipeline "
                  "group [1, 3]); weightbridge's mesh (pp, edp, ep, tp) follows that order",
                  cp, 5, (1, 2), (0, 2), (0, 1), (1, 2), [1, 3])  # tp-pp-dp: pp steps by 2
    _procs.raises(ValueError, "context parallelism 2: not described (the mesh has no cp dim); train with "
                  "context_parallel_size 1", cp, 0, (0, 1), (0, 1), (0, 1), (0, 1), [0], cp=2)
    _procs.raises(ValueError, "expert tensor parallelism 1 differs from tensor parallelism 2: not described",
                  cp, 0, (0, 2), (0, 1), (0, 1), (0, 1), [0], etp=1)
    # the test's Megatron model, cut per rank and registered, is its global tensors again
    for name, k in CASES.items():
        if not k["mcore"]:
            continue
        full, seen = mcore_full(k, 1), {}
        for r in range(world_of(k)):
            for n, x in build(name, r, 1)[1].items():
                g = seen.setdefault(n, np.full(x.shape, 0xFFFF, np.uint16))
                cut(g, x.offset, x.local.shape)[...] = x.local
        want = {n: f for n, f in full.items() if not (n == "output_layer.weight" and k["config"]["tie_word_embeddings"])}
        assert sorted(seen) == sorted(want), (name, sorted(set(seen) ^ set(want)))
        for n in want:
            assert (seen[n] == want[n]).all(), (name, n)


def main():
    tests = [("at_errors", lambda _t: at_errors()), ("megatron_shards", lambda _t: megatron_shards())]
    tests += [(c, lambda t, c=c: run_case(c, t)) for c in CASES]
    return _procs.run_tests("python_parallel", tests, sys.argv[1:], "wb-py-par.")


BIN = os.environ.get("WB_BIN", os.path.join(ROOT, "build/bin"))

if __name__ == "__main__":
    sys.exit(_procs.child_or_main(sys.argv, run_trainer, run_rollout, main, wb.WeightbridgeError))
