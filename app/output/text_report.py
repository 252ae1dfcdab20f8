"""Human-readable check report: findings grouped by area, worst first, remedies spelled out."""

from __future__ import annotations

from collections import defaultdict

from hwtui.app.output.style import Painter, printable
from hwtui.core.finding import Finding, Status

# ASCII-safe status tags: legible with NO_COLOR, in a CI log and on a serial console.
_TAGS = {Status.PASS: ("PASS", "green"), Status.WARN: ("WARN", "yellow"), Status.FAIL: ("FAIL", "red"),
         Status.ERROR: ("ERR ", "magenta"), Status.SKIP: ("SKIP", "dim")}


def render(findings: list[Finding], summary: dict[str, int], duration_s: float, host_desc: str, paint: Painter,
           verbose: bool = False) -> str:
    groups: dict[str, list[Finding]] = defaultdict(list)
    for f in findings:
        groups[f.area].append(f)
    lines = [paint(f"hwtui check: {printable(host_desc)}", "bold"), ""]
    # Areas with problems first, so the eye lands on what needs doing.
    order = sorted(groups, key=lambda a: (-max(f.status.rank for f in groups[a]), a))
    for area in order:
        lines.append(paint(printable(area), "bold"))
        for f in sorted(groups[area], key=lambda f: (-f.status.rank, f.id)):
            tag, color = _TAGS[f.status]
            lines.append(f"  [{paint(tag, color)}] {printable(f.title)}  {paint(printable(f.id), 'dim')}")
            show_detail = f.detail and (verbose or f.status not in (Status.PASS, Status.SKIP))
            if show_detail:
                for dl in f.detail.splitlines()[:6]:
                    lines.append(f"         {printable(dl)}")
            # A skip with a remedy is a check that could run once something is installed: say how.
            if f.remedy and f.status in (Status.WARN, Status.FAIL, Status.ERROR, Status.SKIP):
                lines.append(f"         {paint('fix:', 'cyan')} {printable(f.remedy)}")
        lines.append("")
    counts = ", ".join(f"{summary[s.value]} {s.value}" for s in Status if summary.get(s.value))
    lines.append(f"{summary['total']} checks: {counts or 'none'} in {duration_s:.2f} s")
    return "\n".join(lines)
