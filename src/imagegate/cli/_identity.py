"""The keyless signer's options, one group for every command that names one (`verify`,
`policies write`): who must have signed, who vouched for them, and the Sigstore trusted."""

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from imagegate.cli._app import Option
from imagegate.errors import UsageError

if TYPE_CHECKING:
    from imagegate.attest import keyless


@dataclass(frozen=True)
class Identity:
    """--identity/--identity-regexp, --issuer/--issuer-regexp, --trusted-root."""

    identity: str | None = Option(
        None,
        "--identity",
        metavar="ID",
        help="Keyless: who must have signed, as the certificate names it (a CI workflow's URI, an email); with --issuer and --trusted-root.",
    )
    identity_regexp: str | None = Option(
        None,
        "--identity-regexp",
        metavar="RE",
        help="Keyless: a regexp the certificate's identity must match (anywhere, as cosign's; anchor it with ^…$).",
    )
    issuer: str | None = Option(
        None, "--issuer", metavar="URL", help="Keyless: the OIDC issuer the certificate must name."
    )
    issuer_regexp: str | None = Option(
        None,
        "--issuer-regexp",
        metavar="RE",
        help="Keyless: a regexp the certificate's OIDC issuer must match.",
    )
    trusted_root: Path | None = Option(
        None,
        "--trusted-root",
        metavar="FILE",
        help="Keyless: the Sigstore whose CA, logs and timestamp authorities are trusted (trusted_root.json, or a client trust config).",
    )

    def named(self, what: str) -> Path | None:
        """The trusted root when a whole signer is named: one of --identity/--identity-regexp,
        one of --issuer/--issuer-regexp (regexps that compile) and --trusted-root; None when
        none of them is given; else refused, naming `what` ("keyless verification") needs."""
        import re

        named = {
            "--identity": self.identity,
            "--identity-regexp": self.identity_regexp,
            "--issuer": self.issuer,
            "--issuer-regexp": self.issuer_regexp,
            "--trusted-root": self.trusted_root,
        }
        given = [k for k, value in named.items() if value is not None]
        if not given:
            return None
        if (self.identity is None) == (self.identity_regexp is None) or (self.issuer is None) == (
            self.issuer_regexp is None
        ):
            raise UsageError(
                f"{what} ({', '.join(given)}) needs one of --identity/--identity-regexp "
                "and one of --issuer/--issuer-regexp",
                hint="name who must have signed and who vouched for them, as cosign's --certificate-identity and --certificate-oidc-issuer",
            )
        if self.trusted_root is None:
            raise UsageError(
                f"{what} needs --trusted-root FILE",
                hint="the trusted_root.json of the Sigstore that signed (never a default: name the one you trust)",
            )
        for option, pattern in (
            ("--identity-regexp", self.identity_regexp),
            ("--issuer-regexp", self.issuer_regexp),
        ):
            try:
                re.compile(pattern or "")
            except re.error as e:
                raise UsageError(f"{option} {pattern!r}: not a regexp ({e})") from None
        return self.trusted_root

    def expected(self, what: str) -> "keyless.Expected | None":
        """Who must have signed, under the trusted root read (`named`); None when none is named."""
        path = self.named(what)
        if path is None:
            return None
        from imagegate.attest import keyless

        root = keyless.trusted_root(path)
        return keyless.Expected(root, self.identity, self.identity_regexp, self.issuer, self.issuer_regexp)
