#!/usr/bin/env bash
# The wheels the GPU machines lack (issue #42): pydantic, which the library imports (every call carries them), and
# for the app's tests gradio, plotly and what they need beyond the machines' image (Python 3.12; its package list: the device tool's KINDS.md), pinned to this project's versions.
# Run here, where pip reaches PyPI; the GPU machine reaches nothing. They go to .whl/ (git-ignored), about 46 MB,
# within the 64 MiB that travels with a call:
#
#   scripts/gpu_wheels.sh            # then, in the device call: carry [".whl"], and scripts/gpu_check.sh OUTDIR tests
#   scripts/gpu_wheels.sh peers      # ContextCite's package for the hitratio stage, to .whl-peers/ (about 1 MB):
#                                    # carry [".whl", ".whl-peers"] (with the tree's 16 MB, within the 64 MiB)
#
# gpu_check.sh installs them into /tmp/site (PYTHONPATH) when .whl/ (and .whl-peers/) is there. ContextCite's package
# also imports spaCy (36 MB with blis and thinc: over the limit) and nltk for its own text splitters, which its rows
# here never call (`eval/peers.py` hands it the project's sentences); gpu_check.sh stands in for those two modules
# where they are missing (`peer_stubs`), with stand-ins that fail if called.
set -euo pipefail
cd "$(dirname "$0")/.."
PYDANTIC=(pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5)
PEERS=(context-cite==0.0.4 datasets==4.8.5 dill==0.4.0 multiprocess==0.70.18)  # the rest is in the machines' image
WHEELS=(
    gradio==6.31.0 gradio-client==2.7.2 plotly==7.1.0 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0
    "${PYDANTIC[@]}" orjson==3.13.0
    brotli==1.2.1 groovy==0.1.2 hf-gradio==0.4.1 httpcore2==2.16.2 httpx2==2.16.2 opentelemetry-api==1.45.2
    pydub==0.25.1 python-multipart==0.0.34 safehttpx==0.1.7 semantic-version==2.10.0 tomlkit==0.14.0
    truststore==0.10.5 pytz==2026.6 tzdata==2026.6
)
dir=.whl
case "${1:-all}" in
all) ;;
peers) WHEELS=("${PEERS[@]}") dir=.whl-peers ;;
*) echo "usage: scripts/gpu_wheels.sh [all|peers]" >&2 && exit 2 ;;
esac
for ignored in /.whl/ /.whl-peers/; do
    grep -qx "$ignored" .git/info/exclude 2>/dev/null || echo "$ignored" >> .git/info/exclude
done
mkdir -p "$dir"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$dir" "${WHEELS[@]}"
du -sh "$dir"
