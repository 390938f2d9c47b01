from llmkit.cli.common import stage_command
from llmkit.stages import deferred

print_status = deferred("llmkit.status:print_status")


@stage_command
def status(ctx):
    """Table of the workspace's artifacts in pipeline order (done / stale / incomplete / missing)
    and of the work stages left behind (partial / damaged): stage, size, age; then the commands
    that rebuild what is stale or missing, in the order to run them."""
    print_status(ctx.workspace)
