from llmkit.cli.common import stage_command


@stage_command
def status(ctx):
    """Table of the workspace's artifacts in pipeline order (done / stale / incomplete / missing)
    and of the work stages left behind (partial / damaged): stage, size, age; then the commands
    that rebuild what is stale or missing, in the order to run them."""
    from llmkit.progress import is_tty
    from llmkit.status import NEEDS_REBUILD, human_age, workspace_status
    from llmkit.workspace import shown

    rows = workspace_status(ctx.workspace)
    if not rows:
        print(f"workspace {shown(ctx.workspace.root)} has no artifacts yet")
        return
    if is_tty():
        from rich.console import Console
        from rich.table import Table

        t = Table("artifact", "stage", "state", "size", "age", title=shown(ctx.workspace.root))
        colour = {"done": "green", "stale": "yellow", "incomplete": "red", "partial": "yellow",
                  "damaged": "red", "missing": "red"}
        for r in rows:
            t.add_row(r.name, r.stage, f"[{colour[r.state]}]{r.state}", r.size, human_age(r.age_s))
        Console().print(t)
    else:
        print(f"{'artifact':<20} {'stage':<12} {'state':<11} {'size':<26} age")
        for r in rows:
            print(f"{r.name:<20} {r.stage:<12} {r.state:<11} {r.size:<26} {human_age(r.age_s)}")
    for r in rows:
        if r.state == "damaged":
            print(f"{r.name}: some finished tasks lost files since; rerun `llmkit {r.stage}` "
                  "(same config and inputs) and it redoes them")
    todo = [r for r in rows if r.state in NEEDS_REBUILD]
    if todo:
        print("\nto rebuild, run in this order:")
        for r in todo:
            why = f"{r.state}: {r.why}" if r.why else r.state
            print(f"  {r.rebuild}  # {r.name} {why}" if r.rebuild else
                  f"  # {r.name} {why}: rerun the stage that built it")
