"""The HTML report in a real headless browser (Debian's chromium driven by playwright): every figure
loads and the page logs no console error. Skips when chromium or playwright is absent (.ci/run installs
both)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "planner"))
from conftest_helpers import kl_train  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright = pytest.importorskip("playwright.sync_api", reason="playwright (python) not installed")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (.ci/run installs it)")


def test_report_opens_in_headless_chromium(tmp_path):
    from k3sim.planner.plan import plan
    from k3sim.report import write_report

    res = plan(kl_train(tmp_path), sections=("memory", "step"))
    out = tmp_path / "rep"
    write_report(res, out)
    errors: list[str] = []
    failed: list[str] = []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--allow-file-access-from-files"])
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("requestfailed", lambda r: failed.append(r.url))
            page.goto((out / "report.html").as_uri(), wait_until="load")
            imgs = page.eval_on_selector_all(
                "img", "els => els.map(e => [e.getAttribute('src'), e.complete, e.naturalWidth])")
            title = page.title()
        finally:
            browser.close()
    assert title == "k3sim plan: kl-train-test"
    assert len(imgs) == 3
    assert all(ok and width > 100 for _, ok, width in imgs), imgs
    assert errors == [] and failed == []
