"""The registry: names, options turned into wrappers, and one-line errors."""

import os

import numpy as np
import pytest
import tensorflow as tf

from helpers import replica_values
from tfloop import collectives
from tfloop.collectives import registry

HERE = os.path.dirname(os.path.abspath(__file__))
BUILTIN = ["auto", "hierarchical_copy", "nccl", "reduce_to_one_device", "ring", "strategy"]


@pytest.fixture
def plugin_path(monkeypatch):
    monkeypatch.syspath_prepend(HERE)


def error_of(name, **kwargs):
    kwargs.setdefault("devices", ["/cpu:0", "/cpu:1"])
    with pytest.raises(collectives.CollectiveError) as raised:
        collectives.create(name, **kwargs)
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_builtins_are_registered():
    assert collectives.available() == BUILTIN


@pytest.mark.parametrize(
    "name, options, description",
    [
        ("ring", {}, "ring"),
        ("hierarchical_copy", {}, "hierarchical_copy(num_packs=0)"),
        ("hierarchical_copy", dict(num_packs=2), "hierarchical_copy(num_packs=2)"),
        ("hierarchical_copy", dict(pack_bytes=4096),
         "hierarchical_copy(num_packs=0)+packing(pack_bytes=4096)"),
        ("reduce_to_one_device", dict(reduce_device="cpu:1"),
         "reduce_to_one_device(reduce_device=cpu:1)"),
        ("ring", dict(num_packs=4, gradient_dtype="bfloat16"),
         "ring+packing(num_packs=4)+bfloat16"),
        ("ring", dict(pack_bytes=1 << 20, gradient_dtype="float16"),
         "ring+packing(pack_bytes=1048576)+float16"),
    ],
)
def test_options_become_native_settings_or_wrappers(name, options, description):
    collective = collectives.create(name, devices=["/cpu:0", "/cpu:1"], **options)
    assert collective.describe() == description
    assert collective.name == name


def test_auto_forwards_options_to_its_choice():
    auto = collectives.create("auto", devices=["/cpu:0", "/cpu:1"], pack_bytes=4096,
                              gradient_dtype="bfloat16")
    assert isinstance(auto.chosen, collectives.Compression)
    assert isinstance(auto.chosen.inner, (collectives.Packing, collectives.TFPackedAllReduce))
    assert auto.describe().startswith("auto->")
    four = collectives.create("auto", devices=[f"/cpu:{i}" for i in range(4)], num_packs=2)
    for chosen in (four.small, four.chosen):  # small tensors' collective and the rest's
        assert "num_packs=2" in chosen.describe()


@pytest.mark.parametrize(
    "name, kwargs, expected",
    [
        ("foo", {}, "--collective='foo' is not a collective; choose one of auto, "
                    "hierarchical_copy, nccl, reduce_to_one_device, ring, strategy, or give "
                    "module:Class"),
        ("", {}, "--collective='' is empty; choose one of auto, hierarchical_copy"),
        ("ring", dict(devices=[]), "devices=[] must be a non-empty list of device names"),
        ("ring", dict(devices="cpu:0"), "devices='cpu:0' must be a non-empty list"),
        ("ring", dict(num_packs=-1), "--num_packs=-1 must be an integer >= 0 (0 = no packing"),
        ("ring", dict(num_packs=True), "--num_packs=True must be an integer >= 0"),
        ("ring", dict(num_packs="4"), "--num_packs='4' must be an integer >= 0"),
        ("ring", dict(pack_bytes=-5), "--pack_bytes=-5 must be an integer >= 0"),
        ("ring", dict(num_packs=2, pack_bytes=64),
         "--num_packs=2 and --pack_bytes=64 are both set; choose one"),
        ("ring", dict(gradient_dtype="int8"),
         "--gradient_dtype='int8' is not supported; choose one of float32|bfloat16|float16"),
        ("ring", dict(reduce_device="cpu:0"),
         "--reduce_device='cpu:0' only applies to --collective=reduce_to_one_device, "
         "not --collective=ring; drop it"),
        ("reduce_to_one_device", dict(reduce_device="tpu:0"),
         "--reduce_device='tpu:0' is not a device; write cpu:N or gpu:N"),
        ("reduce_to_one_device", dict(reduce_device="gpu:7"),
         "--reduce_device=gpu:7 does not exist; this machine has"),
        ("nccl", {}, "--collective=nccl needs GPUs, but the devices are cpu:0,cpu:1; on CPU "
                     "use ring, hierarchical_copy or reduce_to_one_device"),
        ("nccl", dict(devices=["/gpu:0", "/cpu:0"]), "--collective=nccl needs GPUs"),
        ("hierarchical_copy", dict(devices=["/cpu:0", "/cpu:1", "/cpu:2"]),
         "--collective=hierarchical_copy needs an even number of devices"),
        ("ring", dict(devices=["/cpu:0", "/gpu:0"]),
         "--collective=ring runs on devices of one kind"),
    ],
)
def test_misuse_is_one_line_naming_argument_value_and_fix(name, kwargs, expected):
    assert expected in error_of(name, **kwargs)


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("no_such_module_xyz:Foo", "--collective='no_such_module_xyz:Foo': cannot import "
                                   "module 'no_such_module_xyz' (ModuleNotFoundError"),
        ("my_collective_plugin:Missing", "module 'my_collective_plugin' has no attribute "
                                         "'Missing'; name a Collective subclass"),
        ("my_collective_plugin:not_a_class", "is function <function not_a_class"),
        ("my_collective_plugin:Unfinished", "--collective='my_collective_plugin:Unfinished' "
                                            "cannot be constructed (Can't instantiate abstract"),
        ("my_collective_plugin:NeedsArguments", "cannot be constructed"),
        ("my_collective_plugin:", "is not module:Class; write e.g."),
        (":AllToAllSum", "is not module:Class"),
        ("a:b:c", "is not module:Class"),
    ],
)
def test_user_class_errors(plugin_path, spec, expected):
    assert expected in error_of(spec)


