"""LoRA adapters: read (adapter_files), held for the forward (bank), applied by the
decoder's linears (layer), managed for vLLM's worker (manager)."""
