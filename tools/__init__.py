"""Developer tools over the package, not part of it (nothing in gpuq/ imports them): the layer
check (`python -m tools.layers`) and the generated tables of docs/reference.md
(`python -m tools.doc_tables`). Run from the top of the checkout."""
