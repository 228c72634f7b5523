"""What every subcommand shares: its subparser with the common options (`Command`), the engine, one
result header (model, dataset, sample, compute dtype and why, blend settings, machine facts with the
CPU's flags) and one way to write the result (`write_result`: the run record with load averages, since
timings on a shared machine drift, the `--out` JSON and the `--plot` PNG next to it by default)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import platform
import resource
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple, get_args

from bench.cpu_share import CpuShare, warn_if_shared
from fsio.atomic import write_text_atomic

if TYPE_CHECKING:
    from bench.prepared import PreparedPrompt
    from engine.engine import Engine
    from retrieval.retriever import Retriever

logger = logging.getLogger(__name__)

DEFAULT_MUSIQUE = Path("../shared/data/musique_dev.json")
DEFAULT_NQ6 = Path("../shared/data/nq6_dev.json")


def default_models_dir() -> Path:
    """The server's model cache (`models_dir`: settings.yaml, BLENDRAG_MODELS_DIR, else the user's cache home),
    so a bench run converts nothing the server has converted, and the reverse."""
    from app.settings import load_settings

    models_dir = load_settings().models_dir
    assert models_dir is not None  # filled in by the settings' validator
    return models_dir


DEFAULT_OUT_DIR = Path("bench/out")  # git-ignored


@dataclass(frozen=True)
class Command:
    """A benchmark subcommand, as bench/__main__.py registers it: its module (with `NAME`, `HELP`, its own
    options in `add_args(parser)` and `main(args) -> exit code`) and the defaults of the common options
    (`dataset` None: the module has its own options only). Its result file is `out` under DEFAULT_OUT_DIR
    (default: `<NAME>.json`); `blend` adds the blend options."""

    module: ModuleType
    dataset: Path | None = None
    examples: int = 0
    passages: int = 0
    blend: bool = False
    out: str | None = None

    def register(self, subparsers: Any) -> argparse.ArgumentParser:
        module = self.module
        parser = subparsers.add_parser(
            module.NAME,
            help=module.HELP,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if self.dataset is not None:
            out = self.out or f"{module.NAME}.json"
            add_common_args(parser, dataset=self.dataset, examples=self.examples, passages=self.passages, out=out)
        if self.blend:
            add_blend_args(parser)
        module.add_args(parser)
        parser.set_defaults(func=module.main)
        return parser


def add_common_args(parser: argparse.ArgumentParser, *, dataset: Path, examples: int, passages: int, out: str) -> None:
    parser.add_argument("--dataset", type=Path, default=dataset, help="question/passages JSON file")
    parser.add_argument("--examples", type=int, default=examples, help="number of examples (seeded sample)")
    parser.add_argument("--passages", type=int, default=passages, help="passages (chunks) per prompt")
    parser.add_argument("--seed", type=int, default=0, help="which examples (seeded shuffle)")
    add_out_arg(parser, out)
    parser.add_argument("--plot", type=Path, default=None, help="PNG plot (default: --out with .png)")
    parser.add_argument(
        "--model",
        default="builtin",
        help="a catalogue name (builtin = smollm2-135m, qwen2.5-coder-0.5b, …), a GGUF file or an HF checkpoint dir",
    )
    parser.add_argument(
        "--models-dir",
        type=Path,
        default=None,
        help="where a catalogue model or GGUF file is converted once (default: the server's model cache)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="model compute dtype (auto: the engine's choice for this machine, recorded in the result)",
    )
    parser.add_argument(
        "--decode-weights",
        default=None,
        choices=["auto", "same", "int8", "int4"],
        help="the weights decode reads (engine.decode_weights; default: the server's, auto)",
    )
    parser.add_argument(
        "--lead-in",
        dest="chunk_lead_in",
        action="store_true",
        help="open every prompt's context with the lead-in (engine.chunk_lead_in; off in the server's defaults)",
    )


def refuse_ship_with_lead_in(args: argparse.Namespace) -> None:
    """`--ship` writes what servers on their default settings read, and they run without the lead-in: a record or
    check measured with `--lead-in` would speak for prompts they never build."""
    if getattr(args, "ship", False) and getattr(args, "chunk_lead_in", False):
        raise SystemExit("--ship records what servers run on their defaults, which have no lead-in: drop --lead-in")


def add_out_arg(parser: argparse.ArgumentParser, out: str) -> None:
    """`--out`: the JSON result file (default: `out` under bench/out)."""
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT_DIR / out, help=f"JSON result file (default: {DEFAULT_OUT_DIR / out})"
    )


def add_retrieval_args(parser: argparse.ArgumentParser, out: str) -> None:
    """The options of a benchmark of retrieval alone (no language model): the embedder's compute dtype and
    the result file."""
    parser.add_argument(
        "--embed-dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="embedder compute dtype (auto: the server's choice for this machine)",
    )
    add_out_arg(parser, out)


def embed_dtype(retriever: Retriever) -> str:
    """The compute dtype the retriever's embedder runs in, as a result file records it."""
    choice = retriever.embedder.dtype_choice
    return choice.dtype if choice is not None else "float32"


