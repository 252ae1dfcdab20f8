"""The node agent over HTTP: ``server`` (what ``hwtui agent`` runs), ``token`` (the bearer token
file), ``client`` (httpx polling of many agents at once, used by ``hwtui agents``, ``hwtui --check
--agents``, ``hwtui push`` and the TUI's cluster view)."""
