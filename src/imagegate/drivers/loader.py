"""How a bundle enters an image without a file in it: the loader every sandboxed driver (the
docker engine's container, the rootfs sandbox) starts with the image's python. No Docker SDK here:
the rootfs driver runs on machines that have no engine and no SDK."""

from __future__ import annotations

from collections.abc import Sequence

# Runs first in the image's python, started with -E -s -S (no PYTHONPATH, no site hooks; the
# image's working directory is dropped from sys.path too): read "<length>\n<zip bytes><key>\n
# <stage ids>\n" from stdin, check the sha256, write the bundle to the tmpfs, hand the event key over through
# an inherited pipe and exec the controller isolated (-I -S). Python 3.8+ standard library.
TOO_OLD_EXIT = 96
LOADER_FLAGS = ["-E", "-s", "-S"]  # Python 2 knows these too: an old interpreter gets the message
LOADER = (  # the first lines parse on Python 2 too, so an old interpreter gets a clear message
    "import sys\n"
    "sys.path[:]=[q for q in sys.path if q]\n"
    "if sys.version_info<(3,8):\n"
    " sys.stderr.write('imagegate: too old: Python %s\\n'%sys.version.split()[0]);sys.exit(96)\n"
    "import hashlib,os,tempfile\n"
    "r=sys.stdin.buffer\n"
    "n=int(r.readline())\n"
    "b=r.read(n)\n"
    "if len(b)!=n or hashlib.sha256(b).hexdigest()!=sys.argv[1]:\n"
    " sys.stderr.write('imagegate: bundle transfer incomplete (%d of %d bytes)\\n'%(len(b),n));sys.exit(97)\n"
    "k=r.readline().strip()\n"
    "os.environ['IMAGEGATE_STAGES']=r.readline().strip().decode()\n"
    "d=tempfile.mkdtemp(prefix='imagegate-bundle-')\n"
    "p=os.path.join(d,'imagegate.pyz')\n"
    "f=open(p,'wb');f.write(b);f.close()\n"
    "i,o=os.pipe();os.write(o,k);os.close(o);os.set_inheritable(i,True)\n"
    "os.environ['IMAGEGATE_EVENT_KEY_FD']=str(i)\n"
    "os.execv(sys.executable,[sys.executable,'-I','-S',p]+sys.argv[2:])\n"
)


def loader_payload(bundle: bytes, event_key: bytes, stages: Sequence[str] | None) -> bytes:
    """What LOADER reads from stdin: length, bundle, key, stage ids."""
    payload = b"%d\n" % len(bundle) + bundle + event_key.hex().encode() + b"\n"
    return payload + ",".join(stages or ()).encode() + b"\n"


# What a run without --gpus sets in the image's environment: no GPU for CUDA or the NVIDIA runtime.
HIDDEN_GPU_ENV = {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void", "TMPDIR": "/tmp"}
