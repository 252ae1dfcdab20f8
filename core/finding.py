"""The unit every check produces: a finding with a stable id, a verdict and a remedy."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict


class Status(str, enum.Enum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    ERROR = "error"

    @property
    def rank(self) -> int:
        """Severity order used for sorting and for the worst-of summary."""
        return _RANK[self]


_RANK = {Status.PASS: 0, Status.SKIP: 1, Status.WARN: 2, Status.ERROR: 3, Status.FAIL: 4}


# A finding as it crosses a boundary (the check's JSON, ``cluster.*`` events, a peer's report). The
# functional form: with ``from __future__ import annotations`` a class-form NotRequired is a string
# that Python 3.11 does not see, and the runtime's required keys would then be wrong.
FindingDict = TypedDict("FindingDict", {  # noqa: UP013 - the runtime must see NotRequired (above)
    "id": str,
    "area": str,
    "status": str,  # a Status value
    "title": str,
    "detail": str,
    "remedy": str,
    "data": NotRequired[dict[str, Any]],  # only when the finding carries figures
})


@dataclass(frozen=True)
class Finding:
    """One verdict about the machine.

    ``id`` is dotted and stable across releases (CI pipelines filter on it); ``remedy`` is the
    exact command or setting that fixes a non-passing finding, never prose like "check your
    driver".
    """

    id: str
    status: Status
    title: str
    detail: str = ""
    remedy: str = ""
    area: str = ""
    data: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.area:
            object.__setattr__(self, "area", self.id.split(".", 1)[0])
        if not isinstance(self.status, Status):
            object.__setattr__(self, "status", Status(self.status))

    def to_dict(self) -> FindingDict:
        out: FindingDict = {
            "id": self.id,
            "area": self.area,
            "status": self.status.value,
            "title": self.title,
            "detail": self.detail,
            "remedy": self.remedy,
        }
        if self.data:
            out["data"] = self.data
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Finding:
        """From a decoded document: read, not trusted to be a FindingDict (callers check or catch KeyError)."""
        return cls(
            id=raw["id"],
            status=Status(raw["status"]),
            title=raw.get("title", ""),
            detail=raw.get("detail", ""),
            remedy=raw.get("remedy", ""),
            area=raw.get("area", ""),
            data=raw.get("data") or {},
        )


def passed(id: str, title: str, detail: str = "", **data: Any) -> Finding:
    return Finding(id, Status.PASS, title, detail, data=data)


def warn(id: str, title: str, detail: str = "", remedy: str = "", **data: Any) -> Finding:
    return Finding(id, Status.WARN, title, detail, remedy, data=data)


def fail(id: str, title: str, detail: str = "", remedy: str = "", **data: Any) -> Finding:
    return Finding(id, Status.FAIL, title, detail, remedy, data=data)


def skip(id: str, title: str, detail: str = "", **data: Any) -> Finding:
    return Finding(id, Status.SKIP, title, detail, data=data)


def error(id: str, title: str, detail: str = "", remedy: str = "", **data: Any) -> Finding:
    return Finding(id, Status.ERROR, title, detail, remedy, data=data)


def summarize(findings: list[Finding]) -> dict[str, int]:
    counts = {s.value: 0 for s in Status}
    for f in findings:
        counts[f.status.value] += 1
    counts["total"] = len(findings)
    return counts
