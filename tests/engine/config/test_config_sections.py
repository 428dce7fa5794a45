"""RunConfig's declarations: each field written once, in the section of the
room that reads it, with its own check and whether run.json remembers it;
everything else derived.

Adding a flag is one edit (its `option(...)` line in its room's
settings.py, plus its use): `SECTIONS`, `check_field`, `IDENTITY`,
`PER_RANGE`, `RunConfig`'s flat fields, `bin/train`'s flags and
docs/flags.md all come from it. The count below is what proves it: a
field's name appears in engine/ and bin/ in one declaration and no list of
names.
"""

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from tfloop.engine import config
from tfloop.engine.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]
#: Representative fields: a number with a ceiling that run.json remembers
#: (image_size), a fraction it remembers (eval_fraction), a factor with an
#: "off" (straggler_threshold), a timeout (hang_timeout), a choice (best_mode)
#: a path (summaries_dir), and two that run.json records per range of a
#: resumed run (end_learning_rate, nan_policy).
REPRESENTATIVE = ("image_size", "eval_fraction", "straggler_threshold", "hang_timeout",
                  "best_mode", "summaries_dir", "end_learning_rate", "nan_policy")
#: Where a representative field's name is written as text and that is a use,
#: not a declaration: a binary picking the flags it takes, or its own flag.
USES = {
    "image_size": {"bin/bench_train": "takes --image_size, with a sentence of its own",
                   "bin/convert_to_tfrecord": "its own --image_size (0: each source's own size)",
                   "bin/predict_scaling": "its own --image_size: the input of the model whose "
                   "gradients it counts (no dataset)"},
    "eval_fraction": {"bin/convert_to_tfrecord": "its own --eval_fraction"},
    "summaries_dir": {"bin/flag_defs.py": "Vertex AI's AIP_TENSORBOARD_LOG_DIR is its default"},
}
#: Where each representative field is declared: its room's section.
DECLARED_IN = {
    "image_size": "engine/task/settings.py", "eval_fraction": "engine/task/settings.py",
    "straggler_threshold": "engine/strategies/settings.py",
    "hang_timeout": "engine/strategies/settings.py", "best_mode": "engine/run_dir/settings.py",
    "summaries_dir": "engine/loop/settings.py", "end_learning_rate": "engine/recipe/settings.py",
    "nan_policy": "engine/loop/settings.py",
}
#: Where a field of the same name is declared again, and why that is another
#: option, not a copy of the flag (none since TrainerOptions became `Step`,
#: the flags' own section, issue 41).
ALSO_DECLARED: dict = {}


def _sources() -> dict[Path, str]:
    """Every Python source of engine/ and bin/ (bin's binaries have no suffix)."""
    files = list((REPO / "engine").rglob("*.py")) + [
        path for path in (REPO / "bin").iterdir()
        if path.is_file() and (path.suffix == ".py" or path.read_text().startswith("#!"))]
    return {path: path.read_text() for path in files}


def _declarations(source: str, name: str) -> list[ast.AnnAssign]:
    """`name: type = ...` statements (a dataclass field), wherever they are."""
    return [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name) and node.target.id == name]


@pytest.mark.parametrize("name", REPRESENTATIVE)
def test_a_field_is_named_once_in_engine_and_bin(name):
    """Before: image_size was named in 6 places (its declaration, the list of
    non-negative fields, the ceilings, SECTIONS, run_identity.IDENTITY,
    bin/export's flags); now its declaration is the one place, and every other
    mention is a use (`config.image_size`, a binary taking the flag) or a
    flag in a help text (`--image_size`)."""
    as_text = re.compile(rf"[\"']{name}[\"']")
    declared = {path.relative_to(REPO).as_posix(): len(_declarations(text, name))
                for path, text in _sources().items() if _declarations(text, name)}
    listed = sorted(path.relative_to(REPO).as_posix()
                    for path, text in _sources().items() if as_text.search(text))
    assert declared == {DECLARED_IN[name]: 1, **{path: 1 for path in ALSO_DECLARED.get(name, {})}}
    assert listed == sorted(USES.get(name, {})), (
        f"{name!r} is listed by name in {listed}: derive the list from its option")


