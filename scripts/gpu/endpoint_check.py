#!/usr/bin/env python3
"""endpoint_check.py — the Python package with real PyTorch models on GPUs.

A trainer holds a Hugging Face transformers Qwen3-MoE model (the demo's small config, random
init, BF16), FSDP2-sharded (fully_shard) over the trainer processes; it registers its DTensor
parameters (the job file names no trainer layout: the controller derives it from their
placements) and pushes three versions, changing the weights between them. A rollout process
holds the model in vLLM's layout — fused qkv_proj and experts.w13, FP8 E4M3 weights with
128x128 weight_scale_inv blocks — as plain torch tensors on its GPU and registers them; after
the last version it checks
  (a) every FP8 byte and every scale equals PyTorch's per_block_cast_to_fp8 (DeepGEMM's
      reference) of the trainer's fused tensors, and the BF16 tensors equal the trainer's;
  (b) a transformers model loaded from the dequantized weights gives logits with cosine >= 0.99
      and top-1 agreement >= 95% against the trainer's model on fixed random inputs.
The post-update hook runs once per version before the rollout reports it.

Cases: "two": trainer and rollout processes (2 trainers over 2 GPUs when there are two, the
rollout on the last GPU; on one GPU all share it: colocated in two processes, CUDA IPC);
"one": a trainer and a rollout endpoint in one process on one GPU (colocated, no IPC);
"large" / "large2": the 9.08 GB Qwen3-MoE shape (LARGE below, random, untrained: logits reported,
not judged) as "one" / as "two", with PyTorch's baseline in the same run (large2: each trainer's
full_tensor() all-gather, then fuse + per_block_cast_to_fp8 + copy_ in the rollout process).

Usage: endpoint_check.py [--case two|one|all|large|large2]   (build first; scripts/gpu/endpoint_check.sh)
Exits non-zero when a check fails.
"""

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
BIN = os.path.join(ROOT, "build", "bin")
RULES = os.path.join(ROOT, "configs/models/qwen3_moe.yaml")
CONFIG = os.path.join(ROOT, "configs/jobs/demo/config.json")
VERSIONS = (1, 2, 3)
# The realistic-size case: the Qwen3-MoE shape of the executor benchmark, 9.08 GB of BF16.
LARGE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "decoder_sparse_step": 1,
         "head_dim": 128, "hidden_size": 2048, "intermediate_size": 6144, "mlp_only_layers": [],
         "moe_intermediate_size": 768, "num_attention_heads": 32, "num_experts": 16,
         "num_experts_per_tok": 4, "num_hidden_layers": 48, "num_key_value_heads": 4,
         "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 2048,
         "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                                 "activation_scheme": "dynamic"}}
# A random model predicts almost uniformly (the top two logits of 1024 lie close), so FP8 noise
# flips its top-1 by chance; the small model is therefore trained first (TRAIN_STEPS of AdamW on
# the fixed inputs) until it predicts them confidently, as a trained model does, and every
# version after the first is one more optimizer step: an RL loop in miniature.
TRAIN_STEPS = 200
TOKEN = os.environ.setdefault("WB_TOKEN", "endpoint-check-%d" % random.randrange(1 << 30))


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------- the model


def hf_config():
    from transformers import Qwen3MoeConfig

    with open(os.environ.get("WB_CHECK_CONFIG", CONFIG)) as f:
        c = json.load(f)
    c.pop("quantization_config", None)  # the trainer holds BF16
    c.pop("architectures", None)
    c.pop("model_type", None)
    cfg = Qwen3MoeConfig(**c)
    cfg.dtype = "bfloat16"
    return cfg


def large():
    return "WB_CHECK_CONFIG" in os.environ


def fp32_masters():
    """WB_CHECK_MASTERS=fp32: the trainer holds FP32 parameters (FSDP2 computing in BF16 by its
    mixed-precision policy); the rollout must get what a BF16 trainer would have sent: PyTorch's
    cast of each master to BF16, then quantized."""
    return os.environ.get("WB_CHECK_MASTERS", "bf16") == "fp32"


