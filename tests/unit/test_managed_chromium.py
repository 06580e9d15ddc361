"""Whether a Playwright-managed Chromium may be installed is read from Playwright's browser folder, so no
driver is started only to learn that none is (it took 0.6-1.7 s, once in the runner and once per web worker)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from targets import chromium


@pytest.fixture
def browsers_folder(tmp_path, monkeypatch):
    """Playwright's default browser folder, made empty for the test."""
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
    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", str(browsers_folder.parent / "chosen"))  # a folder of the user's choice
    (browsers_folder.parent / "chosen" / "chromium-1255").mkdir(parents=True)
    assert chromium._may_hold_managed_chromium()


def test_playwrights_folder_inside_its_package_is_where_its_registry_puts_it(monkeypatch):
    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", "0")
    import playwright

    assert chromium.playwright_browsers_dir() == Path(playwright.__file__).parent / "driver" / "package" / ".local-browsers"


# --- Playwright's own headless shell -----------------------------------------------------------------------------

SHELL_FOLDER = {"linux": "chrome-headless-shell-linux64", "darwin": "chrome-headless-shell-mac-arm64"}.get(
    sys.platform, "chrome-headless-shell-win64")


def _revision() -> str:
    """The headless shell's revision the installed Playwright drives (its browsers.json)."""
    listed = json.loads((chromium._playwright_package() / "browsers.json").read_text())["browsers"]
    return next(browser["revision"] for browser in listed if browser["name"] == "chromium-headless-shell")


def _install_shell(browsers: Path, revision: str, complete: bool = True) -> Path:
    """A headless shell laid out as `playwright install chromium-headless-shell` leaves it (the file need not run:
    only the lookup is tested here)."""
    folder = browsers / f"chromium_headless_shell-{revision}"
    executable = folder / SHELL_FOLDER / ("chrome-headless-shell.exe" if sys.platform == "win32" else "chrome-headless-shell")
    executable.parent.mkdir(parents=True)
    executable.write_text("#!/bin/sh\n")
    executable.chmod(0o755)
    if complete:
        (folder / "INSTALLATION_COMPLETE").touch()
    return executable


@pytest.fixture
def fresh_lookup(monkeypatch):
    monkeypatch.delenv(chromium.BROWSER_PATH_ENV, raising=False)
    chromium.chromium_executable.cache_clear()
    yield
    chromium.chromium_executable.cache_clear()


def test_playwrights_headless_shell_comes_first_from_its_default_folder(browsers_folder, fresh_lookup):
    """Before: only Debian's /usr/lib/chromium/chromium-headless-shell was looked for; Playwright's own was never run."""
    shell = _install_shell(browsers_folder, _revision())
    (browsers_folder / "chromium-1").mkdir()  # a managed full browser beside it: the shell comes first
    assert chromium.managed_headless_shell() == str(shell)
    assert chromium.chromium_executable() == str(shell)


def test_playwrights_headless_shell_is_found_in_the_folder_playwright_browsers_path_names(tmp_path, monkeypatch,
                                                                                         browsers_folder, fresh_lookup):
    chosen = tmp_path / "chosen"
    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", str(chosen))
    _install_shell(browsers_folder, _revision())  # the default folder is not Playwright's now
    assert chromium.managed_headless_shell() is None
    shell = _install_shell(chosen, _revision())
    assert chromium.chromium_executable() == str(shell)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("INIT_CWD", raising=False)
    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", "chosen")  # relative: from the working folder, as Playwright reads it
    assert chromium.managed_headless_shell() == str(shell)


def test_a_headless_shell_half_downloaded_or_of_another_revision_is_not_taken(browsers_folder):
    _install_shell(browsers_folder, _revision(), complete=False)
    _install_shell(browsers_folder, "1")  # another Playwright release's, which this driver does not drive
    assert chromium.managed_headless_shell() is None


def test_a_browser_folder_the_system_cannot_look_into_holds_no_browser(tmp_path, monkeypatch, fresh_lookup):
    """A PLAYWRIGHT_BROWSERS_PATH longer than a file name may be (ENAMETOOLONG): `policy-matrix targets` and every
    run with a web target ended in a traceback, from the headless shell's lookup."""
    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", str(tmp_path / ("x" * 5000)))
    assert chromium.managed_headless_shell() is None
    assert not chromium._may_hold_managed_chromium()
    chromium.chromium_executable()  # the system's Chromium, or None: no OSError
