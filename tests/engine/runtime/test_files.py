"""`engine.runtime.files`: nothing is removed or written through a link the
engine did not make, and modes do not depend on the umask alone.

Each case plants what an adversary with write access to a shared folder
would (a link to a victim folder or file), calls the engine's one helper,
and checks the victim's listing and bytes afterwards."""

import contextlib
import errno
import os
import stat

import pytest
import tensorflow as tf

from tfloop.engine.errors import ConfigError, RunFailure
from tfloop.engine.runtime import files


def _snapshot(folder):
    """Every path under `folder` with its bytes (None for a folder)."""
    return {str(p.relative_to(folder)): (None if p.is_dir() else p.read_bytes())
            for p in sorted(folder.rglob("*"))}


@contextlib.contextmanager
def _umask(mask):
    before = os.umask(mask)
    try:
        yield
    finally:
        os.umask(before)


# --- remove --------------------------------------------------------------------------------------

def test_a_link_is_removed_as_a_link_and_its_target_stays(tmp_path, victim):
    run = tmp_path / "run"
    run.mkdir()
    before = _snapshot(victim)
    (run / "ckpt-7_temp").symlink_to(victim)
    (run / "metrics.json.tmp").symlink_to(victim / "thesis.tex")
    assert files.remove(str(run / "ckpt-7_temp"), within=str(run))
    assert files.remove(str(run / "metrics.json.tmp"), within=str(run))
    assert list(run.iterdir()) == [] and _snapshot(victim) == before


def test_a_folder_is_removed_without_descending_through_a_link_inside(tmp_path, victim):
    run = tmp_path / "run"
    (run / "best" / "export" / "8").mkdir(parents=True)
    (run / "best" / "export" / "8" / "saved_model.pb").write_bytes(b"pb")
    (run / "best" / "export" / "8" / "variables").symlink_to(victim)
    (run / "best" / "export" / "8" / "model.keras").symlink_to(victim / "thesis.tex")
    before = _snapshot(victim)
    assert files.remove(str(run / "best" / "export"), within=str(run))
    assert list((run / "best").iterdir()) == [] and _snapshot(victim) == before


@pytest.mark.parametrize("inner", ["best", "best/export"])
def test_a_link_on_the_way_is_refused_in_one_line(tmp_path, victim, inner):
    run = tmp_path / "run"
    run.mkdir()
    if inner != "best":
        (run / "best").mkdir()
    (victim / "export").mkdir()
    (victim / "export" / "8").mkdir()
    (run / inner).symlink_to(victim if inner == "best" else victim / "export")
    before = _snapshot(victim)
    with pytest.raises(ConfigError) as error:
        files.remove(str(run / "best" / "export" / "8"), within=str(run))
    link = run / inner
    assert str(error.value) == (
        f"{link} is a symbolic link, where the run keeps a file or folder of its own, and it "
        f"never writes or removes through a link it did not make: remove the link (rm {link}) "
        "and run again")
    assert _snapshot(victim) == before


def test_nothing_outside_within_is_removed(tmp_path, victim):
    with pytest.raises(ValueError, match="is not under"):
        files.remove(str(victim), within=str(tmp_path / "run"))
    with pytest.raises(ValueError, match="is not under"):
        files.remove(str(tmp_path / "run" / ".." / "victim"), within=str(tmp_path / "run"))
    assert (victim / "thesis.tex").read_bytes() == b"precious\n"


def test_what_is_not_there_is_not_removed(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "file").write_text("x")
    assert not files.remove(str(tmp_path / "run" / "missing"), within=str(tmp_path / "run"))
    assert not files.remove(str(tmp_path / "run" / "nope" / "x"), within=str(tmp_path / "run"))
    assert not files.remove(str(tmp_path / "run" / "file" / "x"), within=str(tmp_path / "run"))


def test_a_removal_that_fails_says_so_and_does_not_blame_the_free_space(tmp_path, monkeypatch):
    (tmp_path / "run" / "ckpt-7_temp").mkdir(parents=True)

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(files.shutil, "rmtree", refused)
    with pytest.raises(RunFailure) as failure:
        files.remove(str(tmp_path / "run" / "ckpt-7_temp"), within=str(tmp_path / "run"))
    assert str(failure.value) == (
        f"could not remove {tmp_path}/run/ckpt-7_temp (Permission denied), which the run left "
        f"and removes: make {tmp_path}/run writable, or remove {tmp_path}/run/ckpt-7_temp "
        "yourself, and run the same command")
    assert "space" not in str(failure.value)


def test_a_url_is_removed_through_tensorflow():
    root = "ram://tfloop-files/run"
    tf.io.gfile.makedirs(f"{root}/export/.3.tmp-1a2b3c4d")
    with tf.io.gfile.GFile(f"{root}/export/.3.tmp-1a2b3c4d/saved_model.pb", "w") as f:
        f.write("pb")
    assert files.remove(f"{root}/export/.3.tmp-1a2b3c4d", within=root)
    assert not tf.io.gfile.exists(f"{root}/export/.3.tmp-1a2b3c4d/saved_model.pb")
    assert not files.remove(f"{root}/export/missing", within=root)


# --- writing ------------------------------------------------------------------------------------

