"""The blend settings in force have one home, the engine's settings: /api/stats reads them there."""

from __future__ import annotations

from app.build import Services
from app.calibration.in_force import resolve
from app.state import AppState


def test_stats_read_the_settings_the_engine_serves_with(fast_services: Services, fast_engine) -> None:
    before, origin = fast_engine.settings, fast_engine.blend_origin
    state = AppState(settings=fast_services.settings, services=fast_services)
    try:
        fast_services.adopt_blend(resolve(fast_services.settings.engine, fast_engine.config.num_layers))
        assert fast_services.blend is not None and fast_engine.blend_origin == fast_services.blend.described
        stats = state.stats.snapshot(state.serving(), None, None)
        assert stats.blend_settings is not None and stats.blend_settings["source"] == "safe"
        assert stats.blend_settings["values"]["recompute_ratio"] == 0.3 == stats.default_recompute_ratio
        # Whoever changes the engine's blend later (a bench, a test), the stats show what it serves with.
        fast_engine.use_blend(fast_engine.settings.blend.replace(recompute_ratio=0.45), "x")
        stats = state.stats.snapshot(state.serving(), None, None)
        assert stats.blend_settings is not None
        assert stats.blend_settings["values"]["recompute_ratio"] == 0.45 == stats.default_recompute_ratio
    finally:
        fast_engine.use_blend(before.blend, origin)
