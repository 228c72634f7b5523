"""The context's stored KV in a prompt pass: read layer by layer and rotated into the working cache.

Every cached prompt pass writes the stored K (pre-RoPE) of all context tokens into the working cache,
rotated to their real positions, and their V beside it: per layer one read from the `LayerKVReader`
(int4 dequantisation included) and a RoPE over (kv_heads × N × head_dim) values. In bfloat16 the GEMMs
are fast enough that this is a large share of a blend's fixed cost, and most of the reuse floor.

Where it runs depends on the device:

- CPU (`overlap` off): on the request thread, with all of torch's threads, when `fill(l)` asks for layer l
  (the reader converts there too: `kvcache.loader`). A background thread reading ahead only moved the
  work onto a third thread that competed with the compute's OpenMP team for the same cores: on a 2-core
  bf16 CPU, in paired runs, the reuse floor went 0.49 → 0.35 s and the shipped blends 1.92 → 1.66 s
  (SmolLM2) and 3.73 → 3.17 s (Qwen2.5-Coder-0.5B) when it moved back to the request thread
  (docs/benchmarks.md, "Stored context on the request thread").
- Accelerators (`overlap` on): layer l+1 is read and rotated on the transformer's background thread while
  layer l computes (`fill(l)` waits for layer l, then schedules layer l+1): the compute is queued on the
  device, so the host thread is free. The background work runs the same ops, so the cache holds the same
  bits either way; no two layers' writes overlap and the pass only touches a layer after `fill` has
  waited for it.
"""

from __future__ import annotations

import time
from concurrent.futures import Future

import torch

from engine.layers import Transformer
from engine.rope import apply_rope
from engine.threads import SERIAL_MAX_ELEMENTS, serial
from engine.working_cache import WorkingCache
from kvcache.types import LayerKVReader


class StoredContext:
    """The context's stored KV: read from the reader once per layer, in layer order, and written into the
    working cache rotated to the context's real positions (rows the pass computes fresh overwrite theirs).

    With `overlap` the next layer is read and written on `tf.background` while the caller computes the
    current one; without it every layer is read and written when `fill` asks for it, with the caller's
    torch threads. By default overlap is on except on the CPU (module docstring).
    """

    def __init__(
        self,
        tf: Transformer,
        reader: LayerKVReader,
        cache: WorkingCache,
        start: int,
        stop: int,
        overlap: bool | None = None,
    ) -> None:
        self.tf, self.reader, self.cache = tf, reader, cache
        self.span = slice(start, stop)  # the reused rows: all context rows, or the first chunk (mode prefix)
        # One cos/sin lookup per RoPE table serves every layer (Gemma 3's sliding-window layers have their own).
        self.rotations = {id(rope): rope.at(self.span) for rope in (tf.rope, tf.rope_local) if rope is not None}
        self.num_layers_written = 0  # layers 0…num_layers_written-1 hold the rotated stored KV
        self.wait_s = 0.0  # time the pass waited for stored KV: storage not hidden behind compute
        self.overlap = tf.device.type != "cpu" if overlap is None else overlap
        self._pending: tuple[int, Future[tuple[torch.Tensor, torch.Tensor]]] | None = None
        cfg = tf.cfg
        # Beside a background read, small copies run on one thread (see engine/threads.py). Without one the
        # request thread has the cores to itself between two layers, and a layer's context is one large
        # op per step: it uses all of them.
        numel = cfg.num_kv_heads * reader.num_tokens * cfg.head_dim
        self._small = self.overlap and tf.device.type == "cpu" and numel <= SERIAL_MAX_ELEMENTS

    def read(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Stored K (pre-RoPE) and V of every context token at `layer`, each (kv_heads, N, D)."""
        pending = self._take_pending()
        t = time.perf_counter()
        if pending is not None and pending[0] == layer:
            k, v = pending[1].result()  # also rotated into the cache already: the caller may write it again
        else:
            with serial(self._small):
                k, v = self._read(layer)
        self.wait_s += time.perf_counter() - t
        return k, v

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        with serial(self._small):
            self._write(layer, k, v)
        self.num_layers_written = layer + 1

    def fill(self, layer: int) -> None:
        """Make the cache hold the stored KV at `layer` (a no-op for layers the scoring pass filled), and
        start on the next layer in the background."""
        if layer < self.num_layers_written:
            return
        pending = self._take_pending()
        if pending is not None and pending[0] == layer:
            t = time.perf_counter()
            pending[1].result()  # re-raises what the background read raised
            self.wait_s += time.perf_counter() - t
            self.num_layers_written = layer + 1
        else:
            self.write(layer, *self.read(layer))
        if self.overlap and layer + 1 < self.reader.num_layers:
            # Grad and inference mode are per thread: the background write runs in the caller's, or writing
            # into a cache made under torch.inference_mode() (bench/passes.py) would be refused.
            inference = torch.is_inference_mode_enabled()
            self._pending = (layer + 1, self.tf.background.submit(self._read_and_write, layer + 1, inference))

    def wait_for_background(self) -> None:
        """Let the layer being read ahead finish (its errors are dropped: no caller needs that layer)."""
        self._take_pending()

    # -- internals -------------------------------------------------------------------------------------

    def _take_pending(self) -> tuple[int, Future[tuple[torch.Tensor, torch.Tensor]]] | None:
        """The scheduled layer, finished (an out-of-order read must not share the reader with it)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending[1].exception()  # wait; its error, if any, is re-raised by whoever uses its result
        return pending

    def _read(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.reader.layer(layer)
        return k.to(self.tf.device, self.tf.dtype), v.to(self.tf.device, self.tf.dtype)

    def _write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        n = self.span.stop - self.span.start
        cos, sin = self.rotations[id(self.tf.layer_rope(layer))]
        apply_rope(k[:, :n], cos, sin, out=self.cache.k[layer, 0, :, self.span])
        self.cache.v[layer, 0, :, self.span] = v[:, :n]

    def _read_and_write(self, layer: int, inference: bool) -> tuple[torch.Tensor, torch.Tensor]:
        # The background thread's ops run on it alone: the caller's GEMMs keep the cores' OpenMP team.
        with torch.inference_mode(inference), torch.no_grad(), serial(self.tf.device.type == "cpu"):
            k, v = self._read(layer)
            self._write(layer, k, v)
        return k, v
