"""An exported policy graph run with numpy: the one inference path of a deployed policy.

`compile_graph` parses the ``.onnx`` bytes with the `onnx` package (protobuf data: no
external tensor files, no code) and lowers the graph `batchpilot.agents.export` writes
into a few numpy calls per decision (one observation, preallocated buffers):

- a chain of dense steps on the observation: ``Sub``/``Add``/``Div``/``Mul`` by a
  constant, ``Clip`` by constants, ``Tanh``, ``Relu``, and ``Gemm``/``MatMul`` with
  constant weights (the bias is a column of the weights, each vector ends in a 1; weights
  that are blocks along the diagonal, an ensemble's layers side by side, run as one batched
  product of the blocks);
  ``Cast`` to float, ``Flatten``, ``Identity`` and exact no-ops (``Sub 0``, ``Div 1``,
  ``Clip`` to +-inf) cost nothing;
- ``Split`` of the last vector into one segment per knob, and ``ArgMax`` of each, after
  any order-preserving steps (``Softmax``, ``LogSoftmax``, ``x - ReduceLogSumExp(x)``),
  which are skipped: they do not change which entry is largest;
- ``Unsqueeze``/``Concat``/``Reshape``/``Cast`` gathering the indices into the float
  action vector.

Any other op, or these ops arranged otherwise, is refused with a `GraphError` naming the
node and the op. Logits equal onnxruntime's up to float32 rounding (the products sum in
another order), so an action can differ only between logits equal to rounding; the tests
compare the two on random observations.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

# A network whose values overflow makes numpy warn from the dense steps below; `act` then
# raises FloatingPointError naming the problem, so the warning (file, line, source text) would
# only repeat it in numpy's words. Filtered here, not per decision: np.errstate costs ~5 us.
warnings.filterwarnings("ignore", category=RuntimeWarning, module=__name__)

if TYPE_CHECKING:
    from onnx import GraphProto, NodeProto, TensorProto

Act = Callable[[np.ndarray], np.ndarray]
"""Raw observation (n,) float32 -> action (k,) float32; a FloatingPointError where the
logits are NaN or infinite. It writes to buffers of its own: one per controller, not shared
across threads."""

SUPPORTED_OPS = frozenset(
    {
        "Add", "ArgMax", "Cast", "Clip", "Concat", "Constant", "Div", "Flatten", "Gemm",
        "Identity", "LogSoftmax", "MatMul", "Mul", "ReduceLogSumExp", "Relu", "Reshape", "Softmax",
        "Split", "Sub", "Tanh", "Unsqueeze",
    }
)  # fmt: skip
"""The ops `compile_graph` lowers (what `batchpilot export` writes, and a few neighbours)."""
MIN_OPSET = 11
"""The oldest ONNX opset lowered: before 11 a Clip's bounds were attributes, not inputs."""
EXPORT_OPSET = 17
"""The opset `batchpilot export` writes."""

FLOAT = 1  # onnx.TensorProto.FLOAT
EXTERNAL = 1  # onnx.TensorProto.EXTERNAL
LAST_AXIS = (-1, 1)  # the feature axis of a (batch, n) tensor


def diagonal_blocks(w: np.ndarray) -> int:
    """The most equal blocks `w` (out, in) splits into along its diagonal with exact zeros
    elsewhere (1: none), as an exported ensemble's hidden layers do."""
    rows, cols = w.shape
    for k in range(math.gcd(rows, cols), 1, -1):
        if rows % k or cols % k:
            continue
        r, c = rows // k, cols // k
        mask = np.kron(np.eye(k, dtype=bool), np.ones((r, c), dtype=bool))
        if not w[~mask].any():
            return k
    return 1


class GraphError(ValueError):
    """A graph with an op or an arrangement of ops `compile_graph` does not lower."""


@dataclass(frozen=True)
class Dense:
    """The runtime vector after the first `at` dense steps (valid while no step follows)."""

    at: int


@dataclass(frozen=True)
class Segment:
    """A value whose argmax along the last axis is that of ``last_vector[start:stop]``."""

    start: int
    stop: int


