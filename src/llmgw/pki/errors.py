"""The certificate package's exception tree.

```
PkiError
├── PkiInputError     a name, host or validity that cannot go into a certificate
├── PkiExistsError    a file that would be overwritten (without force)
└── PkiFileError      a PEM file that cannot be read or is not what it should be
```

Every message names the file or the value and says what to do. Foreign errors
(OSError, cryptography's ValueError) are translated with `raise ... from exc`.
"""

from __future__ import annotations

from pathlib import Path


class PkiError(Exception):
    """Base of every error `llmgw.pki` raises on purpose."""


class PkiInputError(PkiError, ValueError):
    """A value that cannot go into a certificate (empty name, bad host, days < 1)."""


class PkiExistsError(PkiError):
    """Files that would be overwritten; nothing was written. `paths` lists them."""

    def __init__(self, paths: list[Path], *, hint: str = "") -> None:
        names = ", ".join(str(p) for p in paths)
        super().__init__(f"refusing to overwrite {names}: remove the file(s) or pass --force{hint}")
        self.paths = paths


class PkiFileError(PkiError):
    """A PEM file that cannot be read, or does not hold what it should; `path` names it.

    `role` ("cert", "key" or "ca") says which of `load_tls_material`'s files it
    was, so a caller can name its own option for it; None elsewhere.
    """

    def __init__(self, path: Path, message: str, *, role: str | None = None) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message
        self.role = role
