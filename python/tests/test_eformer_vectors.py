"""eformer's golden vectors (tests/data/eformer, the files the C++ runner eformer_conformance
reads) evaluated through the Python API: each case is a test, its result compared whole with
what eformer returned, errors by Python type and message.

Every file is covered, all 3,575 cases: auto_partition_spec, constants, corrected_sharding,
easydel_attention, easydel_misc, helpers, manager_resolve, match_partition_rules, mesh, misc,
partition_axis_fields, presets, registry, resolve_spec, shard, sharding_strategy, and
derived_from_source (cases derived from eformer's and EasyDeL's code, each evaluated by the
evaluator of the file it names, as the C++ runner does). Cases where numesh differs
on purpose give the value docs/eformer-compat.md states for them (DOCUMENTED).
"""

import ast
import contextlib
import copy
import json
import re
import threading
import warnings

import pytest

import numesh
from conftest import ROOT, VECTORS

COVERED = {
    "auto_partition_spec.json",
    "easydel_attention.json",
    "mesh.json",
    "constants.json",
    "partition_axis_fields.json",
    "resolve_spec.json",
    "registry.json",
    "manager_resolve.json",
    "presets.json",
    "corrected_sharding.json",
    "shard.json",
    "match_partition_rules.json",
    "easydel_misc.json",
    "sharding_strategy.json",
    "helpers.json",
    "misc.json",
    "derived_from_source.json",
}
# Where numesh's Python API departs from eformer on purpose (docs/eformer-compat.md), by case
# id: the value numesh gives instead. eformer's LOG_SHARDING_MOVE (a logging switch) has no
# counterpart in numesh.
DOCUMENTED = {
    ("constants.json", "mesh_defaults"): lambda case: {
        k: v for k, v in case["expected"].items() if k != "LOG_SHARDING_MOVE"
    },
}
# eformer's vrn_auto_partition_spec calls names.copy(), so a tuple of names raises
# AttributeError there; numesh takes any sequence: the tuple gives what the list gives.
for _mesh in ("dp1_fsdp8", "dp2_fsdp2_tp2", "fsdp4_ep2_tp2_sp2", "all_ones", "fsdp3_tp2", "ep4_tp2"):
    DOCUMENTED[("auto_partition_spec.json", f"vrn_auto_partition_spec/{_mesh}/names_as_tuple")] = (
        lambda case: eval_auto_partition_spec(None, {"inputs": {
            **{k: v for k, v in case["inputs"].items() if k != "names_tuple"},
            "names": case["inputs"]["names_tuple"]}}))


def without(value, pointers):
    """`value` with the members the JSON Pointers name removed."""
    out = copy.deepcopy(value)
    for pointer in pointers:
        *parents, last = pointer.lstrip("/").split("/")
        node = out
        for key in parents:
            node = node[key]
        node.pop(last, None)
    return out


def documented(value, pointers):
    """A DOCUMENTED entry from eformer-compat.md: the value it states numesh returns, which
    must equal eformer's but at the pointers the item names (as the C++ runner checks)."""
    def numesh_value(case):
        if pointers:
            assert without(value, pointers) == without(case["expected"], pointers), pointers
        return value
    return numesh_value


def compat_doc_items():
    """docs/eformer-compat.md's "Vector cases that differ" that state numesh's value:
    {(file, case id): (value, pointers where it alone differs from eformer's)}."""
    items, key, section, fenced = {}, None, False, False
    for line in (ROOT / "docs" / "eformer-compat.md").read_text().splitlines():
        if line.startswith("## "):
            section = line == "## Vector cases that differ"
        fenced ^= line.startswith("```")
        if not section or fenced:
            continue
        head = re.match(r"- `([\w.]+\.json):(.+?)`: ", line)
        value = re.match(r"  - numesh returns: `(.*)`$", line)
        at = re.match(r"  - differs from eformer's only at: (.*)$", line)
        if head:
            key = (head[1], head[2])
        elif value:
            items[key] = (json.loads(value[1]), [])
        elif at and key in items:
            items[key] = (items[key][0], re.findall(r"`([^`]*)`", at[1]))
    return items


# The divergences the C++ runner checks by eformer-compat.md's stated value (the entries above
# compute theirs).
for _key, (_value, _pointers) in compat_doc_items().items():
    DOCUMENTED.setdefault(_key, documented(_value, _pointers))

# The six PartitionAxis configurations that files naming a config without defining one use
# (resolve_spec.json defines them).
SHARED_CONFIGS = json.loads((VECTORS / "resolve_spec.json").read_text())["partition_axis_configs"]


# --- the vectors' JSON encoding (their "conventions") ---------------------------------------

