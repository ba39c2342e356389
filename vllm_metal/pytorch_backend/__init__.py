"""Bridge between vLLM's torch tensors and MLX arrays (see tensor_bridge)."""
