"""`python -m devstack.prose [--since REV]`: how the project's prose reads, in figures a
reviewer can compare with other codebases' (issue 80's targets in brackets):

- the words of each docstring sentence of api/, worker/ and contract/ (median <= 14);
- comments that trail code on its line, per 100 lines of code (<= 1);
- the commit subjects since REV: their median length (<= 72), how many run over 72, and
  how many commits have no body to say why.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import statistics
import subprocess
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ("api", "worker", "contract")
SENTENCE_END = re.compile(r"(?<=[.!?])\)?\s+(?=[A-Z`(\"'])")
# a blank line, or a list item's start: what comes after is read as a new sentence
BREAK = re.compile(r"\n\s*\n|\n\s*(?:[-*]|\d+\.)\s+")


def core_files() -> list[Path]:
    return [p for package in CORE for p in sorted((ROOT / package).rglob("*.py"))]


def docstrings(source: str) -> list[str]:
    """Every module, class and function docstring of `source`."""
    tree = ast.parse(source)
    nodes = [
        tree,
        *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)),
    ]
    return [doc for node in nodes if (doc := ast.get_docstring(node))]


def sentence_words(doc: str) -> list[int]:
    """The words of each sentence of a docstring's prose (its list items and code blocks are
    sentences too: a reader reads them as such)."""
    parts = (" ".join(part.split()) for part in BREAK.split(doc))
    return [len(s.split()) for part in parts for s in SENTENCE_END.split(part) if s.strip()]


def trailing_comments(source: str) -> tuple[int, int]:
    """(lines of code, comments after code on the same line)."""
    code: set[int] = set()
    trailing = 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            trailing += tok.start[0] in code
        elif tok.type not in (
            tokenize.NL,
            tokenize.NEWLINE,
            tokenize.INDENT,
            tokenize.DEDENT,
            tokenize.ENDMARKER,
        ):
            code.add(tok.start[0])
    return len(code), trailing


def subjects(since: str) -> list[tuple[str, bool]]:
    """(subject, has a body) of each commit since `since`."""
    out = subprocess.run(
        ["git", "log", "--format=%s%x1f%b%x1e", f"{since}..HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [r.strip("\n") for r in out.split("\x1e") if r.strip()]
    return [(subject, bool(body.strip())) for subject, _, body in (r.partition("\x1f") for r in rows)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--since", default="HEAD~20", help="the commits after this one (default: the last 20)")
    args = ap.parse_args()
    words, lines, trailing = [], 0, 0
    for path in core_files():
        source = path.read_text()
        for doc in docstrings(source):
            words += sentence_words(doc)
        n, t = trailing_comments(source)
        lines, trailing = lines + n, trailing + t
    commits = subjects(args.since)
    lengths = [len(s) for s, _ in commits]
    print(f"docstring sentences: {len(words)}, median {statistics.median(words):.0f} words [<= 14]")
    print(f"trailing comments: {trailing} in {lines} lines of code, {100 * trailing / lines:.1f} % [<= 1 %]")
    if commits:
        over = sum(n > 72 for n in lengths)
        bare = sum(not body for _, body in commits)
        print(
            f"commit subjects since {args.since}: {len(commits)}, median {statistics.median(lengths):.0f} "
            f"characters [<= 72], {over} over 72, {bare} without a body"
        )


if __name__ == "__main__":
    main()
