#!/usr/bin/env python3
"""plan_audit.py -- audits a plan written by `wb-plan --json FILE --tables`, on its own.

It reads only the JSON (Python 3 standard library; none of the planner's code) and checks:
  shards   every placed trainer tensor's shard boxes lie in its shape and tile it
  sources  every op and write of every routing table reads bytes its rank holds: its own
           shard (an owner listed for that tensor, within the shard's bytes), or TMP bytes an
           earlier op of the same task produced (H2D of its shard, a gather whose members are
           the tensor's owners with their shard boxes, a copy, cast, transpose or quantization)
  amax     every amax exchange has exactly one mirror: the same tag on the peer it names,
           naming this rank back, for the same tensor and blocks, with the inboxes crossed
  sizes    a task's write_bytes is the sum of its writes, a table's send_bytes the sum of its
           tasks', the summary's per-rank and total bytes agree, a local tensor's bytes are
           its shape times its dtype size, data tags are tensor index + 1, and every receive
           list's expected bytes and writes per tag are what the tables send it
  coverage every byte a rollout rank must receive is written exactly once: the writes to
           each local tensor tile [0, written) without gap or overlap
  meaning  every write carries what the match puts where it lands: following each byte back
           through the task's ops (h2d, gather, copy, cast, permute, quant) to the trainer tensor and
           elements it came from, and forward through the rollout rank's global boxes
           ("rollout_boxes") and the component map ("components") to the trainer tensor and
           elements the match says belong there -- the same tensor, the same elements in the
           same order, FP8 values and scales where the rollout tensor is FP8, unconverted bytes
           where it is not, transposed exactly where the component is (a permute op's output is
           in the permuted tensor's coordinates, as are the regions and blocks of the ops after
           it); every quantization reads the region it names, and one whose region
           covers only part of an FP8 block (the rest held by other owners) uses the amax the
           owners exchanged
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
    checks = ["shards", "sources", "amax", "sizes", "coverage", "meaning"]
    head = {}
    classes = None
    trainer = []  # [name, dtype, shape, owners {rank: shard box}]
    rollout = []
    ntables = 0
    total_sent = 0
    # per rollout rank: (tensor, offset, length) triples, and per (rank, tag) bytes and writes
    recv = None
    components = rboxes = meaning = None
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
            elif key == "components":
                components = list(st.elements())
            elif key == "rollout_boxes":
                rboxes = list(st.elements())
            elif key == "tables":
                nr = head["nrollouts"]
                recv = [(array.array("q"), array.array("q"), array.array("q")) for _ in range(nr)]
                residence = head.get("trainer_layout", {}).get("residence", "gpu")
                if "format" in head and head["format"] >= 6:
                    meaning = Meaning(au, trainer, rollout, classes, head["mappings"], components, rboxes)
                for t in st.elements():
                    total_sent += audit_table(au, head, classes, trainer, rollout, t, recv)
                    if meaning:
                        meaning.table(t)
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
    if "format" not in head or head["format"] < 6 or classes is None or recv is None or not meaning:
        print("FAIL %s: not a plan written with --json --tables (format 6)" % path)
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
                    and all(owner_box(classes, trainer[tensor], k) == b or
                            (box_numel(b) == 0 and owner_box(classes, trainer[tensor], k) is None)
                            for k, b in listed.items()) \
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
            elif kind == "permute":
                _, tensor, src, sbox, dst, dbox, perm = op
                se, de = ext[sbox], ext[dbox]
                n = snum[dst[4]] * DTYPE_SIZE[dst[3]]
                ok = readable(src) and sorted(perm) == list(range(len(se))) and len(de) == len(se) \
                    and all(de[k] == se[p] for k, p in enumerate(perm)) and dst[0] == 1 \
                    and dst[2] + n <= tmp and src[3] == dst[3]
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


# ---------------------------------------------------------------- meaning


def ravel(c, S):
    i = 0
    for x, s in zip(c, S):
        i = i * s + x
    return i


def unravel(i, S):
    c = [0] * len(S)
    for d in range(len(S) - 1, -1, -1):
        i, c[d] = divmod(i, S[d])
    return c


def run_in_box(c, off, end, S):
    """How many elements, from coordinates c inside box [off, end) of a row-major array of shape
    S, follow on in memory without leaving the box."""
    k = len(S) - 1
    while k > 0 and off[k] == 0 and end[k] == S[k]:
        k -= 1
    inner = 0
    span = 1
    for d in range(k + 1, len(S)):
        inner = inner * S[d] + c[d]
        span *= S[d]
    return (end[k] - c[k]) * span - inner


def inside(c, off, end):
    for x, a, z in zip(c, off, end):
        if x < a or x >= z:
            return False
    return True


def align(src, ref):
    """src's coordinates in a space of len(ref) dims, dims aligned from the right: leading dims
    src lacks are ref's (the stack dim of a stacked component, fixed in one box), leading dims
    src has beyond ref dropped (unit dims)."""
    n, m = len(ref), len(src)
    return list(src[m - n:]) if m >= n else list(ref[:n - m]) + list(src)


def blocks(off, end, B=128):
    """A value box's block box (128x128 over the last two dims)."""
    n = len(off)
    bo, be = list(off), list(end)
    for d in range(max(0, n - 2), n):
        bo[d], be[d] = off[d] // B, -(-end[d] // B)
    return bo, be


