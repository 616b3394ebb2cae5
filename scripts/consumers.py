#!/usr/bin/env python3
"""The real admission consumers run against what imagegate publishes: cosign, Kyverno's CLI and
policy-controller's tester, built from source at pinned versions, each judging the verdict
sequences of tests/policies/test_sequences.py on a real registry on 127.0.0.1, beside the
project's own evaluator of each controller's rule (tests/policies/several.py). The script writes
a dated record: benchmarks/records/YYYY-MM-DD-consumers.json and .md (the commit, each tool's
version and build, every case, step and each tool's answer, and where they disagree).

Each tool is the `tool` of a small Go module under tests/consumers/TOOL (go.mod pins its
version, in one place: the require line; Kyverno's and policy-controller's replace lines are
theirs, which is why `go install module@version` cannot build them). A build goes into
${XDG_CACHE_HOME:-~/.cache}/imagegate/consumers/TOOL-VERSION/ (bin/ and build.json), so a second
run, from any clone on the machine, builds nothing; every tool shares one Go module and build
cache (consumers/go/), since their modules overlap. act (nektos/act, GitHub Actions' runner,
which tests/install runs the Action with) and HashiCorp Vault's transit engine (in a harness
of its wrapper module's own, which tests/attest/test_transit.py signs with) are built the same way, and
so is the tests' own Sigstore (Fulcio, Rekor v2, the timestamp authority, and TesseraCT as its CT log:
tests/attest/sigstore_local.py); Kyverno's build also writes its
admission controller (cmd/kyverno), which tests/kube/kyverno.py runs as a webhook, and
policy-controller's build its webhook (cmd/webhook), which tests/kube/policy_controller.py runs.

Usage: .venv/bin/python scripts/consumers.py [build | run] [--kyverno-policy FILE ...]
  build             build (or find) the three tools; print each one's path, build time and size;
                    after a build, the shared Go caches over 10 GB lose their build cache
  --tool NAME       with build: only this tool (cosign, kyverno, policy-controller, act, kube, kwok,
                    kubelet, cni, vault, sigstore, tesseract; repeatable)
  run               build (and the tests' own Sigstore), then run every case, and the keyless one,
                    and write the record (the default)
  --kyverno-policy  a Kyverno policy to apply, instead of the shipped
                    data/policies/kyverno-clusterpolicy.yaml
                    (repeat for several; each is judged on its own); its placeholders are those
                    of the shipped one: the public key text and the image pattern registry.example/
Needs: Go (any release that can fetch the pinned toolchain), the network for a first build, a
Docker engine, docker-registry, node (the CUE engine of the project's evaluator).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import datetime as dt
import hashlib
import json
import os
import re
import resource
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from imagegate.attest import attach, keys, referrers  # noqa: E402
from imagegate.attest.vsa import VSA_PREDICATE_TYPE  # noqa: E402
from tests.attest.conftest import one_file_image, start_registry  # noqa: E402
from tests.policies import several  # noqa: E402
from tests.policies.admission import (  # noqa: E402
    KYVERNO,
    PLACEHOLDER,
    POLICY_CONTROLLER,
    attestation_cue,
    fill_key,
    not_before,
)
from tests.policies.conftest import Keys, make_keys, make_runs  # noqa: E402
from tests.policies.sequences import addressed, attach_as, push  # noqa: E402
from tests.policies.test_pod_shapes import CPU_SHAPES, GPU_ROUTES, IMAGE  # noqa: E402

RECORDS = ROOT / "benchmarks" / "records"
# One toolchain for every build, whatever Go the machine has: the builds do not change with it.
TOOLCHAIN = "go1.27.3"
# The toolchain's own zip on the Go module proxy (the sha256 of the file `go` fetched and checked
# against sum.golang.org), for a machine with no Go at all: a fresh CI machine.
TOOLCHAIN_ZIP_SHA256 = {"linux-amd64": "af4c06478303fdd1bfb335fab86c7ccb9b12e529044a946a16a1c4bcc779f8d7"}
EXAMPLE_REGISTRY = "registry.example/"


@dataclass(frozen=True)
class Tool:
    name: str
    module: str  # the Go module the tool comes from, whose version tests/consumers/NAME/go.mod pins
    exe: str  # the binary `go install tool` writes (the first, where it writes several)
    # e.g. the version a wrapper module's build cannot know by itself; {version} is the pinned one,
    # {number} the same without its leading v
    ldflags: str = ""
    others: tuple[str, ...] = ()  # the other binaries the build writes that a caller runs
    # What `go install` builds: the go.mod's tool lines, or "." for the wrapper module's own main
    # package (a harness around the pinned module's packages), whose .go files join the stamp
    package: str = "tool"

    @property
    def folder(self) -> Path:
        return ROOT / "tests" / "consumers" / self.name

    @property
    def version(self) -> str:
        found = re.search(rf"^\s*(?:require\s+)?{re.escape(self.module)} (v\S+)", self._gomod(), re.M)
        if found is None:
            raise SystemExit(
                f"consumers: {self.folder / 'go.mod'} requires no {self.module}; add its require line"
            )
        return found.group(1)

    def _gomod(self) -> str:
        return (self.folder / "go.mod").read_text()

    @property
    def flags(self) -> str:
        # {number}: the version without its v, for a tool whose own build gives it so
        return self.ldflags.replace("{version}", self.version).replace(
            "{number}", self.version.removeprefix("v")
        )

    @property
    def cache(self) -> Path:
        return CACHE / f"{self.name}-{self.version}"

    def stamp(self) -> str:
        """What the build depends on: the module's go.mod and go.sum, the toolchain, the flags."""
        h = hashlib.sha256((TOOLCHAIN + self.flags).encode())
        for name in ("go.mod", "go.sum"):
            h.update((self.folder / name).read_bytes())
        if self.package != "tool":
            for source in sorted((self.folder / self.package).glob("*.go")):
                h.update(source.name.encode() + b"\0" + source.read_bytes())
        return h.hexdigest()


CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "imagegate" / "consumers"
# One module and build cache for every tool: their dependencies overlap (a second tool's build
# reuses most of the first's), and the disk holds one copy.
GO_CACHE = CACHE / "go"

TOOLS = (
    Tool("cosign", "github.com/sigstore/cosign/v3", "cosign"),
    # The CLI, and the admission controller (cmd/kyverno) the cluster tests run as a webhook
    # (tests/kube/kyverno.py); the flags are Kyverno's own Makefile's LD_FLAGS (v1.19.1): without
    # the version both report "(devel)", this wrapper module's, in `version` and the metrics.
    Tool(
        "kyverno",
        "github.com/kyverno/kyverno",
        "kubectl-kyverno",
        ldflags="-s -w -X github.com/kyverno/kyverno/pkg/version.BuildVersion={version}",
        others=("kyverno",),
    ),
    # The tester, and the webhook (cmd/webhook) the cluster tests run as the API server's admission
    # webhook (tests/kube/policy_controller.py); the version is given as policy-controller's own
    # Makefile gives it (LDFLAGS, v0.13.1): a wrapper module's build is "(devel)" to Go, which
    # sigs.k8s.io/release-utils' version/version.go (v0.11.1) then reports as "devel".
    Tool(
        "policy-controller",
        "github.com/sigstore/policy-controller",
        "tester",
        ldflags="-buildid= -X sigs.k8s.io/release-utils/version.gitVersion={version}",
        others=("webhook",),
    ),
)
# Not a consumer: the runner the GitHub Action is tested with (tests/install/test_ci_steps.py).
ACT = Tool("act", "github.com/nektos/act", "act")
# Not a consumer: the control plane the cluster tests start (tests/kube/apiserver.py): etcd
# (`server`), kube-apiserver, kube-controller-manager, kube-scheduler and kubectl. A build of a
# wrapper module reports version v0.0.0, which Kyverno and policy-controller compare against, so
# the version is given to the linker (../shared facts: component-base/version).
KUBE_VERSION = "v1.33.13"
KUBE = Tool(
    "kube",
    "k8s.io/kubernetes",
    "kube-apiserver",
    ldflags="-s -w"
    + "".join(
        f" -X k8s.io/component-base/version.{k}={v}"
        for k, v in (("gitVersion", KUBE_VERSION), ("gitMajor", "1"), ("gitMinor", "33"))
    ),
)
# Not a consumer: the fake nodes of the cluster tests (tests/kube/kwok.py), GPU nodes with no
# kubelet behind them; its version is the one its Stage files (tests/kube/stages) come from.
KWOK = Tool("kwok", "sigs.k8s.io/kwok", "kwok")
# Not a consumer: the real node of the cluster tests (tests/kube/kubelet.py), a kubelet of the
# control plane's release (the same version given to the linker) and the CNI plugins its
# containerd networks each Pod with (bridge, host-local, loopback).
KUBELET = Tool("kubelet", "k8s.io/kubernetes", "kubelet", ldflags=KUBE.ldflags)
CNI = Tool("cni", "github.com/containernetworking/plugins", "bridge", others=("host-local", "loopback"))
# Not a consumer: the KMS whose transit engine the `hashivault://` signer's tests sign with
# (tests/attest/test_transit.py). Vault's core does not build from the served modules
# (tests/consumers/vault/go.mod says why), so what is built is the wrapper module's own harness:
# Vault's real transit engine behind an HTTP front, with stand-ins for the token check, the ACL,
# sys/capabilities-self and sys/health (main.go beside the go.mod).
VAULT = Tool("vault", "github.com/hashicorp/vault", "vault-transit", package=".")
# Not a consumer: the Sigstore the keyless signer's tests sign through (tests/attest/sigstore_local.py):
# Fulcio (`fulcio`, its ephemeral CA), Rekor v2 on POSIX storage (rekor-tiles' cmd/rekor-server/posix,
# written as `posix`) and the timestamp authority (`timestamp-server`).
SIGSTORE = Tool("sigstore", "github.com/sigstore/fulcio", "fulcio", others=("posix", "timestamp-server"))
# Not a consumer: the CT log Fulcio submits its precertificates to, a static-CT log on POSIX storage.
# A module of its own: its command is also written as `posix`, which would overwrite Rekor's in one
# bin/, and it keeps the libraries its release pins (Tessera v1.0.1; Rekor's is v1.0.2).
TESSERACT = Tool("tesseract", "github.com/transparency-dev/tesseract", "posix")
# Built only when named with --tool.
EXTRA = (ACT, KUBE, KWOK, KUBELET, CNI, VAULT, SIGSTORE, TESSERACT)


def _size(path: Path) -> int:
    """The bytes of the plain files under `path`. The cache is shared: another build may remove a
    file (a download's temporary one) or a folder while this walks it, which counts as gone."""
    total = 0
    for folder, _, files in os.walk(path):  # os.walk skips a folder that vanished
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(os.path.join(folder, name))
                total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total


def cached(tool: Tool) -> dict[str, Any] | None:
    """The cached build's record, where the cache holds the tool built from this go.mod and go.sum
    by this toolchain with these flags; else None."""
    info_file = tool.cache / "build.json"
    if not (info_file.exists() and all((tool.cache / "bin" / n).exists() for n in (tool.exe, *tool.others))):
        return None
    info: dict[str, Any] = json.loads(info_file.read_text())
    return info if info.get("stamp") == tool.stamp() else None


def named(name: str) -> Tool:
    (tool,) = [t for t in (*TOOLS, *EXTRA) if t.name == name]
    return tool