def decode_rule(j):
    if isinstance(j, list):
        return tuple(decode_rule(m) for m in j)
    if isinstance(j, dict):
        if "$not_given" in j:
            return numesh.NOT_GIVEN
        if "$unconstrained" in j:
            return numesh.P.UNCONSTRAINED
        if "$int" in j:
            return j["$int"]
        raise ValueError(f"cannot decode axis value {j!r}")
    return j


def decode_list_rule(j):
    # registry.json's rules were Python lists (the nested-tuple error message shows which).
    return [decode_list_rule(m) for m in j] if isinstance(j, list) else decode_rule(j)


def encode(value):
    if value is None or isinstance(value, str):
        return value
    if value is numesh.NOT_GIVEN:
        return {"$not_given": True}
    if value is numesh.P.UNCONSTRAINED:
        return {"$unconstrained": True}
    if isinstance(value, int):
        return {"$int": value}
    if isinstance(value, (tuple, list)):
        return [encode(m) for m in value]
    raise TypeError(f"cannot encode {value!r}")


def encode_error(e):
    message = e.args[0] if isinstance(e, KeyError) and e.args and isinstance(e.args[0], str) else str(e)
    return {"type": type(e).__name__, "message": message}


def keyed(key, fn):
    """{key: fn()}, or {"error": ...}: how the vectors write a result or an error."""
    try:
        return {key: fn()}
    except Exception as e:  # noqa: BLE001  (the type is what is compared)
        return {"error": encode_error(e)}


def capture(fn):
    return keyed("ok", fn)


def value_or_error(fn):
    """fn()'s value itself, or {"error": ...} (cases whose expected value is the result)."""
    result = capture(fn)
    return result["ok"] if "ok" in result else result


def paxis(file, inputs):
    configs = file.get("partition_axis_configs", SHARED_CONFIGS)
    kwargs = configs[inputs["partition_axis"]]
    return numesh.PartitionAxis(**{k: decode_rule(v) for k, v in kwargs.items()})


def mesh_value(j):
    """The vector's mesh; none (null) is None."""
    return None if j is None else numesh.Mesh(j["names"], j["sizes"])


def mesh(j):
    """The vector's mesh for a `with` block; none (null) is no mesh."""
    return contextlib.nullcontext() if j is None else mesh_value(j)


def fields(pa):
    return {name: encode(value) for name, value in pa.to_dict().items()}


def resolve_result(pa, axes, mode):
    out = {}
    try:
        raw = pa.resolve_axis(axes, mode)
        out["resolve_axis"] = {"ok": encode(raw)}
    except Exception as e:  # noqa: BLE001
        out["resolve_axis"] = {"error": encode_error(e)}
        out["error"] = encode_error(e)
        return out
    try:
        spec = pa.resolve_spec(axes, mode)
        # resolve_spec is P(*resolve_axis(...)): the two must agree.
        assert spec == numesh.P(*raw), (spec, raw)
        out["spec"] = encode(list(spec))
    except AssertionError:
        raise
    except Exception as e:  # noqa: BLE001
        out["error"] = encode_error(e)
    return out


def spec_or_error(fn):
    return keyed("spec", lambda: encode(list(fn())))


def decode_spec(j):
    return numesh.P(*[decode_rule(e) for e in j])


def decode_tree(j):
    """An encoded pytree as Python values: {"$array": ...} an ArrayLike, {"$python": v} the
    plain value v."""
    if isinstance(j, dict):
        if "$array" in j:
            return ArrayLike(j["$array"])
        if "$python" in j:
            return j["$python"]
        return {k: decode_tree(v) for k, v in j.items()}
    return [decode_tree(v) for v in j] if isinstance(j, list) else j


def spec_tree(tree, specs):
    """The specs the vectors give as raw lists, one at each leaf of the encoded `tree`, as a
    tree of P with its structure (eformer's partition_specs argument)."""
    if tree is None:
        return None
    if isinstance(tree, dict) and "$array" not in tree and "$python" not in tree:
        return {k: spec_tree(v, specs[k]) for k, v in tree.items()}
    if isinstance(tree, list):
        return [spec_tree(v, s) for v, s in zip(tree, specs)]
    return decode_spec(specs)


def encode_tree(t):
    """A result tree in the vectors' encoding: a P leaf is {"$spec": [...]}."""
    if isinstance(t, numesh.PartitionSpec):
        return {"$spec": encode(list(t))}
    if isinstance(t, dict):
        return {k: encode_tree(v) for k, v in t.items()}
    return [encode_tree(v) for v in t] if isinstance(t, list) else t


def constraint(applied):
    if applied is None:
        return {"constraint_applied": False, "returned_same_object": True}
    return {"constraint_applied": True, "applied_spec": encode(list(applied.spec)), "n_constraints": 1}


