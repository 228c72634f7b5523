"""Whether other processes share the CPU a benchmark runs on, and how much of it they take.

A run's torch threads are OpenMP threads that wait for each other at every parallel region: when other work
holds a core, the region runs at the pace of the thread that gets the CPU last. On a 2-core machine a
two-thread run beside a one-thread run measured about 30× slower than alone, not 2×. Load averages (which
every result records) lag by a minute and count this process too; this module samples the CPU time the
*other* processes took over a short interval instead (Linux `/proc/stat` less this process's own time), so a
run can say at its start that its timings will not be its own, and record what it shared the CPU with.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

PROC_STAT = Path("/proc/stat")
SAMPLE_S = 0.25
# Cores of other work a run tolerates before it warns: a shell, a logger, the kernel's own housekeeping.
TOLERANCE_CORES = 0.25

# /proc/stat's aggregate "cpu" line, after the label: user nice system idle iowait irq softirq steal guest guest_nice.
# guest and guest_nice are already counted in user and nice; idle and iowait are the CPU doing nothing.
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


def busy_jiffies(stat_text: str) -> int:
    """The CPU time (clock ticks, all cores) spent busy since boot, from the text of /proc/stat."""
    for line in stat_text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            values = [int(v) for v in fields[1:]]
            return sum(values[i] for i in _BUSY_FIELDS if i < len(values))
    raise ValueError("/proc/stat has no aggregate 'cpu' line")


@dataclass(frozen=True)
class CpuShare:
    """What the CPU did over one sample: `num_cores` this process may run on and the cores' worth of time
    that other processes kept busy (`busy_elsewhere`, 0.0 on an idle machine, 1.0 for one busy core)."""

    num_cores: int
    busy_elsewhere: float

    def oversubscribed_by(self, num_threads: int) -> float:
        """How many cores' worth of threads more than there are cores, when this run's `num_threads` join
        the other work (0.0 when they fit, within TOLERANCE_CORES)."""
        excess = self.busy_elsewhere + num_threads - self.num_cores
        return round(excess, 2) if excess > TOLERANCE_CORES else 0.0

    def warning(self, num_threads: int) -> str | None:
        """The message a run logs at its start when its threads do not fit beside the other work, else None."""
        if not self.oversubscribed_by(num_threads):
            return None
        return (
            f"other processes keep {self.busy_elsewhere:.1f} of {self.num_cores} cores busy; with "
            f"{num_threads} torch thread(s) this run oversubscribes the CPU and its OpenMP threads wait on each "
            "other, so its timings are not its own (runs side by side can be many times slower, not 2x): "
            "run it alone, or give each run --threads so that their sum fits the cores"
        )

    def as_record(self) -> dict[str, float | int]:
        return {"num_cores": self.num_cores, "busy_elsewhere": round(self.busy_elsewhere, 2)}


def available_cores() -> int:
    """The cores this process may run on (its affinity mask, which a container's cpuset narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def sample(interval_s: float = SAMPLE_S) -> CpuShare | None:
    """The cores other processes kept busy over `interval_s` (this process's own CPU time taken out), or None
    where /proc/stat cannot be read (not Linux). Measured while this process waits, so its own share is ~0."""
    try:
        ticks_per_s = os.sysconf("SC_CLK_TCK")
        busy_before, own_before = busy_jiffies(PROC_STAT.read_text()), _own_cpu_s()
        started = time.monotonic()
        time.sleep(interval_s)
        busy_after, own_after = busy_jiffies(PROC_STAT.read_text()), _own_cpu_s()
        elapsed = time.monotonic() - started
    except (OSError, ValueError) as error:
        logger.debug("cannot sample the CPU's load: %s", error)
        return None
    busy_s = (busy_after - busy_before) / ticks_per_s - (own_after - own_before)
    # Counted over all host CPUs where the affinity mask is narrower: clip to what this process may use.
    num_cores = available_cores()
    return CpuShare(num_cores=num_cores, busy_elsewhere=min(max(busy_s / elapsed, 0.0), float(num_cores)))


def _own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def warn_if_shared(num_threads: int) -> CpuShare | None:
    """Sample the CPU and log a warning when `num_threads` do not fit beside the other work; the sample, for
    the result's run record."""
    share = sample()
    if share is not None and (message := share.warning(num_threads)):
        logger.warning("%s", message)
    return share
