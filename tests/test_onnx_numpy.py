"""A deployed policy's network runs in numpy (`batchpilot.agents.onnx_numpy`): its actions
equal onnxruntime's, other ops are refused by name, and the Observer's values are the
documented ones."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from telemetry_builder import make_telemetry  # noqa: E402

from batchpilot.agents.onnx_numpy import GraphError, compile_graph, diagonal_blocks  # noqa: E402
from batchpilot.agents.policy import PolicyFileError, load_policy, seal, sidecar_path  # noqa: E402
from batchpilot.envs.metrics import SLO  # noqa: E402
from batchpilot.envs.observation import OBSERVATION_FIELDS, SCALES, Observer  # noqa: E402
from batchpilot.envs.profiles import PROFILES  # noqa: E402
from batchpilot.envs.sim_engine import SimEngine  # noqa: E402

COMMITTED = Path(__file__).parents[1] / "training" / "reports" / "learned" / "policy.onnx"
N_OBS = len(OBSERVATION_FIELDS)
COMMITTED_N_OBS = len(json.loads(sidecar_path(COMMITTED).read_text())["observation"]["fields"])
"""The committed policy's inputs: the entries its sidecar names (an earlier layout's, if it
was trained before an entry was added)."""


def onnxruntime_run(data: bytes, obs: np.ndarray) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: obs})[0]


def logits64(model: onnx.ModelProto, obs: np.ndarray) -> np.ndarray:
    """The committed graph's logits in float64: its chain of MatMul/Gemm, Sub/Div, Clip and
    Tanh, up to the split into knobs."""
    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            w[node.output[0]] = numpy_helper.to_array(node.attribute[0].t).astype(np.float64)
    x = obs
    for node in model.graph.node:
        op, args = node.op_type, node.input
        if op == "Split":
            return x
        if op == "MatMul":
            x = x @ w[args[1]]
        elif op == "Gemm":  # as torch exports a Linear: transB
            x = x @ w[args[1]].T + w[args[2]]
        elif op in ("Sub", "Div"):
            x = x - w[args[1]] if op == "Sub" else x / w[args[1]]
        elif op == "Clip":
            x = np.clip(x, w.get(args[1], -np.inf), w.get(args[2], np.inf))
        elif op == "Tanh":
            x = np.tanh(x)
    raise AssertionError("no Split in the committed graph")


def test_committed_policy_acts_as_onnxruntime() -> None:
    """On 4,000 random observations the actions are onnxruntime's, except where the two
    best logits of a knob are equal to float32 rounding (then either is right)."""
    data = COMMITTED.read_bytes()
    act = compile_graph(data, COMMITTED_N_OBS)
    obs = np.random.default_rng(0).uniform(-3, 3, size=(4000, COMMITTED_N_OBS))
    obs = obs.astype(np.float32)
    expected = onnxruntime_run(data, obs)
    got = np.stack([act(o) for o in obs])
    assert got.dtype == np.float32 and got.shape == expected.shape == (4000, 2)
    differ = np.nonzero((got != expected).any(axis=1))[0]
    assert len(differ) <= 4, f"{len(differ)} of 4000 actions differ"
    sizes = [17, 8]  # the committed policy's grids
    logits = np.split(logits64(onnx.load(COMMITTED), obs[differ].astype(np.float64)), [17], axis=1)
    for k, size in enumerate(sizes):
        for row, i in enumerate(differ):
            a, b = int(got[i, k]), int(expected[i, k])
            assert a < size and b < size
            assert abs(logits[k][row, a] - logits[k][row, b]) < 1e-5, "not a near-tie"


def test_an_ensembles_side_by_side_layers_run_as_blocks() -> None:
    """The committed graph's second hidden layer is its members' side by side: one 64 x 64
    product a member, not one square matrix mostly of zeros."""
    rng = np.random.default_rng(0)
    blocks = [rng.normal(size=(4, 3)) for _ in range(6)]
    w = np.zeros((24, 18))
    for i, b in enumerate(blocks):
        w[4 * i : 4 * i + 4, 3 * i : 3 * i + 3] = b
    assert diagonal_blocks(w) == 6
    w[0, 17] = 1e-30  # one entry off the blocks: the whole matrix is one block
    assert diagonal_blocks(w) == 1
    assert diagonal_blocks(np.kron(np.eye(2), np.ones((3, 5)))) == 2
    members = len(json.loads(sidecar_path(COMMITTED).read_text())["members"])
    side = (64 * members, 64 * members)
    model = onnx.load(COMMITTED)
    layer = next(t for t in model.graph.initializer if numpy_helper.to_array(t).shape == side)
    assert members > 1 and diagonal_blocks(numpy_helper.to_array(layer)) == members


def test_loaded_network_reuses_its_buffers_soundly() -> None:
    """`load_policy` gives the numpy network (a closure over its buffers): a call does not
    depend on the previous one."""
    policy = load_policy(COMMITTED)
    obs = np.linspace(-1, 1, COMMITTED_N_OBS, dtype=np.float32)
    first = policy.act(obs)
    policy.act(-obs)
    np.testing.assert_array_equal(policy.act(obs), first)
    np.testing.assert_array_equal(first, onnxruntime_run(COMMITTED.read_bytes(), obs[None])[0])


@pytest.mark.parametrize("report", ["learned", "clairvoyance", "sim-to-real"])
def test_committed_policies_serve_with_the_entries_they_name(report: str) -> None:
    """Each committed policy loads, and its controller builds exactly the entries its
    sidecar names, whichever layout it was trained on, and decides from them."""
    path = COMMITTED.parents[1] / report / "policy.onnx"
    fields = json.loads(sidecar_path(path).read_text())["observation"]["fields"]
    policy = load_policy(path)
    t = make_telemetry(step_base_s=0.01, step_s_per_token=1e-4)
    full = Observer(policy.slo)(t)
    policy.observer.reset()
    seen = policy.observer(t)
    np.testing.assert_array_equal(seen, full[[OBSERVATION_FIELDS.index(f) for f in fields]])
    policy.reset(SimEngine(PROFILES["llama-7b-a100"]))
    assert policy.decide(t).max_num_seqs >= 1


def tensor(name: str, value: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def model_bytes(nodes: list, inits: list, n_in: int = 5, out_dims: int = 2) -> bytes:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", n_in])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", out_dims])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def other_arrangement() -> tuple[list, list]:
    """Normalisation and a finite clip, MatMul + Add + Relu, Identity on a vector and on a
    constant, a Gemm with alpha, beta and B not transposed, a split into 3 + 4, LogSoftmax on
    one knob, keepdims on the other."""
    rng = np.random.default_rng(1)
    f32 = np.float32
    inits = [
        tensor("mean", rng.normal(size=5).astype(f32)),
        tensor("std", rng.uniform(0.5, 2, size=5).astype(f32)),
        tensor("lo", np.array(-1.5, f32)),
        tensor("hi", np.array(1.5, f32)),
        tensor("w1", rng.normal(size=(5, 6)).astype(f32)),
        tensor("b1", rng.normal(size=6).astype(f32)),
        tensor("w2", rng.normal(size=(6, 7)).astype(f32)),
        tensor("b2", rng.normal(size=(1, 7)).astype(f32)),
        tensor("sizes", np.array([3, 4], np.int64)),
        tensor("axes", np.array([1], np.int64)),
    ]
    node = helper.make_node
    nodes = [
        node("Sub", ["obs", "mean"], ["c"]),
        node("Div", ["c", "std"], ["n"]),
        node("Clip", ["n", "lo", "hi"], ["x"]),
        node("MatMul", ["x", "w1"], ["m"]),
        node("Add", ["m", "b1"], ["a"]),
        node("Relu", ["a"], ["r"]),
        node("Identity", ["r"], ["ri"]),
        node("Identity", ["b2"], ["b2i"]),
        node("Gemm", ["ri", "w2", "b2i"], ["logits"], alpha=0.5, beta=2.0),
        node("Split", ["logits", "sizes"], ["k0", "k1"], axis=1),
        node("LogSoftmax", ["k0"], ["l0"], axis=1),
        node("ArgMax", ["l0"], ["i0"], axis=1, keepdims=1),
        node("ArgMax", ["k1"], ["j1"], axis=-1, keepdims=0),
        node("Unsqueeze", ["j1", "axes"], ["i1"]),
        node("Concat", ["i0", "i1"], ["ij"], axis=1),
        node("Cast", ["ij"], ["action"], to=TensorProto.FLOAT),
    ]
    return nodes, inits


def test_other_arrangements_act_as_onnxruntime() -> None:
    nodes, inits = other_arrangement()
    data = model_bytes(nodes, inits)
    act = compile_graph(data, 5)
    obs = np.random.default_rng(2).normal(scale=2, size=(500, 5)).astype(np.float32)
    expected = onnxruntime_run(data, obs)
    got = np.stack([act(o) for o in obs])
    assert len(np.unique(got[:, 0])) > 1 and len(np.unique(got[:, 1])) > 1  # not constant
    assert (got == expected).all(axis=1).sum() >= 499


@pytest.mark.parametrize("order", [["i0", "i1"], ["i1", "i0"]])
def test_nan_logits_raise_whatever_order_the_knobs_are_concatenated_in(order: list) -> None:
    """argmax over NaN picks the first choice: serving must see a failure to fall back from,
    also when the graph concatenates the knobs' argmaxes last to first."""
    nodes, inits = other_arrangement()
    nodes[-2] = helper.make_node("Concat", order, ["ij"], axis=1)
    act = compile_graph(model_bytes(nodes, inits), 5)
    assert np.isfinite(act(np.zeros(5, np.float32))).all()
    with pytest.raises(FloatingPointError, match="NaN or infinite logits"):
        act(np.full(5, np.nan, np.float32))


