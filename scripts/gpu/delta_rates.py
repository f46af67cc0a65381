#!/usr/bin/env python3
"""delta_rates.py — how much of a rollout's weights one optimizer step changes (issue #34's table).

A Qwen3 causal LM (transformers' Qwen3ForCausalLM, random init, FP32 master parameters; by
default 8 layers of Qwen3-0.6B's shape: hidden 1024, intermediate 3072, 16 heads, 8 KV heads,
head_dim 128, vocab 151936, tied embeddings) trained with AdamW on the LM loss of random tokens,
STEPS steps at each learning rate (a fresh model from the same seed per rate). After every step
every 2-D weight is cast to BF16 and quantized to FP8 E4M3 in 128x128 blocks exactly as
DeepGEMM's per_block_cast_to_fp8 does (amax = max(max |x| over the block in FP32, 1e-4);
q = e4m3fn(x * (448 / amax)); scale_inv = amax / 448), and compared with the previous step's:

  fp8 elems   FP8 values whose byte changed
  row chunks  128-byte chunks of an FP8 row (128 elements of a row inside a block) with a change
  blocks      128x128 FP8 blocks with a changed value
  scales      block scales (scale_inv, FP32) whose bits changed
  bf16 elems  BF16 values whose bits changed

as percentages of all 2-D weights. Prints one line per step and a summary per rate in the
issue's form ("first -> last (min-max)").

--size GB scales the model up for the transfer benchmark: Qwen3-8B's layer shape (hidden 4096,
intermediate 12288, 32 heads, 8 KV heads) with as many layers as make the BF16 weights at least
GB gigabytes (9: 21 layers, 9.35 GB). --tiny is a small shape for the CPU (hidden 256, 2 layers,
vocab 1024). Without transformers (the CPU test machine has Debian's python3-torch 1.13 and no
transformers) --model torch uses a small torch module with Qwen3's parameter names and shapes
and a real forward (RMSNorm, grouped-query causal attention with per-head q/k norms, no rotary
embedding; SwiGLU MLP) and says so; the GPU run uses transformers. FP8 uses torch's
float8_e4m3fn where torch has it, else an exact round-to-nearest-even encoder (torch before 2.1).

Usage: delta_rates.py [--device cuda|cpu] [--lrs 1e-6,1e-5] [--steps 5] [--size GB | --tiny]
                      [--layers N] [--hidden H] [--batch B] [--seq S] [--seed N]
                      [--model auto|transformers|torch] [--json FILE]
       (scripts/gpu/delta_rates.sh sets up the environment on a lent GPU machine)
"""

import argparse
import json
import math
import sys
import time

import torch

BLOCK = 128
# e4m3fn's finite non-negative values, by code 0x00..0x7e (ascending)
E4M3 = [(m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        for e in range(16) for m in range(8)][:127]

# Qwen3-0.6B's shape (the table: 8 of its 28 layers); Qwen3-8B's for --size
TABLE = dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
             num_key_value_heads=8, head_dim=128, vocab_size=151936, num_hidden_layers=8,
             tie_word_embeddings=True)
BIG = dict(hidden_size=4096, intermediate_size=12288, num_attention_heads=32,
           num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True)
TINY = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, vocab_size=1024, num_hidden_layers=2, tie_word_embeddings=False)


def shapes(c):
    """(name, shape) of every parameter, as transformers' Qwen3ForCausalLM names them."""
    H, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    NH, NKV, HD = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    out = [("model.embed_tokens.weight", (V, H))]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out += [(p + "self_attn.q_proj.weight", (NH * HD, H)),
                (p + "self_attn.k_proj.weight", (NKV * HD, H)),
                (p + "self_attn.v_proj.weight", (NKV * HD, H)),
                (p + "self_attn.o_proj.weight", (H, NH * HD)),
                (p + "self_attn.q_norm.weight", (HD,)), (p + "self_attn.k_norm.weight", (HD,)),
                (p + "mlp.gate_proj.weight", (I, H)), (p + "mlp.up_proj.weight", (I, H)),
                (p + "mlp.down_proj.weight", (H, I)),
                (p + "input_layernorm.weight", (H,)), (p + "post_attention_layernorm.weight", (H,))]
    out.append(("model.norm.weight", (H,)))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, H)))
    return out


def bf16_bytes(c):
    return 2 * sum(math.prod(s) for _, s in shapes(c))


def layers_for(gb):
    """The fewest layers of BIG's shape whose BF16 weights are at least gb * 1e9 bytes."""
    n = 1
    while bf16_bytes(dict(BIG, num_hidden_layers=n)) < gb * 1e9:
        n += 1
    return n


# ---------------------------------------------------------------- a Qwen3-shaped torch model


