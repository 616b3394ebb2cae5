"""Keys that stay in their token: a real PKCS#11 module (SoftHSM2, Debian's softhsm2) holds the
key `keygen` makes there, sensitive and not extractable; `run --key pkcs11:...` signs through it,
and the statement verifies with the public half alone. The PIN is never printed, and a bad URI
or PIN fails before the run, naming the key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from imagegate.attest import hsm
from imagegate.errors import UsageError
from tests.attest.conftest import HERE_RUN, Result, cli

MODULE = Path("/usr/lib/softhsm/libsofthsm2.so")
PIN = "4711-secret"

pytestmark = pytest.mark.skipif(
    not MODULE.is_file(), reason="softhsm2 is not installed (.ci/apt-packages.txt)"
)


@pytest.fixture
def token(tmp_path: Path) -> dict[str, str]:
    """A fresh SoftHSM2 token labelled `ci` in a folder of this test's: the environment a command
    needs to reach it (its PIN is not in it)."""
    store = tmp_path / "softhsm"
    (store / "tokens").mkdir(parents=True)
    conf = store / "softhsm2.conf"
    conf.write_text(
        f"directories.tokendir = {store / 'tokens'}\nobjectstore.backend = file\nlog.level = ERROR\n"
    )
    env = {"SOFTHSM2_CONF": str(conf)}
    subprocess.run(
        ["softhsm2-util", "--init-token", "--free", "--label", "ci", "--pin", PIN, "--so-pin", "so-9876"],
        env={**os.environ, **env}, check=True, capture_output=True,
    )  # fmt: skip
    return env


@pytest.fixture
def tokens(token: dict[str, str]) -> dict[str, str]:
    """Two more tokens beside `ci`, labelled to sort below and above it: a key is found in its own
    token by each attribute that names one, never in a neighbour."""
    for label in ("ab", "zz"):
        subprocess.run(
            ["softhsm2-util", "--init-token", "--free", "--label", label, "--pin", PIN, "--so-pin", "so-9876"],
            env={**os.environ, **token}, check=True, capture_output=True,
        )  # fmt: skip
    return token


def _uri(label: str = "gate", **query: str) -> str:
    extra = "".join(f"&{k}={v}" for k, v in query.items())
    return f"pkcs11:token=ci;object={label}?module-path={MODULE}{extra}"


def _with_pin(token: dict[str, str]) -> dict[str, str]:
    return {**token, "IMAGEGATE_PKCS11_PIN": PIN}


def _keygen(tmp_path: Path, token: dict[str, str], label: str = "gate") -> Result:
    return cli(
        "keygen",
        "--out",
        _uri(label),
        "--pub",
        str(tmp_path / f"{label}.pub"),
        env=_with_pin(token),
        cwd=tmp_path,
    )


def _in_token(token: dict[str, str], code: str) -> subprocess.CompletedProcess[str]:
    """python-pkcs11 in a process of its own (a module is initialised once per process)."""
    prelude = textwrap.dedent(f"""
        import pkcs11
        from pkcs11 import Attribute, ObjectClass
        tok = pkcs11.lib({str(MODULE)!r}).get_token(token_label="ci")
        s = tok.open(user_pin={PIN!r}, rw=True)
    """)
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        env={**os.environ, **token}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_keygen_makes_the_key_inside_the_token_and_nobody_can_read_it_out(
    tmp_path: Path, token: dict[str, str]
) -> None:
    before = {p for p in tmp_path.rglob("*") if "softhsm" not in p.parts}
    r = _keygen(tmp_path, token)
    assert r.returncode == 0, r.stderr
    assert "in the token: sensitive, not extractable" in r.stdout and PIN not in r.stdout + r.stderr
    made = {p for p in tmp_path.rglob("*") if "softhsm" not in p.parts} - before
    assert made == {tmp_path / "gate.pub"}  # the public half only: no private key written anywhere
    assert (tmp_path / "gate.pub").read_text().startswith("-----BEGIN PUBLIC KEY-----")
    attrs = _in_token(
        token,
        """
        (k,) = s.get_objects({Attribute.CLASS: ObjectClass.PRIVATE_KEY, Attribute.LABEL: "gate"})
        print(k[Attribute.SENSITIVE], k[Attribute.EXTRACTABLE], k[Attribute.SIGN], k[Attribute.PRIVATE])
        try:
            k[Attribute.VALUE]
            print("exported")
        except pkcs11.PKCS11Error as e:
            print("refused", type(e).__name__)
    """,
    )
    assert attrs.stdout.split() == ["True", "False", "True", "True", "refused", "AttributeSensitive"], (
        attrs.stderr
    )
    # nor wrapped out under another key, the way an extractable key leaves a token
    wrapped = _in_token(
        token,
        """
        (k,) = s.get_objects({Attribute.CLASS: ObjectClass.PRIVATE_KEY, Attribute.LABEL: "gate"})
        w = s.generate_key(pkcs11.KeyType.AES, 256, template={Attribute.WRAP: True})
        try:
            w.wrap_key(k, mechanism=pkcs11.Mechanism.AES_KEY_WRAP_PAD)
            print("wrapped")
        except pkcs11.PKCS11Error as e:
            print("refused", type(e).__name__)
    """,
    )
    assert wrapped.stdout.split() == ["refused", "KeyUnextractable"], wrapped.stdout + wrapped.stderr
    again = _keygen(tmp_path, token)  # never over a key of that label
    assert again.returncode == 3 and "already holds a key of that label" in again.stderr


def test_a_run_signed_in_the_token_verifies_with_its_public_half(
    tmp_path: Path, token: dict[str, str]
) -> None:
    assert _keygen(tmp_path, token).returncode == 0
    env = {**_with_pin(token), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    argv = (*HERE_RUN, "-o", "runs", "--key", _uri())
    r = cli(*argv, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert PIN not in r.stdout + r.stderr
    assert not (tmp_path / "cfg" / "imagegate" / "signing.key").exists()  # no default key made
    (dsse,) = (tmp_path / "runs").glob("*/*/attestation.dsse.json")
    assert "imagegate public-key --key" in r.stdout  # the next step names how to get the public half
    v = cli("verify", str(dsse), "--key", str(tmp_path / "gate.pub"), env=token, cwd=tmp_path)
    assert v.returncode == 0 and "verified: verdict PASS" in v.stdout, v.stdout + v.stderr
    # `public-key` reads the same public half from the token
    p = cli("public-key", "--key", _uri(), env=_with_pin(token))
    assert p.returncode == 0 and p.stdout == (tmp_path / "gate.pub").read_text(), p.stderr
    # another token key's public half refuses it
    assert _keygen(tmp_path, token, "other").returncode == 0
    w = cli("verify", str(dsse), "--key", str(tmp_path / "other.pub"), env=token, cwd=tmp_path)
    assert w.returncode != 0
    # the signature is the token's: P-256 ECDSA, DER, as cosign writes
    envelope = json.loads(dsse.read_text())
    assert len(envelope["signatures"]) == 1


def test_the_pin_from_a_file_and_a_wrong_pin(tmp_path: Path, token: dict[str, str]) -> None:
    assert _keygen(tmp_path, token).returncode == 0
    pin_file = tmp_path / "pin"
    pin_file.write_text(PIN + "\n")
    good = cli("public-key", "--key", _uri(**{"pin-source": str(pin_file)}), env=token)
    assert good.returncode == 0, good.stderr
    wrong = cli("public-key", "--key", _uri(**{"pin-value": "0000-wrong"}), env=token)
    assert wrong.returncode == 3 and "the token refused the PIN" in wrong.stderr
    assert "0000-wrong" not in wrong.stdout + wrong.stderr  # the URI is quoted without its PIN
    none = cli("public-key", "--key", _uri(), env=token)
    assert none.returncode == 3 and "IMAGEGATE_PKCS11_PIN" in none.stderr
    missing = cli("public-key", "--key", _uri("nothing"), env=_with_pin(token))
    assert missing.returncode == 3 and "no private key on the token" in missing.stderr
    tokenless = cli(
        "public-key", "--key", _uri().replace("token=ci", "token=elsewhere"), env=_with_pin(token)
    )
    assert tokenless.returncode == 3 and "no token match" in tokenless.stderr and "ci" in tokenless.stderr


def test_a_bad_key_uri_fails_before_the_run(tmp_path: Path, token: dict[str, str]) -> None:
    argv = (*HERE_RUN, "-o", "runs")
    r = cli(*argv, "--key", _uri("absent"), env=_with_pin(token), cwd=tmp_path)
    assert r.returncode == 3 and "no private key on the token" in r.stderr
    assert not (tmp_path / "runs").exists()  # nothing ran


def test_a_public_object_of_another_pair_is_caught_before_anything_is_signed(
    tmp_path: Path, token: dict[str, str]
) -> None:
    """Objects found by label: when the public object of that label belongs to another key, the
    token's signature would name a key nobody holds. The signature is checked before it is used."""
    assert _keygen(tmp_path, token).returncode == 0
    assert _keygen(tmp_path, token, "other").returncode == 0
    relabel = _in_token(
        token,
        """
        def one(cls, label):
            (o,) = s.get_objects({Attribute.CLASS: cls, Attribute.LABEL: label})
            return o
        one(ObjectClass.PUBLIC_KEY, "gate")[Attribute.LABEL] = "gate-was"
        one(ObjectClass.PUBLIC_KEY, "other")[Attribute.LABEL] = "gate"
        print("relabelled")
    """,
    )
    assert relabel.stdout.strip() == "relabelled", relabel.stderr
    r = cli(*HERE_RUN, "-o", "runs", "--key", _uri(), env=_with_pin(token), cwd=tmp_path)
    assert r.returncode == 3 and "does not verify with its public key object" in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists()  # found when the key was opened, before the run


