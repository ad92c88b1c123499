"""How soon a change reaches the dashboard's page, against the alternative of polling
``hotswap workload list`` once a second, in the same runs. Prints JSON.

A local cluster of 3 slices (v6e-4) runs one workload (a tiny Python worker). Each run fails the
node under it (``hotswap node fail``); the clock starts when that command is started. The
dashboard (default look interval, 0.5 s for a local cluster) is read as a browser reads it,
through ``/api/stream``: the time is when the document showing the workload on its new slice
arrives. The alternative polls ``workload list --output json`` (a new process each second, as
``watch -n1`` would): the time is when its output first shows the new slice. Then the node is
repaired and the next run starts.

    python benchmarks/bench_dashboard.py --json --runs 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

WORKER = "import time; time.sleep(3600)"


def cli(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "hotswap", *args], capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise SystemExit(f"hotswap {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def holder_slices(rows: list[dict]) -> list[str]:
    return next((r["slices"] for r in rows if r["name"] == "job"), [])


class StreamWatcher:
    """Reads the dashboard's event stream; records when each distinct slice list of ``job`` arrived."""

    def __init__(self, url: str) -> None:
        self.seen: list[tuple[float, tuple[str, ...]]] = []
        self.bytes: list[int] = []
        threading.Thread(target=self._read, args=(url,), daemon=True).start()

    def _read(self, url: str) -> None:
        with urllib.request.urlopen(url + "api/stream", timeout=600) as stream:
            for raw in stream:
                line = raw.decode()
                if not line.startswith("data: "):
                    continue
                self.bytes.append(len(raw))
                document = json.loads(line[6:])
                held = tuple(s["name"] for s in document["slices"] if s["holder"] == "job")
                if not self.seen or self.seen[-1][1] != held:
                    self.seen.append((time.monotonic(), held))

    def first(self, predicate, after: float) -> float | None:
        return next((t for t, held in self.seen if t >= after and predicate(held)), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="hotswap-bench-dashboard-"))
    os.chmod(home, 0o700)
    os.environ["HOTSWAP_HOME"] = str(home)
    from hotswap.cli.dashboard import start_dashboard

    cli("cluster", "create", "--cluster", "b", "--device-type", "v6e-4", "--num-slices", "3")
    board = None
    try:
        cli("workload", "create", "--cluster", "b", "--workload", "job", "--command", f"{sys.executable} -c '{WORKER}'")
        board = start_dashboard("b", "127.0.0.1", 0, None)
        board.start()
        watcher = StreamWatcher(board.url)
        page_s, poll_s = [], []
        for _ in range(args.runs):
            before = holder_slices(json.loads(cli("workload", "list", "--cluster", "b", "--output", "json")))
            moved = lambda held, before=tuple(before): bool(held) and tuple(held) != before
            started = time.monotonic()
            cli("node", "fail", "--cluster", "b", "--slice", before[0])
            polled = None
            while polled is None:  # `watch -n1 hotswap workload list`: a look each second
                look = time.monotonic()
                rows = json.loads(cli("workload", "list", "--cluster", "b", "--output", "json"))
                if moved(holder_slices(rows)):
                    polled = time.monotonic()
                    break
                time.sleep(max(0.0, 1.0 - (time.monotonic() - look)))
            deadline = time.monotonic() + 30
            while (pushed := watcher.first(moved, started)) is None and time.monotonic() < deadline:
                time.sleep(0.02)
            if pushed is None:
                raise SystemExit("the dashboard never showed the move")
            page_s.append(pushed - started)
            poll_s.append(polled - started)
            cli("node", "uncordon", "--cluster", "b", "--slice", before[0])
        result = {
            "runs": args.runs,
            "page_p50_s": round(statistics.median(page_s), 3),
            "page_max_s": round(max(page_s), 3),
            "workload_list_polling_p50_s": round(statistics.median(poll_s), 3),
            "workload_list_polling_max_s": round(max(poll_s), 3),
            "page_over_polling_p50": round(statistics.median(page_s) / statistics.median(poll_s), 2),
            "document_bytes_p50": int(statistics.median(watcher.bytes)) if watcher.bytes else None,
            "look_interval_s": board.source.interval_s,
            "cpus": os.cpu_count(),
            "load_average_1m": round(os.getloadavg()[0], 2),
        }
    finally:
        if board is not None:
            board.stop()
        subprocess.run([sys.executable, "-m", "hotswap", "cluster", "delete", "--cluster", "b"], capture_output=True, timeout=120, check=False)
    print(json.dumps(result, indent=2 if not args.json else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
