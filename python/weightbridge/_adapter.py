"""What every engine and framework adapter shares: finding the parameters to register, checking
that the engine holds them in a layout weightbridge plans, re-running the engine's own
post-processing of weight-derived tensors after a version lands (without moving them), waiting
for versions, and the trainer side's push.

The adapters themselves (``weightbridge.vllm``, ``.sglang``, ``.verl``, ``.slime``,
``.nemo_rl``) only call the engine's or framework's interface and hand its objects to the
classes here. Everything here is duck-typed on the engine's object graph — ``named_parameters()``,
``named_modules()``, a module's ``quant_method`` and its flags, tensor attributes — so that it
works on torch modules and tensors and is tested in CI on stand-in objects holding numpy arrays,
with a real controller and real transfers (tests/python/adapters_e2e.py).

Nothing here imports torch or an engine at module level.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fnmatch
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from . import Rollout, Trainer, WeightbridgeError
from ._tensors import info

# ---------------------------------------------------------------- errors


class AdapterError(WeightbridgeError):
    """A refusal by an adapter (nothing was registered or written), naming the tensor."""

    def __init__(self, message: str):
        super().__init__(-errno.EINVAL, message)


def _problems(what: str, problems: Sequence[str]) -> AdapterError:
    if len(problems) == 1:
        return AdapterError(f"{what}: {problems[0]}")
    return AdapterError(f"{what} ({len(problems)} problems):\n  " + "\n  ".join(problems))


# ---------------------------------------------------------------- tensors of either kind


def _is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def is_tensor(x) -> bool:
    """A numpy array or a torch tensor (Parameters included)."""
    if _is_torch(x):
        return hasattr(x, "data_ptr") and hasattr(x, "shape")
    return type(x).__module__ == "numpy" and hasattr(x, "ctypes") and hasattr(x, "shape")


def address(t) -> int:
    return int(t.data_ptr()) if _is_torch(t) else int(t.ctypes.data)


def describe(t) -> str:
    """"dtype [d0, d1]" (and the device for torch tensors) — how messages show a tensor."""
    dt = str(t.dtype).replace("torch.", "")
    s = f"{dt} [{', '.join(str(int(d)) for d in t.shape)}]"
    if _is_torch(t):
        s += f" on {t.device}"
    return s


def _hold(t):
    """A reference to t's current memory that survives `t.data = other`."""
    return t.detach() if _is_torch(t) else t


def _copy_into(dst, src) -> None:
    if _is_torch(dst):
        dst.copy_(src)
    else:
        import numpy as np

        np.copyto(dst, src)


# ---------------------------------------------------------------- parameter discovery

# Prefixes that wrappers put before a module's own parameter names (FSDP1, activation
# checkpointing, torch.compile).
WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def strip_wrappers(name: str) -> str:
    for p in WRAPPER_PREFIXES:
        name = name.replace(p, "")
    return name


def discover(
    named: Iterable[Tuple[str, Any]],
    *,
    skip: Sequence[str] = (),
    dtypes: Optional[Mapping[str, str]] = None,
    what: str = "engine",
) -> Dict[str, Any]:
    """The tensors to register, from ``named_parameters()`` (or any (name, tensor) pairs):
    wrapper prefixes stripped, names matching a ``skip`` pattern (fnmatch) left out, and a tensor
    listed again under another name (tied weights: same memory, same shape) kept once, under its
    first name. Every tensor must be of a dtype weightbridge moves; all problems are raised
    together, each naming the tensor."""
    out: Dict[str, Any] = {}
    seen: Dict[Tuple[int, Tuple[int, ...]], str] = {}
    problems: List[str] = []
    for raw, t in named:
        name = strip_wrappers(raw)
        if any(fnmatch.fnmatchcase(name, pat) for pat in skip):
            continue
        if name in out:
            problems.append(f"{name}: listed twice")
            continue
        try:
            ti = info(t, (dtypes or {}).get(name))
        except (TypeError, ValueError) as e:
            problems.append(f"{name}: {e}")
            continue
        key = (ti.ptr, tuple(ti.local_shape))
        if ti.ptr and key in seen:
            continue  # tied: the first name carries it
        seen[key] = name
        out[name] = t
    if problems:
        raise _problems(f"{what} parameters weightbridge cannot register", problems)
    return out


