"""What the policy model's text looks like, below both the engine and the gateway:
loading its tokenizer (``tokenizer``; ``builtin_tokenizer`` builds the offline
``builtin:farm-test`` one, since no model hub is reachable) and its native tool-call
formats (``toolcalls``: how each model family writes a call into its output, parsed
back by the gateway and written by the simulator's policies)."""
