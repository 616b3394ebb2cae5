"""A client for the OCI distribution API (registries), pull and push.

Why our own client on httpx rather than a library: the Python registry clients we looked at
(oras-py, python-dxf, docker-registry-client) sit on `requests`, stream blobs without resuming,
and either lack the containers/Docker credential lookup or retries with backoff; each of them
is as much code to wrap as this. httpx gives streaming, timeouts and redirect handling that drops
`Authorization` when a blob redirect leaves the registry's origin.

Speaks: HTTPS (plain HTTP for loopback registries, as Docker allows; `insecure` tries HTTPS
without verification, then HTTP), the Bearer token flow from `WWW-Authenticate` (with Basic
credentials or an identity token at the token endpoint), Basic auth, and retries with
exponential backoff on 429, 5xx and broken connections (`Retry-After` honoured; a blob read cut
mid-way resumes with a Range request). Push primitives (blob upload, manifest PUT) are what an
attestation uploader needs, the way cosign attaches signatures.
"""

from __future__ import annotations

import base64
import functools
import random
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlencode, urljoin

import httpx

from imagegate import __version__
from imagegate._support import deadline, interrupts
from imagegate._support.jsontypes import obj
from imagegate.domain.digest import digest_of, is_digest
from imagegate.errors import UsageError, describe_exception, no_such_host
from imagegate.oci import deadline_net, untrusted_json
from imagegate.oci.auth import Challenge, Credentials, lookup_credentials, parse_challenge
from imagegate.oci.errors import BlobNotFound, SourceError
from imagegate.oci.manifest import ACCEPT_ALL, OCI_INDEX
from imagegate.oci.reference import is_loopback_registry

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
USER_AGENT = f"imagegate/{__version__}"
MAX_REDIRECTS = 5  # a registry sends a blob to its storage once; a loop ends here, named
MAX_ERROR_BYTES = 64 << 10  # of an error body: enough for the registry's message
MAX_TOKEN_BYTES = 1 << 20  # a token answer is a few KiB (a JWT and its expiry)
# Listings (tags, _catalog): names per page asked, pages followed, names kept, bytes of a page.
LIST_PAGE = 1000
MAX_LIST_PAGES = 100
MAX_LISTED = 10_000
MAX_LIST_PAGE_BYTES = 1 << 20  # 1000 names of up to 256 bytes, quoted


class RegistryError(SourceError):
    """The registry could not be reached or answered an error: exit 2 (could not decide)."""


class AuthenticationError(RegistryError):
    pass


class NotFound(RegistryError):
    pass


class NoSuchHost(RegistryError):
    """The registry's name resolves to nothing: an input error (exit 3), which no retry mends."""

    exit_code = 3


@dataclass(frozen=True)
class FetchedManifest:
    raw: bytes
    media_type: str
    digest: str


def _error_text(resp: httpx.Response) -> str:
    try:
        body = untrusted_json.loads(resp.content)
        errs = body.get("errors") if isinstance(body, dict) else None
        if isinstance(errs, list) and errs:
            text = "; ".join(
                f"{e.get('code', '')}: {e.get('message', '')}".strip(": ")
                for e in errs
                if isinstance(e, dict)
            )
            return text[:500] or str(resp.status_code)
    except (ValueError, httpx.ResponseNotRead):
        pass
    return resp.reason_phrase or str(resp.status_code)


def _length(resp: httpx.Response) -> int:
    """The declared Content-Length; 0 when absent or not a number (a hostile header)."""
    value = resp.headers.get("Content-Length", "")
    return int(value) if value.isdigit() else 0


