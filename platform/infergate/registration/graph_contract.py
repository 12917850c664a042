"""Fitting a user's ONNX graph to the contract Triton's models have here.

Every served graph takes ``input_ids`` and ``attention_mask`` (int64, ``[batch,
sequence]``, both axes dynamic: Triton batches ragged requests padded to the longest)
and gives the task's one float32 output under the task's name (``infergate.tasks``):
``embeddings``/``term_weights``/``logits``/``scores`` ``[batch, n]`` or ``token_logits``
``[batch, sequence, labels]``. ``onnx_export`` builds such graphs from PyTorch; a graph
brought as an ONNX file is checked here and, where a difference is only plumbing,
adapted with the onnx library:

- ``token_type_ids`` becomes a value computed inside the graph: zeros for single texts,
  for (query, text) pairs 1 from the token after the first separator on (BERT's pair
  template), as ``onnx_export.ExportWrapper`` computes it;
- int32 inputs are fed from int64 inputs through a Cast; a float16 output is cast to
  float32;
- a per-token output where the task serves one row per text gets the task's head
  (mean pooling over the unpadded tokens for embeddings; SPLADE's
  ``max(log(1 + relu(x)) * mask)`` for term weights);
- the output is renamed to the task's name, and other outputs are dropped.

Anything else (another input, a fixed batch or sequence axis, an output of the wrong
rank or type, several outputs none of which the task names) is refused with one line
saying what the graph has and what it needs. Pure: the onnx library, and the heads'
names (``infergate.tasks.heads``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx
from onnx import TensorProto, helper

from infergate.errors import RegistrationError
from infergate.tasks import heads

INPUTS = ("input_ids", "attention_mask")
TOKEN_TYPES = "token_type_ids"
MIN_OPSET = 11  # CumSum, and the reductions' attribute forms below
INTEGER_INPUTS = (TensorProto.INT64, TensorProto.INT32)
# Opset from which an operator takes ``axes`` as an input rather than an attribute.
_AXES_AS_INPUT = {"ReduceSum": 13, "ReduceMax": 18, "ReduceMean": 18, "Unsqueeze": 13}
_PREFIX = "infergate_"
# Operators of a graph quantised before it came (ONNX Runtime's int8/4-bit, QDQ).
QUANTISED_OPS = frozenset({
    "DequantizeLinear", "DynamicQuantizeLinear", "DynamicQuantizeMatMul",
    "GatherBlockQuantized", "MatMulInteger", "MatMulIntegerToFloat", "MatMulNBits",
    "QAttention", "QLinearMatMul", "QuantizeLinear",
})  # fmt: skip


@dataclass(frozen=True)
class GraphFit:
    """How a user's graph meets the contract: what ``adapt`` changed, and what the
    reference run of the untouched file needs to feed and read."""

    output: str  # the user's output that becomes the task's
    per_token_output: bool  # that output is [batch, sequence, n]
    head: str  # "" (output as it is), "mean_pool" or "splade": added in the graph
    token_types: bool  # the graph had token_type_ids (now computed inside)
    input_types: dict[str, int] = field(default_factory=dict)  # the graph's own dtypes
    changes: tuple[str, ...] = ()  # what adapt did, for the log


def _dims(value: onnx.ValueInfoProto) -> list[int | str | None]:
    """A value's dims: a number when fixed, a name when symbolic, None when unknown."""
    shape = value.type.tensor_type.shape
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in shape.dim]


def _has_shape(value: onnx.ValueInfoProto) -> bool:
    return value.type.tensor_type.HasField("shape")


def _elem(value: onnx.ValueInfoProto) -> int:
    return int(value.type.tensor_type.elem_type)


