"""--model PATH reaches the serve stage's server read-only, in every driver: bound at
/tmp/imagegate-model by the engine and by the rootfs sandbox, used where it is with --here. A
path that is not there is refused before anything runs.

The server here is a stub (standard library, named as such): it serves the model file's text,
and says whether it could write into the model folder. The real server is in
test_transformers_serve.py; what this proves is the mount."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import imagegate

pytestmark = pytest.mark.engine

STUB = r"""
import http.server, json, os, sys
port, model = int(sys.argv[1]), sys.argv[2]
try:
    open(os.path.join(model, "written"), "w").close()
    mode = "writable"
except OSError:
    mode = "read-only"
text = open(os.path.join(model, "weights.txt")).read().strip() + " " + mode + " at " + model
class H(http.server.BaseHTTPRequestHandler):
    def answer(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self.answer({"status": "ok"})
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not req.get("stream"):
            return self.answer({"choices": [{"message": {"content": text}}]})
        self.send_response(200)
        self.end_headers()
        chunk = {"choices": [{"delta": {"content": text}, "finish_reason": "stop"}]}
        self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n")
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""

PIPELINE = {
    "apiVersion": "imagegate/v1",
    "kind": "Pipeline",
    "name": "model-mount",
    "stages": [
        {
            "id": "serve",
            "probe": "serve",
            "timeout": "2m",
            # The stub is no OpenAI server: the bad-media matrix is the real server's test.
            "with": {"command": [sys.executable, "-c", STUB, "{port}", "{model}"], "bad_media": False},
        }
    ],
}


@pytest.fixture
def model(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "weights.txt").write_text("tiny weights\n")
    folder.chmod(0o755)
    return folder


def served(image: str, model: Path, tmp_path: Path, *extra: str, python: str = "python3") -> dict[str, Any]:
    pipeline = json.loads(json.dumps(PIPELINE))
    pipeline["stages"][0]["with"]["command"][0] = python
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(pipeline))
    r = imagegate(
        "run", image, "-p", str(tmp_path / "p.yaml"), "--model", str(model), "--no-sign", "--format", "json",
        "-o", str(tmp_path / "out"), *extra,
        env={"XDG_CACHE_HOME": str(tmp_path / "cache")},
    )  # fmt: skip
    assert r.stdout, r.stderr
    (stage,) = r.json()["predicate"]["stages"]
    return dict(stage)


@pytest.mark.parametrize("driver", ["docker", "rootfs"])
def test_the_model_is_bound_read_only_in_the_sandbox(
    driver: str, images: dict[str, str], model: Path, tmp_path: Path
) -> None:
    ref = images["python"] if driver == "docker" else f"docker-daemon:{images['python']}"
    stage = served(ref, model, tmp_path, "--driver", driver)
    assert stage["status"] == "PASS", stage
    assert stage["facts"]["model"] == "/tmp/imagegate-model"
    chat = stage["facts"]["functional"][0]
    assert chat["text"] == "tiny weights read-only at /tmp/imagegate-model"
    assert not (model / "written").exists()


def test_here_serves_the_model_where_it_is(model: Path, tmp_path: Path) -> None:
    stage = served("", model, tmp_path, "--here", python=sys.executable)
    assert stage["status"] == "PASS", stage
    assert stage["facts"]["functional"][0]["text"].startswith("tiny weights ")
    assert stage["facts"]["model"] == str(model)


def test_a_missing_model_is_refused_before_anything_runs(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(PIPELINE))
    r = imagegate("run", "imagegate-test/python:latest", "-p", str(tmp_path / "p.yaml"), "--model",
                  str(tmp_path / "nope"), "-o", str(tmp_path / "out"))  # fmt: skip
    assert r.returncode == 3
    assert f"--model {tmp_path / 'nope'}: no such file or folder" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()


def test_model_without_a_serve_stage_is_a_usage_error(model: Path, tmp_path: Path) -> None:
    r = imagegate("run", "imagegate-test/python:latest", "-p", "python", "--model", str(model),
                  "-o", str(tmp_path / "out"))  # fmt: skip
    assert r.returncode == 3
    assert (
        "a model given (--model, --model-pvc, --model-host-path), but pipeline 'python' has no serve stage"
        in r.stderr
    )


# Its one stage needs a GPU and there is none here: deferred, no level reached, exit 1 (the attempt
# is written and signed all the same, and is what `complete` takes on a GPU node).
NO_LEVEL = "no level reached"


