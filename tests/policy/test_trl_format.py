"""Issue 31, item 4: a pile in TRL's multi-turn vision layout (``images`` + ``messages``) and
back. The pile is played on the simulated phone (the scripted expert, an agent that writes
nonsense, one that stops at once, a crashing phone, a setup that failed), so every
ending and both valid and unparseable steps cross the round trip; TRL's own
``SFTTrainer`` trains a tiny random Qwen2-VL (built offline) on the export."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from digirl_lite.actions import Action, ActionType, format_action
from digirl_lite.data import (
    Ending,
    MessagesFormatError,
    ScreenTable,
    Trajectory,
    Verdict,
    from_messages_dataset,
    to_messages_dataset,
)
from digirl_lite.envs.sim import Faults, ScriptedExpert, SimPhoneEnv
from digirl_lite.rollout.episode import run_episode

STOP = format_action(Action.key(ActionType.STATUS_TASK_COMPLETE))


class _Says:
    """An agent that writes the same string every step."""

    def __init__(self, text: str) -> None:
        self.text = text

    def act(self, obs) -> str:
        return self.text


@pytest.fixture(scope="module")
def pile():
    """(trajectories, screens): every ending, valid and unparseable steps, and one step
    carrying what only a learning policy and a harness record."""
    env = SimPhoneEnv("webshop_test", seed=0)
    screens = ScreenTable()
    trajs = [run_episode(env, ScriptedExpert(), screens, traj_id=f"expert-{k}",
                         task=env.tasks[k], seed=k) for k in range(3)]
    trajs.append(run_episode(env, _Says("tap the search bar"), screens, traj_id="nonsense",
                             task=env.tasks[0], seed=3))
    trajs.append(run_episode(env, _Says(STOP), screens, traj_id="stops", task=env.tasks[1],
                             seed=4))
    crashing = SimPhoneEnv("webshop_test", seed=0, faults=Faults(crash=1.0))
    trajs.append(run_episode(crashing, ScriptedExpert(), screens, traj_id="crash",
                             task=env.tasks[2], seed=5))
    # what run_episode records when a task's setup phase fails: no steps at all
    trajs.append(Trajectory(traj_id="no-setup", task=env.tasks[2].text, steps=(),
                            final_reward=0.0, ending=Ending.INFRA,
                            truncation_reason="setup phase failed: simulated fault"))
    first = trajs[0]
    learned = replace(first.steps[0], policy_version=7, action_token_ids=(5, 9, 2),
                      action_log_probs=(-0.5, -1.25, -0.125), decided_by="rule:r3",
                      verdict=Verdict.UNJUDGED, judge_reply=None)
    trajs[0] = replace(first, steps=(learned, *first.steps[1:]), iteration=4)
    assert {t.ending for t in trajs} == set(Ending)
    assert any(s.action.action_type is ActionType.INVALID for s in trajs[3].steps)
    assert trajs[-1].steps == ()
    return trajs, screens


@pytest.fixture(scope="module")
def exported(pile):
    return to_messages_dataset(*pile)


def _same_pictures(a: ScreenTable, b: ScreenTable, ids) -> bool:
    return all(np.array_equal(np.asarray(a.image(s)), np.asarray(b.image(s))) for s in ids)


def _referenced(trajs) -> set[str]:
    return {sid for t in trajs for s in t.steps for sid in (s.screen_id, s.next_screen_id)}


@pytest.mark.slow
def test_the_round_trip_gives_back_equal_trajectories_and_pictures(pile, exported):
    trajs, screens = pile
    back, back_screens = from_messages_dataset(exported)
    assert back == trajs  # every field of every step and trajectory
    assert set(back_screens.ids) == _referenced(trajs)
    assert _same_pictures(screens, back_screens, back_screens.ids)


@pytest.mark.slow
def test_each_row_is_a_conversation_trl_accepts(pile, exported):
    from trl.data_utils import prepare_multimodal_messages

    trajs, screens = pile
    assert exported.num_rows == len(trajs)
    for t, row in zip(trajs, exported):
        assert len(row["images"]) == len(t.steps)
        assert [m["role"] for m in row["messages"]] == ["user", "assistant"] * len(t.steps)
        for k, s in enumerate(t.steps):
            user, assistant = row["messages"][2 * k], row["messages"][2 * k + 1]
            assert [p["type"] for p in user["content"]] == ["image", "text"]
            assert user["content"][1]["text"] == s.prompt
            assert "Goal: " + t.task in s.prompt
            assert assistant["content"] == [{"type": "text", "text": s.action_text}]
            assert row["images"][k].tobytes() == screens.image(s.screen_id).tobytes()
        # TRL's own check: one image per placeholder, each put in its place
        filled = prepare_multimodal_messages(row["messages"], images=row["images"])
        shown = [p["image"] for m in filled for p in m["content"] if p["type"] == "image"]
        assert len(shown) == len(t.steps)
        assert (row["traj_id"], row["final_reward"], row["ending"]) == (
            t.traj_id, t.final_reward, t.ending.value)
        assert [s["reward"] for s in row["steps"]] == [s.reward for s in t.steps]
        assert [s["done"] for s in row["steps"]] == [s.done for s in t.steps]


@pytest.mark.slow
def test_saved_to_disk_and_as_parquet_it_reads_back_the_same(pile, exported, tmp_path):
    import datasets

    trajs, screens = pile
    exported.save_to_disk(str(tmp_path / "disk"))
    exported.to_parquet(str(tmp_path / "hub" / "train.parquet"))  # the Hub's files
    reloaded = [datasets.load_from_disk(str(tmp_path / "disk")),
                datasets.load_dataset(str(tmp_path / "hub"), split="train",
                                      cache_dir=str(tmp_path / "cache"))]
    for ds in reloaded:
        back, back_screens = from_messages_dataset(ds)
        assert back == trajs
        assert _same_pictures(screens, back_screens, _referenced(trajs))


def test_image_size_shrinks_the_pictures_and_keeps_the_ids(pile):
    trajs, screens = pile
    small = to_messages_dataset(trajs[:2], screens, image_size=(54, 114))
    assert {img.size for row in small for img in row["images"] + row["extra_images"]} == {
        (54, 114)}
    back, back_screens = from_messages_dataset(small)
    assert back == trajs[:2]
    assert all(back_screens.image(s).size == (54, 114) for s in back_screens.ids)
    assert {screens.image(s).size for s in back_screens.ids} == {(270, 570)}
    with pytest.raises(ValueError, match="image_size must be"):
        to_messages_dataset(trajs, screens, image_size=(54,))


def _rows(ds):
    """The rows of ``ds`` as plain dicts (images as their stored bytes), to break one."""
    return ds.with_format("arrow")[:].to_pylist()


def _dataset(rows, like):
    import datasets

    return datasets.Dataset.from_list(rows, features=like.features)


@pytest.mark.slow
def test_bad_input_is_an_error_that_names_the_row_and_the_column(pile, exported):
    import datasets

    with pytest.raises(MessagesFormatError, match=r"no column\(s\) \['steps'\]"):
        from_messages_dataset(exported.remove_columns("steps"))
    with pytest.raises(MessagesFormatError, match="pass one split"):
        from_messages_dataset(datasets.DatasetDict({"train": exported}))

    rows = _rows(exported)
    rows[1]["images"] = rows[1]["images"][:-1]
    with pytest.raises(MessagesFormatError, match=r"row 1 \(trajectory 'expert-1'\), column "
                                                  r"'images': \d+ images for \d+ image "
                                                  "placeholders"):
        from_messages_dataset(_dataset(rows, exported))

    rows = _rows(exported)
    tap = next(k for k, s in enumerate(rows[0]["steps"]) if s["action_type"] == "DUAL_POINT")
    rows[0]["messages"][2 * tap + 1]["content"][0]["text"] = "I would tap the bar"
    with pytest.raises(MessagesFormatError, match=rf"row 0 .*column 'messages': turn "
                                                  rf"{2 * tap + 1} \(step {tap}'s assistant "
                                                  r"turn\) is not the step's action: 'I would "
                                                  r"tap the bar' does not parse .* recorded "
                                                  "as DUAL_POINT"):
        from_messages_dataset(_dataset(rows, exported))

    rows = _rows(exported)
    rows[2]["messages"][1], rows[2]["messages"][2] = rows[2]["messages"][2], rows[2]["messages"][1]
    with pytest.raises(MessagesFormatError, match=r"row 2 .*turn 1 \(step 0's assistant turn\) "
                                                  "should be a 'assistant' turn, got 'user'"):
        from_messages_dataset(_dataset(rows, exported))

    rows = _rows(exported)
    rows[0]["messages"] = rows[0]["messages"][:-2]
    with pytest.raises(MessagesFormatError, match=r"row 0 .*'messages': \d+ turns for \d+ "
                                                  "steps"):
        from_messages_dataset(_dataset(rows, exported))

    rows = _rows(exported)
    rows[4]["traj_id"] = rows[0]["traj_id"]
    with pytest.raises(MessagesFormatError, match="row 4, column 'traj_id'.* row 0"):
        from_messages_dataset(_dataset(rows, exported))

    rows = _rows(exported)
    rows[0]["final_reward"] = 0.0  # a success without its reward
    with pytest.raises(MessagesFormatError, match="row 0 .*does not match final_reward"):
        from_messages_dataset(_dataset(rows, exported))


def test_export_refuses_what_it_cannot_write(pile):
    trajs, screens = pile
    blind = ScreenTable()
    for sid in screens.ids:
        blind.add(features=np.zeros(2), screen_id=sid)
    with pytest.raises(ValueError, match="trajectory 'expert-0', step 0: screen .* held without "
                                         "its image"):
        to_messages_dataset(trajs[:1], blind)
    with pytest.raises(ValueError, match="trajectory 'expert-0', step 0: screen .* not in the "
                                         "ScreenTable"):
        to_messages_dataset(trajs[:1], ScreenTable())
    t = trajs[0]
    odd = replace(t.steps[1], action=Action.key(ActionType.PRESS_BACK))
    with pytest.raises(ValueError, match="trajectory 'expert-0', step 1: its action "
                                         r"\(PRESS_BACK\) is not what its text parses to"):
        to_messages_dataset([replace(t, steps=(t.steps[0], odd, *t.steps[2:]))], screens)


# -- TRL trains on it ------------------------------------------------------------------------
TRAINING_TEMPLATE = (
    # the tiny Qwen2-VL's chat template (digirl_lite.policy.tiny_vlm.CHAT_TEMPLATE) with
    # {% generation %} around the assistant's turns, so TRL's assistant_only_loss trains on
    # the actions alone (as TRL's training templates for the real Qwen2.5-VL do)
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    "{% for content in message['content'] %}{{ content['text'] }}{% endfor %}<|im_end|>"
    "{% endgeneration %}\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _processor(directory):
    """The tiny checkpoint's Qwen2VLProcessor, without its video half: transformers' video
    processor needs torchvision, which the CPU install leaves out (VLMPolicy works around it
    the same way); images are processed exactly as by the full processor."""
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2VLProcessor

    class ImageQwen2VLProcessor(Qwen2VLProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kw):
            super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kw)

    return ImageQwen2VLProcessor(AutoImageProcessor.from_pretrained(directory),
                                 AutoTokenizer.from_pretrained(directory),
                                 chat_template=TRAINING_TEMPLATE)


@pytest.mark.slow
def test_trls_sft_trainer_trains_a_tiny_qwen2_vl_on_the_actions(pile, tmp_path):
    import torch
    from transformers import AutoModelForImageTextToText
    from trl import SFTConfig, SFTTrainer

    from digirl_lite.envs.sim.demos import sim_corpus
    from digirl_lite.policy.tiny_vlm import make_tiny_vlm

    trajs, screens = pile
    successes = [t for t in trajs if t.is_success]
    ds = to_messages_dataset(successes[:1], screens, image_size=(56, 112))  # 8 tokens a screen
    directory = make_tiny_vlm(tmp_path / "tiny", corpus=sim_corpus(seed=0, n_demos=20))
    model = AutoModelForImageTextToText.from_pretrained(directory)
    processor = _processor(directory)
    before = {n: w.detach().clone() for n, w in model.named_parameters()}
    args = SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=2, learning_rate=1e-2,
                     per_device_train_batch_size=1, max_length=None, assistant_only_loss=True,
                     use_cpu=True, bf16=False, gradient_checkpointing=False,
                     report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True)
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=processor)

    # what the loss sees: the assistant turns, i.e. the actions, and nothing of the prompts
    batch = trainer.data_collator([ds[0]])
    labels = batch["labels"][0]
    spans, run = [], []
    for tok in labels.tolist() + [-100]:
        if tok == -100:
            spans, run = (spans + [run] if run else spans), []
        else:
            run.append(tok)
    assert [processor.tokenizer.decode(s) for s in spans] == [
        s.action_text + "<|im_end|>" for s in successes[0].steps]
    assert len(batch["image_grid_thw"]) == len(successes[0].steps)

    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(np.isfinite(losses))
    changed = [n for n, w in model.named_parameters() if not torch.equal(w, before[n])]
    assert any("visual" in n for n in changed) and any("language_model" in n for n in changed)
