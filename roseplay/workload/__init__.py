"""What the engine is fed and what comes back: scenarios, the driver, snapshot sources,
and recordings (record, frames, replay). No Textual here: the TUI and the bench share it."""
