"""bin/gpu_check: the CPU dry run end to end, its report, its refusals.

The dry run is what a machine without a GPU runs: the same checks as on a GPU
host, on logical CPUs (bench/gpu_check.py's plan), in about a minute here.
"""

import json
import os
import sys

import pytest

from helpers import REPO, assert_one_line_error, run_bin, without_tensorflow

from tfloop.bench import check_report, gpu_check
from tfloop.bench.check_report import CheckResult, Report

#: Every test here reads the one dry run (about two minutes), so they run on
#: one worker (`--dist loadgroup`), which makes it once.
pytestmark = pytest.mark.xdist_group("gpu_check_dry_run")

CHECKS = ["environment", "training_plain", "training_xla", "training_mixed_float16",
          "equivalence_gpus", "busbw", "equivalence_virtual_gpus", "nccl_refused", "multi_worker",
          "gpu_tests"]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("gpu_check")
    result = run_bin("gpu_check", f"--output_dir={output_dir}", timeout=540)
    with open(output_dir / "report.json") as file:
        report = json.load(file)
    return result, report, (output_dir / "report.md").read_text(), output_dir


def test_without_a_gpu_it_says_so_in_one_line_and_every_check_passes(dry_run):
    result, report, _, _ = dry_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    said = [line for line in result.stdout.splitlines() if "no GPU visible" in line]
    assert len(said) == 1 and "CPU dry run" in said[0], result.stdout
    assert result.stdout.startswith(said[0])  # the first thing it says
    assert "Traceback" not in result.stderr, result.stderr
    assert report["mode"] == "cpu_dry_run" and report["complete"] is True
    assert [c["name"] for c in report["checks"]] == CHECKS
    assert {c["name"]: c["status"] for c in report["checks"]} == dict.fromkeys(CHECKS, "pass")
    assert report["counts"] == {"pass": len(CHECKS), "fail": 0, "skipped": 0}


def test_the_dry_run_numbers_are_those_of_real_runs(dry_run):
    _, report, _, output_dir = dry_run
    numbers = {c["name"]: c["numbers"] for c in report["checks"]}
    assert numbers["environment"]["tensorflow_gpus"] == []
    assert numbers["environment"]["first_matmul"]["/cpu:0"]["max_abs_error"] < 1e-9
    for variant in ("plain", "xla", "mixed_float16"):
        losses = numbers[f"training_{variant}"]["loop_losses"]
        assert len(losses) == 4 and losses[-1] < losses[0], (variant, losses)
    assert numbers["training_mixed_float16"]["flags"] == {"mixed_precision": "mixed_float16"}
    assert numbers["training_xla"]["flags"] == {"jit_compile": True}
    for name, replicas in (("equivalence_gpus", 4), ("equivalence_virtual_gpus", 2)):
        assert len(numbers[name]["devices"]) == replicas
        for collective in ("ring", "hierarchical_copy", "reduce_to_one_device", "auto"):
            assert 0 <= numbers[name][f"mlp/{collective}"] < 1e-5, (name, collective)
    rows = numbers["busbw"]["rows"]
    assert {(r["collective"], r["size"]) for r in rows} == {
        (c, s) for c in ("ring", "hierarchical_copy") for s in ("4K", "64K")}
    assert all(r["correct"] and r["busbw_gbs"] > 0 for r in rows)
    assert "nccl needs a GPU" in numbers["busbw"]["not_run"]
    refused = numbers["nccl_refused"]
    assert refused["error"] in ("ConfigError", "CollectiveError") and "nccl" in refused["message"]
    assert refused["model_dir_created"] is False
    worker = numbers["multi_worker"]
    assert worker["exit_status"] == 0 and worker["step"] == 20 and worker["num_replicas"] == 2
    assert sorted(worker["implementation"]) == ["worker:0", "worker:1"]
    assert all("ring" in text for text in worker["implementation"].values())
    assert numbers["gpu_tests"]["exit_status"] == 0
    assert "--collect-only" in numbers["gpu_tests"]["command"]  # GPU tests need a GPU to run
    assert "tests collected" in numbers["gpu_tests"]["summary"]
    for name in CHECKS:  # each check's log kept beside the report
        assert os.path.getsize(output_dir / "checks" / name / "log.txt") > 0


