"""Issue 34: the docs' external links are reviewed (offline, here) and checkable online
(docs/check_links.py --online, by hand: the tests have no network). A link added to the README
or a docs page fails this file until it is well-formed https and listed in
docs/external_links.txt; a listed link no page uses fails it too."""

from __future__ import annotations

import http.server
import importlib.util
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load_checker():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("check_links", ROOT / "docs" / "check_links.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


check_links = _load_checker()


def test_every_external_link_is_well_formed_https_and_reviewed() -> None:
    found = check_links.external_links()
    assert found, "the docs link to JobSet's and Kueue's manifests at least"
    assert check_links.offline_problems(found, check_links.reviewed()) == []


def test_a_new_an_insecure_a_malformed_and_a_stale_link_each_fail() -> None:
    Found = check_links.Found
    listed = ["https://example.org/reviewed", "https://example.org/gone"]
    found = [
        Found("https://example.org/reviewed", "a.md:1"),
        Found("https://example.org/new", "a.md:2"),
        Found("http://example.org/reviewed", "a.md:3"),
        Found("https://exa mple/x", "a.md:4"),
    ]
    problems = check_links.offline_problems(found, listed)
    assert [p.split(": ")[0] for p in problems] == ["a.md:2", "a.md:3", "a.md:4", "docs/external_links.txt"]
    assert "not reviewed" in problems[0] and "not https" in problems[1] and "not a domain name" in problems[2]
    assert "no page links it" in problems[3]


def test_links_are_read_as_written_in_markdown_and_shell_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = tmp_path / "README.md"
    page.write_text(
        "See [JobSet](https://jobset.sigs.k8s.io/docs/), or https://example.org/a.\n"
        "`kubectl apply -f https://example.org/m.yaml`; the page https://example.org/p#part, then\n"
        "the dashboard at http://127.0.0.1:8787/ and http://localhost:9090.\n"
    )
    monkeypatch.setattr(check_links, "ROOT", tmp_path)
    monkeypatch.setattr(check_links, "pages", lambda: [page])
    urls = [(f.url, f.where) for f in check_links.external_links(generate=False)]
    assert urls == [
        ("https://jobset.sigs.k8s.io/docs/", "README.md:1"), ("https://example.org/a", "README.md:1"),
        ("https://example.org/m.yaml", "README.md:2"), ("https://example.org/p#part", "README.md:2"),
    ]


def test_the_reviewed_list_reads_fragments_and_notes(tmp_path: Path) -> None:
    listed = tmp_path / "links.txt"
    listed.write_text("# a comment\n\nhttps://example.org/p#part  a note\n# checked: never\n")
    assert check_links.reviewed(listed) == ["https://example.org/p#part"]


class _Site(http.server.BaseHTTPRequestHandler):
    """/ok answers both; /no-head refuses HEAD (405) and answers GET; /moved redirects to /ok;
    /gone is 404 to both."""

    def _answer(self, body: bool) -> None:
        if self.path == "/moved":
            self.send_response(301)
            self.send_header("Location", "/ok")
            self.end_headers()
            return
        code = {"/ok": 200, "/no-head": 405 if self.command == "HEAD" else 200}.get(self.path, 404)
        self.send_response(code)
        self.send_header("Content-Length", "2")
        self.end_headers()
        if body:
            self.wfile.write(b"ok")

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self._answer(False)

    def do_GET(self) -> None:  # noqa: N802
        self._answer(True)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def site() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_online_head_then_get_redirects_followed_and_failures_said(site: str) -> None:
    results = check_links.check_online([f"{site}/ok", f"{site}/no-head", f"{site}/moved", f"{site}/gone"], timeout=60, workers=4)
    assert results[f"{site}/ok"] == (True, "HEAD 200")
    assert results[f"{site}/no-head"] == (True, "GET 200")
    good, what = results[f"{site}/moved"]
    assert good and what == f"HEAD 200 (at {site}/ok)"
    good, what = results[f"{site}/gone"]
    assert not good and "HEAD 404" in what and "GET 404" in what
