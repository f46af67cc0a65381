"""weightbridge: move model weights from an RL trainer's tensors into a rollout engine's
parameters, with one-sided writes and a plan computed once.

A trainer process registers the parameters it holds and pushes a version after each optimizer
step::

    import weightbridge as wb
    trainer = wb.Trainer("tcp://ctl:7420", model=model)      # FSDP2/DTensor or plain tensors
    for step in range(steps):
        train_step(model)
        f = trainer.push(step + 1)
        f.sources()                                           # parameters may change again
    f.result()                                                # every rollout holds it

A rollout process registers its engine's parameters (the engine's own names and layout: vLLM's
fused, FP8 tensors with their scales) and waits::

    rollout = wb.Rollout("tcp://ctl:7420", params=dict(engine_model.named_parameters()),
                         hook=lambda version: process_weights_after_loading(engine_model))
    rollout.wait(version)

The controller (``wb-controller --config job.yaml``) checks every registration against the
model rules and the layout and refuses a wrong one with every problem listed; errors surface
here as :class:`WeightbridgeError` carrying the C library's message and code, raised as the
code's subclass (:class:`JobEnded`, :class:`PeerError` for a failed version, :class:`Timeout`,
:class:`ConfigError`...; weightbridge._errors lists them).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
from typing import Any, Callable, Dict, Mapping, Optional

from . import _errors, _lib
from ._errors import (  # noqa: F401 - exported
    Busy,
    Closed,
    ConfigError,
    CudaError,
    FabricError,
    HelloError,
    InvalidArgument,
    JobEnded,
    MatchError,
    MemoryChanged,
    NoGpuError,
    PeerError,
    PlanError,
    BoundsError,
    Timeout,
    TokenError,
    WeightbridgeError,
    WireVersionError,
)
from ._tensors import At, Shard, TensorInfo, changes, info, state

__all__ = [
    "WeightbridgeError",
    *_errors.NAMES,
    "Shard",
    "At",
    "Trainer",
    "Rollout",
    "Push",
    "PushResult",
    "plan",
    "synth_fill",
    "library_path",
]

library_path: str = _lib.path


def _raise(code: int, message: str):
    raise _errors.error(code, message)


def _s(x: Optional[str]) -> Optional[bytes]:
    return x.encode() if x is not None else None


def _ns(seconds: Optional[float]) -> int:
    """Nanoseconds; None (a library default) is 0."""
    return 0 if seconds is None else max(0, int(seconds * 1e9))


def _rank_from_env(rank: Optional[int]) -> int:
    if rank is not None:
        return int(rank)
    for var in ("RANK", "SLURM_PROCID"):
        if os.environ.get(var):
            return int(os.environ[var])
    raise ValueError("no rank: pass rank=, or start under torchrun ($RANK) or srun ($SLURM_PROCID)")


def _moved(regs, verb: str) -> Optional[str]:
    """Why a registered tensor's memory is no longer what was registered (it moved, was
    resized, or now holds another dtype), naming the first such tensor; None when none is."""
    for name, src, was in regs:
        try:
            now = state(src)
        except ValueError as e:  # a DLPack export that no longer succeeds
            return f"{name}: cannot be read again ({e}); weightbridge {verb} registered memory in place"
        if now != was:
            return (f"{name}: its memory changed since it was registered ({changes(was, now)}); "
                    f"weightbridge {verb} registered memory in place")
    return None


class _Endpoint:
    """The C endpoint behind Trainer and Rollout. What it registered stays referenced until
    :meth:`close` (a numpy array also pinned against reallocation), and is checked before every
    version: a tensor whose memory moved, was resized or holds another dtype fails it, named."""

    def __init__(
        self,
        role: str,
        controller: str,
        rank: Optional[int],
        token: Optional[str],
        device: Optional[int],
        tensors: Mapping[str, Any],
        dtypes: Optional[Mapping[str, str]],
        tx_domain: Optional[str],
        tx_extra: Optional[str],
        dump: Optional[str],
        trace: Optional[str],
        give_up: Optional[float],
        mesh: Optional[Any] = None,
        watch: Optional[Mapping[str, Any]] = None,
    ):
        """``watch``: name -> the object whose memory is checked before every version, where it
        is not the one registered (a Parameter whose ``.data`` was registered)."""
        self._ep = ctypes.c_void_p()
        self._keep = []
        self._regs = []  # (name, object registered, state() at registration)
        self._closed_state = (0, False)  # version and torn as they were when closed
        self.role = role
        self.rank = _rank_from_env(rank)
        token = token if token is not None else os.environ.get("WB_TOKEN")
        infos = {}
        for name, t in tensors.items():
            try:
                ti = info(t, (dtypes or {}).get(name))
            except (TypeError, ValueError) as e:
                raise type(e)(f"{role} rank {self.rank}: {name}: {e}") from None
            if role == "rollout" and not ti.writeable:
                flag = "its export is flagged READ_ONLY" if ti.buffer.startswith("DLPack") else \
                    "flags.writeable is False"
                raise ValueError(
                    f"{role} rank {self.rank}: {name}: the buffer is read-only ({ti.buffer}, "
                    f"{flag}); a rollout's tensors are written in place"
                )
            if watch and name in watch:
                ti.src = watch[name]
            infos[name] = ti
        devices = {ti.device for ti in infos.values()}
        if device is None:
            if len(devices) > 1:
                raise ValueError(
                    f"tensors on several devices {sorted(devices)}: one endpoint per device"
                )
            device = devices.pop() if devices else -1
        why = ctypes.c_char_p()
        rc = _lib.endpoint_open(
            _s(controller), _s(role), self.rank, _s(token or ""), int(device), _s(tx_domain),
            _s(tx_extra), _s(dump), _s(trace), _ns(give_up), ctypes.byref(self._ep),
            ctypes.byref(why),
        )
        if rc:
            _raise(rc, f"{role} rank {self.rank}: " + (why.value.decode() if why.value else _lib.errname(rc)))
        try:
            meshes = {ti.mesh for ti in infos.values() if ti.mesh is not None}
            if mesh is not None:
                meshes.add(tuple((str(n), int(s)) for n, s in mesh))
            if len(meshes) > 1:
                raise ValueError(f"tensors on several device meshes {sorted(meshes)}: one at a time")
            if meshes:
                self._set_mesh(meshes.pop())
            for name, ti in infos.items():
                self._add(name, ti)
        except BaseException:
            self.close()
            raise

    def _set_mesh(self, dims):
        names = (ctypes.c_char_p * len(dims))(*[n.encode() for n, _ in dims])
        sizes = (ctypes.c_uint32 * len(dims))(*[s for _, s in dims])
        rc = _lib.endpoint_set_mesh(self._ep, len(dims), names, sizes)
        if rc:
            self._fail(rc)

    def _add(self, name: str, ti: TensorInfo):
        nd = len(ti.local_shape)
        strides = _lib.i64s(ti.strides) if ti.strides is not None else None
        place = None
        if ti.placement is not None:
            place = (ctypes.c_int32 * len(ti.placement))(*ti.placement)
        rc = _lib.endpoint_add(
            self._ep, name.encode(), ti.dtype.encode(), nd, _lib.u64s(ti.shape),
            _lib.u64s(ti.offset), _lib.u64s(ti.local_shape), strides, ctypes.c_void_p(ti.ptr),
            place,
        )
        if rc:
            self._fail(rc)
        self._keep.append(ti.keep)
        self._keep.extend(ti.hold)
        src = ti.src if ti.src is not None else ti.keep
        self._regs.append((name, src, state(src)))

    def _fail(self, rc: int):
        msg = _lib.endpoint_error(self._ep).decode() if self._ep else ""
        _raise(rc, msg or _lib.errname(rc))

    def _start(self, timeout: float):
        rc = _lib.endpoint_start(self._ep, _ns(timeout) if timeout else 0)
        if rc:
            self._fail(rc)

    def _closed(self) -> None:
        _raise(-errno.EBADF, f"{self.role} rank {self.rank}: closed")

    def wait_ready(self, timeout: float = 600.0) -> None:
        """Waits until the whole job is ready (for endpoints made with ``timeout=0``, e.g. a
        trainer and a rollout colocated in one process, started one after the other)."""
        if not self._ep:
            self._closed()
        rc = _lib.endpoint_wait_ready(self._ep, _ns(timeout))
        if rc:
            self._fail(rc)

    @property
    def version(self) -> int:
        """The last complete version (rollouts) or the last version every rollout received
        (trainers); after :meth:`close`, what it was then."""
        if not self._ep:
            return self._closed_state[0]
        return int(_lib.endpoint_version(self._ep))

    @property
    def torn(self) -> bool:
        """Rollouts: True from a failed transfer until a version completes — parts of it may
        have landed, so the parameters hold neither it nor :attr:`version` whole."""
        if not self._ep:
            return self._closed_state[1]
        return bool(_lib.endpoint_torn(self._ep))

    def close(self):
        """Stops the endpoint and releases its registrations (the tensors stay yours)."""
        if self._ep:
            self._closed_state = (self.version, self.torn)
            _lib.endpoint_close(self._ep)
            self._ep = ctypes.c_void_p()
            self._keep = []
            self._regs.clear()  # in place: a Rollout's hook holds this very list

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class PushResult:
    """What became of a pushed version on this trainer rank (:meth:`Push.result`).

    ``skipped`` is True when a newer push replaced the version before its transfer started
    (push policy "latest"): it was never transferred and ``skipped_by`` is that newer version.
    This is not an error: the rollouts get the newer version instead. Otherwise every rollout
    holds the version, and ``skipped_versions`` lists the versions skipped in its favour since
    the last one that went (``nskipped`` counts them all; the list keeps the newest 32).

    The figures are this rank's part of the transfer (0 for a skipped version): ``bytes`` and
    ``writes`` it made; ``stages``, seconds per stage (h2d, gather, fuse, quant, write,
    barrier), summed over its tasks; ``transfer_s`` from the transfer's start to its last
    write; ``wait_s`` from the push to the transfer's start (queued behind the one in flight);
    ``total_s`` from the push to every rollout holding the version (or to the skip)."""

    __slots__ = ("version", "skipped", "skipped_by", "nskipped", "skipped_versions", "bytes",
                 "writes", "stages", "transfer_s", "wait_s", "total_s")

    def __init__(self, st: "_lib.PushStats"):
        self.version = int(st.version)
        self.skipped = st.skipped_by != 0
        self.skipped_by = int(st.skipped_by) if st.skipped_by else None
        self.nskipped = int(st.nskipped)
        self.skipped_versions = [int(v) for v in st.skipped[: min(st.nskipped, _lib.WB_PUSH_SKIPPED_MAX)]]
        self.bytes = int(st.bytes)
        self.writes = int(st.writes)
        self.stages = {n: st.stage_ns[i] / 1e9 for i, n in enumerate(_lib.WB_STAGE_NAMES)}
        self.transfer_s = st.xfer_ns / 1e9
        self.wait_s = st.wait_ns / 1e9
        self.total_s = st.total_ns / 1e9

    def __repr__(self) -> str:
        if self.skipped:
            return f"PushResult(version={self.version}, skipped_by={self.skipped_by})"
        stages = ", ".join(f"{n}={t:.4f}" for n, t in self.stages.items())
        return (f"PushResult(version={self.version}, skipped_versions={self.skipped_versions}, "
                f"bytes={self.bytes}, transfer_s={self.transfer_s:.4f}, wait_s={self.wait_s:.4f}, "
                f"total_s={self.total_s:.4f}, stages: {stages})")


class Push:
    """A pushed version: :meth:`sources` returns once this rank's tensors may change again,
    :meth:`result` once the version's outcome is known; both raise :class:`WeightbridgeError`
    with the controller's reason when the version failed. A version a newer push replaced
    (policy "latest") is not a failure: both return at once and ``result()`` says
    ``skipped=True`` and by which version."""

    def __init__(self, trainer: "Trainer", version: int):
        self._t = trainer
        self.version = version
        self._result: Optional[PushResult] = None

    def _wait(self, ev: int, timeout: float) -> int:
        if not self._t._ep:
            self._t._closed()
        rc = _lib.endpoint_wait_push(self._t._ep, self.version, ev, _ns(timeout))
        if rc < 0:
            self._t._fail(rc)
        return rc

    def sources(self, timeout: float = 600.0) -> None:
        """Returns once this rank's tensors may change again: its transfer of the version read
        them, or a newer push replaced it (it will never read them). A version queued behind
        one in flight reads them when its transfer starts, so this waits for that."""
        if self._result is None:
            self._wait(_lib.WB_PUSH_SOURCES, timeout)

    def result(self, timeout: float = 600.0) -> PushResult:
        """Waits for the version's outcome: every rollout holds it, or it was skipped (a
        :class:`PushResult` either way), or it failed (:class:`WeightbridgeError`). The
        endpoint remembers the last 64 pushes: ask before pushing 64 more."""
        if self._result is None:
            self._wait(_lib.WB_PUSH_DONE, timeout)
            st = _lib.PushStats()
            rc = _lib.endpoint_push_stats(self._t._ep, self.version, ctypes.byref(st))
            if rc:
                self._t._fail(rc)
            self._result = PushResult(st)
        return self._result

    def done(self) -> bool:
        if not self._t._ep:
            self._t._closed()
        rc = _lib.endpoint_wait_push(self._t._ep, self.version, _lib.WB_PUSH_DONE, 0)
        return rc != _lib.TIMEOUT


class Trainer(_Endpoint):
    """One trainer rank.

    ``model``: a torch module whose ``named_parameters()`` are registered (FSDP2/DTensor
    parameters register their local shard with its global shape, box and placements, so a job
    file may leave the trainer layout out: the controller derives it), or a list of
    Megatron-core model chunks (this rank's, as ``get_model()`` returns them; virtual pipeline
    stages: several), registered under global layer and expert numbers with placements on the
    mesh (pp, edp, ep, tp) read from megatron's parallel state (:mod:`weightbridge.megatron`). ``tensors``: name -> numpy
    array, torch tensor, any object with ``__dlpack__`` (CuPy, JAX, ...) or :class:`Shard` of
    one, instead of or besides a model. ``dtypes``: name -> dtype for integer arrays that hold
    bfloat16 or float8 bits. Parameters may be float32 or float16 (FP32 masters, FSDP2 mixed precision):
    the rollouts get them cast to their own dtype as ``tensor.to(torch.bfloat16)`` does (FP8
    rollouts: that BF16 cast, quantized); a job with a trainer layout file says so there
    (``dtype: fp32``), a job without one takes the dtypes registered. ``rank`` defaults to torchrun's ``$RANK``, ``token`` to ``$WB_TOKEN``.
    Construction registers and waits (``timeout`` seconds) until the whole job is ready;
    ``timeout=0`` returns at once (then call :meth:`wait_ready`)."""

    def __init__(
        self,
        controller: str,
        model: Any = None,
        tensors: Optional[Mapping[str, Any]] = None,
        *,
        rank: Optional[int] = None,
        token: Optional[str] = None,
        device: Optional[int] = None,
        dtypes: Optional[Mapping[str, str]] = None,
        timeout: float = 600.0,
        tx_domain: Optional[str] = None,
        tx_extra: Optional[str] = None,
        trace: Optional[str] = None,
        give_up: float = 30.0,
        mesh: Optional[Any] = None,
        push_policy: str = "latest",
    ):
        """``mesh``: [(name, size), ...] of the device mesh :class:`Shard` placements refer to
        (DTensors bring their own). ``push_policy``: what a push made while another version
        is in flight does — "latest" (the default): it waits, and a newer push replaces it
        (skipped on every rank alike; the version in flight completes); "queue": every version
        is transferred, in order. Every trainer rank uses the same policy."""
        policies = {"latest": _lib.WB_PUSH_LATEST, "queue": _lib.WB_PUSH_QUEUE}
        if push_policy not in policies:
            raise ValueError(f"push_policy: expected 'latest' or 'queue', not {push_policy!r}")
        all_tensors: Dict[str, Any] = {}
        params: Dict[str, Any] = {}  # checked before each push: `p.data = x` moves p, not p.data
        if isinstance(model, (list, tuple)):  # Megatron-core model chunks (weightbridge.megatron)
            from . import megatron

            try:
                mmesh, mtensors, params = megatron.from_model(model)
            except ValueError as e:
                raise ValueError(f"trainer rank {_rank_from_env(rank)}: {e}") from None
            all_tensors.update(mtensors)
            if mesh is None:
                mesh = mmesh
        elif model is not None:
            for name, p in model.named_parameters():
                all_tensors[name] = p.data if hasattr(p, "data") else p
                params[name] = p
        for name in tensors or {}:
            params.pop(name, None)
        all_tensors.update(tensors or {})
        self._cuda = any(getattr(t.local if isinstance(t, Shard) else t, "is_cuda", False)
                         for t in all_tensors.values())
        super().__init__(
            "trainer", controller, rank, token, device, all_tensors, dtypes, tx_domain, tx_extra,
            None, trace, give_up, mesh, params,
        )
        rc = _lib.endpoint_set_push_policy(self._ep, policies[push_policy])
        if rc:
            self.close()
            _raise(rc, f"trainer rank {self.rank}: push_policy {push_policy}: {_lib.errname(rc)}")
        self._start(timeout)

    def push(self, version: int) -> Push:
        """Asks for transfer ``version`` (every trainer rank pushes the same versions in order;
        it starts when all did) and returns at once. A push while another version is in flight
        waits for it (see ``push_policy``); the tensors must not change until the returned
        :meth:`Push.sources` returned. GPU work PyTorch queued on the tensors
        (the optimizer step) is waited for first: the transfer reads them on its own streams."""
        if not self._ep:
            self._closed()
        why = _moved(self._regs, "reads")
        if why:
            _raise(-errno.EFAULT, f"trainer rank {self.rank}: version {int(version)} "
                                                   f"not pushed: {why}")
        if self._cuda:
            import torch

            torch.cuda.synchronize()
        rc = _lib.endpoint_push(self._ep, int(version))
        if rc:
            self._fail(rc)
        return Push(self, int(version))


class Rollout(_Endpoint):
    """One rollout rank. ``params``: name -> the engine's parameter (torch tensor, numpy
    array, or any object with ``__dlpack__``), named and shaped as the engine holds it (for vLLM, ``dict(model.named_parameters())``
    after loading: fused projections, FP8 weights and ``weight_scale_inv``). ``hook(version)``
    runs after the bytes of a version landed and before the rollout reports it received; an
    exception in it fails the version with its message. ``dump``: a directory where every
    complete version's tensors are written (``wb-ctl verify`` checks them)."""

    def __init__(
        self,
        controller: str,
        params: Mapping[str, Any],
        *,
        rank: Optional[int] = None,
        token: Optional[str] = None,
        device: Optional[int] = None,
        dtypes: Optional[Mapping[str, str]] = None,
        hook: Optional[Callable[[int], None]] = None,
        timeout: float = 600.0,
        tx_domain: Optional[str] = None,
        tx_extra: Optional[str] = None,
        dump: Optional[str] = None,
        give_up: Optional[float] = None,
    ):
        super().__init__(
            "rollout", controller, rank, token, device, dict(params), dtypes, tx_domain, tx_extra,
            dump, None, give_up,
        )
        # Always a hook: after the engine's own (which may replace parameters), before the
        # version is reported received, every registered tensor is checked, so a version never
        # counts as complete here when a tensor's memory is no longer where it landed.
        self._hook_fn = _lib.HOOK(self._make_hook(hook, self._regs))
        _lib.endpoint_set_hook(self._ep, self._hook_fn, None)
        self._start(timeout)

    @staticmethod
    def _make_hook(hook: Optional[Callable[[int], None]], regs):
        def fail(err, cap, text: str) -> int:
            msg = text.encode()[: max(0, cap - 1)]
            ctypes.memmove(err, msg + b"\0", len(msg) + 1)
            return 1

        def run(_arg, version, err, cap):
            try:
                if hook is not None:
                    hook(int(version))
            except BaseException as e:  # noqa: BLE001 - any failure fails the version
                return fail(err, cap, f"{type(e).__name__}: {e}")
            try:
                why = _moved(regs, "writes")
            except BaseException as e:  # noqa: BLE001 - a tensor that cannot be read back
                why = f"checking the registered tensors: {type(e).__name__}: {e}"
            return fail(err, cap, why) if why else 0

        return run

    def wait(self, version: int, timeout: float = 600.0) -> int:
        """Returns once this rank holds ``version`` (or a newer one) complete; raises
        :class:`WeightbridgeError` with the controller's reason when it failed (the rank keeps
        its last complete version) and ``TimeoutError`` after ``timeout`` seconds. A registered
        tensor whose memory moved, was resized or holds another dtype since registration raises
        it, named, and closes this Rollout: no version may land in memory that is not the
        tensor's."""
        if not self._ep:
            self._closed()
        why = _moved(self._regs, "writes")
        if why:
            self.close()
            _raise(-errno.EFAULT, f"rollout rank {self.rank}: {why}: this Rollout is closed "
                                  "(register again)")
        rc = _lib.endpoint_wait(self._ep, int(version), _ns(timeout))
        if rc:
            self._fail(rc)
        return self.version


