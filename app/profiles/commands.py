"""`ocrvl profile plan|detect|check`."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.profiles import PROFILES_DIR, ROOT
from app.profiles.checks import Checker
from app.profiles.detection import DetectionError, match, query
from app.profiles.engines import plan_engines, profile_more_graphs
from app.profiles.gpus import CARDS, CPU_PROFILE, card_for_profile
from app.profiles.headers import profile_header
from app.profiles.images import TargetError, load_targets
from app.profiles.memory import DTYPE_BYTES, derive, plan
from app.profiles.reports import (
    describe,
    describe_engines,
    engines_block,
    engines_env,
    yaml_block,
)
from app.profiles.shapes import DEFAULT_CONFIG, GiB, ModelShape, ShapeError, load_shape

PLAN_DTYPES = ("bfloat16", "float16", "float32")


def _plan(args: argparse.Namespace) -> int:
    try:
        shape = load_shape(args.model_config)
    except ShapeError as exc:
        print(f"ocrvl profile plan: {exc}", file=sys.stderr)
        return 2
    if args.header:
        return _header(args.profile, shape)
    card = card_for_profile(args.profile) if args.profile else None
    if args.profile and card is None:
        known = ", ".join(c.profile for c in CARDS)
        print(
            f"ocrvl profile plan: unknown profile {args.profile!r}; one of {known}", file=sys.stderr
        )
        return 2
    total = card.memory_bytes if card else int(args.gpu_mem_gib * GiB)
    if args.engines_per_gpu != 1 or args.env:
        return _plan_engines(args, shape, total, geforce=card.geforce if card else False)
    limits = derive(
        total,
        shape,
        geforce=card.geforce if card else False,
        utilization=args.utilization,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    more = profile_more_graphs(args.profile)
    limits = replace(limits, dtype_bytes=DTYPE_BYTES[args.dtype], more_graphs=more)
    result = plan(shape, limits, total)
    print(yaml_block(result, shape) if args.yaml else describe(result, shape))
    return 1 if result.errors else 0


def _header(profile: str | None, shape: ModelShape) -> int:
    """`plan --profile NAME --header`: the comment lines vllm_configs/NAME.yaml opens with."""
    known = ", ".join([*(c.profile for c in CARDS), CPU_PROFILE])
    if profile is None:
        print(f"ocrvl profile plan: --header needs --profile, one of {known}", file=sys.stderr)
        return 2
    try:
        header = profile_header(profile, load_targets(), shape)
    except TargetError as exc:
        print(f"ocrvl profile plan: {exc}", file=sys.stderr)
        return 2
    except KeyError:
        print(f"ocrvl profile plan: unknown profile {profile!r}; one of {known}", file=sys.stderr)
        return 2
    sys.stdout.write(header)
    return 0


def _plan_engines(args: argparse.Namespace, shape: ModelShape, total: int, *, geforce: bool) -> int:
    """`plan --engines-per-gpu N`: the share, KV cache and max-num-seqs of each of N engines."""
    if args.engines_per_gpu < 1 or (args.env and args.engines_per_gpu < 2):
        print(
            "ocrvl profile plan: --engines-per-gpu must be 1 or more (2 or more with --env)",
            file=sys.stderr,
        )
        return 2
    if args.utilization is not None or args.max_num_seqs is not None:
        print(
            "ocrvl profile plan: with --engines-per-gpu the share and max-num-seqs of each "
            "engine are planned; leave out --utilization and --max-num-seqs",
            file=sys.stderr,
        )
        return 2
    result = plan_engines(
        shape,
        total,
        args.engines_per_gpu,
        geforce=geforce,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        dtype_bytes=DTYPE_BYTES[args.dtype],
        more_graphs=profile_more_graphs(args.profile),
    )
    if args.env:
        sys.stdout.write(engines_env(result, args.profile or f"{args.gpu_mem_gib:g}gib"))
    else:
        print(engines_block(result) if args.yaml else describe_engines(result, shape))
    return 1 if result.errors else 0


def _detect(args: argparse.Namespace) -> int:
    gpus = query()
    if not gpus:
        print(PROFILES_DIR / "cpu.yaml")
        return 0
    status = 0
    for index, gpu in enumerate(gpus):
        try:
            found = match(gpu)
        except DetectionError as exc:
            print(f"ocrvl profile detect: GPU {index}: {exc}", file=sys.stderr)
            status = 1
            continue
        if found.note:
            print(f"ocrvl profile detect: GPU {index}: {found.note}", file=sys.stderr)
        print(PROFILES_DIR / f"{found.profile}.yaml")
    return status


def _shown(path: Path) -> Path:
    """The path relative to the working directory when it is below it."""
    return path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path


def _check(args: argparse.Namespace) -> int:
    files = [Path(f) for f in args.files] or [
        _shown(path) for path in sorted((ROOT / PROFILES_DIR).glob("*.yaml"))
    ]
    if args.profile and len(files) != 1:
        print("ocrvl profile check: --profile needs exactly one file", file=sys.stderr)
        return 2
    try:
        checker = Checker(load_shape(args.model_config), load_targets())
    except (ShapeError, TargetError) as exc:
        print(f"ocrvl profile check: {exc}", file=sys.stderr)
        return 2
    errors = 0
    for path in files:
        findings = checker.check(path, args.profile, args.vllm_version)
        for finding in findings:
            print(finding, file=sys.stderr if finding.error else sys.stdout)
        failed = sum(finding.error for finding in findings)
        errors += failed
        print(f"{path}: {'FAILED' if failed else 'ok'}")
    return 1 if errors else 0


def _add_model_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model-config",
        type=Path,
        default=DEFAULT_CONFIG,
        help="the checkpoint's config.json (default: PaddleOCR-VL 1.5's, shipped in the repo)",
    )


def register(commands: argparse._SubParsersAction[Any]) -> None:
    """Add the `profile` command group to the `ocrvl` parser."""
    profile = commands.add_parser("profile", help="plan, detect and check per-GPU vLLM profiles")
    actions = profile.add_subparsers(metavar="ACTION", required=True)

    plan_parser = actions.add_parser("plan", help="run the memory model for one card")
    card = plan_parser.add_mutually_exclusive_group(required=True)
    card.add_argument("--gpu-mem-gib", type=float, help="the card's total memory in GiB")
    card.add_argument("--profile", help="a catalogue card, e.g. v100-32gb")
    plan_parser.add_argument("--max-model-len", type=int, help="default: page + 4,096, rounded up")
    plan_parser.add_argument("--max-num-seqs", type=int, help="default: the pages the KV holds")
    plan_parser.add_argument("--utilization", type=float, help="gpu-memory-utilization")
    plan_parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        help="default: the recipe's 16,384, halved while the KV cache holds fewer than 8 pages",
    )
    plan_parser.add_argument("--dtype", choices=PLAN_DTYPES, default="bfloat16")
    plan_parser.add_argument(
        "--engines-per-gpu",
        type=int,
        default=1,
        metavar="N",
        help="plan N engines sharing the card under MPS (default 1: the profile itself)",
    )
    _add_model_config(plan_parser)
    output = plan_parser.add_mutually_exclusive_group()
    output.add_argument("--yaml", action="store_true", help="print the profile's YAML block")
    output.add_argument(
        "--header",
        action="store_true",
        help="with --profile: print the header its vllm_configs/ file opens with",
    )
    output.add_argument(
        "--env",
        action="store_true",
        help="with --engines-per-gpu 2: print compose/mps/<profile>.env (each engine's flags)",
    )
    plan_parser.set_defaults(func=_plan)

    detect_parser = actions.add_parser("detect", help="print the profile path for each GPU")
    detect_parser.set_defaults(func=_detect)

    check_parser = actions.add_parser("check", help="check profiles against vLLM, card, memory")
    check_parser.add_argument("files", nargs="*", help="default: vllm_configs/*.yaml")
    check_parser.add_argument(
        "--profile", help="the profile a single file is for (default: its name)"
    )
    check_parser.add_argument(
        "--vllm-version",
        help="check against this vLLM's stored flag set instead of the compose label's "
        "(e.g. 0.23.0 for a host whose torch pins it)",
    )
    _add_model_config(check_parser)
    check_parser.set_defaults(func=_check)
