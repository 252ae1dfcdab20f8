"""Distributed environment and network checks (rule area ``env``).

Each module reads the machine only through the host seam (``host.env``, sysfs/procfs files and
``host.fact`` for anything live), so every check runs the same on a live node, a recorded
``--sysroot`` tree and a ``--replay`` snapshot:

* :mod:`.launcher`    torchrun / SLURM / MPI rank variables, in range and agreeing;
* :mod:`.visibility`  *_VISIBLE_DEVICES masks against the devices on the PCI bus;
* :mod:`.rendezvous`  MASTER_ADDR / MASTER_PORT: resolve, route, bind or connect (no payload);
* :mod:`.nccl`        NCCL/RCCL variables, conf files, net plugin, GPUDirect RDMA;
* :mod:`.ib`          NCCL_IB_HCA and GID indices against /sys/class/infiniband;
* :mod:`.vendor_ccl`  oneCCL, Gaudi HCCL and TPU PJRT environments;
* :mod:`.knobs`       the replication engine's window / bucket / chunk knobs against free memory;
* :mod:`.hygiene`     checkpoint directory and clock synchronisation;
* :mod:`.exports`     the ``export`` lines ``hwtui env`` prints.

The variable grammars live in :mod:`.parsers`; they never raise, whatever the input.
"""
