"""`collectives.check_options`: the one check of --num_packs, --pack_bytes and
--gradient_dtype, which RunConfig, `collectives.create` and the wrappers call."""

import pytest

from tfloop import collectives


def test_valid_options_come_back_normalized():
    assert collectives.check_options() == (0, 0, "float32")
    assert collectives.check_options(num_packs=None, pack_bytes=None) == (0, 0, "float32")
    assert collectives.check_options(num_packs=4, gradient_dtype="bfloat16") == (4, 0, "bfloat16")
    assert collectives.check_options(pack_bytes=1 << 20) == (0, 1 << 20, "float32")


@pytest.mark.parametrize("options, message", [
    (dict(num_packs=-1), "--num_packs=-1 must be an integer >= 0 (0 = no packing"),
    (dict(num_packs=2.0), "--num_packs=2.0 must be an integer >= 0"),
    (dict(pack_bytes=True), "--pack_bytes=True must be an integer >= 0 (0 = off"),
    (dict(num_packs=2, pack_bytes=64), "--num_packs=2 and --pack_bytes=64 are both set"),
    (dict(gradient_dtype="int8"), "--gradient_dtype='int8' is not supported; choose one of "
                                  "float32|bfloat16|float16"),
])
def test_mistakes_are_one_collective_error_line(options, message):
    with pytest.raises(collectives.CollectiveError) as error:
        collectives.check_options(**options)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("options", [dict(num_packs=-1), dict(pack_bytes=-1)])
def test_packing_built_directly_checks_the_same_way(options):
    inner = collectives.create("reduce_to_one_device", devices=["/cpu:0", "/cpu:1"])
    with pytest.raises(collectives.CollectiveError, match="must be an integer >= 0"):
        collectives.Packing(inner, **options)
