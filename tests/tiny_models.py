"""Tiny random-weight Hugging Face models built from a config, for tests.

No weights can be downloaded here, so tests that need a model folder other than the
shipped all-MiniLM-L6-v2 build one: a WordPiece vocabulary written below, a fast
tokenizer on it, and a 2-layer BERT with random weights.
"""

from __future__ import annotations

from pathlib import Path

from infergate.bench.task_models import train_metaspace_bpe

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
    folder: Path,
    task: str,
    *,
    labels: tuple[str, ...] = ("sad", "happy"),
    seed: int = 0,
    layers: int = 2,
    hidden: int = 32,
) -> Path:
    """Save a tiny BERT for ``task`` and its tokenizer to ``folder``; return ``folder``.
    ``labels`` name its outputs (a cross-encoder's: one or two); ``seed`` draws its
    random weights; ``layers`` and ``hidden`` its size (all-MiniLM-L6's shape is 6 x 384,
    with its tiny vocabulary)."""
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
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2 if hidden <= 64 else hidden // 32,
        intermediate_size=2 * hidden if hidden <= 64 else 4 * hidden,
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


# Sentences the tiny translation model's tokenizer is trained on.
SENTENCES = [
    "i love this film",
    "the service was slow and the food bad",
    "quiet",
    "a good book",
    "this movie is very good",
    "that book was terrible",
    "you hate it",
    "it is not bad at all",
    "the food was great but the service slow",
]


def tiny_marian(folder: Path, *, seed: int = 0, init_std: float = 0.3) -> Path:
    """Save a tiny random Marian translation model and its tokenizer to ``folder``.

    transformers' Marian tokenizer is SentencePiece-only (no fast one), so the tokenizer
    is a BPE trained here with the ``tokenizers`` library, SentencePiece-style (``▁``
    marks word starts), with Marian's special tokens: ``</s>`` (appended to every text,
    id 0), ``<unk>`` and ``<pad>`` last, which is also the decoder's start token.
    ``init_std`` well above the default makes the random decoder depend on its input, so
    different texts get different translations."""
    import torch
    import transformers
    from tokenizers import processors

    folder.mkdir(parents=True, exist_ok=True)
    bpe = train_metaspace_bpe(SENTENCES * 3, 120, ["</s>", "<unk>"])
    bpe.add_special_tokens(["<pad>"])
    bpe.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", 0)]
    )
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    tokenizer.save_pretrained(folder)
    config = transformers.MarianConfig(
        vocab_size=len(tokenizer),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        forced_eos_token_id=None,
        init_std=init_std,
    )
    torch.manual_seed(seed)
    transformers.MarianMTModel(config).eval().save_pretrained(folder)
    return folder


def tiny_t5(folder: Path, *, seed: int = 0, initializer_factor: float = 3.0) -> Path:
    """Save a tiny random T5 (relative positions, no position table) and a BPE tokenizer
    trained like ``tiny_marian``'s (``<pad>`` 0, also the decoder's start, ``</s>`` 1
    appended to every text) to ``folder``. A large ``initializer_factor`` gives large
    activations, which int8 rounds badly: the parity gate's case."""
    import torch
    import transformers
    from tokenizers import processors

    folder.mkdir(parents=True, exist_ok=True)
    bpe = train_metaspace_bpe(SENTENCES * 3, 120, ["<pad>", "</s>", "<unk>"])
    bpe.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", 1)]
    )
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    tokenizer.save_pretrained(folder)
    config = transformers.T5Config(
        vocab_size=len(tokenizer),
        d_model=32,
        d_kv=16,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=2,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
        initializer_factor=initializer_factor,
    )
    torch.manual_seed(seed)
    transformers.T5ForConditionalGeneration(config).eval().save_pretrained(folder)
    return folder


def tiny_bart(folder: Path, *, seed: int = 0) -> Path:
    """Save a tiny random BART and a BPE tokenizer (``<s> text </s>``; ``</s>`` also
    starts the decoder, as BART's config says) to ``folder``."""
    import torch
    import transformers
    from tokenizers import processors

    folder.mkdir(parents=True, exist_ok=True)
    bpe = train_metaspace_bpe(SENTENCES * 3, 120, ["<s>", "<pad>", "</s>", "<unk>"])
    bpe.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<pad>",
    )  # fmt: skip
    tokenizer.save_pretrained(folder)
    config = transformers.BartConfig(
        vocab_size=len(tokenizer),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_bos_token_id=None,
        forced_eos_token_id=None,
        init_std=0.3,
    )
    torch.manual_seed(seed)
    transformers.BartForConditionalGeneration(config).eval().save_pretrained(folder)
    return folder


def slowed(graph: Path, output: str, *, matmuls: int = 12, size: int = 512) -> None:
    """Make the ONNX graph in ``graph`` several times slower with its answers unchanged:
    a chain of ``matmuls`` products of ``size`` x ``size`` matrices, started from the sum of
    the input ids so that no optimiser can fold it away, bounded by tanh, then times zero
    and added to ``output``."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(graph)
    nodes = model.graph.node
    (producer,) = [node for node in nodes if output in node.output]
    fast = f"{output}_before_slowing"
    producer.output[list(producer.output).index(output)] = fast
    weights = np.random.default_rng(0).standard_normal((size, size)) / np.sqrt(size)
    model.graph.initializer.extend([
        numpy_helper.from_array(weights.astype(np.float32), "slow_weights"),
        numpy_helper.from_array(np.zeros((), np.float32), "slow_zero"),
    ])  # fmt: skip
    chain = [
        helper.make_node("Cast", ["input_ids"], ["slow_ids"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["slow_ids"], ["slow_sum"], keepdims=1),
        helper.make_node("Mul", ["slow_sum", "slow_weights"], ["slow_0"]),
    ]
    for i in range(matmuls):
        chain += [
            helper.make_node("MatMul", [f"slow_{i}", "slow_weights"], [f"slow_{i}_product"]),
            helper.make_node("Tanh", [f"slow_{i}_product"], [f"slow_{i + 1}"]),
        ]
    chain += [
        helper.make_node("ReduceSum", [f"slow_{matmuls}"], ["slow_total"], keepdims=0),
        helper.make_node("Mul", ["slow_total", "slow_zero"], ["slow_nothing"]),
        helper.make_node("Add", [fast, "slow_nothing"], [output]),
    ]
    nodes.extend(chain)
    onnx.checker.check_model(model)
    onnx.save(model, graph)
