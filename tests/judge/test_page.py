"""The judging page in a real browser (headless Chromium driven by selenium): two raters judge at
the same time with clicks and keys; the export holds exactly their judgements and `llmkit rm` and
`llmkit dpo` train on it; the page never names a model and shows markup in prompts and replies
as text; a server killed with SIGKILL and restarted keeps every confirmed judgement, once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.data.io import read_table
from llmkit.judge.journal import JOURNAL_FILE, read_journal
from llmkit.judge.session import read_items
from llmkit.train.distributed import free_port
from tests.judge.conftest import (MODELS, Server, arithmetic_prompts, call, known_replies, needs_browser,
                                  write_session)

pytestmark = needs_browser
CHOICE = {"click-left": "left", "click-right": "right", "key-left": "left", "key-right": "right",
          "key-tie": "tie", "key-skip": "skip"}
KEY = {"key-left": "\ue012", "key-right": "\ue014", "key-tie": "=", "key-skip": "s"}  # selenium's Keys


def llmkit(*args) -> str:
    result = CliRunner().invoke(build_app(), [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


def page_state(driver) -> dict:
    return driver.execute_script(
        "const p = document.getElementById('progress');"
        "return {state: document.body.dataset.state, done: Number(p.dataset.done),"
        "        item: document.getElementById('judge').dataset.item || null};")


def wait_until(driver, test, timeout: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        state = page_state(driver)
        if test(state):
            return state
        assert time.monotonic() < deadline, f"page stuck at {state}"
        time.sleep(0.03)


def press(driver, action: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    if action.startswith("click-"):
        driver.find_element(By.ID, f"pick-{CHOICE[action]}").click()
    else:
        ActionChains(driver).send_keys(KEY[action]).perform()


def judge(driver, action: str, models=MODELS) -> tuple[str, str]:
    """(item, choice) of one judgement, once the page has confirmed it (the server answers only
    after the fsync) and shows the next item."""
    before = wait_until(driver, lambda s: s["state"] == "ready")
    assert not any(m in driver.page_source for m in models)  # blind
    press(driver, action)
    wait_until(driver, lambda s: s["done"] == before["done"] + 1 and s["state"] in ("ready", "finished"))
    return before["item"], CHOICE[action]


def rater_session(open_browser, url: str, rater: str, actions: list[str], by_form: bool) -> list[tuple]:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver = open_browser()
    if by_form:
        driver.get(url + "/")
        wait_until(driver, lambda s: s["state"] == "login")
        driver.find_element(By.ID, "rater-input").send_keys(rater, Keys.ENTER)
    else:
        driver.get(f"{url}/?rater={rater}")
    return [(rater, *judge(driver, a)) for a in actions]


def test_two_raters_at_once_their_20_judgements_exported_and_trained_on(tmp_path, browser, tok):
    from tests.train.posttrain_fixtures import tiny_model, write_checkpoint_run

    ws = tmp_path / "ws"
    session = write_session(ws, "judged", arithmetic_prompts(8), known_replies(8))
    items = {i["id"]: i for i in read_items(session)}
    plans = {"ann": ["click-left", "key-right", "key-left", "click-right", "key-left"] * 2,
             "bob": ["key-right", "click-left", "click-right", "key-left", "key-right"] * 2}
    with Server(session) as server, ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(rater_session, browser, server.url, r, plan, r == "ann") for r, plan in plans.items()]
        judged = [j for run in runs for j in run.result()]
    assert len(judged) == 20 and len({(r, i) for r, i, _ in judged}) == 20

    llmkit("judge", "--export", "-w", ws, "--in", "judged", "--out", "prefs", "--set", "resamples=50")
    rows = read_table(ws / "prefs").to_pylist()
    assert sorted((r["rater"], r["item"]) for r in rows) == sorted((r, i) for r, i, _ in judged)
    for rater, item, choice in judged:
        row = next(r for r in rows if (r["rater"], r["item"]) == (rater, item))
        loser = "right" if choice == "left" else "left"
        assert (row["chosen"], row["rejected"]) == (items[item][choice], items[item][loser])
        assert (row["chosen_model"], row["prompt"]) == (items[item][f"{choice}_model"], items[item]["prompt"])
    assert len({r["id"] for r in rows}) == 20

    write_checkpoint_run(ws, "sft", tiny_model(tok.vocab_size), tok)
    small = ["--set", "max_steps=1", "--set", "micro_batch_size=4", "--set", "seq_len=64", "--set",
             "warmup_steps=0", "--set", "eval_every=0", "--set", "eval_fraction=0.2"]
    llmkit("rm", "-w", ws, "--from", "sft", "--in", "prefs", *small)
    llmkit("dpo", "-w", ws, "--from", "sft", "--in", "prefs", *small, "--set", "eval_records=1",
           "--set", "max_new_tokens=2")
    rm, dpo = (json.loads((ws / run / "manifest.json").read_text())["stats"] for run in ("rm", "dpo"))
    assert rm["steps"] == dpo["steps"] == 1
    assert dpo["pairs"] + dpo["heldout_pairs"] == 20 and 0 < dpo["pairs"] < 20


XSS_PROMPT = "<script>alert('prompt')</script><img src=x onerror=\"alert('img')\"> & what?"
XSS_REPLY = "<b onmouseover=alert(1)>bold</b><img src=y onerror=alert(2)>"


def test_markup_is_shown_as_text_no_model_is_named_and_tie_and_skip_keys_record(tmp_path, browser):
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    prompts = [("x", XSS_PROMPT), ("y", "Plain?")]
    session = write_session(tmp_path / "ws", "judged", prompts,
                            {MODELS[0]: [XSS_REPLY, "one"], MODELS[1]: ["fine", XSS_PROMPT]})
    with Server(session) as server:
        driver = browser()
        driver.get(f"{server.url}/?rater=eve")
        shown = []
        for action in ("key-tie", "key-skip"):
            state = wait_until(driver, lambda s: s["state"] == "ready")
            item = server.session.by_id[state["item"]]
            texts = {box: driver.find_element(By.ID, box).text for box in ("prompt", "left", "right")}
            assert texts == {"prompt": item["prompt"], "left": item["left"], "right": item["right"]}
            assert not driver.find_elements(By.CSS_SELECTOR, "#judge img, #judge script, #judge b")
            with pytest.raises(NoAlertPresentException):
                driver.switch_to.alert.text
            shown.append(driver.page_source)
            judge(driver, action)
        wait_until(driver, lambda s: s["state"] == "finished")
        api = [json.dumps(call(f"{server.url}/api/next?rater={r}")[1]) for r in ("eve", "newcomer")]
        assert not [m for m in MODELS for text in shown + api if m in text]
        choices = {r["item"]: r["choice"] for r in read_journal(session / JOURNAL_FILE)}
        assert sorted(choices.values()) == ["skip", "tie"]


def start_server(ws, port: int, kill_at: str | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "LLMKIT_KILL_AT"}
    if kill_at:
        env["LLMKIT_KILL_AT"] = kill_at
    proc = subprocess.Popen([sys.executable, "-m", "llmkit", "judge", "-w", str(ws), "--in", "judged",
                             "--port", str(port)], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            if call(f"http://127.0.0.1:{port}/api/next?rater=probe")[0] == 200:
                return proc
        except OSError:
            pass
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.1)


def test_sigkill_and_restart_keep_every_confirmed_judgement_once(tmp_path, browser):
    ws = tmp_path / "ws"
    session = write_session(ws, "judged", arithmetic_prompts(4), known_replies(4))
    port = free_port()
    # the 4th judgement reaches the disk, then the server dies before it answers
    proc = start_server(ws, port, kill_at="journal_synced@4")
    driver = browser()
    driver.get(f"http://127.0.0.1:{port}/?rater=cat")
    confirmed = [judge(driver, a) for a in ("key-left", "click-right", "key-right")]
    fourth = wait_until(driver, lambda s: s["state"] == "ready")["item"]
    press(driver, "key-left")
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert wait_until(driver, lambda s: s["state"] == "retrying")["done"] == 3  # never said saved
    with open(session / JOURNAL_FILE, "ab") as f:  # a 5th judgement cut mid-write by a kill
        f.write(b'{"id": "0123456789abcdef", "rater": "cat", "it')

    proc = start_server(ws, port)  # the page's retry is answered with the judgement on disk
    wait_until(driver, lambda s: s["done"] == 4 and s["state"] == "ready")
    confirmed += [(fourth, "left"), judge(driver, "key-right")]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    proc = start_server(ws, port)
    driver.refresh()  # the rater resumes where they were
    assert wait_until(driver, lambda s: s["state"] == "ready")["done"] == 5
    confirmed.append(judge(driver, "click-left"))
    proc.terminate()
    proc.wait()
    llmkit("judge", "--export", "-w", ws, "--in", "judged", "--out", "prefs", "--set", "resamples=10")
    exported = [json.loads(line) for line in (ws / "prefs" / "judgements.jsonl").open()]
    assert [(j["item"], j["choice"]) for j in exported] == confirmed
    assert len({j["id"] for j in exported}) == 6
