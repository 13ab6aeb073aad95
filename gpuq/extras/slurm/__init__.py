"""Slurm, an extra: `gpuq export slurm` (specs as sbatch scripts, export.py) and the bridge
(config `backend: slurm`: a worker that hands jobs to Slurm instead of running them,
bridge.py). README.md here is its page."""

from __future__ import annotations

import argparse

from gpuq.hooks import Registry, Verb


def _export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", choices=("slurm",))
    parser.add_argument("specs", nargs="+", metavar="SPEC", help="a spec file, or the id of a pending job")


def register(registry: Registry) -> None:
    registry.verbs.append(
        Verb(
            "export",
            "print specs as sbatch scripts (moving to Slurm)",
            _export_arguments,
            "extras.slurm.cli:cmd_export",
        )
    )
    registry.backends["slurm"] = "extras.slurm.bridge:BridgeWorker"