def build(tool: Tool) -> dict[str, Any]:
    """The tool's binary, built unless the cache holds one of the same stamp; what the build
    took (wall seconds, its cache's size) is kept beside it."""
    info = cached(tool)
    if info is not None:
        return {**info, "cached": True}
    go = _go()
    env = _go_env(tool)
    # A build cache left by an earlier build (of another toolchain or version) makes this one
    # cheaper than a bare one: its size before is said in the record.
    before = _size(GO_CACHE / "build") if (GO_CACHE / "build").is_dir() else 0
    load = os.getloadavg()[0]
    start, cpu = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    flags = ["-ldflags", tool.flags] if tool.flags else []
    p = subprocess.run(
        [go, "install", *flags, tool.package], cwd=tool.folder, env=env, capture_output=True, text=True
    )
    seconds = round(time.monotonic() - start, 1)
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"consumers: building {tool.name} {tool.version} failed:\n{p.stderr[-4000:]}")
    info = {
        "tool": tool.name,
        "version": tool.version,
        "toolchain": TOOLCHAIN,
        "stamp": tool.stamp(),
        "seconds": seconds,
        "cpu_seconds": round(used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime, 1),
        "gocache_bytes_before": before,
        "binary_bytes": _size(tool.cache / "bin"),
        "cache_bytes": _size(GO_CACHE),
        "cores": os.cpu_count(),
        "load": load,
        "built": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    (tool.cache / "build.json").write_text(json.dumps(info, indent=1) + "\n")
    return {**info, "cached": False}


def _go_env(tool: Tool) -> dict[str, str]:
    return {
        **os.environ,
        "GOBIN": str(tool.cache / "bin"),
        # the checksum database's cache too, which go keeps under GOPATH (else ~/go)
        "GOPATH": str(GO_CACHE / "path"),
        "GOMODCACHE": str(GO_CACHE / "mod"),
        "GOCACHE": str(GO_CACHE / "build"),
        "GOTOOLCHAIN": TOOLCHAIN,
        # The caller's own GOFLAGS kept after these: -p=1 lets a build yield on a shared machine.
        "GOFLAGS": " ".join(("-buildvcs=false -mod=readonly", os.environ.get("GOFLAGS", ""))).strip(),
    }


def source(tool: Tool) -> Path:
    """The source of the tool's module at its pinned version, in the shared module cache
    (downloaded again, checked against the module's go.sum, if the cache lost it)."""
    p = subprocess.run(
        [_go(), "mod", "download", "-json", tool.module],
        cwd=tool.folder, env=_go_env(tool), capture_output=True, text=True,
    )  # fmt: skip
    if p.returncode != 0:
        raise SystemExit(f"consumers: no source of {tool.module} {tool.version}:\n{p.stdout}{p.stderr}")
    return Path(json.loads(p.stdout)["Dir"])


def _go() -> str:
    """`go` on PATH, else the pinned toolchain itself from the Go module proxy (its zip checked
    against TOOLCHAIN_ZIP_SHA256), unpacked beside the shared caches: a fresh machine needs no Go."""
    found = shutil.which("go")
    if found:
        return found
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    platform = f"{sys.platform}-{arch}"
    version = f"v0.0.1-{TOOLCHAIN}.{platform}"
    root = GO_CACHE / "toolchain" / version
    go = root / "bin" / "go"
    if go.exists():
        return str(go)
    if platform not in TOOLCHAIN_ZIP_SHA256:
        raise SystemExit(f"consumers: no `go` on PATH, and no pinned {TOOLCHAIN} for {platform}; install Go")
    import io
    import zipfile

    import httpx

    proxy = os.environ.get("GOPROXY", "https://proxy.golang.org").split(",")[0]
    data = httpx.get(f"{proxy}/golang.org/toolchain/@v/{version}.zip", timeout=600, follow_redirects=True)
    data.raise_for_status()
    got = hashlib.sha256(data.content).hexdigest()
    if got != TOOLCHAIN_ZIP_SHA256[platform]:
        raise SystemExit(
            f"consumers: {TOOLCHAIN} from {proxy} has sha256 {got}, not the pinned one; not used"
        )
    prefix = f"golang.org/toolchain@{version}/"
    with zipfile.ZipFile(io.BytesIO(data.content)) as z:
        for info in z.infolist():
            if info.is_dir() or not info.filename.startswith(prefix):
                continue
            out = root / info.filename.removeprefix(prefix)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(z.read(info))
            # Module zips keep no file modes: the commands are made executable, as `go` does.
            tool = out.parent.name == "bin" or out.parent.parent.name == "tool"
            out.chmod(0o755 if tool else 0o644)
    return str(go)


# What the shared Go caches may hold: the modules (the tests read CRDs and manifests from them)
# and, under this, the compiled packages that make the next build cheap.
GO_CACHE_BUDGET = 10 * 10**9


def trim(budget: int = GO_CACHE_BUDGET) -> None:
    """Over the budget, the build cache goes (`go clean -cache`): the binaries are kept, so only a
    build of a new version pays for it. Run after this process's own builds, never beside one."""
    size = _size(GO_CACHE) if GO_CACHE.is_dir() else 0
    if size <= budget:
        return
    env = {
        **os.environ,
        "GOMODCACHE": str(GO_CACHE / "mod"),
        "GOCACHE": str(GO_CACHE / "build"),
        "GOTOOLCHAIN": "local",  # any `go` empties a build cache: no toolchain fetched for it
    }
    subprocess.run([_go(), "clean", "-cache"], env=env, check=True, capture_output=True)
    print(
        f"consumers: the Go caches held {size / 1e9:.1f} GB, over {budget / 1e9:.0f} GB: build cache "
        f"trimmed, {_size(GO_CACHE) / 1e9:.1f} GB left (the binaries are kept)",
        flush=True,
    )


def exe(tool: Tool, name: str | None = None) -> str:
    """The tool's binary, or another of those its build writes (`name`, one of tool.others)."""
    if name is not None and name not in tool.others:
        raise ValueError(f"{tool.name}'s build writes no {name} that is known here")
    return str(tool.cache / "bin" / (name or tool.exe))


# --- the pods -------------------------------------------------------------------------------


def pod_of(shape: str, image: str) -> dict[str, Any]:
    """A Pod shape of test_pod_shapes.py, every container running `image`."""
    shapes = {
        **{f"GPU: {k}": v for k, v in GPU_ROUTES.items()},
        **{f"CPU: {k}": v for k, v in CPU_SHAPES.items()},
    }
    text = json.dumps(copy.deepcopy(shapes[shape]))
    return json.loads(text.replace(json.dumps(IMAGE), json.dumps(image)))  # type: ignore[no-any-return]


CPU_POD = "CPU: plain"
GPU_PODS = ("GPU: limits", "GPU: init container", "GPU: MIG slice", "GPU: runtime class")


# --- the tools' answers ---------------------------------------------------------------------


@dataclass
class Answer:
    admitted: bool | None  # None: the tool did not judge (it broke)
    said: str

    def as_dict(self) -> dict[str, Any]:
        return {"admitted": self.admitted, "said": self.said}


def _run(
    argv: list[str], timeout: float = 180, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "NO_COLOR": "1", **(env or {})},
    )


