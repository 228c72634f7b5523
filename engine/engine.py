"""The engine's public face: one loaded model, chunk precompute for ingest, and generation for /ask.

    engine = Engine(settings, models_dir)
    kv = engine.precompute_chunk(chunk_ids)                       # ingest: K (pre-RoPE) + V of one chunk
    layout = engine.prompt.layout(chunk_ids_list, question)    # [prefix][chunks…][suffix]
    for event in engine.generate(GenerationRequest("r1", layout, InMemoryLayerReader(kvs))):
        ...                                                    # TokenEvent…, FinishEvent

Step-wise, as the scheduler drives it (a `RequestRun` is the request's state, the engine does the compute):

    run = engine.new_run(request)
    events = engine.run_prompt(run, between_layers=..., cancelled=...)  # prompt pass + first token
    events_per_run = engine.decode([run, other_run])                 # one (batched) decode step each

Meant for one computing thread: in the server that is the scheduler's worker (engine/scheduler.py), which
runs every chunk precompute, prompt pass and decode step; CLI tools and bench call it from their one thread. The
weights are read-only and the prefix cache is locked, but nothing else here is designed for concurrent
callers (two at once would also fight over the same cores).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from engine.batched_decode import decode_batch
from engine.blend.plan import BlendPlan, plan_blend
from engine.blend.spans import sentence_ends
from engine.cache_pool import CacheLayout, WorkingCachePool
from engine.config import EngineSettings
from engine.decode_graphs import DecodeGraphs, use_decode_graphs
from engine.decode_weights import DECODE_WEIGHTS_DIR, DecodeWeights, build_decode_weights
from engine.dtype_choice import DtypeChoice, choose_compute_dtype, log_choice
from engine.extend import extend
from engine.generation import RequestRun
from engine.layers import Transformer
from engine.model import LoadedModel, ModelConfig, load_model
from engine.models.resolve import ModelIdentity, ServedModel, parameters_label, resolve_model
from engine.packed_linear import can_pack, pack_weights
from engine.precompute import PrefixKV, precompute_chunks, precompute_prefix
from engine.prompt import LEAD_IN, PromptBuilder
from engine.prompt_pass import LayerBoundary, prompt_pass
from engine.types import (
    BlendConfig,
    GenerationEvent,
    GenerationRequest,
    Mode,
    PromptLayout,
    PromptResult,
    RequestCancelled,
    ScoreResult,
)
from kvcache.types import ChunkKV, LayerKVReader

logger = logging.getLogger(__name__)

_PREFIX_CACHE_ENTRIES = 8


class Engine:
    def __init__(
        self,
        settings: EngineSettings,
        models_dir: Path,
        dtype_choice: DtypeChoice | None = None,
        read_also: Sequence[Path] = (),
    ) -> None:
        """`models_dir`: the model cache a catalogue model or GGUF file is converted into (engine/models/cache.py);
        `read_also`: older models dirs whose conversions are loaded as they are. `dtype_choice`: the compute
        dtype decided by the caller (the app keeps the one a data dir was built with); by default
        `settings.dtype` resolved for the device (engine/dtype_choice.py)."""
        self.settings = settings
        self.blend_origin = "engine settings"  # where the blend settings came from (use_blend)
        resolved = resolve_model(settings.model, Path(models_dir), read_also)
        path = resolved.path
        self.identity: ModelIdentity = resolved.identity
        device = settings.resolve_device()
        self.dtype_choice: DtypeChoice = dtype_choice or choose_compute_dtype(settings.dtype, device)
        dtype = self.dtype_choice.dtype
        if settings.num_threads is not None and device == "cpu":
            torch.set_num_threads(settings.num_threads)  # process-wide; the engine is the main CPU user
        t0 = time.perf_counter()
        self.model: LoadedModel = load_model(path, dtype=dtype, device=device)
        # Decode's compact copies are made from the plain weights, before any packing below.
        self.decode_weights: DecodeWeights = build_decode_weights(
            self.model, settings.decode_weights, Path(models_dir) / DECODE_WEIGHTS_DIR
        )
        self.num_packed_weights = 0
        if settings.pack_weights and can_pack(self.model.device, self.model.dtype):
            self.num_packed_weights = pack_weights(self.model.weights)
            logger.info("%d GEMM weights packed for oneDNN's bf16 kernels", self.num_packed_weights)
        self.transformer = Transformer(self.model)
        self.transformer.with_decode_weights(self.decode_weights.weights)
        # Working caches by size class, reused (engine/cache_pool.py); decode captured in CUDA graphs over them.
        graphs = use_decode_graphs(settings.decode_graphs, self.model.device)
        self.cache_pool: WorkingCachePool | None = _cache_pool(settings, self.model, graphs)
        self.decode_graphs: DecodeGraphs | None = None
        if graphs and self.cache_pool is None:
            logger.info("decode graphs need the working cache pool (engine.working_cache_pool_bytes > 0): eager decode")
        elif graphs:
            self.decode_graphs = DecodeGraphs(capture=True)
        self.tokenizer = _load_tokenizer(path)
        self.eos_token_ids: frozenset[int] = _eos_ids(path, self.tokenizer)
        self.prompt = PromptBuilder(
            self.tokenizer,
            settings.system_prompt,
            settings.question_template,
            lead_in=LEAD_IN if settings.chunk_lead_in else "",
        )
        self._pieces: dict[int, str] = {}  # token id -> its text (_token_piece)
        self._prefix_lock = threading.Lock()
        self._prefixes: OrderedDict[tuple[int, ...], PrefixKV] = OrderedDict()
        self.prefix_kv(self.prompt.prefix_ids)
        log_choice(self.dtype_choice)
        logger.info(
            "engine ready: %s on %s in %.1fs (fingerprint %s…)",
            self.served_model.describe(),
            device,
            time.perf_counter() - t0,
            self.fingerprint[:12],
        )

    def use_blend(self, blend: BlendConfig, origin: str) -> None:
        """Serve with `blend` from now on, which a caller measured or chose for this model; `origin` says where it
        came from. The engine's other settings stay. The default blend of every later request
        (`settings.blend_config()`) is this one; a request already running keeps its own."""
        self.settings, self.blend_origin = self.settings.model_copy(update={"blend": blend}), origin

    # ------------------------------------------------------------------------------------ properties
    @property
    def config(self) -> ModelConfig:
        return self.model.config

    @property
    def served_model(self) -> ServedModel:
        weights = self.model.weights
        tensors = [weights.embed, weights.final_norm]
        if weights.lm_head.data_ptr() != weights.embed.data_ptr():  # tied: one matrix, counted once
            tensors.append(weights.lm_head)
        for layer in weights.layers:
            tensors += [t for t in vars(layer).values() if t is not None]
        dtype = str(self.model.dtype).removeprefix("torch.")
        num_parameters = sum(t.numel() for t in tensors)
        return ServedModel(
            name=self.identity.name,
            display_name=self.identity.display_name,
            source=self.identity.source,
            architecture=self.identity.architecture or self.config.model_type,
            num_parameters=num_parameters,
            parameters_label=parameters_label(num_parameters),
            num_layers=self.config.num_layers,
            origin_quantisation=self.identity.origin_quantisation,
            compute_dtype=dtype,
            decode_weights=self.decode_weights.format,
        )

    @property
    def fingerprint(self) -> str:
        """sha256 hex of config + weight headers + weight samples + dtype + engine numerics version."""
        return self.model.fingerprint

    @property
    def num_layers(self) -> int:
        return self.model.config.num_layers

    @property
    def num_kv_heads(self) -> int:
        return self.model.config.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.model.config.head_dim

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def device(self) -> torch.device:
        return self.model.device

    # ------------------------------------------------------------------------------------ precompute
    def prefix_kv(self, prefix_ids: list[int] | None = None) -> PrefixKV:
        """Exact KV of a prefix (default: this engine's prompt prefix), computed once and kept."""
        key = tuple(self.prompt.prefix_ids if prefix_ids is None else prefix_ids)
        with self._prefix_lock:
            hit = self._prefixes.get(key)
            if hit is not None:
                self._prefixes.move_to_end(key)
                return hit
        prefix = precompute_prefix(self.transformer, list(key))
        with self._prefix_lock:
            self._prefixes[key] = prefix
            while len(self._prefixes) > _PREFIX_CACHE_ENTRIES:
                self._prefixes.popitem(last=False)
        return prefix

    def precompute_chunk(self, chunk_ids: list[int], prefix_ids: list[int] | None = None) -> ChunkKV:
        """KV of one chunk computed behind the prefix: K before RoPE and V, (layers, kv_heads, L, D)."""
        return self.precompute_chunks([chunk_ids], prefix_ids)[0]

    def precompute_chunks(
        self,
        chunks: list[list[int]],
        prefix_ids: list[int] | None = None,
        max_batch_tokens: int | None = None,
        contexts: list[list[int]] | None = None,
    ) -> list[ChunkKV]:
        """Like precompute_chunk for many chunks; chunks of similar length are batched together, up to
        `max_batch_tokens` per forward (default 4096 on a CPU, 32768 on an accelerator). With `contexts`, chunk
        i is computed behind the prefix and contexts[i] (engine.precompute.precompute_chunks)."""
        if max_batch_tokens is None:
            max_batch_tokens = 4096 if self.device.type == "cpu" else 32768
        prefix = self.prefix_kv(prefix_ids)
        lengths = [len(c) + (len(contexts[i]) if contexts is not None else 0) for i, c in enumerate(chunks)]
        order = sorted(range(len(chunks)), key=lambda i: lengths[i])
        results: dict[int, ChunkKV] = {}
        batch: list[int] = []
        for i in [*order, None]:
            if batch and (i is None or lengths[i] * (len(batch) + 1) > max_batch_tokens):
                batch_contexts = None if contexts is None else [contexts[j] for j in batch]
                kvs = precompute_chunks(self.transformer, prefix, [chunks[j] for j in batch], contexts=batch_contexts)
                for j, kv in zip(batch, kvs, strict=True):
                    results[j] = kv
                batch = []
            if i is not None:
                batch.append(i)
        return [results[i] for i in range(len(chunks))]

    # ----------------------------------------------------------------------------------- prompt pass
    def plan(self, layout: PromptLayout, mode: Mode = "blend", blend: BlendConfig | None = None) -> BlendPlan:
        """The plan of a prompt pass (engine/blend/plan.py): what bench and the calibration inspect, and what
        `prompt_pass` carries out. `blend` None: the blend in force."""
        config = blend or self.settings.blend_config()
        ends = None
        if mode == "blend" and config.reads_sentence_ends:
            ends = sentence_ends(layout.chunk_ids, self._token_piece)
        return plan_blend(layout, mode, config, self.num_layers, ends, self._token_piece)

    def prompt_pass(
        self,
        layout: PromptLayout,
        kv_reader: LayerKVReader | None,
        mode: Mode = "blend",
        blend: BlendConfig | None = None,
        extra_capacity: int = 0,
        *,
        between_layers: Callable[[], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> PromptResult:
        """The prompt pass of `mode`: last-token logits + working cache (room for extra_capacity more).

        Every mode but `full` needs `kv_reader`. At every layer boundary `between_layers()` runs, then
        `cancelled()` is asked: True stops the pass there with RequestCancelled (engine.prompt_pass.LayerBoundary).
        """
        config = blend or self.settings.blend_config()
        plan = self.plan(layout, mode, config)
        return prompt_pass(
            self.transformer,
            layout,
            plan,
            config,
            kv_reader,
            self.prefix_kv(layout.prefix_ids) if mode != "full" else None,
            capacity=layout.num_tokens + extra_capacity,
            boundary=LayerBoundary(between_layers, cancelled),
            cache_pool=self.cache_pool,
        )

    def _token_piece(self, token_id: int) -> str:
        """The text one token spells (cached: a blend with `match_span: sentence` reads every context token's)."""
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = self.tokenizer.decode([token_id])
        return piece

    def score(
        self,
        layout: PromptLayout,
        kv_reader: LayerKVReader | None,
        mode: Mode,
        blend: BlendConfig | None,
        target_ids: list[int],
        extra_capacity: int = 0,
    ) -> ScoreResult:
        """Teacher-forced NLL of target_ids after the prompt pass of `mode`, plus first-token logits.

        The pass's cache is rewound to the prompt's end afterwards (room for `extra_capacity` more tokens
        than the targets need), so `answer(request, score.prompt)` decodes from the same pass.
        """
        result = self.prompt_pass(layout, kv_reader, mode, blend, extra_capacity=max(len(target_ids), extra_capacity))
        prompt_len = result.cache.length
        nlls: list[float] = []
        if target_ids:
            logits = result.logits.float()[None]  # (1, vocab): predicts target_ids[0]
            if len(target_ids) > 1:
                rest = extend(self.transformer, result.cache, target_ids[:-1], all_logits=True)
                logits = torch.cat([logits, rest.float()], dim=0)  # rest[i] predicts target_ids[i + 1]
            logprobs = torch.log_softmax(logits, dim=-1)
            targets = torch.tensor(target_ids, device=logprobs.device)
            nlls = (-logprobs.gather(1, targets[:, None]).squeeze(1)).tolist()
            result.cache.length = prompt_len  # decode overwrites the teacher-forced rows
        return ScoreResult(
            token_nlls=nlls,
            first_token_logits=result.logits,
            num_recomputed_tokens=result.num_recomputed_tokens,
            prompt=result,
        )

    # ------------------------------------------------------------------------------------ generation
    def new_run(self, request: GenerationRequest, arrival_time: float | None = None) -> RequestRun:
        """The state of one request (WAITING), to be driven by `run_prompt` and `decode`."""
        return RequestRun(request, self.tokenizer, self.eos_token_ids, self.device, arrival_time)

    def run_prompt(
        self,
        run: RequestRun,
        *,
        between_layers: Callable[[], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> list[GenerationEvent]:
        """The prompt pass of the run's mode and its first token (gpt-fast's `prefill`, on a run).

        `cancelled()` is asked before the pass starts and, like `between_layers()`, at every layer boundary
        (engine.prompt_pass.LayerBoundary); once it says True the run finishes "cancelled" there. Closes
        `run.request.kv_reader` whatever happens: whoever executes the prompt pass owns the source.
        """
        request = run.request
        try:
            if cancelled is not None and cancelled():  # cancelled while it waited: no pass at all
                return [run.cancel()]
            run.start_prompt()
            result = self.prompt_pass(
                request.layout,
                request.kv_reader,
                request.mode,
                request.blend,
                extra_capacity=request.sampling.max_tokens,
                between_layers=between_layers,
                cancelled=cancelled,
            )
        except RequestCancelled:
            return [run.cancel()]
        finally:
            if request.kv_reader is not None:
                request.kv_reader.close()
        if self.cache_pool is not None:  # the run owns the pass's cache: its slot goes back when the run ends
            run.cache_release = self.cache_pool.release
        return run.accept_prompt(result)

    def decode(self, runs: list[RequestRun]) -> list[list[GenerationEvent]]:
        """One decode step of every run (decoding): its pending token through the model, the next sampled.

        Several runs go through the layers together (engine/batched_decode.py); on CUDA as a replayed graph
        (engine/decode_graphs.py). Returns each run's events.
        """
        # Decode's compact weights for a few requests; a large batch reads the model's own (engine/decode_weights.py).
        tf = self.transformer.decoder if len(runs) <= self.decode_weights.max_rows else self.transformer
        caches, tokens = [r.cache for r in runs], [r.pending_token for r in runs]
        if self.decode_graphs is not None:
            logits = self.decode_graphs.decode(tf, caches, tokens, eager=decode_batch)
        else:
            logits = decode_batch(tf, caches, tokens)
        return [run.accept_logits(row) for run, row in zip(runs, logits, strict=True)]

    def generate(self, request: GenerationRequest) -> Iterator[GenerationEvent]:
        """Synchronous generation: TokenEvent… then exactly one FinishEvent. Closes request.kv_reader."""
        run = self.new_run(request)
        try:
            yield from self.run_prompt(run)
            yield from self._decode_to_finish(run)
        finally:
            run.release()

    def answer(self, request: GenerationRequest, result: PromptResult) -> Iterator[GenerationEvent]:
        """Like `generate`, from a prompt pass already done (`result`, e.g. `score(...).prompt`): the same
        sampler, stops and repeated-line guard. Decode writes into `result.cache` from its current length;
        request.kv_reader is not read (the pass is done) and may be None."""
        run = self.new_run(request)
        try:
            run.start_prompt()
            yield from run.accept_prompt(result)
            yield from self._decode_to_finish(run)
        finally:
            run.release()

    def _decode_to_finish(self, run: RequestRun) -> Iterator[GenerationEvent]:
        while not run.finished:
            (events,) = self.decode([run])
            yield from events


def _cache_pool(settings: EngineSettings, model: LoadedModel, decode_graphs: bool) -> WorkingCachePool | None:
    """The working cache pool of `settings.working_cache_pool_bytes` (auto: an eighth of the GPU's memory on
    CUDA, none on a CPU); None when off. With decode graphs a slab holds every request the scheduler runs at
    once (`max_running`) plus the scratch slot padding rows write to, so a decode batch is one slab's slots."""
    max_bytes = settings.working_cache_pool_bytes
    if max_bytes is None:
        device = model.device
        max_bytes = torch.cuda.get_device_properties(device).total_memory // 8 if device.type == "cuda" else 0
    if max_bytes <= 0:
        return None
    cfg = model.config
    layout = CacheLayout(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, model.dtype, model.device)
    slots = settings.max_running if decode_graphs else 1
    return WorkingCachePool(
        layout, max_bytes, slots=slots, scratch=decode_graphs, max_capacity=cfg.max_position_embeddings
    )


def _load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def _eos_ids(path: Path, tokenizer) -> frozenset[int]:
    ids: set[int] = set()
    gen = path / "generation_config.json"
    if gen.is_file():
        value = json.loads(gen.read_text()).get("eos_token_id")
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(int(v) for v in value)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)