def _type_name(elem: int) -> str:
    return TensorProto.DataType.Name(elem).lower()


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def fit(model: onnx.ModelProto, task: str, head: str, per_token: bool) -> GraphFit:
    """Check ``model`` against ``task``'s contract (``head`` and ``per_token`` are the
    task's, ``infergate.tasks``); raise :class:`RegistrationError` saying what does not
    fit."""
    graph = model.graph
    opset = _opset(model)
    if opset < MIN_OPSET:
        raise RegistrationError(
            f"the graph uses ONNX opset {opset}; infergate needs {MIN_OPSET} or newer "
            "(export again with a newer opset_version)"
        )
    initializers = {init.name for init in graph.initializer}
    inputs = {i.name: i for i in graph.input if i.name not in initializers}
    missing = [name for name in INPUTS if name not in inputs]
    others = sorted(set(inputs) - {*INPUTS, TOKEN_TYPES})
    if missing or others:
        raise RegistrationError(
            f"the graph's inputs are {sorted(inputs)}; infergate feeds input_ids and "
            f"attention_mask (and computes token_type_ids): "
            + (f"{', '.join(missing)} missing" if missing else f"{', '.join(others)} unknown")
        )
    for name, value in inputs.items():
        if _elem(value) not in INTEGER_INPUTS:
            raise RegistrationError(
                f"the graph's input {name} is {_type_name(_elem(value))}; token ids and "
                "masks are int64 (or int32)"
            )
        dims = _dims(value)
        if _has_shape(value) and len(dims) != 2:
            raise RegistrationError(
                f"the graph's input {name} has {len(dims)} axes; it needs 2, [batch, sequence]"
            )
        fixed = [axis for axis, d in zip(("batch", "sequence"), dims, strict=False)
                 if isinstance(d, int) and d > 0]  # fmt: skip
        if fixed:
            raise RegistrationError(
                f"the graph's input {name} has a fixed {' and '.join(fixed)} axis {dims}; "
                "Triton batches texts padded to the longest, so both axes must be dynamic "
                "(export with dynamic axes)"
            )
    output = _pick_output(graph, task)
    if _elem(output) not in (TensorProto.FLOAT, TensorProto.FLOAT16):
        raise RegistrationError(
            f"the graph's output {output.name} is {_type_name(_elem(output))}; a "
            f"{task} model's output is float32 (or float16)"
        )
    rank = len(_dims(output)) if _has_shape(output) else None
    if per_token:
        if rank not in (None, 3):
            raise RegistrationError(
                f"the graph's output {output.name} has {rank} axes; a {task} model outputs "
                "[batch, sequence, labels], one row per token"
            )
        added = ""
    elif rank == 3 and head in heads.POOLING:
        added = head  # per-token hidden states or MLM logits: the head goes into the graph
    elif rank in (None, 2):
        added = ""
    else:
        per_text = "[batch, dim]" if head in heads.POOLING else "[batch, labels]"
        also = " or [batch, sequence, dim] to pool" if head in heads.POOLING else ""
        raise RegistrationError(
            f"the graph's output {output.name} has {rank} axes; a {task} model outputs "
            f"{per_text}{also}"
        )
    dims = _dims(output) if rank else []
    if dims and isinstance(dims[0], int) and dims[0] > 0:
        raise RegistrationError(
            f"the graph's output {output.name} has a fixed batch axis {dims}; export with "
            "a dynamic batch axis"
        )
    return GraphFit(
        output=output.name,
        per_token_output=rank == 3,
        head=added,
        token_types=TOKEN_TYPES in inputs,
        input_types={name: _elem(value) for name, value in inputs.items()},
    )


def _pick_output(graph: onnx.GraphProto, task: str) -> onnx.ValueInfoProto:
    from infergate.tasks import get

    outputs = list(graph.output)
    if len(outputs) == 1:
        return outputs[0]
    by_name = {o.name: o for o in outputs}
    served = get(task)
    for name in (served.output_name, *served.graph_outputs):
        if name in by_name:
            return by_name[name]
    raise RegistrationError(
        f"the graph has {len(outputs)} outputs ({', '.join(by_name)}) and none is one a "
        f"{task} model is read from ({', '.join(served.graph_outputs)}); keep only "
        "the one to serve"
    )


def quantised_ops(model: onnx.ModelProto) -> list[str]:
    """The quantised operators ``model`` already has, sorted; empty for a float graph."""
    return sorted({node.op_type for node in model.graph.node} & QUANTISED_OPS)


def output_dim(model: onnx.ModelProto, fitted: GraphFit) -> int | None:
    """The last axis of the user's output when the graph fixes it (labels, dimension)."""
    output = next(o for o in model.graph.output if o.name == fitted.output)
    dims = _dims(output) if _has_shape(output) else []
    return dims[-1] if dims and isinstance(dims[-1], int) and dims[-1] > 0 else None


