"""tfloop.bench.timing: the rotation both benchmarks share, and the interleaved sampler."""

import pytest

from tfloop.bench import timing


def test_rotated_starts_each_round_one_later():
    assert timing.rotated("abc", 0) == ["a", "b", "c"]
    assert timing.rotated("abc", 1) == ["b", "c", "a"]
    assert timing.rotated("abc", 4) == ["b", "c", "a"]
    assert timing.rotated(range(4), 2) == [2, 3, 0, 1]
    assert timing.rotated([], 3) == []


def test_time_interleaved_rotates_and_rebuilds_each_round():
    calls, builds = [], []

    def make_loops():
        builds.append(1)
        return [lambda n, k=k: calls.append((k, int(n))) for k in range(3)]

    schedule = timing.Schedule(rounds=2, repeats=3, warmup=2, iters=5, min_sample_ms=0)
    timings, loops = timing.time_interleaved(make_loops, schedule)
    assert len(builds) == 2 and len(loops) == 3 and len(timings) == 3
    timed = [k for k, n in calls if n == 5]
    assert timed == [0, 1, 2, 1, 2, 0, 2, 0, 1] * 2  # repeat r starts at loop r
    assert all(n in (2, 5) for _, n in calls)
    for t in timings:
        assert 0 <= t.best <= t.median


def test_every_timed_call_is_fetched_before_the_clock_stops(monkeypatch):
    """A GPU kernel outlives the call that queued it: each sample copies the
    loop's result to the host inside the timed section."""
    events = []

    def loop(n):
        events.append("call")
        return ("result", int(n))

    monkeypatch.setattr(timing.time, "perf_counter",
                        lambda: events.append("clock") or float(len(events)))
    monkeypatch.setattr(timing, "fetched", lambda result: events.append(("fetched", result)))
    schedule = timing.Schedule(rounds=1, repeats=2, warmup=1, iters=3, min_sample_ms=0)
    timing.time_interleaved(lambda: [loop], schedule)
    timed = [events[i:i + 4] for i, e in enumerate(events) if e == "clock"][-2:]
    # the last sample: clock, call, fetched, clock
    assert timed[0] == ["clock", "call", ("fetched", ("result", 3)), "clock"]
    assert [e for e in events if isinstance(e, tuple)] == [
        ("fetched", ("result", 1))] * 2 + [("fetched", ("result", 3))] * 2


def test_fetched_copies_tensors_and_passes_other_values(monkeypatch):
    import tensorflow as tf
    result = [tf.constant([1.0]), None, 3, {"tail": tf.constant([2])}]
    copied = []
    eager = type(result[0])
    copy = eager.numpy
    monkeypatch.setattr(eager, "numpy", lambda tensor: copied.append(tensor) or copy(tensor))
    assert timing.fetched(result) is result
    assert len(copied) == 2  # every tensor, nested ones too, copied to the host
    assert copied[0] is result[0] and copied[1] is result[3]["tail"]


def test_matmul_rate_is_positive(cpu_devices):
    assert timing.matmul_gflops(cpu_devices[:2], size=64, iters=2, repeats=1) > 0
    assert "TensorFlow" in timing.machine_description()
    assert timing.environment()["cpu_count"] > 0


def test_schedule_is_frozen():
    schedule = timing.Schedule(rounds=1, repeats=1, warmup=0, iters=1, min_sample_ms=0)
    with pytest.raises(Exception):
        schedule.rounds = 2