# ---------------------------------------------------------------- planning


class _ModelSrc(ctypes.Structure):
    # struct wb_model_src (planner/planner.h)
    _fields_ = [
        ("rules", ctypes.c_char_p),
        ("config", ctypes.c_char_p),
        ("vars", ctypes.c_char_p),
        ("trainer_config", ctypes.c_char_p),
        ("trainer_inv", ctypes.c_char_p),
        ("rollout_inv", ctypes.c_char_p),
        ("trainer_layout", ctypes.c_char_p),
        ("rollout_layout", ctypes.c_char_p),
        ("trainer_mem", ctypes.c_void_p),
        ("naming", ctypes.c_char_p),
    ]


class _Relay(ctypes.Structure):
    # struct wb_relay (planner/planner.h): zeroed = off
    _fields_ = [("kind", ctypes.c_int), ("fanout", ctypes.c_uint32), ("roots", ctypes.c_uint32)]


class _PlanOpts(ctypes.Structure):
    # struct wb_plan_opts (planner/planner.h)
    _fields_ = [
        ("mode", ctypes.c_int),
        ("mem_cap", ctypes.c_uint64),
        ("threads", ctypes.c_uint32),
        ("lazy", ctypes.c_bool),
        ("fit_cap", ctypes.c_bool),
        ("relay", _Relay),
    ]


