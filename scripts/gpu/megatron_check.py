#!/usr/bin/env python3
"""megatron_check.py — Megatron-core trainers as their own code builds them -> a vLLM-layout rollout.

Each case runs 2 trainer processes (`torch.distributed.run`), each building megatron-core's own
GPTModel with `get_gpt_layer_local_spec` (Megatron-core without Transformer Engine: the names
the `megatron_local` naming of the family files describes) under megatron's parallel state:

  tp2  Qwen3 dense (16 heads, 4 query groups, head_dim 128, hidden 1024, ffn 3072, 4 layers, vocab
       4000, which megatron holds padded to 4096 rows),
       tensor parallel 2: linear_qkv split by query groups, linear_fc1 = [gate_r; up_r] per rank;
  pp2  the same model, pipeline parallel 2: each stage holds 2 layers numbered locally 0..1,
       the embedding on the first stage, final norm and output layer on the last;
  ep2  Qwen3-MoE (8 experts of ffn 256, top-2), expert parallel 2: each rank holds 4 experts
       numbered locally 0..3 (SequentialMLP local_experts), the rest replicated over both.

The trainers register with `wb.Trainer(url, model=[model])` (weightbridge's Megatron adapter:
global layer and expert numbers, the (pp, edp, ep, tp) mesh and each tensor's placement from
megatron's parallel state); the job names no trainer layout and no naming (the controller
derives both from the registrations). A rollout process on the last GPU holds the model in
vLLM's layout with FP8 128x128 blocks (fused qkv_proj / gate_up_proj, stacked experts), as plain
torch tensors. Every version the trainers change every local parameter in place (seeded noise;
the copies a tensor has on several ranks stay equal) and push; then each trainer saves its local
parameters as megatron holds them, and the rollout compares every byte with the reference this
script computes independently: megatron's tensors turned into Hugging Face ones (q/k/v out of
each query group, gate/up out of each TP rank's fc1 half, global layer and expert numbers from
the stage and EP rank), fused as vLLM fuses them and quantized with DeepGEMM's
per_block_cast_to_fp8.

Megatron-core is not part of weightbridge: the script imports it from $WB_MEGATRON (a directory
holding megatron/core; scripts/gpu/megatron_check.sh defaults to .deb/mcore, extracted there from
a fetched megatron-core 0.20.0). With one GPU both trainers and the rollout share it (no megatron
collective is taken: the trainers change their parameters in place instead of a training step).

Usage: megatron_check.py [--case tp2|pp2|ep2|all] [--versions N] [--timeout S]
Prints "case X: version V: 0 of N bytes differ" and exits non-zero on any difference or failure.
"""

import argparse
import json
import os
import random
import re
import sys
import tempfile
import time
import uuid
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("WB_BIN", os.path.join(ROOT, "build", "bin"))
TOKEN = os.environ.setdefault("WB_TOKEN", "megatron-check-%d" % random.randrange(1 << 30))

import fsdp2_check as F  # noqa: E402  (process cleanup, file waits)

FP8_QC = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
DENSE = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
         "intermediate_size": 3072, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128,
         "num_hidden_layers": 4, "vocab_size": 4000, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
         "rms_norm_eps": 1e-6}
MOE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 1024,
       "intermediate_size": 3072, "moe_intermediate_size": 256, "num_experts": 8, "num_experts_per_tok": 2,
       "decoder_sparse_step": 1, "mlp_only_layers": [], "num_attention_heads": 16, "num_key_value_heads": 4,
       "head_dim": 128, "num_hidden_layers": 4, "vocab_size": 4000, "tie_word_embeddings": False,
       "torch_dtype": "bfloat16", "rms_norm_eps": 1e-6}
CASES = {"tp2": dict(tp=2, pp=1, ep=1, moe=False), "pp2": dict(tp=1, pp=2, ep=1, moe=False),
         "ep2": dict(tp=1, pp=1, ep=2, moe=True)}


def log(*a):
    print(*a, flush=True)


def hf_config(case):
    c = dict(MOE if CASES[case]["moe"] else DENSE)
    c["quantization_config"] = FP8_QC  # the rollout is FP8; the trainers hold BF16 (norms FP32)
    return c


# ---------------------------------------------------------------- trainers