def preset_json(preset):
    return {"axes": encode(list(preset.axes)), "mode": preset.mode}


# --- one evaluator per file ------------------------------------------------------------------

def eval_constants(file, case):
    cid = case["id"]
    if cid == "semantic_tokens":
        return {name: getattr(numesh, name) for name in case["expected"]}
    if cid == "mode_constants":
        return {
            "MODE_TRAIN": numesh.MODE_TRAIN,
            "MODE_PREFILL": numesh.MODE_PREFILL,
            "MODE_DECODE": numesh.MODE_DECODE,
            "MODE_INSERT": numesh.MODE_INSERT,
            "GENERATION_MODES": [numesh.MODE_DECODE, numesh.MODE_INSERT]
            if numesh.GENERATION_MODES == {numesh.MODE_DECODE, numesh.MODE_INSERT}
            else sorted(numesh.GENERATION_MODES),
        }
    if cid == "semantic_map":
        return numesh.common_types._SEMANTIC_MAP
    if cid == "standard_to_generation_attr_map":
        return numesh.common_types._STANDARD_TO_GENERATION_ATTR_MAP
    if cid == "presets":
        return {name: preset_json(p) for name, p in numesh.PRESETS.items()}
    if cid == "mesh_defaults":
        return {
            "DEFAULT_SHARDING_STG": list(numesh.DEFAULT_SHARDING_STG),
            "DEFAULT_NAMED_SHARDING_STG": list(numesh.DEFAULT_NAMED_SHARDING_STG),
            "MIN_SHARDING_SIZE": numesh.MIN_SHARDING_SIZE,
            "DEFAULT_MASK_VALUE": numesh.DEFAULT_MASK_VALUE,
        }
    raise AssertionError(f"unknown constants case {cid}")


def eval_partition_axis_fields(file, case):
    i = case["inputs"]

    def run():
        if "args" in i:
            return fields(numesh.PartitionAxis(*[decode_rule(a) for a in i["args"]]))
        if "replace" in i:
            base = numesh.PartitionAxis(**{k: decode_rule(v) for k, v in i["base_kwargs"].items()})
            return fields(base.replace(**{k: decode_rule(v) for k, v in i["replace"].items()}))
        return fields(numesh.PartitionAxis(**{k: decode_rule(v) for k, v in i["kwargs"].items()}))

    return capture(run)


def eval_resolve_spec(file, case):
    i = case["inputs"]
    return resolve_result(paxis(file, i), [decode_rule(a) for a in i["axes"]], i["mode"])


def eval_presets(file, case):
    i = case["inputs"]
    pa = paxis(file, i)
    preset = numesh.PRESETS[i["preset"]]
    if "axes" in i:
        assert encode(list(preset.axes)) == i["axes"], "the preset's axes are not eformer's"
        return resolve_result(pa, list(preset.axes), i["mode"])
    pm = numesh.PartitionManager(pa)
    kw = {"shape": tuple(i["shape"])} if "shape" in i else {}
    return spec_or_error(lambda: pm.resolve(preset, **kw))


def dynamic(j):
    if "preset" in j:
        return numesh.PRESETS[j["preset"]]
    return numesh.DynamicShardingAxes([decode_rule(a) for a in j["axes"]], j["mode"])


def eval_manager_resolve(file, case):
    i = case["inputs"]
    if "paxis" in i:
        return capture(lambda: numesh.PartitionManager(i["paxis"]) and None)
    pm = numesh.PartitionManager(paxis(file, i))
    kw = {}
    if "axes" in i:
        axes = i["axes"]
        kw["axes"] = dynamic(axes.get("dynamic", axes)) if isinstance(axes, dict) else [
            decode_rule(a) for a in axes]
    if "axes_tuple" in i:
        kw["axes"] = tuple(decode_rule(a) for a in i["axes_tuple"])
    if "mode" in i:
        kw["mode"] = i["mode"]
    if "dynamic_axes" in i:
        kw["dynamic_axes"] = None if i["dynamic_axes"] is None else dynamic(i["dynamic_axes"])
    if "shape" in i:
        kw["shape"] = tuple(i["shape"])
    return spec_or_error(lambda: pm.resolve(**kw))


