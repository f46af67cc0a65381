"""_hf.py — what the end-to-end tests know of the models independently of weightbridge: the
trainer tensors transformers' named_parameters() gives (HF names, global shapes), their values
per version, which trainer tensors make up each rollout tensor (q/k/v and gate/up fused, experts
stacked, a tied lm_head), and FP8 block quantization as DeepGEMM's per_block_cast_to_fp8 does
it, with a self-check against values worked out by hand."""

import zlib

import numpy as np

FP8_QC = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
          "activation_scheme": "dynamic"}
DENSE = {"head_dim": 64, "hidden_size": 256, "intermediate_size": 384, "num_attention_heads": 4,
         "num_key_value_heads": 2, "num_hidden_layers": 4, "vocab_size": 512,
         "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
CONFIGS = {
    "qwen3": dict(DENSE, architectures=["Qwen3ForCausalLM"], model_type="qwen3"),
    "qwen3_moe": dict(DENSE, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                      num_experts=2, moe_intermediate_size=384, num_experts_per_tok=2,
                      decoder_sparse_step=1, mlp_only_layers=[]),
    "llama3": dict({k: v for k, v in DENSE.items() if k != "head_dim"}, architectures=["LlamaForCausalLM"],
                   model_type="llama", tie_word_embeddings=True),
}


def named_parameters(family, c):
    """(name, global shape) in the order transformers' named_parameters() gives them."""
    H, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    NH, NKV = c["num_attention_heads"], c["num_key_value_heads"]
    HD = c.get("head_dim", H // NH)
    I = c["intermediate_size"]
    out = [("model.embed_tokens.weight", (V, H))]
    for l in range(L):
        p = f"model.layers.{l}."
        out += [(p + "self_attn.q_proj.weight", (NH * HD, H)), (p + "self_attn.k_proj.weight", (NKV * HD, H)),
                (p + "self_attn.v_proj.weight", (NKV * HD, H)), (p + "self_attn.o_proj.weight", (H, NH * HD))]
        if family != "llama3":
            out += [(p + "self_attn.q_norm.weight", (HD,)), (p + "self_attn.k_norm.weight", (HD,))]
        if family == "qwen3_moe":
            E, MI = c["num_experts"], c["moe_intermediate_size"]
            out.append((p + "mlp.gate.weight", (E, H)))
            for e in range(E):
                q = p + f"mlp.experts.{e}."
                out += [(q + "gate_proj.weight", (MI, H)), (q + "up_proj.weight", (MI, H)),
                        (q + "down_proj.weight", (H, MI))]
        else:
            out += [(p + "mlp.gate_proj.weight", (I, H)), (p + "mlp.up_proj.weight", (I, H)),
                    (p + "mlp.down_proj.weight", (H, I))]
        out += [(p + "input_layernorm.weight", (H,)), (p + "post_attention_layernorm.weight", (H,))]
    out.append(("model.norm.weight", (H,)))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, H)))
    return out


