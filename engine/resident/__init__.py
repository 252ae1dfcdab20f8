"""The node agent's engine half: what a resident ``hwtui agent`` knows and does, with no HTTP in it.

- ``state``     background refreshers (live samples, the local check, processes, cluster facts);
                a request only ever reads the last good value and its age, so a slow probe never
                blocks an answer
- ``metrics``   the same state as Prometheus text
- ``resident``  the resident replication rank: torch imported once, the process group kept warm
                between pushes, two version slots
"""
