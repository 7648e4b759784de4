#!/usr/bin/env bash
# One prepared command per GPU lease call, on a machine without network (docs/gpu-report.md says what each found):
#   bash scripts/gpu_lease.sh checks OUT [--device=cpu]   the device path's checks (tests/gpu/test_device_path.py:
#                                                         host waits, warm-up, crops, 2 processes over gloo)
#   bash scripts/gpu_lease.sh bench OUT [--device=cpu] [--quick] [--seeds=N] [--parts=...] [--recipes=...]
#                                       [--race_compile=reduce-overhead]
#                                                         benchmarks.gpu: ours and airbench94 over seeds, the
#                                                         levers, ResNet-18 against its bare step, a profile
#   bash scripts/gpu_lease.sh bisect OUT [--device=cpu] [--quick] [--good=SHA] [--bad=SHA] [--threshold=X]
#                                                         benchmarks.bisect: the commit that lost fast.yaml's
#                                                         accuracy (worktrees from .lease/history.bundle when the
#                                                         copy has no .git: git bundle create it --all)
#   bash scripts/gpu_lease.sh ab OUT [--device=cpu] [--quick]   benchmarks.bisect ab: each suspect alone
#   (bisect and ab take --budget_minutes=M: no run starts that would end past M minutes)
# It installs the wheels in .lease/ (pytorch-ignite, fire, termcolor, airbench) into a folder of its own when the
# machine lacks them, builds CIFAR-10 from .lease/cifar10-jpg.tar.xz with .lease/make_cifar10.py (the archive and
# the tool are copied there from ../shared; .lease/ is ignored by git), and writes everything into OUT as it goes.
# --device=cpu rehearses it here (the CUDA-only checks skip, the peer is skipped).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-}
out=${2:-}
if [[ "$mode" != checks && "$mode" != bench && "$mode" != bisect && "$mode" != ab ]] || [ -z "$out" ]; then
  echo "usage: bash scripts/gpu_lease.sh checks|bench|bisect|ab OUT [--device=cpu] [their flags]" >&2
  exit 2
fi
shift 2
device=cuda
flags=()
for arg in "$@"; do
  case "$arg" in
    --device=cpu) device=cpu ;;
    --quick | --seeds=* | --parts=* | --recipes=* | --race_compile=* | --good=* | --bad=* | --threshold=* | --budget_minutes=*) flags+=("$arg") ;;
    *) echo "gpu_lease.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

mkdir -p "$out"
out=$(cd "$out" && pwd)
site=${LEASE_SITE:-/tmp/lease-site}
if ! python3 -c "import ignite, fire, airbench" 2> /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .lease/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 MPLCONFIGDIR=/tmp/lease-mpl
data=${LEASE_DATA:-/tmp/lease-data}
if [ ! -f "$data/cifar-10-batches-py/test_batch" ]; then
  started=$(date +%s)
  python3 .lease/make_cifar10.py "$data" --archive .lease/cifar10-jpg.tar.xz > /dev/null
  echo "CIFAR-10 built in $(( $(date +%s) - started )) s"
fi
python3 - <<'EOF' | tee "$out/machine.txt"
import subprocess, torch
name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA GPU"
smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip() if torch.cuda.is_available() else ""
print(f"{name}; {smi}; torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
EOF

if [ "$mode" = checks ]; then
  mkdir -p "$out/tmp"
  export GPU_CHECK_OUT="$out" GPU_CHECK_DATA="$data" TMPDIR="$out/tmp"
  [ "$device" = cpu ] && export GPU_CHECK_DEVICE=cpu
  rm -f "$out/checks.jsonl"
  status=0
  # the compiled step is measured by the bench's compile part (recompilations counted there): not run twice
  python3 -m pytest -m gpu tests/gpu/test_device_path.py -k "not compiled" -p no:cacheprovider -q -rs --durations=0 \
    --junitxml="$out/pytest.xml" --basetemp="$out/tmp/pytest" 2>&1 | tee "$out/pytest.log" || status=1
  python3 -m benchmarks.gpu_report --out="$out" || status=1
  rm -rf "$out/tmp"
  exit "$status"
fi
if [ "$mode" = bisect ] || [ "$mode" = ab ]; then
  history=()
  [ -f .lease/history.bundle ] && history=(--history=.lease/history.bundle)
  [ "$mode" = ab ] && history=()
  python3 -m benchmarks.bisect "$mode" --data_path="$data" --device="$device" --json="$out/$mode.json" \
    "${history[@]}" "${flags[@]}" 2>&1 | tee "$out/$mode.log"
  exit "${PIPESTATUS[0]}"
fi
python3 -m benchmarks.gpu --data_path="$data" --device="$device" --json="$out/benchmark.json" "${flags[@]}" \
  2>&1 | tee "$out/benchmark.log"
