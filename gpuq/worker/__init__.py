"""The per-box loop: one pass observes, plans over the whole team and acts on its own box."""
