#!/usr/bin/env python3
"""endpoint_e2e.py — real Python processes through the weightbridge package: a controller runs
the demo job (a small Qwen3-MoE-shaped model, BF16 trainers FSDP 2 x EP 2 -> FP8 rollouts TP 2),
4 trainer processes register numpy shards of the demo model and push three versions, 2 rollout
processes register vLLM-layout FP8 buffers (values and weight_scale_inv scales, as vLLM holds
them) and wait; every rollout byte of every version is then checked against the independent CPU
reference (wb-ctl verify). Bad registrations (missing tensor, wrong shape, wrong box, wrong
dtype, duplicate, non-contiguous) each get their exact error and nothing is transferred. A
rollout tensor whose memory changed while a version landed fails that version, named, at every
trainer and rollout, and the version is not published.

What each rank holds is written here from the demo's files, independently of the planner:
trainer names and shapes from config.json in Hugging Face naming, boxes from the layout's rules
(FSDP shard(0) over fsdp x ep, experts split over ep), rollout tensors as vLLM's TP-2 layers
hold them. (The rollout list is also compared with what wb.plan() reports.)

Usage: endpoint_e2e.py            (the harness: WB_BIN names the programs' directory)
Prints harness lines and the tally "N passed, N failed, N skipped".
"""

import json
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import numpy as np  # noqa: E402

import weightbridge as wb  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _procs  # noqa: E402  (waiting for a job's processes)

JOB = os.path.join(ROOT, "configs/jobs/demo.yaml")
CONFIG = os.path.join(ROOT, "configs/jobs/demo/config.json")
SEED = 42  # the demo job's seed
VERSIONS = (1, 2, 3)
TOKEN = os.environ.setdefault("WB_E2E_TOKEN", "e2e-python-%d" % random.randrange(1 << 30))

# ---------------------------------------------------------------- the demo model, independently

with open(CONFIG) as f:
    C = json.load(f)
H, L, E = C["hidden_size"], C["num_hidden_layers"], C["num_experts"]
NH, NKV, HD = C["num_attention_heads"], C["num_key_value_heads"], C["head_dim"]
MI, V = C["moe_intermediate_size"], C["vocab_size"]
FSDP, EP, TP = 2, 2, 2


def trainer_inventory():
    """(name, global shape) of every trainer tensor, Hugging Face naming."""
    inv = [("model.embed_tokens.weight", (V, H)), ("model.norm.weight", (H,)), ("lm_head.weight", (V, H))]
    for l in range(L):
        p = f"model.layers.{l}."
        inv += [
            (p + "input_layernorm.weight", (H,)),
            (p + "post_attention_layernorm.weight", (H,)),
            (p + "self_attn.q_proj.weight", (NH * HD, H)),
            (p + "self_attn.k_proj.weight", (NKV * HD, H)),
            (p + "self_attn.v_proj.weight", (NKV * HD, H)),
            (p + "self_attn.o_proj.weight", (H, NH * HD)),
            (p + "self_attn.q_norm.weight", (HD,)),
            (p + "self_attn.k_norm.weight", (HD,)),
            (p + "mlp.gate.weight", (E, H)),
        ]
        for e in range(E):
            q = p + f"mlp.experts.{e}."
            inv += [(q + "gate_proj.weight", (MI, H)), (q + "up_proj.weight", (MI, H)), (q + "down_proj.weight", (H, MI))]
    return inv


