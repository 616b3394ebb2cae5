"""Where a report re-rendered from an attempt folder (`imagegate report`) got its statement, and
whether anything vouches for it: the signed payload of the attempt's DSSE envelope (checked with
`--key`, or said to be unchecked), flagged when `statement.json` or an evidence file differs from
what was signed, or when the attempt was never signed. Every format shows these lines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Signature = Literal["verified", "failed", "not checked", "unsigned", "unreadable"]

CHECK_HINT = "signature not checked — pass --key PUB to check it"


@dataclass(frozen=True)
class Provenance:
    signature: Signature
    fingerprint: str | None = None  # of --key, when given
    differs: bool = False  # statement.json is not the signed statement (the report shows the signed one)
    problems: tuple[
        str, ...
    ] = ()  # evidence files that differ from their signed sha256, an unreadable envelope

    @property
    def ok(self) -> bool:
        """Nothing contradicts the signed statement. An unsigned or unchecked attempt is flagged,
        not failed, unless --key asked for a check that cannot pass."""
        if self.differs or self.problems or self.signature in ("failed", "unreadable"):
            return False
        return not (self.signature == "unsigned" and self.fingerprint is not None)

    def lines(self) -> list[str]:
        """Each flag, in words; the first says what vouches for the statement shown."""
        key = self.fingerprint
        first = {
            "verified": f"signature verified with key {key}",
            "failed": f"SIGNATURE FAILED: no signature of the attestation verifies with key {key}: "
            "signed with another key, or changed after signing",
            "not checked": f"signed; {CHECK_HINT}",
            "unsigned": "UNSIGNED: the attempt has no attestation (run without --no-sign): nothing "
            "vouches for this statement" + (f"; --key {key} cannot be checked" if key else ""),
            "unreadable": "ATTESTATION UNREADABLE: this report shows statement.json, which nothing vouches for",
        }[self.signature]
        out = [first]
        if self.differs:
            out.append(
                "STATEMENT.JSON DIFFERS from the signed statement (edited after signing): "
                "this report shows the signed one"
            )
        return out + list(self.problems)

    def summary(self) -> str:
        return "; ".join(self.lines())
