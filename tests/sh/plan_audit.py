#!/usr/bin/env python3
"""plan_audit.py -- audits a plan written by `wb-plan --json FILE --tables`, on its own.

It reads only the JSON (Python 3 standard library; none of the planner's code) and checks:
  shards   every placed trainer tensor's shard boxes lie in its shape and tile it
  sources  every op and write of every routing table reads bytes its rank holds: its own
           shard (an owner listed for that tensor, within the shard's bytes), or TMP bytes an
           earlier op of the same task produced (H2D of its shard, a gather whose members are
           the tensor's owners with their shard boxes, a copy, cast or quantization)
  amax     every amax exchange has exactly one mirror: the same tag on the peer it names,
           naming this rank back, for the same tensor and blocks, with the inboxes crossed
  sizes    a task's write_bytes is the sum of its writes, a table's send_bytes the sum of its
           tasks', the summary's per-rank and total bytes agree, a local tensor's bytes are
           its shape times its dtype size, data tags are tensor index + 1, and every receive
           list's expected bytes and writes per tag are what the tables send it
  coverage every byte a rollout rank must receive is written exactly once: the writes to
           each local tensor tile [0, written) without gap or overlap
Prints "ok <check>" or "FAIL <check>" (with the first problems) per check, then the tally
"N passed, N failed, N skipped"; exits 1 when a check failed.

The file is read as a stream (one table at a time), so memory stays well below the file's
size; per rollout rank it keeps (tensor, offset, length) of the writes it receives.

Usage: plan_audit.py PLAN.json
"""
import array
import json
import sys
from bisect import bisect_right
from itertools import compress, repeat
from math import prod
from operator import add, eq, itemgetter, mul, ne

SHIFT = 1 << 48  # (tensor, offset) as one sort key: tensor * SHIFT + offset


def add1(x):
    return x + 1

DTYPE_SIZE = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8_e4m3": 1, "i32": 4, "i64": 8}
KEEP = 10  # problems listed per check


class Stream:
    """A JSON document read value by value: the top-level object's keys, and for the large
    arrays their elements one at a time."""

    def __init__(self, f):
        self.f = f
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.dec = json.JSONDecoder()

    def _more(self):
        chunk = self.f.read(1 << 23)
        if not chunk:
            self.eof = True
            return False
        self.buf = self.buf[self.pos:] + chunk
        self.pos = 0
        return True

    def _ws(self):
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < len(self.buf) or not self._more():
                return

    def peek(self):
        self._ws()
        return self.buf[self.pos] if self.pos < len(self.buf) else ""

    def expect(self, c):
        if self.peek() != c:
            raise ValueError("expected %r at offset %d, found %r" % (c, self.pos, self.peek()))
        self.pos += 1

    def value(self):
        self._ws()
        while True:
            try:
                v, end = self.dec.raw_decode(self.buf, self.pos)
                # a number may continue in the next chunk
                if end == len(self.buf) and not self.eof and isinstance(v, (int, float)):
                    raise ValueError("may continue")
                self.pos = end
                return v
            except ValueError:
                if self.eof or not self._more():
                    raise

    def members(self):
        """(key, value or None) for each member of the top-level object; for a key whose
        value is an array the caller may stream it with elements() (value None then)."""
        self.expect("{")
        first = True
        while True:
            if self.peek() == "}":
                self.pos += 1
                return
            if not first:
                self.expect(",")
            first = False
            key = self.value()
            self.expect(":")
            yield key

    def elements(self):
        self.expect("[")
        if self.peek() == "]":
            self.pos += 1
            return
        while True:
            yield self.value()
            c = self.peek()
            self.pos += 1
            if c == "]":
                return
            if c != ",":
                raise ValueError("expected , or ] at offset %d" % self.pos)


def owner_box(classes, tensor_entry, rank):
    """The shard box rank holds of a trainer tensor, or None."""
    cls, owners = tensor_entry[3], tensor_entry[4]
    if cls < 0:
        return None
    ranks = owners[0::2]
    try:
        i = ranks.index(rank)
    except ValueError:
        return None
    return classes[cls][owners[2 * i + 1]]


