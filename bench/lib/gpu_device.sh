#!/bin/bash
# One device call (bench/gpu_run's bundle carries this as device.sh): the host's facts, the
# GPU's load sampled each second, then bench/gpu_run from the bundle, all under $OUT/gpu.
#   bash gpu-bundle/device.sh [ARGS]   # MINUTES (9) bounds gpu_run; the call's limit must exceed it;
#                                      # ARGS go to bench/gpu_steps.py (--steps wide,cpu --wide 256 ...)
B=$(cd "$(dirname "$0")" && pwd)
O=${OUT:?OUT: where the figures go}/gpu; mkdir -p "$O"
{ date; nvidia-smi; nvidia-smi -q | grep -iE "product name|driver version|cuda version|power limit|max clocks" -A0;
  nproc; free -g; df -h /tmp; lscpu | grep -iE "model name|socket|numa node\(s\)"; which python3; python3 --version;
  python3 -c 'import numpy; print("numpy", numpy.__version__)';
  ls /usr/local/cuda*/lib64/libcudart.so* /usr/local/cuda*/lib64/libcublas.so* 2>&1 | head; ldd --version | head -1; } > "$O/host.txt" 2>&1
nvidia-smi dmon -s uc -d 1 -o T > "$O/dmon.txt" 2>&1 &
DMON=$!
PY=python3
for c in python3 python3.12 /usr/bin/python3.12 /usr/bin/python3; do
  if $c -c 'import sys; assert sys.version_info[:2]==(3,12)' 2>/dev/null; then PY=$c; break; fi
done
echo "venv python: $PY" >> "$O/host.txt"
set -o pipefail
M=${MINUTES:-9}
PYTHONUNBUFFERED=1 timeout $(( ${M%.*} * 60 + 45 )) $PY "$B/gpu_run" --bundle "$B" --out "$O" --minutes "$M" "$@" 2>&1 | tee "$O/run.log"
echo "exit $?" | tee -a "$O/run.log"
kill $DMON 2>/dev/null
