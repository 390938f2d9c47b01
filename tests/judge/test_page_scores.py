"""The optional 1–5 scores on the judging page, in headless Chromium: set with the mouse, with
the keys 1–5 and the arrows on a focused row, cleared with Delete; sent with the judgement,
reset for the next item, never required."""

from __future__ import annotations

import json

from llmkit.judge.journal import JOURNAL_FILE, read_journal
from tests.judge.conftest import MODELS, Server, arithmetic_prompts, known_replies, needs_browser, write_session
from tests.judge.test_export import llmkit
from tests.judge.test_page import judge, wait_until

pytestmark = needs_browser


def radio(driver, name: str, value: int):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, f'input[name="{name}"][value="{value}"]')


def keys_on(driver, element, *keys) -> None:
    """Focus `element` (as Tab would) and press `keys` as a rater types them."""
    from selenium.webdriver.common.action_chains import ActionChains

    driver.execute_script("arguments[0].focus()", element)
    ActionChains(driver).send_keys(*keys).perform()


def checked(driver) -> dict:
    return driver.execute_script(
        "const out = {};"
        "for (const r of document.querySelectorAll('#judge input[type=radio]:checked')) out[r.name] = Number(r.value);"
        "return out;")


def test_scores_by_mouse_and_keys_go_with_the_judgement_and_are_optional(tmp_path, browser):
    from selenium.webdriver.common.keys import Keys

    ws = tmp_path / "ws"
    session = write_session(ws, "judged", arithmetic_prompts(3), known_replies(3, MODELS[:2]))
    with Server(session) as server:
        driver = browser()
        driver.get(f"{server.url}/?rater=sue")
        wait_until(driver, lambda s: s["state"] == "ready")
        radio(driver, "left-fluency", 4).click()  # the mouse; then ← must pick A, not move the score
        keys_on(driver, radio(driver, "right-safety", 1), "5")
        keys_on(driver, radio(driver, "right-relevance", 1), "2", Keys.DELETE, Keys.ESCAPE)
        assert checked(driver) == {"left-fluency": 4, "right-safety": 5}
        first = judge(driver, "key-left")

        assert checked(driver) == {}  # the next item starts unscored
        second = judge(driver, "key-tie")  # no score given: judged all the same

        wait_until(driver, lambda s: s["state"] == "ready")
        keys_on(driver, radio(driver, "left-relevance", 1), "3", Keys.ARROW_RIGHT)  # the browser's own move
        assert checked(driver) == {"left-relevance": 4}
        third = judge(driver, "key-skip")  # `s` on a focused row is still the page's
        wait_until(driver, lambda s: s["state"] == "finished")

    stored = {j["item"]: j for j in read_journal(session / JOURNAL_FILE)}
    assert [(item, stored[item]["choice"]) for item, _ in (first, second, third)] == [first, second, third]
    assert stored[first[0]]["scores"] == {"left": {"fluency": 4}, "right": {"safety": 5}}
    assert "scores" not in stored[second[0]]
    assert stored[third[0]]["scores"] == {"left": {"relevance": 4}}

    llmkit("judge", "--export", "-w", ws, "--in", "judged", "--out", "prefs", "--set", "resamples=20")
    ratings = [json.loads(line) for line in (ws / "prefs" / "ratings.jsonl").open()]
    by_side = {(r["item"], r["side"]): (r["model"], r["fluency"], r["relevance"], r["safety"]) for r in ratings}
    models = {(i, side): server.session.by_id[i][f"{side}_model"] for i in stored for side in ("left", "right")}
    assert by_side == {(first[0], "left"): (models[first[0], "left"], 4, None, None),
                       (first[0], "right"): (models[first[0], "right"], None, None, 5),
                       (third[0], "left"): (models[third[0], "left"], None, 4, None)}
