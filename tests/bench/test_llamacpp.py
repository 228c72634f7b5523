from __future__ import annotations

import pytest

from bench.__main__ import main
from bench.llamacpp import SKIP_MESSAGE, llama_cpp_available


@pytest.mark.skipif(llama_cpp_available(), reason="llama_cpp is installed: the skip path does not apply")
def test_skips_cleanly_without_llama_cpp(tmp_path, capsys) -> None:
    out = tmp_path / "llamacpp.json"
    assert main(["baseline-llamacpp", "--out", str(out)]) == 0
    assert SKIP_MESSAGE in capsys.readouterr().out
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.skipif(not llama_cpp_available(), reason="needs the optional llama-cpp-python (llamacpp extra)")
def test_llamacpp_baseline_on_the_builtin_gguf(run_bench, dataset_path) -> None:
    code, result, png = run_bench(
        "baseline-llamacpp", "--dataset", str(dataset_path), "--examples", "1", "--passages", "2"
    )
    assert code == 0 and png.is_file()
    assert set(result["modes"]) == {"llamacpp_full", "ours_full", "ours_blend@0.15"}
    assert all(m["ttft_s_median"] > 0 for m in result["modes"].values())
    assert result["per_example"][0]["num_prompt_tokens"] > 0