def build_model(case):
    """megatron-core's GPTModel for this rank, with megatron's parallel state initialized."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig

    k = CASES[case]
    c = hf_config(case)
    ps.initialize_model_parallel(tensor_model_parallel_size=k["tp"], pipeline_model_parallel_size=k["pp"],
                                 expert_model_parallel_size=k["ep"])
    model_parallel_cuda_manual_seed(1234)
    moe = {}
    if k["moe"]:
        moe = dict(num_moe_experts=c["num_experts"], moe_ffn_hidden_size=c["moe_intermediate_size"],
                   moe_router_topk=c["num_experts_per_tok"], moe_grouped_gemm=False)
    tc = TransformerConfig(
        num_layers=c["num_hidden_layers"], hidden_size=c["hidden_size"],
        num_attention_heads=c["num_attention_heads"], num_query_groups=c["num_key_value_heads"],
        kv_channels=c["head_dim"], ffn_hidden_size=c["intermediate_size"], gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, normalization="RMSNorm", qk_layernorm=True,
        add_bias_linear=False, params_dtype=torch.bfloat16, bf16=True, pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=k["tp"], pipeline_model_parallel_size=k["pp"],
        expert_model_parallel_size=k["ep"], use_cpu_initialization=False, **moe)
    spec = get_gpt_layer_local_spec(num_experts=c.get("num_experts"), moe_grouped_gemm=False,
                                    qk_layernorm=True, normalization="RMSNorm")
    # megatron's training scripts pad the vocab to a multiple of make_vocab_size_divisible_by (128)
    # times TP: 4000 -> 4096 rows, 96 of them padding
    div = 128 * k["tp"]
    padded = -(-c["vocab_size"] // div) * div
    model = GPTModel(config=tc, transformer_layer_spec=spec, vocab_size=padded,
                     max_sequence_length=256, pre_process=ps.is_pipeline_first_stage(),
                     post_process=ps.is_pipeline_last_stage(), share_embeddings_and_output_weights=False,
                     position_embedding_type="rope").cuda()
    return model


def ranks():
    from megatron.core import parallel_state as ps

    return {"tp": (ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()),
            "pp": (ps.get_pipeline_model_parallel_rank(), ps.get_pipeline_model_parallel_world_size()),
            "ep": (ps.get_expert_model_parallel_rank(), ps.get_expert_model_parallel_world_size())}


def layer_offset(model):
    """The global number of this stage's first layer (megatron's own: layer_number is 1-based)."""
    return min(l.layer_number for l in model.decoder.layers) - 1 if len(model.decoder.layers) else 0


def change(model, rk, version):
    """Seeded noise on every local parameter, in place; a tensor's copies on several ranks (norms,
    routers, every dense tensor under EP) get the same noise, a TP shard or an expert its own."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            key = f"{version}:{rk['pp'][0]}:{name}"
            if getattr(p, "tensor_model_parallel", False):
                key += f":tp{rk['tp'][0]}"
            if not getattr(p, "allreduce", True):  # an expert parameter: EP rank's own experts
                key += f":ep{rk['ep'][0]}"
            g = torch.Generator(device="cuda").manual_seed(zlib.crc32(key.encode()))
            noise = torch.randn(p.shape, generator=g, device="cuda", dtype=torch.float32)
            if version == 0:  # the initial weights: norms around 1, matrices of scale 0.02
                p.copy_((1.0 + 0.1 * noise if p.dim() == 1 else 0.02 * noise).to(p.dtype))
            else:
                p.add_((noise * (1e-2 if p.dim() == 1 else 2e-4)).to(p.dtype))


def run_trainer(url, tmp, case, versions, timeout):
    import torch
    import torch.distributed as dist

    import weightbridge as wb

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    ngpu = torch.cuda.device_count()
    torch.cuda.set_device(rank % ngpu)
    dist.init_process_group("nccl")  # lazily connected: no collective is taken here
    model = build_model(case)
    rk = ranks()
    change(model, rk, 0)
    names = [n for n, _ in model.named_parameters()]
    log(f"trainer rank {rank}: tp {rk['tp']}, pp {rk['pp']}, ep {rk['ep']}, layer offset {layer_offset(model)}, "
        f"{len(names)} parameters ({', '.join(names[:3])}, ...)")
    t = wb.Trainer(url, model=[model], rank=rank, timeout=timeout)
    deadline = time.time() + timeout
    for v in range(1, versions + 1):
        change(model, rk, v)
        torch.cuda.synchronize()
        t0 = time.time()
        p = t.push(v)
        p.sources(timeout)
        res = p.result(timeout)
        log(f"trainer rank {rank}: version {v} complete in {(time.time() - t0) * 1000:.1f} ms, {res.bytes} bytes written")
        held = {n: q.detach().cpu() for n, q in model.named_parameters()}
        F.atomic_save({"ranks": rk, "offset": layer_offset(model), "params": held},
                      os.path.join(tmp, f"v{v}.rank{rank}.pt"))
        F.wait_for(os.path.join(tmp, f"checked.v{v}"), deadline, f"the rollout's check of version {v}")
    t.close()
    dist.destroy_process_group()