def test_unsupported_op_is_refused_by_name() -> None:
    nodes, inits = other_arrangement()
    nodes[5] = helper.make_node("Softsign", ["a"], ["r"], name="act1")
    with pytest.raises(GraphError, match=r"node 'act1': op 'Softsign' is not supported"):
        compile_graph(model_bytes(nodes, inits), 5)


def test_an_op_of_another_domain_is_refused_by_its_domain() -> None:
    """A Relu of a custom domain is not ONNX's Relu: the message names the domain."""
    nodes, inits = other_arrangement()
    nodes[5] = helper.make_node("Relu", ["a"], ["r"], name="act1", domain="com.example")
    model = onnx.load_from_string(model_bytes(nodes, inits))
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(GraphError, match=r"node 'act1': op 'Relu' of domain 'com.example'"):
        compile_graph(model.SerializeToString(), 5)


def test_a_zero_scale_is_refused_at_load() -> None:
    """A normalisation dividing by 0 would put inf into every decision; it is refused when
    the graph is read, not at the first decision."""
    nodes, inits = other_arrangement()
    std = next(t for t in inits if t.name == "std")
    values = numpy_helper.to_array(std).copy()
    values[2] = 0.0
    std.CopyFrom(numpy_helper.from_array(values, "std"))
    with pytest.raises(GraphError, match=r"\(Div\): divides by 0"):
        compile_graph(model_bytes(nodes, inits), 5)


