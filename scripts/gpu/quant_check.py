#!/usr/bin/env python3
"""quant_check.py - quant/'s CUDA kernels and CPU reference against PyTorch, byte for byte.

Runs build/bench/quant_tool (our code) on random inputs written to files and compares what it
writes with PyTorch on the same GPU:
  - FP8 block quantization against DeepGEMM's per_block_cast_to_fp8 (the reference the
    DeepSeek-V3 / Qwen3-FP8 / Kimi-K2 checkpoints follow), bf16/fp16/fp32, several shapes
    (ragged ones too), one-shot on the GPU and CPU and split among row-range owners;
  - casts against Tensor.to(); pack against slicing.
Prints, per case, the number of differing bytes (the goal is 0 everywhere) and exits 1 if any.

Diagnostic columns (not goals) say which arithmetic a difference follows:
  'div s'   q bytes that differ from s = 448 / amax as one true division (eager PyTorch
            computes 448 / amax as amax.reciprocal() * 448);
  'div si'  scale bytes that differ from scale_inv = amax / 448 as a true division (PyTorch on
            CUDA multiplies by the FP32 reciprocal of 448; on the CPU it divides);
  'sf q'    q bytes that differ from today's DeepGEMM/vLLM form, q = e4m3(x * (1 / sf)) with
            sf = amax / 448 (same scales; the issue's reference is the 448 / amax form);
  'torch-CPU q/s'  differences from the reference run on CPU tensors (small shapes).
Usage: quant_check.py [--tool build/bench/quant_tool] [--quick]
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile

import torch

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def per_block_cast_to_fp8(x, variant="ref"):
    """DeepGEMM's reference as the issue states it (the original tests/test_core.py), or a
    diagnostic variant: "div_s" s = 448 / amax as one IEEE division; "div_si" scale_inv =
    amax / 448 as one IEEE division; "sf" today's DeepGEMM/vLLM form, sf = amax / 448.0 and
    q = e4m3(x * (1.0 / sf)). The variants only explain differences; they are not goals."""
    m, n = x.shape
    xp = torch.zeros((math.ceil(m / 128) * 128, math.ceil(n / 128) * 128), dtype=x.dtype,
                     device=x.device)
    xp[:m, :n] = x
    xv = xp.view(-1, 128, xp.size(1) // 128, 128)
    amax = xv.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
    if variant == "div_s":
        s = torch.full_like(amax, 448.0) / amax  # tensor / tensor: one IEEE division
    elif variant == "sf":
        s = 1.0 / (amax / 448.0)
    else:
        s = 448.0 / amax  # as written in the reference: amax.reciprocal() * 448
    q = (xv * s).to(torch.float8_e4m3fn)
    if variant == "div_si":
        si = amax / torch.full_like(amax, 448.0)
    else:
        si = amax / 448.0  # on CUDA: amax * fl(1/448)
    return q.view_as(xp)[:m, :n].contiguous(), si.view(xv.size(0), xv.size(2))


def random_input(m, n, dtype, seed, specials):
    """Normal values scaled per 128x128 block by 10^[-7, 3]: some blocks sit below the 1e-4
    clamp, every e4m3 region is used. specials adds NaN, +-inf, -0 and subnormals."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, n, device="cuda", generator=g)
    bm, bn = math.ceil(m / 128), math.ceil(n / 128)
    e = torch.rand(bm, bn, device="cuda", generator=g) * 10 - 7
    scale = torch.pow(10.0, e).repeat_interleave(128, 0)[:m].repeat_interleave(128, 1)[:, :n]
    x = (x * scale).to(DT[dtype])
    if specials and m * n > 64:
        flat = x.view(-1)
        idx = torch.randint(0, m * n, (6,), device="cuda", generator=g)
        tiny = torch.finfo(DT[dtype]).smallest_normal / 4
        vals = [float("nan"), float("inf"), float("-inf"), -0.0, tiny, -tiny]
        for i, v in zip(idx.tolist(), vals):
            flat[i] = v
    return x


def write(t, path):
    t.detach().contiguous().view(torch.uint8).cpu().numpy().tofile(path)


def read(path, dtype, shape):
    with open(path, "rb") as f:
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
    return data.view(dtype).view(shape)


def diff_bytes(a, b):
    a = a.contiguous().view(torch.uint8).reshape(-1).cpu()
    b = b.contiguous().view(torch.uint8).reshape(-1).cpu()
    if a.numel() != b.numel():
        return max(a.numel(), b.numel())
    return int((a != b).sum())