# ---------------------------------------------------------------- the reference


def to_hf(files, c):
    """Hugging Face tensors from every rank's megatron parameters (megatron-core's conventions:
    linear_qkv rows per query group [q of the group; k; v], linear_fc1 = [gate; up] of each TP
    rank's rows, column-parallel tensors split along dim 0, row-parallel along dim 1, layers
    numbered from the stage's offset, experts from ep_rank * experts per rank)."""
    import torch

    pieces = {}  # global megatron name -> {tp rank: tensor}
    for f in files:
        tp_r, _ = f["ranks"]["tp"]
        ep_r, ep = f["ranks"]["ep"]
        for n, t in f["params"].items():
            m = re.match(r"decoder\.layers\.(\d+)\.(.*)$", n)
            if m:
                rest = m.group(2)
                e = re.match(r"mlp\.experts\.local_experts\.(\d+)\.(.*)$", rest)
                if e:
                    per = c["num_experts"] // ep
                    rest = f"mlp.experts.local_experts.{ep_r * per + int(e.group(1))}.{e.group(2)}"
                n = f"decoder.layers.{f['offset'] + int(m.group(1))}.{rest}"
            have = pieces.setdefault(n, {})
            if tp_r in have:  # another copy (a DP or EP replica): must be equal
                if not torch.equal(have[tp_r].view(torch.uint8), t.view(torch.uint8)):
                    raise SystemExit(f"megatron_check: {n}: two ranks' copies differ")
            else:
                have[tp_r] = t
    H, hd = c["hidden_size"], c["head_dim"]
    ng, r = c["num_key_value_heads"], c["num_attention_heads"] // c["num_key_value_heads"]
    hf = {}
    for n, by in pieces.items():
        parts = [by[k] for k in sorted(by)]
        col = torch.cat(parts, 0)
        row = torch.cat(parts, 1) if parts[0].dim() == 2 else None
        one = parts[0]
        if len(parts) > 1 and n.endswith(("layernorm.weight", "router.weight")):
            if any(not torch.equal(p, one) for p in parts):
                raise SystemExit(f"megatron_check: {n}: TP ranks' copies differ")
        if n == "embedding.word_embeddings.weight":  # the padding rows are not the model's
            hf["model.embed_tokens.weight"] = col[: c["vocab_size"]]
            continue
        if n == "output_layer.weight":
            hf["lm_head.weight"] = col[: c["vocab_size"]]
            continue
        if n == "decoder.final_layernorm.weight":
            hf["model.norm.weight"] = one
            continue
        m = re.match(r"decoder\.layers\.(\d+)\.(.*)$", n)
        L, rest = m.group(1), m.group(2)
        p = f"model.layers.{L}."
        if rest == "input_layernorm.weight":
            hf[p + "input_layernorm.weight"] = one
        elif rest == "pre_mlp_layernorm.weight":
            hf[p + "post_attention_layernorm.weight"] = one
        elif rest == "self_attention.linear_qkv.weight":
            g = col.view(ng, r + 2, hd, H)
            hf[p + "self_attn.q_proj.weight"] = g[:, :r].reshape(ng * r * hd, H)
            hf[p + "self_attn.k_proj.weight"] = g[:, r].reshape(ng * hd, H)
            hf[p + "self_attn.v_proj.weight"] = g[:, r + 1].reshape(ng * hd, H)
        elif rest == "self_attention.linear_proj.weight":
            hf[p + "self_attn.o_proj.weight"] = row
        elif rest == "self_attention.q_layernorm.weight":
            hf[p + "self_attn.q_norm.weight"] = one
        elif rest == "self_attention.k_layernorm.weight":
            hf[p + "self_attn.k_norm.weight"] = one
        elif rest == "mlp.linear_fc1.weight":
            halves = [x.chunk(2, 0) for x in parts]  # each TP rank: [gate_r; up_r]
            hf[p + "mlp.gate_proj.weight"] = torch.cat([h[0] for h in halves])
            hf[p + "mlp.up_proj.weight"] = torch.cat([h[1] for h in halves])
        elif rest == "mlp.linear_fc2.weight":
            hf[p + "mlp.down_proj.weight"] = row
        elif rest == "mlp.router.weight":
            hf[p + "mlp.gate.weight"] = one
        elif (e := re.match(r"mlp\.experts\.local_experts\.(\d+)\.linear_fc(\d)\.weight$", rest)):
            q = f"{p}mlp.experts.{e.group(1)}."
            if e.group(2) == "1":
                hf[q + "gate_proj.weight"], hf[q + "up_proj.weight"] = one.chunk(2, 0)
            else:
                hf[q + "down_proj.weight"] = one
        else:
            raise SystemExit(f"megatron_check: {n}: no Hugging Face counterpart known here")
    return {k: (v.to(torch.bfloat16) if v.dtype == torch.float32 else v) for k, v in hf.items()}


