"""TensorBoard as a user sees it, in headless Chromium: a sweep's runs, their curves, and an HParams table that opens
on the swept key with each run's final metrics.

TensorBoard's pages are Polymer and Angular apps whose elements sit in shadow roots: the scripts below walk them and
return None until what they look for is drawn, and the test waits on that. Screenshots land in the test's tmp dir.
"""

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.helpers import CHROMEDRIVER, CHROMIUM, check_ok, free_port, read_json, run_module

pytestmark = [pytest.mark.slow, pytest.mark.browser]
RUNS = ["0/tensorboard", "1/tensorboard"]
JSON = {"Content-Type": "application/json"}

# `find(node, test)`: every element under `node`, shadow roots included, that `test` accepts.
FIND = """
function find(node, test, found = []) {
    for (const root of [node.shadowRoot, node]) {
        for (const child of root ? root.children : []) {
            if (test(child)) found.push(child);
            find(child, test, found);
        }
    }
    return found;
}
"""
# The Scalars page: the runs its selector lists, and the lines drawn on the `train/step_loss` chart.
SCALARS = (
    FIND
    + """
const [card] = find(document.body, e => e.localName === "tf-scalar-card" && e.tag === "train/step_loss");
const selector = find(document.body, e => e.localName === "tf-runs-selector")[0];
if (!card || !selector) return null;
const lines = find(card, e => e.localName === "path" && e.classList.contains("line") && e.getAttribute("d"));
const runs = find(selector, e => e.classList.contains("item-label-container")).map(e => e.innerText.trim());
return lines.length && runs.length ? {runs, lines: lines.length} : null;
"""
)
# The HParams page: its table as text (header row first) once every run has a row, and the hyperparameters its
# side panel lists, in its order, each with whether it is ticked (shown as a column).
HPARAMS = (
    FIND
    + f"""
const [grid] = find(document.body, e => e.localName === "vaadin-grid");
const [pane] = find(document.body, e => e.localName === "tf-hparams-query-pane");
if (!grid || !pane) return null;
const cell = c => {{ const slot = c.querySelector("slot"); return slot ? slot.assignedElements()[0] : null; }};
const rows = [...grid.shadowRoot.querySelectorAll("tr")].filter(r => !r.hidden).map(
    r => [...r.querySelectorAll("th, td")].filter(c => !c.hidden && cell(c)).map(c => cell(c).innerText.trim())
).filter(r => r.length);
if (rows.length < {len(RUNS) + 1}) return null;
const ticked = find(pane, e => e.localName === "paper-checkbox").map(e => [e.innerText.trim(), e.checked]);
return {{rows, ticked}};
"""
)


def test_sweep_in_the_browser_shows_both_runs_curves_and_the_swept_key_first_in_the_hparams_table(tmp_path: Path):
    sweep = tmp_path / "sweep"
    check_ok(run_module("project.train", "-m", "model.optimizer.lr=0.1,0.5", f"hydra.sweep.dir={sweep}", cwd=tmp_path))
    with serving_tensorboard(sweep) as address, headless_chromium() as browser:
        browser.get(f"{address}/#scalars&tagFilter=train%2Fstep_loss")
        scalars = wait_for(browser, SCALARS)
        browser.save_screenshot(str(tmp_path / "scalars.png"))
        assert scalars["runs"] == RUNS
        assert scalars["lines"] >= len(RUNS)  # a line per run (and its unsmoothed trace)

        browser.get(f"{address}/#hparams")
        hparams = wait_for(browser, HPARAMS)
        browser.save_screenshot(str(tmp_path / "hparams.png"))
    header, *rows = hparams["rows"]
    assert header[:3] == ["Trial ID", "Show Metrics", "model/optimizer/lr"]
    assert [row[0] for row in rows] == RUNS
    swept = [float(row[2]) for row in rows]
    assert swept == [0.1, 0.5]
    # Each job's final validation accuracy, as its results.json has it (the table shows 4 decimals or 5 digits).
    finals = [read_json(sweep / str(job) / "results.json")["val/acc"] for job in range(len(RUNS))]
    assert [float(row[header.index("hp/val_acc")]) for row in rows] == pytest.approx(finals, abs=1e-4)
    ticked = dict(hparams["ticked"])  # in the side panel's order
    assert next(iter(ticked)) == "model/optimizer/lr" and ticked["model/optimizer/lr"] and ticked["hp/val_acc"]
    # The constant keys: listed, to be ticked at will, and behind the swept one where TensorBoard shows them.
    assert {"seed", "data/batch_size", "trainer/max_epochs"} <= ticked.keys()
    assert not ticked["seed"] and not ticked["trainer/max_epochs"]


def wait_for(browser: WebDriver, script: str) -> dict:
    """What `script` returns once it returns something: the page has drawn what it looks for."""
    return WebDriverWait(browser, 60, poll_frequency=0.2).until(lambda driver: driver.execute_script(script))


@contextmanager
def serving_tensorboard(logdir: Path) -> Iterator[str]:
    """TensorBoard serving `logdir` on 127.0.0.1, its address once it lists every run with its hyperparameters (the
    page reads what the server has at that moment); stopped at the end."""
    port = free_port()
    command = [str(Path(sys.executable).parent / "tensorboard"), "--logdir", str(logdir), "--host", "127.0.0.1"]
    server = subprocess.Popen([*command, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    address = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while not lists_every_run(address):
            assert time.monotonic() < deadline and server.poll() is None, "tensorboard did not come up"
            time.sleep(0.5)
        yield address
    finally:
        server.terminate()
        server.wait(timeout=30)


def lists_every_run(address: str) -> bool:
    """Whether the server has read every run's hyperparameters and final metrics (the last things a run writes)."""
    statuses = ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]
    body = {"experimentName": "", "startIndex": 0, "sliceSize": 10, "allowedStatuses": statuses}
    request = urllib.request.Request(
        f"{address}/data/plugin/hparams/session_groups", data=json.dumps(body).encode(), headers=JSON
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            groups = json.loads(response.read())["sessionGroups"]
    except OSError:
        return False
    return [group["name"] for group in groups] == RUNS and all(group["metricValues"] for group in groups)


@contextmanager
def headless_chromium() -> Iterator[WebDriver]:
    """Debian's Chromium through its chromedriver; with both paths given, Selenium looks for nothing online."""
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1000"):
        options.add_argument(argument)
    browser = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield browser
    finally:
        browser.quit()
