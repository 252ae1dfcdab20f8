"""The embedded engine: weight replication and mixed-vendor training on torch.distributed.

Nothing here imports textual, and importing this package does not import torch: modules that
need torch import it themselves, so the base install (no torch) can still load events and plans.
"""
