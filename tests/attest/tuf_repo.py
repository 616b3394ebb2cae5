"""A TUF repository of the tests' own, made with python-tuf's Metadata API (the library the
Sigstore project's own root-signing uses) and served on 127.0.0.1: the way an organisation
running its own Sigstore publishes its trusted_root.json, and the only way Kyverno takes trust
material (it initialises TUF for every keyless check). One ed25519 key holds the four roles;
consistent snapshots, as Sigstore's repository has them: metadata as N.ROLE.json, targets as
HASH.NAME under targets/."""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
import http.server
from collections.abc import Iterator
from pathlib import Path

from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata, MetaFile, Root, Snapshot, TargetFile, Targets, Timestamp

from tests.helpers import serving


def _meta(data: bytes) -> MetaFile:
    return MetaFile(version=1, length=len(data), hashes={"sha256": hashlib.sha256(data).hexdigest()})


def build(folder: Path, targets: dict[str, bytes]) -> bytes:
    """The repository with `targets` into `folder`; its root.json (what a client is given)."""
    signer = CryptoSigner.generate_ed25519()
    expires = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) + dt.timedelta(days=7)
    root = Metadata(Root(expires=expires, consistent_snapshot=True))
    for role in ("root", "targets", "snapshot", "timestamp"):
        root.signed.add_key(signer.public_key, role)
    listed = Metadata(Targets(expires=expires))
    (folder / "targets").mkdir(parents=True, exist_ok=True)
    for name, data in targets.items():
        target = TargetFile.from_data(name, data, ["sha256"])
        listed.signed.targets[name] = target
        (folder / "targets" / f"{target.hashes['sha256']}.{name}").write_bytes(data)
    written: dict[str, bytes] = {}
    for role, md in (("root", root), ("targets", listed)):
        md.sign(signer)
        written[role] = md.to_bytes()
    snapshot = Metadata(Snapshot(expires=expires))
    snapshot.signed.meta["targets.json"] = _meta(written["targets"])
    snapshot.sign(signer)
    written["snapshot"] = snapshot.to_bytes()
    timestamp = Metadata(Timestamp(expires=expires, snapshot_meta=_meta(written["snapshot"])))
    timestamp.sign(signer)
    for role, data in written.items():
        (folder / f"1.{role}.json").write_bytes(data)
    (folder / "root.json").write_bytes(written["root"])
    (folder / "timestamp.json").write_bytes(timestamp.to_bytes())
    return written["root"]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def served(folder: Path) -> Iterator[str]:
    """`folder` over HTTP on 127.0.0.1: the mirror's base URL."""
    with serving(functools.partial(_Quiet, directory=str(folder))) as url:  # type: ignore[arg-type]
        yield url
