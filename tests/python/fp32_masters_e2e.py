#!/usr/bin/env python3
"""fp32_masters_e2e.py — trainers that hold FP32 (or FP16) parameters, as FSDP2 with a
mixed-precision policy and many trainers' FP32 masters do (issue #31). Two trainer processes
register FP32/FP16 numpy shards; the controller plans casts and quantizations from those dtypes;
the rollouts (BF16, 2 replicas; or FP8 128x128 blocks) receive every tensor cast on the fly, and
every rollout byte is compared, inside the rollout's post-update hook, with what numpy computes
here independently from the trainers' full tensors:

- BF16 from FP32: round to nearest even on the float32 bits, (b + 0x7fff + ((b >> 16) & 1)) >> 16,
  which is PyTorch's tensor.to(torch.bfloat16): values past BF16's largest round to inf, NaN
  (any sign or payload) becomes the canonical quiet NaN 0x7fc0 (torch's scalar rule; torch's
  vectorized CPU path writes 0xffff and its CUDA path 0x7fff: every one a NaN).
  BF16 from FP16: the FP16 value (exact in FP32), rounded the same way.
- FP8 from FP32: the FP32 master is first cast to BF16 as above and that BF16 tensor quantized
  (DeepGEMM's per_block_cast_to_fp8): the rollout receives exactly what it would have received
  from a trainer holding the BF16 cast of its masters. The test also quantizes the FP32 values
  directly and checks that the two differ, so it tells the two rules apart.
- FP8 from FP16: the FP16 values quantized as they are (a trainer training in FP16).

The full tensors carry the cases the cast must get right in their first row: NaN (quiet,
signalling, negative with payload), +-inf, FP32 values above BF16's range (overflow to inf) and
at its edge (a tie that rounds to inf, one just below it), FP32 subnormals (ties included),
ties to even in both directions, -0. FP8 cases keep NaN and inf to one tensor each (a NaN block
is all 0x7f with a NaN scale; an inf block quantizes its finite values to 0).

Cases: derived layouts (no trainer_layout: every tensor's dtype is what the trainers registered),
and layout files whose `dtype:` / `dtypes:` say which tensors are held in which dtype (mixed:
FP16 weights with FP32 norms; BF16 attention with FP32 MLP and norms).

Usage: fp32_masters_e2e.py [case...]   (the harness: WB_BIN names the programs' directory)
Prints harness lines, "case X: rollout R version V: 0 of N bytes differ", and the tally.
"""

import json
import os
import random
import subprocess
import sys
import time
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import numpy as np  # noqa: E402

import weightbridge as wb  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _procs  # noqa: E402  (waiting for a job's processes)

TOKEN = os.environ.setdefault("WB_E2E_TOKEN", "e2e-fp32-%d" % random.randrange(1 << 30))
VERSIONS = (1, 2)
TRAINERS = 2
FP8_QC = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
          "activation_scheme": "dynamic"}
CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 64,
          "hidden_size": 256, "intermediate_size": 384, "num_attention_heads": 4,
          "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 512,
          "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
# name: (FP8 rollout, mode, replicas, layout dtypes (None: derived), held dtype of a name)
CASES = {
    "fp32_bf16_derived": (False, "auto", 2, None, lambda n: "fp32"),
    "fp32_fp8_derived": (True, "auto", 1, None, lambda n: "fp32"),
    "fp32_fp8_gather": (True, "gather", 1, None, lambda n: "fp32"),
    "fp16_bf16_derived": (False, "auto", 1, None, lambda n: "fp16"),
    "fp16_fp8_derived": (True, "auto", 1, None, lambda n: "fp16"),
    "mixed_fp16_bf16_layout": (False, "auto", 2,
                               "dtype: fp16\ndtypes:\n  - {match: \"*norm*\", dtype: fp32}\n",
                               lambda n: "fp32" if "norm" in n else "fp16"),
    "mixed_fp8_layout": (True, "auto", 1,
                         "dtypes:\n  - {match: \"*norm*\", dtype: fp32}\n"
                         "  - {match: \"model.layers.{layer}.mlp.*\", dtype: fp32}\n",
                         lambda n: "fp32" if "norm" in n or ".mlp." in n else "bf16"),
}
# Refused: name -> (layout dtypes (None: derived), held dtype of (name, rank), lines every
# trainer's error must hold ({r}: its rank)). Nothing is planned, every process exits with the reason.
REFUSED = {
    "refused_ranks_disagree": (
        None, lambda n, r: "fp16" if r == 1 and n == "model.norm.weight" else "fp32",
        ["model.norm.weight: trainer rank 0 holds it in fp32, trainer rank 1 in fp16"]),
    "refused_layout_says_bf16": (
        "", lambda n, r: "fp32",
        ["trainer rank {r}: model.layers.0.mlp.up_proj.weight: dtype fp32, expected bf16",
         "trainer rank {r}: trainers holding fp32 parameters say so in the trainer layout (`dtype: "
         "fp32`, or `dtypes:` per tensor), or leave trainer_layout out to plan for the dtypes they "
         "register; the rollouts get them cast"]),
}
NP_OF = {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16}


