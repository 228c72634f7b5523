"""One result header and one subparser set-up for every subcommand."""

from __future__ import annotations

import argparse
import logging
import os
import signal
from pathlib import Path

import pytest
import torch

from bench.__main__ import build_parser
from bench.harness import Stopped, cpu_facts, log_rows, result_header, server_kv_dtype, stop_on_signals
from bench.quality import _mode_line as quality_line


def test_every_subcommand_has_the_common_options() -> None:
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert {"ttft", "quality", "frontier", "profile", "peers", "baseline-llamacpp"} <= set(commands)
    for name, sub in commands.items():
        # scaleout: a cluster of processes; capacity: a server process asked over docs pages; followup and
        # relevance: retrieval alone; random-model writes a checkpoint. None samples a dataset for an engine.
        if name in ("scaleout", "capacity", "followup", "relevance", "random-model"):
            continue
        args = sub.parse_args([])
        assert {"dataset", "examples", "passages", "seed", "out", "model", "dtype", "threads"} <= set(vars(args)), name
    for name in ("ttft", "quality", "frontier", "profile", "peers"):
        assert commands[name].parse_args([]).kv_dtype == server_kv_dtype()
    # The benches that lay out a dataset's passages themselves can take the server's retrieval order.
    takes_order = {name for name, sub in commands.items() if "order" in vars(sub.parse_args([]))}
    assert takes_order == {"ttft", "quality", "frontier", "profile", "peers", "baseline-llamacpp", "kv"}
    assert commands["frontier"].parse_args(["--order", "retrieval"]).order == "retrieval"


def test_result_header_records_model_data_dtype_blend_and_machine(tiny_engine) -> None:
    args = argparse.Namespace(
        dataset=Path("../shared/data/musique_dev.json"), examples=3, passages=6, seed=0, order="retrieval"
    )
    header = result_header("x", args, tiny_engine, examples=2, ratios=[0.15])
    assert header["benchmark"] == "x" and header["dataset_name"] == "musique_dev" and header["order"] == "retrieval"
    assert (header["examples"], header["passages"], header["seed"], header["ratios"]) == (2, 6, 0, [0.15])
    assert header["compute_dtype"] == header["machine"]["compute_dtype"] == "float32"
    choice = tiny_engine.dtype_choice
    assert header["dtype_choice"] == {"dtype": "float32", "reason": choice.reason} and choice.dtype == "float32"
    assert header["blend"] == tiny_engine.settings.blend_config().model_dump()
    assert header["blend_origin"] == tiny_engine.blend_origin == "engine settings"
    assert header["machine"]["cpu_flags"] == cpu_facts()["cpu_flags"]
    assert header["machine"]["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert list(header)[-1] == "machine"


def test_bench_engines_run_on_the_blend_settings_in_force(tiny_llama_dir, tmp_path) -> None:
    from bench.harness import build_engine

    args = argparse.Namespace(
        model=str(tiny_llama_dir), threads=2, dtype="float32", models_dir=tmp_path, selector=None, score_layers="2"
    )
    engine = build_engine(args)
    # No record for the tiny model: the safe settings, except the scoring layer the run's options set.
    assert engine.blend_origin == "safe settings (this model is not calibrated yet); operator set score_layers"
    assert (engine.settings.blend.recompute_ratio, engine.settings.blend.history_ratio) == (0.3, 1.0)
    assert engine.settings.blend.score_layers == (2,)
    header = result_header("x", argparse.Namespace(), engine)
    assert header["blend_origin"] == engine.blend_origin and header["blend"]["recompute_ratio"] == 0.3


def test_the_remedies_options_reach_the_engines_blend_settings(tiny_llama_dir, tmp_path) -> None:
    from bench.harness import build_engine

    args = argparse.Namespace(
        model=str(tiny_llama_dir), threads=2, dtype="float32", models_dir=tmp_path, selector=None, score_layers=None,
        match_window=16, match_span="sentence", stale_key_bias=1.0, stale_key_scope="unnamed",
    )  # fmt: skip
    config = build_engine(args).settings.blend_config()
    assert (config.match_window, config.match_span, config.stale_key_bias, config.stale_key_scope) == (
        16,
        "sentence",
        1.0,
        "unnamed",
    )


def test_log_rows_logs_one_line_a_row_in_the_results_order(caplog) -> None:
    log = logging.getLogger("bench.example")
    rows = {"full": {"f1": 0.5, "nll": 1.25, "length_share": 1.0}, "blend@0.15": {"f1": 0.25}}
    with caplog.at_level(logging.INFO, logger="bench.example"):
        log_rows(log, rows, lambda name, m: f"{name}: f1 {m['f1']:.2f}")
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("bench.example", "full: f1 0.50"),
        ("bench.example", "blend@0.15: f1 0.25"),
    ]


def test_a_quality_mode_line_reads_as_it_did() -> None:
    full = {"f1": 0.5, "nll": 1.25, "length_share": 1.0}
    blend = full | {"fidelity_f1": 0.75, "kl": 0.000123, "benefit_retained": 0.875}
    assert quality_line("full", full) == "full        f1=0.500 nll=1.250 length_share=1.000 "
    assert quality_line("blend@0.15", blend | {"uncontrolled_f1": 0.25, "uncontrolled_length_share": 2.0}) == (
        "blend@0.15  f1=0.500 nll=1.250 length_share=1.000 (without the stop: f1=0.250 length_share=2.000) "
        "fidelity=0.750 kl=1.230e-04 benefit=0.875"
    )
    # with the intervals a summary now carries: KL as a multiple of reuse's, and the benefit's 95% interval
    with_intervals = blend | {"kl_x_reuse": 0.3125, "benefit_retained_ci95": [0.8125, 0.9375]}
    assert quality_line("blend@0.15", with_intervals) == (
        "blend@0.15  f1=0.500 nll=1.250 length_share=1.000 fidelity=0.750 kl=1.230e-04 (0.31x reuse's) "
        "benefit=0.875 [0.81, 0.94]"
    )


def test_stop_on_signals_raises_stopped_for_sigterm_and_puts_the_handlers_back() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with pytest.raises(Stopped) as stopped, stop_on_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        pytest.fail("SIGTERM did not stop the block")
    assert stopped.value.signal_name == "SIGTERM" and isinstance(stopped.value, KeyboardInterrupt)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    # A signal the process ignores stays ignored inside the block.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with stop_on_signals():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not before[0]
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_machine_info_names_a_capped_instruction_set() -> None:
    # An AVX2-only CPU's kernels measured on a newer CPU: the result says so, not only the CPU's flags.
    import subprocess
    import sys

    code = "from bench.harness import machine_info; print(machine_info()['torch_cpu_capability'])"
    env = os.environ | {"ATEN_CPU_CAPABILITY": "default"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "DEFAULT"
