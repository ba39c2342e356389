"""KV offloading: vLLM's OffloadingConnector over this platform's KV pool (a host
memory tier, and vLLM's secondary tiers such as its disk tier behind it)."""
