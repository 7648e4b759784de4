#!/usr/bin/env bash
# Check every accelerator path of cifar10_dist on this machine's NVIDIA GPUs and write a report.
#   bash scripts/gpu_check.sh [--data_path=DIR] [--out=DIR] [--device=cpu] [--quick] [--skip_peer]
# Runs `pytest -m gpu tests/gpu` (nccl under torchrun and spawning, fp16 + GradScaler, bf16, data_on_device,
# pinned memory, channels_last, compile, TF32/cuDNN flags, deterministic mode, GPU vs CPU evaluation, peak GPU
# memory; 2 GPUs: the README's torchrun command), then python -m benchmarks.gpu (with --data_path), then writes
# OUT/gpu_report.md and OUT/gpu_report.json. Uses the torch installed here and installs nothing; writes nothing
# outside OUT (temporary files included). Without CUDA it says so in one line and exits 0; --device=cpu
# rehearses everything on the CPU instead (the CUDA-only checks skip, the peer is skipped).
set -euo pipefail
cd "$(dirname "$0")/.."

data_path=""
out="gpu-check-$(date +%Y%m%d-%H%M%S)"
device=cuda
bench_flags=()
for arg in "$@"; do
  case "$arg" in
    --data_path=*) data_path=${arg#*=} ;;
    --out=*) out=${arg#*=} ;;
    --device=cpu) device=cpu ;;
    --quick | --skip_peer) bench_flags+=("$arg") ;;
    *) echo "gpu_check.sh: unknown argument '$arg' (accepted: --data_path=DIR --out=DIR --device=cpu --quick --skip_peer)" >&2; exit 2 ;;
  esac
done
read -r has_cuda torch_version < <(python -c "import torch; print(torch.cuda.is_available(), torch.__version__)")
if [ "$device" = cuda ] && [ "$has_cuda" != True ]; then
  echo "no CUDA GPU on this machine (torch $torch_version sees none): nothing to check"
  exit 0
fi
if [ -n "$data_path" ] && [ ! -d "$data_path/cifar-10-batches-py" ]; then
  echo "gpu_check.sh: --data_path=$data_path holds no cifar-10-batches-py folder" >&2
  exit 2
fi

mkdir -p "$out/tmp"
out=$(cd "$out" && pwd)
export TMPDIR="$out/tmp" PYTHONDONTWRITEBYTECODE=1 GPU_CHECK_OUT="$out" MPLCONFIGDIR="$out/tmp"
[ "$device" = cpu ] && export GPU_CHECK_DEVICE=cpu
[ -n "$data_path" ] && export GPU_CHECK_DATA="$data_path"
rm -f "$out/checks.jsonl"

status=0
python -m pytest -m gpu tests/gpu -p no:cacheprovider -q -rs --junitxml="$out/pytest.xml" \
  --basetemp="$out/tmp/pytest" 2>&1 | tee "$out/pytest.log" || status=1
if [ -n "$data_path" ]; then
  python -m benchmarks.gpu --data_path="$data_path" --device="$device" --json="$out/benchmark.json" \
    "${bench_flags[@]}" 2>&1 | tee "$out/benchmark.log" || status=1
else
  echo "no --data_path: benchmark skipped (it needs the real CIFAR-10)" | tee "$out/benchmark.log"
fi
python -m benchmarks.gpu_report --out="$out"
echo "report: $out/gpu_report.md"
exit "$status"
