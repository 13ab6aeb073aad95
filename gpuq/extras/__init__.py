"""Extras: optional features, one folder each, that the core never imports. Each package here
has a `register(registry)` that `gpuq/hooks.py` calls; deleting its folder removes the feature
and nothing else (tests/test_extras.py)."""
