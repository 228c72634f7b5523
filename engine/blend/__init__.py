"""The blend: which context rows a prompt pass recomputes, planned on the host.

    config.py     BlendConfig, the knobs (declared once; EngineSettings nests it)
    plan.py       plan_blend(layout, mode, config) → BlendPlan: fresh rows per layer, groups, checks, key bias
    named.py      the tokens a question names and the spans recomputed around them
    spans.py      where sentences, table rows and blocks end (match_span: sentence)
    selectors.py  the token selectors (query, deviation, first_k, random) at equal budget
    select.py     completing a plan's choice from the scores / deviations (on the device)
    scoring.py    the query selector's scoring pass
    key_bias.py   the stale-key bias tensor of a plan

This module imports nothing, so `engine.types` can re-export the config without a cycle.
"""
