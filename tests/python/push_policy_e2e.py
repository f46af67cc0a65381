#!/usr/bin/env python3
"""push_policy_e2e.py — Trainer(push_policy=...) and push.result()'s PushResult through the
Python package, with real processes: a wb-controller, two trainer processes (FSDP 2, shard(0))
holding halves of a BF16 embedding and a norm in numpy arrays, one rollout process holding both
whole. The rollout's hook holds version 1 in flight until every trainer says (a file each) that
it pushed what it pushes behind it, so the order of events is fixed, not timed:

- latest (the default): the trainers push 2..20 in a tight loop behind version 1; 2..19 come
  back skipped (skipped_by the next version, never an error) on both ranks, version 20's result
  lists them, carries this rank's bytes and stage times, and the rollout ends with version 20's
  bytes (checked element by element against values computed here), its hook having seen 1 and
  20 only. Run with both ranks pushing at once, and with rank 1 pushing only after rank 0
  pushed past every version.
- queue: 1..5, each pushed while the one before is in flight; every one is transferred, in
  order, each checked byte for byte by the hook.
- a push_policy that is neither is refused before anything is opened.

Usage: push_policy_e2e.py   (the harness: WB_BIN names the programs' directory)
Prints harness lines and the tally "N passed, N failed, N skipped".
"""

import os
import random
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

import numpy as np  # noqa: E402

import weightbridge as wb  # noqa: E402

ROWS, COLS, NTRAINERS = 64, 32, 2
NAMES = ("model.embed_tokens.weight", "model.norm.weight")
SHAPES = ((ROWS, COLS), (COLS,))
LATEST_LAST, QUEUE_LAST = 20, 5
TOKEN = os.environ.setdefault("WB_PUSH_E2E_TOKEN", "push-policy-%d" % random.randrange(1 << 30))
BIN = os.environ.get("WB_BIN", os.path.join(ROOT, "build/bin"))


def value(v, t, n):
    """The BF16 bits of elements 0..n-1 (row-major, global) of tensor t at version v."""
    i = np.arange(n, dtype=np.uint64)
    return (0x3C00 + ((v * 131 + t * 17 + i * 7) & 0x3FF)).astype(np.uint16)


def box(t, rank):
    """(offset, local shape) of tensor t that trainer `rank` holds: rows split in two."""
    shape = SHAPES[t]
    n = shape[0] // NTRAINERS
    return (rank * n,) + (0,) * (len(shape) - 1), (n,) + shape[1:]


def fill(arrays, rank, v):
    for t, name in enumerate(NAMES):
        off, local = box(t, rank)
        row = COLS if t == 0 else 1
        n = int(np.prod(local))
        arrays[name].reshape(-1)[:] = value(v, t, off[0] * row + n)[off[0] * row:]


def mark(tmp, what, rank):
    open(os.path.join(tmp, f"{what}.{rank}"), "w").close()


def await_mark(tmp, what, rank):
    path = os.path.join(tmp, f"{what}.{rank}")
    for _ in range(30000):  # only ends a hang
        if os.path.exists(path):
            return
        time.sleep(0.01)
    raise AssertionError(f"no {path} after 300 s")


# ---------------------------------------------------------------- the processes


