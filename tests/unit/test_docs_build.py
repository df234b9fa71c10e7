"""The documentation site builds in strict mode (mkdocs.yml): a broken link, a missing anchor, a page
left out of the nav or a Markdown file mkdocs cannot read fails `make test` (CI runs it via .ci/run).
Built into a temporary directory, offline: Material's fonts are off (theme.font: false), nothing is
fetched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("mkdocs", reason="the docs need Python >= 3.11.5 (mkdocs-material 9.8, pyproject markers)")
pytest.importorskip("material", reason="the docs need Python >= 3.11.5 (mkdocs-material 9.8, pyproject markers)")


def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # Material's end-of-life banner
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert (site / "index.html").is_file()
    assert (site / "reference" / "configuration.html").is_file()
    # no page asks the network for fonts or scripts (the site opens offline, as the build ran)
    for page in site.rglob("*.html"):
        text = page.read_text(errors="replace")
        assert "fonts.googleapis.com" not in text and "fonts.gstatic.com" not in text, page


def test_readme_links_into_the_docs_resolve():
    """README.md is the door: every relative link it has must name a file of the checkout (the site's
    strict build does not read the README)."""
    import re
    text = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [l for l in links if not re.match(r"^[a-z]+://", l)]
    assert local, "the README links into docs/"
    missing = [l for l in local if not (REPO / l).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"