def _tail(text: str, n: int = 1200) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", text).strip()
    return text if len(text) <= n else "…" + text[-n:]


@dataclass
class Setting:
    """What every judgement shares: the registry, the key, the rendered policies."""

    registry: str
    keys: Keys
    work: Path
    kyverno_policies: list[Path]
    n: int = 0

    def fresh(self, name: str, create: bool = True) -> Path:
        """A new folder under the work folder (`create`: made here; else its parent only)."""
        self.n += 1
        d = self.work / f"{self.n:03d}-{name}"
        (d if create else d.parent).mkdir(parents=True, exist_ok=not create)
        return d

    def filled(self, text: str) -> str:
        """A shipped policy's text with its placeholders filled in: the public key (its PEM
        block, each line at the block's indentation) and the image pattern."""
        return fill_key(text, self.keys.pub.read_text()).replace(EXAMPLE_REGISTRY, self.registry + "/")

    def kyverno_policy(self, source: Path, d: Path) -> Path:
        text = source.read_text()
        if PLACEHOLDER not in text or EXAMPLE_REGISTRY not in text:
            raise SystemExit(
                f"consumers: {source} names no {PLACEHOLDER!r} or {EXAMPLE_REGISTRY!r} to fill in; "
                "give a policy written like data/policies/kyverno-clusterpolicy.yaml"
            )
        out = d / source.name
        out.write_text(self.filled(text))
        return out

    def cip(self, d: Path, floor: str) -> Path:
        out = d / "cip.yaml"
        out.write_text(self.filled(POLICY_CONTROLLER.read_text()).replace("NOT_BEFORE", floor))
        return out


def kyverno_answer(s: Setting, policy: Path, pod: dict[str, Any], d: Path) -> Answer:
    resource = d / "pod.yaml"
    resource.write_text(yaml.safe_dump(pod))
    return kyverno_apply(s.kyverno_policy(policy, d), resource)


def kyverno_apply(policy: Path, resource: Path, env: dict[str, str] | None = None) -> Answer:
    """Kyverno's CLI on one policy file (filled in) and one resource, the images read from their
    registry (`env`: added to its environment, e.g. where its TUF caches live): admitted when
    every rule that applied passed; None when none applied."""
    p = _run(
        [exe(TOOLS[1]), "apply", str(policy), "--resource", str(resource), "--registry", "--remove-color"],
        env=env,
    )
    out = p.stdout + p.stderr
    summary = re.search(r"pass: (\d+), fail: (\d+), warn: (\d+), error: (\d+), skip: (\d+)", out)
    if summary is None:
        return Answer(None, f"exit {p.returncode}: {_tail(out)}")
    passed, failed, _, errors, _ = (int(x) for x in summary.groups())
    if passed + failed + errors == 0:  # no rule applied (the image pattern missed): no judgement
        return Answer(None, f"exit {p.returncode}: {_tail(out)}")
    return Answer(failed == 0 and errors == 0 and p.returncode == 0, f"exit {p.returncode}: {_tail(out)}")


def policy_controller_answer(s: Setting, image: str, pod: dict[str, Any], d: Path, floor: str) -> Answer:
    resource = d / "pod.yaml"
    resource.write_text(yaml.safe_dump(pod))
    return policy_controller_test(s.cip(d, floor), image, resource)


def split_trust_root(written: Path) -> tuple[Path, Path]:
    """The ClusterImagePolicy file `policies write` writes keyless (the policy, then its
    TrustRoot) as two files beside it, cip.yaml and trustroot.yaml: the tester reads one of each."""
    cip, trust = yaml.safe_load_all(written.read_text())
    paths = written.parent / "cip.yaml", written.parent / "trustroot.yaml"
    for doc, to in zip((cip, trust), paths, strict=True):
        to.write_text(yaml.safe_dump(doc))
    return paths


def policy_controller_test(cip: Path, image: str, resource: Path, trust_root: Path | None = None) -> Answer:
    """policy-controller's tester on one ClusterImagePolicy (filled in), `image` and the resource
    running it (and the TrustRoot its keyless authorities name): admitted on exit 0; None when
    it failed to judge."""
    argv = [exe(TOOLS[2]), "--policy", str(cip), "--image", image, "--resource", str(resource)]
    argv += ["--trustroot", str(trust_root)] if trust_root is not None else []
    p = _run([*argv, "--log-level", "error"])
    if p.returncode == 0:
        return Answer(True, _tail(p.stdout + p.stderr))
    try:  # a refusal is the JSON it prints; anything else is the tester failing to judge
        json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return Answer(None, f"exit {p.returncode}: {_tail(p.stdout + p.stderr)}")
    return Answer(False, _tail(p.stdout))