def local_address(t) -> int:
    """Where the memory of a registered tensor (a wb.Shard, a DTensor's local shard, a tensor or
    array) starts now."""
    if hasattr(t, "local") and hasattr(t, "offset"):
        t = t.local
    if _is_torch(t) and hasattr(t, "to_local"):
        t = t.to_local()
    return address(t)


def check_resident(registered: Mapping[str, int], current: Mapping[str, Any], what: str = "trainer") -> None:
    """Raises when a registered tensor's memory moved since it was registered (parameter offload
    to the CPU and back, re-allocation): weightbridge reads and writes registered memory in place,
    so the tensors must stay where they were. ``registered``: name -> address at registration."""
    problems = []
    for name, ptr in registered.items():
        t = current.get(name)
        if t is None:
            problems.append(f"{name}: no longer present")
            continue
        now = local_address(t)
        if now != ptr:
            problems.append(f"{name}: moved from {ptr:#x} to {now:#x} since it was registered "
                            "(parameter offload or re-allocation); keep the parameters resident")
    if problems:
        raise _problems(f"{what} tensors are not where they were registered", problems)


# ---------------------------------------------------------------- layout attestation

# Quantization methods whose parameters hold exactly what weightbridge writes.
UNQUANTIZED_METHODS = frozenset(
    {"UnquantizedLinearMethod", "UnquantizedEmbeddingMethod", "UnquantizedFusedMoEMethod"}
)
FP8_METHODS = frozenset({"Fp8LinearMethod", "Fp8MoEMethod"})
# FP8 MoE kernels that use the checkpoint layout as loaded (the others reorder, shuffle, repack
# or requantize w13/w2 when loading: FlashInfer TRT-LLM and CUTLASS, Marlin, AITER, vLLM
# CUTLASS grouped GEMM).
FP8_MOE_BACKENDS_IN_PLACE = frozenset({"TRITON", "BATCHED_TRITON", "DEEPGEMM", "BATCHED_DEEPGEMM"})
BLOCK = [128, 128]


def _block_size(qm) -> Optional[List[int]]:
    for holder in (getattr(qm, "quant_config", None), qm):
        bs = getattr(holder, "weight_block_size", None)
        if bs is not None:
            return [int(x) for x in bs]
    return None


def quant_problem(qm, *, scales_ue8m0: bool = False) -> Optional[str]:
    """Why a module's quantization method does not hold the layout weightbridge writes (BF16, or
    FP8 E4M3 with 128x128 float32 weight_scale_inv blocks, as loaded from the checkpoint), or
    None when it does. ``scales_ue8m0``: the engine requantizes block scales to UE8M0
    (DeepGEMM on Blackwell)."""
    cls = type(qm).__name__
    if cls in UNQUANTIZED_METHODS or cls.endswith("KVCacheMethod"):
        return None  # KV-cache scale methods own attention scales, which weightbridge never writes
    if cls not in FP8_METHODS:
        return (
            f"quantization method {cls} stores this layer in a layout weightbridge does not produce "
            "(it writes BF16, or FP8 E4M3 with 128x128 float32 weight_scale_inv blocks)"
        )
    bs = _block_size(qm)
    if bs != BLOCK:
        return f"{cls} with weight_block_size {bs}: weightbridge writes FP8 with 128x128 block scales only"
    if getattr(qm, "use_marlin", False):
        return f"{cls} repacks the weights for the Marlin kernel (a GPU without FP8, or VLLM_TEST_FORCE_FP8_MARLIN)"
    if getattr(qm, "use_aiter_and_is_supported", False) or getattr(qm, "rocm_aiter_moe_enabled", False):
        return f"{cls} shuffles the weights for ROCm AITER kernels"
    fi = getattr(qm, "flashinfer_moe_backend", None)
    if fi is not None:
        return f"{cls} reorders the expert weights for the FlashInfer {getattr(fi, 'name', fi)} kernels"
    be = getattr(qm, "fp8_backend", None)
    if be is not None:
        name = str(getattr(be, "name", be))
        if name not in FP8_MOE_BACKENDS_IN_PLACE and name != "NONE":
            return f"{cls} converts the expert weights for the {name} MoE backend"
    if scales_ue8m0:
        return f"{cls} requantizes weight_scale_inv to UE8M0 for DeepGEMM"
    return None


