"""How long a request submitted now would wait before its prompt pass starts: what a busy engine tells a client.

The scheduler (engine/scheduler.py) knows everything ahead of a new request: the question-priority chunk
precompute, the prompt pass running now, the requests waiting for theirs (each with its mode, its prompt and
its token limit) and the requests decoding. What it does not know up front is how fast this machine is, so it
measures that as it works (`ServiceRates`): the prompt rate of each mode (fresh tokens per second of compute;
the full mode's seeded by the server's start-up prefill rate probe, app/services/estimates.py), the time of a
batched decode step for each batch size, and how much of its token limit an answer uses.

`estimate_admission` then replays the scheduler's policy on a snapshot of its queue (`QueueSnapshot`), without
running anything:

* prompt passes run one at a time, in arrival order, questions' chunk precompute first;
* a waiting request starts its pass only while fewer than `max_running` requests decode; otherwise it waits
  until the first of them ends (its expected remaining tokens × the decode step time);
* while a pass runs, the decoding requests take a step every `decode_interval_s` of prompt compute, which
  lengthens the pass by that step's time (the scheduler's split at layer boundaries).

The result (`AdmissionEstimate`) is the new request's wait until its prompt pass starts (`wait_s`; what
`engine.max_queue_wait_s` is compared with) and the time until the first waiting request starts its own, which
frees a place in a full queue (`slot_s`; the earliest a refused client's retry can be admitted, its
`Retry-After`). Both are estimates: an answer may end earlier or later than the answers before it did, a
prompt of a new length may run at another rate, and another process may take the cores.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.blend.plan import exact_first_segment
from engine.blend.selectors import num_recompute_tokens
from engine.types import DEFAULT_RETRY_AFTER_S

if TYPE_CHECKING:
    from engine.types import GenerationRequest, Mode

# Weight of a new observation in the moving averages: the last ~5 observations dominate, so the estimate follows
# a change in load (another process on the cores) within a few requests without jumping on one outlier.
EMA_ALPHA = 0.2


def ema(previous: float | None, value: float, alpha: float = EMA_ALPHA) -> float:
    return value if previous is None else (1 - alpha) * previous + alpha * value


def fresh_tokens(request: GenerationRequest, num_layers: int) -> float:
    """The work of a request's prompt pass in fresh tokens: rows computed through every layer (a row computed
    through half the layers counts one half). Reused rows cost far less (their stored KV is read and rotated),
    which the measured rate of each mode absorbs (`ServiceRates.prompt_rate`).

    Follows the modes of engine/blend/plan.py: full computes every row; prefix every row after the exact prefix and
    first segment; reuse the suffix; an up-front blend the suffix and `recompute_ratio` of the context; a
    check-layer blend every non-prefix row up to its first check layer, then the suffix and each check layer's
    share of the context. The extra rows a blend may add (matched spans, an adaptive budget) are left out."""
    layout = request.layout
    p, n, s = layout.num_prefix_tokens, layout.num_context_tokens, len(layout.suffix_ids)
    mode = request.mode
    if mode == "full":
        return float(p + n + s)
    if mode == "prefix":
        return float(n - exact_first_segment(layout) + s)
    if mode == "reuse" or n == 0:
        return float(s)
    config = request.blend
    if config.upfront:
        return float(s + num_recompute_tokens(config.recompute_ratio, n))
    layers = max(1, num_layers)
    checks = [min(c, layers) for c in config.check_layers]
    row_layers = float((n + s) * checks[0])
    bounds = [*checks[1:], layers]
    for ratio, start, stop in zip(config.ratios(), checks, bounds, strict=True):
        row_layers += (num_recompute_tokens(ratio, n) + s) * max(0, stop - start)
    return row_layers / layers


class ServiceRates:
    """What the scheduler has measured of this machine, as moving averages (`EMA_ALPHA`). The worker thread
    observes, the threads that submit read: both under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prompt_rate: dict[str, float] = {}  # mode → fresh tokens per second of prompt compute
        self._step_s: dict[int, float] = {}  # batch size → seconds of one decode step
        self._answer_share: float | None = None  # an answer's tokens ÷ its max_tokens

    # ---------------------------------------------------------------------------------------- observe
    def observe_prompt(self, mode: Mode, num_fresh_tokens: float, seconds: float) -> None:
        """A prompt pass (or a unit of chunk precompute: mode full) of `num_fresh_tokens` in `seconds` of compute
        (the decode steps taken between its layers not counted)."""
        if num_fresh_tokens <= 0 or seconds <= 0:
            return
        with self._lock:
            self._prompt_rate[mode] = ema(self._prompt_rate.get(mode), num_fresh_tokens / seconds)

    def seed_full_rate(self, tokens_per_s: float | None) -> None:
        """The full-pass rate measured before this process (the data dir's `prefill_rate.json`), until the
        scheduler measures its own: a full pass is what the start-up probe and ingest's precompute time."""
        if tokens_per_s is None or tokens_per_s <= 0:
            return
        with self._lock:
            self._prompt_rate.setdefault("full", tokens_per_s)

    def observe_decode_step(self, batch_size: int, seconds: float) -> None:
        if batch_size <= 0 or seconds <= 0:
            return
        with self._lock:
            self._step_s[batch_size] = ema(self._step_s.get(batch_size), seconds)

    def observe_answer(self, num_completion_tokens: int, max_tokens: int) -> None:
        """A request that ended by itself (a stop, the limit, a repetition; not a cancel) after this many tokens."""
        if max_tokens <= 0:
            return
        with self._lock:
            self._answer_share = ema(self._answer_share, min(1.0, num_completion_tokens / max_tokens))

    # ------------------------------------------------------------------------------------------- read
    def prompt_rate(self, mode: Mode) -> float | None:
        """Fresh tokens per second of a prompt pass in `mode`: its own measured rate, else the full pass's (a
        blend also reads and rotates stored KV, so before its first pass the estimate is a little short)."""
        with self._lock:
            return self._prompt_rate.get(mode, self._prompt_rate.get("full"))

    def step_s(self, batch_size: int) -> float | None:
        """Seconds of a decode step of `batch_size` requests: measured for that size, else interpolated between
        the nearest measured sizes, else the nearest one's (a batched step costs a little more per extra request;
        every size that occurs is measured at its first step)."""
        with self._lock:
            steps = dict(self._step_s)
        if not steps:
            return None
        if batch_size in steps:
            return steps[batch_size]
        below = [b for b in steps if b < batch_size]
        above = [b for b in steps if b > batch_size]
        if below and above:
            lo, hi = max(below), min(above)
            return steps[lo] + (steps[hi] - steps[lo]) * (batch_size - lo) / (hi - lo)
        return steps[max(below)] if below else steps[min(above)]

    def expected_decode_tokens(self, max_tokens: int, generated: int) -> int:
        """Tokens a request that has `generated` of its `max_tokens` is expected to decode still: up to the share
        of the limit answers have used so far (the whole limit before any answer ended). One that is past that
        share already is expected to end halfway between here and its limit."""
        left = max(0, max_tokens - generated)
        with self._lock:
            share = self._answer_share
        if share is None:
            return left
        expected_total = max(1, round(share * max_tokens))
        if generated < expected_total:
            return expected_total - generated
        return math.ceil(left / 2)


