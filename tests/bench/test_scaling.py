"""The scaling model (bench.cost_model, cost_fit, scaling, predict): its formulas
on cases with known answers, the fit of alpha-beta from a sweep, the engine's
bucket plan, gradient bytes of a known model, and the step model. The
binary's table and plot are tests/bin/test_predict_scaling.py."""

import json
import math
import subprocess
import sys

import pytest

from tfloop.bench import cost_fit, cost_model, links, predict, published, scaling
from tfloop.bench.cost_model import Topology, Unavailable
from tfloop.bench.links import Link, ScalingError
from tfloop.collectives import bucketing

UNIT = Link("unit", bandwidth=1.0, latency=1.0, source="test")
FREE = Link("free", bandwidth=1.0, latency=0.0, source="test")


@pytest.mark.parametrize("p", [2, 3, 4, 8, 64])
def test_ring_moves_2_p_minus_1_over_p_of_the_bytes_in_2_p_minus_1_steps(p):
    cost = cost_model.ring(Topology(p, p, UNIT))
    assert cost.per_byte == pytest.approx(2 * (p - 1) / p)  # nccl-tests' busbw factor
    assert cost.latency == 2 * (p - 1)
    # NCCL's ring moves the same bytes, on top of its base latency.
    nccl = cost_model.nccl_ring(Topology(p, p, UNIT))
    assert nccl.per_byte == pytest.approx(cost.per_byte)
    assert nccl.latency == pytest.approx(cost_model.NCCL_BASE_LATENCY + 2 * (p - 1))


def test_copy_collectives_load_one_device_link():
    # hierarchical copy: the summing device's link carries (p-1) S in sequence, 3 steps;
    # reduce to one device: 2 (p-1) S, 2 steps.
    assert cost_model.hierarchical_copy(Topology(8, 8, UNIT)) == cost_model.AllReduceCost(
        3.0, 7.0, "hierarchical copy")
    assert cost_model.reduce_to_one_device(Topology(8, 8, UNIT)).per_byte == 14.0
    with pytest.raises(Unavailable, match="even device count, not 3"):
        cost_model.hierarchical_copy(Topology(3, 3, UNIT))
    with pytest.raises(Unavailable, match="span 2 hosts"):
        cost_model.reduce_to_one_device(Topology(16, 8, UNIT, UNIT))


def test_multi_host_ring_crosses_hosts_at_the_network_link():
    slow = Link("net", bandwidth=0.25, latency=10.0, source="test")
    topo = Topology(16, 8, UNIT, slow)
    ring = cost_model.ring(topo)  # 30 steps, 2 of them between the two hosts
    assert ring.latency == 28 * 1.0 + 2 * 10.0
    assert ring.per_byte == pytest.approx((30 / 16) / 0.25)
    # Two-level: 2(g-1) intra + 2(m-1) network steps; each host's cards carry S once per way.
    two = cost_model.two_level(Topology(16, 8, UNIT, slow, nics_per_host=2))
    assert two.latency == 14 * 1.0 + 2 * 10.0
    assert two.per_byte == pytest.approx(14 / 8 / 1.0 + 1.0 / (2 * 0.25))
    with pytest.raises(ScalingError, match="name the link between hosts"):
        Topology(16, 8, UNIT)


def test_tree_beats_ring_on_small_messages_over_many_hosts_and_ring_the_large_ones():
    topo = Topology(1024, 8, links.intra("nvlink3"), links.inter("ib_hdr"), nics_per_host=8)
    tree, ring = cost_model.nccl_tree(topo), cost_model.nccl_ring(topo)
    assert tree.latency < ring.latency / 10  # log2(128) network steps against 2(m-1)
    assert tree.per_byte > ring.per_byte  # 0.46 of the bus bandwidth against about 0.5
    crossover = cost_model.crossover_bytes(tree, ring)
    assert 1 << 20 < crossover < 1 << 34
    assert cost_model.seconds("nccl", topo, crossover / 100)[1] == "nccl tree"
    assert cost_model.seconds("nccl", topo, crossover * 100)[1] == "nccl ring"
    # One host, two devices: the ring's two steps cost less than the tree's.
    two = Topology(2, 8, links.intra("nvlink3"))
    assert cost_model.seconds("nccl", two, 1 << 30)[1] == "nccl ring"
    assert cost_model.seconds("nccl", Topology(1, 8, UNIT), 1 << 20) == (0.0, "none (one device)")