def read_capped(resp: httpx.Response, limit: int, what: str, *, truncate: bool = False) -> bytes:
    """A streamed response's body, never more than `limit` bytes of it held: a larger declared
    Content-Length is refused before reading, and a body that goes on (chunked, or longer than
    declared) is cut at the limit. Raw bytes (no decompression: a small gzip can hold
    gigabytes). Too large: a RegistryError naming `what`, or with `truncate` the first bytes.
    The response is closed; `resp.content` holds the bytes."""
    try:
        declared = resp.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > limit and not truncate:
            raise RegistryError(f"{what} is larger than {limit} bytes (it declares {declared})")
        parts, have = [], 0
        for chunk in resp.iter_raw():
            parts.append(chunk)
            have += len(chunk)
            if have > limit:
                if truncate:
                    break
                raise RegistryError(f"{what} is larger than {limit} bytes (more was sent)")
        data = b"".join(parts)[:limit] if truncate else b"".join(parts)
    except httpx.HTTPError as e:
        raise deadline.expired_error(what) or RegistryError(
            f"{what}: the connection failed while reading ({describe_exception(e)})"
        ) from e
    finally:
        resp.close()
    resp._content = data  # read: `.content` answers without reading the stream again
    return data


class RegistryClient:
    def __init__(
        self,
        registry: str,
        *,
        insecure: bool = False,
        credentials: Credentials | None = None,
        lookup: bool = True,
        retries: int = 5,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        timeout_s: float = 60.0,
        env: Mapping[str, str] | None = None,
    ):
        self.registry = registry
        self.insecure = insecure
        self._credentials = credentials
        self._lookup, self._env = lookup, env
        self.retries, self.backoff_s, self.max_backoff_s = retries, backoff_s, max_backoff_s
        self._http = httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 15.0)),
            follow_redirects=True,
            max_redirects=MAX_REDIRECTS,
            verify=not insecure,
            # Bodies are read raw and capped: a compressed one would be refused, not inflated.
            headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"},
        )
        deadline_net.install(self._http)  # every socket wait ends by the command's deadline
        self._base: str | None = None
        self._auth: dict[str, str] = {}  # scope -> Authorization header value
        self._lock = threading.Lock()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport -------------------------------------------------------------------------

    def _base_url(self) -> str:
        if self._base is None:
            if is_loopback_registry(self.registry):
                self._base = f"http://{self.registry}"
            elif not self.insecure:
                self._base = f"https://{self.registry}"
            else:
                # skopeo's --tls-verify=false: HTTPS without verification, else plain HTTP.
                try:
                    with self._http.stream("GET", f"https://{self.registry}/v2/"):
                        pass  # the answer does not matter, only that TLS worked
                    self._base = f"https://{self.registry}"
                except (httpx.TransportError, httpx.TooManyRedirects):
                    self._base = f"http://{self.registry}"
        return self._base

    def _creds(self, repository: str) -> Credentials | None:
        if self._credentials is None and self._lookup:
            return lookup_credentials(self.registry, repository, self._env)
        return self._credentials

    def _sleep(self, attempt: int, resp: httpx.Response | None) -> None:
        delay = min(self.max_backoff_s, self.backoff_s * (2**attempt))
        if resp is not None and resp.headers.get("Retry-After", "").isdigit():
            delay = min(self.max_backoff_s * 4, float(resp.headers["Retry-After"]))
        pause = delay * (0.75 + random.random() / 2)  # jitter: do not retry in lockstep
        time.sleep(deadline.cap(pause) or pause)  # the next try checks the deadline

    def request(
        self,
        method: str,
        path_or_url: str,
        *,
        scope: str,
        headers: Mapping[str, str] | None = None,
        content: bytes | None = None,
        stream: bool = False,
        ok: tuple[int, ...] = (200,),
        max_bytes: int = untrusted_json.MAX_MANIFEST_BYTES,
        what: str = "",
    ) -> httpx.Response:
        """Send with auth and retries. `scope` is the token scope, e.g. `repository:a/b:pull`.
        Returns a response whose status is in `ok`; raises RegistryError otherwise. Unless
        `stream`, its body is read, at most `max_bytes` of it (`what` names it when larger)."""
        url = path_or_url if "://" in path_or_url else self._base_url() + path_or_url
        label = f"{self.registry}: {what or f'{method} {httpx.URL(url).path}'}"
        with deadline.waiting(label):
            return self._request(method, url, label, scope, headers, content, stream, ok, max_bytes)

    def _request(
        self,
        method: str,
        url: str,
        label: str,
        scope: str,
        headers: Mapping[str, str] | None,
        content: bytes | None,
        stream: bool,
        ok: tuple[int, ...],
        max_bytes: int,
    ) -> httpx.Response:
        authed_once = False
        attempt = 0
        last: str = ""
        while True:
            deadline.check(label)
            hdrs = dict(headers or {})
            with self._lock:
                auth = self._auth.get(scope) or self._auth.get("*")
            if auth:
                hdrs["Authorization"] = auth
            resp: httpx.Response | None = None
            try:
                req = self._http.build_request(method, url, headers=hdrs, content=content)
                resp = self._http.send(req, stream=True)  # every body is read capped, below
            except httpx.TransportError as e:
                last = self._unanswered(e, label)
            except httpx.TooManyRedirects as e:
                raise RegistryError(
                    f"{self.registry}: {method} {httpx.URL(url).path} was redirected more than "
                    f"{MAX_REDIRECTS} times (a redirect loop?)",
                    hint="the registry is misconfigured or hostile; ask its operator",
                ) from e
            else:
                if resp.status_code == 401 and not authed_once:
                    authed_once = True
                    challenge = parse_challenge(resp.headers.get("WWW-Authenticate", ""))
                    resp.close()
                    self._authenticate(challenge, scope)
                    continue
                if resp.status_code in ok:
                    if not stream:
                        read_capped(resp, max_bytes, label)
                    return resp
                if resp.status_code not in RETRY_STATUSES:
                    read_capped(resp, MAX_ERROR_BYTES, f"{self.registry}: an error answer", truncate=True)
                    raise self._status_error(method, url, resp)
                last = f"registry {self.registry} answered {resp.status_code} {resp.reason_phrase}".strip()
                resp.close()
            if attempt >= self.retries:
                raise RegistryError(
                    f"{last} ({method} {httpx.URL(url).path}, {attempt + 1} tries)",
                    hint="the registry may be down or overloaded; try again later",
                )
            self._sleep(attempt, resp)
            attempt += 1

    def _unanswered(self, err: httpx.TransportError, label: str) -> str:
        """Why the registry did not answer, in words naming it, for another try; raises when no
        try can help: the deadline passed, or the name resolves to nothing (exit 3)."""
        if (late := deadline.expired_error(label)) is not None:
            raise late from err
        if no_such_host(err):
            raise NoSuchHost(
                f"{self.registry}: no such host", hint="check the registry's name in the reference"
            ) from err
        words = describe_exception(err)
        if words == "connection refused":
            return f"registry {self.registry} refused the connection"
        return f"registry {self.registry}: {words}"

    def _status_error(self, method: str, url: str, resp: httpx.Response) -> RegistryError:
        path = httpx.URL(url).path
        text = _error_text(resp)
        if resp.status_code == 401:
            return AuthenticationError(
                f"{self.registry}: authentication failed for {path} (401: {text})",
                hint=f"log in with `docker login {self.registry}` or set REGISTRY_AUTH_FILE to an auth.json",
            )
        if resp.status_code == 403:
            return AuthenticationError(f"{self.registry}: access to {path} denied (403: {text})")
        if resp.status_code == 404:
            return NotFound(f"{self.registry}: {path} not found (404: {text})")
        return RegistryError(f"{self.registry}: {method} {path} answered {resp.status_code} ({text})")

    def _authenticate(self, challenge: Challenge | None, scope: str) -> None:
        repository = scope.split(":")[1] if scope.count(":") >= 2 else None
        creds = self._creds(repository or "")
        if challenge is None or challenge.scheme == "basic":
            if creds is None or (creds.identity_token and not creds.password):
                raise AuthenticationError(
                    f"{self.registry}: the registry requires authentication (401) and no credentials were found",
                    hint=f"log in with `docker login {self.registry}`, or set REGISTRY_AUTH_FILE to an auth.json",
                )
            value = "Basic " + base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
            with self._lock:
                self._auth["*"] = value
            return
        if challenge.scheme != "bearer" or "realm" not in challenge.params:
            raise AuthenticationError(
                f"{self.registry}: unsupported authentication scheme {challenge.scheme!r}"
            )
        token = self._fetch_token(challenge, scope, creds)
        with self._lock:
            self._auth[scope] = f"Bearer {token}"

    def _fetch_token(self, challenge: Challenge, scope: str, creds: Credentials | None) -> str:
        realm = challenge.params["realm"]
        service = challenge.params.get("service")
        scopes = [scope] if scope != "*" else []
        if challenge.params.get("scope") and challenge.params["scope"] not in scopes:
            scopes.append(challenge.params["scope"])
        try:
            if creds and creds.identity_token:
                form = {
                    "grant_type": "refresh_token",
                    "refresh_token": creds.identity_token,
                    "client_id": "imagegate",
                }
                if service:
                    form["service"] = service
                if scopes:
                    form["scope"] = " ".join(scopes)
                req = self._http.build_request("POST", realm, data=form)
                auth = None
            else:
                query: list[tuple[str, str]] = [("service", service)] if service else []
                query += [("scope", s) for s in scopes]
                auth = httpx.BasicAuth(creds.username, creds.password) if creds else None
                sep = "&" if "?" in realm else "?"
                req = self._http.build_request("GET", realm + (sep + urlencode(query) if query else ""))
            resp = self._http.send(req, auth=auth, stream=True)
        except httpx.TooManyRedirects as e:
            raise RegistryError(
                f"{self.registry}: the token server {realm} redirected more than {MAX_REDIRECTS} times"
            ) from e
        except (httpx.HTTPError, httpx.InvalidURL) as e:
            what = f"{self.registry}: the token server {realm}"
            raise deadline.expired_error(what) or RegistryError(
                f"{what} could not be reached: {describe_exception(e)}"
            ) from e
        read_capped(
            resp,
            MAX_TOKEN_BYTES,
            f"{self.registry}: the token server's answer",
            truncate=resp.status_code != 200,
        )
        if resp.status_code in (401, 403):
            raise AuthenticationError(
                f"{self.registry}: the token server refused {'the credentials' if creds else 'anonymous access'} "
                f"({resp.status_code})",
                hint=f"log in with `docker login {self.registry}` or check REGISTRY_AUTH_FILE",
            )
        if resp.status_code != 200:
            raise RegistryError(f"{self.registry}: the token server answered {resp.status_code}")
        try:
            body = obj(untrusted_json.loads(resp.content))  # JSON but not an object: no token
            token = body.get("token") or body.get("access_token")
        except ValueError:  # not JSON
            token = None
        if not isinstance(token, str) or not token:
            raise RegistryError(f"{self.registry}: the token server answered without a token")
        return token

    # -- pull ------------------------------------------------------------------------------

    @staticmethod
    def _scope(repository: str, actions: str = "pull") -> str:
        return f"repository:{repository}:{actions}"

    def get_manifest(
        self, repository: str, ref: str, accept: tuple[str, ...] = ACCEPT_ALL
    ) -> FetchedManifest:
        resp = self.request(
            "GET",
            f"/v2/{repository}/manifests/{ref}",
            scope=self._scope(repository),
            headers={"Accept": ", ".join(accept)},
            what=f"the manifest served for {repository}:{ref}"
            if not is_digest(ref)
            else f"the manifest {repository}@{ref}",
        )
        raw = resp.content  # read_capped: at most MAX_MANIFEST_BYTES
        media_type = resp.headers.get("Content-Type", "").split(";")[0].strip()
        algorithm = ref.partition(":")[0] if is_digest(ref) else "sha256"
        digest = digest_of(raw, algorithm)
        if is_digest(ref) and digest != ref:
            raise RegistryError(
                f"{self.registry}/{repository}: the manifest served for {ref} hashes to {digest}"
            )
        return FetchedManifest(raw, media_type, digest)

    def head_manifest(self, repository: str, ref: str) -> tuple[str, str, int] | None:
        """(digest, media type, size) of a manifest, or None if the registry has none."""
        try:
            resp = self.request(
                "HEAD",
                f"/v2/{repository}/manifests/{ref}",
                scope=self._scope(repository),
                headers={"Accept": ", ".join(ACCEPT_ALL)},
            )
        except NotFound:
            return None
        return (
            resp.headers.get("Docker-Content-Digest", ""),
            resp.headers.get("Content-Type", ""),
            _length(resp),
        )

    def blob_size(self, repository: str, digest: str) -> int | None:
        try:
            resp = self.request("HEAD", f"/v2/{repository}/blobs/{digest}", scope=self._scope(repository))
        except NotFound:
            return None
        return _length(resp)

    @contextmanager
    def open_blob(self, repository: str, digest: str) -> Iterator[BlobStream]:
        stream = BlobStream(self, repository, digest)
        try:
            stream.open(0)
            yield stream
        finally:
            stream.close()

    def list_tags(self, repository: str, *, limit: int = MAX_LISTED) -> list[str]:
        """Every tag of `repository`, page by page (`Link: <…>; rel="next"`), at most `limit` names
        and MAX_LIST_PAGES pages, each page's body bounded: a listing past either is refused, named."""
        return self._listing(f"/v2/{repository}/tags/list", "tags", self._scope(repository), limit)

    def catalog(self, *, limit: int = MAX_LISTED) -> list[str]:
        """Every repository the registry lists (`/v2/_catalog`, often disabled or limited to what
        the credentials may pull: a 401, 403 or 404 raises, to be named to the user), bounded as
        list_tags is."""
        return self._listing("/v2/_catalog", "repositories", "registry:catalog:*", limit)

    def _listing(self, first: str, key: str, scope: str, limit: int) -> list[str]:
        names: list[str] = []
        url: str | None = f"{first}?n={min(limit, LIST_PAGE)}"
        for _page in range(MAX_LIST_PAGES):
            if url is None:
                return names
            resp = self.request(
                "GET", url, scope=scope, max_bytes=MAX_LIST_PAGE_BYTES, what=f"the {key} list"
            )
            try:
                body = untrusted_json.loads(resp.content, max_bytes=MAX_LIST_PAGE_BYTES)
            except untrusted_json.UntrustedJSONError as e:
                raise RegistryError(f"{self.registry}: the {key} list ({first}) is {e}") from e
            page = (body.get(key) if isinstance(body, dict) else None) or []
            if not isinstance(page, list) or not all(isinstance(t, str) and len(t) <= 256 for t in page):
                raise RegistryError(
                    f"{self.registry}: the {key} list's `{key}` ({first}) is not a list of names"
                )
            names += page
            if len(names) > limit:
                raise RegistryError(
                    f"{self.registry}: {first} lists more than {limit} {key}; not read further",
                    hint="name the tags (or repositories) to audit in the inventory",
                )
            nxt = resp.links.get("next", {}).get("url")
            url = urljoin(str(resp.url), nxt) if nxt else None
        if url is not None:
            raise RegistryError(
                f"{self.registry}: {first} has more than {MAX_LIST_PAGES} pages; not read further",
                hint="name the tags (or repositories) to audit in the inventory",
            )
        return names

    # -- push ------------------------------------------------------------------------------

    def upload_blob(self, repository: str, data: bytes, digest: str | None = None) -> str:
        """Monolithic upload (POST, then PUT with the bytes); skipped when the blob exists."""
        digest = digest or digest_of(data)
        if digest_of(data, digest.partition(":")[0]) != digest:
            raise UsageError(f"upload_blob: the data does not hash to {digest}")
        if self.blob_size(repository, digest) is not None:
            return digest
        scope = self._scope(repository, "pull,push")
        resp = self.request("POST", f"/v2/{repository}/blobs/uploads/", scope=scope, ok=(202,))
        location = resp.headers.get("Location")
        if not location:
            raise RegistryError(f"{self.registry}: the upload answer has no Location")
        url = urljoin(str(resp.url), location)
        url += ("&" if "?" in url else "?") + urlencode({"digest": digest})
        self.request(
            "PUT",
            url,
            scope=scope,
            content=data,
            headers={"Content-Type": "application/octet-stream"},
            ok=(201,),
        )
        return digest

    def put_manifest(self, repository: str, ref: str, raw: bytes, media_type: str) -> str:
        resp = self._put_manifest(repository, ref, raw, media_type)
        return resp.headers.get("Docker-Content-Digest") or digest_of(raw)

    def _put_manifest(self, repository: str, ref: str, raw: bytes, media_type: str) -> httpx.Response:
        return self.request(
            "PUT",
            f"/v2/{repository}/manifests/{ref}",
            scope=self._scope(repository, "pull,push"),
            content=raw,
            headers={"Content-Type": media_type},
            ok=(201,),
        )

    def put_referrer(self, repository: str, raw: bytes, media_type: str) -> tuple[str, bool]:
        """Push a manifest that has a `subject`, by its digest (OCI distribution 1.1); also
        whether the registry said it indexed the subject (the `OCI-Subject` header): if not, the
        caller keeps the tag-schema fallback index itself."""
        digest = digest_of(raw)
        resp = self._put_manifest(repository, digest, raw, media_type)
        return digest, bool(resp.headers.get("OCI-Subject"))

    def delete_manifest(self, repository: str, digest: str) -> bool:
        """Delete the manifest `digest` names; False where the registry refuses deletion (405
        UNSUPPORTED: distribution's default, `storage.delete.enabled` off). One already gone is
        deleted."""
        try:
            resp = self.request(
                "DELETE",
                f"/v2/{repository}/manifests/{digest}",
                scope=self._scope(repository, "delete"),
                ok=(202, 405),
                what=f"deleting the manifest {repository}@{digest}",
            )
        except NotFound:
            return True
        return resp.status_code == 202

    def referrers(self, repository: str, digest: str, url: str | None = None) -> ReferrersPage | None:
        """A page of the referrers API's index for `digest` (bounded like any manifest): the first,
        or the one at `url` (a page's `next`). None where the registry does not serve the API (404,
        as the OCI distribution spec says, or a catch-all page) at the first page; a later page
        that is not an index is an error, since the listing would be partial."""
        first = url is None
        target = url or f"{self._base_url()}/v2/{repository}/referrers/{digest}"
        what = f"the referrers of {repository}@{digest}" + ("" if first else f" (page {target})")
        try:
            resp = self.request(
                "GET", target, scope=self._scope(repository), headers={"Accept": OCI_INDEX}, what=what
            )
        except NotFound:
            if first:
                return None
            raise RegistryError(f"{self.registry}: {what}: not found (404)") from None
        if resp.headers.get("Content-Type", "").split(";")[0].strip() != OCI_INDEX:
            if first:
                return None  # a catch-all page, not the API
            raise RegistryError(f"{self.registry}: {what} is no image index")
        return ReferrersPage(resp.content, str(httpx.URL(target)), self._next_page(resp, what))

    def _next_page(self, resp: httpx.Response, what: str) -> str | None:
        """The absolute URL of the page after `resp` (its `Link: <...>; rel="next"`), which must
        be on this registry, by the same scheme: a link elsewhere would send this client's
        credentials, and take the listing's rest from someone the registry only named."""
        link = resp.links.get("next", {}).get("url")
        if not link:
            return None
        nxt = httpx.URL(str(resp.url)).join(link)
        here = httpx.URL(self._base_url())
        if (nxt.scheme, nxt.host, nxt.port) != (here.scheme, here.host, here.port):
            raise RegistryError(
                f"{self.registry}: {what} links its next page to {nxt}, another host or scheme; not followed",
                hint="the registry is misconfigured or hostile; ask its operator",
            )
        return str(nxt)


