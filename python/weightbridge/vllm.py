"""weightbridge for vLLM rollouts: a weight-transfer backend and a worker extension.

vLLM with the four-phase weight-transfer API (``--weight-transfer-config '{"backend":
"weightbridge"}'``, the backend registered by this package's ``vllm.general_plugins`` entry
point): every worker builds a ``WeightbridgeEngine`` once its model is loaded; it registers the
model's ``named_parameters()`` (vLLM's own names and layout: fused, FP8 with weight_scale_inv)
with the controller — at once when WB_CONTROLLER is set in the workers' environment, else on
``init_weight_transfer_engine`` — and ``update_weights({"version": N})`` waits until the worker
holds version N. Older vLLM: ``--worker-extension-cls weightbridge.vllm.WorkerExtension`` and
``collective_rpc("weightbridge_init", ...)`` / ``collective_rpc("weightbridge_wait", ...)``.

Either way, after the bytes of a version landed and before the worker reports it received, the
worker re-runs vLLM's own post-processing of tensors derived from weights (MLA layers' W_UK_T and
W_UV from kv_b_proj) and puts the results back where CUDA graphs read them; a layer whose
quantization method keeps another layout than the one weightbridge writes (AWQ, GPTQ, Marlin,
FlashInfer-reordered experts, UE8M0 scales, ...) is refused before anything is registered, with
the tensor named. All of that lives in ``weightbridge._adapter``; this module only talks to vLLM.

Trainer side: ``sync(client, trainer, version)`` pushes a version and drives vLLM's four calls
through any object with the methods of vLLM's ``VLLMWeightSyncClient``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, List, Optional

from . import Trainer
from . import _adapter as A

BACKEND = "weightbridge"
# vLLM parameters that are not weights and that weightbridge never plans: FP8 KV-cache and
# attention-probability scales.
DEFAULT_SKIP = ("*.k_scale", "*.v_scale", "*.q_scale", "*.prob_scale")


def register() -> None:
    """The ``vllm.general_plugins`` entry point: registers the "weightbridge" weight-transfer
    backend (lazily: this module is imported by vLLM's factory only when the backend is used).
    vLLM without the weight-transfer API: nothing to do (use WorkerExtension)."""
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    except ImportError:
        return
    try:
        WeightTransferEngineFactory.register_engine(BACKEND, __name__, "WeightbridgeEngine")
    except ValueError:
        pass  # registered already (the plugin loads once per process, but be idempotent)


# ---------------------------------------------------------------- shared by both forms


def _deep_gemm_e8m0() -> bool:
    try:
        from vllm.utils.deep_gemm import is_deep_gemm_e8m0_used
    except ImportError:
        return False
    return bool(is_deep_gemm_e8m0_used())


def _local_rank(vllm_config) -> tuple:
    """(this GPU's index in its replica, GPUs per replica) from vLLM's parallel state."""
    from vllm.distributed import parallel_state as ps

    pc = vllm_config.parallel_config
    return A.engine_local_rank(
        tp=pc.tensor_parallel_size, tp_rank=ps.get_tensor_model_parallel_rank(),
        pp=pc.pipeline_parallel_size, pp_rank=ps.get_pp_group().rank_in_group,
        dp=pc.data_parallel_size, dp_rank=pc.data_parallel_rank,
    )


def _vllm_config_scope(vllm_config) -> Callable:
    def scope():
        try:
            from vllm.config import set_current_vllm_config
        except ImportError:
            return A._nothing()
        return set_current_vllm_config(vllm_config)

    return scope


def make_binding(model, vllm_config, device, skip=()) -> A.RolloutBinding:
    """Everything a vLLM worker registers: the model's parameters after loading, checked against
    the layout weightbridge plans, with the MLA post-processing run after every version."""
    params = A.discover(model.named_parameters(), skip=tuple(DEFAULT_SKIP) + tuple(skip or ()), what="vLLM")
    A.attest(model, params, scales_ue8m0=_deep_gemm_e8m0(), what="vLLM")
    dev = device.index if getattr(device, "index", None) is not None else -1
    act_dtype = vllm_config.model_config.dtype
    return A.RolloutBinding(
        params,
        refresh=A.DerivedRefresh(A.mla_units(model, act_dtype)),
        scope=A.torch_scope(dev, _vllm_config_scope(vllm_config)),
        sync=A.torch_sync(dev),
    )


def start(model, vllm_config, device, given: Optional[Dict[str, Any]] = None, rank: Optional[int] = None) -> A.RolloutBinding:
    """Registers this worker (rank: from the replica index in the settings and vLLM's parallel
    state, unless given) and returns at once; the binding is kept for this process."""
    given = dict(given or {})
    skip = given.pop("skip", None) or ()
    s = A.settings(given)
    if rank is None:
        local, per_replica = _local_rank(vllm_config)
        rank = A.rollout_rank(s.replica, per_replica, local)
    b = make_binding(model, vllm_config, device, skip)
    b.start(s, rank)
    return A.bind("vllm", b)


# ---------------------------------------------------------------- the weight-transfer backend

try:
    from vllm.distributed.weight_transfer.base import (
        WeightTransferEngine,
        WeightTransferInitInfo,
        WeightTransferUpdateInfo,
    )
except ImportError:  # vLLM absent or without the API
    WeightTransferEngine = None

if WeightTransferEngine is not None:

    @dataclass
    class WeightbridgeInitInfo(WeightTransferInitInfo):
        """``init_weight_transfer_engine`` info; every field falls back to the environment
        (WB_CONTROLLER, WB_TOKEN, WB_REPLICA, WB_TX_DOMAIN, WB_TX_EXTRA, WB_TIMEOUT)."""

        controller: Optional[str] = None
        token: Optional[str] = None
        replica: Optional[int] = None
        tx_domain: Optional[str] = None
        tx_extra: Optional[str] = None
        timeout: Optional[float] = None
        skip: List[str] = field(default_factory=list)

    @dataclass
    class WeightbridgeUpdateInfo(WeightTransferUpdateInfo):
        """``update_weights`` info: the version to wait for (none: the next one)."""

        version: Optional[int] = None
        timeout: Optional[float] = None

    class WeightbridgeEngine(WeightTransferEngine):
        """vLLM's weight-transfer engine interface over weightbridge endpoints: the trainers
        write into this worker's parameters in place, so there is nothing to load and
        start/finish are no-ops; receive_weights waits for the version."""

        init_info_cls = WeightbridgeInitInfo
        update_info_cls = WeightbridgeUpdateInfo
        supports_draft_weight_update = False

        def __init__(self, config, vllm_config=None, device=None, model=None, *rest):
            if model is None or rest:
                raise A.AdapterError(
                    "this vLLM creates weight-transfer engines without the model (the API before "
                    "start/finish_weight_update): use --worker-extension-cls weightbridge.vllm.WorkerExtension"
                )
            super().__init__(config, vllm_config, device, model)
            self.binding: Optional[A.RolloutBinding] = None
            if os.environ.get("WB_CONTROLLER"):
                self.init_transfer_engine(WeightbridgeInitInfo())

        def init_transfer_engine(self, init_info) -> None:
            if self.binding is not None:
                return  # started from the environment at load; the init call changes nothing
            given = {f.name: getattr(init_info, f.name) for f in fields(init_info)}
            self.binding = start(self.model, self.vllm_config, self.device, given)

        def start_weight_update(self) -> None:
            pass

        def receive_weights(self, update_info, *args, **kwargs) -> None:
            if self.binding is None:
                raise A.AdapterError("update_weights before init_weight_transfer_engine (and WB_CONTROLLER unset)")
            self.binding.wait(update_info.version, update_info.timeout)

        def finish_weight_update(self) -> None:
            pass

        def shutdown(self) -> None:
            if self.binding is not None:
                self.binding.close()

        @staticmethod
        def trainer_send_weights(iterator, trainer_args) -> None:
            """weightbridge trainers do not send tensors: they push a version of what they
            registered. ``trainer_args``: {"trainer": weightbridge.Trainer, "version": N}; returns
            once this rank's tensors were read (the iterator is not consumed)."""
            t, v = trainer_args["trainer"], int(trainer_args["version"])
            t.push(v).sources()


# ---------------------------------------------------------------- the worker extension


class WorkerExtension:
    """``--worker-extension-cls weightbridge.vllm.WorkerExtension``; methods run on every worker
    through ``llm.collective_rpc(name, args=...)`` (``self`` is vLLM's Worker)."""

    def weightbridge_init(self, init_info: Optional[Dict[str, Any]] = None) -> int:
        """Registers this worker; returns its rollout rank. ``init_info``: controller, token,
        replica, tx_domain, tx_extra, timeout, skip (each falls back to the environment)."""
        b = A.binding("vllm")
        if b is None:
            b = start(self.model_runner.model, self.vllm_config, self.device, init_info)
        return b.rank

    def weightbridge_wait(self, version: Optional[int] = None, timeout: Optional[float] = None) -> int:
        b = A.binding("vllm")
        if b is None:
            raise A.AdapterError("weightbridge_wait before weightbridge_init")
        return b.wait(version, timeout)

    def weightbridge_close(self) -> None:
        b = A.binding("vllm")
        if b is not None:
            b.close()


# ---------------------------------------------------------------- the trainer side


def sync(
    client: Any,
    trainer: Trainer,
    version: Optional[int] = None,
    *,
    sender: bool = True,
    pause: Optional[Callable[[], Any]] = None,
    resume: Optional[Callable[[], Any]] = None,
    timeout: float = 600.0,
) -> int:
    """One weight update from a trainer rank, on every rank: the sender (one rank) pauses
    generation (``pause``, e.g. the engine's pause_generation), calls
    ``client.start_weight_update()``; every rank pushes; the sender then calls
    ``client.update_weights({"version": v})`` — it returns once every worker holds v with vLLM's
    post-processing done — and ``client.finish_weight_update()``, then ``resume``. ``client``: any
    object with those methods (vLLM's HTTPVLLMWeightSyncClient, or one over Ray/collective_rpc).
    Returns the version."""
    ts = A.TrainerSync(trainer)
    if not sender:
        return ts.push(version, timeout=timeout)

    def before():
        if pause is not None:
            pause()
        if hasattr(client, "start_weight_update"):
            client.start_weight_update()

    def after(v):
        client.update_weights({"version": v, "timeout": timeout})
        if hasattr(client, "finish_weight_update"):
            client.finish_weight_update()

    return ts.push(version, pause=before, resume=resume, after_push=after, timeout=timeout)
