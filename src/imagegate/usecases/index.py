"""`imagegate index`: the statement about a multi-platform index, made from signed runs of its
platforms (attest/platforms.py says what it concludes). The runs are verified first, as
`complete` verifies the attempt it completes (a run that does not verify is refused, exit 1);
the index is then read once, by the digest its tag names now, and every run must be about one of
the platform manifests it lists (another image's run is refused, exit 3). A new attempt folder
`OUT/index-<digest>/<time>-<random>/` holds a copy of each platform's envelope and the signed
statements; `--attach` pushes them to the index digest, where admission finds them.
`run --all-platforms` runs each platform this host runs, then does the same (`run_platforms`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from imagegate import __version__
from imagegate._support import jsontypes as j
from imagegate._support.jsontypes import JsonMapping, JsonValue
from imagegate.attest import attach, keys, referrers
from imagegate.attest import platforms as plat
from imagegate.attest import verify as verifying
from imagegate.attest.sign import Signed, sign_attempt
from imagegate.domain.digest import short_digest, split_digest
from imagegate.domain.evidence import Attempt
from imagegate.domain.results import ImageFacts, accepted, exit_code
from imagegate.domain.statements import RawPredicate, Statement
from imagegate.errors import EXIT_ACCEPTED, EXIT_REJECTED, NotVerified, UsageError
from imagegate.oci.manifest import parse_platform, platform_matches
from imagegate.oci.registry import NotFound

if TYPE_CHECKING:
    from imagegate.attest.keyless import Expected
    from imagegate.usecases.accept import Accepted

Notify = Callable[[str], None]


@dataclass(frozen=True)
class IndexJudged:
    folder: Path
    statement: Statement[RawPredicate]
    signed: Signed
    code: int
    attached: tuple[tuple[attach.Attached | None, referrers.Referred], ...] = ()


_COMBINED = "so it is not combined into the index statement"


def read_runs(
    folders: Sequence[Path], trusted: Sequence[keys.PublicKey], keyless: Expected | None = None
) -> list[plat.PlatformRun]:
    """Each run's signed statement, verified as `imagegate verify` checks an attempt: with a key of
    `trusted`, or keyless with the key its own certificate proves was `keyless`'s identity."""
    out = []
    for folder in folders:
        got = verifying.load_attempt(
            folder,
            _ring(folder, trusted, keyless),
            use=_COMBINED,
            hint="a run signed on another host needs that host's public key (--trust PUB), or "
            "its signer's identity (--identity, --issuer, --trusted-root)",
        )
        out.append(plat.PlatformRun(got.statement, got.envelope, str(got.dir)))
    return out


def _ring(
    folder: Path, trusted: Sequence[keys.PublicKey], keyless: Expected | None
) -> tuple[keys.PublicKey, ...]:
    """The keys `folder`'s run may verify with: `trusted`, and keyless the one its certificate
    proves was the identity's. A run whose certificate proves no such key is refused, naming why,
    unless a key of `trusted` may still verify it (a keyed run among keyless ones)."""
    if keyless is None:
        return tuple(trusted)
    try:
        proven = verifying.certified_attempt(folder, keyless, use=_COMBINED)
    except NotVerified:
        if trusted:
            return tuple(trusted)
        raise
    return (*trusted, proven) if proven is not None else tuple(trusted)


def own_trust(key: keys.SigningKey) -> tuple[tuple[keys.PublicKey, ...], Expected | None]:
    """What runs the signer made verify with: its public key, or a keyless signer's identity (its
    key lives for one certificate: a long run may have renewed it between runs)."""
    from imagegate.attest.keyless import KeylessKey

    if isinstance(key, KeylessKey):
        return (), key.expected()
    return (key.public,), None


def read_index(reference: str, insecure: bool) -> tuple[str, str, plat.IndexListing]:
    """(registry/repository, index digest, its platforms): one read of what `reference` names
    now, hashed to its digest; every later step uses that digest."""
    ref = attach.parse_image(reference)
    with attach.client_for(ref, insecure=insecure) as client:
        try:
            top = client.get_manifest(ref.repository, ref.ref)
        except NotFound as e:
            raise UsageError(f"image {reference}: not found in the registry", hint="push it first") from e
    where = f"{reference} ({short_digest(top.digest)})"
    return f"{ref.registry}/{ref.repository}", top.digest, plat.list_platforms(top.raw, top.media_type, where)


def _no_level(verdict: str, statement: JsonMapping) -> str:
    """The exit code's reason, said whatever the format, as run gives it."""
    not_run = ", ".join(j.strings(j.path(statement, "predicate", "notRun")))
    return f"rejected: {verdict} reaches no level (not run: {not_run})"


