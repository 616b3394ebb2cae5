#!/usr/bin/env python3
"""Auditing a whole mirror at the speed of its unique bytes, side by side with hashing each unique
blob once and with `audit` as it was before blobs were shared.

Builds (kept in --work, reused) an official repository of --tags tags over one base of --base-gb GB
(uncompressed, real files under /usr in gzip layers) plus a small layer of each tag's own, and its
mirror: the same images re-compressed (pigz -1: other blob digests, the same configs), both in
local registries (`docker-registry serve` on 127.0.0.1, pushed with skopeo). One mirror tag's own
layer is tampered in place in the mirror's storage. Then times, in one run:
  imagegate audit (a mirror set: every tag listed, --no-cache)      each unique blob read once
  imagegate audit at --baseline (the pairs listed one by one)       every blob of every tag read
  curl BLOB | tee >(sha256sum) | pigz -dc | sha256sum, per unique   the unique bytes hashed once,
      blob of the mirror, --jobs at a time                          digest and diffID
and prints the wall times and ratios, then each goal with PASS or FAIL (exit 1 if one is missed).
Goals: audit <= 1.3x the unique-blob hashing; >= 5x faster than audit at the baseline; the
tampered tag named CORRUPT by both audits and no other tag.

Usage: .venv/bin/python benchmarks/bench_audit.py [--base-gb 1.0] [--tags 20] [--jobs 4]
           [--work DIR] [--baseline COMMIT] [--record F]
Needs: docker-registry (Debian's), skopeo, pigz, curl, bash, git.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from bench_layers import GB, make_layer, pick_layers
from record import Goal, print_goals, write

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.oci.infra import Registry, skopeo, start_registry  # noqa: E402  (the tests' own registry)

GOAL_VS_UNIQUE, GOAL_VS_BEFORE = 1.3, 5.0
BASELINE = "05c1c47"  # the last commit before blobs were shared across an audit's images
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
GZIP_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
REPO = "team/app"
TAMPERED = 7  # the tag whose own layer is tampered in the mirror


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _put(layout: Path, data: bytes) -> dict[str, object]:
    digest = _sha(data)
    path = layout / "blobs" / "sha256" / digest.split(":")[1]
    if not path.exists():
        path.write_bytes(data)
    return {"digest": digest, "size": len(data)}


def _put_file(layout: Path, src: Path) -> dict[str, object]:
    h = hashlib.sha256()
    with open(src, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    digest = "sha256:" + h.hexdigest()
    dest = layout / "blobs" / "sha256" / digest.split(":")[1]
    if not dest.exists():
        shutil.copyfile(src, dest)
    return {"digest": digest, "size": src.stat().st_size}


def _own_layer(tag: str) -> bytes:
    """A tag's own layer, uncompressed: a few MB of text of its own."""
    body = "".join(f"{tag} line {i}: the tag's own files\n" for i in range(60_000)).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(f"app/{tag}.txt")
        info.size, info.mtime = len(body), 0
        tar.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def _base(work: Path, total: int) -> list[tuple[Path, Path, str]]:
    """The base's layers: (official gzip -6, mirror gzip -1, diffID), built once."""
    meta = work / "base.json"
    if meta.exists():
        m = json.loads(meta.read_text())
        if m["min_total"] >= total:
            return [(Path(a), Path(b), d) for a, b, d in m["layers"]]
    layers = []
    for i, paths in enumerate(pick_layers(total)):
        official = work / f"base{i}.tar.gz"
        diff_id, n = make_layer(paths, official)
        mirror = work / f"base{i}-1.tar.gz"
        with open(mirror, "wb") as out:  # the same tar, re-compressed: pigz -dc | pigz -1
            dc = subprocess.Popen(["pigz", "-dc", str(official)], stdout=subprocess.PIPE)
            subprocess.run(["pigz", "-1"], stdin=dc.stdout, stdout=out, check=True)
            dc.wait()
        print(
            f"  base layer {i}: {n / GB:.2f} GB, {official.stat().st_size / GB:.2f} GB gzip", file=sys.stderr
        )
        layers.append((official, mirror, diff_id))
    meta.write_text(json.dumps({"min_total": total, "layers": [[str(a), str(b), d] for a, b, d in layers]}))
    return layers


