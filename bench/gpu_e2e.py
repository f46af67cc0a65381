#!/usr/bin/env python3
"""gpu_e2e.py — the end-to-end GPU benchmark: weightbridge against what RL stacks do today and
against the memory floors, measured in one run on one machine.

For each model (a Qwen3-MoE of realistic size; see MODELS), in this order:
  floors     the device copy rate (a D2D copy, read + write bytes per second), the pinned
             host-to-device copy rate and, with two GPUs, the GPU-to-GPU peer copy rate; the HBM
             floor of a transfer is (BF16 bytes read + rollout bytes written) / copy rate.
  torch      the colocated PyTorch path: per tensor, torch.compile of DeepGEMM's
             per_block_cast_to_fp8, then copy_ into the preallocated FP8 rollout parameter and
             its scales (fused qkv / gate_up slots), BF16 tensors copied (median of 3).
  ours       wb-controller, one trainer agent and one rollout agent on GPU 0 (cudaipc), default
             settings: versions 1..N timed ("complete in", when the trainer finished sending and
             when the rollout counted everything, the trainer's own time), then version N + 1
             dumped and every rollout byte checked against the CPU reference (wb-ctl verify).
  pipeline   the same with the direct path off (WB_DIRECT=0): the general pipeline's time.
  verified   the same job with `verify: true`: every write followed by its checksum record
             (wb_sum64 of its bytes, computed by a kernel behind each task's own), every tensor
             checked at the rollout by one kernel over its records before the version counts.
             A verifying job takes the general pipeline (the direct path carries no records),
             so its time is compared with the pipeline's (the cost of the checksums) and with
             the default's. Runs with the rest: bench/gpu_e2e.sh --model m9 (--skip verified
             leaves it out).
  host       the trainer's parameters in pinned host memory (residence: host, an H2D stage)
             against the pinned H2D copy rate.
  two GPUs   (when the machine has them) the rollout on GPU 1; NCCL broadcast of BF16 buckets
             of 512 MB and per-tensor FP8 broadcast after torch.compile quantization.
  four GPUs  (when the machine has them) 2 trainers on GPUs 0 and 1 (FSDP 2) -> 2 rollouts on
             GPUs 2 and 3 (TP 2), against the two-GPU throughput.
Prints each time and the ratios; exits non-zero when a transfer fails or a byte differs (timings
never fail it).

Usage: bench/gpu_e2e.sh [--model m9|qwen3-30b|demo ...] [--versions N]
                       [--skip torch,pipeline,verified,host]
(the .sh builds first). `demo` runs everything small over the tcp provider on the CPU, to check
the script itself on a machine without a GPU."""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "bin")
RULES = os.path.join(ROOT, "configs/models/qwen3_moe.yaml")
KEEP = None
FP8 = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}


def m9_config():
    with open(os.path.join(ROOT, "configs/jobs/demo/config.json")) as f:
        c = json.load(f)
    c.update(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_attention_heads=32,
             num_key_value_heads=4, num_experts=16, num_hidden_layers=48, vocab_size=2048)
    return c


def hf_config(name):
    with open(os.path.join(ROOT, name)) as f:
        c = json.load(f)
    c["quantization_config"] = FP8  # the rollout serves FP8 128x128 blocks
    return c


MODELS = {
    # the model: 48 layers x 16 experts, hidden 2048: 9.08 GB of BF16
    "m9": m9_config,
    # Qwen3-30B-A3B as published (61 GB of BF16), served as FP8 blocks
    "qwen3-30b": lambda: hf_config("configs/hf/Qwen3-30B-A3B.json"),
    # the demo's tiny model: the script's own check (CPU, tcp)
    "demo": lambda: json.load(open(os.path.join(ROOT, "configs/jobs/demo/config.json"))),
}


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------- the model's tensors