def held_of(case, name, rank):
    if case in REFUSED:
        return REFUSED[case][1](name, rank)
    return CASES[case][4](name)


def case_of(case):
    """(FP8 rollout, mode, replicas, layout dtypes) of a case or a refused one."""
    if case in REFUSED:
        return (False, "auto", 1, REFUSED[case][0])
    return CASES[case][:4]


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------- the model, independently


def named_parameters(c):
    """(name, global shape) in the order transformers' named_parameters() gives them."""
    H, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    NH, NKV, HD, I = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["intermediate_size"]
    out = [("model.embed_tokens.weight", (V, H))]
    for l in range(L):
        p = f"model.layers.{l}."
        out += [(p + "self_attn.q_proj.weight", (NH * HD, H)), (p + "self_attn.k_proj.weight", (NKV * HD, H)),
                (p + "self_attn.v_proj.weight", (NKV * HD, H)), (p + "self_attn.o_proj.weight", (H, NH * HD)),
                (p + "self_attn.q_norm.weight", (HD,)), (p + "self_attn.k_norm.weight", (HD,)),
                (p + "mlp.gate_proj.weight", (I, H)), (p + "mlp.up_proj.weight", (I, H)),
                (p + "mlp.down_proj.weight", (H, I)),
                (p + "input_layernorm.weight", (H,)), (p + "post_attention_layernorm.weight", (H,))]
    out += [("model.norm.weight", (H,)), ("lm_head.weight", (V, H))]
    return out


# FP32 bit patterns whose BF16 cast is easy to get wrong, with the cast worked out by hand.
SPECIALS_F32 = [
    (0x7FC00000, 0x7FC0),  # quiet NaN
    (0xFFC12345, 0x7FC0),  # negative NaN with a payload: the canonical NaN
    (0x7F800001, 0x7FC0),  # signalling NaN (truncating would give +inf)
    (0x7F800000, 0x7F80),  # +inf
    (0xFF800000, 0xFF80),  # -inf
    (0x7F7FFFFF, 0x7F80),  # FP32's largest: above BF16's largest, rounds to inf
    (0xFF7F8000, 0xFF80),  # a tie at BF16's largest (odd): rounds to -inf
    (0x7F7F7FFF, 0x7F7F),  # just below that tie: BF16's largest
    (0x00000001, 0x0000),  # the smallest FP32 subnormal rounds to +0
    (0x00008000, 0x0000),  # a subnormal tie, even: down
    (0x00018000, 0x0002),  # a subnormal tie, odd: up
    (0x807FFFFF, 0x8080),  # the largest subnormal (negative) rounds up to the smallest normal
    (0x80000000, 0x8000),  # -0
    (0x3F808000, 0x3F80),  # 1 + 2^-8: a tie, even: down
    (0x3F818000, 0x3F82),  # a tie, odd: up
    (0x3F80FFFF, 0x3F81),  # above the tie: up
    (0xBF808001, 0xBF81),  # negative, just above the tie: away from zero
]
# FP16 bit patterns and their BF16 cast: NaN, inf, subnormals (exact in BF16's range, rounded to
# its 8 bits), a tie.
SPECIALS_F16 = [
    (0x7E00, 0x7FC0), (0xFD01, 0x7FC0), (0x7C00, 0x7F80), (0xFC00, 0xFF80),
    (0x7BFF, 0x4780),  # 65504 = 0x477fe000 in FP32: rounds up to 65536
    (0x0001, 0x3380),  # 2^-24
    (0x03FF, 0x3880),  # 1023 * 2^-24 = 0x387fc000: rounds up to 2^-14
    (0x8000, 0x8000),
    (0x3C01, 0x3F80),  # 1 + 2^-10: below BF16's half step, down
    (0x3C03, 0x3F80),  # 1 + 3 * 2^-10 = 0x3f806000: down
    (0x3C04, 0x3F80),  # 1 + 2^-8 = 0x3f808000: a tie, even: down
    (0x3C0C, 0x3F82),  # 1 + 3 * 2^-8 = 0x3f818000: a tie, odd: up
]