def build(work: Path, total: int, tags: int) -> dict[str, Path]:
    """The two OCI layouts (official, mirror), each with `tags` tagged manifests."""
    base = _base(work, total)
    layouts = {}
    for side, level in (("official", 6), ("mirror", 1)):
        layout = work / side
        shutil.rmtree(layout, ignore_errors=True)
        (layout / "blobs" / "sha256").mkdir(parents=True)
        (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
        manifests = []
        for t in range(1, tags + 1):
            tag = f"t{t:02d}"
            own = _own_layer(tag)
            layers = [_put_file(layout, off if side == "official" else mir) for off, mir, _ in base]
            layers.append(_put(layout, gzip.compress(own, compresslevel=level, mtime=0)))
            config = json.dumps({
                "architecture": "amd64", "os": "linux", "config": {"Env": [f"TAG={tag}"]},
                "rootfs": {"type": "layers", "diff_ids": [d for _, _, d in base] + [_sha(own)]},
            }).encode()  # fmt: skip
            manifest = json.dumps({
                "schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": OCI_CONFIG, **_put(layout, config)},
                "layers": [{"mediaType": GZIP_LAYER, **d} for d in layers],
            }).encode()  # fmt: skip
            manifests.append({
                "mediaType": OCI_MANIFEST, **_put(layout, manifest),
                "annotations": {"org.opencontainers.image.ref.name": tag},
            })  # fmt: skip
        (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": manifests}))
        layouts[side] = layout
    return layouts


def push(layout: Path, reg: Registry, tags: int) -> None:
    for t in range(1, tags + 1):
        tag = f"t{t:02d}"
        skopeo(
            "copy",
            "-q",
            "--dest-tls-verify=false",
            f"oci:{layout}:{tag}",
            f"docker://{reg.host}/{REPO}:{tag}",
        )


def tamper(layout: Path, reg: Registry) -> str:
    """Flip a byte of the tampered tag's own layer in the mirror's storage; its digest."""
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads(
        (layout / "blobs/sha256" / index["manifests"][TAMPERED - 1]["digest"][7:]).read_bytes()
    )
    victim: str = manifest["layers"][-1]["digest"]
    blob = reg.blob_file(victim)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01
    blob.write_bytes(bytes(data))
    return victim


def unique_blobs(layout: Path) -> list[str]:
    """Every layer blob the mirror's tags name, once."""
    seen: dict[str, None] = {}
    for m in json.loads((layout / "index.json").read_text())["manifests"]:
        doc = json.loads((layout / "blobs/sha256" / m["digest"][7:]).read_bytes())
        seen.update((x["digest"], None) for x in doc["layers"])
    return list(seen)


def timed(
    name: str, cmd: list[str], env: dict[str, str] | None = None, ok: tuple[int, ...] = (0,)
) -> tuple[float, str]:
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    wall = time.perf_counter() - t
    if p.returncode not in ok:
        raise SystemExit(f"{name} failed with {p.returncode}: {p.stderr[-3000:]}")
    print(f"  {name}: {wall:.1f} s", file=sys.stderr)
    return wall, p.stdout


def old_tree(work: Path, commit: str) -> Path:
    """imagegate's source at `commit` (git archive), run with this environment's packages."""
    tree = work / f"src-{commit}"
    if not tree.exists():
        tree.mkdir()
        archive = subprocess.run(
            ["git", "archive", commit, "src", "probes", "data"], cwd=ROOT, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        shutil.copy(ROOT / "src/imagegate/_version.py", tree / "src/imagegate/_version.py")
    return tree / "src"


def outcomes(report: str) -> dict[str, str]:
    return {i["subject"].rsplit(":", 1)[-1]: i["outcome"] for i in json.loads(report)["items"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-gb", type=float, default=1.0, help="the shared base, uncompressed (at most 2)")
    ap.add_argument("--tags", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=4, help="audit's --jobs; as many blobs hashed at a time")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "imagegate-bench-audit")
    ap.add_argument("--baseline", default=BASELINE, help="the commit whose audit is measured beside")
    ap.add_argument("--record", type=Path)
    a = ap.parse_args()
    if a.base_gb > 2:
        raise SystemExit("--base-gb: at most 2 (disk is short)")
    a.work.mkdir(parents=True, exist_ok=True)
    layouts = build(a.work, int(a.base_gb * GB), a.tags)
    regs = {side: start_registry(Path(tempfile.mkdtemp(prefix=f"bench-audit-{side}-"))) for side in layouts}
    try:
        for side, layout in layouts.items():
            push(layout, regs[side], a.tags)
        victim = tamper(layouts["mirror"], regs["mirror"])
        off, mir = regs["official"].host, regs["mirror"].host
        inv_set = a.work / "mirror-set.yaml"
        inv_set.write_text(
            "apiVersion: imagegate/v1\nkind: Inventory\nmirror_sets:\n"
            f"  - {{mirror: '{mir}/{REPO}', official: '{off}/{REPO}:{{tag}}'}}\n"
        )
        inv_list = a.work / "mirror-list.yaml"
        inv_list.write_text("apiVersion: imagegate/v1\nkind: Inventory\nmirrors:\n" + "".join(
            f"  - {{official: '{off}/{REPO}:t{t:02d}', mirror: '{mir}/{REPO}:t{t:02d}'}}\n"
            for t in range(1, a.tags + 1)
        ))  # fmt: skip
        blobs = unique_blobs(layouts["mirror"])
        script = f'curl -sf "http://{mir}/v2/{REPO}/blobs/$0" | tee >(sha256sum > /dev/null) | pigz -dc | sha256sum > /dev/null'
        reference, _ = timed(
            "curl | tee >(sha256sum) | pigz -dc | sha256sum, per unique blob",
            ["bash", "-c", f"printf '%s\\n' {' '.join(blobs)} | xargs -P {a.jobs} -n 1 bash -c '{script}'"],
        )
        py = sys.executable
        audit = ["-m", "imagegate", "audit", "-q", "-j", str(a.jobs), "--json", "-"]
        now, now_out = timed(
            "imagegate audit (mirror set)", [py, *audit, str(inv_set), "--no-cache"], ok=(1,)
        )
        old_src = old_tree(a.work, a.baseline)
        before, before_out = timed(
            f"imagegate audit at {a.baseline}",
            [py, *audit, str(inv_list)],
            env={"PYTHONPATH": str(old_src)},
            ok=(1,),
        )
    finally:
        for reg in regs.values():
            reg.stop()
            shutil.rmtree(reg.root.parent, ignore_errors=True)
    tampered = f"t{TAMPERED:02d}"
    got_now, got_before = outcomes(now_out), outcomes(before_out)
    named = {t for t, o in got_now.items() if o == "CORRUPT"}
    layers = json.loads(now_out)["layers"]
    print(f"\nunique blobs {len(blobs)}; audit read {layers['read']} ({layers['read_bytes'] / GB:.2f} GB), "
          f"knew {layers['known']} ({layers['known_bytes'] / GB:.2f} GB)")  # fmt: skip
    print(f"audit {now:.1f} s; unique-blob hashing {reference:.1f} s ({now / reference:.2f}x); "
          f"audit at {a.baseline} {before:.1f} s ({before / now:.1f}x slower)")  # fmt: skip
    goals = [
        Goal("audit / unique-blob hashing", f"<= {GOAL_VS_UNIQUE}x", f"{now / reference:.2f}x", now / reference <= GOAL_VS_UNIQUE),
        Goal(f"audit at {a.baseline} / audit", f">= {GOAL_VS_BEFORE}x", f"{before / now:.1f}x", before / now >= GOAL_VS_BEFORE),
        Goal("the tampered tag named", f"{tampered} CORRUPT, no other",
             f"now {sorted(named)}, before {sorted(t for t, o in got_before.items() if o == 'CORRUPT')}",
             named == {tampered} and got_before.get(tampered) == "CORRUPT"),
        Goal("each unique blob read once", f"{len(blobs)} reads", f"{layers['read']} reads", layers["read"] == len(blobs)),
    ]  # fmt: skip
    code = print_goals(goals)
    if a.record:
        results = {
            "unique_blobs": len(blobs), "tampered_blob": victim, "layers": layers,
            "wall_s": {"audit": round(now, 2), "unique_blob_hashing": round(reference, 2), f"audit_at_{a.baseline}": round(before, 2)},
            "outcomes": got_now,
        }  # fmt: skip
        write(a.record, "bench_audit", vars(a), results, goals)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
