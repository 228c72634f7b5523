"""The CPU time other processes take, sampled at a run's start, and the warning when a run's threads do not fit."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator

import pytest

from bench import cpu_share
from bench.cpu_share import CpuShare, busy_jiffies
from bench.harness import RunRecord

STAT_BEFORE = "cpu  1000 10 200 5000 40 0 5 3 0 0\ncpu0 500 5 100 2500 20 0 2 1 0 0\nintr 12345\n"
# 100 busy ticks later over all cores: user +70, nice +5, system +20, softirq +4, steal +1 (idle, iowait ignored)
STAT_AFTER = "cpu  1070 15 220 5090 50 0 9 4 0 0\ncpu0 535 7 110 2545 25 0 4 2 0 0\nintr 12399\n"


def test_busy_jiffies_counts_user_nice_system_irq_softirq_steal() -> None:
    assert busy_jiffies(STAT_BEFORE) == 1000 + 10 + 200 + 0 + 5 + 3
    assert busy_jiffies(STAT_AFTER) - busy_jiffies(STAT_BEFORE) == 100
    with pytest.raises(ValueError, match="no aggregate 'cpu' line"):
        busy_jiffies("cpu0 1 2 3 4\n")


def test_threads_that_fit_beside_the_other_work_do_not_warn() -> None:
    idle = CpuShare(num_cores=2, busy_elsewhere=0.1)
    assert idle.oversubscribed_by(2) == 0.0 and idle.warning(2) is None
    beside_one = CpuShare(num_cores=2, busy_elsewhere=1.0)
    assert beside_one.oversubscribed_by(1) == 0.0 and beside_one.warning(1) is None  # two 1-thread runs
    assert beside_one.oversubscribed_by(2) == 1.0
    message = beside_one.warning(2)
    assert message is not None and message.startswith("other processes keep 1.0 of 2 cores busy; with 2 torch")
    assert "--threads" in message
    # within the tolerance (a shell, a logger) is not a warning; just past it is
    assert CpuShare(num_cores=2, busy_elsewhere=0.25).oversubscribed_by(2) == 0.0
    assert CpuShare(num_cores=2, busy_elsewhere=0.3).oversubscribed_by(2) == 0.3
    assert CpuShare(num_cores=4, busy_elsewhere=1.234).as_record() == {"num_cores": 4, "busy_elsewhere": 1.23}


class _FakeStat:
    def __init__(self, texts: list[str]) -> None:
        self._texts = iter(texts)

    def read_text(self) -> str:
        return next(self._texts)


def _fake_clock(monkeypatch: pytest.MonkeyPatch, own_cpu_s: list[float], monotonic_s: list[float]) -> None:
    own: Iterator[float] = iter(own_cpu_s)
    clock: Iterator[float] = iter(monotonic_s)
    monkeypatch.setattr(cpu_share, "_own_cpu_s", lambda: next(own))
    monkeypatch.setattr(cpu_share.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(cpu_share.time, "sleep", lambda _s: None)
    monkeypatch.setattr(cpu_share.os, "sysconf", lambda _name: 100)
    monkeypatch.setattr(cpu_share, "available_cores", lambda: 2)


def test_sample_takes_this_process_out_of_the_busy_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_share, "PROC_STAT", _FakeStat([STAT_BEFORE, STAT_AFTER]))
    # 100 ticks at 100 Hz = 1.0 s busy over 0.5 s; this process took 0.1 s of it: others kept 1.8 cores busy
    _fake_clock(monkeypatch, own_cpu_s=[3.0, 3.1], monotonic_s=[10.0, 10.5])
    assert cpu_share.sample() == CpuShare(num_cores=2, busy_elsewhere=pytest.approx(1.8))


def test_sample_clips_to_the_cores_this_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    # /proc/stat counts every host CPU; a cpuset of 2 cannot have more than 2 busy beside it
    monkeypatch.setattr(cpu_share, "PROC_STAT", _FakeStat([STAT_BEFORE, STAT_AFTER]))
    _fake_clock(monkeypatch, own_cpu_s=[0.0, 0.0], monotonic_s=[0.0, 0.25])
    assert cpu_share.sample() == CpuShare(num_cores=2, busy_elsewhere=2.0)


def test_sample_is_none_where_proc_stat_cannot_be_read(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(cpu_share, "PROC_STAT", tmp_path / "missing")
    assert cpu_share.sample() is None


def test_a_run_warns_at_its_start_and_records_what_it_shared(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(cpu_share, "sample", lambda: CpuShare(num_cores=2, busy_elsewhere=1.0))
    with caplog.at_level(logging.WARNING, logger="bench.cpu_share"):
        alone_enough = RunRecord.start(argparse.Namespace(threads=1))
    assert caplog.records == []
    assert alone_enough.finish()["cpu_share_start"] == {"num_cores": 2, "busy_elsewhere": 1.0}
    with caplog.at_level(logging.WARNING, logger="bench.cpu_share"):
        RunRecord.start(argparse.Namespace(threads=2))
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "oversubscribes the CPU" in caplog.records[0].getMessage()


def test_a_run_without_a_sample_records_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_share, "sample", lambda: None)
    record = RunRecord.start(argparse.Namespace())  # no --threads: torch's default
    assert "cpu_share_start" not in record.finish()
