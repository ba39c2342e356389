"""The model adaptation: each family's own mlx-lm code over the paged cache (adapter.py)."""
