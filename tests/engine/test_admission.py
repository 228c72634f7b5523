"""The wait estimate of a busy engine (engine/admission.py): the work of a prompt pass by mode, the measured rates,
and the scheduler's policy replayed over a queue, on hand-made queues and rates (no model, no clock)."""

from __future__ import annotations

import pytest

from engine.admission import (
    AdmissionEstimate,
    PromptWork,
    QueueSnapshot,
    ServiceRates,
    estimate_admission,
    fresh_tokens,
)
from engine.types import BlendConfig, GenerationRequest, PromptLayout

# prefix 10, two chunks (20 and 30 tokens), suffix 5: 65 tokens
LAYOUT = PromptLayout(prefix_ids=[1] * 10, chunk_ids=[[2] * 20, [3] * 30], suffix_ids=[4] * 5)


def _request(mode: str, blend: BlendConfig | None = None, layout: PromptLayout = LAYOUT) -> GenerationRequest:
    return GenerationRequest("r", layout, mode=mode, blend=blend or BlendConfig(recompute_ratio=0.3))  # type: ignore[arg-type]


def test_fresh_tokens_follow_each_modes_plan() -> None:
    assert fresh_tokens(_request("full"), num_layers=4) == 65.0
    assert fresh_tokens(_request("prefix"), num_layers=4) == 35.0  # the exact first chunk and prefix reused
    assert fresh_tokens(_request("reuse"), num_layers=4) == 5.0
    assert fresh_tokens(_request("blend"), num_layers=4) == 20.0  # suffix + round(0.3 × 50)
    no_context = PromptLayout(prefix_ids=[1] * 10, chunk_ids=[], suffix_ids=[4] * 5)
    assert fresh_tokens(_request("blend", layout=no_context), num_layers=4) == 5.0
    # A check-layer blend: 55 rows through layer 0, then 10 + 5 rows through layers 1-3: (55 + 45) / 4.
    deviation = BlendConfig(selector="deviation", recompute_ratio=0.2, check_layers=(1,))
    assert fresh_tokens(_request("blend", deviation), num_layers=4) == 25.0


def test_rates_fall_back_to_what_is_measured() -> None:
    rates = ServiceRates()
    assert rates.prompt_rate("blend") is None and rates.step_s(1) is None
    rates.seed_full_rate(100.0)
    assert rates.prompt_rate("blend") == 100.0  # no blend pass measured yet: the full rate
    rates.observe_prompt("blend", 40.0, 2.0)
    assert (rates.prompt_rate("blend"), rates.prompt_rate("full")) == (20.0, 100.0)
    rates.observe_prompt("blend", 60.0, 1.0)
    assert rates.prompt_rate("blend") == pytest.approx(0.8 * 20.0 + 0.2 * 60.0)
    rates.seed_full_rate(5.0)  # a seed never replaces a rate already known
    assert rates.prompt_rate("full") == 100.0

    rates.observe_decode_step(1, 0.1)
    rates.observe_decode_step(4, 0.4)
    assert rates.step_s(1) == 0.1 and rates.step_s(4) == 0.4
    assert rates.step_s(2) == pytest.approx(0.2)  # between measured sizes: interpolated
    assert rates.step_s(8) == 0.4  # past them: the nearest


def test_expected_decode_tokens_learn_how_much_of_the_limit_answers_use() -> None:
    rates = ServiceRates()
    assert rates.expected_decode_tokens(100, 30) == 70  # nothing learned: the whole limit
    rates.observe_answer(40, 100)
    assert rates.expected_decode_tokens(100, 30) == 10  # answers end after 40% of their limit
    assert rates.expected_decode_tokens(200, 0) == 80
    assert rates.expected_decode_tokens(100, 60) == 20  # past the usual length: halfway to the limit
    assert rates.expected_decode_tokens(100, 100) == 0


def _rates() -> ServiceRates:
    rates = ServiceRates()
    rates.seed_full_rate(100.0)  # fresh tokens per second
    rates.observe_prompt("blend", 50.0, 1.0)
    rates.observe_decode_step(1, 0.1)
    rates.observe_decode_step(2, 0.2)
    return rates


def _snapshot(**fields: object) -> QueueSnapshot:
    base: dict[str, object] = {
        "question_precompute_tokens": 0,
        "in_pass": None,
        "in_pass_compute_s": 0.0,
        "waiting": (),
        "running": (),
        "max_running": 1,
        "decode_interval_s": 0.05,
    }
    return QueueSnapshot(**(base | fields))  # type: ignore[arg-type]


def test_an_idle_engine_takes_a_request_at_once() -> None:
    assert estimate_admission(_snapshot(), _rates()) == AdmissionEstimate(0.0, 0.0, 0, 0)


def test_a_waiting_request_waits_for_a_running_slot_then_its_pass() -> None:
    snapshot = _snapshot(
        running=(PromptWork("blend", 0.0, max_tokens=10, generated=4),),  # 6 tokens to go: 0.6 s
        waiting=(PromptWork("blend", 100.0, max_tokens=5),),  # its pass: 100 / 50 = 2 s, then 4 tokens: 0.4 s
    )
    estimate = estimate_admission(snapshot, _rates())
    assert estimate.slot_s == pytest.approx(0.6)  # the waiting one starts once the running one ends
    assert estimate.wait_s == pytest.approx(0.6 + 2.0 + 0.4)
    assert (estimate.num_waiting, estimate.num_running) == (1, 1)


def test_decode_steps_between_a_passs_layers_lengthen_it() -> None:
    snapshot = _snapshot(
        max_running=4,
        running=(PromptWork("blend", 0.0, max_tokens=100),),
        in_pass=PromptWork("full", 200.0, max_tokens=10),  # 2 s of compute, 0.5 s of it done
        in_pass_compute_s=0.5,
        question_precompute_tokens=50,  # a question's missing chunk KV goes first: 0.5 s
    )
    estimate = estimate_admission(snapshot, _rates())
    # 0.5 s of precompute with 10 decode steps of 0.1 s, then 1.5 s of the pass with 30 more.
    assert estimate.wait_s == pytest.approx(0.5 + 10 * 0.1 + 1.5 + 30 * 0.1)
    assert estimate.slot_s == estimate.wait_s  # nobody waits: a place is free once the new request would start


def test_nothing_measured_yet_says_so() -> None:
    snapshot = _snapshot(waiting=(PromptWork("blend", 100.0, max_tokens=5),))
    estimate = estimate_admission(snapshot, ServiceRates())
    assert (estimate.wait_s, estimate.slot_s) == (None, None)
    assert estimate.retry_after_s(queue_full=True, max_wait_s=None) == 1.0


def test_retry_after_is_when_a_place_frees_and_the_wait_fits() -> None:
    estimate = AdmissionEstimate(wait_s=30.0, slot_s=12.2, num_waiting=3, num_running=2)
    assert estimate.retry_after_s(queue_full=True, max_wait_s=None) == 12.2
    assert estimate.retry_after_s(queue_full=False, max_wait_s=20.0) == 10.0  # 10 s over the limit
    assert estimate.retry_after_s(queue_full=True, max_wait_s=10.0) == 20.0  # the later of the two
    soon = AdmissionEstimate(wait_s=0.3, slot_s=0.2, num_waiting=1, num_running=1)
    assert soon.retry_after_s(queue_full=True, max_wait_s=None) == 1.0  # a second at least