def master(name, shape, version, held, fp8):
    """The trainers' full tensor `name` at `version` in the dtype they hold it in: normal values
    whose magnitude changes every 128 rows (so FP8 block scales differ), FP32 ones with random
    low bits (so the cast rounds), and the special values in the first row."""
    rng = np.random.default_rng([zlib.crc32(name.encode()), version])
    x = rng.standard_normal(shape, dtype=np.float32)
    mag = np.float32(2.0) ** rng.integers(-9, 3, size=-(-shape[0] // 128)).astype(np.float32)
    x *= np.repeat(mag, 128)[: shape[0]].reshape((-1,) + (1,) * (len(shape) - 1))
    if held == "bf16":
        return bf16_of_f32(x)
    flat = x.reshape(-1)
    if held == "fp16":
        h = x.astype(np.float16)
        sp = [s for s, _ in SPECIALS_F16 if not fp8 or specials_ok(name, s, 16)]
        h.reshape(-1).view(np.uint16)[: len(sp)] = sp
        return h
    sp = [s for s, _ in SPECIALS_F32 if not fp8 or specials_ok(name, s, 32)]
    flat.view(np.uint32)[: len(sp)] = sp
    return x


def specials_ok(name, bits, width):
    """In FP8 cases NaN and inf would take over their whole block: one tensor keeps the NaNs, one
    the infinities (and what overflows to them), the others only finite values."""
    f = (np.array([bits], np.uint32).view(np.float32) if width == 32
         else np.array([bits], np.uint16).view(np.float16).astype(np.float32))[0]
    if width == 32 and not np.isnan(f) and abs(float(f)) > 3.3895313892515355e38:
        f = np.float32(np.inf)  # what BF16 makes of it
    if np.isnan(f):
        return name == "model.layers.0.self_attn.o_proj.weight"
    if np.isinf(f):
        return name == "model.layers.1.mlp.down_proj.weight"
    return True


def bf16_of_f32(x):
    """float32 -> bfloat16 bits, round to nearest even on the bits; NaN -> 0x7fc0."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), r)


def bf16_of(held, t):
    if held == "bf16":
        return t
    return bf16_of_f32(t.astype(np.float32))  # FP16 -> FP32 is exact (numpy keeps NaN a NaN)


chunk = _procs.chunk


# e4m3fn's finite non-negative values, by code 0x00..0x7e (ascending)
E4M3 = np.array([(m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
                 for e in range(16) for m in range(8)][:127])


def to_e4m3(y):
    """float32 -> e4m3fn bits, round to nearest even (as PyTorch's .to(torch.float8_e4m3fn));
    NaN -> 0x7f."""
    nan = np.isnan(y)
    a = np.where(nan, 0, np.abs(y)).astype(np.float64)
    if a.size and a.max() >= 464.0:  # 480 and up would be NaN; the scaling never gets there
        raise AssertionError(f"value {a.max()} out of e4m3fn's range")
    hi = np.clip(np.searchsorted(E4M3, a), 1, 126)
    lo = hi - 1
    dlo, dhi = a - E4M3[lo], E4M3[hi] - a
    code = np.where((dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0)), hi, lo).astype(np.uint8)
    code = code | np.where(np.signbit(y), np.uint8(0x80), np.uint8(0))
    return np.where(nan, np.uint8(0x7F), code)


def per_block_cast_to_fp8(x):
    """DeepGEMM's per_block_cast_to_fp8 of a float32 matrix: (e4m3 bits, fp32 scale_inv bits).
    A block with a NaN has amax NaN: scale_inv is CUDA's NaN 0x7fffffff, every value 0x7f."""
    m, n = x.shape
    M, N = -(-m // 128), -(-n // 128)
    xp = np.zeros((M * 128, N * 128), np.float32)
    xp[:m, :n] = x
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        amax = np.maximum(np.abs(xp).reshape(M, 128, N, 128).max(axis=(1, 3)), np.float32(1e-4))
        t = (np.float32(1) / amax) * np.float32(448)
        q = to_e4m3(x * np.repeat(np.repeat(t, 128, 0), 128, 1)[:m, :n])
        s = (amax * np.float32(1 / 448)).astype(np.float32).view(np.uint32)
    return q, np.where(np.isnan(amax), np.uint32(0x7FFFFFFF), s)


def f32_of_bf16(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def quantized(held, t):
    """What the rollout gets of an FP8 tensor: FP32 through its BF16 cast, FP16/BF16 as held."""
    if held == "fp32":
        return per_block_cast_to_fp8(f32_of_bf16(bf16_of_f32(t)))
    if held == "fp16":
        return per_block_cast_to_fp8(t.astype(np.float32))
    return per_block_cast_to_fp8(f32_of_bf16(t))


def sources(name):
    fuse = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    for fused, parts in fuse.items():
        if f".{fused}." in name:
            return [name.replace(fused, p) for p in parts]
    return [name]


def expected(case, local, version):
    """{rollout tensor: expected array} for a TP-1 rollout rank's locals (wb.plan's list)."""
    fp8, held = CASES[case][0], CASES[case][4]
    shapes = dict(named_parameters(CONFIG))
    cache = {}

    def full(n):
        if n not in cache:
            cache[n] = master(n, shapes[n], version, held(n), fp8)
        return cache[n]

    want = {}
    for l in local:
        name = l["name"]
        scale = name.endswith("_scale_inv")
        base = name[: -len("_scale_inv")] if scale else name
        if scale or l["dtype"] == "fp8_e4m3":
            parts = [quantized(held(n), full(n))[1 if scale else 0] for n in sources(base)]
        else:
            parts = [bf16_of(held(n), full(n)) for n in sources(base)]
        t = np.concatenate(parts)
        if list(t.shape) != list(l["shape"]):
            raise AssertionError(f"{name}: expected shape {t.shape}, the plan says {l['shape']}")
        want[name] = t
    return want


NP = {"bf16": np.uint16, "fp8_e4m3": np.uint8, "fp32": np.float32}  # dlpack_e2e reads it


# ---------------------------------------------------------------- the processes


def run_trainer(case, rank, url, tmp):
    fp8 = case_of(case)[0]

    def held(n):
        return held_of(case, n, rank)

    arrays, tensors = {}, {}
    for name, shape in named_parameters(CONFIG):  # named_parameters() order, as DTensors do
        off, n = chunk(shape[0], TRAINERS, rank)
        arrays[name] = np.zeros((n,) + shape[1:], NP_OF[held(name)])
        tensors[name] = wb.Shard(arrays[name], shape, (off,) + (0,) * (len(shape) - 1), (0,))
    dtypes = {n: "bf16" for n in tensors if held(n) == "bf16"}  # numpy uint16 holding bf16
    t = wb.Trainer(url, tensors=tensors, rank=rank, token=TOKEN, dtypes=dtypes, tx_domain="lo",
                   timeout=60, mesh=[("d0", TRAINERS)])
    for v in VERSIONS:
        for name, shape in named_parameters(CONFIG):  # the optimizer step, in place
            off, n = chunk(shape[0], TRAINERS, rank)
            arrays[name][...] = master(name, shape, v, held(name), fp8)[off:off + n]
        p = t.push(v)
        p.sources(60)
        assert p.result(60).version == v
    t.close()


def run_rollout(case, rank, url, tmp):
    with open(os.path.join(tmp, "locals.json")) as f:
        local = json.load(f)
    _procs.checked_rollout(wb, url, rank, TOKEN, case, local, lambda v: expected(case, local, v), VERSIONS, log)


# ---------------------------------------------------------------- the harness


def write_case(case, tmp):
    fp8, mode, replicas, layout = case_of(case)
    cfg = dict(CONFIG)
    if fp8:
        cfg["quantization_config"] = FP8_QC
    paths = {k: os.path.join(tmp, f"{case}.{k}") for k in ("config.json", "trainer.yaml", "rollout.yaml", "job.yaml")}
    with open(paths["config.json"], "w") as f:
        json.dump(cfg, f)
    with open(paths["rollout.yaml"], "w") as f:
        f.write(f"replicas: {replicas}\ngpus_per_replica: 1\ntp: 1\n")
    with open(paths["trainer.yaml"], "w") as f:
        f.write(f"world_size: {TRAINERS}\nmesh:\n  - {{name: d0, size: {TRAINERS}}}\n"
                "placements:\n  - match: \"*\"\n    place: {d0: shard(0)}\n" + (layout or ""))
    trainer = f"trainers: {TRAINERS}" if layout is None else f"trainer_layout: {paths['trainer.yaml']}"
    with open(paths["job.yaml"], "w") as f:
        f.write(f"""name: fp32-{case}
model:
  rules: {ROOT}/configs/models/qwen3.yaml
  hf_config: {paths["config.json"]}
{trainer}
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
    replicas = case_of(case)[2]
    d = os.path.join(tmp, case)
    os.makedirs(d)
    paths = write_case(case, d)
    plan = wb.plan(os.path.join(ROOT, "configs/models/qwen3.yaml"), paths["config.json"],
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
        procs = [("rollout", r, spawn("rollout", case, r, url, d)) for r in range(replicas)]
        procs += [("trainer", r, spawn("trainer", case, r, url, d)) for r in range(TRAINERS)]
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


def run_refused(case, tmp):
    """Every trainer is refused with the reason, and nothing is transferred."""
    want = REFUSED[case][2]
    d = os.path.join(tmp, case)
    os.makedirs(d)
    paths = write_case(case, d)
    plan = wb.plan(os.path.join(ROOT, "configs/models/qwen3.yaml"), paths["config.json"],
                   paths["trainer.yaml"], paths["rollout.yaml"], tables=True)
    with open(os.path.join(d, "locals.json"), "w") as f:
        json.dump(plan["receive"][0]["local"], f)
    url = f"tcp://127.0.0.1:{20000 + random.randrange(12000)}"
    clog = open(os.path.join(d, "controller.log"), "w")
    cp = subprocess.Popen([os.path.join(BIN, "wb-controller"), "--config", paths["job.yaml"], "--listen", url],
                          env=dict(os.environ, WB_TOKEN=TOKEN), stdout=clog, stderr=subprocess.STDOUT)
    procs = [("rollout", 0, spawn("rollout", case, 0, url, d))]
    procs += [("trainer", r, spawn("trainer", case, r, url, d)) for r in range(TRAINERS)]
    try:
        for role, r, p in procs[1 if REFUSED[case][0] is not None else 0:]:
            out, _ = p.communicate(timeout=120)
            text = out.decode()
            lines = [w.format(r=r) for w in want]
            if role == "trainer" and (p.returncode != 3 or any(w not in text for w in lines)):
                raise AssertionError(f"trainer {r} exited {p.returncode}, expected 3 and\n  " +
                                     "\n  ".join(lines) + f"\nin:\n{text}")
        log(f"    case {case}: refused: {want[0].format(r=0)}")
        st = ctl(url, "status").stdout
        if "version 0, in flight: none" not in st:
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


def self_check():
    """The numpy reference against the values worked out by hand above, so a wrong reference
    cannot pass by agreeing with a wrong library; and the FP8 rule told apart from quantizing
    FP32 directly."""
    bits = np.array([s for s, _ in SPECIALS_F32], np.uint32)
    got = bf16_of_f32(bits.view(np.float32)).tolist()
    assert got == [w for _, w in SPECIALS_F32], [hex(g) for g in got]
    h = np.array([s for s, _ in SPECIALS_F16], np.uint16).view(np.float16)
    got = bf16_of("fp16", h).tolist()
    assert got == [w for _, w in SPECIALS_F16], [hex(g) for g in got]
    # a block whose BF16 cast overflows: amax inf, finite values to (signed) 0, inf to 0x7f
    x = np.array([[1.0, -2.0], [3.4e38, 0.5]], np.float32)
    q, s = quantized("fp32", x)
    assert q.tolist() == [[0x00, 0x80], [0x7F, 0x00]] and s.tolist() == [[0x7F800000]], (q, s)
    # quantized directly, the same FP32 values stay finite
    q2, s2 = per_block_cast_to_fp8(x)
    assert q2[1, 0] == 0x7E and s2[0, 0] != 0x7F800000, (q2, s2)
    # a NaN block: every value 0x7f, scale_inv CUDA's NaN
    q, s = quantized("fp32", np.array([[np.nan, 1.0]], np.float32))
    assert q.tolist() == [[0x7F, 0x7F]] and s.tolist() == [[0x7FFFFFFF]], (q, s)
    # the two FP8 rules differ on ordinary masters (double rounding), so the cases below tell
    # "cast to BF16, then quantize" from "quantize the FP32 values"
    m = master("model.layers.0.mlp.up_proj.weight", (384, 256), 1, "fp32", True)
    a, b = quantized("fp32", m)[0], per_block_cast_to_fp8(m)[0]
    ndiff = int((a != b).sum())
    assert ndiff > 0, "the BF16-first and the direct FP8 rules agree on a whole tensor"
    log(f"self_check: BF16-first vs direct FP32 quantization differ in {ndiff} of {a.size} bytes")


def main():
    tests = [("self_check", lambda _t: self_check())]
    tests += [(c, lambda t, c=c: run_case(c, t)) for c in CASES]
    tests += [(c, lambda t, c=c: run_refused(c, t)) for c in REFUSED]
    return _procs.run_tests("python_fp32", tests, sys.argv[1:], "wb-py-fp32.")


BIN = os.environ.get("WB_BIN", os.path.join(ROOT, "build/bin"))

if __name__ == "__main__":
    sys.exit(_procs.child_or_main(sys.argv, run_trainer, run_rollout, main, wb.WeightbridgeError))