def test_a_buckets_latency_term_and_the_engines_plan():
    sizes = [1000] * 8
    assert scaling.Choice("ring").buckets(sizes) == sizes  # unpacked: one per gradient
    assert scaling.Choice("ring", num_packs=2).buckets(sizes) == [4000, 4000]
    assert scaling.Choice("ring", pack_bytes=3000).buckets(sizes) == [3000, 3000, 2000]
    # A gradient of at least the target travels alone; the small ones around it share.
    assert bucketing.plan_buckets([10, 5000, 10, 10], pack_bytes=100) == [[0, 2, 3], [1]]
    parts = [scaling.Part(latency=2.0, transfer=1.0, algorithm="a", basis="b")] * 3
    assert scaling.comm_seconds(parts, in_flight=1) == 3 * 2.0 + 3 * 1.0
    assert scaling.comm_seconds(parts, in_flight=2) == 2 * 2.0 + 3 * 1.0  # two waves
    topo = Topology(4, 4, UNIT)
    work = _workload(sizes, compute_s=0.0)
    unpacked = scaling.estimate(work, scaling.Choice("ring"), topo, scaling.CostSource())
    packed = scaling.estimate(work, scaling.Choice("ring", num_packs=1), topo,
                              scaling.CostSource())
    # Same bytes; packing removes 7 of the 8 latencies of 2(p-1) = 6 steps each.
    assert unpacked.comm - packed.comm == pytest.approx(7 * 6.0)
    assert (unpacked.all_reduces, packed.all_reduces) == (8, 1)


def _workload(sizes, compute_s, **kw):
    return scaling.Workload(name="test", sizes=tuple(sizes), compute=scaling.Compute.weak(compute_s),
                            examples=lambda n: 32 * n, batch="32 per device", **kw)


def _sweep_rows(latency, per_byte, devices, collective="ring"):
    return [dict(size=s, collective=collective, devices=devices, correct=True,
                 time_us=(latency + per_byte * s) * 1e6,
                 median_us=(latency + per_byte * s) * 1.1e6)
            for s in (4 << 10, 64 << 10, 1 << 20, 16 << 20)]


def test_fit_recovers_known_constants_from_a_synthetic_sweep(tmp_path):
    rows = _sweep_rows(50e-6, 2e-10, 4)
    rows.append(dict(rows[0], collective="broken", correct=False))  # a wrong sum: left out
    path = tmp_path / "bench_collectives.json"
    path.write_text(json.dumps(dict(sweep=rows)))
    [fit] = cost_fit.fit_files([str(path)], statistic="best")
    assert (fit.collective, fit.devices, fit.points) == ("ring", 4, 4)
    assert fit.latency == pytest.approx(50e-6, rel=1e-9)
    assert fit.per_byte == pytest.approx(2e-10, rel=1e-9)
    assert fit.worst_error < 1e-9
    [median] = cost_fit.fit_files([str(path)])  # the median samples, 10% slower
    assert median.latency == pytest.approx(55e-6, rel=1e-9)
    # The link that gives the fit back through the ring's formula: alpha per step, beta.
    link = cost_fit.link_for(fit)
    assert link.latency == pytest.approx(50e-6 / 6)
    assert link.bandwidth == pytest.approx(1.5 / 2e-10)
    again = cost_model.ring(Topology(4, 4, link))
    assert (again.latency, again.per_byte) == pytest.approx((50e-6, 2e-10))


def test_fit_on_noisy_points_and_refusals(tmp_path):
    rows = _sweep_rows(100e-6, 1e-9, 2, "reduce_to_one_device")
    for row, noise in zip(rows, (1.05, 0.95, 1.03, 0.98)):
        row["median_us"] *= noise / 1.1
    [fit] = cost_fit.fit_rows(rows)
    assert fit.latency == pytest.approx(100e-6, rel=0.1)
    assert fit.per_byte == pytest.approx(1e-9, rel=0.05)
    assert 0.02 < fit.worst_error < 0.06
    with pytest.raises(cost_fit.SweepError, match="at least two different sizes"):
        cost_fit.fit_alpha_beta([4096, 4096], [1e-5, 1e-5])
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(cost_fit.SweepError, match="has no sweep rows; run bin/bench_collectives"):
        cost_fit.read_sweep(str(bad))
    with pytest.raises(cost_fit.SweepError, match="cannot read the sweep"):
        cost_fit.read_sweep(str(tmp_path / "missing.json"))


