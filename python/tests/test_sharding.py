"""The Python face of the partition layer: what is Python's own (PartitionSpec as a tuple, the
`with` of PartitionManager and Mesh, keyword construction, presets as classes, exception
types) and bad input from Python, each refused with a Python exception naming it."""

import pickle
import threading

import numpy as np
import pytest

import numesh
from numesh import P


def test_readme_example():
    paxis = numesh.PartitionAxis()
    spec = paxis.resolve_spec([numesh.BATCH, numesh.QUERY_LENGTH, numesh.EMBED], numesh.MODE_TRAIN)
    assert spec == P(("fsdp", "dp"), "sp", "tp")
    assert repr(spec) == "P(('fsdp', 'dp'), 'sp', 'tp')"


def test_partition_spec_is_a_canonical_tuple():
    spec = P("dp", ["fsdp"], ("fsdp", "sp"), "", [], 0)
    assert isinstance(spec, tuple)
    assert tuple(spec) == ("dp", "fsdp", ("fsdp", "sp"), None, None, None)
    assert len(spec) == 6 and spec[2] == ("fsdp", "sp")
    assert type(spec[:2]) is tuple  # slicing gives a plain tuple, as in JAX
    assert P(["a", "b"])[0] == ("a", "b")  # a longer list becomes a tuple


def test_partition_spec_equality_and_hash():
    assert P("dp", None) == P("dp", None)
    assert P(None) != P()  # different lengths (eformer relies on it)
    assert P("dp") != ("dp",)  # only another PartitionSpec, as JAX since 2026-04
    assert hash(P("dp", ("a", "b"))) == hash(P("dp", ("a", "b")))
    assert {P("dp"): 1}[P(("dp",))] == 1
    assert pickle.loads(pickle.dumps(P("dp", ("a", "b")))) == P("dp", ("a", "b"))


def test_partition_spec_refuses_nested_tuples_with_jax_message():
    with pytest.raises(ValueError, match="A tuple inside PartitionSpec cannot contain a nested tuple"):
        P(("a", ("b", "c")))


def test_partition_spec_unconstrained():
    spec = P(P.UNCONSTRAINED, "dp")
    assert spec[0] is P.UNCONSTRAINED and spec[0] is numesh.PartitionSpec.UNCONSTRAINED
    assert repr(P.UNCONSTRAINED) == "UNCONSTRAINED"


def test_axis_values_of_other_types_are_refused_by_name():
    with pytest.raises(TypeError, match=r"got 1\.5 of <class 'float'>"):
        P(1.5)
    with pytest.raises(TypeError, match="of <class 'dict'>"):
        numesh.PartitionAxis(head_axis={"a": 1})


def test_partition_axis_keywords_positions_and_fields():
    pa = numesh.PartitionAxis(tensor_parallel_axis="model")
    assert pa.head_axis == "model" and pa.vocab_axis == "model"
    assert pa.batch_axis == ("fsdp", "dp")
    assert pa.expert_gate_axis is None
    assert numesh.PartitionAxis("data").data_parallel_axis == "data"
    assert list(pa.to_dict())[:3] == ["data_parallel_axis", "fully_sharded_data_parallel_axis",
                                      "tensor_parallel_axis"]
    assert repr(pa).startswith("PartitionAxis(data_parallel_axis='dp', ")
    assert pa == numesh.PartitionAxis(tensor_parallel_axis="model")
    assert pa != numesh.PartitionAxis()
    assert hash(pa) == hash(numesh.PartitionAxis(tensor_parallel_axis="model"))
    # replace keeps what is derived (eformer's quirk): head_axis stays 'tp'.
    assert numesh.PartitionAxis().replace(tensor_parallel_axis="model").head_axis == "tp"


def test_partition_axis_errors_are_pythons():
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        numesh.PartitionAxis(nope="x")
    with pytest.raises(TypeError, match="got multiple values for argument 'data_parallel_axis'"):
        numesh.PartitionAxis("dp", data_parallel_axis="x")
    with pytest.raises(TypeError, match="takes from 1 to 28 positional arguments but 29 were given"):
        numesh.PartitionAxis(*(["x"] * 28))
    with pytest.raises(ValueError, match="Partitioning rule `data_parallel_axis` was not resolved."):
        numesh.PartitionAxis(data_parallel_axis=numesh.NOT_GIVEN)
    with pytest.raises(ValueError, match="Unknown semantic axis name: '__NOPE__'"):
        numesh.PartitionAxis().resolve_spec(["__NOPE__"], numesh.MODE_TRAIN)


