"""`gpuq report`: what happened, over the events and samples."""

from __future__ import annotations

import argparse
import errno
import json
import sys
import time
from pathlib import Path

from gpuq.cli.common import open_layout
from gpuq.views.reporthtml import ReportHtmlError, write_html
from gpuq.views.reportview import DEFAULT_SINCE, gather, parse_since, report_text


def cmd_report(args: argparse.Namespace) -> int:
    layout = open_layout(args)
    now = time.time()
    try:
        since = parse_since(args.since or DEFAULT_SINCE, now)
    except ValueError as e:
        print(f"gpuq report: {e}", file=sys.stderr)
        return 2
    # Asked for nothing, a young queue's report covers its life, not a week of empty slices.
    report = gather(layout, since, now, args.by, from_history_start=args.since is None)
    if args.html:
        try:
            write_html(report, Path(args.html))
        except ReportHtmlError as e:
            print(f"gpuq report: {e}", file=sys.stderr)
            return 2
        except OSError as e:
            link = " (a symbolic link, never written through: name the file itself)" if e.errno == errno.ELOOP else ""
            print(f"gpuq report: cannot write {args.html}: {e.strerror}{link}", file=sys.stderr)
            return 2
        print(f"wrote {args.html}", file=sys.stderr)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    elif not args.html:
        print(report_text(report))
    return 0
