#!/usr/bin/env python3
"""Unpack throughput on a real big image from a registry on 127.0.0.1, side by side with the
machine's plain write speed and with `skopeo copy` + `umoci unpack`.

The image: --image (default: the largest `*vllm*` image in the engine of at least 8 GB), pushed
by the engine to a docker-registry started here (bench_big_image.py's helpers); or --ref
REPO:TAG already in --registry HOST:PORT.

Measured one after the other (wall time; peak RSS of the process tree, from wait4), the disk
emptied and `sync`ed between steps so that one step's write-back does not slow the next:
  cold     imagegate cache unpack docker://REF     (every digest, size and diffID verified
                                                   while the layers are written)
  warm     the same again                          (the root reused from the cache)
  write    tar -xf LAYER.tar for each layer (alternated with cold, --repeat times), from already-decompressed layer tars
           (untimed: curl | pigz -dc > LAYER.tar): the machine's plain write speed for exactly
           these files
  umoci    skopeo copy docker://REF oci:DIR, then umoci unpack --image DIR (where installed)
Goals (issue 15): cold unpack within 80 % of the plain write speed (tar time / imagegate time
>= 0.8); peak RSS <= 150 MB; faster than skopeo + umoci. Ratios printed with PASS/FAIL; exit 1
on a miss. A dated record goes to benchmarks/records/.

Usage: .venv/bin/python benchmarks/bench_unpack.py [--image REF | --registry HOST:PORT --ref REPO:TAG]
           [--work DIR] [--repeat N] [--no-umoci] [--no-record]
Needs: a Docker engine, docker-registry, curl, pigz, tar; skopeo and umoci for the comparison.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_big_image import (
    GB,
    ROOT,
    Measure,
    cores_delivered,
    find_image,
    push,
    ratio_line,
    run_measured,
    start_registry,
)


def _manifest(host: str, ref: str) -> dict[str, object]:
    repo, _, tag = ref.rpartition(":")
    req = urllib.request.Request(
        f"http://{host}/v2/{repo}/manifests/{tag}",
        headers={
            "Accept": "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"
        },
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        doc: dict[str, object] = json.loads(r.read())
    return doc


def _empty(path: Path) -> None:
    if path.exists():
        subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=True)
    subprocess.run(["sync"], check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", help="an image in the engine (default: the largest *vllm* one of >= 8 GB)")
    ap.add_argument("--registry", help="HOST:PORT of a registry on loopback that already holds --ref")
    ap.add_argument("--ref", help="REPO:TAG in --registry")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "imagegate-bench-unpack")
    ap.add_argument("--no-umoci", action="store_true", help="skip skopeo copy + umoci unpack")
    ap.add_argument(
        "--repeat", type=int, default=1, help="cold unpacks and tar runs, alternated; the fastest counts"
    )
    ap.add_argument("--no-record", action="store_true", help="do not write benchmarks/records/")
    args = ap.parse_args()
    if bool(args.registry) != bool(args.ref):
        raise SystemExit("--registry and --ref go together")
    args.work.mkdir(parents=True, exist_ok=True)
    registry_proc = None
    try:
        if args.registry:
            host, repo_tag = args.registry, args.ref
            what = f"{host}/{repo_tag}"
        else:
            image = args.image or find_image()
            host, registry_proc = start_registry(args.work)
            full, _ = push(image, host)
            repo_tag = full.split("/", 1)[1]
            what = f"{image} pushed to {full}"
        ref = f"{host}/{repo_tag}"
        m = _manifest(host, repo_tag)
        layers = [(int(x["size"]), str(x["digest"])) for x in m["layers"]]  # type: ignore[attr-defined]
        print(
            f"{what}: {len(layers)} layers, {sum(s for s, _ in layers) / GB:.2f} GB compressed",
            file=sys.stderr,
        )
        results: list[Measure] = []
        tars = args.work / "tars"
        _empty(tars)
        tars.mkdir()
        print("  decompressing the layers for the plain-write baseline (untimed) ...", file=sys.stderr)
        repo = repo_tag.rpartition(":")[0]
        for i, (_, digest) in enumerate(layers):
            subprocess.run(
                f"curl -sf http://{host}/v2/{repo}/blobs/{digest} | pigz -dc > {tars}/{i:03}.tar",
                shell=True,
                check=True,
            )
        cache, plain = args.work / "cache", args.work / "plain"
        ig = [sys.executable, "-m", "imagegate", "cache", "unpack", "-q", "--format", "json"]
        ig += ["--cache-dir", str(cache), f"docker://{ref}"]
        extract = " && ".join(f"tar -xf {tars}/{i:03}.tar -C {plain}" for i in range(len(layers)))
        colds, writes = [], []
        # Alternated, the fastest of each: a shared machine's load hits both sides alike.
        for r in range(max(1, args.repeat)):
            _empty(cache)
            colds.append(run_measured("imagegate cache unpack (cold)", ig))
            if r == 0:
                out = subprocess.run(ig, capture_output=True, text=True, check=True)
                size = int(json.loads(out.stdout)["size"])
                warm = run_measured("imagegate cache unpack (warm, cached)", ig)
            _empty(cache)
            _empty(plain)
            plain.mkdir()
            writes.append(run_measured("tar -xf (already decompressed layers)", extract, shell=True))
            _empty(plain)
        cold = min(colds, key=lambda m: m.wall_s)
        write = min(writes, key=lambda m: m.wall_s)
        results += [cold, warm, write]
        _empty(tars)

        umoci = None
        if not args.no_umoci and shutil.which("umoci") and shutil.which("skopeo"):
            oci = args.work / "oci"
            bundle = args.work / "bundle"
            _empty(oci)
            _empty(bundle)
            copy = run_measured(
                "skopeo copy docker:// oci:",
                ["skopeo", "copy", "-q", "--src-tls-verify=false", f"docker://{ref}", f"oci:{oci}:bench"],
            )
            unpack = run_measured("umoci unpack", ["umoci", "unpack", "--image", f"{oci}:bench", str(bundle)])
            umoci = Measure(
                "skopeo copy + umoci unpack", copy.wall_s + unpack.wall_s, None, copy.cpu_s + unpack.cpu_s
            )
            results += [copy, unpack]
            _empty(oci)
            _empty(bundle)
    finally:
        if registry_proc is not None:
            registry_proc.terminate()
            registry_proc.wait(30)

    delivered = cores_delivered()
    load = os.getloadavg()
    lines = [
        f"image: {what}, {len(layers)} layers, {size / GB:.2f} GB of files",
        f"cold unpack and tar runs: {max(1, args.repeat)} each, alternated (the fastest counts)",
        f"machine: {os.cpu_count()} cores ({delivered:.2f} cores of CPU delivered at the end, measured with "
        f"sha256sum); load average at the end {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} (a shared, busy machine)",
        "",
        f"{'measured':<50} {'wall s':>8} {'CPU s':>8} {'peak RSS MB':>12} {'MB/s':>8}",
    ]
    for x in results:
        rss = f"{x.peak_rss_mb:.0f}" if x.peak_rss_mb is not None else "-"
        lines.append(f"{x.name:<50} {x.wall_s:>8.1f} {x.cpu_s:>8.1f} {rss:>12} {size / 1e6 / x.wall_s:>8.0f}")
    lines.append("")
    within = write.wall_s / cold.wall_s
    goals = [
        ("unpack throughput / plain write (tar -x)", within, ">= 0.8", within >= 0.8),
        ("imagegate peak RSS, MB", cold.peak_rss_mb or 0.0, "<= 150", (cold.peak_rss_mb or 0) <= 150),
    ]
    if umoci is not None:
        speed = umoci.wall_s / cold.wall_s
        goals.append(("skopeo copy + umoci unpack / imagegate (cold)", speed, ">= 1", speed >= 1))
    lines.append(f"warm cache: {warm.wall_s:.2f} s ({cold.wall_s / warm.wall_s:.0f}x faster than cold)")
    for name, value, goal, ok in goals:
        lines.append(ratio_line(name, value, goal, ok))
    text = "\n".join(lines)
    print(text)
    if not args.no_record:
        now = dt.datetime.now(dt.timezone.utc)
        record = ROOT / "benchmarks" / "records" / f"{now:%Y-%m-%d-%H%M}-unpack.md"
        cmd = " ".join(
            shlex.quote(a) for a in [".venv/bin/python", "benchmarks/bench_unpack.py", *sys.argv[1:]]
        )
        record.write_text(
            f"# Unpack throughput on a big image, {now:%Y-%m-%d %H:%M} UTC\n\nCommand: `{cmd}`\n\n```\n{text}\n```\n"
        )
        print(f"\nrecord: {record.relative_to(ROOT)}", file=sys.stderr)
    return 0 if all(ok for *_, ok in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
