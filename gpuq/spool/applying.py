"""A worker applies the requests in the inbox (spool/inbox.py), judging each by who sent it: the
request file's owner (owners.Actor). One function per verb; each id's outcome is one line
of the reply, and the reply is ok when every id's was."""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

from gpuq import hooks
from gpuq.host.owners import Actor
from gpuq.model.config import Config
from gpuq.spool import cancel, drain, holds
from gpuq.spool.decommission import forget
from gpuq.spool.inbox import Reply, Request, RequestError, answered, finish, read_taken, take, taken_path
from gpuq.spool.layout import Layout

log = logging.getLogger("gpuq.worker")
Outcome = tuple[bool, str]
# How a request is applied: (layout, config, this host, who asks, the request) -> one outcome
# per id. An extra's request kinds (hooks.py `request_kinds`) name a function of this type.
ApplyKind = Callable[[Layout, Config, str, Actor, Request], list[Outcome]]


def apply_one(layout: Layout, config: Config, host: str, name: str, taken: bool = False) -> Reply | None:
    """Take request `name` from the inbox (unless this host took it already), apply it and
    write the reply. None: someone else took it first. Whatever goes wrong with one request
    is its reply: it never stops the requests behind it."""
    if not taken and take(layout, host, name) is None:
        return None
    path = taken_path(layout, host, name)
    try:
        uid = os.lstat(path).st_uid  # who asks, also for a request that cannot be read
    except OSError:
        uid = None
    if uid is not None and answered(layout, name, uid):
        # Applied already: this host died before it dropped the file. A reply is never overwritten.
        log.warning("request %s dropped: it has a reply", name)
        finish(layout, host, name, None)
        return None
    try:
        request = read_taken(path, name)
        reply = apply_request(layout, config, host, request)
    except RequestError as e:
        reply = Reply(((False, str(e)),), host, uid)
    except Exception as e:  # noqa: BLE001 - a bug or a case not foreseen: answered, logged, never stuck
        log.exception("request %s failed", name)
        reply = Reply(
            (
                (
                    False,
                    f"request {name}: gpuq could not apply it ({type(e).__name__}); "
                    "an admin can read why in the worker's log",
                ),
            ),
            host,
            uid,
        )
    try:
        finish(layout, host, name, reply)
    except OSError:
        log.exception("could not reply to request %s", name)
        try:
            os.unlink(taken_path(layout, host, name))
        except OSError:
            pass
    return reply


def apply_request(layout: Layout, config: Config, host: str, request: Request) -> Reply:
    actor = Actor.of(request.uid, config.admins, request.by_root)
    handler = _handler(request.verb)
    try:
        outcomes = handler(layout, config, host, actor, request)
    except (RequestError, holds.HoldError, drain.DrainError) as e:
        outcomes = [(False, str(e))]
    except OSError as e:  # the spool could not be written: say so, nothing is half done
        outcomes = [
            (
                False,
                f"gpuq {request.verb}: {e.strerror or e} ({e.filename or 'state/'}); nothing was changed; try again",
            )
        ]
    done = sum(ok for ok, _ in outcomes)
    log.info(
        "%s by %s: %d done, %d refused%s",
        request.verb,
        actor.name,
        done,
        len(outcomes) - done,
        "".join(f"; {line}" for _, line in outcomes[:3]) + (" ..." if len(outcomes) > 3 else ""),
    )
    return Reply(tuple(outcomes), host, request.uid)


def _handler(verb: str) -> ApplyKind:
    """The core's own verb, or an extra's request kind (read_taken let in only those)."""
    if verb in VERBS:
        return VERBS[verb]
    spec = hooks.registry().request_kinds.get(verb)
    if spec is None:  # the extra was deleted between take and apply: a refusal, as any unknown verb
        raise RequestError(f"gpuq {verb}: no extra here applies it")
    kind: ApplyKind = hooks.load(spec)
    return kind