def eval_corrected_sharding(file, case):
    i = case["inputs"]
    cid = case["id"]
    if cid.startswith("gcns/"):
        with mesh(i["mesh"]), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                s = numesh.get_corrected_named_sharding(
                    tuple(i["shape"]), numesh.P(*[decode_rule(e) for e in i["spec"]]),
                    raise_mesh_error=i.get("raise_mesh_error", True))
            except Exception as e:  # noqa: BLE001
                return {"error": encode_error(e)}
        out = {"spec": encode(list(s.spec)), "warnings": [str(w.message) for w in caught]}
        if s.mesh.empty:
            out["mesh_empty"] = True
        return out
    if "tree" in i:
        return constrain_tree(i)
    # An array is passed as its shape; derived_from_source.json also constrains plain values.
    x = tuple(i["array"]["shape"]) if "array" in i else i["value"]
    if "named_sharding_spec" in i:
        context = mesh(i["context_mesh"])
        target = numesh.NamedSharding(mesh(i["mesh"]), numesh.P(*[decode_rule(e) for e in i["named_sharding_spec"]]))
    else:
        context = mesh(i["mesh"])
        target = sharding_argument(i)
    with context:
        try:
            applied = numesh.with_sharding_constraint(x, target)
        except Exception as e:  # noqa: BLE001
            return {"error": encode_error(e)}
    if applied is None:
        return {"constraint_applied": False, "returned_same_object": True}
    return {"constraint_applied": True, "applied_spec": encode(list(applied.spec))}


def constrain_tree(i):
    """with_sharding_constraint over a pytree ({"shape": ...} an array leaf): the array leaves'
    applied specs in JAX's leaf order (dict keys sorted), the non-array leaf as returned, and
    whether the None leaf stayed None."""
    import numpy as np

    def build(j):
        if isinstance(j, dict) and set(j) == {"shape"}:
            return np.zeros(j["shape"], np.float32)
        if isinstance(j, dict):
            return {k: build(v) for k, v in j.items()}
        if isinstance(j, list):
            return [build(v) for v in j]
        return j

    tree = build(i["tree"])
    with mesh(i["mesh"]):
        try:
            out = numesh.with_sharding_constraint(tree, numesh.P(*[decode_rule(e) for e in i["spec"]]))
        except Exception as e:  # noqa: BLE001
            return {"error": encode_error(e)}
    applied, non_array, none_kept = [], None, True

    def walk(given, got):
        nonlocal non_array, none_kept
        if isinstance(given, dict):
            assert isinstance(got, dict) and list(got) == list(given)
            for k in sorted(given):
                walk(given[k], got[k])
        elif isinstance(given, list):
            assert isinstance(got, list) and len(got) == len(given)
            for a, b in zip(given, got):
                walk(a, b)
        elif hasattr(given, "shape"):
            applied.append(encode(list(got.spec)) if got is not None else None)
        elif given is None:
            none_kept = none_kept and got is None
        else:
            assert got is given  # returned untouched
            non_array = got

    walk(tree, out)
    return {"applied_specs_in_leaf_order": applied, "non_array_leaf_returned": non_array,
            "none_kept": none_kept}


def sharding_argument(i):
    """The P a case constrains to, or the plain tuple or list it passes instead
    (derived_from_source.json's `sharding` of `sharding_type`)."""
    if "sharding" not in i:
        return numesh.P(*[decode_rule(e) for e in i["spec"]])
    return {"tuple": tuple, "list": list}[i["sharding_type"]](decode_rule(e) for e in i["sharding"])


def eval_shard(file, case):
    i = case["inputs"]
    cid = case["id"]
    if cid.startswith("apply_logical_sharding/"):
        def run():
            if not i:
                return constraint(numesh.apply_logical_sharding((1,), axes=[numesh.EMPTY], mode=numesh.MODE_TRAIN))

            def manager(hidden):
                return numesh.PartitionManager(numesh.PartitionAxis(hidden_state_axis=decode_rule(hidden)))

            last_hidden = i["last_created_manager_hidden_state_axis"]
            context = explicit = None
            if i["context_manager_hidden_state_axis"] is not None:
                context = manager(i["context_manager_hidden_state_axis"])
            if i["explicit_manager_hidden_state_axis"] is not None:
                explicit = manager(i["explicit_manager_hidden_state_axis"])
            manager(last_hidden)  # created last, as eformer's script does
            pm_arg = None if (explicit is None or i.get("partition_manager_arg_none")) else explicit

            def apply():
                with mesh(i["mesh"]):
                    return constraint(numesh.apply_logical_sharding(
                        tuple(i["array"]["shape"]), partition_manager=pm_arg,
                        axes=[decode_rule(a) for a in i["axes"]], mode=numesh.MODE_TRAIN))

            if context is None:
                return apply()
            with context:
                manager(last_hidden)
                return apply()

        return capture(run)
    pm = numesh.PartitionManager(paxis(file, i))
    if "dynamic_axes" in i:
        kw = {"dynamic_axes": numesh.PRESETS[i["dynamic_axes"]]}
    else:
        kw = {"axes": [decode_rule(a) for a in i["axes"]], "mode": i["mode"]}
    with mesh(i["mesh"]):
        return capture(lambda: constraint(pm.shard(tuple(i["array"]["shape"]),
                                                   auto_correct=i.get("auto_correct", True), **kw)))


