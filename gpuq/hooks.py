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
    # Extras that could not be loaded, each with why and the fix: the core runs without them
    # (one broken folder must not take down `gpuq status` or a worker); `gpuq doctor` lists them.
    broken: dict[str, str] = field(default_factory=dict)
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
                _register(found.name, _registry)
    return _registry


def _register(name: str, into: Registry) -> None:
    """Load one extra into the registry, or note it as broken: what it added is taken back
    if its register() fails half-way, so the core sees all of an extra or none of it."""
    trial = Registry()
    try:
        module = importlib.import_module(f"gpuq.extras.{name}")
        register = getattr(module, "register", None)
        if not callable(register):
            raise TypeError("it has no register(registry) function")
        register(trial)
    except Exception as e:  # an extra is someone else's code: whatever it raises, the core goes on
        into.broken[name] = (
            f"the extra gpuq/extras/{name} could not be loaded ({type(e).__name__}: {e}); gpuq runs without it. "
            f"Fix: repair or reinstall it, or delete the folder gpuq/extras/{name}"
        )
        return
    taken = {v.name for v in into.verbs}
    into.verbs += [v for v in trial.verbs if v.name not in taken]
    into.backends.update({k: v for k, v in trial.backends.items() if k not in into.backends})


def load(spec: str) -> Any:
    """What a "module:name" under gpuq names (a Verb's handler, a backend), imported now."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(f"gpuq.{module}"), name)