class Entry:
    """Bytes of a task's TMP (or a rank's PARAM shard) and what they hold: the view (byte offset
    voff of a row-major array of shape `shape`, es-byte elements) within box [boff, bend) holds
    trainer tensor T, element boff being T's element torig; kind: raw (as the trainer holds
    it), cast, fp8 (quantized values) or scale (FP32 block scales, coordinates in blocks);
    perm: () in the trainer's dim order, else the coordinates (torig included) are those of T
    permuted (dim k is T's dim perm[k]: after a permute op)."""
    __slots__ = ("voff", "shape", "boff", "bend", "es", "kind", "T", "torig", "lo", "hi", "geo", "perm")

    def __init__(self, voff, shape, boff, bend, es, kind, T, torig, perm=()):
        self.voff, self.shape, self.boff, self.bend = voff, shape, boff, bend
        self.es, self.kind, self.T, self.torig = es, kind, T, torig
        self.perm = tuple(perm)
        last = [z - 1 for z in bend]
        self.lo = voff + ravel(boff, shape) * es
        self.hi = voff + (ravel(last, shape) + 1) * es if all(z > a for a, z in zip(boff, bend)) else self.lo
        # what a write's meaning depends on, but the tensor (cache key, Meaning.write)
        self.geo = (kind, es, tuple(shape), tuple(boff), tuple(bend), tuple(torig), self.perm)

    def tcoords(self, v):
        """Trainer coordinates of view coordinates v (inside the box)."""
        rel = [x - a for x, a in zip(v, self.boff)]
        rel = align(rel, [0] * len(self.torig))
        return [t + x for t, x in zip(self.torig, rel)]

    def tbox(self):
        ext = align([z - a for a, z in zip(self.boff, self.bend)], [1] * len(self.torig))
        return self.torig, [t + e for t, e in zip(self.torig, ext)]


class Comps:
    """A mapping's components (T, src off, dst off, dst end, perm), found by a destination
    element: the components sorted by their destination box's first element, the one holding
    an element is found by bisection (the last that starts at or before it, or one just
    before that: fused components along one dim, stacked experts of fused halves)."""

    def __init__(self, comps):
        self.c = sorted(comps, key=lambda x: x[2])
        self.offs = [x[2] for x in self.c]

        self.geo = tuple((tuple(x[1]), tuple(x[2]), tuple(x[3]), x[4]) for x in self.c)

    def find(self, gc):
        """The index of the component holding element gc, or -1."""
        c = self.c
        i = bisect_right(self.offs, gc) - 1
        for j in range(i, max(i - 4, -1), -1):
            if inside(gc, c[j][2], c[j][3]):
                return j
        for j, x in enumerate(c):
            if inside(gc, x[2], x[3]):
                return j
        return -1


