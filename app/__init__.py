"""hwtui's user-facing layer: the CLI, output formats and the Textual app."""

from __future__ import annotations


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("hwtui")
    except PackageNotFoundError:
        return "0+unknown"
