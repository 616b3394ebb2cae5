"""A cluster's service-account tokens are OIDC tokens too: a real API server (tests/kube/apiserver.py,
its tokens issued under its own URL, its discovery and keys served there as a cluster publishes
them) is an issuer the tests' own Fulcio trusts (tests/attest/sigstore_local.py, Fulcio's
`kubernetes` issuer type), and a token `kubectl create token` gives a ServiceAccount signs keyless
as that ServiceAccount: what a zero-GPU Pod or a GPU node's Job has, with no CI around it. The
statement verifies for the ServiceAccount the certificate names
(https://kubernetes.io/namespaces/NS/serviceaccounts/NAME) and that cluster as issuer, and not for
another ServiceAccount of the same cluster."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from imagegate.attest import sign
from tests.attest.conftest import cli
from tests.attest.sigstore_local import Cluster, LocalSigstore, local_sigstore
from tests.helpers import go_tools
from tests.kube.apiserver import ApiServer, started

HERE = ("run", "--here", "--python", sys.executable, "-p", "python", "-m", "json")


@dataclass(frozen=True)
class Issuing:
    api: ApiServer
    local: LocalSigstore
    namespace: str


@pytest.fixture(scope="module")
def issuing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Issuing]:
    with started(tmp_path_factory.mktemp("control-plane"), own_issuer=True) as api:
        assert api.ca is not None
        with local_sigstore(go_tools("sigstore", "tesseract"), Cluster(api.issuer, api.ca)) as local:
            made = api.kubectl_run("create", "namespace", "checks")
            assert made.returncode == 0, made.stderr
            for account in ("gate", "other"):
                made = api.kubectl_run("create", "serviceaccount", account, "-n", "checks")
                assert made.returncode == 0, made.stderr
            yield Issuing(api, local, "checks")


def _token(i: Issuing, account: str) -> str:
    """What a Pod of `account` is given (a projected token for Sigstore's audience)."""
    got = i.api.kubectl_run(
        "create", "token", account, "-n", i.namespace, "--audience", "sigstore", "--duration", "10m"
    )
    assert got.returncode == 0, got.stderr
    return got.stdout.strip()


def _who(i: Issuing, account: str) -> tuple[str, ...]:
    identity = f"https://kubernetes.io/namespaces/{i.namespace}/serviceaccounts/{account}"
    return ("--identity", identity, "--issuer", i.api.issuer, "--trusted-root", str(i.local.trusted_root))


def test_a_service_account_token_signs_keyless_as_that_service_account(
    issuing: Issuing, tmp_path: Path
) -> None:
    env = {"SIGSTORE_ID_TOKEN": _token(issuing, "gate"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    trust = f"sigstore:{issuing.local.client_trust_config}"
    done = cli(*HERE, "-o", "runs", "--key", trust, env=env, cwd=tmp_path)
    log = issuing.local.folder.parent / "fulcio" / "server.log"  # why Fulcio refused, if it did
    said = log.read_text(errors="replace")[-2500:] if log.exists() else f"(no {log})"
    assert done.returncode == 0 and "signed keyless" in done.stdout, done.stdout + done.stderr + said
    (attempt,) = [p.parent for p in (tmp_path / "runs").glob("*/*/statement.json")]
    bundle = str(attempt / sign.BUNDLE_FILE)
    quiet = {"IMAGEGATE_SIGNING_KEY": "", "XDG_CONFIG_HOME": str(tmp_path / "no-config")}
    ok = cli("verify", bundle, *_who(issuing, "gate"), env=quiet)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    other = cli("verify", bundle, *_who(issuing, "other"), env=quiet)
    assert other.returncode == 1 and "serviceaccounts/gate" in other.stdout, other.stdout
