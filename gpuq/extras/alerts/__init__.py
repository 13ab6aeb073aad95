"""Alerts, an extra: each worker evaluates them with every publication of its box's state
(watch.py, a publisher: a hot GPU, a job holding memory idly or over its declaration, a flood
of very short jobs, and on one host for the queue: long waits, silent workers), keeps them in
state/alerts/HOST.json, hands each new one to config `alert_command`, and `gpuq status` shows
them under ALERTS (view.py). README.md here is its page. Without it no alert is raised, and
`doctor` names the alert_* keys a config sets for nothing."""

from __future__ import annotations

from pathlib import Path

from gpuq.hooks import BoxPublisher, Registry, StatusSection
from gpuq.spool.layout import Layout


def register(registry: Registry) -> None:
    registry.publishers.append(BoxPublisher("alerts", "extras.alerts.watch:start"))
    registry.views.append(
        StatusSection("alerts", "ALERTS", "extras.alerts.view:read", "extras.alerts.view:render", after="HOSTS")
    )


def alerts_file(layout: Layout, host: str) -> Path:
    """Where `host`'s worker keeps its current alerts: state/, which only the queue's account
    writes. Here, not in watch.py: `gpuq status` reads the file and loads none of the worker."""
    return layout.state / "alerts" / f"{host}.json"
