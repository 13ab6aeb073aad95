"""The one registry through which extras (`gpuq/extras/NAME/`) add to the core: the core
asks the registry, never an extra by name (gpuq/layers.py refuses such an import).

An extra is found by listing `gpuq/extras/`: each package there is imported and its
`register(registry)` called, once per process. A deleted extra's folder is simply not there.
What an extra's `register` may add is the fields of `Registry`; docs/design.md, "The new
shape", says which part of the core asks for each.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

EXTRAS_DIR = Path(__file__).resolve().parent / "extras"


@dataclass(frozen=True)
class Verb:
    """A verb an extra adds to `gpuq`. `setup` adds its arguments (argparse only: every CLI
    start runs it, so it must import nothing heavy); `handler` is "module:function" under
    gpuq, loaded only when the verb runs, as the core's own verbs are (cli/__init__.py)."""

    name: str
    help: str
    setup: Callable[[argparse.ArgumentParser], None]
    handler: str


@dataclass
class Registry:
    verbs: list[Verb] = field(default_factory=list)
    # Worker kinds by the config's `backend` ("local" is the core's own worker): "module:class"
    # under gpuq, a class taking what worker.loop.Worker takes, loaded when a worker starts.
    backends: dict[str, str] = field(default_factory=dict)


_registry: Registry | None = None


def registry() -> Registry:
    """Every extra's contributions; the extras are imported the first time it is asked for."""
    global _registry
    if _registry is None:
        _registry = Registry()
        for found in sorted(pkgutil.iter_modules([str(EXTRAS_DIR)]), key=lambda m: m.name):
            if found.ispkg:
                importlib.import_module(f"gpuq.extras.{found.name}").register(_registry)
    return _registry


def load(spec: str) -> Any:
    """What a "module:name" under gpuq names (a Verb's handler, a backend), imported now."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(f"gpuq.{module}"), name)
