"""The manifest: what the shards of a dataset are, written next to them as ``manifest.json``.

    {
      "format": "ml-harness-shards/1",
      "shards": [
        {"name": "shard-000000.tar", "size": 67109376, "num_samples": 655,
         "sha256": "9f2c..."},
        ...
      ]
    }

The reader plans an epoch from the manifest alone (no listing, no HEAD per shard): sample
counts give exact per-rank lengths, sizes let a cut download resume and a short object be
caught before a byte is parsed, sha256 verifies what is downloaded before it enters the cache
and names the content in the cache (a changed shard never hits a stale cached copy).
:func:`build_manifest` makes one for shards written by someone else (the ``webdataset``
package writes none) by reading every shard once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from .errors import ManifestError

__all__ = ["FORMAT", "MANIFEST_NAME", "Manifest", "ShardInfo", "build_manifest"]

FORMAT = "ml-harness-shards/1"
MANIFEST_NAME = "manifest.json"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardInfo:
    """One shard as the manifest records it."""

    name: str
    """Object key relative to the dataset's prefix (local: path relative to its directory)."""
    size: int
    """Bytes of the whole object, tar end-of-archive blocks included."""
    num_samples: int
    """Samples in the shard (runs of members sharing a key, as :mod:`.tario` groups them)."""
    sha256: str
    """Lower-case hex SHA-256 of the object's bytes."""

    def __post_init__(self) -> None:
        if not self.name or self.name.startswith("/") or ".." in self.name.split("/"):
            raise ManifestError(
                f"shard name must be a relative path inside the dataset, got {self.name!r}"
            )
        if not isinstance(self.size, int) or self.size < 1024:
            raise ManifestError(
                f"shard {self.name!r}: size must be an int >= 1024 (a tar ends with two 512-byte "
                f"blocks), got {self.size!r}"
            )
        if not isinstance(self.num_samples, int) or self.num_samples < 0:
            raise ManifestError(
                f"shard {self.name!r}: num_samples must be an int >= 0, got {self.num_samples!r}"
            )
        if not isinstance(self.sha256, str) or not _SHA256.match(self.sha256):
            raise ManifestError(
                f"shard {self.name!r}: sha256 must be 64 lower-case hex digits, got {self.sha256!r}"
            )


@dataclasses.dataclass(frozen=True)
class Manifest:
    """The shards of one dataset, in a fixed (written) order; epochs shuffle a copy of it."""

    shards: tuple[ShardInfo, ...]

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for shard in self.shards:
            if shard.name in seen:
                raise ManifestError(f"shard {shard.name!r} is listed twice in the manifest")
            seen.add(shard.name)

    @property
    def total_samples(self) -> int:
        return sum(s.num_samples for s in self.shards)

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.shards)

    @property
    def digest(self) -> str:
        """SHA-256 of the canonical JSON: identifies the dataset in a resume state."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def shard(self, name: str) -> ShardInfo:
        for s in self.shards:
            if s.name == name:
                return s
        raise KeyError(name)

    # ----------------------------------------------------------------------- (de)serialising
    def to_json(self) -> str:
        return (
            json.dumps(
                {"format": FORMAT, "shards": [dataclasses.asdict(s) for s in self.shards]},
                indent=1,
                sort_keys=True,
            )
            + "\n"
        )

    @classmethod
    def from_json(cls, text: str | bytes, *, where: str = "manifest") -> Manifest:
        """Parse and validate; unknown keys and a wrong format tag are errors naming ``where``."""
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise ManifestError(f"{where}: not valid JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise ManifestError(f"{where}: expected a JSON object, got {type(doc).__name__}")
        if doc.get("format") != FORMAT:
            raise ManifestError(
                f"{where}: format must be {FORMAT!r}, got {doc.get('format')!r}; write the "
                "manifest with ShardWriter or build_manifest()"
            )
        unknown = set(doc) - {"format", "shards"}
        if unknown:
            raise ManifestError(f"{where}: unknown key(s) {sorted(unknown)}")
        rows = doc.get("shards")
        if not isinstance(rows, list):
            raise ManifestError(f"{where}: 'shards' must be a list")
        fields = {f.name for f in dataclasses.fields(ShardInfo)}
        shards = []
        for i, row in enumerate(rows):
            if not isinstance(row, dict) or set(row) != fields:
                raise ManifestError(
                    f"{where}: shard entry {i} must have exactly the keys {sorted(fields)}, got "
                    f"{sorted(row) if isinstance(row, dict) else row!r}"
                )
            shards.append(ShardInfo(**row))
        return cls(tuple(shards))


def build_manifest(source: Any, names: Iterable[str] | None = None) -> Manifest:
    """Read every shard of ``source`` once and record its size, sample count and sha256.

    ``source`` is a :class:`~.sources.Source` (or a URL/path accepted by
    :func:`~.sources.open_source`); ``names`` defaults to every ``*.tar`` it lists, sorted.
    This is how shards written by another tool (the ``webdataset`` package) become readable.
    """
    from .sources import open_source
    from .tario import iter_samples

    src = open_source(source)
    shard_names: Sequence[str] = sorted(names) if names is not None else src.list_shards()
    infos = []
    for name in shard_names:
        data = src.read_all(name)
        counts = [0]
        for _ in iter_samples([data], name, skip=1 << 62, counts=counts):
            pass
        infos.append(
            ShardInfo(
                name=name,
                size=len(data),
                num_samples=counts[0],
                sha256=hashlib.sha256(data).hexdigest(),
            )
        )
    return Manifest(tuple(infos))
