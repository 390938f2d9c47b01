"""The judging page: static HTML, CSS and vanilla JavaScript, served as they are (no CDN, no
build step: it works offline). No data is in them; the script asks the API for items and puts
every prompt and reply on the page with textContent, never as HTML.

Under each reply, optional 1–5 scores (llmkit.judge.ratings): a row of native radio buttons per
criterion, so Tab reaches each row and arrows or the keys 1–5 set it, Delete clears it and
Escape hands the keys back to the page's shortcuts."""

from llmkit.judge.ratings import CRITERIA, HIGHEST, LOWEST


def score_rows(side: str, label: str) -> str:
    rows = "".join(
        f'<div class="criterion" role="radiogroup" aria-label="{c} of reply {label}"><span>{c}</span>'
        + "".join(f'<label><input type="radio" name="{side}-{c}" value="{v}">{v}</label>'
                  for v in range(LOWEST, HIGHEST + 1)) + "</div>"
        for c in CRITERIA)
    return (f'<fieldset class="scores" id="scores-{side}"><legend>scores, optional '
            f'({LOWEST} poor – {HIGHEST} good)</legend>{rows}</fieldset>')


PAGE_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>llmkit · blind comparison</title>
<link rel="stylesheet" href="/app.css">
<script src="/app.js" defer></script>
</head>
<body data-state="loading">
<header>
  <h1>Which reply is better?</h1>
  <span id="progress" data-done="0" data-total="0"></span>
  <span id="rater"></span>
  <button id="change-rater" type="button">change rater</button>
</header>
<section id="login" hidden>
  <label>Your name <input id="rater-input" maxlength="64" autocomplete="name"></label>
  <button id="start" type="button">Start</button>
</section>
<main id="judge" hidden>
  <section class="prompt"><h2>Prompt</h2><div id="prompt"></div></section>
  <section class="replies">
    <article><h2>Reply A</h2><div id="left" class="reply"></div>
      @SCORES-left@
      <button id="pick-left" type="button">A is better <kbd>&larr;</kbd></button></article>
    <article><h2>Reply B</h2><div id="right" class="reply"></div>
      @SCORES-right@
      <button id="pick-right" type="button">B is better <kbd>&rarr;</kbd></button></article>
  </section>
  <section class="actions">
    <button id="pick-tie" type="button">Equally good <kbd>=</kbd></button>
    <button id="pick-skip" type="button">Skip <kbd>s</kbd></button>
  </section>