def attest(
    model: Any,
    registered: Mapping[str, Any],
    *,
    scales_ue8m0: bool = False,
    what: str = "engine",
) -> None:
    """Refuses, before anything is registered, an engine whose parameters are not in the layout
    the plan writes: every module's quantization method must be one that keeps the checkpoint
    layout (see quant_problem), and no registered scale may be flagged UE8M0. Each problem names
    the first registered tensor of the module."""
    problems = []
    for prefix, module in model.named_modules():
        qm = getattr(module, "quant_method", None)
        if qm is None:
            continue
        why = quant_problem(qm, scales_ue8m0=scales_ue8m0)
        if why is None:
            continue
        names = [strip_wrappers(n) for n, _ in _direct_params(module, prefix)]
        first = next((n for n in names if n in registered), names[0] if names else prefix or "(model)")
        problems.append(f"{first}: {why}")
    for name, t in registered.items():
        if getattr(t, "format_ue8m0", False):
            problems.append(f"{name}: block scales stored as UE8M0; weightbridge writes float32 scales")
    if problems:
        raise _problems(
            f"{what}: the parameter layout is not the one weightbridge plans, nothing was registered",
            problems,
        )


def _direct_params(module, prefix):
    np_ = getattr(module, "named_parameters", None)
    if np_ is None:
        return []
    try:
        it = np_(recurse=False)
    except TypeError:
        it = np_()
    return [(f"{prefix}.{n}" if prefix else n, p) for n, p in it]


# ---------------------------------------------------------------- derived tensors


@dataclass
class Derived:
    """One piece of the engine's own post-processing that derives tensors from weights (vLLM's
    MLA layer computing W_UK_T/W_UV from kv_b_proj, SGLang's post_load_weights computing
    w_kc/w_vc). ``run`` calls it; ``owners`` are (label, object) whose tensor attributes must keep
    their memory — captured CUDA graphs hold their addresses."""

    label: str
    run: Callable[[], None]
    owners: Sequence[Tuple[str, Any]]


def _tensor_attrs(owner) -> Dict[str, Any]:
    out = {}
    for k, v in vars(owner).items():
        if is_tensor(v):
            out[k] = v
    for store in ("_parameters", "_buffers"):
        for k, v in (getattr(owner, store, None) or {}).items():
            if v is not None and is_tensor(v):
                out[k] = v
    return out


def _restore(owner, attr: str, old, held) -> None:
    if _is_torch(held) and old.data_ptr() != held.data_ptr():
        old.data = held  # `.data` was swapped: point the same object at the old memory again
    params = getattr(owner, "_parameters", None)
    if params is not None and attr in params and _is_torch(old):
        import torch

        if not isinstance(old, torch.nn.Parameter):
            old = torch.nn.Parameter(old, requires_grad=False)
    setattr(owner, attr, old)


