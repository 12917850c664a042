"""Named prompts at registration: the command line's ``--prompt NAME=TEXT`` and
``--default-prompt``, a sentence-transformers folder's config, and how they combine into
a version's spec (which serving reads back: tests/unit/protocols/test_tei.py)."""

from __future__ import annotations

import json

import pytest

from infergate.cli import build_parser
from infergate.errors import InvalidInput, RegistrationError
from infergate.registration.prompts import parse_prompt_options, prompt_spec
from infergate.serving.prompts import prompt_for
from infergate.versions import Spec


def st_folder(tmp_path, **config):
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps(config))
    return tmp_path


def test_prompt_options_keep_their_text_as_typed():
    assert parse_prompt_options(["query=query: ", "doc=passage:  ", "empty="]) == {
        "query": "query: ", "doc": "passage:  ", "empty": ""}  # fmt: skip
    assert parse_prompt_options(["a=b=c"]) == {"a": "b=c"}
    for bad in (["query"], ["=text"], [" q=x"]):
        with pytest.raises(RegistrationError, match="is not NAME=TEXT"):
            parse_prompt_options(bad)
    with pytest.raises(RegistrationError, match="names 'q' twice"):
        parse_prompt_options(["q=a", "q=b"])


def test_the_command_line_takes_repeated_prompts_and_a_default():
    args = build_parser().parse_args(
        ["register", "src", "--name", "m", "--task", "feature-extraction",
         "--prompt", "query=query: ", "--prompt", "passage=passage: ", "--default-prompt",
         "query"]
    )  # fmt: skip
    assert args.prompt == ["query=query: ", "passage=passage: "]
    assert args.default_prompt == "query"
    plain = build_parser().parse_args(
        ["register", "src", "--name", "m", "--task", "feature-extraction"]
    )
    assert plain.prompt == [] and plain.default_prompt is None


def test_a_sentence_transformers_folders_prompts_and_the_command_lines_over_them(tmp_path):
    folder = st_folder(
        tmp_path, prompts={"query": "query: ", "passage": "passage: "}, default_prompt_name="query"
    )
    assert prompt_spec("feature-extraction", folder) == {
        "prompts": {"query": "query: ", "passage": "passage: "},
        "default_prompt_name": "query",
    }
    both = prompt_spec("feature-extraction", folder, {"query": "Q: ", "title": "title: "}, "title")
    assert both == {"prompts": {"query": "Q: ", "passage": "passage: ", "title": "title: "},
                    "default_prompt_name": "title"}  # fmt: skip


def test_empty_prompts_of_a_folder_are_none(tmp_path):
    folder = st_folder(tmp_path, prompts={"query": "", "document": ""}, default_prompt_name=None)
    assert prompt_spec("feature-extraction", folder) == {}
    assert prompt_spec("feature-extraction", tmp_path / "missing") == {}


def test_a_default_that_names_no_prompt_is_refused(tmp_path):
    with pytest.raises(RegistrationError, match=r"'query' is not one of the prompts \('doc'\)"):
        prompt_spec("feature-extraction", tmp_path, {"doc": "d: "}, "query")


def test_prompts_for_a_task_that_takes_none(tmp_path):
    with pytest.raises(RegistrationError, match="a text-classification model takes none"):
        prompt_spec("text-classification", tmp_path, {"q": "q: "})
    folder = st_folder(tmp_path, prompts={"query": "query: "})
    assert prompt_spec("token-classification", folder) == {}  # the folder's: left out
    assert prompt_spec("sparse-embedding", folder) == {"prompts": {"query": "query: "}}


def test_the_spec_round_trip_and_the_prompt_a_request_gets():
    spec = Spec.from_dict({"task": "feature-extraction", "output_name": "e", "output_dim": 4,
                           "max_length": 8, "prompts": {"query": "query: ", "doc": "d: "},
                           "default_prompt_name": "query"})  # fmt: skip
    assert prompt_for(spec, None, "m") == "query: "
    assert prompt_for(spec, "doc", "m") == "d: "
    with pytest.raises(InvalidInput, match="no prompt called 'x'; its prompts are 'doc', 'query'"):
        prompt_for(spec, "x", "m")
    bare = Spec.from_dict({"task": "feature-extraction", "output_name": "e", "output_dim": 4,
                           "max_length": 8})  # fmt: skip
    assert bare.prompts == {} and prompt_for(bare, None, "m") == ""
