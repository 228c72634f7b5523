"""FAISS vector index keyed by stable int64 chunk ids, with cosine similarity (inner product on
L2-normalized vectors; the index normalizes what it is given).

Index types:
- flat: exact search, `IndexIDMap2(IndexFlatIP)`.
- hnsw: approximate graph search, `IndexIDMap2(IndexHNSWFlat)` with inner product. FAISS cannot delete
  from an HNSW graph, so `remove` *tombstones* ids: they are excluded from every search by an id
  selector, and the graph is rebuilt without them (`compact`) once they exceed a quarter of the index,
  or when a tombstoned id is added again.
- ivf: `IndexIVFFlat` with inner product, holding the chunk ids natively and a hashtable direct map (so
  removal and reconstruction work). Training needs data: until the index holds `ivf_nlist * 39`
  vectors it is a flat index; the add that crosses that size trains IVF on everything held and
  switches over.

Filtered search (`allowed_ids`) is exact for flat, and for hnsw/ivf whenever the allowed set is small
(≤ `exact_filter_limit`: those vectors are scored directly, avoiding the recall loss of filtered graph or
cluster search); larger allowed sets use FAISS id selectors, and when those return fewer than k hits (a
scattered allowed set the graph walk or the probed lists miss) the allowed set is scored exactly.

The index is not thread-safe; the Retriever serializes access. With faiss-gpu installed and
`use_gpu=True`, unfiltered flat/ivf searches run on a GPU copy (rebuilt lazily after changes).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import struct
from collections.abc import Collection, Iterable
from typing import Literal

import faiss
import numpy as np

from retrieval.types import IndexParams, RetrievalError, ScoredId

logger = logging.getLogger(__name__)

IndexType = Literal["flat", "hnsw", "ivf"]
INDEX_TYPES: tuple[IndexType, ...] = ("flat", "hnsw", "ivf")
IVF_MIN_POINTS_PER_CENTROID = 39
_MAGIC = b"BLENDRAG-VECIDX1"
_HEADER_LENGTH = struct.Struct("<Q")
_COMPACT_MIN_TOMBSTONES = 64
_COMPACT_RATIO = 0.25


def _as_ids(ids: Iterable[int] | np.ndarray) -> np.ndarray:
    array = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, dtype=np.int64).reshape(-1)
    return np.ascontiguousarray(array)


class VectorIndex:
    """Cosine-similarity index over int64 ids. See the module docstring for the index types."""

    def __init__(
        self,
        dim: int,
        index_type: IndexType = "flat",
        params: IndexParams | None = None,
        *,
        use_gpu: bool = False,
    ) -> None:
        if dim <= 0:
            raise ValueError("dim must be positive")
        if index_type not in INDEX_TYPES:
            raise ValueError(f"index_type must be one of {INDEX_TYPES}, not {index_type!r}")
        self.dim = dim
        self.index_type: IndexType = index_type
        self.params = params or IndexParams()
        self._live: set[int] = set()
        self._tombstones: set[int] = set()  # hnsw only
        self._ivf_trained = False
        self._index: faiss.Index = self._empty_index()
        self._gpu_resources = self._gpu_setup() if use_gpu else None
        self._gpu_index: faiss.Index | None = None

    # -- public API --------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, chunk_id: object) -> bool:
        return chunk_id in self._live

    def ids(self) -> np.ndarray:
        """Live ids, sorted. # (n,) int64"""
        return np.array(sorted(self._live), dtype=np.int64)

    @property
    def is_trained_ivf(self) -> bool:
        return self._ivf_trained

    @property
    def num_tombstones(self) -> int:
        return len(self._tombstones)

    def add(self, ids: Iterable[int] | np.ndarray, vectors: np.ndarray) -> None:
        """Add vectors under new ids. Raises ValueError on duplicate, negative or already-present ids."""
        id_array = _as_ids(ids)
        matrix = self._prepare(vectors, len(id_array))
        if len(id_array) == 0:
            return
        if (id_array < 0).any():
            raise ValueError("ids must be non-negative")
        if len(np.unique(id_array)) != len(id_array):
            raise ValueError("ids within one add() must be unique")
        present = self._live.intersection(id_array.tolist())
        if present:
            raise ValueError(f"{len(present)} id(s) already in the index, e.g. {min(present)}; remove them first")
        if self._tombstones.intersection(id_array.tolist()):
            # The graph still holds the old vector under that id: purge tombstones before reuse.
            self.compact()
        self._invalidate_gpu()
        if self.index_type == "ivf" and not self._ivf_trained:
            needed = self.params.ivf_nlist * IVF_MIN_POINTS_PER_CENTROID
            if len(self._live) + len(id_array) >= needed:
                held_ids = self.ids()
                all_ids = np.concatenate([held_ids, id_array])
                all_vectors = np.concatenate([self._reconstruct(held_ids), matrix])
                self._index = self._trained_ivf(all_vectors)
                self._index.add_with_ids(all_vectors, all_ids)
                self._ivf_trained = True
                self._live.update(id_array.tolist())
                logger.info("IVF index trained on %d vectors (nlist=%d)", len(all_ids), self.params.ivf_nlist)
                return
        self._index.add_with_ids(matrix, id_array)
        self._live.update(id_array.tolist())

    def remove(self, ids: Iterable[int] | np.ndarray) -> int:
        """Remove ids (unknown ids are ignored). Returns how many were removed."""
        present = sorted(self._live.intersection(_as_ids(ids).tolist()))
        if not present:
            return 0
        self._invalidate_gpu()
        if self.index_type == "hnsw":
            self._tombstones.update(present)
            self._live.difference_update(present)
            if len(self._tombstones) >= max(_COMPACT_MIN_TOMBSTONES, _COMPACT_RATIO * self._index.ntotal):
                self.compact()
            return len(present)
        present_array = np.array(present, dtype=np.int64)  # must outlive the selector that points into it
        # IVF's hashtable direct map only accepts an IDSelectorArray; IDMap2 takes any selector.
        selector = faiss.IDSelectorArray(present_array) if self._ivf_trained else faiss.IDSelectorBatch(present_array)
        removed = self._index.remove_ids(selector)
        if removed != len(present):
            raise RetrievalError(f"FAISS removed {removed} of {len(present)} ids; index is inconsistent")
        self._live.difference_update(present)
        return len(present)

    def search(self, vector: np.ndarray, k: int, allowed_ids: Collection[int] | None = None) -> list[ScoredId]:
        """The k most similar ids (cosine, best first), optionally only among `allowed_ids`."""
        query = self._prepare(vector, 1)
        if k <= 0 or not self._live:
            return []
        if allowed_ids is not None:
            allowed = self._live.intersection(allowed_ids)
            if not allowed:
                return []
            if len(allowed) <= self.params.exact_filter_limit:
                return self._exact_search(query, k, allowed)
            selector = faiss.IDSelectorBatch(np.array(sorted(allowed), dtype=np.int64))
            wanted = min(k, len(allowed))
            hits = self._faiss_search(query, wanted, selector)
            if len(hits) < wanted:
                # A graph walk (hnsw) or the probed lists (ivf) reached too few allowed vectors: an allowed
                # set scattered across the index must still fill top-k, so score it exactly.
                return self._exact_search(query, k, allowed)
            return hits
        if self._tombstones:
            selector = faiss.IDSelectorNot(faiss.IDSelectorBatch(np.array(sorted(self._tombstones), dtype=np.int64)))
            return self._faiss_search(query, min(k, len(self._live)), selector)
        return self._faiss_search(query, min(k, len(self._live)), None)

    def vectors(self, ids: Iterable[int] | np.ndarray) -> np.ndarray:
        """Stored (normalized) vectors of live ids, in the given order. # (n, dim) float32"""
        id_array = _as_ids(ids)
        missing = set(id_array.tolist()) - self._live
        if missing:
            raise KeyError(f"ids not in the index: {sorted(missing)[:5]}")
        return self._reconstruct(id_array)

    def compact(self) -> None:
        """Rebuild an hnsw graph without its tombstones (no-op for other types)."""
        if self.index_type != "hnsw" or not self._tombstones:
            return
        self._rebuild_from(self.ids())
        logger.info("HNSW index compacted: %d tombstones dropped", len(self._tombstones))
        self._tombstones.clear()

    def converted(self, index_type: IndexType) -> VectorIndex:
        """A new index of another type (same vectors and parameters)."""
        other = VectorIndex(self.dim, index_type, self.params, use_gpu=self._gpu_resources is not None)
        ids = self.ids()
        if len(ids):
            other.add(ids, self._reconstruct(ids))
        return other

    # -- persistence ---------------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        header = {
            "dim": self.dim,
            "index_type": self.index_type,
            **dataclasses.asdict(self.params),
            "ivf_trained": self._ivf_trained,
            "num_live": len(self._live),
            "num_tombstones": len(self._tombstones),
        }
        header_bytes = json.dumps(header, sort_keys=True).encode()
        return b"".join(
            [
                _MAGIC,
                _HEADER_LENGTH.pack(len(header_bytes)),
                header_bytes,
                self.ids().tobytes(),
                np.array(sorted(self._tombstones), dtype=np.int64).tobytes(),
                faiss.serialize_index(self._index).tobytes(),
            ]
        )

    @classmethod
    def from_bytes(cls, data: bytes, use_gpu: bool = False) -> VectorIndex:
        if not data.startswith(_MAGIC):
            raise RetrievalError("not a blendrag vector index file")
        offset = len(_MAGIC)
        (header_length,) = _HEADER_LENGTH.unpack_from(data, offset)
        offset += _HEADER_LENGTH.size
        header = json.loads(data[offset : offset + header_length])
        offset += header_length
        params = IndexParams(**{f.name: header[f.name] for f in dataclasses.fields(IndexParams)})
        index = cls(header["dim"], header["index_type"], params, use_gpu=use_gpu)
        live = np.frombuffer(data, dtype=np.int64, count=header["num_live"], offset=offset)
        offset += live.nbytes
        tombstones = np.frombuffer(data, dtype=np.int64, count=header["num_tombstones"], offset=offset)
        offset += tombstones.nbytes
        faiss_index = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8, offset=offset).copy())
        expected = len(live) + len(tombstones)
        if faiss_index.ntotal != expected or faiss_index.d != index.dim:
            raise RetrievalError(
                f"vector index file is inconsistent ({faiss_index.ntotal} vectors, {expected} ids, dim {faiss_index.d})"
            )
        index._index = faiss_index
        index._live = set(live.tolist())
        index._tombstones = set(tombstones.tolist())
        index._ivf_trained = bool(header["ivf_trained"])
        return index

    # -- internals -------------------------------------------------------------------------------------

    def _prepare(self, vectors: np.ndarray, rows: int) -> np.ndarray:
        matrix = np.array(vectors, dtype=np.float32, copy=True, order="C")
        if matrix.ndim == 1:
            matrix = matrix.reshape(1, -1)
        if matrix.shape != (rows, self.dim):
            raise ValueError(f"expected vectors of shape ({rows}, {self.dim}), got {tuple(matrix.shape)}")
        if not np.isfinite(matrix).all():
            raise ValueError("vectors contain NaN or infinity")
        faiss.normalize_L2(matrix)  # zero vectors stay zero
        return matrix

    def _empty_index(self) -> faiss.Index:
        if self.index_type == "hnsw":
            graph = faiss.IndexHNSWFlat(self.dim, self.params.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            graph.hnsw.efConstruction = self.params.hnsw_ef_construction
            graph.hnsw.efSearch = self.params.hnsw_ef_search
            return faiss.IndexIDMap2(graph)
        return faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))  # flat, and ivf before training

    def _trained_ivf(self, training_vectors: np.ndarray) -> faiss.Index:
        quantizer = faiss.IndexFlatIP(self.dim)
        ivf = faiss.IndexIVFFlat(quantizer, self.dim, self.params.ivf_nlist, faiss.METRIC_INNER_PRODUCT)
        # The IVF index owns its quantizer from now on (Python would otherwise free it under it).
        quantizer.this.disown()
        ivf.own_fields = True
        ivf.train(training_vectors)
        ivf.set_direct_map_type(faiss.DirectMap.Hashtable)
        ivf.nprobe = self.params.ivf_nprobe
        return ivf

    def _reconstruct(self, ids: np.ndarray) -> np.ndarray:
        if len(ids) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._index.reconstruct_batch(np.ascontiguousarray(ids, dtype=np.int64))

    def _rebuild_from(self, ids: np.ndarray) -> None:
        vectors = self._reconstruct(ids)
        self._index = self._empty_index()
        self._ivf_trained = False
        if self.index_type == "ivf" and len(ids) >= self.params.ivf_nlist * IVF_MIN_POINTS_PER_CENTROID:
            self._index = self._trained_ivf(vectors)
            self._ivf_trained = True
        if len(ids):
            self._index.add_with_ids(vectors, ids)
        self._invalidate_gpu()

    def _exact_search(self, query: np.ndarray, k: int, allowed: set[int]) -> list[ScoredId]:
        ids = np.array(sorted(allowed), dtype=np.int64)
        scores = self._reconstruct(ids) @ query[0]  # (n,)
        order = np.argsort(-scores, kind="stable")[:k]
        return [ScoredId(int(ids[i]), float(scores[i])) for i in order]

    def _search_params(self, selector: faiss.IDSelector | None, k: int) -> faiss.SearchParameters | None:
        if self.index_type == "hnsw":
            return faiss.SearchParametersHNSW(sel=selector, efSearch=max(self.params.hnsw_ef_search, k))
        if self._ivf_trained:
            return faiss.SearchParametersIVF(sel=selector, nprobe=self.params.ivf_nprobe)
        return faiss.SearchParameters(sel=selector) if selector is not None else None

    def _faiss_search(self, query: np.ndarray, k: int, selector: faiss.IDSelector | None) -> list[ScoredId]:
        gpu_index = self._gpu_index_for_search() if selector is None else None
        if gpu_index is not None:
            distances, labels = gpu_index.search(query, k)
        else:
            params = self._search_params(selector, k)
            distances, labels = (
                self._index.search(query, k, params=params) if params is not None else self._index.search(query, k)
            )
        return [
            ScoredId(int(label), float(score))
            for label, score in zip(labels[0], distances[0], strict=True)
            if label >= 0
        ]

    # -- optional GPU -----------------------------------------------------------------------------------

    @staticmethod
    def _gpu_setup() -> object | None:
        if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() == 0:
            logger.info("faiss-gpu is not installed or sees no GPU: vector search stays on the CPU")
            return None
        return faiss.StandardGpuResources()

    def _invalidate_gpu(self) -> None:
        self._gpu_index = None

    def _gpu_index_for_search(self) -> faiss.Index | None:
        if self._gpu_resources is None or self.index_type == "hnsw":  # FAISS has no GPU HNSW
            return None
        if self._gpu_index is None:
            try:
                self._gpu_index = faiss.index_cpu_to_gpu(self._gpu_resources, 0, self._index)
            except RuntimeError as exc:
                logger.warning("cannot copy the vector index to the GPU (%s); using the CPU", exc)
                self._gpu_resources = None
                return None
            if self._ivf_trained:
                faiss.GpuParameterSpace().set_index_parameter(self._gpu_index, "nprobe", self.params.ivf_nprobe)
        return self._gpu_index