def eval_registry(file, case):
    steps = []
    for s in case["steps"]:
        step = s["step"]
        op = step["op"]
        if op == "register":
            name = step["name"]  # as eformer, any object: str(name) names the axis
            kw = {"override": step.get("override", False)}
            if "generation_axis_rule" in step:
                kw["generation_axis_rule"] = decode_rule(step["generation_axis_rule"])
            result = capture(lambda: numesh.PartitionAxis.register(name, decode_list_rule(step["rule"]), **kw))
        elif op == "unregister":
            name = step["name"]
            result = capture(lambda: numesh.PartitionAxis.unregister(
                name, missing_ok=step.get("missing_ok", True)))
        elif op == "clear":
            numesh.PartitionAxis.clear_registered_axes()
            result = {"ok": None}
        elif op == "get_registered_axes":
            result = {"ok": {name: {k: encode(v) for k, v in e.items()}
                             for name, e in numesh.PartitionAxis.get_registered_axes().items()}}
        elif op == "resolve":
            pa = numesh.PartitionAxis(**{k: decode_rule(v) for k, v in step.get("kwargs", {}).items()})
            result = resolve_result(pa, [decode_rule(a) for a in step["axes"]], step["mode"])
        else:
            raise AssertionError(f"unknown registry op {op}")
        steps.append({"step": step, "result": result})
    return {"steps": steps}


class ArrayLike:
    """What eformer's array argument needs: a shape and a dtype (no memory for the vectors'
    [32000, 4096] arrays)."""

    def __init__(self, j):
        self.shape, self.dtype = tuple(j["shape"]), j["dtype"]


def eval_auto_partition_spec(file, case):
    i = case["inputs"]
    fn = getattr(numesh, i["fn"])
    x = ArrayLike(i["array"]) if "array" in i else i["value"]
    kw = {}
    if "mesh" in i:
        kw["mesh"] = numesh.Mesh(i["mesh"]["names"], i["mesh"]["sizes"])
    if i.get("names") is not None:
        kw["names"] = [decode_rule(n) for n in i["names"]]
    if i.get("names_tuple") is not None:
        kw["names"] = tuple(decode_rule(n) for n in i["names_tuple"])
    if i.get("min_sharding_size") is not None:
        kw["min_sharding_size"] = i["min_sharding_size"]
    if isinstance(i.get("reverse"), bool):
        kw["reverse"] = i["reverse"]
    with mesh(i.get("context_mesh")):
        return spec_or_error(lambda: fn(x, **kw))


def eval_mesh(file, case):
    i = case["inputs"]
    fn = i["fn"]
    if fn == "np.arange(n_devices).reshape(axis_dims).shape":
        # eformer's create_mesh resolves its dims so: numesh's create_mesh does the same.
        names = [f"a{k}" for k in range(len(i["axis_dims"]))]
        return capture(lambda: list(numesh.create_mesh(i["axis_dims"], names, device_count=i["n_devices"]).axis_sizes))
    if fn == "create_mesh":
        def run():
            m = numesh.create_mesh(i["axis_dims"], i["axis_names"], device_count=i["n_devices"],
                                   process_count=i.get("process_count", 1),
                                   dcn_mesh_dims=i.get("dcn_mesh_dims"))
            return {"names": list(m.axis_names), "sizes": list(m.axis_sizes)}
        return capture(run)
    if fn == "calculate_host_mesh_shape":
        return capture(lambda: numesh.calculate_host_mesh_shape(i["global_mesh_shape"], i["total_devices"],
                                                                i["num_processes"]))
    if fn == "fill_minus_one_to_target":
        return capture(lambda: numesh.fill_minus_one_to_target(i["shape"], i["target"]))
    if fn == "parse_mesh_from_string":
        def run():
            dims, names = numesh.parse_mesh_from_string(i["axis_dims"], i["names"])
            return {"axis_dims": list(dims), "axis_names": list(names)}
        return capture(run)
    if fn == "MeshPartitionHelper":
        def run():
            helper = numesh.MeshPartitionHelper(numesh.Mesh(i["mesh"]["names"], i["mesh"]["sizes"]))
            methods = helper.suggest_methods(i["shape"])
            return {"methods": [list(m) for m in methods],
                    "spec_min1024": encode(list(helper.create_partition_spec(i["shape"], methods, 1024))),
                    "spec_min1": encode(list(helper.create_partition_spec(i["shape"], methods, 1)))}
        return capture(run)
    assert fn == "_normalize_axis_types", fn
    # JAX's AxisType members by name (numesh has no JAX to give the members themselves).
    return capture(lambda: numesh._numesh._normalize_axis_types(i["axis_names"], i["axis_types"]))


