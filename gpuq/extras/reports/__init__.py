"""Reports, an extra: `gpuq report` (what the queue did over a window: report.py the figures,
reportview.py the text, reporthtml.py the page), `gpuq eff` (how well jobs used what they
held: efficiency.py), and what each worker writes with its heartbeat through two publishers:
the Prometheus metrics (metrics.py) and the GPU samples the reports draw utilization from
(samples.py). They read what the core keeps besides: the event log and the records.
README.md here is its page."""

from __future__ import annotations

import argparse

from gpuq.hooks import BoxPublisher, Registry, Verb


def _report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--since",
        help="a duration back from now (7d, 12h, 90m) or a local date (2026-11-01, "
        "'2026-11-01 14:00'); default 7d, or from the queue's first job when that is later",
    )
    parser.add_argument("--by", choices=("user", "host", "gpu"), help="one row per user, host or GPU")
    parser.add_argument("--json", action="store_true", help="the report as JSON (docs/reports.md)")
    parser.add_argument(
        "--html", metavar="FILE", help="write a self-contained page with charts (needs the [report] extra: matplotlib)"
    )


def _eff_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "ids", nargs="*", metavar="ID", help="jobs, or a sweep's or array's id (default: --user's jobs)"
    )
    parser.add_argument("--user", help="whose jobs, without IDs (default: mine)")
    parser.add_argument("--since", default="7d", help="without IDs: jobs that ran in this window (default 7d)")
    parser.add_argument("--json", action="store_true", help="the figures and hints as JSON (docs/reports.md)")


def register(registry: Registry) -> None:
    registry.verbs.append(
        Verb(
            "report",
            "GPU-hours used and held idle, waits, utilization and queue length "
            "over time, failures and preemptions, over a window",
            _report_arguments,
            "extras.reports.cli:cmd_report",
        )
    )
    registry.verbs.append(
        Verb(
            "eff",
            "how well jobs used their CPUs, RAM and GPUs, with hints why one is slow "
            "(a job, a sweep or array, or a user's jobs over a window)",
            _eff_arguments,
            "extras.reports.cli:cmd_eff",
        )
    )
    registry.publishers.append(BoxPublisher("metrics", "extras.reports.metrics:start"))
    registry.publishers.append(BoxPublisher("samples", "extras.reports.samples:start", last_word=True))