def as_sent(sd):
    """A trainer state dict as the rollout receives it: FP32 masters cast to BF16 by PyTorch."""
    import torch

    return {k: v.to(torch.bfloat16) if v.dtype == torch.float32 else v for k, v in sd.items()}


def new_model(device):
    import torch
    from transformers import Qwen3MoeForCausalLM

    torch.manual_seed(1234)
    with torch.device(device):
        m = Qwen3MoeForCausalLM(hf_config()).to(dtype=torch.bfloat16)
    m.eval()
    return m


def inputs(device):
    import torch

    g = torch.Generator().manual_seed(99)
    return torch.randint(0, hf_config().vocab_size, (4, 48), generator=g).to(device)


# Newer transformers hold a MoE layer's experts fused (mlp.experts.gate_up_proj [E, 2I, H] or
# [E, H, 2I], mlp.experts.down_proj); checkpoints name them per expert. The trainer registers
# them fused (the family's fused naming); these turn one naming into the other for the checks'
# references (the saved state dict and the model loaded from the rollout's weights).
def fused_experts(model):
    return any(n.endswith("mlp.experts.gate_up_proj") for n, _ in model.named_parameters())


def expert_views(name, t, cfg):
    """Per-expert (checkpoint-named) tensors of a fused experts parameter (views where the
    layout allows, copies otherwise)."""
    p = name.rsplit(".", 1)[0] + "."
    I, H = cfg.moe_intermediate_size, cfg.hidden_size
    out = {}
    for e in range(t.shape[0]):
        if name.endswith("gate_up_proj"):
            w = t[e] if t.shape[1] == 2 * I else t[e].t()
            out[f"{p}{e}.gate_proj.weight"] = w[:I].contiguous() if not w.is_contiguous() else w[:I]
            out[f"{p}{e}.up_proj.weight"] = w[I:].contiguous() if not w.is_contiguous() else w[I:]
        else:
            w = t[e] if t.shape[1] == H else t[e].t()
            out[f"{p}{e}.down_proj.weight"] = w.contiguous()
    return out


def checkpoint_names(sd, cfg):
    out = {}
    for k, v in sd.items():
        if k.endswith("mlp.experts.gate_up_proj") or k.endswith("mlp.experts.down_proj"):
            out.update(expert_views(k, v, cfg))
        else:
            out[k] = v
    return out


def model_names(sd, model, cfg):
    """Checkpoint-named tensors as the model's state dict wants them."""
    import torch

    if not fused_experts(model):
        return sd
    want = dict(model.state_dict())
    out = {k: v for k, v in sd.items() if ".mlp.experts." not in k}
    for k, ref in want.items():
        if k.endswith("mlp.experts.gate_up_proj") or k.endswith("mlp.experts.down_proj"):
            p = k.rsplit(".", 1)[0] + "."
            per = []
            for e in range(cfg.num_experts):
                if k.endswith("gate_up_proj"):
                    w = torch.cat([sd[f"{p}{e}.gate_proj.weight"], sd[f"{p}{e}.up_proj.weight"]])
                else:
                    w = sd[f"{p}{e}.down_proj.weight"]
                per.append(w if ref.shape[1] == w.shape[0] else w.t())
            out[k] = torch.stack(per)
    return out