def run_trainer(rank, url, tmp, mode):
    arrays = {name: np.zeros(box(t, rank)[1], dtype=np.uint16) for t, name in enumerate(NAMES)}
    tensors = {name: wb.Shard(arrays[name], SHAPES[t], box(t, rank)[0]) for t, name in enumerate(NAMES)}
    policy = "queue" if mode == "queue" else "latest"
    tr = wb.Trainer(url, tensors=tensors, rank=rank, token=TOKEN, dtypes={n: "bf16" for n in NAMES},
                    tx_domain="lo", timeout=60, push_policy=policy)
    rank_bytes = (ROWS * COLS + COLS) // NTRAINERS * 2
    if mode == "queue":
        pushes = []
        for v in range(1, QUEUE_LAST + 1):
            fill(arrays, rank, v)
            pushes.append(tr.push(v))
            if v == 2:
                mark(tmp, "pushed", rank)
            pushes[-1].sources(60)
        for v, p in enumerate(pushes, 1):
            r = p.result(60)
            assert (r.version, r.skipped, r.skipped_by, r.nskipped, r.skipped_versions, r.bytes) == \
                (v, False, None, 0, [], rank_bytes), r
        assert tr.version == QUEUE_LAST
        tr.close()
        return
    fill(arrays, rank, 1)
    first = tr.push(1)
    first.sources(60)
    if mode == "ordered" and rank == 1:
        await_mark(tmp, "pushed", 0)
    fill(arrays, rank, LATEST_LAST)  # not changed again: nothing pushed after reads it early
    pushes = {v: tr.push(v) for v in range(2, LATEST_LAST + 1)}
    for v in range(2, LATEST_LAST):  # decided while version 1 is in flight
        pushes[v].sources(60)  # at once: a skipped version never reads the tensors
        r = pushes[v].result(60)
        assert (r.version, r.skipped, r.skipped_by, r.bytes, r.nskipped) == (v, True, v + 1, 0, 0), r
        assert repr(r) == f"PushResult(version={v}, skipped_by={v + 1})", repr(r)
    mark(tmp, "pushed", rank)
    r1 = first.result(60)
    assert (r1.skipped, r1.nskipped, r1.bytes) == (False, 0, rank_bytes), r1
    last = pushes[LATEST_LAST]
    last.sources(60)
    r = last.result(60)
    assert (r.version, r.skipped, r.skipped_by) == (LATEST_LAST, False, None), r
    assert r.nskipped == LATEST_LAST - 2 and r.skipped_versions == list(range(2, LATEST_LAST)), r
    assert r.bytes == rank_bytes and r.writes > 0, r
    assert sorted(r.stages) == ["barrier", "fuse", "gather", "h2d", "quant", "write"], r.stages
    assert r.stages["write"] > 0 and r.transfer_s > 0 and r.total_s >= r.wait_s >= 0, r
    assert last.result() is r  # kept: asking again does not wait
    assert tr.version == LATEST_LAST
    print(f"trainer {rank}: {r!r}", flush=True)
    tr.close()


def run_rollout(url, tmp, mode):
    bufs = {name: np.zeros(SHAPES[t], dtype=np.uint16) for t, name in enumerate(NAMES)}
    seen = []

    def exact(v):
        for t, name in enumerate(NAMES):
            want = value(v, t, bufs[name].size)
            bad = np.nonzero(bufs[name].reshape(-1) != want)[0]
            if bad.size:
                i = int(bad[0])
                raise ValueError(f"{name}[{i}] = {int(bufs[name].reshape(-1)[i]):#06x}, version {v} "
                                 f"wrote {int(want[i]):#06x}")

    def hook(v):
        if v == 1:  # held in flight until every trainer pushed what goes behind it
            for r in range(NTRAINERS):
                await_mark(tmp, "pushed", r)
        exact(v)
        seen.append(v)

    ro = wb.Rollout(url, bufs, rank=0, token=TOKEN, dtypes={n: "bf16" for n in NAMES}, hook=hook,
                    tx_domain="lo", timeout=60)
    last = QUEUE_LAST if mode == "queue" else LATEST_LAST
    assert ro.wait(last, 120) == last
    exact(last)
    want = list(range(1, QUEUE_LAST + 1)) if mode == "queue" else [1, LATEST_LAST]
    assert seen == want, seen
    ro.close()
    print(f"rollout: versions {seen} checked byte for byte", flush=True)


# ---------------------------------------------------------------- the harness


