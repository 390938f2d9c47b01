from typing import Annotated, Optional

import typer

from llmkit.cli.common import stage_command
from llmkit.errors import UserError
from llmkit.stages import deferred

run_serve = deferred("llmkit.judge.server:run_serve")
run_export = deferred("llmkit.judge.export:run_export")
prepare_session = deferred("llmkit.judge.session:prepare_session")
run_model_judge = deferred("llmkit.judge.model_rating:run_model_judge")


@stage_command(config=True, inputs=True, writes=True)
def judge(
    ctx,
    from_: Annotated[Optional[str], typer.Option(
        "--from", help="Models to compare, comma-separated checkpoint runs, e.g. sft,dpo,ppo.")] = None,
    prompts: Annotated[Optional[str], typer.Option(
        "--prompts", help="Prompt dataset (e.g. prompts_eval) or file (.jsonl with `prompt`, else a "
                          "prompt a line).")] = None,
    export: Annotated[bool, typer.Option(
        "--export", help="Write the judgements of session --in as a preference dataset (rm, dpo), "
                         "ranked lists, ratings and a Bradley-Terry ranking.")] = False,
    prepare: Annotated[bool, typer.Option(
        "--prepare", help="Only generate the replies into the session; serve it later with "
                          "`llmkit judge --in NAME`.")] = False,
    model: Annotated[Optional[str], typer.Option(
        "--model", help="A checkpoint run that judges the session itself (--in, default judge; or the one "
                        "--from/--prompts prepare): both orders of every item, verdicts into its journal "
                        "as rater model:RUN, then agreement with the human raters.")] = None,
    host: Annotated[str, typer.Option("--host", help="Address to listen on; beyond loopback needs --token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on (0: any free one).")] = 8765,
    token: Annotated[Optional[str], typer.Option(
        "--token", envvar="LLMKIT_JUDGE_TOKEN", help="Secret raters open the page with (?token=…).")] = None,
):
    """Blind side-by-side human judgements in the browser: replies of --from to --prompts generated once (session `judge`), then the judging page; --model RUN: a model judges them too; --export -> preference dataset `judge_prefs` (rm, dpo) with ratings and a Bradley-Terry ranking."""
    cfg = ctx.config()
    if model and (export or prepare):
        raise UserError("--model judges a session: give it the session (--in NAME) or --from and --prompts "
                        "to prepare one, not --export or --prepare")
    if model:
        session = prepare_session(ctx, cfg, from_, prompts) if (from_ or prompts) else ctx.input(default="judge")
        return run_model_judge(ctx, cfg, model, session)
    if export and (prepare or from_ or prompts):
        raise UserError("--export reads the judgements of an existing session (--in NAME); it takes no "
                        "--prepare, --from or --prompts: run those first, then `llmkit judge --export`")
    if export:
        return run_export(ctx, cfg)
    if prepare:
        return prepare_session(ctx, cfg, from_, prompts)
    run_serve(ctx, cfg, from_, prompts, host, port, token)
