"""The numpy reference of the heads and of the pairs' token types (``infergate.tasks.heads``),
which a user's ONNX graph is run with at registration."""

import numpy as np

from infergate.tasks import TASKS, heads

IDS = np.array([[2, 7, 3, 9, 3], [2, 5, 3, 0, 0]])
MASK = (IDS != 0).astype(np.int64)


def test_every_task_names_a_declared_head():
    declared = {heads.LOGITS, heads.MEAN_POOL, heads.SPLADE, heads.GENERATE}
    assert {task.head for task in TASKS.values()} <= declared


def test_pooling_heads_leave_the_padding_out():
    output = np.arange(30, dtype=np.float32).reshape(2, 5, 3) - 10
    mean = heads.apply(heads.MEAN_POOL, output, MASK)
    np.testing.assert_allclose(mean[1], output[1, :3].mean(axis=0))
    splade = heads.apply(heads.SPLADE, output, MASK)
    np.testing.assert_allclose(splade[1], np.log1p(np.maximum(output[1, :3], 0)).max(axis=0))
    assert heads.apply(heads.LOGITS, output, MASK) is output


def test_a_pairs_second_segment_starts_after_the_first_separator():
    assert heads.token_types(IDS, 3).tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 1, 1]]
    assert not heads.token_types(IDS, None).any()