def per_block_cast_to_fp8(x):
    """DeepGEMM's reference (tests/test_core.py): 128x128 blocks from the origin."""
    import torch

    m, n = x.shape
    xp = torch.zeros((math.ceil(m / 128) * 128, math.ceil(n / 128) * 128), dtype=x.dtype, device=x.device)
    xp[:m, :n] = x
    xv = xp.view(-1, 128, xp.size(1) // 128, 128)
    amax = xv.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
    q = (xv * (448.0 / amax)).to(torch.float8_e4m3fn)
    return q.view_as(xp)[:m, :n].contiguous(), (amax / 448.0).view(xv.size(0), xv.size(2))


def fused_reference(sd, cfg):
    """The rollout tensors as vLLM holds them, computed from a trainer state dict with PyTorch:
    fused projections, each component quantized separately and concatenated."""
    return fused_reference_with(sd, cfg, per_block_cast_to_fp8)


def fused_reference_with(sd, cfg, q8):
    import torch

    out = {}
    for k, v in sd.items():
        if ".self_attn.q_proj." in k:
            p = k.replace(".q_proj.weight", ".")
            parts = [q8(sd[p + n + "_proj.weight"]) for n in ("q", "k", "v")]
            out[p + "qkv_proj.weight"] = torch.cat([a for a, _ in parts])
            out[p + "qkv_proj.weight_scale_inv"] = torch.cat([s for _, s in parts])
        elif ".self_attn.o_proj." in k:
            out[k], out[k + "_scale_inv"] = q8(v)
        elif k.endswith(".mlp.experts.0.gate_proj.weight"):
            p = k.replace(".experts.0.gate_proj.weight", ".experts.")
            w13, s13, w2, s2 = [], [], [], []
            for e in range(cfg.num_experts):
                g, gs = q8(sd[f"{p}{e}.gate_proj.weight"])
                u, us = q8(sd[f"{p}{e}.up_proj.weight"])
                d, ds = q8(sd[f"{p}{e}.down_proj.weight"])
                w13.append(torch.cat([g, u]))
                s13.append(torch.cat([gs, us]))
                w2.append(d)
                s2.append(ds)
            out[p + "w13_weight"] = torch.stack(w13)
            out[p + "w13_weight_scale_inv"] = torch.stack(s13)
            out[p + "w2_weight"] = torch.stack(w2)
            out[p + "w2_weight_scale_inv"] = torch.stack(s2)
        elif ".mlp.experts." in k or any(f".self_attn.{n}_proj." in k for n in "kv"):
            continue
        else:
            out[k] = v
    return out


def dequantized_state_dict(rt, cfg):
    """A transformers state dict from the rollout's vLLM-layout tensors."""
    import torch

    def deq(w, s):
        lead = w.shape[:-2]
        m, n = w.shape[-2:]
        s = s.repeat_interleave(128, -2)[..., :m, :].repeat_interleave(128, -1)[..., :n]
        return (w.float() * s).to(torch.bfloat16).reshape(*lead, m, n)

    sd = {}
    qd, kd = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    for k, v in rt.items():
        if k.endswith("_scale_inv"):
            continue
        if v.dtype == torch.float8_e4m3fn:
            v = deq(v, rt[k + "_scale_inv"])
        if ".qkv_proj." in k:
            p = k.replace("qkv_proj.weight", "")
            sd[p + "q_proj.weight"], sd[p + "k_proj.weight"], sd[p + "v_proj.weight"] = v.split([qd, kd, kd])
        elif k.endswith(".experts.w13_weight"):
            p = k.replace("w13_weight", "")
            for e in range(cfg.num_experts):
                g, u = v[e].split([cfg.moe_intermediate_size] * 2)
                sd[f"{p}{e}.gate_proj.weight"], sd[f"{p}{e}.up_proj.weight"] = g, u
        elif k.endswith(".experts.w2_weight"):
            p = k.replace("w2_weight", "")
            for e in range(cfg.num_experts):
                sd[f"{p}{e}.down_proj.weight"] = v[e]
        else:
            sd[k] = v
    return sd


def rollout_tensors(tmp):
    """What a TP-1 rollout rank holds, as the planner reports it (name, dtype, shape)."""
    import weightbridge as wb

    tl = os.path.join(tmp, "one-trainer.yaml")
    rl = os.path.join(tmp, "one-rollout.yaml")
    with open(tl, "w") as f:
        f.write("world_size: 1\nmesh: [{name: dp, size: 1}]\nplacements: [{match: \"*\", place: {}}]\n")
    with open(rl, "w") as f:
        f.write("replicas: 1\ntp: 1\ngpus_per_replica: 1\ngpus_per_node: 1\n")
    return wb.plan(RULES, os.environ.get("WB_CHECK_CONFIG", CONFIG), tl, rl, tables=True)["receive"][0]["local"]


# ---------------------------------------------------------------- processes


def make_rollout_params(local, device):
    import torch

    dt = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp8_e4m3": torch.float8_e4m3fn}
    return {l["name"]: torch.zeros(l["shape"], dtype=dt[l["dtype"]], device=device) for l in local}


def check_rollout(params, tmp, ref=None, ref_logits=None):
    """(a) bytes against the reference; (b) logits of the dequantized model. The trainer's state
    dict and logits come from files (another process) or directly."""
    import torch

    cfg = hf_config()
    dev = params[next(iter(params))].device
    if ref is None:
        ref = torch.load(os.path.join(tmp, "trainer_sd.pt"), map_location=dev)
        ref_logits = torch.load(os.path.join(tmp, "trainer_logits.pt"), map_location=dev)
    want = fused_reference(as_sent(ref), cfg)
    del ref
    bad = [k for k in params if k not in want]
    check(not bad, f"rollout tensors without a reference: {bad[:5]}")
    differ, total = 0, 0
    for k, v in params.items():
        w = want[k]
        a, b = v.contiguous().view(torch.uint8), w.contiguous().to(v.dtype).view(torch.uint8)
        total += a.numel()
        n = int((a != b).sum())
        if n and differ == 0:
            log(f"    {k}: {n} of {a.numel()} bytes differ (the first tensor that does)")
        differ += n
    log(f"  (a) rollout bytes vs PyTorch per_block_cast_to_fp8 of the fused trainer tensors: "
        f"{differ} of {total} differ")
    check(differ == 0, "rollout bytes differ from the reference")
    del want
    m = new_model(v.device)
    missing, unexpected = m.load_state_dict(model_names(dequantized_state_dict(params, cfg), m, cfg),
                                            strict=False)
    check(not unexpected and all("rotary" in k for k in missing), f"state dict: {missing} {unexpected}")
    with torch.no_grad():
        got = m(inputs(v.device)).logits.float()
    del m
    ref_logits = ref_logits.float()
    top2 = ref_logits.topk(2, dim=-1).values
    log(f"      (the trainer's logits: median top-1 margin {(top2[..., 0] - top2[..., 1]).median().item():.3f}, "
        f"std {ref_logits.std().item():.3f})")
    cos = torch.nn.functional.cosine_similarity(got.flatten(1), ref_logits.flatten(1), dim=1).min().item()
    top1 = (got.argmax(-1) == ref_logits.argmax(-1)).float().mean().item()
    log(f"  (b) logits of the model loaded from the dequantized FP8 weights vs the trainer's: "
        f"cosine (min over sequences) {cos:.5f}, top-1 agreement {top1 * 100:.2f}%")
    if not large():  # the large model is random (untrained): its logits are reported only
        check(cos >= 0.99 and top1 >= 0.95, "logits too far from the trainer's")


def check(cond, what):
    if not cond:
        raise SystemExit("endpoint_check: " + what)


def trainer_loop(url, model, rank, tmp):
    """Registers the FSDP2 model, pushes VERSIONS (a step of noise between them), saves the full
    state dict and logits of the last version (rank 0)."""
    import weightbridge as wb

    check_fused_layout(model)
    t = wb.Trainer(url, model=model, rank=rank, timeout=300)
    return trainer_versions(t, model, rank, tmp)


def check_fused_layout(model):
    """Fused experts register as they are (DTensor shards of gate_up_proj [E, 2I, H] and
    down_proj [E, H, I]: FSDP2's Shard(0) splits the experts over the trainers), under the
    family's `fused` naming, which the controller picks from the registered names. The
    transposed form ([E, H, 2I]) needs the planner's transposes: refused here."""
    cfg = hf_config()
    for n, p in model.named_parameters():
        if n.endswith("mlp.experts.gate_up_proj") and p.shape[1] != 2 * cfg.moe_intermediate_size:
            raise SystemExit(f"endpoint_check: {n} {tuple(p.shape)} is the transposed fused form "
                             "[E, H, 2I]; the fused naming describes [E, 2I, H] only")


def train(model, opt, steps):
    """Next-token prediction on the fixed inputs (FSDP2 keeps every shard in place)."""
    import torch

    x = inputs("cuda")
    model.train()
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(
            model(x).logits[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()
    return loss.item()


def trainer_versions(t, model, rank, tmp, keep=False):
    import torch
    import torch.distributed as dist

    opt = None
    if not large():
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
        log(f"  trainer rank {rank}: trained {TRAIN_STEPS} steps, loss {train(model, opt, TRAIN_STEPS):.3f}")
    for v in VERSIONS:
        if v > 1 and opt is not None:
            train(model, opt, 1)  # the optimizer step of an RL loop
        elif v > 1:  # the large model: a small change of every shard, in place
            with torch.no_grad():
                g = torch.Generator(device="cuda").manual_seed(v * 100 + rank)
                for p in model.parameters():
                    loc = p.to_local() if hasattr(p, "to_local") else p
                    loc.add_(torch.randn(loc.shape, generator=g, device="cuda").to(loc.dtype) * 1e-3)
        t0 = time.time()
        f = t.push(v)
        f.sources(300)
        f.result(300)
        log(f"  trainer rank {rank}: version {v} complete in {(time.time() - t0) * 1000:.1f} ms (push to result)")
    # the reference of the last version: full tensors and the model's logits (the all-gather is
    # also what a trainer without weightbridge does first: timed, for the baseline)
    torch.cuda.synchronize()
    t0 = time.time()
    sd = {}
    for k, p in model.state_dict().items():
        sd[k] = p.full_tensor() if hasattr(p, "full_tensor") else p
    torch.cuda.synchronize()
    if dist.is_initialized() and dist.get_world_size() > 1:
        log(f"  trainer rank {rank}: baseline part 1: full_tensor() of every parameter (NCCL all-gather over "
            f"{dist.get_world_size()} ranks) {(time.time() - t0) * 1000:.1f} ms")
    sd = checkpoint_names(sd, hf_config())
    with torch.no_grad():
        logits = model(inputs("cuda")).logits
    if keep:  # the same process checks: hand them over as they are
        return t, {k: v.detach() for k, v in sd.items()}, logits.detach()
    if rank == 0:  # written whole, then renamed: the rollout waits for the names
        for name, obj in (("trainer_sd.pt", {k: v.detach().cpu() for k, v in sd.items()}),
                          ("trainer_logits.pt", logits.detach().cpu())):
            torch.save(obj, os.path.join(tmp, name + ".tmp"))
            os.replace(os.path.join(tmp, name + ".tmp"), os.path.join(tmp, name))
    if dist.is_initialized():
        dist.barrier()
    return t


def fsdp_model(rank, world):
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    ngpu = torch.cuda.device_count()
    torch.cuda.set_device(rank % ngpu)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("fsdp",))
    model = new_model("cuda")
    kw = {}
    if fp32_masters():
        from torch.distributed.fsdp import MixedPrecisionPolicy

        model = model.float()
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **kw)
    return model


def run_trainer(url, rank, world, tmp):
    import torch.distributed as dist

    model = fsdp_model(rank, world)
    t = trainer_loop(url, model, rank, tmp)
    t.close()
    dist.destroy_process_group()


def run_rollout(url, device, tmp):
    import torch
    import weightbridge as wb

    torch.cuda.set_device(device)
    params = make_rollout_params(rollout_tensors(tmp), f"cuda:{device}")
    seen = []
    r = wb.Rollout(url, params, rank=0, hook=lambda v: seen.append(v), timeout=300)
    for v in VERSIONS:
        r.wait(v, 300)
    torch.cuda.synchronize()
    check(seen == list(VERSIONS), f"hook ran for {seen}")
    # the trainer writes its reference after the last version; wait for it
    for _ in range(1200):
        if os.path.exists(os.path.join(tmp, "trainer_logits.pt")):
            break
        time.sleep(0.1)
    check_rollout(params, tmp)
    if large():  # baseline part 2, the rest of what a trainer without weightbridge does
        ref = torch.load(os.path.join(tmp, "trainer_sd.pt"), map_location=f"cuda:{device}")
        baseline(as_sent(ref), params)
        del ref
    r.close()


def run_one_process(url, tmp):
    """Trainer and rollout endpoints in one process on GPU 0."""
    import torch
    import torch.distributed as dist
    import weightbridge as wb

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + random.randrange(1000)))
    model = fsdp_model(0, 1)
    params = make_rollout_params(rollout_tensors(tmp), "cuda:0")
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    log(f"  trainer model: {nbytes / 1e9:.2f} GB of {'FP32' if fp32_masters() else 'BF16'} in {sum(1 for _ in model.parameters())} parameters; "
        f"rollout: {sum(p.numel() * p.element_size() for p in params.values()) / 1e9:.2f} GB")
    seen = []
    check_fused_layout(model)
    t = wb.Trainer(url, model=model, rank=0, timeout=0)
    r = wb.Rollout(url, params, rank=0, hook=lambda v: seen.append(v), timeout=0)
    t.wait_ready(300)
    r.wait_ready(300)
    _, sd, logits = trainer_versions(t, model, 0, tmp, keep=True)
    r.wait(VERSIONS[-1], 60)
    check(seen == list(VERSIONS), f"hook ran for {seen}")
    check_rollout(params, tmp, sd, logits)
    baseline(as_sent(sd), params)  # after the check: it overwrites the rollout's tensors
    t.close()
    r.close()
    dist.destroy_process_group()