def add_order_arg(parser: argparse.ArgumentParser) -> None:
    """`--order`: which passages play the retrieval ranking of a prepared prompt (bench/data.py)."""
    from bench.data import PASSAGE_ORDERS

    parser.add_argument(
        "--order",
        choices=PASSAGE_ORDERS,
        default="file",
        help="which passages play the retrieval ranking: file (the first K in file order) or retrieval (the "
        "server's retriever ranks each example's passages and the top K are laid out)",
    )


def server_kv_dtype() -> str:
    """The storage dtype the server writes chunk KV in by default (kvcache.storage_dtype)."""
    from kvcache.config import KVCacheSettings

    return str(KVCacheSettings().storage_dtype)


def add_selectors_arg(parser: argparse.ArgumentParser, default: str | None, help: str) -> None:
    """`--selectors`: the blend selectors a run compares, comma-separated (`bench.passes.parse_selectors`)."""
    from bench.passes import parse_selectors

    parser.add_argument("--selectors", default=default, type=parse_selectors, help=help)


def add_candidates_arg(parser: argparse.ArgumentParser, help: str) -> None:
    """`--candidates`: a study, a JSON list of blend settings (`bench.candidates.read_candidates`)."""
    parser.add_argument("--candidates", type=Path, default=None, help=help)


def add_kv_dtype_arg(
    parser: argparse.ArgumentParser,
    choices: tuple[str, ...] = ("fp32", "fp16", "bf16", "int8", "int4"),
    default: str | None = None,
) -> None:
    """`--kv-dtype`: what the cached modes read through the store (default: the server's storage dtype)."""
    default = default or server_kv_dtype()
    parser.add_argument(
        "--kv-dtype",
        default=default,
        choices=list(choices),
        help=f"storage dtype of the chunk KV the cached modes read (default {default}: the server's; "
        "fp32: the engine's own tensors, no store)",
    )


class _BlendOption(NamedTuple):
    """One blend setting a run may change: its BlendConfig field (the option is `--field-name`, default None:
    the server's own) and its `add_argument` keywords."""

    name: str
    help: str
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None


def _blend_options() -> tuple[_BlendOption, ...]:
    """The blend options, in the order `build_engine` applies them; their choices are BlendConfig's own."""
    from engine.blend.config import SELECTORS, MatchScope, MatchSpan, StaleKeyScope

    return (
        _BlendOption("selector", "blend token selector (default: the engine's default selector)", choices=SELECTORS),
        _BlendOption("score_layers", "query selector: scoring layers, comma-separated"),
        _BlendOption("check_layers", "deviation selector: check layers, comma-separated"),
        _BlendOption(
            "match_window",
            "up-front selectors: recompute the tokens the question names and this many after each (0: off)",
            int,
        ),
        _BlendOption(
            "match_span",
            "--match-window: a fixed window, to the end of the matched token's sentence (at most the window), or "
            "the whole sentence around it (at most the window on each side)",
            choices=get_args(MatchSpan),
        ),
        _BlendOption(
            "match_extra",
            "--match-window: the matched rows recomputed on top of the budget, at most this share of the context",
            float,
        ),
        _BlendOption(
            "match_scope",
            "--match-window: spans for any question naming a token, or one naming tokens of one chunk only",
            choices=get_args(MatchScope),
        ),
        _BlendOption("stale_key_bias", "attention-logit bias against the unrecomputed stored keys", float),
        _BlendOption(
            "stale_key_scope",
            "--stale-key-bias on every segment's stale keys, or only on the segments the question does not name",
            choices=get_args(StaleKeyScope),
        ),
    )


def add_blend_args(parser: argparse.ArgumentParser) -> None:
    """Options that change the engine's blend settings (default: the server's own defaults)."""
    for option in _blend_options():
        parser.add_argument(
            "--" + option.name.replace("_", "-"),
            default=None,
            type=option.type,
            choices=option.choices,
            help=option.help,
        )