@dataclass(frozen=True)
class PromptWork:
    """A request ahead in the queue, as the estimate sees it."""

    mode: Mode
    num_fresh_tokens: float  # its prompt pass's work (`fresh_tokens`)
    max_tokens: int  # its answer's token limit
    generated: int = 0  # tokens it has decoded (for a running request)


@dataclass(frozen=True)
class QueueSnapshot:
    """The scheduler's queue at one moment, taken under its lock."""

    question_precompute_tokens: int  # chunk tokens a question waits for (they go before every prompt pass)
    in_pass: PromptWork | None  # the prompt pass running now
    in_pass_compute_s: float  # the compute it has had (decode steps between its layers not counted)
    waiting: tuple[PromptWork, ...]  # in the order their passes will run
    running: tuple[PromptWork, ...]  # decoding
    max_running: int
    decode_interval_s: float  # a prompt pass lets the decoding requests step at most this often


@dataclass(frozen=True)
class AdmissionEstimate:
    """What a request submitted now faces. None: a rate it needs is not measured yet."""

    wait_s: float | None  # until its prompt pass starts
    slot_s: float | None  # until the first waiting request's pass starts (a place in a full queue frees); wait_s
    # when nobody waits
    num_waiting: int
    num_running: int

    def retry_after_s(self, *, queue_full: bool, max_wait_s: float | None) -> float:
        """When a refused client should come back, in seconds: once a place in the full queue is free (`slot_s`)
        and the wait is down to `max_wait_s` (`engine.max_queue_wait_s`), whichever is later; at least a second
        (the unit of Retry-After), and a second when nothing is measured yet."""
        if self.wait_s is None or self.slot_s is None:
            return DEFAULT_RETRY_AFTER_S
        over_s = self.wait_s - max_wait_s if max_wait_s is not None else 0.0
        return max(1.0, over_s, self.slot_s if queue_full else 0.0)


