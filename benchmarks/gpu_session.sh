#!/bin/bash
# One prepared call on a lent GPU machine (../shared/GPU.md): the wheels in .whl/, torch's IPC
# reference count scenario by scenario (exp_ipc_counts.py), then the IPC
# receiver's copy + device checksum (bench_device_checksum.py), the IPC leg alone (bench_ipc_leg.py),
# bench_gpu.py on a 4 GiB file (the source path with and without read-ahead among its rows),
# optionally the page-cache registration experiment (EXP=1; measured in round seven: <= 21.8 GB/s),
# then tests/gpu (the resident push and the IPC path first). Every stage is bounded by `timeout`
# and logged under $OUT, so a call cut short still says how far it got. Knobs: STAGES, EXP_COUNTS_S, CK_S,
# LEG_S, PROF_S, HUGE_S, HUGE_T, BENCH_S, RES_S, EXP, EXP_S, TEST_S, PER_TEST_S, READERS, SLICES, DEPTHS, AHEADS, BUCKET_MB, TESTS. The default bounds
# add to 595 s; round thirteen's whole call took 348 s (the bench 60 s, the tests 252 s), round
# sixteen's 414 s (the checks and the bench 143 s, the tests cut at 270 s before the last two), so
# give the call a 600 s limit. .whl/ is ignored by git: name it in the device call's carry.
# What comes back: every log is bundled into $OUT/session.tgz when the script ends (a device call
# returns a few files only: round sixteen's pytest log was left out by count), and the pytest log
# is also kept beside it.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
bundle() { tar -C "$OUT" -czf /tmp/session.tgz --exclude=session.tgz . 2>/dev/null && mv /tmp/session.tgz "$OUT/" && find "$OUT" -type f ! -name session.tgz ! -name pytest.txt -delete; }
trap bundle EXIT
T0=$(date +%s)
el() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >"$OUT/pip.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi >"$OUT/smi.txt" 2>&1; nproc; free -g | head -2; df -h /tmp | tail -1
python3 -c "import torch,sys;print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name(0))"
# STAGES: which stages run (default all but huge): counts checksum leg profile huge bench resident tests
want() { case " ${STAGES:-counts checksum leg profile bench resident tests} " in *" $1 "*) return 0;; esac; return 1; }
if want counts; then
el ipc-counts
# torch's IPC reference count, scenario by scenario (round thirteen: A-E; F-H open the consumer
# without a counter name, as ipc_provider.CudaIpc now tries first).
timeout ${EXP_COUNTS_S:-45} python3 benchmarks/exp_ipc_counts.py >"$OUT/ipc-counts.txt" 2>&1; echo "ipc-counts rc=$?"
grep -v "^\[W" "$OUT/ipc-counts.txt" | tail -10
fi
if want checksum; then
el checksum
timeout ${CK_S:-75} python3 benchmarks/bench_device_checksum.py --mb 1024 --rounds 7 --json "$OUT/checksum.json" >"$OUT/checksum.txt" 2>&1; echo "checksum rc=$?"
cat "$OUT/checksum.txt" | tail -30
fi
if want leg; then
el ipc-leg
# The receiver's copy + verify with the source idle, 1/4/16 buckets per GiB (round nine: 610/307/90 GB/s),
# with the host clock between the receiver's phases.
timeout ${LEG_S:-60} python3 benchmarks/bench_ipc_leg.py --mb 1024 --buckets 1,4,16 --rounds 7 --json "$OUT/ipc-leg.json" >"$OUT/ipc-leg.txt" 2>&1; echo "ipc-leg rc=$?"
grep -v "^\[W" "$OUT/ipc-leg.txt" | tail -22
fi
if want profile; then
el ipc-profile
# Where the receiver's host time goes per bucket (1 x 1 GiB, 16 x 64 MiB), step by step (--trace;
# --profile is cProfile, heavier).
timeout ${PROF_S:-40} python3 benchmarks/bench_ipc_leg.py --mb 1024 --buckets 1,16 --rounds 5 --trace >"$OUT/ipc-profile.txt" 2>&1; echo "ipc-profile rc=$?"
grep -v "^\[W" "$OUT/ipc-profile.txt" | head -40
fi
if want huge; then
el huge-ring
timeout ${HUGE_S:-90} python3 benchmarks/exp_huge_ring.py --mb 4096 --threads ${HUGE_T:-16} --rounds 5 >"$OUT/huge.txt" 2>&1; echo "huge rc=$?"
tail -12 "$OUT/huge.txt"; rm -f /tmp/hwtui-huge-ring.bin
fi
if want bench; then
el bench
# The whole-file reader at 16 and 64 MiB slices (round seven 39.47 GB/s best, round sixteen 38.39),
# and the source path (planned buckets, as replicate and push read them) at 64 MiB and replicate's
# default 32 MiB buckets, 3 / 1 / 0 read ahead: round seventeen found it cut 64 MiB buckets into
# 4 MiB slices (11-13 GB/s) and put a 16 MiB floor under a device's slices (reader.DEVICE_MIN_SLICE).
timeout ${BENCH_S:-75} python3 benchmarks/bench_gpu.py --mb 4096 --rounds 3 --readers ${READERS:-16} --slices ${SLICES:-16,64} --depths ${DEPTHS:-2} --aheads ${AHEADS:-3,1,0} --bucket-mb ${BUCKET_MB:-64,32} --json "$OUT/gpu-bench.json" >"$OUT/bench.txt" 2>&1; echo "bench rc=$?"
cat "$OUT/bench.txt" | tail -30
fi
if [ "${EXP:-0}" = 1 ]; then
el exp
python3 -c "
import os
with open('/tmp/w4.bin','wb') as f:
    for _ in range(64): f.write(os.urandom(64<<20))
"
cat /tmp/w4.bin >/dev/null
timeout ${EXP_S:-80} python3 benchmarks/bench_gpu_register.py /tmp/w4.bin >"$OUT/exp.txt" 2>&1; echo "exp rc=$?"; cat "$OUT/exp.txt" | tail -12
rm -f /tmp/w4.bin
fi
if want resident; then
el resident
# Pushes back to back into a GPU-resident receiver, each meeting the last one's disk write (round
# sixteen: a newer push stops it; before, it waited for all of it, ~10x the push's transfer there).
timeout ${RES_S:-60} python3 benchmarks/bench_agent.py --push --mb 256 --pushes 4 --receivers 1 --resident cuda >"$OUT/resident.txt" 2>&1; echo "resident rc=$?"
grep -v "^\[W" "$OUT/resident.txt" | tail -14
fi
if want tests; then
el tests
# Every CLI exec'd, as in round nine's GPU runs: the tests' fork zygote (tests/cli_proc.py) was never run beside CUDA.
HWTUI_TEST_CLI_EXEC=1 timeout ${TEST_S:-240} python3 -m pytest ${TESTS:-tests/gpu/test_resident_live.py tests/gpu/test_ipc_live.py tests/gpu/test_reader_live.py tests/gpu/test_gpu_live.py} -m gpu -v -rs -s -p no:cacheprovider -o addopts="" --timeout=${PER_TEST_S:-150} --junitxml="$OUT/junit.xml" >"$OUT/pytest.txt" 2>&1; echo "pytest rc=$?"
grep -E "PASSED|FAILED|ERROR|SKIPPED|XFAIL|IPC:|replicate 1 GiB|push |warm pushes|nvidia-smi|allocator|timeline|phases|disk copy|agent load|passed|failed" "$OUT/pytest.txt" | tail -60
fi
el done
