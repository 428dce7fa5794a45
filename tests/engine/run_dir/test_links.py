"""A symbolic link planted under `--model_dir` (issue 29, items 1, 2 and 4).

Anyone who can write into a shared `--model_dir` can plant a link where the
run keeps a file or folder. Each case plants one to a victim outside the
run, runs (in process, a few steps; `bin/train` and `bin/export` once each),
and checks that the victim's listing and bytes are unchanged and that the
run either refused in one line (exit 2) or succeeded without touching it.
Also: what the run creates is at most 0644 / 0755 under `umask 000`.
"""

import json
import os
import stat

import pytest

from helpers import assert_one_line_error, run_bin
from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError, ExportFailure
from tfloop.engine.assembly.run import run
from tfloop.engine.run_dir import export as export_lib
from tfloop.engine.runtime import files

SMALL = dict(strategy="one_device", devices="cpu:0", train_steps=4, steps_per_loop=2,
             global_batch_size=32, summary_interval=0, export=False, seed=1)
BEST = dict(mode="train_and_evaluate", best_metric="eval/loss", eval_interval=2, eval_steps=2,
            checkpoint_interval=2)


def _snapshot(folder):
    return {str(p.relative_to(folder)): (None if p.is_dir() else p.read_bytes())
            for p in sorted(folder.rglob("*"))}


def _refusal(link):
    return (f"{link} is a symbolic link, where the run keeps a file or folder of its own, and "
            f"it never writes or removes through a link it did not make: remove the link "
            f"(rm {link}) and run again")


# --- refused: a link where the run keeps a file or a folder ---------------------------------------

@pytest.mark.parametrize("name, overrides", [
    ("best", BEST),
    ("best/export", {**BEST, "export": True}),
    ("best/best.json", BEST),
    ("export", {"export": True}),
    ("summaries", {}),
    ("run.json", {}),
    ("checkpoint", {}),
    ("diagnostics", {}),
    ("damaged", {}),
])
def test_a_link_where_the_run_keeps_a_file_or_folder_is_refused_before_anything_is_written(
        tmp_path, victim, name, overrides):
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    if name.startswith("best/"):
        (model_dir / "best").mkdir()
    target = victim / "thesis.tex" if name.endswith(("json", "checkpoint")) else victim
    (model_dir / name).symlink_to(target)
    before = _snapshot(victim)
    listing = sorted(str(p.relative_to(model_dir)) for p in model_dir.rglob("*"))
    with pytest.raises(ConfigError) as error:
        run(RunConfig(model_dir=str(model_dir), **{**SMALL, **overrides}))
    assert str(error.value) == _refusal(model_dir / name)
    assert _snapshot(victim) == before
    assert sorted(str(p.relative_to(model_dir)) for p in model_dir.rglob("*")) == listing



def test_run_json_as_a_link_is_refused_before_it_is_read(tmp_path, victim):
    """bin/train reads run.json (`run_identity.load`, for the flags it
    remembers) before the run's own link check: a link there to a file that
    is not JSON was read and called a damaged run.json (issue 38)."""
    from tfloop.engine.run_dir import run_identity

    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / "run.json").symlink_to(victim / "thesis.tex")
    with pytest.raises(ConfigError) as error:
        run_identity.load(str(model_dir))
    assert str(error.value) == _refusal(model_dir / "run.json")

def test_bin_train_refuses_a_best_folder_that_is_a_link_in_one_line(tmp_path, victim):
    """The campaign's case: `ln -s $PWD/victim md/best`, then `--best_metric=eval/loss`
    emptied victim/."""
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / "best").symlink_to(victim)
    (victim / "best.json").write_text(json.dumps({
        "metric": "eval/loss", "mode": "min", "value": 9.0, "step": 2,
        "checkpoint": "best/ckpt-2", "export": None}))
    before = _snapshot(victim)
    result = run_bin("train", f"--model_dir={model_dir}", "--strategy=one_device",
                     "--devices=cpu:0", "--train_steps=4", "--steps_per_loop=2",
                     "--global_batch_size=32", "--summary_interval=0", "--noexport",
                     "--mode=train_and_evaluate", "--best_metric=eval/loss",
                     "--eval_interval=2", "--eval_steps=2")
    line = assert_one_line_error(result, contains=_refusal(model_dir / "best"))
    assert result.returncode == 2, line
    assert _snapshot(victim) == before
    assert sorted(p.name for p in model_dir.iterdir()) == ["best"]


# --- unlinked as links: what the run left and removes ---------------------------------------------

#: The tests that plant links in a copy of the module's one trained run
#: (`trained_copy`, tests/engine/conftest.py): one xdist group, so that one
#: worker trains it once.
SHARED = pytest.mark.xdist_group("links_trained")


@SHARED
def test_left_overs_that_are_links_are_unlinked_and_their_targets_stay(
        trained_copy, tmp_path, victim):
    """A stale `ckpt-N_temp`, `export/.N.tmp-*` and record temporary as links;
    the fixed `*.tmp` names of earlier versions as links, which nothing opens."""
    model_dir = trained_copy
    (model_dir / "export").mkdir()
    (model_dir / "ckpt-6_temp").symlink_to(victim)
    (model_dir / "export" / ".6.tmp-1a2b3c4d").symlink_to(victim)
    (model_dir / f"metrics.json{files.TEMPORARY_INFIX}0123456789abcdef").symlink_to(
        victim / "thesis.tex")
    old_names = ("metrics.json.tmp", "run.json.tmp", "checkpoint.tmp", "evaluations.json.tmp")
    for name in old_names:
        (model_dir / name).symlink_to(victim / "thesis.tex")
    (model_dir / "checkpoint").unlink()  # so that the state file is rewritten (checkpoint.tmp)
    before = _snapshot(victim)
    record = run(RunConfig(model_dir=str(model_dir), **{**SMALL, "train_steps": 8}))
    assert record["status"] == "finished" and record["step"] == 8
    evaluated = run(RunConfig(model_dir=str(model_dir), **{**SMALL, "mode": "evaluate",
                                                           "eval_steps": 2}))
    assert evaluated["step"] == 8
    assert _snapshot(victim) == before
    names = sorted(p.name for p in model_dir.iterdir())
    assert "ckpt-6_temp" not in names and os.listdir(model_dir / "export") == []
    assert not [n for n in names if files.TEMPORARY_INFIX in n]
    assert all((model_dir / n).is_symlink() for n in old_names)  # not the run's: left alone
    for name in ("metrics.json", "run.json", "checkpoint", "evaluations.json"):
        assert (model_dir / name).is_file() and not (model_dir / name).is_symlink(), name


