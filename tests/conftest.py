"""Every test, and every process a test starts, imports hwtui from the tree the tests sit in.

pytest puts the repository root first on sys.path (pyproject's ``pythonpath``), where hwtui/ links
the root folders; exporting it as PYTHONPATH makes children (engine ranks, the CLI run as
``python -m hwtui.app``, probe children) read the same tree, never whatever an editable install of
another clone points at. tests/test_packaging.py proves it from a copy of the tree.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = str(Path(__file__).resolve().parent.parent)
os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))