def test_registry_is_process_wide_and_key_error_carries_the_key():
    numesh.PartitionAxis.register("__X__", "expert_parallel_axis")
    assert numesh.PartitionAxis().resolve_spec(["__X__"], numesh.MODE_TRAIN) == P("ep")
    assert "__X__" in numesh.PartitionAxis.get_registered_axes()
    numesh.PartitionAxis.unregister("__X__")
    with pytest.raises(KeyError) as raised:
        numesh.PartitionAxis.unregister("__X__", missing_ok=False)
    assert raised.value.args[0] == "Semantic axis '__X__' is not registered."


def test_modes_and_dimension_modes():
    # decode_batch_axis="dp": BATCH resolves differently in train and decode, so every check
    # below tells which mode was used.
    pm = numesh.PartitionManager(numesh.PartitionAxis(decode_batch_axis="dp"))
    axes = [numesh.BATCH]
    train, decode = P(("fsdp", "dp")), P("dp")
    assert pm.resolve(axes, numesh.MODE_TRAIN) == train and pm.resolve(axes, numesh.MODE_DECODE) == decode
    assert pm.paxis.resolve_spec(axes, "__something_else__") == train  # any other mode: train
    assert pm.resolve(axes, 1, shape=(2, 1)) == decode
    assert pm.resolve(axes, 1, shape=(2, 5)) == train
    assert pm.resolve(axes, True, shape=(2, 1)) == decode  # a bool is an int
    assert pm.resolve(axes, -1, shape=(1, 1)) == decode
    with pytest.raises(ValueError, match="when using dynamic mode detection shape should be provided"):
        pm.resolve(axes, 1)
    with pytest.raises(IndexError, match="tuple index out of range"):
        pm.resolve(axes, 5, shape=(2, 1))
    with pytest.raises(IndexError, match="cannot fit 'int' into an index-sized integer"):
        pm.resolve(axes, 2**70, shape=(2, 1))
    # NumPy integers are not Python ints: eformer's isinstance(mode, int) treats them as train.
    assert pm.resolve(axes, np.int64(1), shape=(2, 1)) == train
    # With a named mode the shape is not looked at, as in eformer.
    assert pm.resolve(axes, numesh.MODE_DECODE, shape="not a shape") == decode


def test_manager_follows_its_paxis_and_hashes():
    pm = numesh.PartitionManager()
    pm.paxis = numesh.PartitionAxis(tensor_parallel_axis="model")
    assert pm.resolve([numesh.EMBED], numesh.MODE_TRAIN) == P("model")
    with pytest.raises(TypeError, match="Expected PartitionAxis, got <class 'int'>"):
        pm.paxis = 3
    assert hash(pm) == hash(numesh.PartitionManager(numesh.PartitionAxis(tensor_parallel_axis="model")))
    assert len({pm, numesh.PartitionManager(pm.paxis)}) == 1


def test_one_manager_entered_from_two_threads():
    pm = numesh.PartitionManager()
    inside = threading.Barrier(2)
    errors = []

    def enter_and_leave():
        try:
            with pm:
                inside.wait(timeout=10)
                assert numesh.get_current_partition_manager() is pm
            assert numesh.get_current_partition_manager() is None
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=enter_and_leave) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    pm.__exit__(None, None, None)  # an exit without an enter does nothing, as in eformer


def test_copies_and_pickles():
    import copy

    assert copy.deepcopy(numesh.NOT_GIVEN) is numesh.NOT_GIVEN
    assert pickle.loads(pickle.dumps(numesh.NOT_GIVEN)) is numesh.NOT_GIVEN
    assert pickle.loads(pickle.dumps(P(P.UNCONSTRAINED, "dp"))) == P(P.UNCONSTRAINED, "dp")
    pa = numesh.PartitionAxis(tensor_parallel_axis="model", head_axis=("a", "b"))
    assert pickle.loads(pickle.dumps(pa)) == pa and copy.deepcopy(pa) == pa


