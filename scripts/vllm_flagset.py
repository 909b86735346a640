"""Produce the `vllm serve` flag set of an older vLLM from that version's own source.

    python scripts/vllm_flagset.py 0.19.1                      # sdist from PyPI
    python scripts/vllm_flagset.py 0.23.0 --wheel WHEEL.whl    # a wheel already here
    python scripts/vllm_flagset.py 0.32.0 --installed          # this venv's own vLLM

How: the version's sdist (`vllm-X.Y.Z.tar.gz`) comes from PyPI's simple index (the JSON API pip
itself reads; `pip download` cannot fetch it without building CUDA extensions) and its sha256 is
verified. Only its pure-Python `vllm/` package is unpacked into a temporary folder, next to a
`vllm-X.Y.Z+cpu.dist-info` stub so that vLLM picks its CPU platform and no GPU is needed. That
folder goes first on PYTHONPATH of this venv's interpreter, and `python -m app.profiles.flagsets`
builds that version's own parser (`make_arg_parser(FlexibleArgumentParser())`, as `vllm serve`
does) and writes every option's kind, type, choices and enum values. Third-party modules the old
version imports but this venv lacks are installed into the temporary folder (`pip install
--target`, at the version the old requirements pin). The result goes to
`app/profiles/data/flagsets/vllm-X.Y.Z.json`; commit it.

`--wheel` takes the `vllm/` package from a wheel instead (e.g. the GPU wheel set of
../shared/gpu/fetch_wheels.sh, downloaded with pip), leaving its compiled extensions behind;
`--installed` reads the vLLM this venv runs (the CPU build of the same version: the serve parser
is the same Python code on every platform).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "app" / "profiles" / "data" / "flagsets"
INDEX = "https://pypi.org/simple/vllm/"
MISSING = re.compile(r"No module named '([\w.]+)'")
PACKAGE_FOR_MODULE = {"lm_format_enforcer": "lm-format-enforcer", "cv2": "opencv-python-headless"}


def sdist(version: str, folder: Path) -> tuple[Path, str]:
    """Download `vllm-VERSION.tar.gz` from PyPI and check its sha256."""
    request = urllib.request.Request(
        INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310
        files = json.load(response)["files"]
    name = f"vllm-{version}.tar.gz"
    entry = next((f for f in files if f["filename"] == name), None)
    if entry is None:
        sys.exit(f"PyPI has no {name}")
    path = folder / name
    urllib.request.urlretrieve(entry["url"], path)  # noqa: S310
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != entry["hashes"]["sha256"]:
        sys.exit(f"{name}: sha256 {digest} does not match PyPI's {entry['hashes']['sha256']}")
    return path, f"{entry['url']} (sha256 {digest})"


def unpack(archive: Path, version: str, folder: Path) -> list[str]:
    """Unpack the `vllm/` package and a CPU metadata stub; return the version's requirements."""
    prefix = f"vllm-{version}/"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix + "vllm/")]
        for member in members:
            member.name = member.name.removeprefix(prefix)
        tar.extractall(folder, members=members, filter="data")
        requirements = tar.extractfile(prefix + "requirements/common.txt")
        lines = requirements.read().decode().splitlines() if requirements else []
    stub = folder / f"vllm-{version}+cpu.dist-info"
    stub.mkdir()
    (stub / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def unpack_wheel(wheel: Path, version: str, folder: Path) -> list[str]:
    """Unpack the wheel's pure-Python `vllm/` and a CPU metadata stub; its requirements."""
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("vllm/") and not name.endswith(".so"):
                archive.extract(name, folder)
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
    stub = folder / f"vllm-{version}+cpu.dist-info"
    stub.mkdir()
    (stub / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    requires = [
        line.removeprefix("Requires-Dist: ") for line in lines if line.startswith("Requires")
    ]
    return [r.split(";")[0].strip() for r in requires if "extra ==" not in r]


def pinned(package: str, requirements: list[str]) -> str:
    """The requirement line of the old version for a package, or the bare name."""
    for line in requirements:
        name = re.split(r"[\s<>=!~;\[]", line, maxsplit=1)[0]
        if name.lower().replace("_", "-") == package.lower().replace("_", "-"):
            return line.split(";")[0].strip()
    return package


def dump(version: str, folder: Path, out: Path, source: str, requirements: list[str]) -> None:
    """Run the flag-set extraction under the old source, adding missing modules as needed."""
    deps = folder / "deps"
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(folder), str(deps), str(ROOT)]),
        "VLLM_TARGET_DEVICE": "cpu",
        "HF_HUB_OFFLINE": "1",
    }
    command = [sys.executable, "-m", "app.profiles.flagsets", str(out), "--source", source]
    for _ in range(10):
        result = subprocess.run(  # noqa: S603 - our own interpreter and module
            command, env=environment, capture_output=True, text=True, check=False
        )
        if result.returncode == 0:
            return
        match = MISSING.search(result.stderr)
        if match is None:
            sys.exit(f"extracting the flag set of vLLM {version} failed:\n{result.stderr[-3000:]}")
        module = match.group(1).split(".")[0]
        package = pinned(PACKAGE_FOR_MODULE.get(module, module), requirements)
        print(f"vLLM {version} imports {module}: installing {package} into the temporary folder")
        subprocess.run(  # noqa: S603
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--target",
                str(deps),
                package,
            ],
            check=True,
        )
    sys.exit("too many missing modules; giving up")


def installed(version: str, out: Path) -> None:
    """Extract the flag set of the vLLM this venv runs, which must be `version`."""
    found = metadata.version("vllm")
    if found.split("+")[0] != version:
        sys.exit(f"this venv runs vLLM {found}, not {version}")
    command = [sys.executable, "-m", "app.profiles.flagsets", str(out)]
    command += ["--source", f"vllm {found} (the project venv's, `make venv`)"]
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_TARGET_DEVICE": "cpu"}
    subprocess.run(command, env=environment, check=True)  # noqa: S603 - our own module


def main() -> None:
    """Download, unpack, extract, write."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", help="vLLM version, e.g. 0.19.1")
    origin = parser.add_mutually_exclusive_group()
    origin.add_argument("--wheel", type=Path, help="take vLLM's source from this wheel")
    origin.add_argument("--installed", action="store_true", help="this venv's own vLLM")
    args = parser.parse_args()
    out = OUT_DIR / f"vllm-{args.version}.json"
    if args.installed:
        installed(args.version, out)
    with tempfile.TemporaryDirectory(prefix="vllm-flagset-") as tmp:
        folder = Path(tmp)
        if args.wheel:
            requirements = unpack_wheel(args.wheel, args.version, folder)
            digest = hashlib.sha256(args.wheel.read_bytes()).hexdigest()
            dump(args.version, folder, out, f"{args.wheel.name} (sha256 {digest})", requirements)
        elif not args.installed:
            archive, source = sdist(args.version, folder)
            requirements = unpack(archive, args.version, folder)
            dump(args.version, folder, out, source, requirements)
    flags = json.loads(out.read_text())["flags"]
    print(f"wrote {out.relative_to(ROOT)}: {len(flags)} options of `vllm serve` {args.version}")


if __name__ == "__main__":
    main()