class RMSNorm(torch.nn.Module):
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attn(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        H, self.nh, self.nkv, self.hd = (c["hidden_size"], c["num_attention_heads"],
                                         c["num_key_value_heads"], c["head_dim"])
        self.q_proj = torch.nn.Linear(H, self.nh * self.hd, bias=False)
        self.k_proj = torch.nn.Linear(H, self.nkv * self.hd, bias=False)
        self.v_proj = torch.nn.Linear(H, self.nkv * self.hd, bias=False)
        self.o_proj = torch.nn.Linear(self.nh * self.hd, H, bias=False)
        self.q_norm, self.k_norm = RMSNorm(self.hd), RMSNorm(self.hd)

    def forward(self, x):
        B, S, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, S, self.nh, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, S, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.nkv, self.hd).transpose(1, 2)
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        a = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
        a = a.masked_fill(torch.ones(S, S, dtype=torch.bool, device=x.device).triu(1), -1e9)
        y = (a.softmax(-1) @ v).transpose(1, 2).reshape(B, S, self.nh * self.hd)
        return self.o_proj(y)


class MLP(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        H, I = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = torch.nn.Linear(H, I, bias=False)
        self.up_proj = torch.nn.Linear(H, I, bias=False)
        self.down_proj = torch.nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn, self.mlp = Attn(c), MLP(c)
        self.input_layernorm = RMSNorm(c["hidden_size"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"])

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = torch.nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"])


class TorchQwen3(torch.nn.Module):
    """Qwen3ForCausalLM's parameters (names and shapes) with a plain forward."""

    def __init__(self, c):
        super().__init__()
        self.model = Body(c)
        self.tied = c["tie_word_embeddings"]
        if not self.tied:
            self.lm_head = torch.nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        for name, p in self.named_parameters():  # Qwen3's init: normal(0, 0.02), norms 1
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)

    def loss(self, ids):
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x)
        x = self.model.norm(x)
        w = self.model.embed_tokens.weight if self.tied else self.lm_head.weight
        logits = x[:, :-1] @ w.t()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                 ids[:, 1:].reshape(-1))


def make_model(kind, c, device, seed):
    torch.manual_seed(seed)
    if kind == "transformers":
        import transformers
        cfg = transformers.Qwen3Config(**c, torch_dtype="float32")
        m = transformers.Qwen3ForCausalLM(cfg).to(device=device, dtype=torch.float32)
        return m, lambda ids: m(input_ids=ids, labels=ids).loss
    m = TorchQwen3(c).to(device=device, dtype=torch.float32)
    return m, m.loss


# ---------------------------------------------------------------- quantization and comparison


def to_e4m3_bits(y):
    """float32 -> e4m3fn bits (uint8), round to nearest even, as .to(torch.float8_e4m3fn)."""
    if hasattr(torch, "float8_e4m3fn"):
        return y.to(torch.float8_e4m3fn).view(torch.uint8)
    table = torch.tensor(E4M3, dtype=torch.float64, device=y.device)
    a = y.abs().double()
    if a.numel() and float(a.max()) >= 464.0:
        raise AssertionError(f"value {float(a.max())} out of e4m3fn's range")
    hi = torch.searchsorted(table, a).clamp(1, 126)
    lo = hi - 1
    dlo, dhi = a - table[lo], table[hi] - a
    code = torch.where((dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0)), hi, lo).to(torch.uint8)
    return code | (torch.signbit(y).to(torch.uint8) << 7)


