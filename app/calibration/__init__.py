"""Blend settings measured per model: the calibration that chooses them, where they are kept, which are in force.

record.py    BlendSettingsRecord: the settings a calibration chose for one model and what it measured
store.py     CalibrationStore: <data dir>/calibration/<fingerprint>.json, written atomically
shipped.py   shipped_blend_settings(model_name, dtype): the records the repo ships, one per model and compute dtype
in_force.py  BlendInForce: operator > calibrated > shipped > safe, where each came from (the engine holds them)
calset.py    the calibration set, generated (look-ups with made-up codes, two-hop questions, follow-ups)
prose.py     its passages: sections of the standard library's docstrings, none repeated
measure.py   one blend configuration's figures on that set, against full prefill and reuse
search.py    calibrate(): the cheapest candidate meeting the targets
runner.py    CalibrationRunner: the background calibration of a model served for the first time
"""