def test_fitted_constants_are_used_where_measured_and_scaled_by_formula_elsewhere():
    [fit] = cost_fit.fit_rows(_sweep_rows(60e-6, 3e-10, 4, "reduce_to_one_device"),
                              statistic="best")
    costs = scaling.CostSource([fit])
    at_four = costs.cost("reduce_to_one_device", Topology(4, 4, UNIT), 1 << 20)
    assert at_four.seconds == pytest.approx(fit.seconds(1 << 20))
    assert at_four.basis == "fitted on 4 devices"
    at_eight = costs.cost("reduce_to_one_device", Topology(8, 8, UNIT), 1 << 20)
    # Same two steps of latency; the root's link carries 2*7 S instead of 2*3 S.
    assert at_eight.latency == pytest.approx(60e-6)
    assert at_eight.transfer == pytest.approx(3e-10 * (1 << 20) * 14 / 6)
    assert at_eight.basis == "links fitted on 4 devices"
    preset = costs.cost("ring", Topology(8, 8, links.intra("pcie4")), 1 << 20)
    assert preset.basis == "link presets pcie4"


def test_gradient_bytes_of_a_known_model_and_compression():
    variables = scaling.model_variable_sizes("mlp")
    counts = [count for count, _ in variables]
    assert counts == [784 * 256, 256, 256 * 256, 256, 256 * 10, 10]
    assert sum(scaling.travelling_sizes(variables, "float32")) == 4 * 269_322
    assert sum(scaling.travelling_sizes(variables, "bfloat16")) == 2 * 269_322
    assert scaling.travelling_sizes([(10, 1)], "float16") == (10,)  # already narrow: as is


def test_step_model_weak_strong_overlap_and_efficiency():
    sizes = [4 << 20] * 10
    choices = [scaling.Choice(c) for c in ("nccl", "ring", "hierarchical_copy")]
    kwargs = dict(per_host=8, intra=links.intra("pcie4"), inter=links.inter("eth25"),
                  choices=choices)
    weak = scaling.predict(_workload(sizes, 0.1), [1, 8, 64], **kwargs)
    assert [p.devices for p in weak] == [1, 8, 64] and weak[0].efficiency == 1.0
    assert weak[0].examples_per_second == pytest.approx(320.0)
    assert 1.0 > weak[1].efficiency > weak[2].efficiency > 0
    assert "hierarchical_copy" in weak[2].unavailable  # 8 hosts
    overlapped = scaling.predict(_workload(sizes, 0.1, overlap="backward"), [1, 8, 64], **kwargs)
    assert all(o.efficiency >= w.efficiency for o, w in zip(overlapped, weak))
    strong_work = scaling.Workload(
        name="t", sizes=tuple(sizes), compute=scaling.Compute.strong(0.8),
        examples=lambda n: 256, batch="256 global")
    strong = scaling.predict(strong_work, [1, 8], **kwargs)
    assert strong[1].best.compute == pytest.approx(0.1)
    with pytest.raises(ScalingError, match="--overlap='some'"):
        _workload(sizes, 0.1, overlap="some")


def test_shared_host_compute_divides_the_hosts_parallelism_among_replicas():
    compute = scaling.Compute.shared_host({1: 0.010, 2: 0.006, 4: 0.0035},
                                          {1: 1.0, 2: 2.0, 4: 1.75}, what="t")
    assert compute.seconds(2) == pytest.approx(0.006)  # two replicas side by side
    assert compute.seconds(4) == pytest.approx(0.008)  # four sharing 1.75 cores' worth
    assert "parallelism (1: 1.00, 2: 2.00, 4: 1.75)" in compute.assumption
    with pytest.raises(Unavailable, match="no one-replica measurement for 8"):
        compute.seconds(8)