def cosign_answer(s: Setting, image: str, gpu: bool, d: Path, floor: str) -> Answer:
    """`cosign verify-attestation` with the policy-controller authority's CUE for the level the
    Pod needs: cosign refuses when any verified statement of the type fails it."""
    cip = yaml.safe_load(POLICY_CONTROLLER.read_text())["spec"]
    authority = cip["authorities"][1 if gpu else 0]
    cue = d / "level.cue"
    cue.write_text(attestation_cue(authority["attestations"][0], floor))
    argv = [exe(TOOLS[0]), "verify-attestation", "--key", str(s.keys.pub), "--insecure-ignore-tlog"]
    p = _run([*argv, "--type", VSA_PREDICATE_TYPE, "--policy", str(cue), image])
    return Answer(p.returncode == 0, f"exit {p.returncode}: {_tail(p.stderr)}")


def cosign_statements(s: Setting, image: str) -> dict[str, Any]:
    """What cosign finds on the image: the VSAs it verifies with the key (no policy), and every
    attestation `cosign download attestation` lists."""
    cosign = exe(TOOLS[0])
    p = _run(
        [
            cosign,
            "verify-attestation",
            "--key",
            str(s.keys.pub),
            "--insecure-ignore-tlog",
            "--type",
            VSA_PREDICATE_TYPE,
            image,
        ]
    )
    verdicts = []
    for line in p.stdout.splitlines():
        with contextlib.suppress(ValueError, KeyError):
            statement = json.loads(base64.b64decode(json.loads(line)["payload"]))
            verdicts.append(statement["predicate"].get("verificationResult"))
    dl = _run([cosign, "download", "attestation", image])
    return {
        "verified_vsas": verdicts if p.returncode == 0 else f"exit {p.returncode}: {_tail(p.stderr, 300)}",
        "downloaded": len([x for x in dl.stdout.splitlines() if x.strip()]),
    }


# --- the cases ------------------------------------------------------------------------------


@dataclass
class Step:
    kind: str  # "attach" or "judge"
    arg: str  # attach: the run's name; judge: the Pod shape
    days_old: int = 0
    # judge: what the docs say each controller answers, (Kyverno, policy-controller), per mode
    expect: dict[str, tuple[bool, bool]] = field(default_factory=dict)


def _j(shape: str, replace: tuple[bool, bool], append: tuple[bool, bool] | None = None) -> Step:
    return Step("judge", shape, expect={"replace": replace, "append-only": append or replace})


def _a(run: str, days_old: int = 0) -> Step:
    return Step("attach", run, days_old)


T, F = True, False
CASES: dict[str, list[Step]] = {
    "FAIL then PASS": [_a("fail"), _j(CPU_POD, (F, F)), _a("pass"), _j(CPU_POD, (T, T), (F, T))],
    "PASS then FAIL": [_a("pass"), _j(CPU_POD, (T, T)), _a("fail"), _j(CPU_POD, (F, F), (F, T))],
    "deferred then completed": [
        _a("deferred"),
        *[_j(p, (F, F)) for p in GPU_PODS],
        _j(CPU_POD, (T, T)),
        _a("gpu_pass"),
        *[_j(p, (T, T), (F, T)) for p in GPU_PODS],
        _j(CPU_POD, (T, T)),
    ],
    "8 days old then fresh": [_a("pass", 8), _j(CPU_POD, (F, F)), _a("pass"), _j(CPU_POD, (T, T), (F, T))],
}


def _judge(s: Setting, ref: str, shape: str, tag: str) -> dict[str, Any]:
    now = dt.datetime.now(dt.timezone.utc)
    floor = not_before(now)
    pod = pod_of(shape, ref)
    gpu = shape.startswith("GPU")
    d = s.fresh(tag)
    found = several.statements_for(ref, keys.load_public_key(s.keys.pub))
    project_pc, _ = several.policy_controller(pod, found, floor, d / "project")
    kyverno = {
        p.name: kyverno_answer(s, p, pod, s.fresh(tag + "-kyverno")).as_dict() for p in s.kyverno_policies
    }
    return {
        "pod": shape,
        "project": {"kyverno": not several.kyverno(pod, found, now), "policy-controller": project_pc},
        "kyverno": kyverno,
        "policy-controller": policy_controller_answer(s, ref, pod, d, floor).as_dict(),
        "cosign": cosign_answer(s, ref, gpu, d, floor).as_dict(),
        "cosign_finds": cosign_statements(s, ref),
    }


def run_case(
    s: Setting, name: str, steps: list[Step], mode: str, image: str, runs: dict[str, Path]
) -> dict[str, Any]:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    ref = push(image, f"{slug}-{mode}")
    out: list[dict[str, Any]] = []
    for n, step in enumerate(steps):
        if step.kind == "attach":
            finished = (
                dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=step.days_old) if step.days_old else None
            )
            made = addressed(
                runs[step.arg], ref, s.fresh(f"{slug}-{n}-statement", create=False), s.keys.key, finished
            )
            attach_as(mode, made, ref)
            out.append({"attach": step.arg + (f" ({step.days_old} days old)" if step.days_old else "")})
            continue
        if mode == "append-only" and step.arg in GPU_PODS[1:]:
            continue  # the other routes to a GPU change nothing there: judged once, replacing
        judged = _judge(s, ref, step.arg, f"{slug}-{n}")
        judged["docs"] = dict(zip(("kyverno", "policy-controller"), step.expect[mode], strict=True))
        out.append(judged)
        print(f"  {name} [{mode}] {step.arg}: {_brief(judged)}", flush=True)
    tree = _run([exe(TOOLS[0]), "tree", ref])
    return {
        "case": name,
        "mode": mode,
        "image": ref,
        "steps": out,
        "cosign_tree": _tail(tree.stdout + tree.stderr, 3000),
    }


