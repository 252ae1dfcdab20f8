"""The pieces every layer shares: errors, atomic writes, redaction, findings, events, the process
supervisor and network helpers. core imports nothing else of hwtui (an import-linter contract and
tests/test_layers.py enforce it), so anything may import core."""
