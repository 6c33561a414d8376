"""roseplay's panels: one widget (family) per file, each drawing itself from a snapshot."""
