"""Hardware and environment probes.

Probes read facts through a :class:`~hwtui.probes.host.Host` (never straight from ``/``) and
rules turn facts into :class:`~hwtui.core.finding.Finding` objects. Nothing in this package may
depend on textual: the headless check and the engine must run on machines with no terminal UI.
"""
