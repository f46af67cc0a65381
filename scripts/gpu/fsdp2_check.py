#!/usr/bin/env python3
"""fsdp2_check.py — issue #35's case on GPUs, as reported: FSDP2 trainers -> one rollout.

Trainers: `torchrun --nproc_per_node 2`, a transformers Qwen3ForCausalLM (hidden 1024,
intermediate 3072, LAYERS layers, 16 heads, 8 KV heads, head_dim 64, vocab 4096, untied, random
init, BF16), fully_shard(layer) for every decoder layer and then fully_shard(model) on the default
mesh; wb.Trainer(url, model=model, rank=rank) registers the DTensor shards (the job names no
trainer layout: the controller derives it). Right after registering, every parameter's
full_tensor() is taken once and kept (the report's variant that crashed with an illegal
instruction: memory allocated after the rollout's IPC handles were opened); at the end it must be
unchanged. Then VERSIONS times: one SGD step (lr 1e-2) on an LM loss, push(v), sources(),
result(), and the full parameters of version v for the rollout to check against.

With two GPUs each trainer rank has its own (NCCL). With one, both share GPU 0: NCCL refuses two
ranks on one GPU and gloo's all-gather crashes on CUDA tensors (SIGSEGV in memcpy, torch 2.11), so
there the trainers take no FSDP2 collective: each version adds seeded noise (scale 1e-2) to its
local shards in place, and full parameters are gathered on the CPU over gloo (the shards are
FSDP2's dim-0 chunks) — the registered memory, its layout and its DTensor placements are FSDP2's
either way. The rollout is one process on GPU 1 (GPU 0 when alone): the tensors
wb.plan() lists for rank 0, torch.zeros in that order (vLLM's layout: fused qkv_proj and
gate_up_proj), registered with wb.Rollout; after every version every rollout byte is compared
with the trainer's full parameters of that version — qkv_proj = cat(q, k, v), gate_up_proj =
cat(gate, up) — and, for the FP8 case (the config with a quantization_config of 128x128 fp8
blocks), with torch's per_block_cast_to_fp8 (DeepGEMM's reference) of the fused tensors.

--mesh RxS (HSDP, issue #29's 2-D meshes): R*S trainer processes on a device mesh ("replicate" R,
"shard" S), fully_shard on it, so every parameter is a DTensor placed (Replicate(), Shard(0)); the
controller derives the layout from those placements and may take each byte from any replica. The
case passes only if every trainer rank wrote bytes (sources in every replica) as well as every
rollout byte being right. On fewer GPUs than processes they share them over gloo as above.

Cases: bf16 (the report's), fp8. Each prints "case X: 0 of N bytes differ" (N: every rollout byte
of every version) and the trainers' own memory check; the run exits non-zero on any difference
or failure. Every child's failure ends the case with its output; every wait has a time limit and
the children (torchrun's workers included) are found by a marker in their environment and killed.

Usage: fsdp2_check.py [--case bf16|fp8|all] [--layers N] [--versions N] [--timeout S] [--mesh 2|RxS]
       (build first and set WB_LIBRARY, WB_BIN: scripts/gpu/fsdp2_check.sh does)
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # endpoint_check's reference
BIN = os.environ.get("WB_BIN", os.path.join(ROOT, "build", "bin"))
RULES = os.path.join(ROOT, "configs/models/qwen3.yaml")
TOKEN = os.environ.setdefault("WB_TOKEN", "fsdp2-check-%d" % random.randrange(1 << 30))
MARK = "WB_FSDP2_CHECK_RUN"  # in every child's environment: how the cleanup finds them
FP8_QC = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}


def log(*a):
    print(*a, flush=True)


# The report's model, and one of the size users run (--size 9g: 24 layers of hidden 4096, 4.9 B
# parameters, 9.8 GB BF16; --layers is then the layer count, default 24).
SIZES = {
    "small": {"hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16,
              "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 4096},
    "9g": {"hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 32768},
}
SIZE = os.environ.get("WB_FSDP2_SIZE", "small")  # the children learn it from the parent
# The trainers' device mesh: "2" (FSDP2 over 2 ranks, the report's) or "RxS" (HSDP: R replicas,
# each sharded over S ranks: fully_shard on a 2-D mesh ("replicate", "shard"), placements
# (Replicate(), Shard(0))). The children learn it from the parent.
MESH = os.environ.get("WB_FSDP2_MESH", "2")


def mesh_shape():
    dims = tuple(int(x) for x in MESH.split("x"))
    return dims if len(dims) == 2 else (1, dims[0])


def config(layers, fp8):
    c = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": layers,
         "tie_word_embeddings": False, "torch_dtype": "bfloat16", **SIZES[SIZE]}
    if fp8:
        c["quantization_config"] = FP8_QC
    return c


def wait_for(path, deadline, what):
    while not os.path.exists(path):
        if time.time() > deadline:
            raise SystemExit(f"fsdp2_check: timed out waiting for {what} ({path})")
        if os.path.exists(os.path.join(os.path.dirname(path), "abort")):
            raise SystemExit(f"fsdp2_check: gave up waiting for {what}: another process failed")
        time.sleep(0.05)


def atomic_save(obj, path):
    import torch

    torch.save(obj, path + ".tmp")
    os.replace(path + ".tmp", path)


# ---------------------------------------------------------------- trainers (under torchrun)


def run_trainer(url, tmp, case, layers, versions, timeout):
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import Qwen3Config, Qwen3ForCausalLM

    import weightbridge as wb

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    ngpu = torch.cuda.device_count()
    torch.cuda.set_device(rank % ngpu)
    backend = "nccl" if ngpu >= world else "gloo"  # two ranks on one GPU: NCCL refuses that
    dist.init_process_group(backend)
    c = config(layers, False)  # the trainer holds BF16 whatever the rollout holds
    for k in ("architectures", "model_type", "torch_dtype"):
        c.pop(k)
    torch.manual_seed(1234)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(Qwen3Config(**c)).to(torch.bfloat16)
    nrep, nshard = mesh_shape()
    kw = {}
    if nrep > 1:  # HSDP: replicate x shard
        from torch.distributed.device_mesh import init_device_mesh

        kw["mesh"] = init_device_mesh("cuda", (nrep, nshard), mesh_dim_names=("replicate", "shard"))
    for layer in model.model.layers:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)  # the default mesh (every rank), or the 2-D one
    names = [n for n, _ in model.named_parameters()]
    log(f"trainer rank {rank}: {backend} on GPU {torch.cuda.current_device()}, {len(names)} parameters "
        f"(named_parameters() order: {', '.join(names[:3])}, ...)")
    t = wb.Trainer(url, model=model, rank=rank, timeout=timeout)
    ptrs = {n: p.to_local().data_ptr() for n, p in model.named_parameters()}
    shared = backend == "gloo"  # one GPU: no FSDP2 collective (see the module's docstring)

    def full_tensor(q):
        if not shared:
            return q.full_tensor()
        # FSDP2's chunks: ceil(rows / shards) rows each, the last ones shorter or empty; padded
        # to that size and gathered as bytes (gloo's all-gather of CPU tensors) from every rank;
        # ranks are numbered row-major over (replicate, shard): replica 0's shards come first
        rows = q.shape[0]
        step = -(-rows // nshard)
        loc = q.to_local().detach().cpu().contiguous()
        pad = torch.zeros((step, *q.shape[1:]), dtype=q.dtype)
        pad[: loc.shape[0]] = loc
        parts = [torch.empty_like(pad).view(torch.uint8) for _ in range(world)]
        dist.all_gather(parts, pad.view(torch.uint8))
        return torch.cat([x.view(q.dtype) for x in parts[:nshard]], 0)[:rows].cuda()

    # the report's variant: memory allocated after registration (the rollout's IPC handles are
    # open by now), kept and checked at the end
    early = {n: full_tensor(p) for n, p in model.named_parameters()}
    early_host = {n: v.cpu() for n, v in early.items()}
    torch.cuda.synchronize()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(7)
    sent = 0  # bytes this rank wrote, every version (HSDP: both replicas must be sources)
    deadline = time.time() + timeout
    for v in range(1, versions + 1):
        x = torch.randint(0, c["vocab_size"], (2, 64), generator=g).cuda()
        if shared:
            # seeded by the shard coordinate: the replicas of a shard (HSDP) stay equal, as
            # their all-reduced gradients keep them
            gn = torch.Generator().manual_seed(1000 * v + rank % nshard)
            with torch.no_grad():
                for q in model.parameters():
                    loc = q.to_local()
                    noise = torch.randn(loc.shape, generator=gn) * 1e-2
                    loc.add_(noise.to(loc.device, loc.dtype))
        else:
            loss = torch.nn.functional.cross_entropy(model(x).logits[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        moved = [n for n, p in model.named_parameters() if p.to_local().data_ptr() != ptrs[n]]
        if moved:
            raise SystemExit(f"fsdp2_check: trainer rank {rank}: local shards moved since registration: {moved[:4]}")
        t0 = time.time()
        p = t.push(v)
        p.sources(timeout)
        res = p.result(timeout)
        sent += res.bytes
        log(f"trainer rank {rank}: version {v} complete in {(time.time() - t0) * 1000:.1f} ms, {res.bytes} bytes "
            f"written by this rank ({'shards perturbed in place' if shared else f'loss {loss.item():.3f}'})")
        full = {n: full_tensor(q) for n, q in model.named_parameters()}  # a collective: every rank
        if rank == 0:
            atomic_save({n: w.cpu() for n, w in full.items()}, os.path.join(tmp, f"ref.v{v}.pt"))
        del full
        wait_for(os.path.join(tmp, f"checked.v{v}"), deadline, f"the rollout's check of version {v}")
    torch.cuda.synchronize()
    changed = sum(int((early[n].cpu().view(torch.uint8) != early_host[n].view(torch.uint8)).sum()) for n in early)
    total = sum(v.numel() * v.element_size() for v in early_host.values())
    with open(os.path.join(tmp, f"trainer{rank}.json"), "w") as f:
        json.dump({"changed": changed, "total": total, "sent": sent}, f)
    log(f"trainer rank {rank}: {changed} of {total} bytes of the full tensors taken after registration changed")
    t.close()
    dist.destroy_process_group()  # a difference is the parent's verdict, with the rollout's


# ---------------------------------------------------------------- the rollout


class OnDevice:
    """The reference's tensors (on the CPU), each moved to the device when it is read."""

    def __init__(self, ref, device):
        self.ref, self.device = ref, device

    def __getitem__(self, name):
        return self.ref[name].to(self.device)


