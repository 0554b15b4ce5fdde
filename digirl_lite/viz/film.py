"""A trajectory as a filmstrip: each screenshot with its action drawn on it, and per step the
action string, the judge's verdict and reply, the critics' values, the step grade and whether
the filters kept it.

One list of :class:`StepView` records feeds every rendering: :func:`filmstrip` (one Pillow
image, for notebooks and files) and :func:`trajectory_html` (cards for Jupyter and the static
report of :mod:`digirl_lite.report`).
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from digirl_lite.actions import Action
from digirl_lite.viz.draw import action_label, draw_action, thumbnail

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image

    from digirl_lite.data.records import ScreenTable, Trajectory
    from digirl_lite.viz.grades import OnPolicyGrade, TrajectoryGrade

__all__ = ["StepView", "step_views", "replay", "filmstrip", "trajectory_html", "image_data_uri",
           "HTML_STYLE"]


@dataclass(frozen=True)
class StepView:
    """What the viewer shows for one frame of a trajectory.

    Frames 0 .. T-1 are the steps (the screen the action was taken on); frame T is the last
    screen, with no action (``action is None``), labelled by the trajectory's ending.

    Attributes:
        index: the frame number h.
        screen_id: the screenshot shown.
        action: the parsed action (None for the last frame).
        action_text: what the policy wrote, verbatim ("" for the last frame).
        label: a short label of the action, or the ending for the last frame.
        reward: the step's reward (None for the last frame).
        verdict: the judge's verdict on the screen after the action ("success", "failure",
            "unjudged"; None where no judge ran).
        judge_reply: the judge's reply text, if any.
        value: V_step(s_h) (None without a grade); for PPO the value head's value at the
            step's first action token.
        advantage: the step grade, Eq. 4.3 (None without a grade and on the last frame); for
            PPO the mean of the step's token-level GAE advantages, for GRPO the trajectory's
            group advantage.
        kept: whether the filters would imitate this step (None as for ``advantage``, and
            for PPO and GRPO, which filter nothing).
        log_prob: PPO and GRPO: the recorded log-probability of the action (None where
            none was recorded, and for the other algorithms).
    """

    index: int
    screen_id: str
    action: Action | None
    action_text: str
    label: str
    reward: float | None = None
    verdict: str | None = None
    judge_reply: str | None = None
    value: float | None = None
    advantage: float | None = None
    kept: bool | None = None
    log_prob: float | None = None

    def caption(self) -> list[str]:
        """Short text lines under a thumbnail."""
        lines = [f"{self.index}: {self.label}"]
        if self.verdict is not None:
            lines.append(f"judge: {self.verdict}")
        grade = []
        if self.value is not None:
            grade.append(f"V={self.value:.2f}")
        if self.advantage is not None:
            grade.append(f"A={self.advantage:+.2f}")
        if self.kept is not None:
            grade.append("kept" if self.kept else "dropped")
        if grade:
            lines.append(" ".join(grade))
        return lines


def step_views(trajectory: Trajectory, grade: TrajectoryGrade | OnPolicyGrade | None = None
               ) -> list[StepView]:
    """T + 1 views of a T-step trajectory (the last one: the final screen and the ending)."""
    steps = trajectory.steps
    if grade is not None and len(grade.advantages) != len(steps):
        raise ValueError(f"grade of {grade.traj_id!r} has {len(grade.advantages)} steps, "
                         f"trajectory {trajectory.traj_id!r} has {len(steps)}")
    values = grade.values if grade else ()  # () for GRPO: no value head
    kept = grade.step_kept if grade else ()  # () for PPO and GRPO: no filter
    log_probs = getattr(grade, "log_probs", ())  # PPO and GRPO
    views = []
    for h, s in enumerate(steps):
        views.append(StepView(
            index=h, screen_id=s.screen_id, action=s.action, action_text=s.action_text,
            label=action_label(s.action), reward=s.reward,
            verdict=s.verdict.value if s.verdict is not None else None,
            judge_reply=s.judge_reply,
            value=values[h] if values else None,
            advantage=grade.advantages[h] if grade else None,
            kept=kept[h] if kept else None,
            log_prob=log_probs[h] if log_probs else None))
    if steps:
        end = trajectory.ending.value
        if trajectory.truncation_reason:
            end += f" ({trajectory.truncation_reason})"
        views.append(StepView(index=len(steps), screen_id=steps[-1].next_screen_id, action=None,
                              action_text="", label=f"end: {end}",
                              value=values[-1] if values else None))
    return views


def replay(trajectory: Trajectory, screens: ScreenTable,
           grade: TrajectoryGrade | OnPolicyGrade | None = None,
           *, width: int | None = None) -> Iterator[tuple[StepView, Image.Image | None]]:
    """Step through a trajectory: (view, screenshot with the action drawn) per frame.

    The image is None where the store kept no screenshot for that screen.
    """
    for v in step_views(trajectory, grade):
        img = screens.image(v.screen_id)
        if img is not None:
            if v.action is not None:
                img = draw_action(img, v.action, width=width)
            else:
                img = thumbnail(img, width)
        yield v, img


def filmstrip(trajectory: Trajectory, screens: ScreenTable,
              grade: TrajectoryGrade | OnPolicyGrade | None = None, *, thumb_width: int = 160,
              max_frames: int | None = None) -> Image.Image:
    """One image: the frames side by side, each with its caption underneath, and the task
    and ending on top.

    Args:
        trajectory: the trajectory.
        screens: its screens.
        grade: its grade (values, step grades, kept), if any.
        thumb_width: width of each frame in pixels.
        max_frames: show at most this many frames (the first ones).
    """
    from PIL import Image, ImageDraw

    from digirl_lite.viz.draw import _font, fit_text

    frames = list(replay(trajectory, screens, grade, width=thumb_width))[:max_frames]
    font = _font(max(9, thumb_width // 14))
    line_h = round(font.size * 1.3) if hasattr(font, "size") else 12
    n_lines = max((len(v.caption()) for v, _ in frames), default=1)
    thumb_h = max((im.height for _, im in frames if im is not None),
                  default=round(thumb_width * 2280 / 1080))
    gap, head = 6, 2 * line_h + 6
    width = max(1, len(frames)) * (thumb_width + gap) + gap
    height = head + thumb_h + n_lines * line_h + 2 * gap
    sheet = Image.new("RGB", (width, height), (250, 250, 250))
    d = ImageDraw.Draw(sheet)
    d.text((gap, 3), fit_text(d, trajectory.task, font, width - 2 * gap), font=font,
           fill=(0, 0, 0))
    head2 = f"{trajectory.traj_id}  {trajectory.ending.value}, {len(trajectory)} steps"
    if grade is not None:
        head2 += "  " + _grade_head(grade, html_=False)
    d.text((gap, 3 + line_h), head2, font=font, fill=(90, 90, 90))
    for i, (v, im) in enumerate(frames):
        x = gap + i * (thumb_width + gap)
        if im is not None:
            sheet.paste(im, (x, head))
        else:
            d.rectangle((x, head, x + thumb_width, head + thumb_h), outline=(180, 180, 180))
        color = {True: (0, 128, 0), False: (170, 0, 0), None: (0, 0, 0)}[v.kept]
        for j, line in enumerate(v.caption()):
            d.text((x, head + thumb_h + gap + j * line_h), fit_text(d, line, font, thumb_width),
                   font=font,
                   fill=color if j == len(v.caption()) - 1 and v.kept is not None else (0, 0, 0))
    return sheet


def image_data_uri(image: Image.Image, fmt: str = "PNG") -> str:
    """A ``data:`` URI of ``image`` (for HTML shown inline in a notebook)."""
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return f"data:image/{fmt.lower()};base64,{base64.b64encode(buf.getvalue()).decode()}"


HTML_STYLE = """
.dl-traj{font:13px/1.35 system-ui,sans-serif;margin:10px 0;border:1px solid #ddd;
  border-radius:6px;padding:6px 8px;background:#fff}
.dl-traj>summary{cursor:pointer}
.dl-traj .dl-ok{color:#0a7a2f;font-weight:600}.dl-traj .dl-bad{color:#b00020;font-weight:600}
.dl-strip{display:flex;gap:8px;overflow-x:auto;padding:6px 0}
.dl-step{flex:0 0 auto;border:2px solid #ccc;border-radius:4px;padding:3px;background:#fafafa}
.dl-step.kept{border-color:#0a7a2f}.dl-step.dropped{border-color:#d9a0a8}
.dl-step img{display:block}
.dl-step .dl-cap{font-size:11px;white-space:normal;word-break:break-word}
.dl-step code{font-size:10px;color:#555;display:block;max-height:4.5em;overflow:auto}
.dl-num{font-variant-numeric:tabular-nums}
"""
"""CSS for :func:`trajectory_html` (the report includes it once; notebooks inline it)."""


def _grade_head(grade: TrajectoryGrade | OnPolicyGrade, html_: bool) -> str:
    """The trajectory-level numbers of a grade, for a card's or a filmstrip's header."""
    sub = (lambda x: f"<sub>{x}</sub>") if html_ else (lambda x: f"_{x}")
    if hasattr(grade, "instr_value"):  # DigiRL, Filtered BC, AWR: the critics and filters
        return (f"V{sub('instr')}={grade.instr_value:.2f} "
                f"A{sub('instr')}={grade.instr_advantage:+.2f} "
                + (f'({"kept" if grade.kept else "dropped"} by the trajectory filter)' if html_
                   else ("kept" if grade.kept else "dropped")))
    from digirl_lite.learners import learner_class

    row = grade.row()
    if getattr(learner_class(grade.algorithm), "value_coef_applies", False):  # a value head
        return (f"{grade.algorithm.upper()}: R={grade.reward:g} "
                f"V{sub('start')}={row['V_start']:.2f} mean A={row['mean_A']:+.2f}")
    return (f"{grade.algorithm.upper()}: R={grade.reward:g} A{sub('group')}="
            f"{_num(row['A_group'], '+.2f')} (no value head)")


def _num(x: float | None, fmt: str) -> str:
    return "&ndash;" if x is None else format(x, fmt)


def trajectory_html(trajectory: Trajectory, screens: ScreenTable,
                    grade: TrajectoryGrade | OnPolicyGrade | None = None, *,
                    thumb_width: int = 160,
                    image_src: Callable[[StepView, Image.Image], str] | None = None,
                    open_: bool = True, style: bool = True) -> str:
    """An HTML card: the task, ending and instruction grades, then one card per frame with
    the screenshot (action drawn), the action string, the verdict and reply, V, A, kept.

    Args:
        trajectory: the trajectory.
        screens: its screens.
        grade: its grade, if any.
        thumb_width: frame width in pixels.
        image_src: maps (view, drawn image) to an ``<img src>``; default: an inline
            ``data:`` URI (self-contained, for notebooks). The report writes files instead.
        open_: render the ``<details>`` element expanded.
        style: include :data:`HTML_STYLE` (False when the page already has it).
    """
    src_of = image_src or (lambda v, im: image_data_uri(im))
    e = html.escape
    ok = trajectory.is_success
    head = [f'<span class="{"dl-ok" if ok else "dl-bad"}">{e(trajectory.ending.value)}</span>',
            f"{len(trajectory)} steps", f"<b>{e(trajectory.task)}</b>",
            f'<span class="dl-num">{e(trajectory.traj_id)}</span>']
    if grade is not None:
        head.append(f'<span class="dl-num">{_grade_head(grade, html_=True)}</span>')
    on_policy = getattr(grade, "algorithm", None) if hasattr(grade, "log_probs") else None
    cards = []
    for v, im in replay(trajectory, screens, grade, width=thumb_width):
        img = (f'<img src="{e(src_of(v, im))}" width="{im.width}" height="{im.height}" '
               f'alt="frame {v.index}">' if im is not None else "<i>(no screenshot)</i>")
        cls = "" if v.kept is None else (" kept" if v.kept else " dropped")
        lines = [f"<b>{v.index}</b>: {e(v.label)}"]
        if v.action is not None:
            lines.append(f"<code>{e(v.action_text)}</code>")
            lines.append(f"judge: <b>{e(v.verdict or 'none')}</b>"
                         + (f" &ndash; <i>{e(v.judge_reply)}</i>" if v.judge_reply else ""))
            lines.append(f'<span class="dl-num">r={_num(v.reward, "g")} '
                         f'V={_num(v.value, ".2f")} A={_num(v.advantage, "+.2f")}'
                         + ("" if v.kept is None else f' {"kept" if v.kept else "dropped"}')
                         + ("" if on_policy is None else f' logp={_num(v.log_prob, ".2f")}')
                         + "</span>")
        else:
            lines.append(f'<span class="dl-num">V={_num(v.value, ".2f")}</span>')
        cards.append(f'<div class="dl-step{cls}" style="width:{thumb_width}px">{img}'
                     f'<div class="dl-cap">{"<br>".join(lines)}</div></div>')
    css = f"<style>{HTML_STYLE}</style>" if style else ""
    return (f'{css}<details class="dl-traj"{" open" if open_ else ""} '
            f'id="{e(trajectory.traj_id)}"><summary>{" &middot; ".join(head)}</summary>'
            f'<div class="dl-strip">{"".join(cards)}</div></details>')
