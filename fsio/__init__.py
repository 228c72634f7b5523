"""File-system helpers every package of blendrag shares; the standard library only, so that engine, kvcache,
retrieval, ingest, app and bench may all import it without importing each other.

Modules: atomic (replace a file whole: a reader sees the old file or the new one, never a torn one).
"""