def test_not_a_collective_says_how_to_fix(plugin_path):
    message = error_of("my_collective_plugin:not_a_class")
    assert "not a Collective subclass; derive it from collectives.Collective" in message


@pytest.mark.parametrize("cls", ["AllToAllSum", "TemplateAllToAllSum"])
def test_user_collective_by_module_and_class(plugin_path, cpu_devices, cls):
    collective = collectives.create(
        f"my_collective_plugin:{cls}", devices=cpu_devices, num_packs=1,
        gradient_dtype="bfloat16",
    )
    # Options it does not take itself become wrappers around it.
    assert isinstance(collective, collectives.Compression)
    assert isinstance(collective.inner, collectives.Packing)
    assert collective.name == f"my_collective_plugin:{cls}"

    strategy = tf.distribute.MirroredStrategy(cpu_devices)

    values = replica_values(strategy)
    with strategy.scope():
        reduced = collective.batch_all_reduce(values, values)
    for result, want in zip(reduced, (10.0, 100.0)):
        for part in collectives.components(result):
            np.testing.assert_allclose(part.numpy(), want)


def test_the_template_does_the_prologue_for_every_collective(plugin_path):
    """`batch_all_reduce` lists the batch, checks it pairs up, and returns one
    replica's plain tensors without calling `_sum_replicas`; a plug-in that
    overrides `batch_all_reduce` itself never needs `_sum_replicas`."""
    import my_collective_plugin

    class Counting(collectives.Collective):
        calls = 0

        def _sum_replicas(self, values, destinations):
            Counting.calls += 1
            return values

    plain = [tf.constant([1.0, 2.0])]
    assert Counting().batch_all_reduce(tuple(plain), plain) == plain
    assert Counting().batch_all_reduce([], []) == []
    assert Counting.calls == 0
    with pytest.raises(ValueError, match="got 1 values but 2 destinations"):
        Counting().batch_all_reduce(plain, plain * 2)
    whole = my_collective_plugin.AllToAllSum()
    assert whole.batch_all_reduce(plain, plain) == plain
    with pytest.raises(NotImplementedError, match="overrides batch_all_reduce"):
        whole._sum_replicas(plain, plain)


def test_user_class_with_native_options_is_not_wrapped(plugin_path):
    collective = collectives.create(
        "my_collective_plugin:WithNativePacking", devices=["/cpu:0", "/cpu:1"], num_packs=3
    )
    assert isinstance(collective, collectives.Checked)  # a plug-in is checked, not wrapped
    assert type(collective.inner).__name__ == "WithNativePacking"
    assert collective.inner.num_packs == 3


def test_register_adds_a_name(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    @collectives.register("my_sum")
    class MySum(collectives.Collective):
        def batch_all_reduce(self, values, destinations):
            return list(values)

    assert "my_sum" in collectives.available()
    created = collectives.create("my_sum", devices=["/cpu:0"])
    assert isinstance(created, MySum) and created.name == "my_sum"


def test_register_misuse(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    with pytest.raises(collectives.CollectiveError) as raised:
        collectives.register("ring")(type("Other", (collectives.Collective,), {
            "batch_all_reduce": lambda self, v, d: list(v)}))
    assert "the name is taken by tfloop.collectives.ring.Ring; pick another name" in str(raised.value)
    with pytest.raises(collectives.CollectiveError) as raised:
        collectives.register("not a name")
    assert "must be an identifier" in str(raised.value)
    with pytest.raises(collectives.CollectiveError) as raised:
        collectives.register("fine")(dict)
    assert "is not a Collective subclass" in str(raised.value)


def test_wrappers_refuse_bad_options():
    inner = collectives.create("ring", devices=["/cpu:0", "/cpu:1"])
    with pytest.raises(collectives.CollectiveError):
        collectives.Packing(inner)  # neither option
    with pytest.raises(collectives.CollectiveError):
        collectives.Packing(inner, num_packs=2, pack_bytes=8)
    with pytest.raises(collectives.CollectiveError):
        collectives.Compression(inner, dtype="float32")
    with pytest.raises(collectives.CollectiveError):
        collectives.Packing("ring", num_packs=2)
