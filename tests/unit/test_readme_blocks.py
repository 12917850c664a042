"""Every code block of the README and of the docs pages is run by tests/e2e/test_readme.py
or marked with a reason, and expected outputs are compared as tests/readme_blocks.py says."""

import pytest

from readme_blocks import (
    README,
    ROOT,
    bash_commands,
    output_mismatch,
    pages,
    printed_comments,
    read_blocks,
    readme_blocks,
)


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_is_run_or_marked_with_a_reason(path):
    blocks, problems = read_blocks(path.read_text(), str(path.relative_to(ROOT)))
    assert problems == []
    assert all(b.runs or b.marker or b.language == "text" for b in blocks)


def test_the_pages_are_the_readme_and_every_docs_page_in_the_sites_nav():
    """A page left out of mkdocs.yml's nav would have its blocks neither run nor checked."""
    found = pages()
    assert found[0] == README and len(set(found)) == len(found)
    assert sorted(found[1:]) == sorted((ROOT / "docs").glob("*.md"))


@pytest.mark.parametrize(
    "command",
    [
        "curl -s http://127.0.0.1:8000/v1/models/sentiment/predict",
        "curl -s http://127.0.0.1:8000/openai/v1/embeddings",
        "curl -s http://127.0.0.1:8000/v2/models/sentiment/versions/1/infer",
        "curl -s -i http://127.0.0.1:8000/readyz",
        "infergate register path/to/hf-model-folder",
        "infergate canary start reviews",
        "infergate canary set-weight reviews",
        "infergate canary rollback reviews",
        "infergate canary status reviews",
        "infergate canary promote reviews",
        "MlflowClient(",
        "infergate.dashboards generate",
        "infergate dashboards snapshot",
        "infergate keys create",
        "OpenAI(",
        "tritonclient.http",
    ],
)
def test_what_the_readme_shows_of_a_running_stack_is_run(command):
    """Taken out of a run block (marked, or moved into prose), it would go untested."""
    run = [b for b in readme_blocks() if b.runs and command in " ".join(bash_commands(b.code))]
    assert run, f"no block that runs has {command!r}"


@pytest.mark.parametrize(
    "shown",
    [
        "make run",
        "make test",
        "/v1/models/sentiment/predict",  # text-classification, infergate's own protocol
        "/v1/models/embed/predict",  # feature-extraction
        "/v1/models/rerank/rerank",  # text-ranking
        "/v1/models/splade/predict",  # sparse-embedding
        "/v1/models/ner/predict",  # token-classification
        "/v1/models/translate/predict",  # translation
        "OpenAI(",  # the OpenAI-compatible embeddings
        "tritonclient.http",  # the Open Inference Protocol
    ],
)
def test_the_readme_keeps_its_two_commands_and_an_example_of_each_task_and_protocol(shown):
    """The rest moved to docs/; what a newcomer needs first stays in the README."""
    assert any(shown in b.code for b in readme_blocks() if b.page == "README.md"), shown


def test_every_curl_and_command_block_says_what_it_prints():
    for block in readme_blocks():
        if block.runs and block.language == "bash":
            assert block.output is not None, f"{block.page} line {block.line} shows no output"


SAMPLE = """\
Intro.

```bash
curl -s http://127.0.0.1:8000/healthz
```

```json
{"status":"ok"}
```

<!-- not run: needs a GPU -->
```bash
nvidia-smi
```

<!-- checked by tests/integration/test_helm_chart.py -->
```bash
helm install x helm/infergate
```

```python
print(1 + 1)  # 2
```

Then a diagram:

```text
a --> b
```
"""


def test_blocks_outputs_and_markers_are_read():
    blocks, problems = read_blocks(SAMPLE)
    assert problems == []
    curl, gpu, helm, python, diagram = blocks
    assert curl.runs and curl.output is not None and curl.output.code == '{"status":"ok"}\n'
    assert (curl.line, curl.output.line) == (3, 7)
    assert gpu.marker == ("not run", "needs a GPU") and not gpu.runs
    assert helm.marker == ("checked by", "tests/integration/test_helm_chart.py")
    assert python.runs and printed_comments(python.code) == ["2"]
    assert diagram.language == "text" and not diagram.runs and diagram.output is None