def expected(ref, names, fp8):
    """The rollout tensors from the trainer's full parameters: fused, and for FP8 the fused
    tensor quantized (its components start on 128-row block edges, so that is each component
    quantized and concatenated, as vLLM's loader does)."""
    import torch

    from endpoint_check import per_block_cast_to_fp8  # DeepGEMM's reference, beside this file

    out = {}
    for name in names:
        base = name[: -len("_scale_inv")] if name.endswith("_scale_inv") else name
        if ".qkv_proj." in base:
            w = torch.cat([ref[base.replace("qkv_proj", p)] for p in ("q_proj", "k_proj", "v_proj")])
        elif ".gate_up_proj." in base:
            w = torch.cat([ref[base.replace("gate_up_proj", p)] for p in ("gate_proj", "up_proj")])
        else:
            w = ref[base]
        if fp8 and (name.endswith("_scale_inv") or name + "_scale_inv" in names):
            q, s = per_block_cast_to_fp8(w)
            w = s if name.endswith("_scale_inv") else q
        out[name] = w
    return out


def allocator_layout(params, device):
    """What the caching allocator did with the rollout's tensors: allocations (cudaMalloc'd
    segments) holding them, and how many begin exactly where another ends (before the fix of
    #35 such runs were registered as one region through the first allocation's IPC handle)."""
    import torch

    segs = sorted((s["address"], s["total_size"]) for s in torch.cuda.memory_snapshot()
                  if s.get("device") == device)
    held = set()
    for p in params.values():
        a = p.data_ptr()
        for i, (b, n) in enumerate(segs):
            if b <= a < b + n:
                held.add(i)
    touching = sum(1 for i in range(1, len(segs)) if segs[i][0] == segs[i - 1][0] + segs[i - 1][1])
    return len(held), len(segs), touching


