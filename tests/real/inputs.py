"""What a built-in pipeline's verdict on a real image depends on, file by file: the pipeline
itself, the in-image code its stages run (the controller and every shared module of probes/, and
the probes it names), the runner's code for the outside stages it names, and the runner's code
that turns what ran into a verdict (the plan, the run, the docker driver the records run under,
the protocol, the verdict's rules). scripts/real-frameworks.py records these digests with each
run; tests/real/test_records.py fails when one changed after the record that backs a version
claim."""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
# probes/ modules that belong to one probe: another pipeline's probe is not this one's input.
# Any other module (the controller, capture, versions, ...) is shared by every stage.
OWN = {"cli": "cli", "find_spec": "find_spec", "pip_check": "pip_check", "av_roundtrip": "av_roundtrip",
       "inventory": "inventory", "gpu_preflight": "gpu_preflight", "gpu_worker": "gpu_preflight",
       "gpu_causes": "gpu_preflight",
       "serve": "serve", "serve_process": "serve", "serve_http": "serve", "serve_media": "serve",
       "serve_engines": "serve"}  # fmt: skip
# The runner's files a verdict is computed by, whatever the pipeline: which stages run and which
# wait (plan), the bundle sent in and the run of it (probes_bundle, runner, workers, accept), what
# the controller's output means (protocol), the verdict from the stages' statuses (results), the
# pipeline as read (pipeline/), the docker driver that runs it or refuses it (a refusal is an
# ERROR; the records run under it, so the rootfs driver's files are not theirs), and the outside
# stages' common code (stages/__init__).
VERDICT = ("usecases/accept.py", "domain/probes_bundle.py", "domain/results.py", "domain/plan.py",
           "domain/protocol.py", "usecases/runner/*.py", "_support/workers.py",
           "pipeline/*.py", "drivers/__init__.py", "drivers/interface.py", "drivers/loader.py",
           "drivers/select.py", "drivers/docker.py", "stages/__init__.py")  # fmt: skip


def inputs(pipeline: str) -> dict[str, str]:
    """Path (from the repository's root) -> sha256 of each file `-p PIPELINE` runs."""
    path = ROOT / "data" / "pipelines" / f"{pipeline}.yaml"
    used = {stage["probe"] for stage in yaml.safe_load(path.read_text())["stages"]}
    probes = sorted((ROOT / "probes").glob("*.py"))
    files = [path, *(f for f in probes if OWN.get(f.stem) in used | {None})]
    files += [f for p in sorted(used) if (f := ROOT / "src" / "imagegate" / "stages" / f"{p}.py").is_file()]
    files += sorted({f for pattern in VERDICT for f in (ROOT / "src" / "imagegate").glob(pattern)})
    return {str(f.relative_to(ROOT)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
