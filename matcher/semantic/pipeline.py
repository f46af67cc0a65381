"""pipeline.py -- a tiny model through weightbridge's own programs, as a job moves it: the
family's inventories generated and matched (wb-match), the checkpoint checked against the
model and planned (wb-broadcast --dry-run), then broadcast for real -- a coordinator running
the controller and the planner, 2 reader processes executing their routing tables (the
trainer side's executor: reads, amax exchanges, FP8 quantization, one-sided writes over
libfabric's tcp provider on loopback) into one rollout wb-agent per TP rank, which writes the
bytes it holds when the version is complete (--dump). Nothing here moves or converts a byte.
"""

import json
import os
import signal
import socket
import subprocess
import time

import numpy as np


class Failed(Exception):
    """A step failed: its message (the program's own words) is what the check reports."""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run(cmd, what, timeout):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Failed("%s: did not finish in %d s" % (what, timeout))
    if p.returncode != 0:
        raise Failed("%s failed (exit %d):\n%s" % (what, p.returncode, (p.stdout + p.stderr).rstrip()))
    return p.stdout + p.stderr


def inventories(bindir, family, config, vars_, tmp, timeout, naming=None):
    """The family's trainer and rollout inventories for config (dicts name -> (dtype, shape), in
    inventory order), matched by wb-match (in the trainer naming given, else the file's first)."""
    tag = "" if naming is None else "." + naming
    t, r = os.path.join(tmp, "trainer%s.json" % tag), os.path.join(tmp, "rollout%s.json" % tag)
    cmd = [os.path.join(bindir, "wb-match"), "--family", family, "--config", config, "--save-trainer", t,
           "--save-rollout", r]
    for v in vars_:
        cmd += ["--var", v]
    if naming is not None:
        cmd += ["--naming", naming]
    run(cmd, "wb-match", timeout)
    out = []
    for path in (t, r):
        with open(path) as f:
            inv = json.load(f, object_pairs_hook=lambda kv: kv)
        out.append({name: (v[0], v[1]) for name, v in inv})
    return out


def read_dump(path, names):
    """A rollout dump (WBDUMP1: count, then per local tensor its rollout index, bytes, bytes)
    as name -> bytes."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"WBDUMP1\n":
        raise Failed("%s: not a rollout dump" % path)
    n = int(np.frombuffer(data, np.uint32, 1, 8)[0])
    at, out = 12, {}
    for _ in range(n):
        idx = int(np.frombuffer(data, np.uint32, 1, at)[0])
        size = int(np.frombuffer(data, np.uint64, 1, at + 4)[0])
        at += 12
        if idx >= len(names):
            raise Failed("%s: tensor index %d past the rollout inventory's %d" % (path, idx, len(names)))
        out[names[idx]] = data[at:at + size]
        at += size
    return out


def broadcast(bindir, family, config, vars_, rollout_names, tp, ep, tmp, timeout, log, naming=None):
    """Plans and broadcasts the checkpoint in tmp/ckpt into tp*1 rollout ranks; returns each
    rank's local tensors (name -> bytes)."""
    port = free_port()
    url = "tcp://127.0.0.1:%d" % port
    token = "semantic-%d" % os.getpid()
    with open(os.path.join(tmp, "rollout.yaml"), "w") as f:
        f.write("replicas: 1\ngpus_per_replica: %d\ntp: %d\nep: %d\n" % (tp, tp, ep))
    job = os.path.join(tmp, "job.yaml")
    with open(job, "w") as f:
        f.write("name: semantic-check\nlisten: %s\ntoken: %s\nmodel:\n  rules: %s\n  hf_config: %s\n"
                "  vars: \"%s\"\n  naming: \"%s\"\ntrainers: 2\nrollout_layout: %s\nmode: auto\nmem_cap: 64MiB\n"
                "provider: tcp\n"
                % (url, token, os.path.abspath(family), os.path.abspath(config), ",".join(vars_), naming or "",
                   os.path.join(tmp, "rollout.yaml")))
    ckpt = os.path.join(tmp, "ckpt")
    b = os.path.join(bindir, "wb-broadcast")
    out = run([b, "--checkpoint", ckpt, "--dry-run", "--job", job, "--readers", "2"], "wb-broadcast --dry-run",
              timeout)
    log(out)
    dump = os.path.join(tmp, "dump")
    os.makedirs(dump, exist_ok=True)
    env = dict(os.environ, WB_TOKEN=token)
    procs = []

    def spawn(name, cmd):
        lf = open(os.path.join(tmp, name + ".log"), "w")
        procs.append((name, subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=env,
                                             start_new_session=True), lf))

    try:
        spawn("coordinator", [b, "--checkpoint", ckpt, "--job", job, "--progress", "off", "--wait", "%ds" % timeout])
        for r in range(2):
            spawn("reader%d" % r, [b, "--reader", "--checkpoint", ckpt, "--controller", url, "--rank", str(r),
                                   "--readers", "2"])
        for r in range(tp):
            spawn("rollout%d" % r, [os.path.join(bindir, "wb-agent"), "--role", "rollout", "--rank", str(r),
                                    "--controller", url, "--dump", dump])
        deadline = time.time() + timeout
        coord = procs[0][1]
        while coord.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        if coord.poll() is None:
            logs = []
            for name, _, _ in procs:
                with open(os.path.join(tmp, name + ".log")) as f:
                    logs.append("%s: %s" % (name, " / ".join(f.read().strip().split("\n")[-3:])))
            raise Failed("wb-broadcast: no complete version in %d s; the last lines of each:\n%s"
                         % (timeout, "\n".join(logs)))
        with open(os.path.join(tmp, "coordinator.log")) as f:
            clog = f.read()
        if coord.returncode != 0:
            raise Failed("wb-broadcast failed (exit %d):\n%s" % (coord.returncode, clog.rstrip()))
        log(clog)
        # the job ended: the readers and rollouts exit by themselves
        for name, p, _ in procs[1:]:
            try:
                rc = p.wait(max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                raise Failed("%s did not exit after the broadcast" % name)
            if rc != 0:
                with open(os.path.join(tmp, name + ".log")) as f:
                    raise Failed("%s exited %d after the broadcast:\n%s" % (name, rc, f.read()[-2000:].rstrip()))
    finally:
        for _, p, lf in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            lf.close()
    return [read_dump(os.path.join(dump, "rollout%d.v1.bin" % r), rollout_names) for r in range(tp)]
