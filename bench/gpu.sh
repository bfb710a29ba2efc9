#!/usr/bin/env bash
# What torchtrace checks and times on a CUDA device, in one go (a GPU machine is often lent for minutes only):
#
#     bash bench/gpu.sh [results folder]      (default: $OUT when set, else ./gpu-results)
#
# (DEVICE=cpu bash bench/gpu.sh tries the script itself on a machine without a GPU.)
# 1. tests/test_cuda.py: ported models and layers on CUDA tracers vs torch autograd on CUDA, Adam steps, tt.compile;
# 2. PyTorch's OpInfo samples on CUDA tracers vs torch autograd there (python -m torchtrace ops --coverage): the first
#    two samples of each op, then (step opinfo-full, last) every sample;
# 3. bench/overhead.py, bench/models.py and bench/compile.py with --device cuda (ratios to torch autograd).
# Each step has its own time limit and log (<step>.txt); a step that fails or runs out does not stop the next.
set -u
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu-results}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
export TORCHTRACE_TEST_DEVICE=$device

step() {  # step NAME SECONDS COMMAND...: run COMMAND with a limit, its output in NAME.txt, one summary line here
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1
  echo "$name: exit $? after $((SECONDS - start)) s: $(tail -n 1 "$out/$name.txt")"
}

step environment 40 $py -c "import torch, torchtrace; print(torch.__version__, torch.cuda.is_available() and \
torch.cuda.get_device_name())"
step tests 90 $py -m pytest -q -p no:cacheprovider tests/test_cuda.py "tests/ops/test_shape.py::test_cuda_round_trip"
step opinfo 120 $py -m torchtrace ops --coverage --samples 2 --device $device
step overhead 45 $py bench/overhead.py --device $device --threads 1 --repeats 20 --large-repeats 5
step models 45 $py bench/models.py --device $device --threads 1 --repeats 20
step compile 45 $py bench/compile.py --device $device --repeats 20
step opinfo-full 150 $py -m torchtrace ops --coverage --full --device $device