class DerivedRefresh:
    """Runs the engine's own post-processing of weight-derived tensors after a version landed,
    then puts every result back into the memory the tensor had before (the engine's code may
    allocate new tensors; captured CUDA graphs would keep reading the old ones). A result of
    another shape, dtype or device, or a tensor the processing removed, fails the version with
    the tensor named, and the old tensor is put back as it was."""

    def __init__(self, units: Iterable[Derived]):
        self.units = list(units)

    def __len__(self) -> int:
        return len(self.units)

    def run(self) -> None:
        problems = []
        for u in self.units:
            snap = []
            for label, owner in u.owners:
                for attr, t in _tensor_attrs(owner).items():
                    snap.append((label, owner, attr, t, _hold(t), address(t)))
            try:
                u.run()
            except Exception as e:  # noqa: BLE001 - reported with the layer named, tensors put back
                problems.append(f"{u.label}: post-processing raised {type(e).__name__}: {e}")
            for label, owner, attr, old, held, ptr in snap:
                cur = getattr(owner, attr, None)
                if cur is old and address(old) == ptr:
                    continue  # untouched, or written in place
                if cur is None or not is_tensor(cur):
                    problems.append(f"{label}.{attr}: post-processing removed it")
                elif describe(cur) != describe(held):
                    problems.append(f"{label}.{attr}: post-processing made it {describe(cur)}, it was "
                                    f"{describe(held)}; captured CUDA graphs read the old memory")
                else:
                    _copy_into(held, cur)
                # the old tensor goes back in any case: the engine keeps reading the memory its
                # CUDA graphs captured (with the old values when the version failed)
                _restore(owner, attr, old, held)
        if problems:
            raise _problems("after the update", problems)


def mla_units(model: Any, act_dtype: Any) -> List[Derived]:
    """vLLM: every attention layer whose post-processing derives tensors from kv_b_proj (MLA:
    W_UK_T and W_UV, on the layer or on its backend impl) — its own
    ``process_weights_after_loading(act_dtype)``, which vLLM's layerwise reload also re-runs."""
    units = []
    for name, m in model.named_modules():
        fn = getattr(m, "process_weights_after_loading", None)
        impl = getattr(m, "impl", None)
        if not callable(fn) or not (hasattr(m, "kv_b_proj") or hasattr(impl, "kv_b_proj")):
            continue
        owners = [(name, m)] + ([(f"{name}.impl", impl)] if impl is not None else [])
        units.append(Derived(name, (lambda f=fn: f(act_dtype)), owners))
    return units


def post_load_units(model: Any) -> List[Derived]:
    """SGLang: the model's ``post_load_weights()`` (DeepSeek-V2/V3, Kimi-K2: w_kc/w_vc from
    kv_b_proj), which SGLang itself runs after every load_weights; every module's tensors are
    kept in place."""
    fn = getattr(model, "post_load_weights", None)
    if not callable(fn):
        return []
    owners = [(name or "model", m) for name, m in model.named_modules()]
    return [Derived(f"{type(model).__name__}.post_load_weights", fn, owners)]


# ---------------------------------------------------------------- settings and ranks


@dataclass
class Settings:
    controller: str
    token: Optional[str]
    replica: int
    tx_domain: Optional[str]
    tx_extra: Optional[str]
    timeout: float


def settings(given: Optional[Mapping[str, Any]] = None, env: Optional[Mapping[str, str]] = None) -> Settings:
    """Endpoint settings from ``given`` (an adapter's init info or kwargs), else the environment:
    WB_CONTROLLER, WB_TOKEN, WB_REPLICA (this engine instance's replica index), WB_TX_DOMAIN,
    WB_TX_EXTRA, WB_TIMEOUT (seconds a wait may take). Unknown keys are refused."""
    given = dict(given or {})
    env = os.environ if env is None else env
    keys = {"controller", "token", "replica", "tx_domain", "tx_extra", "timeout"}
    bad = sorted(set(given) - keys)
    if bad:
        raise AdapterError(f"unknown weightbridge setting{'s' if len(bad) > 1 else ''} {', '.join(bad)} "
                           f"(known: {', '.join(sorted(keys))})")

    def pick(key, var):
        v = given.get(key)
        return v if v is not None else env.get(var)

    controller = pick("controller", "WB_CONTROLLER")
    if not controller:
        raise AdapterError("no controller: pass controller= (the init info) or set WB_CONTROLLER")
    out = {}
    for key, var, conv, lo in (("replica", "WB_REPLICA", int, 0), ("timeout", "WB_TIMEOUT", float, 0)):
        raw = pick(key, var)
        if raw is None:
            out[key] = 0 if key == "replica" else 600.0
            continue
        try:
            out[key] = conv(raw)
        except (TypeError, ValueError):
            raise AdapterError(f"{key} ({var}): expected a {'non-negative integer' if conv is int else 'number of seconds'}, got {raw!r}") from None
        if out[key] < lo:
            raise AdapterError(f"{key} ({var}): expected >= {lo}, got {raw!r}")
    return Settings(str(controller), pick("token", "WB_TOKEN"), out["replica"], pick("tx_domain", "WB_TX_DOMAIN"),
                    pick("tx_extra", "WB_TX_EXTRA"), out["timeout"])


