"""examples/fenced_write.py end to end, against a real node and a real
`palisade fence-store`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import Node, Proc, free_port

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fenced_write.py"


def test_fenced_write_example(node: Node, tmp_path: Path) -> None:
    port = free_port()
    store = Proc(
        ["fence-store", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "objects")],
        tmp_path / "fence-store.log",
        "fenced object store on",
    )
    try:
        store.start()
        run = subprocess.run(
            [sys.executable, str(EXAMPLE), "--endpoints", node.addr, "--store", f"http://127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert "wrote late: 409" in run.stdout, run.stdout
        assert "the store holds: 'written by holder 2'" in run.stdout, run.stdout
    finally:
        store.kill()
