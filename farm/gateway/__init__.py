"""farm.gateway: the Anthropic / Responses / Chat endpoints the coding-agent CLIs talk to.

Public API (import from the modules; this package imports nothing on its own):

- ``farm.gateway.gateway.Gateway`` -- ``Gateway(config, tokenizer, engine, tool_format,
  model_name=)`` / ``Gateway.from_config(farm_cfg, engine)``; ``await start() -> base_url``,
  ``open_session(session_id, *, model_name, max_turns, max_context_tokens, policy_version)
  -> SessionHandle(session_id, secret)``, ``await close_session(session_id) -> TurnTree``,
  ``stats(session_id) -> SessionStats``, ``await stop()``; an async context manager.
- ``farm.gateway.config.GatewayConfig`` (section ``gateway`` of ``FarmConfig``).
- ``farm.engine.client.EngineClient`` -- the SGLang ``/generate`` client the gateway uses.
- Below both the gateway and the engine (``farm.modeltext``): ``farm.modeltext.toolcalls``
  (``get_format(name)``, ``ToolCall``, ``ParsedOutput``) and
  ``farm.modeltext.tokenizer.load_tokenizer(spec, cache_dir)`` (``engine.tokenizer`` -> HF tokenizer).
"""
