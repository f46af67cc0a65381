#!/usr/bin/env python3
"""delta_check.py — delta updates of a real optimizer's steps, trainer GPU -> rollout GPU.

A trainer process holds a transformers Qwen3 (Qwen3-8B's layer shape, as many layers as make
at least --size GB of BF16 weights: 9 -> 21 layers, 9.35 GB; random init) with FP32 master
parameters and AdamW on GPU 0, and registers the BF16 copy of every parameter that it refreshes
after each optimizer step (as Megatron keeps its BF16 model params beside the FP32 main params).
A rollout process on the last GPU (GPU 0 too on a one-GPU machine: two processes sharing it)
holds the model in vLLM's layout with FP8 128x128 block weights. The job has `delta: true`
and `delta_full_every: K`: version 1 and every K-th are full updates, the others deltas.

Versions: 1 (the initial weights), then --steps optimizer steps at each learning rate of --lrs
(the LM loss of random tokens), one version after each step. After every version the rollout
process checks every byte it holds against PyTorch's per_block_cast_to_fp8 (DeepGEMM's
reference) of the trainer's BF16 tensors — read from the trainer's GPU through CUDA IPC
(torch.multiprocessing's tensor handles), while the trainer waits before its next step — and
counts the FP8 values that changed since the previous version. The trainer prints, per version,
push-to-complete time and the bytes it wrote; the end prints the table: delta versions' bytes as
a share of a full update's and their times against the full updates of the same run.

Usage: delta_check.py [--size GB] [--lrs 1e-6,1e-5] [--steps 5] [--full-every 4]
                      [--batch 4] [--seq 256] [--seed 0]
       (build first; scripts/gpu/delta_check.sh sets up the environment and builds)
Exits non-zero when a byte differs or a process fails; times never fail it.
"""

import argparse
import json
import os
import pickle
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)
BIN = os.path.join(ROOT, "build", "bin")
RULES = os.path.join(ROOT, "configs/models/qwen3.yaml")
TOKEN = os.environ.setdefault("WB_TOKEN", "delta-check-%d" % random.randrange(1 << 30))


def log(*a):
    print(*a, flush=True)


def fail(what):
    raise SystemExit("delta_check: " + what)


def model_config(size):
    import delta_rates as dr

    c = dict(dr.BIG)
    c["num_hidden_layers"] = dr.layers_for(size)
    return c


def write_hf_config(c, path):
    cfg = dict(c, architectures=["Qwen3ForCausalLM"], model_type="qwen3", torch_dtype="bfloat16",
               max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1000000.0,
               quantization_config={"quant_method": "fp8", "fmt": "e4m3",
                                    "weight_block_size": [128, 128], "activation_scheme": "dynamic"})
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)


def versions_of(a):
    """[(version, lr or None)]: version 1 is the initial weights."""
    out, v = [(1, None)], 1
    for lr in a.lrs:
        for _ in range(a.steps):
            v += 1
            out.append((v, lr))
    return out


def wait_file(path, seconds, what):
    deadline = time.time() + seconds
    while not os.path.exists(path):
        if time.time() > deadline:
            fail(f"{what}: {path} did not appear within {seconds} s")
        time.sleep(0.05)


# ---------------------------------------------------------------- trainer


