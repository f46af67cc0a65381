"""Megatron-core trainers: a model as its trainer rank holds it (a list of model chunks — one,
or several with virtual pipeline stages) turned into registrations weightbridge plans from, with
no trainer layout file.

Every parameter is registered under its name with GLOBAL layer and expert numbers (the family
files' ``megatron`` / ``megatron_local`` namings: ``decoder.layers.L...``), its global shape
(the local one times the tensor-parallel size along the split dim) and its placement on the
mesh ``(pp, edp, ep, tp)`` — Megatron's default rank order ``tp-cp-ep-dp-pp`` with tp fastest,
then ep, then the expert data-parallel ranks, then pp (a rank is
``tp + TP * (ep + EP * (edp + EDP * pp))``):

- pp: ``At(stage)`` for everything (a stage's layers; the embedding on the first stage, the final
  norm and output layer on the last; with tied embeddings the last stage's copy of the
  embedding, ``output_layer.weight``, is not registered);
- edp: replicated;
- ep: ``At(ep_rank)`` for routed experts, replicated otherwise;
- tp: ``Shard(0)`` for column-parallel weights (``linear_qkv``, ``linear_fc1``, the embedding,
  ``output_layer``, their biases), ``Shard(1)`` for row-parallel ones (``linear_proj``,
  ``linear_fc2``), replicated for norms, the router and row-parallel biases. Experts are split
  over tp the same way (expert tensor parallelism equal to tp; another is refused).

Local layer numbers become global ones from each TransformerLayer's ``layer_number`` (1-based,
global) — or, for the numpy entry :func:`shards`, from explicit offsets; local expert K of
expert-parallel rank r becomes ``r * experts_per_rank + K`` (SequentialMLP
``mlp.experts.local_experts.K.``, TEGroupedMLP ``mlp.experts.linear_fc1.weightK``).

Follows megatron-core 0.20.0's conventions (parallel_state's RankGenerator, GPTModel,
TransformerLayer, SequentialMLP/TEGroupedMLP). A parameter this module cannot describe is
refused, naming it and why; so are context parallelism, a rank order other than the default
and expert tensor parallelism other than tp."""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ._tensors import At, Shard

MESH_DIMS = ("pp", "edp", "ep", "tp")

# What follows "decoder.layers.L." -> the tensor dim tp splits (None: replicated)
_LAYER = [
    (r"input_layernorm\.(weight|bias)", None),
    (r"self_attention\.linear_qkv\.layer_norm_(weight|bias)", None),
    (r"self_attention\.linear_qkv\.(weight|bias)", 0),
    (r"self_attention\.(q|k)_layernorm\.(weight|bias)", None),
    (r"self_attention\.linear_proj\.weight", 1),
    (r"self_attention\.linear_proj\.bias", None),
    (r"pre_mlp_layernorm\.(weight|bias)", None),
    (r"mlp\.linear_fc1\.layer_norm_(weight|bias)", None),
    (r"mlp\.linear_fc1\.(weight|bias)", 0),
    (r"mlp\.linear_fc2\.weight", 1),
    (r"mlp\.linear_fc2\.bias", None),
    (r"mlp\.router\.(weight|bias)", None),
    (r"mlp\.shared_experts\.linear_fc1\.weight", 0),
    (r"mlp\.shared_experts\.linear_fc2\.weight", 1),
    (r"mlp\.shared_experts\.gate_weight", None),
]
# Routed experts: (pattern with the local expert number as group "k", tp dim)
_EXPERT = [
    (r"mlp\.experts\.local_experts\.(?P<k>\d+)\.linear_fc1\.(weight|bias)", 0),
    (r"mlp\.experts\.local_experts\.(?P<k>\d+)\.linear_fc2\.weight", 1),
    (r"mlp\.experts\.local_experts\.(?P<k>\d+)\.linear_fc2\.bias", None),
    (r"mlp\.experts\.linear_fc1\.(weight|bias)(?P<k>\d+)", 0),
    (r"mlp\.experts\.linear_fc2\.weight(?P<k>\d+)", 1),
    (r"mlp\.experts\.linear_fc2\.bias(?P<k>\d+)", None),
]
_TOP = [
    (r"embedding\.word_embeddings\.weight", 0),
    (r"embedding\.position_embeddings\.weight", None),
    (r"decoder\.final_layernorm\.(weight|bias)", None),
    (r"output_layer\.(weight|bias)", 0),
]


def mesh(tp: int = 1, pp: int = 1, ep: int = 1, edp: int = 1) -> List[Tuple[str, int]]:
    """The trainers' device mesh for Trainer(mesh=...): (pp, edp, ep, tp), tp fastest."""
    return [("pp", pp), ("edp", edp), ("ep", ep), ("tp", tp)]


def _pair(what: str, x) -> Tuple[int, int]:
    try:
        r, n = (int(v) for v in x)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: expected (rank, size), got {x!r}") from None
    if n < 1 or not 0 <= r < n:
        raise ValueError(f"{what}: rank {r} of size {n}: expected 0 <= rank < size")
    return r, n