def test_unsupported_op_in_a_policy_file_is_refused(tmp_path: Path) -> None:
    """End to end: a re-sealed sidecar whose graph uses another op is refused by
    `load_policy`, naming the op."""
    model = onnx.load(COMMITTED)
    next(n for n in model.graph.node if n.op_type == "Tanh").op_type = "Softsign"
    path = tmp_path / "p.onnx"
    path.write_bytes(model.SerializeToString())
    meta = json.loads(sidecar_path(COMMITTED).read_text())
    meta["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    sidecar_path(path).write_text(json.dumps(seal(meta)))
    with pytest.raises(PolicyFileError, match="op 'Softsign' is not supported"):
        load_policy(path)


@pytest.mark.parametrize(
    ("replacement", "message"),
    [
        (("Relu", ["m"], ["r"], {}), "latest dense vector"),  # a branch, not one chain
        (("Cast", ["ij"], ["action"], {"to": TensorProto.INT64}), "cast to float"),
        (("ArgMax", ["l0"], ["i0"], {"axis": 0}), "last axis"),
        (("Sub", ["mean", "obs"], ["c"], {}), "arranged otherwise"),
    ],
)
def test_other_arrangements_are_refused(replacement: tuple, message: str) -> None:
    nodes, inits = other_arrangement()
    op, inputs, outputs, attrs = replacement
    index = next(i for i, n in enumerate(nodes) if list(n.output) == outputs)
    nodes[index] = helper.make_node(op, inputs, outputs, **attrs)
    with pytest.raises(GraphError, match=message):
        compile_graph(model_bytes(nodes, inits), 5)


@pytest.mark.parametrize(
    ("op", "value", "message"),
    [
        ("Div", np.inf, r"\(Div\): a NaN or infinite constant operand"),
        ("Sub", np.nan, r"\(Sub\): a NaN or infinite constant operand"),
        ("Clip", np.nan, r"\(Clip\): a NaN bound"),
    ],
)
def test_a_non_finite_constant_node_is_refused_at_load(op: str, value: float, message: str) -> None:
    """Initializers were checked, Constant nodes not: dividing by inf made every decision one
    action, silently; a NaN failed only at the first decision, blamed on overflowing weights."""
    nodes, inits = other_arrangement()
    operand = {"Div": "std", "Sub": "mean", "Clip": "lo"}[op]
    inits = [t for t in inits if t.name != operand]
    kept = numpy_helper.from_array(np.array(value, np.float32), "k")
    nodes.insert(0, helper.make_node("Constant", [], [operand], value=kept))
    with pytest.raises(GraphError, match=message):
        compile_graph(model_bytes(nodes, inits), 5)


@pytest.mark.parametrize("attr", [{"alpha": float("nan")}, {"beta": float("inf")}, {"alpha": 3e38}])
def test_a_gemm_scaled_past_float32_is_refused_at_load(attr: dict) -> None:
    nodes, inits = other_arrangement()
    gemm = next(n for n in nodes if n.op_type == "Gemm")
    gemm.CopyFrom(helper.make_node("Gemm", list(gemm.input), list(gemm.output), **attr))
    with pytest.raises(GraphError, match=r"\(Gemm\): its weights \(times alpha\) or bias \(times beta\) are NaN or infinite"):
        compile_graph(model_bytes(nodes, inits), 5)


def test_a_nan_weight_is_refused() -> None:
    """Every argmax over NaN would pick an arbitrary action."""
    model = onnx.load(COMMITTED)
    weight = max(model.graph.initializer, key=lambda t: len(t.raw_data))
    values = numpy_helper.to_array(weight).copy()
    values.flat[0] = np.nan
    weight.CopyFrom(numpy_helper.from_array(values, weight.name))
    with pytest.raises(GraphError, match=f"weight {weight.name!r} holds NaN or infinite values"):
        compile_graph(model.SerializeToString(), COMMITTED_N_OBS)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: setattr(m.graph.input[0].type.tensor_type.shape.dim[0], "dim_value", 7), "fixes its batch at 7"),
        (lambda m: m.graph.output[0].type.tensor_type.__setattr__("elem_type", TensorProto.INT64), "is declared INT64, not float"),
    ],
    ids=["batch-7", "int64-output"],
)
def test_declarations_onnxruntime_would_refuse_are_refused(edit, message: str) -> None:
    """Both ran here though onnxruntime refuses them: a file that loads must load elsewhere."""
    model = onnx.load(COMMITTED)
    edit(model)
    with pytest.raises(GraphError, match=message):
        compile_graph(model.SerializeToString(), COMMITTED_N_OBS)
    one = onnx.load(COMMITTED)  # a batch fixed at 1 serves: a decision is one observation
    one.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    assert compile_graph(one.SerializeToString(), COMMITTED_N_OBS)(np.zeros(COMMITTED_N_OBS, np.float32)).shape == (2,)


