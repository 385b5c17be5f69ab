"""The benchmark's mechanics on the toy family (random weights: speed-ups mean nothing here)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from mulo.engine import Engine
from mulo.eval import bench, costs, harness, sweeps
from tests.helpers import run_cli


@pytest.fixture(scope="module", autouse=True)
def quick_timings():
    """Timings settle in few, short rounds here: these tests check the mechanics, not the numbers."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(costs, "MIN_ROUND_S", 0.002)
        patch.setattr(costs, "MAX_ROUNDS", 8)
        yield


@pytest.fixture(scope="module")
def result(toy):
    return bench.run(Engine(toy), quick=True, n_prompts=2)


@pytest.mark.slow  # bench --quick on the toy family: ~30 s
def test_quick_table_has_every_label_and_the_contract_fields(result):
    assert list(result["methods"]) == bench.QUICK_LABELS
    for label, row in result["methods"].items():
        assert {"speedup", "nfe_speedup", "latency_s", "nfe", "acceptance", "fd", "adherence"} <= set(row), label
        assert set(row["nfe"]) == {"target", "drafter"}
    assert result["methods"]["ar"]["speedup"] == 1.0  # AR against itself, request by request
    assert result["methods"]["ar"]["nfe"] == {"target": 64.0, "drafter": 0.0}
    assert result["methods"]["mulo-v2-r4"]["nfe"]["drafter"] > 0
    for key in ("device", "dtype", "threads", "versions"):
        assert key in result
    assert result["verification_pass_s"] > 0


def test_tree_and_chain_rows_report_their_accepted_length(result):
    rows = result["methods"]
    eagle = rows["eagle2"]
    assert eagle["accepted_length"] >= 1 and 1 <= eagle["tree_size"] <= 59  # the default budget: 59 nodes
    assert rows["sd"]["accepted_length"] >= 1 and rows["sd"]["tree_size"] is None
    assert 1 <= rows["lantern"]["tree_size"] <= 59  # LANTERN verifies EAGLE-2's trees
    assert rows["ar"]["accepted_length"] is None and rows["mulo-v2-r2"]["tree_size"] is None
    assert "| tokens / round | tree nodes |" in bench.markdown(result)


def test_nfe_speedup_weights_drafter_passes_by_their_measured_step_cost(result):
    rows, cost = result["methods"], result["step_cost"]
    assert set(cost) == {"drafter_r2", "drafter_r4", "draft_model", "eagle_head"}
    assert all(c > 0 for c in cost.values())
    ar_passes = rows["ar"]["nfe"]["target"]
    assert rows["ar"]["nfe_speedup"] == 1.0
    assert rows["zipar"]["nfe_speedup"] == pytest.approx(ar_passes / rows["zipar"]["nfe"]["target"])
    pairs = {"sd": "draft_model", "eagle2": "eagle_head", "lantern": "eagle_head", "mulo-v2-r2": "drafter_r2"}
    pairs["mulo-v2-r4"] = "drafter_r4"
    for label, drafter in pairs.items():
        nfe = rows[label]["nfe"]
        assert rows[label]["nfe_speedup"] == pytest.approx(ar_passes / (nfe["target"] + nfe["drafter"] * cost[drafter]))
    assert "| NFE speed-up |" in bench.markdown(result) and "drafter_r4" in bench.markdown(result)


def test_cost_speedup_prices_every_pass_by_its_model_and_width(result):
    table, rows = result["pass_costs"], result["methods"]
    # only the buckets that price a pass the runs fed are timed, width 1 (the unit) always
    assert set(table["widths"]["target"]) <= {1, 2, 4, 8, 16, 32, 63}  # the toy's 8x8 grid feeds at most 63
    assert 63 in table["widths"]["target"]  # MuLo-SD's verification feeds the whole grid
    assert set(table["widths"]["drafter_r4"]) <= {1, 2, 3} and 1 in table["widths"]["drafter_r4"]  # a 2x2 grid
    assert set(table["widths"]) == {"target", "drafter_r2", "drafter_r4", "draft_model", "eagle_head"}
    assert all(t > 0 for seconds in table["seconds"].values() for t in seconds)
    assert rows["ar"]["cost_speedup"] == 1.0
    assert set(result["step_cost_spread"]) == set(table["widths"])
    assert "| cost speed-up |" in bench.markdown(result)
    assert "## Pass costs" in "\n".join(bench.cost_lines(table))


