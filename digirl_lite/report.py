"""A static HTML report of a run: summary table, learning curve, and every evaluation
trajectory as a filmstrip with its grades (issue 8).

    python -m digirl_lite.report runs/webshop            # writes runs/webshop/report/
    python -m digirl_lite.report runs/webshop --out /tmp/report --max-per-stage 20

The report is a folder: ``index.html`` plus the images it links (``img/``, the curves), all
by relative paths, so it opens from disk in any browser with no server and can be copied as
a whole. Grades (both critics' values, Eq. 4.4 and Eq. 4.3, what the filters would keep) come
from the run's newest checkpoint when it has one (:class:`digirl_lite.viz.Grader`); for a PPO
run, the value head's value, the GAE advantage and the recorded log-probability of every step
instead, and GRPO's group advantage per trajectory (:class:`digirl_lite.viz.OnPolicyGrader`).
"""

from __future__ import annotations

import argparse
import hashlib
import html
import os
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["build_report", "main"]

_PAGE_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:18px 26px;color:#222;background:#f6f6f4}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:26px 0 8px;border-bottom:1px solid #ccc}
h3{font-size:15px;margin:18px 0 4px}
table.dl-sum{border-collapse:collapse;background:#fff}
table.dl-sum td,table.dl-sum th{border:1px solid #ddd;padding:3px 8px;text-align:right}
table.dl-sum th{background:#eee}table.dl-sum td:first-child{text-align:left}
.dl-meta{color:#555}.dl-note{color:#555;max-width:70em}
.dl-curves img{background:#fff;border:1px solid #ddd;margin:4px 8px 4px 0;vertical-align:top}
#dl-broken{display:none;background:#b00020;color:#fff;padding:6px 10px}
nav a{margin-right:12px}
"""

# On load, count images that did not load and say so at the top (a report folder copied
# without its img/): the page's own check, which the headless-Chromium test reads back.
_IMAGE_CHECK = """
window.addEventListener("load", function () {
  var imgs = document.images, broken = 0;
  for (var i = 0; i < imgs.length; i++) {
    if (!imgs[i].complete || imgs[i].naturalWidth === 0) broken++;
  }
  document.body.setAttribute("data-images", imgs.length);
  document.body.setAttribute("data-broken-images", broken);
  if (broken) {
    var b = document.getElementById("dl-broken");
    b.textContent = broken + " of " + imgs.length +
      " images did not load (is img/ beside index.html?)";
    b.style.display = "block";
  }
});
"""


def _fmt(x: Any, spec: str = ".3f") -> str:
    if x is None:
        return "&ndash;"
    try:
        if x != x:  # NaN
            return "&ndash;"
        return format(x, spec)
    except (TypeError, ValueError):
        return html.escape(str(x))


def _summary_table(rows: list[dict[str, Any]]) -> str:
    e = html.escape
    kinds = list(dict.fromkeys(k for r in rows for k in (r.get("failure_kinds") or {})))
    # the environment's truth beside the judge's rate, where a stage has one (issue 32)
    truth = any(r.get("truth") == "environment" for r in rows)
    head = ("<tr><th>stage</th><th>online trajectories</th><th>success rate (judge)</th>"
            + ("<th>true success rate</th><th>judge accuracy</th>" if truth else "")
            + "<th>95% interval</th><th>episodes</th><th>mean length</th>"
            "<th>invalid steps</th>"
            + "".join(f"<th>{e(k.replace('_', ' '))}</th>" for k in kinds) + "</tr>")
    body = []
    for r in rows:
        ci = r.get("ci95") or [None, None]
        fk = r.get("failure_kinds") or {}
        body.append(
            f"<tr><td>{e(str(r['stage']))}</td><td>{_fmt(r.get('online_trajectories'), 'd')}</td>"
            + (f"<td>incomplete: {e(str(r.get('judged')))} judged</td>"  # issue 29
               if r.get("complete") is False else f"<td>{_fmt(r.get('success_rate'))}</td>")
            + (_truth_cells(r) if truth else "")
            + f"<td>[{_fmt(ci[0], '.2f')}, {_fmt(ci[1], '.2f')}]</td>"
            f"<td>{_fmt(r.get('episodes'), 'd')}</td><td>{_fmt(r.get('mean_length'), '.2f')}</td>"
            f"<td>{_fmt(r.get('invalid_step_rate'), '.1%')}</td>"
            + "".join(f"<td>{_fmt(fk.get(k), 'd')}</td>" for k in kinds) + "</tr>")
    return f'<table class="dl-sum">{head}{"".join(body)}</table>'


def _with_splits(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A stage's summary row, then a row of each of its held-out splits (issue 32 item 5),
    ``<stage>: <split>``, with the same columns (the truth beside the judge's rate)."""
    return [row, *({**rep, "stage": f"{row['stage']}: {name}",
                    "online_trajectories": row.get("online_trajectories")}
                   for name, rep in (row.get("splits") or {}).items())]


def _truth_cells(r: dict[str, Any]) -> str:
    """The true success rate (true successes / episodes with a truth) and the judge's
    accuracy against it; dashes for a stage without a truth."""
    if r.get("truth") != "environment":
        return "<td>&ndash;</td><td>&ndash;</td>"
    agree = r.get("judge_agreement") or {}
    return (f"<td>{_fmt(r.get('true_success_rate'))} ({_fmt(r.get('true_successes'), 'd')}/"
            f"{_fmt(r.get('true_episodes'), 'd')})</td><td>{_fmt(agree.get('accuracy'))}</td>")


def build_report(run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
                 *, stages: list[str] | None = None, max_per_stage: int | None = None,
                 thumb_width: int = 180, grades: bool = True, grader: Any = None,
                 progress: bool = False) -> Path:
    """Write the report of ``run_dir``; returns the path of its ``index.html``.

    Args:
        run_dir: a run folder written by the Trainer.
        out: the report folder (default: ``run_dir/report``); its ``img/`` is replaced.
        stages: evaluation stages to show (default: every stored one, in order).
        max_per_stage: show at most this many trajectories per stage (default: all).
        thumb_width: frame width in pixels.
        grades: grade trajectories with the run's critics (skipped, with a note, when the
            run has no checkpoint).
        grader: a ready :class:`~digirl_lite.viz.Grader` to use instead of the run's.
        progress: print a line per stage.
    """
    import shutil

    from digirl_lite.viz.curves import plot_learning_curves, plot_training_metrics
    from digirl_lite.viz.film import HTML_STYLE, trajectory_html
    from digirl_lite.viz.runs import Run

    e = html.escape
    run = Run(run_dir)
    out = Path(out) if out is not None else run.path / "report"
    img_dir = out / "img"
    if img_dir.exists():
        shutil.rmtree(img_dir)
    img_dir.mkdir(parents=True)

    cfg = run.config
    parts = [f"<h1>Run {e(run.name)}</h1>"]
    meta = [f"{k}={cfg[k]}" for k in ("algorithm", "world", "seed", "iterations",
                                      "rollouts_per_iteration", "eval_tasks", "step_filter",
                                      "lam", "top_p", "ppo_gamma", "ppo_lam")
            if k in cfg and (not k.startswith("ppo_") or cfg.get("algorithm") == "ppo")]
    if cfg.get("judge"):
        meta.append(f"judge={cfg['judge'].get('judge', cfg['judge'])}")
    parts.append(f'<p class="dl-meta">{e(", ".join(meta))}<br>folder: '
                 f'<code>{e(str(run.path.resolve()))}</code></p>')
    parts.append('<div id="dl-broken"></div>')

    stage_rows = [row for r in run.stage_table() for row in _with_splits(r)]
    parts.append("<h2>Summary</h2>")
    parts.append(_summary_table(stage_rows) if stage_rows
                 else "<p>No evaluation recorded yet.</p>")

    parts.append('<h2>Learning curve</h2><div class="dl-curves">')
    fig = plot_learning_curves([run])
    fig.savefig(out / "learning_curve.png", dpi=90)
    parts.append('<img src="learning_curve.png" alt="learning curve">')
    if any(run.series(k)[0] for k in ("kept_steps", "step_critic_loss",
                                      "success_with_recovery")):
        fig = plot_training_metrics([run])
        fig.savefig(out / "training_metrics.png", dpi=80)
        parts.append('<img src="training_metrics.png" alt="training metrics">')
    parts.append("</div>")

    shown = stages if stages is not None else run.eval_stages()
    parts.append("<h2>Evaluation trajectories</h2>")
    if not shown:
        parts.append("<p>This run stores no evaluation episodes (<code>eval/&lt;stage&gt;/"
                     "</code>).</p>")
    note = None
    if shown and grades and grader is None:
        try:
            from digirl_lite.viz.grades import Grader

            grader = Grader.from_run(run)
        except FileNotFoundError as err:
            note = f"Not graded: {err}."
    if grader is not None:  # what the grades mean: the run's learner says
        from digirl_lite.learners import learner_class

        note = learner_class(grader.algorithm).grades_note(
            grader, f"<code>{e(str(run.latest_checkpoint()))}</code>")
    if note:
        parts.append(f'<p class="dl-note">{note}</p>')
    if shown:
        parts.append("<nav>" + "".join(f'<a href="#stage-{e(s)}">{e(s)}</a>' for s in shown)
                     + "</nav>")

    def image_src(view, image) -> str:
        key = hashlib.blake2b(f"{view.screen_id}|{view.action_text}|{image.size}".encode(),
                              digest_size=10).hexdigest()
        path = img_dir / f"{key}.png"
        if not path.exists():
            image.save(path, optimize=True)
        return f"img/{key}.png"

    for stage in shown:
        t0 = time.perf_counter()
        trajs, screens = run.eval_trajectories(stage)
        trajs = trajs[:max_per_stage] if max_per_stage else trajs
        graded = grader.grade(trajs, screens) if grader is not None else {}
        wins = sum(t.is_success for t in trajs)
        known = [t for t in trajs if t.true_success is not None]
        true = (f" (judge); {sum(t.true_success for t in known)} of {len(known)} truly "
                "(the environment's check)" if known else "")
        parts.append(f'<h3 id="stage-{e(stage)}">{e(stage)}: {wins} of {len(trajs)} '
                     f"trajectories succeeded{true}</h3>")
        for t in trajs:
            parts.append(trajectory_html(t, screens, graded.get(t.traj_id),
                                         thumb_width=thumb_width, image_src=image_src,
                                         style=False))
        if progress:
            print(f"report: {stage}: {len(trajs)} trajectories in "
                  f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)

    page = ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>digirl_lite report: {e(run.name)}</title>"
            f"<style>{_PAGE_STYLE}{HTML_STYLE}</style></head><body>"
            + "\n".join(parts)
            + f'<p class="dl-meta">Written by digirl_lite.report on '
              f'{time.strftime("%Y-%m-%d %H:%M")}.</p>'
            + f"<script>{_IMAGE_CHECK}</script></body></html>\n")
    index = out / "index.html"
    index.write_text(page, encoding="utf-8")
    return index


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(prog="python -m digirl_lite.report",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="a run folder written by the Trainer")
    ap.add_argument("--out", default=None, help="report folder (default: RUN_DIR/report)")
    ap.add_argument("--stages", default=None,
                    help="comma-separated evaluation stages (default: all stored)")
    ap.add_argument("--max-per-stage", type=int, default=None,
                    help="at most this many trajectories per stage (default: all)")
    ap.add_argument("--thumb-width", type=int, default=180, help="frame width in pixels")
    ap.add_argument("--no-grades", action="store_true",
                    help="do not load the critics (no values, advantages or kept marks)")
    args = ap.parse_args(argv)
    index = build_report(args.run_dir, args.out,
                         stages=args.stages.split(",") if args.stages else None,
                         max_per_stage=args.max_per_stage, thumb_width=args.thumb_width,
                         grades=not args.no_grades, progress=True)
    print(index)
    return index


if __name__ == "__main__":
    main()