def rollout_rank(replica: int, gpus_per_replica: int, local: int) -> int:
    """weightbridge's rollout rank: replica * gpus_per_replica + the GPU's index in its replica."""
    if not 0 <= local < gpus_per_replica:
        raise AdapterError(f"GPU index {local} outside a replica of {gpus_per_replica} GPUs")
    return replica * gpus_per_replica + local


def engine_local_rank(*, tp: int, tp_rank: int, pp: int = 1, pp_rank: int = 0, dp: int = 1, dp_rank: int = 0) -> Tuple[int, int]:
    """(index of this GPU in its replica, GPUs per replica) for an engine instance of dp x pp x tp
    GPUs (vLLM and SGLang number them dp-major, then pp, then tp). weightbridge plans rollouts
    without pipeline stages: pp > 1 is refused."""
    if pp != 1:
        raise AdapterError(f"pipeline parallel size {pp}: weightbridge plans rollouts with tensor and expert "
                           "parallelism only (pipeline_parallel_size 1)")
    for n, r, what in ((tp, tp_rank, "tensor"), (dp, dp_rank, "data")):
        if not 0 <= r < n:
            raise AdapterError(f"{what} parallel rank {r} outside size {n}")
    return dp_rank * tp + tp_rank, dp * tp


# ---------------------------------------------------------------- the rollout side


@contextlib.contextmanager
def _nothing():
    yield


def torch_scope(device: int, *more: Callable[[], ContextManager]) -> Callable[[], ContextManager]:
    """A scope for the post-update hook, which runs on the endpoint's own thread: the engine's
    CUDA device current (a new thread starts on device 0), no autograd, plus ``more``."""

    @contextlib.contextmanager
    def scope():
        import torch

        with contextlib.ExitStack() as st:
            st.enter_context(torch.no_grad())
            if device >= 0:
                st.enter_context(torch.cuda.device(device))
            for m in more:
                st.enter_context(m())
            yield

    return scope


def torch_sync(device: int) -> Callable[[], None]:
    def sync():
        if device >= 0:
            import torch

            torch.cuda.synchronize(device)

    return sync


