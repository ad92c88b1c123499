"""The external links of the README and the docs: listed, reviewed, and checked online.

The strict MkDocs build checks internal links and anchors; the tests have no network (CI's
machine reaches PyPI only), so external links are checked in two steps:

- offline (``python docs/check_links.py``, and ``tests/test_docs_links.py``): every external
  link in README.md and docs/ (the generated reference pages included) is well-formed https and
  listed in docs/external_links.txt, the reviewed list; a new link fails until someone reviews
  it and adds it there, a link no page uses any more fails until it is taken out;
- online (``python docs/check_links.py --online``, by hand where the internet is reachable):
  each listed link is fetched, HEAD first, then GET where HEAD is refused (some servers answer
  HEAD with 403, 404 or 405), several at once, each with a timeout. ``--stamp`` then writes
  the date into the list's ``# checked:`` line if every link answered 2xx (after redirects).

Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import importlib.util
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REVIEWED = ROOT / "docs" / "external_links.txt"
# A URL as written in Markdown or a shell line: up to a space, a bracket, a quote or a backtick.
_URL = re.compile(r"https?://[^\s<>()\[\]{}\"'`|\\]+")
_TRAILING = ".,;:!?"  # prose punctuation after a link is not part of it
LOCAL_HOSTS = {"127.0.0.1", "localhost", "0.0.0.0", "::1"}  # the reader's own machine: not a link to check
TIMEOUT_S = 15.0
WORKERS = 8
USER_AGENT = "hotswap-docs-link-check (+https://pypi.org/project/hotswap/)"


@dataclass(frozen=True)
class Found:
    url: str
    where: str  # page:line


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _generated(page: Path, text: str) -> str:
    """The page as the site shows it: its generated parts filled in
    (docs/_hooks/reference.py; needs hotswap importable, else the page as written)."""
    hook = ROOT / "docs" / "_hooks" / "reference.py"
    try:
        spec = importlib.util.spec_from_file_location("hotswap_docs_reference", hook)
        if spec is None or spec.loader is None:
            return text
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return str(module.on_page_markdown(text, page=None))
    except Exception as error:  # noqa: BLE001 - a page we cannot generate is checked as written, and said so
        print(f"note: {page.relative_to(ROOT)} checked as written, its generated parts left out ({error})", file=sys.stderr)
        return text


def external_links(generate: bool = True) -> list[Found]:
    """Every external link of the README and the docs, where it is written."""
    found = []
    for page in pages():
        text = page.read_text()
        if generate and "<!-- hotswap:" in text:
            text = _generated(page, text)
        for number, line in enumerate(text.splitlines(), 1):
            for match in _URL.finditer(line):
                url = match.group(0).rstrip(_TRAILING)
                if urllib.parse.urlsplit(url).hostname not in LOCAL_HOSTS:
                    found.append(Found(url, f"{page.relative_to(ROOT)}:{number}"))
    return found


def malformed(url: str) -> str | None:
    """Why ``url`` is not a well-formed https link (None: it is)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "https":
        return "not https"
    host = parts.hostname or ""
    if "." not in host or not re.fullmatch(r"[a-z0-9.-]+", host) or host.startswith(".") or host.endswith("."):
        return f"host {host!r} is not a domain name"
    if re.search(r"%(?![0-9A-Fa-f]{2})", url):
        return "a stray %"
    return None


def reviewed(path: Path = REVIEWED) -> list[str]:
    """The reviewed links: the first word of each line that is not a ``#`` comment (a URL may
    hold a ``#`` fragment; words after it are notes)."""
    return [line.split()[0] for line in path.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]


def offline_problems(found: list[Found], listed: list[str]) -> list[str]:
    problems = []
    for item in found:
        why = malformed(item.url)
        if why is not None:
            problems.append(f"{item.where}: {item.url}: {why}")
        elif item.url not in listed:
            problems.append(f"{item.where}: {item.url}: not reviewed (check it, then add it to {REVIEWED.relative_to(ROOT)})")
    used = {item.url for item in found}
    problems += [f"{REVIEWED.relative_to(ROOT)}: {url}: no page links it any more (take it out)" for url in listed if url not in used]
    return problems


def fetch(url: str, timeout: float = TIMEOUT_S) -> tuple[bool, str]:
    """(answered 2xx, what happened): HEAD, then GET if HEAD was refused or failed."""
    said = []
    for method in ("HEAD", "GET"):
        request = urllib.request.Request(url, method=method, headers={"User-Agent": USER_AGENT})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:  # follows redirects
                if method == "GET":
                    answer.read(1024)
                moved = f" (at {answer.geturl()})" if answer.geturl() != url else ""
                return True, f"{method} {answer.status}{moved}"
        except urllib.error.HTTPError as error:
            said.append(f"{method} {error.code} {error.reason}")
        except (urllib.error.URLError, OSError, ValueError) as error:
            said.append(f"{method}: {getattr(error, 'reason', error)}")
    return False, "; ".join(said)


def check_online(urls: list[str], timeout: float = TIMEOUT_S, workers: int = WORKERS) -> dict[str, tuple[bool, str]]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip(urls, pool.map(lambda url: fetch(url, timeout), urls)))


def stamp(today: datetime.date, path: Path = REVIEWED) -> None:
    lines = [f"# checked: {today.isoformat()}, every link answered 2xx" if line.startswith("# checked:") else line
             for line in path.read_text().splitlines()]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--online", action="store_true", help="also fetch every reviewed link")
    parser.add_argument("--stamp", action="store_true", help="with --online: date the list if every link answered")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per request")
    args = parser.parse_args(argv)
    found = external_links()
    listed = reviewed()
    problems = offline_problems(found, listed)
    for problem in problems:
        print(problem)
    print(f"{len({f.url for f in found})} external links in {len(pages())} pages; {len(problems)} problems offline")
    if not args.online:
        return 1 if problems else 0
    results = check_online(listed, args.timeout)
    for url, (good, what) in results.items():
        print(f"{'ok  ' if good else 'FAIL'} {url}: {what}")
    failed = [url for url, (good, _) in results.items() if not good]
    print(f"{len(results) - len(failed)} of {len(results)} links answered")
    if args.stamp and not failed and not problems:
        stamp(datetime.datetime.now(datetime.timezone.utc).date())
    return 1 if problems or failed else 0


if __name__ == "__main__":
    sys.exit(main())
