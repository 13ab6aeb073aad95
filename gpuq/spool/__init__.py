"""The shared directory is the state: its layout, records, claims, events, and every operation on them."""