def test_integers_as_axis_values():
    assert P(np.int64(3)) == P(3)
    with pytest.raises(ValueError, match="does not fit an axis value"):
        P(2**70)


def test_presets_are_classes_passed_as_axes_or_dynamic_axes():
    assert issubclass(numesh.HiddenStateSharding, numesh.DynamicShardingAxes)
    assert numesh.HiddenStateSharding.mode == 1
    pm = numesh.PartitionManager()
    assert pm.resolve(numesh.ColumnWise) == P(("fsdp", "sp"), "tp")
    assert pm.resolve(dynamic_axes=numesh.Replicated) == P(None)
    instance = numesh.DynamicShardingAxes([numesh.EMBED], numesh.MODE_TRAIN)
    assert pm.resolve(instance) == P("tp")
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'axes'"):
        pm.resolve([numesh.BATCH], dynamic_axes=None)


def test_partition_manager_context_and_threads():
    with pytest.raises(TypeError, match="Expected PartitionAxis, got <class 'str'>"):
        numesh.PartitionManager("x")
    a = numesh.PartitionManager(numesh.PartitionAxis(tensor_parallel_axis="a"))
    b = numesh.PartitionManager(numesh.PartitionAxis(tensor_parallel_axis="b"))
    assert numesh.get_partition_manager() is b
    assert numesh.get_current_partition_manager() is None
    seen = {}
    with a:
        with a:
            assert numesh.get_current_partition_manager() is a
        assert numesh.get_current_partition_manager() is a
        assert numesh.get_partition_manager() is a

        def probe():
            seen["current"] = numesh.get_current_partition_manager()
            seen["last"] = numesh.get_partition_manager()

        t = threading.Thread(target=probe)
        t.start()
        t.join()
    assert numesh.get_current_partition_manager() is None
    assert seen == {"current": None, "last": a}


def test_mesh_context_and_corrected_sharding():
    mesh = numesh.create_mesh((2, -1), ("dp", "tp"), device_count=8)
    assert mesh.shape == {"dp": 2, "tp": 4} and mesh.axis_names == ("dp", "tp") and mesh.size == 8
    assert numesh.get_incontext_mesh(raise_error=False).empty
    with pytest.raises(AssertionError, match="No mesh found under this context manager."):
        numesh.get_incontext_mesh()
    with pytest.raises(AssertionError, match="No mesh found under this context manager."):
        numesh.get_corrected_named_sharding((3, 8), P("dp", "tp"))
    with mesh as entered:
        assert entered is mesh
        assert numesh.get_incontext_mesh() == mesh
        s = numesh.get_corrected_named_sharding((3, 8), P("dp", "tp"))
        assert s.spec == P(None, "tp") and s.mesh == mesh
        assert numesh.with_sharding_constraint(np.zeros((4, 8)), P("dp")).spec == P("dp", None)
        assert numesh.with_sharding_constraint((4, 8), P()) is None
        pm = numesh.PartitionManager()
        assert pm.shard(np.zeros((8, 1, 16)), numesh.HiddenStateSharding).spec == P(None, None, "tp")
    assert numesh.get_incontext_mesh(raise_error=False).empty
    with pytest.warns(UserWarning, match="Active mesh is empty"):
        numesh.get_corrected_named_sharding((3, 8), P("dp"), raise_mesh_error=False)


def test_named_sharding_validation_is_jaxs():
    mesh = numesh.Mesh(["dp", "tp"], [2, 4])
    with pytest.raises(numesh.DuplicateSpecError, match="has duplicate entries for `dp`"):
        numesh.NamedSharding(mesh, P("dp", "dp"))
    assert not issubclass(numesh.DuplicateSpecError, ValueError)
    with pytest.raises(ValueError, match=r"Resource axis: model of P\('model',\) is not found in mesh"):
        numesh.NamedSharding(mesh, P("model"))
    assert repr(numesh.NamedSharding(mesh, P("dp"))) == (
        "NamedSharding(mesh=Mesh('dp': 2, 'tp': 4), spec=P('dp',))")


