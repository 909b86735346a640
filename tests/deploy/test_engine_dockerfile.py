"""engine/Dockerfile, read with BuildKit's own parser, and its install step run for real.

The docker tier builds the image over its stand-in CPU base and runs vLLM and the layout service
from it (tests/deploy/docker/test_engine_image.py); here, without an engine: the instructions,
what the build context lets in, and the install into a --target folder that vLLM's Python finds
through PYTHONPATH, tried with the engine venv's Python.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dockerfile
import yaml

from tests.conftest import ENGINE_VENV
from tests.deploy.compose import GPU_PROFILES, ROOT
from tests.deploy.test_dockerfile import ignored

COMMANDS = dockerfile.parse_file(str(ROOT / "engine" / "Dockerfile"))
TARGET = "/opt/ocrvl-engine"


def stages() -> list[list[dockerfile.Command]]:
    starts = [i for i, command in enumerate(COMMANDS) if command.cmd == "FROM"]
    return [list(COMMANDS[a:b]) for a, b in zip(starts, [*starts[1:], len(COMMANDS)], strict=True)]


def args() -> dict[str, str]:
    found = [command.value[0] for command in COMMANDS if command.cmd == "ARG"]
    return dict(arg.split("=", 1) for arg in found if "=" in arg)


def test_a_thin_layer_over_the_vllm_image_named_by_the_build_arg() -> None:
    """Two stages: the packages built over PYTHON_IMAGE (the gateway's base), then VLLM_IMAGE
    (the GPU profiles' vLLM by default) with only the built folder copied in and PYTHONPATH
    leading to it; no pip runs in vLLM's image."""
    build, final = stages()
    assert build[0].value == ("${PYTHON_IMAGE}", "AS", "build")
    assert final[0].value == ("${VLLM_IMAGE}",)
    gateway = dockerfile.parse_file(str(ROOT / "Dockerfile"))
    gateway_args = dict(
        c.value[0].split("=", 1) for c in gateway if c.cmd == "ARG" and "=" in c.value[0]
    )
    assert args()["PYTHON_IMAGE"] == gateway_args["PYTHON_IMAGE"]
    profiles = yaml.safe_load(GPU_PROFILES.read_text())["services"]
    assert args()["VLLM_IMAGE"] == profiles["h200-141gb"]["build"]["args"]["VLLM_IMAGE"]
    copies = [c for c in final if c.cmd == "COPY"]
    assert [(c.flags, c.value) for c in copies] == [(("--from=build",), (TARGET, TARGET))]
    env = next(c for c in final if c.cmd == "ENV")
    assert env.value[0] == "PYTHONPATH"
    assert env.value[1].startswith(f"{TARGET}$")
    assert not [c for c in final if c.cmd == "RUN" and "pip" in " ".join(c.value)]


def test_both_engine_packages_are_installed_without_dependencies() -> None:
    """One pip call installs engine/vllm_plugin and engine/layout with --no-deps (vLLM's image
    has torch and transformers) into the folder the final stage copies, from the locked
    setuptools (wheelhouse/ where there is no index)."""
    build, _ = stages()
    (run,) = [c for c in build if c.cmd == "RUN"]
    text = " ".join(run.value)
    assert "-r /src/locks/build.txt" in text
    install = text[text.index("--no-deps") :]
    assert f"--target {TARGET} /src/engine/vllm_plugin /src/engine/layout" in install
    assert "--no-build-isolation" in install


def test_the_build_checks_what_vllms_python_finds_unless_told_not_to() -> None:
    """CHECK_IMPORTS=1 (default): the plugin's entry point, the layout service's module and
    transformers' PP-DocLayoutV3 (>= 5.1) must import in the built image."""
    _, final = stages()
    assert args()["CHECK_IMPORTS"] == "1"
    (run,) = [c for c in final if c.cmd == "RUN"]
    text = " ".join(run.value)
    assert '[ "$CHECK_IMPORTS" = 1 ]' in text
    for needed in ("vllm.general_plugins", "ocrvl_packed_encoder", "ocrvl_layout.__main__",
                   "transformers.models.pp_doclayout_v3"):  # fmt: skip
        assert needed in text, needed


def test_the_build_context_lets_in_the_engine_sources_and_keeps_builds_out() -> None:
    """.dockerignore (shared with the gateway's Dockerfile) lets in both packages, the build
    lock and wheelhouse/, and keeps their egg-info, caches and the tests out."""
    for kept in ("engine/vllm_plugin/pyproject.toml", "engine/layout/pyproject.toml",
                 "engine/layout/ocrvl_layout/__main__.py", "locks/build.txt"):  # fmt: skip
        assert (ROOT / kept).exists(), kept
        assert not ignored(kept), kept
    for out in ("engine/layout/ocrvl_layout.egg-info/PKG-INFO",
                "engine/vllm_plugin/ocrvl_vllm_plugin/__pycache__/x.pyc",
                "tests/engine/test_vllm_plugin.py", ".cache/tiny-layout/config.json"):  # fmt: skip
        assert ignored(out), out


FINDS = """
import json
from importlib.metadata import entry_points
import ocrvl_layout, ocrvl_vllm_plugin
plugins = [(e.name, e.value, e.dist.locate_file("").as_posix())
           for e in entry_points(group="vllm.general_plugins")]
print(json.dumps({"plugins": plugins, "plugin": ocrvl_vllm_plugin.__file__,
                  "layout": ocrvl_layout.__file__}))
"""


def test_the_install_step_gives_vllms_python_the_plugin_and_the_layout_service(
    tmp_path: Path,
) -> None:
    """The Dockerfile's pip call, run here into a folder, then vLLM's Python (the engine venv)
    with only PYTHONPATH set: the plugin's entry point and both packages come from the folder,
    ahead of the copies the venv holds itself."""
    target = tmp_path / "ocrvl-engine"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--no-deps",
         "--no-build-isolation", "--no-index", "--target", str(target),
         str(ROOT / "engine" / "vllm_plugin"), str(ROOT / "engine" / "layout")],
        check=True, timeout=300, capture_output=True, cwd=tmp_path,
    )  # fmt: skip
    environment = {"PATH": os.environ["PATH"], "PYTHONPATH": str(target), "HOME": str(tmp_path)}
    ran = subprocess.run(
        [str(ENGINE_VENV / "bin" / "python"), "-c", FINDS], capture_output=True, text=True,
        env=environment, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    found = json.loads(ran.stdout)
    ours = [p for p in found["plugins"] if p[0] == "ocrvl_packed_encoder"]
    assert ours[0][:2] == ["ocrvl_packed_encoder", "ocrvl_vllm_plugin:register"]
    assert ours[0][2].startswith(str(target))
    assert found["plugin"].startswith(str(target))
    assert found["layout"].startswith(str(target))
