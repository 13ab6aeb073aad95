#!/usr/bin/env python3
"""Thin launcher: `python worker.py [--foreground] ...` runs this host's gpuq worker.
Cron line: * * * * * cd /shared/gpuq && python worker.py"""
import os
import sys

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    from gpuq.worker_main import main

    sys.exit(main(launcher_dir=here))