def run_rollout(url, tmp, case, layers, versions, device, timeout):
    import torch

    import weightbridge as wb

    torch.cuda.set_device(device)
    fp8 = case == "fp8"
    local = wb.plan(RULES, os.path.join(tmp, "config.json"), os.path.join(tmp, "trainer.yaml"),
                    os.path.join(tmp, "rollout.yaml"), tables=True)["receive"][0]["local"]
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp8_e4m3": torch.float8_e4m3fn}
    params = {l["name"]: torch.zeros(l["shape"], dtype=dt[l["dtype"]], device=f"cuda:{device}") for l in local}
    held, nsegs, touching = allocator_layout(params, device)
    log(f"rollout: {len(params)} tensors in {held} of the GPU {device} caching allocator's {nsegs} allocations; "
        f"{touching} allocation(s) begin where another ends")
    total = sum(p.numel() * p.element_size() for p in params.values())
    r = wb.Rollout(url, params, rank=0, timeout=timeout)
    deadline = time.time() + timeout
    differ_all, bad_all = 0, []
    for v in range(1, versions + 1):
        r.wait(v, timeout)
        torch.cuda.synchronize()
        wait_for(os.path.join(tmp, f"ref.v{v}.pt"), deadline, f"the trainers' full parameters of version {v}")
        # on the CPU, moved to the GPU a tensor at a time: a 9.8 GB model's reference and its
        # FP8 expectation at once would not fit beside the rollout's own tensors
        ref = torch.load(os.path.join(tmp, f"ref.v{v}.pt"), map_location="cpu")
        differ, bad = 0, []
        for name, p in params.items():
            lazy = OnDevice(ref, f"cuda:{device}")
            pair = [name] + ([name + "_scale_inv"] if name + "_scale_inv" in params else [])
            want = expected(lazy, pair, fp8)
            a = p.contiguous().view(torch.uint8)
            b = want[name].to(p.dtype).contiguous().view(torch.uint8)
            if a.shape != b.shape:
                raise SystemExit(f"fsdp2_check: {name}: rollout shape {tuple(p.shape)}, "
                                 f"reference {tuple(want[name].shape)}")
            n = int((a != b).sum())
            if n:
                md = (p.float() - want[name].float()).abs().max().item()
                bad.append(f"{name}: {n} of {a.numel()} bytes, max |diff| {md:.4g}")
            differ += n
            del want, a, b
        log(f"case {case}: version {v}: {differ} of {total} bytes differ" + (f" ({len(bad)} tensors)" if bad else ""))
        for line in bad[:40]:
            log("    " + line)
        differ_all += differ
        bad_all += [f"v{v} {b}" for b in bad]
        del ref
        torch.cuda.empty_cache()
        with open(os.path.join(tmp, f"checked.v{v}"), "w") as f:
            f.write(str(differ))
    with open(os.path.join(tmp, "rollout.json"), "w") as f:
        json.dump({"differ": differ_all, "total": total * versions, "tensors": len(params), "bad": bad_all[:100]}, f)
    r.close()  # a difference is the parent's verdict: it prints the case's summary line


