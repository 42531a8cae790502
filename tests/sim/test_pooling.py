"""The simulator's rerank, score, tokenize and detokenize answer as vLLM does, with values a test can predict."""

from __future__ import annotations

import json

import pytest

from llmgw.sim import pooling
from llmgw.sim.api import ApiError
from tests.support.sim import MODEL


def post(sim, path: str, payload: dict):
    status, _, body = sim.request("POST", path, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    return status, json.loads(body)


def test_rerank_orders_the_documents_by_the_share_of_the_query_they_contain():
    answer = json.loads(pooling.rerank({"query": "red fox", "documents": ["a blue car", "the red fox", {"text": "red"}],
                                        "top_n": 2}, "m", "rerank-1"))
    assert answer["id"] == "rerank-1" and answer["model"] == "m"
    assert [(r["index"], r["relevance_score"], r["document"]["text"]) for r in answer["results"]] == [
        (1, 1.0, "the red fox"), (2, 0.5, "red")]
    assert answer["usage"] == {"total_tokens": 2 * 3 + 3 + 3 + 1}


def test_score_is_one_to_many_or_pairwise():
    one = json.loads(pooling.score({"text_1": "red fox", "text_2": ["red", "fox red", "no"]}, "m", "score-1", 7))
    assert [(d["index"], d["object"], d["score"]) for d in one["data"]] == [(0, "score", 0.5), (1, "score", 1.0),
                                                                            (2, "score", 0.0)]
    assert one["object"] == "list" and one["created"] == 7 and one["usage"]["completion_tokens"] == 0
    pairs = json.loads(pooling.score({"text_1": ["a", "b"], "text_2": ["a", "c"]}, "m", "s", 7))
    assert [d["score"] for d in pairs["data"]] == [1.0, 0.0]
    with pytest.raises(ApiError, match="text_1 has 2 texts and text_2 3"):
        pooling.score({"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "m", "s", 7)


def test_tokenize_then_detokenize_gives_the_words_back():
    vocabulary = pooling.Vocabulary()
    tokens = json.loads(pooling.tokenize({"prompt": "hello there world", "return_token_strs": True}, vocabulary))
    assert tokens["count"] == 3 and tokens["max_model_len"] == pooling.MAX_MODEL_LEN
    assert tokens["token_strs"] == ["hello", "there", "world"]
    # The same word is the same id in every process.
    assert tokens["tokens"] == [pooling.Vocabulary().id_of(w) for w in ("hello", "there", "world")]
    chat = json.loads(pooling.tokenize({"messages": [{"role": "user", "content": "hello world"}]}, vocabulary))
    assert chat["tokens"] == [tokens["tokens"][0], tokens["tokens"][2]] and chat["token_strs"] is None
    assert json.loads(pooling.detokenize({"tokens": tokens["tokens"]}, vocabulary)) == {"prompt": "hello there world"}
    assert json.loads(pooling.detokenize({"tokens": [7]}, pooling.Vocabulary())) == {"prompt": "<7>"}
    with pytest.raises(ApiError, match="tokens must be a list of token ids"):
        pooling.detokenize({"tokens": "1 2"}, vocabulary)


@pytest.mark.parametrize("path", sorted(pooling.RERANK))
def test_the_sim_serves_rerank_at_every_path_vllm_does(sim, path):
    status, answer = post(sim, path, {"model": MODEL, "query": "fox", "documents": ["dog", "fox"]})
    assert status == 200 and answer["results"][0]["index"] == 1 and answer["id"].startswith("rerank-")


def test_the_sim_serves_score_tokenize_and_detokenize(sim):
    status, scored = post(sim, "/score", {"model": MODEL, "text_1": "a b", "text_2": ["a", "b c"]})
    assert status == 200 and [d["score"] for d in scored["data"]] == [0.5, 0.5]
    status, tokens = post(sim, "/tokenize", {"model": MODEL, "prompt": "one two"})
    assert status == 200 and tokens["count"] == 2
    status, text = post(sim, "/v1/detokenize", {"model": MODEL, "tokens": tokens["tokens"]})
    assert (status, text) == (200, {"prompt": "one two"})


def test_the_sim_refuses_another_model_and_a_bad_body_as_vllm_does(sim):
    status, answer = post(sim, "/v1/rerank", {"model": "other", "query": "q", "documents": ["d"]})
    assert status == 404 and answer["error"]["code"] == "model_not_found"
    status, answer = post(sim, "/v1/rerank", {"model": MODEL, "documents": ["d"]})
    assert status == 400 and answer["error"]["param"] == "query"


def test_a_long_query_against_many_documents_costs_their_words_not_their_product():
    import time

    query = "w " * 500_000
    started = time.monotonic()
    answer = json.loads(pooling.rerank({"query": query, "documents": ["w"] + [""] * 20_000}, "m", "r"))
    scored = json.loads(pooling.score({"text_1": query, "text_2": ["w"] + [""] * 20_000}, "m", "s", 7))
    # Counted per document it was 10**10 word lookups: hours, with the sim answering nobody else.
    assert time.monotonic() - started < 5
    assert answer["results"][0]["relevance_score"] == 1.0 and scored["data"][0]["score"] == 1.0
