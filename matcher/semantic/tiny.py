"""tiny.py -- a tiny model of a real config.json: the same architecture and structure (grouped-
query attention with its group size, QK norms, MLA with its LoRA ranks and rope/nope/value
head dims, mixture of experts with shared experts, grouped routing, dense layers before the
first MoE layer, the MTP layer, tied or untied embeddings), the sizes shrunk so that a forward
in numpy takes milliseconds; and random values for every tensor of a trainer inventory,
written as a safetensors checkpoint.

Sizes are chosen so that a TP split of FP8 weights falls on 128x128 block edges, as vLLM
requires: each rank's share of every split dim is a multiple of 128. rope_scaling is dropped
(the rotary embedding reads no weights); so is the vocabulary's size: 500, which pads to 512
for VocabParallelEmbedding, so that the last rank holds padding rows.
"""

import json
import struct

import numpy as np

from numerics import FP8_BLOCK, bf16_bits

FP8_QC = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
          "activation_scheme": "dynamic"}


def _heads(c, tp, hd):
    """kv heads and query heads: as few as keep the group size (up to 2) and give every TP
    rank whole 128-row FP8 blocks of k and v."""
    nh0 = c["num_attention_heads"]
    nkv0 = c.get("num_key_value_heads") or nh0
    group = max(1, nh0 // nkv0)
    per = FP8_BLOCK // int(np.gcd(hd, FP8_BLOCK))  # kv heads per rank for whole blocks
    nkv = min(nkv0, tp * per)
    return nkv * min(group, 2), nkv


def shrink(cfg, arch, tp):
    """The tiny config of `cfg` (a dict), for a rollout of TP size tp."""
    c = dict(cfg)
    c.pop("quantization_config", None)
    c["rope_scaling"] = None
    c["vocab_size"] = 500
    c["max_position_embeddings"] = min(c.get("max_position_embeddings") or 4096, 4096)
    if arch == "deepseek_v3":
        fk = min(c.get("first_k_dense_replace") or 0, 1)
        c.update(first_k_dense_replace=fk, num_hidden_layers=fk + 1, hidden_size=256, intermediate_size=256 * tp,
                 moe_intermediate_size=128 * tp, num_attention_heads=2 * tp, num_key_value_heads=2 * tp,
                 n_routed_experts=4, num_experts_per_tok=min(c.get("num_experts_per_tok") or 2, 2),
                 n_group=min(c.get("n_group") or 1, 2), topk_group=min(c.get("topk_group") or 1, 1),
                 kv_lora_rank=128, moe_layer_freq=1)
        if c.get("q_lora_rank"):
            c["q_lora_rank"] = 128
        for k in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            c[k] = min(c[k], 128 if k != "qk_rope_head_dim" else 64)
        return c
    hd0 = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    hd = min(hd0, 128)
    nh, nkv = _heads(c, tp, hd)
    c.update(num_hidden_layers=2, num_attention_heads=nh, num_key_value_heads=nkv)
    if "head_dim" in cfg:
        c.update(head_dim=hd, hidden_size=256)
    else:
        c["hidden_size"] = nh * hd  # head_dim is hidden_size / heads (Llama, Phi-3, Mixtral)
    c["intermediate_size"] = 256 * tp
    if arch == "qwen3_moe":
        c.update(num_experts=4, num_experts_per_tok=min(c.get("num_experts_per_tok") or 2, 2),
                 moe_intermediate_size=128 * tp, decoder_sparse_step=1,
                 mlp_only_layers=[0] if c.get("mlp_only_layers") else [])
    if arch in ("mixtral", "gpt_oss"):
        c.update(num_local_experts=4, num_experts_per_tok=2)
    if arch == "gpt_oss":
        c.update(experts_per_token=2, layer_types=(c.get("layer_types") or [])[:2] or None)
    return c


def describe(c, arch):
    g = c.get
    s = "%d layers, hidden %d, vocab %d" % (g("num_hidden_layers"), g("hidden_size"), g("vocab_size"))
    if arch == "deepseek_v3":
        s += ", MLA %d heads (q_lora %s, kv_lora %d, nope %d, rope %d, v %d), %d experts top-%d + %d shared, " \
             "first %d dense" % (g("num_attention_heads"), g("q_lora_rank"), g("kv_lora_rank"), g("qk_nope_head_dim"),
                                 g("qk_rope_head_dim"), g("v_head_dim"), g("n_routed_experts"), g("num_experts_per_tok"),
                                 g("n_shared_experts") or 0, g("first_k_dense_replace"))
        return s
    s += ", %d heads / %d kv heads of %d" % (g("num_attention_heads"), g("num_key_value_heads"),
                                            g("head_dim") or g("hidden_size") // g("num_attention_heads"))
    if arch == "qwen3_moe":
        s += ", %d experts top-%d of %d" % (g("num_experts"), g("num_experts_per_tok"), g("moe_intermediate_size"))
    elif arch in ("mixtral", "gpt_oss"):
        s += ", %d experts top-%d of %d" % (g("num_local_experts"), g("num_experts_per_tok"), g("intermediate_size"))
    else:
        s += ", intermediate %d" % g("intermediate_size")
    return s + (", tied embeddings" if g("tie_word_embeddings") else "")


def random_tensor(rng, name, dtype, shape):
    """Values a trained model could hold, different everywhere: norms around 1, biases and
    the router's correction bias small, matrices scaled by their fan-in with a magnitude that
    changes every 128 rows (so that FP8 block scales differ from block to block)."""
    shape = tuple(shape)
    if len(shape) == 1:
        if "norm" in name:
            x = 1.0 + 0.2 * rng.standard_normal(shape)
        else:
            x = 0.1 * rng.standard_normal(shape)
    else:
        x = rng.standard_normal(shape) / np.sqrt(shape[-1])
        if "embed" in name or name.endswith("head.weight"):
            x = rng.standard_normal(shape) * 0.5
        rows = shape[-2]
        mag = 2.0 ** rng.integers(-1, 2, size=-(-rows // FP8_BLOCK))
        x = x * np.repeat(mag, FP8_BLOCK)[:rows].reshape((rows, 1))
    x = x.astype(np.float32)
    if dtype == "fp32":
        return x, x.astype(np.float64)
    if dtype != "bf16":
        raise ValueError("%s: a trainer tensor of dtype %s (the check generates bf16 and fp32 ones)" % (name, dtype))
    bits = bf16_bits(x)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def write_safetensors(path, tensors):
    """tensors: name -> (dtype, array of its stored bits/values), in order."""
    st = {"bf16": "BF16", "fp32": "F32"}
    hdr, off = {}, 0
    for name, (dt, a) in tensors.items():
        n = a.nbytes
        hdr[name] = {"dtype": st[dt], "shape": list(a.shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, (_, a) in tensors.items():
            f.write(np.ascontiguousarray(a).tobytes())
