"""The Textual app: panels, keys, guides and the compare screen, over a snapshot source
(roseplay/workload/source.py)."""
