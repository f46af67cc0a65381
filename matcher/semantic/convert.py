"""convert.py -- a Hugging Face checkpoint (the tiny model's tensors) as another trainer naming
holds it, written from each framework's conventions and not from the family file's rules, so
that the semantic check of a naming other than hf tests the rules against an independent
account of the layout (configs/models/README.md lists the namings):

  fused           transformers >= 5: a MoE layer's experts in one gate_up_proj [E, 2I, H]
                  (per expert [gate; up]) and one down_proj [E, H, I], no .weight suffix;
  megatron        Megatron-core (0.20) with Transformer Engine; megatron_local without it.
                  Global tensors, i.e. the concatenation of the TP ranks' local tensors:
                  linear_qkv per query group [its q heads; its k head; its v head];
                  linear_fc1 per trainer TP rank r [gate_r; up_r] (mesh_tp ranks); the
                  embedding and output layer padded to a multiple of 128 * mesh_tp rows.

Every function takes and returns name -> (dtype, array), the arrays being whatever the caller
stores (bf16 bits or values): only rows are moved.
"""

import numpy as np

MEGATRON_VOCAB_DIVISOR = 128  # make_vocab_size_divisible_by's default
PAD_FILL = 0x40E0  # bf16 bits of 7.0: padding rows a wrong rule would move are visible


class ConvertError(Exception):
    pass


def _padded(a, rows):
    if a.shape[0] == rows:
        return a
    pad = np.full((rows - a.shape[0],) + a.shape[1:], PAD_FILL if a.dtype == np.uint16 else 7.0, a.dtype)
    return np.concatenate([a, pad])


def _per_rank(gate, up, tp):
    """[gate_0; up_0; gate_1; up_1; ...]: what TP ranks' column-parallel linear_fc1 locals,
    each [its gate rows; its up rows], make when concatenated."""
    n = gate.shape[0]
    if n % tp:
        raise ConvertError("mesh_tp %d does not divide %d gate rows" % (tp, n))
    s = n // tp
    out = []
    for r in range(tp):
        out += [gate[r * s:(r + 1) * s], up[r * s:(r + 1) * s]]
    return np.concatenate(out)


def _layers(t):
    n = 0
    while "model.layers.%d.input_layernorm.weight" % n in t:
        n += 1
    return n


def _experts(t, L):
    e = 0
    while "model.layers.%d.mlp.experts.%d.gate_proj.weight" % (L, e) in t:
        e += 1
    return e


def fused(t):
    """transformers >= 5's fused experts."""
    out = {}
    for name, v in t.items():
        if ".mlp.experts." not in name:
            out[name] = v
    for L in range(_layers(t)):
        p = "model.layers.%d.mlp." % L
        E = _experts(t, L)
        if not E:
            continue
        dt = t[p + "experts.0.gate_proj.weight"][0]
        gu = [np.concatenate([t[p + "experts.%d.gate_proj.weight" % e][1], t[p + "experts.%d.up_proj.weight" % e][1]])
              for e in range(E)]
        out[p + "experts.gate_up_proj"] = (dt, np.stack(gu))
        out[p + "experts.down_proj"] = (dt, np.stack([t[p + "experts.%d.down_proj.weight" % e][1] for e in range(E)]))
    return out


def megatron(t, cfg, tp, te):
    """Megatron-core's names and layouts, te: with Transformer Engine (its fused layer norms
    and TEGroupedMLP experts), else the local spec (SequentialMLP experts)."""
    nh, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // nh
    V = cfg["vocab_size"]
    mult = MEGATRON_VOCAB_DIVISOR * tp
    PV = -(-V // mult) * mult
    out = {}

    def put(name, src):
        out[name] = t[src]

    dt, emb = t["model.embed_tokens.weight"]
    out["embedding.word_embeddings.weight"] = (dt, _padded(emb, PV))
    if "lm_head.weight" in t:
        dt, lm = t["lm_head.weight"]
        out["output_layer.weight"] = (dt, _padded(lm, PV))
    put("decoder.final_layernorm.weight", "model.norm.weight")
    q_per = nh // nkv * hd
    for L in range(_layers(t)):
        h, d = "model.layers.%d." % L, "decoder.layers.%d." % L
        a = h + "self_attn."
        dt, q = t[a + "q_proj.weight"]
        k, v = t[a + "k_proj.weight"][1], t[a + "v_proj.weight"][1]
        groups = []
        for g in range(nkv):  # each query group: its q heads, then its k head and v head
            groups += [q[g * q_per:(g + 1) * q_per], k[g * hd:(g + 1) * hd], v[g * hd:(g + 1) * hd]]
        out[d + "self_attention.linear_qkv.weight"] = (dt, np.concatenate(groups))
        put(d + "self_attention.linear_proj.weight", a + "o_proj.weight")
        if a + "q_norm.weight" in t:
            put(d + "self_attention.q_layernorm.weight", a + "q_norm.weight")
            put(d + "self_attention.k_layernorm.weight", a + "k_norm.weight")
        put(d + ("self_attention.linear_qkv.layer_norm_weight" if te else "input_layernorm.weight"),
            h + "input_layernorm.weight")
        m = h + "mlp."
        E = _experts(t, L)
        if E:
            put(d + "pre_mlp_layernorm.weight", h + "post_attention_layernorm.weight")
            put(d + "mlp.router.weight", m + "gate.weight")
            for e in range(E):
                x = m + "experts.%d." % e
                dt, g = t[x + "gate_proj.weight"]
                fc1 = (dt, _per_rank(g, t[x + "up_proj.weight"][1], tp))
                if te:
                    out[d + "mlp.experts.linear_fc1.weight%d" % e] = fc1
                    put(d + "mlp.experts.linear_fc2.weight%d" % e, x + "down_proj.weight")
                else:
                    out[d + "mlp.experts.local_experts.%d.linear_fc1.weight" % e] = fc1
                    put(d + "mlp.experts.local_experts.%d.linear_fc2.weight" % e, x + "down_proj.weight")
        else:
            put(d + ("mlp.linear_fc1.layer_norm_weight" if te else "pre_mlp_layernorm.weight"),
                h + "post_attention_layernorm.weight")
            dt, g = t[m + "gate_proj.weight"]
            out[d + "mlp.linear_fc1.weight"] = (dt, _per_rank(g, t[m + "up_proj.weight"][1], tp))
            put(d + "mlp.linear_fc2.weight", m + "down_proj.weight")
    return out


def convert(naming, t, cfg, mesh_tp):
    """t (Hugging Face names) as `naming` holds it."""
    if naming == "hf":
        return dict(t)
    if naming == "fused":
        return fused(t)
    if naming in ("megatron", "megatron_local"):
        return megatron(t, cfg, mesh_tp, naming == "megatron")
    raise ConvertError("the check cannot write a checkpoint in naming %r (it knows hf, fused, megatron, "
                       "megatron_local)" % naming)