def test_a_request_costs_the_sum_of_its_passes_interpolated_between_buckets():
    priced = costs.PassCosts(
        widths={"target": [1, 2, 4], "drafter_r2": [1, 3]},
        seconds={"target": [1.0, 1.5, 3.5], "drafter_r2": [0.5, 1.5]},
        spread={"target": [0.0] * 3, "drafter_r2": [0.0] * 2},
    )
    assert priced.step("drafter_r2") == 0.5
    assert priced.relative("target", [3]).tolist() == [2.5]  # halfway between w=2 (1.5) and w=4 (3.5)
    assert priced.relative("target", [9]).tolist() == [3.5]  # beyond the widest bucket: its cost
    widths = {"target": [1, 1, 4], "drafter": [2, 2]}
    assert priced.request(widths, "drafter_r2") == 1 + 1 + 3.5 + 1.0 + 1.0
    assert priced.request(widths, None) == 5.5  # no drafter named: its passes are not priced


def test_only_the_buckets_that_price_a_fed_width_are_timed():
    every = costs.buckets(64)
    assert every == [1, 2, 4, 8, 16, 32, 63]
    assert costs.priced_buckets(every, []) == [1]  # the unit, always
    assert costs.priced_buckets(every, [1]) == [1]
    assert costs.priced_buckets(every, [8]) == [1, 8]
    assert costs.priced_buckets(every, [5, 40, 63]) == [1, 4, 8, 32, 63]  # each width's neighbours
    priced = costs.PassCosts({"target": every}, {"target": [w * 1.0 for w in every]}, {"target": [0.0] * 7})
    kept = costs.priced_buckets(every, [5, 40])
    pruned = costs.PassCosts({"target": kept}, {"target": [w * 1.0 for w in kept]}, {"target": [0.0] * len(kept)})
    assert pruned.relative("target", [5, 40]).tolist() == priced.relative("target", [5, 40]).tolist()


def test_stable_seconds_repeats_until_the_rounds_agree(monkeypatch):
    monkeypatch.setattr(costs, "MIN_ROUND_S", 0.0)
    ticks = iter([0.0] + [float(i) * 0.1 for i in range(1, 200)])  # every call takes exactly 0.1 s
    monkeypatch.setattr(costs.time, "perf_counter", lambda: next(ticks))
    seconds, spread = costs.stable_seconds(lambda: None)
    assert seconds == pytest.approx(0.1) and spread == pytest.approx(0.0)
    # rounds of one call each, taking 1 s and 2 s in turn: they never agree within 5 %
    steps = iter([0.0, 1.0, 0.0, 2.0] * 50)  # clock advance at each round's start and end
    clock = [0.0]

    def perf_counter():
        clock[0] += next(steps)
        return clock[0]

    monkeypatch.setattr(costs, "MAX_ROUNDS", 12)
    monkeypatch.setattr(costs.time, "perf_counter", perf_counter)
    _, spread = costs.stable_seconds(lambda: None)
    assert spread > costs.TOLERANCE  # reported, not hidden: it never settled


def test_ideal_bound_is_drafting_plus_one_pass(result):
    """ideal = AR's median latency / (median drafting time + one verification pass); of ideal =
    that bound / the method's latency: their product with the latency gives AR's back, and the
    bound is never below the verification pass alone."""
    row, ar = result["methods"]["mulo-v2-r2"], result["methods"]["ar"]
    bound = ar["latency_s"] / row["ideal_speedup"]
    assert row["fraction_of_ideal"] == pytest.approx(bound / row["latency_s"], rel=1e-9)
    assert bound >= result["verification_pass_s"] * (1 - 1e-9)
    assert "ideal_speedup" not in ar