_plan_json = _lib._decl(
    "wb_plan_json", ctypes.c_int, ctypes.POINTER(_ModelSrc), ctypes.POINTER(_PlanOpts),
    ctypes.c_bool, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p),
)
_MODES = _lib.plan_modes()


def plan(
    model: str,
    config: str,
    trainer: str,
    rollout: str,
    *,
    mode: str = "auto",
    mem_cap: int = 0,
    tables: bool = False,
    vars: Optional[str] = None,
    naming: Optional[str] = None,
) -> Dict[str, Any]:
    """The plan of a weight update, as ``wb-plan --json`` writes it, without any hardware:
    ``model`` the model-family YAML, ``config`` the Hugging Face config.json, ``trainer`` and
    ``rollout`` the cluster layouts; ``naming`` the trainer naming (``wb-plan --naming``). Raises :class:`WeightbridgeError` listing every problem.
    With ``tables``, each rollout rank's ``receive[r]["local"]`` lists the tensors it holds as
    dicts (``tensor``, ``name``, ``dtype``, ``shape``, ``bytes``, ``written``) — what a rollout
    process registers — rather than the file's compact rows; everything else is as written."""
    if mode not in _MODES:
        raise ValueError(f"mode: expected one of {', '.join(_MODES)}, got {mode!r}")
    src = _ModelSrc(
        rules=_s(model), config=_s(config), vars=_s(vars), trainer_layout=_s(trainer),
        rollout_layout=_s(rollout), naming=_s(naming),
    )
    opts = _PlanOpts(mode=_MODES[mode], mem_cap=int(mem_cap), threads=0, lazy=False)
    out, err = ctypes.c_void_p(), ctypes.c_void_p()
    rc = _plan_json(ctypes.byref(src), ctypes.byref(opts), tables, ctypes.byref(out), ctypes.byref(err))
    try:
        if rc:
            text = ctypes.string_at(err.value).decode() if err.value else _lib.errname(rc)
            _raise(rc, text.strip())
        return _expand(json.loads(ctypes.string_at(out.value).decode()))
    finally:
        _lib.free(out.value)
        _lib.free(err.value)


