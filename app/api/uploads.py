"""The names uploads are known by: the path a client sent, kept relative and safe.

`blendrag ingest ./docs` sends each file as its path relative to the folder it was found under
(`advanced/timeouts.md`), so sources and the catalog say where a passage came from. The stored copy's
file name is checked elsewhere (`check_upload_name`); this is the name shown and used as the document's
identity for re-ingest (the same path with new content replaces the old document).
"""

from __future__ import annotations

from pathlib import PurePosixPath


def upload_source_path(filename: str) -> str:
    """A client's upload name as a relative POSIX path: backslashes as separators, no drive, no root,
    no `.` or `..` parts (a name can only say where a file sat in the client's folder, never point
    outside it). Falls back to "upload" for a name with nothing left."""
    parts = [p for p in PurePosixPath(filename.replace("\\", "/")).parts if p not in ("", ".", "..", "/")]
    if parts and len(parts[0]) == 2 and parts[0][1] == ":":  # a Windows drive ("C:")
        parts = parts[1:]
    return "/".join(parts) or "upload"