def adapt(
    model: onnx.ModelProto, fitted: GraphFit, output_name: str, segment_sep_id: int | None
) -> onnx.ModelProto:
    """A copy of ``model`` meeting the contract, as ``fitted`` (from :func:`fit`) says;
    ``segment_sep_id`` numbers a pair's token types (None: zeros)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    opset = _opset(out)
    nodes: list[onnx.NodeProto] = []  # run before the user's nodes
    changes: list[str] = []
    renamed: dict[str, str] = {}  # the user's int32 input -> the cast value feeding it

    for value in list(graph.input):
        own = value.name in fitted.input_types and value.name != TOKEN_TYPES
        if own and _elem(value) == TensorProto.INT32:
            cast = f"{_PREFIX}{value.name}_int32"
            nodes.append(helper.make_node("Cast", [value.name], [cast], to=TensorProto.INT32))
            renamed[value.name] = cast
            value.type.tensor_type.elem_type = TensorProto.INT64
            changes.append(f"{value.name} int32 -> int64")
    if fitted.token_types:
        kept = [i for i in graph.input if i.name != TOKEN_TYPES]
        del graph.input[:]
        graph.input.extend(kept)
        nodes.extend(_token_type_nodes(fitted.input_types[TOKEN_TYPES], segment_sep_id, opset))
        changes.append("token_type_ids computed in the graph")
    for node in graph.node:  # the user's nodes read the cast values
        for k, name in enumerate(node.input):
            if name in renamed:
                node.input[k] = renamed[name]
    _reroute_subgraphs(graph, renamed)

    user = next(o for o in graph.output if o.name == fitted.output)
    tail: list[onnx.NodeProto] = []
    current = user.name
    if user.name == output_name and (fitted.head or _elem(user) == TensorProto.FLOAT16):
        current = f"{_PREFIX}user_output"  # the contract's name goes to the final value
        for node in graph.node:
            node.output[:] = [current if n == user.name else n for n in node.output]
            node.input[:] = [current if n == user.name else n for n in node.input]
    if _elem(user) == TensorProto.FLOAT16:
        cast = helper.make_node("Cast", [current], [f"{_PREFIX}float"], to=TensorProto.FLOAT)
        tail.append(cast)
        current = f"{_PREFIX}float"
        changes.append("float16 output cast to float32")
    if fitted.head:
        head_nodes, current = _head_nodes(fitted.head, current, opset)
        tail.extend(head_nodes)
        changes.append(f"{fitted.head} head added")
    if current != output_name:
        tail.append(helper.make_node("Identity", [current], [output_name]))
        if current == user.name:
            changes.append(f"output {user.name} served as {output_name}")
    if output_name != user.name and any(output_name in n.output for n in graph.node):
        raise RegistrationError(
            f"the graph already has a value named {output_name} that is not its output; rename it"
        )
    rank = 3 if fitted.per_token_output and not fitted.head else 2
    axes: list[str | int | None] = ["batch", "sequence", None]
    result = helper.make_tensor_value_info(output_name, TensorProto.FLOAT, axes[:rank])
    dropped = [o.name for o in graph.output if o.name != fitted.output]
    del graph.output[:]
    graph.output.append(result)
    if dropped:
        changes.append(f"outputs {', '.join(dropped)} dropped")
    ordered = [*nodes, *graph.node, *tail]
    del graph.node[:]
    graph.node.extend(ordered)
    try:
        onnx.checker.check_model(out)
    except onnx.checker.ValidationError as exc:
        first = (str(exc).strip() or type(exc).__name__).splitlines()[0]
        raise RegistrationError(f"the adapted graph is not valid ONNX: {first}") from None
    out.doc_string = "; ".join(changes)
    return out


def _reroute_subgraphs(graph: onnx.GraphProto, renamed: dict[str, str]) -> None:
    """Nodes inside If/Loop bodies may read graph inputs too."""
    for node in graph.node:
        for attribute in node.attribute:
            subgraphs = [attribute.g] if attribute.HasField("g") else list(attribute.graphs)
            for sub in subgraphs:
                for inner in sub.node:
                    for k, name in enumerate(inner.input):
                        if name in renamed:
                            inner.input[k] = renamed[name]
                _reroute_subgraphs(sub, renamed)


def _constant(name: str, values: Sequence[int | float], elem: int) -> onnx.NodeProto:
    tensor = helper.make_tensor(name, elem, [len(values)], list(values))
    return helper.make_node("Constant", [], [name], value=tensor)


def _with_axes(
    op: str, inputs: list[str], output: str, axes: list[int], opset: int, **attrs: Any
) -> list[onnx.NodeProto]:
    """``op`` over ``axes``, in the form the graph's opset takes."""
    if opset >= _AXES_AS_INPUT[op]:
        name = f"{output}_axes"
        return [
            _constant(name, axes, TensorProto.INT64),
            helper.make_node(op, [*inputs, name], [output], **attrs),
        ]
    return [helper.make_node(op, inputs, [output], axes=axes, **attrs)]


