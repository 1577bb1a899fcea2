"""retry-until-tests-pass: implement, run the tests in a `command` task, feed failures back.

The agent works in one session: each fix resumes it on the previous branch.
The check runs inside the task's own container on an isolated clone of the
branch (``import_policy="never"``: /workspace is read-only there, so the test
command must not need to write into the repository; pytest gets
``-p no:cacheprovider``).

    orchestrator "make the parser accept empty input" \
        --strategy examples/strategies/retry_until_tests_pass.py -S max_attempts=3
"""

from typing import Annotated

from orchestrator.strategy import Context, TaskResult


def branch_of(result: TaskResult) -> str:
    return result["artifact"]["branch_final"] or result["artifact"]["base"]


async def retry_until_tests_pass(
    prompt: str,
    base_branch: str,
    ctx: Context,
    *,
    test_command: Annotated[
        str, "shell command run on the branch; exit 0 means pass"
    ] = "python -m pytest -q -p no:cacheprovider",
    max_attempts: Annotated[int, "agent attempts (the first one plus fixes)"] = 3,
) -> TaskResult:
    """Implement, test in a container, and let the agent fix failures until the tests pass."""
    session = ctx.key("session")  # one agent session for the whole chain
    result = await ctx.wait(
        ctx.run({"prompt": prompt, "base_branch": base_branch, "session_group_key": session}, key=ctx.key("attempt", 1))
    )
    for attempt in range(1, max_attempts + 1):
        branch = branch_of(result)
        try:
            await ctx.wait(
                ctx.run(
                    {"plugin": "command", "command": test_command, "base_branch": branch, "import_policy": "never"},
                    key=ctx.key("test", attempt),
                )
            )
            return result  # the passing attempt: the summary shows its branch
        except ctx.errors.TaskFailed as exc:
            if exc.error_type != "command":
                raise  # the check could not run at all (Docker, git): not the agent's fault
            failure = exc.message
        if attempt == max_attempts:
            break
        result = await ctx.wait(
            ctx.run(
                {
                    "prompt": (
                        f"The tests fail on your work (`{test_command}`):\n{failure}\n\n"
                        f"Fix the code so they pass, then commit. The original task was:\n{prompt}"
                    ),
                    "base_branch": branch,
                    "session_group_key": session,
                    "resume_session_id": result["session_id"],
                },
                key=ctx.key("attempt", attempt + 1),
            )
        )
    raise ctx.errors.NoViableCandidates(f"tests still fail after {max_attempts} attempts; last branch {branch}")
