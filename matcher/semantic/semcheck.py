#!/usr/bin/env python3
"""semcheck.py -- the semantic check of a model-family file (wb-match --check-semantics runs it).

Shapes cannot tell k from v, gate from up, or a square matrix from its transpose: a family
file that fuses [q, v, k] matches, plans and transfers, and every update writes wrong weights.
This check runs the model. From the family file and a real config.json it makes a tiny model of
the same structure (tiny.py), gives every tensor of the family's trainer inventory random
values, moves them with weightbridge's own programs into a rollout of TP (and EP) ranks
(pipeline.py: matcher, planner, the readers' executor, libfabric writes), then runs one forward
(forward.py) twice: over the trainer's tensors read as Hugging Face's model reads them, and
over each rollout rank's local tensors read as vLLM's model class reads them (arch.py). It
reports the first layer and tensor whose weights or output differ.

Thresholds: a BF16 rollout must hold the trainer's values bit for bit where vLLM reads them,
and every op's output and the logits agree to a cosine of 0.999 (they differ only by the order
of float64 additions: measured 1.000000). An FP8 rollout's values must lie within E4M3's
rounding of the trainer's (|dequantized - trainer| <= 2^-4 |trainer| + 2^-10 scale), each
block's scale be its block's amax / 448 (to 1e-6), every op's output -- computed with the
rollout's weights from the trainer run's inputs of that op -- agree to 0.998 (measured
0.99955-0.99964 on the shipped families), and the logits of the rollout's own forward, where
FP8 rounding adds up over the layers, to 0.97 (measured 0.9891-0.9978).

A trainer naming other than hf (--naming megatron, with --var mesh_tp=N for its TP size): the
random values are the Hugging Face model's, and the checkpoint holds them as that naming's
framework holds them (convert.py, written from the frameworks' conventions, not from the
family's rules); the forward over the trainer's tensors is still Hugging Face's.

Usage: semcheck.py --bin DIR --family FILE --config CONFIG.json [--var NAME=VALUE ...]
                   [--naming NAME] [--dtype bf16|fp8|both] [--tp N] [--ep N] [--seed N]
                   [--keep DIR] [--timeout SECONDS]
Exit status: 0 the check passed, 1 it failed (the first difference is named), 2 usage.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from arch import ARCHS, MODEL_TYPES, VLLM_CLASS, HFWeights, Missing, Model, VllmWeights  # noqa: E402
from forward import Run, compare, forward  # noqa: E402
from numerics import cosine  # noqa: E402
from convert import ConvertError, convert  # noqa: E402
from pipeline import Failed, broadcast, inventories  # noqa: E402
from tiny import FP8_QC, describe, random_tensor, shrink, write_safetensors  # noqa: E402

BOUNDS = {"bf16": {"act": 0.999, "logits": 0.999}, "fp8": {"act": 0.998, "logits": 0.97}}
TOKENS = 8
# trainer tensors no forward reads, by design: rotary tables, and the MTP layer's copy of the
# embedding (vLLM's draft shares the target's)
UNREAD_OK = ("rotary_emb.inv_freq",)


def say(*a):
    print(*a, flush=True)


def trainer_unread(inv, read, mtp_from):
    out = []
    for n in inv:
        if n in read or n.endswith(UNREAD_OK):
            continue
        if n.startswith("model.layers.") and n.endswith(".embed_tokens.weight"):
            if int(n.split(".")[2]) >= mtp_from:
                continue
        out.append(n)
    return out


def mesh_tp(vars_):
    """--var mesh_tp=N (the trainer's TP size in the Megatron namings), else 1."""
    n = 1
    for v in vars_:
        for item in v.split(","):
            k, _, x = item.partition("=")
            if k.strip() == "mesh_tp":
                n = int(x)
    return n


def check_one(a, arch, cfg, dtype, tmp):
    """One rollout dtype: (passed, lines, first difference or None)."""
    lines = []
    tiny = shrink(cfg, arch, a.tp)
    if dtype == "fp8":
        tiny["quantization_config"] = FP8_QC
    d = os.path.join(tmp, dtype)
    os.makedirs(os.path.join(d, "ckpt"))
    config = os.path.join(d, "config.json")
    with open(config, "w") as f:
        json.dump(tiny, f, indent=1)
    other = a.naming not in (None, "hf")
    tinv, rinv = inventories(a.bin, a.family, config, a.var, d, a.timeout, "hf" if other else None)
    if dtype == "fp8" and not any(v[0] == "fp8_e4m3" for v in rinv.values()):
        return None, ["fp8 rollout: skipped: the family makes no FP8 rollout tensor (no quant.fp8 rule matches)"], None
    rng = np.random.default_rng(a.seed)
    bits, vals = {}, {}
    for name, (dt, shape) in tinv.items():
        b, v = random_tensor(rng, name, dt, shape)
        bits[name] = (dt, b)
        vals[name] = (dt, v)
    if other:  # the same values as the naming's framework holds them
        xinv, rinv = inventories(a.bin, a.family, config, a.var, d, a.timeout, a.naming)
        try:
            bits = convert(a.naming, bits, tiny, mesh_tp(a.var))
        except ConvertError as e:
            return False, lines + ["  FAIL %s" % e], str(e)
        have = {n: (dt, list(b.shape)) for n, (dt, b) in bits.items()}
        want = {n: (dt, list(sh)) for n, (dt, sh) in xinv.items()}
        if have != want:
            diff = [n for n in sorted(set(have) | set(want)) if have.get(n) != want.get(n)]
            msg = ("the family's %s trainer inventory differs from the %s checkpoint the check writes at %d "
                   "tensor(s): %s" % (a.naming, a.naming, len(diff), "; ".join(
                       "%s: family %s, checkpoint %s" % (n, want.get(n), have.get(n)) for n in diff[:3])))
            return False, lines + ["  FAIL " + msg], msg
        lines.append("%s rollout: the checkpoint in the %s naming (mesh_tp %d): %d tensors from the %d Hugging "
                     "Face ones" % (dtype, a.naming, mesh_tp(a.var), len(bits), len(tinv)))
    write_safetensors(os.path.join(d, "ckpt", "model.safetensors"), bits)
    locs = broadcast(a.bin, a.family, config, a.var, list(rinv), a.tp, a.ep, d, a.timeout, lambda s: None,
                     a.naming)
    nbytes = sum(len(b) for loc in locs for b in loc.values())
    lines.append("%s rollout, tp %d%s: %d trainer tensors -> %d rollout tensors, matched, planned and broadcast by 2 "
                 "readers into %d rollout ranks (%d bytes)" % (dtype, a.tp, ", ep %d" % a.ep if a.ep > 1 else "",
                                                              len(bits), len(rinv), a.tp, nbytes))
    if arch not in ARCHS:
        msg = "the check has no forward for %s yet (it knows %s)" % (arch, ", ".join(ARCHS))
        return False, lines + ["  FAIL " + msg], msg
    m = Model(tiny, arch)
    mtp = m.mtp if arch == "deepseek_v3" and ("model.layers.%d.eh_proj.weight" % m.L) in tinv else 0
    ids = np.random.default_rng(a.seed + 1).integers(0, m.V, TOKENS)
    hf = Run(HFWeights(m, vals), m)
    vl_w = VllmWeights(m, locs, rinv, a.tp, a.ep, dtype == "fp8")
    try:
        hf_logits = forward(hf, ids, mtp)
        tf = Run(vl_w, m, teacher=hf)  # every op from the trainer run's inputs: where a difference starts
        forward(tf, ids, mtp, routes=hf.routes)
        free = Run(vl_w, m)  # the rollout's own forward, tokens to logits
        v_logits = forward(free, ids, mtp, routes=hf.routes)
    except Missing as e:
        return False, lines + ["  FAIL %s" % e], str(e)
    bounds = BOUNDS[dtype]
    found, low = compare(hf, tf, bounds, m.L)
    nw = sum(1 for k, _ in tf.events if k == "w")
    na = sum(1 for k, _ in tf.events if k == "a")
    problems = []
    unread_r = sorted(n for n in rinv if n not in vl_w.read)
    if unread_r:
        problems.append("the family's rollout holds %d tensor(s) vLLM's %s does not read: %s"
                        % (len(unread_r), VLLM_CLASS[arch], ", ".join(unread_r[:4]) + (" ..." if len(unread_r) > 4 else "")))
    unread_t = trainer_unread(tinv, hf.W.read, m.L)
    if unread_t:
        problems.append("the family's trainer holds %d tensor(s) the Hugging Face model does not read: %s"
                        % (len(unread_t), ", ".join(unread_t[:4]) + (" ..." if len(unread_t) > 4 else "")))
    wfound = [f for f in found if f[2]]
    if not wfound:
        lines.append("  weights: %d logical weights read from %d rollout tensors as vLLM's %s reads them: %s"
                     % (nw, len(vl_w.read), VLLM_CLASS[arch],
                        "every value equal to the trainer's" if dtype == "bf16" else
                        "every value within E4M3 rounding of the trainer's, every block scale its amax / 448"))
    lines.append("  activations: %d op outputs compared, lowest cosine %.6f (%s), bound %g"
                 % (na, low[0], low[1], bounds["act"]))
    ok = not found and not problems
    for name, hl, vlg in [("logits", hf_logits[0], v_logits[0])] + [
            ("MTP layer %d logits" % (m.L + i), hf_logits[1 + i], v_logits[1 + i]) for i in range(mtp)]:
        c = cosine(hl, vlg)
        top = int(np.sum(np.argmax(hl, -1) == np.argmax(vlg, -1)))
        good = c >= bounds["logits"]
        ok = ok and good
        lines.append("  %s: cosine %.6f, bound %g; the same top token at %d of %d positions%s"
                     % (name, c, bounds["logits"], top, TOKENS, "" if good else "  FAIL"))
        if not good:
            found.append((name, "cosine %.6f below %g" % (c, bounds["logits"]), ""))
    for lab, short, detail in found[:12]:
        lines.append("  FAIL %s: %s%s" % (lab, short, ": " + detail if detail else ""))
    if len(found) > 12:
        lines.append("  ... and %d more" % (len(found) - 12))
    for p in problems:
        lines.append("  FAIL %s" % p)
    first = None
    if found:
        first = "%s: %s" % found[0][:2]
    elif problems:
        first = problems[0]
    return ok, lines, first


def main():
    ap = argparse.ArgumentParser(prog="wb-match --check-semantics", description=__doc__.split("\n\n")[1])
    ap.add_argument("--bin", required=True, help="directory of wb-match, wb-broadcast and wb-agent")
    ap.add_argument("--family", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--var", action="append", default=[])
    ap.add_argument("--naming", help="the trainer naming (one of the family's namings; default its first)")
    ap.add_argument("--dtype", choices=("bf16", "fp8", "both"), default="both")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", help="keep the tiny model, the job and the logs in this directory")
    ap.add_argument("--timeout", type=int, default=120, help="seconds for each program (default 120)")
    a = ap.parse_args()
    if not 1 <= a.tp <= 8 or a.ep not in (1, a.tp):
        say("wb-match: --check-semantics: --tp %d --ep %d: tp 1..8, and ep 1 or the tp (vLLM's expert "
            "parallelism spans the replica)" % (a.tp, a.ep))
        return 2
    try:
        with open(a.config) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        say("wb-match: --check-semantics: %s: %s" % (a.config, e))
        return 1
    mt = cfg.get("model_type") if isinstance(cfg, dict) else None
    arch = MODEL_TYPES.get(mt)
    if arch is None:
        say("wb-match: --check-semantics: %s: model_type %r: the check knows %s"
            % (a.config, mt, ", ".join(sorted(MODEL_TYPES))))
        return 1
    tmp = a.keep or tempfile.mkdtemp(prefix="wb-semantic.")
    if a.keep:
        os.makedirs(tmp, exist_ok=True)
    family = os.path.basename(a.family)
    say("semantic check of %s with a tiny %s (%s; %s)" % (family, os.path.basename(a.config), arch,
                                                        describe(shrink(cfg, arch, a.tp), arch)))
    first = None
    passed = True
    try:
        for dtype in (("bf16", "fp8") if a.dtype == "both" else (a.dtype,)):
            try:
                ok, lines, f = check_one(a, arch, cfg, dtype, tmp)
            except Failed as e:
                ok, lines, f = False, ["%s rollout: %s" % (dtype, str(e).replace("\n", "\n  "))], \
                    str(e).split("\n")[-1].strip()
            for ln in lines:
                say(ln)
            if ok is False:
                passed = False
                first = first or "%s rollout: %s" % (dtype, f)
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    if passed:
        say("semantic check passed")
        return 0
    say("semantic check failed: %s" % first)
    return 1


if __name__ == "__main__":
    sys.exit(main())