def test_a_checker_error_is_one_line() -> None:
    """A node of an unknown domain gave the checker's message over several lines."""
    model = onnx.load(COMMITTED)
    model.graph.node[0].domain = "com.example"
    with pytest.raises(GraphError, match="not a loadable ONNX model") as err:
        compile_graph(model.SerializeToString(), COMMITTED_N_OBS)
    assert "\n" not in str(err.value) and "com.example" in str(err.value), str(err.value)


def test_garbage_is_not_a_loadable_model() -> None:
    with pytest.raises(GraphError, match="not a loadable ONNX model"):
        compile_graph(b"not an onnx graph", N_OBS)


def test_observer_values_are_the_documented_ones() -> None:
    """The vector for one telemetry, entry by entry from `Observer`'s table, with one entry
    clipped; then a NaN entry (0)."""
    slo = SLO.parse("ttft:2000,tpot:50")
    t = make_telemetry(
        oldest_waiting_age_s=50.0,  # 25 TTFT targets: clipped to 10
        interval_prompt_tokens=30,
        interval_output_tokens=10,
        interval_iterations=4,
        interval_preemptions=2,
        waiting_prefill_tokens=4096,
        arrival_rate_short=3.0,
        recent_tbt_p90_s=0.06,
        step_base_s=0.01,
        step_s_per_token=0.05 / 1024,
    )
    s = SCALES
    capacity = t.num_total_blocks * t.block_size
    expected = {
        "kv_cache_usage": t.kv_cache_usage,
        "kv_usage_trend": 0.0,
        "running": t.num_requests_running / s["requests"],
        "waiting": t.num_requests_waiting / s["requests"],
        "decoding": t.num_decoding / s["requests"],
        "oldest_waiting_over_ttft": s["clip"],
        "waiting_prefill_tokens": 0.5,
        "log_arrival_rate_short": math.log(4.0) / s["log_rate"],
        "log_arrival_rate_long": math.log1p(t.arrival_rate) / s["log_rate"],
        "tbt_mean_over_tpot": t.recent_tbt_s / 0.05,
        "tbt_p90_over_tpot": 0.06 / 0.05,
        "ttft_over_target": t.recent_ttft_s / 2.0,
        "prefill_share": 0.75,
        "tokens_per_step": 10 / s["tokens"],
        "preemptions_per_running": 2 / t.num_requests_running,
        "log2_max_num_seqs": math.log2(t.max_num_seqs) / s["log2_limit"],
        "log2_token_budget": math.log2(t.max_num_batched_tokens) / s["log2_budget"],
        "kv_fit": capacity / (t.prompt_mean + t.output_mean) / s["requests"],
        "prompt_mean": t.prompt_mean / s["context_tokens"],
        "output_mean": t.output_mean / s["context_tokens"],
        "log2_kv_capacity": math.log2(capacity) / s["log2_kv_tokens"],
        "step_base_over_tpot": 0.2,
        "log2_tokens_per_tpot": 10 / s["log2_budget"],
    }
    obs = Observer(slo)(t)
    assert obs.dtype == np.float32 and list(expected) == list(OBSERVATION_FIELDS)
    np.testing.assert_array_equal(obs, np.array(list(expected.values()), np.float32))
    unclipped = Observer(slo)(make_telemetry())
    assert np.isfinite(unclipped).all() and np.abs(unclipped).max() < s["clip"]
    nan = dataclasses.replace(make_telemetry(), recent_ttft_s=float("nan"))  # not valid
    i = OBSERVATION_FIELDS.index("ttft_over_target")
    assert unclipped[i] != 0
    np.testing.assert_array_equal(Observer(slo)(nan), np.where(np.arange(N_OBS) == i, 0, unclipped))
    picked = ["log2_tokens_per_tpot", "kv_cache_usage", "waiting"]
    np.testing.assert_array_equal(
        Observer(slo, picked)(t), np.array([expected[k] for k in picked], np.float32)
    )
    for bad in (["kv_cache_usage", "kv_cache_usage"], ["queue_mood"], []):
        with pytest.raises(ValueError, match="observation fields"):
            Observer(slo, bad)


