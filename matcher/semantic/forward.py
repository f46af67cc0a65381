"""forward.py -- the one forward of the semantic check, and the comparison of its two runs.

The forward computes a decoder (attention -- grouped-query, or DeepSeek's multi-head latent
attention -- then a dense MLP or a mixture of experts, and DeepSeek's multi-token-prediction
layer) from *logical* weights (arch.py) rank by rank, as a tensor-parallel engine does: a
column-parallel linear gives each rank's rows of the output, a row-parallel one sums the
ranks' partial products, a vocabulary-parallel embedding adds each rank's rows. Run over the
trainer's tensors read by Hugging Face's semantics (one rank) and over the rollout's read by
vLLM's (each rank its local tensors), the two runs must agree:

- weights: every piece a rollout rank holds equals the trainer's values where vLLM's
  semantics place it -- bit for bit in BF16, and in FP8 within the rounding of E4M3
  (|dequantized - trainer| <= 2^-4 |trainer| + 2^-10 scale, a half step of 3 mantissa bits, or
  of the subnormal step) with each block's scale equal to its block's amax / 448;
- activations: every op's output (q, k, v, attention, o, gate, up, down, the router, each
  expert, the norms, ...) computed with the rollout's weights from the trainer run's inputs of
  that op (so a difference shows in the op whose weights cause it, and FP8 rounding does not
  add up along the layers), by cosine;
- logits: the rollout's own forward from the tokens to the logits (and the MTP layer's).

Expert selection is taken from the trainer's run in the rollout's, so that FP8 rounding cannot
flip a near tie between two experts; the router's logits are compared on their own.
"""

import numpy as np

from numerics import (FP8_MAX, block_amax, causal_attention, cosine, rmsnorm, rope_neox, rope_pairs, silu,
                      softmax)


def col(pieces, x, n):
    """Column-parallel linear: each piece gives rows of the output (a replicated piece, or a
    kv head held by several ranks, is computed once)."""
    out = np.zeros(x.shape[:-1] + (n,))
    done = np.zeros(n, bool)
    for p in pieces:
        lo, hi = p.rows or (0, n)
        if done[lo:hi].all():
            continue
        out[..., lo:hi] = x @ p.w.T
        done[lo:hi] = True
    return out


def row(pieces, x, n):
    """Row-parallel linear: each rank's columns of the input times its piece, summed."""
    out = np.zeros(x.shape[:-1] + (n,))
    for p in pieces:
        lo, hi = p.cols or (0, x.shape[-1])
        out += x[..., lo:hi] @ p.w.T
    return out


def vec(pieces):
    return pieces[0].w


def bias(pieces, n):
    """A bias of n entries from the pieces holding its rows (a split one: each rank's rows)."""
    out = np.zeros(n)
    for p in pieces:
        lo, hi = p.rows or (0, n)
        out[lo:hi] = p.w
    return out


def embed(pieces, ids, H):
    out = np.zeros((len(ids), H))
    for p in pieces:
        lo, hi = p.rows or (0, p.w.shape[0])
        m = (ids >= lo) & (ids < hi)
        out[m] += p.w[ids[m] - lo]
    return out


def lm_head(pieces, h, V):
    out = np.zeros((h.shape[0], V))
    for p in pieces:
        lo, hi = p.rows or (0, V)
        out[:, lo:hi] = h @ p.w.T
    return out


class Run:
    """One forward over one side's weights: the outputs of every op, the logical weights
    read, both in the order the forward met them."""

    def __init__(self, W, model, teacher=None):
        self.W, self.m, self.teacher = W, model, teacher
        self.events = []
        self.acts = {}
        self.wts = {}
        self.routes = {}  # layer -> [T, E] expert weights per token

    def w(self, L, what, e=None, mtp=False):
        k = (L, what, e, mtp)
        if k not in self.wts:
            self.wts[k] = self.W.weights(L, what, e, mtp)
            self.events.append(("w", k))
        return self.wts[k]

    def rec(self, L, what, v):
        self.acts[(L, what)] = v
        self.events.append(("a", (L, what)))

    def t(self, L, what, v):
        """Records an op's output; a teacher run goes on from the trainer run's output of the
        same op, so that every op is compared on the same inputs (its own weights alone make
        any difference)."""
        self.rec(L, what, v)
        return self.teacher.acts[(L, what)] if self.teacher is not None else v


