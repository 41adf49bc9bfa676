#!/usr/bin/env bash
# The GPU checks of a release, in one run on a machine with CUDA: `make test-gpu`, then the
# benchmark figures a GPU changes (throughput, stall, launch). Uses the Python that has a CUDA
# torch already (a GPU image's; never installs torch), with trainctl from this checkout.
#
#   tools/gpu-check.sh [OUT_DIR]          # logs and bench results there (default: gpu-check/)
#
#   GPU_CHECK_WHEELS=DIR   install trainctl's other dependencies from these wheels first
#                          (a machine with no package index; into a private target dir)
#   TEST_SECONDS, BENCH_SECONDS   limits for each part (default 300, 330)
#   BENCH_ARGS             the figures (default: --quick --only throughput --only stall
#                          --only launch)
set -u
out=${1:-gpu-check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
started=$(date +%s)
say() { echo "[gpu-check $(( $(date +%s) - started ))s] $*"; }

nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv || {
  say "no nvidia-smi: not a GPU machine"; exit 2; }
python3 -c "import torch, sys; assert torch.cuda.is_available(), 'torch sees no CUDA device';
print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name(0))" || exit 2

if [ -n "${GPU_CHECK_WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade \
    --target /tmp/gpu-check-site "$GPU_CHECK_WHEELS"/*.whl || exit 2
  export PYTHONPATH=/tmp/gpu-check-site${PYTHONPATH:+:$PYTHONPATH}
fi
# trainctl from this checkout, in every process the checks start (agents, controllers)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# `make` runs in a "venv" that is this Python's own prefix: its pytest, and a `trainctl`
# beside it (written there if missing: the tests start the CLI from next to the interpreter)
venv=$(python3 -c 'import sys; print(sys.prefix)')
if [ ! -x "$venv/bin/trainctl" ]; then
  printf '#!%s\nimport sys\nfrom trainctl.cli import main\nsys.exit(main())\n' \
    "$(python3 -c 'import sys; print(sys.executable)')" > "$venv/bin/trainctl"
  chmod +x "$venv/bin/trainctl"
fi
stamp=$(mktemp)  # make's venv step: already done (nothing written into that Python's prefix)
touch -d 2099-01-01 "$stamp"
trap 'rm -f "$stamp"' EXIT
"$venv/bin/trainctl" --help > /dev/null || { say "trainctl does not start"; exit 2; }

say "make test-gpu"
timeout "${TEST_SECONDS:-300}" make test-gpu VENV="$venv" STAMP="$stamp" > "$out/test-gpu.log" 2>&1
test_rc=$?
tail -5 "$out/test-gpu.log"
say "make test-gpu: exit $test_rc"

say "make bench (the GPU figures)"
timeout "${BENCH_SECONDS:-330}" make bench VENV="$venv" STAMP="$stamp" \
  BENCH_ARGS="${BENCH_ARGS:---quick --only throughput --only stall --only launch}" \
  > "$out/bench.log" 2>&1
bench_rc=$?
grep -v '^\[bench\]' "$out/bench.log" | tail -25
cp bench/results.json "$out/results.json" 2>/dev/null
say "make bench: exit $bench_rc (results: $out/results.json, written after each figure)"
[ "$test_rc" = 0 ] && [ "$bench_rc" = 0 ]
