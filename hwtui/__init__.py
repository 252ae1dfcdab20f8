"""hwtui: from mixed-vendor GPUs to verified weight replication and training, with a TUI to watch it.

In a clone, this folder's entries are links to the root folders (app/ core/ engine/ probes/
widgets/), so with the clone's root on sys.path ``import hwtui.engine`` reads the tree it sits in,
whatever an editable install points at. Installed, setup.py maps the same folders under hwtui/.
"""

from hwtui.core.events import register_provider

# Where each engine's event families live, so any reader of a JSON-lines stream (the TUI, a test)
# rebuilds typed events on sight without importing an engine first (none of these imports torch).
# Registered here, above the layers, because core may name no other layer.
register_provider("repl.", "hwtui.engine.replication.events")
register_provider("train.", "hwtui.engine.training.events")
register_provider("cluster.", "hwtui.engine.cluster.events")