class Check:
    def __init__(self, tool, tmp):
        self.tool, self.tmp = tool, tmp
        self.total = 0
        self.compared = 0

    def run(self, *args):
        r = subprocess.run([self.tool, *args], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{self.tool} {' '.join(args)}: {r.stderr.strip()}")

    def count(self, n):
        self.total += n
        self.compared += 1
        return n

    def quant(self, dtype, m, n, seed, specials=False):
        x = random_input(m, n, dtype, seed, specials)
        xin, qf, sf = (os.path.join(self.tmp, f) for f in ("x.bin", "q.bin", "s.bin"))
        write(x, xin)
        nb = (math.ceil(m / 128), math.ceil(n / 128))
        ref_q, ref_s = per_block_cast_to_fp8(x)
        alt_q, _ = per_block_cast_to_fp8(x, "div_s")
        _, alt_s = per_block_cast_to_fp8(x, "div_si")
        sf_q, _ = per_block_cast_to_fp8(x, "sf")
        cpu_q, cpu_s = per_block_cast_to_fp8(x.cpu()) if m * n <= (1 << 22) else (None, None)
        cols = []
        outs = {}
        for mode, extra in (("gpu", ["--gpu"]), ("cpu", []), ("gpu split", ["--gpu", "--split",
                                                                            "3"])):
            self.run("quant", "--dtype", dtype, "--rows", str(m), "--cols", str(n), "--in", xin,
                     "--q", qf, "--scale", sf, *extra)
            outs[mode] = (read(qf, torch.uint8, (m, n)).clone(),
                          read(sf, torch.float32, nb).clone())
        gq, gs = outs["gpu"]
        cols.append(self.count(diff_bytes(gq, ref_q)))
        cols.append(self.count(diff_bytes(gs, ref_s)))
        cols.append(self.count(diff_bytes(gq, outs["cpu"][0]) + diff_bytes(gs, outs["cpu"][1])))
        cols.append(self.count(diff_bytes(outs["gpu split"][0], gq) +
                               diff_bytes(outs["gpu split"][1], gs)))
        cols.append(diff_bytes(gq, alt_q))
        cols.append(diff_bytes(gs, alt_s))
        cols.append(diff_bytes(gq, sf_q))
        info = "-" if cpu_q is None else f"{diff_bytes(gq, cpu_q)}/{diff_bytes(gs, cpu_s)}"
        name = f"{dtype} [{m},{n}]" + (" +NaN/inf" if specials else "")
        print(f"  {name:28s} {cols[0]:9d} {cols[1]:9d} {cols[2]:9d} {cols[3]:9d}"
              f" {cols[4]:9d} {cols[5]:9d} {cols[6]:9d}   {info}")

    def cast(self, src, dst, n, seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randn(n, device="cuda", generator=g) * torch.pow(
            10.0, torch.rand(n, device="cuda", generator=g) * 16 - 10)
        x = x.to(DT[src])
        xin, out = os.path.join(self.tmp, "c.bin"), os.path.join(self.tmp, "o.bin")
        write(x, xin)
        res = []
        for extra in (["--gpu"], []):
            self.run("cast", "--from", src, "--to", dst, "--n", str(n), "--in", xin, "--out",
                     out, *extra)
            res.append(read(out, DT[dst], (n,)).clone())
        d = self.count(diff_bytes(res[0], x.to(DT[dst])))
        c = self.count(diff_bytes(res[0], res[1]))
        print(f"  cast {src}->{dst} n={n:<10d} vs torch {d:9d}   GPU vs CPU {c:9d}")

    def pack(self, dtype, shape, box, seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randn(*shape, device="cuda", generator=g).to(DT[dtype])
        xin, out = os.path.join(self.tmp, "p.bin"), os.path.join(self.tmp, "o.bin")
        write(x, xin)
        sl = tuple(slice(o, o + e) for o, e in box)
        want = x[sl].contiguous()
        spec = ",".join(f"{o}:{e}" for o, e in box)
        d = []
        for extra in (["--gpu"], []):
            self.run("pack", "--dtype", dtype, "--shape", ",".join(map(str, shape)), "--box",
                     spec, "--in", xin, "--out", out, *extra)
            d.append(self.count(diff_bytes(read(out, DT[dtype], want.shape), want)))
        print(f"  pack {dtype} {list(shape)} box {spec:24s} GPU {d[0]:9d}   CPU {d[1]:9d}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", default="build/bench/quant_tool")
    ap.add_argument("--quick", action="store_true", help="skip the largest shapes")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("quant_check: no CUDA device visible to PyTorch", file=sys.stderr)
        return 2
    print(f"quant_check: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    shapes = [(128, 128), (7, 5), (129, 130), (300, 257), (1000, 1000), (2048, 7168),
              (4096, 1536), (513, 4112)]
    if not a.quick:
        shapes += [(7168, 18432)]
    with tempfile.TemporaryDirectory(prefix="quant_check.") as tmp:
        c = Check(a.tool, tmp)
        print("\nFP8 block quantization: differing bytes (goal 0 in the first four columns)")
        print(f"  {'case':28s} {'q/torch':>9s} {'s/torch':>9s} {'GPU/CPU':>9s} {'split':>9s}"
              f" {'(div s)':>9s} {'(div si)':>9s} {'(sf q)':>9s}   (torch-CPU q/s)")
        for i, (m, n) in enumerate(shapes):
            for dt in ("bf16", "fp16", "fp32"):
                if m * n > (1 << 26) and dt != "bf16":
                    continue
                c.quant(dt, m, n, seed=100 + i)
        for dt in ("bf16", "fp16", "fp32"):
            c.quant(dt, 1000, 1000, seed=7, specials=True)
        print("\ncasts: differing bytes")
        for src in ("bf16", "fp16", "fp32"):
            for dst in ("bf16", "fp16", "fp32"):
                if src != dst:
                    c.cast(src, dst, 1 << 20, seed=3)
        print("\npack: differing bytes")
        c.pack("bf16", (300, 257), ((10, 100), (3, 128)), 1)
        c.pack("fp32", (7, 9, 33), ((1, 5), (0, 9), (4, 20)), 2)
        c.pack("fp16", (4096, 1536), ((1024, 2048), (0, 1536)), 3)
        c.pack("bf16", (64, 70000), ((3, 50), (16, 60000)), 4)
        print(f"\nquant_check: {c.compared} comparisons, {c.total} differing bytes in total"
              f" ({'PASS' if c.total == 0 else 'FAIL'})")
        return 0 if c.total == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
