"""The CPU backend: MLX on the host's CPU (``backend.CpuBackend``).

MLX's Linux CPU backend ships scalar, single-threaded matmuls and costs the
host ~10 us per graph node, so this wing puts the model on the extension's CPU
kernels: the linear and embedding layers (``fast_linears``), norms and RoPE
while a forward is built (``fast_functions``), llama-family layer stacks as one
node (``decoder_stack``). It also keeps the host in shape for them: weights and
KV cache on huge pages (``huge_pages``), idle threads off the cores
(``idle_threads``), the KV cache within the host's free memory (``kv_cap``).
"""
