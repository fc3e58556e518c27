"""The Grafana dashboard "lbc training", built with grafana-foundation-sdk.

`python -m lbc.dashboard` writes k8s/components/monitoring/dashboard.json (shipped as a ConfigMap for
Grafana's sidecar); a test checks the file is what this module builds and that every query returns
data from a real Prometheus scraping the real services. Series carry the labels the PodMonitor
sets: namespace, run, pod and component.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh

OUTPUT = Path(__file__).resolve().parent.parent / "k8s" / "components" / "monitoring" / "dashboard.json"
UID = "lbc-training"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = 'namespace=~"$namespace", run=~"$run"'   # every query is scoped to the chosen namespace and run
INFERENCE_ROW = "Central inference (actor.inference=remote)"   # its panels are empty where actors infer locally


def _query(expr: str, legend: str = "", fmt: str | None = None) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).legend_format(legend or "__auto").datasource(DATASOURCE)
    if fmt is not None:
        q = q.format(fmt)
    return q


def _series(title: str, unit: str, *queries: prometheus.Dataquery, width: int = 12) -> timeseries.Panel:
    panel = timeseries.Panel().title(title).unit(unit).datasource(DATASOURCE).height(8).span(width)
    for q in queries:
        panel = panel.with_target(q)
    return panel


def _stat(title: str, unit: str, query: prometheus.Dataquery) -> stat.Panel:
    return stat.Panel().title(title).unit(unit).datasource(DATASOURCE).height(4).span(6).with_target(query)


def build() -> dict:
    rate = "[$__rate_interval]"
    d = (
        db.Dashboard("lbc training")
        .uid(UID)
        .tags(["lbc", "reinforcement-learning"])
        .description("Throughput, returns, learner, replay, bandit and resources of one lbc training run.")
        .refresh("30s")
        .time("now-3h", "now")
        .with_variable(db.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(
            db.QueryVariable("namespace").label("Namespace").datasource(DATASOURCE)
            .query("label_values(lbc_learner_steps_total, namespace)").refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        )
        .with_variable(
            db.QueryVariable("run").label("Run").datasource(DATASOURCE)
            .query('label_values(lbc_learner_steps_total{namespace=~"$namespace"}, run)')
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        )
        .with_variable(
            db.QueryVariable("dimension").label("psi dimension").datasource(DATASOURCE)
            .query(f"label_values(lbc_bandit_selections_total{{{SEL}}}, dimension)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).multi(True).include_all(True)
        )
        .with_row(db.Row("Overview"))
        .with_panel(_stat("Frames/s", "short", _query(f"sum(rate(lbc_actor_frames_total{{{SEL}}}{rate}))")))
        .with_panel(_stat("Mean return (last 100, all actors)", "short",
                          _query(f"avg(lbc_actor_return_mean100{{{SEL}}})")))
        .with_panel(_stat("Human-normalised score", "percentunit", _query(f"avg(lbc_actor_hns_mean100{{{SEL}}})")))
        .with_panel(_stat("Parameter version", "none", _query(f"max(lbc_learner_param_version{{{SEL}}})")))
        .with_row(db.Row("Throughput"))
        .with_panel(_series("Frames/s, total and per actor", "short",
                            _query(f"sum(rate(lbc_actor_frames_total{{{SEL}}}{rate}))", "total"),
                            _query(f"sum by (pod) (rate(lbc_actor_frames_total{{{SEL}}}{rate}))", "{{pod}}")))
        .with_panel(_series("Learner steps/s and samples/s", "short",
                            _query(f"sum(rate(lbc_learner_steps_total{{{SEL}}}{rate}))", "steps/s"),
                            _query(f"sum(rate(lbc_learner_samples_total{{{SEL}}}{rate}))", "samples/s")))
        .with_panel(_series("Actors' loop: share of time in inference (acting remotely: waiting for the answer) "
                            "and in the games", "percentunit",
                            _query(f"sum by (pod) (rate(lbc_actor_inference_seconds_total{{{SEL}}}{rate}))",
                                   "{{pod}} inference"),
                            _query(f"sum by (pod) (rate(lbc_actor_env_seconds_total{{{SEL}}}{rate}))", "{{pod}} games"),
                            width=24))
        .with_row(db.Row("Returns"))
        .with_panel(_series("Mean return of the last 100 episodes", "short",
                            _query(f"lbc_actor_return_mean100{{{SEL}}}", "{{pod}}")))
        .with_panel(_series("Human-normalised score", "percentunit",
                            _query(f"lbc_actor_hns_mean100{{{SEL}}}", "{{pod}}")))
        .with_row(db.Row("Evaluation (fixed policy, whole games)"))
        .with_panel(_series("Evaluation score: mean, median, std", "short",
                            _query(f"lbc_eval_score{{{SEL}}}", "{{stat}}")))
        .with_panel(_series("Evaluation: normalised score of the mean", "percentunit",
                            _query(f"lbc_eval_normalised_score{{{SEL}}}", "{{measure}}")))
        .with_panel(_series("Version evaluated, and the learner's", "none",
                            _query(f"max(lbc_eval_param_version{{{SEL}}})", "evaluated"),
                            _query(f"max(lbc_learner_param_version{{{SEL}}})", "learner")))
        .with_panel(_series("Evaluation episodes per minute", "short",
                            _query(f"sum(rate(lbc_eval_episodes_total{{{SEL}}}{rate})) * 60", "episodes/min")))
        .with_row(db.Row("Learner"))
        .with_panel(_series("Loss terms per policy", "short",
                            _query(f"lbc_learner_loss{{{SEL}}}", "policy {{policy}} {{term}}"), width=24))
        .with_panel(_series("Parameter version: learner and actors", "none",
                            _query(f"max(lbc_learner_param_version{{{SEL}}})", "learner"),
                            _query(f"lbc_actor_param_version{{{SEL}}}", "{{pod}}")))
        .with_panel(_series("Policy lag (versions)", "none",
                            _query(f"lbc_learner_policy_lag{{{SEL}}}", "{{stat}}")))
        .with_panel(_series("Learner's training thread: share of time by part (device_wait: waiting for the GPU)",
                            "percentunit",
                            _query(f"avg by (part) (rate(lbc_learner_step_seconds_total{{{SEL}}}{rate}))", "{{part}}"),
                            width=24))
        .with_panel(_series("Torso units dead on a batch (all dead: the net is blind)", "percentunit",
                            _query(f"lbc_learner_dead_units_ratio{{{SEL}}}", "{{layer}}")))
        .with_row(db.Row("Replay"))
        .with_panel(_series("Replay fill", "percentunit",
                            _query(f"sum(lbc_replay_sequences{{{SEL}}}) / sum(lbc_replay_capacity_sequences{{{SEL}}})",
                                   "fill")))
        .with_panel(_series("Insert and sample rates (sequences/s)", "short",
                            _query(f"sum(rate(lbc_replay_inserted_total{{{SEL}}}{rate}))", "inserted"),
                            _query(f"sum(rate(lbc_replay_sampled_total{{{SEL}}}{rate}))", "sampled")))
        .with_panel(_series("Who waits: learner on data, actors on the rate limiter", "percentunit",
                            _query(f"sum(rate(lbc_replay_sample_blocked_seconds_total{{{SEL}}}{rate}))", "learner"),
                            _query(f"sum(rate(lbc_replay_insert_blocked_seconds_total{{{SEL}}}{rate}))", "actors"),
                            width=24))
        .with_row(db.Row("Bandit (behaviour control)"))
        .with_panel(
            heatmap.Panel().title("Arm selections: $dimension").datasource(DATASOURCE).height(8).span(12)
            .repeat("dimension").repeat_direction("h").max_per_row(2).calculate(False)
            .with_target(_query(
                f'sum by (arm) (increase(lbc_bandit_selections_total{{{SEL}, dimension=~"$dimension"}}{rate}))',
                "{{arm}}", fmt="heatmap"))
        )
        .with_panel(_series("tau chosen (inverse temperature; epsilon for the epsilon-greedy family)", "none",
                            _query(f'lbc_bandit_psi{{{SEL}, dimension=~"tau_.*|epsilon_.*"}}', "{{dimension}}")))
        .with_panel(_series("omega chosen (mixture weight)", "none",
                            _query(f'lbc_bandit_psi{{{SEL}, dimension=~"omega_.*"}}', "{{dimension}}")))
        .with_row(db.Row("Resources"))
        .with_panel(_series("CPU per service (cores)", "short",
                            _query(f"sum by (component) (rate(process_cpu_seconds_total{{{SEL}}}{rate}))",
                                   "{{component}}")))
        .with_panel(_series("Resident memory per service", "bytes",
                            _query(f"sum by (component) (process_resident_memory_bytes{{{SEL}}})", "{{component}}")))
        # only where actors act through the inference service (components/central-inference; the gpu overlay)
        .with_row(db.Row(INFERENCE_ROW))
        .with_panel(_series("Forward passes/s and requests answered/s", "short",
                            _query(f"sum(rate(lbc_inference_passes_total{{{SEL}}}{rate}))", "passes/s"),
                            _query(f"sum(rate(lbc_inference_requests_total{{{SEL}}}{rate}))", "requests/s")))
        .with_panel(_series("A pass: games and requests (the batch the service gathers)", "short",
                            _query(f"sum(rate(lbc_inference_games_total{{{SEL}}}{rate})) / "
                                   f"sum(rate(lbc_inference_passes_total{{{SEL}}}{rate}))", "games"),
                            _query(f"sum(rate(lbc_inference_requests_total{{{SEL}}}{rate})) / "
                                   f"sum(rate(lbc_inference_passes_total{{{SEL}}}{rate}))", "requests")))
        .with_panel(_series("Forward pass time", "ms",
                            _query(f"1000 * sum(rate(lbc_inference_forward_seconds_total{{{SEL}}}{rate})) / "
                                   f"sum(rate(lbc_inference_passes_total{{{SEL}}}{rate}))", "ms a pass")))
        .with_panel(_series("Requests refused/s, by reason (an actor whose network or game does not fit)", "short",
                            _query(f"sum by (reason) (rate(lbc_inference_rejected_total{{{SEL}}}{rate}))",
                                   "{{reason}}")))
    )
    return json.loads(json.dumps(d.build(), cls=JSONEncoder))


def panels_by_row(board: dict) -> dict[str, list[dict]]:
    """The built board's panels (rows themselves left out) under the title of the row they follow."""
    rows: dict[str, list[dict]] = {}
    title = ""
    for panel in board["panels"]:
        if panel["type"] == "row":
            title = panel["title"]
            rows[title] = []
        else:
            rows.setdefault(title, []).append(panel)
    return rows


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lbc.dashboard", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUTPUT, help=f"where to write (default {OUTPUT})")
    args = parser.parse_args(argv)
    args.out.write_text(render())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
