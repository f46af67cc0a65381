"""arch.py -- what each supported architecture's weights mean, read two ways, written apart
from any model-family file:

- Hugging Face semantics (`HFWeights`): the trainer's tensors by transformers' names, as its
  modeling code reads them (Phi-3's fused qkv_proj = [q; k; v] and gate_up_proj = [gate; up]
  split by sizes);
- vLLM semantics (`VllmWeights`): each rollout rank's local tensors by vLLM's names, as vLLM's
  model classes read them: QKVParallelLinear's qkv_proj = [q; k; v] of the rank's heads (a kv
  head replicated where the TP size exceeds the kv heads), MergedColumnParallelLinear's
  gate_up_proj = [gate; up] of the rank's rows, FusedMoE's w13_weight[e] = [gate; up] and
  w2_weight[e] per expert (the rank's rows, or whole experts with expert parallelism),
  DeepSeek's MLA fused_qkv_a_proj = [q_a; kv_a] (replicated), VocabParallelEmbedding and
  ParallelLMHead rows of the vocabulary padded to 64, row-parallel o_proj/down_proj columns,
  and FP8 weights dequantized with their 128x128 block scales (weight_scale_inv).

Both give the same thing: the *logical* weights of the model (q, k, v, o, gate, up, down,
expert e's gate/up/down, the router, q_a, kv_a, q_b, kv_b, norms, ...) as pieces -- one
piece, the whole weight, from Hugging Face; one piece per rank, the rows or columns that rank
holds, from vLLM -- which the one forward (forward.py) computes with, rank by rank.
"""

import numpy as np

from numerics import FP8_BLOCK, bf16_values, block_expand, e4m3_values

# the architectures with a forward here, and the config.json model_types that are one of them
ARCHS = ("llama", "qwen3", "qwen3_moe", "deepseek_v3", "mixtral", "phi3", "gpt_oss")
MODEL_TYPES = {"llama": "llama", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe", "deepseek_v3": "deepseek_v3",
               "kimi_k2": "deepseek_v3", "mixtral": "mixtral", "phi3": "phi3", "gpt_oss": "gpt_oss"}
VLLM_CLASS = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
              "deepseek_v3": "DeepseekV3ForCausalLM", "mixtral": "MixtralForCausalLM", "phi3": "Phi3ForCausalLM",
              "gpt_oss": "GptOssForCausalLM"}


class Missing(Exception):
    """A tensor one side's semantics read that the family's inventory does not hold, or holds
    in another shape or dtype."""


class Model:
    """The sizes and structure of one config.json, as both sides read it."""

    def __init__(self, cfg, arch):
        self.cfg, self.arch = cfg, arch
        g = cfg.get
        self.H = g("hidden_size")
        self.V = g("vocab_size")
        self.L = g("num_hidden_layers")
        self.nh = g("num_attention_heads")
        self.nkv = g("num_key_value_heads") or self.nh
        self.hd = g("head_dim") or self.H // self.nh
        self.I = g("intermediate_size")
        self.eps = g("rms_norm_eps", 1e-6)
        self.theta = float(g("rope_theta", 10000.0))
        self.tied = bool(g("tie_word_embeddings", False))
        self.mla = arch == "deepseek_v3"
        self.qk_norm = arch in ("qwen3", "qwen3_moe")
        # how the trainer's fused experts order gate and up (semcheck's --gate-up): interleaved
        # (transformers' GptOssExperts: gate = [..., ::2], up = [..., 1::2]) or halves
        self.gate_up = "interleaved"
        if arch == "qwen3_moe":
            self.E, self.topk, self.MI = g("num_experts"), g("num_experts_per_tok"), g("moe_intermediate_size")
        elif arch == "mixtral":
            self.E, self.topk, self.MI = g("num_local_experts"), g("num_experts_per_tok"), self.I
        elif arch == "gpt_oss":
            self.E, self.MI = g("num_local_experts"), self.I
            self.topk = g("experts_per_token") or g("num_experts_per_tok")
            self.limit = float(g("swiglu_limit", 7.0))
            self.window = g("sliding_window") or 0
            self.layer_types = g("layer_types") or []
        elif arch == "deepseek_v3":
            self.E, self.topk, self.MI = g("n_routed_experts"), g("num_experts_per_tok"), g("moe_intermediate_size")
            self.ql, self.kvl = g("q_lora_rank"), g("kv_lora_rank")
            self.rope, self.nope, self.vd = g("qk_rope_head_dim"), g("qk_nope_head_dim"), g("v_head_dim")
            self.shared = (g("n_shared_experts") or 0) * self.MI
            self.mtp = g("num_nextn_predict_layers") or 0
        else:
            self.E = 0

    def moe(self, L):
        """Is decoder layer L a mixture of experts (both sides decide alike)."""
        g = self.cfg.get
        if self.arch == "qwen3_moe":
            return L not in (g("mlp_only_layers") or []) and self.E > 0 and (L + 1) % g("decoder_sparse_step", 1) == 0
        if self.arch in ("mixtral", "gpt_oss"):
            return True
        if self.arch == "deepseek_v3":
            return self.E and L >= g("first_k_dense_replace", 0) and L % g("moe_layer_freq", 1) == 0
        return False


