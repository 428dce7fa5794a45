"""How a binary starts and ends, seen from outside: no TensorFlow C++ chatter
before the engine's first line (unless --verbose), Ctrl-C and SIGTERM during
start-up as one line and 130 / 143, `--devices=gpu:0` without a GPU says how
to get GPU support, and the process ends right after its last line."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from helpers import (REPO, assert_one_line_error, bin_env, run_bin, run_python, start_bin,
                     start_python)

TINY = ["--train_steps=20", "--steps_per_loop=10", "--global_batch_size=32", "--devices=cpu:0"]
CHATTER = re.compile(r"cuInit|oneDNN|absl::InitializeLog|cudart|cpu_feature_guard|"
                     r"^[IWEF]\d{4} [\d:.]+\s+\d+ \S+:\d+\]", re.MULTILINE)


def test_no_tensorflow_chatter_unless_verbose_and_sigusr_before_training_ends_nothing(
        tmp_path):
    """One quiet run shows both: no TensorFlow chatter, and SIGUSR1 and
    SIGUSR2 sent inside `import tensorflow` end nothing. Their default action
    ends a process with 138 / 140, the retryable class: a platform would
    restart a run nothing went wrong with (before, bin/train ended silently
    so). From bin/cli's import on they do nothing until the engine gives them
    their work, and say nothing either."""
    # A fresh interpreter: what is at stake happens inside its `import tensorflow`.
    quiet = start_bin("train", *TINY, f"--model_dir={tmp_path / 'quiet'}", "--mode=train",
                      "--noexport", fresh=True)
    try:
        time.sleep(1.5)  # inside `import tensorflow`
        quiet.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        quiet.send_signal(signal.SIGUSR2)
        stdout, stderr = quiet.communicate(timeout=180)
    finally:
        if quiet.poll() is None:
            quiet.kill()
            quiet.communicate(timeout=10)
    assert quiet.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr and (tmp_path / "quiet" / "metrics.json").exists()
    assert not CHATTER.search(stdout + stderr), stdout + stderr
    assert stderr == ""
    # The first line is the engine's.
    assert re.match(r"\d\d:\d\d:\d\d  ", stdout), stdout[:300]

    # --verbose: TensorFlow's chatter as it writes it, from its import on. A
    # run refused right after the import and device set-up shows it as well as
    # a whole training run, without the training.
    verbose = run_bin("train", *TINY[:-1], "--devices=cpu:100000",
                      f"--model_dir={tmp_path / 'verbose'}", "--verbose", fresh=True)
    assert verbose.returncode == 2 and "cpu:100000 is beyond" in verbose.stderr, verbose.stderr
    assert CHATTER.search(verbose.stdout + verbose.stderr)


def test_gpu_without_a_gpu_says_how_to_install_gpu_support(tmp_path):
    result = run_bin("train", *TINY[:-1], "--devices=gpu:0", f"--model_dir={tmp_path / 'run'}")
    line = assert_one_line_error(result, contains="TensorFlow sees no GPU on this machine")
    assert "pip install '.[gpu]'" in line
    assert result.returncode == 2
    assert not (tmp_path / "run").exists()


def _signal_at(process, signum, *, after_s=None, marker=None):
    if marker is None:
        time.sleep(after_s)
    else:
        for line in process.stdout:
            if marker in line:
                break
    process.send_signal(signum)
    return process.communicate(timeout=60)


@pytest.mark.parametrize("signum, status, reason", [
    (signal.SIGTERM, 143, "terminated (SIGTERM)"),
    (signal.SIGINT, 130, "interrupted (Ctrl-C)"),
], ids=["sigterm", "sigint"])
@pytest.mark.parametrize("moment", [dict(after_s=0.5), dict(after_s=2.0),
                                    dict(marker="dataset synthetic")],
                         ids=["0.5s", "2s", "dataset"])
def test_a_signal_during_start_up_is_one_line(tmp_path, signum, status, reason, moment):
    """0.5 s: Python and absl start-up; 2 s: inside `import tensorflow`;
    the dataset line: building the model, datasets and compiled step."""
    # The timed moments fall in an interpreter's start and its `import tensorflow`:
    # a fresh one (a fork of the binary server has imported it already).
    process = start_bin("train", *TINY[:-1], "--devices=cpu:0,cpu:1", "--train_steps=100000",
                        f"--model_dir={tmp_path / 'run'}", fresh="after_s" in moment)
    try:
        stdout, stderr = _signal_at(process, signum, **moment)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=10)
    assert process.returncode == status, stderr
    assert "Traceback" not in stderr
    # Ours, or, where training had just begun, StopRequest's ("preempted (SIGTERM)
    # at step N; saved ..."): one line either way.
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert stderr.startswith("train: ") and reason.split()[-1] in stderr, stderr


@pytest.mark.parametrize("signum, status, reason", [
    (signal.SIGTERM, 143, "terminated (SIGTERM)"),
    (signal.SIGINT, 130, "interrupted (Ctrl-C)"),
], ids=["sigterm", "sigint"])
def test_a_signal_before_cli_run_is_one_line(tmp_path, signum, status, reason):
    """Between bin/cli's import (its handlers installed) and `cli.run` a
    binary still imports its other modules and defines its flags (bin/train:
    `flag_defs`, a few tenths of a second in a fresh checkout). A signal
    there was a `Signalled` traceback and exit 1 (seen once in CI as the
    0.5 s case above). Sent at that point, deterministically: one line."""
    script = tmp_path / "binary.py"
    script.write_text(
        "import os, signal, time\n"
        "from tfloop.bin import cli\n"
        f"os.kill(os.getpid(), {int(signum)})  # as if it came while the flags are defined\n"
        "time.sleep(30)\n"
        "cli.run(lambda argv: 0)\n")
    result = run_python([str(script)], env=bin_env())
    assert result.returncode == status, result.stderr
    assert result.stderr == f"binary.py: {reason}\n", result.stderr


def test_bin_train_exits_right_after_its_last_line(tmp_path):
    """From outside: the time from the last stdout line to the exit. Before
    `cli.run(skip_teardown=True)` and engine.loop.iterators this was 1 to 30 s (a
    tf.data iterator's destructor waiting); the bound is generous for a
    loaded 2-core machine."""
    # A fork of the binary server (helpers.start_python), not a fresh
    # interpreter: what is timed happens after the last line, at the end of a
    # run (the interpreter's own end, which a served binary goes through as a
    # fresh one does), not inside the interpreter's start or `import tensorflow`.
    process = start_python(
        [f"{REPO}/bin/train", "--devices=cpu:0,cpu:1,cpu:2,cpu:3",
         "--train_steps=200", "--steps_per_loop=50", "--global_batch_size=64",
         "--eval_interval=100", f"--model_dir={tmp_path / 'run'}"],
        cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    last_line_at = None
    lines = []
    for line in process.stdout:
        last_line_at = time.monotonic()
        lines.append(line)
    process.wait(timeout=120)
    seconds = time.monotonic() - last_line_at
    print(f"exit {seconds:.2f} s after the last line ({lines[-1].strip()[:80]})")
    assert process.returncode == 0, process.stderr.read()[-3000:]
    assert "exported" in lines[-1]
    assert seconds < 2.0


# -- a script's end: tfloop.run / tfloop.fit under `python train.py` (issue 29 item 6) ------

_SCRIPT = """
import sys
import tfloop

def on_loop_end(step, metrics):
    print("loop", step, flush=True)  # the test's cue: training runs
    if sys.argv[1] == "lost" and step >= 4:
        raise tfloop.ClusterFailure("worker:1 lost the cluster after step 4 (injected)")

config = tfloop.RunConfig(strategy="default", devices="cpu:0", model_dir=sys.argv[2],
                          global_batch_size=16, train_steps=10**6, steps_per_loop=2,
                          checkpoint_interval=0, summary_interval=0, mode="train", export=False)
tfloop.run(config, on_loop_end=on_loop_end)
"""


@pytest.mark.parametrize("how, status, says", [
    ("sigterm", 143, "train.py: preempted (SIGTERM) at step "),
    ("lost", 138, "train.py: error: worker:1 lost the cluster after step 4 (injected) "
                  "(exit 138: restart every task from the last checkpoint)"),
])
def test_a_script_ends_a_sigterm_or_a_lost_peer_in_one_line_and_its_status(
        tmp_path, how, status, says):
    """`python train.py` calling tfloop.run (or fit), with no wrapping of its
    own: before, a traceback and exit 1, which no platform restarts; now the
    contract of bin/train, by the excepthook the first run installs."""
    from helpers import bin_env

    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    # `python train.py` as a fork of the binary server (helpers.start_python):
    # what is checked happens at the script's end (the excepthook the first run
    # installs), not inside the interpreter's start or `import tensorflow`.
    process = start_python([str(script), how, str(tmp_path / "run")], cwd=str(tmp_path),
                           env=bin_env(PYTHONUNBUFFERED="1"))
    try:
        if how == "sigterm":
            _, stderr = _signal_at(process, signal.SIGTERM, marker="loop")
        else:
            _, stderr = process.communicate(timeout=180)
    finally:
        process.kill()
    assert process.returncode == status, stderr[-3000:]
    assert "Traceback" not in stderr, stderr
    assert stderr.rstrip().splitlines()[-1].startswith(says), stderr
    if how == "sigterm":
        assert "saved " in stderr and (tmp_path / "run" / "checkpoint").exists()


def test_the_hook_leaves_every_other_exception_to_the_previous_one(monkeypatch):
    from tfloop.engine.errors import ClusterFailure, ConfigError
    from tfloop.engine.runtime import script_exit

    seen = []
    hook = script_exit._hook(lambda kind, error, tb: seen.append(error))
    error = KeyError("a bug")
    hook(KeyError, error, None)
    mistake = ConfigError("a mistake keeps its traceback in a script")
    hook(ConfigError, mistake, None)

    class Mine(Exception):
        exit_status = 138  # not tfloop's: not ours to end

    mine = Mine()
    hook(Mine, mine, None)
    assert seen == [error, mistake, mine]
    with pytest.raises(SystemExit) as ended:
        hook(ClusterFailure, ClusterFailure("lost"), None)
    assert ended.value.code == 138 and not seen[3:]


# -- statuses from the first instruction (issue 38 item 3) ----------------------------------

_BINARIES = {  # each binary and one boolean flag of its own
    "train": "verbose", "export": "verbose", "bench_collectives": "plot",
    "bench_train": "plot", "convert_to_tfrecord": "verbose", "gpu_check": "verbose",
    "launch": "chief", "predict_scaling": "plot", "data_service": "verbose",
}


def test_every_binary_is_listed():
    listed = {name for name in os.listdir(os.path.join(REPO, "bin"))
              if "." not in name and not name.startswith("_")}
    assert listed == set(_BINARIES)


@pytest.mark.parametrize("binary", sorted(_BINARIES))
def test_a_booleans_negation_given_a_value_is_one_line_and_exit_2(binary):
    """`--nofoo=1` was absl's `ValueError` traceback and exit 1, in every
    binary (the shared parse in bin/cli); it is refused before TensorFlow loads."""
    flag = _BINARIES[binary]
    extra = ["--", "true"] if binary == "launch" else []
    result = run_bin(binary, f"--no{flag}=1", *extra, timeout=60)
    line = assert_one_line_error(result)
    assert result.returncode == 2, result.stderr
    assert line == (f"{binary}: error: --no{flag} takes no value; write --{flag}=false "
                    f"or --no{flag}"), line


_FIT_SCRIPT = """
import sys, time
import numpy as np
import keras
import tfloop

def build_model():
    print("building", flush=True)  # the test's cue
    time.sleep(120)

x, y = np.zeros((32, 4), "float32"), np.zeros((32,), "int32")
config = tfloop.RunConfig(strategy="default", devices="cpu:0", model_dir=sys.argv[1])
tfloop.fit(build_model, x, y, batch_size=8, config=config)
"""


def test_a_fit_script_sigtermed_in_build_model_ends_in_one_line_and_143(tmp_path):
    """A `tfloop.fit` script SIGTERMed inside the user's `build_model` died by
    the signal (-15), said nothing and left `model_dir` with its `train.lock`
    (issue 38); now one line, 143, and the folder it created is gone."""
    from helpers import bin_env

    script = tmp_path / "train.py"
    script.write_text(_FIT_SCRIPT)
    # A fork of the binary server (helpers.start_python): the signal comes in
    # the user's build_model, long after the interpreter's start and its imports.
    process = start_python([str(script), str(tmp_path / "run")], cwd=str(tmp_path),
                           env=bin_env(PYTHONUNBUFFERED="1"))
    try:
        _, stderr = _signal_at(process, signal.SIGTERM, marker="building")
    finally:
        process.kill()
    assert process.returncode == 143, stderr[-3000:]
    assert "Traceback" not in stderr, stderr
    assert stderr.rstrip().splitlines()[-1] == (
        "train.py: terminated (SIGTERM) outside the training loop; nothing was saved at the "
        "signal: run the same command (it resumes from the last checkpoint)"), stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("binary, flag", [
    ("bench_collectives", "output_dir"), ("bench_train", "output_dir"),
    ("gpu_check", "output_dir"), ("convert_to_tfrecord", "output_dir"),
    ("convert_to_tfrecord", "data_dir"), ("launch", "diagnostics_dir"),
])
def test_every_folder_flag_gets_the_one_path_check(tmp_path, binary, flag):
    """`--output_dir=~/x` made a folder named `~` in the working directory (and
    ran a benchmark into it); bin/cli checks every given `--*_dir` as
    `--model_dir` is checked, before anything is created (issue 38)."""
    from helpers import bin_env

    extra = ["--output_dir=out"] if flag == "data_dir" else []
    extra += ["--", "true"] if binary == "launch" else []
    result = subprocess.run([sys.executable, os.path.join(REPO, "bin", binary), f"--{flag}=~/x",
                             *extra], capture_output=True, text=True, timeout=60,
                            cwd=tmp_path, env=bin_env())
    assert_one_line_error(result, contains=f"--{flag}=~/x starts with ~, which nothing expanded")
    assert result.returncode == 2 and list(tmp_path.iterdir()) == []