class RolloutBinding:
    """One rollout rank of an engine: the engine's parameters registered in place, the engine's
    own post-processing run after each version landed and before the rank reports it received
    (so a version is complete only once every rank ran it), and versions waited for.

    ``history`` records, in order, ("hook", v) when the hook starts (the bytes of v landed),
    ("processed", v) when the post-processing and ``sync`` finished, and ("waited", v) when a
    wait returned v — what the tests check the ordering with."""

    def __init__(
        self,
        params: Mapping[str, Any],
        *,
        refresh: Optional[DerivedRefresh] = None,
        scope: Optional[Callable[[], ContextManager]] = None,
        sync: Optional[Callable[[], None]] = None,
    ):
        self.params = dict(params)
        self.refresh = refresh or DerivedRefresh([])
        self.scope = scope or _nothing
        self.sync = sync
        self.rollout: Optional[Rollout] = None
        self.rank: Optional[int] = None
        self.waited = 0
        self.ready = False
        self.history: collections.deque = collections.deque(maxlen=256)

    def _hook(self, version: int) -> None:
        self.history.append(("hook", version))
        with self.scope():
            self.refresh.run()
            if self.sync is not None:
                self.sync()
        self.history.append(("processed", version))

    def start(
        self,
        s: Settings,
        rank: int,
        *,
        dtypes: Optional[Mapping[str, str]] = None,
        dump: Optional[str] = None,
        give_up: Optional[float] = None,
    ) -> "RolloutBinding":
        """Registers with the controller and returns at once (the job becomes ready once every
        trainer and rollout registered; wait() waits for that)."""
        if self.rollout is not None:
            raise AdapterError(f"rollout rank {self.rank}: already started")
        self.rank = rank
        self.rollout = Rollout(
            s.controller, self.params, rank=rank, token=s.token, dtypes=dtypes, hook=self._hook, timeout=0,
            tx_domain=s.tx_domain, tx_extra=s.tx_extra, dump=dump, give_up=give_up,
        )
        self.timeout = s.timeout
        return self

    @property
    def version(self) -> int:
        return self.rollout.version if self.rollout is not None else 0

    @property
    def torn(self) -> bool:
        """True from a failed update until a version completes (Rollout.torn)."""
        return self.rollout.torn if self.rollout is not None else False

    def wait(self, version: Optional[int] = None, timeout: Optional[float] = None) -> int:
        """Returns once this rank holds ``version`` complete — or, without one, the version after
        the last one waited for (frameworks that do not number their updates) — with the
        post-processing done; raises WeightbridgeError with the controller's reason when it
        failed and TimeoutError after ``timeout`` seconds."""
        if self.rollout is None:
            raise AdapterError("wait before start: the engine's weightbridge endpoint was never initialized")
        timeout = self.timeout if timeout is None else timeout
        if not self.ready:
            self.rollout.wait_ready(timeout)
            self.ready = True
        want = int(version) if version is not None else max(self.waited, self.rollout.version) + 1
        got = self.rollout.wait(want, timeout)
        self.waited = max(self.waited, got)
        self.history.append(("waited", got))
        return got

    def close(self) -> None:
        if self.rollout is not None:
            self.rollout.close()
            self.rollout = None


# One binding per engine process, so that a framework's code running in the same process (NeMo-RL's
# checkpoint engine inside the vLLM worker) finds the one the engine adapter made.
_BINDINGS: Dict[str, RolloutBinding] = {}


def bind(key: str, binding: RolloutBinding) -> RolloutBinding:
    _BINDINGS[key] = binding
    return binding


def binding(key: str = "default") -> Optional[RolloutBinding]:
    return _BINDINGS.get(key)


# ---------------------------------------------------------------- the trainer side


class TrainerSync:
    """A trainer rank's part of one framework "update weights" call: optionally pause the
    rollouts, push the next version (or the one given), wait until this rank's tensors may change
    again and (unless told not to) until every rollout holds the version, then resume. The
    registered tensors must not have moved since registration (checked before every push when
    ``current``, the tensors as they are now, is given)."""

    def __init__(self, trainer: Trainer, registered: Optional[Mapping[str, Any]] = None):
        self.trainer = trainer
        self.addresses = {n: local_address(t) for n, t in (registered or {}).items()}
        self.last = 0

    def next_version(self) -> int:
        return max(self.last, self.trainer.version) + 1

    def push(
        self,
        version: Optional[int] = None,
        *,
        current: Optional[Mapping[str, Any]] = None,
        pause: Optional[Callable[[], Any]] = None,
        resume: Optional[Callable[[], Any]] = None,
        after_push: Optional[Callable[[int], Any]] = None,
        wait_done: bool = True,
        timeout: float = 600.0,
    ) -> int:
        """``pause`` runs before the push (rollouts must not read weights while they land),
        ``after_push(version)`` once this rank's tensors were read (the engine-side wait goes
        there), ``resume`` last, also when something failed."""
        if current is not None and self.addresses:
            check_resident(self.addresses, current)
        v = int(version) if version is not None else self.next_version()
        if pause is not None:
            pause()
        try:
            p = self.trainer.push(v)
            p.sources(timeout)
            if after_push is not None:
                after_push(v)
            if wait_done:
                p.result(timeout)
        finally:
            if resume is not None:
                resume()
        self.last = v
        return v


