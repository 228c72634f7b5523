"""Stored KV computed behind related text: the cross-chunk variant of ingest (a study; `stored_context` in a
`--candidates` file of `bench frontier`).

Ingest computes a chunk's KV behind the prefix alone, as if the chunk opened the document; in a prompt of several
chunks the question then over-attends to those keys and the blend must recompute rows to correct them. A
cross-chunk pass at ingest (FusionRAG's offline step) computes each chunk's KV behind related text instead, so the
stored rows already carry attention to context. Which text:

    plain      behind the prefix alone (what ingest stores; with --lead-in the prefix ends with engine.prompt.LEAD_IN)
    neighbour  behind the passage most similar to it (the builtin embedder's cosine) among its example's other
               passages, as a server would pick a chunk's nearest neighbour in its collection at ingest; the
               neighbour may or may not be in the prompt
    unrelated  behind a passage of another example (the next one in the run; chunk i behind its passage i): text
               about something else, as a chunk's predecessor in a long document often is; with one example in
               the run, behind the example's own passage furthest from it
    previous   behind the context that precedes it in this prompt: the bound a cross-chunk pass could reach (its
               stored KV is full prefill's wherever the whole preceding context fits the cap; a server cannot
               know the prompt at ingest, it can know a chunk's predecessor in its document)

The prompt's first chunk keeps its plain KV either way: it stands right behind the prefix, so that KV is exact.
A context is cut to its last `MAX_CONTEXT_TOKENS` tokens (ingest pays for it once per chunk).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, get_args

from bench.prepared import PreparedPrompt

if TYPE_CHECKING:
    from bench.data import BenchPrompt
    from engine.engine import Engine
    from retrieval.embedder import Embedder

StoredContext = Literal["plain", "neighbour", "unrelated", "previous"]
STORED_CONTEXTS: tuple[StoredContext, ...] = get_args(StoredContext)
MAX_CONTEXT_TOKENS = 256


class ContextVariants:
    """Each example's chunk KV in every variant a study asks for, computed as ingest would (outside any timing)."""

    def __init__(self, engine: Engine, embedder: Embedder | None = None, prompts: Sequence[BenchPrompt] = ()) -> None:
        self.engine = engine
        self._embedder = embedder
        self._others = {bp.example.index: prompts[(k + 1) % len(prompts)] for k, bp in enumerate(prompts)}

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            from retrieval.config import RetrievalSettings
            from retrieval.embedder import Embedder

            self._embedder = Embedder.from_settings(RetrievalSettings())
        return self._embedder

    def contexts(self, bp: BenchPrompt, how: StoredContext) -> list[list[int]]:
        """The token ids each of the prompt's chunks is computed behind (empty: the prefix alone)."""
        chunk_ids = bp.chunk_ids
        if how == "plain":
            return [[] for _ in chunk_ids]
        if how == "previous":
            before: list[int] = []
            contexts = []
            for ids in chunk_ids:
                contexts.append(before[-MAX_CONTEXT_TOKENS:])
                before = [*before, *ids]
        elif how == "neighbour":
            contexts = self._neighbours(bp)
        elif how == "unrelated":
            contexts = self._unrelated(bp)
        else:
            raise ValueError(f"stored_context must be one of {', '.join(STORED_CONTEXTS)}, got {how!r}")
        if self._server_prefix(bp):  # the first chunk's plain KV is exact where it stands
            contexts[0] = []
        return contexts

    def _server_prefix(self, bp: BenchPrompt) -> bool:
        """Whether the prompt opens with the server's own prefix (not a study's longer one: --question-first)."""
        return bp.layout.segments_behind_prefix

    def _unrelated(self, bp: BenchPrompt) -> list[list[int]]:
        """Chunk i behind passage i of the run's next example (of this one, the least similar, when alone)."""
        other = self._others.get(bp.example.index, bp)
        if other.example.index == bp.example.index:
            return self._neighbours(bp, least=True)
        return [other.chunk_ids[i % len(other.chunk_ids)][-MAX_CONTEXT_TOKENS:] for i in range(len(bp.chunk_ids))]

    def _neighbours(self, bp: BenchPrompt, least: bool = False) -> list[list[int]]:
        """Each chunk's most (`least`: least) similar other passage of its example (by text; ties to the first)."""
        from bench.data import passage_chunk_ids

        tokenizer = self.engine.tokenizer
        pool = bp.example.passages
        pool_ids = passage_chunk_ids(tokenizer, pool)
        pool_vectors = self.embedder.embed_passages([p.text for p in pool])  # (pool, dim), normalised
        out = []
        for ids in bp.chunk_ids:
            own = [j for j, candidate in enumerate(pool_ids) if candidate == ids]
            chunk_vector = pool_vectors[own[0]] if own else self.embedder.embed_passages([tokenizer.decode(ids)])[0]
            similarity = pool_vectors @ chunk_vector  # (pool,)
            if least:
                similarity = -similarity
            for j in own:
                similarity[j] = float("-inf")
            out.append(pool_ids[int(similarity.argmax())][-MAX_CONTEXT_TOKENS:])
        return out

    def prepare(self, bp: BenchPrompt, how: StoredContext) -> PreparedPrompt:
        """`bp`'s chunks with KV of variant `how`, served like PreparedPrompt.compute's."""
        if how == "plain":
            return PreparedPrompt.compute(self.engine, bp)
        kvs = self.engine.precompute_chunks(bp.chunk_ids, contexts=self.contexts(bp, how))
        return PreparedPrompt(self.engine, bp.chunk_ids, kvs, bp)