class _Par:
    def __init__(self, tp, pp, ep, edp, num_experts, tied):
        self.tp, self.pp, self.ep, self.edp = tp, pp, ep, edp
        self.num_experts = num_experts
        self.tied = tied
        self.per = None
        if num_experts is not None:
            if num_experts < 1 or num_experts % ep[1]:
                raise ValueError(
                    f"num_experts {num_experts} cannot be split evenly over {ep[1]} expert-parallel ranks"
                )
            self.per = num_experts // ep[1]


def _describe(par: _Par, name: str, layer: Callable[[int], int]):
    """(global name, tp dim or None, expert or not) of local parameter `name`; None for one
    that is not registered (the tied output layer's copy); ValueError naming it otherwise."""
    for pat, dim in _TOP:
        if re.fullmatch(pat, name):
            if name == "output_layer.weight" and par.tied:
                return None  # the last stage's copy of the tied embedding
            if name.startswith("embedding.") and par.pp[0] != 0:
                raise ValueError(
                    f"{name}: an embedding on pipeline stage {par.pp[0]}, not the first "
                    "(multi-token prediction layers are not described)"
                )
            return name, dim, False
    m = re.fullmatch(r"decoder\.layers\.(\d+)\.(.*)", name)
    if not m:
        if name.startswith("mtp."):
            raise ValueError(f"{name}: multi-token prediction layers are not described")
        raise ValueError(f"{name}: not a Megatron-core GPT parameter this module knows")
    local, rest = int(m.group(1)), m.group(2)
    prefix = f"decoder.layers.{layer(local)}."
    for pat, dim in _LAYER:
        if re.fullmatch(pat, rest):
            return prefix + rest, dim, False
    for pat, dim in _EXPERT:
        e = re.fullmatch(pat, rest)
        if not e:
            continue
        k = int(e.group("k"))
        if par.per is None:
            raise ValueError(f"{name}: a routed expert's parameter, and the number of experts is not known")
        if k >= par.per:
            raise ValueError(
                f"{name}: local expert {k}, but each of the {par.ep[1]} expert-parallel ranks "
                f"holds {par.per} of {par.num_experts}"
            )
        g = par.ep[0] * par.per + k
        a, b = e.span("k")
        return prefix + rest[:a] + str(g) + rest[b:], dim, True
    raise ValueError(
        f"{name}: not a Megatron-core GPT layer parameter this module knows (its tensor-parallel "
        "split is unknown)"
    )


def _register(par: _Par, chunks, dtype: Optional[str]) -> Dict[str, Shard]:
    """chunks: [(named locals, local layer -> global layer)] -> {global name: Shard}."""
    out: Dict[str, Shard] = {}
    tp_r, tp_n = par.tp
    for named, layer in chunks:
        for name, local in named:
            d = _describe(par, name, layer)
            if d is None:
                continue
            gname, dim, expert = d
            shape = [int(s) for s in local.shape]
            offset = [0] * len(shape)
            if dim is not None and tp_n > 1:
                if dim >= len(shape):
                    raise ValueError(
                        f"{name}: split along dim {dim} by tensor parallelism, but it has shape {tuple(shape)}"
                    )
                offset[dim] = tp_r * shape[dim]
                shape[dim] *= tp_n
            place = [At(par.pp[0]), None, At(par.ep[0]) if expert else None, dim if tp_n > 1 else None]
            if gname in out:
                raise ValueError(f"{name}: registers {gname}, which another parameter of this rank registers too")
            out[gname] = Shard(local, shape, offset, place, dtype)
    return out


def shards(
    named_locals,
    *,
    tp: Sequence[int] = (0, 1),
    pp: Sequence[int] = (0, 1),
    ep: Sequence[int] = (0, 1),
    edp: Sequence[int] = (0, 1),
    layer_offset=0,
    num_experts: Optional[int] = None,
    tied_embeddings: bool = False,
    dtype: Optional[str] = None,
) -> Tuple[List[Tuple[str, int]], Dict[str, Shard]]:
    """The registrations of one Megatron-core trainer rank from arrays (numpy, or any tensor
    weightbridge takes): ``named_locals`` yields (name, local array) as a model chunk's
    ``named_parameters()`` does — local layer and expert numbers. ``tp``, ``pp``, ``ep``,
    ``edp``: (rank, size) of this rank in each. ``layer_offset``: the global number of the
    chunk's layer 0; with virtual pipeline stages ``named_locals`` is a list of chunks and
    ``layer_offset`` a list of their offsets. ``num_experts``: routed experts in all (needed
    when there are any). ``dtype`` names the arrays' element type where theirs cannot (numpy
    uint16 holding bfloat16: "bf16"). Returns (mesh, {global name: Shard}) for
    ``Trainer(tensors=..., mesh=...)``."""
    par = _Par(_pair("tp", tp), _pair("pp", pp), _pair("ep", ep), _pair("edp", edp), num_experts,
               tied_embeddings)
    if isinstance(layer_offset, (list, tuple)):
        chunks = list(named_locals)
        if len(chunks) != len(layer_offset):
            raise ValueError(f"{len(chunks)} model chunks and {len(layer_offset)} layer offsets")
        offsets = [int(o) for o in layer_offset]
    else:
        chunks, offsets = [named_locals], [int(layer_offset)]
    m = mesh(par.tp[1], par.pp[1], par.ep[1], par.edp[1])
    return m, _register(par, [(c, (lambda k, o=o: k + o)) for c, o in zip(chunks, offsets)], dtype)


