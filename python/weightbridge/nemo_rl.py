"""weightbridge as a NeMo-RL checkpoint-engine refit transport (non-colocated vLLM generation):

    policy.generation.refit_transport: "weightbridge.nemo_rl:WeightbridgeCheckpointEngine"
    policy.generation.refit_cfg:
      "weightbridge.nemo_rl:WeightbridgeCheckpointEngine": {controller: "tcp://ctl:7420"}

NeMo-RL constructs the engine on every policy worker and, through its vLLM worker extension,
inside every vLLM worker. Policy side: ``send_weights`` pushes the next version of the policy
worker's model parameters (registered the first time; the generator of gathered tensors is never
read) and returns once every rollout holds it. Generation side: ``init_rollout_process_group``
registers the vLLM worker's own parameters under NeMo-RL's rollout rank (the same machinery as
``weightbridge.vllm``: layout check, MLA post-processing after every version), and
``receive_weight_batches`` waits for the next version and yields nothing to load.

Engine kwargs: controller, token, tx_domain, tx_extra, timeout (each falls back to the
environment, WB_CONTROLLER, ...); NeMo-RL's own bucket size and release_after_refit are accepted
and have no effect.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

from . import _adapter as A

try:
    from nemo_rl.utils.checkpoint_engines.base import CheckpointEngine as _Base
except ImportError:  # NeMo-RL absent
    _Base = object

_SETTINGS = ("controller", "token", "tx_domain", "tx_extra", "timeout", "skip")


class WeightbridgeCheckpointEngine(_Base):
    shard_expert_weights = False

    def __init__(self, bucket_size: int = 0, release_after_refit: bool = False, **engine_kwargs: Any):
        bad = sorted(set(engine_kwargs) - set(_SETTINGS))
        if bad:
            raise A.AdapterError(f"weightbridge checkpoint engine: unknown setting{'s' if len(bad) > 1 else ''} "
                                 f"{', '.join(bad)} (known: {', '.join(_SETTINGS)})")
        self.given = {k: v for k, v in engine_kwargs.items() if k != "skip"}
        self.skip = engine_kwargs.get("skip") or ()
        self.sync: Optional[A.TrainerSync] = None
        self.model = None
        self.binding: Optional[A.RolloutBinding] = None

    def get_target_weight_layout(self):
        return None

    def prepare(self):
        return {}

    def init_policy_process_group(self, *, worker_rank, train_world_size, rollout_world_size, metadata):
        pass  # the Trainer is made at the first send, from the calling policy worker's model

    def init_rollout_process_group(self, *, rollout_rank, train_world_size, rollout_world_size, metadata):
        if self.binding is not None:
            return
        self.binding = A.binding("vllm")
        if self.binding is not None and self.binding.rank != int(rollout_rank):
            raise A.AdapterError(f"NeMo-RL rollout rank {rollout_rank}: this vLLM worker registered as rollout rank "
                                 f"{self.binding.rank} (WB_REPLICA and its place in the engine); they must agree")
        if self.binding is None:
            from . import vllm as wb_vllm

            worker = A.find_in_callers(lambda o: o if A.model_of(o, ("model_runner.model",)) is not None else None)
            if worker is None:
                raise A.AdapterError("NeMo-RL: found no vLLM worker (self.model_runner.model) among the callers")
            given = dict(self.given, skip=list(self.skip))
            self.binding = wb_vllm.start(worker.model_runner.model, worker.vllm_config, worker.device, given,
                                         rank=int(rollout_rank))

    def finalize(self):
        pass  # endpoints live as long as the workers

    async def send_weights(self, weights):
        if self.sync is None:
            self.sync, self.model = A.caller_trainer(self.given, framework="NeMo-RL")
        close = getattr(weights, "close", None)
        if close is not None:
            close()
        current = A.discover(self.model.named_parameters(), what="NeMo-RL trainer")
        return self.sync.push(current=current, timeout=A.settings(self.given).timeout)

    async def receive_weight_batches(self):
        if self.binding is None:
            raise A.AdapterError("NeMo-RL: receive before init_rollout_process_group")
        await asyncio.get_running_loop().run_in_executor(None, self.binding.wait)
        return
        yield  # an async generator with nothing to load