def numel(shape):
    return prod(shape)


def box_numel(box):
    return prod([z - a for a, z in box])


def box_extents(box):
    return [z - a for a, z in box]


class Audit:
    def __init__(self):
        self.problems = {}
        self.counts = {}
        self.amax = {}  # tag -> the exchanges carrying it: (rank, peer, tensor, blocks, inbox, peer inbox)

    def bad(self, check, msg):
        self.counts[check] = self.counts.get(check, 0) + 1
        lst = self.problems.setdefault(check, [])
        if len(lst) < KEEP:
            lst.append(msg)

    def report(self, checks):
        passed = failed = 0
        for c in checks:
            n = self.counts.get(c, 0)
            if n == 0:
                print("ok %s" % c)
                passed += 1
            else:
                for m in self.problems[c]:
                    print("    %s" % m)
                if n > len(self.problems[c]):
                    print("    ... and %d more" % (n - len(self.problems[c])))
                print("FAIL %s (%d problem%s)" % (c, n, "" if n == 1 else "s"))
                failed += 1
        print("%d passed, %d failed, 0 skipped" % (passed, failed))
        return failed == 0


class Ranges:
    """Produced byte ranges of a task's TMP, merged; membership by bisection."""

    def __init__(self):
        self.r = []
        self.starts = None

    def add(self, a, n):
        self.r.append((a, a + n))
        self.starts = None

    def _merge(self):
        m = []
        for x, z in sorted(self.r):
            if m and x <= m[-1][1]:
                if z > m[-1][1]:
                    m[-1][1] = z
            else:
                m.append([x, z])
        self.starts = [x for x, _ in m]
        self.ends = [z for _, z in m]

    def has(self, a, n):
        if self.starts is None:
            # while ops add ranges, what an op reads was mostly produced just before it
            r = self.r
            for k in range(len(r) - 1, max(len(r) - 9, -1), -1):
                if r[k][0] <= a and a + n <= r[k][1]:
                    return True
            self._merge()
        i = bisect_right(self.starts, a) - 1
        return i >= 0 and a + n <= self.ends[i]


def main(path):
    au = Audit()
    checks = ["shards", "sources", "amax", "sizes", "coverage"]
    head = {}
    classes = None
    trainer = []  # [name, dtype, shape, owners {rank: shard box}]
    rollout = []
    ntables = 0
    total_sent = 0
    # per rollout rank: (tensor, offset, length) triples, and per (rank, tag) bytes and writes
    recv = None
    residence = "gpu"
    with open(path, "r", encoding="utf-8") as f:
        st = Stream(f)
        for key in st.members():
            if key == "shard_classes":
                classes = list(st.elements())
                for ci, boxes in enumerate(classes):
                    pass
            elif key == "trainer_tensors":
                for name, dt, shape, cls, owners in st.elements():
                    trainer.append((name, dt, shape, cls, owners))
                check_shards(au, trainer, classes)
            elif key == "rollout_tensors":
                rollout = list(st.elements())
            elif key == "tables":
                nr = head["nrollouts"]
                recv = [(array.array("q"), array.array("q"), array.array("q")) for _ in range(nr)]
                residence = head.get("trainer_layout", {}).get("residence", "gpu")
                for t in st.elements():
                    total_sent += audit_table(au, head, classes, trainer, rollout, t, recv)
                    ntables += 1
            elif key == "receive":
                ng = 0
                for rv in st.elements():
                    audit_receive(au, head, rollout, rv, recv)
                    ng += 1
                if ng != head["nrollouts"]:
                    au.bad("sizes", "%d receive lists for %d rollout GPUs" % (ng, head["nrollouts"]))
            else:
                head[key] = st.value()
    if "format" not in head or head["format"] < 5 or classes is None or recv is None:
        print("FAIL %s: not a plan written with --json --tables (format 5)" % path)
        print("0 passed, 1 failed, 0 skipped")
        return False
    check_amax(au)
    if ntables != head["ntrainers"]:
        au.bad("sizes", "%d tables for %d trainer GPUs" % (ntables, head["ntrainers"]))
    if total_sent != head["stats"]["total_bytes"]:
        au.bad("sizes", "tables send %d bytes, the summary says %d" % (total_sent, head["stats"]["total_bytes"]))
    _ = residence
    return au.report(checks)


