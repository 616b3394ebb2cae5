"""Zero-GPU Pod mode: the probes run in the target cluster, against the image exactly as that
cluster pulled it (its real `imageID`), without taking a GPU.

- `render`: the ConfigMap (the bundle) and the Job that runs it, validated by `validate`;
- `collect`: from the Pod's log and status to a run record, evidence and the statement;
- `cluster`: the one small interface to the API server (`kubectl` implements it);
- `podrun`: render, apply, wait, collect, delete, through that interface.
"""

from __future__ import annotations
