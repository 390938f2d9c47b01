"""The live progress line of training stages (`llmkit.train.metrics.ConsoleLine`): a bar,
step / max_steps, loss, tokens/s and ETA on a terminal; the plain log lines elsewhere."""

import io

from llmkit.train.metrics import ConsoleLine, duration, format_record, live_text


class Terminal(io.StringIO):
    def isatty(self):
        return True


def record(step, loss=2.5, tokens_per_s=1234.4, **extra):
    return {"step": step, "loss": loss, "lr": 1e-3, "tokens_per_s": tokens_per_s, "step_s": 0.5, **extra}


def test_on_a_terminal_one_live_line_with_step_of_max_steps_loss_speed_and_eta():
    now = [100.0]
    out = Terminal()
    line = ConsoleLine(max_steps=10, clock=lambda: now[0], stream=out)
    line.show(record(1))          # took 0.5 s (step_s): 9 steps left -> 4.5 s
    assert line.eta_s(1, now[0]) == 4.5
    now[0] += 2.0                 # steps 2..5 in 2 s: 5 steps in 2.5 s since step 1 began
    line.show(record(5, loss=1.25))
    assert line.eta_s(5, now[0]) == 2.5
    line.show(record(5, loss=1.25, val_loss=1.5))  # validation stays above the live line
    line.close()
    text = out.getvalue()
    assert "step 5/10 | loss 1.25 | 1,234 tok/s | ETA 2s" in text
    assert format_record(record(5, loss=1.25, val_loss=1.5)) in text


def test_elsewhere_the_plain_log_lines():
    out = io.StringIO()
    line = ConsoleLine(max_steps=10, stream=out)
    line.show(record(1))
    line.show(record(2, loss=2.0))
    line.note("resumed")
    line.close()
    assert out.getvalue().splitlines() == [format_record(record(1)), format_record(record(2, loss=2.0)),
                                           "resumed"]


def test_live_text_and_durations():
    assert live_text({"step": 3}, None, None) == "step 3"
    assert live_text(record(120), 1000, 252) == "step 120/1000 | loss 2.5 | 1,234 tok/s | ETA 4m12s"
    assert [duration(s) for s in (0.4, 45, 252, 7500, 3 * 86400 + 4 * 3600)] == [
        "0s", "45s", "4m12s", "2h05m", "3d04h"]