def check_shards(au, trainer, classes):
    for ci, boxes in enumerate(classes):
        # a class's shards: disjoint, and (with the shape of any tensor of the class) a tiling
        for i in range(len(boxes)):
            for j in range(i + 1, len(boxes)):
                a, b = boxes[i], boxes[j]
                if box_numel(a) and box_numel(b) and all(
                        max(x[0], y[0]) < min(x[1], y[1]) for x, y in zip(a, b)):
                    au.bad("shards", "shard class %d: shards %d and %d overlap" % (ci, i, j))
    seen = set()
    for name, dt, shape, cls, own in trainer:
        if dt not in DTYPE_SIZE:
            au.bad("sizes", "%s: unknown dtype %r" % (name, dt))
        if cls < 0 or cls in seen:
            continue
        seen.add(cls)
        boxes = classes[cls]
        if any(len(b) != len(shape) or any(a < 0 or z > s or a > z for (a, z), s in zip(b, shape))
               for b in boxes):
            au.bad("shards", "%s: a shard box lies outside its shape %s" % (name, shape))
        if sum(box_numel(b) for b in boxes) != numel(shape):
            au.bad("shards", "%s: its shards hold %d of %d elements" %
                   (name, sum(box_numel(b) for b in boxes), numel(shape)))
    for name, dt, shape, cls, own in trainer:
        if cls >= 0 and not own:
            au.bad("shards", "%s: placed but no owner listed" % name)


def expand_records(au, r, R, tasks):
    """The single writes a table's records stand for (7 numbers a write: a record's last two
    numbers, more and rank_step, make it more + 1 writes to dst_rank + k * rank_step), and the
    tasks with their write ranges in those writes."""
    if len(R) % 9:
        au.bad("sizes", "rank %d: writes hold %d numbers, not 9 a record" % (r, len(R)))
    n = len(R) // 9
    at = [0] * (n + 1)
    W = []
    for i in range(n):
        rec = R[9 * i:9 * i + 9]
        more, step = rec[7], rec[8]
        if more < 0 or (more and step <= 0):
            au.bad("sizes", "rank %d write record %d: fan-out %d with rank step %d" % (r, i, more, step))
            more = 0
        for k in range(more + 1):
            W.extend((rec[0], rec[1], rec[2] + k * step, rec[3], rec[4], rec[5], rec[6]))
        at[i + 1] = at[i] + more + 1
    out = []
    for task in tasks:
        task = list(task)
        w0, nws = task[9], task[10]
        if 0 <= w0 and w0 + nws <= n:
            task[9], task[10] = at[w0], at[w0 + nws] - at[w0]
        out.append(task)
    return W, out


