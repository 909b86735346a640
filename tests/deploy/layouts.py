"""What compose/engines/<profile>.yml must say: the profile's own engines per GPU, by default."""

from __future__ import annotations

from app.profiles.gpus import CPU_PROFILE, card_for_profile

ONE = """\
# {profile}: one vLLM engine per GPU by default, as vllm_configs/{profile}.yaml's header says
# ({grounds}); ENGINES_PER_GPU=2 runs two under NVIDIA MPS. GPUS (default 1) GPUs alike.
# docker-compose.yml includes this file for GPU_PROFILE={profile}; the catalogue
# (app/profiles/gpus.py) holds the same number, and tests/deploy/test_compose_layouts.py the three
# equal.
include:
  - path: ../layouts/gpus-${{GPUS:-1}}-engines-${{ENGINES_PER_GPU:-1}}.yml
"""

TWO = """\
# {profile}: two vLLM engines per GPU under NVIDIA MPS by default, as vllm_configs/{profile}.yaml's
# header says ({grounds}); ENGINES_PER_GPU=1 runs one. GPUS (default 1) GPUs alike.
# docker-compose.yml includes this file for GPU_PROFILE={profile}; the catalogue
# (app/profiles/gpus.py) holds the same number, and tests/deploy/test_compose_layouts.py the three
# equal.
include:
  - path: ../layouts/gpus-${{GPUS:-1}}-engines-${{ENGINES_PER_GPU:-2}}.yml
"""

CPU = """\
# cpu: no GPU; one vLLM engine and the layout service on the CPU (compose/layouts/cpu.yml).
# GPUS and ENGINES_PER_GPU do not apply. docker-compose.yml includes this file for
# GPU_PROFILE=cpu.
include:
  - path: ../layouts/cpu.yml
"""


def engines_file(profile: str) -> str:
    """compose/engines/<profile>.yml as the catalogue says it (measured or modelled grounds)."""
    if profile == CPU_PROFILE:
        return CPU
    card = card_for_profile(profile)
    if card is None:
        raise ValueError(f"{profile!r} is not in the GPU catalogue")
    grounds = "measured" if card.engines_measured else "modelled"
    template = TWO if card.engines_per_gpu == 2 else ONE
    return template.format(profile=profile, grounds=grounds)