def full_tensor(name, shape, version):
    """The trainers' full tensor `name` at `version`, as BF16 bits: normal values whose
    magnitude changes every 128 rows (so FP8 block scales differ) and with every version."""
    rng = np.random.default_rng([zlib.crc32(name.encode()), version])
    x = rng.standard_normal(shape, dtype=np.float32)
    mag = np.float32(2.0) ** rng.integers(-9, 3, size=-(-shape[0] // 128)).astype(np.float32)
    x *= np.repeat(mag, 128)[: shape[0]].reshape((-1,) + (1,) * (len(shape) - 1))
    b = x.view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


# e4m3fn's finite non-negative values, by code 0x00..0x7e (ascending)
E4M3 = np.array([(m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
                 for e in range(16) for m in range(8)][:127])


def to_e4m3(y):
    """float32 -> e4m3fn bits, round to nearest even (as PyTorch's .to(torch.float8_e4m3fn))."""
    a = np.abs(y).astype(np.float64)
    if a.size and a.max() >= 464.0:  # 480 and up would be NaN; the scaling never gets there
        raise AssertionError(f"value {a.max()} out of e4m3fn's range")
    hi = np.clip(np.searchsorted(E4M3, a), 1, 126)
    lo = hi - 1
    dlo, dhi = a - E4M3[lo], E4M3[hi] - a
    code = np.where((dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0)), hi, lo).astype(np.uint8)
    return code | np.where(np.signbit(y), np.uint8(0x80), np.uint8(0))


def per_block_cast_to_fp8(bits):
    """DeepGEMM's per_block_cast_to_fp8 of a BF16 matrix (bits): (e4m3 bits, fp32 scale_inv)."""
    x = (bits.astype(np.uint32) << 16).view(np.float32)
    m, n = x.shape
    M, N = -(-m // 128), -(-n // 128)
    xp = np.zeros((M * 128, N * 128), np.float32)
    xp[:m, :n] = x
    amax = np.maximum(np.abs(xp).reshape(M, 128, N, 128).max(axis=(1, 3)), np.float32(1e-4))
    t = (np.float32(1) / amax) * np.float32(448)
    q = to_e4m3(x * np.repeat(np.repeat(t, 128, 0), 128, 1)[:m, :n])
    return q, (amax * np.float32(1 / 448)).astype(np.float32)


def sources(family, c, name):
    """The trainer tensors of rollout tensor `name`: [[components]] (one group, or one per
    expert for stacked experts)."""
    fuse = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    for fused, parts in fuse.items():
        if f".{fused}." in name:
            return [[name.replace(fused, p) for p in parts]]
    if name.endswith(".mlp.experts.w13_weight") or name.endswith(".mlp.experts.w2_weight"):
        p = name.rsplit(".", 1)[0] + "."
        parts = ("gate_proj", "up_proj") if name.endswith("w13_weight") else ("down_proj",)
        return [[f"{p}{e}.{q}.weight" for q in parts] for e in range(c["num_experts"])]
    if name == "lm_head.weight" and c["tie_word_embeddings"]:
        return [["model.embed_tokens.weight"]]
    return [[name]]


def expected(family, c, local, version):
    """{rollout tensor: expected bytes} for a TP-1 rollout rank's locals (wb.plan's list)."""
    shapes = dict(named_parameters(family, c))
    cache = {}

    def full(n):
        if n not in cache:
            cache[n] = full_tensor(n, shapes[n], version)
        return cache[n]

    want = {}
    for l in local:
        name = l["name"]
        scale = name.endswith("_scale_inv")
        base = name[: -len("_scale_inv")] if scale else name
        groups = sources(family, c, base)
        fp8 = scale or l["dtype"] == "fp8_e4m3"
        per = [np.concatenate([per_block_cast_to_fp8(full(n))[1 if scale else 0] if fp8 else full(n)
                               for n in g]) for g in groups]
        t = np.stack(per) if ".mlp.experts.w" in base else per[0]
        if base in ("model.embed_tokens.weight", "lm_head.weight") and l["shape"][0] > t.shape[0]:
            # vLLM pads the vocab (to 64 rows): nothing is written there, the buffer's zeros stay
            t = np.concatenate([t, np.zeros((l["shape"][0] - t.shape[0],) + t.shape[1:], t.dtype)])
        if list(t.shape) != list(l["shape"]):
            raise AssertionError(f"{name}: expected shape {t.shape}, the plan says {l['shape']}")
        want[name] = t
    return want


def self_check():
    """The numpy reference against values worked out by hand, so a wrong reference cannot pass
    by agreeing with a wrong library."""
    # e4m3fn: exact values, ties to even, subnormals, sign
    y = np.array([0.0, -0.0, 1.0, 1.0625, 1.1875, 448.0, 450.0, 2.0 ** -9, 3 * 2.0 ** -10, -2.0], np.float32)
    got = to_e4m3(y).tolist()
    assert got == [0x00, 0x80, 0x38, 0x38, 0x3A, 0x7E, 0x7E, 0x01, 0x02, 0xC0], [hex(g) for g in got]
    # a block whose amax is 2: scale_inv = 2 * fl(1/448), 2 -> 448 (0x7e), 1 -> 224 (0x76)
    bits = np.zeros((2, 2), np.uint16)
    bits[0, 0], bits[1, 1] = 0x4000, 0x3F80  # 2.0, 1.0 in bf16
    q, s = per_block_cast_to_fp8(bits)
    assert q.tolist() == [[0x7E, 0x00], [0x00, 0x76]], q
    assert s.shape == (1, 1) and s[0, 0] == np.float32(2) * np.float32(1 / 448), s
    # an all-zero block takes the 1e-4 floor
    q, s = per_block_cast_to_fp8(np.zeros((130, 3), np.uint16))
    assert s.shape == (2, 1) and (s == np.float32(1e-4) * np.float32(1 / 448)).all() and not q.any()