def _token_type_nodes(elem: int, sep_id: int | None, opset: int) -> list[onnx.NodeProto]:
    """Nodes computing ``token_type_ids`` (of the graph's own dtype) from ``input_ids``."""
    p = _PREFIX
    if sep_id is None:
        zero = helper.make_tensor(f"{p}zero", elem, [1], [0])
        return [
            helper.make_node("Shape", ["input_ids"], [f"{p}ids_shape"]),
            helper.make_node("ConstantOfShape", [f"{p}ids_shape"], [TOKEN_TYPES], value=zero),
        ]
    # 1 from the token after the first separator on: cumsum(is_sep) - is_sep > 0
    return [
        _constant(f"{p}sep", [sep_id], TensorProto.INT64),
        helper.make_node("Equal", ["input_ids", f"{p}sep"], [f"{p}is_sep_bool"]),
        helper.make_node("Cast", [f"{p}is_sep_bool"], [f"{p}is_sep"], to=TensorProto.INT64),
        _constant(f"{p}axis1", [1], TensorProto.INT64),
        helper.make_node("CumSum", [f"{p}is_sep", f"{p}axis1"], [f"{p}seps_so_far"]),
        helper.make_node("Sub", [f"{p}seps_so_far", f"{p}is_sep"], [f"{p}seps_before"]),
        _constant(f"{p}zero64", [0], TensorProto.INT64),
        helper.make_node("Greater", [f"{p}seps_before", f"{p}zero64"], [f"{p}second"]),
        helper.make_node("Cast", [f"{p}second"], [TOKEN_TYPES], to=elem),
    ]


def _head_nodes(head: str, hidden: str, opset: int) -> tuple[list[onnx.NodeProto], str]:
    """The task's head on a ``[batch, sequence, n]`` value; the nodes and their output."""
    p = _PREFIX
    nodes = [
        helper.make_node("Cast", ["attention_mask"], [f"{p}mask_float"], to=TensorProto.FLOAT),
        *_with_axes("Unsqueeze", [f"{p}mask_float"], f"{p}mask", [-1], opset),
    ]
    if head == heads.SPLADE:  # log(1 + relu(x)) >= 0, so padding's zeros never win the max
        nodes += [
            helper.make_node("Relu", [hidden], [f"{p}relu"]),
            _constant(f"{p}one", [1.0], TensorProto.FLOAT),
            helper.make_node("Add", [f"{p}relu", f"{p}one"], [f"{p}relu_plus_one"]),
            helper.make_node("Log", [f"{p}relu_plus_one"], [f"{p}weights"]),
            helper.make_node("Mul", [f"{p}weights", f"{p}mask"], [f"{p}masked"]),
            *_with_axes("ReduceMax", [f"{p}masked"], f"{p}pooled", [1], opset, keepdims=0),
        ]
        return nodes, f"{p}pooled"
    # mean pooling over the unpadded tokens, not normalised (the front-end normalises)
    nodes += [
        helper.make_node("Mul", [hidden, f"{p}mask"], [f"{p}masked"]),
        *_with_axes("ReduceSum", [f"{p}masked"], f"{p}summed", [1], opset, keepdims=0),
        *_with_axes("ReduceSum", [f"{p}mask"], f"{p}counts", [1], opset, keepdims=0),
        _constant(f"{p}tiny", [heads.MIN_TOKENS], TensorProto.FLOAT),
        helper.make_node("Max", [f"{p}counts", f"{p}tiny"], [f"{p}counts_min"]),
        helper.make_node("Div", [f"{p}summed", f"{p}counts_min"], [f"{p}pooled"]),
    ]
    return nodes, f"{p}pooled"
