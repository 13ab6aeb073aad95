#!/usr/bin/env python3
"""Thin launcher: `python gpuq.py VERB ...` (status, submit, show, logs, cancel, ...)."""

import os
import sys

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    from gpuq.host.audit import install_if_asked

    install_if_asked()  # the tests' proof of the privilege boundary; nothing otherwise
    if sys.argv[1:2] == ["fake-use"]:  # in nearly every job on fake GPUs: not worth the CLI's imports
        from gpuq.host.fake_use import main as fake_use

        sys.exit(fake_use(sys.argv[2:]))
    from gpuq.cli import main

    sys.exit(main(launcher_dir=here))