</main>
<section id="finished" hidden><h2>All items judged — thank you.</h2></section>
<p id="status" role="status"></p>
</body>
</html>
""".replace("@SCORES-left@", score_rows("left", "A")).replace("@SCORES-right@", score_rows("right", "B"))

APP_CSS = """
body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 70rem; padding: 1rem; color: #222; }
header { display: flex; gap: 1rem; align-items: baseline; }
header h1 { font-size: 1.3rem; margin-right: auto; }
h2 { font-size: 1rem; margin: .4rem 0; color: #556; }
.prompt, .reply { white-space: pre-wrap; overflow-wrap: anywhere; }
.prompt { background: #f4f4f8; padding: .5rem 1rem; border-radius: .4rem; }
.prompt .turn { margin: .3rem 0; }
.replies { display: grid; grid-template-columns: 1fr 1fr; gap: 1rem; margin-top: 1rem; }
.replies article { border: 1px solid #ccd; border-radius: .4rem; padding: .5rem 1rem; }
.reply { min-height: 4rem; font-family: ui-monospace, monospace; }
.actions { display: flex; gap: 1rem; justify-content: center; margin-top: 1rem; }
button { font-size: 1rem; padding: .4rem .9rem; cursor: pointer; }
kbd { border: 1px solid #999; border-radius: .2rem; padding: 0 .3rem; font-size: .85rem; }
.scores { border: none; padding: 0; margin: .5rem 0; font-size: .9rem; color: #445; }
.scores legend { padding: 0; color: #778; }
.criterion { display: flex; gap: .5rem; align-items: center; }
.criterion span { width: 5.5rem; }
.criterion label { cursor: pointer; }
.criterion input:focus-visible { outline: 2px solid #36c; }
#status { min-height: 1.5rem; color: #555; }
body[data-state="retrying"] #status, body[data-state="error"] #status { color: #b00; }
"""

APP_JS = r"""
"use strict";
(function () {
  const query = new URLSearchParams(location.search);
  const token = query.get("token");
  const $ = (id) => document.getElementById(id);
  let rater = query.get("rater") || localStorage.getItem("llmkit-rater") || "";
  let current = null;   // the item on the page
  let busy = false;     // a judgement is on its way: keys and clicks wait for its answer

  function setState(state, message) {
    document.body.dataset.state = state;
    $("status").textContent = message;
  }

  function headers(extra) {
    const h = Object.assign({}, extra);
    if (token) h["X-Llmkit-Token"] = token;
    return h;
  }

  async function api(path, options) {
    const response = await fetch(path, Object.assign({cache: "no-store"}, options,
                                                     {headers: headers((options || {}).headers)}));
    const body = await response.json().catch(() => ({}));
    if (!response.ok) {
      const error = new Error(body.error || ("HTTP " + response.status));
      error.refused = true;  // the server answered: retrying would not help
      throw error;
    }
    return body;
  }

  function showProgress(answer) {
    const p = $("progress");
    p.dataset.done = answer.done;
    p.dataset.total = answer.total;
    p.textContent = answer.done + " / " + answer.total + " judged";
  }

  function renderPrompt(prompt) {
    const box = $("prompt");
    box.replaceChildren();
    const turns = Array.isArray(prompt) ? prompt : [{role: "", content: prompt}];
    for (const turn of turns) {
      const div = document.createElement("div");
      div.className = "turn";
      div.textContent = turn.role ? turn.role + ": " + turn.content : turn.content;
      box.appendChild(div);
    }
  }

  async function loadNext() {
    setState("loading", "loading…");
    let answer;
    try {
      answer = await api("/api/next?rater=" + encodeURIComponent(rater));
    } catch (e) {
      if (e.refused) return setState("error", e.message);
      setState("retrying", "server unreachable — retrying…");
      return setTimeout(loadNext, 1000);
    }
    showProgress(answer);
    if (answer.item === null || current === null || answer.item.id !== current.id) clearScores();
    current = answer.item;
    $("judge").hidden = current === null;
    $("finished").hidden = current !== null;
    if (current === null) return setState("finished", "");
    $("judge").dataset.item = current.id;
    renderPrompt(current.prompt);
    $("left").textContent = current.left;
    $("right").textContent = current.right;
    setState("ready", "");
  }

  function scoreInputs() {
    return document.querySelectorAll("#judge input[type=radio]");
  }

  function clearScores() {
    for (const input of scoreInputs()) input.checked = false;
  }

  function collectScores() {
    const scores = {};
    for (const input of scoreInputs()) {
      if (!input.checked) continue;
      const [side, criterion] = input.name.split("-");
      (scores[side] = scores[side] || {})[criterion] = Number(input.value);
    }
    return scores;
  }

  async function send(choice, item, scores) {
    try {
      const answer = await api("/api/judge", {
        method: "POST", headers: {"Content-Type": "application/json"},
        body: JSON.stringify({rater: rater, item: item, choice: choice, scores: scores})});
      showProgress(answer);
      busy = false;
      setState("saved", "saved (" + answer.choice + ")");
      loadNext();
    } catch (e) {
      if (e.refused) { busy = false; return setState("error", "not saved: " + e.message); }
      // no answer: maybe not on disk; the same rater and item make the same id, so resending
      // cannot count it twice
      setState("retrying", "not saved yet (server unreachable) — retrying…");
      setTimeout(() => send(choice, item, scores), 1000);
    }
  }

  function choose(choice) {
    if (busy || current === null || !rater) return;
    busy = true;
    setState("saving", "saving…");
    send(choice, current.id, collectScores());
  }

  function start(name) {
    rater = name.trim().slice(0, 64);
    if (!rater) return;
    localStorage.setItem("llmkit-rater", rater);
    $("rater").textContent = "rater: " + rater;
    $("login").hidden = true;
    loadNext();
  }

  function askName() {
    rater = "";
    current = null;
    $("judge").hidden = true;
    $("finished").hidden = true;
    $("login").hidden = false;
    $("rater-input").focus();
    setState("login", "");
  }

  const KEYS = {"ArrowLeft": "left", "ArrowRight": "right", "=": "tie", "s": "skip", "S": "skip"};
  // a focused score row keeps the keys the browser gives radio buttons (arrows move its choice)
  // and takes 1-5, Delete and Escape; every other key is the page's
  function scoreKey(event, input) {
    if (event.key.startsWith("Arrow") || event.key === " " || event.key === "Tab") return true;
    if (event.key === "Escape") {
      input.blur();
    } else if (event.key === "Delete" || event.key === "Backspace") {
      for (const r of document.getElementsByName(input.name)) r.checked = false;
    } else if (/^[1-5]$/.test(event.key)) {
      const r = document.querySelector('input[name="' + input.name + '"][value="' + event.key + '"]');
      r.checked = true;
      r.focus();
    } else {
      return false;
    }
    event.preventDefault();
    return true;
  }

  document.addEventListener("keydown", (event) => {
    if (event.target.id === "rater-input") {
      if (event.key === "Enter") start($("rater-input").value);
      return;
    }
    if (event.target.type === "radio" && scoreKey(event, event.target)) return;
    if (KEYS[event.key] && !event.ctrlKey && !event.metaKey && !event.altKey) {
      event.preventDefault();
      choose(KEYS[event.key]);
    }
  });
  document.addEventListener("DOMContentLoaded", () => {
    for (const choice of ["left", "right", "tie", "skip"]) {
      $("pick-" + choice).addEventListener("click", () => choose(choice));
    }
    $("start").addEventListener("click", () => start($("rater-input").value));
    // a score clicked with the mouse gives the keys back: ← then picks a reply, not a score
    for (const input of scoreInputs()) {
      input.addEventListener("click", (event) => { if (event.detail > 0) input.blur(); });
    }
    $("change-rater").addEventListener("click", askName);
    if (rater) start(rater); else askName();
  });
})();
"""
