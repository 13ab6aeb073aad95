"""The simulator: traces replayed through the same plan the workers carry out."""
