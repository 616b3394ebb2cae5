"""Signing after a run, shared by `run` and `pod collect` / `pod run`: the key is resolved in
the runner's process only; it never reaches a container, a Pod or the evidence."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

from imagegate.attest import keys as attest_keys
from imagegate.attest import sign as attest_sign
from imagegate.model import RunRecord


def key_option() -> Any:
    return typer.Option(
        None,
        "--key",
        help="Signing key (PEM); default $IMAGEGATE_SIGNING_KEY, else the user's key, created on first use.",
    )


def no_sign_option() -> Any:
    return typer.Option(False, "--no-sign", help="Do not sign the attempt.")


def resolve(key: str | None, no_sign: bool, notify: Callable[[str], None]) -> attest_keys.SigningKey | None:
    """Before the work: a bad key or passphrase fails first, not after the run. With no key
    named and no default key possible (a read-only home), the run goes on unsigned and says so:
    the verdict and its evidence are still written."""
    if no_sign:
        return None
    try:
        return attest_keys.resolve_signing_key(key, notify=notify)
    except attest_keys.DefaultKeyUnavailable as e:
        typer.echo(f"imagegate: warning: the attempt will not be signed: {e}\n  hint: {e.hint}", err=True)
        return None


def sign(record: RunRecord, key: attest_keys.SigningKey | None, notify: Callable[[str], None]) -> Any:
    if key is None:
        return None
    signed = attest_sign.sign_run(record, key)
    notify(f"signed {signed.dsse_path} with key {signed.fingerprint}")
    return signed