def chunk(n, parts, i):
    """torch.chunk's piece i of n rows in `parts` pieces: (offset, length)."""
    size = -(-n // parts)
    off = min(i * size, n)
    return off, max(0, min(size, n - off))


def trainer_shards(rank):
    """{name: (global shape, offset, local shape)} of what trainer `rank` holds: ranks are
    row-major over (fsdp, ep); experts go to the ep coordinate owning them (E / EP each) and are
    split over fsdp; everything else is split over fsdp x ep along dim 0."""
    f, e_coord = divmod(rank, EP)
    out = {}
    for name, shape in trainer_inventory():
        if ".mlp.experts." in name:
            expert = int(name.split(".mlp.experts.")[1].split(".")[0])
            if expert // (E // EP) != e_coord:
                continue
            off, n = chunk(shape[0], FSDP, f)
        else:
            off, n = chunk(shape[0], FSDP * EP, f * EP + e_coord)
        if n == 0:
            continue
        out[name] = (shape, (off,) + (0,) * (len(shape) - 1), (n,) + tuple(shape[1:]))
    return out


def rollout_locals(rank):
    """{name: (dtype, local shape)} a vLLM TP-2 rank holds: qkv and gate/up fused, attention and
    experts FP8 128x128 blocks with FP32 weight_scale_inv, the vocabulary split by rows."""
    del rank  # both ranks hold the same shapes
    b = lambda n: -(-n // 128)  # noqa: E731
    out = {
        "model.embed_tokens.weight": ("bf16", (V // TP, H)),
        "model.norm.weight": ("bf16", (H,)),
        "lm_head.weight": ("bf16", (V // TP, H)),
    }
    qkv = (NH * HD + 2 * NKV * HD) // TP
    for l in range(L):
        p = f"model.layers.{l}."
        out.update({
            p + "input_layernorm.weight": ("bf16", (H,)),
            p + "post_attention_layernorm.weight": ("bf16", (H,)),
            p + "self_attn.q_norm.weight": ("bf16", (HD,)),
            p + "self_attn.k_norm.weight": ("bf16", (HD,)),
            p + "self_attn.qkv_proj.weight": ("fp8_e4m3", (qkv, H)),
            p + "self_attn.qkv_proj.weight_scale_inv": ("fp32", (b(NH * HD // TP) + 2 * b(NKV * HD // TP), b(H))),
            p + "self_attn.o_proj.weight": ("fp8_e4m3", (H, NH * HD // TP)),
            p + "self_attn.o_proj.weight_scale_inv": ("fp32", (b(H), b(NH * HD // TP))),
            p + "mlp.gate.weight": ("bf16", (E, H)),
            p + "mlp.experts.w13_weight": ("fp8_e4m3", (E, 2 * MI // TP, H)),
            p + "mlp.experts.w13_weight_scale_inv": ("fp32", (E, 2 * b(MI // TP), b(H))),
            p + "mlp.experts.w2_weight": ("fp8_e4m3", (E, H, MI // TP)),
            p + "mlp.experts.w2_weight_scale_inv": ("fp32", (E, b(H), b(MI // TP))),
        })
    return out


NP = {"bf16": np.uint16, "fp8_e4m3": np.uint8, "fp32": np.float32}

# ---------------------------------------------------------------- the processes


def fsdp_shards(rank, world=FSDP * EP):
    """FSDP2 over a 1-d mesh of every trainer: each tensor Shard(0) in `world` chunks."""
    out = {}
    for name, shape in trainer_inventory():
        off, n = chunk(shape[0], world, rank)
        out[name] = (shape, (off,) + (0,) * (len(shape) - 1), (n,) + tuple(shape[1:]))
    return out


def run_trainer(rank, url, mode=""):
    derived = mode in ("fsdp", "wrongbox")  # a layout derived from these placements
    shards = fsdp_shards(rank) if derived else trainer_shards(rank)
    arrays = {name: np.zeros(local, dtype=np.uint16) for name, (_, _, local) in shards.items()}
    place = (0,) if derived else None
    if mode == "wrongbox" and rank == 1:  # says Shard(0) but holds another rank's rows
        shards["model.norm.weight"] = fsdp_shards(2)["model.norm.weight"]
    tensors = {name: wb.Shard(arrays[name], shape, off, place) for name, (shape, off, _) in shards.items()}
    t = wb.Trainer(url, tensors=tensors, rank=rank, token=TOKEN, dtypes={n: "bf16" for n in shards},
                   tx_domain="lo", timeout=60, mesh=[("fsdp", FSDP * EP)] if derived else None)
    for v in VERSIONS:
        if mode == "moved" and v == 3:
            break  # rollout rank 1 closed itself after version 2
        for name, (shape, off, _) in shards.items():  # the "optimizer step"
            wb.synth_fill(arrays[name], name, SEED, v, shape, off, "bf16")
        p = t.push(v)
        if mode == "moved" and v == 2:
            try:
                p.sources(60)
                p.result(60)
                raise AssertionError("version 2 completed though a rollout tensor changed under it")
            except wb.PeerError as e:
                assert str(e) == "version 2 failed: rollout rank 1: post-update hook: " + MOVED, str(e)
            continue
        if mode == "hookfail" and v == 2:
            try:
                p.sources(60)  # says the version failed if that is known by then
                p.result(60)
                raise AssertionError("version 2 completed though a rollout's hook failed")
            except wb.PeerError as e:
                want = ("version 2 failed: rollout rank 1: post-update hook: ValueError: "
                        "engine refused version 2")
                assert str(e) == want, str(e)
            continue
        p.sources(60)
        assert p.result(60).version == v
    assert t.version == (1 if mode == "moved" else VERSIONS[-1])
    t.close()


# Rollout rank 1 of test_moved_buffer: its engine hook swaps a tensor's element type in place at
# version 2 (what an engine replacing a parameter amounts to); the package's check after it
# fails the version with this reason.
MOVED = ("model.norm.weight: its memory changed since it was registered (dtype uint16 -> float16); "
         "weightbridge writes registered memory in place")


def run_rollout(rank, url, dump, mode=""):
    bufs = {name: np.zeros(shape, dtype=NP[dt]) for name, (dt, shape) in rollout_locals(rank).items()}
    seen = []

    def hook(v):
        seen.append(v)
        if mode == "hookfail" and rank == 1 and v == 2:
            raise ValueError("engine refused version 2")
        if mode == "moved" and rank == 1 and v == 2:
            bufs["model.norm.weight"].dtype = np.float16

    r = wb.Rollout(url, bufs, rank=rank, token=TOKEN, dtypes={n: dt for n, (dt, _) in rollout_locals(rank).items()},
                   hook=hook, tx_domain="lo", dump=dump, timeout=60)
    if mode == "moved":
        assert r.wait(1, 60) >= 1
        try:
            r.wait(2, 60)
            raise AssertionError("wait(2) returned though version 2 failed")
        except wb.WeightbridgeError as e:
            failed = ("version 2 failed: rollout rank 1: post-update hook: " + MOVED + " (this rank's "
                      "tensors are torn: parts of it may have landed over version 1)")
            # rank 1's own wait may begin after its hook ran: the package's check then says it
            closed = f"rollout rank 1: {MOVED}: this Rollout is closed (register again)"
            assert str(e) in ((failed, closed) if rank == 1 else (failed,)), str(e)
        assert r.version == 1
        r.close()
        return
    for v in VERSIONS:
        if mode == "hookfail" and v == 2:
            try:
                r.wait(v, 60)
                raise AssertionError("wait(2) returned though version 2 failed")
            except wb.PeerError as e:  # a failed version (not JobEnded, not Timeout)
                want = ("version 2 failed: rollout rank 1: post-update hook: ValueError: engine refused "
                        "version 2 (this rank's tensors are torn: parts of it may have landed over "
                        "version 1)")
                assert str(e) == want, str(e)
                assert r.version == 1 and r.torn
            continue
        assert r.wait(v, 60) >= v
        assert not r.torn
    # the hook ran once per version, in order; another rank's hook failing version 2 may abort
    # it here before all its bytes landed, and then this hook never sees it
    want = [list(VERSIONS)]
    if mode == "hookfail" and rank != 1:
        want.append([v for v in VERSIONS if v != 2])
    assert seen in want, seen
    r.close()


def run_bad(case, url):
    """Registers trainer rank 0 wrongly (or right: case 'good'); prints the error text."""
    shards = trainer_shards(0)
    arrays = {name: np.zeros(local, dtype=np.uint16) for name, (_, _, local) in shards.items()}
    tensors = {name: wb.Shard(arrays[name], shape, off) for name, (shape, off, _) in shards.items()}
    dtypes = {n: "bf16" for n in shards}
    if case == "missing":
        del tensors["model.norm.weight"]
    elif case == "shape":
        a = np.zeros((H // 4, 7), dtype=np.uint16)  # a 2-d tensor for a 1-d one
        tensors["model.layers.0.input_layernorm.weight"] = wb.Shard(a, (H, 7), (0, 0))
    elif case == "box":
        name = "model.layers.1.self_attn.o_proj.weight"
        shape, off, local = shards[name]
        tensors[name] = wb.Shard(arrays[name], shape, (off[0] + 16, 0))
    elif case == "dtype":
        dtypes["model.layers.0.mlp.gate.weight"] = "fp16"
    elif case == "extra":
        tensors["model.layers.9.mlp.gate.weight"] = wb.Shard(np.zeros((1, H), np.uint16), (E, H), (0, 0))
        dtypes["model.layers.9.mlp.gate.weight"] = "bf16"
    elif case == "strided":
        name = "model.layers.0.self_attn.q_proj.weight"
        big = np.zeros((shards[name][2][0], 2 * H), dtype=np.uint16)
        tensors[name] = wb.Shard(big[:, ::2], shards[name][0], shards[name][1])
    elif case == "duplicate":
        pass  # registered below, twice
    try:
        if case == "duplicate":
            # The endpoint itself refuses a second tensor of one name before anything is sent.
            import ctypes
            ep = wb._Endpoint("trainer", url, 0, TOKEN, -1, {}, None, "lo", None, None, None, 5.0)
            ti = wb.info(wb.Shard(arrays["model.norm.weight"], (H,), (0,)), "bf16")
            ep._add("model.norm.weight", ti)
            ep._add("model.norm.weight", ti)
            del ctypes
        else:
            wb.Trainer(url, tensors=tensors, rank=0, token=TOKEN, dtypes=dtypes, tx_domain="lo", timeout=5)
    except wb.Timeout as e:  # a right registration waits for the rest of the job
        print("TIMEOUT", e, flush=True)
        sys.exit(4)
    except wb.ConfigError as e:  # refused: every problem listed
        print(e, flush=True)
        sys.exit(3)
    except wb.WeightbridgeError as e:  # the endpoint's own refusals (a duplicate name)
        print(e, flush=True)
        sys.exit(3)
    sys.exit(0)


# ---------------------------------------------------------------- the harness


def spawn(*args, log=None):
    env = dict(os.environ, WB_TOKEN=TOKEN)
    return subprocess.Popen([sys.executable, __file__, *map(str, args)], env=env,
                            stdout=log or subprocess.PIPE, stderr=subprocess.STDOUT)


class Controller:
    def __init__(self, tmp, job=JOB):
        self.port = 20000 + random.randrange(12000)  # below the ephemeral ports
        self.url = f"tcp://127.0.0.1:{self.port}"
        self.log = open(os.path.join(tmp, f"controller{self.port}.log"), "w")
        env = dict(os.environ, WB_TOKEN=TOKEN)
        self.p = subprocess.Popen([os.path.join(BIN, "wb-controller"), "--config", job, "--listen", self.url],
                                  env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def ctl(self, *args, timeout=30):
        env = dict(os.environ, WB_TOKEN=TOKEN)
        return subprocess.run([os.path.join(BIN, "wb-ctl"), "-c", self.url, "--timeout", "10s", *args],
                              env=env, capture_output=True, text=True, timeout=timeout)

    def stop(self):
        self.ctl("shutdown")
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.log.close()


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def test_three_versions(tmp):
    check(rollout_locals(0) == {l["name"]: (l["dtype"], tuple(l["shape"]))
                                for l in wb.plan(os.path.join(ROOT, "configs/models/qwen3_moe.yaml"), CONFIG,
                                                 os.path.join(ROOT, "configs/jobs/demo/trainer.yaml"),
                                                 os.path.join(ROOT, "configs/jobs/demo/rollout.yaml"),
                                                 tables=True)["receive"][0]["local"]},
          "the rollout tensors written here differ from what the planner gives rank 0")
    dump = os.path.join(tmp, "dump")
    os.makedirs(dump)
    c = Controller(tmp)
    procs = []
    try:
        for r in range(2):
            procs.append(("rollout", r, spawn("rollout", r, c.url, dump)))
        for r in range(FSDP * EP):
            procs.append(("trainer", r, spawn("trainer", r, c.url)))
        _procs.wait_all(procs, 180, print)
        st = c.ctl("status").stdout
        check(f"version {VERSIONS[-1]}, in flight: none" in st, "status: " + st)
        for v in VERSIONS:
            res = subprocess.run([os.path.join(BIN, "wb-ctl"), "verify", "--config", JOB, "--dump", dump,
                                  "--version", str(v)], capture_output=True, text=True, timeout=120)
            check(res.returncode == 0, f"verify {v}: {res.stdout}{res.stderr}")
            check(f"verify version {v}: 2 rollouts," in res.stdout and "every byte equals the reference" in res.stdout,
                  res.stdout)
    finally:
        for _, _, p in procs:
            if p.poll() is None:
                p.kill()
        c.stop()


def derived_job(tmp):
    """The demo job without a trainer layout: 4 trainers whose placements say it."""
    path = os.path.join(tmp, "derived.yaml")
    with open(path, "w") as f:
        f.write(f"""name: derived
model:
  rules: {ROOT}/configs/models/qwen3_moe.yaml
  hf_config: {CONFIG}
trainers: {FSDP * EP}
rollout_layout: {ROOT}/configs/jobs/demo/rollout.yaml
mem_cap: 4MiB
seed: {SEED}
""")
    return path


def test_derived_layout(tmp):
    """No trainer layout in the job: FSDP2-like trainers register Shard(0) placements on a
    4-rank mesh; the controller derives the layout, plans, and the bytes are right."""
    job = derived_job(tmp)
    dump = os.path.join(tmp, "dump-derived")
    os.makedirs(dump)
    c = Controller(tmp, job)
    procs = []
    try:
        for r in range(2):
            procs.append(("rollout", r, spawn("rollout", r, c.url, dump)))
        for r in range(FSDP * EP):
            procs.append(("trainer", r, spawn("trainer", r, c.url, "fsdp")))
        _procs.wait_all(procs, 180, print)
        res = subprocess.run([os.path.join(BIN, "wb-ctl"), "verify", "--config", JOB, "--dump", dump,
                              "--version", str(VERSIONS[-1])], capture_output=True, text=True, timeout=120)
        check(res.returncode == 0 and "every byte equals the reference" in res.stdout, res.stdout + res.stderr)
        plan = c.ctl("plan").stdout
        check("trainer" in plan, plan)
    finally:
        for _, _, p in procs:
            if p.poll() is None:
                p.kill()
        c.stop()


def test_derived_layout_refused(tmp):
    """A trainer whose box disagrees with its own placement: the derived plan refuses it with
    the tensor named, and nothing moves."""
    c = Controller(tmp, derived_job(tmp))
    procs = []
    try:
        for r in range(2):
            procs.append(("rollout", r, spawn("rollout", r, c.url, tmp)))
        for r in range(FSDP * EP):
            procs.append(("trainer", r, spawn("trainer", r, c.url, "wrongbox")))
        _, _, bad = procs[3]  # trainer rank 1
        out, _ = bad.communicate(timeout=120)
        text = out.decode()
        check(bad.returncode == 3, f"trainer 1 exited {bad.returncode}:\n{text}")
        check(f"trainer rank 1: controller {c.url}: register: 1 registration problem" in text, text)
        check("trainer rank 1: model.norm.weight: box [128:192], expected [64:128]" in text, text)
        st = c.ctl("status").stdout
        check("version 0, in flight: none" in st, st)
    finally:
        for _, _, p in procs:
            if p.poll() is None:
                p.kill()
        c.stop()


def run_failing_version(tmp, mode, verify):
    """The demo job with every process in `mode`, in which version 2 fails (each process checks
    its own side of that); then no rollout published version 2, and version `verify` is every
    byte right."""
    dump = os.path.join(tmp, f"dump-{mode}")
    os.makedirs(dump)
    c = Controller(tmp)
    procs = []
    try:
        for r in range(2):
            procs.append(("rollout", r, spawn("rollout", r, c.url, dump, mode)))
        for r in range(FSDP * EP):
            procs.append(("trainer", r, spawn("trainer", r, c.url, mode)))
        _procs.wait_all(procs, 180, print)
        for r in range(2):
            check(not os.path.exists(os.path.join(dump, f"rollout{r}.v2.bin")), "version 2 was dumped as complete")
        res = subprocess.run([os.path.join(BIN, "wb-ctl"), "verify", "--config", JOB, "--dump", dump,
                              "--version", str(verify)], capture_output=True, text=True, timeout=120)
        check(res.returncode == 0, res.stdout + res.stderr)
    finally:
        for _, _, p in procs:
            if p.poll() is None:
                p.kill()
        c.stop()


def test_hook_failure(tmp):
    """Rollout rank 1's post-update hook fails version 2: trainers' push(2).result() and every
    rollout's wait(2) raise with that reason, the rollouts still hold version 1, and version 3
    then completes."""
    run_failing_version(tmp, "hookfail", 3)


def test_moved_buffer(tmp):
    """Rollout rank 1's engine hook changes a registered tensor (its dtype, in place) while
    version 2 lands: the package's check after the hook fails version 2 naming the tensor, at
    every trainer and rollout; version 1 stays verified and version 2 is published nowhere."""
    run_failing_version(tmp, "moved", 1)


BAD = {
    "missing": ["register: 1 registration problem (nothing is planned for this rank until they are fixed):",
                "trainer rank 0: model.norm.weight: not registered (expected bf16 [256] box [0:64])"],
    "shape": ["trainer rank 0: model.layers.0.input_layernorm.weight: global shape [256, 7], expected [256]"],
    "box": ["trainer rank 0: model.layers.1.self_attn.o_proj.weight: box [16:80, 0:512], expected [0:64, 0:512]"],
    "dtype": ["trainer rank 0: model.layers.0.mlp.gate.weight: dtype fp16, expected bf16"],
    "extra": ["trainer rank 0: model.layers.9.mlp.gate.weight: registered, but the plan gives this rank no such tensor"],
    "strided": ["trainer rank 0: model.layers.0.self_attn.q_proj.weight: strides [512, 2] are not contiguous row-major; "
                "register a contiguous tensor"],
    "duplicate": ["model.norm.weight: registered twice"],
}


def test_bad_registrations(tmp):
    c = Controller(tmp)
    try:
        for case, want in BAD.items():
            p = spawn("bad", case, c.url)
            out, _ = p.communicate(timeout=60)
            text = out.decode()
            check(p.returncode == 3, f"{case}: exited {p.returncode}:\n{text}")
            for line in want:
                check(line in text, f"{case}: expected\n  {line}\nin\n{text}")
            prefix = f"trainer rank 0: controller {c.url}: register:" if case != "duplicate" else ""
            check(text.startswith(prefix), f"{case}: {text}")
        # nothing was registered, so nothing was set up or transferred
        st = c.ctl("status").stdout
        check("trainer      0 absent" in st, st)
        r = c.ctl("transfer", "--version", "1")
        check(r.returncode == 1 and r.stderr == "wb-ctl: not ready: waiting for trainer ranks 0-3 (not "
              "registered); rollout ranks 0-1 (not registered)\n", r.stderr)
    finally:
        c.stop()


def main():
    tests = [("three_versions", test_three_versions), ("bad_registrations", test_bad_registrations),
             ("derived_layout", test_derived_layout), ("derived_layout_refused", test_derived_layout_refused),
             ("hook_failure", test_hook_failure), ("moved_buffer", test_moved_buffer)]
    passed = failed = 0
    only = sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="wb-py-e2e.") as tmp:
        for name, fn in tests:
            if only and name not in only:
                continue
            print(f"python_endpoint {name} ...", flush=True)
            t0 = time.time()
            try:
                fn(tmp)
                print(f"ok python_endpoint {name} ({(time.time() - t0) * 1000:.0f} ms)", flush=True)
                passed += 1
            except Exception:  # noqa: BLE001 - a test's failure is reported and counted
                print("    " + traceback.format_exc().replace("\n", "\n    "))
                print(f"FAIL python_endpoint {name} ({(time.time() - t0) * 1000:.0f} ms)", flush=True)
                failed += 1
    print(f"{passed} passed, {failed} failed, 0 skipped")
    return 1 if failed else 0


BIN = os.environ.get("WB_BIN", os.path.join(ROOT, "build/bin"))

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "trainer":
        try:
            run_trainer(int(sys.argv[2]), sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "")
        except wb.WeightbridgeError as e:
            print(e, flush=True)
            sys.exit(3)
    elif len(sys.argv) > 1 and sys.argv[1] == "rollout":
        run_rollout(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else "")
    elif len(sys.argv) > 1 and sys.argv[1] == "bad":
        run_bad(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main())