@pytest.mark.parametrize(
    ("markdown", "problem"),
    [
        ("```\nls\n```\n", "language ''"),
        ("```sh\nls\n```\n", "language 'sh'"),
        ("<!-- not run -->\n```bash\nls\n```\n", "is not '<!-- not run: REASON -->'"),
        ("<!-- not run:   -->\n```bash\nls\n```\n", "is not '<!-- not run: REASON -->'"),
        ("<!-- skip: slow -->\n```bash\nls\n```\n", "is not '<!-- not run: REASON -->'"),
        ("<!-- checked by tests/nowhere.py -->\n```bash\nls\n```\n", "which is not a file"),
        ("<!-- checked by tests/unit/protocols/test_http.py -->\n```bash\nls\n```\n",
         "does not read README.md"),
        ("Prose.\n\n```json\n{}\n```\n", "no command's output"),
        ("```python\nx = 1\nprint(x)\n```\n", "line 3: say what it prints"),
        ("```python\nprint(x)  # 1\n```\n\n```text\n1\n```\n", "in its print lines"),
        ("```bash\nls\n```\n\n<!-- not run: x -->\n```text\na\n```\n", "needs no marker"),
        ("```bash\nls\n", "never closed"),
        ("1. A step:\n\n   ```bash\n   ls\n   ```\n", "line 3: an indented fence"),
    ],
)  # fmt: skip
def test_a_block_neither_run_nor_marked_properly_is_a_problem(markdown, problem):
    _, problems = read_blocks(markdown)
    assert len(problems) == 1 and problem in problems[0], problems


def test_an_output_block_belongs_only_to_the_block_right_before_it():
    _, problems = read_blocks("```bash\nls\n```\n\nSome words.\n\n```text\na\n```\n")
    assert problems == []  # the text block is a diagram, and `ls` says it prints nothing
    blocks, _ = read_blocks("```bash\nls\n```\n```text\na\n```\n```text\nb\n```\n")
    assert [b.language for b in blocks] == ["bash", "text"]
    assert blocks[0].output is not None and blocks[0].output.code == "a\n"


def test_bash_commands_join_continuations_and_drop_comments():
    code = "# a comment\ncurl -s http://x \\\n  -H 'a: b'   # trailing words stay\n\nls\n"
    assert bash_commands(code) == ["curl -s http://x -H 'a: b'   # trailing words stay", "ls"]


def test_print_comments_are_what_each_call_prints():
    code = "print(len(v), n)  # 384 10\nx = f(1)  # not a print\nprint(g(a))  # f(y) [1]\n"
    assert printed_comments(code) == ["384 10", "f(y) [1]"]


# -- expected outputs ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expected", "actual"),
    [
        ("384 10", "384 10\n"),
        ('{"score":0.98}', '{"score":0.9812345}'),
        ('{"score":0.98}', '{"score":0.9749}'),
        ('{"score":0.996}', '{"score":0.99591}'),
        ("[-0.019,0.086,...]", "[-0.019279655,0.08559585,0.04,-4.9e-33]"),
        ('{"a":[\n  1,\n  2]}', '{"a":[1,2]}'),
        ("HTTP/1.1 200 OK\n...\n{}", "HTTP/1.1 200 OK\r\ndate: now\r\n\r\n{}"),
        ("ig_...", "ig_JsFYAIFHhb8voe_kAC"),
        ("[[0.004 0.996] [0.996 0.004]]", "[[0.004 0.996]\n [0.996 0.004]]"),
        ("version 2.60.0", "version 2.60.0"),
        ("  1        champion  80%", "1 champion 80%"),
    ],
)
def test_outputs_that_match(expected, actual):
    assert output_mismatch(expected, actual) is None


@pytest.mark.parametrize(
    ("expected", "actual"),
    [
        ("384 10", "384 11"),
        ("384 10", "38410"),
        ("384 10", "384 10 extra"),
        ('{"score":0.98}', '{"score":0.9649}'),
        ('{"score":0.98}', '{"score":1.0}'),
        ('{"score":0.996}', '{"score":0.9945}'),
        ('{"label":"positive"}', '{"label":"negative"}'),
        ('{"a":1}', '{"a": 1}'),
        ("['embed', 'sentiment']", "['embed', 'reviews', 'sentiment']"),
        ("[-0.019,...]", "[0.019,0.5]"),
        ("a\n...\nb", "a\nc"),
        ("", "something printed"),
        ("version 2.60.0", "version 2.61.0"),
    ],
)
def test_outputs_that_do_not(expected, actual):
    assert output_mismatch(expected, actual) is not None