def test_auto_routes_like_the_collective_it_models():
    from tfloop.collectives import auto

    small, large = 1024, auto.CPU_SMALL_TENSOR_BYTES
    assert scaling.auto_routes([small, large], 4, "cpu") == [
        ("hierarchical_copy", small), ("reduce_to_one_device", large)]
    assert scaling.auto_routes([small, large], 2, "cpu") == [
        ("reduce_to_one_device", small), ("reduce_to_one_device", large)]
    assert scaling.auto_routes([small, large], 8, "gpu") == [("nccl", small + large)]


@pytest.mark.parametrize("override, message", [
    (dict(model="mlp", parameters=1e6), "exactly one of --model"),
    (dict(global_batch_size=0), "exactly one of --global_batch_size"),
    (dict(step_ms=0.0), "exactly one of --step_ms"),
    (dict(device_kind="cpu", collectives=("nccl",)), "NCCL has no CPU kernel"),
    (dict(intra_link="nvlink9"), "--intra_link='nvlink9' is not a link preset"),
    (dict(packings=("num_packs=0",)), "--packings: 'num_packs=0' is not a packing"),
    (dict(device_counts=("1", "x")), "is not a list of integers"),
    (dict(nics_per_host=0), "--nics_per_host=0 must be at least 1"),
])
def test_requests_refused_in_one_line(override, message):
    request = predict.Request(**{**dict(parameters=1e6, global_batch_size=64, step_ms=10.0),
                                 **override})
    with pytest.raises(ScalingError, match=message.replace("(", r"\(")) as error:
        predict.check(request)
    assert "\n" not in str(error.value)


def test_a_vision_model_without_its_image_size_names_predict_scalings_own_flag():
    from tfloop.models import ModelError

    request = predict.Request(model="resnet50", global_batch_size=256, step_ms=100.0)
    with pytest.raises(ModelError, match=r"--model=resnet50 needs images of at least 32x32, .*; "
                                         r"add --image_size=224 \(its default, 0, models the "
                                         r"synthetic 28x28x1 images\)$"):
        predict.float32_sizes(request)


def test_bench_train_json_gives_the_one_device_step(tmp_path):
    path = tmp_path / "bench_train_mlp_1dev.json"
    path.write_text(json.dumps(dict(num_devices=1, config=dict(global_batch_size=256),
                                    rows=[dict(variant="fit", median=1.0),
                                          dict(variant="engine", median=51200.0)])))
    assert predict.step_from_bench_train(str(path)) == (0.005, 256, 1)
    request = predict.Request(parameters=1e6, tensors=3, global_batch_size=128,
                              bench_train_json=str(path))
    with pytest.raises(ScalingError, match="timed global batch 256 on 1 device"):
        predict.workload(request, predict.float32_sizes(request))
    assert predict.float32_sizes(request) == [1333334, 1333333, 1333333]