def _per_id(request: Request, one: Callable[[str], Outcome]) -> list[Outcome]:
    if not request.ids:
        raise RequestError(f"gpuq {request.verb}: no job ids given")
    return [one(job_id) for job_id in request.ids]


def _held_or_refused(call: Callable[[], str]) -> Outcome:
    try:
        return True, call()
    except holds.HoldError as e:
        return False, str(e)


def _cancel(layout: Layout, config: Config, host: str, actor: Actor, r: Request) -> list[Outcome]:
    now = r.args.get("now") is True  # `gpuq cancel --now`
    # The waiting ones first: an array's running member stopped before its waiting ones were
    # cancelled freed its %N place, and another box started a member the same cancel then killed.
    waiting_first = sorted(dict.fromkeys(r.ids), key=lambda i: layout.record(layout.running, i).exists())
    done = {i: cancel.cancel_one(layout, i, host, actor, now) for i in waiting_first}
    return _per_id(r, done.__getitem__)  # the outcomes in the order asked


def _hold(layout: Layout, config: Config, host: str, actor: Actor, r: Request) -> list[Outcome]:
    why = text_arg(r.args.get("why"), 200)
    return _per_id(r, lambda i: _held_or_refused(lambda: holds.hold(layout, i, host, actor, why)))


def _submit_held(layout: Layout, config: Config, host: str, actor: Actor, r: Request) -> list[Outcome]:
    text = r.args.get("text")
    if len(r.ids) != 1 or not isinstance(text, str):
        raise RequestError("gpuq submit --hold: one job id and the spec's text")
    return [_held_or_refused(lambda: holds.submit_held(layout, r.ids[0], host, actor, text.encode()))]


def _release(layout: Layout, config: Config, host: str, actor: Actor, r: Request) -> list[Outcome]:
    return _per_id(r, lambda i: _held_or_refused(lambda: holds.release(layout, i, host, actor)))


def _retry(layout: Layout, config: Config, host: str, actor: Actor, r: Request) -> list[Outcome]:
    return _per_id(r, lambda i: _held_or_refused(lambda: holds.retry(layout, i, host, actor)))


def _dismiss(layout: Layout, config: Config, host: str, actor: Actor, r: Request) -> list[Outcome]:
    return _per_id(r, lambda i: _held_or_refused(lambda: holds.dismiss(layout, i, actor)))


def _edit(layout: Layout, config: Config, host: str, actor: Actor, r: Request) -> list[Outcome]:
    text = r.args.get("text")
    if len(r.ids) != 1 or not isinstance(text, str):
        raise RequestError("gpuq edit: one job id and the new text")
    release_after = r.args.get("release") is True
    return [_held_or_refused(lambda: holds.edit(layout, r.ids[0], host, actor, text.encode(), release_after))]


def _drain(layout: Layout, config: Config, host: str, actor: Actor, r: Request) -> list[Outcome]:
    return [(True, drain.drain(layout, _host(r), text_arg(r.args.get("reason"), 200) or None, actor))]


def _resume(layout: Layout, config: Config, host: str, actor: Actor, r: Request) -> list[Outcome]:
    return [(True, drain.resume(layout, _host(r), actor))]


def _forget(layout: Layout, config: Config, host: str, actor: Actor, r: Request) -> list[Outcome]:
    return [(True, forget(layout, _host(r), actor, config.lost_after_s))]


def _host(r: Request) -> str:
    host = r.args.get("host")
    if not isinstance(host, str):
        raise RequestError(f"gpuq {r.verb}: a host name")
    return host


def text_arg(value: Any, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else ""


VERBS: dict[str, ApplyKind] = {
    "cancel": _cancel,
    "hold": _hold,
    "submit-held": _submit_held,
    "release": _release,
    "retry": _retry,
    "edit": _edit,
    "drain": _drain,
    "resume": _resume,
    "forget": _forget,
    "dismiss": _dismiss,
}
