"""Bucketed, windowed, verified weight replication over torch.distributed.

Layout of the package (each module is small and does one thing):

- ``plan``      the versioned plan schema, the O(n log n) planner, delta against a manifest, digest
- ``weights``   zero-copy readers: memory-mapped safetensors, torch state dicts (weights_only)
- ``checksum``  xxh3 helpers (bucket and tensor checksums)
- ``pool``      a recycled buffer pool whose peak is the memory bound (window x bucket)
- ``transport`` per-vendor transport choice and its one decision line
- ``window``    the in-flight window (fixed, byte-capped, adaptive)
- ``staging``   a receiver's staging copy of the next version (in memory or a mmapped file)
- ``commit``    the served-version directory and its two-phase commit
- ``worker``    per-rank logic (source packs and broadcasts; receivers unpack and verify)
- ``launcher``  spawns local workers or joins a torchrun/SLURM world; fans out events
- ``events``    the typed events the CLI and the TUI consume
- ``report``    the final JSON report

Only ``launcher.run_replication`` and ``plan.build_plan_from_files`` are meant as entry points;
torch is imported lazily so planning and validation work without it.
"""
