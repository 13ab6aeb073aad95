#!/usr/bin/env python3
"""Thin launcher: `python worker.py [--foreground] ...` runs this host's gpuq worker.
Cron starts it every minute: `gpuq init` prints the line (README, "On a GPU box")."""

import os
import sys

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    from gpuq.host.audit import install_if_asked

    install_if_asked()  # the tests' proof of the privilege boundary; nothing otherwise
    from gpuq.single_instance import ANOTHER_WORKER_RUNS, lock_at_cron_start

    lock_fd = lock_at_cron_start(sys.argv[1:], here)
    if lock_fd == ANOTHER_WORKER_RUNS:
        sys.exit(0)  # cron's every-minute start while the worker runs: leave before loading more
    from gpuq.worker_main import main

    sys.exit(main(launcher_dir=here, lock_fd=lock_fd))