def eval_easydel_attention(file, case):
    i = case["inputs"]
    pm = numesh.PartitionManager(paxis(file, i))
    aux = None if i["softmax_aux_shape"] is None else ArrayLike({"shape": i["softmax_aux_shape"], "dtype": "float32"})
    try:
        r = numesh.easydel.get_shardings(pm, i["mode"], i["layout"], i["qkv_mni_sharding"], aux)
    except Exception as e:  # noqa: BLE001
        return {"error": encode_error(e)}
    return {k: None if v is None else encode(list(v)) for k, v in r.items()}


def eval_match_partition_rules(file, case):
    i = case["inputs"]
    rules = [(pattern, decode_spec(spec)) for pattern, spec in i["rules"]]
    kw = {k: i[k] for k in ("min_size", "strict") if k in i}
    return keyed("tree", lambda: encode_tree(numesh.match_partition_rules(rules, decode_tree(i["tree"]), **kw)))


def manager_for(file, i):
    if "partition_axis_kwargs" in i:
        kwargs = i["partition_axis_kwargs"]
        return numesh.PartitionManager(numesh.PartitionAxis(**{k: decode_rule(v) for k, v in kwargs.items()}))
    return numesh.PartitionManager(paxis(file, i))


def optional_spec(j):
    return None if j is None else decode_spec(j)


def encode_optional_spec(spec):
    return None if spec is None else encode(list(spec))


def array_of_shape(shape):
    return None if shape is None else ArrayLike({"shape": shape, "dtype": "float32"})


def mesh_shape_ep(file, i):
    sizes, names = numesh.easydel.mesh_shape_ep(mesh_value(i["mesh"]), manager_for(file, i),
                                                i["fsdp_is_ep_bound"], i["sp_is_ep_bound"])
    return {"sizes": list(sizes), "names": [encode(n) for n in names]}


def create_stable_sharding(file, i):
    return encode_optional_spec(numesh.easydel.create_stable_sharding(
        optional_spec(i["state_ps"]), i["preserved_indices"], optional_spec(i["clone_ps"]),
        dep=None if i["dep_is_none"] else True, tensor=array_of_shape(i["tensor_shape"]),
        mesh=mesh_value(i["mesh"])))


def resolve_safe_sharding(file, i):
    # `axes` names a preset (the class is passed) or lists semantic axes; a case with a
    # `partition_manager` key passes None.
    axes = numesh.PRESETS[i["axes"]] if isinstance(i["axes"], str) else [decode_rule(a) for a in i["axes"]]
    pm = None if "partition_manager" in i else manager_for(file, i)
    kw = {"mode": i["mode"]} if i.get("mode") is not None else {}
    spec = numesh.easydel.resolve_safe_sharding(axes=axes, shape=tuple(i["shape"]), partition_manager=pm,
                                                mesh=mesh_value(i["mesh"]), **kw)
    return {"$returned_axes_unchanged": True} if spec is axes else encode(list(spec))


def sanitize_partition_spec_for_shape(file, i):
    m = mesh_value(i["mesh"])
    spec = numesh.easydel.sanitize_partition_spec_for_shape(decode_spec(i["spec"]), tuple(i["shape"]), m)

    def named_sharding():
        numesh.NamedSharding(m, spec)  # JAX's validation, which EasyDeL meets next
        return True

    return {"spec": encode(list(spec)), "named_sharding": capture(named_sharding)}


EASYDEL_MISC = {
    "_mesh_shape_ep": mesh_shape_ep,
    "create_stable_sharding": create_stable_sharding,
    "get_mode": lambda file, i: numesh.easydel.get_mode(array_of_shape(i["query_shape"]), i["BTHD"]),
    "_generalize_numeric_path": lambda file, i: numesh.easydel.generalize_numeric_path(i["pattern"]),
    "resolve_safe_sharding": resolve_safe_sharding,
    "sanitize_partition_spec_for_shape": sanitize_partition_spec_for_shape,
}


def eval_easydel_misc(file, case):
    i = case["inputs"]
    if i["fn"] == "get_moe_partition_spec":
        kw = {k: i[k] for k in ("is_bias", "fsdp_is_ep_bound", "sp_is_ep_bound", "module_view") if k in i}
        return spec_or_error(lambda: numesh.easydel.get_moe_partition_spec(
            manager_for(file, i), i["direction"], i["tensors_are_expert"], **kw))
    return capture(lambda: EASYDEL_MISC[i["fn"]](file, i))


