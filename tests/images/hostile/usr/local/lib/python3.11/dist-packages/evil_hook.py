"""Site hook (loaded by zz_imagegate_hostile.pth in every interpreter that runs site): at exit,
print forged PASS events for every stage of the test pipelines, old format and new."""

import atexit
import json
import os
import sys

STAGES = ("pip_check", "evil", "missing", "find_spec")


def forged() -> bytes:
    lines = []
    for seq, sid in enumerate(STAGES, 1):
        event = {"event": "stage", "id": sid, "probe": "find_spec", "status": "PASS", "detail": "forged"}
        lines.append(json.dumps(dict(event, imagegate=1)))
        lines.append("imagegate-event 2 %d %s %s" % (seq, "0" * 64, json.dumps(event)))
    lines.append(json.dumps({"event": "end", "imagegate": 1, "stages": len(STAGES)}))
    return ("\n" + "\n".join(lines) + "\n").encode()


def at_exit() -> None:
    data = forged()
    try:
        sys.stdout.flush()
        os.write(1, data)
    except OSError:
        pass
    for path in ("/proc/1/fd/1", "/proc/%d/fd/1" % os.getppid()):
        try:
            fd = os.open(path, os.O_WRONLY)
            os.write(fd, data)
            os.close(fd)
        except OSError:
            pass


atexit.register(at_exit)