# ---------------------------------------------------------------- finding the caller's model

MODEL_PATHS = ("model", "module", "engine.module", "actor.engine.module", "actor_module", "model_runner.model")


def _get_path(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def model_of(obj, paths: Sequence[str] = MODEL_PATHS):
    """The module a framework worker holds: the first of ``paths`` that leads to an object with
    named_parameters()."""
    for p in paths:
        m = _get_path(obj, p)
        if m is not None and callable(getattr(m, "named_parameters", None)):
            return m
    return None


def find_in_callers(test: Callable[[Any], Any], *, skip: int = 0, depth: int = 24):
    """Walks the calling frames, from the caller's (less ``skip``) outwards — coroutines awaiting
    each other included — and returns the first non-None ``test(self)`` of a frame's ``self``.
    Frameworks construct checkpoint engines without the model; the worker that calls them holds
    it."""
    f = sys._getframe(1 + skip)
    for _ in range(depth):
        if f is None:
            return None
        obj = f.f_locals.get("self")
        if obj is not None:
            r = test(obj)
            if r is not None:
                return r
        f = f.f_back
    return None


# ---------------------------------------------------------------- commands through a tensor list

COMMAND_PREFIX = "weightbridge:"
COMMAND_OPS = {"init": set(Settings.__dataclass_fields__) | {"skip"}, "wait": {"version", "timeout"}, "close": set()}


def encode_command(op: str, **args) -> str:
    """A control message carried as the name of an (empty) tensor, for engines whose only way
    into every worker is a "load these named tensors" call (SGLang's update_weights_from_tensor
    with a custom loader)."""
    if op not in COMMAND_OPS:
        raise AdapterError(f"unknown command {op!r} (known: {', '.join(sorted(COMMAND_OPS))})")
    return COMMAND_PREFIX + json.dumps({"op": op, **{k: v for k, v in args.items() if v is not None}}, sort_keys=True)


def decode_command(name: str) -> Dict[str, Any]:
    if not name.startswith(COMMAND_PREFIX):
        raise AdapterError(f"{name!r}: not a weightbridge command (the weightbridge loader only takes its own commands)")
    try:
        msg = json.loads(name[len(COMMAND_PREFIX):])
    except ValueError as e:
        raise AdapterError(f"{name!r}: malformed command: {e}") from None
    op = msg.pop("op", None) if isinstance(msg, dict) else None
    if op not in COMMAND_OPS:
        raise AdapterError(f"{name!r}: unknown command {op!r} (known: {', '.join(sorted(COMMAND_OPS))})")
    bad = sorted(set(msg) - COMMAND_OPS[op])
    if bad:
        raise AdapterError(f"{name!r}: {op}: unknown argument{'s' if len(bad) > 1 else ''} {', '.join(bad)}")
    msg["op"] = op
    return msg


def caller_trainer(given: Mapping[str, Any], *, framework: str, paths: Sequence[str] = MODEL_PATHS,
                   make: Optional[Callable[..., Trainer]] = None):
    """A framework trainer rank's Trainer, made the first time the framework asks to send
    weights: the model is the calling worker's (``paths`` on the frames' ``self``), its
    parameters registered as they are (FSDP2/DTensor shards with their placements). Returns
    (TrainerSync, model)."""
    model = find_in_callers(lambda o: model_of(o, paths), skip=1)
    if model is None:
        raise AdapterError(f"{framework}: found no model in the calling worker (looked for "
                           + ", ".join(f"self.{p}" for p in paths) + ")")
    tensors = discover(model.named_parameters(), what=f"{framework} trainer")
    s = settings(given)
    make = make or Trainer
    t = make(s.controller, tensors=tensors, token=s.token, tx_domain=s.tx_domain, tx_extra=s.tx_extra,
             timeout=s.timeout)
    return TrainerSync(t, registered=tensors), model
