"""What one `bench.throughput` run measured, kept (`--out DIR`): bench.json with every figure it printed and
bench.png, the same story in four pictures: frames/s (the ceiling from the stages alone, the whole system at
each actor count and with the actors' other inference), the ceiling each lever would give, the cores each
service kept busy in the end-to-end window with what one agent step costs each, and (a CPU learner) the CPU an
agent step the ceiling charges against what the window spent, part by part (achieved / ceiling).

The record is a plain dict filled as the benchmark goes (keys below); only what a run measured is in it.
  machine, cores, preset, game, settings                           what ran where
  stages: {environment_agent_steps_per_s, inference_samples_per_s, learner_samples_per_s (each alone on one
           core), learner_step_ms, operations, ceiling_frames_per_s, stolen_cores (the cores the hypervisor took
           meanwhile, steal time; from session 66)}
  levers: [{lever, stage, rate, gain, ceiling_frames_per_s, preset_rate (the preset's stage measured in turn)}]
  end_to_end: [{actors, frames_per_s, learner_steps_per_s, learner_bound_frames_per_s, lag, held, waited, ...}]
  actors (the end-to-end run the rest is of), ratio, learner_step_ms, actor_loop_ms, inference_passes,
  cpu: {service: cores}, agent_steps_per_s, stolen_cores (the window's steal time, in cores; from session 66)
  busiest_threads: {service: [share of the window its busiest thread ran, share it waited for a core]} (from
                   session 71; empty where the kernel keeps no schedstat)
  ceiling_gap_ms: {part: CPU ms an agent step} (a CPU learner: bench.cpu_use.ceiling_gap, the ratio's parts)
  other_inference: {inference, frames_per_s, x}
  stages_after: {environment_agent_steps_per_s, inference_samples_per_s, learner_samples_per_s,
                 ceiling_frames_per_s, ratio_to_mean_ceiling, stolen_cores} (the stages alone again after the window)

`python -m bench.record DIR|FILE ... [--picture PNG]` prints several runs' records side by side (the A/B runs
of bench/gpu_checks.sh, say), one row a run, and draws them side by side.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.cpu_use import BEYOND, CHARGED, SHOWN_CORES
from bench.system import ACTOR_PARTS
from learner_svc.step_time import PARTS

HATCHES = {"idle cores": "//", "taken by the hypervisor": "xx"}   # the parts of the cores no service spent

# the order the parts happen in, bottom up in the pictures (records keep their keys sorted)
PART_ORDER = (*PARTS, *ACTOR_PARTS, "the rest")


def write(record: dict, out: Path) -> tuple[Path, Path]:
    """bench.json and bench.png under `out` (made if missing); returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    data = out / "bench.json"
    data.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return data, draw(record, out / "bench.png")