def _with_copies(
    statement: Statement[RawPredicate], attempt: Attempt, runs: Sequence[plat.PlatformRun]
) -> Statement[RawPredicate]:
    """The index statement with each platform's envelope copied into the attempt, as its evidence."""
    by_digest = {r.manifest_digest: r for r in runs}
    pred = statement.predicate.to_json()
    files: list[JsonValue] = []
    for entry in j.objects(pred["platforms"]):
        if entry["ran"]:
            run = by_digest[j.text(entry["manifestDigest"])]
            copied = attempt.write(str(j.path(entry, "attestation", "path")), run.envelope)
            files.append({"path": copied.path, "sha256": copied.sha256, "size": copied.size})
    return replace(statement, predicate=RawPredicate({**pred, "evidence": files}))


def judge_index(
    reference: str,
    runs: Sequence[Path],
    key: keys.SigningKey,
    trusted: Sequence[keys.PublicKey],
    out: Path,
    *,
    attach_it: bool = False,
    insecure: bool = False,
    require_complete: bool = False,
    notify: Notify = lambda _m: None,
    alert: Notify = lambda _m: None,
    index: tuple[str, str, plat.IndexListing] | None = None,
    keyless: Expected | None = None,
) -> IndexJudged:
    """`index`: the index as `read_index` read it already (run --all-platforms), not read again.
    `alert`: a line the caller shows whatever the format (the use case prints nothing). `keyless`:
    runs signed keyless by that identity verify too (read_runs)."""
    verified = read_runs(runs, trusted, keyless)
    repository, digest, listing = index or read_index(reference, insecure)
    now = dt.datetime.now(dt.timezone.utc)
    statement = plat.build_index_statement(
        repository,
        reference,
        digest,
        listing,
        verified,
        finished_on=now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z",
        version=__version__,
    )
    algo, hexd = split_digest(digest)
    attempt = Attempt(out, ImageFacts(reference, None), now=now, key=f"index-{algo}-{hexd}")
    statement = _with_copies(statement, attempt, verified)
    pred, said = statement.predicate.to_json(), statement.to_json()
    attempt.write_json("statement.json", said)
    signed = sign_attempt(attempt.dir, statement, key)
    notify(
        f"signed {signed.dsse_path} {'' if signed.signer.startswith('keyless') else 'with '}{signed.signer}"
    )
    verdict = str(pred["verdict"])
    # No level, no acceptance: a deferred index whose platforms reached none is rejected, as verify rejects it.
    code = accepted(verdict, plat.index_levels(said), require_complete=require_complete)
    if code != exit_code(verdict, require_complete=require_complete):
        alert(_no_level(verdict, said))
    pairs: tuple[tuple[attach.Attached | None, referrers.Referred], ...] = ()
    if attach_it:
        pinned = attach.parse_image(reference).with_digest(digest)
        with attach.client_for(pinned, insecure=insecure) as client:
            pairs = tuple(referrers.attach_signed(client, pinned, signed, key))
        left = referrers.remaining(list(pairs), pinned.repository)
        if left is not None:
            alert(left)
            if code == EXIT_ACCEPTED:
                code = EXIT_REJECTED
    return IndexJudged(attempt.dir, statement, signed, code, pairs)


def runs_here(platform: str) -> bool:
    """Whether this host runs images of `platform` (os/arch[/variant]) natively: Linux on this
    machine's architecture. No emulation is assumed: a platform it cannot run is named, not run."""
    import platform as host

    try:
        want = parse_platform(f"linux/{host.machine()}")
        have = parse_platform(platform)
    except UsageError:
        return False
    return platform_matches(want, have)


def run_platforms(
    image: str,
    run_one: Callable[[str], Accepted],
    key: keys.SigningKey,
    out: Path,
    *,
    attach_it: bool = False,
    insecure: bool = False,
    require_complete: bool = False,
    notify: Notify = lambda _m: None,
    alert: Notify = lambda _m: None,
) -> tuple[list[Accepted], IndexJudged]:
    """`run --all-platforms`: the index `image` names read once; `run_one` runs the pipeline on
    each platform manifest this host runs (by digest, with the transport `image` was given in);
    then the index statement over those runs, naming the platforms not run here."""
    read = read_index(image, insecure)
    repository, _, listing = read
    here = [p for p in listing.platforms if runs_here(p.platform)]
    if not here:
        import platform as host

        listed = ", ".join(p.platform for p in listing.platforms)
        raise UsageError(
            f"{image}: the index lists {listed}; this {host.machine()} host runs none of them",
            hint="run on a host of one of those platforms, then sign the index with imagegate index",
        )
    transport = "docker://" if image.startswith("docker://") else ""
    done = []
    for p in here:
        notify(f"platform {p.platform}: {repository}@{p.digest}")
        done.append(run_one(f"{transport}{repository}@{p.digest}"))
    folders = [Path(d.record.attempt_dir) for d in done if d.signed is not None]
    trusted, keyless = own_trust(key)
    judged = judge_index(
        image,
        folders,
        key,
        trusted,
        out,
        attach_it=attach_it,
        insecure=insecure,
        require_complete=require_complete,
        notify=notify,
        alert=alert,
        index=read,
        keyless=keyless,
    )
    return done, judged
