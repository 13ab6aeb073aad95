"""Values, parsing and validation: job specs, config, states, units, and the types every layer
shares. Imports no other gpuq package."""
