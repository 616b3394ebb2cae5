"""Names other programs and users know imagegate's output and settings by, in a module that
imports nothing: the command line's help names them and must not load the layers that use them."""

from __future__ import annotations

# The acceptance statement's predicate type (attest.statement; what verify expects by default).
PREDICATE_TYPE = "https://imagegate.dev/attestations/acceptance/v1"
# The signing key, and its passphrase (attest.keys).
KEY_ENV = "IMAGEGATE_SIGNING_KEY"
PASSWORD_ENV = "IMAGEGATE_KEY_PASSWORD"
# a pkcs11: key's module and user PIN, where its URI names neither (attest/hsm.py)
PKCS11_MODULE_ENV = "IMAGEGATE_PKCS11_MODULE"
PKCS11_PIN_ENV = "IMAGEGATE_PKCS11_PIN"
# a hashivault:// key's server, token, transit mount and CA: the names cosign and Vault's own CLI
# read (attest/kms.py); VAULT_SKIP_VERIFY is read only to refuse it
VAULT_ADDR_ENV = "VAULT_ADDR"
VAULT_TOKEN_ENV = "VAULT_TOKEN"
VAULT_TRANSIT_ENV = "TRANSIT_SECRET_ENGINE_PATH"
VAULT_CACERT_ENV = "VAULT_CACERT"
VAULT_SKIP_VERIFY_ENV = "VAULT_SKIP_VERIFY"
# Keyless signing's identity token (attest/keyless.py; cosign's name, GitLab's id_tokens set it),
# and what GitHub Actions gives a job with `id-token: write` to ask for one: whoever holds either
# signs as the CI's workflow
SIGSTORE_TOKEN_ENV = "SIGSTORE_ID_TOKEN"
GITHUB_TOKEN_REQUEST_ENVS = ("ACTIONS_ID_TOKEN_REQUEST_TOKEN", "ACTIONS_ID_TOKEN_REQUEST_URL")
