"""TESTS ONLY: make an engine fail on purpose, to test what clients see when a step raises.

Installed by the `llm` model only when its config.pbtxt parameter `fault_inject_after_steps` is
N > 0 (the shipped config leaves it unset, which is 0 = off): once the engine has run N steps,
every further step raises InjectedFault. The engine loop then fails the requests in flight and
stops (engine_loop.py), exactly as for a real failure of the model step.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class InjectedFault(RuntimeError):
    """The failure fault_inject_after_steps asked for."""


def install_step_fault(engine, after_steps: int) -> None:
    """Wrap engine.step so that it raises once engine.num_steps >= after_steps (> 0)."""
    if after_steps <= 0:
        return
    real_step = engine.step

    def step(*args, **kwargs):
        if engine.num_steps >= after_steps:
            raise InjectedFault(f"fault injected after {after_steps} engine steps "
                                f"(config.pbtxt parameter fault_inject_after_steps, for tests only)")
        return real_step(*args, **kwargs)

    engine.step = step
    log.warning("fault injection armed: the engine fails after %d steps (fault_inject_after_steps)", after_steps)