def resealed(tmp_path: Path, edit) -> Path:
    """A copy of the committed policy whose sidecar `edit` changed and re-sealed (as anyone
    can)."""
    path = tmp_path / "p.onnx"
    path.write_bytes(COMMITTED.read_bytes())
    meta = json.loads(sidecar_path(COMMITTED).read_text())
    edit(meta)
    sidecar_path(path).write_text(json.dumps(seal(meta)))
    return path


def _reverse_fields(meta: dict) -> None:
    meta["observation"]["fields"].reverse()


def _drop_first_field(meta: dict) -> None:
    del meta["observation"]["fields"][0]


def _unknown_member_field(meta: dict) -> None:
    meta["members"][0]["observation_fields"][0] = "queue_mood"


def _no_members(meta: dict) -> None:
    meta["members"] = []


def _no_slo(meta: dict) -> None:
    meta["slo"] = ""


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            _reverse_fields,
            r"observation\.fields are not the members' observation_fields joined in layout order: entry 0 is \w+, theirs kv_cache_usage",
        ),
        (
            _drop_first_field,
            r"observation\.fields are not .* entry 0 is kv_usage_trend, theirs kv_cache_usage",
        ),
        (
            _unknown_member_field,
            r"members: observation fields name entries .*unknown: \['queue_mood'\]",
        ),
        (_no_members, "entry 0 is kv_cache_usage, theirs missing"),
        (_no_slo, "slo names no objective"),
    ],
)
def test_a_resealed_sidecar_at_odds_with_itself_is_refused(
    tmp_path: Path, edit, message: str
) -> None:
    """An ensemble's inputs are its members' entries joined in layout order: a sidecar whose
    ``observation.fields`` say otherwise (reordered: the network would read permuted inputs)
    is refused, and so is one trained for an SLO with no objective."""
    with pytest.raises(PolicyFileError, match=f"p\\.onnx\\.json: .*{message}"):
        load_policy(resealed(tmp_path, edit))


