"""/metrics read by the reference parser (prometheus_client): well formed, build info, no double count."""

from __future__ import annotations

import pytest

from hwtui.engine.resident.metrics import render

parser = pytest.importorskip("prometheus_client.parser")

SAMPLES = [{"device": "hip:0", "name": 'Radeon "7800"\nXT', "mem_used": 1 << 30, "mem_total": 16 << 30, "util": 42.0,
            "temp_c": 55.0, "power_w": 120.5, "power_limit_w": 260.0},
           {"device": "cuda:0", "name": "RTX 4090 \\ x", "util": 7, "mem_used": 2, "mem_total": 24 << 30}]
CHECK = {"value": {"summary": {"pass": 5, "warn": 2, "fail": 1, "error": 0, "skip": 3, "total": 11, "worst": "fail"}},
         "age_s": 1.5}


def _families(text: str) -> dict:
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def _text(**kw) -> str:
    args = {"node": 'n1"\n', "devices": {"value": SAMPLES, "age_s": 0.2}, "check": CHECK,
            "replication": {"serving": "v1", "in_flight": {"version": "v2", "progress": 0.25},
                            "pushes": {"committed": 2, "aborted": 1}},
            "processes": {"value": [{"pid": 1}], "age_s": 3.0}}
    args.update(kw)
    return render(**args)


def test_the_reference_parser_reads_every_family():
    fams = _families(_text())
    util = fams["hwtui_device_utilization_percent"]
    assert util.type == "gauge"
    assert {(s.labels["device"], s.labels["name"], s.value) for s in util.samples} == {
        ("hip:0", 'Radeon "7800"\nXT', 42.0), ("cuda:0", "RTX 4090 \\ x", 7.0)}
    assert {s.labels["node"] for f in fams.values() for s in f.samples} == {'n1"\n'}
    pushes = fams["hwtui_replication_pushes"]  # the parser names a counter family without _total
    assert pushes.type == "counter"
    assert {s.name: s.value for s in pushes.samples if s.labels["outcome"] == "committed"} == {
        "hwtui_replication_pushes_total": 2.0}
    assert [s.value for s in fams["hwtui_replication_progress_ratio"].samples] == [0.25]


def test_build_info_names_hwtui_and_python():
    import platform

    (sample,) = _families(_text())["hwtui_build_info"].samples
    assert sample.value == 1.0 and sample.labels["version"] and sample.labels["python"] == platform.python_version()
    (given,) = _families(_text(build={"version": "1.2.3", "python": "3.12.1"}))["hwtui_build_info"].samples
    assert given.labels == {"node": 'n1"\n', "version": "1.2.3", "python": "3.12.1"}


def test_findings_sum_to_the_number_of_findings():
    """sum(hwtui_check_findings) is the number of findings: no status="total" (or "worst") series."""
    samples = _families(_text())["hwtui_check_findings"].samples
    assert {s.labels["status"] for s in samples} <= {"pass", "warn", "fail", "error", "skip"}
    assert sum(s.value for s in samples) == CHECK["value"]["summary"]["total"]
