"""Scripted agents the tests drive phones with (over the wire or in process)."""

from __future__ import annotations

from digirl_lite.actions import Action, ActionType, format_action


class Tapper:
    """Taps the middle of the screen twice, then says the task is done (every episode 3
    steps, each judged)."""

    def __init__(self, slot: int) -> None:
        del slot

    def act(self, obs) -> str:
        if obs.step >= 2:
            return format_action(Action.key(ActionType.STATUS_TASK_COMPLETE))
        return format_action(Action.tap(x=0.5, y=0.5))


class TwinExpert:
    """The simulator's expert over the wire, for served phones without surprises: it keeps
    an in-process twin of its phone (the episode's task loaded at step 0), reads the twin's
    state, and applies each action's gesture to the twin as the phone gets it."""

    def __init__(self, slot: int) -> None:
        from digirl_lite.envs.sim import SimPhoneEnv, Surprises

        del slot
        self.twin = SimPhoneEnv("webshop", surprises=Surprises.none())

    def act(self, obs) -> str:
        from digirl_lite.actions import to_gesture
        from digirl_lite.envs.sim.agents import expert_action
        from digirl_lite.envs.sim.world import HEIGHT, WIDTH

        if obs.step == 0:
            self.twin.load_task(obs.task, 0)
        action = expert_action(self.twin.state, self.twin.task)
        if not action.ends_episode:
            self.twin.apply_gesture(to_gesture(action, WIDTH, HEIGHT))
        return format_action(action)


def play(env, agent, task, seed: int) -> tuple[float, dict]:
    """One episode of ``agent`` on ``env`` for ``task``: the last step's reward and info."""
    obs, _ = env.reset(seed=seed, task=task)
    while True:
        obs, reward, term, trunc, info = env.step(agent.act(obs))
        if term or trunc:
            return reward, info


def experts():
    """The simulator's scripted expert on every slot of a fleet (it reads the phone's state:
    for tests of the fleets, never of an agent)."""
    from digirl_lite.envs.sim import ScriptedExpert
    from digirl_lite.rollout.fleet import ScriptedBatchAgent

    return ScriptedBatchAgent(lambda slot: ScriptedExpert())