def baseline(sd, params):
    """What a colocated RL stack does without weightbridge, on the same tensors: per rollout
    tensor, fuse, per_block_cast_to_fp8 (eager, then torch.compile), copy_ into the preallocated
    parameter. Timed like ours: the whole model, after a warm-up, GPU synchronized."""
    import torch

    cfg = hf_config()

    def once(fn):
        torch.cuda.synchronize()
        t0 = time.time()
        out = fused_reference_with(sd, cfg, fn)
        for k, p in params.items():
            p.copy_(out[k])
        torch.cuda.synchronize()
        return time.time() - t0

    eager = min(once(per_block_cast_to_fp8) for _ in range(2))
    compiled_fn = torch.compile(per_block_cast_to_fp8, dynamic=False)
    once(compiled_fn)  # compile every shape
    compiled = min(once(compiled_fn) for _ in range(2))
    want = fused_reference(sd, cfg)  # what torch.compile wrote, against the eager reference
    differ = sum(int((p.view(torch.uint8) != want[k].view(torch.uint8)).sum()) for k, p in params.items())
    log(f"  baseline (PyTorch, same run): fuse + per_block_cast_to_fp8 + copy_ per tensor: eager "
        f"{eager * 1000:.1f} ms, torch.compile {compiled * 1000:.1f} ms (torch.compile's bytes differ "
        f"from the eager reference in {differ})")