def other_image_case(s: Setting, image: str, other: str, runs: dict[str, Path]) -> dict[str, Any]:
    """One image's attestation never admits another, even copied onto the other's `.att` tag."""
    a, b = push(image, "one"), push(other, "other")
    steps: list[dict[str, Any]] = []
    made = addressed(runs["pass"], a, s.fresh("one-statement", create=False), s.keys.key)
    attach_as("replace", made, a)
    steps.append({"attach": "pass, to A"})
    for ref, label, expect in ((a, "A", (T, T)), (b, "B", (F, F))):
        judged = _judge(s, ref, CPU_POD, f"one-{label}")
        judged["docs"] = dict(zip(("kyverno", "policy-controller"), expect, strict=True))
        judged["of"] = label
        steps.append(judged)
    parsed = attach.parse_image(b)
    with attach.client_for(parsed) as client:
        for env in referrers.standard_beside(made, referrers.read_envelopes(made)[0]):
            attach.append(client, attach.resolve(client, parsed), env)
    steps.append({"attach": "A's statement copied onto B (by hand: attach refuses it)"})
    judged = _judge(s, b, CPU_POD, "one-B-copied")
    judged["docs"], judged["of"] = {"kyverno": F, "policy-controller": F}, "B"
    steps.append(judged)
    for j in steps:
        if "pod" in j:
            print(f"  one image's attestation, {j['of']}: {_brief(j)}", flush=True)
    return {
        "case": "one image's attestation never admits another",
        "mode": "replace",
        "image": f"A {a}, B {b}",
        "steps": steps,
    }


KEYLESS_WORKFLOWS = ("org/gate", "org/other")  # who signs, then another workflow of the same issuer
CLASSIC = ("--new-bundle-format=false", "--use-signed-timestamps", "--insecure-ignore-tlog")


def keyless_case(tmp: Path, image: str, runs: dict[str, Path]) -> dict[str, Any]:
    """The pass run's statement about `image` (the stand-in, re-addressed) signed keyless as the
    first workflow by the tests' own Sigstore (tests/attest/sigstore_local.py: Fulcio, a CT log,
    Rekor v2, a timestamp authority; the OIDC issuer a STAND-IN) and attached as `run --attach`
    attaches it (bundle referrers, `.att` layers with cosign's classic keyless proof); then each
    tool judges a plain Pod of it with what `policies write --identity --issuer --trusted-root`
    writes for each workflow: Kyverno's CLI (the ImageValidatingPolicy, then the ClusterPolicy,
    through a TUF repository of the run's own), policy-controller's tester, and cosign
    verify-attestation for the identity (the bundle, then the classic form)."""
    from imagegate.attest import keyless
    from tests.attest import tuf_repo
    from tests.attest.sigstore_local import local_sigstore
    from tests.policies.sequences import readdressed

    work = tmp / "keyless"
    with local_sigstore(sys.modules[__name__]) as local:
        key = keyless.open_key(
            f"sigstore:{local.client_trust_config}", {"SIGSTORE_ID_TOKEN": local.token(KEYLESS_WORKFLOWS[0])}
        )
        signed = readdressed(runs["pass"], image, work / "signed", key)
        ref = attach.parse_image(image)
        with attach.client_for(ref) as client:
            referrers.attach_signed(client, ref, signed, key)
        (work / "tuf").mkdir()
        (work / "tuf" / "root.json").write_bytes(
            tuf_repo.build(work / "tuf" / "repo", {"trusted_root.json": local.trusted_root.read_bytes()})
        )
        pod = work / "pod.yaml"
        pod.write_text(yaml.safe_dump(pod_of(CPU_POD, image)))
        with tuf_repo.served(work / "tuf" / "repo") as mirror:
            rows = [_keyless_row(local, sub, work, image, pod, mirror) for sub in KEYLESS_WORKFLOWS]
    return {"case": "keyless", "signer": local.identity(KEYLESS_WORKFLOWS[0]), "rows": rows}


def _keyless_row(local: Any, sub: str, work: Path, image: str, pod: Path, mirror: str) -> dict[str, Any]:
    """Each tool's answer with the policies written for workflow `sub`."""
    from tests.attest.conftest import cli

    out = work / sub.replace("/", "-")
    written = cli(
        "policies", "write", "--identity", local.identity(sub), "--issuer", local.issuer("github"),
        "--trusted-root", str(local.trusted_root), "--tuf-mirror", mirror,
        "--tuf-root", str(work / "tuf" / "root.json"), "--image", f"{image.partition('@')[0].rpartition('/')[0]}/*",
        "--out", str(out),
    )  # fmt: skip
    if written.returncode != 0:
        raise SystemExit(f"consumers: policies write keyless: {written.stderr}")
    cip, trust = split_trust_root(out / "policy-controller-clusterimagepolicy.yaml")
    env = {"HOME": str(out / "home"), "TUF_ROOT": str(out / "tuf-cache")}  # Kyverno's TUF caches
    answers = {
        "kyverno-imagevalidatingpolicy": kyverno_apply(out / "kyverno-imagevalidatingpolicy.yaml", pod, env),
        "kyverno-clusterpolicy": kyverno_apply(out / "kyverno-clusterpolicy.yaml", pod, env),
        "policy-controller": policy_controller_test(cip, image, pod, trust),
    }
    who = ["--certificate-identity", local.identity(sub), "--certificate-oidc-issuer", local.issuer("github")]
    for form, extra in (("cosign bundle", ()), ("cosign classic", CLASSIC)):
        argv = [exe(TOOLS[0]), "verify-attestation", "--trusted-root", str(local.trusted_root), *who,
                "--type", VSA_PREDICATE_TYPE, "--allow-http-registry", *extra, image]  # fmt: skip
        p = _run(argv)
        answers[form] = Answer(p.returncode == 0, f"exit {p.returncode}: {_tail(p.stderr)}")
    return {
        "workflow": local.identity(sub),
        "expected": sub == KEYLESS_WORKFLOWS[0],
        "answers": {k: a.as_dict() for k, a in answers.items()},
    }


