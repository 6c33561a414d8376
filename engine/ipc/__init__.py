"""The engine core in its own process: the wire protocol, the core process, addresses."""
