"""Model-level adaptations of mlx-lm models (CPU fast path)."""
