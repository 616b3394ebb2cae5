"""`complete --driver rootfs`: the deferred stages run on exactly the bytes judged. The image is
read again from the transport it was judged from, every layer verified; when that reference now
names another image, nothing runs and nothing is written."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import imagegate
from tests.oci.infra import skopeo
from tests.run.test_gpu import GPU_PIPELINE


def test_complete_on_rootfs_refuses_another_image_behind_the_same_reference(
    pushed_vllm: str, images: dict[str, str], root_cache: dict[str, str], tmp_path: Path
) -> None:
    layout, runs = tmp_path / "layout", tmp_path / "runs"
    skopeo("copy", "-q", "--src-tls-verify=false", f"docker://{pushed_vllm}", f"oci:{layout}:0.11")
    (tmp_path / "deferred.yaml").write_text(GPU_PIPELINE.format(python="python3"))
    assert imagegate("keygen", "--out", str(tmp_path / "k")).returncode == 0
    env = {
        **root_cache,
        "IMAGEGATE_SIGNING_KEY": str(tmp_path / "k.key"),
        "DOCKER_HOST": "unix:///nonexistent",
    }
    ran = imagegate("run", f"oci:{layout}:0.11", "--driver", "rootfs", "-p", str(tmp_path / "deferred.yaml"),
                    "-o", str(runs), env=env)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    (first,) = runs.glob("*/*/")
    # The same reference, another image.
    skopeo("copy", "-q", f"docker-daemon:{images['python']}", f"oci:{layout}:0.11")
    done = imagegate("complete", str(first), "--driver", "rootfs", env=env)
    assert done.returncode == 3, done.stderr
    judged = first.parent.name.replace("sha256-", "sha256:")
    assert f"is not the image ID {judged} that attempt {first.name} judged" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert list(runs.glob("*/*/")) == [first]  # nothing written
