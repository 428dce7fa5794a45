"""`engine.run_dir.refusals`: the one writable-ancestor walk, shared by
`--model_dir`, `--summaries_dir` and `--local_checkpoint_dir` (issue 41
item 2: `local_checkpoints.check` used to repeat it without the link check)."""

import os

import pytest

from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError
from tfloop.engine.run_dir import local_checkpoints, refusals


def _local(tmp_path, where):
    """The loop's section, which `local_checkpoints.check` reads."""
    return RunConfig(model_dir=str(tmp_path / "run"), local_checkpoint_dir=where,
                     local_checkpoint_interval=10).loop


def test_the_walk_returns_the_nearest_existing_folder(tmp_path):
    assert refusals.writable_ancestor(str(tmp_path / "a" / "b"), "--model_dir") == str(tmp_path)
    assert refusals.writable_ancestor(str(tmp_path), "--model_dir") == str(tmp_path)
    (tmp_path / "a").mkdir()
    assert refusals.writable_ancestor(str(tmp_path / "a" / "b"), "--x") == str(tmp_path / "a")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # read-only: nothing made


def test_a_file_on_the_way_is_the_same_line_for_model_dir_and_the_local_folder(tmp_path,
                                                                               monkeypatch):
    """The messages each flag had before the walk was shared, byte for byte:
    --model_dir quotes its absolute path, --local_checkpoint_dir the value as given."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError) as model_dir:
        refusals.check_model_dir("file/run")
    assert str(model_dir.value) == (
        f"--model_dir={tmp_path / 'file' / 'run'} cannot be written ({tmp_path / 'file'} is "
        "not a writable directory); choose a directory you can write to")
    with pytest.raises(ConfigError) as local:
        local_checkpoints.check(_local(tmp_path, "file/shm"), asynchronous_cluster=False)
    assert str(local.value) == (
        f"--local_checkpoint_dir=file/shm cannot be written ({tmp_path / 'file'} is not a "
        "writable directory); choose a directory you can write to")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.parametrize("below", [False, True])
def test_a_dangling_link_in_the_local_folder_is_refused_as_model_dirs_is(tmp_path, below):
    """The one walk refuses a link that leads nowhere for --local_checkpoint_dir
    too: before, it passed the check and every local save was skipped with a
    warning ('could not be made') for the whole run."""
    link = tmp_path / "shm"
    link.symlink_to(tmp_path / "gone")
    where = str(link / "sub" if below else link)
    with pytest.raises(ConfigError) as error:
        local_checkpoints.check(_local(tmp_path, where), asynchronous_cluster=False)
    assert str(error.value) == (
        f"--local_checkpoint_dir={where} cannot be created: {link} is a symbolic link to "
        f"{tmp_path / 'gone'}, which does not exist; create that directory, or remove the "
        "link")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shm"] and link.is_symlink()


def test_a_link_loop_in_the_local_folder_is_one_line(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(ConfigError, match=r"^--local_checkpoint_dir=.* is a symbolic link loop; "
                                          r"point --local_checkpoint_dir at a directory"):
        local_checkpoints.check(_local(tmp_path, str(tmp_path / "a")), asynchronous_cluster=False)


def test_a_link_to_a_folder_is_a_local_folder_like_any_other(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "shm").symlink_to(tmp_path / "real")
    local_checkpoints.check(_local(tmp_path, str(tmp_path / "shm")), asynchronous_cluster=False)
    local_checkpoints.check(_local(tmp_path, str(tmp_path / "shm" / "new")),
                            asynchronous_cluster=False)
    assert os.listdir(tmp_path / "real") == []