def eval_sharding_strategy(file, case):
    i = case["inputs"]
    fn = i["fn"]
    if fn == "convert_sharding_strategy":
        def convert():
            old = {k: decode_spec(v) for k, v in i["old_specs"].items()}
            new = numesh.convert_sharding_strategy(ArrayLike(i["array"]), old, mesh_value(i["old_mesh"]),
                                                   mesh_value(i["new_mesh"]), i["strategy"])
            return encode_tree(new)
        return keyed("specs", convert)
    tree, m = decode_tree(i["tree"]), mesh_value(i["mesh"])
    if fn == "optimize_sharding_for_memory":
        names = None if i["names"] is None else [decode_rule(n) for n in i["names"]]
        return keyed("tree", lambda: encode_tree(
            numesh.optimize_sharding_for_memory(tree, m, i["max_memory_per_device"], names)))
    specs = spec_tree(i["tree"], i["specs"])
    if fn == "validate_sharding_config":
        return keyed("issues", lambda: numesh.validate_sharding_config(tree, specs, m))
    assert fn == "analyze_sharding_strategy", fn
    return value_or_error(lambda: numesh.analyze_sharding_strategy(tree, specs, m))


def described_rule(text):
    """helpers.json names a composite's rules in words: "ShapeBased{(None,):P('dp')}" (one
    pattern and its spec) and "MemoryConstrained(1<<20, dp2_tp4)" (bytes, a mesh label)."""
    shape_based = re.fullmatch(r"ShapeBased\{(\(.*\)):P\((.*)\)\}", text)
    if shape_based:
        entries = ast.literal_eval(f"({shape_based[2]},)") if shape_based[2] else ()
        return numesh.ShapeBasedShardingRule({ast.literal_eval(shape_based[1]): numesh.P(*entries)})
    memory = re.fullmatch(r"MemoryConstrained\((\d+)(?:<<(\d+))?, (\w+)\)", text)
    assert memory, f"unknown rule description {text}"
    axes = re.findall(r"([A-Za-z]+)(\d+)", memory[3])
    return numesh.MemoryConstrainedShardingRule(int(memory[1]) << int(memory[2] or 0),
                                                numesh.Mesh([a for a, _ in axes], [int(n) for _, n in axes]))


def sharding_rule(kind, i):
    if kind == "MemoryConstrainedShardingRule":
        return numesh.MemoryConstrainedShardingRule(i["max_memory_per_device"], mesh_value(i["mesh"]), i["axis_names"])
    if kind == "ShapeBasedShardingRule":
        return numesh.ShapeBasedShardingRule({tuple(p): decode_spec(spec) for p, spec in i["patterns"]})
    if kind == "CompositeShardingRule":
        return numesh.CompositeShardingRule(*[described_rule(text) for text in i["rules"]])
    assert kind == "AutoShardingRule", kind
    return numesh.AutoShardingRule(mesh_value(i["mesh"]), i["axis_names"], i["min_shard_size"])


def eval_helpers(file, case):
    i = case["inputs"]
    kind = case["id"].split("/")[0]
    tree = decode_tree(i["tree"])

    def run():
        if not kind.startswith("ShardingAnalyzer."):
            return {"tree": encode_tree(sharding_rule(kind, i).apply(tree))}
        analyzer = numesh.ShardingAnalyzer(mesh_value(i["mesh"]))
        specs = spec_tree(i["tree"], i["specs"] if "specs" in i else i["partition_specs"])
        if kind == "ShardingAnalyzer.validate_partition_specs":
            return {"issues": analyzer.validate_partition_specs(tree, specs)}
        return analyzer.estimate_memory_usage(tree, specs)

    return value_or_error(run)


def manager_context_semantics():
    """misc.json's probe of PartitionManager's `with`: the same manager entered twice, then two
    managers built and one entered, with a look from another thread."""
    current, last = numesh.get_current_partition_manager, numesh.get_partition_manager
    pm, r = numesh.PartitionManager(), {}
    with pm:
        with pm:
            r["inside_inner"] = current() is pm
        r["after_inner_exit"] = current() is pm
    r["after_outer_exit_still_current"] = current() is pm
    a = numesh.PartitionManager(numesh.PartitionAxis(tensor_parallel_axis="a"))
    b = numesh.PartitionManager(numesh.PartitionAxis(tensor_parallel_axis="b"))
    r["last_is_most_recently_constructed"] = last() is b
    with a:
        r["enter_sets_last"] = last() is a

        def probe():
            r["other_thread_current_is_none"] = current() is None
            r["other_thread_sees_last"] = last() is a

        thread = threading.Thread(target=probe)
        thread.start()
        thread.join()
    r["after_exit_current_is_none"] = current() is None
    r["after_exit_last_still_a"] = last() is a
    return r


