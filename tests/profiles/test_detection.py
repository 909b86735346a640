"""`ocrvl profile detect` against a stand-in `nvidia-smi` printing the real output format."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.profiles import ROOT

HEADER = "name, memory.total [MiB], compute_cap"


def run_detect(bin_dir: Path) -> subprocess.CompletedProcess[str]:
    """The real `ocrvl profile detect` with only `bin_dir` on PATH."""
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "profile", "detect"],
        capture_output=True,
        text=True,
        env={"PATH": str(bin_dir), "HOME": str(bin_dir)},
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def stand_in(tmp_path: Path, stdout: str, status: int = 0, old_driver: str = "") -> Path:
    """A `nvidia-smi` answering the profile query like the real one; `old_driver` is what a
    driver without `compute_cap` prints for `name,memory.total` (it refuses the full query)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    full = "--query-gpu=name,memory.total,compute_cap"
    script.write_text(
        "#!/bin/sh\n"
        '[ "$2" = "--format=csv" ] || exit 2\n'
        f'if [ "$1" = "{full}" ] && [ -z "{old_driver}" ]; then\n'
        f"  printf '%s' '{stdout}'; exit {status}\n"
        "fi\n"
        f'if [ "$1" = "--query-gpu=name,memory.total" ] && [ -n "{old_driver}" ]; then\n'
        f"  printf '%s' '{old_driver}'; exit 0\n"
        "fi\n"
        "echo 'Field \"compute_cap\" is not a valid field to query.'; exit 2\n"
    )
    script.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize(
    ("line", "profile"),
    [
        ("Tesla V100-SXM2-32GB, 32768 MiB, 7.0", "v100-32gb"),
        ("Tesla V100-PCIE-32GB, 32510 MiB, 7.0", "v100-32gb"),
        ("Tesla T4, 15360 MiB, 7.5", "t4-16gb"),
        ("NVIDIA GeForce RTX 3060, 12288 MiB, 8.6", "rtx3060-12gb"),
        ("NVIDIA GeForce RTX 4090, 24564 MiB, 8.9", "rtx4090-24gb"),
        ("NVIDIA A10, 23028 MiB, 8.6", "a10-24gb"),
        ("NVIDIA L4, 23034 MiB, 8.9", "l4-24gb"),
        ("NVIDIA A100-SXM4-40GB, 40960 MiB, 8.0", "a100-40gb"),
        ("NVIDIA A100-PCIE-40GB, 40960 MiB, 8.0", "a100-40gb"),
        ("NVIDIA A100-SXM4-80GB, 81920 MiB, 8.0", "a100-80gb"),
        ("NVIDIA A100 80GB PCIe, 81920 MiB, 8.0", "a100-80gb"),
        ("NVIDIA H100 80GB HBM3, 81559 MiB, 9.0", "h100-80gb"),
        ("NVIDIA H100 PCIe, 81559 MiB, 9.0", "h100-80gb"),
        ("NVIDIA H200, 143771 MiB, 9.0", "h200-141gb"),
    ],
)
def test_one_gpu_gets_its_profile(tmp_path: Path, line: str, profile: str) -> None:
    """Each catalogue card, as nvidia-smi names it, maps to its own profile file."""
    result = run_detect(stand_in(tmp_path, f"{HEADER}\n{line}\n"))
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == f"vllm_configs/{profile}.yaml\n"
    assert (ROOT / result.stdout.strip()).exists()


def test_several_gpus_print_one_line_each(tmp_path: Path) -> None:
    """Lines follow nvidia-smi's GPU order."""
    lines = [
        "NVIDIA A100-SXM4-80GB, 81920 MiB, 8.0",
        "NVIDIA A100-SXM4-80GB, 81920 MiB, 8.0",
        "Tesla T4, 15360 MiB, 7.5",
    ]
    result = run_detect(stand_in(tmp_path, "\n".join([HEADER, *lines]) + "\n"))
    assert result.returncode == 0
    assert result.stdout.splitlines() == [
        "vllm_configs/a100-80gb.yaml",
        "vllm_configs/a100-80gb.yaml",
        "vllm_configs/t4-16gb.yaml",
    ]


def test_no_nvidia_smi_means_cpu(tmp_path: Path) -> None:
    """No nvidia-smi on PATH: the CPU profile."""
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_detect(empty)
    assert (result.returncode, result.stdout) == (0, "vllm_configs/cpu.yaml\n")


def test_no_device_means_cpu(tmp_path: Path) -> None:
    """nvidia-smi without a usable GPU (it exits 6 with a message): the CPU profile."""
    result = run_detect(stand_in(tmp_path, "No devices were found\n", status=6))
    assert (result.returncode, result.stdout) == (0, "vllm_configs/cpu.yaml\n")


def test_an_uncatalogued_card_gets_the_largest_profile_of_its_kind(tmp_path: Path) -> None:
    """An RTX 3090 (24 GiB, 8.6) runs the 4090's profile; stderr says it is a stand-in."""
    result = run_detect(stand_in(tmp_path, f"{HEADER}\nNVIDIA GeForce RTX 3090, 24576 MiB, 8.6\n"))
    assert (result.returncode, result.stdout) == (0, "vllm_configs/rtx4090-24gb.yaml\n")
    assert "RTX 3090 has no profile of its own" in result.stderr


def test_a_card_no_profile_fits_fails(tmp_path: Path) -> None:
    """A 16 GB V100 fits neither the 32 GB V100 profile nor a current (no sm_70) image."""
    result = run_detect(stand_in(tmp_path, f"{HEADER}\nTesla V100-PCIE-16GB, 16384 MiB, 7.0\n"))
    assert result.returncode == 1
    assert result.stdout == ""
    assert "no profile fits Tesla V100-PCIE-16GB" in result.stderr
    assert "ocrvl profile plan --gpu-mem-gib 16.0" in result.stderr


def test_a_driver_without_compute_cap_still_gets_profiles(tmp_path: Path) -> None:
    """Old drivers refuse `compute_cap`; the name and memory still pick the card's class."""
    answer = "name, memory.total [MiB]\nTesla V100-SXM2-32GB, 32768 MiB\n"
    result = run_detect(stand_in(tmp_path, "", old_driver=answer))
    assert (result.returncode, result.stdout) == (0, "vllm_configs/v100-32gb.yaml\n")
