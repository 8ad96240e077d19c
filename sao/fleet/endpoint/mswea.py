"""mini-swe-agent, unmodified, as a harness: its agent and model classes, our sandbox.

mini-swe-agent (the ``mini-swe-agent`` package, pinned in setup.py's
``harness`` extra) calls the endpoint through litellm like any OpenAI
provider: one ``bash`` function in ``tools``, ``tool_calls`` read back, each
command's result sent as a ``tool`` message. Its environment interface is
pluggable: ``SandboxEnvironment`` runs every command in a *workspace*, any
object with ``execute(command, cwd, timeout) -> {"returncode", "output"}``
(``sao.envs.swe``'s ``Workspace``: the namespace sandbox, no network, the
repository copied in), and keeps mini-swe-agent's own end-of-task rule
(first output line ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``).

Offline: importing this module sets (unless already set) the variables that
keep mini-swe-agent and litellm off the network and quiet
(``OFFLINE_ENV``: a local cost map, cost errors ignored, no start-up banner,
a scratch config directory, no retries with minute-long back-offs);
tests/endpoint/test_mswea.py proves that the import makes no connection.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import pathlib
import platform
from typing import Any, Callable, Mapping

OFFLINE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",      # else litellm fetches a price map at import
    "MSWEA_COST_TRACKING": "ignore_errors",      # our model has no price: not an error
    "MSWEA_SILENT_STARTUP": "1",
    "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1",  # the endpoint is local: a refusal is final
    "LITELLM_LOG": "ERROR",
}


def configure_offline(config_dir: str | None = None) -> None:
    """Sets ``OFFLINE_ENV`` and ``MSWEA_GLOBAL_CONFIG_DIR`` (default
    ``~/.cache/sao/mini-swe-agent``; mini-swe-agent creates it at import and
    reads a ``.env`` there) where they are not set yet."""
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    scratch = config_dir or str(pathlib.Path.home() / ".cache" / "sao" / "mini-swe-agent")
    os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", scratch)


configure_offline()

import litellm  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from minisweagent.models.litellm_model import LitellmModel  # noqa: E402

from sao.fleet.endpoint.episode import HarnessResult  # noqa: E402

litellm.suppress_debug_info = True   # no "Give Feedback / Get Help" banner per refused call

SYSTEM_TEMPLATE = (
    "You are a software engineer fixing a bug in a Python repository. Call the bash tool "
    "with one command at a time. When the tests pass, run exactly: "
    "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
INSTANCE_TEMPLATE = "{{task}}"


class SandboxEnvironment(LocalEnvironment):
    """mini-swe-agent's environment interface over a sandboxed ``workspace``.

    Only ``execute`` and the template variables differ from its local
    environment: commands run in the workspace (never on the host), and the
    host's environment variables are not offered to prompt templates.
    """

    def __init__(self, workspace, *, timeout: int = 30, **kwargs):
        super().__init__(timeout=timeout, **kwargs)
        self.workspace = workspace

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        command = action.get("command", "")
        try:
            result = self.workspace.execute(command, cwd or self.config.cwd,
                                            timeout or self.config.timeout)
            output = {"output": str(result["output"]), "returncode": int(result["returncode"]),
                      "exception_info": ""}
        except Exception as e:  # the sandbox failed: the agent sees it, the episode goes on
            output = {"output": "", "returncode": -1,
                      "exception_info": f"the command could not run: {type(e).__name__}: {e}"}
        self._check_finished(output)
        return output

    def get_template_vars(self, **kwargs) -> dict[str, Any]:
        return {**self.config.model_dump(), **platform.uname()._asdict(), **kwargs}


class MiniSweAgentHarness:
    """Runs ``DefaultAgent`` per episode in a thread of its own pool.

    Args:
      make_workspace: ``prompt -> workspace`` (the task's repository, sandboxed).
      grade: ``(prompt, workspace) -> (reward, facts)`` after the agent stopped.
      task_text: ``prompt -> str`` given as mini-swe-agent's ``{{task}}``.
      step_limit: model calls per episode (mini-swe-agent's ``step_limit``).
      command_timeout_s: per-command wall seconds.
      max_threads: episodes at once (the worker's ``max_concurrency``).
      agent_kwargs: more ``AgentConfig`` fields (templates, ``wall_time_limit_seconds``).
      request_timeout_s: litellm's timeout of one model call.
      max_output_chars: a command's output shown to the model, characters
        (head and tail kept; mini-swe-agent's ``observation_template``).

    An episode the agent did not submit (step limit, repeated format
    errors) is reported ``truncated`` with reward 0.
    """

    def __init__(self, make_workspace: Callable[[Mapping], Any],
                 grade: Callable[[Mapping, Any], tuple[float, dict]],
                 task_text: Callable[[Mapping], str], *, step_limit: int,
                 command_timeout_s: int = 30, max_threads: int = 16,
                 agent_kwargs: Mapping[str, Any] | None = None, request_timeout_s: float = 600.0,
                 max_output_chars: int = 2000):
        self.make_workspace, self.grade, self.task_text = make_workspace, grade, task_text
        self.step_limit, self.command_timeout_s = step_limit, command_timeout_s
        self.agent_kwargs = {"system_template": SYSTEM_TEMPLATE,
                             "instance_template": INSTANCE_TEMPLATE, **(agent_kwargs or {})}
        self.request_timeout_s = request_timeout_s
        half = max(1, max_output_chars // 2)
        self.observation_template = (
            "{% if output.exception_info %}<exception>{{output.exception_info}}</exception>\n"
            "{% endif %}<returncode>{{output.returncode}}</returncode>\n<output>\n"
            f"{{% if output.output | length > {2 * half} %}}"
            f"{{{{output.output[:{half}]}}}}\n[... output clipped ...]\n{{{{output.output[-{half}:]}}}}"
            "{% else %}{{output.output}}{% endif %}</output>")
        self._pool = concurrent.futures.ThreadPoolExecutor(max_threads, "mswea")

    def run_sync(self, prompt: Mapping, base_url: str, api_key: str) -> HarnessResult:
        """One episode, blocking: agent, then grading of the workspace it left."""
        workspace = self.make_workspace(prompt)
        model = LitellmModel(model_name="openai/sao-policy", cost_tracking="ignore_errors",
                             observation_template=self.observation_template,
                             model_kwargs={"api_base": base_url, "api_key": api_key,
                                           "timeout": self.request_timeout_s})
        env = SandboxEnvironment(workspace, timeout=self.command_timeout_s)
        agent = DefaultAgent(model, env, step_limit=self.step_limit, cost_limit=0.0,
                             **self.agent_kwargs)
        info = agent.run(task=self.task_text(prompt))
        status = info.get("exit_status", "")
        facts = {"exit_status": status, "model_calls": agent.n_calls}
        if status != "Submitted":
            return HarnessResult(0.0, facts, truncated=True)
        reward, graded = self.grade(prompt, workspace)
        return HarnessResult(float(reward), {**facts, **graded})

    async def run(self, prompt: Mapping, base_url: str, api_key: str) -> HarnessResult:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.run_sync, prompt, base_url, api_key)