class Piece:
    """Part of a logical weight: its values (float64), the rows and columns of the logical
    weight they are, where they were read (for messages), and for FP8 the block scales they
    were dequantized with (one per element, and the grid) for the FP8 bound."""
    __slots__ = ("w", "rows", "cols", "src", "scale", "grid", "rank", "base")

    def __init__(self, w, rows, cols, src, scale=None, grid=None, rank=0, base=0):
        self.w, self.rows, self.cols, self.src = w, rows, cols, src
        self.scale, self.grid, self.rank = scale, grid, rank
        self.base = base  # the tensor's row of the weight's row 0 (a fused tensor's component)


def _span(a, b):
    return "%d:%d" % (a, b)


# ---------------------------------------------------------------- Hugging Face semantics


class HFWeights:
    """The trainer's tensors read by transformers' names (tensors: name -> (dtype, values))."""

    def __init__(self, model, tensors):
        self.m, self.t, self.read = model, tensors, set()
        self.tp = 1

    def get(self, name, shape):
        if name not in self.t:
            raise Missing("trainer tensor %s: not in the family's trainer inventory, and the Hugging Face "
                          "model reads it" % name)
        dt, v = self.t[name]
        if list(v.shape) != list(shape):
            raise Missing("trainer tensor %s: shape %s in the family's trainer inventory, the Hugging Face "
                          "model's is %s" % (name, list(v.shape), list(shape)))
        self.read.add(name)
        return v

    def whole(self, name, shape, rows=None):
        """One piece: the tensor, or rows (a, b) of it (a fused Phi-3 tensor's component)."""
        v = self.get(name, shape)
        if rows is None:
            return [Piece(v, None, None, "trainer " + name)]
        return [Piece(v[rows[0]:rows[1]], None, None, "trainer " + name, base=rows[0])]

    def weights(self, L, what, e=None, mtp=False):
        m, H = self.m, self.m.H
        p = "model.layers.%d." % L if L is not None else "model."
        if what == "embed":
            return self.whole("model.embed_tokens.weight", [m.V, H])
        if what == "lm_head":
            if m.tied:
                return self.whole("model.embed_tokens.weight", [m.V, H])
            return self.whole("lm_head.weight", [m.V, H])
        if what == "norm":
            return self.whole("model.norm.weight", [H])
        if what in ("enorm", "hnorm"):
            return self.whole(p + what + ".weight", [H])
        if what == "eh_proj":
            return self.whole(p + "eh_proj.weight", [H, 2 * H])
        if what == "head_norm":
            return self.whole(p + "shared_head.norm.weight", [H])
        if what == "head":
            # DeepSeek's MTP head; a checkpoint without its own copy shares the model's
            if p + "shared_head.head.weight" in self.t:
                return self.whole(p + "shared_head.head.weight", [m.V, H])
            return self.weights(None, "lm_head")
        if what in ("in_norm", "post_norm"):
            n = "input_layernorm" if what == "in_norm" else "post_attention_layernorm"
            return self.whole(p + n + ".weight", [H])
        if m.arch == "gpt_oss":
            return self.gpt_oss(p, L, what, e)
        a = p + "self_attn."
        if m.mla:
            nh, qd = m.nh, m.nope + m.rope
            shapes = {"q_a": ("q_a_proj", [m.ql, H]), "q_a_norm": ("q_a_layernorm", [m.ql]),
                      "q_b": ("q_b_proj", [nh * qd, m.ql or 0]), "q": ("q_proj", [nh * qd, H]),
                      "kv_a": ("kv_a_proj_with_mqa", [m.kvl + m.rope, H]),
                      "kv_a_norm": ("kv_a_layernorm", [m.kvl]), "kv_b": ("kv_b_proj", [nh * (m.nope + m.vd), m.kvl]),
                      "o": ("o_proj", [H, nh * m.vd])}
            if what in shapes:
                n, sh = shapes[what]
                return self.whole(a + n + ".weight", sh)
        else:
            nq, nk = m.nh * m.hd, m.nkv * m.hd
            if what in ("q", "k", "v"):
                if m.arch == "phi3":  # HF Phi3Attention: qkv_proj output split [q | k | v]
                    rows = {"q": (0, nq), "k": (nq, nq + nk), "v": (nq + nk, nq + 2 * nk)}[what]
                    return self.whole(a + "qkv_proj.weight", [nq + 2 * nk, H], rows)
                return self.whole(a + what + "_proj.weight", [nq if what == "q" else nk, H])
            if what == "o":
                return self.whole(a + "o_proj.weight", [H, nq])
            if what in ("q_norm", "k_norm"):
                return self.whole(a + what + ".weight", [m.hd])
        f = p + "mlp."
        if what in ("gate", "up", "down") and e is None:
            I = m.I
            if m.arch == "phi3":  # HF Phi3MLP: gate, up = gate_up_proj(x).chunk(2)
                if what == "down":
                    return self.whole(f + "down_proj.weight", [H, I])
                rows = (0, I) if what == "gate" else (I, 2 * I)
                return self.whole(f + "gate_up_proj.weight", [2 * I, H], rows)
            return self.whole(f + what + "_proj.weight", [H, I] if what == "down" else [I, H])
        if what == "router":
            n = "model.layers.%d.block_sparse_moe.gate.weight" % L if m.arch == "mixtral" else f + "gate.weight"
            return self.whole(n, [m.E, H])
        if what == "e_bias":
            return self.whole(f + "gate.e_score_correction_bias", [m.E])
        if what in ("shared.gate", "shared.up", "shared.down"):
            w = what.split(".")[1]
            return self.whole(f + "shared_experts.%s_proj.weight" % w, [H, m.shared] if w == "down" else [m.shared, H])
        if e is not None:
            MI = m.MI
            if m.arch == "mixtral":
                n = "model.layers.%d.block_sparse_moe.experts.%d.%s.weight" % (L, e, {"gate": "w1", "up": "w3", "down": "w2"}[what])
            else:
                n = f + "experts.%d.%s_proj.weight" % (e, what)
            return self.whole(n, [H, MI] if what == "down" else [MI, H])
        raise KeyError(what)

    def gpt_oss(self, p, L, what, e):
        """HF GptOssForCausalLM: biased q/k/v/o, per-head sinks, a biased router, and the experts
        of a layer stacked: gate_up_proj [E, H, 2I] multiplied from the left (x @ W) whose
        output columns are gate and up interleaved (gate = [..., ::2], up = [..., 1::2]),
        down_proj [E, I, H] likewise; the logical weights are [out, in] as everywhere here."""
        m, H = self.m, self.m.H
        a, f = p + "self_attn.", p + "mlp."
        nq, nk = m.nh * m.hd, m.nkv * m.hd
        if what in ("q", "k", "v", "o"):
            return self.whole(a + what + "_proj.weight", {"q": [nq, H], "k": [nk, H], "v": [nk, H], "o": [H, nq]}[what])
        if what in ("q_bias", "k_bias", "v_bias", "o_bias"):
            w = what[0]
            return self.whole(a + w + "_proj.bias", [{"q": nq, "k": nk, "v": nk, "o": H}[w]])
        if what == "sinks":
            return self.whole(a + "sinks", [m.nh])
        if what == "router":
            return self.whole(f + "router.weight", [m.E, H])
        if what == "router_bias":
            return self.whole(f + "router.bias", [m.E])
        E, MI = m.E, m.MI
        if what in ("gate", "up", "gate_bias", "up_bias"):
            b = what.endswith("_bias")
            n = f + ("experts.gate_up_proj_bias" if b else "experts.gate_up_proj")
            v = self.get(n, [E, 2 * MI] if b else [E, H, 2 * MI])[e]
            k = 0 if what.startswith("gate") else 1
            if m.gate_up == "halves":
                cut, how = slice(k * MI, (k + 1) * MI), "%d:%d" % (k * MI, (k + 1) * MI)
            else:
                cut, how = slice(k, None, 2), "%d::2" % k
            v = v[cut] if b else v[:, cut].T
            return [Piece(v, None, None, "trainer %s (expert %d, %s%s)" % (n, e, "" if b else "columns ", how))]
        if what == "down":
            n = f + "experts.down_proj"
            return [Piece(self.get(n, [E, MI, H])[e].T, None, None, "trainer %s (expert %d, transposed)" % (n, e))]
        if what == "down_bias":
            n = f + "experts.down_proj_bias"
            return [Piece(self.get(n, [E, H])[e], None, None, "trainer %s (expert %d)" % (n, e))]
        raise KeyError(what)


