"""Secret redaction for every report, snapshot and log hwtui writes.

The rule is deliberately greedy: a variable whose *name* looks secret is masked whatever its
value, and credentials found inside any value are masked wherever they appear in free text:

* URL user info, parsed by hand rather than by one regex so that a password holding ``/`` or
  ``@`` (``https://bob:pa/ss@w0rd@host``) is masked whole; scheme-less ``user:pw@host``
  (``MASTER_ADDR=admin:pw@host``) too;
* ``NAME=value`` / ``--name=value`` assignments whose name looks secret (a /proc command line);
* query parameters (``?token=``, ``X-Amz-Signature=``), ``Bearer``/``Basic`` headers;
* well-known token shapes (GitHub, Hugging Face, OpenAI, AWS, Slack, JWTs) and webhook URLs,
  whose secret is their path.

Everything here runs in time linear in the input: text is cut into whitespace/quote-delimited
tokens once and each token is examined with ``str.find``-style scans; the few regexes left are
anchored so that no character starts more than a bounded amount of work (a 1 MB value redacts in
well under 0.1 s; an unanchored ``[a-z]+://`` search had made a 100 KB value take 38 s).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

MASK = "***REDACTED***"

_SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSW(?:OR)?D|PASSPHRASE|PASS(?:_|$)|SSHPASS|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|AUTH|"
    r"SESSION|COOKIE|SIGNATURE|_KEY$|^KEY$|_PWD$|^PWD_|(?:^|_)PAT$|(?:^|_)PAT_|WEBHOOK|DSN$|CONN(?:ECTION)?_?STR",
    re.IGNORECASE,
)
# Names that match the pattern above but are known not to hold secrets (PWD is the working
# directory, SSH_AUTH_SOCK a socket path).
_SAFE_NAMES = {"SSH_AUTH_SOCK", "XAUTHORITY", "KEYBOARD", "AUTHOR", "PWD", "OLDPWD"}

# Keys whose value is a credential wherever ``key=value`` appears (``?token=``, ``&sig=``), matched
# whole and case-insensitively; any key that looks secret by name (``X-Amz-Signature``) counts too.
_QUERY_KEYS = ("token", "api_key", "apikey", "password", "passwd", "pass", "pwd", "secret", "sig", "signature",
               "credential", "key", "auth")
# Cheap gate: '=' is only worth a look when the text holds one of these (lower case).
_SECRET_WORDS = ("token", "pass", "pwd", "secret", "key", "sig", "auth", "credential", "session", "cookie", "pat",
                 "webhook", "dsn", "conn")
_BEARER_WORDS = ("bearer", "basic")
_BEARER_VALUE = re.compile(r"\s+([A-Za-z0-9._~+/=-]{8,})")
# Well-known token shapes that can appear in any value (GitHub, Hugging Face, OpenAI, AWS, Slack,
# GitLab, JWTs). Each starts with a literal so the regex engine jumps between candidates, and the
# lookbehind *after* the literal keeps a match to where a word starts: within one long word only
# the first position can start a match, so the scan is linear.
_TOKEN_SHAPES = tuple(re.compile(p) for p in (
    r"gh[pousr]_(?<![A-Za-z0-9_-]gh._)[A-Za-z0-9]{20,}",
    r"github_pat_(?<![A-Za-z0-9_-]github_pat_)[A-Za-z0-9_]{20,}",
    r"hf_(?<![A-Za-z0-9_-]hf_)[A-Za-z0-9]{20,}",
    r"sk-(?<![A-Za-z0-9_-]sk-)[A-Za-z0-9_-]{20,}",
    r"AKIA(?<![A-Za-z0-9_-]AKIA)[0-9A-Z]{16}",
    r"xox[abpr]-(?<![A-Za-z0-9_-]xox.-)[A-Za-z0-9-]{10,}",
    r"glpat-(?<![A-Za-z0-9_-]glpat-)[A-Za-z0-9_-]{20,}",
    r"eyJ(?<![A-Za-z0-9_-]eyJ)[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*",
))
# A token ends at whitespace or a quote: a password may hold any other character.
_DELIM = re.compile(r"[\s\"'<>`]")
_TOKEN_BODY = re.compile(r"[^\s\"'<>`]*")
_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")
_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
# Markers after which a URL's path *is* the credential.
_WEBHOOK_MARKERS = ("hooks.slack.com/", "/api/webhooks/", "/webhookb2/", "/webhook/", "/webhooks/", "/hooks/")
# Characters that can precede a scheme-less ``user:pw@host`` inside a token (``ADDR=admin:pw@h``).
_USERINFO_LEFT = "=,;([{"
# The common shape, found in one C-level scan: a whole token that is exactly ``user:password@host``
# (no scheme, no '=', no left-delimiter, no '/', one '@'). _bare_userinfo would mask its
# ``user:password``; doing it here keeps a value of a hundred thousand credentials linear *and*
# fast. The slow per-token path then skips an '@' that directly follows a mask.
_SIMPLE_CREDENTIAL = re.compile(r"(?<![^\s\"'<>`])[^\s\"'<>`=,;(\[{@:/]+:[^\s\"'<>`=,;(\[{@/]*(?=@[^\s\"'<>`@=/]*(?![^\s\"'<>`]))")
_ASSIGN_NAME = re.compile(r"-{0,2}[A-Za-z_][A-Za-z0-9_.-]*")


def is_secret_name(name: str) -> bool:
    return name.upper() not in _SAFE_NAMES and bool(_SECRET_NAME.search(name))


def _scheme_start(token: str, sep: int) -> int:
    """Index where the URL scheme ending at ``sep`` (the ``://``) begins, or -1 when there is none."""
    i = sep
    while i > 0 and token[i - 1] in _SCHEME_CHARS:
        i -= 1
    return i if i < sep and token[i].isalpha() else -1


def _is_port(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 5


def _url_userinfo(token: str) -> tuple[int, int] | None:
    """(start, end) of the user info in ``scheme://userinfo@host...``, greedy about ``/`` and ``@``."""
    sep = token.find("://")
    if sep < 0 or _scheme_start(token, sep) < 0:
        return None
    start = sep + 3
    at = token.rfind("@", start)
    if at < 0:
        return None
    # Where the authority would end for a well-formed URL.
    ends = [i for i in (token.find(c, start) for c in "/?#") if i >= 0]
    delim = min(ends) if ends else len(token)
    if at < delim:
        return start, token.rfind("@", start, delim)
    # The only '@' comes after a '/': either a path (medium.com/@user) or a password holding '/'
    # (user:pa/ss@host). A colon before the '/' that is not a port means a password.
    colon = token.find(":", start, delim)
    if colon >= 0 and not _is_port(token[colon + 1:delim]):
        return start, at
    return None


def _bare_userinfo(token: str) -> tuple[int, int] | None:
    """(start, end) of a scheme-less ``user:password@host`` (``MASTER_ADDR=admin:pw@host``)."""
    at = token.rfind("@")
    if at <= 0:
        return None
    start = max(token.rfind(c, 0, at) for c in _USERINFO_LEFT) + 1
    colon = token.find(":", start, at)
    # A colon before the '@' with a user in front: user:password. `git@host:repo` has none before.
    if colon <= start:
        return None
    return start, at


def _is_secret_key(key: str) -> bool:
    return bool(key) and (key.lower() in _QUERY_KEYS or is_secret_name(key))


def _key_before(token: str, eq: int) -> int:
    """Start of the ``[A-Za-z0-9_.-]`` run that ends just before ``token[eq]``."""
    i = eq
    while i > 0 and token[i - 1] in _KEY_CHARS:
        i -= 1
    return i


def _secret_values(token: str) -> list[tuple[int, int]]:
    """Spans of values given to secret-looking keys: ``DB_PASS=x``, ``--password=x``, ``?token=x&``."""
    spans: list[tuple[int, int]] = []
    eq = token.find("=")
    while eq > 0:
        start = _key_before(token, eq)
        lead = token[:start]
        if _is_secret_key(token[start:eq]) or (lead.strip("-") == "" and is_secret_name(token[:eq].lstrip("-"))):
            # A whole-token assignment owns the rest of the token (a password may hold '&'); a
            # query parameter ends at the next '&'.
            end = len(token) if lead.strip("-") == "" else (token.find("&", eq) % (len(token) + 1))
            if token.startswith(MASK, eq + 1):
                # Already masked (by an earlier pass, possibly together with what followed): keep
                # the mask as it is, so redacting twice gives what redacting once gave.
                end = eq + 1 + len(MASK)
            if end > eq + 1:
                spans.append((eq + 1, end))
            eq = token.find("=", max(end, eq + 1))
        else:
            eq = token.find("=", eq + 1)
    return spans


def _webhook_path(token: str) -> int | None:
    lower = token.lower()
    if "://" not in lower and not lower.startswith("hooks."):
        return None
    for marker in _WEBHOOK_MARKERS:
        i = lower.find(marker)
        if i >= 0 and i + len(marker) < len(token):
            return i + len(marker)
    return None


def _token_spans(token: str, look_at_values: bool) -> list[tuple[int, int]]:
    """Spans of ``token`` to mask."""
    spans = _secret_values(token) if look_at_values and "=" in token else []
    hook = _webhook_path(token)
    if hook is not None:
        spans.append((hook, len(token)))
    if "@" in token:
        span = _url_userinfo(token) if "://" in token else _bare_userinfo(token)
        if span is not None:
            spans.append(span)
    return spans


def _apply(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` with every span replaced by MASK (overlapping spans merge)."""
    if not spans:
        return text
    spans.sort()
    out: list[str] = []
    pos = 0
    cur_start, cur_end = spans[0]
    for start, end in spans[1:]:
        if start <= cur_end:
            cur_end = max(cur_end, end)
            continue
        out += [text[pos:cur_start], MASK]
        pos, cur_start, cur_end = cur_end, start, end
    out += [text[pos:cur_start], MASK, text[cur_end:]]
    return "".join(out)


def _credential_spans(text: str, low: str) -> list[tuple[int, int]]:
    """Spans of user info, secret assignments and webhook paths, token by token.

    Only tokens holding a trigger ('@', '://', or '=' when a secret-looking word occurs at all)
    are looked at; each is scanned once, so the work is linear in the text.
    """
    look_at_values = "=" in text and any(w in low for w in _SECRET_WORDS)
    # An '@' right after a mask was handled by _SIMPLE_CREDENTIAL; when every '@' is such (a count,
    # in C), '@' is no trigger at all, else the trigger regex skips those.
    at_done = text.count("@") == text.count(MASK + "@")
    triggers = [t for t in ("" if at_done else "@", "://", "=" if look_at_values else "") if t and t in text]
    if not triggers:
        return []
    trigger = re.compile("|".join(f"(?<!{re.escape(MASK)})@" if t == "@" else re.escape(t) for t in triggers))
    rev = text[::-1]
    n = len(text)
    spans: list[tuple[int, int]] = []
    m = trigger.search(text)
    while m:
        at = m.start()
        end_m = _DELIM.search(text, at)
        end = end_m.start() if end_m else n
        back = _TOKEN_BODY.match(rev, n - at)
        start = n - back.end() if back else at
        spans += [(start + a, start + b) for a, b in _token_spans(text[start:end], look_at_values)]
        m = trigger.search(text, end)
    return spans


def _bearer_spans(text: str, low: str) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    for word in _BEARER_WORDS:
        i = low.find(word)
        while i >= 0:
            m = None if i > 0 and low[i - 1].isalpha() else _BEARER_VALUE.match(text, i + len(word))
            if m:
                spans.append(m.span(1))
            i = low.find(word, m.end() if m else i + 1)
    return spans


def redact_text(text: str) -> str:
    """Mask credentials that appear inside free text."""
    if not text:
        return text
    # Masking can expose a credential an earlier span hid behind (``a:@token=@``: the last '@' sat in
    # a masked value); repeat until nothing changes so redacting twice equals redacting once. Text
    # without credentials takes one pass; each further pass only runs because a mask was added.
    if "@" in text:
        text = _SIMPLE_CREDENTIAL.sub(MASK, text)
    for _ in range(4):
        low = text.lower()
        spans = _credential_spans(text, low) + _bearer_spans(text, low)
        masked = _apply(text, spans)
        if masked == text:
            break
        text = masked
    for shape in _TOKEN_SHAPES:
        text = shape.sub(MASK, text)
    return text


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


def redact_doc(doc: Mapping[str, Any]) -> dict[str, Any]:
    """``redact`` for a JSON object (a report, a document): the same object type comes back."""
    out: dict[str, Any] = redact(doc)  # a Mapping comes back as a dict of the same keys
    return out