def tensors(c):
    """(name, shape, fp8 destination group) of every trainer tensor of a Qwen3-MoE, as the rules
    name them; group None = copied as BF16."""
    H, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    D = c.get("head_dim", H // c["num_attention_heads"])
    nh, nkv, E, I = c["num_attention_heads"], c["num_key_value_heads"], c["num_experts"], c["moe_intermediate_size"]
    out = [("model.embed_tokens.weight", (V, H), None), ("model.norm.weight", (H,), None),
           ("lm_head.weight", (V, H), None)]
    for l in range(L):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", (H,), None), (p + "post_attention_layernorm.weight", (H,), None),
                (p + "self_attn.q_norm.weight", (D,), None), (p + "self_attn.k_norm.weight", (D,), None),
                (p + "self_attn.q_proj.weight", (nh * D, H), p + "qkv"),
                (p + "self_attn.k_proj.weight", (nkv * D, H), p + "qkv"),
                (p + "self_attn.v_proj.weight", (nkv * D, H), p + "qkv"),
                (p + "self_attn.o_proj.weight", (H, nh * D), p + "o"), (p + "mlp.gate.weight", (E, H), None)]
        for e in range(E):
            q = p + f"mlp.experts.{e}."
            out += [(q + "gate_proj.weight", (I, H), p + "w13"), (q + "up_proj.weight", (I, H), p + "w13"),
                    (q + "down_proj.weight", (H, I), p + "w2")]
    return out


