"""weightbridge as a verl checkpoint engine (``actor_rollout_ref.rollout.checkpoint_engine.backend=
weightbridge``), registered with verl's CheckpointEngineRegistry when this module is imported
(``actor_rollout_ref.model.external_lib=weightbridge.verl``).

verl calls ``send_weights(generator)`` on every trainer rank and, through its checkpoint-engine
workers, ``receive_weights()`` next to every rollout GPU. Here the trainer side pushes a version
of the tensors the trainer worker already holds — its model's parameters, registered the first
time (FSDP2 DTensor shards with their placements; the generator of gathered full tensors is
never read) — and returns once every rollout holds it. The rollout side has nothing to receive:
the bytes were written into the inference engine's own parameters by the engine's weightbridge
endpoints (``weightbridge.vllm``, configured through ``engine_kwargs.vllm.weight_transfer_config``),
and verl aborts generation before and resumes it after the update.

Engine kwargs (``checkpoint_engine.engine_kwargs.weightbridge``): controller, token, tx_domain,
tx_extra, timeout — each falls back to the environment (WB_CONTROLLER, ...).
"""

from __future__ import annotations

from typing import Any, Optional

from . import _adapter as A

try:
    from verl.checkpoint_engine import CheckpointEngine, CheckpointEngineRegistry
except ImportError:  # verl absent
    CheckpointEngine = None


class _Weightbridge:
    """The behaviour, independent of verl's base class (so that it is importable, and tested,
    without verl)."""

    def __init__(self, bucket_size: int = 0, is_master: bool = False, **engine_kwargs: Any):
        self.is_master = is_master
        self.given = engine_kwargs
        self.sync: Optional[A.TrainerSync] = None
        self.model = None

    def prepare(self):
        return {}

    @classmethod
    def build_topology(cls, trainer_world_size: int, rollout_world_size: int, metadata):
        return {}, {}

    def init_process_group(self, **kwargs):
        pass

    def finalize(self):
        pass

    async def send_weights(self, weights):
        """A trainer rank: push the next version of the registered parameters and return once
        every rollout holds it."""
        if self.sync is None:
            self.sync, self.model = A.caller_trainer(self.given, framework="verl")
        close = getattr(weights, "close", None)
        if close is not None:
            close()  # never iterated: it would gather full tensors
        current = A.discover(self.model.named_parameters(), what="verl trainer")
        return self.sync.push(current=current, timeout=A.settings(self.given).timeout)

    async def receive_weights(self):
        """A rollout GPU's checkpoint-engine worker: nothing to hand the server adapter."""
        return
        yield  # an async generator that yields nothing


if CheckpointEngine is not None:

    @CheckpointEngineRegistry.register("weightbridge")
    class WeightbridgeCheckpointEngine(_Weightbridge, CheckpointEngine):
        pass

else:
    WeightbridgeCheckpointEngine = _Weightbridge