def test_bad_meshes_and_shapes():
    with pytest.raises(ValueError):
        numesh.Mesh(["dp", "dp"], [2, 2])
    with pytest.raises(ValueError, match="cannot reshape array of size 6"):
        numesh.create_mesh((4, -1), ("dp", "tp"), device_count=6)
    with numesh.Mesh(["dp"], [2]):
        with pytest.raises(TypeError, match="a shape is a tuple or list of ints"):
            numesh.get_corrected_named_sharding("8", P("dp"))
        with pytest.raises(TypeError, match=r"holds 2\.0 of <class 'float'>"):
            numesh.get_corrected_named_sharding((2.0,), P("dp"))
        with pytest.raises(TypeError, match="Unsupported sharding type: <class 'str'>"):
            numesh.with_sharding_constraint((2,), "dp")
        with pytest.raises(TypeError, match="Unsupported sharding type: <class 'tuple'>"):
            numesh.with_sharding_constraint((2,), ("dp",))  # a P, not a plain tuple, as eformer
    with pytest.raises(ValueError, match="does not fit 64 bits"):
        with numesh.Mesh(["dp"], [2]):
            numesh.get_corrected_named_sharding((2**70,), P("dp"))


def test_create_mesh_defaults_to_the_machines_devices():
    mesh = numesh.create_mesh()
    assert mesh.axis_names == ("dp", "fsdp", "ep", "tp", "sp")
    assert mesh.size >= 1 and mesh.shape["fsdp"] == mesh.size


def test_errors_without_a_python_counterpart_are_numesh_errors():
    with pytest.raises(numesh.Error, match="hwloc rejected the synthetic topology description 'nonsense:2'"):
        numesh.Topology.from_synthetic("nonsense:2")
    # The eformer-mirroring ones are Python's own types, not numesh.Error.
    with pytest.raises(ValueError) as raised:
        numesh.PartitionAxis().resolve_spec(["__NOPE__"], numesh.MODE_TRAIN)
    assert not isinstance(raised.value, numesh.Error)


def test_easydel_attention_shardings():
    pm = numesh.PartitionManager()
    r = numesh.easydel.get_shardings(pm, numesh.MODE_TRAIN)
    assert r["query"] == P(("fsdp", "dp"), "sp", "tp", None) and r["softmax_aux"] is None
    assert numesh.easydel.get_shardings(pm, numesh.MODE_TRAIN, softmax_aux=np.zeros((4, 2)))["softmax_aux"] == P(None, "tp")
    with pytest.raises(NotImplementedError, match="Layout 'thd' is not implemented"):
        numesh.easydel.get_shardings(pm, numesh.MODE_TRAIN, layout="thd")
    with pytest.raises(TypeError, match="Expected PartitionManager"):
        numesh.easydel.get_shardings(numesh.PartitionAxis(), numesh.MODE_TRAIN)


def test_pytrees_nested_names_and_caller_keys():
    mesh = numesh.create_mesh((2, -1), ("dp", "tp"), device_count=8)
    # with_sharding_constraint maps over a pytree's leaves; other leaves stay as they are.
    with mesh:
        out = numesh.with_sharding_constraint({"a": np.zeros((4, 8)), "b": [np.zeros((8,)), 3.0, None]}, P("dp"))
    assert out["a"].spec == P("dp", None) and out["b"][0].spec == P("dp")
    assert out["b"][1] == 3.0 and out["b"][2] is None
    # A list of ints is still a shape, not a tree.
    with mesh:
        assert numesh.with_sharding_constraint([4, 8], P("dp")).spec == P("dp", None)
    # Names nested to any depth, as eformer's recursion collects them.
    assert numesh.get_names_from_partition_spec([["tp", ["dp", ["sp"]]], None]) == ["dp", "sp", "tp"]
    # Each converted spec under the caller's own key, of whatever type.
    converted = numesh.convert_sharding_strategy(np.zeros((8, 8)), {1: P("tp"), "1": P()}, mesh, mesh)
    assert list(converted) == [1, "1"]
    assert numesh.convert_sharding_strategy(np.zeros((8, 8)), {1: P("tp")}, mesh, mesh, "other") == {}