def sizes(c):
    bf16 = fp8 = 0
    for _, shape, g in tensors(c):
        n = 1
        for d in shape:
            n *= d
        bf16 += 2 * n
        if g is None:
            fp8 += 2 * n
        else:
            fp8 += n + 4 * ((shape[0] + 127) // 128) * ((shape[-1] + 127) // 128)
    return bf16, fp8


# ---------------------------------------------------------------- PyTorch: floors and baselines


def torch_part(cfg_path, out_path, two_gpus):
    """Runs in its own process (its GPU memory is gone when it exits)."""
    import torch

    c = json.load(open(cfg_path))
    dev = torch.device("cuda:0")
    res = {}

    def timed(fn, reps=5):
        fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) / 1e3)
        ts.sort()
        return ts[len(ts) // 2]

    n = 4 << 30
    x = torch.empty(n, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    res["copy_GBps"] = 2 * n / timed(lambda: y.copy_(x)) / 1e9  # read + write
    h = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    res["h2d_GBps"] = n / timed(lambda: x.copy_(h, non_blocking=True)) / 1e9
    del h
    if two_gpus:
        z = torch.empty(n, dtype=torch.uint8, device="cuda:1")
        res["peer_GBps"] = n / timed(lambda: z.copy_(x, non_blocking=True)) / 1e9
        del z
    del x, y
    torch.cuda.empty_cache()

    def per_block_cast_to_fp8(x):  # DeepGEMM's reference
        m, k = x.shape
        xp = torch.zeros(((m + 127) // 128 * 128, (k + 127) // 128 * 128), dtype=x.dtype, device=x.device)
        xp[:m, :k] = x
        xv = xp.view(-1, 128, xp.size(1) // 128, 128)
        amax = xv.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
        xs = (xv * (448.0 / amax)).to(torch.float8_e4m3fn)
        return xs.view_as(xp)[:m, :k].contiguous(), (amax / 448.0).view(xv.size(0), xv.size(2))

    # the trainer's tensors and the rollout's preallocated parameters (fused slots)
    ts = tensors(c)
    src = {name: torch.randn(shape, device=dev, dtype=torch.bfloat16) for name, shape, _ in ts}
    rows, slots = {}, []
    for name, shape, g in ts:
        if g is not None:
            off = rows.get(g, 0)
            rows[g] = off + shape[0]
            slots.append((name, g, off, shape))
    dstq = {}
    for name, shape, g in ts:
        if g is not None and g not in dstq:
            cols = shape[1]
            dstq[g] = (torch.empty((rows[g], cols), device=dev, dtype=torch.float8_e4m3fn),
                       torch.empty(((rows[g] + 127) // 128, (cols + 127) // 128), device=dev, dtype=torch.float32))
    dstb = {name: torch.empty(shape, device=dev, dtype=torch.bfloat16) for name, shape, g in ts if g is None}
    fn = torch.compile(per_block_cast_to_fp8, dynamic=False)

    def push():
        for name, g, off, shape in slots:
            q, s = fn(src[name])
            dq, ds = dstq[g]
            dq[off:off + shape[0]].copy_(q)
            ds[off // 128:(off + shape[0] + 127) // 128].copy_(s)
        for name, t in dstb.items():
            t.copy_(src[name])

    t0 = time.time()
    push()  # compiles every shape
    torch.cuda.synchronize()
    res["torch_compile_s"] = time.time() - t0
    res["torch_ms"] = timed(push, reps=3) * 1e3

    if two_gpus:  # what RL stacks do across GPUs: NCCL broadcast (two processes on two GPUs)
        res.update(nccl_part(c))
    json.dump(res, open(out_path, "w"))


def nccl_part(c):
    """Bucketed BF16 broadcast (512 MB buckets) and per-tensor FP8 broadcast, GPU 0 -> GPU 1, in
    two processes over NCCL. Returns their times in ms."""
    import torch.multiprocessing as mp

    q = mp.get_context("spawn").SimpleQueue()
    ps = [mp.get_context("spawn").Process(target=nccl_rank, args=(r, c, q)) for r in (0, 1)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    out = {}
    while not q.empty():
        out.update(q.get())
    return out


def nccl_rank(rank, c, q):
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2)
    ts = tensors(c)
    bufs = [torch.empty(shape, device="cuda", dtype=torch.bfloat16) for _, shape, _ in ts]

    def bucketed():
        bucket, size = [], 0
        for t in bufs:
            bucket.append(t)
            size += t.numel() * 2
            if size >= 512 << 20:
                flat = torch.cat([b.flatten() for b in bucket]) if rank == 0 else torch.empty(size // 2, device="cuda", dtype=torch.bfloat16)
                dist.broadcast(flat, 0)
                bucket, size = [], 0
        if bucket:
            flat = torch.cat([b.flatten() for b in bucket]) if rank == 0 else torch.empty(size // 2, device="cuda", dtype=torch.bfloat16)
            dist.broadcast(flat, 0)

    def per_tensor_fp8():
        for t in bufs:
            if t.dim() == 2:
                q8 = t.to(torch.float8_e4m3fn).view(torch.uint8)
                dist.broadcast(q8, 0)
            else:
                dist.broadcast(t, 0)

    out = {}
    for name, fn in (("nccl_bf16_ms", bucketed), ("nccl_fp8_ms", per_tensor_fp8)):
        fn()
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.time()
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        dist.barrier()
        out[name] = (time.time() - t0) / 3 * 1e3
    if rank == 0:
        q.put(out)
    dist.destroy_process_group()


# ---------------------------------------------------------------- weightbridge


class Job:
    """A job of len(trainers) trainer agents (FSDP over them, on those GPUs) and len(rollouts)
    rollout agents (one replica, TP over them, on those GPUs)."""

    def __init__(self, tmp, name, cfg_path, provider, residence, trainers, rollouts, env, sums=False):
        self.dir = os.path.join(tmp, name)
        os.makedirs(os.path.join(self.dir, "dump"))
        self.url = "tcp://127.0.0.1:%d" % (20000 + os.getpid() % 10000 + len(name) * 7)
        self.env = dict(os.environ, **env)
        self.env.setdefault("WB_TOKEN", "gpu-e2e-%d" % os.getpid())
        self.env.setdefault("WB_LOG", "info")
        nt, nr = len(trainers), len(rollouts)
        tl = os.path.join(self.dir, "trainer.yaml")
        with open(tl, "w") as f:
            f.write("world_size: %d\ngpus_per_node: %d\nresidence: %s\nmesh:\n  - {name: fsdp, size: %d}\n"
                    "placements:\n  - match: \"*\"\n    place: {fsdp: shard(0)}\n" % (nt, nt, residence, nt))
        rl = os.path.join(self.dir, "rollout.yaml")
        with open(rl, "w") as f:
            f.write("replicas: 1\ngpus_per_replica: %d\ntp: %d\n" % (nr, nr))
        self.job = os.path.join(self.dir, "job.yaml")
        with open(self.job, "w") as f:
            f.write(f"name: {name}\nmodel:\n  rules: {RULES}\n  hf_config: {cfg_path}\n"
                    f"trainer_layout: {tl}\nrollout_layout: {rl}\nmode: auto\nseed: 7\nprovider: {provider}\n"
                    + ("verify: true\n" if sums else ""))
        self.procs = []
        self.provider, self.trainers, self.rollouts = provider, trainers, rollouts

    def start(self, dump_from):
        def spawn(args, log_name):
            f = open(os.path.join(self.dir, log_name), "w")
            self.procs.append(subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=self.env))
        dom = ["--tx-domain", "lo"] if self.provider == "tcp" else []
        traces = os.path.join(self.dir, "traces")  # trainer<rank>.v<version>.json
        os.makedirs(traces, exist_ok=True)
        spawn([os.path.join(BIN, "wb-controller"), "--config", self.job, "--listen", self.url], "controller.log")
        for r, dev in enumerate(self.trainers):  # trainer 0 logs to trainer.log
            sfx = "" if r == 0 else str(r)
            spawn([os.path.join(BIN, "wb-agent"), "--role", "trainer", "--rank", str(r), "--device", str(dev),
                   "--controller", self.url, "--trace", traces] + dom,
                  f"trainer{sfx}.log")
        for r, dev in enumerate(self.rollouts):
            sfx = "" if r == 0 else str(r)
            spawn([os.path.join(BIN, "wb-agent"), "--role", "rollout", "--rank", str(r), "--device", str(dev),
                   "--controller", self.url, "--dump", os.path.join(self.dir, "dump"),
                   "--dump-from", str(dump_from)] + dom, f"rollout{sfx}.log")
        t0 = time.time()
        while time.time() - t0 < 300:
            r = self.ctl("--timeout", "2s", "status")
            if ": ready" in r.stdout:
                return time.time() - t0
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.2)
        self.tail()
        raise RuntimeError(f"{self.dir}: the agents did not become ready")

    def ctl(self, *args):
        return subprocess.run([os.path.join(BIN, "wb-ctl"), "-c", self.url] + list(args), capture_output=True,
                              text=True, env=self.env)

    def transfer(self, v):
        # The synthetic trainer generates version v while idle (not counted in a transfer); a
        # trainer in host memory takes seconds for it, so wait until it says the values are ready.
        t0 = time.time()
        logs = ["trainer.log"] + [f"trainer{r}.log" for r in range(1, len(self.trainers))]
        while time.time() - t0 < 600 and not all(self.grep(n, f"version {v}'s values ready") for n in logs):
            time.sleep(0.05)
        r = self.ctl("--timeout", "600s", "transfer", "--version", str(v))
        if r.returncode:
            self.tail()
            raise RuntimeError(f"transfer {v} failed: {r.stdout}{r.stderr}")
        m = re.search(r"complete in ([\d.]+) ms \(trainers sent by ([\d.]+) ms, rollouts received by ([\d.]+) ms\)",
                      r.stdout)
        row = [l.split() for l in r.stdout.splitlines() if l.startswith("all ")][0]
        return {"complete_ms": float(m.group(1)), "sent_ms": float(m.group(2)), "received_ms": float(m.group(3)),
                "trainer_ms": float(row[11]), "quant_ms": float(row[8]), "write_ms": float(row[9]),
                "bytes": int(row[1])}

    def verify(self, v):
        r = subprocess.run([os.path.join(BIN, "wb-ctl"), "verify", "--config", self.job, "--dump",
                            os.path.join(self.dir, "dump"), "--version", str(v)], capture_output=True, text=True,
                           env=self.env)
        log("  " + (r.stdout + r.stderr).strip())
        return r.returncode == 0

    def grep(self, log_name, what):
        with open(os.path.join(self.dir, log_name)) as f:
            return [l.strip() for l in f if what in l]

    def tail(self):
        for n in ("controller.log", "trainer.log", "rollout.log"):
            p = os.path.join(self.dir, n)
            if os.path.exists(p):
                log(f"  --- {n}:\n" + "".join(open(p).readlines()[-15:]))

    def stop(self):
        self.ctl("shutdown")
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(os.path.join(self.dir, "dump"), ignore_errors=True)
        if KEEP:
            shutil.copytree(self.dir, os.path.join(KEEP, os.path.basename(self.dir)), dirs_exist_ok=True)


def ours(tmp, name, cfg_path, versions, provider, device, rollout_gpu=None, residence="gpu", env=None,
         verify=True, sums=False, trainers=None, rollouts=None):
    """verify: dump the last version and check it against the CPU reference; sums: the job's
    own checksums (verify: true in the job); trainers, rollouts: the GPUs of several agents
    (default: one each, on device, and on rollout_gpu or device)."""
    trainers = trainers or [device]
    rollouts = rollouts or [device if rollout_gpu is None else rollout_gpu]
    job = Job(tmp, name, cfg_path, provider, residence, trainers, rollouts, env or {}, sums)
    ok = True
    try:
        ready = job.start(versions + 1 if verify else 1 << 60)
        runs = [job.transfer(v) for v in range(1, versions + 1)]
        for v, r in enumerate(runs, 1):
            log(f"  {name} version {v}: complete in {r['complete_ms']:.2f} ms (trainer sent by {r['sent_ms']:.2f}, "
                f"rollout counted by {r['received_ms']:.2f}; the trainer's own time {r['trainer_ms']:.2f} ms, "
                f"of it quantizing {r['quant_ms']:.2f} ms), {r['bytes']} bytes")
        for l in job.grep("trainer.log", "direct path"):
            log("  " + l)
        if verify:
            last = versions + 1
            r = job.transfer(last)
            log(f"  {name} version {last} (dumped): complete in {r['complete_ms']:.2f} ms")
            ok = job.verify(last)
        log(f"  {name}: agents ready in {ready:.1f} s")
    finally:
        job.stop()
    best = min(runs, key=lambda r: r["complete_ms"])
    return best, runs, ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", choices=sorted(MODELS), help="default: m9")
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--skip", default="", help="comma list of: torch, pipeline, verified, host")
    ap.add_argument("--keep", metavar="DIR", help="copy every job's logs and traces into DIR")
    ap.add_argument("--torch-part", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    global KEEP
    KEEP = a.keep
    if a.torch_part:
        return torch_part(a.torch_part[0], a.torch_part[1], a.torch_part[2] == "1")
    skip = set(filter(None, a.skip.split(",")))
    ngpu = 0
    try:
        ngpu = len([l for l in subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.splitlines()
                    if l.startswith("GPU ")])
    except OSError:
        pass
    tmp = tempfile.mkdtemp(prefix="gpu_e2e.")
    failed = []
    for model in a.model or ["m9"]:
        cfg = MODELS[model]()
        cfg_path = os.path.join(tmp, model + ".json")
        json.dump(cfg, open(cfg_path, "w"), indent=1)
        bf16, fp8 = sizes(cfg)
        cpu = model == "demo" or ngpu == 0
        provider, device = ("tcp", -1) if cpu else ("cudaipc", 0)
        log(f"== {model}: {bf16 / 1e9:.2f} GB BF16 -> {fp8 / 1e9:.2f} GB FP8 + scales (+ BF16 norms, embeddings); "
            f"{'CPU, tcp (script check)' if cpu else f'{ngpu} GPU(s), cudaipc'}")
        t = {}
        if not cpu and "torch" not in skip:
            out = os.path.join(tmp, model + ".torch.json")
            r = subprocess.run([sys.executable, __file__, "--torch-part", cfg_path, out, "1" if ngpu >= 2 else "0"])
            if r.returncode == 0:
                t = json.load(open(out))
                log(f"  floors: device copy {t['copy_GBps']:.0f} GB/s (read + write), pinned H2D {t['h2d_GBps']:.1f} GB/s"
                    + (f", GPU 0 -> 1 peer copy {t['peer_GBps']:.0f} GB/s" if "peer_GBps" in t else ""))
                log(f"  PyTorch colocated per-tensor path: {t['torch_ms']:.1f} ms (torch.compile took "
                    f"{t['torch_compile_s']:.0f} s first)")
            else:
                failed.append(model + ": torch baseline")
        try:
            best, runs, ok = ours(tmp, model + "-direct", cfg_path, a.versions, provider, device)
            if not ok:
                failed.append(model + ": bytes")
            pipe = None
            if "pipeline" not in skip and not cpu:
                pipe, _, _ = ours(tmp, model + "-pipeline", cfg_path, a.versions, provider, device,
                                  env={"WB_DIRECT": "0"}, verify=False)
            sums = None
            if "verified" not in skip:
                sums, _, sok = ours(tmp, model + "-checksums", cfg_path, a.versions, provider, device, sums=True)
                if not sok:
                    failed.append(model + ": verified bytes")
            host = None
            if "host" not in skip:
                host, _, hok = ours(tmp, model + "-host", cfg_path, a.versions, provider, device, residence="host",
                                    verify=model != "qwen3-30b")
                if not hok:
                    failed.append(model + ": host bytes")
            two = None
            if ngpu >= 2 and not cpu:
                two, _, tok = ours(tmp, model + "-2gpu", cfg_path, a.versions, provider, device, rollout_gpu=1)
                if not tok:
                    failed.append(model + ": 2-GPU bytes")
            four = None
            if ngpu >= 4 or model == "demo":  # the demo: the script's check of the same job on the CPU
                devs = [0, 1, 2, 3] if not cpu else [-1] * 4
                four, _, fok = ours(tmp, model + "-4gpu", cfg_path, a.versions, provider, device,
                                    trainers=devs[:2], rollouts=devs[2:])
                if not fok:
                    failed.append(model + ": 4-GPU bytes")
        except RuntimeError as e:
            log(f"  FAILED: {e}")
            failed.append(model)
            continue
        log(f"-- {model} summary (best of {a.versions} versions; {bf16 / 1e9:.2f} GB BF16 read, {best['bytes'] / 1e9:.2f} "
            f"GB written)")
        log(f"  ours: complete in {best['complete_ms']:.2f} ms, the trainer's own time {best['trainer_ms']:.2f} ms, "
            f"control plane on top {best['complete_ms'] - best['trainer_ms']:.2f} ms")
        if t:
            floor = (bf16 + best["bytes"]) / (t["copy_GBps"] * 1e9) * 1e3
            log(f"  HBM floor {floor:.2f} ms: ours / floor = {best['complete_ms'] / floor:.2f}x (goal <= 2)")
            log(f"  PyTorch {t['torch_ms']:.1f} ms: PyTorch / ours = {t['torch_ms'] / best['complete_ms']:.1f}x "
                f"(goal >= 25)")
        if pipe:
            log(f"  general pipeline (WB_DIRECT=0): {pipe['complete_ms']:.2f} ms = "
                f"{pipe['complete_ms'] / best['complete_ms']:.1f}x the direct path")
        if sums:
            line = (f"  with checksums (verify: true): complete in {sums['complete_ms']:.2f} ms, the trainer's own time "
                    f"{sums['trainer_ms']:.2f} ms")
            if pipe:
                line += (f"; without, the same pipeline: {pipe['complete_ms']:.2f} ms; with / without = "
                         f"{sums['complete_ms'] / pipe['complete_ms']:.2f}x")
            line += f"; with / the default (direct path, no checksums) = {sums['complete_ms'] / best['complete_ms']:.2f}x"
            log(line)
        if host:
            rate = bf16 / (host["trainer_ms"] / 1e3) / 1e9
            line = f"  host-resident trainer: complete in {host['complete_ms']:.1f} ms ({rate:.1f} GB/s of BF16 moved to the GPU)"
            if t:
                line += f" = {rate / t['h2d_GBps']:.2f}x the pinned H2D copy rate (goal >= 0.8)"
            log(line)
        if two and t and "peer_GBps" in t:
            pf = two["bytes"] / (t["peer_GBps"] * 1e9) * 1e3
            log(f"  GPU 0 -> GPU 1: {two['complete_ms']:.2f} ms = {two['complete_ms'] / pf:.2f}x the peer-copy time "
                f"(goal <= 1.3); NCCL BF16 buckets {t['nccl_bf16_ms']:.1f} ms ({t['nccl_bf16_ms'] / two['complete_ms']:.1f}x), "
                f"per-tensor FP8 {t['nccl_fp8_ms']:.1f} ms ({t['nccl_fp8_ms'] / two['complete_ms']:.1f}x)")
        elif ngpu < 2:
            log("  two GPUs: this machine has one; not measured")
        if four:
            base = two or best
            ratio = (four["bytes"] / four["complete_ms"]) / (base["bytes"] / base["complete_ms"])
            log(f"  2 trainers (FSDP 2{'' if cpu else ', GPUs 0 and 1'}) -> 2 rollouts (TP 2{'' if cpu else ', GPUs 2 and 3'}): complete in "
                f"{four['complete_ms']:.2f} ms, {four['bytes'] / four['complete_ms'] / 1e6:.1f} GB/s = {ratio:.2f}x the "
                f"{'GPU 0 -> GPU 1' if two else 'one-GPU'} throughput (goal >= 1.8)")
        elif ngpu < 4:
            log(f"  four GPUs: this machine has {ngpu}; not measured")
    shutil.rmtree(tmp, ignore_errors=True)
    if failed:
        log("gpu_e2e: FAILED: " + ", ".join(failed))
        return 1
    log("gpu_e2e: every transfer complete, every checked byte equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
