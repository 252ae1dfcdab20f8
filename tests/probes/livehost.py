"""A live-behaving host over a recorded tree: runtime facts are produced (not read back).

This is how a test drives a collector's live path (the producer passed to ``host.fact``) with a
fake library injected, while the files it reads still come from the FakeSys tree.
"""

from __future__ import annotations

import os

from hwtui.probes.host import FsHost


class LiveTreeHost(FsHost):
    @property
    def is_live(self) -> bool:
        return True

    def _p(self, path: str) -> str:
        return os.path.join(str(self.root), path.lstrip("/"))

    def fact(self, key, producer):
        if key == "user":  # who "we" are on the recorded machine
            return self._recorded_facts().get("user") or producer()
        return producer()
