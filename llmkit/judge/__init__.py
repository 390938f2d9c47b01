"""Human evaluation (`llmkit judge`): people compare two models' replies blind, in a browser.

`session` generates every model's reply to every prompt ahead (an artifact, so judging is
instant) and pairs them into items whose left/right sides are drawn once and stored; `server`
serves one offline page (`page`) on the standard library's http.server; `journal` makes each
judgement, with its optional 1–5 scores (`ratings`), durable before the page is told it is
saved; `export` turns the journal into a preference dataset that `llmkit rm` and `llmkit dpo`
read, ranked lists, the scores, and a Bradley–Terry ranking of the models (`ranking`) that
`llmkit report` plots. A model rates the same items as a rater too (`llmkit judge --model RUN`,
`model_rating` over `model_judge`: both orders, label probabilities), and `agreement` sets it
beside the human raters (agreement rate, Cohen's kappa, position bias).
"""
