"""JupyterLab in a real browser: `specdiag lab` opens a .py notebook as a notebook, runs it, and the
reader sees a rendered widget and a figure (headless Debian chromium through selenium; skipped
where they are missing, installed in CI by .ci/run)."""

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from specdiag.runner import REPO_ROOT

selenium = pytest.importorskip("selenium")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
HAS_LAB = subprocess.run([sys.executable, "-m", "jupyterlab", "--version"], capture_output=True).returncode == 0
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and DRIVER and HAS_LAB), reason="needs chromium, chromedriver and jupyterlab (see .ci/run)"
)
NOTEBOOK = "03_context_sweep.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, seconds: float) -> None:
    end = time.time() + seconds
    while time.time() < end:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer in {seconds} s")


def _sessions(port: int, notebook: str) -> list[str]:
    """The execution state of each kernel the server holds for `notebook`."""
    import json

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/sessions", timeout=5) as r:
        sessions = json.load(r)
    return [s["kernel"]["execution_state"] for s in sessions if s["path"].endswith(notebook)]


def _log_end(log: Path) -> str:
    return f"server log ends: {log.read_text()[-1500:]}"


def _wait_kernel_idle(port: int, notebook: str, seconds: float, log: Path) -> None:
    end = time.time() + seconds
    states: list[str] = []
    while time.time() < end:
        states = _sessions(port, notebook)
        if "idle" in states:
            return
        time.sleep(0.5)
    raise AssertionError(f"no idle kernel for {notebook} in {seconds} s: {states}; {_log_end(log)}")


def _cells_started(driver) -> bool:
    """Whether any code cell has run or is running (its prompt shows [*] or a count, not [ ])."""
    from selenium.webdriver.common.by import By

    return any(re.match(r"\[(\*|\d+)\]", e.text) for e in driver.find_elements(By.CSS_SELECTOR, ".jp-InputPrompt"))


