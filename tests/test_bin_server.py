"""The binary server (tests/bin_server.py): a forked binary is a process of its
own, as `python bin/<name>` would be, for everything the suite reads of it."""

import os
import signal
import subprocess
import textwrap

import pytest

import helpers

pytestmark = pytest.mark.process


@pytest.fixture()
def script(tmp_path):
    """A stand-in binary that reports what a process can see of itself."""
    path = tmp_path / "report"
    path.write_text(textwrap.dedent("""
        import json, os, sys, tempfile
        import tensorflow as tf
        if sys.argv[1:2] == ["--sleep"]:
            print("sleeping", flush=True)
            import time
            time.sleep(60)
        if sys.argv[1:2] == ["--raise"]:
            raise ValueError("a bug")
        tf.config.set_logical_device_configuration(
            tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 3)
        print(json.dumps({
            "pid": os.getpid(), "argv": sys.argv, "orig_argv": sys.orig_argv[1:],
            "cwd": os.getcwd(), "path0": sys.path[0], "seen": os.environ.get("SEEN"),
            "tmp": tempfile.gettempdir(), "devices": len(tf.config.list_logical_devices("CPU")),
            "name": __name__, "path1": sys.path[1],
            "users_module": __import__("users_module").WHERE if os.environ.get("USERS_MODULE") else None}))
        print("to stderr", file=sys.stderr)
        sys.exit(int(os.environ.get("STATUS", "0")))
    """))
    return str(path)


def _served(script, *args, env=None, cwd=None):
    return helpers._server().spawn([script, *args], env=helpers.bin_env(env), cwd=cwd or helpers.REPO)


def test_a_forked_binary_is_a_process_of_its_own_with_the_callers_argv_env_and_streams(
        script, tmp_path):
    import json

    process = _served(script, "--flag=1", env={"SEEN": "yes", "STATUS": "3",
                                                 "TMPDIR": str(tmp_path)}, cwd=str(tmp_path))
    stdout, stderr = process.communicate(timeout=120)
    report = json.loads(stdout)
    assert process.returncode == 3
    assert report["pid"] == process.pid and process.pid != os.getpid()
    assert report["argv"] == [script, "--flag=1"] and report["orig_argv"] == [script, "--flag=1"]
    assert report["cwd"] == str(tmp_path) and report["path0"] == os.path.dirname(script)
    assert report["seen"] == "yes" and report["tmp"] == str(tmp_path)
    assert report["name"] == "__main__"
    # TensorFlow's runtime starts in the child: it may still configure its devices.
    assert report["devices"] == 3
    assert stderr.strip().splitlines()[-1] == "to stderr"
    # A second fork starts from the same untouched server.
    again = _served(script)
    assert json.loads(again.communicate(timeout=120)[0])["devices"] == 3
    assert again.returncode == 0


def test_an_uncaught_error_ends_as_python_would_and_a_signal_as_popen_reports_it(script):
    process = _served(script, "--raise")
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1
    assert "ValueError: a bug" in stderr.splitlines()[-1]

    process = _served(script, "--sleep")
    assert process.stdout.readline().strip() == "sleeping"
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.1)
    assert process.poll() is None
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL
    process.stdout.close()
    process.stderr.close()


def test_run_bin_gives_the_fresh_interpreters_result_served(tmp_path, monkeypatch, script):
    """A refusal that comes after TensorFlow's import and the device set-up:
    the same lines and status from a fresh interpreter and from run_bin's
    fork, which starts no process of its own (`subprocess` refuses here)."""
    args = ("--devices=cpu:100000", "--train_steps=4", f"--model_dir={tmp_path}/a")
    fresh = helpers.run_bin("train", *args, fresh=True)
    monkeypatch.delenv(helpers.FRESH, raising=False)
    _served(script).communicate(timeout=120)  # the server is up before subprocess refuses

    def no_process(*args, **kwargs):
        raise AssertionError("run_bin started a process instead of a fork of the server")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    served = helpers.run_bin("train", *args)
    assert (served.returncode, served.stderr, served.stdout) == (
        fresh.returncode, fresh.stderr, fresh.stdout)
    assert served.returncode == 2 and "cpu:100000 is beyond" in served.stderr, served.stderr
    assert not os.path.exists(tmp_path / "a")


def test_an_environment_read_at_interpreter_start_goes_to_a_fresh_interpreter(tmp_path):
    served_by_default = os.environ.get(helpers.FRESH) != "1"
    assert helpers._served(helpers.bin_env(), fresh=False) == served_by_default
    assert helpers._served(helpers.bin_env({"PYTHONPATH": str(tmp_path)}), fresh=False) == (
        served_by_default)  # read by the child as at start (below)
    assert not helpers._served(helpers.bin_env({"PYTHONHASHSEED": "7"}), fresh=False)
    assert not helpers._served(helpers.bin_env(helpers.without_tensorflow(tmp_path)), fresh=False)
    assert not helpers._served(helpers.bin_env(), fresh=True)


def test_pythonpath_is_read_as_a_fresh_interpreter_reads_it(script, tmp_path):
    import json

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "users_module.py").write_text("WHERE = 'mine'\n")
    process = _served(script, env={"PYTHONPATH": str(tmp_path / "mine"), "USERS_MODULE": "1"})
    report = json.loads(process.communicate(timeout=120)[0])
    assert report["path1"] == str(tmp_path / "mine") and report["users_module"] == "mine"