def keyless_disagreements(keyless: dict[str, Any] | None) -> list[str]:
    """Each keyless answer that is not the one the docs give: admit for the workflow that signed,
    refuse for another."""
    out = []
    for row in (keyless or {}).get("rows", []):
        for tool, a in row["answers"].items():
            if a["admitted"] is not row["expected"]:
                out.append(
                    f"keyless, policies for {row['workflow']}: {tool} {a['admitted']}, docs {row['expected']}"
                )
    return out


def _brief(j: dict[str, Any]) -> str:
    def yn(v: Any) -> str:
        return {True: "admit", False: "refuse", None: "ERROR"}[v]

    k = ", ".join(f"{n} {yn(v['admitted'])}" for n, v in j["kyverno"].items())
    return (
        f"kyverno [{k}] (project {yn(j['project']['kyverno'])}, docs {yn(j['docs']['kyverno'])}); "
        f"policy-controller {yn(j['policy-controller']['admitted'])} (project {yn(j['project']['policy-controller'])}, "
        f"docs {yn(j['docs']['policy-controller'])}); cosign {yn(j['cosign']['admitted'])}"
    )


def disagreements(cases: list[dict[str, Any]]) -> list[str]:
    """Each judgement where a real tool's answer differs from the project's evaluator or from
    what the docs say; cosign, run with the level's CUE, follows Kyverno's rule (every
    statement of the type must pass), so it is compared with the project's Kyverno answer."""
    out = []
    for case in cases:
        for n, j in enumerate(case["steps"]):
            if "pod" not in j:
                continue
            where = (
                f"{case['case']} [{case['mode']}] step {n} ({j['pod']}{', ' + j['of'] if 'of' in j else ''})"
            )
            real = {f"kyverno {k}": v["admitted"] for k, v in j["kyverno"].items()}
            for name, admitted in real.items():
                for against in ("project", "docs"):
                    if admitted != j[against]["kyverno"]:
                        out.append(f"{where}: {name} {admitted}, {against} {j[against]['kyverno']}")
            for against in ("project", "docs"):
                if j["policy-controller"]["admitted"] != j[against]["policy-controller"]:
                    out.append(
                        f"{where}: policy-controller {j['policy-controller']['admitted']}, "
                        f"{against} {j[against]['policy-controller']}"
                    )
            if j["cosign"]["admitted"] != j["project"]["kyverno"]:
                out.append(
                    f"{where}: cosign {j['cosign']['admitted']}, the every-statement rule {j['project']['kyverno']}"
                )
    return out


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def write_record(record: dict[str, Any]) -> Path:
    day = record["started"][:10]
    path = RECORDS / f"{day}-consumers.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    path.with_suffix(".md").write_text(markdown(record))
    return path


def markdown(r: dict[str, Any]) -> str:
    def yn(v: Any) -> str:
        return {True: "admit", False: "refuse", None: "ERROR"}[v]

    lines = [
        f"# The real admission consumers on what imagegate publishes, {r['started'][:10]}",
        "",
        f"Written by `scripts/consumers.py` started at commit {r['commit']} ({'dirty' if r['dirty'] else 'clean'}), "
        f"{r['cores']} cores, load {r['load_start']:.1f} at the start and {r['load_end']:.1f} at the end; "
        f"{r['seconds']:.0f} s in all. Registry: docker-registry on 127.0.0.1.",
        "",
        "| tool | version | build: wall, CPU, load at its start | go build cache before it | binary | cache |",
        "|---|---|---|---|---|---|",
    ]
    for t in r["tools"].values():
        cpu = f", {t['cpu_seconds']:.0f} CPU-s" if "cpu_seconds" in t else ""
        before = t.get("gocache_bytes_before")
        lines.append(
            f"| {t['tool']} | {t['version']} ({t['toolchain']}) | {t['seconds']:.0f} s{cpu}, load {t['load']:.1f}"
            f"{' (built by an earlier run)' if t['cached'] else ''} | "
            f"{'not recorded' if before is None else f'{before / 1e9:.2f} GB'} | "
            f"{t['binary_bytes'] / 1e6:.0f} MB | {t['cache_bytes'] / 1e9:.2f} GB |"
        )
    lines += [""] + [f"- {t['tool']}: {t['note']}." for t in r["tools"].values() if t.get("note")]
    names = r["kyverno_policies"]
    lines += [
        "",
        "Each judgement: the real tool's answer, then (project's evaluator / docs). Kyverno: `kubectl-kyverno apply "
        "POLICY --resource POD --registry`; policy-controller: `tester --policy CIP --image IMAGE --resource POD` "
        "(NOT_BEFORE rendered to 7 days ago); cosign: `verify-attestation --key --insecure-ignore-tlog --type "
        "VSA --policy LEVEL.cue` with the authority's CUE for the level the Pod needs (compared with the every-statement rule).",
        "",
        "| case | mode | step | "
        + " | ".join(f"Kyverno {n}" for n in names)
        + " | policy-controller | cosign | cosign finds |",
        "|---|---|---|" + "---|" * len(names) + "---|---|---|",
    ]
    for case in r["cases"]:
        attached: list[str] = []
        for j in case["steps"]:
            if "attach" in j:
                attached.append(j["attach"])
                continue
            k = " | ".join(
                f"{yn(j['kyverno'][n]['admitted'])} ({yn(j['project']['kyverno'])} / {yn(j['docs']['kyverno'])})"
                for n in names
            )
            pc = f"{yn(j['policy-controller']['admitted'])} ({yn(j['project']['policy-controller'])} / {yn(j['docs']['policy-controller'])})"
            step = " → ".join(attached) + f"; {j['pod']}" + (f" of {j['of']}" if "of" in j else "")
            finds = j["cosign_finds"]
            lines.append(
                f"| {case['case']} | {case['mode']} | {step} | {k} | {pc} | {yn(j['cosign']['admitted'])} | "
                f"{finds['verified_vsas']}, {finds['downloaded']} downloaded |"
            )
    lines += _keyless_markdown(r.get("keyless"), yn)
    lines += ["", "## Disagreements", ""]
    lines += [f"- {d}" for d in r["disagreements"]] or [
        "None: every real tool answered as the project's evaluator and the docs."
    ]
    lines.append("")
    return "\n".join(lines)


