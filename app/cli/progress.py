"""`blendrag ingest` progress: one bar per stage in a terminal, plain lines otherwise.

The job reports `stage` (the one running) and `progress` (done/total for every stage). A stage's bar is
drawn from that dict, not from the moment it was seen running, so a stage that finished between two
updates still ends at its total ("parse 1/1"), a stage with nothing to do says so once, and a job that
succeeded shows every stage complete. Without a terminal (CI logs, pipes) each stage prints one line
when it is over, never a carriage-return bar.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

STAGE_ORDER = ("parse", "chunk", "embed", "kv", "commit")
FINISHED = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class JobView:
    """What the printer needs of a job, from the API's JobOut (remote) or a JobRecord (local)."""

    status: str
    stage: str | None
    progress: Mapping[str, Mapping[str, int]]

    @classmethod
    def of(cls, job: Any) -> JobView:
        if isinstance(job, Mapping):
            return cls(str(job["status"]), job.get("stage"), job.get("progress") or {})
        status = getattr(job.status, "value", job.status)
        return cls(str(status), job.stage, job.progress or {})


class IngestProgress:
    """Feed it every job update (`update`), then the final job (`finish`)."""

    def __init__(self, stream: TextIO | None = None, *, tty: bool | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._tty = self._stream.isatty() if tty is None else tty
        self._bars: dict[str, Any] = {}  # stage -> tqdm bar (terminal only)
        self._ended: set[str] = set()  # stages whose final line or bar is out

    def update(self, job: Any) -> None:
        view = JobView.of(job)
        running = view.stage if view.status not in FINISHED else None
        for stage in self._stages(view):
            if stage == running:
                self._draw(stage, view.progress.get(stage, {}), final=False)
                return
            self._end(stage, view.progress.get(stage, {}))

    def finish(self, job: Any) -> None:
        """Close every bar. A succeeded job ends each stage at its total; a failed or cancelled one ends the
        stages it completed, marks the first it did not complete with the outcome, and stops there."""
        view = JobView.of(job)
        for stage in self._stages(view):
            progress = dict(view.progress.get(stage, {}))
            if view.status == "succeeded":
                progress["done"] = progress.get("total", 0)
            elif progress.get("done", 0) < progress.get("total", 0):
                self._end(stage, progress, outcome=view.status)
                return
            self._end(stage, progress)

    def _stages(self, view: JobView) -> list[str]:
        """Stages up to the one running (or all of them once finished), in pipeline order."""
        order = [s for s in STAGE_ORDER if s in view.progress] + [s for s in view.progress if s not in STAGE_ORDER]
        if view.status in FINISHED or view.stage not in order:
            return order if view.status in FINISHED else []
        return order[: order.index(view.stage) + 1]

    def _draw(self, stage: str, progress: Mapping[str, int], *, final: bool) -> None:
        if not self._tty or stage in self._ended:
            return
        total, done = int(progress.get("total", 0)), int(progress.get("done", 0))
        if total == 0 and not final:
            return  # nothing announced yet: a bar of "0it" says nothing
        bar = self._bars.get(stage)
        if bar is None:
            from tqdm import tqdm

            bar = self._bars[stage] = tqdm(
                total=total, desc=f"{stage:>6}", unit="", file=self._stream, leave=True, dynamic_ncols=True
            )
        bar.total = total
        bar.n = min(done, total)
        bar.refresh()

    def _end(self, stage: str, progress: Mapping[str, int], outcome: str | None = None) -> None:
        if stage in self._ended:
            return
        total, done = int(progress.get("total", 0)), int(progress.get("done", 0))
        if total == 0 and outcome is None:
            self._ended.add(stage)
            self._line(f"{stage:>6}: nothing to do")
            return
        if self._tty and total > 0:
            self._draw(stage, progress, final=True)
            bar = self._bars.pop(stage, None)
            if bar is not None:
                if outcome is not None:
                    bar.set_postfix_str(outcome, refresh=True)
                bar.close()
        else:
            suffix = f" ({outcome})" if outcome is not None else ""
            self._line(f"{stage:>6}: {min(done, total)}/{total}{suffix}")
        self._ended.add(stage)

    def _line(self, text: str) -> None:
        print(text, file=self._stream, flush=True)