def run_trainer(url, tmp, a):
    import torch
    import transformers
    import weightbridge as wb
    from torch.multiprocessing.reductions import reduce_tensor

    torch.cuda.set_device(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    c = model_config(a.size)
    torch.manual_seed(a.seed)
    with torch.device("cuda"):
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**c)).float()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lrs[0])
    # the BF16 copies the rollouts get (refreshed after every step), registered once
    bf = {n: p.detach().to(torch.bfloat16) for n, p in model.named_parameters()}
    nbytes = sum(t.numel() * t.element_size() for t in bf.values())
    log(f"  trainer: Qwen3, {c['num_hidden_layers']} layers x hidden {c['hidden_size']}: "
        f"{nbytes / 1e9:.2f} GB BF16 in {len(bf)} tensors (FP32 masters + AdamW on GPU 0)")
    with open(os.path.join(tmp, "handles.pkl.tmp"), "wb") as f:
        pickle.dump({n: reduce_tensor(t) for n, t in bf.items()}, f)
    os.replace(os.path.join(tmp, "handles.pkl.tmp"), os.path.join(tmp, "handles.pkl"))
    t = wb.Trainer(url, tensors=bf, rank=0, timeout=600)
    gen = torch.Generator(device="cpu").manual_seed(a.seed + 1)
    rows = []
    for v, lr in versions_of(a):
        loss = None
        if lr is not None:
            for g in opt.param_groups:
                g["lr"] = lr
            ids = torch.randint(0, c["vocab_size"], (a.batch, a.seq), generator=gen).cuda()
            opt.zero_grad(set_to_none=True)
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            opt.step()
            loss = float(out.loss)
            del out
            with torch.no_grad():
                for n, p in model.named_parameters():
                    bf[n].copy_(p)
        torch.cuda.synchronize()
        t0 = time.time()
        res = t.push(v).result(600)
        dt = time.time() - t0
        rows.append(dict(version=v, lr=lr, loss=loss, bytes=res.bytes, ms=dt * 1000,
                         transfer_ms=res.transfer_s * 1000))
        log(f"  trainer: version {v}{f' (lr {lr:g}, loss {loss:.4f})' if lr else ''}: complete in "
            f"{dt * 1000:.1f} ms (push to result), {res.bytes} bytes written")
        # the rollout reads the BF16 copies for its check: they stay until it is done
        wait_file(os.path.join(tmp, f"checked.{v}"), 900, f"version {v}'s check")
    with open(os.path.join(tmp, "trainer.json"), "w") as f:
        json.dump(rows, f)
    t.close()


# ---------------------------------------------------------------- rollout


def q8(x):
    import delta_rates as dr
    import torch

    q, s = dr.per_block_cast_to_fp8(x)
    return q.view(torch.float8_e4m3fn), s


def reference(name, src, dev):
    """The rollout tensor `name` from the trainer's BF16 tensors (src: name -> tensor on the
    trainer's GPU), computed on dev: vLLM's fused projections, each part quantized alone."""
    import torch

    def get(n):
        return src[n].to(dev)

    if name.endswith("weight_scale_inv"):
        return None
    for fused, module, parts in ((".self_attn.qkv_proj.", ".self_attn.", ("q", "k", "v")),
                                 (".mlp.gate_up_proj.", ".mlp.", ("gate", "up"))):
        if fused in name:
            pre = name.split(fused)[0] + module
            qs = [q8(get(f"{pre}{p}_proj.weight")) for p in parts]
            return torch.cat([q for q, _ in qs]), torch.cat([s for _, s in qs])
    if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
        return q8(get(name))
    return get(name), None


