"""A run tells the next step: a signed run ends naming the public key and the `verify` command
that checks its statement, pasteable as printed; `verify` given no key uses the public half of
the key `run` signs with, saying so; an unsigned run's evidence is said to be unsigned."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from imagegate.attest import keys
from tests.attest.conftest import Result, cli

UNSIGNED = "this run was not signed (--no-sign): nothing to verify"


def _run(cwd: Path, config: Path, *more: str, env: dict[str, str] | None = None) -> Result:
    argv = ("run", "--here", "--python", sys.executable, "-p", "python", "-m", "json", "-o", "runs")
    return cli(*argv, *more, cwd=cwd, env={"XDG_CONFIG_HOME": str(config), **(env or {})})


def _attempt(cwd: Path) -> Path:
    (found,) = [p.parent for p in (cwd / "runs").glob("*/*/statement.json")]
    return found


def _said_verify(r: Result) -> list[str]:
    """The verify command the run printed last, as a shell would split it."""
    last = r.stdout.rstrip().splitlines()
    assert last[-1].startswith("to verify: imagegate verify "), r.stdout
    return shlex.split(last[-1].removeprefix("to verify: imagegate "))


def test_every_signed_run_ends_with_its_public_key_and_the_command_that_verifies_it(tmp_path: Path) -> None:
    work, config = tmp_path / "work", tmp_path / "key dir"  # a space: the path must be quoted
    work.mkdir()
    home = {"HOME": str(tmp_path)}  # the key under the home folder: named from ~
    for n in (1, 2):  # the first run makes the key, the next one finds it: both say the same
        r = _run(work, config, env=home)
        assert r.returncode == 0, r.stdout + r.stderr
        lines = r.stdout.rstrip().splitlines()
        assert lines[-2] == "public key: ~/'key dir/imagegate/signing.pub'", r.stdout
        attempt = sorted((work / "runs").glob("*/*/attestation.dsse.json"))[-1]
        said = lines[-1].removeprefix("to verify: ")
        assert (
            said == f"imagegate verify {attempt.relative_to(work)} --key ~/'key dir/imagegate/signing.pub'"
        ), n
        # pasted into a shell as printed, from where the run was
        pasted = subprocess.run(
            ["bash", "-c", f"imagegate() {{ {shlex.quote(sys.executable)} -m imagegate \"$@\"; }}; {said}"],
            capture_output=True, text=True, cwd=work, env={**os.environ, **home}, timeout=300,
        )  # fmt: skip
        assert pasted.returncode == 0 and "verified: verdict PASS" in pasted.stdout, pasted


def test_a_key_under_the_cwd_is_named_relative_to_it(tmp_path: Path) -> None:
    r = _run(tmp_path, tmp_path / "cfg")
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip().splitlines()[-2] == "public key: cfg/imagegate/signing.pub"
    assert _said_verify(r)[-2:] == ["--key", "cfg/imagegate/signing.pub"]


def test_json_output_says_the_next_step_on_stderr(tmp_path: Path) -> None:
    r = _run(tmp_path, tmp_path / "cfg", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("{") and "to verify:" not in r.stdout  # stdout is the statement's
    assert "imagegate: to verify: imagegate verify runs/" in r.stderr


def test_verify_without_a_key_uses_the_key_run_signed_with_and_says_so(tmp_path: Path) -> None:
    config = tmp_path / "cfg"
    assert _run(tmp_path, config).returncode == 0
    attempt = _attempt(tmp_path)
    env = {"XDG_CONFIG_HOME": str(config)}
    for given in (attempt / "attestation.dsse.json", attempt):  # the statement, or its folder
        r = cli("verify", str(given), cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        pub = config / "imagegate" / "signing.pub"
        assert f"verify: using the signing key's public half {pub} (run's default key)\n" in r.stderr
        assert "verified: verdict PASS" in r.stdout
    # The key named by the variable run reads is the one used, named as such.
    other, other_pub = keys.write_keypair(tmp_path / "ci" / "gate", keys.generate(), None)
    r = cli("verify", str(attempt), cwd=tmp_path, env={**env, keys.KEY_ENV: str(other)})
    assert f"verify: using the signing key's public half {other_pub} (${keys.KEY_ENV})" in r.stderr
    assert r.returncode == 1 and "NOT verified: signature:" in r.stdout, r.stdout  # not run's key


def test_verify_with_no_key_anywhere_names_the_flag(tmp_path: Path) -> None:
    assert _run(tmp_path, tmp_path / "cfg").returncode == 0
    r = cli("verify", str(_attempt(tmp_path)), env={"XDG_CONFIG_HOME": str(tmp_path / "empty")})
    assert r.returncode == 3, r.stdout + r.stderr
    assert "no public key to verify with" in r.stderr and "pass --key PUB" in r.stderr
    assert str(tmp_path / "empty" / "imagegate" / "signing.key") in r.stderr  # where it looked


def test_an_unsigned_runs_evidence_is_said_to_be_unsigned(tmp_path: Path) -> None:
    """Exit 3, an input error as `verify` of any input that holds no attestation: nothing was
    checked, so nothing was rejected (1 is a check that ran and failed)."""
    r = _run(tmp_path, tmp_path / "cfg", "--no-sign")
    assert r.returncode == 0, r.stderr
    assert "to verify:" not in r.stdout  # nothing to tell for an unsigned run
    attempt = _attempt(tmp_path)
    for given in (attempt, attempt / "statement.json", attempt / "attestation.dsse.json"):
        said = cli("verify", str(given), "--key", str(tmp_path / "absent.pub"))
        assert said.returncode == 3, said.stdout + said.stderr
        assert f"{attempt}: {UNSIGNED}" in said.stderr, said.stderr
        assert "No such file" not in said.stderr
