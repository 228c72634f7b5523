"""The LLM engine: Llama-family model loading, the layer loop, prefill / blend / decode, the scheduler.

Public API (import from the modules; this package imports nothing eagerly):

    engine.config.EngineSettings          pydantic settings (model, device, dtype, mode, ratio, …)
    engine.engine.Engine                  Engine(settings, models_dir): prefill_chunk(s), prompt_pass, score,
                                          generate; step-wise new_run, prefill(run), decode(runs)
    engine.generation.RequestRun          one request's state (status, sampler, working cache); no compute
    engine.scheduler.Scheduler            Scheduler(engine).submit(request) -> async iterator of events
    engine.prompt.PromptBuilder           prefix_ids, suffix_ids(question), layout(chunk_ids, question)
    engine.types                          PromptLayout, BlendConfig, SamplingParams, GenerationRequest,
                                          TokenEvent, FinishEvent, PromptResult, ScoreResult, Mode,
                                          EngineError, EngineBusy
    engine.selectors.TokenSelector        the protocol behind BlendConfig.selector (query, deviation, first_k,
                                          random)
"""