def audit_table(au, head, classes, trainer, rollout, t, recv):
    r = t["rank"]
    boxes, shapes, ops = t["boxes"], t["shapes"], t["ops"]
    W, tasks = expand_records(au, r, t["writes"], t["tasks"])
    nw = len(W) // 7
    nr = head["nrollouts"]
    gpu = t["residence"] == "gpu"
    ext = [box_extents(b) for b in boxes]
    bnum = [prod(e) for e in ext]
    snum = [prod(sh) for sh in shapes]
    mine = {}  # tensor -> (extents, bytes) of this rank's shard, or None

    def shard(tensor):
        v = mine.get(tensor, 0)
        if v == 0:
            b = owner_box(classes, trainer[tensor], r) if 0 <= tensor < len(trainer) else None
            v = None if b is None else (box_extents(b), box_numel(b) * DTYPE_SIZE[trainer[tensor][1]])
            mine[tensor] = v
        return v

    sent = 0
    max_tmp = 0
    next_op = next_w = 0
    last_phase = -1
    for ti, (mp, item, phase, mesh, mode, tmp, wbytes, op0, nops, w0, nws) in enumerate(tasks):
        if op0 != next_op or w0 != next_w:
            au.bad("sizes", "rank %d task %d: ops/writes do not follow the previous task's" % (r, ti))
        next_op, next_w = op0 + nops, w0 + nws
        if phase < last_phase:
            au.bad("sizes", "rank %d task %d: phase %d after phase %d" % (r, ti, phase, last_phase))
        last_phase = phase
        if tmp > max_tmp:
            max_tmp = tmp
        pr = Ranges()
        add, has = pr.add, pr.has

        def readable(v):
            buf, tensor, off, dt, sh = v
            if buf == 1:
                return has(off, snum[sh] * DTYPE_SIZE[dt])
            m = shard(tensor)
            return gpu and m is not None and off == 0 and m[0] == shapes[sh]

        for oi in range(op0, op0 + nops):
            op = ops[oi]
            kind = op[0]
            if kind == "h2d":
                _, tensor, so, n, do = op
                m = shard(tensor)
                ok = m is not None and so + n <= m[1] and do + n <= tmp
                add(do, n)
            elif kind == "quant":
                _, tensor, src, sbox, dst, region, grid, scale_off, amax_off = op
                n = snum[dst[4]]
                g = bnum[grid] * 4
                ok = readable(src) and ext[sbox] == ext[region] and dst[0] == 1 \
                    and dst[3] == "fp8_e4m3" and dst[2] + n <= tmp and scale_off + g <= tmp
                add(dst[2], n)
                add(scale_off, g)
            elif kind == "amax":
                _, tensor, src, sbox, region, blocks, grid, amax_off, peers = op
                ok = readable(src) and len(peers) >= 4
                bl = tuple(map(tuple, boxes[blocks]))
                for i in range(0, len(peers), 4):
                    peer, tag, peer_inbox, inbox = peers[i:i + 4]
                    au.amax.setdefault(tag, []).append((r, peer, tensor, bl, inbox, peer_inbox))
            elif kind == "gather":
                _, tensor, src, dst, mesh_, seq, bytes_in, peers = op
                listed = {}
                for i in range(0, len(peers), 2):
                    listed[peers[i]] = boxes[peers[i + 1]]
                full = trainer[tensor][2]
                n = numel(full) * DTYPE_SIZE[dst[3]]
                ok = r in listed \
                    and all(owner_box(classes, trainer[tensor], k) == b for k, b in listed.items()) \
                    and sum(box_numel(b) for b in listed.values()) == numel(full) \
                    and dst[0] == 1 and shapes[dst[4]] == full \
                    and (box_numel(listed[r]) == 0 or readable(src)) and dst[2] + n <= tmp
                add(dst[2], n)
            elif kind in ("copy", "cast"):
                _, tensor, src, sbox, dst, dbox = op
                se, de = ext[sbox], ext[dbox]
                while len(de) > len(se) and de[0] == 1:  # a stacked destination
                    de = de[1:]
                n = snum[dst[4]] * DTYPE_SIZE[dst[3]]
                ok = readable(src) and se == de and dst[0] == 1 and dst[2] + n <= tmp \
                    and (kind == "cast" or src[3] == dst[3])
                add(dst[2], n)
            else:
                tensor, ok = op[1] if len(op) > 1 else -1, False
            if not ok:
                au.bad("sources", "rank %d op %d (%s of %s) reads bytes the rank does not hold"
                       % (r, oi, kind, trainer[tensor][0] if 0 <= tensor < len(trainer) else tensor))
        # the task's writes, a column at a time
        a, z = 7 * w0, 7 * (w0 + nws)
        srcs, soffs, gs, dts, doffs, lens, tags = (W[a + c:z:7] for c in range(7))
        tb = sum(lens)
        for src, so, ln in set(zip(srcs, soffs, lens)):  # replicas get the same bytes
            if src < 0:
                ok = has(so, ln)
            else:
                m = shard(src)
                ok = gpu and m is not None and so + ln <= m[1]
            if not ok:
                i = next(i for i in range(nws) if (srcs[i], soffs[i], lens[i]) == (src, so, ln))
                au.bad("sources", "rank %d write %d (to rank %d %s +%d) reads bytes it does not hold"
                       % (r, w0 + i, gs[i], rollout[dts[i]][0], doffs[i]))
        if tb != wbytes:
            au.bad("sizes", "rank %d task %d: writes sum to %d bytes, write_bytes says %d" % (r, ti, tb, wbytes))
        sent += tb
    # every write of the table at once, column-wise
    srcs, soffs, gs, dts, doffs, lens, tags = (W[c::7] for c in range(7))
    if not all(map(eq, tags, map(add1, dts))):
        i = next(i for i in range(nw) if tags[i] != dts[i] + 1)
        au.bad("sizes", "rank %d write %d: tag %d for tensor %d" % (r, i, tags[i], dts[i]))
    if nw:
        order = sorted(range(nw), key=gs.__getitem__)
        pick = itemgetter(*order) if nw > 1 else (lambda col: (col[order[0]],))
        G, D, O, L = pick(gs), pick(dts), pick(doffs), pick(lens)
        lo = 0
        while lo < nw:
            g = G[lo]
            hi = bisect_right(G, g, lo)
            if 0 <= g < nr:
                rt, ro, rl = recv[g]
                rt.extend(D[lo:hi])
                ro.extend(O[lo:hi])
                rl.extend(L[lo:hi])
            else:
                au.bad("coverage", "rank %d: %d writes to rollout rank %d of %d" % (r, hi - lo, g, nr))
            lo = hi
    if next_op != len(ops) or next_w != nw:
        au.bad("sizes", "rank %d: tasks cover %d of %d ops and %d of %d writes" % (r, next_op, len(ops), next_w, nw))
    if sent != t["send_bytes"] or sent != head["send_bytes"][r]:
        au.bad("sizes", "rank %d: writes sum to %d bytes, send_bytes says %d (summary %d)"
               % (r, sent, t["send_bytes"], head["send_bytes"][r]))
    if max_tmp != t["max_tmp_bytes"]:
        au.bad("sizes", "rank %d: largest task %d bytes, max_tmp_bytes says %d" % (r, max_tmp, t["max_tmp_bytes"]))
    return sent