def test_every_field_is_in_exactly_one_section_in_flag_order():
    names = [field.name for field in dataclasses.fields(config.RunConfig)]
    assert [name for section in config.SECTIONS.values() for name in section] == names
    for field in dataclasses.fields(config.RunConfig):
        assert set(field.metadata) == {"help", "section", "check", "identity",
                                       "per_range"}, field.name
    assert list(config.SECTIONS) == ["Distribution", "Model and data", "The loop", "The recipe",
                                     "The step", "Keeping and stopping", "Cluster",
                                     "Speed and reproducibility"]
    # The step's flags, declared once in the loop's room (issue 41: they were
    # spread over four sections and declared again by TrainerOptions).
    assert config.SECTIONS["The step"] == ("clip_norm", "accumulation_steps", "nan_policy",
                                           "nan_max_skips", "jit_compile",
                                           "synthetic_on_device")


def test_each_section_is_declared_in_the_room_that_reads_it():
    rooms = {section.TITLE: section.__module__ for _, section in config.COMPOSED}
    assert rooms == {
        "Distribution": "tfloop.engine.strategies.settings",
        "Model and data": "tfloop.engine.task.settings",
        "The loop": "tfloop.engine.loop.settings",
        "The recipe": "tfloop.engine.recipe.settings",
        "The step": "tfloop.engine.loop.settings",
        "Keeping and stopping": "tfloop.engine.run_dir.settings",
        "Cluster": "tfloop.engine.strategies.settings",
        "Speed and reproducibility": "tfloop.engine.runtime.settings",
    }


