"""branchbox: the Python client of branchbox's HTTP API (`branchctl serve`).

Standard library only, synchronous, thread safe. See docs/sdk-python.md.

    import branchbox
    c = branchbox.Client(socket="/run/branchbox/api.sock", namespace="default")
    sb = c.sandbox("agent")
    kids = sb.fork(4)
    r = kids[0].exec(["sh", "-c", "make test"])
    if r.exit_code == 0:
        kids[0].commit()
"""

from ._client import (
    Branch,
    BranchboxError,
    Client,
    ExecResult,
    Interactive,
    Sandbox,
    StaleError,
    best_of_n,
)

__all__ = ["Branch", "BranchboxError", "Client", "ExecResult", "Interactive", "Sandbox", "StaleError", "best_of_n"]
__version__ = "0.1.0"
