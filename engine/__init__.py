"""The LLM engine: Llama-family model loading, the layer loop, prompt passes and decode, the scheduler.

Public API (import from the modules; this package imports nothing eagerly):

    engine.config.EngineSettings          pydantic settings (model, device, dtype, mode, ratio, …);
                                          blend_config() (BLEND_FIELDS, 1:1), sampling_params()
    engine.engine.Engine                  Engine(settings, models_dir): prefix_kv, precompute_chunk(s),
                                          prompt_pass, score, generate, answer (decode from a pass
                                          already done); step-wise new_run, run_prompt(run), decode(runs)
    engine.generation.RequestRun          one request's state (RequestStatus, sampler, working cache); no compute
    engine.scheduler.Scheduler            Scheduler(engine).submit(request) -> RequestStream (async iterator
                                          of events); precompute_chunks(chunks, priority=PrecomputePriority.…)
    engine.prompt.PromptBuilder           prefix_ids, suffix_ids(question), layout(chunk_ids, question,
                                          history_ids), layout_ranked, for_system_prompt(text)
    engine.types                          PromptLayout, BlendConfig, SamplingParams, GenerationRequest,
                                          TokenEvent, FinishEvent, GenerationEvent, PromptResult,
                                          ScoreResult, Mode, SelectorName, EngineError, EngineBusy,
                                          RequestCancelled
    engine.selectors.TokenSelector        the protocol behind BlendConfig.selector (query, deviation, first_k,
                                          random)
    engine.dtype_choice                   choose_compute_dtype: what `engine.dtype: auto` computes in, and why
"""