def test_importing_the_config_imports_no_tensorflow():
    """bin/train defines its flags from RunConfig before TensorFlow loads:
    the sections' rooms (strategies/, task/) load their TensorFlow modules
    on first use, not when their settings are imported."""
    import subprocess
    import sys

    code = ("import sys; import tfloop.engine.config, tfloop.engine.strategies, "
            "tfloop.engine.task; print(sorted(m for m in sys.modules if m == 'tensorflow' "
            "or m.startswith(('keras', 'tfloop.collectives'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() == "[]", out


def test_a_section_reads_as_a_dict_and_the_flags_stay_flat():
    run_config = config.RunConfig(learning_rate=0.5, eval_timeout=7.0)
    assert run_config.section("Cluster") == {"eval_timeout": 7.0, "startup_timeout": 300.0,
                                             "auto_shard_policy": "auto", "data_service": "",
                                             "cluster_from": "auto",
                                             "hang_timeout": 1800.0, "straggler_threshold": 3.0}
    assert run_config.section("The recipe")["learning_rate"] == 0.5
    assert "learning_rate" in run_config.as_dict()  # metrics.json and run.json keep flat names


def test_each_section_is_a_typed_frozen_part_of_the_flat_record():
    """`config.recipe` is what a module that needs the recipe is handed
    (`schedules.from_config`): the section its room declares, frozen, equal
    to the flat record's values; the flat fields are the sections'."""
    run_config = config.RunConfig(learning_rate=0.5, lr_schedule="step",
                                  lr_decay_steps="10,20", hang_timeout=60.0)
    declared = {field.name: field for field in dataclasses.fields(config.RunConfig)}
    for attribute, section in config.COMPOSED:
        fields = dataclasses.fields(section)
        assert tuple(field.name for field in fields) == config.SECTIONS[section.TITLE]
        assert all(field.type == declared[field.name].type
                   and field.default == declared[field.name].default for field in fields)
        assert isinstance(getattr(run_config, attribute), section)
        assert dataclasses.asdict(getattr(run_config, attribute)) == run_config.section(
            section.TITLE)
    recipe = run_config.recipe
    assert isinstance(recipe, config.Recipe)
    assert dataclasses.asdict(recipe) == run_config.section("The recipe")
    assert recipe.lr_decay_boundaries == (10, 20) == run_config.lr_decay_boundaries
    assert run_config.cluster.hang_timeout == 60.0
    assert config.Recipe() == config.RunConfig().recipe  # the same defaults
    with pytest.raises(dataclasses.FrozenInstanceError):
        recipe.learning_rate = 0.1


def test_run_json_remembers_the_fields_declared_identity():
    from tfloop.engine.run_dir import run_identity

    assert run_identity.IDENTITY == ("task", "model", "dataset", "data_dir", "image_size",
                                     "eval_fraction", "augment")
    assert run_identity.IDENTITY == tuple(
        field.name for field in dataclasses.fields(config.RunConfig)
        if field.metadata["identity"])


def test_run_json_records_per_range_the_fields_declared_per_range():
    """`RunConfig.PER_RANGE` (what a resumed run may change, one entry per
    range of steps) is derived from `option(per_range=True)`, not listed:
    the eleven fields it held as a hand-written list, in flag order."""
    from tfloop.engine.run_dir import run_identity

    assert config.RunConfig.PER_RANGE == config.PER_RANGE == tuple(
        field.name for field in dataclasses.fields(config.RunConfig)
        if field.metadata["per_range"])
    assert set(config.PER_RANGE) == {
        "global_batch_size", "optimizer", "learning_rate", "lr_schedule", "warmup_steps",
        "end_learning_rate", "weight_decay", "clip_norm", "accumulation_steps",
        "mixed_precision", "nan_policy"}
    assert not set(config.PER_RANGE) & set(run_identity.IDENTITY)


def test_one_check_serves_every_field_that_declares_it():
    """A check is called with the field's name, so its line names the flag
    it was given for."""
    with pytest.raises(ConfigError, match=r"^--hang_timeout=-1 must be 0 or more seconds"):
        config.check_field("hang_timeout", -1)
    with pytest.raises(ConfigError, match=r"^--eval_timeout=inf must be 0 or more seconds"):
        config.check_field("eval_timeout", float("inf"))
    with pytest.raises(ConfigError, match=r"^--image_size=8193 must be 0 or more, at most 8192$"):
        config.RunConfig(image_size=8193)
    config.check_field("image_size", 8192)


#: The engine modules that read the whole RunConfig (docs/engine.md, "Who
#: reads the whole config": 18 before issue 41, 7 after). A module that needs
#: a part of the run takes its section (`config.recipe`); one added here is a
#: deliberate edit.
WHOLE_CONFIG_READERS = (
    "engine/assembly/batching.py", "engine/assembly/plan.py", "engine/assembly/run.py",
    "engine/keras_fit/fit.py", "engine/run_dir/run_identity.py",
    "engine/task/compiled_model.py", "engine/task/plugin.py",
)


def _reads_the_whole_config(source: str) -> bool:
    """Imports RunConfig (for an annotation too), or takes a parameter named
    `config` or annotated `RunConfig` (docs/engine.md's count)."""
    return any(
        isinstance(node, ast.ImportFrom) and any(a.name == "RunConfig" for a in node.names)
        or isinstance(node, ast.arg) and (node.arg == "config" or "RunConfig" in ast.unparse(
            node.annotation or ast.Constant(0)))
        for node in ast.walk(ast.parse(source)))


def test_the_modules_that_read_the_whole_config_are_these():
    readers = sorted(path.relative_to(REPO).as_posix()
                     for path in (REPO / "engine").rglob("*.py")
                     if _reads_the_whole_config(path.read_text()))
    assert readers == sorted(WHOLE_CONFIG_READERS), (
        "a module reads the whole RunConfig: hand it the section it reads (config.<section>)")
