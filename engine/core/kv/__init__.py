"""The paged KV cache's bookkeeping: block pool, prefix index, block tables, counters."""