def test_markdown_and_files(result, tmp_path):
    bench.save(result, tmp_path / "out", tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["methods"].keys() == result["methods"].keys()
    table = (tmp_path / "out" / "table.md").read_text()
    assert all(f"| {label} |" in table for label in bench.QUICK_LABELS)
    assert result["methods"]["eagle2"]["residuals_emptied"] == 0  # EAGLE-2's residual never empties
    assert "`eagle2`" not in table.split("|")[-1]
    lantern_row = {**result["methods"]["lantern"], "residuals_emptied": 2.5}
    emptied = {**result, "methods": {**result["methods"], "lantern": lantern_row}}
    assert "`lantern`: 2.5 rejections per image left the residual no mass" in bench.markdown(emptied)
    assert (tmp_path / "out" / "table.png").stat().st_size > 10_000
    sweep = {"pooling": [{"point": "k=0", "speedup": 1.5, "nfe_target": 40.0, "acceptance": 0.5, "reopened": 0.2}]}
    bench.write_results(tmp_path / "out", result, sweep, "python -m mulo bench --quick")
    text = (tmp_path / "out" / "RESULTS.md").read_text()
    assert "`python -m mulo bench --quick`" in text and "## Goals" in text and "mulo-v2-r2" in text
    assert "| k=0 | 1.50x | 40.0 | 0.500 | 0.200 |" in text and "sweep_pooling.png" in text
    assert "## Against the floor" in text and "| target | " in text.split("## Against the floor")[1]


def test_every_timed_pass_is_priced_against_its_floor(result):
    floor = result["floor"]
    assert floor["bandwidth_GBps"] > 0 and floor["matrix_GFLOPs"] > 0 and floor["batch"] == 2  # the toy's CFG 4
    for name, widths in result["pass_costs"]["widths"].items():
        rows = floor["models"][name]
        assert [r["width"] for r in rows] == widths, name
        for row, seconds in zip(rows, result["pass_costs"]["seconds"][name], strict=True):
            assert row["over_floor"] == pytest.approx(seconds / row["floor_s"])
    assert result["execution"] == "eager (compiling switched off)"  # the suite runs eagerly (conftest)
    # wide passes in float32 (conftest), said in the environment and the table's head; the machine named
    assert result["environment"]["wide_precision"] == "float32 (forced)"
    assert result["environment"]["machine"]["torch"] and "wide passes: float32 (forced)" in bench.markdown(result)


def test_a_pass_floor_counts_weights_kv_and_flops():
    from mulo.eval.floor import pass_floor
    from mulo.models.gpt import GPT, GPTConfig

    config = GPTConfig(
        dim=8,
        n_layer=1,
        n_head=2,
        vocab_size=4,
        max_seq_len=4,
        cond_len=1,
        cond_dim=1,
        cond_type="class",
        multiple_of=8,
    )
    model = GPT(config)
    # read whole: wqkv 24x8, wo 8x8, w1/w3 24x8 (ffn_hidden 24), w2 8x24, output 4x8, three norms of 8
    matrices = 24 * 8 + 8 * 8 + 3 * 24 * 8 + 4 * 8
    weights = 4 * (matrices + 3 * 8)
    kv = 2 * 1 * 2 * 2 * 4 * 4  # K and V, one layer, CFG batch 2, two heads of 4, float32: per slot
    step = pass_floor(model, config, batch=2, width=1, context=3, bytes_per_s=1e3, flops_per_s=1e9)
    assert step["bytes"] == weights + 3 * kv and step["bound"] == "memory"
    assert step["flops"] == 2 * 2 * matrices + 4 * 1 * 2 * 2 * 4 * 1 * 3
    assert step["floor_s"] == pytest.approx(step["bytes"] / 1e3)
    wide = pass_floor(model, config, batch=2, width=3, context=4, bytes_per_s=1e12, flops_per_s=1e3)
    assert wide["bound"] == "compute" and wide["floor_s"] == pytest.approx(wide["flops"] / 1e3)


def test_a_wide_pass_in_bf16_is_priced_at_the_bf16_matrix_rate(monkeypatch):
    """A pass whose layers ran in bfloat16 (mulo.wide) is held to the bf16 rate, not float32's: on
    a CPU with bf16 matrix units the float32 floor would flatter it several times over."""
    from types import SimpleNamespace

    from mulo import wide
    from mulo.eval import floor
    from mulo.models.gpt import GPT, GPTConfig

    config = GPTConfig(dim=8, n_layer=1, n_head=2, vocab_size=4, max_seq_len=256, cond_len=1, cond_dim=1,
                       cond_type="class", multiple_of=8)  # fmt: skip
    model = GPT(config)
    wide.attach([model], "bfloat16")  # forced: no timing, passes over 64 queries in bf16
    rates = {torch.float32: 1e9, torch.bfloat16: 4e9}
    monkeypatch.setattr(floor, "matrix_rate", lambda device, dtype=torch.float32: rates[dtype])
    monkeypatch.setattr(floor, "bandwidth", lambda device, mb: 1e15)  # every pass compute-bound
    family = SimpleNamespace(target=model, drafters={}, draft_model=None, eagle_head=None)
    engine = SimpleNamespace(family=family, make_config=lambda _: SimpleNamespace(guidance=1.0))
    out = floor.floors(engine, {"widths": {"target": [64, 128]}, "seconds": {"target": [1.0, 1.0]}})
    narrow, wide_row = out["models"]["target"]
    assert (narrow["precision"], wide_row["precision"]) == ("float32", "bfloat16")
    assert narrow["floor_s"] == pytest.approx(narrow["flops"] / 1e9)
    assert wide_row["floor_s"] == pytest.approx(wide_row["flops"] / 4e9)
    assert out["matrix_GFLOPs_bfloat16"] == pytest.approx(4.0)
    text = "\n".join(floor.floor_lines(out))
    assert "bfloat16 matrix rate 4 GFLOP/s" in text and "x bf16)" in text.split("| target |")[1]
    wide.attach([model], "float32")  # all float32: no bf16 rate measured or named
    out = floor.floors(engine, {"widths": {"target": [64, 128]}, "seconds": {"target": [1.0, 1.0]}})
    assert "matrix_GFLOPs_bfloat16" not in out and "bf16" not in "\n".join(floor.floor_lines(out))


def test_family_without_a_method_skips_it_with_the_reason(toy):
    engine = Engine(toy)
    draft_model, toy.draft_model = toy.draft_model, None
    try:
        assert "draft model" in harness.runnable(engine, "sd")
        out = bench.run(engine, n_prompts=1, labels=["ar", "sd", "mulo-v2-r2"])
    finally:
        toy.draft_model = draft_model
    assert "sd" in out["skipped"] and "sd" not in out["methods"]


def test_sweep_points_cover_the_ablations_and_run(toy, tmp_path):
    names = set(sweeps.sweep_points(toy.vocab_size))
    assert names == {"tau", "pooling", "rejection", "resampling", "upsampler", "rows_per_block", "gsd_group"}
    rows = sweeps.run_all(Engine(toy), n_prompts=1, out_dir=tmp_path, names=["rejection"])["rejection"]
    assert [r["point"] for r in rows] == ["raster", "local l=0", "local l=1", "local l=2", "local l=3"]
    # Raster rejection re-opens everything after the first rejection: never less than local l=0.
    assert rows[0]["reopened"] >= rows[1]["reopened"]
    assert (tmp_path / "sweep_rejection.png").exists() and (tmp_path / "sweep_rejection_images.png").exists()


def test_a_sweep_point_that_drafts_nothing_has_no_acceptance(toy):
    """AR drafts nothing: its acceptance is None (shown blank), not 0; MuLo-SD at tau 1.01 drafts and
    rejects every draft: 0. (The sweeps once counted a missing acceptance as 0.)"""
    points = [("plain", "ar", {}), ("reject all", "mulo-v2-r2", {"tau": 1.01})]
    rows = sweeps.run_sweep(Engine(toy), points, [("red apple", "red apple")], None)
    assert [(r["point"], r["acceptance"]) for r in rows] == [("plain", None), ("reject all", 0.0)]


def test_aggregate_keeps_a_missing_number_missing():
    image = torch.zeros(2, 2, 3, dtype=torch.uint8).numpy()
    ar = [harness.Measured(1.0, 64, 0, None, 0.0, 8, 0.0, image) for _ in range(2)]
    mixed = [
        harness.Measured(0.5, 20, 10, 0.5, 0.2, 3, 0.1, image),
        harness.Measured(0.25, 30, 10, None, 0.4, 5, 0.1, image),  # a request that drafted nothing
    ]
    row = harness.aggregate(mixed, ar)
    assert row["speedup"] == 3.0 and row["nfe"] == {"target": 25.0, "drafter": 10.0}
    assert row["acceptance"] == 0.5  # the mean of the requests that drafted
    assert harness.aggregate(ar)["acceptance"] is None and harness.aggregate(ar)["speedup"] is None
    assert row["fd"] is None and row["adherence"] is None  # no quality metrics given


def test_pooling_sweep_fits_the_codebook():
    """k must stay below the codebook size (the 32-code twemoji VQ rejects k = 32 and 128)."""
    assert sweeps.pooling_ks(512) == [0, 8, 32, 128]
    assert sweeps.pooling_ks(32) == [0, 1, 2, 8]
    assert sweeps.pooling_ks(4) == [0, 1]
    points = sweeps.sweep_points(32)["pooling"]
    assert [p[2]["k"] for p in points] == [0, 1, 2, 8]


def test_cli_rejects_unknown_labels_in_one_line():
    proc = run_cli("bench", "--family", "toy", "--methods", "ar,eagle")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "unknown method label(s) eagle" in proc.stderr


@pytest.mark.parametrize(
    "argv, env, mode",
    [
        (["--quick"], None, "cached"),  # a cold cache never compiles for a 1.5 min look
        ([], None, "auto"),  # the full table is timed compiled
        (["--quick", "--compile", "on"], None, "on"),
        (["--quick"], "off", "auto"),  # MULO_COMPILE still rules, through auto
    ],
)
def test_quick_bench_runs_the_packages_already_built_unless_told_otherwise(monkeypatch, argv, env, mode):
    import mulo.__main__ as cli
    import mulo.engine

    class Stop(Exception):
        pass

    seen = {}

    def engine(family, compile, wide_precision):  # records the mode, then stops before any run
        seen["compile"] = compile
        raise Stop

    monkeypatch.setattr(mulo.engine, "Engine", engine)
    if env is None:
        monkeypatch.delenv("MULO_COMPILE", raising=False)
    else:
        monkeypatch.setenv("MULO_COMPILE", env)
    with pytest.raises(Stop):
        cli.main(["bench", "--family", "toy", *argv])
    assert seen["compile"] == mode


def test_a_bench_says_how_many_pass_shapes_ran_eagerly_for_want_of_packages():
    from types import SimpleNamespace as NS

    def engine(*missing_sets, ran=True):  # a model's shapes not built, and whether any ran compiled
        models = [NS(compiled=NS(missing=m, runs={(1, 1): "package"} if ran else {})) for m in missing_sets]
        models.append(NS(compiled=None))  # a model left eager (not compiled at all) counts nothing
        return NS(compilation="compiled steps", family=NS(name="scenes", transformers=lambda: models))

    assert bench.execution(engine(set())) == "compiled steps"
    said = bench.execution(engine({(1, 4), (1, "sampled")}, {(2, 1)}))
    assert said.startswith("compiled steps where built; 3 pass shape(s) not built ran eagerly")
    assert "python -m mulo compile --family scenes" in said
    cold = bench.execution(engine({(1, 4), (1, "sampled")}, {(2, 1)}, ran=False))  # a cold cache: all eager
    assert cold.startswith("eager: no package built for its 3 pass shape(s)") and "compile --family scenes" in cold


def test_ar_dtok_cost_profile_runs_on_tiny_shapes():
    from mulo.eval.profile import profile

    rows = profile(
        "test-tiny", sides=(4, 8), device="cpu", dtype=torch.float32, repeats=2, cond_len=9, cond_dim=16, vocab=64
    )
    assert [r["tokens"] for r in rows] == [16, 64]
    assert all(r["step_s"] > 0 and r["verify_s"] > 0 for r in rows)


def test_goal_verdicts_need_both_speed_ups_ar_quality_and_the_papers_ordering():
    ar = {"speedup": 1.0, "nfe_speedup": 1.0, "fd": 1.0, "adherence": 0.80}

    def verdict(mulo: dict, **baselines) -> str:
        rows = {"ar": ar, "mulo-v2-r2": {"fd": 1.05, "adherence": 0.79, **mulo}, **baselines}
        (line,) = bench.goal_lines({"methods": rows})
        return line

    fast = {"speedup": 1.7, "nfe_speedup": 2.1}
    assert verdict(fast).endswith("**met**")
    assert verdict({"speedup": 1.5, "nfe_speedup": 2.1}).endswith("**NOT met**")  # wall clock short
    assert verdict({"speedup": 1.7, "nfe_speedup": 1.9}).endswith("**NOT met**")  # NFE short
    assert verdict({**fast, "adherence": 0.70}).endswith("**NOT met**")  # quality lost
    # A faster baseline counts only at AR's quality: ZipAR at 2.0x and adherence 0.5 does not.
    zipar_blurry = {"speedup": 2.0, "fd": 1.0, "adherence": 0.5}
    line = verdict(fast, zipar=zipar_blurry, sd={"speedup": 1.2, "fd": 1.0, "adherence": 0.8})
    assert line.endswith("**met**") and "ahead of sd" in line
    line = verdict(fast, zipar={**zipar_blurry, "adherence": 0.79})
    assert "not ahead of zipar" in line and line.endswith("**NOT met**")


def test_the_eager_ar_runs_the_tables_prompts_and_seeds_on_a_copy_of_the_family(toy):
    engine = Engine(toy)
    assert bench.eager_ar(engine, [("red apple", "red apple")]) is None  # eager already: nothing to compare
    engine.compilation = "compiled steps"  # as on a CPU with a C++ compiler
    prompts = [("red apple", "red apple"), ("cat face", "cat face")]
    compiler = engine.family.target.compiled = object()  # marks the table's model: the copy must not touch it
    eager = bench.eager_ar(engine, prompts, warmup=0)
    assert engine.family.target.compiled is compiler
    engine.family.target.compiled = None
    table = harness.run(engine, harness.runs_of(["ar"]), prompts)["ar"]
    assert len(eager) == 2
    for e, t in zip(eager, table, strict=True):
        assert (e.image == t.image).all()  # the same request: same prompt, same seed, same tokens


def test_each_row_reports_its_speed_up_over_the_eager_ar(toy, monkeypatch):
    def eager_slow(engine, prompts, warmup=1):  # an eager AR taking 1,000 s an image
        return [
            dataclasses.replace(r, latency=1e3) for r in harness.run(engine, harness.runs_of(["ar"]), prompts)["ar"]
        ]

    monkeypatch.setattr(bench, "eager_ar", eager_slow)
    rows, _, _ = bench.run_table(Engine(toy), [("red apple", "red apple")], ["ar", "zipar"], None, warmup=0)
    for label, row in rows.items():
        assert row["speedup_vs_eager_ar"] == pytest.approx(1e3 / row["latency_s"]), label
    table = bench.markdown({**bench_result_stub(), "methods": rows})
    assert "| vs eager AR |" in table and f"| {1e3 / rows['zipar']['latency_s']:.2f}x |" in table
    assert "| vs eager AR |" not in bench.markdown(
        {**bench_result_stub(), "methods": {"ar": {**rows["ar"], "speedup_vs_eager_ar": None}}}
    )


def bench_result_stub() -> dict:
    env = {"family": "toy", "device": "cpu", "dtype": "float32", "threads": 1}
    return {"environment": env, "prompts": 1, "verification_pass_s": 0.01, "step_cost": {}, "step_cost_spread": {}}
