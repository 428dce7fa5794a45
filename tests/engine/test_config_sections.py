"""RunConfig's sections: every field in exactly one, in flag order."""

import dataclasses

from tfloop.engine import config


def test_every_field_is_in_exactly_one_section_in_flag_order():
    names = [field.name for field in dataclasses.fields(config.RunConfig)]
    assert [name for section in config.SECTIONS.values() for name in section] == names


def test_a_section_reads_as_a_dict_and_the_flags_stay_flat():
    run_config = config.RunConfig(learning_rate=0.5, eval_timeout=7.0)
    assert run_config.section("Cluster") == {"eval_timeout": 7.0, "startup_timeout": 300.0,
                                             "auto_shard_policy": "auto", "cluster_from": "auto",
                                             "hang_timeout": 1800.0, "straggler_threshold": 3.0}
    assert run_config.section("The recipe")["learning_rate"] == 0.5
    assert "learning_rate" in run_config.as_dict()  # metrics.json and run.json keep flat names
