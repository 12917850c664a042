"""infergate.registration.graph_contract on tiny graphs built here with onnx.helper: what
fits, what is adapted (and that the adapted graph computes what the user's graph computes with the
inputs infergate would have fed it), and the one-line errors for what does not fit."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from infergate.errors import RegistrationError
from infergate.registration.graph_contract import adapt, fit, output_dim, quantised_ops
from infergate.tasks import get, heads

IDS = np.array([[2, 7, 3, 9, 3], [2, 5, 3, 0, 0]], dtype=np.int64)
MASK = (IDS != 0).astype(np.int64)
SEP = 3
WEIGHTS = np.array([1.0, -2.0, 0.5], dtype=np.float32)  # the toy graph's 3 "labels"


def toy_graph(
    *,
    token_types: bool = True,
    elem: int = TensorProto.INT64,
    out_elem: int = TensorProto.FLOAT,
    opset: int = 17,
    output: str = "logits",
    extra_output: str | None = None,
    batch: str | int = "batch",
) -> onnx.ModelProto:
    """[batch, sequence, 3]: (ids + 100 * token types) * mask * WEIGHTS, a per-token
    output that depends on every input, so a wrongly fed one shows."""
    names = ["input_ids", "attention_mask", *(["token_type_ids"] if token_types else [])]
    inputs = [helper.make_tensor_value_info(n, elem, [batch, "sequence"]) for n in names]
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["ids_f"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
    ]
    summed = "ids_f"
    if token_types:
        nodes += [
            helper.make_node("Cast", ["token_type_ids"], ["types_f"], to=TensorProto.FLOAT),
            helper.make_node(
                "Constant",
                [],
                ["hundred"],
                value=helper.make_tensor("hundred_value", TensorProto.FLOAT, [1], [100.0]),
            ),
            helper.make_node("Mul", ["types_f", "hundred"], ["types_100"]),
            helper.make_node("Add", ["ids_f", "types_100"], ["ids_types"]),
        ]
        summed = "ids_types"
    weights = helper.make_tensor("weights", TensorProto.FLOAT, [3], WEIGHTS.tolist())
    nodes += [
        helper.make_node("Mul", [summed, "mask_f"], ["masked"]),
        helper.make_node("Constant", [], ["axes"], value=helper.make_tensor(
            "axes_value", TensorProto.INT64, [1], [-1])),
        helper.make_node("Unsqueeze", ["masked", "axes"], ["column"]),
        helper.make_node("Constant", [], ["w"], value=weights),
        helper.make_node("Mul", ["column", "w"], ["out_f"]),
        helper.make_node("Cast", ["out_f"], [output], to=out_elem),
    ]  # fmt: skip
    outputs = [helper.make_tensor_value_info(output, out_elem, [batch, "sequence", 3])]
    if extra_output:
        nodes.append(helper.make_node("Identity", ["mask_f"], [extra_output]))
        outputs.append(
            helper.make_tensor_value_info(extra_output, TensorProto.FLOAT, [batch, "sequence"])
        )
    graph = helper.make_graph(nodes, "toy", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    if opset < 13:  # Unsqueeze took its axes as an attribute before opset 13
        for node in model.graph.node:
            if node.op_type == "Unsqueeze":
                del node.input[1:]
                node.attribute.append(helper.make_attribute("axes", [-1]))
    onnx.checker.check_model(model)
    return model


def expected(ids: np.ndarray, types: np.ndarray | None = None) -> np.ndarray:
    types = np.zeros_like(ids) if types is None else types
    return ((ids + 100.0 * types) * MASK)[..., None] * WEIGHTS


def run(model: onnx.ModelProto, **feeds: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask"]
    (out,) = session.run(None, feeds or {"input_ids": IDS, "attention_mask": MASK})
    return out


def fitted_and_adapted(model: onnx.ModelProto, task: str, sep: int | None = None):
    served = get(task)
    fitted = fit(model, task, served.head, served.per_token)
    return fitted, adapt(model, fitted, served.output_name, sep)


def test_token_types_become_zeros_inside_and_the_output_takes_the_tasks_name():
    fitted, adapted = fitted_and_adapted(toy_graph(), "token-classification")
    assert fitted.token_types and fitted.output == "logits" and not fitted.head
    assert [o.name for o in adapted.graph.output] == ["token_logits"]
    np.testing.assert_allclose(run(adapted), expected(IDS))
    assert "token_type_ids computed in the graph" in adapted.doc_string
    assert output_dim(toy_graph(), fitted) == 3


def test_pairs_get_token_types_from_the_first_separator_on():
    _, adapted = fitted_and_adapted(toy_graph(), "token-classification", sep=SEP)
    # [CLS] a [SEP] b [SEP]: 0 0 0 1 1 ; padding after a second segment's [SEP] stays 1,
    # as BERT's rule is computed, and is masked anyway.
    types = np.array([[0, 0, 0, 1, 1], [0, 0, 0, 1, 1]])
    np.testing.assert_allclose(run(adapted), expected(IDS, types))


@pytest.mark.parametrize("opset", [11, 17, 18])
def test_int32_inputs_are_fed_from_int64_at_every_opset(opset):
    model = toy_graph(elem=TensorProto.INT32, opset=opset)
    _, adapted = fitted_and_adapted(model, "token-classification")
    assert all(i.type.tensor_type.elem_type == TensorProto.INT64 for i in adapted.graph.input)
    np.testing.assert_allclose(run(adapted), expected(IDS))


@pytest.mark.parametrize("opset", [11, 17, 18])
def test_embedding_and_splade_heads_pool_a_per_token_output(opset):
    model = toy_graph(token_types=False, opset=opset, output="last_hidden_state")
    hidden = expected(IDS)
    fitted, adapted = fitted_and_adapted(model, "feature-extraction")
    assert fitted.head == "mean_pool"
    mask = MASK[..., None]
    np.testing.assert_allclose(run(adapted), (hidden * mask).sum(1) / mask.sum(1), rtol=1e-6)
    fitted, adapted = fitted_and_adapted(model, "sparse-embedding")
    assert fitted.head == "splade"
    splade = (np.log1p(np.maximum(hidden, 0)) * mask).max(axis=1)
    np.testing.assert_allclose(run(adapted), splade, rtol=1e-6)


def test_a_float16_output_is_served_as_float32():
    _, adapted = fitted_and_adapted(toy_graph(out_elem=TensorProto.FLOAT16), "token-classification")
    out = run(adapted)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected(IDS), rtol=1e-3)


def test_an_output_already_named_as_the_task_and_pooled_keeps_the_name():
    model = toy_graph(token_types=False, output="embeddings")
    _, adapted = fitted_and_adapted(model, "feature-extraction")
    assert [o.name for o in adapted.graph.output] == ["embeddings"]
    assert run(adapted).shape == (2, 3)


def test_the_tasks_output_is_picked_among_several_and_the_others_dropped():
    model = toy_graph(extra_output="hidden_states")
    fitted, adapted = fitted_and_adapted(model, "token-classification")
    assert fitted.output == "logits"
    assert [o.name for o in adapted.graph.output] == ["token_logits"]
    assert "outputs hidden_states dropped" in adapted.doc_string


def graph_with_input(name: str, elem: int = TensorProto.INT64) -> onnx.ModelProto:
    model = toy_graph()
    model.graph.input.append(helper.make_tensor_value_info(name, elem, ["batch", "sequence"]))
    return model


def relabelled(model: onnx.ModelProto, **changes) -> onnx.ModelProto:
    for value in [*model.graph.input, *model.graph.output]:
        if value.name in changes:
            value.CopyFrom(changes[value.name])
    return model


@pytest.mark.parametrize(
    ("model", "task", "message"),
    [
        (toy_graph(opset=10), "token-classification", "opset 10; infergate needs 11"),
        (graph_with_input("position_ids"), "token-classification", "position_ids unknown"),
        (relabelled(toy_graph(), attention_mask=helper.make_tensor_value_info(
            "mask", TensorProto.INT64, ["batch", "sequence"])),
         "token-classification", "attention_mask missing"),
        (relabelled(toy_graph(), input_ids=helper.make_tensor_value_info(
            "input_ids", TensorProto.FLOAT, ["batch", "sequence"])),
         "token-classification", "input_ids is float; token ids and masks are int64"),
        (relabelled(toy_graph(), input_ids=helper.make_tensor_value_info(
            "input_ids", TensorProto.INT64, ["batch", "sequence", 1])),
         "token-classification", "input_ids has 3 axes"),
        (toy_graph(batch=1), "token-classification", "fixed batch axis [1, 'sequence']"),
        (relabelled(toy_graph(), input_ids=helper.make_tensor_value_info(
            "input_ids", TensorProto.INT64, ["batch", 128])),
         "token-classification", "fixed sequence axis"),
        (toy_graph(), "text-classification", "has 3 axes; a text-classification model "
         "outputs [batch, labels]"),
        (relabelled(toy_graph(), logits=helper.make_tensor_value_info(
            "logits", TensorProto.FLOAT, ["batch", 3])),
         "token-classification", "[batch, sequence, labels], one row per token"),
        (toy_graph(out_elem=TensorProto.INT64), "token-classification", "output logits is int64"),
        (toy_graph(output="scores_a", extra_output="scores_b"), "token-classification",
         "2 outputs (scores_a, scores_b) and none is one"),
    ],
)  # fmt: skip
def test_a_graph_that_does_not_fit_is_refused_saying_why(model, task, message):
    served = get(task)
    with pytest.raises(RegistrationError, match=None) as raised:
        fit(model, task, served.head, served.per_token)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_value_named_like_the_tasks_output_inside_the_graph_is_refused():
    model = toy_graph()
    for node in model.graph.node:
        node.output[:] = ["token_logits" if n == "masked" else n for n in node.output]
        node.input[:] = ["token_logits" if n == "masked" else n for n in node.input]
    with pytest.raises(RegistrationError, match="already has a value named token_logits"):
        fitted_and_adapted(model, "token-classification")


def test_quantised_operators_are_found():
    assert quantised_ops(toy_graph()) == []
    model = toy_graph()
    model.graph.node.append(helper.make_node("DequantizeLinear", ["a", "b"], ["c"]))
    assert quantised_ops(model) == ["DequantizeLinear"]


@pytest.mark.parametrize("task", ["feature-extraction", "sparse-embedding"])
def test_the_head_added_in_the_graph_is_the_numpy_references(task):
    model = toy_graph(token_types=False, output="last_hidden_state")
    fitted, adapted = fitted_and_adapted(model, task)
    reference = heads.apply(fitted.head, expected(IDS).astype(np.float32), MASK)
    np.testing.assert_allclose(run(adapted), reference, rtol=1e-6)


def test_the_token_types_computed_in_the_graph_are_the_numpy_references():
    _, adapted = fitted_and_adapted(toy_graph(), "token-classification", sep=SEP)
    np.testing.assert_allclose(run(adapted), expected(IDS, heads.token_types(IDS, SEP)))