def expected(hf, names, c):
    """The rollout's tensors from Hugging Face ones: vLLM's fusions, FP8 per fused component."""
    import torch

    from endpoint_check import per_block_cast_to_fp8  # DeepGEMM's reference

    def q8(parts, stack=False):
        qs = [per_block_cast_to_fp8(x) for x in parts]
        f = torch.stack if stack else torch.cat
        return f([a for a, _ in qs]), f([s for _, s in qs])

    out = {}
    for name in names:
        if name.endswith("_scale_inv"):
            continue
        fp8 = name + "_scale_inv" in names
        p = name.rsplit(".", 2)[0] + "."
        if name.endswith(".self_attn.qkv_proj.weight"):
            parts = [hf[name.replace("qkv_proj", x)] for x in ("q_proj", "k_proj", "v_proj")]
        elif name.endswith(".mlp.gate_up_proj.weight"):
            parts = [hf[name.replace("gate_up_proj", x)] for x in ("gate_proj", "up_proj")]
        elif name.endswith(".mlp.experts.w13_weight") or name.endswith(".mlp.experts.w2_weight"):
            base = name[: -len("w13_weight")] if name.endswith("w13_weight") else name[: -len("w2_weight")]
            ws, ss = [], []
            for e in range(c["num_experts"]):
                if name.endswith("w13_weight"):
                    a, s = q8([hf[f"{base}{e}.gate_proj.weight"], hf[f"{base}{e}.up_proj.weight"]])
                else:
                    a, s = q8([hf[f"{base}{e}.down_proj.weight"]])
                ws.append(a)
                ss.append(s)
            out[name], out[name + "_scale_inv"] = torch.stack(ws), torch.stack(ss)
            continue
        else:
            parts = [hf[name]]
        if fp8:
            out[name], out[name + "_scale_inv"] = q8(parts)
        else:
            out[name] = torch.cat(parts)
        del p
    return out


# ---------------------------------------------------------------- the rollout


def run_rollout(url, tmp, case, versions, device, timeout):
    import torch

    import weightbridge as wb

    torch.cuda.set_device(device)
    c = hf_config(case)
    rules = os.path.join(ROOT, "configs/models", "qwen3_moe.yaml" if CASES[case]["moe"] else "qwen3.yaml")
    local = wb.plan(rules, os.path.join(tmp, "config.json"), os.path.join(tmp, "trainer.yaml"),
                    os.path.join(tmp, "rollout.yaml"), tables=True)["receive"][0]["local"]
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp8_e4m3": torch.float8_e4m3fn}
    params = {l["name"]: torch.zeros(l["shape"], dtype=dt[l["dtype"]], device=f"cuda:{device}") for l in local}
    total = sum(p.numel() * p.element_size() for p in params.values())
    r = wb.Rollout(url, params, rank=0, timeout=timeout)
    deadline = time.time() + timeout
    differ_all = 0
    for v in range(1, versions + 1):
        r.wait(v, timeout)
        torch.cuda.synchronize()
        files = []
        for k in range(2):
            path = os.path.join(tmp, f"v{v}.rank{k}.pt")
            F.wait_for(path, deadline, f"trainer rank {k}'s parameters of version {v}")
            files.append(torch.load(path, map_location="cpu"))
        hf = {k: x.to(f"cuda:{device}") for k, x in to_hf(files, c).items()}
        want = expected(hf, list(params), c)
        differ, bad = 0, []
        for name, p in params.items():
            w = want[name].to(p.dtype)
            if p.shape[0] > w.shape[0] and p.shape[1:] == w.shape[1:]:  # vLLM's vocab padding rows:
                w = torch.cat([w, torch.zeros_like(p[w.shape[0]:])])  # never written, still zero
            a = p.contiguous().view(torch.uint8)
            b = w.contiguous().view(torch.uint8)
            if a.shape != b.shape:
                raise SystemExit(f"megatron_check: {name}: rollout {tuple(p.shape)}, reference {tuple(w.shape)}")
            n = int((a != b).sum())
            if n:
                bad.append(f"{name}: {n} of {a.numel()} bytes differ")
            differ += n
        log(f"case {case}: version {v}: {differ} of {total} bytes differ ({len(params)} rollout tensors)")
        for line in bad[:20]:
            log("    " + line)
        differ_all += differ
        with open(os.path.join(tmp, f"checked.v{v}"), "w") as f:
            f.write(str(differ))
    with open(os.path.join(tmp, "rollout.json"), "w") as f:
        json.dump({"differ": differ_all, "total": total * versions}, f)
    r.close()


