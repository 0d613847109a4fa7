"""The summary, the table and the chart of ``bench.compare``.

A row is a dict: ``workload`` (a Riverbed workload), ``riverbed`` (the Riverbed variant's broker name),
``label``, and ``cols``: {peer name: (peer workload, peer broker name)} for every peer with a mapping
(RabbitMQ runs the row's own workload; Redis and NATS their mapped workloads). Every ratio is
Riverbed ÷ peer (ratio of medians, range min/max to max/min); goals are judged against RabbitMQ, or as
absolute figures.
"""

import statistics
import sys

from bench._workloads import CHART, KIND_METRICS, METRICS, PEER_LABELS, W, goal

# bar hatching per peer in the chart
HATCH = {"rabbitmq": "", "redis": "///", "nats": "..."}


def summarise(runs, pairs):
    """{(workload, broker): {metric: {med, min, max, values}, noisy_rounds, rounds}} over the kept runs."""
    out = {}
    for wname, bname in pairs:
        kept = [r for r in runs if r["workload"] == wname and r["broker"] == bname and r.get("kept")]
        if not kept:
            continue
        d = {}
        for key in METRICS:
            vals = [r[key] for r in kept if r.get(key) is not None]
            if vals:
                d[key] = {"med": statistics.median(vals), "min": min(vals), "max": max(vals), "values": vals}
        d["noisy_rounds"] = sum(1 for r in kept if r.get("noisy"))
        d["rounds"] = len(kept)
        out[(wname, bname)] = d
    return out


def ratio(a, b):
    """Riverbed (b) ÷ peer (a): ratio of medians, range from min/max to max/min; None when either is
    missing or the peer's figure is zero."""
    if not a or not b or a["med"] == 0 or a["min"] == 0:
        return None
    return {"med": b["med"] / a["med"], "min": b["min"] / a["max"], "max": b["max"] / a["min"]}


def row_pairs(rows):
    """Every (workload, broker) that a row reads."""
    out = set()
    for row in rows:
        out.add((row["workload"], row["riverbed"]))
        out.update(row["cols"].values())
    return out


def row_ratios(summary, row):
    """{peer: {metric: ratio or None}} of one row."""
    rb = summary.get((row["workload"], row["riverbed"]), {})
    return {peer: {k: ratio(summary.get(key, {}).get(k), rb.get(k)) for k in KIND_METRICS[W[row["workload"]]["kind"]]}
            for peer, key in row["cols"].items()}


def goal_check(wname, key, ratio_d, rb, durable=False):
    """'met (...)' / 'MISSED (...)' for a Riverbed figure with a goal, '?' when it cannot be judged (a
    ratio goal without RabbitMQ), '' without a goal."""
    g = goal(wname, key, durable)
    if not g:
        return ""
    how, op, target = g
    val = (ratio_d or {}).get("med") if how == "ratio" else (rb or {}).get("med")
    text = (f"{op}{target:g}×" if how == "ratio" else f"{op}{target:g}")
    if val is None:
        return f"? ({text})"
    ok = val >= target if op == ">=" else val <= target
    return f"{'met' if ok else 'MISSED'} ({text})"


def fmt_stat(d, fmt):
    if not d:
        return "—"
    if d["min"] == d["max"]:
        return fmt.format(d["med"])
    return f"{fmt.format(d['med'])} ({fmt.format(d['min'])}–{fmt.format(d['max'])})"


def fmt_ratio(r, a, b):
    if r is None:
        return "—"
    if len(a["values"]) > 1 or len(b["values"]) > 1:
        return f"{r['med']:.2f} ({r['min']:.2f}–{r['max']:.2f})"
    return f"{r['med']:.2f}"