@dataclass(frozen=True)
class ReferrersPage:
    """One page of a referrers listing (OCI distribution 1.1: a registry may page it as it pages
    tags, each page an image index, the next one named by a `Link` header)."""

    raw: bytes
    url: str  # the absolute URL it was asked at
    next: str | None  # the absolute URL of the next page, on the same registry; None: the last


class BlobStream:
    """A blob body read in chunks; a connection cut mid-way is resumed with a Range request.

    A body of known length on a connection that carries it as is (HTTP/1.1, no transfer coding,
    no TLS-in-TLS) is read from the socket directly once the HTTP parser's buffer is drained:
    one copy from the kernel instead of a trip through h11, httpcore and httpx per 64 KiB
    (measured on a 4.5 GB blob from a loopback registry: 1.1 CPU-s instead of 6.6)."""

    def __init__(self, client: RegistryClient, repository: str, digest: str):
        self.client, self.repository, self.digest = client, repository, digest
        self.offset = 0
        self.size: int | None = None
        self._resp: httpx.Response | None = None
        self._iter: Iterator[bytes] | None = None
        self._sock: socket.socket | None = None  # see _direct_socket
        self._direct = False  # reading from _sock
        self._length = self._taken = 0  # of this response's body
        self._recv_flags = 0
        self._buf = b""
        self._resumes = 0
        self._cut: Callable[[], None] | None = None  # unregisters the stop's cut

    def open(self, offset: int) -> None:
        headers = {"Accept-Encoding": "identity"}
        if offset:
            headers["Range"] = f"bytes={offset}-"
        try:
            resp = self.client.request(
                "GET",
                f"/v2/{self.repository}/blobs/{self.digest}",
                scope=f"repository:{self.repository}:pull",
                headers=headers,
                stream=True,
                ok=(200, 206),
            )
        except NotFound as e:
            raise BlobNotFound(f"{self.client.registry}/{self.repository}: no blob {self.digest}") from e
        # A 200 to a Range request: the registry ignored it; drop what we already have.
        skip = offset if offset and resp.status_code == 200 else 0
        if self.size is None and resp.status_code == 200 and resp.headers.get("Content-Length", "").isdigit():
            self.size = int(resp.headers["Content-Length"])
        # Chunks as they arrive (not re-assembled to a size): a cut loses nothing received.
        self._resp, self._iter, self._taken = resp, resp.iter_raw(), 0
        self._sock = self._direct_socket(resp)
        self._cut = _stop_cut(resp)
        while skip:
            chunk = self._next_chunk()
            if not chunk:
                break
            self._buf += chunk[skip:]
            self.offset += len(chunk[skip:])
            skip = max(0, skip - len(chunk))

    def _direct_socket(self, resp: httpx.Response) -> socket.socket | None:
        """The socket the body can be read from as is once httpx has handed over one chunk
        (that chunk holds whatever the parser read past the headers), or None: read through
        httpx. Such a connection is out of step with the parser and is closed with the
        response, never reused."""
        length = resp.headers.get("Content-Length", "")
        stream = resp.extensions.get("network_stream")
        if (
            resp.http_version != "HTTP/1.1"
            or not length.isdigit()
            or "Transfer-Encoding" in resp.headers
            or stream is None
        ):
            return None
        sock = stream.get_extra_info("socket")
        ssl_object = stream.get_extra_info("ssl_object")
        if not isinstance(sock, socket.socket):
            return None
        # TLS in TLS (through an HTTPS proxy) reports the outer socket, not this stream's.
        tls = sock._sslobj if isinstance(sock, ssl.SSLSocket) else None  # type: ignore[attr-defined]
        if ssl_object is not tls:
            return None
        self._length = int(length)
        return sock

    def _next_chunk(self) -> bytes:
        """The next chunk through httpx (b"" at the end); raises httpx.TransportError."""
        assert self._iter is not None
        chunk = next(self._iter, b"")
        self._taken += len(chunk)
        if self._sock is not None:
            self._direct = True  # the parser's buffer is empty now
            self._set_timeout(self._sock)  # httpcore set its own for its read
        return chunk

    def _recv(self, n: int) -> bytes:
        """Up to `n` bytes straight from the socket (b"" at the end of the body); raises
        httpx.ReadError or ReadTimeout when the connection fails or ends early."""
        assert self._sock is not None
        left = self._length - self._taken
        if left <= 0:
            return b""
        read_s, d = self.client._http.timeout.read, deadline.current()
        if d is not None and (read_s is None or d.remaining() < read_s):
            # The deadline is nearer than a read timeout: this recv ends by it. Otherwise the
            # timeout set once (_next_chunk) stands: no syscall per chunk on the 10 GB path.
            self._set_timeout(self._sock)
        try:
            data = self._sock.recv(min(n, left), self._recv_flags)
        except (TimeoutError, BlockingIOError) as e:  # BlockingIOError: SO_RCVTIMEO ran out
            raise httpx.ReadTimeout(f"no byte for {self.client._http.timeout.read} s") from e
        except OSError as e:
            raise httpx.ReadError(str(e)) from e
        if not data:
            raise httpx.ReadError(f"the connection closed with {left} bytes of the body unread")
        self._taken += len(data)
        return data

    def _set_timeout(self, sock: socket.socket) -> None:
        """The read timeout on the socket. A plain socket is made blocking with the timeout in
        the kernel (SO_RCVTIMEO), so that MSG_WAITALL fills whole chunks in one call (a socket
        with a Python timeout is non-blocking: each recv returns what has arrived, ~150 KiB on
        loopback, and every chunk costs a hand-off downstream). TLS sockets take no flags."""
        timeout = deadline.cap(self.client._http.timeout.read)
        self._recv_flags = 0
        if isinstance(sock, ssl.SSLSocket) or timeout is None or not hasattr(socket, "MSG_WAITALL"):
            sock.settimeout(timeout)
            return
        sock.settimeout(None)
        whole = int(timeout)
        sock.setsockopt(
            socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", whole, int((timeout - whole) * 1e6))
        )
        self._recv_flags = socket.MSG_WAITALL

    def read(self, n: int) -> bytes:
        # `offset` counts bytes received (returned or buffered): a resume asks for the rest.
        parts, have = [self._buf], len(self._buf)
        self._buf = b""
        while have < n and self._iter is not None:
            try:
                chunk = self._recv(n - have) if self._direct else self._next_chunk()
            except httpx.TransportError as e:
                late = deadline.expired_error(
                    f"{self.client.registry}/{self.repository}: the blob {self.digest}"
                )
                if late is not None:
                    raise late from e
                if self._resumes >= self.client.retries:
                    raise RegistryError(
                        f"{self.client.registry}/{self.repository}: reading {self.digest} failed "
                        f"{self._resumes + 1} times at byte {self.offset} ({describe_exception(e)})",
                        hint="the registry or the network drops connections; try again later",
                    ) from e
                self._resumes += 1
                self.close()
                self.client._sleep(self._resumes - 1, None)
                self.open(self.offset)  # may buffer bytes past the offset (Range ignored)
                parts.append(self._buf)
                have += len(self._buf)
                self._buf = b""
                continue
            if not chunk:
                self.close()
                break
            parts.append(chunk)
            have += len(chunk)
            self.offset += len(chunk)
            if self._direct:
                break  # a short read, as a socket gives it: no copy to join pieces
        data = b"".join(parts) if len(parts) > 1 else parts[0]
        if len(data) <= n:
            return data
        out, self._buf = data[:n], data[n:]
        return out

    def close(self) -> None:
        if self._cut is not None:
            self._cut()
        if self._resp is not None:
            self._resp.close()
        self._resp, self._iter, self._sock, self._direct, self._cut = None, None, None, False, None


def _stop_cut(resp: httpx.Response) -> Callable[[], None] | None:
    """While the blob is read: a stop (a signal, the hard deadline) shuts its socket down, so
    that a read blocked on a registry that sends nothing ends at once (interrupts.on_stop)."""
    stream = resp.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if not isinstance(sock, socket.socket):
        return None
    return interrupts.on_stop(functools.partial(interrupts.shutdown_socket, sock))
