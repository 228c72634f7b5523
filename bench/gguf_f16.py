"""An F16 GGUF written from the same weights as a quantized one (the `gguf` package, no llama.cpp tools).

The built-in model ships as Q4_1; the engine dequantizes it once and computes in float32 or bfloat16.
To compare llama.cpp on equal weights, `write_f16_gguf` dequantizes every tensor of the source file and
writes it again: matrices as F16, 1-D tensors (norms, biases) as F32, every metadata field copied but
`general.file_type` (MOSTLY_F16). The file (~270 MB for SmolLM2-135M) belongs under bench/out/ or the
data dir, never in the repository.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fsio.atomic import atomic_path

logger = logging.getLogger(__name__)

# Fields the writer produces itself (header counts, the architecture) or that change with the weights.
_SKIP_FIELDS = ("GGUF.", "general.architecture", "general.file_type")
_MOSTLY_F16 = 1  # llama.cpp's LLAMA_FTYPE_MOSTLY_F16


def write_f16_gguf(source: Path, target: Path) -> Path:
    """Write `target` (F16) from `source` unless it exists; returns `target`."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize

    target = Path(target)
    if target.is_file():
        return target
    reader = GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    with atomic_path(target) as tmp:  # a run stopped halfway leaves no file that looks done
        writer = GGUFWriter(tmp, arch)
        for name, field in reader.fields.items():
            if name.startswith(_SKIP_FIELDS):
                continue
            vtype = field.types[0]
            sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
            writer.add_key_value(name, field.contents(), vtype, sub_type)
        writer.add_file_type(_MOSTLY_F16)
        for tensor in reader.tensors:
            shape = tuple(int(x) for x in reversed(tensor.shape))  # GGML lists ne0 first; numpy the other way
            values = dequantize(tensor.data, tensor.tensor_type).reshape(shape)
            if len(shape) > 1:
                writer.add_tensor(tensor.name, values.astype(np.float16), raw_dtype=GGMLQuantizationType.F16)
            else:
                writer.add_tensor(tensor.name, values.astype(np.float32), raw_dtype=GGMLQuantizationType.F32)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    logger.info("wrote %s (%.0f MB, F16 from %s)", target, target.stat().st_size / 1e6, Path(source).name)
    return target
