"""weightbridge as slime's / miles' weight updater (Megatron trainers, SGLang rollouts).

slime and miles pick the updater class from a fixed list (``--update-weight-transport`` in slime,
``--update-weight-transfer-mode`` in miles); their ``--custom-megatron-init-path`` hook runs on
every trainer rank before the updater is made, and ``install`` puts ``WeightbridgeUpdater`` in
place of the default non-colocated one (slime ``nccl`` / miles ``broadcast``). The SGLang
engines are started with weightbridge's loader (``--sglang-custom-weight-loader
weightbridge.sglang.load_weights``).

``WeightbridgeUpdater`` keeps their updater interface: ``connect_rollout_engines`` makes every
engine's workers weightbridge rollout endpoints (engine i is replica i); ``update_weights`` pauses
generation on every engine, pushes the next version from every trainer rank, has every engine
wait for it (SGLang's post-processing re-run, weight_version set, cache flushed), and continues
generation.

The trainer tensors: by default the model chunks' own parameters, as they are
(``weightbridge.megatron``: global layer and expert numbers under the family files' megatron
namings, placements from Megatron's parallel state). WB_TRAINER_TENSORS may name a function
``module:function(args, model)`` returning what this rank registers instead — a mapping from
names to tensors / ``weightbridge.Shard``s it keeps up to date, or a ready
``weightbridge.Trainer``.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Optional, Sequence

from . import Trainer
from . import _adapter as A

ACTOR_MODULES = ("slime.backends.megatron_utils.actor", "miles.backends.megatron_utils.actor")
REPLACED = "UpdateWeightFromDistributed"


def install(args: Any = None) -> list:
    """``--custom-megatron-init-path weightbridge.slime.install``: replaces the non-colocated
    updater class in the loaded actor module(s); returns the modules patched."""
    patched = []
    for name in ACTOR_MODULES:
        mod = sys.modules.get(name)
        if mod is None:
            try:
                mod = importlib.import_module(name)
            except ImportError:
                continue
        if hasattr(mod, REPLACED):
            setattr(mod, REPLACED, WeightbridgeUpdater)
            patched.append(name)
    if not patched:
        raise A.AdapterError(f"weightbridge.slime.install: neither of {', '.join(ACTOR_MODULES)} has {REPLACED}")
    return patched


def _load(spec: str):
    mod, _, fn = spec.partition(":")
    if not fn:
        raise A.AdapterError(f"WB_TRAINER_TENSORS={spec!r}: expected module:function")
    return getattr(importlib.import_module(mod), fn)


class WeightbridgeUpdater:
    """slime/miles' updater interface (constructor, connect_rollout_engines, update_weights,
    weight_version) over weightbridge."""

    def __init__(self, args, model, weights_getter=None, *, model_name: Optional[str] = None,
                 quantization_config=None, tensors=None, **_ignored):
        self.args = args
        self.model = model
        self.weight_version = 0
        self.engines: Sequence[Any] = ()
        self.tp_sizes: Sequence[int] = ()
        self._tensors = tensors  # tests and callers that have them; else WB_TRAINER_TENSORS
        self.sync: Optional[A.TrainerSync] = None

    # -- trainer ranks

    def _trainer(self) -> A.TrainerSync:
        if self.sync is None:
            src = self._tensors
            spec = os.environ.get("WB_TRAINER_TENSORS")
            if src is None and spec:
                src = _load(spec)(self.args, self.model)
            if src is None:
                # Megatron's own parameters, as they are (weightbridge.megatron: global layer and
                # expert numbers, the megatron namings, placements from the parallel state)
                if not isinstance(self.model, (list, tuple)):
                    raise A.AdapterError(
                        f"weightbridge with Megatron: the model is a {type(self.model).__name__}, not the list of "
                        "model chunks Megatron's get_model() returns; set WB_TRAINER_TENSORS=module:function(args, "
                        "model) returning what this rank registers"
                    )
                s = A.settings({})
                self.sync = A.TrainerSync(Trainer(s.controller, model=list(self.model), token=s.token,
                                                  tx_domain=s.tx_domain, tx_extra=s.tx_extra, timeout=s.timeout))
            elif isinstance(src, Trainer):
                self.sync = A.TrainerSync(src)
            else:
                tensors = A.discover(src.items(), what="Megatron trainer")
                s = A.settings({})
                self.sync = A.TrainerSync(Trainer(s.controller, tensors=tensors, token=s.token, tx_domain=s.tx_domain,
                                                  tx_extra=s.tx_extra, timeout=s.timeout), registered=tensors)
        return self.sync

    # -- the driver rank (0) talks to the engines

    def connect_rollout_engines(self, rollout_engines, rollout_engine_lock=None, engine_gpu_counts=None,
                                engine_gpu_offsets=None, engine_parallel_configs=None, **_ignored):
        self.engines = list(rollout_engines)
        per = getattr(self.args, "rollout_num_gpus_per_engine", 1)
        self.tp_sizes = list(engine_gpu_counts) if engine_gpu_counts is not None else [per] * len(self.engines)
        if _rank() == 0:
            _each(self.engines, lambda i, e: _remote(e.update_weights_from_tensor, _serialized("init", self.tp_sizes[i], replica=i),
                                                     load_format=_loader()))

    def is_rollout_engines_fresh(self) -> bool:
        return bool(self.engines)

    def update_weights(self) -> None:
        ts = self._trainer()
        driver = _rank() == 0

        def pause():
            if driver:
                _each(self.engines, lambda i, e: _remote(e.pause_generation))
            _barrier()

        def after(v):
            if driver:
                _each(self.engines, lambda i, e: _remote(e.update_weights_from_tensor, _serialized("wait", self.tp_sizes[i], version=v),
                                                         load_format=_loader(), flush_cache=True, weight_version=str(v)))

        def resume():
            if driver:
                _each(self.engines, lambda i, e: _remote(e.continue_generation))

        self.weight_version = ts.push(pause=pause, after_push=after, resume=resume)


def _loader() -> str:
    from .sglang import LOADER

    return LOADER


def _serialized(op: str, tp: int, **args) -> list:
    from .sglang import _serialize, command_tensors

    return [_serialize(command_tensors(op, **args))] * tp


def _rank() -> int:
    try:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_initialized() else 0
    except ImportError:
        return 0


def _barrier() -> None:
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if dist.is_initialized():
        dist.barrier()


def _remote(method, *args, **kwargs):
    """A Ray actor method (``.remote``), or a plain one."""
    return method.remote(*args, **kwargs) if hasattr(method, "remote") else method(*args, **kwargs)


def _each(engines, fn) -> list:
    refs = [fn(i, e) for i, e in enumerate(engines)]
    if refs and type(refs[0]).__name__ == "ObjectRef":
        import ray

        return ray.get(refs)
    return refs