# ---------------------------------------------------------------- the run


def ours():
    """Our children: every process whose environment carries this run's marker."""
    want = f"{MARK}={os.environ[MARK]}".encode()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    out.append(int(d))
        except OSError:
            pass
    return out


def kill_ours():
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = ours()
        for p in pids:
            try:
                os.kill(p, sig)
            except OSError:
                pass
        t0 = time.time()
        while ours() and time.time() - t0 < 5:
            time.sleep(0.1)


def tail(path, n=60):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def run_job(children, tmp, url, env, seconds):
    """Starts the job's processes ({name: argv}: "controller", "rollout", "trainers"), each logging
    to tmp/NAME.log, and waits until the rollout and the trainers exited 0. The first child that
    fails, a controller that exits early, or `seconds` passing ends the run: every child is
    killed (found by MARK) and the reason returned with the failed child's log tail; else None.
    Prints the trainers' and the rollout's report lines either way."""
    procs, logs, files = {}, {}, []
    failed = None
    try:
        for name, cmd in children.items():
            logs[name] = os.path.join(tmp, name + ".log")
            files.append(open(logs[name], "w"))
            procs[name] = subprocess.Popen(cmd, env=env, stdout=files[-1], stderr=subprocess.STDOUT)
        deadline = time.time() + seconds
        while failed is None:
            rc = {n: p.poll() for n, p in procs.items()}
            bad = [n for n, c in rc.items() if c not in (None, 0)]
            if bad:
                failed = f"{bad[0]} exited {rc[bad[0]]}:\n{tail(logs[bad[0]])}"
            elif rc["rollout"] == 0 and rc["trainers"] == 0:
                break
            elif rc["controller"] == 0:
                failed = f"the controller exited before the job was done:\n{tail(logs['controller'])}"
            elif time.time() > deadline:
                failed = f"not done in {seconds} s; still running: {[n for n, c in rc.items() if c is None]}"
            time.sleep(0.2)
    finally:
        if failed is None and "controller" in procs:  # done: the controller ends the job
            try:
                subprocess.run([os.path.join(BIN, "wb-ctl"), "-c", url, "--timeout", "10s", "shutdown"], env=env,
                               capture_output=True, timeout=30)
                procs["controller"].wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        open(os.path.join(tmp, "abort"), "w").close()  # whoever still waits stops
        kill_ours()
        for f in files:
            f.close()
    for name in ("trainers", "rollout"):
        for line in tail(logs.get(name, ""), 400).splitlines():
            if line.startswith(("trainer rank", "rollout:", "case ", "    ")):
                log("  " + line)
    return failed