def test_complete_mounts_the_model_for_a_deferred_serve_stage(
    images: dict[str, str], model: Path, tmp_path: Path
) -> None:
    assert imagegate("keygen", "--out", str(tmp_path / "k")).returncode == 0
    pipeline = json.loads(json.dumps(PIPELINE))
    pipeline["stages"][0]["requires"] = ["gpu"]
    pipeline["stages"][0]["with"]["command"][0] = "python3"
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(pipeline))
    key = ["--key", str(tmp_path / "k.key")]
    first = imagegate("run", images["python"], "-p", str(tmp_path / "p.yaml"), "--model", str(model), *key,
                      "-o", str(tmp_path / "out"), "--format", "json")  # fmt: skip
    assert first.returncode == 1 and NO_LEVEL in first.stderr, first.stderr
    attempt = next((tmp_path / "out").glob("*/" + first.json()["predicate"]["attempt"]["id"]))
    # No GPU here either: the stage is deferred again, and what it ran for the record shows
    # whether the model reached the server.
    for given, seen in (
        ([], "model path /tmp/imagegate-model does not exist"),
        (["--model", str(model)], "chat, stream"),
    ):
        done = imagegate("complete", str(attempt), *key, *given, "-o", str(tmp_path / "again"))
        assert done.returncode == 1 and NO_LEVEL in done.stdout + done.stderr, done.stdout + done.stderr
        statement = json.loads(sorted((tmp_path / "again").glob("*/*/statement.json"))[-1].read_text())
        (stage,) = [s for s in statement["predicate"]["stages"] if s["id"] == "serve"]
        assert stage["status"] == "DEFERRED" and seen in stage["detail"], stage["detail"]


def test_complete_here_serves_the_model_given_now_not_the_first_runs_path(
    model: Path, tmp_path: Path
) -> None:
    """On the GPU node the model is seldom where the first run saw it: `complete --here --model`
    serves the path given now, and says so in the completion's plan and facts."""
    assert imagegate("keygen", "--out", str(tmp_path / "k")).returncode == 0
    pipeline = json.loads(json.dumps(PIPELINE))
    pipeline["stages"][0]["requires"] = ["gpu"]
    pipeline["stages"][0]["with"]["command"][0] = sys.executable
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(pipeline))
    key = ["--key", str(tmp_path / "k.key")]
    first = imagegate("run", "--here", "-p", str(tmp_path / "p.yaml"), "--model", str(model), *key,
                      "-o", str(tmp_path / "out"), "--format", "json")  # fmt: skip
    assert first.returncode == 1 and NO_LEVEL in first.stderr, first.stderr
    attempt = next((tmp_path / "out").glob("*/" + first.json()["predicate"]["attempt"]["id"]))
    moved = tmp_path / "node" / "models" / "tiny"
    moved.mkdir(parents=True)
    (moved / "weights.txt").write_text("the node's copy\n")
    done = imagegate("complete", str(attempt), "--here", *key, "--model", str(moved),
                     "-o", str(tmp_path / "again"), "--format", "json")  # fmt: skip
    assert done.returncode == 1 and NO_LEVEL in done.stderr, done.stderr
    predicate = done.json()["predicate"]
    (stage,) = [s for s in predicate["stages"] if s["id"] == "serve"]
    assert stage["status"] == "DEFERRED", stage["detail"]  # no GPU here either: ran for the record
    assert stage["facts"]["model"] == str(moved), stage
    assert stage["facts"]["functional"][0]["text"].startswith("the node's copy ")
    (planned,) = [s for s in predicate["plan"]["stages"] if s["id"] == "serve"]
    assert planned["params"]["model"] == str(moved)
    # --model for an attempt that deferred no serve stage: refused, naming what it deferred
    gpu = imagegate("run", "--here", "-p", "gpu", *key, "-o", str(tmp_path / "gpu"), "--format", "json")
    assert gpu.returncode == 1 and NO_LEVEL in gpu.stderr, gpu.stderr
    gpu_attempt = next((tmp_path / "gpu").glob("*/" + gpu.json()["predicate"]["attempt"]["id"]))
    refused = imagegate("complete", str(gpu_attempt), "--here", *key, "--model", str(moved))
    assert refused.returncode == 3, refused.stderr
    assert "deferred no serve stage (deferred: " in refused.stderr, refused.stderr