def check_amax(au):
    for tag, ex in sorted(au.amax.items()):
        if len(ex) != 2:
            au.bad("amax", "tag %d: %d exchanges carry it, not 2 (ranks %s)" % (tag, len(ex), sorted(e[0] for e in ex)))
            continue
        (r, p, t, b, i, pi), (r2, p2, t2, b2, i2, pi2) = ex
        if (r, p) != (p2, r2) or t != t2 or b != b2 or (i, pi) != (pi2, i2):
            au.bad("amax", "tag %d: ranks %d and %d do not mirror each other" % (tag, r, r2))


def audit_receive(au, head, rollout, rv, recv):
    g = rv["rank"]
    local = {}
    got = {}  # tensor -> [bytes, writes] the tables send this rank (data tag = tensor + 1)
    bad_tensors = set()
    for tensor, dt, shape, nbytes, written in rv["local"]:
        local[tensor] = written
        if nbytes != numel(shape) * DTYPE_SIZE.get(dt, 0):
            au.bad("sizes", "rollout rank %d %s: %d bytes for shape %s of %s"
                   % (g, rollout[tensor][0], nbytes, shape, dt))
        if dt != rollout[tensor][1]:
            au.bad("sizes", "rollout rank %d %s: dtype %s, the tensor's is %s"
                   % (g, rollout[tensor][0], dt, rollout[tensor][1]))
        if written > nbytes:
            au.bad("sizes", "rollout rank %d %s: %d bytes written of %d" % (g, rollout[tensor][0], written, nbytes))
    # the writes received, sorted by (tensor, offset) as one key each; where each key is the
    # previous one plus its length the bytes follow on; every other place must be the end of a
    # tensor's wanted bytes followed by the start of the next tensor
    T, O, L = recv[g]
    recv[g] = None
    n = len(T)
    total = sum(L)
    done = set()
    if n and (max(map(add, O, L)) >= SHIFT or min(O) < 0 or min(L) < 0 or min(T) < 0):
        au.bad("coverage", "rollout rank %d: a write with a negative offset, length or tensor, or "
               "beyond 2^48 bytes" % g)
        return
    K = list(map(add, map(mul, T, repeat(SHIFT)), O))
    order = sorted(range(n), key=K.__getitem__)
    pick = itemgetter(*order) if n > 1 else (lambda col: tuple(col[i] for i in order))
    Ks, Ls = pick(K), pick(L)
    breaks = list(compress(range(n - 1), map(ne, Ks[1:], map(add, Ks, Ls))))
    for s0, s1 in zip([0] + [b + 1 for b in breaks], breaks + [n - 1]) if n else ():
        tensor = Ks[s0] // SHIFT
        want = local.get(tensor)
        name = rollout[tensor][0] if 0 <= tensor < len(rollout) else str(tensor)
        sent = got.setdefault(tensor, [0, 0])
        sent[0] += sum(Ls[s0:s1 + 1])
        sent[1] += s1 + 1 - s0
        if want is None:
            au.bad("coverage", "rollout rank %d %s: written, but not one of its local tensors" % (g, name))
            continue
        if tensor in done or Ks[s0] % SHIFT != 0 or Ks[s1] + Ls[s1] != tensor * SHIFT + want \
                or Ks[s1] // SHIFT != tensor:
            done.discard(tensor)
            bad_tensors.add(tensor)
        else:
            done.add(tensor)
    for tensor in sorted(bad_tensors):
        # the exact report: this tensor's writes in order
        done.add(tensor)
        want = local.get(tensor)
        name = rollout[tensor][0]
        run = sorted((o, ln) for t, o, ln in zip(T, O, L) if t == tensor)
        at = 0
        for off, ln in run:
            if off != at:
                au.bad("coverage", "rollout rank %d %s: bytes [%d, %d) %s" %
                       (g, name, min(off, at), max(off, at), "written twice" if off < at else "never written"))
            at = max(at, off + ln)
        if at != want:
            au.bad("coverage", "rollout rank %d %s: %s at byte %d of %d"
                   % (g, name, "writes end" if at < want else "writes run past the end", at, want))
    for tensor, want in local.items():
        if tensor not in done and want:
            au.bad("coverage", "rollout rank %d %s: none of its %d bytes written" % (g, rollout[tensor][0], want))
    tb = tw = 0
    for tag, tensor, nbytes, nwrites in rv["expect"]:
        sent = got.pop(tag - 1, [0, 0])
        tb += nbytes
        tw += nwrites
        if tag - 1 != tensor or sent != [nbytes, nwrites]:
            au.bad("sizes", "rollout rank %d tag %d: expects %d bytes in %d writes of tensor %d, the "
                   "tables send %d in %d" % (g, tag, nbytes, nwrites, tensor, sent[0], sent[1]))
    for tensor, (nbytes, nwrites) in sorted(got.items()):
        au.bad("sizes", "rollout rank %d: %d bytes in %d writes with tag %d arrive, not expected"
               % (g, nbytes, nwrites, tensor + 1))
    if tb != rv["recv_bytes"] or tw != rv["recv_writes"] or tb != head["recv_bytes"][g] or tb != total:
        au.bad("sizes", "rollout rank %d: expects %d bytes in %d writes, recv_bytes says %d in %d (summary %d), "
               "the tables send %d" % (g, tb, tw, rv["recv_bytes"], rv["recv_writes"], head["recv_bytes"][g], total))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__.split("\n\n")[-1].strip(), file=sys.stderr)
        sys.exit(2)
    sys.exit(0 if main(sys.argv[1]) else 1)
