"""The user docs and the repository's text: what they may say, what they must name, where they link.

- No tracked file (``git ls-files``; ``data/`` and binary files aside) names a path of the machine
  it was written on or talks about how the work was organised; a hit is reported as file:line.
  The patterns below are written so that this file does not match them itself.
- docs/ARCHITECTURE.md names every module of ``recipe/``, ``data_prep/`` and every file of
  ``scripts/`` in the section of its package.
- Every relative link of README.md and docs/ resolves (file, and heading anchor where given), and
  every ``docs/<page>.md`` named anywhere in the repository exists.
- README.md + docs/ stay within the word budget (``wc -w``).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
WORD_BUDGET = 15_000

# (what it is, pattern). Split literals keep this file from matching its own patterns.
LEAK_PATTERNS = [
    ("a path of the machine", re.compile("/" + "work/")),
    ("a path of the machine", re.compile("/" + "root/")),
    ("a random temporary directory", re.compile(r"/tmp/tmp\.")),
    ("the CPU-slot lock of the machine", re.compile("HEAVY_" + "EXCLUSIVE")),
    ("work organisation (lead)", re.compile(r"\bthe\s+lead\b|\blead(?:'|’)s\b", re.IGNORECASE)),
    ("work organisation (a session)", re.compile(
        r"\b(?:this|an\s+earlier|a\s+previous|the\s+previous)\s+session\b|\bthe\s+session\s+that\b", re.IGNORECASE)),
    ("work organisation (helpers)", re.compile(r"\b(?:other|another|~?\d+)\s+helpers?\b|\bhelpers'", re.IGNORECASE)),
    ("an issue number", re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)),
    ("work organisation (a stop)", re.compile(r"\bthis\s+stop\b", re.IGNORECASE)),
    ("work organisation (brief)", re.compile(r"\bthe\s+brief\b", re.IGNORECASE)),
    ("work organisation (shared notes)", re.compile(r"\bnotes\s+§")),
]


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        pytest.skip("not a git checkout: git ls-files failed")
    return [REPO_ROOT / name for name in out.stdout.splitlines() if not name.startswith("data/")]


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary / non-UTF-8 / missing file."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if b"\0" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def leaks(paths) -> list[str]:
    found = []
    for path in paths:
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            for what, pattern in LEAK_PATTERNS:
                if pattern.search(line):
                    found.append(f"{path.relative_to(REPO_ROOT)}:{number}: {what}: {line.strip()[:120]}")
    return found


def doc_pages() -> list[Path]:
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("line, expected", [
    ("see " + "/" + "work/cache/model", True),
    ("ran under HEAVY_" + "EXCLUSIVE=1", True),
    ("the " + "lea" + "d's probe", True),
    ("measured in this " + "session", True),
    ("Issue " + "19 item 1", True),
    ("the loss helpers allocate", False),
    ("starts the trainer in its own session", False),
    ("python scripts/build_tiny_model.py --out-dir /tmp/tiny", False),
])
def test_the_leak_patterns_catch_what_they_should(line, expected):
    assert any(pattern.search(line) for _, pattern in LEAK_PATTERNS) == expected


def test_docs_name_no_machine_path_and_no_work_organisation():
    found = leaks(doc_pages())
    assert not found, "\n".join(found)


def test_no_tracked_file_names_a_machine_path_or_work_organisation():
    found = leaks(tracked_files())
    assert not found, f"{len(found)} line(s):\n" + "\n".join(found)


# --------------------------------------------------------------------------- ARCHITECTURE.md

def architecture_sections() -> dict[str, str]:
    """Package path (``recipe/cpu/``, ``scripts/``, ...) -> the text of the section whose heading names it."""
    sections: dict[str, str] = {}
    heading_paths: list[str] = []
    body: list[str] = []
    for line in (REPO_ROOT / "docs" / "ARCHITECTURE.md").read_text().splitlines() + ["# end"]:
        if line.startswith("#"):
            for path in heading_paths:
                sections[path] = sections.get(path, "") + "\n".join(body)
            heading_paths = re.findall(r"`([\w./-]+/)`", line)
            body = []
        else:
            body.append(line)
    return sections


def package_of(relative: str) -> str:
    parts = relative.split("/")
    if parts[0] == "recipe" and len(parts) > 2:
        return f"recipe/{parts[1]}/"
    return parts[0] + "/"


def unnamed_modules() -> list[str]:
    sections = architecture_sections()
    whole = (REPO_ROOT / "docs" / "ARCHITECTURE.md").read_text()
    missing = []
    for path in tracked_files():
        relative = path.relative_to(REPO_ROOT).as_posix()
        is_module = relative.endswith(".py") and (relative.startswith("recipe/") or re.match(r"data_prep/[^/]+$", relative))
        if not (is_module or relative.startswith("scripts/")):
            continue
        package = package_of(relative)
        if path.name == "__init__.py":
            # a package is named by its section (or, for the top-level namespace, by the layout)
            if package not in sections and f"{package}" not in whole:
                missing.append(relative)
            continue
        below = relative[len(package):]
        section = sections.get(package)
        if section is None or not re.search(rf"(?<![\w/]){re.escape(below)}(?!\w)", section):
            missing.append(relative)
    return missing


def test_architecture_names_every_module_in_its_package_section():
    missing = unnamed_modules()
    assert not missing, "not named in its package's section of docs/ARCHITECTURE.md: " + ", ".join(missing)


# --------------------------------------------------------------------------- links

def github_slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    slugs, seen = set(), {}
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not re.match(r"#{1,6} ", line):
            continue
        slug = github_slug(line.lstrip("#"))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        slugs.add(slug if count == 0 else f"{slug}-{count}")
    return slugs


def broken_links() -> list[str]:
    broken = []
    for page in doc_pages():
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (page.parent / file_part).resolve() if file_part else page
            where = f"{page.relative_to(REPO_ROOT)}: ({target})"
            if not linked.exists():
                broken.append(f"{where}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{where}: no heading #{anchor}")
    return broken


def test_every_relative_link_of_the_docs_resolves():
    broken = broken_links()
    assert not broken, "\n".join(broken)


def test_every_doc_page_named_in_the_repository_exists():
    missing = set()
    for path in tracked_files():
        text = text_of(path)
        for name in re.findall(r"\bdocs/[\w/.-]*?\.md\b", text or ""):
            if not (REPO_ROOT / name).exists():
                missing.add(f"{path.relative_to(REPO_ROOT)}: {name}")
    assert not missing, "\n".join(sorted(missing))


def test_the_user_docs_stay_within_the_word_budget():
    """README.md + docs/*.md; the dated measurements under docs/results/ are result pages, not counted."""
    pages = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
    counts = {page.relative_to(REPO_ROOT).as_posix(): len(page.read_text().split()) for page in pages}
    total = sum(counts.values())
    largest = ", ".join(f"{name} {n}" for name, n in sorted(counts.items(), key=lambda item: -item[1])[:5])
    assert total <= WORD_BUDGET, f"README.md + docs/*.md hold {total} words (budget {WORD_BUDGET}); largest: {largest}"