def write_job(tmp, port):
    inv = "".join(f"{n}: {{dtype: bf16, shape: {list(s)}}}\n" for n, s in zip(NAMES, SHAPES))
    files = {
        "trainer_inv.yaml": inv,
        "rollout_inv.yaml": inv,
        "trainer.yaml": "world_size: 2\ngpus_per_node: 2\nmesh:\n  - {name: fsdp, size: 2}\n"
                        "placements:\n  - match: \"*\"\n    place: {fsdp: shard(0)}\n",
        "rollout.yaml": "replicas: 1\ngpus_per_replica: 1\ntp: 1\ngpus_per_node: 1\n",
        "job.yaml": f"name: push-policy\nlisten: tcp://127.0.0.1:{port}\ntoken: {TOKEN}\n"
                    f"model:\n  rules: {ROOT}/configs/models/qwen3_moe.yaml\n"
                    f"  trainer_inventory: {tmp}/trainer_inv.yaml\n"
                    f"  rollout_inventory: {tmp}/rollout_inv.yaml\n"
                    f"trainer_layout: {tmp}/trainer.yaml\nrollout_layout: {tmp}/rollout.yaml\n"
                    "mode: auto\nmem_cap: 1MiB\nprovider: tcp\nheartbeat: 200ms\n",
    }
    for name, text in files.items():
        with open(os.path.join(tmp, name), "w") as f:
            f.write(text)
    return os.path.join(tmp, "job.yaml")


def spawn(*args):
    return subprocess.Popen([sys.executable, __file__, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def run_job(parent, mode):
    tmp = tempfile.mkdtemp(prefix=f"{mode}.", dir=parent)
    port = 20000 + random.randrange(12000)  # below the ephemeral ports
    url = f"tcp://127.0.0.1:{port}"
    job = write_job(tmp, port)
    log = open(os.path.join(tmp, "controller.log"), "w")
    ctl = subprocess.Popen([os.path.join(BIN, "wb-controller"), "--config", job], stdout=log,
                           stderr=subprocess.STDOUT)
    procs = [("rollout", spawn("rollout", url, tmp, mode))]
    procs += [(f"trainer {r}", spawn("trainer", r, url, tmp, mode)) for r in range(NTRAINERS)]
    try:
        for who, p in procs:
            out, _ = p.communicate(timeout=300)
            if p.returncode != 0:
                log.flush()
                raise AssertionError(f"{who} exited {p.returncode}:\n{out.decode()}\ncontroller log:\n"
                                     + open(os.path.join(tmp, "controller.log")).read())
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.kill()
        subprocess.run([os.path.join(BIN, "wb-ctl"), "-c", url, "--timeout", "10s", "shutdown"],
                       env=dict(os.environ, WB_TOKEN=TOKEN), capture_output=True, timeout=30)
        try:
            ctl.wait(10)
        except subprocess.TimeoutExpired:
            ctl.kill()
            ctl.wait()
        log.close()


def test_bad_policy(_tmp):
    try:
        wb.Trainer("tcp://127.0.0.1:1", tensors={}, rank=0, token="t", push_policy="newest")
        raise AssertionError("push_policy 'newest' accepted")
    except ValueError as e:
        assert str(e) == "push_policy: expected 'latest' or 'queue', not 'newest'", str(e)


def main():
    tests = [("latest_together", lambda tmp: run_job(tmp, "together")),
             ("latest_ordered", lambda tmp: run_job(tmp, "ordered")),
             ("queue", lambda tmp: run_job(tmp, "queue")),
             ("bad_policy", test_bad_policy)]
    passed = failed = 0
    only = sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="wb-py-push.") as tmp:
        for name, fn in tests:
            if only and name not in only:
                continue
            print(f"python_push {name} ...", flush=True)
            t0 = time.time()
            try:
                fn(tmp)
                print(f"ok python_push {name} ({(time.time() - t0) * 1000:.0f} ms)", flush=True)
                passed += 1
            except Exception:  # noqa: BLE001 - a test's failure is reported and counted
                print("    " + traceback.format_exc().replace("\n", "\n    "))
                print(f"FAIL python_push {name} ({(time.time() - t0) * 1000:.0f} ms)", flush=True)
                failed += 1
    print(f"{passed} passed, {failed} failed, 0 skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "trainer":
        run_trainer(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
    elif len(sys.argv) > 1 and sys.argv[1] == "rollout":
        run_rollout(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(main())
