"""The paged KV cache's host side (pure Python): blocks.py (the block pool: allocation, reference counts, eviction),
prefix.py (full blocks found again by content and position), sequence.py (one sequence's block-table row),
sizing.py (--kv-memory and how many blocks fit). The engine's PagedCache (engine/paged_cache.py) holds the GPU
pools and the block table built from these."""
