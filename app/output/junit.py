"""JUnit XML: one testsuite per area, one testcase per finding, for CI dashboards."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import defaultdict

from hwtui.core.finding import Finding, Status

# Characters XML 1.0 cannot hold at all (control characters, lone surrogates, U+FFFE/U+FFFF):
# ElementTree writes them anyway and the file no longer parses, or the UTF-8 write fails.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _x(text: str) -> str:
    return _NOT_XML.sub(lambda m: f"\\x{{{ord(m.group()):x}}}", text)


def to_junit(findings: list[Finding], duration_s: float, strict: bool = False) -> str:
    groups: dict[str, list[Finding]] = defaultdict(list)
    for f in findings:
        groups[f.area].append(f)
    root = ET.Element("testsuites", name="hwtui.check", tests=str(len(findings)), time=f"{duration_s:.3f}")
    total_fail = total_err = total_skip = 0
    for area in sorted(groups):
        cases = groups[area]
        suite = ET.SubElement(root, "testsuite", name=_x(f"hwtui.{area}"), tests=str(len(cases)))
        fails = errs = skips = 0
        for f in cases:
            case = ET.SubElement(suite, "testcase", name=_x(f.id), classname=_x(f"hwtui.{area}"))
            body = _x("\n".join(x for x in (f.detail, f"fix: {f.remedy}" if f.remedy else "") if x))
            if f.status is Status.FAIL or (strict and f.status is Status.WARN):
                fails += 1
                el = ET.SubElement(case, "failure", message=_x(f.title), type=f.status.value)
                el.text = body
            elif f.status is Status.ERROR:
                errs += 1
                el = ET.SubElement(case, "error", message=_x(f.title), type="error")
                el.text = body
            elif f.status is Status.SKIP:
                skips += 1
                ET.SubElement(case, "skipped", message=_x(f.title))
            else:
                out = ET.SubElement(case, "system-out")
                out.text = f"{f.status.value}: {_x(f.title)}" + (f"\n{body}" if body else "")
        suite.set("failures", str(fails))
        suite.set("errors", str(errs))
        suite.set("skipped", str(skips))
        total_fail, total_err, total_skip = total_fail + fails, total_err + errs, total_skip + skips
    root.set("failures", str(total_fail))
    root.set("errors", str(total_err))
    root.set("skipped", str(total_skip))
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
