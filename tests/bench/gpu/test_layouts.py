"""bench.gpu.layouts without a GPU: each layout's engine config, and merging stored H200 runs."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.gpu import layouts

RAW = Path(__file__).resolve().parents[3] / "bench/results/gpu-h200-2026-12-01-third-raw/mps"


def test_a_layout_writes_its_share_fixed_kv_and_renderer_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The profile as prepared, plus the layout's own keys and nothing else changed."""
    monkeypatch.setattr(layouts, "WORK", tmp_path)
    (tmp_path / "profile.yaml").write_text(yaml.safe_dump({"max-num-seqs": 256, "dtype": "bf16"}))
    layout = layouts.Layout(2, 0.45, kv_gib=16, renderer_workers=8)
    config = yaml.safe_load(layouts._profile("x", layout).read_text())
    assert config == {
        "max-num-seqs": 256,
        "dtype": "bf16",
        "gpu-memory-utilization": 0.45,
        "kv-cache-memory-bytes": 16 * 2**30,
        "renderer-num-workers": 8,
    }
    plain = yaml.safe_load(layouts._profile("y", layouts.LAYOUTS["default"]).read_text())
    assert "kv-cache-memory-bytes" not in plain
    assert "renderer-num-workers" not in plain


def test_merging_layouts_that_swept_different_levels_keeps_every_level(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stored MPS run (default 128/256, two-mps 256/384, three-mps 384/512): all six rows,
    ratios only where the default ran too, peaks against the default's."""
    results = tmp_path / "results"
    shutil.copytree(RAW, results, ignore=shutil.ignore_patterns("*.csv", "vllm-logs"))
    monkeypatch.setattr(layouts, "RESULTS", results)
    out = tmp_path / "out"
    assert layouts.merge(out, ["default", "two-mps", "three-mps"], stem="m") == 0
    merged = json.loads((out / "m.json").read_text())
    assert [level["concurrency"] for level in merged["levels"]] == [128, 256, 384, 512]
    text = (out / "m.md").read_text()
    sweep = text.split("Ratios to the first target")[0]
    names = ("| default |", "| two-mps |", "| three-mps |")
    rows = [line.split("|")[1:3] for line in sweep.splitlines() if line.startswith(names)]
    assert [(name.strip(), int(c)) for name, c in rows] == [
        ("default", 128), ("default", 256), ("two-mps", 256),
        ("two-mps", 384), ("three-mps", 384), ("three-mps", 512),
    ]  # fmt: skip
    ratios = text.split("Ratios to the first target")[1].split("![")[0]
    ratio_rows = [line for line in ratios.splitlines() if line[:3] in ("| 1", "| 2", "| 3", "| 5")]
    assert [row.split("|")[1].strip() for row in ratio_rows] == ["256"]
    peaks = {row["layout"]: row["peak_pages_per_s"] for row in merged["layouts"]}
    assert peaks["two-mps"] / peaks["default"] == pytest.approx(1.54, abs=0.01)
    assert all(row["mps"] for row in merged["layouts"] if row["layout"] != "default")


def test_resized_layouts_change_the_pages_sent_not_the_engines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`resized` layouts sweep with pages at the model's size, `gateway-resized` ones through
    a gateway with OCRVL_RESIZE_IMAGES=on; their engines are configured as `default`'s and
    `api2`'s; every other layout sends the corpus as drawn through a plain gateway."""
    from app.bench import sweep as sweeping  # noqa: PLC0415

    monkeypatch.setattr(layouts, "WORK", tmp_path)
    monkeypatch.setattr(layouts, "RESULTS", tmp_path / "results")
    (tmp_path / "profile.yaml").write_text(yaml.safe_dump({"max-num-seqs": 256}))
    asked: dict[str, tuple[bool, bool]] = {}
    resizing: list[bool] = []

    @contextlib.contextmanager
    def no_engines(name: str, layout: layouts.Layout, vllm: list[str]) -> Iterator[list[Any]]:
        yield []

    @contextlib.contextmanager
    def no_gateway(backends: list[str], resize_images: bool = False) -> Iterator[str]:
        resizing.append(resize_images)
        yield "http://127.0.0.1:9"

    def config_only(config: sweeping.Config) -> dict[str, Any]:
        asked[config.name] = (config.resized, resizing[-1])
        return {}

    monkeypatch.setattr(layouts, "engines", no_engines)
    monkeypatch.setattr(layouts, "gateway", no_gateway)
    monkeypatch.setattr(sweeping, "main", config_only)
    names = ["default", "resized", "api2", "api2-resized", "gateway-resized",
             "api2-gateway-resized", "api4"]  # fmt: skip
    assert layouts.run(names, ["vllm"], [256], 30.0) == 0
    assert asked == {
        "default": (False, False), "resized": (True, False), "api2": (False, False),
        "api2-resized": (True, False), "gateway-resized": (False, True),
        "api2-gateway-resized": (False, True), "api4": (False, False),
    }  # fmt: skip
    profile = {
        name: yaml.safe_load(layouts._profile(name, layouts.LAYOUTS[name]).read_text())
        for name in names
    }
    for name in ("resized", "api2", "api2-resized", "gateway-resized", "api2-gateway-resized"):
        assert profile[name] == profile["default"]
    assert [layouts.LAYOUTS[n].api_servers for n in names[:6]] == [1, 1, 2, 2, 1, 2]
    stored = json.loads((tmp_path / "results" / "gateway-resized.json").read_text())
    assert stored["layout"]["resize_in_gateway"] is True  # what merge's table reads
    seqs512 = {
        name: yaml.safe_load(layouts._profile(name, layouts.LAYOUTS[name]).read_text())
        for name in ("api2-seqs512", "api2-resized-seqs512", "api2-gateway-resized-seqs512")
    }
    for config in seqs512.values():  # room for 512 sequences, nothing else changed
        assert config == {**profile["default"], "max-num-seqs": 512}
    assert profile["default"]["max-num-seqs"] == 256


def test_a_layout_with_more_sequences_tells_the_gateway_its_capacity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM 0.32 does not expose max-num-seqs, so the gateway learns 256 for every engine; a
    layout that raises it hands the gateway `;capacity=N` for each engine, which the gateway's
    own settings read as that engine's capacity. Layouts that keep the profile's seqs leave it
    learnt."""
    from app.bench import sweep as sweeping  # noqa: PLC0415
    from app.settings import BackendSpec  # noqa: PLC0415

    monkeypatch.setattr(layouts, "WORK", tmp_path)
    monkeypatch.setattr(layouts, "RESULTS", tmp_path / "results")
    (tmp_path / "engine.log").write_text("")
    urls = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    handed: dict[str, list[str]] = {}

    @contextlib.contextmanager
    def two_engines(name: str, layout: layouts.Layout, vllm: list[str]) -> Iterator[Any]:
        yield [(url, tmp_path / "engine.log") for url in urls]

    @contextlib.contextmanager
    def no_gateway(backends: list[str], resize_images: bool = False) -> Iterator[str]:
        handed[str(len(handed))] = backends
        yield "http://127.0.0.1:9"

    monkeypatch.setattr(layouts, "engines", two_engines)
    monkeypatch.setattr(layouts, "gateway", no_gateway)
    monkeypatch.setattr(sweeping, "main", lambda config: {})
    names = ["seqs512", "api2-seqs512", "api2-gateway-resized-seqs512", "default", "api2"]
    assert layouts.run(names, ["vllm"], [512], 30.0) == 0
    capacities = {
        name: [(spec.url, spec.capacity) for spec in map(BackendSpec.parse, handed[str(i)])]
        for i, name in enumerate(names)
    }
    for name in names[:3]:
        assert capacities[name] == [(url, 512) for url in urls]
    for name in names[3:]:
        assert capacities[name] == [(url, None) for url in urls]


def test_with_hey_each_layout_is_also_loaded_by_hey_with_the_sweeps_body(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OCRVL_BENCH_HEY set: after its sweep, each layout's gateway gets hey at HEY_C for HEY_S
    seconds, with the sweep's body (256 tokens, ignore_eos, the served name) around a corpus
    page, and the layout's JSON keeps hey's summary. Unset: hey never runs."""
    from app.bench import sweep as sweeping  # noqa: PLC0415

    monkeypatch.setattr(layouts, "WORK", tmp_path)
    monkeypatch.setattr(layouts, "RESULTS", tmp_path / "results")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "engine.log").write_text("")
    asked: list[tuple[Any, ...]] = []

    @contextlib.contextmanager
    def one_engine(name: str, layout: layouts.Layout, vllm: list[str]) -> Iterator[Any]:
        yield [("http://127.0.0.1:8001", tmp_path / "engine.log")]

    @contextlib.contextmanager
    def at_gateway(backends: list[str], resize_images: bool = False) -> Iterator[str]:
        yield "http://127.0.0.1:9"

    def hey_run(binary: str, url: str, key: str, body: Path, **load: float) -> dict[str, Any]:
        asked.append((binary, url, key, json.loads(body.read_bytes()), load))
        return {"pages_per_s": 1.5, "concurrency": load["concurrency"]}

    monkeypatch.setattr(layouts, "engines", one_engine)
    monkeypatch.setattr(layouts, "gateway", at_gateway)
    monkeypatch.setattr(sweeping, "main", lambda config: {})
    monkeypatch.setattr(layouts.hey_load, "run", hey_run)
    assert layouts.run(["default"], ["vllm"], [512], 30.0) == 0
    assert asked == []
    monkeypatch.setattr(layouts, "HEY", "/usr/bin/hey")
    assert layouts.run(["default", "seqs512"], ["vllm"], [512], 30.0) == 0
    assert [a[:3] for a in asked] == [("/usr/bin/hey", "http://127.0.0.1:9", layouts.KEY)] * 2
    body, load = asked[0][3], asked[0][4]
    assert load == {"concurrency": layouts.HEY_C, "duration": layouts.HEY_S}
    assert (body["model"], body["max_completion_tokens"], body["ignore_eos"]) == (
        layouts.SERVED, 256, True
    )  # fmt: skip
    assert body["messages"][0]["content"][0]["image_url"]["url"].startswith("data:image/")
    stored = json.loads((tmp_path / "results" / "seqs512.json").read_text())
    assert stored["hey"] == {"pages_per_s": 1.5, "concurrency": layouts.HEY_C}


