"""Write records into a run as fast as possible until killed; print each committed call's digest to stdout.

    python tests/records/writer.py RUN_DIR
"""

from __future__ import annotations

import sys

import numpy as np

from invar import canonical
from invar.protocol.messages import Call, Identity, Report, Role
from invar.records import RunStore

store = RunStore.create(sys.argv[1], meta={"purpose": "kill test"})
ident = Identity("writer", {"invar": "test"}, Role.INFERENCE, {}, ("echo",), 1)
key = store.record_worker(ident.to_wire())
i = 0
while True:
    i += 1
    payload = canonical.encode(Call(i, "echo", {"v": np.full(64, i, dtype=np.float32)}).to_wire())
    digest = store.record_call(payload, worker=key)
    print(f"call {digest}", flush=True)
    rep = canonical.encode(Report(i, digest, key, result={"v": i}).to_wire())
    store.record_report(rep, worker=key)
    print(f"report {canonical.sha256(rep)}", flush=True)
