"""Mixed-vendor parallel training: one worker process per device, merged through host memory.

Each device (CUDA, ROCm, XPU, Gaudi or a CPU rank) trains its own copy of a small model on chunks
of data it claims from a shared queue; every ``merge_every`` steps the copies are averaged in
proportion to the samples each one trained on, over a gloo group on CPU copies of the weights,
because no collective library spans vendors, and (``--merge outer-nesterov``, the default) an
outer optimizer step is taken on the averaged deltas (DiLoCo). Module map:

* ``backend``    one device abstraction (device, set_device, synchronize, streams, memory, AMP)
* ``model``      a small character-level transformer
* ``modelspec``  what ``--model`` names (char, a local Hugging Face directory, module:function), checked
* ``models``     building any of them, seeded, behind one interface (logits, loss)
* ``data``       the Python standard library's own source text, split deterministically
* ``textdata``   ``--data``: your text file / .txt directory / .jsonl, checked, tokenised, split
* ``export``     ``--save-hf``: the merged model as a Hugging Face directory, atomically
* ``memory``     will the model fit? refuse clearly, before any work starts
* ``queue``      chunk queue: dynamic / equal / static balancing, requeue on worker loss
* ``merge``      sample-weighted merge over gloo with a two-phase commit; the outer Nesterov step
* ``checkpoint`` atomic safetensors checkpoints with a JSON manifest
* ``resume``     resume checks (hyper-parameters, --override) and the recorded chunk assignment
* ``health``     heartbeats (worker side) and liveness tracking (coordinator side)
* ``config``     frozen run config and the versioned per-worker config (serialised once)
* ``channel``    the worker's end of its pipes (JSON lines with a ``kind``; never pickle)
* ``worker``     the worker process (``python -m hwtui.engine.training.worker``)
* ``workers``    a worker process as the coordinator sees it, started via hwtui.core.supervisor
* ``schedule``   pure scheduling decisions (end-of-round deferral, speed estimates, evaluation rounds, idle)
* ``launcher``   the coordinator: phases, rounds, recovery
* ``evaluate``   held-out loss and text generation from a checkpoint (``hwtui eval`` / ``sample``)
* ``events`` / ``report``  the telemetry contract and the ``--report`` document
* ``knobs``      documented test-only knobs (slowdown, fault injection, checkpoint delay)

Importing this package imports neither torch nor textual.
"""
