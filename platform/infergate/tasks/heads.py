"""The heads an exported graph puts on a model's output, and how the token types of a
(query, text) pair are numbered: named once here for the three places that compute them.

A task names its head (``Task.head``). PyTorch computes it inside the exported graph
(``registration.onnx_export.ExportWrapper``), ONNX nodes add it to a user's graph that
lacks it (``registration.graph_contract``), and the numpy functions here are the
reference a user's untouched graph is run with (``registration.onnx_folder``). The three
must agree: the parity check at registration compares the PyTorch head with the exported
graph, and the graph contract's tests compare its nodes with this reference.

Pure: numpy only.
"""

from __future__ import annotations

import numpy as np

LOGITS = "logits"  # the model's logits as they are (a sequence or a token classifier's)
MEAN_POOL = "mean_pool"  # attention-masked mean of last_hidden_state, not L2-normalised
SPLADE = "splade"  # log(1 + relu) of the masked-LM logits, max-pooled over the text
GENERATE = "generate"  # no graph: CTranslate2 decodes (translation)
POOLING = (MEAN_POOL, SPLADE)  # heads that turn one row per token into one per text
MIN_TOKENS = 1e-9  # mean pooling's divisor floor, for a row with no unpadded token


def apply(head: str, output: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """A pooling ``head`` over a float32 ``[batch, sequence, n]`` output's unpadded
    tokens; any other head's output as it is."""
    mask = attention_mask[..., None].astype(np.float32)
    if head == SPLADE:  # log(1 + relu(x)) >= 0, so padding's zeros never win the max
        return (np.log1p(np.maximum(output, 0)) * mask).max(axis=1)
    if head == MEAN_POOL:
        return (output * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), MIN_TOKENS)
    return output


def token_types(input_ids: np.ndarray, sep_id: int | None) -> np.ndarray:
    """Token type ids computed from ``input_ids``: zeros for single texts (``sep_id``
    None); for pairs 1 from the token after the first ``sep_id`` on, as BERT's pair
    template ``[CLS] A [SEP] B [SEP]`` numbers them."""
    if sep_id is None:
        return np.zeros_like(input_ids)
    is_sep = (input_ids == sep_id).astype(np.int64)
    return ((np.cumsum(is_sep, axis=1) - is_sep) > 0).astype(np.int64)
