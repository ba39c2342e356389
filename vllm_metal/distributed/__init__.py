"""Running one model across processes: pipeline stages (the decoder layers each rank
holds) and the MLX communication group that carries hidden states between them."""
