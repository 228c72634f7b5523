"""Made-up benchmark data (the shape of ../shared/data/*.json) and a way to run `python -m bench …` in-process."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = [
    {
        "question": "What is the capital of Freedonia?",
        "answers": ["Fredville", "the city of Fredville"],
        "ctxs": [
            {
                "title": "Freedonia",
                "text": "Freedonia is a small country. Its capital is Fredville, a city on the river Fred.",
                "isgold": True,
            },
            {"title": "Sylvania", "text": "Sylvania borders Freedonia in the north and exports cheese."},
            {"title": "Rivers", "text": "The river Fred flows from the mountains into the southern sea."},
        ],
    },
    {
        "question": "Which animal is Marvin the robot afraid of?",
        "answers": ["ducks"],
        "ctxs": [
            {"title": "Cheese", "text": "Sylvanian cheese is aged for twelve months in caves."},
            {"title": "Marvin", "text": "Marvin is a robot who is afraid of ducks but likes geese.", "isgold": True},
            {"title": "Geese", "text": "Geese migrate south in the autumn, flying in a V formation."},
        ],
    },
]


@pytest.fixture
def dataset_path(tmp_path: Path) -> Path:
    path = tmp_path / "made_up_dev.json"
    path.write_text(json.dumps(EXAMPLES), encoding="utf-8")
    return path


@pytest.fixture
def dataset20_path(tmp_path: Path) -> Path:
    """Twenty made-up examples (a held-out check needs that many), three passages each, the gold one first."""
    examples = [
        {
            "question": f"What is the capital of Country{n}?",
            "answers": [f"City{n}"],
            "ctxs": [
                {
                    "title": f"Country{n}",
                    "text": f"Country{n} is a land of hills. Its capital is City{n}.",
                    "isgold": True,
                },
                {"title": f"River{n}", "text": f"River{n} flows through Country{n} into the sea."},
                {"title": f"Food{n}", "text": f"People in Country{n} eat bread with honey."},
            ],
        }
        for n in range(20)
    ]
    path = tmp_path / "made_up_20.json"
    path.write_text(json.dumps(examples), encoding="utf-8")
    return path


def _takes_dtype(command: str) -> bool:
    """Whether `python -m bench COMMAND` has a --dtype option (scaleout runs servers with their own settings)."""
    import argparse

    from bench.__main__ import build_parser

    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return any("--dtype" in action.option_strings for action in subparsers.choices[command]._actions)


@pytest.fixture
def run_bench(tmp_path: Path, tiny_llama_dir: Path):
    """Run a subcommand through the real dispatcher on the tiny model; returns (exit code, JSON, png path)."""
    from bench.__main__ import main

    def run(command: str, *args: str) -> tuple[int, dict, Path]:
        out = tmp_path / f"{command}.json"
        base = [command, "--model", str(tiny_llama_dir), "--threads", "2", "--out", str(out)]
        if _takes_dtype(command):
            # float32 like the rest of the suite (`auto` is bfloat16 on an AMX CPU); a test may pass its own.
            base += ["--dtype", "float32"]
        code = main([*base, *args])
        return code, json.loads(out.read_text(encoding="utf-8")), out.with_suffix(".png")

    return run


@pytest.fixture(scope="session")
def tiny_engine(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    from engine.config import EngineSettings
    from engine.engine import Engine

    return Engine(
        EngineSettings(model=str(tiny_llama_dir), num_threads=2, dtype="float32"),
        models_dir=tmp_path_factory.mktemp("models"),
    )


@pytest.fixture
def write_step_result() -> Callable[..., None]:
    """A fake `bench ship` step's result file (tests/bench/test_ship.py, test_ship_resume.py)."""
    return _write_step_result


def _write_step_result(step: Any, right_blend: int, targets_met: bool = True) -> None:
    """What a `bench ship` step (a bench.ship.Step) writes to its `--out`, as far as bench.ship.step_figures reads it:
    check parts with full prefill at 11-12 and the default blend at `right_blend`; a calibration whose targets were
    `targets_met`."""
    out = Path(step.argv[step.argv.index("--out") + 1])
    if step.name == "calibrate":
        result = {
            "record": {"values": {"recompute_ratio": 0.1}, "measured": {"targets_met": targets_met, "chosen": {}}}
        }
    elif step.name.startswith("similar"):
        result = {
            "default_selector": "query",
            "ratio": 0.1,
            "right": {"full": 11, "reuse": 4, "query@0.1": right_blend},
        }
    elif step.name == "followups_check":
        summary = {path: {"full_right": 12, "default_right": right_blend} for path in ("ask", "v1")}
        result = {"lookup": {"summary": summary}}
    elif step.name == "heldout_check":
        blend = {"kl_x_reuse": 0.2, "benefit_retained": 0.99, "f1": 0.42}
        modes = {"full": {"f1": 0.43}, "reuse": {}, "blend@0.1": blend}
        result = {"modes": modes}
    else:
        modes = {"full": {"finish_reasons": {"stop": 12}}, "blend": {"finish_reasons": {"stop": 12}, "agrees": 9}}
        result = {"modes": modes}
    out.write_text(json.dumps(result))
