"""`blendrag sync`: a collection kept equal to a folder (scan, plan, ingest what changed, remove what is gone)."""
