"""The one way the app loads its engine: the model of `settings`, in the compute dtype its data dir's KV was
built in (app/compute_dtype.py), from the machine's model cache. The server, every CLI command that needs
the model (through app/build.py) and `blendrag calibrate` / `python -m bench calibrate` load it here, so a
calibration measures the model in the dtype the server on that data dir serves it in."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.settings import Settings
    from engine.engine import Engine

logger = logging.getLogger(__name__)


def load_engine(settings: Settings) -> Engine:
    """Load (on a first start: convert) the model of `settings` and warm its prompt prefix; seconds, minutes
    the first time."""
    from app.compute_dtype import data_dir_dtype
    from engine.engine import Engine

    step = time.perf_counter()
    model = settings.engine.model
    logger.info(
        "start-up: loading the model %s%s …",
        model,
        f" (a catalogue model or GGUF file is converted to safetensors once, into {settings.models_dir}, then reused)"
        if not Path(model).is_dir()
        else "",
    )
    # The dtype the data dir's KV was built in, unless the operator sets another (app/compute_dtype.py).
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    dtype = data_dir_dtype(settings.data_dir, settings.engine.dtype, settings.engine.resolve_device())
    engine = Engine(
        settings.engine, models_dir=settings.models_dir, dtype_choice=dtype, read_also=settings.models_dirs_read
    )
    logger.info(
        "start-up: model loaded and its prompt prefix warmed in %.1f s: %s",
        time.perf_counter() - step,
        engine.served_model.describe(),
    )
    return engine