# ---------------------------------------------------------------- the run


def run_case(case, a):
    import torch

    ngpu = torch.cuda.device_count()
    tmp = tempfile.mkdtemp(prefix=f"megatron_check_{case}.")
    c = hf_config(case)
    rules = os.path.join(ROOT, "configs/models", "qwen3_moe.yaml" if CASES[case]["moe"] else "qwen3.yaml")
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(c, f)
    with open(os.path.join(tmp, "rollout.yaml"), "w") as f:
        f.write("replicas: 1\ntp: 1\ngpus_per_replica: 1\n")
    with open(os.path.join(tmp, "trainer.yaml"), "w") as f:  # for wb.plan's rollout list only
        f.write("world_size: 1\nmesh:\n  - {name: d0, size: 1}\nplacements:\n  - match: \"*\"\n    place: {}\n")
    with open(os.path.join(tmp, "job.yaml"), "w") as f:
        f.write(f"""name: megatron-check-{case}
model:
  rules: {rules}
  hf_config: {os.path.join(tmp, "config.json")}
trainers: 2
rollout_layout: {os.path.join(tmp, "rollout.yaml")}
provider: cudaipc
mem_cap: 1GiB
dead_after: 20s
""")
    url = f"tcp://127.0.0.1:{21000 + random.randrange(20000)}"
    rdev = ngpu - 1
    k = CASES[case]
    log(f"== case {case}: 2 megatron-core trainer processes (tp {k['tp']}, pp {k['pp']}, ep {k['ep']}) on GPU(s) "
        f"{[r % ngpu for r in range(2)]}, FP8 rollout on GPU {rdev}, cudaipc, {a.versions} versions (logs: {tmp})")
    env = dict(os.environ, WB_TOKEN=TOKEN, PYTHONPATH=os.pathsep.join(
        [os.environ["WB_MEGATRON"], os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH", "")]))
    common = [url, tmp, case, str(a.versions), str(a.timeout)]
    children = {
        "controller": [os.path.join(BIN, "wb-controller"), "--config", os.path.join(tmp, "job.yaml"), "--listen", url],
        "rollout": [sys.executable, __file__, "--role", "rollout", *common, str(rdev)],
        "trainers": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                     __file__, "--role", "trainer", *common],
    }
    failed = F.run_job(children, tmp, url, env, a.timeout + 120)
    if failed:
        log(f"case {case}: FAILED: {failed}")
        return 1
    with open(os.path.join(tmp, "rollout.json")) as f:
        res = json.load(f)
    log(f"case {case}: {res['differ']} of {res['total']} bytes differ over {a.versions} versions")
    return 1 if res["differ"] else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", default="all", choices=[*CASES, "all"])
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=300, help="seconds for each wait, and a case's limit")
    ap.add_argument("--role", default=None)
    ap.add_argument("rest", nargs="*")
    a = ap.parse_args()
    if a.role in ("trainer", "rollout"):
        url, tmp, case, versions, timeout = a.rest[:5]
        try:
            if a.role == "trainer":
                run_trainer(url, tmp, case, int(versions), int(timeout))
            else:
                run_rollout(url, tmp, case, int(versions), int(a.rest[5]), int(timeout))
        except BaseException:
            open(os.path.join(tmp, "abort"), "w").close()
            raise
        return 0
    import torch

    if not torch.cuda.is_available():
        log("megatron_check: no GPU")
        return 1
    if not os.path.isdir(os.path.join(os.environ.get("WB_MEGATRON", ""), "megatron", "core")):
        log("megatron_check: WB_MEGATRON must name a directory holding megatron/core (megatron-core's source)")
        return 1
    sys.path.insert(0, os.environ["WB_MEGATRON"])
    import megatron.core

    os.environ[F.MARK] = uuid.uuid4().hex
    log(f"torch {torch.__version__}, megatron-core {megatron.core.__version__}, {torch.cuda.device_count()} GPU(s): "
        f"{torch.cuda.get_device_name(0)}")
    rc = 0
    for case in (list(CASES) if a.case == "all" else [a.case]):
        r = run_case(case, a)
        log(f"== case {case}: {'PASS' if r == 0 else 'FAIL'}")
        rc |= r
    return rc


if __name__ == "__main__":
    sys.exit(main())
