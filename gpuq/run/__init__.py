"""One job under its supervisor: launching, containers, limits, liveness files; MPS daemons."""
