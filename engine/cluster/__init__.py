"""Guided cluster setup and the multi-node smoke test.

``spec`` describes the cluster, ``launchfiles`` turns it into per-node launch commands, env files
and a SLURM batch script, and ``smoke`` is what every rank runs under the launcher: the blocking
local checks (``preflight``), a bounded roll call in the rendezvous store, an all-pairs TCP reach
test (``reach``), the local check, reports gathered as JSON (``gather``) and capped and
shape-checked (``peer``), the cross-node comparison (``compare``), a correctness all-reduce and a
bandwidth sweep (``bandwidth``).
Nothing here imports torch at module level except ``gather``/``bandwidth``/``smoke``, which only
the test itself loads.
"""
