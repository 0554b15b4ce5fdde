"""Darwin's learner (spec/DARWIN.md A.5, A.6): token-level PPO with GAE over the flattened
action tokens and a value head on the policy's decoder, trained on each online iteration's
own trajectories against the log-probabilities recorded when they were sampled.

The offline phase warms the value head up on the pile (the actor frozen; A.6) and, with
``offline_policy_passes``, runs the same update over the pile (the starting policy's own
attempts). Each iteration logs what tells an update's health apart (issue 28): the share of
sampled steps that did not parse, the policy's entropy and KL to the starting policy, the
clip fraction and ratio range, and the gradient norms of the policy and the value head.

The math is :mod:`digirl_lite.ppo`'s; the rows :mod:`digirl_lite.policy.on_policy`'s; one
update :func:`digirl_lite.policy.updates.ppo_update`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from digirl_lite.errors import ConfigError
from digirl_lite.learners import register
from digirl_lite.learners.base import Learner

if TYPE_CHECKING:  # pragma: no cover
    from digirl_lite.data.records import Trajectory
    from digirl_lite.policy.on_policy import PPORow

__all__ = ["PPO", "OnPolicyConfig", "ON_POLICY_FIELDS"]

ON_POLICY_FIELDS = ("ppo_clip_eps", "ppo_epochs", "ppo_minibatch", "kl_coef", "kl_reference",
                    "offline_policy_passes", "offline_imitation", "policy_loss_norm",
                    "negative_advantage_scale")
"""The config fields PPO and GRPO both read (the clipped update, the KL, the offline
phase); PPO adds its value head's and GAE's."""

# -- the config section of PPO and GRPO (flat in DigiRLConfig; ``docs/config.md`` gives the
# measurements behind the defaults that are this project's choices) -------------------
@dataclass
class OnPolicyConfig:
    """PPO's and GRPO's updates, and their offline phase."""

    ppo_clip_eps: float = 0.2
    """PPO's clip epsilon (Schulman et al. 2017; DARWIN.md D)."""
    ppo_epochs: int = 2
    """Passes over each iteration's tokens (Darwin gives no number; few passes keep the
    policy near the one that sampled)."""
    ppo_minibatch: int = 32
    """Steps per PPO update (all of a step's action tokens together)."""
    ppo_gamma: float = 0.99
    """PPO's discount across steps (:data:`digirl_lite.ppo.GAMMA`)."""
    ppo_lam: float = 1.0
    """GAE's lambda over the flattened action tokens; 1: Monte-Carlo advantages (Schulman's
    0.95 reached about one step back and PPO did not learn)."""
    value_coef: float = 0.5
    """Weight of the value head's MSE in PPO's loss (Schulman et al. 2017's c1 = 0.5)."""
    value_lr: float = 1e-3
    """The value head's learning rate (its own AdamW group; the rest keeps ``actor_lr``)."""
    value_bias: float = 0.1
    """The output bias of a fresh value head (DARWIN.md A.6: 0.1); a loaded head keeps its
    own."""
    kl_coef: float = 0.0
    """Weight of the k3 KL penalty to ``kl_reference`` in PPO's and GRPO's loss (0: off; both
    KLs are logged either way)."""
    kl_reference: str = "start"
    """What the KL penalty pulls towards: "start" (the online phase's starting policy,
    frozen) or "sampling" (the policy that sampled the iteration)."""
    negative_advantage_scale: float = 1.0
    """Multiplies every negative advantage in PPO's and GRPO's policy loss (1: the plain
    objective; 0: only better-than-expected tokens are pushed, up)."""
    value_grad_clip: float | None = None
    """PPO: the value head's own gradient-norm cap; None: one cap, ``actor_grad_clip``, over
    the policy and the value head together."""
    advantage_norm: str = "none"
    """PPO: "none" (GAE's advantages as they are) or "batch" (standardised over the
    iteration's tokens)."""
    policy_loss_norm: str | None = None
    """How the policy loss (and KL) averages over tokens: "token" (PPO's default) or
    "trajectory" (each trajectory weighs alike; GRPO's default); None: the algorithm's own."""
    offline_policy_passes: int = 0
    """Passes of the learner's own update over the pile in the offline phase (after PPO's
    value warm-up); 0: none (Darwin A.6)."""
    offline_imitation: bool | None = None
    """The offline phase first runs Filtered BC's ``offline_actor_updates`` on the pile's
    successes; None: the algorithm's own (True for PPO and GRPO)."""
    grpo_group: int = 4
    """GRPO: attempts per task per iteration (``rollouts_per_iteration`` must be a multiple;
    Darwin gives no number)."""
    grpo_groups: str = "draw"
    """GRPO: a group is the ``grpo_group`` attempts of one draw of a task ("draw") or every
    attempt at the same task text in the iteration ("task")."""
    critic_warmup_updates: int = 30
    """PPO's offline phase: value-head-only updates on the pile, the actor frozen (Darwin
    A.6: 30 warm-up steps kept a fresh critic from collapsing the policy)."""


