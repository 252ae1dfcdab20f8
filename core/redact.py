"""Secret redaction for every report, snapshot and log hwtui writes.

The rule is deliberately greedy: a variable whose *name* looks secret is masked whatever its
value, and credentials embedded in URLs (``https://user:pass@host``) or ``token=...`` query
parameters are masked wherever they appear in free text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

MASK = "***REDACTED***"

_SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSW(OR)?D|PASSPHRASE|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|AUTH|"
    r"SESSION|COOKIE|SIGNATURE|_KEY$|^KEY$|_PWD$|WANDB_KEY|HF_TOKEN)",
    re.IGNORECASE,
)
# Names that match the pattern above but are known not to hold secrets.
_SAFE_NAMES = {"SSH_AUTH_SOCK", "XAUTHORITY", "KEYBOARD", "AUTHOR"}

_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<cred>[^/\s:@]+(:[^/\s@]*)?)@")
_QUERY_SECRET = re.compile(
    r"(?P<key>(?:access_)?token|api_?key|apikey|password|passwd|secret|sig|signature|key)=(?P<val>[^&\s\"']+)",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(?i)(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")
# Well-known token shapes that can appear in any value (GitHub, Hugging Face, OpenAI, AWS, Slack).
_TOKEN_SHAPES = re.compile(
    r"\b(gh[pousr]_[A-Za-z0-9]{20,}|hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}|"
    r"xox[abpr]-[A-Za-z0-9-]{10,})\b"
)


def is_secret_name(name: str) -> bool:
    return name.upper() not in _SAFE_NAMES and bool(_SECRET_NAME.search(name))


def redact_text(text: str) -> str:
    """Mask credentials that appear inside free text."""
    if not text:
        return text
    text = _URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)
    text = _QUERY_SECRET.sub(lambda m: f"{m.group('key')}={MASK}", text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {MASK}", text)
    return _TOKEN_SHAPES.sub(MASK, text)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (MASK if is_secret_name(k) else redact_text(v)) for k, v in env.items()}


def redact(value: Any) -> Any:
    """Recursively redact a JSON-like structure (dict keys that look secret mask their values)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {
            k: (MASK if isinstance(k, str) and is_secret_name(k) and isinstance(v, str) else redact(v))
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value