def test_each_attribute_that_names_a_token_finds_that_one(tmp_path: Path, tokens: dict[str, str]) -> None:
    listed = _in_token(
        tokens,
        """
        for slot in pkcs11.lib(%r).get_slots(token_present=True):
            t = slot.get_token()
            print(slot.slot_id, t.label, t.serial.decode().strip())
    """
        % str(MODULE),
    )
    found = [
        line.split() for line in listed.stdout.splitlines() if len(line.split()) == 3
    ]  # not the free slot
    assert sorted(label for _, label, _ in found) == ["ab", "ci", "zz"], listed.stderr
    # for each attribute, the token in the middle of the three by it: a looser match takes a neighbour
    for n, (attr, key) in enumerate([("token", 1), ("slot-id", 0), ("serial", 2)]):
        slot, label, serial = sorted(found, key=lambda f: int(f[0]) if key == 0 else f[key])[1]
        made = cli(
            "keygen", "--out", f"pkcs11:token={label};object=k{n}?module-path={MODULE}",
            "--pub", str(tmp_path / f"k{n}.pub"), env=_with_pin(tokens),
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        value = {"token": label, "slot-id": slot, "serial": serial}[attr]
        got = cli(
            "public-key",
            "--key",
            f"pkcs11:{attr}={value};object=k{n}?module-path={MODULE}",
            env=_with_pin(tokens),
        )
        assert got.returncode == 0 and got.stdout == (tmp_path / f"k{n}.pub").read_text(), (attr, got.stderr)
    absent = cli(
        "public-key", "--key", f"pkcs11:slot-id=1;object=k0?module-path={MODULE}", env=_with_pin(tokens)
    )
    assert absent.returncode == 3 and "no token match" in absent.stderr
    assert "the module's tokens: ab, ci, zz;" in absent.stderr  # the free slot is no token to name
    # a key named without its token among several: no PIN is tried on a token it may not be for
    # (each wrong try counts towards locking that token), the user is asked to name one
    loose = cli("public-key", "--key", _uri("k0").replace("token=ci;", ""), env=_with_pin(tokens))
    assert (
        loose.returncode == 3
        and "3 tokens match it" in loose.stderr
        and "name one with token=" in loose.stderr
    )


@pytest.mark.parametrize(
    ("kind", "params"),
    [("P-384", "06052b81040022"), ("brainpoolP256r1", "06092b2403030208010107"), ("RSA", None)],
)
def test_a_key_of_another_kind_is_refused_by_name(
    token: dict[str, str], kind: str, params: str | None
) -> None:
    """imagegate signs ECDSA P-256 in a token: another curve, with parameters that sort below or
    above P-256's, or RSA, is refused before anything is signed."""
    make = (
        "s.generate_keypair(pkcs11.KeyType.RSA, 2048, store=True, label='other')"
        if params is None
        else f"s.create_domain_parameters(pkcs11.KeyType.EC, {{Attribute.EC_PARAMS: bytes.fromhex({params!r})}}, "
        "local=True).generate_keypair(store=True, label='other')"
    )
    assert _in_token(token, make).returncode == 0
    r = cli("public-key", "--key", _uri("other"), env=_with_pin(token))
    assert r.returncode == 3 and "not an ECDSA P-256 key" in r.stderr, (kind, r.stderr)


def test_two_keys_of_one_label_and_a_key_not_allowed_to_sign_are_refused(token: dict[str, str]) -> None:
    made = _in_token(
        token,
        """
        from pkcs11.util.ec import encode_named_curve_parameters
        params = s.create_domain_parameters(
            pkcs11.KeyType.EC, {Attribute.EC_PARAMS: encode_named_curve_parameters("secp256r1")}, local=True
        )
        for n in (1, 2):
            params.generate_keypair(store=True, label="twin", id=bytes([n]))
        params.generate_keypair(store=True, label="verify-only", private_template={Attribute.SIGN: False})
        # a key that wants its PIN again for each signature (context-specific login)
        params.generate_keypair(store=True, label="each-time", private_template={Attribute.ALWAYS_AUTHENTICATE: True})
        print("made")
    """,
    )
    assert made.stdout.strip() == "made", made.stderr
    twins = cli("public-key", "--key", _uri("twin"), env=_with_pin(token))
    assert twins.returncode == 3 and "2 private keys match it" in twins.stderr, twins.stderr
    one = cli("public-key", "--key", _uri("twin") + "", env=_with_pin(token))
    by_id = cli(
        "public-key", "--key", _uri("twin").replace("object=twin", "object=twin;id=%02"), env=_with_pin(token)
    )
    assert one.returncode == 3 and by_id.returncode == 0, by_id.stderr  # the id tells them apart
    unsigning = cli("public-key", "--key", _uri("verify-only"), env=_with_pin(token))
    assert unsigning.returncode == 3 and "the token did not sign" in unsigning.stderr, unsigning.stderr
    each = cli("public-key", "--key", _uri("each-time"), env=_with_pin(token))
    assert each.returncode == 3 and "the token did not sign (" in each.stderr, each.stderr


def test_the_uri_is_read_as_rfc_7512_says() -> None:
    ref = hsm.parse(
        "pkcs11:token=my%20ci;slot-id=3;object=gate;id=%01%ab?module-path=/m.so&pin-value=12%2634", {}
    )
    assert (ref.token, ref.slot_id, ref.label, ref.key_id, ref.pin) == (
        "my ci",
        3,
        "gate",
        b"\x01\xab",
        "12&34",
    )
    assert "12" not in ref.uri.split("?")[0] and "pin" not in ref.uri and "12&34" not in repr(ref)
    assert hsm.parse("pkcs11:object=gate", {"IMAGEGATE_PKCS11_MODULE": "/m.so"}).module == Path("/m.so")
    for bad, said in [
        ("pkcs11:token=ci", "names no key"),
        ("pkcs11:object=gate", "no PKCS#11 module"),
        ("pkcs11:object=gate;colour=red?module-path=/m.so", "'colour' is not a PKCS#11 URI attribute"),
        ("pkcs11:object=gate;object=b?module-path=/m.so", "object is given twice"),
        ("pkcs11:object=gate;type=public?module-path=/m.so", "a signing key is type=private"),
        ("pkcs11:object=gate;type=cert?module-path=/m.so", "a signing key is type=private"),
        ("pkcs11:object=gate;slot-id=x?module-path=/m.so", "not a number"),
        ("pkcs11:object=g?module-path=/m.so&pin-value=1&pin-source=/f", "both given"),
    ]:
        with pytest.raises(UsageError, match=said) as e:
            hsm.parse(bad, {})
        assert "pin-value=1&" not in str(e.value)