@dataclass(frozen=True)
class LogSumExp:
    """``ReduceLogSumExp`` of a segment (keepdims): subtracting it keeps the argmax."""

    of: Segment


@dataclass(frozen=True)
class Indices:
    """The argmax of each segment, as a tensor of `shape` ((k,) or (1, k)), float once cast."""

    segments: tuple[Segment, ...]
    shape: tuple[int, ...]
    is_float: bool = False


Value = np.ndarray | Dense | Segment | LogSumExp | Indices


def compile_graph(data: bytes, n_obs: int, choices: Sequence[int] | None = None) -> Act:
    """An `Act` for the serialized ONNX model `data` with input (batch, `n_obs`), choosing
    among `choices[i]` values for knob i (None: as many as the graph's segments)."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load_model_from_string(data)
        onnx.checker.check_model(model)
    except (DecodeError, onnx.checker.ValidationError, ValueError) as exc:  # bad bytes decode
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GraphError(f"not a loadable ONNX model ({first})") from None
    opsets = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    newest = onnx.defs.onnx_opset_version()
    if len(opsets) != 1 or not MIN_OPSET <= opsets[0] <= newest:
        raise GraphError(
            f"ONNX opset {opsets[0] if len(opsets) == 1 else opsets} is not lowered "
            f"(opsets {MIN_OPSET} to {newest} are; `batchpilot export` writes {EXPORT_OPSET})"
        )
    return Lowering(model.graph, n_obs).act(choices)


def _type_name(elem_type: int) -> str:
    """An ONNX tensor element type's name (``INT64``), or its number if it has none."""
    from onnx import TensorProto

    try:
        return TensorProto.DataType.Name(elem_type)
    except ValueError:
        return str(elem_type)


