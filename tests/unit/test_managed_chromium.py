"""Whether a Playwright-managed Chromium may be installed is read from Playwright's browser folder, so no
driver is started only to learn that none is (it took 0.6-1.7 s, once in the runner and once per web worker)."""

from __future__ import annotations

import sys

import pytest

from targets import chromium


@pytest.fixture
def browsers_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("PLAYWRIGHT_BROWSERS_PATH", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path))
    monkeypatch.setattr(chromium.Path, "home", lambda: tmp_path)
    cache = tmp_path / "Library" / "Caches" if sys.platform == "darwin" else tmp_path
    return cache / "ms-playwright"


def test_no_chromium_install_in_playwrights_folder_means_no_managed_chromium(browsers_folder):
    assert not chromium._may_hold_managed_chromium()
    (browsers_folder / "ffmpeg-1011").mkdir(parents=True)  # other downloads are not a Chromium
    assert not chromium._may_hold_managed_chromium()


def test_a_chromium_install_or_a_folder_of_the_users_choice_is_asked_about(browsers_folder, monkeypatch):
    (browsers_folder / "chromium-1255").mkdir(parents=True)
    assert chromium._may_hold_managed_chromium()
    (browsers_folder / "chromium-1255").rmdir()
    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", "0")  # inside the package: only the driver knows
    assert chromium._may_hold_managed_chromium()
