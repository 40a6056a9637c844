#!/usr/bin/env bash
# The wheels the GPU machines lack (issue #42): pydantic, which the library imports (every call carries them), and
# for the app's tests gradio, plotly and what they need beyond the machines' image (Python 3.12; its package list: the device tool's KINDS.md), pinned to this project's versions.
# Run here, where pip reaches PyPI; the GPU machine reaches nothing. They go to .whl/ (git-ignored), about 46 MB,
# within the 64 MiB that travels with a call:
#
#   scripts/gpu_wheels.sh            # then, in the device call: carry [".whl"], and scripts/gpu_check.sh OUTDIR tests
#   scripts/gpu_wheels.sh peers      # ContextCite's package for the hitratio stage, with pydantic and gguf, to
#                                    # .whl-peers/ (about 4 MB): carry [".whl-peers", ".gguf-N"] (below)
#   scripts/gpu_wheels.sh data FILE  # a SQuAD file (the lds-cc-long stage's questions) to .data/, never committed:
#                                    # carry ".data" too
#   scripts/gpu_wheels.sh model      # the embedded model's GGUF (94 MB, more than a call carries) in three parts,
#                                    # .gguf-1/ .gguf-2/ .gguf-3/ (about 31 MB each, with the whole file's SHA-256):
#                                    # one part a call, each with .whl-peers; gpu_check.sh keeps the parts on the
#                                    # machine (/tmp/gguf-parts) and, once all three are there, installs the model
#
# gpu_check.sh installs them into /tmp/site (PYTHONPATH) when .whl/ (and .whl-peers/) is there. ContextCite's package
# also imports spaCy (36 MB with blis and thinc: over the limit) and nltk for its own text splitters, which its rows
# here never call (`eval/peers.py` hands it the project's sentences); gpu_check.sh stands in for those two modules
# where they are missing (`peer_stubs`), with stand-ins that fail if called.
set -euo pipefail
cd "$(dirname "$0")/.."
PYDANTIC=(pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5)
LIBRARY=(gguf==0.19.0 nltk==3.10.4)  # the GGUF loader, and nltk for rouge-score (built below: PyPI has no wheel of it)
PEERS=(context-cite==0.0.4 datasets==4.8.5 dill==0.4.0 multiprocess==0.70.18)  # the rest is in the machines' image
WHEELS=(
    gradio==6.31.0 gradio-client==2.7.2 plotly==7.1.0 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0
    "${PYDANTIC[@]}" "${LIBRARY[@]}" orjson==3.13.0
    brotli==1.2.1 groovy==0.1.2 hf-gradio==0.4.1 httpcore2==2.16.2 httpx2==2.16.2 opentelemetry-api==1.45.2
    pydub==0.25.1 python-multipart==0.0.34 safehttpx==0.1.7 semantic-version==2.10.0 tomlkit==0.14.0
    truststore==0.10.5 pytz==2026.6 tzdata==2026.6
)
dir=.whl
case "${1:-all}" in
all) ;;
peers) WHEELS=("${PYDANTIC[@]}" gguf==0.19.0 "${PEERS[@]}") dir=.whl-peers ;;
model)
    PY=python3
    [ -x .venv/bin/python ] && PY=.venv/bin/python
    gguf=${2:-$($PY -c "from explainer.models.loading import embedded_gguf_path; print(embedded_gguf_path())")}
    to=${GGUF_TO:-.}  # where the parts go (the tests split a file of their own elsewhere)
    sum=$(sha256sum "$gguf" | cut -d' ' -f1)
    size=$(stat -c %s "$gguf")
    part=$(((size + 2) / 3))
    for i in 1 2 3; do
        rm -rf "$to/.gguf-$i" && mkdir -p "$to/.gguf-$i"
        dd if="$gguf" of="$to/.gguf-$i/part" bs=1M iflag=skip_bytes,count_bytes skip=$(((i - 1) * part)) count=$part \
            status=none
        echo "$sum 3" >"$to/.gguf-$i/SHA256"
    done
    du -sh "$to"/.gguf-[123]
    exit 0
    ;;
data)  # a SQuAD file of the user's (e.g. the cached squad_v2-dev), for the lds-cc-long stage: never committed
    mkdir -p .data && cp "${2:?data FILE}" .data/squad-dev.json && du -sh .data
    exit 0
    ;;
*) echo "usage: scripts/gpu_wheels.sh [all|peers|model [GGUF]|data FILE]" >&2 && exit 2 ;;
esac
mkdir -p "$dir"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$dir" "${WHEELS[@]}"
if [ "$dir" = .whl ]; then  # the faithfulness metrics' ROUGE-L (PyPI has its source only; pure Python)
    python3 -m pip wheel -q --no-deps -w "$dir" rouge-score==0.1.2
fi
du -sh "$dir"