def table_rows(summary, rows, peers):
    """rows (see the module docstring), peers: the peer names that ran, in column order -> table lines:
    workload, metric, [RabbitMQ], Riverbed, [Riverbed ÷ RabbitMQ], then per other peer its figure and
    Riverbed ÷ it, then the goal. A row without a mapping to a peer shows "—" there."""
    others = [p for p in peers if p != "rabbitmq"]
    rabbit = "rabbitmq" in peers
    header = ["workload", "metric"] + (["RabbitMQ"] if rabbit else []) + ["Riverbed"]
    header += ["Riverbed ÷ RabbitMQ"] if rabbit else []
    for p in others:
        header += [PEER_LABELS[p], f"Riverbed ÷ {PEER_LABELS[p]}"]
    lines = [tuple(header + ["goal"])]
    for row in rows:
        wname, label = row["workload"], row["label"]
        b_all = summary.get((wname, row["riverbed"]), {})
        peer_all = {p: summary.get(row["cols"][p], {}) if p in row["cols"] else {} for p in peers}
        if not b_all and not any(peer_all.values()):
            continue
        noisy = b_all.get("noisy_rounds") or any(d.get("noisy_rounds") for d in peer_all.values())
        first = True
        for key in KIND_METRICS[W[wname]["kind"]]:
            mlabel, fmt, _ = METRICS[key]
            b = b_all.get(key)
            cells = [label + ("*" if noisy else "") if first else "", mlabel]
            r_rabbit = None
            if rabbit:
                a = peer_all["rabbitmq"].get(key)
                r_rabbit = ratio(a, b)
                cells += [fmt_stat(a, fmt), fmt_stat(b, fmt), fmt_ratio(r_rabbit, a, b)]
            else:
                cells.append(fmt_stat(b, fmt))
            for p in others:
                a = peer_all[p].get(key)
                cells += [fmt_stat(a, fmt), fmt_ratio(ratio(a, b), a, b)]
            cells.append(goal_check(wname, key, r_rabbit, b, durable=row["riverbed"] != "riverbed"))
            lines.append(tuple(cells))
            first = False
    return lines


def print_table(lines, out=sys.stdout):
    widths = [max(len(str(r[i])) for r in lines) for i in range(len(lines[0]))]
    last = len(lines[0]) - 1
    for j, row in enumerate(lines):
        cells = []
        for i, c in enumerate(row):
            c = str(c)
            cells.append(c.ljust(widths[i]) if i < 2 or i == last else c.rjust(widths[i]))
        print("  ".join(cells).rstrip(), file=out)
        if j == 0:
            print("  ".join("-" * w for w in widths), file=out)


def chart_items(summary, rows, keys, peers):
    """The bars of one panel: (name, peer, ratio, goal as a ratio or None, goal met or None, note)."""
    items = []
    for row in rows:
        wname, b_name, label = row["workload"], row["riverbed"], row["label"]
        for key in keys:
            if key not in CHART[W[wname]["kind"]]:
                continue
            b = summary.get((wname, b_name), {}).get(key)
            first = True
            for peer in peers:
                if peer not in row["cols"]:
                    continue
                a_all = summary.get(row["cols"][peer], {})
                a = a_all.get(key)
                r = ratio(a, b)
                if r is None:
                    continue
                g = goal(wname, key, b_name != "riverbed") if peer == "rabbitmq" else None
                if g and g[0] == "ratio":
                    goal_ratio, met = g[2], (r["med"] >= g[2] if g[1] == ">=" else r["med"] <= g[2])
                elif g:   # an absolute goal, drawn where it falls relative to RabbitMQ's median
                    goal_ratio, met = g[2] / a["med"], (b["med"] >= g[2] if g[1] == ">=" else b["med"] <= g[2])
                else:
                    goal_ratio, met = None, None
                noisy = a_all.get("noisy_rounds") or summary[(wname, b_name)].get("noisy_rounds")
                name = ((label if key == "msgs_per_s" else f"{label} — {METRICS[key][0]}") + (" *" if noisy else "")
                        if first else "")
                fmt = METRICS[key][1]
                note = f"{r['med']:.2f}× {PEER_LABELS[peer]}  ({fmt.format(b['med'])} vs {fmt.format(a['med'])}"
                if g and g[0] == "abs":
                    note += f"; goal {g[1]}{g[2]:g}"
                note += ")"
                items.append((name, peer, r, goal_ratio, met, note))
                first = False
    return items