def per_block_cast_to_fp8(x):
    """DeepGEMM's per_block_cast_to_fp8 of a 2-D BF16 tensor: (e4m3 bits [m, n] uint8, scale_inv
    [ceil(m/128), ceil(n/128)] float32)."""
    m, n = x.shape
    M, N = -(-m // BLOCK), -(-n // BLOCK)
    xp = torch.zeros((M * BLOCK, N * BLOCK), dtype=x.dtype, device=x.device)
    xp[:m, :n] = x
    v = xp.view(M, BLOCK, N, BLOCK)
    amax = v.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
    q = to_e4m3_bits(v.float() * (448.0 / amax))
    return q.view(M * BLOCK, N * BLOCK)[:m, :n].contiguous(), (amax / 448.0).view(M, N)


def snapshot(model):
    """{name: (bf16 bits int16, e4m3 bits uint8, scale_inv bits int32)} of every 2-D weight (a
    tied weight once)."""
    out = {}
    seen = set()
    for name, p in model.named_parameters():
        if p.dim() != 2 or p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        b = p.detach().to(torch.bfloat16)
        q, s = per_block_cast_to_fp8(b)
        out[name] = (b.view(torch.int16), q, s.view(torch.int32))
    return out


def changes(old, new):
    """Counts and totals of what changed from snapshot old to new: {metric: [changed, total]}."""
    c = {k: [0, 0] for k in ("fp8", "chunks", "blocks", "scales", "bf16")}
    for name, (b1, q1, s1) in new.items():
        b0, q0, s0 = old[name]
        m, n = q1.shape
        M, N = -(-m // BLOCK), -(-n // BLOCK)
        d = q1 != q0
        c["fp8"][0] += int(d.sum())
        c["fp8"][1] += m * n
        dp = torch.zeros((M * BLOCK, N * BLOCK), dtype=torch.bool, device=d.device)
        dp[:m, :n] = d
        rows = dp.view(M * BLOCK, N, BLOCK).any(2)[:m]  # [m, N]: a row's 128-byte chunks
        c["chunks"][0] += int(rows.sum())
        c["chunks"][1] += m * N
        c["blocks"][0] += int(dp.view(M, BLOCK, N, BLOCK).any(3).any(1).sum())
        c["blocks"][1] += M * N
        c["scales"][0] += int((s1 != s0).sum())
        c["scales"][1] += M * N
        c["bf16"][0] += int((b1 != b0).sum())
        c["bf16"][1] += m * n
    return c


def pct(x):
    return 100.0 * x[0] / x[1] if x[1] else 0.0


def fmt(v):
    return f"{v:.3g}" if v < 10 else f"{v:.0f}"


COLS = [("fp8", "FP8 elements"), ("chunks", "FP8 128-byte row chunks"),
        ("blocks", "FP8 128x128 blocks"), ("scales", "FP8 block scales"), ("bf16", "BF16 elements")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[1:]))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--lrs", default="1e-6,1e-5", help="learning rates, comma-separated")
    ap.add_argument("--steps", type=int, default=5)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--size", type=float, help="scale to at least GB gigabytes of BF16 weights")
    g.add_argument("--tiny", action="store_true", help="a small shape for the CPU")
    ap.add_argument("--layers", type=int, help="number of layers (overrides the preset's)")
    ap.add_argument("--hidden", type=int, help="hidden size (overrides the preset's)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", choices=("auto", "transformers", "torch"), default="auto")
    ap.add_argument("--json", help="write the per-step figures here")
    a = ap.parse_args()
    try:
        lrs = [float(x) for x in a.lrs.split(",")]
    except ValueError:
        ap.error(f"--lrs: expected comma-separated numbers, got {a.lrs!r}")
    if a.steps < 1 or a.batch < 1 or a.seq < 2 or any(not lr > 0 for lr in lrs):
        ap.error("--steps and --batch must be >= 1, --seq >= 2, every learning rate > 0")
    if a.size is not None and not a.size > 0:
        ap.error(f"--size: expected gigabytes > 0, got {a.size}")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("delta_rates: skipped: --device cuda but torch sees no GPU (use --device cpu)")
        return 0
    c = dict(TINY if a.tiny else BIG if a.size else TABLE)
    if a.size:
        c["num_hidden_layers"] = layers_for(a.size)
    if a.layers:
        c["num_hidden_layers"] = a.layers
    if a.hidden:
        c["hidden_size"] = a.hidden
    kind = a.model
    if kind == "auto":
        try:
            import transformers  # noqa: F401
            kind = "transformers" if hasattr(transformers, "Qwen3ForCausalLM") else "torch"
        except ImportError:
            kind = "torch"
        if kind == "torch":
            print("delta_rates: transformers (with Qwen3) is not installed: using a torch module "
                  "with Qwen3's parameter names and shapes (no rotary embedding)")
    fp8 = "torch.float8_e4m3fn" if hasattr(torch, "float8_e4m3fn") else "an exact RNE encoder"
    print(f"delta_rates: {kind} Qwen3, {c['num_hidden_layers']} layers, hidden "
          f"{c['hidden_size']}, intermediate {c['intermediate_size']}, vocab {c['vocab_size']}: "
          f"{bf16_bytes(c) / 1e9:.3f} GB BF16; FP32 masters, AdamW, LM loss on random tokens "
          f"(batch {a.batch} x {a.seq}); {a.device}; torch {torch.__version__}, FP8 by {fp8}")
    rows, summary = [], []
    for lr in lrs:
        model, loss_of = make_model(kind, c, a.device, a.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        gen = torch.Generator(device="cpu").manual_seed(a.seed + 1)
        prev = snapshot(model)
        per = []
        for step in range(1, a.steps + 1):
            ids = torch.randint(0, c["vocab_size"], (a.batch, a.seq), generator=gen).to(a.device)
            t0 = time.time()
            opt.zero_grad(set_to_none=True)
            loss = loss_of(ids)
            loss.backward()
            opt.step()
            cur = snapshot(model)
            ch = changes(prev, cur)
            prev = cur
            p = {k: pct(ch[k]) for k, _ in COLS}
            per.append(p)
            rows.append(dict(lr=lr, step=step, loss=float(loss), counts=ch, pct=p))
            print(f"lr {lr:g} step {step}: loss {float(loss):.4f}; changed: "
                  + ", ".join(f"{k} {p[k]:.4g} %" for k, _ in COLS)
                  + f" ({time.time() - t0:.1f} s)", flush=True)
        summary.append((lr, per))
        del model, opt, prev
    print()
    print("| lr | " + " | ".join(f"{t} changed" for _, t in COLS) + " |")
    print("|---" * (len(COLS) + 1) + "|")
    for lr, per in summary:
        cells = []
        for k, _ in COLS:
            v = [p[k] for p in per]
            cells.append(f"{fmt(v[0])} → {fmt(v[-1])} % ({fmt(min(v))}–{fmt(max(v))})")
        print(f"| {lr:g} (steps 1–{len(per)}) | " + " | ".join(cells) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(config=c, model=kind, device=a.device, steps=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