def test_a_resealed_sidecar_that_changes_nothing_loads(tmp_path: Path) -> None:
    path = resealed(tmp_path, lambda meta: None)
    obs = np.linspace(-1, 1, COMMITTED_N_OBS, dtype=np.float32)
    np.testing.assert_array_equal(load_policy(path).act(obs), load_policy(COMMITTED).act(obs))


def _members_before_their_fields(meta: dict) -> None:
    for member in meta["members"]:  # as exports before members recorded their entries
        del member["observation_fields"]


def test_an_ensemble_sidecar_from_before_members_named_their_fields_loads(tmp_path: Path) -> None:
    """Such members all observed the sidecar's own entries: the file decides as before."""
    path = resealed(tmp_path, _members_before_their_fields)
    obs = np.linspace(-1, 1, COMMITTED_N_OBS, dtype=np.float32)
    np.testing.assert_array_equal(load_policy(path).act(obs), load_policy(COMMITTED).act(obs))


def opset_10(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` re-expressed at opset 10: Clip's bounds (tightened, so it bites), Split's sizes
    and Unsqueeze's axes as attributes, ArgMax without select_last_index."""
    consts = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in model.graph.node if n.op_type == "Constant"}
    nodes = []
    for node in model.graph.node:
        if node.op_type == "Clip":
            del node.input[1:]
            node.attribute.extend([helper.make_attribute("min", -0.05), helper.make_attribute("max", 0.05)])
        elif node.op_type == "Split":
            sizes = consts[node.input[1]]
            del node.input[1:]
            node.attribute.append(helper.make_attribute("split", [int(v) for v in sizes]))
        elif node.op_type == "ArgMax":
            keep = [a for a in node.attribute if a.name != "select_last_index"]
            del node.attribute[:]
            node.attribute.extend(keep)
        elif node.op_type == "Unsqueeze":
            del node.input[1:]
            node.attribute.append(helper.make_attribute("axes", [1]))
        nodes.append(node)
    used = {i for n in nodes for i in n.input}
    nodes = [n for n in nodes if not (n.op_type == "Constant" and n.output[0] not in used)]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.opset_import[0].version, model.ir_version = 10, 5
    onnx.checker.check_model(model)
    return model


def test_an_opset_whose_ops_mean_otherwise_is_refused() -> None:
    """At opset 10 a Clip's bounds are attributes, which the lowering read as no clip: the
    file loaded and chose unlike onnxruntime on 439 of 500 observations."""
    with pytest.raises(GraphError, match=r"ONNX opset 10 is not lowered \(opsets 11 to"):
        compile_graph(opset_10(onnx.load(COMMITTED)).SerializeToString(), COMMITTED_N_OBS)
    future = onnx.load(COMMITTED)
    future.opset_import[0].version = 100_000
    with pytest.raises(GraphError, match="opset 100000 is not lowered"):
        compile_graph(future.SerializeToString(), COMMITTED_N_OBS)


@pytest.mark.parametrize("where", ["initializer", "Constant"])
def test_an_unknown_element_type_is_named(where: str) -> None:
    """A KeyError traceback (initializer), or "input 61 is not defined before it"."""
    model = onnx.load(COMMITTED)
    if where == "initializer":
        model.graph.initializer[0].data_type = 61
    else:
        next(n for n in model.graph.node if n.op_type == "Constant").attribute[0].t.data_type = 61
    with pytest.raises(GraphError, match="unknown element type 61"):
        compile_graph(model.SerializeToString(), COMMITTED_N_OBS)


def test_a_reference_attribute_is_named_with_its_node() -> None:
    """A function's reference attribute gave a plain ValueError of several protobuf lines."""
    model = onnx.load(COMMITTED)
    next(n for n in model.graph.node if n.op_type == "ArgMax").attribute[0].ref_attr_name = "x"
    with pytest.raises(GraphError, match=r"^node '.*' \(ArgMax\): Cannot get value of reference attribute") as err:
        compile_graph(model.SerializeToString(), COMMITTED_N_OBS)
    assert "\n" not in str(err.value)


def test_what_runs_is_the_file_its_sha256_was_checked_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file was hashed on one read and compiled from a second: a file replaced between
    the two ran unchecked."""
    from batchpilot.agents import policy as policy_module

    path = tmp_path / "p.onnx"
    path.write_bytes(COMMITTED.read_bytes())
    sidecar_path(path).write_text(sidecar_path(COMMITTED).read_text())
    checked = policy_module.read_policy_files

    def replaced_after_the_check(onnx_path):
        result = checked(onnx_path)
        path.write_bytes(b"a re-export landing")
        return result

    monkeypatch.setattr(policy_module, "read_policy_files", replaced_after_the_check)
    obs = np.zeros(COMMITTED_N_OBS, np.float32)
    assert np.array_equal(load_policy(path).act(obs), load_policy(COMMITTED).act(obs))