def job_file(tmp, trainers, provider):
    path = os.path.join(tmp, "job.yaml")
    rl = os.path.join(tmp, "rollout.yaml")
    with open(rl, "w") as f:
        f.write("replicas: 1\ntp: 1\ngpus_per_replica: 1\ngpus_per_node: 8\n")
    with open(path, "w") as f:
        f.write(f"""name: endpoint-check
model:
  rules: {RULES}
  hf_config: {os.environ.get("WB_CHECK_CONFIG", CONFIG)}
trainers: {trainers}
rollout_layout: {rl}
provider: {provider}
mem_cap: 4GiB
dead_after: 20s
heartbeat: 500ms
""")
    return path


def wait_first_failure(procs, seconds):
    """Waits for every process; the first that fails (exit status not 0) or a deadline passed
    ends the others at once, so that a child's failure ends the run with its message instead
    of the others waiting for it until their own timeouts. Returns 0 or the first failure's
    status (1 for the deadline)."""
    deadline = time.time() + seconds
    while True:
        codes = [p.poll() for p in procs]
        bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        if bad or time.time() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            if bad:
                log(f"  child {bad[0][0]} ({' '.join(procs[bad[0][0]].args[2:4])}) exited {bad[0][1]}: the others were ended")
                return bad[0][1] if bad[0][1] > 0 else 1
            log(f"  not done in {seconds} s: the children were ended")
            return 1
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.2)