def test_entries_of_best_that_best_json_does_not_name_go_as_links(tmp_path, victim):
    model_dir = tmp_path / "run"
    (model_dir / "best" / "export").mkdir(parents=True)
    (model_dir / "best" / "ckpt-99.index").symlink_to(victim / "thesis.tex")
    (model_dir / "best" / "ckpt-99_temp").symlink_to(victim)
    (model_dir / "best" / "export" / "99").symlink_to(victim)
    before = _snapshot(victim)
    record = run(RunConfig(model_dir=str(model_dir), **{**SMALL, **BEST}))
    assert record["status"] == "finished"
    kept = json.loads((model_dir / "best" / "best.json").read_text())
    # best/export/ went too (no --export: best.json names none), its link inside unlinked.
    assert sorted(p.name for p in (model_dir / "best").iterdir()) == sorted([
        "best.json", "state.json", f"ckpt-{kept['step']}.index",
        f"ckpt-{kept['step']}.data-00000-of-00001"])
    assert _snapshot(victim) == before


def test_an_export_being_replaced_that_is_a_link_goes_as_a_link_and_modes_ignore_the_umask(
        tmp_path, victim):
    """Under `umask 000` (item 4): every folder the run makes is at most 0755,
    every file at most 0644, TensorFlow's checkpoints and SavedModel included."""
    model_dir = tmp_path / "run"
    (model_dir / "export").mkdir(parents=True)
    (model_dir / "export" / "4").symlink_to(victim)
    os.chmod(model_dir, 0o755)
    os.chmod(model_dir / "export", 0o755)
    before = _snapshot(victim)
    umask = os.umask(0)
    try:
        record = run(RunConfig(model_dir=str(model_dir / "inner"), **SMALL))
        assert record["status"] == "finished"
        record = run(RunConfig(model_dir=str(model_dir), **{**SMALL, "export": True}))
        assert os.umask(0) == 0  # the run restored the umask it found
    finally:
        os.umask(umask)
    assert record["export"] == str(model_dir / "export" / "4")
    assert not (model_dir / "export" / "4").is_symlink()
    assert (model_dir / "export" / "4" / "saved_model.pb").read_bytes() != b"not yours"
    assert _snapshot(victim) == before
    too_open = [(str(p.relative_to(model_dir)), oct(stat.S_IMODE(p.lstat().st_mode)))
                for p in [model_dir / "inner", *model_dir.rglob("*")]
                if stat.S_IMODE(p.lstat().st_mode) & ~(0o755 if p.is_dir() else 0o644)]
    assert too_open == []


@SHARED
def test_bin_export_replaces_an_export_that_is_a_link_without_touching_its_target(
        trained_copy, tmp_path, victim):
    model_dir = trained_copy
    (model_dir / "export").mkdir()
    (model_dir / "export" / "4").symlink_to(victim)
    (model_dir / "export" / ".4.tmp-0badf00d").symlink_to(victim)  # bin/export removes none
    before = _snapshot(victim)
    result = run_bin("export", f"--model_dir={model_dir}", timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == str(model_dir / "export" / "4")
    assert (model_dir / "export" / "4" / "saved_model.pb").is_file()
    assert not (model_dir / "export" / "4").is_symlink()
    assert (model_dir / "export" / ".4.tmp-0badf00d").is_symlink()
    assert _snapshot(victim) == before


def test_an_export_that_cannot_be_replaced_says_why_and_not_free_space(
        tmp_path, monkeypatch):
    """Item 17: the removal failure of an export being replaced names the
    removal, and its fix is not "free some space"."""
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    (tmp_path / "export" / "5").mkdir(parents=True)

    real = files.shutil.rmtree

    def refused(path, *args, **kwargs):
        if path == "5":  # export/5, as files.remove names it (relative to its folder)
            raise PermissionError(13, "Permission denied")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(files.shutil, "rmtree", refused)
    with pytest.raises(ExportFailure) as failure:
        export_lib.export_model(model, input_signature=tf.TensorSpec([None, 3], tf.float32),
                                directory=str(tmp_path), step=5)
    assert str(failure.value) == (
        f"could not export step 5 to {tmp_path}/export: {tmp_path}/export/5 is in the way and "
        "could not be removed (Permission denied); nothing was exported")
    assert failure.value.fix == (f"remove {tmp_path}/export/5 yourself (or make "
                                 f"{tmp_path}/export writable)")


def test_a_save_refused_for_its_permissions_is_not_told_to_free_space(tmp_path):
    from tfloop.engine.run_dir import checkpointing

    line = str(checkpointing.SaveFailure(str(tmp_path), 20, f"{tmp_path}/ckpt-10",
                                         PermissionError(13, "Permission denied")))
    assert line.endswith(f"the latest checkpoint is still ckpt-10: make {tmp_path} writable and "
                         "run the same command to resume from it")