def run_rollout(url, tmp, dev, a):
    import torch
    import weightbridge as wb

    torch.cuda.set_device(dev)
    tl = os.path.join(tmp, "one-trainer.yaml")
    rl = os.path.join(tmp, "one-rollout.yaml")
    with open(tl, "w") as f:
        f.write("world_size: 1\nmesh: [{name: dp, size: 1}]\nplacements: [{match: \"*\", place: {}}]\n")
    with open(rl, "w") as f:
        f.write("replicas: 1\ntp: 1\ngpus_per_replica: 1\ngpus_per_node: 1\n")
    local = wb.plan(RULES, os.path.join(tmp, "config.json"), tl, rl, tables=True)["receive"][0]["local"]
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp8_e4m3": torch.float8_e4m3fn}
    params = {l["name"]: torch.zeros(l["shape"], dtype=dt[l["dtype"]], device=f"cuda:{dev}")
              for l in local}
    log(f"  rollout: {len(params)} tensors, "
        f"{sum(p.numel() * p.element_size() for p in params.values()) / 1e9:.2f} GB on GPU {dev}")
    r = wb.Rollout(url, params, rank=0, timeout=600)
    wait_file(os.path.join(tmp, "handles.pkl"), 900, "the trainer's tensor handles")
    with open(os.path.join(tmp, "handles.pkl"), "rb") as f:
        src = {n: fn(*args) for n, (fn, args) in pickle.load(f).items()}
    prev = {}
    rows = []
    for v, _ in versions_of(a):
        r.wait(v, 900)
        torch.cuda.synchronize()
        differ = total = changed = nfp8 = 0
        first = None
        for name, p in params.items():
            ref = reference(name, src, p.device)
            if ref is None:
                continue
            w, s = ref
            pairs = [(p, w)] + ([(params[name + "_scale_inv"], s)] if s is not None else [])
            for got, want in pairs:
                x = got.contiguous().view(torch.uint8)
                y = want.contiguous().to(got.dtype).view(torch.uint8)
                n = int((x != y).sum())
                if n and first is None:
                    first = f"{name}: {n} of {x.numel()} bytes differ"
                differ += n
                total += x.numel()
            if w.dtype == torch.float8_e4m3fn:
                wb8 = w.view(torch.uint8)
                if name in prev:
                    changed += int((prev[name] != wb8).sum())
                nfp8 += wb8.numel()
                prev[name] = wb8.clone()
            del ref, w, s
        row = dict(version=v, differ=differ, total=total, fp8_changed=changed if v > 1 else None,
                   fp8_total=nfp8)
        rows.append(row)
        log(f"  rollout: version {v}: {differ} of {total} bytes differ from the reference"
            + (f"; FP8 values changed since version {v - 1}: {changed} of {nfp8} "
               f"({100 * changed / nfp8:.3f} %)" if v > 1 else ""))
        if differ:
            fail(f"version {v}: {first}")
        with open(os.path.join(tmp, f"checked.{v}"), "w") as f:
            f.write("ok\n")
    with open(os.path.join(tmp, "rollout.json"), "w") as f:
        json.dump(rows, f)
    del src
    r.close()


# ---------------------------------------------------------------- main


def job_file(tmp, a):
    path = os.path.join(tmp, "job.yaml")
    with open(os.path.join(tmp, "rollout.yaml"), "w") as f:
        f.write("replicas: 1\ntp: 1\ngpus_per_replica: 1\ngpus_per_node: 8\n")
    with open(os.path.join(tmp, "trainer.yaml"), "w") as f:  # one trainer holding every tensor
        f.write("world_size: 1\nmesh: [{name: dp, size: 1}]\nplacements: [{match: \"*\", place: {}}]\n")
    with open(path, "w") as f:
        f.write(f"""name: delta-check
model:
  rules: {RULES}
  hf_config: {os.path.join(tmp, "config.json")}
trainer_layout: {os.path.join(tmp, "trainer.yaml")}
rollout_layout: {os.path.join(tmp, "rollout.yaml")}
provider: cudaipc
mem_cap: 4GiB
delta: true
delta_full_every: {a.full_every}
dead_after: 60s
heartbeat: 500ms
transfer_timeout: 300s
""")
    return path


