"""Run small element-wise work on the calling thread only; keep GEMMs and attention multi-threaded.

Every multi-threaded torch op on the CPU is one OpenMP parallel region that ends in a barrier. On a
2-core machine that other processes also use, a region waits whenever its peer thread is descheduled,
which costs a scheduler time slice (milliseconds) however small the op. The blend's late layers run
dozens of small ops (norms, RoPE, residual adds on a few hundred rows) per layer; serialising them
costs ~1% of the blend on an idle machine and saves seconds on a busy one. Thread counts are per
calling thread (OpenMP/MKL ICVs), so other threads using torch are not affected.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

# Element-wise work on tensors up to about this many elements runs serially.
SERIAL_MAX_ELEMENTS = 1 << 21

_local = threading.local()


@contextmanager
def serial(enabled: bool = True) -> Iterator[None]:
    """Ops inside run on one thread, except inside `parallel()` blocks."""
    threads = torch.get_num_threads()
    if not enabled or threads == 1 or getattr(_local, "threads", None):
        yield
        return
    _local.threads = threads
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        _local.threads = None


@contextmanager
def parallel() -> Iterator[None]:
    """Inside `serial()`: give the enclosed heavy op (GEMM, attention) all threads again."""
    threads = getattr(_local, "threads", None)
    if not threads or getattr(_local, "in_parallel", False):
        yield
        return
    _local.in_parallel = True
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(1)
        _local.in_parallel = False
