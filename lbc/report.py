"""`lbc report RUN [RUN ...]`: learning curves (PNG) and a markdown summary of one or more run folders.

A run folder (`runs/<name>/`, written by the launcher) holds `config.json`, `metrics.jsonl` (one progress
record every few seconds: frames, training return100, the published version, ...) and `eval.jsonl`
(one record per evaluation, keyed by the parameter version it played). An evaluation is placed on the
frame axis at the frames the actors had played when its version was first published (an `lbc evaluate`
of a checkpoint: when the checkpoint was written), so that the evaluation curve and the training curve
share one axis.

Over several games it prints the papers' aggregates of the final evaluation scores (mean and median
HNS, HWRNS, SABER, the count of human world records broken) and, over runs and games, the IQM of the
human-normalised scores with a 95% stratified bootstrap interval (lbc.scores.iqm_with_ci).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lbc.config import EnvConfig
from lbc.run_folder import read_jsonl
from lbc.scores import aggregate, human_normalised, iqm_with_ci


@dataclass
class Run:
    name: str
    preset: str
    game: str                 # lbc.config.EnvConfig.name: the Atari game, minatar-<game>, catch, a Gymnasium id
    metrics: list[dict]
    evals: list[dict] = field(default_factory=list)   # each with "frames" added from the version join
    # where the game itself is sticky (MinAtar), the evaluator plays it so: its probability, for records
    # written before the evaluator logged the probability it played with
    game_sticky: float = 0.0

    @property
    def frames(self) -> float:
        return self.metrics[-1]["frames"] if self.metrics else 0.0

    @property
    def wall_s(self) -> float:
        return self.metrics[-1]["time"] - self.metrics[0]["time"] if len(self.metrics) > 1 else 0.0

    @property
    def final_eval(self) -> dict | None:
        return self.evals[-1] if self.evals else None

    @property
    def best_eval(self) -> dict | None:
        return max(self.evals, key=lambda e: e["mean"]) if self.evals else None


def frames_at_version(metrics: list[dict], version: float) -> float | None:
    """Frames the actors had played when `version` was first seen published (None if never)."""
    for record in metrics:
        if record.get("version") is not None and record["version"] >= version:
            return record["frames"]
    return None


def load_run(path: Path) -> Run:
    """Read a run folder; raises ValueError when it holds no metrics log."""
    path = Path(path)
    metrics = read_jsonl(path / "metrics.jsonl")
    if not metrics:
        raise ValueError(f"{path}: no metrics.jsonl records (is it a run folder written by lbc.launch?)")
    config = json.loads((path / "config.json").read_text()) if (path / "config.json").exists() else {}
    env = config.get("env", {})
    try:
        game = EnvConfig(**env).name
    except ValueError:   # a run written by an lbc whose settings differ: its game as recorded
        game = str(env.get("game", "?"))
    evals = []
    for record in read_jsonl(path / "eval.jsonl"):
        # `lbc evaluate` records the frames its checkpoint was written at; the evaluator's versions join
        frames = record.get("run_frames")
        if frames is None:
            frames = frames_at_version(metrics, record["version"])
        if frames is not None:
            evals.append({**record, "frames": frames})
    evals.sort(key=lambda e: e["frames"])   # a checkpoint evaluated during the run lands among the others
    game_sticky = float(env.get("repeat_action_probability", 0.0)) if env.get("kind", "atari") != "atari" else 0.0
    return Run(name=path.name, preset=config.get("preset", "?"), game=game, metrics=metrics, evals=evals,
               game_sticky=game_sticky)


LAYER_STYLES = ("-", "--", ":")   # the torso's ReLU layers in order: first convolution, second, features


def plot(runs: list[Run], out: Path) -> Path:
    """Panels against frames: training return100, evaluation score (mean, with its std as a band), and
    where the runs recorded them the shares of the torso's dead units (decision 34), one line style per
    layer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    games = sorted({r.game for r in runs})
    with_dead = any(m.get("dead_units") for r in runs for m in r.metrics)
    columns = 3 if with_dead else 2
    fig, axes = plt.subplots(len(games), columns, figsize=(6 * columns, 4 * len(games)), squeeze=False)
    for row, game in enumerate(games):
        ax_train, ax_eval = axes[row][:2]
        if with_dead:
            _plot_dead_units(axes[row][2], [r for r in runs if r.game == game], game)
        for i, run in enumerate(r for r in runs if r.game == game):
            colour = f"C{i % 10}"
            train = [(m["frames"], m["mean_return_100"]) for m in run.metrics if m.get("mean_return_100") is not None]
            if train:
                x, y = zip(*train, strict=True)
                ax_train.plot(np.array(x) / 1e6, y, color=colour, label=run.name)
            if run.evals:
                x = np.array([e["frames"] for e in run.evals]) / 1e6
                mean = np.array([e["mean"] for e in run.evals])
                std = np.array([e["std"] for e in run.evals])
                ax_eval.plot(x, mean, "o-", color=colour, markersize=3, label=run.name)
                ax_eval.fill_between(x, mean - std, mean + std, color=colour, alpha=0.15)
        for ax, title in ((ax_train, "training return (last 100 episodes)"), (ax_eval, "evaluation score (± std)")):
            ax.set_title(f"{game}: {title}")
            ax.set_xlabel("frames (millions)")
            ax.set_ylabel("score")
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _plot_dead_units(ax, runs: list[Run], game: str) -> None:
    for i, run in enumerate(runs):
        layers = sorted({layer for m in run.metrics for layer in (m.get("dead_units") or {})},
                        key=lambda name: [int(p) if p.isdigit() else p for p in name.split(".")])
        for layer, style in zip(layers, LAYER_STYLES, strict=False):
            points = [(m["frames"], m["dead_units"][layer]) for m in run.metrics
                      if layer in (m.get("dead_units") or {})]
            x, y = zip(*points, strict=True)
            ax.plot(np.array(x) / 1e6, y, style, color=f"C{i % 10}", label=f"{run.name} {layer}")
    ax.set_title(f"{game}: torso units dead on a batch")
    ax.set_xlabel("frames (millions)")
    ax.set_ylabel("share of the layer")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def summary(runs: list[Run], png_name: str) -> str:
    """The markdown summary: one row per run, then the aggregates where there are several games or runs."""
    lines = ["# lbc report", "", f"![learning curves]({png_name})", "",
             "| run | preset | game | frames | wall time | evaluations | final eval (mean ± std, at frames) | "
             "final HNS | best eval (at frames) | eval protocol |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        final, best = r.final_eval, r.best_eval
        protocol = "-"
        if final:
            policy = final.get("policy", "?") + (f" eps {final['epsilon']}" if final.get("epsilon") is not None else "")
            noops = f"no-ops {final.get('noop_max', '?')}, " if human_normalised(r.game, 0.0) is not None else ""
            sticky = final.get("repeat_action_probability",
                                0.25 if final.get("sticky_actions") else r.game_sticky)
            protocol = f"{policy}, {final.get('episodes', '?')} episodes, {noops}sticky {sticky:g}" if sticky \
                else f"{policy}, {final.get('episodes', '?')} episodes, {noops}sticky no"
        lines.append(
            f"| {r.name} | {r.preset} | {r.game} | {r.frames / 1e6:.2f}M | {r.wall_s / 60:.0f} min | {len(r.evals)} | "
            + (f"{final['mean']:.2f} ± {final['std']:.2f} ({final['frames'] / 1e6:.2f}M) | "
               f"{_fmt(final.get('hns'), '.3f')} | "
               f"{best['mean']:.2f} ({best['frames'] / 1e6:.2f}M) | " if final else "- | - | - | ")
            + f"{protocol} |")
    scored = [r for r in runs if r.final_eval and human_normalised(r.game, 0.0) is not None]
    for preset in sorted({r.preset for r in scored}):
        mine = [r for r in scored if r.preset == preset]
        if len(mine) > 1:
            lines += ["", *aggregate_lines(preset, mine)]
    return "\n".join(lines) + "\n"


def aggregate_lines(preset: str, runs: list[Run]) -> list[str]:
    """One preset's aggregates over its runs' final evaluation scores (runs of one game averaged)."""
    games = sorted({r.game for r in runs})
    per_game = {g: float(np.mean([r.final_eval["mean"] for r in runs if r.game == g])) for g in games}
    agg = aggregate(per_game)
    lines = [f"## {preset}: aggregates of the final evaluation scores ({agg['games']} game(s), runs of a game "
             "averaged)", "",
             "| mean HNS | median HNS | mean HWRNS | median HWRNS | mean SABER | median SABER | HWRB |",
             "|---|---|---|---|---|---|---|",
             f"| {agg['mean_hns']:.1f}% | {agg['median_hns']:.1f}% | {agg['mean_hwrns']:.2f}% | "
             f"{agg['median_hwrns']:.2f}% | {agg['mean_saber']:.2f}% | {agg['median_saber']:.2f}% | {agg['hwrb']} |"]
    by_game = [[human_normalised(g, r.final_eval["mean"]) for r in runs if r.game == g] for g in games]
    runs_per_game = min(len(v) for v in by_game)
    matrix = np.array([v[:runs_per_game] for v in by_game]).T   # [runs, games]
    point, low, high = iqm_with_ci(matrix)
    return lines + ["", f"IQM of HNS over {runs_per_game} run(s) x {len(games)} game(s): {100 * point:.1f}% "
                        f"(95% stratified bootstrap interval {100 * low:.1f}% to {100 * high:.1f}%)"]
    return "\n".join(lines) + "\n"


def report(paths: list[Path], out_dir: Path | None = None, name: str = "report") -> tuple[Path, Path]:
    """Write <out_dir>/<name>.png and <name>.md (out_dir: the first run's parent folder)."""
    runs = [load_run(Path(p)) for p in paths]
    out_dir = Path(out_dir) if out_dir is not None else Path(paths[0]).resolve().parent
    png = plot(runs, out_dir / f"{name}.png")
    md = out_dir / f"{name}.md"
    md.write_text(summary(runs, png.name))
    return png, md
