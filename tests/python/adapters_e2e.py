#!/usr/bin/env python3
"""adapters_e2e.py — the logic every engine and framework adapter shares (weightbridge._adapter),
with real processes where it matters, and one test per adapter that runs where its engine or
framework is importable and is skipped otherwise.

The engine is a stand-in: an object graph of plain Python modules holding numpy arrays, shaped
and named as vLLM holds a model (fused projections, FP8 weights with weight_scale_inv, MLA
attention layers whose backend derives W_UK_T and W_UV from kv_b_proj in their
process_weights_after_loading, quantization-method objects with vLLM's class names and flags).
The controller, the trainers (wb-agent, synthetic values) and the transfers are real.

  mla_versions          a tiny DeepSeek-V3 job (2 trainers -> 2 FP8 rollouts, TP 2): the rollouts
                        register through the adapter path (discover, attest, MLA refresh,
                        RolloutBinding); after every version W_UK_T/W_UV are recomputed from the
                        kv_b_proj bytes that landed, in the memory they had, before wait() returns;
                        rank 1's post-processing breaks version 2, which fails everywhere with its
                        message; version 3 completes; every byte is checked by wb-ctl verify
  frameworks            the demo job with 4 numpy trainers driven through the verl (version 1),
                        NeMo-RL (2) and slime (3) trainer-side adapters and 2 rollouts waiting
                        through verl's, NeMo-RL's and SGLang's rollout-side calls; every byte
                        checked; the order pause -> push -> engine wait -> resume
  discovery, attestation, refresh, settings, commands, trainer_sync, callers
                        in-process, exact values and exact errors
  adapter_<name>        the real engine or framework, where importable

Usage: adapters_e2e.py [test ...]   (WB_BIN names the programs' directory)
Prints harness lines and the tally "N passed, N failed, N skipped".
"""

import asyncio
import hashlib
import importlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import weightbridge as wb  # noqa: E402
from weightbridge import _adapter as A  # noqa: E402

BIN = os.environ.get("WB_BIN", os.path.join(ROOT, "build/bin"))
FIX = os.path.join(ROOT, "tests/fixtures/adapters")
DS_CONFIG = os.path.join(FIX, "dsv3_tiny.json")
TOKEN = os.environ.setdefault("WB_E2E_TOKEN", "e2e-adapters-%d" % random.randrange(1 << 30))
NP = {"bf16": np.uint16, "fp8_e4m3": np.uint8, "fp32": np.float32}

# ---------------------------------------------------------------- the stand-in engine


class Module:
    """The part of torch.nn.Module the adapters use: parameters and submodules by attribute,
    named_parameters() (shared parameters listed once, as torch does), named_modules()."""

    def __init__(self):
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})

    def __getattr__(self, name):
        for store in ("_parameters", "_modules"):
            d = object.__getattribute__(self, store)
            if name in d:
                return d[name]
        raise AttributeError(name)

    def __setattr__(self, name, value):
        if isinstance(value, np.ndarray) and name in self._parameters:
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        else:
            object.__setattr__(self, name, value)

    def add(self, name, value):
        (self._modules if isinstance(value, Module) else self._parameters)[name] = value
        return value

    def named_modules(self, prefix=""):
        seen = set()
        stack = [(prefix, self)]
        while stack:
            p, m = stack.pop(0)
            if id(m) in seen:
                continue
            seen.add(id(m))
            yield p, m
            for n, c in m._modules.items():
                stack.append((f"{p}.{n}" if p else n, c))

    def named_parameters(self, prefix="", recurse=True):
        seen = set()
        mods = self.named_modules(prefix) if recurse else [(prefix, self)]
        for p, m in mods:
            for n, t in m._parameters.items():
                if id(t) in seen:
                    continue
                seen.add(id(t))
                yield (f"{p}.{n}" if p else n), t


def quant(cls, **attrs):
    """A quantization-method object with vLLM's class name and flags."""
    return type(cls, (), {})() if not attrs else type(cls, (), dict(attrs))()


def fp8_table():
    """float32 value of every FP8 E4M3FN byte."""
    out = np.zeros(256, np.float32)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            v = np.nan
        elif e == 0:
            v = (m / 8.0) * 2.0 ** -6
        else:
            v = (1 + m / 8.0) * 2.0 ** (e - 7)
        out[b] = -v if s else v
    return out


FP8 = fp8_table()


def dequant(w8, scale):
    w = FP8[w8]
    return w * np.kron(scale, np.ones((128, 128), np.float32))[: w.shape[0], : w.shape[1]]


def digest(a):
    return hashlib.sha256(np.ascontiguousarray(a).view(np.uint8)).hexdigest()[:16]