def test_together_sweeps_in_order_then_hey_in_reverse_and_direct_only_where_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run --together` with hey: every layout swept in the order named, then hey through a
    fresh gateway in the reverse order (A B B A), and for a one-engine layout named in
    OCRVL_BENCH_HEY_DIRECT also hey straight at its engine, at the same concurrency. Both hey
    summaries land in the layout's JSON beside its sweep, and the merged table shows them."""
    from app.bench import sweep as sweeping  # noqa: PLC0415

    monkeypatch.setattr(layouts, "WORK", tmp_path)
    monkeypatch.setattr(layouts, "RESULTS", tmp_path / "results")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(layouts, "HEY", "/usr/bin/hey")
    monkeypatch.setattr(layouts, "HEY_DIRECT", {"default-kv16", "api4-kv16"})
    (tmp_path / "engine.log").write_text("GPU KV cache size: 932,064 tokens\n")
    engine_of = {"default-kv16": "http://127.0.0.1:8001", "api4-kv16": "http://127.0.0.1:8002"}
    events: list[tuple[str, str]] = []
    gateways: list[list[str]] = []

    def launch(name: str, layout: layouts.Layout, vllm: list[str], indices: Any) -> Any:
        return [(engine_of[name], tmp_path / "engine.log", None)]

    @contextlib.contextmanager
    def at_gateway(backends: list[str], resize_images: bool = False) -> Iterator[str]:
        gateways.append(backends)
        yield f"http://127.0.0.1:9{len(gateways)}"

    def sweep_main(config: sweeping.Config) -> dict[str, Any]:
        events.append(("sweep", config.name))
        return {"swept": config.name}

    def hey_run(binary: str, url: str, key: str, body: Path, **load: float) -> dict[str, Any]:
        events.append(("hey", url))
        return {"pages_per_s": 2.0 if url in engine_of.values() else 1.0, **load}

    monkeypatch.setattr(layouts, "launch", launch)
    monkeypatch.setattr(layouts, "healthy", lambda wave, label: [(u, p) for u, p, _ in wave])
    monkeypatch.setattr(layouts, "_stop", lambda processes: None)
    monkeypatch.setattr(layouts, "gateway", at_gateway)
    monkeypatch.setattr(sweeping, "main", sweep_main)
    monkeypatch.setattr(layouts.hey_load, "run", hey_run)
    names = ["default-kv16", "api4-kv16"]
    assert layouts.run(names, ["vllm"], [256], 45.0, together=True) == 0
    assert events == [
        ("sweep", "default-kv16"), ("sweep", "api4-kv16"),
        ("hey", "http://127.0.0.1:93"), ("hey", engine_of["api4-kv16"]),
        ("hey", "http://127.0.0.1:94"), ("hey", engine_of["default-kv16"]),
    ]  # fmt: skip
    assert gateways == [[engine_of[n]] for n in (*names, *reversed(names))]
    for name in names:
        stored = json.loads((tmp_path / "results" / f"{name}.json").read_text())
        assert stored["swept"] == name
        assert stored["layout"]["name"] == name
        assert stored["layout"]["engines_logged"] == [{"kv_cache_tokens": 932064.0}]
        assert stored["hey"]["pages_per_s"] == 1.0
        assert stored["hey_direct"] == {"pages_per_s": 2.0, "concurrency": layouts.HEY_C,
                                        "duration": layouts.HEY_S}  # fmt: skip
    rows = [
        {"layout": name, "gpus": 1, "engines": 1, "memory_share": 0.95, "api_servers": 1,
         "omp_threads": None, "mps": False, "encoder_graphs": False, "peak_pages_per_s": 3.0,
         "peak_at": 256, "p99_at_peak_s": 9.0, "knee_concurrency": 256, "knee_per_engine": 256,
         "engines_logged": [], "gpu": None, "hey": {"pages_per_s": hey, "concurrency": 256},
         "hey_direct": direct}
        for name, hey, direct in (("a", 1.0, {"pages_per_s": 2.0}), ("b", 1.5, None))
    ]  # fmt: skip
    table = layouts.layouts_table(rows).splitlines()
    assert table[2].split("|")[-4:-1] == [" hey pages/s at c ", " hey x default ",
                                          " hey direct pages/s "]  # fmt: skip
    assert [line.split("|")[-4:-1] for line in table[4:]] == [
        [" 1.00 at 256 ", " 1.00 ", " 2.00 "],
        [" 1.50 at 256 ", " 1.50 ", "  "],
    ]


def test_layouts_that_cannot_start_together_are_refused_before_any_engine_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM refuses to start an engine unless `share` of the GPU is free at that moment, even
    with a fixed KV: the seventh pass's 0.95 `one-mps` beside `three-mps` died so, after 240 s
    of device time. Such a set, or one with a layout that profiles its memory, is refused
    before anything is launched; the layouts meant to run together pass."""
    launched: list[str] = []
    monkeypatch.setattr(layouts, "launch", lambda name, *rest: launched.append(name))
    old_one_mps = layouts.Layout(1, 0.95, kv_gib=16, mps=True)
    monkeypatch.setitem(layouts.LAYOUTS, "one-mps-0.95", old_one_mps)
    problems = layouts.together_problems(["one-mps-0.95", "three-mps"])
    assert len(problems) == 1
    assert problems[0].startswith("one-mps-0.95: share 0.95 asks for 132.8 GiB free")
    assert layouts.together_problems(["default", "two-mps"]) == ["default: no fixed KV (kv_gib)"]
    assert layouts.run(["one-mps-0.95", "three-mps"], ["vllm"], [256], 1.0, together=True) == 2
    assert launched == []
    for names in (["default-kv16", "api4-kv16"], ["one-mps", "two-mps"], ["one-mps", "three-mps"],
                  ["default-kv16", "api2-kv16", "api4-kv16", "renderer8-kv16"]):  # fmt: skip
        assert layouts.together_problems(names) == [], names