class Lowering:
    """One pass over the nodes (ONNX stores them in topological order), tracking what each
    value is (`Value`) and collecting the dense steps, which form one chain."""

    def __init__(self, graph: GraphProto, n_obs: int) -> None:
        from onnx import helper, numpy_helper

        self.to_array, self.attribute = numpy_helper.to_array, helper.get_attribute_value
        self.values: dict[str, Value] = {t.name: self.weight(t) for t in graph.initializer}
        inputs = [i for i in graph.input if i.name not in self.values]
        if len(inputs) != 1 or len(graph.output) != 1:
            raise GraphError(
                f"the graph has {len(inputs)} inputs and {len(graph.output)} outputs, not 1 and 1"
            )
        tensor = inputs[0].type.tensor_type
        if tensor.elem_type != FLOAT or [d.dim_value for d in tensor.shape.dim][1:] != [n_obs]:
            raise GraphError(f"input {inputs[0].name!r} is not a (batch, {n_obs}) float tensor")
        if tensor.shape.dim[0].dim_value > 1:  # 0: a named (dynamic) batch, as exported
            raise GraphError(
                f"input {inputs[0].name!r} fixes its batch at {tensor.shape.dim[0].dim_value}; "
                "a decision is a batch of 1 (export the batch as a dynamic axis)"
            )
        declared = graph.output[0].type.tensor_type
        if declared.elem_type != FLOAT:
            raise GraphError(
                f"output {graph.output[0].name!r} is declared {_type_name(declared.elem_type)}, "
                "not float (onnxruntime would refuse the graph)"
            )
        self.steps: list[Callable[[], Any]] = []
        self.vectors = [np.ones(n_obs + 1, np.float32)]  # each vector's buffer, ending in 1
        self.values[inputs[0].name] = Dense(0)
        self.split_done = False
        for node in graph.node:
            self.lower(node)
        self.output = self.values.get(graph.output[0].name)

    def constant(self, tensor: TensorProto) -> np.ndarray:
        if tensor.data_location == EXTERNAL:
            raise GraphError(f"tensor {tensor.name!r} refers to an external file")
        try:
            return self.to_array(tensor)
        except ValueError as exc:  # data that does not fit the tensor's type and shape
            raise GraphError(f"tensor {tensor.name!r}: {exc}") from None
        except KeyError:  # onnx's checker passes an element type it has no numpy type for
            raise GraphError(
                f"tensor {tensor.name!r}: unknown element type {tensor.data_type}"
            ) from None

    def weight(self, tensor: TensorProto) -> np.ndarray:
        """An initializer: a constant of finite values (a NaN weight turns every argmax
        into an arbitrary choice; a Constant node, say a clip bound, may be infinite)."""
        array = self.constant(tensor)
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise GraphError(f"weight {tensor.name!r} holds NaN or infinite values")
        return array

    def in_place(self, fn: np.ufunc, *args: Any) -> Dense:
        """A step ``fn(v, *args, v)`` on the latest vector ``v`` (``out`` given by position:
        a keyword costs more than the op here)."""
        v = self.vectors[-1][:-1]
        self.steps.append(partial(fn, v, *args, v))
        return Dense(len(self.steps))

    def act(self, choices: Sequence[int] | None) -> Act:
        out = self.output
        if not (
            isinstance(out, Indices) and out.is_float and out.shape[-1:] == (len(out.segments),)
        ):
            raise GraphError("the graph's output is not the float argmax of each action knob")
        sizes = tuple(s.stop - s.start for s in out.segments)
        if choices is not None and sizes != tuple(choices):
            raise GraphError(
                f"the graph chooses among {sizes} values per knob, the action among "
                f"{tuple(choices)}"
            )
        observation, last = self.vectors[0][:-1], self.vectors[-1]
        steps = tuple(self.steps)
        argmaxes = tuple(last[s.start : s.stop].argmax for s in out.segments)
        # every knob's logits, whatever order the graph concatenates the knobs in
        logits = last[min(s.start for s in out.segments) : max(s.stop for s in out.segments)]

        def act(obs: np.ndarray) -> np.ndarray:
            observation[:] = obs
            for step in steps:
                step()
            if not np.isfinite(logits).all():  # argmax would pick an arbitrary action
                raise FloatingPointError("the policy's network output NaN or infinite logits")
            return np.array([argmax() for argmax in argmaxes], np.float32)

        return act

    def lower(self, node: NodeProto) -> None:
        op = node.op_type
        where = f"node {node.name or node.output[0]!r}"
        if node.domain not in ("", "ai.onnx"):
            raise GraphError(
                f"{where}: op {op!r} of domain {node.domain!r} is not supported "
                "(ONNX's own ops only)"
            )
        if op not in SUPPORTED_OPS:
            supported = ", ".join(sorted(SUPPORTED_OPS))
            raise GraphError(f"{where}: op {op!r} is not supported (supported: {supported})")
        try:
            attrs = {a.name: self.attribute(a) for a in node.attribute}
        except ValueError as exc:  # a reference attribute (a function's), which has no value
            first = str(exc).strip().splitlines()[0]
            raise GraphError(f"{where} ({op}): {first}") from None
        try:
            args = [self.values[name] if name else None for name in node.input]
            result = self.lower_op(op, args, attrs)
        except KeyError as exc:
            raise GraphError(f"{where} ({op}): input {exc} is not defined before it") from None
        except GraphError as exc:
            raise GraphError(f"{where} ({op}): {exc}") from None
        results = result if isinstance(result, list) else [result]
        if len(results) != len(node.output):
            raise GraphError(f"{where} ({op}): {len(node.output)} outputs, not {len(results)}")
        self.values.update(zip(node.output, results, strict=True))

    def dense(self, x: Value | None) -> int:
        """The length of `x`, checked to be the latest vector, before the split."""
        if not isinstance(x, Dense) or x.at != len(self.steps) or self.split_done:
            raise GraphError("expects the latest dense vector, before the action's split")
        return len(self.vectors[-1]) - 1

    def lower_op(self, op: str, args: list[Value | None], attrs: dict[str, Any]) -> Value | list:
        """The value of one node's outputs; appends its dense step, if any."""
        x = args[0] if args else None
        if op == "Constant":
            if set(attrs) != {"value"}:
                raise GraphError(f"only a tensor 'value' is supported, got {sorted(attrs)}")
            return self.constant(attrs["value"])
        if op == "Identity":
            return x  # the exporter writes one where two constants are equal (shared storage)
        if op in ("Flatten", "Cast") and isinstance(x, Dense | Indices):
            if attrs.get("axis", 1) != 1 or attrs.get("to", FLOAT) != FLOAT:
                raise GraphError(f"only axis 1 and a cast to float are supported, got {attrs}")
            if op == "Cast" and isinstance(x, Indices):
                return Indices(x.segments, x.shape, is_float=True)
            return x  # the vectors are float32 already
        if op in ("Sub", "Add", "Div", "Mul") and isinstance(x, Dense):
            k = self.vector(args[1], self.dense(x))
            if not np.isfinite(k).all():  # every observation NaN, or one constant action
                raise GraphError("a NaN or infinite constant operand")
            if (k == (1 if op in ("Div", "Mul") else 0)).all():
                return x  # exactly the identity
            if op == "Div" and not k.all():
                raise GraphError("divides by 0 (a normalisation with a zero scale)")
            fn = {"Sub": np.subtract, "Add": np.add, "Div": np.divide, "Mul": np.multiply}[op]
            return self.in_place(fn, k)
        if op == "Clip":
            self.dense(x)
            lo, hi = (
                bound if b is None else float(self.vector(b, 1))
                for b, bound in zip([*args[1:], None, None][:2], (-np.inf, np.inf), strict=True)
            )
            if np.isnan(lo) or np.isnan(hi):
                raise GraphError("a NaN bound (an infinite one leaves that side open)")
            if np.isfinite(lo):
                x = self.in_place(np.maximum, np.array(lo, np.float32))
            return self.in_place(np.minimum, np.array(hi, np.float32)) if np.isfinite(hi) else x
        if op == "Tanh":
            self.dense(x)
            return self.in_place(np.tanh)
        if op == "Relu":
            self.dense(x)
            return self.in_place(np.maximum, np.zeros((), np.float32))
        if op in ("Gemm", "MatMul"):
            return self.gemm(self.dense(x), args[1:], attrs if op == "Gemm" else {})
        if op == "Split":
            return self.split(self.dense(x), args[1:], attrs)
        if op in ("Softmax", "LogSoftmax") and isinstance(x, Segment):
            self.last_axis(attrs.get("axis", -1))
            return x
        if op == "ReduceLogSumExp" and isinstance(x, Segment):
            axes = attrs.get("axes", self.ints(args[1]) if len(args) > 1 else None)
            if axes is None or len(axes) != 1 or attrs.get("keepdims", 1) != 1:
                raise GraphError("only a reduction over the last axis with keepdims is supported")
            self.last_axis(axes[0])
            return LogSumExp(x)
        if op == "Sub" and isinstance(x, Segment) and isinstance(args[1], LogSumExp):
            if args[1].of != x:
                raise GraphError("subtracts the log-sum-exp of another segment")
            return x
        if op == "ArgMax" and isinstance(x, Segment):
            self.last_axis(attrs.get("axis", 0))
            if attrs.get("select_last_index", 0):
                raise GraphError("select_last_index is not supported")
            return Indices((x,), (1, 1) if attrs.get("keepdims", 1) else (1,))
        if op == "Unsqueeze" and isinstance(x, Indices) and x.shape == (1,):
            axes = attrs.get("axes", self.ints(args[1]) if len(args) > 1 else None)
            if axes not in ([1], [-1]):
                raise GraphError(f"only axes [1] are supported, got {axes}")
            return Indices(x.segments, (1, 1), x.is_float)
        if op == "Concat" and all(isinstance(a, Indices) and a.shape == (1, 1) for a in args):
            self.last_axis(attrs.get("axis"))
            if len({a.is_float for a in args}) != 1:
                raise GraphError("inputs of mixed types")
            segments = tuple(s for a in args for s in a.segments)
            return Indices(segments, (1, len(segments)), args[0].is_float)
        if op == "Reshape" and isinstance(x, Indices) and len(x.shape) == 2:
            if self.ints(args[1]) not in ([-1, x.shape[1]], [1, x.shape[1]]):
                raise GraphError(f"only a reshape to (1, {x.shape[1]}) is supported")
            return x
        kinds = [type(a).__name__ for a in args]
        raise GraphError(f"inputs {kinds} are arranged otherwise than in an exported policy")

    @staticmethod
    def ints(x: Value | None) -> list[int]:
        if not isinstance(x, np.ndarray) or x.dtype.kind not in "iu" or x.ndim != 1:
            raise GraphError("expects a constant 1-D integer tensor")
        return [int(v) for v in x]

    @staticmethod
    def last_axis(axis: object) -> None:
        if axis not in LAST_AXIS:
            raise GraphError(f"only the last axis (1 or -1) is supported, got {axis}")

    @staticmethod
    def vector(c: Value | None, n: int) -> np.ndarray:
        """A float constant that broadcasts against (1, n), as float32 (n,) or ()."""
        if not isinstance(c, np.ndarray) or c.dtype != np.float32:
            raise GraphError("expects a constant float tensor")
        if c.size == 1 and c.ndim <= 2:
            return c.reshape(())
        if c.shape not in ((n,), (1, n)):
            raise GraphError(f"a constant of shape {c.shape} does not broadcast to (1, {n})")
        return c.reshape(n)

    def gemm(self, n: int, args: list[Value | None], attrs: dict[str, Any]) -> Dense:
        """``x @ B (transposed if transB) * alpha + C * beta`` as one product with the
        vector's trailing 1: equal to onnxruntime's up to float32 rounding."""
        w = args[0]
        if not isinstance(w, np.ndarray) or w.dtype != np.float32 or w.ndim != 2:
            raise GraphError("expects constant float weights (2-D)")
        if attrs.get("transA", 0):
            raise GraphError("transA is not supported")
        with np.errstate(over="ignore", invalid="ignore"):  # refused below, by name
            w = np.float32(attrs.get("alpha", 1.0)) * (w if attrs.get("transB", 0) else w.T)
        if w.shape[1] != n:
            raise GraphError(f"weights of shape {w.shape} (out, in) do not take {n} inputs")
        c = args[1] if len(args) > 1 else None
        bias = np.zeros(len(w), np.float32) if c is None else self.vector(c, len(w))
        with np.errstate(over="ignore", invalid="ignore"):
            bias = np.float32(attrs.get("beta", 1.0)) * np.broadcast_to(bias, len(w))
        if not (np.isfinite(w).all() and np.isfinite(bias).all()):
            raise GraphError("its weights (times alpha) or bias (times beta) are NaN or infinite")
        source, out = self.vectors[-1], np.ones(len(w) + 1, np.float32)
        self.vectors.append(out)
        k = diagonal_blocks(w)
        if k > 1:  # an ensemble's layers side by side: k products of one block each
            r, c = len(w) // k, n // k
            blocks = np.stack([w[i * r : (i + 1) * r, i * c : (i + 1) * c] for i in range(k)])
            x, y = source[:-1].reshape(k, c, 1), out[:-1]
            self.steps.append(partial(np.matmul, blocks, x, y.reshape(k, r, 1)))
            self.steps.append(partial(np.add, y, np.ascontiguousarray(bias), y))
        else:
            weights = np.ascontiguousarray(np.column_stack([w, bias]))
            self.steps.append(partial(np.dot, weights, source, out[:-1]))
        return Dense(len(self.steps))

    def split(self, n: int, args: list[Value | None], attrs: dict[str, Any]) -> list[Value]:
        self.last_axis(attrs.get("axis", 0))
        sizes = attrs.get("split", self.ints(args[0]) if args and args[0] is not None else None)
        if sizes is None or sum(sizes) != n or min(sizes) < 1:
            raise GraphError(f"split sizes {sizes} do not partition {n} entries")
        self.split_done = True
        return [Segment(a, b) for a, b in itertools.pairwise(np.cumsum([0, *sizes]).tolist())]