def main_case(case):
    import torch

    ngpu = torch.cuda.device_count()
    tmp = tempfile.mkdtemp(prefix=f"endpoint_check_{case}.")
    port = 21000 + random.randrange(20000)
    url = f"tcp://127.0.0.1:{port}"
    trainers = 2 if case == "two" and ngpu >= 2 else 1
    job = job_file(tmp, trainers, "cudaipc")
    where = ("one process on GPU 0 (colocated, no IPC)" if case == "one" else
             f"{trainers} FSDP2 trainer process(es) on GPU(s) {list(range(trainers))}, rollout process on GPU "
             f"{ngpu - 1}{' (colocated with the trainer, CUDA IPC)' if ngpu == 1 else ''}")
    log(f"== case {case}: {where}")
    ctl_log = open(os.path.join(tmp, "controller.log"), "w")
    ctl = subprocess.Popen([os.path.join(BIN, "wb-controller"), "--config", job, "--listen", url],
                           stdout=ctl_log, stderr=subprocess.STDOUT)
    procs = []
    try:
        if case == "one":
            procs.append(subprocess.Popen([sys.executable, __file__, "--role", "one", url, tmp]))
        else:
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + random.randrange(1000)))
            procs.append(subprocess.Popen([sys.executable, __file__, "--role", "rollout", url, tmp, str(ngpu - 1)]))
            for r in range(trainers):
                procs.append(subprocess.Popen([sys.executable, __file__, "--role", "trainer", url, tmp,
                                               str(r), str(trainers)], env=env))
        rc = wait_first_failure(procs, 900)
        subprocess.run([os.path.join(BIN, "wb-ctl"), "-c", url, "plan"], timeout=30)
        return rc
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        subprocess.run([os.path.join(BIN, "wb-ctl"), "-c", url, "shutdown"], timeout=30,
                       capture_output=True)
        ctl.wait(timeout=30)
        ctl_log.close()
        if os.environ.get("WB_KEEP"):
            log(f"  logs: {tmp}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", default="all", choices=["two", "one", "all", "large", "large2"])
    ap.add_argument("--role", default=None)
    ap.add_argument("rest", nargs="*")
    a = ap.parse_args()
    if a.role == "trainer":
        url, tmp, rank, world = a.rest
        run_trainer(url, int(rank), int(world), tmp)
        return 0
    if a.role == "rollout":
        url, tmp, dev = a.rest
        run_rollout(url, int(dev), tmp)
        return 0
    if a.role == "one":
        url, tmp = a.rest
        run_one_process(url, tmp)
        return 0
    import torch
    import transformers

    log(f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}")
    probe = new_model("cpu")
    log("model parameters (first 12): " + ", ".join(
        f"{n} {tuple(p.shape)}" for n, p in list(probe.named_parameters())[:12]))
    if fused_experts(probe):
        log("this transformers holds experts fused: registered as they are (the fused naming)")
    del probe
    rc = 0
    for case in (["two", "one"] if a.case == "all" else [a.case]):
        if case in ("large", "large2"):  # the realistic size: colocated in one process, or FSDP2
            cfg_path = os.path.join(tempfile.mkdtemp(prefix="endpoint_check_cfg."), "config.json")
            with open(cfg_path, "w") as f:  # over two trainer processes (GPUs 0, 1), rollout on the last
                json.dump(LARGE, f)
            os.environ["WB_CHECK_CONFIG"] = cfg_path
            r = main_case("one" if case == "large" else "two")
            del os.environ["WB_CHECK_CONFIG"]
        else:
            r = main_case(case)
        log(f"== case {case}: {'PASS' if r == 0 else 'FAIL'}")
        rc |= r
    return rc


if __name__ == "__main__":
    sys.exit(main())