def draw(record: dict, path: Path) -> Path:
    """The record's pictures side by side, those it has data for."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [draw_panel for draw_panel, data in ((_throughput, throughput_bars(record)),
                                                  (_levers, record.get("levers")), (_cores, record.get("cpu")),
                                                  (_ceiling_gap, record.get("ceiling_gap_ms")))
              if data]
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(6.5 * max(1, len(panels)), 4.6), squeeze=False)
    for panel, ax in zip(panels, axes[0], strict=False):
        panel(record, ax)
    fig.suptitle(f"bench.throughput: preset {record['preset']}, {record['game']}, {record['machine']}, "
                 f"{record['cores']} cores", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def throughput_bars(record: dict) -> list[tuple[str, float]]:
    """(label, frames/s) of the first picture: the ceiling, each end-to-end run, the other inference."""
    bars = []
    if "stages" in record:
        bars.append(("ceiling\n(stages alone)", record["stages"]["ceiling_frames_per_s"]))
    for run in record.get("end_to_end", []):
        bars.append((f"end to end\n{run['actors']} actor(s)", run["frames_per_s"]))
    other = record.get("other_inference")
    if other:
        bars.append((f"inference\n{other['inference']}", other["frames_per_s"]))
    if "stages_after" in record:
        bars.append(("ceiling\nafter the window", record["stages_after"]["ceiling_frames_per_s"]))
    return bars


def _throughput(record: dict, ax) -> None:
    labels, values = zip(*throughput_bars(record), strict=True)
    colours = ["#9e9e9e" if label.startswith("ceiling") else "#1f77b4" for label in labels]
    ax.bar(range(len(values)), values, color=colours)
    for i, v in enumerate(values):
        ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(values)), labels, fontsize=8)
    ax.set_ylabel("frames/s")
    title = "frames/s"
    if record.get("ratio") is not None:
        title += f"; achieved / ceiling {record['ratio']:.2f}"
    if "stages_after" in record:
        title += f" ({record['stages_after']['ratio_to_mean_ceiling']:.2f} to both ceilings' mean)"
    ax.set_title(title, fontsize=10)


def _levers(record: dict, ax) -> None:
    levers = record["levers"]
    ceiling = record["stages"]["ceiling_frames_per_s"]
    names = [f"{row['lever']} ({row['gain']:.2f}x {row['stage']})" for row in levers]
    values = [row["ceiling_frames_per_s"] for row in levers]
    ax.barh(range(len(values)), values, color=["#2ca02c" if v > ceiling else "#d62728" for v in values])
    ax.axvline(ceiling, color="black", linestyle="--", linewidth=1, label=f"the preset's ceiling {ceiling:,.0f}")
    low, high = min(*values, ceiling), max(*values, ceiling)
    ax.set_xlim(max(0.0, low - 0.5 * (high - low) - 0.05 * high), high + 0.05 * high)   # the differences, not 0
    ax.set_yticks(range(len(values)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ceiling with the lever, frames/s")
    ax.set_title("each lever on its stage alone", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")


def _cores(record: dict, ax) -> None:
    cpu = record["cpu"]
    steps = record["agent_steps_per_s"]
    bottom = 0.0
    for name, cores in sorted(cpu.items(), key=lambda item: -item[1]):
        if cores >= SHOWN_CORES:   # as bench.cpu_use's table
            ax.bar(0, cores, bottom=bottom, label=f"{name}: {cores:.2f} cores, {cores / steps * 1e3:.3f} ms a step")
        bottom += cores
    used = bottom
    stolen = record.get("stolen_cores", 0.0)   # records before session 66 have no steal time
    if stolen >= SHOWN_CORES:
        _unspent_bar(ax, "taken by the hypervisor", "taken by the hypervisor", stolen, bottom)
        bottom += stolen
    _unspent_bar(ax, "idle cores", "idle", max(record["cores"] - bottom, 0.0), bottom)
    ax.set_xlim(-0.6, 2.4)
    ax.set_xticks([])
    ax.set_ylabel("cores busy in the end-to-end window")
    ax.set_title(f"CPU by service: {used / steps * 1e3:.3f} ms an agent step in all", fontsize=10)
    ax.legend(fontsize=7, loc="upper right")


def _unspent_bar(ax, part: str, label: str, cores: float, bottom: float) -> None:
    """Cores no service spent, hatched as the same part of _ceiling_gap's bars."""
    ax.bar(0, cores, bottom=bottom, color="white", edgecolor="#9e9e9e", hatch=HATCHES[part],
           label=f"{label}: {cores:.2f} cores")


