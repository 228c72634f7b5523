#!/usr/bin/env bash
# The GPU path measured in one command (one NVIDIA GPU, no network, ~6 minutes on an H200):
#   - the sync-free prompt pass under torch.cuda.set_sync_debug_mode("error") (tests/engine/test_host_syncs.py)
#   - random-weight checkpoints of real shapes written on the device (bench/random_model.py) with the default
#     model's tokenizer: Qwen2.5-0.5B (the default model's shape), Mistral-7B, Qwen2.5-7B
#   - `bench ttft` on each, bfloat16, every mode: chunk KV from the store in int4 (the server's default: one
#     copy per layer across the bus) and device-resident (the engine's tensors on the GPU, nothing crosses)
#   - `bench quality` at ratio 1 in float32 (exactness: first-token KL of blend against full prefill)
#   - `bench profile` (kernel launches, copies and host syncs per prompt pass)
#   - decode tokens/s of 1 and 8 concurrent clients (batched, through the scheduler), captured in CUDA graphs and
#     eager (engine.decode_graphs: off), with the graph decode's own tests (tests/engine/test_decode_graphs.py)
#   - where the host CPU has AMX: `bench ttft` of the default model's shape on two of its cores in bfloat16, with
#     the default model's shipped record (~2 minutes; the AMX figure of the README's table)
# Needs what scripts/device-prep.sh puts under .device/ (wheels, tokenizer, data): carry `.device`.
# Results are written under $RES and packed again after every step into one archive, $OUT/device-check.tgz (the
# device tool brings back at most 8 files, and whatever is under $OUT when a run is cut short): a run stopped
# at its time limit still returns every figure taken so far. The most wanted shape runs first.
# Rehearse it on a CPU before a GPU is at hand (every command runs, the CUDA-only tests skip, figures mean nothing):
#   PY=.venv/bin/python WHEELS=none SHAPES=tiny CPU_TTFT=always CPU_SHAPE=tiny scripts/device-check.sh
# (TOKENIZER= and DATASET= point elsewhere than .device/; tests/scripts/test_device_check.py does this in the suite)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./device-check-out}
RES=${RES:-/tmp/device-check-results}
mkdir -p "$OUT" "$RES"
LOG="$RES/device-check.log"
SHAPES=${SHAPES:-"mistral-7b qwen2.5-0.5b qwen2.5-7b"}
MODELS=${MODELS:-/tmp/blendrag-random-models}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export BLENDRAG_MODELS_DIR=${BLENDRAG_MODELS_DIR:-/tmp/blendrag-models}
PY=${PY:-python3}
WHEELS=${WHEELS:-.device/whl}
step() {
    tar czf "$OUT/device-check.tgz" -C "$RES" . 2>/dev/null  # what is taken so far
    echo "== $(date +%T) $*" | tee -a "$LOG"
}
run() { "$@" >>"$LOG" 2>&1 || echo "!! failed ($?): $*" | tee -a "$LOG"; }

if [ -d "$WHEELS" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
step "environment"
{ nvidia-smi; "$PY" -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(0))'; lscpu | head -20; } >"$RES/env.txt" 2>&1

step "no host sync in any prompt pass; graph decode gives eager decode's tokens (CUDA)"
run "$PY" -m pytest -q -p no:cacheprovider tests/engine/test_host_syncs.py tests/kvcache/test_staging.py \
    tests/engine/test_decode_graphs.py

DATASET=${DATASET:-.device/data/musique_dev.json}
TOKENIZER=${TOKENIZER:-.device/tokenizer}
for shape in $SHAPES; do
    model="$MODELS/$shape"
    step "write $shape"
    run "$PY" -m bench random-model --shape "$shape" --tokenizer "$TOKENIZER" --out "$model"
    for kv in int4 fp32; do
        step "ttft $shape kv=$kv"
        run "$PY" -m bench ttft --model "$model" --dataset "$DATASET" --examples 5 --passages 6 --dtype bfloat16 \
            --ratios 0.15,0.3 --kv-dtype "$kv" --no-rss --out "$RES/ttft-$shape-$kv.json"
    done
    if [ "$shape" = "mistral-7b" ] || [ "$shape" = "tiny" ]; then
        step "profile $shape"
        run "$PY" -m bench profile --model "$model" --dataset "$DATASET" --examples 1 --passages 6 --dtype bfloat16 \
            --repeats 2 --kv-dtype int4 --out "$RES/profile-$shape.json"
    fi
    if [ "$shape" = "qwen2.5-0.5b" ] || [ "$shape" = "tiny" ]; then
        step "exactness $shape (float32, ratio 1)"
        run "$PY" -m bench quality --model "$model" --dataset "$DATASET" --examples 3 --passages 6 --dtype float32 \
            --ratios 1.0 --kv-dtype fp32 --max-tokens 4 --out "$RES/quality-$shape-fp32.json"
        step "decode $shape (1 and 8 clients, CUDA graphs)"
        run "$PY" scripts/decode_rate.py --model "$model" --dtype bfloat16 --tokens 128 --clients 1,8 --out "$RES/decode-$shape.json"
        step "decode $shape (1 and 8 clients, eager)"
        run "$PY" scripts/decode_rate.py --model "$model" --dtype bfloat16 --tokens 128 --clients 1,8 \
            --decode-graphs off --out "$RES/decode-$shape-eager.json"
    fi
    rm -rf "$model"
done
# The README's AMX row, which otherwise needs an AMX machine at hand: where the host has AMX (many GPU hosts are
# Xeons that do), the default model's shape in bfloat16 on two of its cores, the GPU hidden. The checkpoint is
# written under the default model's name, so the engine takes that model's shipped bfloat16 record as a server does
# (its ratio, selector, scoring layers, spans, stale-key bias); random weights recompute as many rows as the real
# ones, so the timing holds. CPU_TTFT=always runs it on any CPU (the rehearsal), never skips it.
CPU_TTFT=${CPU_TTFT:-auto}
CPU_SHAPE=${CPU_SHAPE:-qwen2.5-0.5b}
if [ "$CPU_TTFT" = always ] || { [ "$CPU_TTFT" = auto ] && grep -qw amx_tile /proc/cpuinfo; }; then
    model="$MODELS/cpu/qwen2.5-coder-0.5b"
    step "write $CPU_SHAPE (as qwen2.5-coder-0.5b) for the CPU"
    run "$PY" -m bench random-model --shape "$CPU_SHAPE" --tokenizer "$TOKENIZER" --out "$model"
    ratio=$("$PY" -c 'from app.calibration.shipped import shipped_blend_settings as s
print(s("qwen2.5-coder-0.5b", "bfloat16").values["recompute_ratio"])')
    pin=""
    command -v taskset >/dev/null && pin="taskset -c 0,1"
    step "ttft $CPU_SHAPE on 2 CPU cores, bfloat16, the shipped record (ratio $ratio) beside 0.15 and 0.25"
    run env CUDA_VISIBLE_DEVICES= $pin "$PY" -m bench ttft --model "$model" --dataset "$DATASET" --examples 5 \
        --passages 6 --threads 2 --dtype bfloat16 --kv-dtype int4 --ratios "$ratio,0.15,0.25" --no-rss \
        --out "$RES/ttft-cpu-$CPU_SHAPE.json"
    rm -rf "$model"
fi
step "done"
ls -la "$RES" "$OUT"
