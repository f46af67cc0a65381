#!/usr/bin/env python3
"""adapters_check.py — weightbridge.vllm's rollout path with PyTorch on GPUs, without vLLM.

vLLM is not installable on the lent machines, so the engine is a torch stand-in of vLLM's object
graph for a tiny DeepSeek-V3 (the adapters test's job: 2 synthetic trainers -> 2 FP8 rollouts,
TP 2): nn.Parameters on the GPU named and shaped as vLLM holds them (FP8 E4M3 weights with
float32 weight_scale_inv), quantization-method objects with vLLM's class names, and per layer
an MLA attention whose backend derives W_UK_T and W_UV from kv_b_proj (dequantized, BF16, new
tensors each time, allocated on the current CUDA device) in process_weights_after_loading. Each
rollout registers through ``weightbridge.vllm.start`` — the module's own code: discovery,
attestation, the post-update hook on the endpoint's thread under torch_scope(device), CUDA sync —
and captures a CUDA graph that multiplies a fixed input by W_UK_T and W_UV. After each version:
  (a) the graph's output equals the same products computed eagerly from the kv_b_proj bytes that
      landed (the refresh put the new values where the graph reads);
  (b) W_UK_T/W_UV keep their objects and addresses, on the rollout's device;
  (c) wb-ctl verify: every rollout byte equals the reference.
With two GPUs the rollouts sit on GPU 1 (a hook without the device scope would allocate on GPU 0
and fail the version). Also runs the adapters test's in-process tests, torch variant included.

Usage: adapters_check.py     (build first; scripts/gpu/adapters_check.sh)
Exits non-zero when a check fails.
"""

import os
import random
import subprocess
import sys
import tempfile
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests/python"))
os.environ.setdefault("WB_BIN", os.path.join(ROOT, "build/bin"))
TOKEN = os.environ.setdefault("WB_TOKEN", "adapters-check-%d" % random.randrange(1 << 30))
os.environ["WB_E2E_TOKEN"] = TOKEN

import adapters_e2e as T  # noqa: E402  (the job, the plan's rollout list, FP8 decoding)
import weightbridge.vllm as wbv  # noqa: E402
from weightbridge import _adapter as A  # noqa: E402

VERSIONS = (1, 2, 3)


def log(*a):
    print(*a, flush=True)


def torch_engine(rank, device):
    import torch

    TD = {"bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn, "fp32": torch.float32}
    locals_ = T.ds_locals(rank)
    root = torch.nn.Module()
    for name, dt, shape in locals_:
        path, pname = name.rsplit(".", 1)
        m = root
        for part in path.split("."):
            if not hasattr(m, part):
                m.add_module(part, torch.nn.Module())
            m = getattr(m, part)
        m.register_parameter(pname, torch.nn.Parameter(torch.zeros(shape, dtype=TD[dt], device=device),
                                                       requires_grad=False))
        if pname == "weight_scale_inv":
            m.quant_method = T.quant("Fp8LinearMethod", weight_block_size=[128, 128], use_marlin=False)
        if pname == "w13_weight":
            m.quant_method = T.quant("Fp8MoEMethod", weight_block_size=[128, 128])

    class Impl:
        def __init__(self, kv_b_proj):
            self.kv_b_proj = kv_b_proj

        def process_weights_after_loading(self, act_dtype):
            w = self.kv_b_proj.weight.float() * torch.repeat_interleave(
                torch.repeat_interleave(self.kv_b_proj.weight_scale_inv, 128, 0), 128, 1)
            w = w.to(act_dtype).T.reshape(128, 2, 256)
            uk_t = torch.empty((2, 128, 128), dtype=act_dtype, device="cuda")  # the current device
            uv = torch.empty((2, 128, 128), dtype=act_dtype, device="cuda")
            uk_t.copy_(w[..., :128].permute(1, 2, 0))
            uv.copy_(w[..., 128:].transpose(0, 1))
            self.W_UK_T, self.W_UV = uk_t, uv

    class MLAAttention(torch.nn.Module):
        def __init__(self, kv_b_proj):
            super().__init__()
            self.impl = Impl(kv_b_proj)
            self.kv_b_proj = kv_b_proj

        def process_weights_after_loading(self, act_dtype):
            self.impl.process_weights_after_loading(act_dtype)

    attns = []
    for l in range(2):
        sa = root.model.layers.get_submodule(str(l)).self_attn
        sa.attn = MLAAttention(sa.kv_b_proj)
        with torch.cuda.device(device):
            sa.attn.process_weights_after_loading(torch.bfloat16)  # at load
        attns.append(sa.attn)
    return root, attns


def run_rollout(rank, url, dump, device_index, sync):
    import torch

    device = torch.device(f"cuda:{device_index}")
    torch.cuda.set_device(device)
    model, attns = torch_engine(rank, device)
    vllm_config = types.SimpleNamespace(model_config=types.SimpleNamespace(dtype=torch.bfloat16))
    b = wbv.make_binding(model, vllm_config, device)  # what weightbridge.vllm.start registers
    b.start(A.Settings(url, TOKEN, 0, "lo", None, 120.0), rank, dump=dump)
    keep = [(a.impl.W_UK_T, a.impl.W_UV, a.impl.W_UK_T.data_ptr(), a.impl.W_UV.data_ptr()) for a in attns]
    # a CUDA graph reading the derived tensors, captured before any update
    x = torch.randn((2, 4, 128), dtype=torch.bfloat16, device=device, generator=torch.Generator(device).manual_seed(5))
    outs = [torch.empty((2, 4, 128), dtype=torch.bfloat16, device=device) for _ in range(4)]
    s = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):
        for _ in range(2):
            for i, a in enumerate(attns):
                torch.bmm(x, a.impl.W_UK_T, out=outs[2 * i])
                torch.bmm(x, a.impl.W_UV, out=outs[2 * i + 1])
    torch.cuda.current_stream(device).wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i, a in enumerate(attns):
            torch.bmm(x, a.impl.W_UK_T, out=outs[2 * i])
            torch.bmm(x, a.impl.W_UV, out=outs[2 * i + 1])
    bad = 0
    for v in VERSIONS:
        got = b.wait(v, 120)
        T.mark(sync, rank, v)
        g.replay()
        torch.cuda.synchronize(device)
        for i, a in enumerate(attns):
            kv = a.kv_b_proj
            w = kv.weight.float() * torch.repeat_interleave(torch.repeat_interleave(kv.weight_scale_inv, 128, 0), 128, 1)
            w = w.to(torch.bfloat16).T.reshape(128, 2, 256)
            uk_t, uv = w[..., :128].permute(1, 2, 0).contiguous(), w[..., 128:].transpose(0, 1).contiguous()
            same = (a.impl.W_UK_T is keep[i][0] and a.impl.W_UV is keep[i][1] and a.impl.W_UK_T.data_ptr() == keep[i][2]
                    and a.impl.W_UV.data_ptr() == keep[i][3] and a.impl.W_UK_T.device == device)
            exact = torch.equal(a.impl.W_UK_T, uk_t) and torch.equal(a.impl.W_UV, uv)
            e1 = (outs[2 * i].float() - torch.bmm(x, uk_t).float()).abs().max().item()
            e2 = (outs[2 * i + 1].float() - torch.bmm(x, uv).float()).abs().max().item()
            nz = kv.weight.view(torch.uint8).count_nonzero().item()
            log(f"rollout {rank} v{got} layer {i}: kv_b_proj nonzero bytes {nz}, derived tensors in place {same}, "
                f"equal to recomputation {exact}, graph output max |diff| W_UK_T {e1} W_UV {e2}")
            bad += (not same) + (not exact) + (e1 != 0) + (e2 != 0) + (nz == 0)
    order = [e for e in b.history]
    want = [(k, v) for v in VERSIONS for k in ("hook", "processed", "waited")]
    log(f"rollout {rank} history {order}")
    bad += order != want
    b.close()
    log(f"rollout {rank} {'ok' if bad == 0 else 'FAILED'}")
    sys.exit(1 if bad else 0)


