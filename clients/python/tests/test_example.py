"""examples/fenced_write.py end to end, against a real node and a real
`palisade fence-store`."""

from __future__ import annotations

import json
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


REPO_README = Path(__file__).resolve().parents[3] / "README.md"


def readme_snippet(language: str) -> str:
    """The README's one ``language`` code block (of "From Python, Node, …")."""
    text = REPO_README.read_text()
    start = text.index(f"```{language}\n") + len(f"```{language}\n")
    return text[start : text.index("```", start)]


def test_the_readme_python_snippet_prints_a_token(node: Node) -> None:
    snippet = readme_snippet("python")
    assert '"127.0.0.1:7420"' in snippet, snippet
    # The node of this test, not the README's default address.
    run = subprocess.run(
        [sys.executable, "-c", snippet.replace("127.0.0.1:7420", node.addr)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    words = run.stdout.split()
    assert run.stdout.startswith("holding jobs/nightly with fencing token "), run.stdout
    assert int(words[-1]) > 0, run.stdout


def test_bench_example_prints_one_json_line_of_pairs(node: Node) -> None:
    run = subprocess.run(
        [sys.executable, str(EXAMPLE.parent / "bench.py"), "--endpoints", node.addr, "--duration", "0.3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(run.stdout.splitlines()[-1])
    assert result["pairs"] >= 1 and len(result["acquire_us"]) == result["pairs"], result
    assert result["elapsed_s"] > 0, result
