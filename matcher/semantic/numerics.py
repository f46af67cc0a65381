"""numerics.py -- the numbers of the semantic check: BF16 and FP8 E4M3 bits to values, and the
pieces of a decoder forward that read no weights' layout (RMSNorm, rotary embeddings, causal
attention, SiLU, routing). numpy on the CPU in float64, so that a BF16 model's two forwards
differ only by the order of additions."""

import numpy as np

FP8_BLOCK = 128
FP8_MAX = 448.0

# e4m3fn: 4 exponent bits (bias 7), 3 mantissa bits, no infinities; 0x7f and 0xff are NaN
_E4M3 = np.zeros(256, np.float64)
for _c in range(256):
    _e, _m = (_c >> 3) & 15, _c & 7
    _v = (_m / 8.0) * 2.0 ** -6 if _e == 0 else (1 + _m / 8.0) * 2.0 ** (_e - 7)
    _E4M3[_c] = -_v if _c & 0x80 else _v
_E4M3[0x7F] = _E4M3[0xFF] = np.nan


def bf16_values(bits):
    """uint16 BF16 bits -> float64 values (exact)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def bf16_bits(x):
    """float32 values -> BF16 bits, rounding to nearest even (as torch's .to(torch.bfloat16))."""
    b = np.asarray(x, np.float32).view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def e4m3_values(bits):
    """uint8 E4M3 (fn) bits -> float64 values (NaN for the NaN codes)."""
    return _E4M3[np.asarray(bits, np.uint8)]


def block_expand(scale, shape):
    """A block-scale grid (ceil(m/128) x ceil(n/128) over the last two dims, leading dims as
    they are) expanded to one value per element of `shape`."""
    s = np.repeat(np.repeat(scale, FP8_BLOCK, axis=-2), FP8_BLOCK, axis=-1)
    return s[..., : shape[-2], : shape[-1]]


def block_amax(x):
    """max |x| over each 128x128 block of the last two dims (from the origin), and 1e-4 at
    least, as DeepGEMM's per_block_cast_to_fp8 takes it (in float32)."""
    x = np.abs(np.asarray(x, np.float32))
    m, n = x.shape[-2], x.shape[-1]
    M, N = -(-m // FP8_BLOCK), -(-n // FP8_BLOCK)
    pad = np.zeros(x.shape[:-2] + (M * FP8_BLOCK, N * FP8_BLOCK), np.float32)
    pad[..., :m, :n] = x
    blocks = pad.reshape(x.shape[:-2] + (M, FP8_BLOCK, N, FP8_BLOCK)).max(axis=(-3, -1))
    return np.maximum(blocks, np.float32(1e-4))


def rmsnorm(x, w, eps):
    v = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(v + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def rope_angles(T, dim, theta):
    inv = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    ang = np.outer(np.arange(T, dtype=np.float64), inv)  # [T, dim/2]
    return np.cos(ang), np.sin(ang)


def rope_neox(x, theta):
    """Rotary embedding, halves rotated (Llama, Qwen): x [T, heads, dim]."""
    T, _, d = x.shape
    cos, sin = rope_angles(T, d, theta)
    cos, sin = cos[:, None, :], sin[:, None, :]
    a, b = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def rope_pairs(x, theta):
    """Rotary embedding on interleaved pairs (GPT-J style; DeepSeek's MLA): x [T, heads, dim]."""
    T, _, d = x.shape
    cos, sin = rope_angles(T, d, theta)
    cos, sin = cos[:, None, :], sin[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = b * cos + a * sin
    return out


def causal_attention(q, k, v, scale, group=1, sinks=None, window=0):
    """Softmax attention of every position over itself and the earlier ones: q [T, H, d],
    k [T, Hk, d], v [T, Hk, dv]; query head h reads kv head h // group. sinks (per head) add
    a logit to the softmax's denominator only; window > 0 sees only that many positions."""
    T, H, _ = q.shape
    kk = np.repeat(k, group, axis=1)
    vv = np.repeat(v, group, axis=1)
    s = np.einsum("thd,shd->hts", q, kk) * scale
    mask = np.tril(np.ones((T, T), bool))
    if window:
        mask &= ~np.tril(np.ones((T, T), bool), -window)
    s = np.where(mask[None], s, -np.inf)
    if sinks is not None:
        m = np.maximum(np.max(s, axis=-1, keepdims=True), sinks[:, None, None])
        e = np.exp(s - m)
        p = e / (np.sum(e, axis=-1, keepdims=True) + np.exp(sinks[:, None, None] - m))
    else:
        p = softmax(s)
    return np.einsum("hts,shd->thd", p, vv).reshape(T, -1)


def cosine(a, b):
    a, b = np.ravel(a), np.ravel(b)
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0 or not np.isfinite(na) or not np.isfinite(nb):
        return 0.0
    return float(np.dot(a, b) / (na * nb))
