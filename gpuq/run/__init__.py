"""One job under its supervisor: launching (through the extras' launch wrappers too), limits,
liveness files."""