def draw_chart(summary, rows, peers, path, title):
    """Two panels of horizontal bars, Riverbed ÷ each peer (median, whiskers = min–max): throughput
    (higher is better) and server CPU per message / confirm latency / memory (lower is better); one bar
    per peer, hatched by peer. Green = goal met (or, without a goal, better than parity), orange = better
    than parity but short of the goal, red = worse than parity. Each bar is annotated with the medians."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    panels = [("higher is better — throughput (msgs/s)", ["msgs_per_s"], True),
              ("lower is better — server CPU per message, confirm latency, memory",
               ["server_us_per_msg", "lat_p50_us", "lat_p99_us", "server_peak_rss_mb"], False)]
    data = [(t, chart_items(summary, rows, keys, peers), higher) for t, keys, higher in panels]
    data = [d for d in data if d[1]]
    if not data:
        return
    heights = [0.36 * len(items) + 1.2 for _, items, _ in data]
    fig, axes = plt.subplots(len(data), 1, figsize=(13, sum(heights) + 1.5),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, (ptitle, items, higher) in zip(axes[:, 0], data):
        ys = list(range(len(items)))[::-1]
        xmax = max(2.0, max(max(it[2]["max"], it[3] or 0) for it in items) * 1.45)
        positive = [v for it in items for v in (it[2]["min"], it[2]["med"]) if v > 0]
        # Peers far apart (Redis and NATS differ from Riverbed by 0.05-25x) squash a linear axis: log it.
        log_x = bool(positive) and xmax / min(positive) > 40
        if log_x:
            ax.set_xscale("log")
            xmin, xmax = min(positive) / 1.5, xmax * 4
        for y, (_, peer, r, goal, met, note) in zip(ys, items):
            better = r["med"] >= 1.0 if higher else r["med"] <= 1.0
            colour = "#2b8a3e" if (met if met is not None else better) else ("#e8590c" if better else "#c92a2a")
            ax.barh([y], [r["med"]], xerr=[[max(0.0, r["med"] - r["min"])], [max(0.0, r["max"] - r["med"])]],
                    color=colour, alpha=0.85, capsize=4, ecolor="#333", height=0.7, hatch=HATCH[peer],
                    edgecolor="white" if HATCH[peer] else None)
            ax.text(r["max"] * 1.08 if log_x else r["max"] + xmax * 0.01, y, note, va="center", fontsize=7.5)
            if goal is not None:
                ax.plot([goal, goal], [y - 0.42, y + 0.42], color="#1c7ed6", linewidth=2.5)
        ax.axvline(1.0, color="black", linewidth=1.2)
        ax.set_yticks(ys)
        ax.set_yticklabels([it[0] for it in items], fontsize=8)
        ax.set_xlim(xmin if log_x else 0, xmax)
        ax.set_title(ptitle, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    present = [p for p in peers if any(it[1] == p for _, items, _ in data for it in items)]
    fig.legend(handles=[Patch(facecolor="#868e96", hatch=HATCH[p], edgecolor="white",
                              label=f"Riverbed ÷ {PEER_LABELS[p]}") for p in present],
               loc="upper left", fontsize=7.5, ncol=len(present), frameon=False)
    axes[-1, 0].set_xlabel("Riverbed ÷ peer — bar: median; whiskers: min–max; black line: parity; blue tick: goal "
                           "(goals are against RabbitMQ)\ngreen: goal met (no goal: better than the peer); orange: "
                           "better than the peer but short of the goal; red: worse; * = a kept run was noisy",
                           fontsize=7.5)
    fig.suptitle(title, fontsize=10.5)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / fig.get_figheight()))
    fig.savefig(path, dpi=110)
    plt.close(fig)
