"""`gpuq-worker`, the installed worker command. Cron starts it every minute on every box, as it
starts a checkout's `worker.py`, and like `worker.py` it first asks single_instance.py whether
this host's worker runs already: then it leaves having loaded os, fcntl and stat, not argparse,
PyYAML and the rest of gpuq. Only a start that will run the worker loads `worker_main`.
"""

from __future__ import annotations

import importlib
import os
import sys

from gpuq.host.audit import install_if_asked
from gpuq.single_instance import ANOTHER_WORKER_RUNS, lock_at_cron_start


def main() -> int:
    install_if_asked()  # the tests' proof of the privilege boundary; nothing otherwise
    argv = sys.argv[1:]
    lock_fd = lock_at_cron_start(argv, _cwd_if_root())
    if lock_fd == ANOTHER_WORKER_RUNS:
        return 0  # cron's every-minute start while the worker runs
    worker_main = importlib.import_module("gpuq.worker_main")  # by name: loaded only to run the worker
    return worker_main.main(argv, lock_fd=lock_fd)


def _cwd_if_root() -> str | None:
    """With no --root and no $GPUQ_ROOT, the installed commands take the current directory when
    it looks like a root (spool/layout.resolve_root); none, or a removed one, leaves it to main."""
    try:
        cwd = os.getcwd()
    except OSError:
        return None
    looks_like_root = os.path.isdir(os.path.join(cwd, "jobs")) and os.path.exists(os.path.join(cwd, "config.yaml"))
    return cwd if looks_like_root else None