def attention(R, L, h, mtp):
    m, T = R.m, h.shape[0]
    if m.mla:
        nh, qd = m.nh, m.nope + m.rope
        if m.ql:
            qa = R.t(L, "q_a", col(R.w(L, "q_a", mtp=mtp), h, m.ql))
            qa = R.t(L, "q_a norm", rmsnorm(qa, vec(R.w(L, "q_a_norm", mtp=mtp)), m.eps))
            q = R.t(L, "q_b", col(R.w(L, "q_b", mtp=mtp), qa, nh * qd))
        else:
            q = R.t(L, "q", col(R.w(L, "q", mtp=mtp), h, nh * qd))
        kva = R.t(L, "kv_a", col(R.w(L, "kv_a", mtp=mtp), h, m.kvl + m.rope))
        c = R.t(L, "kv_a norm", rmsnorm(kva[:, : m.kvl], vec(R.w(L, "kv_a_norm", mtp=mtp)), m.eps))
        kv = R.t(L, "kv_b", col(R.w(L, "kv_b", mtp=mtp), c, nh * (m.nope + m.vd)))
        q = q.reshape(T, nh, qd)
        kv = kv.reshape(T, nh, m.nope + m.vd)
        qp = rope_pairs(q[..., m.nope:], m.theta)
        kp = rope_pairs(kva[:, m.kvl:].reshape(T, 1, m.rope), m.theta)
        qf = np.concatenate([q[..., : m.nope], qp], axis=-1)
        kf = np.concatenate([kv[..., : m.nope], np.repeat(kp, nh, axis=1)], axis=-1)
        att = R.t(L, "attention", causal_attention(qf, kf, kv[..., m.nope:], 1.0 / np.sqrt(qd)))
        return R.t(L, "o", row(R.w(L, "o", mtp=mtp), att, m.H))
    nh, nkv, hd = m.nh, m.nkv, m.hd
    if m.arch == "gpt_oss":
        return attention_gpt_oss(R, L, h)
    q = R.t(L, "q", col(R.w(L, "q", mtp=mtp), h, nh * hd))
    k = R.t(L, "k", col(R.w(L, "k", mtp=mtp), h, nkv * hd))
    v = R.t(L, "v", col(R.w(L, "v", mtp=mtp), h, nkv * hd))
    q, k = q.reshape(T, nh, hd), k.reshape(T, nkv, hd)
    if m.qk_norm:
        q = R.t(L, "q_norm", rmsnorm(q, vec(R.w(L, "q_norm", mtp=mtp)), m.eps))
        k = R.t(L, "k_norm", rmsnorm(k, vec(R.w(L, "k_norm", mtp=mtp)), m.eps))
    q, k = rope_neox(q, m.theta), rope_neox(k, m.theta)
    att = R.t(L, "attention", causal_attention(q, k, v.reshape(T, nkv, hd), 1.0 / np.sqrt(hd), group=nh // nkv))
    return R.t(L, "o", row(R.w(L, "o", mtp=mtp), att, m.H))


def attention_gpt_oss(R, L, h):
    """gpt-oss: biased q/k/v/o, NeoX rotary (the tiny config has no YaRN scaling), a learned
    sink logit per head in the softmax's denominator, and a sliding window on the layers
    layer_types marks sliding_attention."""
    m, T = R.m, h.shape[0]
    nh, nkv, hd = m.nh, m.nkv, m.hd
    q = R.t(L, "q", col(R.w(L, "q"), h, nh * hd) + bias(R.w(L, "q_bias"), nh * hd))
    k = R.t(L, "k", col(R.w(L, "k"), h, nkv * hd) + bias(R.w(L, "k_bias"), nkv * hd))
    v = R.t(L, "v", col(R.w(L, "v"), h, nkv * hd) + bias(R.w(L, "v_bias"), nkv * hd))
    q, k = rope_neox(q.reshape(T, nh, hd), m.theta), rope_neox(k.reshape(T, nkv, hd), m.theta)
    sliding = L < len(m.layer_types) and m.layer_types[L] == "sliding_attention"
    att = R.t(L, "attention", causal_attention(q, k, v.reshape(T, nkv, hd), 1.0 / np.sqrt(hd), group=nh // nkv,
                                               sinks=bias(R.w(L, "sinks"), nh), window=m.window if sliding else 0))
    return R.t(L, "o", row(R.w(L, "o"), att, m.H) + vec(R.w(L, "o_bias")))


def mlp(R, L, h, mtp):
    m = R.m
    g = R.t(L, "gate", col(R.w(L, "gate", mtp=mtp), h, m.I))
    u = R.t(L, "up", col(R.w(L, "up", mtp=mtp), h, m.I))
    return R.t(L, "down", row(R.w(L, "down", mtp=mtp), silu(g) * u, m.H))


def route(m, logits, bias):
    """[T, E] weights of the experts each token goes to (0 elsewhere), as the model's own
    router decides: Qwen3-MoE softmax then top-k (renormalized with norm_topk_prob), Mixtral
    top-k of the logits then softmax, DeepSeek-V3 sigmoid scores, top-k over the best groups
    by score + e_score_correction_bias, weights the scores normalized, times the scaling."""
    T, E = logits.shape
    g = m.cfg.get
    w = np.zeros((T, E))
    for t in range(T):
        if m.arch == "deepseek_v3":
            s = 1.0 / (1.0 + np.exp(-logits[t]))
            choice = s + bias
            ng, tg = g("n_group") or 1, g("topk_group") or 1
            grp = choice.reshape(ng, -1)
            gscore = np.sort(grp, axis=1)[:, -2:].sum(axis=1)
            keep = np.argsort(-gscore, kind="stable")[:tg]
            masked = np.full(E, -np.inf)
            for k in keep:
                masked[k * (E // ng):(k + 1) * (E // ng)] = choice[k * (E // ng):(k + 1) * (E // ng)]
            sel = np.argsort(-masked, kind="stable")[: m.topk]
            ws = s[sel]
            if g("norm_topk_prob", True):
                ws = ws / ws.sum()
            w[t, sel] = ws * g("routed_scaling_factor", 1.0)
        elif m.arch in ("mixtral", "gpt_oss"):  # gpt-oss: top-k of the biased logits, then softmax
            sel = np.argsort(-logits[t], kind="stable")[: m.topk]
            w[t, sel] = softmax(logits[t, sel])
        else:
            p = softmax(logits[t])
            sel = np.argsort(-p, kind="stable")[: m.topk]
            ws = p[sel]
            if g("norm_topk_prob", False):
                ws = ws / ws.sum()
            w[t, sel] = ws
    return w


def moe_gpt_oss(R, L, h, routes):
    """gpt-oss's experts: gate and up with biases, gate clamped above at swiglu_limit, up to
    [-limit, limit], out = (up + 1) * gate * sigmoid(1.702 gate), then down with its bias."""
    m = R.m
    logits = R.t(L, "router", col(R.w(L, "router"), h, m.E) + vec(R.w(L, "router_bias")))
    w = routes[L] if routes is not None else route(m, logits, None)
    R.routes[L] = w
    out = np.zeros_like(h)
    for e in range(m.E):
        g = R.t(L, "expert %d gate" % e, col(R.w(L, "gate", e), h, m.MI) + bias(R.w(L, "gate_bias", e), m.MI))
        u = R.t(L, "expert %d up" % e, col(R.w(L, "up", e), h, m.MI) + bias(R.w(L, "up_bias", e), m.MI))
        g = np.minimum(g, m.limit)
        u = np.clip(u, -m.limit, m.limit)
        a = (u + 1) * g / (1.0 + np.exp(-1.702 * g))
        y = R.t(L, "expert %d down" % e, row(R.w(L, "down", e), a, m.H) + vec(R.w(L, "down_bias", e)))
        out += w[:, e:e + 1] * y
    return R.t(L, "experts", out)


def moe(R, L, h, mtp, routes):
    m = R.m
    if m.arch == "gpt_oss":
        return moe_gpt_oss(R, L, h, routes)
    logits = R.t(L, "router", col(R.w(L, "router", mtp=mtp), h, m.E))
    bias = vec(R.w(L, "e_bias", mtp=mtp)) if m.arch == "deepseek_v3" else None
    w = routes[L] if routes is not None else route(m, logits, bias)
    R.routes[L] = w
    out = np.zeros_like(h)
    for e in range(m.E):
        g = R.t(L, "expert %d gate" % e, col(R.w(L, "gate", e, mtp), h, m.MI))
        u = R.t(L, "expert %d up" % e, col(R.w(L, "up", e, mtp), h, m.MI))
        y = R.t(L, "expert %d down" % e, row(R.w(L, "down", e, mtp), silu(g) * u, m.H))
        out += w[:, e:e + 1] * y
    if m.arch == "deepseek_v3" and m.shared:
        g = R.t(L, "shared expert gate", col(R.w(L, "shared.gate", mtp=mtp), h, m.shared))
        u = R.t(L, "shared expert up", col(R.w(L, "shared.up", mtp=mtp), h, m.shared))
        out = out + R.t(L, "shared expert down", row(R.w(L, "shared.down", mtp=mtp), silu(g) * u, m.H))
    return R.t(L, "experts", out)


def layer(R, L, x, mtp, routes):
    m = R.m
    h = R.t(L, "input norm", rmsnorm(x, vec(R.w(L, "in_norm", mtp=mtp)), m.eps))
    x = R.t(L, "attention residual", x + attention(R, L, h, mtp))
    h = R.t(L, "post-attention norm", rmsnorm(x, vec(R.w(L, "post_norm", mtp=mtp)), m.eps))
    return R.t(L, "output", x + (moe(R, L, h, mtp, routes) if m.moe(L) else mlp(R, L, h, mtp)))


def forward(R, ids, mtp_layers=0, routes=None):
    """The logits (and the MTP layers' logits) of the tokens ids. A teacher run (R.teacher,
    the trainer's run) computes every op from the trainer run's inputs of that op."""
    m = R.m
    x = R.t(None, "embedding", embed(R.w(None, "embed"), ids, m.H))
    for L in range(m.L):
        x = layer(R, L, x, False, routes)
    hidden = x
    h = R.t(None, "final norm", rmsnorm(x, vec(R.w(None, "norm")), m.eps))
    logits = R.t(None, "logits", lm_head(R.w(None, "lm_head"), h, m.V))
    out = [logits]
    for N in range(m.L, m.L + mtp_layers):
        # DeepSeek's MTP layer (vLLM's DeepSeekMultiTokenPredictorLayer): the next token's
        # embedding (zero at position 0) and the main model's last hidden state, each normed,
        # concatenated through eh_proj, a decoder layer, the shared head's norm and head
        nxt = np.roll(ids, -1)
        e = embed(R.w(None, "embed"), nxt, m.H)
        e[0] = 0
        e = R.t(N, "enorm", rmsnorm(e, vec(R.w(N, "enorm")), m.eps))
        hh = R.t(N, "hnorm", rmsnorm(hidden, vec(R.w(N, "hnorm")), m.eps))
        z = R.t(N, "eh_proj", col(R.w(N, "eh_proj"), np.concatenate([e, hh], axis=-1), m.H))
        z = layer(R, N, z, True, routes)
        hz = R.t(N, "head norm", rmsnorm(z, vec(R.w(N, "head_norm")), m.eps))
        out.append(R.t(N, "MTP logits", lm_head(R.w(N, "head"), hz, m.V)))
        hidden = z
    return out


# ---------------------------------------------------------------- comparing the runs


def label(key, mtp_from):
    """'layer 0 k', 'layer 1 expert 2 up', 'MTP layer 2 q_a', 'the embedding'."""
    L, what = key[0], key[1]
    e = key[2] if len(key) > 2 else None
    if L is None:
        return {"embed": "the embedding", "lm_head": "the LM head", "norm": "the final norm"}.get(what, what)
    name = what if e is None else "expert %d %s" % (e, what)
    return "%s %d %s" % ("MTP layer" if L >= mtp_from else "layer", L, name)


def _slice(ref, p):
    r = ref
    if p.rows:
        r = r[p.rows[0]:p.rows[1]]
    if p.cols:
        r = r[:, p.cols[0]:p.cols[1]]
    return r


def _where(p, ref):
    """Where in the trainer's tensor piece p's values belong: rows of the tensor (a fused
    tensor's component starts at ref.base), columns."""
    s = []
    rows = p.rows or ((0, ref.w.shape[0]) if ref.base else None)
    if rows:
        s.append("rows %d:%d" % (rows[0] + ref.base, rows[1] + ref.base))
    if p.cols:
        s.append("columns %d:%d" % p.cols)
    return " (%s)" % ", ".join(s) if s else ""


def check_weight(hf, vl):
    """The first rollout piece that is not the trainer's values where vLLM places it, as
    (short text, detail), or None."""
    ref_p = hf[0]
    ref = ref_p.w
    for p in vl:
        want = _slice(ref, p)
        head = "%s differs from %s%s" % (p.src, ref_p.src, _where(p, ref_p))
        if want.shape != p.w.shape:
            return head, "shape %s where the trainer's is %s" % (list(p.w.shape), list(want.shape))
        if p.scale is None:
            bad = int(np.count_nonzero(p.w != want))
            if bad:
                return head, "%d of %d values differ (BF16 must be equal)" % (bad, want.size)
            continue
        if p.grid is not None and (p.grid[1] or p.grid[2]):
            return head, "the piece starts inside an FP8 block (row %d, column %d of its block)" % p.grid[1:]
        err = np.abs(p.w - want)
        bound = 2.0 ** -4 * np.abs(want) + 2.0 ** -10 * p.scale
        bad = int(np.count_nonzero(~(err <= bound * (1 + 1e-9))))
        if bad:
            return head, "%d of %d values outside the FP8 rounding bound" % (bad, want.size)
        amax = block_amax(want).astype(np.float32)
        expect = (amax / np.float32(FP8_MAX)).astype(np.float64)
        got = p.grid[0]
        if got.shape != expect.shape:
            return head, "scale grid %s where the trainer's blocks are %s" % (list(got.shape), list(expect.shape))
        rel = np.abs(got - expect) / expect
        badb = int(np.count_nonzero(~(rel <= 1e-6)))
        if badb:
            return head, "%d of %d block scales are not the block's amax / 448" % (badb, expect.size)
    return None


def compare(hf_run, tf_run, bounds, mtp_from):
    """Findings in forward order: (label, short text, detail) for each weight that differs and
    each activation below its cosine bound; and the lowest activation cosine seen."""
    out = []
    low = (2.0, None)
    for kind, key in tf_run.events:
        if kind == "w":
            hkey = key
            if hkey not in hf_run.wts:
                hf_run.wts[hkey] = hf_run.W.weights(*key)
            f = check_weight(hf_run.wts[hkey], tf_run.wts[key])
            if f:
                out.append((label(key, mtp_from), f[0], f[1]))
        else:
            a, b = hf_run.acts.get(key), tf_run.acts[key]
            if a is None:
                continue
            c = cosine(a, b)
            if c < low[0]:
                low = (c, label(key, mtp_from))
            if not c >= bounds["act"]:
                out.append((label(key, mtp_from), "output cosine %.6f below %g" % (c, bounds["act"]), ""))
    return out, low
