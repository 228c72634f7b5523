"""Models by name: the catalogue, installing and joining its packages, GGUF conversion, `engine.model`."""
