"""The demo's human evaluation, with a scripted rater: `llmkit judge` end to end in a browser.

Generates SFT's, DPO's and PPO's replies to the first `--max-prompts` held-out prompts
(`llmkit judge --prepare`), serves the judging page (`llmkit judge`, a fresh process on a free
port) and judges every item in headless Chromium (Debian's chromium + chromedriver, selenium)
as a rater who reads only the page: ← or → for the reply the checker
(`llmkit.rewards.verify.exact_match` against the prompt's `answer`) finds right, `=` when both or
neither are, and a relevance score of 5 for a right reply and 1 for a wrong one (the keys 1–5
on the focused score row). Then `llmkit judge --export` and `llmkit report`, and a table of the
Bradley–Terry ranking beside exact match of the same replies.

    python bench/judge_demo.py -w workspace [--from sft,dpo,ppo] [--prompts prompts_eval]
        [--max-prompts 30] [--screenshot docs/judge-page.png] [--plot docs/judge-ranking.png]
"""

from __future__ import annotations

import sys

if sys.path and sys.path[0].rstrip("/").endswith("bench"):
    sys.path.pop(0)  # the repository root, not bench/, on the path

import argparse
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from llmkit.data.io import read_table  # noqa: E402
from llmkit.judge.session import read_items  # noqa: E402
from llmkit.rewards.verify import exact_match  # noqa: E402
from llmkit.train.distributed import free_port  # noqa: E402


def llmkit(ws: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "llmkit", *args, "-w", str(ws)], check=True)


def start_server(ws: Path, session: str, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "llmkit", "judge", "-w", str(ws), "--in", session,
                             "--port", str(port)])
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/next?rater=probe", timeout=2):
                return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the judging server did not start") from None
            time.sleep(0.2)


def open_browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=960,640", "--hide-scrollbars"):
        options.add_argument(arg)
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    return webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))


def page_state(driver) -> tuple[str, int]:
    return driver.execute_script("return [document.body.dataset.state, "
                                 "Number(document.getElementById('progress').dataset.done)]")


def score_relevance(driver, side: str, right: bool) -> None:
    """Focus the side's relevance row (as Tab would) and type its score, then give the keys back."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    row = driver.find_element(By.CSS_SELECTOR, f'input[name="{side}-relevance"][value="1"]')
    driver.execute_script("arguments[0].focus()", row)
    ActionChains(driver).send_keys("5" if right else "1", Keys.ESCAPE).perform()


def rate_everything(url: str, answers: dict[str, str], screenshot: Path | None) -> int:
    """Judge every item as the checker would; the number judged."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver = open_browser()
    driver.get(url + "/?rater=checker")
    judged, shot = 0, 0
    try:
        while True:
            while page_state(driver)[0] not in ("ready", "finished"):
                time.sleep(0.02)
            state, done = page_state(driver)
            if state == "finished":
                return judged
            prompt = driver.find_element(By.ID, "prompt").text
            right = {side: exact_match(driver.find_element(By.ID, side).text, answers[prompt])
                     for side in ("left", "right")}
            for side in ("left", "right"):
                score_relevance(driver, side, right[side])
            # a prompt any font shows (no CJK font needed), at best with a right and a wrong reply
            better = prompt.isascii() + (right["left"] != right["right"])
            if screenshot and judged >= 3 and prompt.isascii() and better > shot:
                driver.save_screenshot(str(screenshot))
                shot = better
            key = "=" if right["left"] == right["right"] else Keys.ARROW_LEFT if right["left"] else Keys.ARROW_RIGHT
            ActionChains(driver).send_keys(key).perform()
            while page_state(driver)[1] != done + 1:
                time.sleep(0.02)
            judged += 1
    finally:
        driver.quit()


def exact_match_counts(ws: Path, session: str, answers: dict[str, str]) -> dict[str, tuple[int, int]]:
    """(right, replies) per model over the session's own replies."""
    replies = {}
    for item in read_items(ws / session):
        for side in ("left", "right"):
            replies[item[f"{side}_model"], item["prompt_id"]] = (item[side], answers[item["prompt"]])
    counts: dict[str, tuple[int, int]] = {}
    for (model, _), (reply, answer) in replies.items():
        right, total = counts.get(model, (0, 0))
        counts[model] = (right + exact_match(reply, answer), total + 1)
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-w", "--workspace", type=Path)
    ap.add_argument("--from", dest="models", default="sft,dpo,ppo")
    ap.add_argument("--prompts", default="prompts_eval")
    ap.add_argument("--max-prompts", type=int, default=30)
    ap.add_argument("--session", default="judged")
    ap.add_argument("--screenshot", type=Path, help="save the page as the rater sees it (an item after the 3rd)")
    ap.add_argument("--plot", type=Path, help="copy the report's ranking plot here")
    args = ap.parse_args()
    if not args.workspace:
        return print("skip: needs -w, a demo workspace with its sft, dpo and ppo runs (make demo), and chromium")
    ws, session, prefs = args.workspace, args.session, f"{args.session}_prefs"
    answers = {r["prompt"]: r["answer"] for r in read_table(ws / args.prompts).to_pylist()}

    llmkit(ws, "judge", "--prepare", "--from", args.models, "--prompts", args.prompts, "--out", session,
           "--set", f"max_prompts={args.max_prompts}")
    port = free_port()
    server = start_server(ws, session, port)
    started = time.monotonic()
    try:
        judged = rate_everything(f"http://127.0.0.1:{port}", answers, args.screenshot)
    finally:
        server.terminate()
        server.wait()
    print(f"judged {judged} items in {time.monotonic() - started:.1f}s")
    llmkit(ws, "judge", "--export", "--in", session, "--out", prefs)
    llmkit(ws, "report", prefs)
    if args.plot:
        shutil.copyfile(ws / "report" / "report" / f"ranking-{prefs}.png", args.plot)

    summary = json.loads((ws / prefs / "ranking.json").read_text())
    relevance = {m["model"]: m["mean"] for m in summary["criteria"] if m["criterion"] == "relevance"}
    counts = exact_match_counts(ws, session, answers)
    print("\n| model | Bradley–Terry [95% interval] | relevance (mean) | exact match |\n|---|---|---|---|")
    for r in summary["ranking"]:
        right, total = counts[r["model"]]
        print(f"| {r['model']} | {r['score']:+.2f} [{r['ci_low']:+.2f}, {r['ci_high']:+.2f}] "
              f"| {relevance.get(r['model'], float('nan')):.2f} | {right}/{total} |")


if __name__ == "__main__":
    main()
