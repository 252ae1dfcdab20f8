"""A bounded reader for the YAML subset that configuration files use, without a YAML dependency.

Accelerate's ``default_config.yaml`` and Lightning's ``configs/distributed.yaml`` are block
mappings of scalars, nested mappings and short lists. That subset is read here: ``key: value``
lines nested by indentation, ``- item`` lists, quoted strings, ``#`` comments, empty ``{}`` /
``[]`` and one-line flow lists of scalars. Anything else (anchors, tags, multi-line strings,
flow mappings with content) is reported as a :class:`YamlSubsetError` naming the line, so a
check says "cannot read line 7" instead of guessing. PyYAML is not a dependency of hwtui; this
keeps the base install at three packages. Input size and nesting are bounded.
"""

from __future__ import annotations

import re
from typing import Any

MAX_BYTES = 256 * 1024
MAX_DEPTH = 32

_KEY = re.compile(r"""^(?P<key>"[^"]*"|'[^']*'|[^\s#'"{}\[\],&*!|>%@`][^#]*?)\s*:(?:\s+(?P<rest>.*))?$""")


class YamlSubsetError(ValueError):
    def __init__(self, line: int, message: str):
        super().__init__(f"line {line}: {message}")
        self.line = line


def _strip_comment(text: str) -> str:
    """Drop a trailing ``# comment`` that is outside quotes."""
    quote = ""
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1] in " \t"):
            return text[:i].rstrip()
    return text.rstrip()


def scalar(text: str, line: int = 0) -> Any:
    """A plain, single- or double-quoted scalar with YAML 1.2 core-schema typing."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        body = text[1:-1]
        return body.replace("''", "'") if text[0] == "'" else body.replace('\\"', '"').replace("\\\\", "\\")
    if text[:1] in ("&", "*", "!", "|", ">", "%", "@", "`", "'", '"'):
        raise YamlSubsetError(line, f"unsupported YAML construct {text[:20]!r}")
    if text in ("{}",):
        return {}
    if text.startswith("["):
        if not text.endswith("]"):
            raise YamlSubsetError(line, "unterminated flow list")
        inner = text[1:-1].strip()
        return [] if not inner else [scalar(part, line) for part in inner.split(",")]
    if text.startswith("{"):
        raise YamlSubsetError(line, "flow mappings with content are not supported; write one key per line")
    lowered = text.lower()
    if lowered in ("", "~", "null"):
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    if re.fullmatch(r"[-+]?\d+", text):
        return int(text)
    if re.fullmatch(r"[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?", text):
        return float(text)
    return text


def loads(text: str) -> Any:
    """Parse the subset; raise YamlSubsetError (with the line number) on anything outside it."""
    if len(text.encode("utf-8", "replace")) > MAX_BYTES:
        raise YamlSubsetError(0, f"file larger than {MAX_BYTES // 1024} KiB")
    lines: list[tuple[int, int, str]] = []  # (line number, indent, content)
    for number, raw in enumerate(text.splitlines(), 1):
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise YamlSubsetError(number, "tab used for indentation")
        content = _strip_comment(raw)
        if not content.strip() or content.strip() in ("---", "..."):
            continue
        lines.append((number, len(content) - len(content.lstrip()), content.strip()))
    if not lines:
        return None
    value, pos = _block(lines, 0, lines[0][1], 0)
    if pos != len(lines):
        raise YamlSubsetError(lines[pos][0], "unexpected indentation")
    return value


def _block(lines: list[tuple[int, int, str]], pos: int, indent: int, depth: int) -> tuple[Any, int]:
    if depth > MAX_DEPTH:
        raise YamlSubsetError(lines[pos][0], f"nested deeper than {MAX_DEPTH} levels")
    if lines[pos][2].startswith("- ") or lines[pos][2] == "-":
        return _list(lines, pos, indent, depth)
    return _mapping(lines, pos, indent, depth)


def _child(lines: list[tuple[int, int, str]], pos: int, indent: int, depth: int) -> tuple[Any, int]:
    """The nested block after ``key:`` (more indented, or a list at the same indent), else null."""
    if pos < len(lines):
        number, ind, content = lines[pos]
        if ind > indent or (ind == indent and (content.startswith("- ") or content == "-")):
            return _block(lines, pos, ind, depth + 1)
    return None, pos


def _mapping(lines: list[tuple[int, int, str]], pos: int, indent: int, depth: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    while pos < len(lines):
        number, ind, content = lines[pos]
        if ind < indent:
            break
        if ind > indent:
            raise YamlSubsetError(number, "unexpected indentation")
        match = _KEY.match(content)
        if not match or content.startswith("- "):
            raise YamlSubsetError(number, f"expected 'key: value', got {content[:40]!r}")
        key = str(scalar(match.group("key"), number))
        if key in out:
            raise YamlSubsetError(number, f"duplicate key {key!r}")
        rest = match.group("rest")
        pos += 1
        if rest is None or not rest.strip():
            out[key], pos = _child(lines, pos, indent, depth)
        else:
            out[key] = scalar(rest, number)
    return out, pos


def _list(lines: list[tuple[int, int, str]], pos: int, indent: int, depth: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    while pos < len(lines):
        number, ind, content = lines[pos]
        if ind < indent or not (content.startswith("- ") or content == "-"):
            break
        if ind > indent:
            raise YamlSubsetError(number, "unexpected indentation")
        item = content[1:].strip()
        pos += 1
        if not item:
            value, pos = _child(lines, pos, indent, depth)
            out.append(value)
        elif _KEY.match(item):
            # "- key: value" starts a mapping whose keys sit at the item's column.
            sub = [(number, indent + 2, item)]
            while pos < len(lines) and lines[pos][1] > indent:
                sub.append(lines[pos])
                pos += 1
            value, used = _mapping(sub, 0, indent + 2, depth + 1)
            if used != len(sub):
                raise YamlSubsetError(sub[used][0], "unexpected indentation")
            out.append(value)
        else:
            out.append(scalar(item, number))
    return out, pos
