"""Tiny random-weight Hugging Face models built from a config, for tests.

No weights can be downloaded here, so tests that need a model folder other than the
shipped all-MiniLM-L6-v2 build one: a WordPiece vocabulary written below, a fast
tokenizer on it, and a 2-layer BERT with random weights.
"""

from __future__ import annotations

from pathlib import Path

WORDS = [
    "the",
    "a",
    "film",
    "book",
    "movie",
    "this",
    "that",
    "is",
    "was",
    "very",
    "good",
    "bad",
    "great",
    "terrible",
    "love",
    "hate",
    "i",
    "you",
    "it",
    "service",
    "food",
    "not",
    "at",
    "all",
    "and",
    "but",
    "of",
    "to",
    "in",
    "with",
    "for",
    "on",
    "slow",
    "fast",
    "quiet",
    "loud",
]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


# The transformers class of each task's tiny model; feature-extraction's is BertModel.
MODEL_CLASSES = {
    "text-classification": "BertForSequenceClassification",
    "text-ranking": "BertForSequenceClassification",  # a cross-encoder: 1 or 2 labels
    "sparse-embedding": "BertForMaskedLM",
    "token-classification": "BertForTokenClassification",
}


def tiny_bert(
    folder: Path, task: str, *, labels: tuple[str, ...] = ("sad", "happy"), seed: int = 0
) -> Path:
    """Save a tiny BERT for ``task`` and its tokenizer to ``folder``; return ``folder``.
    ``labels`` name its outputs (a cross-encoder's: one or two); ``seed`` draws its
    random weights."""
    import torch
    import transformers
    from transformers import BertConfig, BertTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    vocab = folder / "vocab.txt"
    vocab.write_text(
        "\n".join([*SPECIAL, *WORDS, *(f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz")]) + "\n"
    )
    tokenizer = BertTokenizerFast(vocab=str(vocab), do_lower_case=True)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
    )
    torch.manual_seed(seed)
    model_class = MODEL_CLASSES.get(task, "BertModel")
    model = getattr(transformers, model_class)(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def onnx_only(model_folder: Path, folder: Path, *, output: str = "logits") -> Path:
    """Export the tiny model in ``model_folder`` (from :func:`tiny_bert`) to
    ``folder/model.onnx`` as a user's own export would be (Optimum's layout: the inputs
    ``input_ids``, ``attention_mask`` and ``token_type_ids``, the model's own output
    name, dynamic batch and sequence axes) and copy its tokenizer and config beside it,
    without the PyTorch weights; return ``folder``. ``output`` is ``logits`` (a model
    with a head) or ``last_hidden_state`` (a bare encoder)."""
    import shutil
    import warnings

    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    for path in model_folder.iterdir():
        if path.is_file() and not path.name.endswith((".safetensors", ".bin")):
            shutil.copyfile(path, folder / path.name)
    config = transformers.AutoConfig.from_pretrained(model_folder)
    model_class = next(iter(config.architectures or ["BertModel"]))
    model = (
        getattr(transformers, model_class)
        .from_pretrained(model_folder, attn_implementation="eager")
        .eval()
    )

    class Outputs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            )
            return getattr(out, output)

    ids = torch.tensor([[2, 10, 11, 3], [2, 12, 3, 0]])
    args = (ids, (ids != 0).long(), torch.zeros_like(ids))
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {name: {0: "batch_size", 1: "sequence_length"} for name in [*names, output]}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Outputs(), args, str(folder / "model.onnx"), input_names=names,
            output_names=[output], dynamic_axes=axes, opset_version=17, dynamo=False,
        )  # fmt: skip
    return folder