def main():
    import torch

    n = torch.cuda.device_count()
    dev = 1 if n > 1 else 0
    log(f"{n} GPU(s); rollouts on GPU {dev}; torch {torch.__version__}")
    failed = 0
    res = subprocess.run([sys.executable, os.path.join(ROOT, "tests/python/adapters_e2e.py"), "discovery",
                          "attestation", "refresh", "settings", "commands", "trainer_sync", "callers", "refresh_torch"],
                         capture_output=True, text=True)
    log(res.stdout.strip())
    failed += res.returncode != 0 or "SKIP" in res.stdout
    with tempfile.TemporaryDirectory(prefix="wb-adapters-check.") as tmp:
        job = T.ds_job(tmp)
        dump, sync = os.path.join(tmp, "dump"), os.path.join(tmp, "sync")
        os.makedirs(dump)
        os.makedirs(sync)
        c = T.Controller(tmp, job)
        procs = []
        try:
            for r in range(2):
                procs.append(subprocess.Popen([sys.executable, __file__, "rollout", str(r), c.url, dump, str(dev), sync]))
            for r in range(2):
                procs.append(subprocess.Popen([os.path.join(T.BIN, "wb-agent"), "--role", "trainer", "--rank", str(r),
                                               "--controller", c.url, "--tx-domain", "lo"]))
            c.wait_ready(120)
            for v in VERSIONS:
                if v > 1:
                    T.await_marks(sync, 2, v - 1)
                t0 = time.time()
                r = c.ctl("transfer", "--version", str(v))
                log(f"transfer {v}: rc {r.returncode} ({(time.time() - t0) * 1000:.0f} ms)")
                failed += r.returncode != 0
                if r.returncode:
                    log(r.stdout + r.stderr)
            for p in procs[:2]:
                failed += p.wait(300) != 0
            for v in VERSIONS:
                res = subprocess.run([os.path.join(T.BIN, "wb-ctl"), "verify", "--config", job, "--dump", dump,
                                      "--version", str(v)], capture_output=True, text=True)
                log(res.stdout.strip())
                failed += res.returncode != 0
        finally:
            c.stop()
            for p in procs:
                if p.poll() is None:
                    p.kill()
    log("adapters_check: " + ("all checks passed" if not failed else f"{failed} check(s) failed"))
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "rollout":
        run_rollout(int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6])
    sys.exit(main())
