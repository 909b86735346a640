"""Check that the GPU wheel list plus the H200 host's own packages meet every requirement.

Reads the METADATA of vllm, torch and every other wheel of the list (recursively, with the
extras that are asked for), evaluates markers for Linux x86_64 / CPython 3.12, and prints each
requirement that neither the list nor the host meets, marking the ones accepted on purpose.

    python bench/gpu/wheels_check.py [WHEEL_DIR] [LIST]
    (defaults: .gpu-wheels-032/.whl and bench/gpu/wheels_032.txt)
"""

from __future__ import annotations

import email.parser
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

HERE = Path(__file__).resolve().parent
ENV = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
ENV |= {"python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython"}

# The host's own packages, as `pip list` printed them there on 2026-12-01.
HOST_PINS = """
cuda-bindings==13.3.1 cuda-core==1.2.0 cuda-pathfinder==1.8.1 cuda-toolkit==13.0.2
cupy-cuda13x==14.2.0 numba==0.68.0 numba-cuda==0.30.4 numpy==2.5.2 nvidia-cublas==13.1.0.3
nvidia-cuda-cupti==13.0.85 nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96
nvidia-cudnn-cu13==9.19.0.56 nvidia-cufft==12.0.0.61 nvidia-cufile==1.15.1.6
nvidia-curand==10.4.0.35 nvidia-cusolver==12.0.4.66 nvidia-cusparse==12.6.3.3
nvidia-cusparselt-cu13==0.8.0 nvidia-nccl-cu13==2.28.9 nvidia-nvjitlink==13.0.88
nvidia-nvshmem-cu13==3.4.5 nvidia-nvtx==13.0.85 torch==2.11.0 torchaudio==2.11.0
torchvision==0.26.0 transformers==5.17.0 triton==3.6.0
"""
HOST = dict(pin.split("==") for pin in HOST_PINS.split())
# On the host, version unknown: vLLM 0.23 required them (or a package it carried did, or
# transformers/torch/aiohttp/requests do) and ran there without carrying them (README.md).
HOST_NAMES = """regex psutil sentencepiece requests tqdm py-cpuinfo huggingface-hub
tokenizers safetensors protobuf aiohttp pillow prometheus-client tiktoken filelock pyyaml six
setuptools einops cloudpickle ninja httpx httpcore h11 idna certifi urllib3 charset-normalizer
uvloop jinja2 markupsafe sympy networkx fsspec packaging click typer annotated-doc attrs
"""
HOST_UNVERSIONED = set(HOST_NAMES.split())
# Required by a carried wheel but not imported on the `vllm serve` path (evidence: source).
ACCEPTED = {
    "numba": "host 0.68 kept: 0.65 needs numpy<2.4; numba only in ngram_proposer/inkling",
    "cuda-toolkit": "metapackage; host 13.0.2 libs are soname-compatible (cublas 13.1.0 vs 13.1.1)",
    "numpy": "mistral_common caps numpy<2.4 (py<=3.12); 0.23 ran it on the host's 2.5.2",
    "flashinfer-python": "FA3 on sm90; sampler off via VLLM_USE_FLASHINFER_SAMPLER=0",
    "tilelang": "only the mhc kernels (other models) import vllm.tilelang_utils",
    "nvidia-cudnn-frontend": "only vllm_flash_attn/cute bench files import cudnn (guarded)",
    "nvtx": "imported inside a function (v1/utils.py) for profiling ranges only",
    "fastsafetensors": "guarded import; only --load-format fastsafetensors",
    "instanttensor": "imported inside a function; only --load-format instanttensor",
    "nvidia-cutlass-dsl": "CuTe-DSL kernels (FA4/sm100, GDN, MLA indexers) not on sm90 path",
    "quack-kernels": "CuTe-DSL kernels only (mamba/MLA/MoE router), not PaddleOCR-VL",
    "tokenspeed-mla": "MLA models only",
    "humming-kernels": "quantized MoE kernels only",
    "torchcodec": "guarded import (video/audio decoders)",
    "pynvvideocodec": "not imported at module level (video decode only)",
    "anthropic": "not imported by vllm at module level",
    "mcp": "not imported by vllm at module level",
    "opentelemetry-sdk": "guarded import in vllm/tracing/otel.py",
    "opentelemetry-api": "guarded import in vllm/tracing/otel.py",
    "opentelemetry-exporter-otlp": "guarded import in vllm/tracing/otel.py",
    "opentelemetry-semantic-conventions-ai": "guarded import in vllm/tracing/otel.py",
    "opencv-python-headless": "cv2 guarded (multimodal/video.py); images go through PIL",
    "fastapi-cli": "fastapi[standard] CLI extra; vLLM runs uvicorn itself",
    "fastar": "fastapi[standard] extra for `fastapi deploy`; not imported",
}


def metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.BytesParser().parsebytes(zf.read(name))


def wanted(req: Requirement, extras: set[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate(ENV | {"extra": e}) for e in extras | {""})


def main() -> int:
    wheel_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parents[1] / ".gpu-wheels-032/.whl"
    list_file = Path(sys.argv[2]) if len(sys.argv) > 2 else HERE / "wheels_032.txt"
    carried = {}
    for raw_line in list_file.read_text().splitlines():
        line = raw_line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            carried[canonicalize_name(name)] = version
    wheels = {canonicalize_name(w.name.split("-")[0]): w for w in wheel_dir.glob("*.whl")}
    missing = sorted(set(carried) - set(wheels))
    if missing:
        print("wheels missing from", wheel_dir, ":", ", ".join(missing))
        return 1
    unmet, said = 0, set()
    todo, seen = [("vllm", frozenset()), ("torch", frozenset())], set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        for raw in metadata(wheels[name]).get_all("Requires-Dist") or []:
            req = Requirement(raw)
            if not wanted(req, set(extras)):
                continue
            dep = canonicalize_name(req.name)
            have = carried.get(dep) or HOST.get(dep)
            if dep in carried:
                todo.append((dep, frozenset(req.extras)))
            if have and req.specifier.contains(Version(have), prereleases=True):
                continue
            if have is None and dep in HOST_UNVERSIONED:
                if req.specifier and (name, dep) not in said:
                    print(f"host, version unknown: {name} needs {req.name}{req.specifier}")
                said.add((name, dep))
                continue
            if (name, dep) in said:
                continue
            said.add((name, dep))
            tag = "ACCEPTED" if dep in ACCEPTED else "UNMET"
            unmet += tag == "UNMET"
            found = f"{have} ({'list' if dep in carried else 'host'})" if have else "absent"
            print(
                f"{tag:8} {name} needs {req.name}{req.specifier or ''}: {found}"
                f"{'  -- ' + ACCEPTED[dep] if dep in ACCEPTED else ''}"
            )
    print(f"{len(carried)} wheels listed, {len(seen)} checked, {unmet} unmet")
    return 1 if unmet else 0


if __name__ == "__main__":
    sys.exit(main())