class _Replay:
    """The scheduler's policy played forward in time over expected work (module docstring)."""

    def __init__(self, snapshot: QueueSnapshot, rates: ServiceRates) -> None:
        self.snapshot, self.rates = snapshot, rates
        self.t = 0.0  # seconds from now
        # The expected remaining tokens of each decoding request.
        expected = (rates.expected_decode_tokens(r.max_tokens, r.generated) for r in snapshot.running)
        self.decoding = [d for d in expected if d > 0]

    def _step_s(self) -> float:
        step = self.rates.step_s(len(self.decoding))
        if step is None:
            raise _Unknown
        return step

    def _decode(self, steps: int) -> None:
        """`steps` decode steps of everything decoding (fewer as requests end)."""
        while steps > 0 and self.decoding:
            run = min(steps, min(self.decoding))  # steps until the next request ends
            self.t += run * self._step_s()
            self.decoding = [d - run for d in self.decoding if d > run]
            steps -= run

    def prompt(self, compute_s: float) -> None:
        """A prompt pass (or question precompute) of `compute_s`, with the decode steps taken between its layers."""
        if compute_s <= 0:
            return
        steps = math.floor(compute_s / self.snapshot.decode_interval_s) if self.decoding else 0
        self.t += compute_s
        self._decode(steps)

    def pass_s(self, work: PromptWork) -> float:
        rate = self.rates.prompt_rate(work.mode)
        if rate is None:
            raise _Unknown
        return work.num_fresh_tokens / rate

    def start(self, work: PromptWork) -> None:
        """A pass ends: its request decodes from now on."""
        left = self.rates.expected_decode_tokens(work.max_tokens, 1)  # the pass sampled its first token
        if left > 0:
            self.decoding.append(left)

    def free_slot(self) -> None:
        """Until fewer than `max_running` requests decode: a waiting request's pass may start."""
        while len(self.decoding) >= self.snapshot.max_running:
            self._decode(min(self.decoding))


class _Unknown(Exception):
    """A rate the replay needs is not measured yet."""


def estimate_admission(snapshot: QueueSnapshot, rates: ServiceRates) -> AdmissionEstimate:
    """Replay the queue (module docstring): when a request submitted now would start its prompt pass, and when
    the first waiting one starts its own."""
    counts = {"num_waiting": len(snapshot.waiting), "num_running": len(snapshot.running)}
    replay = _Replay(snapshot, rates)
    try:
        if snapshot.question_precompute_tokens:
            # Units of chunk precompute, each followed by a decode step: close to a pass with steps between layers.
            full = rates.prompt_rate("full")
            if full is None:
                raise _Unknown
            replay.prompt(snapshot.question_precompute_tokens / full)
        if snapshot.in_pass is not None:
            replay.prompt(max(0.0, replay.pass_s(snapshot.in_pass) - snapshot.in_pass_compute_s))
            replay.start(snapshot.in_pass)
        first_start: float | None = None
        for work in snapshot.waiting:
            replay.free_slot()
            if first_start is None:
                first_start = replay.t
            replay.prompt(replay.pass_s(work))
            replay.start(work)
        replay.free_slot()
    except _Unknown:
        return AdmissionEstimate(wait_s=None, slot_s=None, **counts)
    wait_s = replay.t
    return AdmissionEstimate(wait_s=wait_s, slot_s=wait_s if first_start is None else first_start, **counts)