class Meaning:
    """The meaning check, table by table (see the module's doc)."""

    def __init__(self, au, trainer, rollout, classes, mappings, components, rboxes):
        self.au, self.trainer, self.rollout, self.classes = au, trainer, rollout, classes
        self.role = {}
        self.comp = []  # per mapping, per role (values, scales): [(T, src off, dst off, dst end)]
        self.want = []  # per mapping, per role: the kind of bytes that must land
        for m, (rt, sc, xf, _ts) in enumerate(mappings):
            self.role[rt] = (m, 0)
            if sc >= 0:
                self.role[sc] = (m, 1)
            vals, scales = [], []
            # a transposed component's src box is taken in the permuted tensor's coordinates,
            # those of the entries a permute op makes (perm must match too)
            for T, src, dst, perm in components[m]:
                if perm:
                    src = [src[p] for p in perm]
                so, do_, de = [a for a, _ in src], [a for a, _ in dst], [z for _, z in dst]
                vals.append((T, so, do_, de, tuple(perm)))
                if sc >= 0:
                    b_so = blocks(so, [z for _, z in src])[0]
                    b_do, b_de = blocks(do_, de)
                    scales.append((T, b_so, b_do, b_de, tuple(perm)))
            self.comp.append((Comps(vals), Comps(scales)))
            tdt = trainer[components[m][0][0]][1] if components[m] else None
            self.want.append(("fp8", "scale") if xf == "fp8_block" else
                             ("raw" if tdt == rollout[rt][1] else "cast", None))
        # Writes of the same geometry (source view and box, offsets, destination local shape,
        # pieces and component boxes) step through the same components: the walk's outcome is
        # kept by geometry, and a later write of that geometry only compares tensors. Kimi-K2's
        # 3M write records have a few thousand geometries (layers and experts repeat).
        self.cache = {}
        self.dgeo = {}  # (rollout tensor, rank's locals) -> its destination geometry's number
        self.geos = {}  # geometries, numbered
        self.local = {}  # rollout rank -> {tensor: (local shape, [(goff, gend, loff, lend)])}
        for c in rboxes:
            loc = {}
            for tensor, shape, pieces in c["local"]:
                loc[tensor] = (shape, [([a for a, _ in g], [z for _, z in g], [a for a, _ in lb],
                                        [z for _, z in lb]) for g, lb in pieces])
            for g in c["ranks"]:
                self.local[g] = loc

    def bad(self, msg):
        self.au.bad("meaning", msg)

    def tname(self, T):
        return self.trainer[T][0] if 0 <= T < len(self.trainer) else "trainer tensor %d" % T

    def param(self, r, T):
        """Rank r's PARAM shard of trainer tensor T as an entry, or None."""
        if not 0 <= T < len(self.trainer):
            return None
        b = owner_box(self.classes, self.trainer[T], r)
        if b is None:
            return None
        off, ext = [a for a, _ in b], [z - a for a, z in b]
        return Entry(0, ext, [0] * len(ext), ext, DTYPE_SIZE[self.trainer[T][1]], "raw", T, off)

    def resolve(self, r, entries, view, box):
        """The entry whose bytes a view's box reads, and the trainer coordinates of the box's
        first and last elements; None when no op produced them."""
        buf, tensor, off, dt, sh = view
        shape = self.shapes[sh]
        es = DTYPE_SIZE.get(dt, 1)
        first = [a for a, _ in box]
        last = [z - 1 for _, z in box]
        if buf == 0:
            e = self.param(r, tensor)
            if e is None:
                return None
            return e, e.tcoords(first), e.tcoords(last)
        b0 = off + ravel(first, shape) * es
        b1 = off + ravel(last, shape) * es
        for e in reversed(entries):
            if e.lo <= b0 < e.hi and e.lo <= b1 < e.hi and (b0 - e.voff) % e.es == 0:
                c0 = unravel((b0 - e.voff) // e.es, e.shape)
                c1 = unravel((b1 - e.voff) // e.es, e.shape)
                if inside(c0, e.boff, e.bend) and inside(c1, e.boff, e.bend):
                    return e, e.tcoords(c0), e.tcoords(c1)
        return None

    def table(self, t):
        r = t["rank"]
        self.boxes, self.shapes = t["boxes"], t["shapes"]
        ops, R = t["ops"], t["writes"]
        nwr = 0  # single writes before the current record
        for task in t["tasks"]:
            op0, nops, w0, nws = task[7], task[8], task[9], task[10]
            entries = []
            amax = {}  # amax_off -> [block boxes the owners exchanged]
            for oi in range(op0, op0 + nops):
                self.op(r, oi, ops[oi], entries, amax)
            for i in range(w0, w0 + nws):
                rec = R[9 * i:9 * i + 9]
                done = set()
                for k in range(rec[7] + 1):
                    g = rec[2] + k * rec[8]
                    loc = self.local.get(g)
                    if id(loc) not in done:
                        done.add(id(loc))
                        self.write(r, nwr + k, rec, g, loc, entries)
                nwr += rec[7] + 1

    def op(self, r, oi, op, entries, amax):
        kind, T = op[0], op[1]
        B = self.boxes
        if kind == "h2d":
            _, T, so, n, do_ = op
            e = self.param(r, T)
            if e is not None:
                e = Entry(do_ - so, e.shape, e.boff, e.bend, e.es, "raw", T, e.torig)
                e.lo, e.hi = max(e.lo, do_), min(e.hi, do_ + n)
                entries.append(e)
        elif kind == "gather":
            dst = op[3]
            shape = self.shapes[dst[4]]
            entries.append(Entry(dst[2], shape, [0] * len(shape), shape, DTYPE_SIZE[dst[3]], "raw", T,
                                 [0] * len(self.trainer[T][2])))
        elif kind in ("copy", "cast"):
            _, T, src, sbox, dst, dbox = op
            got = self.resolve(r, entries, src, B[sbox])
            if got is None:
                return  # the sources check reports it
            e, c0, _ = got
            db = B[dbox]
            entries.append(Entry(dst[2], self.shapes[dst[4]], [a for a, _ in db], [z for _, z in db],
                                 DTYPE_SIZE[dst[3]], "cast" if kind == "cast" else e.kind, e.T, c0, e.perm))
        elif kind == "permute":
            _, T, src, sbox, dst, dbox, perm = op
            got = self.resolve(r, entries, src, B[sbox])
            if got is None:
                return  # the sources check reports it
            e, c0, _ = got
            if e.perm or e.kind != "raw":
                self.bad("rank %d op %d (permute of %s): transposes %s bytes%s" % (
                    r, oi, self.tname(T), e.kind, " transposed already" if e.perm else ""))
                return
            db = B[dbox]
            entries.append(Entry(dst[2], self.shapes[dst[4]], [a for a, _ in db], [z for _, z in db],
                                 DTYPE_SIZE[dst[3]], "raw", e.T, [c0[p] for p in perm], perm))
        elif kind == "amax":
            amax.setdefault(op[7], []).append(B[op[5]])
        elif kind == "quant":
            _, T, src, sbox, dst, region, grid, scale_off, amax_off = op
            reg, gr = B[region], B[grid]
            got = self.resolve(r, entries, src, B[sbox])
            ro = [a for a, _ in reg]
            if got is not None and (got[0].T != T or got[1] != ro):
                self.bad("rank %d op %d (quant of %s %s): reads %s %s" % (
                    r, oi, self.tname(T), ro, self.tname(got[0].T), got[1]))
            perm = got[0].perm if got is not None else ()
            self.check_amax(r, oi, T, reg, amax.get(amax_off, []) if amax_off >= 0 else [], amax_off, perm)
            shape = self.shapes[dst[4]]
            entries.append(Entry(dst[2], shape, [0] * len(shape), shape, 1, "fp8", T, ro, perm))
            gext = [z - a for a, z in gr]
            entries.append(Entry(scale_off, gext, [0] * len(gext), gext, 4, "scale", T, [a for a, _ in gr], perm))

    def check_amax(self, r, oi, T, reg, shared, amax_off, perm=()):
        """Blocks the region covers only in part must be quantized with the owners' amax (the
        region in the permuted tensor's coordinates when perm says so)."""
        shape = self.trainer[T][2]
        if perm:
            shape = [shape[p] for p in perm]
        n = len(shape)
        bo, be = blocks([a for a, _ in reg], [z for _, z in reg])
        part = []
        for d in range(n):
            lo, hi = bo[d], be[d]
            if d < n - 2:
                continue
            # a block is whole when the region spans it (to the tensor's end)
            first_part = reg[d][0] % 128 != 0
            last_part = reg[d][1] % 128 != 0 and reg[d][1] != shape[d]
            if first_part:
                part.append((d, lo))
            if last_part and (hi - 1 != lo or not first_part):
                part.append((d, hi - 1))
        for d, b in part:
            covered = any(bx[d][0] <= b < bx[d][1] for bx in shared)
            if not covered:
                self.bad("rank %d op %d (quant of %s %s): covers part of FP8 block row %d of dim %d "
                         "and quantizes it with %s" % (
                             r, oi, self.tname(T), [list(x) for x in reg], b, d,
                             "no shared amax (amax_off -1)" if amax_off < 0 else
                             "an amax no exchange of its task fills"))
                return

    def write(self, r, wi, rec, g, loc, entries):
        src, so, _, d, doff, ln = rec[:6]
        role = self.role.get(d)
        info = loc.get(d) if loc else None
        if role is None or info is None:
            self.bad("%s: no mapping or global box says what lands there" % self.where(r, wi, g, d, doff))
            return
        m, sc = role
        comps = self.comp[m][sc]
        want = self.want[m][sc]
        esd = DTYPE_SIZE[self.rollout[d][1]]
        if src >= 0:
            e = self.param(r, src)
            if e is None:
                return  # the sources check reports it
        else:
            e = None
            for x in reversed(entries):
                if x.lo <= so < x.hi:
                    e = x
                    break
            if e is None:
                return  # the sources check reports it
        if e.es != esd or doff % esd or ln % esd or (so - e.voff) % e.es:
            self.bad("%s: %d-byte elements written into a tensor of %d-byte elements"
                     % (self.where(r, wi, g, d, doff), e.es, esd))
            return
        if e.kind != want:
            self.bad("%s: %s bytes of %s, where %s bytes belong"
                     % (self.where(r, wi, g, d, doff), e.kind, self.tname(e.T), want))
            return
        dk = self.dgeo.get((d, id(loc)))
        if dk is None:
            lshape, pieces = info
            geo = (tuple(lshape), tuple(tuple(map(tuple, p)) for p in pieces), comps.geo)
            dk = self.dgeo[(d, id(loc))] = self.geos.setdefault(geo, len(self.geos))
        if type(e.geo) is tuple:
            e.geo = self.geos.setdefault(e.geo, len(self.geos))
        key = (e.geo, so - e.voff, ln, doff, dk)
        steps = self.cache.get(key)
        if steps is not None:
            c = comps.c
            for j in steps:
                if c[j][0] != e.T:
                    break
            else:
                return
        steps = self.walk(r, wi, g, d, doff, ln, e, info, comps, esd, so)
        if steps is not None:
            self.cache[key] = steps

    def where(self, r, wi, g, d, doff):
        name = self.rollout[d][0] if 0 <= d < len(self.rollout) else str(d)
        return "rank %d write %d (to rank %d %s +%d)" % (r, wi, g, name, doff)

    def walk(self, r, wi, g, d, doff, ln, e, info, comps, esd, so):
        """Follows a write element run by element run (each inside one piece, one component
        and the source's box); the components it stepped through, or None after reporting."""
        lshape, pieces = info
        n = ln // esd
        e0 = doff // esd
        s0 = (so - e.voff) // e.es
        pos = 0
        steps = []
        while pos < n:
            lc = unravel(e0 + pos, lshape)
            pc = None
            for p in pieces:
                if inside(lc, p[2], p[3]):
                    pc = p
                    break
            if pc is None:
                self.bad("%s: lands on local element %s, which holds no element of the global tensor"
                         % (self.where(r, wi, g, d, doff), lc))
                return None
            goff, gend, loff, lend = pc
            gc = [a + x - b for a, x, b in zip(goff, lc, loff)]
            j = comps.find(gc)
            if j < 0:
                self.bad("%s: lands on global element %s, which no component builds"
                         % (self.where(r, wi, g, d, doff), gc))
                return None
            T, cso, cdo, cde, cperm = comps.c[j]
            io = [max(a, b) for a, b in zip(goff, cdo)]
            ie = [min(a, b) for a, b in zip(gend, cde)]
            ld = min(run_in_box(lc, loff, lend, lshape),
                     run_in_box([x - a for x, a in zip(gc, goff)], [x - a for x, a in zip(io, goff)],
                                [x - a for x, a in zip(ie, goff)], [z - a for a, z in zip(goff, gend)]))
            vc = unravel(s0 + pos, e.shape)
            if not inside(vc, e.boff, e.bend):
                self.bad("%s: reads bytes no op of its task produced" % self.where(r, wi, g, d, doff))
                return None
            L = min(ld, run_in_box(vc, e.boff, e.bend, e.shape), n - pos)
            ta = e.tcoords(vc)
            ref = [0] * len(cso)
            te = [s + x for s, x in zip(cso, align([x - a for x, a in zip(gc, cdo)], ref))]
            ok = e.T == T and ta == te and e.perm == cperm
            if ok and L > 1:
                # the same elements in the same order: the same last element, and boxes that
                # agree on every dim inside the outermost one the run steps through
                sb0, sb1 = e.tbox()
                db0 = [s + x for s, x in zip(cso, align([x - a for x, a in zip(io, cdo)], ref))]
                db1 = [s + x for s, x in zip(cso, align([x - a for x, a in zip(ie, cdo)], [1] * len(cso)))]
                sx = [z - a for a, z in zip(sb0, sb1)]
                dx = [z - a for a, z in zip(db0, db1)]
                se = [a + x for a, x in zip(sb0, unravel(ravel([x - a for x, a in zip(ta, sb0)], sx) + L - 1, sx))]
                de = [a + x for a, x in zip(db0, unravel(ravel([x - a for x, a in zip(te, db0)], dx) + L - 1, dx))]
                k0 = next((k for k in range(len(ta)) if ta[k] != se[k]), len(ta))
                ok = se == de and all(sb0[k] == db0[k] and sb1[k] == db1[k] for k in range(k0 + 1, len(ta)))
            if not ok:
                self.bad("%s: holds %s %s%s, the mapping puts %s %s%s there" % (
                    self.where(r, wi, g, d, doff), self.tname(e.T), ta,
                    " permuted %s" % list(e.perm) if e.perm else "", self.tname(T), te,
                    " permuted %s" % list(cperm) if cperm else ""))
                return None
            steps.append(j)
            pos += L
        return steps


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__.split("\n\n")[-1].strip(), file=sys.stderr)
        sys.exit(2)
    sys.exit(0 if main(sys.argv[1]) else 1)
