#!/usr/bin/env python3
"""Thin launcher: `python gpuq.py VERB ...` (status, submit, show, logs, cancel, ...)."""

import os
import sys

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    from gpuq.host.audit import install_if_asked

    install_if_asked()  # the tests' proof of the privilege boundary; nothing otherwise
    from gpuq.cli import main

    sys.exit(main(launcher_dir=here))
