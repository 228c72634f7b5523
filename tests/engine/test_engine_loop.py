"""The engine loop's shape: RequestRun is plain state, the engine executes, the prompt pass's callbacks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from enginetest_tiny import random_chunks

from engine.generation import RequestRun, RequestStatus
from engine.types import BlendConfig, FinishEvent, GenerationRequest, RequestCancelled, SamplingParams, TokenEvent
from kvcache.types import InMemoryLayerReader

ENGINE_DIR = Path(__file__).resolve().parents[2] / "engine"


class RecordingSource(InMemoryLayerReader):
    """Remembers which layers were read and whether it was closed."""

    def __init__(self, chunks) -> None:
        super().__init__(chunks)
        self.layers_read: list[int] = []
        self.closed = False

    def layer(self, layer_idx: int):
        self.layers_read.append(layer_idx)
        return super().layer(layer_idx)

    def close(self) -> None:
        self.closed = True


@pytest.fixture(scope="module")
def chunks() -> list[list[int]]:
    return random_chunks([12, 9], seed=5)


@pytest.fixture(scope="module")
def layout(tiny_engine, chunks):
    return tiny_engine.prompt.layout(chunks, "which one?")


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_generation_imports_nothing_from_the_engine() -> None:
    imported = _imported_modules(ENGINE_DIR / "generation.py")  # TYPE_CHECKING imports included
    assert "engine.engine" not in imported
    assert "engine.scheduler" not in imported
    assert not any(name in imported for name in ("engine.prompt_pass", "engine.layers", "engine.batched_decode"))


def test_request_run_holds_no_engine(tiny_engine, layout) -> None:
    run = tiny_engine.new_run(GenerationRequest("r", layout, None, "full"))
    assert run.status == RequestStatus.WAITING
    assert not any(value is tiny_engine for value in vars(run).values())


def test_request_run_steps_without_a_model(tiny_engine, layout) -> None:
    """The run samples from logits it is handed; it never runs the model itself."""
    sampling = SamplingParams(max_tokens=2, ignore_eos=True)
    run = RequestRun(
        GenerationRequest("r", layout, None, "full", sampling=sampling),
        tiny_engine.tokenizer,
        frozenset(),
        torch.device("cpu"),
    )
    result = tiny_engine.prompt_pass(layout, None, "full", extra_capacity=2)
    logits = torch.full_like(result.logits, -1e9)
    logits[42] = 0.0
    run.start_prompt()
    assert run.status == RequestStatus.PROMPT_PASS
    (first,) = run.accept_prompt(result)
    assert isinstance(first, TokenEvent) and first.token_id == int(result.logits.argmax())
    assert run.status == RequestStatus.DECODING and run.pending_token == first.token_id
    second, finish = run.accept_logits(logits)
    assert isinstance(second, TokenEvent) and second.token_id == 42
    assert isinstance(finish, FinishEvent) and finish.finish_reason == "length" and finish.num_completion_tokens == 2
    assert run.status == RequestStatus.FINISHED and run.finished


def test_callbacks_run_at_every_layer_boundary_between_layers_first(tiny_engine, layout) -> None:
    calls: list[str] = []
    tiny_engine.prompt_pass(
        layout,
        None,
        "full",
        between_layers=lambda: calls.append("between"),
        cancelled=lambda: calls.append("cancelled") is not None,  # False: keep going
    )
    assert calls == ["between", "cancelled"] * tiny_engine.num_layers


def test_query_blend_asks_at_the_scoring_layers_too(tiny_engine, layout, chunks) -> None:
    calls: list[str] = []
    config = BlendConfig(recompute_ratio=0.3, selector="query", score_layers=(1,))
    source = InMemoryLayerReader(tiny_engine.precompute_chunks(chunks))
    tiny_engine.prompt_pass(layout, source, "blend", config, between_layers=lambda: calls.append("between"))
    assert len(calls) == 2 + tiny_engine.num_layers  # scoring pass over layers 0…1, then the prompt pass


def test_cancelled_stops_at_a_layer_boundary(tiny_engine, layout, chunks) -> None:
    source = RecordingSource(tiny_engine.precompute_chunks(chunks))
    asked: list[int] = []

    def cancelled() -> bool:
        asked.append(1)
        return len(asked) == 3  # before layer 2

    with pytest.raises(RequestCancelled):
        tiny_engine.prompt_pass(layout, source, "reuse", cancelled=cancelled)
    # On the CPU a layer's stored KV is read when the pass reaches the layer (engine/stored_context.py):
    # layers 0 and 1, nothing from the boundary that cancelled on.
    assert source.layers_read == [0, 1]
    assert len(asked) == 3


def test_prefill_of_a_cancelled_run_finishes_it_and_closes_the_source(tiny_engine, layout, chunks) -> None:
    source = RecordingSource(tiny_engine.precompute_chunks(chunks))
    run = tiny_engine.new_run(GenerationRequest("r", layout, source, "reuse"))
    asked: list[int] = []
    events = tiny_engine.run_prompt(run, cancelled=lambda: asked.append(1) is None and len(asked) == 2)
    assert [type(e) for e in events] == [FinishEvent] and events[0].finish_reason == "cancelled"
    assert run.status == RequestStatus.CANCELLED
    assert source.layers_read == [] and source.closed  # asked before the pass, then before layer 0


def test_prefill_closes_the_source_after_the_pass(tiny_engine, layout, chunks) -> None:
    source = RecordingSource(tiny_engine.precompute_chunks(chunks))
    run = tiny_engine.new_run(GenerationRequest("r", layout, source, "reuse", sampling=SamplingParams(max_tokens=3)))
    events = tiny_engine.run_prompt(run)
    assert isinstance(events[0], TokenEvent) and run.status == RequestStatus.DECODING
    assert source.layers_read == list(range(tiny_engine.num_layers)) and source.closed


def test_decode_of_several_runs_equals_one_at_a_time(tiny_engine, chunks) -> None:
    def request(i: int) -> GenerationRequest:
        layout = tiny_engine.prompt.layout(chunks, f"question {i}?")
        return GenerationRequest(f"r{i}", layout, None, "full", sampling=SamplingParams(max_tokens=4, ignore_eos=True))

    alone = [[e.token_id for e in tiny_engine.generate(request(i)) if isinstance(e, TokenEvent)] for i in range(3)]
    runs = [tiny_engine.new_run(request(i)) for i in range(3)]
    tokens: list[list[int]] = [
        [e.token_id for e in tiny_engine.run_prompt(run) if isinstance(e, TokenEvent)] for run in runs
    ]
    while not all(run.finished for run in runs):
        live = [i for i, run in enumerate(runs) if not run.finished]
        for i, events in zip(live, tiny_engine.decode([runs[i] for i in live]), strict=True):
            tokens[i] += [e.token_id for e in events if isinstance(e, TokenEvent)]
    assert tokens == alone
