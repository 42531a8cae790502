"""What a model's source names, and the cache name its fetched copy gets."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.agent.weights.sources import local_path_for, request_headers
from llmgw.weightnames import cache_name, is_cache_name, parse, partial_name, source_prefix

GEMMA = "hf://unsloth/gemma-3-270m-it-GGUF/gemma-3-270m-it-Q4_K_M.gguf"


@pytest.mark.parametrize("source, kind, url, file_name", [
    ("/srv/models/gemma.gguf", "path", None, "gemma.gguf"),
    ("/srv/models/Qwen2.5-7B", "path", None, "Qwen2.5-7B"),
    ("https://mirror.lab/models/gemma.gguf", "http", "https://mirror.lab/models/gemma.gguf", "gemma.gguf"),
    ("http://10.0.0.5:8000/w/a%20b.gguf?dl=1", "http", "http://10.0.0.5:8000/w/a%20b.gguf?dl=1", "a b.gguf"),
    (GEMMA, "hf", "https://huggingface.co/unsloth/gemma-3-270m-it-GGUF/resolve/main/gemma-3-270m-it-Q4_K_M.gguf",
     "gemma-3-270m-it-Q4_K_M.gguf"),
    ("hf://org/repo@v1.0/q4/model.gguf", "hf", "https://huggingface.co/org/repo/resolve/v1.0/q4/model.gguf",
     "model.gguf"),
    ("hf://org/repo@0123abcd/m.gguf", "hf", "https://huggingface.co/org/repo/resolve/0123abcd/m.gguf", "m.gguf"),
    ("hf://org/repo@refs%2Fpr%2F1/m.gguf", "hf", "https://huggingface.co/org/repo/resolve/refs%2Fpr%2F1/m.gguf",
     "m.gguf"),
    ("hf://org/repo/with space.gguf", "hf", "https://huggingface.co/org/repo/resolve/main/with%20space.gguf",
     "with space.gguf"),
])
def test_sources_parse(source, kind, url, file_name):
    parsed = parse(source)
    assert (parsed.kind, parsed.url, parsed.file_name, parsed.text) == (kind, url, file_name, source)
    assert parsed.fetched == (kind != "path")


def test_a_repository_and_a_split_gguf_are_fetched_as_directories():
    repo = parse("hf://Qwen/Qwen3-0.6B@refs%2Fpr%2F1", hf_endpoint="http://127.0.0.1:9999/")
    assert (repo.layout, repo.directory, repo.url, repo.file_name) == ("repository", True, None, "Qwen3-0.6B")
    assert (repo.repository, repo.revision, repo.endpoint) == ("Qwen/Qwen3-0.6B", "refs%2Fpr%2F1",
                                                                "http://127.0.0.1:9999")
    assert parse("hf://Qwen/Qwen3-0.6B").revision == "main"
    split = parse("hf://org/big-GGUF/Q4/big-00001-of-00003.gguf")
    assert (split.layout, split.directory, split.url) == ("parts", True, None)
    assert split.part_names() == ["Q4/big-00001-of-00003.gguf", "Q4/big-00002-of-00003.gguf",
                                  "Q4/big-00003-of-00003.gguf"]
    single = parse("hf://org/repo/m.gguf")
    assert (single.layout, single.directory, single.repo_path) == ("file", False, "m.gguf")


def test_files_patterns_give_a_repository_a_cache_name_of_its_own_in_any_order():
    plain = cache_name("hf://org/repo")
    some = cache_name("hf://org/repo", ["*.json", "*.safetensors"])
    assert plain.startswith(source_prefix("hf://org/repo")) and some.startswith(source_prefix("hf://org/repo"))
    assert plain != some == cache_name("hf://org/repo", ("*.safetensors", "*.json", "*.json"))
    assert cache_name("hf://org/repo", ()) == plain
    assert is_cache_name(some) and is_cache_name(cache_name("hf://org/" + "r" * 90, ["*"]))


def test_hf_endpoint_can_be_a_mirror():
    parsed = parse("hf://org/repo/m.gguf", hf_endpoint="http://127.0.0.1:9999/")
    assert parsed.url == "http://127.0.0.1:9999/org/repo/resolve/main/m.gguf"


@pytest.mark.parametrize("source, says", [
    ("", "empty"),
    ("models/gemma.gguf", "neither an absolute path nor a URL"),
    ("~/gemma.gguf", "neither an absolute path nor a URL"),
    (" /srv/m.gguf", "spaces at its ends"),
    ("/srv/m.gguf\n", "spaces at its ends"),
    ("/srv/m\x00.gguf", "control character"),
    ("file:///srv/m.gguf", "without file://"),
    ("s3://bucket/m.gguf", "not s3://"),
    ("https:///m.gguf", "names no host"),
    ("https://host:notaport/m", "is not a URL"),
    ("https://host/a b.gguf", "percent-encode"),
    ("https://höst/m.gguf", "percent-encode"),
    ("https://host/m.gguf#frag", "#fragment"),
    ("hf://org", "write hf://ORG/REPO for a whole repository, or hf://ORG/REPO/FILE"),
    ("hf://org//m.gguf", "write hf://ORG/REPO for a whole repository"),
    ("hf://org/repo/", "write hf://ORG/REPO for a whole repository"),
    ("hf://org/repo/m-00002-of-00003.gguf", "name the first part, m-00001-of-00003.gguf"),
    ("hf://org/repo/m-00004-of-00003.gguf", "part 4 of 3 is not a split GGUF's part"),
    ("hf://org/repo/m-00001-of-01001.gguf", "(1 to 1000 parts)"),
    ("hf://org/repo@/m.gguf", "nothing after @"),
    ("hf://-org/repo/m.gguf", "organisation '-org'"),
    ("hf://org/re po/m.gguf", "repository 're po'"),
    ("hf://org/repo@a?b/m.gguf", "revision"),
    ("hf://org/repo/../m.gguf", "'..' is not allowed"),
    ("hf://org/repo/a\\b.gguf", "is not allowed"),
    (42, "not int"),
    (None, "not NoneType"),
])
def test_malformed_sources_say_what_to_write(source, says):
    with pytest.raises(ValueError) as raised:
        parse(source)
    assert says in str(raised.value)


def test_credentials_in_a_url_are_refused_without_repeating_them():
    with pytest.raises(ValueError) as raised:
        parse("https://alice:s3cret@mirror.lab/m.gguf")
    assert "credentials" in str(raised.value) and "s3cret" not in str(raised.value)


def test_a_cache_name_is_a_hash_of_the_source_and_a_readable_name():
    name = cache_name(GEMMA)
    assert re.fullmatch(r"llmgw-[0-9a-f]{16}-gemma-3-270m-it-Q4_K_M\.gguf", name)
    assert cache_name(GEMMA) == name  # a calculation: the same catalog gives the same names
    # Same file name, another source: another cache name.
    assert cache_name("hf://other/gemma-3-270m-it-GGUF/gemma-3-270m-it-Q4_K_M.gguf") != name
    assert cache_name(GEMMA.replace("GGUF/", "GGUF@v2/")) != name
    assert is_cache_name(name) and not is_cache_name(partial_name(GEMMA))
    assert partial_name(GEMMA) == name + ".partial"


@pytest.mark.parametrize("source, tail", [
    ("https://h/models/ünïcode name.gguf", "-_n_code_name.gguf"),
    ("https://h/.hidden.gguf", "-hidden.gguf"),
    ("https://h/", "-h"),
    ("https://h/model.partial", "-model_partial"),  # never mistaken for an unfinished download
    ("https://h/" + "x" * 300 + ".gguf", "-" + "x" * 75 + ".gguf"),  # the end, with its extension
    ("not even a source", "-not_even_a_source"),
])
def test_cache_names_of_awkward_sources_are_safe(source, tail):
    name = cache_name(source)
    assert name.endswith(tail) and is_cache_name(name), name


@pytest.mark.parametrize("name", [
    "gemma.gguf", "llmgw-abc-x.gguf", "llmgw-0123456789ABCDEF-x.gguf", "llmgw-0123456789abcdef-",
    "llmgw-0123456789abcdef-a/b", "llmgw-0123456789abcdef-x.gguf.partial", "xllmgw-0123456789abcdef-x",
    "llmgw-0123456789abcdef-" + "x" * 81, None, 7, b"llmgw-0123456789abcdef-x",
])
def test_other_names_are_not_cache_names(name):
    assert not is_cache_name(name)


@given(st.text())
def test_every_source_has_a_cache_name_that_is_one_plain_file_name(source):
    name = cache_name(source)
    assert is_cache_name(name)
    assert "/" not in name and name not in (".", "..") and len(name) <= 6 + 16 + 1 + 80


def test_local_path_for(tmp_path):
    assert local_path_for("/srv/models/m.gguf", tmp_path) == Path("/srv/models/m.gguf")
    assert local_path_for(GEMMA, tmp_path) == tmp_path / cache_name(GEMMA)
    assert local_path_for("hf://org/repo", tmp_path) == tmp_path / cache_name("hf://org/repo")
    assert local_path_for("hf://org/repo", tmp_path, ["*.json"]) == tmp_path / cache_name("hf://org/repo", ["*.json"])
    split = "hf://org/repo/q/m-00001-of-00002.gguf"
    assert local_path_for(split, tmp_path) == tmp_path / cache_name(split) / "q" / "m-00001-of-00002.gguf"
    with pytest.raises(ValueError):
        local_path_for("relative.gguf", tmp_path)


def test_hf_token_is_sent_to_hf_sources_only():
    env = {"HF_TOKEN": "hf_abc"}
    assert request_headers(parse(GEMMA), env) == {"Authorization": "Bearer hf_abc"}
    assert request_headers(parse("https://mirror.lab/m.gguf"), env) == {}
    assert request_headers(parse(GEMMA), {}) == {}
    assert request_headers(parse(GEMMA), {"HF_TOKEN": "  "}) == {}


SERVER_YAML = """\
listen: {link: "ssl:7443", api: "tcp:8080", admin: "tcp:9090"}
tls: {ca: ca.crt, cert: server.crt, key: server.key}
profiles:
  qwen-cpu: {engine: vllm}
models:
  qwen: {source: "hf://Qwen/Qwen3-0.6B", profile: qwen-cpu, files: %s}
"""


def test_a_models_files_patterns_are_read_from_server_yaml(tmp_path):
    from llmgw.config import load_server_config
    from llmgw.errors import ConfigError

    for name in ("ca.crt", "server.crt", "server.key"):
        (tmp_path / name).write_text("")
    (tmp_path / "server.yaml").write_text(SERVER_YAML % '["*.json", "*.safetensors", "tokenizer/"]')
    config = load_server_config(tmp_path / "server.yaml")
    assert config.models["qwen"].files == ("*.json", "*.safetensors", "tokenizer/")
    (tmp_path / "server.yaml").write_text(SERVER_YAML % '["/etc/*"]')
    with pytest.raises(ConfigError, match=r"models\.qwen\.files\[0\].*not starting with /"):
        load_server_config(tmp_path / "server.yaml")
