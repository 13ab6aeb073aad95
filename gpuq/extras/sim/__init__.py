"""The simulator, an extra: traces replayed through the same plan the workers carry out,
beside the baselines (`slurm_easy`: Slurm's EASY backfill with multifactor priority). A tool
over the planner: it reads the worker's wake rules (gpuq/host/wake.py), never shapes them.
README.md here is its page."""

from __future__ import annotations

import argparse

from gpuq.hooks import Registry, Verb


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "trace",
        help="CSV: job_id, submit_s, duration_s, gpus, gpu_mem_gib, gpu_util, user[, priority][, time_limit_s]",
    )
    parser.add_argument(
        "--cluster",
        required=True,
        help="HOSTSxGPUSxMEMORY, e.g. 2x8x32GiB; mixed boxes joined by '+', e.g. 1x8x80GiB+2x4x24GiB",
    )
    parser.add_argument(
        "--policy",
        action="append",
        choices=("gpuq", "slurm-easy", "pack-bestfit", "fifo-exclusive"),
        metavar="NAME",
        help="gpuq, slurm-easy, pack-bestfit or fifo-exclusive (repeatable; default: all four)",
    )
    parser.add_argument("--since", type=float, metavar="S", help="only jobs submitted at or after S seconds")
    parser.add_argument("--jobs", type=int, metavar="N", help="only the first N jobs (from --since)")
    parser.add_argument(
        "--stretch",
        type=float,
        default=1.0,
        metavar="K",
        help="multiply the gaps between submissions by K (size a big cluster's load to yours)",
    )
    parser.add_argument(
        "--mark-low",
        type=float,
        metavar="FRACTION",
        help="mark about FRACTION of the jobs priority low (by a hash of job_id)",
    )
    parser.add_argument("--without-low", action="store_true", help="with --mark-low: leave those jobs out instead")
    parser.add_argument(
        "--mark-rule",
        choices=("sha1", "md5", "small"),
        default="sha1",
        help="with --mark-low: sha1 of the job id (default), md5 of it, or sha1 among jobs of one GPU or less",
    )
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="a config.yaml key for gpuq's policy")
    parser.add_argument(
        "--colocation-penalty",
        type=float,
        default=0.0,
        metavar="F",
        help="a job sharing its GPU loses a further fraction F of its speed (0.15: as many measured pairs do)",
    )
    parser.add_argument("--json", action="store_true", help="the figures as JSON")


def register(registry: Registry) -> None:
    registry.verbs.append(
        Verb(
            "simulate",
            "replay a job trace (CSV) on a virtual cluster through gpuq's planner and the baselines; "
            "print waits, occupancy, ratios",
            _arguments,
            "extras.sim.cli:cmd_simulate",
        )
    )
