"""What the tracer records of each ``torch.distributed`` call, read from its arguments.

The tracer (tracer.py) wraps the functions named in :data:`TRACED_OPS`; for each call it binds
the arguments by name (:func:`by_name`) and asks the op's extractor in :data:`EXTRACT` for
what every rank must agree on: the shapes and dtypes, the reduce op, and which argument names
the root. Kept apart from the tracer: this is the table of torch's signatures, which changes
with torch's releases, while the tracer's recording and completion logic does not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "barrier",
)
P2P = ("send", "recv", "isend", "irecv")
TRACED_OPS = (*COLLECTIVES, *P2P, "batch_isend_irecv")
"""The ``torch.distributed`` functions the tracer wraps (those this torch has)."""

# --- what to record for each op --------------------------------------------------------------

_DTYPE_NAMES: dict[torch.dtype, str] = {}


def dtype_name(t: torch.Tensor) -> str:
    name = _DTYPE_NAMES.get(t.dtype)
    if name is None:
        name = _DTYPE_NAMES[t.dtype] = str(t.dtype).removeprefix("torch.")
    return name


def tensors(*ts: Any) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]:
    shapes, dtypes = [], []
    for t in ts:
        if isinstance(t, torch.Tensor):
            shapes.append(tuple(t.shape))
            dtypes.append(dtype_name(t))
    return tuple(shapes), tuple(dtypes)


def redop(op: Any) -> str:
    if op is None:
        return "sum"
    name = getattr(op, "name", None)  # RedOpType.SUM.name == "SUM"
    return str(name).lower() if name else str(op).rsplit(".", 1)[-1].lower()


# Each extractor maps the call's bound arguments to (shapes, dtypes, reduce_op, root key).
# Shapes are those every rank must agree on: a root's list arguments legitimately differ from
# the others' (None there), so they are left out.
Extract = Callable[[dict[str, Any]], tuple[Any, Any, str | None, str | None]]


def _ex_tensor(root: str | None, reduce: bool) -> Extract:
    def ex(a: dict[str, Any]) -> tuple[Any, Any, str | None, str | None]:
        shapes, dtypes = tensors(a.get("tensor"))
        return shapes, dtypes, redop(a.get("op")) if reduce else None, root

    return ex


def _ex_pair(out: str, inp: str, reduce: bool) -> Extract:
    def ex(a: dict[str, Any]) -> tuple[Any, Any, str | None, str | None]:
        shapes, dtypes = tensors(a.get(inp), a.get(out))
        return shapes, dtypes, redop(a.get("op")) if reduce else None, None

    return ex


def _ex_all_gather(a: dict[str, Any]) -> tuple[Any, Any, str | None, str | None]:
    shapes, dtypes = tensors(a.get("tensor"))
    return shapes, dtypes, None, None


def _ex_reduce_scatter(a: dict[str, Any]) -> tuple[Any, Any, str | None, str | None]:
    shapes, dtypes = tensors(a.get("output"))
    return shapes, dtypes, redop(a.get("op")), None


def _ex_all_to_all(a: dict[str, Any]) -> tuple[Any, Any, str | None, str | None]:
    inputs = a.get("input_tensor_list") or []
    # Per-peer sizes may legitimately differ: only the dtype and the list length must agree.
    dtypes = tuple(sorted({dtype_name(t) for t in inputs}))
    return ((len(inputs),),), dtypes, None, None


def _ex_all_to_all_single(a: dict[str, Any]) -> tuple[Any, Any, str | None, str | None]:
    if a.get("output_split_sizes") is None and a.get("input_split_sizes") is None:
        shapes, dtypes = tensors(a.get("input"), a.get("output"))
        return shapes, dtypes, None, None
    _, dtypes = tensors(a.get("input"))
    return (), dtypes, None, None


def _ex_none(a: dict[str, Any]) -> tuple[Any, Any, str | None, str | None]:
    return (), (), None, None


EXTRACT: dict[str, Extract] = {
    "all_reduce": _ex_tensor(None, reduce=True),
    "broadcast": _ex_tensor("src", reduce=False),
    "reduce": _ex_tensor("dst", reduce=True),
    "gather": _ex_tensor("dst", reduce=False),
    "scatter": _ex_tensor("src", reduce=False),
    "all_gather": _ex_all_gather,
    "all_gather_into_tensor": _ex_pair("output_tensor", "input_tensor", reduce=False),
    "all_gather_single": _ex_pair("output_tensor", "input_tensor", reduce=False),
    "reduce_scatter": _ex_reduce_scatter,
    "reduce_scatter_tensor": _ex_pair("output", "input", reduce=True),
    "reduce_scatter_single": _ex_pair("output", "input", reduce=True),
    "all_to_all": _ex_all_to_all,
    "all_to_all_single": _ex_all_to_all_single,
    "barrier": _ex_none,
}
# Same collective under its deprecated and new names: one name in records, so ranks that use
# different spellings still line up.
CANONICAL = {
    "all_gather_single": "all_gather_into_tensor",
    "reduce_scatter_single": "reduce_scatter_tensor",
}


def by_name(
    names: tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """A wrapped call's arguments by parameter name (args may stop before the defaults)."""
    a = dict(zip(names, args, strict=False))
    a.update(kwargs)
    return a


def global_rank(a: dict[str, Any], ranks: list[int], key: str) -> int | None:
    """The global rank an argument names: ``key`` (src, dst) itself or, when only the group-local
    ``group_<key>`` is given (torch >= 2.3), its global rank in the group (``ranks``: the
    group's global ranks); None if neither."""
    rank = a.get(key)
    group_rank = a.get("group_" + key)
    if rank is None and group_rank is not None:
        rank = ranks[group_rank]
    return rank
