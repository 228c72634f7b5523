"""`python -m bench numerics` on the tiny model: both dtypes, every part, and the identities that must hold."""

from __future__ import annotations

import pytest


def test_numerics_measures_every_part_and_ratio_one_is_full_prefill(run_bench, dataset_path) -> None:
    code, result, _ = run_bench(
        "numerics", "--dataset", str(dataset_path), "--examples", "1", "--passages", "3", "--ratios", "0.3,1.0"
    )
    assert code == 0 and result["benchmark"] == "numerics" and result["ratios"] == [0.3, 1.0]
    layers = result["layers"]
    assert set(layers) == {"k_bf16", "k_round", "k_int4", "v_bf16", "v_int4", "rotation_bf16", "k_stale"}
    num_layers = result["served_model"]["num_layers"]
    assert all(len(values) == num_layers for values in layers.values())
    # bfloat16 keeps 8 bits of mantissa: rounding alone costs at most 2^-9 relative per element.
    assert all(0 < e < 2**-8 for e in layers["k_round"])
    assert all(e > 0 for e in layers["k_int4"])
    methods = result["methods"]
    assert set(methods) == {
        "full16",
        "reuse32",
        "reuse16",
        *(
            f"{m}@{r}"
            for r in (0.3, 1.0)
            for m in ("blend32", "blend16", "blend16+kv32", "blend16+rows32", "blend16+int4")
        ),
    }
    # In float32 a blend that recomputes everything is full prefill; in bfloat16 it is bfloat16's full prefill.
    assert methods["blend32@1.0"]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert methods["blend16@1.0"]["kl_own"] == pytest.approx(0.0, abs=1e-2)
    assert methods["blend16@1.0"]["rows_shared"] == 1.0 == methods["blend32@1.0"]["rows_shared"]
    # The forced plan recomputes exactly the float32 blend's rows: at ratio 1 every row, as the plan's own.
    assert methods["blend16+rows32@1.0"]["kl_own"] == pytest.approx(methods["blend16@1.0"]["kl_own"], abs=1e-6)
    assert layers["k_stale"][0] == 0.0  # layer 0's keys depend on the token alone: nothing to repair there