# ---------------------------------------------------------------- vLLM semantics


class VllmWeights:
    """The rollout ranks' local tensors read by vLLM's names and layouts. locals_[r] maps a
    rollout tensor's name to its bytes at rank r; inv maps a name to (dtype, global shape) as
    the family's rollout inventory says; fp8: whether vLLM's linear layers are FP8 here."""

    def __init__(self, model, locals_, inv, tp, ep, fp8):
        self.m, self.loc, self.inv = model, locals_, inv
        self.tp, self.ep, self.fp8 = tp, ep, fp8
        self.read = set()
        self.cache = {}

    # -- one local tensor

    def local(self, r, name, shape, linear):
        """Rank r's local `name` as vLLM holds it: `shape`, FP8 with block scales when it is a
        linear layer of an FP8 model, else BF16 (or what `linear` names: 'fp32')."""
        key = (r, name)
        if key in self.cache:
            return self.cache[key]
        want = "fp32" if linear == "fp32" else ("fp8_e4m3" if linear is True and self.fp8 else "bf16")
        if name not in self.inv:
            raise Missing("rollout tensor %s: not in the family's rollout inventory, and vLLM's %s reads it"
                          % (name, VLLM_CLASS[self.m.arch]))
        dt = self.inv[name][0]
        if dt != want:
            raise Missing("rollout tensor %s: %s in the family's rollout inventory, vLLM's %s holds it in %s"
                          % (name, dt, VLLM_CLASS[self.m.arch], want))
        raw = self.loc[r].get(name)
        size = {"bf16": 2, "fp32": 4, "fp8_e4m3": 1}[dt]
        n = int(np.prod(shape))
        if raw is None or len(raw) != n * size:
            raise Missing("rollout tensor %s: rank %d holds %s bytes, vLLM's %s at tp %d, ep %d holds %s %s "
                          "(%d bytes)" % (name, r, "no" if raw is None else len(raw), VLLM_CLASS[self.m.arch],
                                         self.tp, self.ep, list(shape), dt, n * size))
        self.read.add(name)
        scale = grid = None
        if dt == "bf16":
            v = bf16_values(np.frombuffer(raw, np.uint16)).reshape(shape)
        elif dt == "fp32":
            v = np.frombuffer(raw, np.float32).astype(np.float64).reshape(shape)
        else:
            q = e4m3_values(np.frombuffer(raw, np.uint8)).reshape(shape)
            sname = name[: -len("weight")] + "weight_scale_inv"
            gshape = list(shape[:-2]) + [-(-shape[-2] // FP8_BLOCK), -(-shape[-1] // FP8_BLOCK)]
            if sname not in self.inv or self.inv[sname][0] != "fp32":
                raise Missing("rollout tensor %s: FP8 without an FP32 %s in the family's rollout inventory"
                              % (name, sname))
            sraw = self.loc[r].get(sname)
            if sraw is None or len(sraw) != int(np.prod(gshape)) * 4:
                raise Missing("rollout tensor %s: rank %d holds %s bytes, vLLM's block scales of %s %s are %s "
                              "FP32" % (sname, r, "no" if sraw is None else len(sraw), name, list(shape), gshape))
            self.read.add(sname)
            grid = np.frombuffer(sraw, np.float32).astype(np.float64).reshape(gshape)
            scale = block_expand(grid, shape)
            v = q * scale
        self.cache[key] = (v, scale, grid)
        return self.cache[key]

    def piece(self, r, name, shape, linear, rows=None, cols=None, lrows=None, lcols=None, e=None, what=""):
        """A piece of rank r's local `name`: local rows lrows / columns lcols (of expert e),
        which are rows / cols of the logical weight."""
        v, s, grid = self.local(r, name, shape, linear)
        if e is not None:
            v, s, grid = v[e], (None if s is None else s[e]), (None if grid is None else grid[e])
        sl = (slice(*lrows) if lrows else slice(None), slice(*lcols) if lcols else slice(None))
        sl = sl[: v.ndim]
        where = []
        if self.tp > 1 or self.ep > 1:
            where.append("rank %d" % r)
        if e is not None:
            where.append("expert %d" % e)
        if lrows:
            where.append("rows " + _span(*lrows))
        if lcols:
            where.append("columns " + _span(*lcols))
        src = "rollout %s (%s%s)" % (name, ", ".join(where) + (", " if where else ""), "as vLLM reads " + what)
        g = None
        if grid is not None:
            b0 = (lrows[0] if lrows else 0) // FP8_BLOCK
            b1 = -(-(lrows[1] if lrows else v.shape[0]) // FP8_BLOCK)
            c0 = (lcols[0] if lcols else 0) // FP8_BLOCK
            c1 = -(-(lcols[1] if lcols else v.shape[-1]) // FP8_BLOCK)
            g = (grid[b0:b1, c0:c1], (lrows[0] if lrows else 0) % FP8_BLOCK, (lcols[0] if lcols else 0) % FP8_BLOCK)
        return Piece(v[sl], rows, cols, src, None if s is None else s[sl], g, r)

    # -- how vLLM splits a replica's ranks

    def heads(self, n, r):
        """(first head, heads) rank r holds of n heads: n/tp each, or, with fewer heads than
        ranks, one replicated head (QKVParallelLinear: head r // (tp / n))."""
        tp = self.tp
        if n >= tp:
            return r * (n // tp), n // tp
        return r // (tp // n), 1

    def vocab(self, r):
        """VocabParallelEmbedding / ParallelLMHead: (first real row, real rows, local rows)."""
        V = self.m.V
        padded = -(-V // 64) * 64
        per = padded // self.tp
        lo = r * per
        return lo, max(0, min(per, V - lo)), per

    def split(self, n, r):
        per = n // self.tp
        return r * per, per

    def each(self, fn):
        out = []
        for r in range(self.tp):
            out += fn(r)
        return out

    # -- the logical weights

    def vocab_pieces(self, name, what):
        H = self.m.H

        def one(r):
            lo, n, per = self.vocab(r)
            if n == 0:
                return []
            return [self.piece(r, name, [per, H], False, rows=(lo, lo + n), lrows=(0, n), what=what)]
        return self.each(one)

    def col(self, name, shape_of, comps, what, linear=True, heads=None, e=None, stacked=None):
        """Column-parallel (QKVParallelLinear, MergedColumnParallelLinear, FusedMoE w13):
        rank r's local tensor is its part of each component in order, comps = [(name, rows
        of the logical weight, heads or None)]; returns the pieces of component `what`."""
        def one(r):
            at, mine = 0, None
            for cname, n, nheads in comps:
                if nheads:
                    h0, hn = self.heads(nheads, r)
                    per = n // nheads
                    lo, cnt = h0 * per, hn * per
                else:
                    lo, cnt = self.split(n, r)
                if cname == what:
                    mine = (lo, cnt, at)
                at += cnt
            lo, cnt, at0 = mine
            shape = shape_of(at)
            return [self.piece(r, name, shape, linear, rows=(lo, lo + cnt), lrows=(at0, at0 + cnt), e=e,
                               what=what if e is None else "expert %d %s" % (e, what))]
        return self.each(one)

    def row(self, name, n, shape_of, what, linear=True, e=None):
        """Row-parallel (o_proj, down_proj, FusedMoE w2): rank r holds columns of the input."""
        def one(r):
            lo, cnt = self.split(n, r)
            return [self.piece(r, name, shape_of(cnt), linear, cols=(lo, lo + cnt), lcols=(0, cnt), e=e,
                               what=what if e is None else "expert %d %s" % (e, what))]
        return self.each(one)

    def rep(self, name, shape, what, linear=False, lrows=None):
        """Replicated: every rank holds it whole (or rows lrows of it are the weight)."""
        return self.each(lambda r: [self.piece(r, name, shape, linear, rows=None, lrows=lrows, what=what)])

    def weights(self, L, what, e=None, mtp=False):
        m, H = self.m, self.m.H
        top = "model.layers.%d." % L if L is not None else "model."
        p = top + "mtp_block." if mtp else top  # vLLM's DeepSeekMTP: the decoder under mtp_block
        if what == "embed":  # vLLM's GptOssModel calls it `embedding`
            return self.vocab_pieces("model.embedding.weight" if m.arch == "gpt_oss" else "model.embed_tokens.weight",
                                     "the embedding")
        if what == "lm_head":
            if m.tied:
                return self.vocab_pieces("model.embed_tokens.weight", "the tied LM head")
            return self.vocab_pieces("lm_head.weight", "the LM head")
        if what == "norm":
            return self.rep("model.norm.weight", [H], "the final norm")
        if what in ("enorm", "hnorm"):
            return self.rep(top + what + ".weight", [H], what)
        if what == "eh_proj":
            return self.rep(top + "eh_proj.weight", [H, 2 * H], "eh_proj")
        if what == "head_norm":
            return self.rep(top + "shared_head.norm.weight", [H], "the MTP head's norm")
        if what == "head":
            return self.vocab_pieces(top + "shared_head.head.weight", "the MTP head")
        if what in ("in_norm", "post_norm"):
            n = "input_layernorm" if what == "in_norm" else "post_attention_layernorm"
            return self.rep(p + n + ".weight", [H], n)
        if m.arch == "gpt_oss":
            return self.gpt_oss(p, what, e)
        a = p + "self_attn."
        if m.mla:
            nh, qd, vd = m.nh, m.nope + m.rope, m.vd
            if what in ("q_a", "kv_a") and m.ql:
                n = m.ql + m.kvl + m.rope  # fused_qkv_a_proj = [q_a; kv_a], replicated
                rows = (0, m.ql) if what == "q_a" else (m.ql, n)
                return self.rep(a + "fused_qkv_a_proj.weight", [n, H], what, linear=True, lrows=rows)
            if what == "kv_a":
                return self.rep(a + "kv_a_proj_with_mqa.weight", [m.kvl + m.rope, H], what, linear=True)
            if what in ("q_a_norm", "kv_a_norm"):
                n, k = ("q_a_layernorm", m.ql) if what == "q_a_norm" else ("kv_a_layernorm", m.kvl)
                return self.rep(a + n + ".weight", [k], n)
            if what in ("q_b", "q"):
                n, k = ("q_b_proj", m.ql) if what == "q_b" else ("q_proj", H)
                return self.col(a + n + ".weight", lambda rows: [rows, k], [(what, nh * qd, nh)], what)
            if what == "kv_b":
                return self.col(a + "kv_b_proj.weight", lambda rows: [rows, m.kvl], [(what, nh * (m.nope + vd), nh)],
                                what)
            if what == "o":
                return self.row(a + "o_proj.weight", nh * vd, lambda c: [H, c], "o")
        else:
            nq, nk = m.nh * m.hd, m.nkv * m.hd
            if what in ("q", "k", "v"):
                comps = [("q", nq, m.nh), ("k", nk, m.nkv), ("v", nk, m.nkv)]
                return self.col(a + "qkv_proj.weight", lambda rows: [rows, H], comps, what)
            if what == "o":
                return self.row(a + "o_proj.weight", nq, lambda c: [H, c], "o")
            if what in ("q_norm", "k_norm"):
                return self.rep(a + what + ".weight", [m.hd], what)
        f = p + ("block_sparse_moe." if m.arch == "mixtral" else "mlp.")
        if what in ("gate", "up") and e is None:
            return self.col(f + "gate_up_proj.weight", lambda rows: [rows, H], [("gate", m.I, 0), ("up", m.I, 0)], what)
        if what == "down" and e is None:
            return self.row(f + "down_proj.weight", m.I, lambda c: [H, c], "down")
        if what == "router":  # a replicated BF16 linear (quant_config=None in vLLM)
            return self.rep(f + "gate.weight", [m.E, H], "the router")
        if what == "e_bias":
            return self.rep(f + "gate.e_score_correction_bias", [m.E], "the router's bias", linear="fp32")
        if what in ("shared.gate", "shared.up"):
            w = what.split(".")[1]
            return self.col(f + "shared_experts.gate_up_proj.weight", lambda rows: [rows, H],
                            [("gate", m.shared, 0), ("up", m.shared, 0)], w)
        if what == "shared.down":
            return self.row(f + "shared_experts.down_proj.weight", m.shared, lambda c: [H, c], "shared down")
        if e is not None:
            return self.expert(f, e, what)
        raise KeyError(what)

    def expert(self, f, e, what):
        """FusedMoE: w13_weight [E, 2I, H] holds each expert's [gate; up], w2_weight [E, H, I]
        its down; with expert parallelism rank r holds experts [r E/ep, (r+1) E/ep) whole,
        without it every expert's rows (w13, per half) or columns (w2) split over TP."""
        H, MI, E = self.m.H, self.m.MI, self.m.E
        if self.ep > 1:
            per = E // self.ep
            out = []
            for r in range(self.tp):
                er = r % self.ep
                if not er * per <= e < (er + 1) * per:
                    continue
                le = e - er * per
                if what == "down":
                    out.append(self.piece(r, f + "experts.w2_weight", [per, H, MI], True, e=le,
                                          what="expert %d down" % e))
                else:
                    lr = (0, MI) if what == "gate" else (MI, 2 * MI)
                    out.append(self.piece(r, f + "experts.w13_weight", [per, 2 * MI, H], True, lrows=lr, e=le,
                                          what="expert %d %s" % (e, what)))
            return out
        if what == "down":
            return self.row(f + "experts.w2_weight", MI, lambda c: [E, H, c], "down", e=e)
        return self.col(f + "experts.w13_weight", lambda rows: [E, rows, H], [("gate", MI, 0), ("up", MI, 0)], what,
                        e=e)

    def gpt_oss(self, p, what, e):
        """vLLM's GptOssForCausalLM (model_executor/models/gpt_oss.py): attn.qkv_proj [q; k; v] of
        the rank's heads with its bias, o_proj row-parallel with its bias whole on every rank
        (added once: RowParallelLinear adds it on rank 0), attn.sinks the rank's heads, the
        router replicated, and one FusedMoE: w13_weight [E, 2I, H] whose rows are gate and up
        interleaved (the swigluoai activation reads gate = rows ::2, up = rows 1::2 of the
        rank's share), split over TP as one block of 2I/tp rows, w13_bias alike, w2_weight
        [E, H, I] split along I, w2_bias whole on TP rank 0 (zeros elsewhere); with expert
        parallelism each rank holds whole experts, biases included."""
        m, H = self.m, self.m.H
        a, f = p + "attn.", p + "mlp."
        nq, nk = m.nh * m.hd, m.nkv * m.hd
        comps = [("q", nq, m.nh), ("k", nk, m.nkv), ("v", nk, m.nkv)]
        if what in ("q", "k", "v"):
            return self.col(a + "qkv_proj.weight", lambda rows: [rows, H], comps, what)
        if what in ("q_bias", "k_bias", "v_bias"):
            return self.col(a + "qkv_proj.bias", lambda rows: [rows], comps, what[0], linear=False)
        if what == "o":
            return self.row(a + "o_proj.weight", nq, lambda c: [H, c], "o")
        if what == "o_bias":
            return self.rep(a + "o_proj.bias", [H], "o's bias")
        if what == "sinks":
            return self.col(a + "sinks", lambda rows: [rows], [("sinks", m.nh, m.nh)], "sinks", linear=False)
        if what == "router":
            return self.rep(f + "router.weight", [m.E, H], "the router")
        if what == "router_bias":
            return self.rep(f + "router.bias", [m.E], "the router's bias")
        E, MI = m.E, m.MI
        ep = self.ep > 1
        per = E // self.ep if ep else E
        out = []
        for r in range(self.tp):
            if ep:
                er = r % self.ep
                if not er * per <= e < (er + 1) * per:
                    continue
                le, lo, cnt = e - er * per, 0, MI
            else:
                le, (lo, cnt) = e, self.split(MI, r)
            where = "rank %d, expert %d" % (r, e) if self.tp > 1 else "expert %d" % e
            if what in ("gate", "up", "gate_bias", "up_bias"):
                bias = what.endswith("_bias")
                n = f + ("experts.w13_bias" if bias else "experts.w13_weight")
                shape = [per, 2 * cnt] if bias else [per, 2 * cnt, H]
                v, s, _ = self.local(r, n, shape, not bias)
                if s is not None:
                    raise Missing("rollout tensor %s: FP8, and vLLM's gpt-oss reads BF16 (or MXFP4) experts" % n)
                k = 0 if what.startswith("gate") else 1
                out.append(Piece(v[le][k::2], (lo, lo + cnt), None, "rollout %s (%s, rows %d::2, as vLLM reads expert %d %s)"
                                 % (n, where, k, e, what.replace("_", " ")), rank=r))
            elif what == "down":
                n = f + "experts.w2_weight"
                v, s, _ = self.local(r, n, [per, H, cnt], True)
                if s is not None:
                    raise Missing("rollout tensor %s: FP8, and vLLM's gpt-oss reads BF16 (or MXFP4) experts" % n)
                out.append(Piece(v[le], None, (lo, lo + cnt), "rollout %s (%s, as vLLM reads expert %d down)"
                                 % (n, where, e), rank=r))
            elif what == "down_bias":
                if not ep and r > 0:
                    continue  # zeros there: vLLM adds the bias once, on TP rank 0
                n = f + "experts.w2_bias"
                v, _, _ = self.local(r, n, [per, H], False)
                out.append(Piece(v[le], None, None, "rollout %s (%s, as vLLM reads expert %d's down bias)"
                                 % (n, where, e), rank=r))
            else:
                raise KeyError(what)
        return out
