"""weightbridge for SGLang rollouts: a custom weight loader that makes every tensor-parallel
worker a weightbridge rollout endpoint, and the calls that drive it.

The server is started with ``--custom-weight-loader weightbridge.sglang.load_weights``. SGLang's
``update_weights_from_tensor(named_tensors, load_format=...)`` is its one call that reaches every
worker of an instance with the worker's model in hand; weightbridge sends its commands through
it as the name of an empty tensor (empty tensors serialize without shared memory, so this works
over HTTP too):

- ``init(engine, controller=..., replica=i)``: every worker registers its model's
  ``named_parameters()`` (SGLang's names and layout) and returns at once;
- ``wait(engine, version)``: every worker returns once it holds ``version``, with SGLang's own
  post-processing (``post_load_weights``: DeepSeek/Kimi-K2 MLA w_kc/w_vc from kv_b_proj) re-run
  after the bytes landed and before the version was reported complete; SGLang then records
  ``weight_version`` and flushes the radix cache;
- ``paused(engine)``: pause_generation / continue_generation around the push, so no forward
  pass reads weights while they land.

``engine``: an ``sglang.Engine``, a server URL ("http://host:port"), or an object with the same
methods as slime/miles' SGLang engine actors.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import urllib.request
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _adapter as A

LOADER = "weightbridge.sglang.load_weights"


# ---------------------------------------------------------------- inside the SGLang workers


def _deep_gemm_ue8m0() -> bool:
    try:
        from sglang.srt.layers import deep_gemm_wrapper
    except ImportError:
        return False
    return bool(getattr(deep_gemm_wrapper, "DEEPGEMM_SCALE_UE8M0", False))


def _local_rank() -> Tuple[int, int]:
    from sglang.srt.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
    from sglang.srt.distributed.parallel_state import get_pp_group

    return A.engine_local_rank(
        tp=get_tensor_model_parallel_world_size(), tp_rank=get_tensor_model_parallel_rank(),
        pp=get_pp_group().world_size, pp_rank=get_pp_group().rank_in_group,
    )


def _start(model, cmd: Dict[str, Any]) -> A.RolloutBinding:
    skip = cmd.pop("skip", None) or ()
    s = A.settings(cmd)
    local, per_replica = _local_rank()
    params = A.discover(model.named_parameters(), skip=tuple(skip), what="SGLang")
    A.attest(model, params, scales_ue8m0=_deep_gemm_ue8m0(), what="SGLang")
    dev = next((p.device.index for p in params.values() if p.device.type == "cuda"), -1)
    b = A.RolloutBinding(
        params, refresh=A.DerivedRefresh(A.post_load_units(model)), scope=A.torch_scope(dev), sync=A.torch_sync(dev)
    )
    b.start(s, A.rollout_rank(s.replica, per_replica, local))
    return A.bind("sglang", b)


def load_weights(model, named_tensors: Sequence[Tuple[str, Any]]) -> None:
    """The custom weight loader SGLang calls on every worker: runs the weightbridge commands
    carried in the tensor names (anything else is refused — weightbridge never loads tensors
    through SGLang)."""
    for name, _ in named_tensors:
        cmd = A.decode_command(name)
        op = cmd.pop("op")
        b = A.binding("sglang")
        if op == "init":
            if b is None:
                _start(model, cmd)
        elif op == "wait":
            if b is None:
                raise A.AdapterError("wait before init: the worker's weightbridge endpoint was never initialized")
            b.wait(cmd.get("version"), cmd.get("timeout"))
        elif b is not None:  # close
            b.close()
            A._BINDINGS.pop("sglang", None)


# ---------------------------------------------------------------- driving an engine


def command_tensors(op: str, **args) -> List[Tuple[str, Any]]:
    """The named tensors that carry a command: one empty uint8 tensor named by the command."""
    import torch

    return [(A.encode_command(op, **args), torch.empty(0, dtype=torch.uint8))]


def _post(url: str, path: str, payload: Optional[dict] = None, timeout: float = 3600.0):
    req = urllib.request.Request(
        url.rstrip("/") + path, data=json.dumps(payload or {}).encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
    return json.loads(body) if body else None


def _tp_size(url: str) -> int:
    with urllib.request.urlopen(url.rstrip("/") + "/get_server_info", timeout=60) as r:
        return int(json.loads(r.read())["tp_size"])


def _serialize(named) -> str:
    try:
        from sglang.srt.utils import MultiprocessingSerializer
    except ImportError:
        from sglang.srt.utils.common import MultiprocessingSerializer  # newer layout
    return MultiprocessingSerializer.serialize(named, output_str=True)


def _call(engine, named, *, flush_cache: bool = False, weight_version: Optional[str] = None, tp_size: Optional[int] = None):
    if isinstance(engine, str):  # a server URL
        n = tp_size or _tp_size(engine)
        payload = {"serialized_named_tensors": [_serialize(named)] * n, "load_format": LOADER, "flush_cache": flush_cache}
        if weight_version is not None:
            payload["weight_version"] = weight_version
        out = _post(engine, "/update_weights_from_tensor", payload)
    elif hasattr(engine, "update_weights_from_tensor") and "serialized_named_tensors" in inspect.signature(engine.update_weights_from_tensor).parameters:
        n = tp_size or 1
        kw = {"weight_version": weight_version} if weight_version is not None else {}
        out = engine.update_weights_from_tensor([_serialize(named)] * n, load_format=LOADER, flush_cache=flush_cache, **kw)
    else:  # sglang.Engine
        params = inspect.signature(engine.update_weights_from_tensor).parameters
        kw = {"weight_version": weight_version} if weight_version is not None and "weight_version" in params else {}
        out = engine.update_weights_from_tensor(named_tensors=named, load_format=LOADER, flush_cache=flush_cache, **kw)
    if isinstance(out, dict) and out.get("success") is False:
        raise A.AdapterError(f"SGLang refused the weightbridge command: {out.get('message')}")
    if isinstance(out, (tuple, list)) and len(out) == 2 and out[0] is False:
        raise A.AdapterError(f"SGLang refused the weightbridge command: {out[1]}")
    return out


def init(engine, *, controller: Optional[str] = None, replica: Optional[int] = None, token: Optional[str] = None,
         tx_domain: Optional[str] = None, tx_extra: Optional[str] = None, timeout: Optional[float] = None,
         skip: Optional[Sequence[str]] = None, tp_size: Optional[int] = None):
    """Makes every worker of ``engine`` (replica ``replica`` of the job's rollout layout) a
    rollout endpoint; settings not given come from the workers' environment (WB_CONTROLLER, ...)."""
    return _call(engine, command_tensors("init", controller=controller, replica=replica, token=token,
                                         tx_domain=tx_domain, tx_extra=tx_extra, timeout=timeout,
                                         skip=list(skip) if skip else None), tp_size=tp_size)


def wait(engine, version: int, *, timeout: Optional[float] = None, flush_cache: bool = True, tp_size: Optional[int] = None):
    """Returns once every worker of ``engine`` holds ``version`` (SGLang's post-processing done);
    tags the engine with weight_version=str(version) and flushes its cache."""
    return _call(engine, command_tensors("wait", version=int(version), timeout=timeout), flush_cache=flush_cache,
                 weight_version=str(int(version)), tp_size=tp_size)


@contextlib.contextmanager
def paused(engine):
    """pause_generation on entry, continue_generation on exit."""
    if isinstance(engine, str):
        _post(engine, "/pause_generation")
        try:
            yield
        finally:
            _post(engine, "/continue_generation")
        return
    if not hasattr(engine, "pause_generation"):
        raise A.AdapterError(f"{type(engine).__name__} has no pause_generation: pass the server URL instead")
    engine.pause_generation()
    try:
        yield
    finally:
        engine.continue_generation()
