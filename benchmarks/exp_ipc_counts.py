"""Experiment (round thirteen): what keeps a shared CUDA block allocated in the producer.

Each scenario: a fresh 64 MiB block in this (producer) process, shared with ``_share_cuda_()``
once, opened by a consumer subprocess (torch's ``_new_shared_cuda``) and closed when told, then
``memory_allocated`` (MiB above the start) after each step and after ``ipc_collect()``.

Measured on an H200 (torch 2.11, round thirteen):

- A: no release; the consumer closes, then the producer frees: 0 (freed at once)
- B: torch's count released at the share; the consumer closes, then the producer frees: 64, and
  still 64 after ipc_collect and the consumer's exit (the block never comes back)
- C: released at the share; the producer frees while the consumer still maps it: 0
- D: no release; the producer frees while mapped: 64 until the consumer closed, 0 after ipc_collect
- E: released at the share, no consumer: 0

So releasing the count at the share (ipc_provider.CudaIpc.handle since round twelve) leaks a block
whenever its consumer closes before the producer frees it (B): the IPC source's slots at the end
of a run, where receivers close as the source frees. F-H: the consumer opens with an empty or no
ref-counter name, so its close decrements nothing (what ipc_provider.CudaIpc tries first, falling
back to the counter where torch refuses it). Measured on an H200 (torch 2.11, round sixteen):

- F: released at the share, the consumer opens with an empty name and closes before the producer
  frees (B's order): 0 at every step
- G: no name at all (None): torch refuses it (TypeError), so the empty name is the one to send
- H: F's open, the producer freeing first: nothing left (it read -64: below its start, an earlier
  scenario's block freed meanwhile)
"""
import json
import subprocess
import sys

CONSUMER = r'''
import json
import sys

import torch
torch.cuda.init()
h = json.loads(sys.stdin.readline())
ref = bytes.fromhex(h["ref"]) if h["ref"] != "NONE" else None
st = torch.UntypedStorage._new_shared_cuda(h["device"], bytes.fromhex(h["handle"]), h["size"], h["offset"],
    ref, h["ref_off"], bytes.fromhex(h["ev"]) or None, h["ev_sync"])
print("opened", flush=True)
sys.stdin.readline()
del st
torch.cuda.ipc_collect()
print("closed", flush=True)
sys.stdin.readline()
'''


def main() -> None:
    import torch

    def share(t, release, consumer_ref="keep"):
        s = t.untyped_storage()
        (dev, handle, size, off, ref, ref_off, ev, ev_sync) = s._share_cuda_()
        if release and ref:
            torch.UntypedStorage._release_ipc_counter_cuda(bytes(ref), int(ref_off))
        ref_wire = bytes(ref or b"").hex() if consumer_ref == "keep" else ("" if consumer_ref == "empty" else "NONE")
        return {"device": int(dev), "handle": bytes(handle).hex(), "size": int(size), "offset": int(off),
                "ref": ref_wire, "ref_off": int(ref_off), "ev": bytes(ev or b"").hex(), "ev_sync": bool(ev_sync)}

    def alloc():
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated() >> 20

    for name, release, free_first, consumer, cref in (
            ("A", False, False, True, "keep"), ("B", True, False, True, "keep"), ("C", True, True, True, "keep"),
            ("D", False, True, True, "keep"), ("E", True, True, False, "keep"),
            ("F", True, False, True, "empty"), ("G", True, False, True, "none"), ("H", True, True, True, "empty")):
        base = alloc()
        t = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        h = share(t, release, cref)
        p = None
        if consumer:
            p = subprocess.Popen([sys.executable, "-c", CONSUMER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            p.stdin.write(json.dumps(h) + "\n")
            p.stdin.flush()
            got = p.stdout.readline().strip()
            if got != "opened":
                print(name, "consumer failed to open:", got, p.communicate(timeout=30), flush=True)
                continue
        steps = {}
        if free_first:
            del t
            steps["after producer free"] = alloc() - base
            if p:
                p.stdin.write("\n")
                p.stdin.flush()
                p.stdout.readline()
                steps["after consumer close"] = alloc() - base
        else:
            if p:
                p.stdin.write("\n")
                p.stdin.flush()
                p.stdout.readline()
            del t
            steps["after consumer close, then producer free"] = alloc() - base
        torch.cuda.ipc_collect()
        steps["after ipc_collect"] = alloc() - base
        if p:
            p.stdin.write("\n")
            p.stdin.flush()
            p.wait(30)
            torch.cuda.ipc_collect()
            steps["after consumer exit + ipc_collect"] = alloc() - base
        print(name, f"release={release} free_first={free_first} consumer={consumer}", json.dumps(steps), flush=True)


if __name__ == "__main__":
    main()
