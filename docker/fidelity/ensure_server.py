"""Start the scripted API server in this container unless it already listens.

The agent's container outlives one CLI run (resume and retries reuse it) and
may be restarted, which empties /tmp: so every wrapper call checks the port
and starts the server when nothing answers.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

PORT = int(os.environ.get("FIDELITY_PORT", "18080"))
HERE = os.path.dirname(os.path.abspath(__file__))


def listening() -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", PORT)) == 0


def main() -> None:
    if listening():
        return
    with open("/tmp/fidelity-api.log", "ab") as log:
        subprocess.Popen(
            [sys.executable, "-S", os.path.join(HERE, "api_server.py")],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if listening():
            return
        time.sleep(0.05)
    sys.exit(f"fidelity API server did not start on 127.0.0.1:{PORT}; see /tmp/fidelity-api.log")


if __name__ == "__main__":
    main()