class MLAImpl:
    """vLLM's MLA backend implementation, as far as weight post-processing goes: W_UK_T and W_UV
    derived from kv_b_proj (dequantized) in process_weights_after_loading, new arrays each time."""

    def __init__(self, kv_b_proj, heads, nope, v, lora):
        self.kv_b_proj = kv_b_proj
        self.heads, self.nope, self.v, self.lora = heads, nope, v, lora
        self.calls = 0
        self.seen = []  # digest of kv_b_proj.weight at each call
        self.break_on_call = None

    def process_weights_after_loading(self, act_dtype):
        self.calls += 1
        self.seen.append(digest(self.kv_b_proj.weight))
        w = dequant(self.kv_b_proj.weight, self.kv_b_proj.weight_scale_inv).astype(act_dtype).T
        w = w.reshape(self.lora, self.heads, self.nope + self.v)
        uk, uv = w[..., : self.nope], w[..., self.nope:]
        self.W_UV = np.ascontiguousarray(uv.transpose(1, 0, 2))
        self.W_UK_T = np.ascontiguousarray(uk.transpose(1, 2, 0))
        if self.calls == self.break_on_call:
            self.W_UV = self.W_UV[..., : self.v // 2].copy()


class MLAAttention(Module):
    def __init__(self, impl):
        super().__init__()
        object.__setattr__(self, "impl", impl)
        self.add("kv_b_proj", impl.kv_b_proj)  # vLLM's layer holds it too: listed once

    def process_weights_after_loading(self, act_dtype):
        self.impl.process_weights_after_loading(act_dtype)


class PlainAttention(Module):
    """An attention layer without weight-derived tensors: the refresh must leave it alone."""

    def process_weights_after_loading(self, act_dtype):
        raise AssertionError("plain attention post-processing must not be re-run")


def ds_locals(rank):
    """(name, dtype, shape) of what a TP-2 rank of the tiny DeepSeek-V3 holds in vLLM's layout,
    as the planner lists it."""
    p = wb.plan(os.path.join(ROOT, "configs/models/deepseek_v3.yaml"), DS_CONFIG,
                os.path.join(FIX, "trainer.yaml"), os.path.join(FIX, "rollout.yaml"), tables=True)
    return [(l["name"], l["dtype"], tuple(l["shape"])) for l in p["receive"][rank]["local"]]


def build_engine(locals_, mla=True):
    """The stand-in vLLM model: every listed tensor a parameter of the module its name implies,
    FP8 linears and experts with Fp8LinearMethod / Fp8MoEMethod, the rest unquantized, and per
    layer an MLA attention (or a plain one) over kv_b_proj."""
    with open(DS_CONFIG) as f:
        C = json.load(f)
    root = Module()
    dtypes = {}
    for name, dt, shape in locals_:
        mod_path, pname = name.rsplit(".", 1)
        m = root
        for part in mod_path.split("."):
            if part not in m._modules:
                m.add(part, Module())
            m = m._modules[part]
        m.add(pname, np.zeros(shape, NP[dt]))
        dtypes[name] = dt
        if pname == "weight":
            if ".experts" in mod_path:
                pass
            elif any(n.startswith(mod_path + ".weight_scale_inv") for n, _, _ in locals_):
                object.__setattr__(m, "quant_method", quant("Fp8LinearMethod", weight_block_size=[128, 128],
                                                            use_marlin=False))
            elif mod_path.endswith(("_proj", "lm_head", "gate")):
                object.__setattr__(m, "quant_method", quant("UnquantizedLinearMethod"))
        if pname == "w13_weight":
            object.__setattr__(m, "quant_method", quant("Fp8MoEMethod", weight_block_size=[128, 128],
                                                        fp8_backend=type("B", (), {"name": "TRITON"})()))
    heads = C["num_attention_heads"] // 2
    impls = []
    for l in range(C["num_hidden_layers"]):
        sa = root._modules["model"]._modules["layers"]._modules[str(l)]._modules["self_attn"]
        if mla:
            impl = MLAImpl(sa._modules["kv_b_proj"], heads, C["qk_nope_head_dim"], C["v_head_dim"], C["kv_lora_rank"])
            sa.add("attn", MLAAttention(impl))
            impl.process_weights_after_loading(np.float32)  # at load, as vLLM does
            impls.append(impl)
        else:
            sa.add("attn", PlainAttention())
    return root, dtypes, impls


# ---------------------------------------------------------------- processes


def spawn(*args):
    env = dict(os.environ, WB_TOKEN=TOKEN)
    return subprocess.Popen([sys.executable, __file__, *map(str, args)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


class Controller:
    def __init__(self, tmp, job):
        self.port = 20000 + random.randrange(12000)  # below the ephemeral ports
        self.url = f"tcp://127.0.0.1:{self.port}"
        self.log = open(os.path.join(tmp, f"controller{self.port}.log"), "w")
        self.p = subprocess.Popen([os.path.join(BIN, "wb-controller"), "--config", job, "--listen", self.url],
                                  env=dict(os.environ, WB_TOKEN=TOKEN), stdout=self.log, stderr=subprocess.STDOUT)

    def ctl(self, *args, timeout=90):
        return subprocess.run([os.path.join(BIN, "wb-ctl"), "-c", self.url, "--timeout", "60s", *args],
                              env=dict(os.environ, WB_TOKEN=TOKEN), capture_output=True, text=True, timeout=timeout)

    def wait_ready(self, timeout=60):
        end = time.time() + timeout
        while time.time() < end:
            st = self.ctl("status", timeout=30).stdout
            if ": ready" in st:
                return
            time.sleep(0.2)
        raise AssertionError("job not ready: " + self.ctl("status").stdout)

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


# Versions must not overtake a rollout's wait (a wait for v returns "v or newer", and the tests
# check which): each rollout marks every version it waited for, and the next version is started
# only once every rollout marked the previous one.
def mark(sync, rank, v):
    open(os.path.join(sync, f"waited.{rank}.{v}"), "w").close()


def await_marks(sync, nrollouts, v, timeout=120):
    end = time.time() + timeout
    while not all(os.path.exists(os.path.join(sync, f"waited.{r}.{v}")) for r in range(nrollouts)):
        if time.time() > end:
            raise AssertionError(f"rollouts did not all wait for version {v}")
        time.sleep(0.02)


def verify(job, dump, v):
    res = subprocess.run([os.path.join(BIN, "wb-ctl"), "verify", "--config", job, "--dump", dump, "--version", str(v)],
                         capture_output=True, text=True, timeout=120)
    check(res.returncode == 0 and "every byte equals the reference" in res.stdout,
          f"verify {v}: {res.stdout}{res.stderr}")


def settle(procs, timeout=180):
    outs = {}
    for key, p in procs:
        out, _ = p.communicate(timeout=timeout)
        outs[key] = (p.returncode, out.decode())
    return outs


# ---------------------------------------------------------------- mla_versions


def ds_job(tmp):
    path = os.path.join(tmp, "dsv3.yaml")
    with open(path, "w") as f:
        f.write(f"""name: adapters-dsv3
model:
  rules: {ROOT}/configs/models/deepseek_v3.yaml
  hf_config: {DS_CONFIG}
trainer_layout: {FIX}/trainer.yaml
rollout_layout: {FIX}/rollout.yaml
mode: auto
mem_cap: 4MiB
seed: 7
provider: tcp
heartbeat: 200ms
dead_after: 1500ms
""")
    return path


def run_mla_rollout(rank, url, dump, sync):
    """One rollout rank: the stand-in engine registered through the adapter path, versions 1-3
    waited for (2 fails: rank 1's post-processing breaks W_UV), the derived tensors checked."""
    engine, dtypes, impls = build_engine(ds_locals(rank))
    if rank == 1:
        impls[0].break_on_call = 3  # the call after version 2 landed (1: load, 2: version 1)
    before = [(id(i.W_UK_T), A.address(i.W_UK_T), id(i.W_UV), A.address(i.W_UV)) for i in impls]
    params = A.discover(engine.named_parameters(), dtypes=dtypes)
    check(len(params) == len(dtypes), f"{len(params)} parameters discovered, {len(dtypes)} listed")
    A.attest(engine, params)
    refresh = A.DerivedRefresh(A.mla_units(engine, np.float32))
    check([u.label for u in refresh.units] == ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"],
          [u.label for u in refresh.units])
    b = A.RolloutBinding(params, refresh=refresh)
    b.start(A.Settings(url, TOKEN, 0, "lo", None, 60.0), rank, dtypes=dtypes, dump=dump)
    for v in (1, 2, 3):
        try:
            got = b.wait(v)
        except wb.WeightbridgeError as e:
            mark(sync, rank, v)
            check(v == 2, f"version {v} failed: {e}")
            want = ("version 2 failed: rollout rank 1: post-update hook: AdapterError: after the update: "
                    "model.layers.0.self_attn.attn.impl.W_UV: post-processing made it float32 "
                    "[2, 128, 64], it was float32 [2, 128, 128]; captured CUDA graphs read the old memory "
                    "(this rank's tensors are torn: parts of it may have landed over version 1)")
            check(b.torn and b.version == 1, f"rank {rank}: torn {b.torn}, version {b.version}")
            check(str(e) == want, f"rank {rank}: {e}")
            continue
        mark(sync, rank, v)
        check(v != 2 and got == v, f"version {v}: wait returned {got}")
        check(not b.torn, f"rank {rank}: version {v} complete, still torn")
        for l, i in enumerate(impls):
            # the post-processing ran on the bytes of this version, after they landed
            check(i.seen[-1] == digest(i.kv_b_proj.weight), f"layer {l} v{v}: processed other bytes")
            w = dequant(i.kv_b_proj.weight, i.kv_b_proj.weight_scale_inv).T.reshape(128, 2, 256)
            check(np.array_equal(i.W_UK_T, w[..., :128].transpose(1, 2, 0)), f"layer {l} v{v}: W_UK_T")
            check(np.array_equal(i.W_UV, w[..., 128:].transpose(1, 0, 2)), f"layer {l} v{v}: W_UV")
            check((id(i.W_UK_T), A.address(i.W_UK_T), id(i.W_UV), A.address(i.W_UV)) == before[l],
                  f"layer {l} v{v}: derived tensors moved")
        check(np.any(impls[0].kv_b_proj.weight), "kv_b_proj still zero")
    h = list(b.history)
    order = [e for e in h if e[1] in (1, 3)]
    check(order == [("hook", 1), ("processed", 1), ("waited", 1), ("hook", 3), ("processed", 3), ("waited", 3)],
          f"history {h}")
    # load, version 1, version 2 where its bytes all landed here before the abort, version 3
    calls = 3 + (("hook", 2) in h)
    check(impls[0].calls == calls and impls[1].calls == calls, f"calls {[i.calls for i in impls]}, history {h}")
    check(len(set(impls[0].seen[1:])) == calls - 1, "the versions' kv_b_proj bytes are not all different")
    b.close()
    print("rollout ok", flush=True)


def test_mla_versions(tmp):
    job = ds_job(tmp)
    dump, sync = os.path.join(tmp, "dump-mla"), os.path.join(tmp, "sync-mla")
    os.makedirs(dump)
    os.makedirs(sync)
    c = Controller(tmp, job)
    procs = []
    try:
        for r in range(2):
            procs.append((("rollout", r), spawn("mla-rollout", r, c.url, dump, sync)))
        for r in range(2):
            procs.append((("trainer", r), subprocess.Popen(
                [os.path.join(BIN, "wb-agent"), "--role", "trainer", "--rank", str(r), "--controller", c.url,
                 "--tx-domain", "lo"], env=dict(os.environ, WB_TOKEN=TOKEN), stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT)))
        c.wait_ready()
        r1 = c.ctl("transfer", "--version", "1")
        check(r1.returncode == 0, r1.stdout + r1.stderr)
        await_marks(sync, 2, 1)
        r2 = c.ctl("transfer", "--version", "2")
        check(r2.returncode == 1 and "rollout rank 1: post-update hook: AdapterError: after the update: model.layers.0.self_attn.attn.impl.W_UV" in
              r2.stdout + r2.stderr, r2.stdout + r2.stderr)
        await_marks(sync, 2, 2)
        r3 = c.ctl("transfer", "--version", "3")
        check(r3.returncode == 0, r3.stdout + r3.stderr)
        outs = settle(procs[:2])
        for key, (rc, out) in outs.items():
            check(rc == 0 and "rollout ok" in out, f"{key} exited {rc}:\n{out}")
        verify(job, dump, 1)
        verify(job, dump, 3)
        check(not os.path.exists(os.path.join(dump, "rollout0.v2.bin")), "version 2 was dumped as complete")
    finally:
        c.stop()
        for _, p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


# ---------------------------------------------------------------- frameworks (the demo job)

import endpoint_e2e as demo  # noqa: E402  (the demo model's shards and vLLM-layout buffers)


class FakeTrainerModel(Module):
    """A trainer's model whose parameters are numpy shards (wb.Shard with dtype and placement),
    named as FSDP1 would wrap some of them."""

    def __init__(self, rank):
        super().__init__()
        self.shards = demo.fsdp_shards(rank)
        self.arrays = {n: np.zeros(local, np.uint16) for n, (_, _, local) in self.shards.items()}
        self.iterated = False

    def named_parameters(self, prefix="", recurse=True):
        for i, (n, (shape, off, _)) in enumerate(self.shards.items()):
            name = ("_fsdp_wrapped_module." + n) if i % 3 == 0 else n
            yield name, wb.Shard(self.arrays[n], shape, off, (0,), dtype="bf16")

    def fill(self, v):
        for n, (shape, off, _) in self.shards.items():
            wb.synth_fill(self.arrays[n], n, demo.SEED, v, shape, off, "bf16")

    def gathered(self):
        self.iterated = True  # the full-tensor generator a framework passes: must never run
        yield from ()


class FakeVerlWorker:
    def __init__(self, model, ce):
        self.engine = type("Engine", (), {})()
        self.engine.module = model
        self.checkpoint_engine = ce

    async def update_weights(self):
        gen = self.engine.module.gathered()
        await self.checkpoint_engine.send_weights(gen)
        return gen


class FakeNemoPolicyWorker:
    def __init__(self, model, ce):
        self.model = model
        self.checkpoint_engine = ce

    async def send_weights_via_checkpoint_engine(self):
        await self.checkpoint_engine.send_weights(self.model.gathered())


class FakeSglangEngine:
    """What slime's updater calls on an engine actor, recorded."""

    def __init__(self, log):
        self.log = log

    def pause_generation(self):
        self.log.append("pause")

    def continue_generation(self):
        self.log.append("continue")

    def update_weights_from_tensor(self, serialized, load_format=None, flush_cache=False, weight_version=None):
        cmd = A.decode_command(serialized[0])
        self.log.append((cmd["op"], cmd.get("version"), cmd.get("replica"), len(serialized), load_format, flush_cache,
                         weight_version))


def run_framework_trainer(rank, url, sync):
    os.environ["RANK"] = str(rank)
    import functools

    from weightbridge import nemo_rl as wb_nemo
    from weightbridge import slime as wb_slime
    from weightbridge import verl as wb_verl

    A.Trainer = functools.partial(wb.Trainer, mesh=[("fsdp", 4)])  # numpy shards carry no mesh
    model = FakeTrainerModel(rank)
    given = {"controller": url, "token": TOKEN, "tx_domain": "lo", "timeout": 60}
    # version 1: verl
    ce = wb_verl.WeightbridgeCheckpointEngine(bucket_size=1 << 20, is_master=rank == 0, **given)
    model.fill(1)
    gen = asyncio.run(FakeVerlWorker(model, ce).update_weights())
    check(ce.sync.last == 1 and ce.sync.trainer.version == 1, f"verl: {ce.sync.last} {ce.sync.trainer.version}")
    check(not model.iterated and gen.gi_frame is None, "verl: the gathered generator was read or left open")
    # version 2: NeMo-RL, on the same trainer endpoint
    ne = wb_nemo.WeightbridgeCheckpointEngine(bucket_size=1 << 20, release_after_refit=False, **given)
    ne.sync, ne.model = ce.sync, ce.model
    await_marks(sync, 2, 1)
    model.fill(2)
    asyncio.run(FakeNemoPolicyWorker(model, ne).send_weights_via_checkpoint_engine())
    check(ne.sync.last == 2 and ne.sync.trainer.version == 2, "NeMo-RL: version 2")
    # version 3: slime/miles, with two recorded engines (rank 0 drives them)
    log = []
    up = wb_slime.WeightbridgeUpdater(type("Args", (), {"rollout_num_gpus_per_engine": 2})(), [model])
    up.sync = ce.sync
    wb_slime._serialized = lambda op, tp, **a: [A.encode_command(op, **a)] * tp
    wb_slime._rank = lambda: rank
    engines = [FakeSglangEngine(log), FakeSglangEngine(log)]
    up.connect_rollout_engines(engines, None, engine_gpu_counts=[2, 2])
    await_marks(sync, 2, 2)
    model.fill(3)
    up.update_weights()
    check(up.weight_version == 3, f"slime: weight_version {up.weight_version}")
    loader = "weightbridge.sglang.load_weights"
    want = [("init", None, 0, 2, loader, False, None), ("init", None, 1, 2, loader, False, None), "pause", "pause",
            ("wait", 3, None, 2, loader, True, "3"), ("wait", 3, None, 2, loader, True, "3"), "continue", "continue"]
    check(log == (want if rank == 0 else []), f"rank {rank} slime calls {log}")
    ce.sync.trainer.close()
    print("trainer ok", flush=True)


def run_framework_rollout(rank, url, dump, sync):
    from weightbridge import nemo_rl as wb_nemo
    from weightbridge import sglang as wb_sglang
    from weightbridge import verl as wb_verl

    locals_ = demo.rollout_locals(rank)
    engine = Module()
    dtypes = {}
    for name, (dt, shape) in locals_.items():
        engine.add(name, np.zeros(shape, NP[dt]))
        dtypes[name] = dt
    params = A.discover(engine.named_parameters(), dtypes=dtypes)
    b = A.bind("vllm", A.RolloutBinding(params))
    b.start(A.Settings(url, TOKEN, 0, "lo", None, 60.0), rank, dtypes=dtypes, dump=dump)
    # version 1: verl's rollout-side checkpoint engine has nothing to hand over; the engine waits
    ce = wb_verl.WeightbridgeCheckpointEngine(bucket_size=1 << 20)

    async def drain(agen):
        return [x async for x in agen]

    check(asyncio.run(drain(ce.receive_weights())) == [], "verl receive_weights yielded something")
    check(b.wait(1) == 1, "version 1")
    mark(sync, rank, 1)
    # version 2: NeMo-RL's checkpoint engine inside the vLLM worker finds the engine's binding
    ne = wb_nemo.WeightbridgeCheckpointEngine(bucket_size=1 << 20, controller=url)
    ne.init_rollout_process_group(rollout_rank=rank, train_world_size=4, rollout_world_size=2, metadata=[])
    check(ne.binding is b, "NeMo-RL did not use the engine's binding")
    other = wb_nemo.WeightbridgeCheckpointEngine(bucket_size=1 << 20, controller=url)
    msg = raises(lambda: other.init_rollout_process_group(rollout_rank=1 - rank, train_world_size=4,
                                                          rollout_world_size=2, metadata=[]))
    check(msg == f"NeMo-RL rollout rank {1 - rank}: this vLLM worker registered as rollout rank {rank} (WB_REPLICA "
                 "and its place in the engine); they must agree", msg)
    check(asyncio.run(drain(ne.receive_weight_batches())) == [] and b.waited == 2, f"NeMo-RL waited {b.waited}")
    mark(sync, rank, 2)
    # version 3: SGLang's loader, as the engine's workers run it
    A.bind("sglang", b)
    wb_sglang.load_weights(engine, [(A.encode_command("wait", version=3, timeout=60), None)])
    check(b.waited == 3 and b.version == 3, f"SGLang loader: waited {b.waited}, holds {b.version}")
    check([e for e in b.history if e[0] == "waited"] == [("waited", 1), ("waited", 2), ("waited", 3)], list(b.history))
    b.close()
    print("rollout ok", flush=True)


def test_frameworks(tmp):
    job = demo.derived_job(tmp)
    dump, sync = os.path.join(tmp, "dump-frameworks"), os.path.join(tmp, "sync-frameworks")
    os.makedirs(dump)
    os.makedirs(sync)
    c = Controller(tmp, job)
    procs = []
    try:
        for r in range(2):
            procs.append((("rollout", r), spawn("fw-rollout", r, c.url, dump, sync)))
        for r in range(4):
            procs.append((("trainer", r), spawn("fw-trainer", r, c.url, sync)))
        outs = settle(procs)
        for key, (rc, out) in outs.items():
            check(rc == 0 and ("rollout ok" if key[0] == "rollout" else "trainer ok") in out, f"{key} exited {rc}:\n{out}")
        for v in (1, 2, 3):
            verify(demo.JOB, dump, v)  # the same model and seed, with the layout the trainers' placements say
    finally:
        c.stop()
        for _, p in procs:
            if p.poll() is None:
                p.kill()


# ---------------------------------------------------------------- in-process tests


def raises(fn, exc=wb.WeightbridgeError):
    try:
        fn()
    except exc as e:
        return str(e)
    raise AssertionError(f"{fn} did not raise {exc.__name__}")


def test_discovery(tmp):
    m = Module()
    layer = m.add("layer", Module())
    w = layer.add("weight", np.zeros((4, 8), np.uint16))
    m.add("head", Module()).add("weight", w)  # tied: the same array under two names
    m.add("norm", Module()).add("k_scale", np.zeros(1, np.float32))
    m.add("_fsdp_wrapped_module", Module()).add("bias", np.zeros(8, np.float32))
    got = A.discover(m.named_parameters(), skip=("*.k_scale",), dtypes={"layer.weight": "bf16"})
    check(list(got) == ["layer.weight", "bias"], list(got))
    view = np.zeros((4, 8), np.uint16)
    pairs = [("a", view), ("b", view[:2]), ("c", np.zeros(3, np.complex64)), ("a", view), ("d", np.zeros(2, np.uint16))]
    msg = raises(lambda: A.discover(pairs, dtypes={"a": "bf16", "b": "bf16"}, what="vLLM"))
    check(msg == "vLLM parameters weightbridge cannot register (3 problems):\n"
                 "  c: numpy dtype complex64 is not one weightbridge moves\n"
                 "  a: listed twice\n"
                 "  d: this array's dtype does not say which floating-point format it holds: pass dtype= "
                 "('bf16', 'fp8_e4m3', ...)", msg)
    # the same memory and shape under two names is registered once; a view of another shape is not an alias
    check(list(A.discover([("x", view), ("y", view), ("z", view[:2])], dtypes=dict.fromkeys("xyz", "bf16"))) == ["x", "z"],
          "aliases")


def test_attestation(tmp):
    engine, dtypes, _ = build_engine(ds_locals(0))
    params = A.discover(engine.named_parameters(), dtypes=dtypes)
    A.attest(engine, params)  # the planned layout passes
    L = engine._modules["model"]._modules["layers"]
    sa0 = L._modules["0"]._modules["self_attn"]
    object.__setattr__(sa0._modules["o_proj"], "quant_method", quant("AWQMarlinLinearMethod"))
    object.__setattr__(sa0._modules["q_b_proj"], "quant_method",
                       quant("Fp8LinearMethod", weight_block_size=[128, 128], use_marlin=True))
    object.__setattr__(sa0._modules["kv_b_proj"], "quant_method", quant("Fp8LinearMethod", weight_block_size=[64, 64]))
    experts = L._modules["1"]._modules["mlp"]._modules["experts"]
    object.__setattr__(experts, "quant_method", quant("Fp8MoEMethod", weight_block_size=[128, 128],
                                                      fp8_backend=type("B", (), {"name": "FLASHINFER_TRTLLM"})()))
    msg = raises(lambda: A.attest(engine, params, what="vLLM"))
    want = ("vLLM: the parameter layout is not the one weightbridge plans, nothing was registered (4 problems):\n"
            "  model.layers.0.self_attn.kv_b_proj.weight: Fp8LinearMethod with weight_block_size [64, 64]: weightbridge "
            "writes FP8 with 128x128 block scales only\n"
            "  model.layers.0.self_attn.o_proj.weight: quantization method AWQMarlinLinearMethod stores this layer in a "
            "layout weightbridge does not produce (it writes BF16, or FP8 E4M3 with 128x128 float32 weight_scale_inv blocks)\n"
            "  model.layers.0.self_attn.q_b_proj.weight: Fp8LinearMethod repacks the weights for the Marlin kernel "
            "(a GPU without FP8, or VLLM_TEST_FORCE_FP8_MARLIN)\n"
            "  model.layers.1.mlp.experts.w13_weight: Fp8MoEMethod converts the expert weights for the "
            "FLASHINFER_TRTLLM MoE backend")
    check(msg == want, msg)
    engine, dtypes, _ = build_engine(ds_locals(0))
    params = A.discover(engine.named_parameters(), dtypes=dtypes)
    msg = raises(lambda: A.attest(engine, params, scales_ue8m0=True, what="SGLang"))
    check(msg.startswith("SGLang: the parameter layout is not the one weightbridge plans, nothing was registered (13 problems):\n"
                         "  model.layers.0.self_attn.kv_b_proj.weight: Fp8LinearMethod requantizes weight_scale_inv to UE8M0 "
                         "for DeepGEMM\n"), msg)
    check(A.quant_problem(quant("Fp8KVCacheMethod")) is None and A.quant_problem(quant("UnquantizedFusedMoEMethod")) is None,
          "kv-cache and unquantized methods")
    check(A.quant_problem(quant("Fp8MoEMethod", weight_block_size=[128, 128], flashinfer_moe_backend="CUTLASS")) ==
          "Fp8MoEMethod reorders the expert weights for the FlashInfer CUTLASS kernels", "flashinfer")


def test_refresh(tmp):
    engine, dtypes, impls = build_engine(ds_locals(0))
    i = impls[0]
    keep = (i.W_UK_T, i.W_UV, A.address(i.W_UK_T))
    i.kv_b_proj.weight[:] = np.arange(i.kv_b_proj.weight.size, dtype=np.uint32).reshape(i.kv_b_proj.weight.shape) % 120
    i.kv_b_proj.weight_scale_inv[:] = 0.5
    r = A.DerivedRefresh(A.mla_units(engine, np.float32))
    r.run()
    check(i.W_UK_T is keep[0] and i.W_UV is keep[1] and A.address(i.W_UK_T) == keep[2], "moved")
    w = dequant(i.kv_b_proj.weight, i.kv_b_proj.weight_scale_inv).T.reshape(128, 2, 256)
    check(np.array_equal(i.W_UK_T, w[..., :128].transpose(1, 2, 0)) and float(np.abs(i.W_UK_T).max()) == 120.0,
          "values")
    holder = type("H", (), {})()
    holder.t = np.zeros(2, np.float32)
    msg = raises(lambda: A.DerivedRefresh([A.Derived("x", lambda: delattr(holder, "t"), [("x", holder)])]).run())
    check(msg == "after the update: x.t: post-processing removed it", msg)
    msg = raises(lambda: A.DerivedRefresh([A.Derived("y", lambda: 1 / 0, []), A.Derived("z", lambda: {}[0], [])]).run())
    check(msg == "after the update (2 problems):\n  y: post-processing raised ZeroDivisionError: division by zero\n"
                 "  z: post-processing raised KeyError: 0", msg)
    # plain attention layers are not re-run; a model without MLA has nothing to refresh
    engine, _, impls = build_engine(ds_locals(0), mla=False)
    check(A.mla_units(engine, np.float32) == [] and A.post_load_units(engine) == [], "no units")


def test_settings(tmp):
    env = {"WB_CONTROLLER": "tcp://h:1", "WB_REPLICA": "3", "WB_TIMEOUT": "5"}
    s = A.settings({"token": "t"}, env)
    check((s.controller, s.token, s.replica, s.timeout, s.tx_domain) == ("tcp://h:1", "t", 3, 5.0, None), str(s))
    s = A.settings({"controller": "tcp://x:2", "replica": 1}, env)
    check((s.controller, s.replica) == ("tcp://x:2", 1), str(s))
    for given, env_, want in [
        ({}, {}, "no controller: pass controller= (the init info) or set WB_CONTROLLER"),
        ({"controler": "x"}, {}, "unknown weightbridge setting controler (known: controller, replica, timeout, token, "
                                 "tx_domain, tx_extra)"),
        ({}, {"WB_CONTROLLER": "u", "WB_REPLICA": "two"}, "replica (WB_REPLICA): expected a non-negative integer, got 'two'"),
        ({"replica": -1}, {"WB_CONTROLLER": "u"}, "replica (WB_REPLICA): expected >= 0, got -1"),
        ({}, {"WB_CONTROLLER": "u", "WB_TIMEOUT": "soon"}, "timeout (WB_TIMEOUT): expected a number of seconds, got 'soon'"),
    ]:
        msg = raises(lambda: A.settings(given, env_))
        check(msg == want, msg)
    check(A.engine_local_rank(tp=8, tp_rank=3, dp=4, dp_rank=2) == (19, 32), "dp x tp")
    check(A.rollout_rank(2, 32, 19) == 83, "rank")
    check(raises(lambda: A.engine_local_rank(tp=4, tp_rank=0, pp=2)) ==
          "pipeline parallel size 2: weightbridge plans rollouts with tensor and expert parallelism only "
          "(pipeline_parallel_size 1)", "pp")
    check(raises(lambda: A.rollout_rank(0, 8, 8)) == "GPU index 8 outside a replica of 8 GPUs", "local")


def test_commands(tmp):
    name = A.encode_command("init", controller="tcp://h:1", replica=2, token=None)
    check(name == 'weightbridge:{"controller": "tcp://h:1", "op": "init", "replica": 2}', name)
    check(A.decode_command(name) == {"controller": "tcp://h:1", "replica": 2, "op": "init"}, "decode")
    for bad, want in [
        ("model.embed_tokens.weight", "'model.embed_tokens.weight': not a weightbridge command (the weightbridge "
                                      "loader only takes its own commands)"),
        ("weightbridge:{", "'weightbridge:{': malformed command: Expecting property name enclosed in double quotes: "
                           "line 1 column 2 (char 1)"),
        ('weightbridge:{"op": "load"}', "'weightbridge:{\"op\": \"load\"}': unknown command 'load' (known: close, init, wait)"),
        ('weightbridge:{"op": "wait", "versoin": 3}', "'weightbridge:{\"op\": \"wait\", \"versoin\": 3}': wait: unknown "
                                                      "argument versoin"),
    ]:
        msg = raises(lambda: A.decode_command(bad))
        check(msg == want, msg)
    check(raises(lambda: A.encode_command("load")) == "unknown command 'load' (known: close, init, wait)", "encode")
    from weightbridge import sglang as wb_sglang

    A._BINDINGS.pop("sglang", None)
    msg = raises(lambda: wb_sglang.load_weights(Module(), [(A.encode_command("wait", version=1), None)]))
    check(msg == "wait before init: the worker's weightbridge endpoint was never initialized", msg)


class FakePush:
    def __init__(self, log, v):
        self.log, self.v = log, v

    def sources(self, timeout=None):
        self.log.append(("sources", self.v))

    def result(self, timeout=None):
        self.log.append(("result", self.v))
        return self.v


class FakeTrainer:
    def __init__(self, log):
        self.log, self.version = log, 0

    def push(self, v):
        self.log.append(("push", v))
        self.version = v
        return FakePush(self.log, v)


def test_trainer_sync(tmp):
    log = []
    a, b = np.zeros(4, np.uint16), np.zeros(2, np.uint16)
    ts = A.TrainerSync(FakeTrainer(log), registered={"a": wb.Shard(a, (8,), (0,), dtype="bf16"), "b": b})
    v = ts.push(current={"a": wb.Shard(a, (8,), (0,)), "b": b}, pause=lambda: log.append("pause"),
                after_push=lambda v: log.append(("engine wait", v)), resume=lambda: log.append("resume"))
    check(v == 1 and log == ["pause", ("push", 1), ("sources", 1), ("engine wait", 1), ("result", 1), "resume"], log)
    log.clear()
    check(ts.push(5, wait_done=False) == 5 and log == [("push", 5), ("sources", 5)] and ts.next_version() == 6, log)
    moved = np.zeros(4, np.uint16)
    msg = raises(lambda: ts.push(current={"a": moved}))
    want = (f"trainer tensors are not where they were registered (2 problems):\n"
            f"  a: moved from {a.ctypes.data:#x} to {moved.ctypes.data:#x} since it was registered (parameter offload "
            f"or re-allocation); keep the parameters resident\n  b: no longer present")
    check(msg == want, msg)

    def failing():
        raise RuntimeError("push failed")

    log.clear()
    ts2 = A.TrainerSync(type("T", (), {"version": 0, "push": lambda self, v: failing()})())
    raises(lambda: ts2.push(pause=lambda: log.append("pause"), resume=lambda: log.append("resume")), RuntimeError)
    check(log == ["pause", "resume"], f"resume after a failure: {log}")


class Worker:
    def __init__(self):
        self.engine = type("E", (), {})()
        self.engine.module = Module()

    def call(self):
        return A.find_in_callers(A.model_of)

    async def acall(self):
        return await inner()


async def inner():
    return A.find_in_callers(A.model_of)


def test_callers(tmp):
    w = Worker()
    check(w.call() is w.engine.module, "sync caller")
    check(asyncio.run(w.acall()) is w.engine.module, "awaiting caller")
    check(A.find_in_callers(A.model_of) is None, "no worker among the callers")
    holder = type("H", (), {})()
    holder.model_runner = type("R", (), {})()
    holder.model_runner.model = Module()
    check(A.model_of(holder) is holder.model_runner.model, "model_runner.model")
    msg = raises(lambda: A.caller_trainer({"controller": "tcp://127.0.0.1:1"}, framework="verl"))
    check(msg == "verl: found no model in the calling worker (looked for self.model, self.module, self.engine.module, "
                 "self.actor.engine.module, self.actor_module, self.model_runner.model)", msg)


# ---------------------------------------------------------------- the real engines and frameworks


def importable(*names):
    for n in names:
        try:
            importlib.import_module(n)
            return n
        except Exception:  # noqa: BLE001 - any failure to import means: not here
            continue
    return None


def refresh_torch():
    """DerivedRefresh on torch modules and tensors (CPU)."""
    import torch

    # torch: a Parameter replaced by a new one, and a tensor whose .data was swapped, both go back
    owner = torch.nn.Module()
    owner.w = torch.nn.Parameter(torch.zeros(3), requires_grad=False)
    owner.register_buffer("b", torch.zeros(2))
    owner.plain = torch.zeros(4)
    pw, pb, pp = owner.w.data_ptr(), owner.b.data_ptr(), owner.plain.data_ptr()

    def process():
        owner.w = torch.nn.Parameter(torch.ones(3), requires_grad=False)
        owner.b.data = torch.full((2,), 2.0)
        owner.plain = torch.full((4,), 3.0)

    A.DerivedRefresh([A.Derived("m", process, [("m", owner)])]).run()
    check(owner.w.data_ptr() == pw and owner.b.data_ptr() == pb and owner.plain.data_ptr() == pp, "torch moved")
    check(owner.w.tolist() == [1, 1, 1] and owner.b.tolist() == [2, 2] and owner.plain.tolist() == [3, 3, 3, 3],
          "torch values")
    check(isinstance(owner.w, torch.nn.Parameter), "the parameter is no longer one")


def adapter_vllm():
    from vllm.distributed.weight_transfer.base import WeightTransferEngine
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from weightbridge import vllm as wb_vllm

    wb_vllm.register()
    wb_vllm.register()  # idempotent
    check(WeightTransferEngineFactory._registry["weightbridge"]() is wb_vllm.WeightbridgeEngine, "registered")
    check(issubclass(wb_vllm.WeightbridgeEngine, WeightTransferEngine), "subclass")
    info = wb_vllm.WeightbridgeInitInfo(controller="tcp://h:1", replica=1)
    check((info.controller, info.replica, info.skip) == ("tcp://h:1", 1, []), str(info))
    for m in ("weightbridge_init", "weightbridge_wait", "weightbridge_close"):
        check(callable(getattr(wb_vllm.WorkerExtension, m)), m)


def adapter_sglang():
    from weightbridge import sglang as wb_sglang

    named = wb_sglang.command_tensors("wait", version=4)
    check(named[0][0] == 'weightbridge:{"op": "wait", "version": 4}' and named[0][1].numel() == 0, str(named))
    s = wb_sglang._serialize(named)
    check(isinstance(s, str) and s, "serialized")


def adapter_verl():
    from verl.checkpoint_engine import CheckpointEngine, CheckpointEngineRegistry

    from weightbridge import verl as wb_verl

    cls = CheckpointEngineRegistry.get("weightbridge")
    check(cls is wb_verl.WeightbridgeCheckpointEngine and issubclass(cls, CheckpointEngine), "registered")
    ce = CheckpointEngineRegistry.new("weightbridge", is_master=True, bucket_size=1 << 20, controller="tcp://h:1")
    check(ce.build_topology(2, 2, [{}] * 4) == ({}, {}), "topology")


def adapter_slime():
    from weightbridge import slime as wb_slime

    patched = wb_slime.install(None)
    for name in patched:
        check(getattr(sys.modules[name], wb_slime.REPLACED) is wb_slime.WeightbridgeUpdater, name)


def adapter_nemo_rl():
    from nemo_rl.utils.checkpoint_engines.base import CheckpointEngine, create_checkpoint_engine

    ce = create_checkpoint_engine("weightbridge.nemo_rl:WeightbridgeCheckpointEngine", bucket_size_bytes=1 << 20,
                                  engine_kwargs={"controller": "tcp://h:1", "release_after_refit": False})
    check(isinstance(ce, CheckpointEngine) and ce.prepare() == {}, "created")


ADAPTERS = [
    ("refresh_torch", ("torch",), refresh_torch),
    ("adapter_vllm", ("vllm",), adapter_vllm),
    ("adapter_sglang", ("sglang",), adapter_sglang),
    ("adapter_verl", ("verl",), adapter_verl),
    ("adapter_slime", ("slime.backends.megatron_utils.actor", "miles.backends.megatron_utils.actor"), adapter_slime),
    ("adapter_nemo_rl", ("nemo_rl",), adapter_nemo_rl),
]


def main():
    tests = [("mla_versions", test_mla_versions), ("frameworks", test_frameworks), ("discovery", test_discovery),
             ("attestation", test_attestation), ("refresh", test_refresh), ("settings", test_settings),
             ("commands", test_commands), ("trainer_sync", test_trainer_sync), ("callers", test_callers)]
    passed = failed = skipped = 0
    only = sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="wb-py-adapters.") as tmp:
        for name, fn in tests:
            if only and name not in only:
                continue
            print(f"python_adapters {name} ...", flush=True)
            t0 = time.time()
            try:
                fn(tmp)
                print(f"ok python_adapters {name} ({(time.time() - t0) * 1000:.0f} ms)", flush=True)
                passed += 1
            except Exception:  # noqa: BLE001 - a test's failure is reported and counted
                print("    " + traceback.format_exc().replace("\n", "\n    "))
                print(f"FAIL python_adapters {name} ({(time.time() - t0) * 1000:.0f} ms)", flush=True)
                failed += 1
        for name, mods, fn in ADAPTERS:
            if only and name not in only:
                continue
            print(f"python_adapters {name} ...", flush=True)
            if importable(*mods) is None:
                print(f"SKIP python_adapters {name}: skipped: {mods[0].split('.')[0]} not importable", flush=True)
                skipped += 1
                continue
            try:
                fn()
                print(f"ok python_adapters {name}", flush=True)
                passed += 1
            except Exception:  # noqa: BLE001
                print("    " + traceback.format_exc().replace("\n", "\n    "))
                print(f"FAIL python_adapters {name}", flush=True)
                failed += 1
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "mla-rollout":
        run_mla_rollout(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
    elif cmd == "fw-trainer":
        run_framework_trainer(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    elif cmd == "fw-rollout":
        run_framework_rollout(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
    else:
        sys.exit(main())
