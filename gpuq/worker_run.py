"""The worker process: started by its box's starter (worker_main.py, host/privsep.py) as the
queue's account, isolated (`python -I`, in `/`), with the starter's socket in its environment.
It makes what is missing of the spool, opens its log, and runs the worker loop (or another
backend's worker, from an extra: the Slurm bridge) until stopped; it exits with the starter if the starter dies.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

from gpuq import hooks
from gpuq.host.audit import install_if_asked
from gpuq.model import config as config_mod
from gpuq.single_instance import this_host
from gpuq.spool.layout import Layout, RootError, resolve_root
from gpuq.worker.loop import Worker
from gpuq.worker_main import local_dir_problem, open_worker_log, parse_args, setup_logging


def main(argv: list[str] | None = None) -> int:
    install_if_asked()  # the tests' proof of the privilege boundary: it records nothing unless root
    args = parse_args(argv)
    try:
        layout = Layout(resolve_root(args.root, None))
    except RootError as e:
        print(f"gpuq worker: {e}", file=sys.stderr)
        return 2
    host = args.host or this_host()
    layout.ensure()
    # The log first: a daemonized worker's stderr goes nowhere, and a refusal must be read.
    log_fd, log_problem = open_worker_log(layout.worker_log(host))
    setup_logging(log_fd, to_stderr=args.foreground or args.once or log_fd is None, verbose=args.verbose)
    if log_problem:
        logging.getLogger("gpuq.worker").warning("%s", log_problem)
    try:
        config = config_mod.load(layout.config_file)
    except config_mod.ConfigError as e:  # strict: a typo must not run the team's jobs on a default
        logging.getLogger("gpuq.worker").error("worker %s refuses to start: %s", host, e)
        return 2
    local_dir = layout.local_dir(host, config.local_dir)
    if (problem := local_dir_problem(local_dir, layout, os.geteuid())) is not None:
        logging.getLogger("gpuq.worker").error("worker %s refuses to start: %s", host, problem)
        return 2
    worker_class = Worker
    if config.backend != "local":  # another kind of worker, from an extra (config.py checks the name)
        if config.backend not in hooks.registry().backends:
            why = hooks.registry().broken.get(config.backend) or f"gpuq/extras/{config.backend} is not there"
            logging.getLogger("gpuq.worker").error(
                "worker %s refuses to start: backend %r comes with the %s extra, and %s. "
                "Fix: restore that folder (reinstall gpuq from its checkout), or set backend: local in %s",
                host,
                config.backend,
                config.backend,
                why,
                layout.config_file,
            )
            return 2
        worker_class = hooks.load(hooks.registry().backends[config.backend])
    # SIGTERM (shutdown, `kill`) ends the worker cleanly; running jobs live on under their
    # supervisors and keepers, and the next worker reattaches to them.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        worker_class(layout, config, host, args.fake_gpus).run(once=args.once, exit_when_idle=args.exit_when_idle)
    except KeyboardInterrupt:
        pass
    finally:
        logging.getLogger("gpuq.worker").info("worker %s stopped; running jobs continue under their supervisors", host)
    return 0
