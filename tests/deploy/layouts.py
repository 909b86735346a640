"""What compose/engines/<profile>.yml and .env must say: the profile's own engines per GPU and the
layout service's batch on its card, by default."""

from __future__ import annotations

from app.profiles.gpus import CPU_PROFILE, card_for_profile
from app.profiles.memory import layout_batch

ONE = """\
# {profile}: one vLLM engine per GPU by default, as vllm_configs/{profile}.yaml's header says
# ({grounds}); ENGINES_PER_GPU=2 runs two under NVIDIA MPS. GPUS (default 1) GPUs alike.
# docker-compose.yml includes this file for GPU_PROFILE={profile}; the catalogue
# (app/profiles/gpus.py) holds the same number, and tests/deploy/test_compose_layouts.py the three
# equal. The layout service's batch on this card comes from {profile}.env.
include:
  - path: ../layouts/gpus-${{GPUS:-1}}-engines-${{ENGINES_PER_GPU:-1}}.yml
    env_file: {profile}.env
"""

TWO = """\
# {profile}: two vLLM engines per GPU under NVIDIA MPS by default, as vllm_configs/{profile}.yaml's
# header says ({grounds}); ENGINES_PER_GPU=1 runs one. GPUS (default 1) GPUs alike.
# docker-compose.yml includes this file for GPU_PROFILE={profile}; the catalogue
# (app/profiles/gpus.py) holds the same number, and tests/deploy/test_compose_layouts.py the three
# equal. The layout service's batch on this card comes from {profile}.env.
include:
  - path: ../layouts/gpus-${{GPUS:-1}}-engines-${{ENGINES_PER_GPU:-2}}.yml
    env_file: {profile}.env
"""

CPU = """\
# cpu: no GPU; one vLLM engine and the layout service on the CPU (compose/layouts/cpu.yml).
# GPUS and ENGINES_PER_GPU do not apply. docker-compose.yml includes this file for
# GPU_PROFILE=cpu.
include:
  - path: ../layouts/cpu.yml
"""

LAYOUT_ENV = """\
# {profile}: LAYOUT_MAX_BATCH, the layout service's --max-batch on this card, as
# vllm_configs/{profile}.yaml's header says (app/profiles/layout.py: the largest batch
# whose share is within a third of the card). compose/engines/{profile}.yml reads this file
# for its default; LAYOUT_MAX_BATCH in .env or the shell wins. tests/deploy/test_compose_layouts.py
# keeps it equal to the memory model.
LAYOUT_MAX_BATCH={batch}
"""


def layout_env_file(profile: str) -> str:
    """compose/engines/<profile>.env: the layout service's batch on the profile's card."""
    card = card_for_profile(profile)
    if card is None:
        raise ValueError(f"{profile!r} is not in the GPU catalogue")
    return LAYOUT_ENV.format(profile=profile, batch=layout_batch(card.memory_bytes))


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