def _ceiling_gap(record: dict, ax) -> None:
    """Two stacked bars in CPU ms an agent step: what the ceiling charges, and what the window spent (the same
    charges, then each part beyond them); their heights' quotient is achieved / ceiling."""
    gap = record["ceiling_gap_ms"]
    colours = dict(zip(CHARGED, ("#1f77b4", "#2ca02c"), strict=True))
    for x, parts in enumerate((CHARGED, CHARGED + BEYOND)):
        bottom = 0.0
        for name in parts:
            extra = name in BEYOND
            ms = gap.get(name, 0.0)   # records before session 66 have no steal time
            ax.bar(x, ms, bottom=bottom, color=colours.get(name), alpha=0.55 if extra else 1.0,
                   hatch=HATCHES.get(name), edgecolor="#9e9e9e" if extra else None,
                   label=f"{name}: {ms:.3f} ms" if x == 1 else None)
            bottom += ms
        ax.text(x, bottom, f"{bottom:.3f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks([0, 1], ["the ceiling charges", "the window spent"], fontsize=8)
    ax.set_xlim(-0.6, 3.2)
    ax.set_ylabel("CPU ms an agent step")
    ratio = sum(gap[name] for name in CHARGED) / sum(gap.values())
    ax.set_title(f"achieved / ceiling {ratio:.2f}: where the rest of the CPU went", fontsize=10)
    ax.legend(fontsize=7, loc="upper right")


COLUMNS = ("frames/s", "ratio", "learner steps/s", "keeps up with", "held", "waited", "stolen", "GPU busy",
           "CPU ms/step")


def main_run(record: dict) -> dict | None:
    """The end-to-end run the record's other figures (CPU split, learner step, actor loop) are of: the one at
    its `actors` count, else its last; None without one."""
    runs = record.get("end_to_end") or []
    return next((r for r in runs if r["actors"] == record.get("actors")), runs[-1] if runs else None)


def summary_row(record: dict) -> list[str]:
    """One run's headline figures (COLUMNS): its main end-to-end run (the actor count the CPU split is of),
    achieved / ceiling where the stages ran, the learner's steps and the frames/s they keep up with at the replay
    ratio (bench.throughput.learner_bound_frames), replay holding the actors back and the learner waiting for data,
    the cores the hypervisor took in the window (steal time; records before session 66 lack it), the GPU's busy
    share where sampled, and the CPU of all services per agent step."""
    main = main_run(record)
    if main is None:
        return ["-"] * len(COLUMNS)
    cpu, steps = record.get("cpu") or {}, record.get("agent_steps_per_s")
    return [f"{main['frames_per_s']:,.0f}",
            f"{record['ratio']:.2f}" if record.get("ratio") is not None else "-",
            f"{main['learner_steps_per_s']:.2f}",
            f"{main['learner_bound_frames_per_s']:,.0f}" if "learner_bound_frames_per_s" in main else "-",
            f"{main['held']:.0%}", f"{main['waited']:.0%}",
            f"{record['stolen_cores']:.2f}" if "stolen_cores" in record else "-",
            f"{main['gpu_busy_percent']:.0f}%" if "gpu_busy_percent" in main else "-",
            f"{sum(cpu.values()) / steps * 1e3:.3f}" if cpu and steps else "-"]


def load(path: Path) -> tuple[str, dict]:
    """(name, record) of a bench.json or a folder holding one; the name is the folder's, or folder/file for
    a record under another name (bench/gpu_checks.sh's <order>-<check>.json)."""
    file = path / "bench.json" if path.is_dir() else path
    name = file.parent.name if file.name == "bench.json" else f"{file.parent.name}/{file.stem}"
    return name, json.loads(file.read_text())


def compare(paths: list[Path]) -> list[str]:
    """A table of the records under `paths` (each a bench.json or a folder holding one), one row a run,
    labelled by its folder, preset, actors and settings, and by its machine where they were not all one."""
    rows = [["run", *COLUMNS]]
    runs = [load(path) for path in paths]
    several_machines = len({record.get("machine") for _, record in runs}) > 1
    for name, record in runs:
        settings = " ".join(record.get("settings", []))
        label = f"{name}: {record['preset']}, {record.get('actors', '?')} actors {settings}".rstrip()
        if several_machines:
            label += f" [{record.get('machine', '?')}]"
        rows.append([label, *summary_row(record)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths,
            strict=True))) for row in rows]


