"""A receiver's host staging memory that its host-mates can map: shared memory faulted in while the world forms.

A host leader (engine.replication.paths) receives every bucket over the network straight into
its staging copy, and its followers map that copy and copy each announced bucket from it. Without
this, the leader's copy was a fresh ``/dev/shm`` file made at set-up and written page by page by
``recv``: every first touch of a 4 KiB page of fresh memory costs a fault (on this VM often
microseconds each, and then seconds per GB), paid inside the transfer while the network's copies
want the same cores. Measured on the 2 x 2 namespace bench (1 GB): the leader received in 3-4 s
instead of 0.6 s; faulted in at set-up instead, it cost 0.5-4.7 s there (docs/replication.md).

So a rank that will probably lead its host (a receiver whose local rank is 0: the lowest rank of
its node, which is who leads) stages in memory that is *shared from the start*: a file in its own
private run directory (engine.replication.shm: 0700, unguessable name, locked while it lives;
the file is 0600, created exclusively, never through a symlink), reserved whole and faulted in,
writable, by a thread while ``import torch`` and the rendezvous run -- exactly as
:class:`~hwtui.engine.replication.staging.Prefaulted` does for anonymous memory. The data sits at
offset 0 of the file (no header: the header is this rank's own business), which the agreement
record says (``staging_data_at``). If the rank does not lead after all, its file is unlinked as
soon as the paths are chosen and the mapping serves as plain memory, as anonymous memory would.

Where shared memory is too small (a container's 64 MB ``/dev/shm``) or cannot be made, nothing
changes: :meth:`take` answers None and the rank stages as before.
"""

from __future__ import annotations

import mmap
import os
import threading

from hwtui.core.private_file import create_private
from hwtui.engine.replication.disk import preallocate
from hwtui.engine.replication.shm import RunDir, make_run_dir
from hwtui.engine.replication.staging import MADV_POPULATE_WRITE, populate

FILE_NAME = "staging"


class SharedPrefaulted:
    """``nbytes`` of shared memory in a fresh private run directory, faulted in by a thread.

    ``run_dir`` and ``path`` exist from construction (the path goes into the agreement record);
    the memory itself is handed out by :meth:`take` once the thread is done.
    """

    def __init__(self, nbytes: int, run_dir: RunDir):
        self.nbytes = nbytes
        self.run_dir = run_dir
        self.path = run_dir.file(FILE_NAME)
        self.populated = False
        self.error: BaseException | None = None
        self._buf: mmap.mmap | None = None
        self._fd = create_private(self.path)  # exclusive, 0600, in a directory only we can write
        self._thread = threading.Thread(target=self._run, name="prefault-shared-staging", daemon=True)
        self._thread.start()

    @classmethod
    def make(cls, nbytes: int) -> SharedPrefaulted | None:
        """One, or None where no private shared-memory directory can be made (then: anonymous memory)."""
        if nbytes <= 0:
            return None
        try:
            run_dir = make_run_dir()
        except OSError:
            return None
        try:
            return cls(nbytes, run_dir)
        except OSError:
            run_dir.remove()
            return None

    def _run(self) -> None:
        try:
            os.ftruncate(self._fd, self.nbytes)
            # Every page reserved first: a /dev/shm too small fails here, cleanly (ENOSPC), not by
            # SIGBUS through the mapping mid-transfer.
            if not preallocate(self._fd, self.nbytes, f"shared staging memory {self.path}"):
                raise OSError("shared memory cannot be reserved here")
            buf = mmap.mmap(self._fd, self.nbytes)  # MAP_SHARED, read-write
            self.populated = populate(buf, MADV_POPULATE_WRITE)
            self._buf = buf
        except BaseException as exc:  # noqa: BLE001 - reported by ready()/take() in the rank's thread
            self.error = exc
        finally:
            os.close(self._fd)

    def ready(self, timeout: float) -> bool:
        """True once the memory is reserved and mapped (a bounded wait): only then may this rank lead."""
        self._thread.join(timeout)
        return not self._thread.is_alive() and self._buf is not None

    def take(self, timeout: float) -> mmap.mmap | None:
        """The mapping, or None (not ready in time, or it failed: the file and directory are gone then)."""
        if not self.ready(timeout):
            self.discard()
            return None
        buf, self._buf = self._buf, None
        return buf

    def discard(self) -> None:
        """Give the directory up (the mapping, if taken, stays valid: unlinking a file keeps its pages mapped)."""
        if not self._thread.is_alive() and self._buf is not None:
            self._buf.close()
            self._buf = None
        self.run_dir.remove()