def test_the_markdown_report_lists_every_check_with_its_status(dry_run):
    _, report, markdown, _ = dry_run
    assert markdown.startswith("# GPU check (CPU dry run)")
    assert f"complete: {len(CHECKS)} passed, 0 failed, 0 skipped" in markdown
    for check in report["checks"]:
        assert f"(`{check['name']}`) | **pass** |" in markdown
    assert "- mlp/ring: " in markdown


def test_a_failing_check_fails_the_binary_and_is_reported(tmp_path):
    result = run_bin("gpu_check", f"--output_dir={tmp_path}", "--checks=environment,nccl_refused",
                     "--check_timeout=0.01")
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert [c["name"] for c in report["checks"]] == ["environment", "nccl_refused"]
    assert all(c["status"] == "fail" and c["reason"].startswith("timed out after 0.01 s")
               for c in report["checks"])
    assert report["complete"] is True


# The refusals below run with a `tensorflow` that fails on import: each is
# one line at once, before TensorFlow's start-up (bin/gpu_check's check_flags).


def test_a_file_as_output_dir_is_one_line(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    result = run_bin("gpu_check", f"--output_dir={taken}", env=without_tensorflow(tmp_path))
    assert result.returncode == 2
    assert_one_line_error(result, contains=f"--output_dir={taken} is a file")
    assert taken.read_text() == "not a folder"


def test_a_negative_check_timeout_is_one_line(tmp_path):
    result = run_bin("gpu_check", f"--output_dir={tmp_path / 'out'}", "--check_timeout=-1",
                     env=without_tensorflow(tmp_path))
    assert result.returncode == 2
    assert_one_line_error(result, contains="--check_timeout=-1 must be a number of seconds >= 0")
    assert not (tmp_path / "out").exists()


def test_an_unknown_check_is_one_line(tmp_path):
    result = run_bin("gpu_check", f"--output_dir={tmp_path / 'out'}",
                     "--checks=environment,nope", env=without_tensorflow(tmp_path))
    assert result.returncode == 2
    assert_one_line_error(result, contains="--checks: nope is not a check; choose from environment")
    result = run_bin("gpu_check", f"--output_dir={tmp_path / 'out'}", "--checks=,",
                     env=without_tensorflow(tmp_path))  # not "every check"
    assert result.returncode == 2
    assert_one_line_error(result, contains="--checks: '' is not a check; choose from environment")


def test_the_report_is_rewritten_after_each_check(tmp_path):
    report = Report(str(tmp_path), mode="gpu", machine={"tensorflow_gpus": 2})
    first = json.loads((tmp_path / "report.json").read_text())
    assert first["checks"] == [] and first["complete"] is False
    report.add(CheckResult("environment", "sees GPUs", "pass", numbers={"gpus": 2}, seconds=1.5))
    report.add(CheckResult("busbw", "busbw", "fail", "wrong sums", {"best": float("nan")}))
    mid = json.loads((tmp_path / "report.json").read_text())
    assert [c["status"] for c in mid["checks"]] == ["pass", "fail"]
    assert mid["checks"][1]["numbers"] == {"best": "nan"}  # JSON has no NaN
    assert mid["complete"] is False and mid["counts"] == {"pass": 1, "fail": 1, "skipped": 0}
    assert "INCOMPLETE" in (tmp_path / "report.md").read_text()
    report.add(CheckResult("multi_worker", "two workers", "skipped", "needs 2 GPUs"))
    report.finish()
    done = json.loads((tmp_path / "report.json").read_text())
    assert done["complete"] is True and [r.name for r in report.failed()] == ["busbw"]
    markdown = (tmp_path / "report.md").read_text()
    assert "| two workers (`multi_worker`) | **skipped** | 0.0 | needs 2 GPUs |" in markdown
    assert "- gpus: 2" in markdown and "- tensorflow_gpus: 2" in markdown
    assert sorted(os.listdir(tmp_path)) == ["report.json", "report.md"]  # no temporary left


def test_a_result_must_have_a_known_status_and_a_reason_unless_it_passed():
    with pytest.raises(ValueError, match="status='ok' must be one of pass|fail|skipped"):
        CheckResult("x", "x", "ok")
    with pytest.raises(ValueError, match="a skipped check"):
        CheckResult("x", "x", "skipped")
    assert check_report.STATUSES == ("pass", "fail", "skipped")


@pytest.mark.process  # bench.gpu_check.run_child starts the check's process
def test_a_check_whose_process_dies_fails_with_its_last_line(tmp_path):
    status, reason, numbers = gpu_check.run_child(
        [sys.executable, "-c", "import sys; print('NCCL WARN boom'); sys.exit(134)"],
        timeout=60, log_path=str(tmp_path / "log.txt"), result_path=str(tmp_path / "r.json"))
    assert (status, numbers) == ("fail", {})
    assert reason == "the check's process ended with status 134: NCCL WARN boom"


def test_the_plan_follows_the_gpus():
    def by_name(gpus):
        return {c.name: c for c in gpu_check.plan(gpus=gpus, bin_dir="bin")}

    one, two, dry = by_name(1), by_name(2), by_name(0)
    assert list(one) == list(two) == list(dry) == CHECKS
    # One GPU: virtual GPUs and the NCCL refusal; nothing that needs two.
    assert {n for n, c in one.items() if c.skip} == {"equivalence_gpus", "busbw", "multi_worker"}
    assert one["equivalence_virtual_gpus"].params["virtual_gpus"] == 2
    assert "nccl" not in one["equivalence_virtual_gpus"].params["collectives"]
    # Two GPUs: every collective, NCCL included, and a worker per GPU.
    assert {n for n, c in two.items() if c.skip} == {"equivalence_virtual_gpus"}
    assert two["equivalence_gpus"].params["devices"] == ["/gpu:0", "/gpu:1"]
    assert "nccl" in two["equivalence_gpus"].params["collectives"]
    assert "nccl" in two["busbw"].params["collectives"]
    assert two["multi_worker"].params["gpus_per_task"] == 1
    assert two["multi_worker"].params["expected"] == "nccl"
    # No GPU: nothing skipped, logical CPUs instead, NCCL only as its refusal.
    assert not any(c.skip for c in dry.values())
    assert dry["equivalence_gpus"].params["devices"] == [f"/cpu:{i}" for i in range(4)]
    assert all("nccl" not in c.params.get("collectives", ()) for c in dry.values())


def test_the_console_script_is_declared():
    with open(os.path.join(REPO, "pyproject.toml")) as file:
        pyproject = file.read()
    assert 'tfloop-gpu-check = "tfloop.bin:gpu_check"' in pyproject
    assert '"gpu_check",' in pyproject  # shipped as package data, as the other binaries


def test_without_pytest_the_gpu_tests_check_names_the_missing_package(monkeypatch):
    """A checkout installed without the test extra: the check says which
    package is missing, not pytest's bare exit status (issue 25)."""
    from tfloop.bench import gpu_checks

    monkeypatch.setattr(gpu_checks, "TEST_PACKAGES",
                        {"pytest": "tfloop_no_such_pytest", "pytest-xdist": "xdist"})
    status, reason, numbers = gpu_checks.gpu_tests(dry_run=True, repo=REPO, timeout=60)
    assert status == check_report.SKIPPED
    assert reason.startswith(f"pytest not installed in {sys.executable}: pip install '.[test]'")
    assert numbers == {"missing": ["pytest"]}