def summary(tmp, a):
    tr = json.load(open(os.path.join(tmp, "trainer.json")))
    ro = {r["version"]: r for r in json.load(open(os.path.join(tmp, "rollout.json")))}
    full_bytes = tr[0]["bytes"]
    log("")
    log("| version | lr | update | bytes written | of a full update | time (push to complete) | FP8 values changed |")
    log("|---|---|---|---|---|---|---|")
    full_ms, delta_ms, delta_share = [], [], []
    for r in tr:
        kind = "full" if r["bytes"] == full_bytes else "delta"
        (full_ms if kind == "full" and r["version"] > 1 else delta_ms if kind == "delta" else []).append(r["ms"])
        if kind == "delta":
            delta_share.append(r["bytes"] / full_bytes)
        ch = ro[r["version"]]
        chs = f"{100 * ch['fp8_changed'] / ch['fp8_total']:.3f} %" if ch["fp8_changed"] is not None else "-"
        log(f"| {r['version']} | {r['lr'] if r['lr'] else '-'} | {kind} | {r['bytes']} | "
            f"{100 * r['bytes'] / full_bytes:.2f} % | {r['ms']:.1f} ms | {chs} |")
    for lr in a.lrs:
        sh = [r["bytes"] / full_bytes for r in tr if r["lr"] == lr and r["bytes"] != full_bytes]
        if sh:
            log(f"lr {lr:g}: delta versions wrote {100 * min(sh):.2f}–{100 * max(sh):.2f} % of a full update's bytes")
    if full_ms and delta_ms:
        f, d = statistics.median(full_ms), statistics.median(delta_ms)
        log(f"median time: full updates (after the first) {f:.1f} ms, deltas {d:.1f} ms: ratio {d / f:.3f}")
    elif not full_ms:
        log("no full update after the first: raise --steps or lower --full-every for a same-run comparison")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[1:]))
    ap.add_argument("--size", type=float, default=9.0, help="GB of BF16 weights (at least)")
    ap.add_argument("--lrs", default="1e-6,1e-5")
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps per learning rate")
    ap.add_argument("--full-every", type=int, default=4, help="the job's delta_full_every")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deadline", type=float, default=1800, help="seconds before the run is ended")
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    a = ap.parse_args()
    try:
        a.lrs = [float(x) for x in a.lrs.split(",")]
    except ValueError:
        ap.error(f"--lrs: expected comma-separated numbers, got {a.lrs!r}")
    if a.steps < 1 or a.full_every < 1 or a.batch < 1 or a.seq < 2 or not a.size > 0:
        ap.error("--steps, --full-every, --batch must be >= 1, --seq >= 2, --size > 0")
    if a.role == "trainer":
        return run_trainer(a.rest[0], a.rest[1], a)
    if a.role == "rollout":
        return run_rollout(a.rest[0], a.rest[1], int(a.rest[2]), a)
    import torch

    ngpu = torch.cuda.device_count()
    if ngpu < 1:
        fail("needs a GPU, found none")
    tmp = tempfile.mkdtemp(prefix="delta_check.")
    write_hf_config(model_config(a.size), os.path.join(tmp, "config.json"))
    url = f"tcp://127.0.0.1:{21000 + random.randrange(20000)}"
    job = job_file(tmp, a)
    log(f"== delta_check: trainer on GPU 0, rollout on GPU {ngpu - 1}"
        f"{' (two processes sharing it, CUDA IPC)' if ngpu == 1 else ' (CUDA IPC over NVLink)'}; "
        f"delta_full_every {a.full_every}")
    ctl_log = open(os.path.join(tmp, "controller.log"), "w")
    ctl = subprocess.Popen([os.path.join(BIN, "wb-controller"), "--config", job, "--listen", url],
                           stdout=ctl_log, stderr=subprocess.STDOUT)
    me = [sys.executable, __file__, "--size", str(a.size), "--lrs", ",".join(map(str, a.lrs)),
          "--steps", str(a.steps), "--full-every", str(a.full_every), "--batch", str(a.batch),
          "--seq", str(a.seq), "--seed", str(a.seed)]
    procs = [subprocess.Popen(me + ["--role", "rollout", url, tmp, str(ngpu - 1)]),
             subprocess.Popen(me + ["--role", "trainer", url, tmp])]
    rc = 0
    try:
        deadline = time.time() + a.deadline
        while True:
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes) or time.time() > deadline:
                rc = 1
                log(f"  a process failed or the run timed out: exit codes {codes}")
                break
            if all(c == 0 for c in codes):
                break
            time.sleep(0.2)
        if rc == 0:
            summary(tmp, a)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        subprocess.run([os.path.join(BIN, "wb-ctl"), "-c", url, "shutdown"], timeout=30,
                       capture_output=True)
        ctl.wait(timeout=60)
        ctl_log.close()
        if rc or os.environ.get("WB_KEEP"):
            log(f"  logs: {tmp}")
            os.system(f"tail -n 5 {tmp}/controller.log")
    log("delta_check: " + ("PASS" if rc == 0 else "FAILED"))
    return rc


if __name__ == "__main__":
    sys.exit(main())