def _keyless_markdown(keyless: dict[str, Any] | None, yn: Any) -> list[str]:
    if not keyless:
        return []
    tools = list(keyless["rows"][0]["answers"])
    lines = [
        "",
        "## Keyless",
        "",
        f"A VSA signed keyless as {keyless['signer']} by the tests' own Sigstore (Fulcio, a CT log, Rekor v2, a "
        "timestamp authority; the OIDC issuer a stand-in) and attached as `run --attach` attaches it (bundle "
        "referrers, `.att` layers with cosign's classic keyless proof); each tool judges a plain Pod of the image "
        "with the files `policies write --identity --issuer --trusted-root` writes for each workflow (Kyverno "
        "through a TUF repository of the run's own; cosign `verify-attestation --certificate-identity "
        "--certificate-oidc-issuer`, the bundle then the classic form). Each answer, then (docs).",
        "",
        "| policies for | " + " | ".join(tools) + " |",
        "|---|" + "---|" * len(tools),
    ]
    for row in keyless["rows"]:
        said = " | ".join(f"{yn(row['answers'][t]['admitted'])} ({yn(row['expected'])})" for t in tools)
        lines.append(f"| {row['workflow']} | {said} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="?", choices=("build", "run"), default="run")
    parser.add_argument("--kyverno-policy", action="append", type=Path, default=None)
    parser.add_argument(
        "--tool",
        action="append",
        choices=[t.name for t in (*TOOLS, *EXTRA)],
        help="build only these",
    )
    args = parser.parse_args()
    policies = [p.resolve() for p in (args.kyverno_policy or [KYVERNO])]
    for p in policies:
        if not p.is_file():
            print(f"consumers: no Kyverno policy {p}; give a policy file", file=sys.stderr)
            return 3
    started = dt.datetime.now(dt.timezone.utc)
    load_start = os.getloadavg()[0]
    # The tree as it starts: what ran is the code read then.
    commit, dirty = _git("rev-parse", "--short=12", "HEAD"), bool(_git("status", "--porcelain"))
    tools = {}
    for tool in (*TOOLS, *EXTRA):
        # a run also needs the tests' own Sigstore (the keyless case)
        wanted = args.what == "run" and tool in (SIGSTORE, TESSERACT)
        if (args.tool and tool.name not in args.tool) or (tool in EXTRA and not args.tool and not wanted):
            continue
        tools[tool.name] = info = build(tool)
        also = "".join(f", {exe(tool, name)}" for name in tool.others)
        print(
            f"{tool.name} {tool.version}: {exe(tool)}{also} ({'cached' if info['cached'] else 'built'}; "
            f"build {info['seconds']} s, cache {info['cache_bytes'] / 1e9:.2f} GB)",
            flush=True,
        )
    if any(not info["cached"] for info in tools.values()):
        trim()
    if args.what == "build":
        return 0
    with tempfile.TemporaryDirectory(prefix="imagegate-consumers-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "registry").mkdir()
        policy_keys = make_keys(Path(tempfile.mkdtemp(dir=tmp)))
        print("consumers: signing the runs (`imagegate run --here`)", flush=True)
        runs = make_runs(Path(tempfile.mkdtemp(dir=tmp)), policy_keys)
        with (
            start_registry(tmp / "registry") as registry,
            one_file_image(f"{registry}/seq/a:1", b"image A\n") as image,
            one_file_image(f"{registry}/seq/b:1", b"image B: another digest\n") as other,
        ):
            s = Setting(registry, policy_keys, tmp / "work", policies)
            cases = [
                run_case(s, name, steps, mode, image, runs)
                for name, steps in CASES.items()
                for mode in ("replace", "append-only")
            ]
            cases.append(other_image_case(s, image, other, runs))
            with one_file_image(f"{registry}/keyless/a:1", b"image K: signed keyless\n") as signed_keyless:
                print("consumers: keyless (the tests' own Sigstore)", flush=True)
                keyless = keyless_case(tmp, push(signed_keyless, "signed"), runs)
    record: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "commit": commit,
        "dirty": dirty,
        "cores": os.cpu_count(),
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
        "seconds": (dt.datetime.now(dt.timezone.utc) - started).total_seconds(),
        "tools": tools,
        "kyverno_policies": [p.name for p in policies],
        "cases": cases,
        "keyless": keyless,
        "disagreements": disagreements(cases) + keyless_disagreements(keyless),
    }
    path = write_record(record)
    print(
        f"consumers: wrote {path.relative_to(ROOT)} and .md; {len(record['disagreements'])} disagreement(s)"
    )
    return 1 if record["disagreements"] else 0


if __name__ == "__main__":
    sys.exit(main())
