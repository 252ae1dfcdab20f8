"""Pushing a plan's weights into the resident receivers of running agents: the orchestration
behind ``hwtui push`` and ``hwtui train --push-to``, with no command line in it.

- ``options``: :class:`PushOptions`, the frozen, typed settings of one push;
- ``plan_file``: a plan file's bytes and the facts the pusher needs from its header;
- ``client``: the pusher's HTTP client (one kept-alive connection per agent);
- ``orchestrate``: the push itself (prepare, settle a decided version, start, follow, stop);
- ``report``: what each node serves, read back from the nodes, and the push's document and line.
"""