def test_lab_opens_a_py_notebook_as_a_notebook_runs_it_and_shows_a_widget_and_a_figure(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    books = tmp_path / "notebooks"
    books.mkdir()
    shutil.copy(REPO_ROOT / "notebooks" / NOTEBOOK, books / NOTEBOOK)
    source = (books / NOTEBOOK).read_text()
    port = _free_port()
    env = dict(os.environ)  # a clean Jupyter home: only the workbook's own settings apply
    for var, sub in (
        ("JUPYTER_CONFIG_DIR", "cfg"),
        ("JUPYTERLAB_SETTINGS_DIR", "settings"),
        ("JUPYTER_RUNTIME_DIR", "rt"),
    ):
        env[var] = str(tmp_path / sub)
    env.pop("JUPYTER_CONFIG_PATH", None)
    env.pop("MPLBACKEND", None)  # conftest's Agg would keep the kernel's figures off the page
    # keep every cell in the page (JupyterLab detaches off-screen cells by default) so that the
    # test can find outputs above the last cell
    (tmp_path / "cfg" / "labconfig").mkdir(parents=True)
    (tmp_path / "cfg" / "labconfig" / "default_setting_overrides.json").write_text(
        '{"@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"}}'
    )
    log = tmp_path / "lab.log"  # a file, not a pipe: a pipe nobody reads fills up and stalls the server
    with log.open("w") as out:
        lab = subprocess.Popen(
            [
                sys.executable, "-m", "specdiag.cli", "lab", str(books), "--no-browser", f"--port={port}",
                "--IdentityProvider.token=", "--ServerApp.password=", "--ServerApp.ip=127.0.0.1", "--allow-root",
            ],
            env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(arg)
    driver = None
    try:
        _wait_http(f"http://127.0.0.1:{port}/api/status", 60)
        driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=DRIVER), options=opts)
        driver.get(f"http://127.0.0.1:{port}/lab/tree/{NOTEBOOK}")
        wait = WebDriverWait(driver, 90)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".jp-NotebookPanel .jp-Notebook .jp-Cell")))
        assert not driver.find_elements(By.CSS_SELECTOR, ".jp-FileEditor"), "opened as a text file"
        # Run All Cells is a no-op until the notebook has its kernel: wait for the session to be idle
        _wait_kernel_idle(port, NOTEBOOK, 120, log)
        run_menu = "//div[contains(@class,'lm-MenuBar-itemLabel') and text()='Run']"
        run_all = "//li[contains(@class,'lm-Menu-item') and not(contains(@class,'lm-mod-disabled'))]"
        run_all += "//div[contains(@class,'lm-Menu-itemLabel') and text()='Run All Cells']"
        for attempt in range(2):  # a second click only if the first started no cell at all (a lost click)
            wait.until(ec.element_to_be_clickable((By.XPATH, run_menu))).click()
            wait.until(ec.element_to_be_clickable((By.XPATH, run_all))).click()
            try:
                WebDriverWait(driver, 30).until(_cells_started)
                break
            except Exception:
                if attempt:
                    raise AssertionError(f"Run All Cells started no cell; {_log_end(log)}") from None
        found = {"figure": ".jp-OutputArea-output img", "widget": ".jp-OutputArea-output .widget-dropdown select"}
        error = ".jp-OutputArea-output[data-mime-type*='error']"
        try:  # generous for a cold 2-core CI machine; an error output ends the wait
            WebDriverWait(driver, 300).until(
                lambda d: (
                    d.find_elements(By.CSS_SELECTOR, error)
                    or all(d.find_elements(By.CSS_SELECTOR, c) for c in found.values())
                )
            )
        except Exception:
            seen = {k: len(driver.find_elements(By.CSS_SELECTOR, c)) for k, c in found.items()}
            prompts = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".jp-CodeCell .jp-InputPrompt")]
            raise AssertionError(
                f"after Run All Cells the page holds {seen}; prompts {prompts[:8]}; "
                f"kernels {_sessions(port, NOTEBOOK)}; {_log_end(log)}"
            ) from None
        errors = driver.find_elements(By.CSS_SELECTOR, error)
        assert not errors, errors[0].text[:500]
        assert all(driver.find_elements(By.CSS_SELECTOR, c) for c in found.values())
    except Exception:
        if driver is not None:
            driver.save_screenshot(str(tmp_path / "lab.png"))
        raise
    finally:
        if driver is not None:
            driver.quit()
        lab.terminate()
        try:
            lab.wait(timeout=20)
        except subprocess.TimeoutExpired:
            lab.kill()
    assert (books / NOTEBOOK).read_text() == source  # opening and running it rewrote nothing


def test_saving_a_notebook_in_jupyterlab_leaves_its_source_as_it_is(tmp_path):
    """JupyterLab saves through jupytext's contents manager: each notebook saved back is byte for byte the same."""
    from jupyter_server.services.contents.largefilemanager import LargeFileManager
    from jupytext.sync_contentsmanager import build_sync_jupytext_contents_manager_class

    for p in (REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.py"):
        shutil.copy(p, tmp_path / p.name)
    cm = build_sync_jupytext_contents_manager_class(LargeFileManager)(root_dir=str(tmp_path))
    for p in sorted(tmp_path.glob("*.py")):
        model = cm.get(p.name, content=True, type="notebook")
        model["content"].metadata["language_info"] = {"name": "python"}  # what a live kernel adds
        cm.save(model, p.name)
        assert p.read_text() == (REPO_ROOT / "notebooks" / p.name).read_text(), p.name
    assert sorted(x.name for x in tmp_path.iterdir()) == sorted(
        x.name for x in (REPO_ROOT / "notebooks").glob("[0-9][0-9]_*.py")
    )


def test_lab_settings_make_python_files_open_as_notebooks():
    import json

    from specdiag.cli import lab_env

    env = lab_env({"JUPYTER_CONFIG_PATH": "/elsewhere"})
    ours = Path(env["JUPYTER_CONFIG_PATH"].split(os.pathsep)[0])
    assert env["JUPYTER_CONFIG_PATH"].endswith(os.pathsep + "/elsewhere")
    cfg = json.loads((ours / "labconfig" / "default_setting_overrides.json").read_text())
    assert cfg["@jupyterlab/docmanager-extension:plugin"]["defaultViewers"]["python"] == "Jupytext Notebook"
