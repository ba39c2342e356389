"""The Metal backend: MLX on the Apple GPU (``backend.MetalBackend``).

MLX's own GPU kernels run the model; the paged ops run the kernels_v2 Metal
kernels, which ``vllm_metal.native`` loads with the extension.
"""