class Stopped(KeyboardInterrupt):
    """A run stopped by a signal (`stop_on_signals`): a KeyboardInterrupt, so whatever cleans up after ^C cleans
    up after SIGTERM too."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise `Stopped` in the main thread while the block runs, so a long run's `finally`
    (the gate putting the record from before back) runs on `kill` as on ^C; SIGTERM's default would end the
    process with none of it. A signal the process was started ignoring stays ignored (a job started in the
    background of a script ignores SIGINT), and after the first signal the previous handlers are back: a
    second one is not caught. Outside the main thread (where Python takes no handler) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[signal.Signals, Any] = {}

    def stop(signum: int, frame: object) -> None:
        restore()
        raise Stopped(signal.Signals(signum).name)

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        previous.clear()

    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, stop)
    try:
        yield
    finally:
        restore()


def ship_check(write: Callable[[], Path], error: type[ValueError], what: str) -> int:
    """`--ship` of a check part: `write` puts it into the shipped record; exit code 1 when it refuses with `error`
    (the target missed, no record, another fingerprint's record: logged), else 0."""
    try:
        path = write()
    except error as exc:
        logger.error("%s", exc)
        return 1
    logger.info("%s check written to %s", what, path)
    return 0


def blend_options_given(args: argparse.Namespace) -> list[str]:
    """The blend options a run changed (as `--option-name`): a check of the server's defaults refuses them."""
    return ["--" + o.name.replace("_", "-") for o in _blend_options() if getattr(args, o.name, None) is not None]


def _layers(text: str | None) -> list[int] | None:
    return None if not text else [int(x) for x in text.split(",") if x.strip()]


def build_engine(args: argparse.Namespace, **overrides: Any) -> Engine:
    """The engine with the server's default settings (the blend's: those in force for the model, see
    app/calibration), changed only by the options the run gives."""
    from engine.config import EngineSettings
    from engine.engine import Engine

    for name in (option.name for option in _blend_options()):
        value = getattr(args, name, None)
        if value is not None:
            overrides.setdefault(name, _layers(value) if name in ("score_layers", "check_layers") else value)
    if getattr(args, "decode_weights", None) is not None:
        overrides.setdefault("decode_weights", args.decode_weights)
    if getattr(args, "chunk_lead_in", False):
        overrides.setdefault("chunk_lead_in", True)
    settings = EngineSettings(model=args.model, num_threads=args.threads, dtype=args.dtype, **overrides)
    engine = Engine(settings, models_dir=args.models_dir)
    # The blend settings a server on this model starts with (shipped for it, else safe; the options above
    # are the operator's and win), as the result header records.
    from app.calibration.in_force import apply, blend_in_force

    apply(engine, blend_in_force(engine, settings, None))
    return engine


def blend_settings(engine: Engine) -> dict[str, Any]:
    """The engine's blend settings, recorded in every result file."""
    return engine.settings.blend_config().model_dump()


def plot_path(args: argparse.Namespace) -> Path:
    return args.plot if args.plot is not None else Path(args.out).with_suffix(".png")


# CPU features that decide how fast a dtype runs (absolute times differ with them; ratios in one run count).
_CPU_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def cpu_facts() -> dict[str, Any]:
    """The CPU's model name and which of the flags that matter here it has (Linux /proc/cpuinfo)."""
    cpuinfo = Path("/proc/cpuinfo")
    model, flags = platform.processor() or platform.machine(), set()
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    return {"cpu_model": model, "cpu_flags": [f for f in _CPU_FLAGS if f in flags]}


def machine_info(engine: Engine | None = None) -> dict[str, Any]:
    """Facts that make two result files comparable (or explain why they are not)."""
    import torch

    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        **cpu_facts(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        # The instruction set torch's kernels dispatch to: below the CPU's flags when capped
        # (ATEN_CPU_CAPABILITY=avx2 measures an AVX2-only CPU's kernels on a newer one).
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    if engine is not None:
        info["device"] = str(engine.device)
        info |= compute_dtype(engine)
    return info


def compute_dtype(engine: Engine) -> dict[str, Any]:
    """The dtype the engine computes in, and the choice behind it (`engine.dtype: auto`: which and why)."""
    choice = engine.dtype_choice
    return {
        "compute_dtype": str(engine.dtype).removeprefix("torch."),
        "dtype_choice": {"dtype": str(choice.dtype), "reason": str(choice.reason)},
    }


def result_header(name: str, args: argparse.Namespace, engine: Engine | None = None, **extra: Any) -> dict[str, Any]:
    """The fields every result file starts with: what ran, on what data, with what settings, where."""
    header: dict[str, Any] = {"benchmark": name}
    if engine is not None:
        header["model"] = model_name(engine)
        header["served_model"] = dataclasses.asdict(engine.served_model)
    dataset = getattr(args, "dataset", None)
    if dataset is not None:
        header |= {"dataset": str(dataset), "dataset_name": Path(dataset).stem}
    for key in ("examples", "passages", "seed", "order"):
        if getattr(args, key, None) is not None:
            header[key] = getattr(args, key)
    if engine is not None:
        header |= compute_dtype(engine)
        header["blend"] = blend_settings(engine)
        header["blend_origin"] = engine.blend_origin
        header["chunk_lead_in"] = engine.settings.chunk_lead_in  # the prompt's lead-in (engine/prompt.py)
    header |= extra
    header.setdefault("machine", machine_info(engine))  # a server's own engine may have given them
    return header


def prompt_facts(prompts: Sequence[PreparedPrompt]) -> dict[str, Any]:
    """How many prepared prompts a run measured and their mean length in tokens, as its result records them."""
    return {"examples": len(prompts), "prompt_tokens_mean": statistics.fmean(p.layout.num_tokens for p in prompts)}


def write_result(
    args: argparse.Namespace,
    result: dict[str, Any],
    run: RunRecord,
    plot: Callable[[dict[str, Any], Path], None] | None = None,
) -> None:
    """Add the run record, write `--out` and, given `plot`, the PNG (`--plot`, default: next to the JSON)."""
    result["run"] = run.finish()
    write_json(args.out, result)
    if plot is not None:
        plot(result, plot_path(args))


def log_rows(log: logging.Logger, rows: Mapping[str, Any], line: Callable[[str, Any], str]) -> None:
    """The summary a run logs once its result is written: `line(name, row)` for each row of one of its
    tables (its modes, its dtypes …), in the result's order."""
    for name, row in rows.items():
        log.info("%s", line(name, row))


def model_name(engine: Engine) -> str:
    return engine.served_model.display_name


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@dataclass
class RunRecord:
    """Wall time and load averages of one benchmark run (recorded at the start and at the end), and the cores
    other processes kept busy when it started (`cpu_share`, None where it cannot be sampled)."""

    started: float = field(default_factory=time.perf_counter)
    load_start: list[float] = field(default_factory=load_avg)
    cpu_share: CpuShare | None = None

    @classmethod
    def start(cls, args: argparse.Namespace) -> RunRecord:
        """The record of a run starting now, warning (logged) when the run's torch threads (`--threads`, else
        torch's default) do not fit beside what else keeps the CPU busy: its timings would not be its own."""
        import torch

        threads = getattr(args, "threads", None) or torch.get_num_threads()
        return cls(cpu_share=warn_if_shared(threads))

    def finish(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "elapsed_s": round(time.perf_counter() - self.started, 2),
            "load_avg_start": self.load_start,
            "load_avg_end": load_avg(),
            "unix_time": int(time.time()),
        }
        if self.cpu_share is not None:
            record["cpu_share_start"] = self.cpu_share.as_record()
        return record


def _json_safe(value: Any) -> Any:
    """NaN/inf are not JSON: write them as null so every reader can parse the file."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def write_json(path: Path, data: dict[str, Any]) -> None:
    path = Path(path)
    write_text_atomic(path, json.dumps(_json_safe(data), indent=2, ensure_ascii=False) + "\n")
    logger.info("wrote %s", path)


def new_figure(num_panels: int, width_per_panel: float = 4.2, height: float = 3.6):
    """A row of matplotlib axes on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, num_panels, figsize=(width_per_panel * num_panels, height), squeeze=False)
    return fig, list(axes[0])


def save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    logger.info("wrote %s", path)


def finish_figure(fig, path: Path, result: dict[str, Any], *details: str) -> None:
    """Title the figure with what every result shares (model, compute dtype, data, sample) plus `details`,
    then save it."""
    parts = [f"{result.get('model', '?')} {result.get('compute_dtype', '')}".strip()]
    if "dataset_name" in result:
        parts.append(str(result["dataset_name"]))
    if "examples" in result and "passages" in result:
        parts.append(f"{result['examples']} ex × {result['passages']} passages")
    fig.suptitle(" · ".join([*parts, *details]), fontsize=9)
    save_figure(fig, path)


def peak_rss_bytes() -> int:
    """High-water resident set size of this process's own memory so far.

    Linux's VmHWM, not ru_maxrss: a spawned child's ru_maxrss also counts the forked parent's pages it
    held for a moment before exec, so a small child of a big benchmark process reports the parent's size.
    """
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
