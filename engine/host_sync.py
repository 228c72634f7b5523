"""Host round trips: moving small host data to the device without a sync, and finding the calls that sync.

On an accelerator every value the host reads from a device tensor (`.item()`, `int(t)`, `.tolist()`,
`nonzero()`, a boolean-mask index, `.cpu()` …) waits for every kernel queued before it: the host stops
feeding the device, and a prompt pass with one such read per layer runs at the speed of its launches. The
prompt pass keeps every count it needs on the host (the layout says how many tokens each segment has, the
budget is `round(r · N)`), so it never needs to read one back.

- `to_device(t, device)`: a host tensor onto the device asynchronously (pinned, `non_blocking`); a plain
  `.to(device)` of pageable memory is a copy followed by a stream sync.
- `HostSyncAudit`: a `TorchFunctionMode` that records the torch calls which would sync with a device,
  whatever device the tensors are on. It lets a CPU test prove what `torch.cuda.set_sync_debug_mode("error")`
  proves on a GPU for the data-dependent reads (the host-to-device copies it cannot see on a CPU; the
  device check runs the CUDA mode as well).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` (on the host) on `device` without making the host wait: a pinned copy, queued on the stream."""
    if device.type == "cpu":
        return t
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def ids_on(ids: Sequence[int], device: torch.device) -> torch.Tensor:
    """(n,) int64 token ids or positions from a host list onto `device` (`to_device`)."""
    return to_device(torch.tensor(list(ids), dtype=torch.int64), device)


def _name(func: Callable[..., Any]) -> str:
    return getattr(func, "__name__", repr(func))


# Calls whose result the host needs now: on a device each is a copy back plus a stream sync.
_READS = frozenset(
    {
        "item",
        "tolist",
        "numpy",
        "cpu",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "__complex__",
        "nonzero",
        "argwhere",
        "masked_select",
        "unique",
        "unique_consecutive",
        "equal",
        "allclose",
    }
)


def _is_bool_index(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


class HostSyncAudit(TorchFunctionMode):
    """Records (or refuses, with `error=True`) every torch call inside it that makes the host wait for a
    device: the reads in `_READS`, indexing with a boolean mask (a hidden `nonzero`), `repeat_interleave`
    with tensor repeats and no `output_size`, and the one-argument `torch.where`. `calls` lists their names.
    """

    def __init__(self, error: bool = False) -> None:
        super().__init__()
        self.error = error
        self.calls: list[str] = []

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        name = _name(func)
        syncs = name in _READS
        if name in ("__getitem__", "__setitem__", "index_put", "index_put_") and len(args) > 1:
            syncs = _is_bool_index(args[1])
        elif name == "repeat_interleave":
            repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
            syncs = isinstance(repeats, torch.Tensor) and repeats.numel() > 1 and kwargs.get("output_size") is None
        elif name == "where":
            syncs = len(args) + len(kwargs) == 1
        if syncs:
            self.calls.append(name)
            if self.error:
                raise RuntimeError(f"host sync inside a sync-free region: {name}")
        return func(*args, **kwargs)