def test_published_results_are_predicted_from_their_own_rates():
    vgg = next(r for r in published.RESULTS if r.keras_model == "VGG16")
    inception = next(r for r in published.RESULTS if r.keras_model == "InceptionV3")
    # The Keras models' gradient bytes (138.4M and 23.8M parameters) in 16 equal
    # tensors each, without building the models here.
    vgg_sizes, inception_sizes = [138_357_544 // 4] * 16, [23_817_352 // 4] * 16
    vgg_eff = published.predict_one(vgg, vgg_sizes, "none")
    inception_eff = published.predict_one(inception, inception_sizes, "none")
    assert 0 < vgg_eff < inception_eff < 1  # 5.8x the bytes, over the same 25 GbE
    # Overlapped with the backward pass, only the first variables' bucket shows.
    assert vgg_eff < published.predict_one(vgg, vgg_sizes, "backward") < 1
    alone = [138_357_544 * 4]  # one bucket: nothing to hide it behind
    assert published.predict_one(vgg, alone, "backward") == published.predict_one(
        vgg, alone, "none")
    assert all(0 < r.efficiency <= 1 for r in published.RESULTS)


def test_the_cost_model_imports_no_tensorflow():
    code = ("import sys; from tfloop.bench import cost_model, cost_fit, links, scaling, "
            "sizes, predict, scaling_report; assert 'tensorflow' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_link_presets_name_their_sources():
    for link in (*links.INTRA.values(), *links.INTER.values()):
        assert link.source and link.bandwidth > 1e9 and 0 < link.latency < 1e-4
        assert math.isfinite(link.step_latency_tree)


def _engine_result(n, batch, median, high):
    return dict(num_devices=n, config=dict(global_batch_size=batch),
                rows=[dict(variant="engine", median=median, low=median / 2, high=high)])


def test_against_measured_builds_the_prediction_from_one_replica_and_the_fits():
    from tfloop.bench import scaling_check

    fits = cost_fit.fit_rows(
        _sweep_rows(40e-6, 1e-10, 2, "reduce_to_one_device")
        + _sweep_rows(60e-6, 2e-10, 4, "reduce_to_one_device")
        + _sweep_rows(50e-6, 3e-10, 4, "hierarchical_copy"), statistic="best")
    measured = [_engine_result(n, 256, m, 1.5 * m)
                for n, m in ((1, 30_000.0), (2, 40_000.0), (4, 35_000.0))]
    alone = {1: measured[0], 2: _engine_result(1, 128, 128 / 0.0045, 128 / 0.003),
             4: _engine_result(1, 64, 64 / 0.0025, 64 / 0.002)}
    probed = {1: [1.0, 1.0], 2: [1.6, 1.8, 2.0], 4: [1.9, 2.0, 2.1]}
    pools = {1: 2, 2: 2, 4: 1}  # the intra-op threads of each process
    # N replicas with no exchange: 5 ms and 7 ms a step (medians), 4 and 6 (best).
    free = {1: measured[0], 2: _engine_result(2, 256, 256 / 0.005, 256 / 0.004),
            4: _engine_result(4, 256, 256 / 0.007, 256 / 0.006)}
    rows = scaling_check.compare("mlp", alone, probed, pools, measured,
                                 {"median": fits, "best": fits}, cores=2, exchange_free=free)
    assert [r["devices"] for r in rows] == [1, 2, 4]
    one = rows[0]["median"]
    assert one["predicted"] == pytest.approx(30_000.0) and one["comm_ms"] == 0
    # Two replicas, medians: 4.5 ms x 2 / P(2) = 1.8 of compute; the mlp's 6 gradients
    # through reduce_to_one_device, latencies two at a time (2 cores).
    mlp = [784 * 256 * 4, 1024, 256 * 256 * 4, 1024, 2560 * 4, 40]
    comm2 = 3 * 40e-6 + 1e-10 * sum(mlp)
    two = rows[1]["median"]
    assert two["predicted"] == pytest.approx(256 / (0.0045 * 2 / 1.8 + comm2))
    assert two["error"] == pytest.approx(two["predicted"] / 40_000 - 1)
    # From two replicas timed with no exchange: their step plus the same all-reduce.
    assert two["from_replicas"] == pytest.approx(256 / (0.005 + comm2))
    assert two["from_replicas_error"] == pytest.approx(two["from_replicas"] / 40_000 - 1)
    assert rows[1]["best"]["from_replicas"] == pytest.approx(256 / (0.004 + comm2))
    assert one["from_replicas"] == pytest.approx(30_000.0)
    # The best: the fastest repetitions on both sides, the highest P(2).
    best = rows[1]["best"]
    assert best["predicted"] == pytest.approx(256 / (0.003 * 2 / 2.0 + comm2))
    assert best["measured"] == 60_000.0 and best["parallelism"] == 2.0
    # Four: auto sends the gradients below 256 KiB through hierarchical copy;
    # latencies 60, 60 (reduce to one) and 50 x 4, two at a time: 60 + 50 + 50.
    small = [1024, 1024, 2560 * 4, 40]
    comm4 = 160e-6 + 2e-10 * (784 * 256 * 4 + 256 * 256 * 4) + 3e-10 * sum(small)
    assert rows[2]["median"]["comm_ms"] == pytest.approx(1e3 * comm4)
    # One intra-op thread for the four replicas' kernels: min(P(4), T(4)) = 1.
    assert rows[2]["median"]["compute_ms"] == pytest.approx(1e3 * 0.0025 * 4 / 1)
    assert rows[2]["median"]["parallelism"] == 1
    assert "| mlp | 4 |" in scaling_check.table(rows, 2)


@pytest.mark.process  # scaling_check.host_parallelism starts its busy processes
def test_the_hosts_parallelism_probe():
    from tfloop.bench import scaling_check

    probed = scaling_check.host_parallelism([1, 2], repeats=1)
    assert probed[1] == [1.0] and 0 < probed[2][0] < 2.6  # at most the two cores, and noise
