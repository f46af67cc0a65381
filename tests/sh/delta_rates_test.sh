#!/usr/bin/env bash
# delta_rates_test.sh — scripts/gpu/delta_rates.py on the CPU (issue #34's change-rate table; the
# GPU run is the lead's): the FP8 encoder and DeepGEMM's block quantization on values worked out
# by hand, the comparison on planted changes counted exactly (sign flips: FP8 values, row chunks,
# blocks and BF16 elements but no scale; a block doubled: its scale and 16384 BF16 elements but
# no FP8 value), and a real run — a small torch model with Qwen3's parameter shapes (transformers
# is not installed here: the script says so), AdamW, LM loss on random tokens, 2 steps at lr 1e-6
# and 1e-3 — whose totals are the model's 2-D elements and blocks, exactly, and whose changes
# grow with the learning rate. Needs a python3 with torch (Debian's python3-torch, 1.13;
# scripts/deps.sh installs it). Run from the repository root (make test does). Prints the tally.
py=""
for p in /usr/bin/python3 python3; do
    if command -v "$p" >/dev/null && "$p" -c 'import torch' 2>/dev/null; then
        py=$p
        break
    fi
done
if [ -z "$py" ]; then
    echo "skipped: no python3 with torch (Debian's python3-torch; scripts/deps.sh installs it)"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
unset LD_PRELOAD
pass=0 fail=0
check() { # name, command...
    local name=$1
    shift
    if out=$("$@" 2>&1); then
        echo "ok $name"
        pass=$((pass + 1))
    else
        printf '%s\n' "$out" | tail -n 30
        echo "FAIL $name"
        fail=$((fail + 1))
    fi
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cat >"$tmp/units.py" <<'PY'
import importlib.util, sys
import torch
spec = importlib.util.spec_from_file_location("delta_rates", "scripts/gpu/delta_rates.py")
dr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dr)
what = sys.argv[1]

if what == "encoder":
    # value -> e4m3fn code: the largest finite, signs, the smallest subnormal, ties to even
    cases = [(448.0, 0x7E), (-448.0, 0xFE), (0.0, 0x00), (2.0 ** -9, 0x01), (2.0 ** -10, 0x00),
             (3 * 2.0 ** -10, 0x02), (1.0, 0x38), (1.0625, 0x38), (1.1875, 0x3A), (240.0, 0x77),
             (-1.5, 0xBC), (0.75, 0x34)]
    x = torch.tensor([v for v, _ in cases], dtype=torch.float32)
    got = dr.to_e4m3_bits(x).tolist()
    want = [c for _, c in cases]
    assert got == want, (got, want)

if what == "quantizer":
    # 130 x 129 BF16: blocks (0,0) (0,1) (1,0) (1,1) with amax 2, 1, 0.5 and 0 (clamped to 1e-4)
    x = torch.zeros(130, 129)
    x[:128, :128] = 1.0
    x[0, 0] = 2.0
    x[:128, 128] = -1.0
    x[128:, :128] = 0.25
    x[128, 0] = 0.5
    q, s = dr.per_block_cast_to_fp8(x.to(torch.bfloat16))
    assert q.shape == (130, 129) and s.shape == (2, 2), (q.shape, s.shape)
    # 1.0 * 448/2 = 224 (0x76), 2 * 224 = 448 (0x7e); -1 * 448 = -448 (0xfe); 0.25 * 896 = 224
    assert int(q[0, 0]) == 0x7E and int(q[5, 7]) == 0x76 and int(q[3, 128]) == 0xFE
    assert int(q[129, 0]) == 0x76 and int(q[128, 0]) == 0x7E and int(q[129, 128]) == 0x00
    want = torch.tensor([[2, 1], [0.5, 1e-4]], dtype=torch.float32) / 448.0
    assert torch.equal(s, want), (s, want)

if what == "changes":
    g = torch.Generator().manual_seed(7)
    w = torch.rand(300, 260, generator=g) * 0.5 + 0.5  # in [0.5, 1): no FP8 value is 0
    class M(torch.nn.Module):
        def __init__(self, t):
            super().__init__()
            self.w = torch.nn.Parameter(t.clone())
    old = dr.snapshot(M(w))
    v = w.clone()
    for r, c in [(0, 0), (5, 200), (5, 201), (299, 259)]:
        v[r, c] = -v[r, c]  # a sign flip: same |x|, same amax
    v[128:256, 0:128] *= 2  # a power of two: the same FP8 bytes, another scale
    got = dr.changes(old, dr.snapshot(M(v)))
    want = {"fp8": [4, 78000], "chunks": [3, 900], "blocks": [3, 9], "scales": [1, 9],
            "bf16": [4 + 128 * 128, 78000]}
    assert got == want, (got, want)
PY
for u in encoder quantizer changes; do
    check "$u" "$py" "$tmp/units.py" "$u"
done

# A real run on the CPU: totals exact (2-D weights of the tiny shape: 1,703,936 elements in 104
# blocks of 128x128; 300 x ... row chunks), changes growing with the learning rate.
cat >"$tmp/run.py" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["model"] == "torch", d["model"]
st = d["steps"]
assert [(s["lr"], s["step"]) for s in st] == [(1e-6, 1), (1e-6, 2), (1e-3, 1), (1e-3, 2)]
for s in st:
    c = s["counts"]
    assert c["fp8"][1] == 1703936 and c["bf16"][1] == 1703936, c
    assert c["blocks"][1] == 104 and c["scales"][1] == 104, c
    assert c["chunks"][1] == 2 * 1024 * 2 + 2 * (256 * 2 + 128 * 2 * 2 + 256 * 2 + 512 * 2 * 2 + 256 * 4), c
    for k, (n, t) in c.items():
        assert 0 <= n <= t, (k, n, t)
lo, hi = st[1]["counts"], st[3]["counts"]
for k in ("fp8", "bf16", "chunks"):
    assert hi[k][0] > lo[k][0] > 0, (k, lo[k], hi[k])
PY
run() {
    "$py" scripts/gpu/delta_rates.py --device cpu --tiny --steps 2 --lrs 1e-6,1e-3 --seq 32 \
        --json "$tmp/rates.json" >"$tmp/out" 2>&1 || { cat "$tmp/out"; return 1; }
    cat "$tmp/out"
    grep -q '^delta_rates: transformers (with Qwen3) is not installed: using a torch module' \
        "$tmp/out" || python3 -c 'import transformers' 2>/dev/null || return 1
    grep -q '^| 1e-06 (steps 1–2) | ' "$tmp/out" && grep -q '^| 0.001 (steps 1–2) | ' "$tmp/out" &&
        "$py" "$tmp/run.py" "$tmp/rates.json"
}
check cpu_run run
"$py" scripts/gpu/delta_rates.py --steps 0 >"$tmp/usage" 2>&1
rc=$?
check bad_steps_refused grep -q -- '--steps and --batch must be >= 1' "$tmp/usage"
[ $rc -eq 2 ] || { echo "FAIL bad_steps_exit: exit $rc, expected 2"; fail=$((fail + 1)); }
echo "$pass passed, $fail failed, 0 skipped"
[ "$fail" -eq 0 ]