REFERENCE_MAX_PARAMETERS = 50_000_000
"""A policy up to this size keeps a frozen copy of its start (for the KL reading) even with
no KL penalty: the copy and one scoring pass per iteration cost little."""


@register("ppo")
class PPO(Learner):
    on_policy = True
    reads = (*ON_POLICY_FIELDS, "ppo_gamma", "ppo_lam", "value_coef", "value_lr",
             "value_bias", "critic_warmup_updates", "value_grad_clip", "advantage_norm")
    defaults = {"actor_lr": 1e-5, "policy_loss_norm": "token", "offline_imitation": True}
    """Issue 28: 10x below the imitation learners' rate (see the config's ``actor_lr``), a
    token mean, and Filtered BC's offline phase first (``offline_imitation``)."""
    data_parallel = False
    """Each process would take its own number of minibatches and the collectives would
    hang: one process until the on-policy updates are made data parallel."""
    own_offline_work = "the value head's warm-up"
    value_coef_applies = True  # GRPO: no value head in the loss

    def __init__(self, run) -> None:
        super().__init__(run)
        self._reference = None  # the frozen starting policy (reference_policy)
        self._reference_state: dict[str, Any] | None = None  # from a checkpoint, not built

    # -- its config section -----------------------------------------------------------------
    @classmethod
    def check_config(cls, cfg) -> None:
        if not 0 < cfg.ppo_clip_eps < 1:
            raise ValueError(f"ppo_clip_eps must be in (0, 1), got {cfg.ppo_clip_eps}")
        if not (0 <= cfg.ppo_gamma <= 1 and 0 <= cfg.ppo_lam <= 1):
            raise ValueError(f"ppo_gamma and ppo_lam must be in [0, 1], got {cfg.ppo_gamma}, "
                             f"{cfg.ppo_lam}")
        if cfg.offline_policy_passes < 0:
            raise ValueError(f"offline_policy_passes must be >= 0, "
                             f"got {cfg.offline_policy_passes}")
        for name in ("ppo_epochs", "ppo_minibatch", "grpo_group"):
            if getattr(cfg, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(cfg, name)}")
        if cfg.value_coef < 0 or cfg.kl_coef < 0 or cfg.critic_warmup_updates < 0:
            raise ValueError("value_coef, kl_coef and critic_warmup_updates must be >= 0")
        if not cfg.value_lr > 0:
            raise ValueError(f"value_lr must be positive, got {cfg.value_lr}")
        if cfg.kl_reference not in ("start", "sampling"):
            raise ValueError(f"kl_reference must be 'start' or 'sampling', "
                             f"got {cfg.kl_reference!r}")
        if not 0.0 <= cfg.negative_advantage_scale <= 1.0:
            raise ValueError(f"negative_advantage_scale must be in [0, 1], "
                             f"got {cfg.negative_advantage_scale}")
        if cfg.value_grad_clip is not None and not cfg.value_grad_clip > 0:
            raise ValueError(f"value_grad_clip must be positive or None, "
                             f"got {cfg.value_grad_clip}")
        if cfg.advantage_norm not in ("none", "batch"):
            raise ValueError(f"advantage_norm must be 'none' or 'batch', "
                             f"got {cfg.advantage_norm!r}")
        if cfg.grpo_groups not in ("draw", "task"):
            raise ValueError(f"grpo_groups must be 'draw' or 'task', got {cfg.grpo_groups!r}")
        if cfg.policy_loss_norm not in (None, "token", "trajectory"):
            raise ValueError(f"policy_loss_norm must be 'token' or 'trajectory', "
                             f"got {cfg.policy_loss_norm!r}")
        cls._check_scoring(cfg)

    @staticmethod
    def _check_scoring(cfg) -> None:
        """PPO's and GRPO's ratio divides the model's own probability of each recorded token
        (temperature 1, the actor's precision, the sampling's masks: the Auto-UI policy puts
        the grammar and the copy mask again when it scores, issue 47) by the one recorded at
        sampling: the two must be the same distribution before any update, or the ratio is
        off from the first step (measured on an untrained policy: up to 2.4 nats per token
        apart at temperature 0.7, 10.6 under the grammar mask scored without it, whose
        recorded probabilities are always the larger, so every negative advantage is clipped
        away; bf16 scoring put 2.5% of the shipped policy's tokens outside [0.8, 1.2] before
        any update)."""
        a = cfg.algorithm
        if cfg.temperature != 1.0:
            raise ConfigError(f"temperature={cfg.temperature}: algorithm={a!r} scores the "
                              "recorded tokens at temperature 1 (greedy decoding records no "
                              "log-probabilities at all); sample at temperature 1")
        for name in ("constrained_decoding", "copy_typed_text"):
            if getattr(cfg, name) and cfg.policy != "autoui":
                raise ConfigError(f"{name}: algorithm={a!r} scores the recorded tokens under "
                                  "the sampling's masks, which the Auto-UI policy puts again "
                                  f"(policy='autoui'), not policy={cfg.policy!r}; run it "
                                  f"with {name} false")
        if 0.0 < cfg.goal_token_dropout < 1.0:
            raise ConfigError(f"goal_token_dropout={cfg.goal_token_dropout}: algorithm={a!r} "
                              "scores the sampled tokens in training mode, where the randomly "
                              "dropped goal embeddings change their probabilities; set it to "
                              "0, or 1 (always dropped, acting too)")
        if cfg.policy == "vlm" and cfg.vlm_dtype != "fp32":
            raise ConfigError(f"vlm_dtype={cfg.vlm_dtype!r}: algorithm={a!r} needs the "
                              "recorded log-probabilities to be the scored ones, and a bf16 "
                              "model samples (with a key-value cache) and scores (one "
                              "forward) with different roundings; use vlm_dtype 'fp32'")
        if cfg.policy == "vlm" and cfg.lora.get("dropout", 0.0):
            raise ConfigError(f"lora.dropout={cfg.lora['dropout']}: algorithm={a!r} scores "
                              "the sampled tokens in training mode, where dropout changes "
                              "them; use lora dropout 0")
        if cfg.actor_precision != "fp32":
            raise ConfigError(f"actor_precision={cfg.actor_precision!r}: algorithm={a!r} "
                              "compares probabilities across a bf16 forward and the "
                              "sampler's fp32 one (ratios 0.71-1.27 before any update); "
                              "use 'fp32'")
        if cfg.actor_updates == 0:
            raise ConfigError(f"actor_updates=0 does not freeze algorithm={a!r}: its updates "
                              "per iteration are ppo_epochs over the iteration's data")

    @classmethod
    def grades_note(cls, grader: Any, checkpoint: str) -> str:
        return (f"PPO values and advantages from checkpoint {checkpoint}, as the learner "
                "computes them: V = the "
                "value head's value at the step's first action token (the state the action was "
                "taken in); A = the mean over the step's tokens of the token-level GAE "
                f"advantage (&gamma; = {grader.gamma:g}, &lambda; = {grader.lam:g}, terminal "
                "value 0); logp = the log-probability of the action recorded when it was "
                "sampled (the sum over its tokens); in each header R = the final reward, "
                "V<sub>start</sub> = V of the first step. PPO filters nothing (no kept or "
                "dropped). Evaluation episodes are never trained on.")

    # -- its checkpoint state ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The frozen reference policy's weights once it is made (:meth:`reference_policy`),
        so a resumed run reads the same one."""
        ref = self._reference
        if ref is None:
            return {} if self._reference_state is None else \
                {"reference_policy": self._reference_state}
        return {"reference_policy": {"model": ref.model.state_dict(),
                                     "value_head": ref.value_head.state_dict()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The reference's weights (built on first use), or, from a checkpoint saved before
        the learner had a state of its own, the ``OUT/reference_policy`` folder that
        version wrote."""
        self._reference = None
        self._reference_state = state.get("reference_policy")
        if self._reference_state is None and not state:
            self._reference_state = self._old_reference_folder()

    def _old_reference_folder(self) -> dict[str, Any] | None:
        """The weights in ``OUT/reference_policy`` (an older version's), or None."""
        out = getattr(self.run, "out", None)
        d = None if out is None else out / "reference_policy"
        if d is None or not (d / "state.json").exists():
            return None
        from digirl_lite.policy.factory import load_kwargs, load_policy

        old = load_policy(d / "policy", **load_kwargs(self.cfg), device="cpu")
        return {"model": old.model.state_dict(), "value_head": old.value_head.state_dict()}

    @property
    def offline_work(self) -> str:
        """For the run's line about the offline phase."""
        if not self.cfg.resolved("offline_imitation"):
            return self.own_offline_work
        then = f", then {self.own_offline_work}" if self.value_coef_applies else ""
        return f"the actor on the pile's successes{then}"

    def actor_param_groups(self) -> list[dict[str, Any]]:
        """The policy's weights at ``actor_lr`` and the value head's at ``value_lr``."""
        return [{"params": list(self.policy.parameters())},
                {"params": list(self.policy.value_head.parameters()),
                 "lr": self.cfg.value_lr}]

    # -- the phases -------------------------------------------------------------------------
    def offline(self, pile: Sequence[Trajectory]) -> dict[str, Any]:
        run, c = self.run, self.cfg
        info = self.imitate(pile)
        info.update(run.timed("offline_actor", lambda: self.warm_up_value_head(pile)))
        if c.offline_policy_passes:  # and the learner's own update on the pile
            info.update(run.timed("offline_actor", lambda: self.train_on_policy(
                pile, passes=c.offline_policy_passes)))
        return info

    def imitate(self, pile: Sequence[Trajectory]) -> dict[str, Any]:
        """``offline_imitation``: Filtered BC's offline phase on ``pile`` (every valid step of
        its successes, ``offline_actor_updates`` updates) with an AdamW of its own at the
        imitation rate (Filtered BC's ``actor_lr``); the run's actor optimiser (PPO's rate,
        and the value head) is left as it was. Logged as ``imitation_*``; {} when off."""
        import torch

        from digirl_lite.learners.filtered_bc import FilteredBC

        run, c = self.run, self.cfg
        if not c.resolved("offline_imitation"):
            return {}
        params = [p for p in self.policy.parameters() if p.requires_grad]
        own = torch.optim.AdamW(params, lr=FilteredBC.defaults["actor_lr"])
        kept_opt, run.actor_opt = run.actor_opt, own
        try:  # FilteredBC.offline times its own parts (offline_filter, offline_actor)
            info = FilteredBC(run).offline(pile)
        finally:
            run.actor_opt = kept_opt
        return {f"imitation_{k}": v for k, v in info.items()}

    def update(self, collected: Sequence[Trajectory]) -> dict[str, Any]:
        out = self.run.timed("actor", lambda: self.train_on_policy(collected))
        out["actor_loss"] = out.pop("policy_loss", float("nan"))
        return out

    # -- rows and batches -------------------------------------------------------------------
    def groups(self, trajs: Sequence[Trajectory]) -> dict[str, Any] | None:
        """GRPO's group of each trajectory (None: PPO has none)."""
        return None

    @classmethod
    def token_rows(cls, trajs: Sequence[Trajectory], policy, screens, *, gamma: float,
                   lam: float, monte_carlo: bool = False,
                   groups: dict[str, Any] | None = None) -> list[PPORow]:
        """A :class:`~digirl_lite.policy.on_policy.PPORow` per step of ``trajs`` as this
        learner computes them (PPO: :func:`~digirl_lite.policy.on_policy.gae_rows`, token
        GAE on ``policy``'s value head; ``groups`` unused); the viewer calls it too
        (:class:`~digirl_lite.viz.OnPolicyGrader`)."""
        from digirl_lite.policy.on_policy import gae_rows

        return gae_rows(trajs, policy, screens, gamma=gamma, lam=lam, monte_carlo=monte_carlo)

    def rows(self, trajs: Sequence[Trajectory], monte_carlo: bool = False) -> list[PPORow]:
        """:meth:`token_rows` of ``trajs`` with this run's policy, ``ppo_gamma`` and
        ``ppo_lam`` (``monte_carlo``: lambda 1, the warm-up's targets) and :meth:`groups`."""
        c = self.cfg
        return self.token_rows(trajs, self.policy, self.run.screens, gamma=c.ppo_gamma,
                               lam=c.ppo_lam, monte_carlo=monte_carlo,
                               groups=self.groups(trajs))

    def batch(self, rows, pick, weights: Sequence[float] | None = None,
              ref: Sequence[Sequence[float]] | None = None) -> Any:
        """The :class:`~digirl_lite.policy.updates.PPOBatch` of ``rows[pick]``."""
        from digirl_lite.policy.updates import PPOBatch, steps_to_batch

        chosen = [rows[i] for i in pick]
        prompts, feats, _ = steps_to_batch([r[0] for r in chosen], self.run.screens,
                                           self.policy)
        return PPOBatch(prompts, feats, [r[1] for r in chosen], [r[2] for r in chosen],
                        [r[3] for r in chosen],
                        [r[4] for r in chosen] if self.value_coef_applies else None,
                        None if weights is None else [weights[i] for i in pick],
                        None if ref is None else [ref[i] for i in pick],
                        [r.typed for r in chosen])

    def policy_loss_weights(self, rows) -> np.ndarray | None:
        """Each row's token weight in the policy loss under ``policy_loss_norm`` (the
        learner's own where None, :attr:`defaults`): None for "token" (a token mean); for
        "trajectory", 1 / the tokens of the row's trajectory among ``rows`` (every
        trajectory weighs the same)."""
        if self.cfg.resolved("policy_loss_norm") == "token":
            return None
        tokens: dict[str, int] = {}
        for r in rows:
            tokens[r.traj_id] = tokens.get(r.traj_id, 0) + len(r.token_ids)
        return np.array([1.0 / tokens[r.traj_id] for r in rows])

    def normalised_advantages(self, rows) -> list[Any]:
        """``rows`` with their advantages standardised over all their tokens
        (``advantage_norm="batch"``; as they are otherwise)."""
        if self.cfg.advantage_norm == "none" or not rows:
            return list(rows)
        adv = np.concatenate([np.asarray(r[3], dtype=np.float64) for r in rows])
        mu, sd = float(adv.mean()), float(adv.std())
        return [r._replace(advantages=((np.asarray(r[3]) - mu) / (sd + 1e-8)).tolist())
                for r in rows]

    # -- the reference and the readings -----------------------------------------------------
    def reference_policy(self):
        """The frozen policy the on-policy updates started from (the KL penalty's reference
        under ``kl_reference="start"``, and the ``kl_start`` of metrics.jsonl), or None where
        it is not kept: it is kept with ``kl_coef`` > 0 and "start", and for policies of up
        to :data:`REFERENCE_MAX_PARAMETERS`. Made at the first on-policy update and saved
        with the run's checkpoints (:meth:`state_dict`), so a resumed run reads the same
        one."""
        if self._reference is not None:
            return self._reference
        c = self.cfg
        if not ((c.kl_coef > 0 and c.kl_reference == "start")
                or self.policy.num_parameters() <= REFERENCE_MAX_PARAMETERS):
            return None
        # the trainer's behaviour copy's way: the wrapper shallow (a VLM's processor holds
        # locks), the networks deep
        ref = copy.copy(self.policy)
        ref.model = copy.deepcopy(self.policy.model)
        ref.value_head = copy.deepcopy(self.policy.value_head)
        if self._reference_state is not None:  # a resumed run's
            ref.model.load_state_dict(self._reference_state["model"])
            ref.value_head.load_state_dict(self._reference_state["value_head"])
            self._reference_state = None
        ref.model.eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        self._reference = ref
        return ref

    def rows_log_probs(self, policy, rows) -> list[np.ndarray]:
        """``policy``'s log-probability of each row's tokens (no gradient), one array each."""
        import torch

        from digirl_lite.policy.updates import scoring_masks, steps_to_batch

        out: list[np.ndarray] = []
        with torch.no_grad():
            for a in range(0, len(rows), 64):
                chunk = rows[a:a + 64]
                prompts, feats, _ = steps_to_batch([r[0] for r in chunk], self.run.screens,
                                                   policy)
                lp, _, _ = policy.token_ids_log_probs_and_values(
                    prompts, feats, [r[1] for r in chunk],
                    **scoring_masks(self.run.sampling_masks(), [r.typed for r in chunk]))
                out += [lp[i, :len(r[1])].float().cpu().numpy() for i, r in enumerate(chunk)]
        return out

    def readings(self, rows, trajs) -> tuple[dict[str, float], list | None]:
        """What tells an on-policy iteration's health apart (issue 28), on the policy that
        sampled it, before the update: the share of its sampled steps that did not parse,
        the mean entropy of its next-token distribution at its sampled tokens, and its KL
        (k3, token mean) to the starting policy. Returns them and the reference's
        log-probabilities of every row's tokens (None without a reference)."""
        from digirl_lite.policy.updates import steps_to_batch
        from digirl_lite.ppo import kl_k3

        steps = [s for t in trajs for s in t.steps]
        out = {"sampled_invalid_share": round(
            float(np.mean([not s.action.is_valid for s in steps])) if steps else 0.0, 4)}
        if hasattr(self.policy, "token_entropies"):
            prompts, feats, _ = steps_to_batch([r[0] for r in rows], self.run.screens,
                                               self.policy)
            ent = self.policy.token_entropies(prompts, feats, [r[1] for r in rows])
            out["entropy"] = round(float(np.concatenate(ent).mean()), 4)
        ref = self.reference_policy()
        if ref is None:
            return out, None
        ref_lp = self.rows_log_probs(ref, rows)
        old = np.concatenate([np.asarray(r[2], dtype=np.float64) for r in rows])
        out["kl_start"] = round(float(kl_k3(old, np.concatenate(ref_lp)).mean()), 5)
        return out, ref_lp

    # -- the updates ------------------------------------------------------------------------
    def train_on_policy(self, trajs: Sequence[Trajectory], passes: int | None = None
                        ) -> dict[str, Any]:
        """PPO or GRPO on this iteration's own trajectories (or, in the offline phase, on the
        pile: ``offline_policy_passes``): ``passes`` (default ``ppo_epochs``) passes in
        minibatches of ``ppo_minibatch`` steps, each ratio against the log-probabilities
        recorded when the step was sampled. Returns the last pass's mean statistics (the
        clip fraction and gradient norms of the first pass: ``*_first``), and
        :meth:`readings`."""
        from digirl_lite.policy.updates import actor_precision, ppo_update

        run, c = self.run, self.cfg
        passes = c.ppo_epochs if passes is None else passes
        rows = [r for r in self.rows(trajs) if r[0].action_log_probs]
        if not rows:
            return {"ppo_steps": 0}
        readings, ref_lp = self.readings(rows, trajs)
        rows = self.normalised_advantages(rows)
        weights = self.policy_loss_weights(rows)
        ref = ref_lp if c.kl_reference == "start" else None
        masks = run.sampling_masks()
        done: list[list[dict[str, float]]] = []
        with actor_precision(self.policy, c.actor_precision):
            for _ in run.iterate(passes, "policy passes"):
                done.append([])
                for pick in np.array_split(self.rng.permutation(len(rows)),
                                           max(1, -(-len(rows) // c.ppo_minibatch))):
                    done[-1].append(ppo_update(
                        self.policy, run.actor_opt, self.batch(rows, pick, weights, ref),
                        clip_eps=c.ppo_clip_eps,
                        value_coef=c.value_coef if self.value_coef_applies else 0.0,
                        kl_coef=c.kl_coef, grad_clip=c.actor_grad_clip,
                        negative_scale=c.negative_advantage_scale,
                        value_grad_clip=c.value_grad_clip if self.value_coef_applies
                        else None, masks=masks))
        stats = done[-1]
        # kl_ref is NaN in every minibatch without a reference: left out
        out = {k: round(float(np.mean([s[k] for s in stats])), 4) for k in stats[0]
               if not np.isnan(stats[0][k])}
        out["ratio_max"] = round(max(s["ratio_max"] for s in stats), 4)
        out["ratio_min"] = round(min(s["ratio_min"] for s in stats), 4)
        for k in ("clip_fraction", "grad_norm_policy", "grad_norm_value"):
            out[f"{k}_first"] = round(float(np.mean([s[k] for s in done[0]])), 4)
        adv = np.concatenate([r[3] for r in rows])
        w = (np.ones(len(adv)) if weights is None
             else np.repeat(weights, [len(r[3]) for r in rows]))
        # the mean advantage as the policy loss weighs tokens (its sign: what the update
        # does, on balance, to what every attempt shares)
        return {**out, **readings, "ppo_steps": len(rows), "ppo_tokens": int(len(adv)),
                "mean_advantage": round(float((adv * w).sum() / w.sum()), 4)}

    def warm_up_value_head(self, trajs: Sequence[Trajectory]) -> dict[str, Any]:
        """PPO's offline phase (Darwin A.6): ``critic_warmup_updates`` value-head-only
        updates on ``trajs`` (the pile), Monte-Carlo token returns as targets, the actor
        frozen."""
        from digirl_lite.policy.updates import ppo_update

        run, c = self.run, self.cfg
        if c.critic_warmup_updates <= 0:
            return {}
        rows = self.rows(trajs, monte_carlo=True)
        if not rows:
            return {}
        held = self.rng.permutation(len(rows))[:256]  # the loss before and after, on these
        before = self.value_loss(rows, held)
        for _ in run.iterate(c.critic_warmup_updates, "critic warm-up"):
            pick = self.rng.integers(0, len(rows), min(c.ppo_minibatch, len(rows)))
            ppo_update(self.policy, run.actor_opt, self.batch(rows, pick),
                       value_coef=1.0, grad_clip=c.actor_grad_clip, update_policy=False)
        return {"warmup_value_loss_before": round(before, 5),
                "warmup_value_loss_after": round(self.value_loss(rows, held), 5)}

    def value_loss(self, rows, pick) -> float:
        """The value head's token-mean MSE to the rows' returns (no gradient)."""
        import torch

        from digirl_lite.policy.updates import pad_rows

        b = self.batch(rows, pick)
        with torch.no_grad():
            _, v, m = self.policy.token_ids_log_probs_and_values(list(b.prompts), b.feats,
                                                                 list(b.token_ids))
        ret = pad_rows(b.returns, v.shape[1], v.device)
        return float((((v - ret) ** 2) * m).sum() / m.sum().clamp(min=1))
