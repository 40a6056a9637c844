#!/usr/bin/env bash
# The checks that need a GPU, as one script: the test suite on CUDA (the device-parametrised tests first), the
# embedded model in bfloat16 against plain `generate`, `bench` of plain generation vs MACS vs Rollout at 1k-32k prompt
# tokens in bfloat16, and the bf16-vs-float32 agreement on SQuAD. Each stage writes its log (and JSON) to OUTDIR and
# is time-boxed, so a stage that overruns leaves the others their time.
#
#   scripts/gpu_check.sh OUTDIR tests          # the suite: tests/explainer (CUDA cases first) and the project checks
#   scripts/gpu_check.sh OUTDIR embedded       # the embedded-model tests (bf16 vs plain generate, every method)
#   scripts/gpu_check.sh OUTDIR bench          # bench, bfloat16: 1k and 4k, then 16k and 32k (see below)
#   scripts/gpu_check.sh OUTDIR agreement DATA # bf16-vs-float32 agreement on the SQuAD file DATA (resumable)
#
# SmolLM2-135M (the embedded model) has a context of 8,192 positions; for the 16k and 32k rows `bench` runs a copy of
# it whose position limit is raised to 32,800. Its rotary embedding is computed from the positions, so the work (and
# the timing) is that of the same model with a longer context; its outputs past 8k are outside its training.
# Environment: PY (default python3), STAGE_SECONDS (default per stage below), PYTEST_WORKERS (pytest-xdist, if any).
set -uo pipefail
OUT=${1:?OUTDIR}
STAGE=${2:?stage}
PY=${PY:-python3}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

run() {  # run SECONDS NAME CMD...: time-boxed, output to OUT/NAME.log and to the terminal
    local seconds=$1 name=$2
    shift 2
    echo "=== $name ($(date -u +%H:%M:%S), at most ${seconds}s): $*"
    timeout -k 10 "$seconds" "$@" > >(tee "$OUT/$name.log") 2>&1
    local rc=$?
    echo "=== $name: exit $rc"
}

case "$STAGE" in
tests)
    workers=${PYTEST_WORKERS:-}
    xdist=()
    if [ -n "$workers" ] && $PY -c "import xdist" 2>/dev/null; then xdist=(-n "$workers"); fi
    run "${STAGE_SECONDS:-150}" pytest-cuda $PY -m pytest -p no:cacheprovider -q -rfEs "${xdist[@]}" \
        tests/explainer/test_on_device.py -k cuda --junitxml "$OUT/pytest-cuda.xml"
    # The rest of the library's tests (the models they load without a device go to CUDA here); the app's tests need
    # gradio and the browser tests Chromium.
    run "${STAGE_SECONDS:-240}" pytest-all $PY -m pytest -p no:cacheprovider -q -rfE "${xdist[@]}" \
        --continue-on-collection-errors tests/explainer tests/test_function_length.py tests/test_real_size.py \
        --deselect tests/explainer/test_on_device.py --junitxml "$OUT/pytest-all.xml"
    ;;
embedded)
    # Loads on CUDA: capture = plain generate in float32 and bfloat16, every method in bfloat16, AtMan's no-op.
    run "${STAGE_SECONDS:-90}" pytest-embedded $PY -m pytest -p no:cacheprovider -q -rfEs \
        tests/explainer/test_embedded.py tests/explainer/test_bf16.py -k "embedded"
    ;;
bench)
    long=/tmp/smollm2-135m-32k
    $PY - "$long" <<'EOF'
import json, shutil, sys
from pathlib import Path
from explainer.models import _converted_embedded_folder
target = Path(sys.argv[1])
if not target.exists():
    shutil.copytree(_converted_embedded_folder(), target)
cfg = json.loads((target / "config.json").read_text())
cfg["max_position_embeddings"] = 32800
(target / "config.json").write_text(json.dumps(cfg))
print("long-context copy at", target)
EOF
    run "${STAGE_SECONDS:-120}" bench-short $PY -m explainer bench --dtype bfloat16 --prompt-tokens 1024,4096 \
        --new-tokens 32 --methods none,macs,rollout --repeats 3 --json "$OUT/bench-gpu-short.json" --markdown
    run "${STAGE_SECONDS:-200}" bench-long $PY -m explainer bench --model "$long" --dtype bfloat16 \
        --prompt-tokens 16384,32768 --new-tokens 32 --methods none,macs,rollout --repeats 2 \
        --json "$OUT/bench-gpu-long.json" --markdown
    ;;
agreement)
    data=${3:-squad_v2-dev}  # a SQuAD JSON file, or the dev set the CLI downloads once
    run "${STAGE_SECONDS:-150}" agreement $PY -m explainer agreement \
        --methods macs,rollout,atman,attnlrp,grad_ellm,input_x_gradient --data "$data" --limit 50 \
        --max-new-tokens 16 --results "$OUT/agreement-bf16-gpu.jsonl"
    $PY -m explainer agreement --report "$OUT/agreement-bf16-gpu.jsonl" 2>&1
    ;;
*)
    echo "unknown stage $STAGE" >&2
    exit 2
    ;;
esac