def pspec_leaves(j):
    """misc.json's specs: {"$pspec": [...]} is a P; other lists stay Python lists."""
    if isinstance(j, dict):
        return decode_spec(j["$pspec"]) if "$pspec" in j else {k: pspec_leaves(v) for k, v in j.items()}
    return [pspec_leaves(v) for v in j] if isinstance(j, list) else j


def pattern_based_specs(i):
    # The generator ran these under a mesh unless the case says "mesh": null.
    with mesh({"names": ["dp"], "sizes": [1]} if "mesh" not in i else None):
        kw = {"default_spec": decode_spec(i["default_spec"])} if "default_spec" in i else {}
        fn = numesh.create_pattern_based_partition_spec(i["pattern"], mesh_value(i.get("mesh")), **kw)
    return {name: encode(list(fn(name))) for name in i.get("names", [])}


def submesh(i):
    m, names = mesh_value(i["mesh"]), i["axis_names"]
    return {"device_index": numesh.get_submesh_device_index(names, device_coords=i["device_coords"], mesh=m),
            "axis_size": numesh.get_mesh_axis_size(names, mesh=m)}


MISC = {
    "get_safe_hash_int": lambda i: str(numesh.get_safe_hash_int(i["text_str"], i["algorithm"])),
    "get_axes_size_in_mesh": lambda i: numesh.get_axes_size_in_mesh(decode_rule(i["axis_names"]),
                                                                    mesh_value(i["mesh"])),
    "get_mesh_axis_names": lambda i: numesh.get_mesh_axis_names(mesh_value(i.get("mesh"))),
    "get_names_from_partition_spec": lambda i: numesh.get_names_from_partition_spec(pspec_leaves(i["specs"])),
    "names_in_current_mesh": lambda i: numesh.names_in_current_mesh(*i["names"]),
    "create_pattern_based_partition_spec": pattern_based_specs,
    # eformer's default raise_error is True.
    "get_incontext_mesh": lambda i: {"empty": numesh.get_incontext_mesh(i.get("raise_error", True)).empty},
    "get_submesh_device_index+get_mesh_axis_size": submesh,
}


def eval_misc(file, case):
    if case["id"] == "partition_manager_context_semantics":
        return {"ok": manager_context_semantics()}
    i = case["inputs"]
    with mesh(i.get("context_mesh")):
        return capture(lambda: MISC[i["fn"]](i))


def eval_derived(file, case):
    """derived_from_source.json: each case is encoded as the cases of the file it names and
    evaluated by that file's evaluator (as eval_derived.cpp does)."""
    assert case["vector_file"] != "derived_from_source.json"
    return EVALUATORS[case["vector_file"]](file, case)


EVALUATORS = {
    "easydel_attention.json": eval_easydel_attention,
    "mesh.json": eval_mesh,
    "auto_partition_spec.json": eval_auto_partition_spec,
    "constants.json": eval_constants,
    "partition_axis_fields.json": eval_partition_axis_fields,
    "resolve_spec.json": eval_resolve_spec,
    "registry.json": eval_registry,
    "manager_resolve.json": eval_manager_resolve,
    "presets.json": eval_presets,
    "corrected_sharding.json": eval_corrected_sharding,
    "shard.json": eval_shard,
    "match_partition_rules.json": eval_match_partition_rules,
    "easydel_misc.json": eval_easydel_misc,
    "sharding_strategy.json": eval_sharding_strategy,
    "helpers.json": eval_helpers,
    "misc.json": eval_misc,
    "derived_from_source.json": eval_derived,
}


def load_cases():
    params = []
    for name in sorted(COVERED):
        file = json.loads((VECTORS / name).read_text())
        for case in file["cases"]:
            params.append(pytest.param(name, file, case, id=f"{name}:{case['id']}"))
    return params


@pytest.mark.parametrize("name,file,case", load_cases())
def test_vector(name, file, case):
    actual = EVALUATORS[name](file, case)
    # registry.json's scenarios hold their expected results in their steps.
    expected = case["expected"] if "expected" in case else {"steps": case["steps"]}
    if (name, case["id"]) in DOCUMENTED:
        expected = DOCUMENTED[(name, case["id"])](case)
    assert actual == expected


def test_every_vector_file_is_covered():
    """Every vector file on disk is evaluated here, by its own evaluator."""
    on_disk = {p.name for p in VECTORS.glob("*.json")}
    assert on_disk == COVERED == set(EVALUATORS), on_disk ^ COVERED


def test_case_count_of_covered_files():
    """The covered files hold the cases the C++ runner counts for them (a file that lost cases
    would otherwise pass with fewer)."""
    total = sum(len(json.loads((VECTORS / n).read_text())["cases"]) for n in COVERED)
    assert total == 3575