def _expand(p: Dict[str, Any]) -> Dict[str, Any]:
    """The rollouts' local tensors as dicts, their names from ``rollout_tensors``."""
    names = [t[0] for t in p.get("rollout_tensors", [])]
    for r in p.get("receive", []):
        r["local"] = [l if isinstance(l, dict) else
                      {"tensor": l[0], "name": names[l[0]] if l[0] < len(names) else None,
                       "dtype": l[1], "shape": l[2], "bytes": l[3], "written": l[4]}
                      for l in r.get("local", [])]
    return p


# ---------------------------------------------------------------- synthetic values


def synth_fill(out: Any, name: str, seed: int, version: int, shape, offset, dtype: str) -> None:
    """Fills ``out`` (a contiguous numpy array or CPU torch tensor holding the box of tensor
    ``name`` that starts at ``offset`` in a global tensor of ``shape``) with weightbridge's
    synthetic values of (seed, version) — what ``wb-agent`` trainers hold, so that ``wb-ctl
    verify`` can check what rollouts received. ``dtype``: 'bf16', 'fp16' or 'fp32'."""
    try:
        ti = info(out, dtype)
    except (TypeError, ValueError) as e:
        raise type(e)(f"synth_fill {name}: {e}") from None
    if not ti.writeable:
        raise ValueError(f"synth_fill {name}: out is read-only ({ti.buffer})")
    if ti.strides is not None or ti.device >= 0:
        raise ValueError("synth_fill: out must be contiguous host memory")
    rc = _lib.synth_fill(
        name.encode(), int(seed), int(version), dtype.encode(), len(ti.local_shape),
        _lib.u64s(shape), _lib.u64s(offset), _lib.u64s(ti.local_shape), ctypes.c_void_p(ti.ptr),
    )
    if rc:
        _raise(rc, f"synth_fill {name}: {_lib.errname(rc)}")
