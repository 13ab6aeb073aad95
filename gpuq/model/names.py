"""What a job id and a host name may be: both become file names in every part of the spool, so
both are checked wherever one is read."""

from __future__ import annotations

import re

JOB_ID_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}\Z")


HOST_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}\Z")