def run_case(case, a):
    import torch

    ngpu = torch.cuda.device_count()
    tmp = tempfile.mkdtemp(prefix=f"fsdp2_check_{case}.")
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config(a.layers, case == "fp8"), f)
    with open(os.path.join(tmp, "rollout.yaml"), "w") as f:
        f.write("replicas: 1\ntp: 1\ngpus_per_replica: 1\n")
    nrep, nshard = mesh_shape()
    world = nrep * nshard
    with open(os.path.join(tmp, "trainer.yaml"), "w") as f:  # what the controller derives; wb.plan only
        f.write(f"world_size: {world}\nmesh:\n  - {{name: r, size: {nrep}}}\n  - {{name: d0, size: {nshard}}}\n"
                "placements:\n  - match: \"*\"\n    place: {d0: shard(0)}\n")
    with open(os.path.join(tmp, "job.yaml"), "w") as f:
        f.write(f"""name: fsdp2-check-{case}
model:
  rules: {RULES}
  hf_config: {os.path.join(tmp, "config.json")}
trainers: {world}
rollout_layout: {os.path.join(tmp, "rollout.yaml")}
provider: cudaipc
mem_cap: 1GiB
dead_after: 10s
""")
    url = f"tcp://127.0.0.1:{21000 + random.randrange(20000)}"
    rdev = 1 if ngpu >= 2 else 0  # the report's: GPU 1, beside trainer rank 1
    log(f"== case {case}: {world} FSDP2 trainer processes "
        f"({'HSDP mesh (replicate %d, shard %d)' % (nrep, nshard) if nrep > 1 else 'one shard dim'}) on GPU(s) "
        f"{[r % ngpu for r in range(world)]} ({'NCCL' if ngpu >= world else 'gloo, sharing GPUs'}), the rollout on GPU {rdev}, cudaipc, "
        f"{a.layers} layers, {a.versions} versions, {'FP8' if case == 'fp8' else 'BF16'} rollout (logs: {tmp})")
    env = dict(os.environ, WB_TOKEN=TOKEN)
    common = [url, tmp, case, str(a.layers), str(a.versions), str(a.timeout)]
    children = {
        "controller": [os.path.join(BIN, "wb-controller"), "--config", os.path.join(tmp, "job.yaml"), "--listen", url],
        "rollout": [sys.executable, __file__, "--role", "rollout", *common, str(rdev)],
        "trainers": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world),
                     __file__, "--role", "trainer", *common],
    }
    failed = run_job(children, tmp, url, env, a.timeout + 120)
    if failed:
        log(f"case {case}: FAILED: {failed}")
        return 1
    try:
        with open(os.path.join(tmp, "rollout.json")) as f:
            res = json.load(f)
        tr = []
        for r in range(world):
            with open(os.path.join(tmp, f"trainer{r}.json")) as f:
                tr.append(json.load(f))
    except (OSError, ValueError) as e:
        log(f"case {case}: FAILED: every process exited 0 but a result is missing: {e}")
        return 1
    log(f"case {case}: {res['differ']} of {res['total']} bytes differ ({res['tensors']} rollout tensors, "
        f"{a.versions} versions); trainers' own memory: {sum(t['changed'] for t in tr)} of "
        f"{sum(t['total'] for t in tr)} bytes changed")
    for b in res["bad"][:40]:
        log("    " + b)
    idle = [r for r, t in enumerate(tr) if t["sent"] == 0]
    log(f"case {case}: bytes written per trainer rank over the versions: {[t['sent'] for t in tr]}"
        + (f"; ranks {idle} wrote nothing" if idle and nrep > 1 else ""))
    # HSDP: each replica holds every byte, so the balancer should take sources from every replica
    return 1 if res["differ"] or any(t["changed"] for t in tr) or (nrep > 1 and idle) else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", default="all", choices=["bf16", "fp8", "all"])
    ap.add_argument("--layers", type=int, default=None, help="default 4 (--size 9g: 24)")
    ap.add_argument("--size", default="small", choices=sorted(SIZES))
    ap.add_argument("--versions", type=int, default=5)
    ap.add_argument("--mesh", default="2", help='trainer mesh: "2" (FSDP2 over 2 ranks) or "RxS" (HSDP)')
    ap.add_argument("--timeout", type=int, default=600, help="seconds for each wait, and a case's limit")
    ap.add_argument("--role", default=None)
    ap.add_argument("rest", nargs="*")
    a = ap.parse_args()
    global SIZE
    if a.role is None:
        SIZE = a.size
        os.environ["WB_FSDP2_SIZE"] = a.size
        global MESH
        MESH = os.environ["WB_FSDP2_MESH"] = a.mesh
        if a.layers is None:
            a.layers = 24 if a.size == "9g" else 4
    if a.role in ("trainer", "rollout"):
        url, tmp, case, layers, versions, timeout = a.rest[:6]
        try:
            if a.role == "trainer":
                run_trainer(url, tmp, case, int(layers), int(versions), int(timeout))
            else:
                run_rollout(url, tmp, case, int(layers), int(versions), int(a.rest[6]), int(timeout))
        except BaseException:
            open(os.path.join(tmp, "abort"), "w").close()  # the others stop waiting for us
            raise
        return 0
    if a.layers < 2 or a.versions < 1:
        ap.error("--layers >= 2 (layers past the first are the point) and --versions >= 1")
    import torch
    import transformers

    if not torch.cuda.is_available():
        log("fsdp2_check: no GPU")
        return 1
    os.environ[MARK] = uuid.uuid4().hex
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.device_count()} GPU(s): "
        f"{torch.cuda.get_device_name(0)}; library {os.environ.get('WB_LIBRARY', '(default)')}, programs {BIN}")
    rc = 0
    for case in (["bf16", "fp8"] if a.case == "all" else [a.case]):
        try:
            r = run_case(case, a)
        except BaseException:
            kill_ours()
            raise
        log(f"== case {case}: {'PASS' if r == 0 else 'FAIL'}")
        rc |= r
    return rc


if __name__ == "__main__":
    sys.exit(main())
