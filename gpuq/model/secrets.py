"""Which environment variables look like secrets: the one rule for what `gpuq submit` leaves out
and what `gpuq show` masks."""

from __future__ import annotations

import json
import re
from typing import Any

# What makes a variable look like a secret. Its name, split into words at anything but letters
# and digits: a word ending in one of SECRET_ENDINGS (API_KEY, APIKEY, HF_TOKEN, hfToken,
# DB_PASSWORD, CLIENT_SECRET), or one of SECRET_WORDS (MYSQL_PWD, DB_PASS, GITHUB_PAT, SENTRY_DSN).
# Words, not substrings: TOKENIZERS_PARALLELISM and PATH are not secrets. PWD alone is the
# working directory. Its value: credentials in a URL (postgres://user:password@host, a proxy's
# user:password@), a webhook URL whose path is its key (Slack, Discord, Mattermost, Teams, ...)
# or a URL with a token, key or signature in its query, a connection string's Password=, a PEM
# private key, a bearer token, a JSON web token, or a well-known token format (GitHub, GitLab,
# Hugging Face, OpenAI, Slack, AWS, npm, Google, DigitalOcean, Stripe).
SECRET_ENDINGS = (
    "TOKEN",
    "TOKENS",
    "KEY",
    "KEYS",
    "SECRET",
    "SECRETS",
    "PASSWORD",
    "PASSWORDS",
    "PASSWD",
    "PASSPHRASE",
    "CREDENTIAL",
    "CREDENTIALS",
    "COOKIE",
    "COOKIES",
)


SECRET_WORDS = frozenset(
    {"PASS", "PWD", "PAT", "AUTH", "AUTHORIZATION", "CREDS", "DSN", "SESSION", "SESSIONID", "WEBHOOK", "WEBHOOKS"}
)


NOT_SECRET_NAMES = frozenset({"PWD", "OLDPWD"})


SECRET_VALUE_RE = re.compile(
    r"\b[A-Za-z][A-Za-z0-9+.-]{0,31}://[^/\s:@]*:[^/\s@]+@"  # scheme://user:password@
    r"|(?i:://[^\s/]+/(?:[^\s?#]*/)?(?:services|webhooks?|hooks)/(?:[\w-]+/)*[\w-]{8,})"  # a webhook's key in its path
    r"|(?i:[?&](?:token|access_token|api[_-]?key|key|sig|signature|secret|code|auth)=[^&\s]{8,})"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"  # a PEM private key
    r"|(?i:\b(?:password|passwd|pwd|accountkey|sharedaccesskey|secret)=)"  # Server=..;Password=..
    r"|\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}|\bgithub_pat_\w{20,}|\bglpat-[\w-]{20,}"
    r"|\bhf_[A-Za-z0-9]{30,}|\bsk-[A-Za-z0-9_-]{20,}|\bxox[abposr]-[\w-]{10,}|\bAKIA[0-9A-Z]{16}\b"
    r"|\beyJ[\w-]{10,}\.eyJ[\w-]{10,}\.[\w-]{10,}"  # a JSON web token
    r"|\bnpm_[A-Za-z0-9]{30,}|\bAIza[\w-]{30,}|\bdo[opr]_v1_[A-Za-z0-9]{20,}|\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|(?i:\bbearer\s+[\w.~+/=-]{16,})"  # an Authorization header's value
)


def looks_secret(name: str, value: str = "") -> bool:
    """Whether a variable looks like a secret, by its name or its value (see SECRET_ENDINGS).
    The one rule for what submit leaves out and what `gpuq show` masks."""
    if name.upper() in NOT_SECRET_NAMES:
        return bool(SECRET_VALUE_RE.search(value))
    words = [w for w in re.split(r"[^A-Z0-9]+", name.upper()) if w]
    return any(w.endswith(SECRET_ENDINGS) or w in SECRET_WORDS for w in words) or bool(SECRET_VALUE_RE.search(value))


MASK = "****"


def mask_secrets(job: dict[str, Any]) -> dict[str, Any]:
    """The job as shown to anyone: env values that look like secrets (submit.looks_secret, the
    same rule that decides what `gpuq submit` leaves out) are masked whole, in the parsed spec
    and wherever the spec's text holds them."""
    spec = job.get("spec") or {}
    env = spec.get("env") or {}
    secret = {k: str(v) for k, v in env.items() if looks_secret(k, str(v))}
    if not secret:
        return job
    masked = {**job, "spec": {**spec, "env": {k: MASK if k in secret else v for k, v in env.items()}}}
    masked["spec_text"] = _masked_text(job.get("spec_text") or "", secret)
    return masked


def _masked_text(text: str, secret: dict[str, str]) -> str:
    """`text` with each secret value masked whole: every way YAML may have written it (plain,
    quoted, escaped, one line of a block scalar); in flow style (`{NAME: value, ...}`) the
    value after `NAME:`, quoted or up to the next `,` or `}`; in block style all of a `NAME:`
    line after the colon and the more indented lines that continue it (a folded or block value)."""
    for value in secret.values():
        forms = {value, value.replace("'", "''"), json.dumps(value)[1:-1], *value.splitlines()}
        for form in sorted((f for f in forms if len(f.strip()) >= 4), key=len, reverse=True):
            text = text.replace(form, MASK)  # shorter ones would mask unrelated text: the rules below
    names = "|".join(map(re.escape, secret))
    text = re.sub(
        r"""([{,]\s*["']?(?:%s)["']?\s*:\s*)("(?:[^"\\]|\\.)*"|'(?:[^']|'')*'|[^,}\n]*)""" % names,
        rf"\g<1>{MASK}",
        text,
    )
    key_line = re.compile(r"(\s*(?:-\s+)?[\"']?(?:%s)[\"']?\s*:)(?:[ \t]|$)" % names)
    lines, inside = [], None  # inside: the indent of the secret's key line while its value goes on
    for line in text.split("\n"):
        indent = len(line) - len(line.lstrip())
        if inside is not None and (not line.strip() or indent > inside):
            lines.append(line[:indent] + MASK if line.strip() else line)
            continue
        inside = None
        if (m := key_line.match(line)) is not None:
            inside = indent
            line = f"{m.group(1)} {MASK}"
        lines.append(line)
    return "\n".join(lines)
