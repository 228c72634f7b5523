#!/usr/bin/env bash
# Prepare what scripts/device-check.sh carries to a GPU machine (no network there): the Python wheels its image
# lacks, the default model's tokenizer and the benchmark data, all under .device/ (in .gitignore). Run here, once,
# from the repository root; then run the check there with `.device` carried.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${DATA_DIR:-../shared/data}
mkdir -p .device/whl .device/data
# The device image has torch, transformers, numpy, safetensors, tokenizers, httpx, click, rich, tqdm; not these.
# Versions as this checkout's environment has them; cp312 manylinux wheels (the image's Python is 3.12).
wheels=""
for name in pydantic pydantic-core annotated-types typing-inspection pydantic-settings python-dotenv faiss-cpu \
    beautifulsoup4 soupsieve python-docx pypdf redis; do
    version=$("$PY" -m pip show "$name" 2>/dev/null | awk '/^Version:/ {print $2}')
    [ -n "$version" ] && wheels="$wheels $name==$version"
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .device/whl $wheels
[ -f .device/tokenizer/tokenizer.json ] || "$PY" -m bench random-model --export-tokenizer qwen2.5-coder-0.5b --out .device/tokenizer
cp "$DATA/musique_dev.json" .device/data/
du -sh .device
