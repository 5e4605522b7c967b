"""gallery."""
