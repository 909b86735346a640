"""The pass as data: both plans name only stages the harness has, the H200 plan keeps method
2's rules; the report turns a results folder into issue 50's summary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.gpu import method, report, run
from bench.gpu.method import Record

PLANS = Path(__file__).resolve().parents[3] / "bench" / "gpu" / "plans"


def plan(name: str) -> dict[str, Any]:
    return dict(json.loads((PLANS / name).read_text()))


@pytest.mark.parametrize("name", sorted(path.name for path in PLANS.glob("*.json")))
def test_every_call_names_stages_the_harness_has(name: str) -> None:
    """Each call's words are stages (with a part number or a window index after `receive`,
    `window` and `alone`); every window of each A B B A order is run once, in every plan."""
    given = plan(name)
    words = " ".join(" ".join(call) for call in given["calls"]).split()
    indices: dict[str, list[int]] = {"receive": [], "window": [], "alone": []}
    while words:
        word = words.pop(0)
        if word in indices:
            indices[word].append(int(words.pop(0)))
        else:
            assert word in run.STAGES
    turns = method.order([v["name"] for v in given["variants"]], given["windows"])
    assert sorted(indices["window"]) == list(range(len(turns)))
    alone = method.order(list(given["alone"]["services"]), given["alone"]["windows"])
    assert sorted(indices["alone"]) == list(range(len(alone)))


def test_the_layout_service_alone_compares_its_processes_with_its_threads() -> None:
    """The fourteenth pass's plan and the CPU rehearsal load the layout service alone with
    worker processes (no --worker-processes: the default) and with threads
    (`--worker-processes 0`), at least two windows each (A B B A), the processes first."""
    for name in ("h200-vit-alone.json", "cpu-rehearsal.json"):
        alone = plan(name)["alone"]
        flags = {n: " ".join(f) for n, f in alone["services"].items()}
        assert list(flags) == ["processes", "threads"]
        assert "--worker-processes 0" in flags["threads"]
        assert "--worker-processes 0" not in flags["processes"]
        assert alone["windows"] >= 2
    assert "--worker-processes" not in plan("h200-vit-alone.json")["alone"]["services"]["processes"]


def test_the_h200_plan_compares_the_layout_service_as_shipped_with_eager() -> None:
    """The method-2 pass loads the layout service alone as it ships (`default`: no flag but the
    profile's batch) and with `--no-cuda-graphs` (`eager`), >= 3 windows each, the default
    first: its figure is the summary's `layout_service_alone_pages_per_s`."""
    alone = plan("h200-method2.json")["alone"]
    assert alone["services"] == {"default": ["--max-batch", "8"],
                                 "eager": ["--max-batch", "8", "--no-cuda-graphs"]}  # fmt: skip
    assert alone["windows"] >= 2


def test_the_vit_stage_times_every_attention_mode_and_backend() -> None:
    """The fourteenth pass's `vit` stage: the plugin's four modes and vLLM's other backends,
    on pages and on blocks, after `prepare` built the checkpoint."""
    given = plan("h200-vit-alone.json")
    options = " ".join(given["vit"])
    assert "--attention vllm,sdpa,cudnn,grouped" in options
    assert "--kinds pages,blocks" in options
    assert "--backends TRITON_ATTN,TORCH_SDPA" in options
    words = " ".join(" ".join(call) for call in given["calls"]).split()
    assert words.index("prepare") < words.index("vit")


@pytest.mark.parametrize("name", sorted(path.name for path in PLANS.glob("*.json")))
def test_a_plan_that_spies_names_one_of_its_variants_and_spies_once(name: str) -> None:
    """`spy` reads the plan's `spy` section: a variant the plan has, seconds and a rate; it
    runs once the stack is ready (`ready`), once, as a load of its own between or after the
    windows (the twenty-first pass's budget ran it before the last two)."""
    given = plan(name)
    words = " ".join(" ".join(call) for call in given["calls"]).split()
    if "spy" not in words:
        return
    assert words.count("spy") == 1
    assert given["spy"]["variant"] in [v["name"] for v in given["variants"]]
    assert given["spy"]["seconds"] > 0 < given["spy"]["rate"]
    assert words.index("spy") > words.index("ready")


def test_the_h200_plan_keeps_method_2s_rules() -> None:
    """Variants `default` (layout off) and `layout` (on), 3 windows each, >= 120 s and >= 10
    mean latencies, 10-s bins; every wheel part received once; calls within 600 s."""
    given = plan("h200-method2.json")
    assert [(v["name"], v["layout"]) for v in given["variants"]] == [
        ("default", "off"), ("layout", "on")]  # fmt: skip
    assert given["windows"] >= 3
    assert given["window"]["seconds"] >= 120
    assert given["window"]["latencies"] >= 10
    assert given["window"]["bin_s"] == 10
    parts = [int(call[0].split()[1]) for call in given["calls"] if call[0].startswith("receive")]
    assert sorted(parts) == list(range(1, 50))  # 49 parts of 36 MiB of the 1,755 MiB set
    # the last part (27 MiB) travels alone: `.whl` (11 MiB) goes with the install's call
    assert next(call for call in given["calls"] if "install" in call)[0] == "install"
    assert given["limit_s"] < 600
    assert given["host"]["profile"] == "h200-141gb"


@pytest.mark.parametrize("name", ["h200-layout-graphs.json", "h100-layout-graphs.json"])
def test_the_layout_graphs_plans_need_no_wheel_parts_and_alternate_their_settings(
    name: str,
) -> None:
    """The layout service alone: `install-layout` first (no vLLM, no `receive`), its checkpoint
    alone, as shipped against --no-cuda-graphs in A B B A A B, windows as method 2's."""
    given = plan(name)
    stages = [stage for call in given["calls"] for stage in call]
    assert stages[:2] == ["install-layout", "prepare"]
    assert not any(stage.startswith(("receive", "install ", "up", "window")) for stage in stages)
    assert "model" not in given["host"]
    assert [s for s in stages if s.startswith("alone")] == [f"alone {i}" for i in range(6)]
    assert given["alone"]["services"]["eager"][-1] == "--no-cuda-graphs"
    assert "--no-cuda-graphs" not in given["alone"]["services"]["default"]
    assert method.order(list(given["alone"]["services"]), given["alone"]["windows"]) == [
        "default", "eager", "eager", "default", "default", "eager"]  # fmt: skip
    assert given["window"]["seconds"] >= 120
    assert given["window"]["latencies"] >= 10


def test_the_harness_imports_with_the_standard_library_alone() -> None:
    """`bench.gpu.run` starts on a bare host, before its `install` stage has put anything there
    (the nineteenth pass's first install call failed on orjson, imported by way of reads.py):
    it imports with no site-packages at all."""
    code = "import sys; sys.path.insert(0, sys.argv[1]); import bench.gpu.run"
    done = subprocess.run([sys.executable, "-S", "-c", code, str(PLANS.parents[2])],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr


def window_file(res: Path, name: str, rate_clients: int) -> None:
    """A window's JSON as bench.gpu.load writes it, from a closed loop made to order."""
    records = [Record(w, s / 2, s / 2 + 2.0, "200") for w in range(rate_clients)
               for s in range(w % 4, 400, 4)]  # fmt: skip
    found = method.window(records, 10.0, 150.0, latencies=5.0)
    (res / f"{name}.json").write_text(json.dumps({"name": name} | found))


def test_the_report_writes_the_summary_and_the_median_against_each_floor(
    tmp_path: Path,
) -> None:
    """Three windows per variant and a layout-alone window in RES: STEM.json is issue 50's
    shape (each variant with its own floor), STEM.md states the median window and its ratio."""
    given = plan("h200-method2.json")
    res, out = tmp_path / "res", tmp_path / "out"
    res.mkdir()
    for index, turn in enumerate(method.order(["default", "layout"], 3)):
        window_file(res, f"{index:02d}-{turn}", 8 if turn == "default" else 4)
    for index, setting in enumerate(method.order(["default", "eager"], 2)):
        window_file(res, f"alone-{index:02d}-{setting}", 16 if setting == "default" else 8)
    for variant, ms in (("whole", 25.0), ("blocks", 40.0)):
        floor = {"ms_per_page": ms, "definition": "d", "machine": {"gpu": "NVIDIA H200"}}
        (res / f"floor-{variant}.json").write_text(json.dumps(floor))
    summary = report.write(given, res, out)
    assert json.loads((out / "gpu-h200-method2.json").read_text()) == summary
    assert summary["gpu"] == "NVIDIA H200"
    assert summary["floor"] == {"ms_per_page": 25.0, "definition": "d"}
    found = [(v["name"], v["floor_ms_per_page"], len(v["windows"])) for v in summary["variants"]]
    assert found == [("default", 25.0, 3), ("layout", 40.0, 3)]
    assert summary["layout_service_alone_pages_per_s"] == pytest.approx(8.0, rel=0.05)
    by_setting = summary["layout_service_alone_by_setting"]
    assert by_setting["eager"]["pages_per_s_by_count"] == pytest.approx(4.0, rel=0.05)
    assert by_setting["eager"]["flags"][-1:] == ["--no-cuda-graphs"]
    text = (out / "gpu-h200-method2.md").read_text()
    assert "**4.00 pages/s** (median window by count" in text
    assert "**10.0 %** of its floor" in text  # 4 pages/s x 25 ms
    assert "Layout service alone, eager (--max-batch 8 --no-cuda-graphs): 4.00" in text


def test_the_report_puts_the_engines_reads_beside_each_window(tmp_path: Path) -> None:
    """Two windows with the window stage's check in their JSON: the table gives requests /
    pages and cache hits, marks the one the cache answered, and the figure says whether the
    engines read every page."""
    given = plan("h200-method2.json") | {"variants": plan("h200-method2.json")["variants"][:1],
                                         "alone_pass": None}  # fmt: skip
    res, out = tmp_path / "res", tmp_path / "out"
    res.mkdir()
    for index in range(2):
        window_file(res, f"0{index}-default", 8)
        window = res / f"0{index}-default.json"
        hits, fault = 2 * index, "the results cache answered 2 pages" if index else None
        reads = {"engine_completions": 5 - hits, "engine_aborts": 0, "cache_hits": hits,
                 "pages_answered": 5, "fault": fault}  # fmt: skip
        window.write_text(json.dumps(json.loads(window.read_text()) | {"engine_reads": reads}))
    summary = report.write(given, res, out)
    first, second = summary["variants"][0]["engine_reads"]
    assert (first["engine_completions"], first["pages_answered"], first["fault"]) == (5, 5, None)
    assert second["fault"] == "the results cache answered 2 pages"
    text = (out / f"{given['stem']}.md").read_text()
    assert "| 5 / 5, 0 |" in text
    assert "| 3 / 5, 2 (**not the engines'**) |" in text
    assert "the engines read every page: False." in text


@pytest.mark.parametrize("name", ["vit-attention.json", "vit-attention-fused-rotary.json"])
def test_the_report_tables_the_vit_attention_and_names_the_fastest_within_bounds(
    tmp_path: Path, name: str
) -> None:
    """encoder_check's JSON in RES (and no floor), as the `vit` stage names it (or as the
    twenty-third pass's did, with the fused rotary opt-in then): the summary's `vit_attention`
    has each batch's ms per line and the fastest line within bounds (a faster one out of bounds
    is not it), the GPU named from the check's machine; STEM.md tables them, each
    line's distance from the stock where not 0, and which rotary the plugin ran."""
    given = plan("h200-vit-alone.json")
    res, out = tmp_path / "res", tmp_path / "out"
    res.mkdir()
    mode = {"within": True, "max_rel": 0.0}
    batches = [
        {"kind": "pages", "images": 8, "patches": 40320, "stock_ms": 200.0,
         "modes": {"vllm": mode | {"ms": 150.0}, "cudnn": mode | {"ms": 170.0}},
         "backends": {"TORCH_SDPA": mode | {"ms": 280.0}}},
        {"kind": "blocks", "images": 8, "patches": 10144, "stock_ms": 300.0,
         "modes": {"vllm": mode | {"ms": 36.0, "max_abs": 7.5},
                   "cudnn": {"within": False, "ms": 20.0}},
         "backends": {"TORCH_SDPA": mode | {"ms": 230.0}}},
    ]  # fmt: skip
    vit = {
        "machine": {"gpu": "NVIDIA H200"},
        "stock_attention": "FLASH_ATTN",
        "batches": batches,
        "fused_rotary": True,
    }
    (res / name).write_text(json.dumps(vit))
    summary = report.write(given, res, out)
    assert summary["gpu"] == "NVIDIA H200"
    rows = summary["vit_attention"]
    assert [(r["kind"], r["fastest"]) for r in rows] == [("pages", "plugin vllm"),
                                                        ("blocks", "plugin vllm")]  # fmt: skip
    assert rows[1]["out_of_bounds"] == ["plugin cudnn"]
    assert rows[0]["ms"] == {"stock FLASH_ATTN": 200.0, "plugin vllm": 150.0,
                             "plugin cudnn": 170.0, "vllm TORCH_SDPA": 280.0}  # fmt: skip
    text = (out / f"{given['stem']}.md").read_text()
    assert "| blocks | 8 | 10144 | 300.00 | 36.00 (7.5) | 20.00 ! | 230.00 | plugin vllm |" in text
    assert "| pages | 8 | 40320 | 200.00 | 150.00 | 170.00 | 280.00 | plugin vllm |" in text
    assert "the plugin's rotary: the plugin's fused" in text


def gauges_file(path: Path, allocated: float, max_allocated: float, max_reserved: float) -> None:
    """The layout service's memory gauges in /metrics text (MiB given, bytes written)."""
    lines = [
        "# HELP ocrvl_layout_gpu_memory_bytes torch's CUDA allocator in this process",
        f'ocrvl_layout_gpu_memory_bytes{{kind="allocated"}} {allocated * 2**20:e}',
        f'ocrvl_layout_gpu_memory_bytes{{kind="max_allocated"}} {max_allocated * 2**20:e}',
        f'ocrvl_layout_gpu_memory_bytes{{kind="reserved"}} {max_reserved * 2**20:e}',
        f'ocrvl_layout_gpu_memory_bytes{{kind="max_reserved"}} {max_reserved * 2**20:e}',
        "ocrvl_layout_pages_total 10.0",
    ]
    path.write_text("\n".join(lines) + "\n")


def test_the_report_gives_each_layout_settings_gpu_memory_from_its_gauges(
    tmp_path: Path,
) -> None:
    """Two windows of each setting with the gauges read before and after: the most reserved and
    allocated over its windows, and what it held at rest before its first; STEM.md says them."""
    given = plan("h200-layout-graphs.json")
    res, out = tmp_path / "res", tmp_path / "out"
    res.mkdir()
    at_rest = {"default": 542.0, "eager": 97.0}
    for index, setting in enumerate(method.order(["default", "eager"], 2)):
        name = f"alone-{index:02d}-{setting}"
        window_file(res, name, 8)
        top = 5000.0 + 100 * index if setting == "default" else 4000.0
        gauges_file(res / f"{name}.metrics-before.txt", at_rest[setting], 3000.0, top - 50)
        gauges_file(res / f"{name}.metrics-after.txt", at_rest[setting], 3200.0, top)
    summary = report.write(given, res, out)
    by_setting = summary["layout_service_alone_by_setting"]
    assert by_setting["default"]["gpu_memory_mib"] == {
        "max_reserved": pytest.approx(5300.0), "max_allocated": pytest.approx(3200.0),
        "allocated_at_rest": pytest.approx(542.0)}  # fmt: skip
    assert by_setting["eager"]["gpu_memory_mib"]["max_reserved"] == pytest.approx(4000.0)
    text = (out / f"{given['stem']}.md").read_text()
    assert "5,300 reserved at most, 3,200 allocated at most, 542 allocated at rest" in text


def test_a_pass_without_the_layout_service_alone_takes_its_earlier_pass_and_writes_strict_json(
    tmp_path: Path,
) -> None:
    """The method-2 plan's windows but no layout-alone window and no floor: the summary's
    layout-alone figures are those of the pass `alone_pass` names (committed under
    bench/results), with its raw tarball named; the floor not measured is null, not NaN."""
    given = plan("h200-method2.json")
    earlier = json.loads((PLANS.parents[2] / given["alone_pass"]).read_text())
    res, out = tmp_path / "res", tmp_path / "out"
    res.mkdir()
    for index, turn in enumerate(method.order(["default", "layout"], 3)):
        window_file(res, f"{index:02d}-{turn}", 8)
    summary = report.write(given, res, out)
    strict = json.loads((out / "gpu-h200-method2.json").read_text(), parse_constant=pytest.fail)
    assert strict == summary
    assert summary["floor"]["ms_per_page"] is None
    assert summary["layout_service_alone_pages_per_s"] == (
        earlier["layout_service_alone_by_setting"]["default"]["pages_per_s_by_count"])  # fmt: skip
    assert summary["layout_service_alone_from"] == earlier["raw"]
    assert (PLANS.parents[1] / "results" / earlier["raw"]).exists()
    text = (out / "gpu-h200-method2.md").read_text()
    assert f"measured in a pass of its own: {earlier['raw']}" in text


def test_the_spy_stage_ranks_processes_threads_and_frames_by_the_cores_they_kept_busy() -> None:
    """py-spy's raw stacks (py-spy 0.4.3's format with --subprocesses --threads, fixed here as
    the input): a line's last `process` is its own; a thread's samples over rate x seconds are
    the cores it kept busy; innermost frames add up across lines, line numbers dropped."""
    root, api, core = 'process 10:"bash serve.sh"', 'process 20:"APIServer_0"', 'process 30:"Core"'
    raw = "\n".join([
        f"{root};{api};thread (20): MainThread;run (asyncio.py:6);call (image.py:40) 120",
        f"{root};{api};thread (20): MainThread;run (asyncio.py:6);call (image.py:41) 60",
        f"{root};{api};thread (21): Thread-1;detokenize (detok.py:5) 30",
        f"{root};{api};{core};thread (30): MainThread;step (core.py:99) 45",
        "a line that is no stack",
    ])  # fmt: skip
    found = run.busiest(raw, whole=10 * 3)  # 30 samples: one core busy all along
    assert [row["process"] for row in found] == ['20:"APIServer_0"', '30:"Core"']
    assert [row["cores"] for row in found] == [7.0, 1.5]
    assert found[0]["threads"] == {"thread (20): MainThread": 6.0, "thread (21): Thread-1": 1.0}
    assert found[0]["self"] == [("call (image.py)", 180), ("detokenize (detok.py)", 30)]
    assert found[1]["self"] == [("step (core.py)", 45)]


def test_collect_tars_a_log_that_a_restart_cuts_short_while_it_is_tarred(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The twenty-second pass's `up` ended in OSError: collect tarred the engine's log while the
    new engine truncated it. Each log now goes in as the bytes read before its header: the file
    cut short after that (here inside gettarinfo, as the restart did) changes nothing."""
    import tarfile  # noqa: PLC0415

    monkeypatch.setattr(run, "WORK", tmp_path / "work")
    (tmp_path / "work" / "serve-logs").mkdir(parents=True)
    log = tmp_path / "work" / "serve-logs" / "vllm-8118.log"
    log.write_text("the previous engine's log\n" * 100)
    stat = tarfile.TarFile.gettarinfo

    def then_truncated(self: tarfile.TarFile, *args: Any, **kwargs: Any) -> Any:
        info = stat(self, *args, **kwargs)
        if info.name == "logs/vllm-8118.log":
            log.write_text("")  # the new engine opens its log for writing
        return info

    monkeypatch.setattr(tarfile.TarFile, "gettarinfo", then_truncated)
    given = plan("h100-diagnose.json") | {"host": {"results": str(tmp_path / "res"), "ports": 0}}
    run.Pass(given, tmp_path / "out").collect()
    with tarfile.open(tmp_path / "out" / f"{given['stem']}-raw.tar.gz") as tar:
        member = tar.extractfile("logs/vllm-8118.log")
        assert member is not None
        assert member.read() == b"the previous engine's log\n" * 100


def test_the_report_gives_each_variant_its_own_windows_when_one_name_ends_another(
    tmp_path: Path,
) -> None:
    """The encoder plans' variants `layout`, `fused-layout` and `graphs-layout`: each takes only
    its own window (NN-NAME.json), not the others' whose names end with its own."""
    given = plan("h100-encoder.json")
    res, out = tmp_path / "res", tmp_path / "out"
    res.mkdir()
    names = [v["name"] for v in given["variants"]]
    assert names == ["default", "layout", "fused", "fused-layout", "graphs", "graphs-layout"]
    for index, name in enumerate(method.order(names, given["windows"])):
        window_file(res, f"{index:02d}-{name}", 4 + index)
    summary = report.write(given, res, out)
    found = {v["name"]: len(v["windows"]) for v in summary["variants"]}
    assert found == dict.fromkeys(names, 1)


def test_a_pass_without_a_floor_or_with_a_variant_unread_says_so(tmp_path: Path) -> None:
    """The twenty-third pass: no floor, and two of six variants without a window. STEM.md says
    the floor was not measured and which variants had no window, and prints no NaN ratio."""
    given = plan("h100-encoder.json")
    res, out = tmp_path / "res", tmp_path / "out"
    res.mkdir()
    names = [v["name"] for v in given["variants"]]
    for index, name in enumerate(method.order(names, given["windows"])):
        if not name.endswith("-layout"):
            window_file(res, f"{index:02d}-{name}", 4 + index)
    report.write(given, res, out)
    text = (out / f"{given['stem']}.md").read_text()
    assert "nan" not in text
    assert text.count("Floor: not measured in this pass.") == 1 + 4
    assert "## fused-layout: no window in this pass" in text
    assert "## graphs-layout: no window in this pass" in text
    assert "of its floor" not in text


def test_a_pass_without_a_floor_names_its_gpu_from_the_windows_clocks(tmp_path: Path) -> None:
    """The twenty-fourth pass's report read GPU "?": no floor, no layout service alone. The
    windows' nvidia-smi rows (NN-VARIANT.gpu.csv, the GPU's name first) name it instead; with
    neither, "?" still."""
    given = plan("h100-encoder-graphs.json")
    res = tmp_path / "res"
    res.mkdir()
    for index, name in enumerate(method.order([v["name"] for v in given["variants"]], 1)):
        window_file(res, f"{index:02d}-{name}", 4 + index)
    assert report.gather(given, res)["summary"]["gpu"] == "?"
    header = "name, timestamp, clocks.current.sm [MHz], pstate\n"
    (res / "00-eager.gpu.csv").write_text(header)  # a load shorter than one row
    row = "NVIDIA H100 80GB HBM3, 2026/12/06 17:11:02.123, 1980 MHz, P0\n"
    (res / "01-graphs.gpu.csv").write_text(header + row)
    assert report.gather(given, res)["summary"]["gpu"] == "NVIDIA H100 80GB HBM3"


def test_ready_ends_when_the_stack_it_waits_for_has_exited_unreaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CPU rehearsal of plans/h100-engines.json: make serve exited at once (ENGINES=2 asks for
    MPS, which the CPU lacks) and `ready` waited out its deadline, since the exited child, never
    waited for, still answered `kill(pid, 0)`. `gone` knows such a zombie, and `ready` fails at
    once with the stack's log."""
    import os  # noqa: PLC0415

    monkeypatch.setattr(run, "WORK", tmp_path / "work")
    p = run.Pass(plan("h100-engines.json") | {"host": {"results": str(tmp_path / "res"),
                                                        "ports": 0}}, tmp_path / "out")  # fmt: skip
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "serve.log").write_text("make serve: MPS asked for\n")
    child = subprocess.Popen(["sh", "-c", "exit 2"])  # as `up` starts make serve
    (tmp_path / "work" / "serve.pid").write_text(str(child.pid))
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # it exited; unreaped, a zombie
    try:
        os.kill(child.pid, 0)  # what `ready` asked before: still "alive"
        assert run.gone(child.pid)
        with pytest.raises(RuntimeError, match="MPS asked for"):
            p.wait_ready("serve", "http://127.0.0.1:9/ready", 600)
    finally:
        assert child.wait() == 2
    assert run.gone(child.pid)  # reaped: no such process


def test_a_variant_with_its_own_settings_is_loaded_through_its_own_gateway(
    tmp_path: Path,
) -> None:
    """plans/h100-headroom.json alternates two gateway settings on one engine: each variant's
    `env` gets a gateway of its own (process, port), its windows go there, and the variants that
    name none keep the stack's gateways."""
    given = plan("h100-headroom.json")
    p = run.Pass(given | {"host": given["host"] | {"results": str(tmp_path / "res")}},
                 tmp_path / "out")  # fmt: skip
    assert run.own_gateways(p) == {
        "gateway-layout": (8021, {"OCRVL_SEQUENCE_HEADROOM": "0"}),
        "gateway-headroom": (8022, {"OCRVL_SEQUENCE_HEADROOM": "0.25"}),
    }
    layout, headroom = given["variants"]
    assert run.gateway(p, headroom) == "http://127.0.0.1:8022"
    assert run.gateway(p, layout) == "http://127.0.0.1:8021"
    assert method.order([v["name"] for v in given["variants"]], given["windows"]) == [
        "layout", "headroom", "headroom", "layout", "layout", "headroom"]  # fmt: skip
    whole = plan("h100-method2.json")
    p = run.Pass(whole | {"host": whole["host"] | {"results": str(tmp_path / "res")}},
                 tmp_path / "out")  # fmt: skip
    assert run.own_gateways(p) == {}
    assert [run.gateway(p, v) for v in whole["variants"][:2]] == [
        "http://127.0.0.1:8000", "http://127.0.0.1:8020"]  # fmt: skip
    engines = plan("h100-engines.json")  # one engine of two by its own gateway, both by serve's
    p = run.Pass(engines | {"host": engines["host"] | {"results": str(tmp_path / "res")}},
                 tmp_path / "out")  # fmt: skip
    assert run.own_gateways(p) == {
        "gateway-one": (8021, {"OCRVL_BACKENDS": "http://127.0.0.1:8118;capacity=256"})
    }
    assert [run.gateway(p, v) for v in engines["variants"]] == [
        "http://127.0.0.1:8021", "http://127.0.0.1:8000"]  # fmt: skip


def test_a_window_records_the_cpu_each_process_used_and_the_report_puts_it_per_token(
    tmp_path: Path,
) -> None:
    """`cpu_seconds` finds a busy child by its command line with the CPU it spent (user +
    system, from /proc); a window's NN-VARIANT.cpu.json (the busiest processes, the engines'
    generated tokens) becomes the report's CPU milliseconds a token, the pid and the program's
    folder left out."""
    code = (
        "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\n"
        "print('spent', flush=True)\nsys.stdin.read()"
    )  # busy 0.5 s, then waits for us
    with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as busy:  # fmt: skip
        assert busy.stdout is not None
        assert busy.stdout.readline() == "spent\n"
        found = run.cpu_seconds()
        assert busy.stdin is not None
        busy.stdin.close()
    (name,) = [name for name in found if name.startswith(f"{busy.pid} ")]
    assert "process_time" in name
    assert 0.4 <= found[name] < 30  # /proc counts in clock ticks, sampled: a little under 0.5
    given = plan("cpu-stream-interval.json")
    res, out = tmp_path / "res", tmp_path / "out"
    res.mkdir()
    window_file(res, "00-interval-1", 8)
    spent = [[5.0, "41 VLLM::EngineCore"], [2.0, "42 /v/bin/python -m app.cli serve --port 8021"]]
    (res / "00-interval-1.cpu.json").write_text(json.dumps({"generated_tokens": 1000,
                                                            "cpu_s": spent}))  # fmt: skip
    report.write(given, res, out)
    text = (out / f"{given['stem']}.md").read_text()
    assert (
        "CPU ms a generated token, window 0's busiest processes: VLLM::EngineCore 5.00; "
        "python -m app.cli serve --port 8021 2.00."
    ) in text
    assert "## interval-8: no window in this pass" in text


def test_a_calls_neighbouring_windows_of_one_variant_run_as_one_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In A B B A A B, a call's `window 1 window 2` (B B) and `window 3 window 4` (A A) are one
    load each; windows of two variants, or out of order, are loads of their own; a load of two
    windows needs room for both and may take twice a window's cap."""
    given = plan("h100-stream-interval.json")
    p = run.Pass(given | {"host": given["host"] | {"results": str(tmp_path / "res")}},
                 tmp_path / "out")  # fmt: skip
    loads: list[list[int]] = []
    monkeypatch.setattr(run, "WORK", tmp_path / "work")  # no `prepare` there to wait for
    monkeypatch.setattr(run, "window", lambda _, indices: loads.append(indices))
    monkeypatch.setattr(run.Pass, "collect", lambda _: None)
    words = "window 0 window 1 window 2 window 3 window 4 window 5 window 2 window 1"
    assert run.stages(p, words.split()) == 0
    assert loads == [[0], [1, 2], [3, 4], [5], [2], [1]]
    rules = given["window"]
    assert run.room(p, ["01-b", "02-b"]) == 2 * rules["max_seconds"]
    p.began -= given["limit_s"] - 30 - 2 * rules["seconds"] - rules["ramp_s"] - 5
    assert run.room(p, ["01-b"]) is not None
    assert run.room(p, ["01-b", "02-b"]) is None


# Pass.start drops its Popen while the process runs on (as on the host): Python warns of it
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_prepare_writes_in_the_background_and_the_next_stage_but_floor_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`prepare` returns with its writers still running (the host's engine_python here: a fake
    that blocks on a FIFO until the test lets it go), `floor` would run beside them, and the
    next other stage waits for them, prints their log, and fails the call when one failed."""
    import os  # noqa: PLC0415

    monkeypatch.setattr(run, "WORK", tmp_path / "work")
    writer = tmp_path / "writer"  # `writer -m MODULE PATH ...` waits on the FIFO named MODULE
    model, layout = tmp_path / "tests.support.tiny_model", tmp_path / "bench.gpu.layout_checkpoint"
    for gate in (model, layout):
        os.mkfifo(gate)
    writer.write_text(f'#!/bin/sh\nread go < {tmp_path}/$2\necho "wrote $*"\n[ "$go" = ok ]\n')
    writer.chmod(0o755)
    host = {
        "results": str(tmp_path / "res"),
        "ports": 0,
        "engine_python": str(writer),
        "model": str(tmp_path / "model"),
        "layout_model": str(tmp_path / "layout"),
    }
    p = run.Pass(plan("h100-stream-interval.json") | {"host": host}, tmp_path / "out")

    def let(gate: Path, word: str) -> None:
        with gate.open("w") as go:  # blocks until that writer reads
            go.write(word + "\n")

    run.prepare(p)  # returns at once: the writers wait on their gates
    pid = int((tmp_path / "work" / "prepare.pid").read_text())
    assert not run.gone(pid)
    let(model, "ok")
    assert not run.gone(pid)  # the layout's writer still waits
    let(layout, "ok")
    run.prepared()
    assert run.gone(pid)
    out = capsys.readouterr().out
    assert "wrote -m tests.support.tiny_model" in out
    assert "wrote -m bench.gpu.layout_checkpoint" in out
    assert out.endswith("prepared\n")
    run.prepared()  # once waited for, nothing more to wait for
    assert capsys.readouterr().out == ""
    run.prepare(p)
    let(model, "broken")  # the model's writer fails: the layout's never starts
    with pytest.raises(RuntimeError, match="prepare failed"):
        run.prepared()


def test_the_engines_wrapper_gives_every_engine_the_common_flags_and_one_engine_its_own(
    tmp_path: Path,
) -> None:
    """serve.sh starts each engine as `VLLM_BIN serve MODEL ... --port PORT ...`: the host's
    wrapper (run.WRAPPER) adds BENCH_VLLM_ARGS to every one and BENCH_VLLM_ARGS_PORT to that
    port's alone, a JSON flag whole (brackets unglobbed). A fake `python3` on PATH prints the
    arguments it was given, one a line."""
    import os  # noqa: PLC0415

    (tmp_path / "python3").write_text('#!/bin/sh\nfor a; do echo "$a"; done\n')
    (tmp_path / "python3").chmod(0o755)
    wrapper = tmp_path / "vllm"
    wrapper.write_text(run.WRAPPER)
    wrapper.chmod(0o755)
    (tmp_path / "a[1]").touch()  # what `[1]` would glob to, were globbing on
    flag = '--compilation-config={"a":[1],"b":true}'
    env = os.environ | {"PATH": f"{tmp_path}:{os.environ['PATH']}", "BENCH_VLLM_ARGS": "--x 1",
                        "BENCH_VLLM_ARGS_8119": f"{flag} --y"}  # fmt: skip

    def args(*given: str) -> list[str]:
        done = subprocess.run([str(wrapper), *given], env=env, cwd=tmp_path, check=True,
                              capture_output=True, text=True)  # fmt: skip
        return done.stdout.splitlines()

    head = ["-m", "vllm.entrypoints.cli.main", "serve", "M", "--host", "127.0.0.1"]
    assert args("serve", "M", "--host", "127.0.0.1", "--port", "8118", "--config", "c y") == [
        *head, "--port", "8118", "--config", "c y", "--x", "1"]  # fmt: skip
    assert args("serve", "M", "--host", "127.0.0.1", "--port", "8119") == [
        *head, "--port", "8119", "--x", "1", flag, "--y"]  # fmt: skip
    assert args("--version") == ["-m", "vllm.entrypoints.cli.main", "--version", "--x", "1"]


def test_a_variant_that_names_its_engines_has_a_gateway_in_front_of_those_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """plans/h100-encoder-graphs.json runs two engines of make serve, one with vLLM's encoder
    CUDA graphs: each variant's gateway is given its own engine's URL as OCRVL_BACKENDS, and the
    stack's layout-first gateway keeps both."""
    given = plan("h100-encoder-graphs.json")
    monkeypatch.setattr(run, "WORK", tmp_path / "work")
    monkeypatch.setattr(run, "served_backends", lambda: "http://127.0.0.1:8118;capacity=256,"
                        "http://127.0.0.1:8119;capacity=256")  # fmt: skip
    p = run.Pass(given | {"host": given["host"] | {"results": str(tmp_path / "res")}},
                 tmp_path / "out")  # fmt: skip
    started: dict[str, dict[str, str]] = {}
    monkeypatch.setattr(p, "start", lambda name, command, **env: started.setdefault(name, env))
    monkeypatch.setattr(p, "wait_ready", lambda name, url, seconds: None)
    run.ready(p)
    backends = {name: env.get("OCRVL_BACKENDS") for name, env in started.items()}
    assert backends == {
        "standin": None,
        "layout-gateway": "http://127.0.0.1:8118;capacity=256,http://127.0.0.1:8119;capacity=256",
        "gateway-eager": "http://127.0.0.1:8118;capacity=256",
        "gateway-graphs": "http://127.0.0.1:8119;capacity=256",
    }
    assert given["host"]["serve_env"]["ENGINES"] == "2"
    assert "cudagraph_mm_encoder" in given["host"]["serve_env"]["BENCH_VLLM_ARGS_8119"]
    # 8118 without the CUDA graphs the profile records since this plan ran (as it then shipped)
    assert given["host"]["serve_env"]["BENCH_VLLM_ARGS_8118"] == "--compilation-config={}"


def test_the_whole_page_graphs_plan_reads_the_profiles_graphs_against_vllms_default() -> None:
    """plans/h100-graphs-whole.json: 8119 as the profile ships (its compilation-config, nothing
    on top), 8118 with vLLM's default graphs; both variants whole pages, each on its own engine."""
    given = plan("h100-graphs-whole.json")
    env = given["host"]["serve_env"]
    assert env["BENCH_VLLM_ARGS_8118"] == "--compilation-config={}"
    assert "BENCH_VLLM_ARGS_8119" not in env
    assert "compilation-config" not in env["BENCH_VLLM_ARGS"]
    assert given["host"]["profile"] == "h100-80gb"
    flags = yaml.safe_load((PLANS.parents[2] / "vllm_configs" / "h100-80gb.yaml").read_text())
    assert "cudagraph_mm_encoder" in flags["compilation-config"]
    engines = {v["name"]: (v["layout"], v["env"]["OCRVL_BACKENDS"]) for v in given["variants"]}
    assert engines == {
        "plain": ("off", "http://127.0.0.1:8118;capacity=256"),
        "graphs": ("off", "http://127.0.0.1:8119;capacity=256"),
    }


def test_the_floor_keeps_the_gpus_clocks_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The twenty-ninth pass could say the load's clocks but not the floor's: `floor` now runs
    the windows' nvidia-smi sampler beside both floors into RES/floor.gpu.csv, and stops it."""
    calls, pid = tmp_path / "calls", tmp_path / "sampler.pid"
    p = run.Pass(plan("h100-engines.json") | {"host": {"results": str(tmp_path), "ports": 0}},
                 tmp_path / "out")  # fmt: skip
    row = "NVIDIA H100 80GB HBM3, 1980 MHz"
    monkeypatch.setattr(run, "SMI", ["sh", "-c", f'echo $$ > {pid}; echo "name, clocks.sm"; '
                                     f'while :; do echo "{row}"; sleep 0.05; done'])  # fmt: skip
    fake = tmp_path / "python"  # corpus and floor: each call noted; a floor waits for a sample
    fake.write_text(f'#!/bin/sh\necho "$2 $6" >> {calls}\n[ "$2" = bench.gpu.floor ] || exit 0\n'
                    f"for i in $(seq 200); do grep -qs NVIDIA {p.res}/floor.gpu.csv && exit 0; "
                    "sleep 0.05; done; exit 1\n")  # at most 10 s without a sample  # fmt: skip
    fake.chmod(0o755)
    p.host |= {"python": str(fake), "engine_python": str(fake)}
    run.floor(p)
    assert calls.read_text().splitlines()[1:] == ["bench.gpu.floor whole", "bench.gpu.floor blocks"]
    rows = (p.res / "floor.gpu.csv").read_text().splitlines()
    assert rows[0] == "name, clocks.sm"
    assert row in rows[1:]
    assert run.gone(int(pid.read_text()))  # stopped with the stage, not left sampling


def test_a_stage_named_in_quotes_is_read_as_its_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python3 -m bench.gpu.run PLAN ready "window 0"` runs window 0: the thirty-first pass's
    call quoted it, and the harness took it for one unknown stage."""
    seen: list[list[str]] = []
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(run, "stages", lambda p, words: seen.append(words) or 0)
    assert run.main([str(PLANS / "h100-engines3.json"), "ready", "window 0"]) == 0
    call = plan("h100-engines3.json")["calls"].index(["ready", "window 0"])
    assert run.main([str(PLANS / "h100-engines3.json"), "--call", str(call)]) == 0
    assert seen == [["ready", "window", "0"], ["ready", "window", "0"]]


def test_spy_samples_the_gateway_its_variants_load_goes_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """plans/h200-method2.json's `layout` has settings of its own (the stream interval), so a
    gateway of its own: py-spy samples that gateway, the one its load goes to, not the stack's
    layout-first gateway, and make serve's processes and the stand-in beside it."""
    given = plan("h200-method2.json")
    assert given["host"]["serve_env"]["OCRVL_ENGINE_STREAM_INTERVAL"] == "8"  # make serve's
    assert given["variants"][1]["env"] == {"OCRVL_ENGINE_STREAM_INTERVAL": "8"}  # the layout's
    monkeypatch.setattr(run, "WORK", tmp_path / "work")
    run.WORK.mkdir()
    names = ("serve", "layout-gateway", "gateway-layout", "standin")
    for pid, name in enumerate(names, 100):
        (run.WORK / f"{name}.pid").write_text(f"{pid}\n")
    p = run.Pass(given | {"host": given["host"] | {"results": str(tmp_path / "res")}},
                 tmp_path / "out")  # fmt: skip
    commands: list[list[str]] = []

    class Recorded:  # a process that ends at once, its command kept
        def __init__(self, command: list[str], **_: Any) -> None:
            commands.append(command)

        def __enter__(self) -> Recorded:
            return self

        def __exit__(self, *_: object) -> None:
            return None

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(run.subprocess, "Popen", Recorded)
    monkeypatch.setattr(run.time, "sleep", lambda _: None)
    monkeypatch.setattr(p, "left", lambda: 600.0)
    monkeypatch.setattr(run, "served_backends", lambda: "http://127.0.0.1:8118;capacity=256")
    monkeypatch.setattr(run.reads, "fetch", lambda url, body: b"")  # vLLM's profiler, asked
    run.spy(p)
    load, *spied = commands
    assert load[load.index("bench.gpu.load") + 1] == run.gateway(p, given["variants"][1])
    assert run.gateway(p, given["variants"][1]) != p.url("layout_gateway")
    assert [command[command.index("--pid") + 1] for command in spied] == ["100", "102", "103"]