def _unwrap(chunk):
    """A model chunk inside Megatron's wrappers (DDP, Float16Module: ``.module``)."""
    while hasattr(chunk, "module") and not hasattr(chunk, "decoder") and not hasattr(chunk, "embedding"):
        chunk = chunk.module
    return chunk


def _layer_numbers(chunk) -> Dict[int, int]:
    """{local layer index: global 0-based layer} from the chunk's TransformerLayers."""
    out = {}
    for mname, mod in chunk.named_modules():
        m = re.fullmatch(r"decoder\.layers\.(\d+)", mname)
        if m and hasattr(mod, "layer_number"):
            out[int(m.group(1))] = int(mod.layer_number) - 1  # layer_number is 1-based, global
    return out


def check_parallel(rank: int, tp, ep, edp, pp, pp_group: Sequence[int], cp: int = 1, etp: Optional[int] = None):
    """What the mesh (pp, edp, ep, tp) assumes of Megatron's parallel state, given as this rank's
    global number, (rank, size) in tp/ep/edp/pp, its pipeline group's global ranks, the context
    and expert tensor parallel sizes: ValueError saying what differs. Megatron's default rank
    order (tp-cp-ep-dp-pp) numbers this rank tp + TP * (ep + EP * (edp + EDP * pp)), and its
    pipeline group steps by TP * EP * EDP; another order would make the mesh name other ranks
    than the ones holding the tensors."""
    if cp > 1:
        raise ValueError(f"context parallelism {cp}: not described (the mesh has no cp dim); train with "
                         "context_parallel_size 1")
    if etp is not None and etp != tp[1]:
        raise ValueError(f"expert tensor parallelism {etp} differs from tensor parallelism {tp[1]}: not described")
    want = tp[0] + tp[1] * (ep[0] + ep[1] * (edp[0] + edp[1] * pp[0]))
    stride = tp[1] * ep[1] * edp[1]
    if rank != want or list(pp_group) != [want - pp[0] * stride + s * stride for s in range(pp[1])]:
        raise ValueError(
            f"rank {rank}: Megatron's rank order is not its default tp-cp-ep-dp-pp (this rank is "
            f"tp {tp[0]}/{tp[1]}, ep {ep[0]}/{ep[1]}, expert data-parallel {edp[0]}/{edp[1]}, pp "
            f"{pp[0]}/{pp[1]}, which that order numbers {want}, pipeline group {list(pp_group)}); "
            "weightbridge's mesh (pp, edp, ep, tp) follows that order"
        )


def from_model(chunks) -> Tuple[List[Tuple[str, int]], Dict[str, Shard], Dict[str, Any]]:
    """(mesh, {global name: Shard}, {global name: Parameter}) of this rank's model chunks, read
    from megatron.core.parallel_state (initialized)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    tp = (ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size())
    pp = (ps.get_pipeline_model_parallel_rank(), ps.get_pipeline_model_parallel_world_size())
    ep = (ps.get_expert_model_parallel_rank(), ps.get_expert_model_parallel_world_size())
    edp = (ps.get_expert_data_parallel_rank(), ps.get_expert_data_parallel_world_size())
    check_parallel(dist.get_rank(), tp, ep, edp, pp,
                   dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group()),
                   ps.get_context_parallel_world_size(), ps.get_expert_tensor_parallel_world_size())
    chunks = [_unwrap(c) for c in chunks]
    cfg = getattr(chunks[0], "config", None)
    num_experts = getattr(cfg, "num_moe_experts", None)
    tied = bool(getattr(chunks[0], "share_embeddings_and_output_weights", False))
    par = _Par(tp, pp, ep, edp, num_experts, tied)
    watch: Dict[str, Any] = {}
    todo = []
    for i, c in enumerate(chunks):
        numbers = _layer_numbers(c)
        named = []
        for name, p in c.named_parameters():
            if type(p).__name__ == "DTensor" or type(getattr(p, "data", None)).__name__ == "DTensor":
                raise ValueError(f"{name}: a DTensor (Megatron FSDP): not described here")
            named.append((name, p.data))

        def layer(k, numbers=numbers, i=i):
            if k not in numbers:
                raise ValueError(f"model chunk {i}: decoder.layers.{k}: no TransformerLayer with a layer_number")
            return numbers[k]

        todo.append((named, layer))
        for name, p in c.named_parameters():
            d = _describe(par, name, layer)
            if d is not None:
                watch[d[0]] = p
    return mesh(tp[1], pp[1], ep[1], edp[1]), _register(par, todo, None), watch


def is_model_chunks(model) -> bool:
    """Whether `model` is a list of model chunks (Megatron's get_model() returns one)."""
    return isinstance(model, (list, tuple))


__all__ = ["MESH_DIMS", "mesh", "shards", "from_model", "check_parallel"]