def bar_names(names: list[str]) -> list[str]:
    """Each run's label under its bars: its file's or folder's own name where those tell the runs apart, else the
    whole name (records of one file name in several folders, zen4-s56/cpu beside amx-s54/cpu), so that no two
    runs share a bar."""
    short = [name.split("/")[-1] for name in names]
    return short if len(set(short)) == len(short) else names


def draw_comparison(paths: list[Path], path: Path) -> Path:
    """Several runs side by side in three pictures, one bar a run: frames/s with the rate the learner's steps
    keep up with marked, the learner's step in the system by part, and an actor's loop by part (where the
    records have them). The question they answer at a glance: which side waits, and on what."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [load(p) for p in paths]
    names = bar_names([name for name, _ in runs])
    fig, axes = plt.subplots(1, 3, figsize=(3 * max(4.5, 0.85 * len(runs)), 5.2), squeeze=False)
    ax = axes[0][0]
    mains = [main_run(rec) or {} for _, rec in runs]
    ceilings = [rec.get("stages", {}).get("ceiling_frames_per_s", 0.0) for _, rec in runs]
    if any(ceilings):   # behind each run's bar, wider: how far the window fell short of its stages alone
        ax.bar(names, ceilings, width=0.9, color="#d9d9d9", label="ceiling (its stages alone)")
    bars = ax.bar(names, [m.get("frames_per_s", 0.0) for m in mains], width=0.6, color="tab:blue",
                  label="frames/s in the window")
    ax.bar_label(bars, fmt="{:,.0f}", fontsize=7)
    bound = [(i, m["learner_bound_frames_per_s"]) for i, m in enumerate(mains) if "learner_bound_frames_per_s" in m]
    if bound:
        ax.scatter([i for i, _ in bound], [b for _, b in bound], marker="_", s=900, color="black", zorder=3,
                   label="what the learner's steps keep up with")
    ax.set_ylabel("frames/s")
    ax.set_title("end to end", fontsize=10)
    ax.set_ylim(top=1.3 * max([m.get("frames_per_s", 0.0) for m in mains] + [b for _, b in bound] + ceilings + [1.0]))
    ax.legend(fontsize=7, loc="upper right")
    for ax, key, title in ((axes[0][1], "learner_step_ms", "the learner's step in the system, ms"),
                           (axes[0][2], "actor_loop_ms", "an actor's loop (its games stepped once), ms")):
        parts = sorted({part for _, rec in runs for part in rec.get(key) or {}},
                       key=lambda part: (PART_ORDER.index(part) if part in PART_ORDER else len(PART_ORDER), part))
        bottom = [0.0] * len(runs)
        for part in parts:
            heights = [(rec.get(key) or {}).get(part, 0.0) for _, rec in runs]
            ax.bar(names, heights, bottom=bottom, label=part)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        ax.set_title(title, fontsize=10)
        if parts:   # the legend in the order the parts stack, the top one first, above the bars
            handles, labels = ax.get_legend_handles_labels()
            ax.legend(handles[::-1], labels[::-1], fontsize=7, loc="upper right", ncol=2)
            ax.set_ylim(top=1.45 * max(bottom))
    for ax in axes[0]:
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    first = runs[0][1]
    machines = {rec.get("machine") for _, rec in runs}
    machine = first["machine"] if len(machines) == 1 else f"{len(machines)} machines (the table names each run's)"
    fig.suptitle(f"bench.throughput: preset {first['preset']}, {first['game']}, {machine}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.record", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="bench.json files, or the folders that hold them")
    parser.add_argument("--picture", type=Path, help="also draw the runs side by side into this PNG "
                        "(frames/s, the learner's step and an actor's loop by part)")
    args = parser.parse_args(argv)
    for line in compare(args.paths):
        print(line)
    if args.picture:
        print(f"wrote {draw_comparison(args.paths, args.picture)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