def test_an_atomic_write_replaces_a_link_at_its_path_not_the_target(tmp_path, victim):
    """rename(2) replaces the link itself: run.json becomes a file of its own."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").symlink_to(victim / "thesis.tex")
    before = _snapshot(victim)
    files.write_atomically(str(run / "run.json"), '{"a": 1}\n')
    assert not (run / "run.json").is_symlink()
    assert (run / "run.json").read_text() == '{"a": 1}\n'
    assert _snapshot(victim) == before
    assert [p.name for p in run.iterdir()] == ["run.json"]


def test_an_atomic_write_never_opens_the_old_fixed_temporary_name(tmp_path, victim):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("metrics.json.tmp", "run.json.tmp", "checkpoint.tmp", "evaluations.json.tmp"):
        (run / name).symlink_to(victim / "thesis.tex")
        files.write_atomically(str(run / name[:-len(".tmp")]), "new\n")
    assert (victim / "thesis.tex").read_bytes() == b"precious\n"
    assert all((run / n).read_text() == "new\n"
               for n in ("metrics.json", "run.json", "checkpoint", "evaluations.json"))


def test_a_temporary_name_is_random_and_created_exclusively(tmp_path, victim):
    names = {files.temporary_name(str(tmp_path / "metrics.json")) for _ in range(50)}
    assert len(names) == 50
    link = tmp_path / "planted"
    link.symlink_to(victim / "thesis.tex")
    with pytest.raises(FileExistsError):
        files.create_exclusively(str(link))
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileExistsError):
        files.create_exclusively(str(dangling))
    assert not (tmp_path / "nowhere").exists()
    assert (victim / "thesis.tex").read_bytes() == b"precious\n"


def test_a_failed_write_leaves_no_temporary_and_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "metrics.json"
    path.write_text("old\n")

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(files.os, "replace", refused)
    with pytest.raises(PermissionError):
        files.write_atomically(str(path), "new\n")
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]
    assert path.read_text() == "old\n"


def test_a_url_is_written_atomically_through_tensorflow():
    path = "ram://tfloop-files/records/metrics.json"
    tf.io.gfile.makedirs("ram://tfloop-files/records")
    files.write_atomically(path, "one\n")
    files.write_atomically(path, "two\n")
    with tf.io.gfile.GFile(path) as f:
        assert f.read() == "two\n"
    assert tf.io.gfile.listdir("ram://tfloop-files/records") == ["metrics.json"]


# --- modes --------------------------------------------------------------------------------------

def test_modes_are_at_most_0644_and_0755_under_umask_0(tmp_path):
    with _umask(0):
        files.make_dirs(str(tmp_path / "a" / "b" / "c"))
        files.write_atomically(str(tmp_path / "a" / "b" / "c" / "run.json"), "{}\n")
        with files.create_exclusively(str(tmp_path / "a" / "dump.txt")) as f:
            f.write("x")
    for folder in ("a", "a/b", "a/b/c"):
        assert stat.S_IMODE((tmp_path / folder).stat().st_mode) == 0o755, folder
    for name in ("a/b/c/run.json", "a/dump.txt"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644, name


def test_the_umask_is_narrowed_inside_and_restored_after(tmp_path):
    with _umask(0):
        with files.umask_at_least():
            (tmp_path / "tf").mkdir()  # as TensorFlow makes one: 0777 less the umask
            with open(tmp_path / "tf" / "file", "w"):
                pass
        assert os.umask(0) == 0
    assert stat.S_IMODE((tmp_path / "tf").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "tf" / "file").stat().st_mode) == 0o644
    with _umask(0o027):
        with files.umask_at_least():
            assert os.umask(0o027 | 0o022) == 0o027 | 0o022  # stricter kept as it is
        assert os.umask(0o027) == 0o027


# --- a private folder in a shared place ----------------------------------------------------------

def test_a_private_folder_is_0700_and_refused_when_a_link_or_someone_elses(
        tmp_path, victim, monkeypatch):
    shared = tmp_path / "tmp"
    shared.mkdir()
    with _umask(0):
        mine = files.private_dir(str(shared / "mine"))
    assert stat.S_IMODE(os.stat(mine).st_mode) == 0o700
    os.chmod(mine, 0o755)
    files.private_dir(mine)  # taken again: narrowed to 0700
    assert stat.S_IMODE(os.stat(mine).st_mode) == 0o700
    (shared / "planted").symlink_to(victim)
    victim_mode = stat.S_IMODE(victim.stat().st_mode)
    with pytest.raises(OSError, match="a link"):
        files.private_dir(str(shared / "planted"))
    assert stat.S_IMODE(victim.stat().st_mode) == victim_mode  # not narrowed through the link
    monkeypatch.setattr(files.os, "getuid", lambda: os.stat(mine).st_uid + 1)
    with pytest.raises(OSError, match="owned by user"):
        files.private_dir(mine)


def test_only_a_full_disk_is_told_to_free_space():
    """Item 17: a write refused for its permissions, or a removal, is not fixed by space."""
    from tfloop.engine.runtime import disk

    assert disk.advice(OSError(errno.ENOSPC, "No space left on device"), "/d") == "free some space"
    assert disk.advice(OSError(errno.EDQUOT, "Disk quota exceeded"), "/d") == "free some space"
    assert disk.advice(tf.errors.ResourceExhaustedError(None, None, "x; No space left on device"),
                       "/d") == "free some space"
    assert disk.advice(PermissionError(errno.EACCES, "Permission denied"), "/d") == (
        "make /d writable")
    assert disk.advice(tf.errors.PermissionDeniedError(None, None, "denied"), "/d") == (
        "make /d writable")
