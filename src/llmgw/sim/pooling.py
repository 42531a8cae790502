"""The simulator's rerank, score, tokenize and detokenize: vLLM's request and answer shapes, deterministic values.

vLLM serves them at ``/rerank`` (and ``/v1/rerank``, ``/v2/rerank``),
``/score`` (and ``/v1/score``), ``/tokenize`` and ``/detokenize``; the
simulator answers every spelling so a test can reach them through a router.
A token is a word here as everywhere in the simulator: a word's id is a hash
of it, remembered so ``/detokenize`` gives the words back.  A relevance or
score is the share of the query's words the document contains, so a test can
say which document ranks first.
"""

from __future__ import annotations

import json
import zlib
from collections import Counter
from typing import Any

from llmgw.sim.api import ApiError, _prompt_words, _text_of

RERANK = frozenset(("/rerank", "/v1/rerank", "/v2/rerank"))
SCORE = frozenset(("/score", "/v1/score"))
TOKENIZE = frozenset(("/tokenize", "/v1/tokenize"))
DETOKENIZE = frozenset(("/detokenize", "/v1/detokenize"))
ROUTES = RERANK | SCORE | TOKENIZE | DETOKENIZE
# The context length /tokenize reports.
MAX_MODEL_LEN = 4096
# Words remembered for /detokenize; past that, an id detokenizes as "<id>".
MAX_VOCABULARY = 65536


class Vocabulary:
    """Word ids: a hash of the word, below 2**20, and the words seen, for the way back."""

    def __init__(self) -> None:
        self.words: dict[int, str] = {}

    def id_of(self, word: str) -> int:
        token = zlib.crc32(word.encode()) & 0xFFFFF
        if len(self.words) < MAX_VOCABULARY:
            self.words.setdefault(token, word)
        return token

    def word_of(self, token: int) -> str:
        return self.words.get(token, "<%d>" % token)


def relevance(query: str, document: str) -> float:
    """The share of the query's words (ignoring case) found in the document, 0.0 to 1.0."""
    return _Query(query).relevance(document)


class _Query:
    """A query's words counted once, so scoring it against many documents costs each document's words only."""

    def __init__(self, query: str):
        self.words = words = query.lower().split()
        self.total = len(words)
        self.counts = Counter(words)

    def relevance(self, document: str) -> float:
        if not self.total:
            return 0.0
        counts = self.counts
        return round(sum(counts[w] for w in set(document.lower().split()) if w in counts) / self.total, 6)


def _string(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise ApiError(400, f"{param} must be a string", param=param)
    return value


def _documents(value: Any, param: str) -> list[str]:
    """A string or a list of strings (or of {"text": ...} documents)."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise ApiError(400, f"{param} must be a non-empty list of strings", param=param)
    texts = []
    for item in value:
        if isinstance(item, dict) and isinstance(item.get("text"), str):
            texts.append(item["text"])
        elif isinstance(item, str):
            texts.append(item)
        else:
            raise ApiError(400, f"each of {param} must be a string", param=param)
    return texts


def rerank(payload: dict[str, Any], model: str, rid: str) -> bytes:
    """vLLM's RerankResponse: the documents by relevance to the query, best first, ``top_n`` of them."""
    query = _string(payload.get("query"), "query")
    documents = _documents(payload.get("documents"), "documents")
    top_n = payload.get("top_n")
    if top_n is None or top_n == 0:
        top_n = len(documents)
    elif not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0:
        raise ApiError(400, "top_n must be a positive integer", param="top_n")
    asked = _Query(query)
    scored = sorted(((asked.relevance(d), i, d) for i, d in enumerate(documents)), key=lambda t: (-t[0], t[1]))
    tokens = len(query.split()) * len(documents) + sum(len(d.split()) for d in documents)
    results = [{"index": i, "document": {"text": d}, "relevance_score": s} for s, i, d in scored[:top_n]]
    return json.dumps({"id": rid, "model": model, "usage": {"total_tokens": tokens}, "results": results}).encode()


def score(payload: dict[str, Any], model: str, rid: str, created: int) -> bytes:
    """vLLM's ScoreResponse: text_1 scored against each text_2 (one to many, or pairwise)."""
    first = _documents(payload.get("text_1", payload.get("queries")), "text_1")
    second = _documents(payload.get("text_2", payload.get("documents")), "text_2")
    if len(first) == 1:
        first = first * len(second)
    elif len(first) != len(second):
        raise ApiError(400, f"text_1 has {len(first)} texts and text_2 {len(second)}: give one text_1, or as many "
                            "as text_2", param="text_2")
    queries: dict[str, _Query] = {}
    for a in first:
        if a not in queries:
            queries[a] = _Query(a)
    data = [{"index": i, "object": "score", "score": queries[a].relevance(b)} for i, (a, b) in enumerate(zip(first, second))]
    # One text_1 for many: its words are counted once, not once a document.
    tokens = sum(len(queries[a].words) + len(b.split()) for a, b in zip(first, second))
    usage = {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0, "prompt_tokens_details": None}
    return json.dumps({"id": rid, "object": "list", "created": created, "model": model, "data": data,
                       "usage": usage}).encode()


def tokenize(payload: dict[str, Any], vocabulary: Vocabulary) -> bytes:
    """vLLM's TokenizeResponse for a prompt or chat messages."""
    if "messages" in payload:
        messages = payload["messages"]
        if not isinstance(messages, list):
            raise ApiError(400, "messages must be a list", param="messages")
        words = [w for m in messages if isinstance(m, dict) for w in _text_of(m.get("content")).split()]
    else:
        words = _prompt_words(payload.get("prompt"), "prompt")
    tokens = [vocabulary.id_of(w) for w in words]
    strs = words if payload.get("return_token_strs") is True else None
    return json.dumps({"count": len(tokens), "max_model_len": MAX_MODEL_LEN, "tokens": tokens,
                       "token_strs": strs}).encode()


def detokenize(payload: dict[str, Any], vocabulary: Vocabulary) -> bytes:
    """vLLM's DetokenizeResponse: the words of the ids, spaced."""
    tokens = payload.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise ApiError(400, "tokens must be a list of token ids", param="tokens")
    return json.dumps({"prompt": " ".join(vocabulary.word_of(t) for t in tokens)}).encode()
