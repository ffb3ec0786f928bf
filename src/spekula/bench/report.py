"""Reports from one result dict: a Markdown summary, PNG plots, and a self-contained HTML page.

The result dict (what `spekula bench` writes as JSON) holds everything: the manifest, the
configurations (the first one is the baseline), summaries per configuration and category, every
request, and optionally one output rendered token by token. Nothing here measures or re-derives a
number: it formats what spekula.bench.metrics computed.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

from spekula.extras import needs_extra

PLOT_TITLES = {
    "speedup_per_category": "Speedup over plain decoding, per category (median, bars: p10-p90)",
    "acceptance_by_position": "Acceptance rate by draft position",
    "tau_distribution": "Distribution of tau (tokens per target pass), per request",
    "speedup_vs_k": "Speedup against k (median, bars: p10-p90)",
}
KIND_COLOURS = {"accepted": "#b7e4c7", "recovered": "#ffd6a5", "bonus": "#a0c4ff", "plain": "#e9ecef"}
KIND_WORDS = {
    "accepted": "drafted and accepted",
    "recovered": "target: recovered token after a rejection",
    "bonus": "target: bonus token after a fully accepted draft",
    "plain": "target: plain step (nothing drafted)",
}


# -- Markdown ---------------------------------------------------------------------------------------


def markdown(result: dict[str, Any], images: dict[str, str] | None = None, level: int = 2) -> str:
    """The summary printed on stdout; `images`: plot name -> path to link (docs); `level`: of the
    top heading (3 when it goes under a section of a larger document)."""
    h1, h2 = "#" * level, "#" * (level + 1)
    configs = [c["name"] for c in result["configs"]]
    spec = [c for c in configs if c != result["baseline"]]
    lines = _overall(result, configs, h1)
    lines += _failures(result)
    lines += _loop_notes(result)
    lines += ["", memory_note(result)]
    if spec:
        lines += _per_category(result, spec, h2)
        lines += _by_position(result["summary"], spec, h2)
    for name, path in (images or {}).items():
        lines += ["", f"![{PLOT_TITLES.get(name, name)}]({path})"]
    return "\n".join(lines) + "\n"


def _overall(result: dict[str, Any], configs: list[str], h1: str) -> list[str]:
    """The heading, what was run, and one row per configuration over the whole workload."""
    baseline = result["baseline"]
    s = result["summary"]
    w = result["workload"]
    samp = result["sampling"]
    mode = (
        "greedy"
        if samp["temperature"] == 0
        else f"temperature {samp['temperature']}, top-p {samp['top_p']}, top-k {samp['top_k']}, min-p {samp['min_p']}"
    )
    lines = [
        f"{h1} spekula bench: {result['target']}",
        "",
        f"{w['prompts']} prompts ({w['name']}; {len(w['categories'])} categories) x {len(configs)} configurations, "
        f"{mode}, "
        f"max_tokens <= {result['max_tokens'] if result.get('max_tokens') else 'per prompt'}, "
        f"{result.get('repeats', 1)} repeat(s); "
        f"baseline: {baseline}.",
        "",
        "| configuration | tok/s | speedup median [p10, p90] | decode-only speedup median [p10, p90] | α | τ | TTFT "
        "p50 (s) | TPOT p50 (ms) | latency p50 / p90 / p99 (s) | wasted drafts | steps by k | identical to baseline "
        "| CPU-s / 1k tok | peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in configs:
        o = s[name]["overall"]
        sp = o["speedup"]
        lines.append(
            f"| {name} | {_f(o['throughput_tokens_per_s'])} | {_speedup(sp)} | {_speedup(o['decode_speedup'])} | "
            f"{_f(o['alpha'])} | {_f(o['tau'])} | "
            f"{_f(o['ttft_s']['p50'])} | {_f(_ms(o['tpot_s']['p50']))} | "
            f"{_f(o['latency_s']['p50'])} / {_f(o['latency_s']['p90'])} / {_f(o['latency_s']['p99'])} | "
            f"{_wasted(o)} | {_steps(o)} | {_identical(o)} | {_f(o['cpu_s_per_1k_tokens'])} | "
            f"{_mib(o['peak_rss_bytes'])} |"
        )
    return lines


def _per_category(result: dict[str, Any], spec: list[str], h2: str) -> list[str]:
    """Each speculative configuration's median speedup and α in each category."""
    s = result["summary"]
    lines = [
        "",
        f"{h2} Speedup per category (median per-prompt speedup, whole requests and decode only; α; "
        f"{memory_state(result)})",
        "",
        "| category | " + " | ".join(spec) + " |",
        "|---|" + "---|" * len(spec),
    ]
    for cat in result["workload"]["categories"]:
        cells = []
        for name in spec:
            c = s[name]["categories"].get(cat)
            cells.append("n/a" if c is None else f"{_f(c['speedup']['median'])}x{_decode(c)} (α {_f(c['alpha'])})")
        lines.append(f"| {cat} | " + " | ".join(cells) + " |")
    return lines


def _by_position(s: dict[str, Any], spec: list[str], h2: str) -> list[str]:
    """Each speculative configuration's acceptance rate by draft position (nothing when none drafted)."""
    depth = max((len(s[n]["overall"]["acceptance_by_position"]) for n in spec), default=0)
    if not depth:
        return []
    lines = [
        "",
        f"{h2} Acceptance by draft position",
        "",
        "| configuration | " + " | ".join(str(i + 1) for i in range(depth)) + " |",
        "|---|" + "---|" * depth,
    ]
    for name in spec:
        acc = s[name]["overall"]["acceptance_by_position"]
        lines.append(f"| {name} | " + " | ".join(_f(acc[i]) if i < len(acc) else "" for i in range(depth)) + " |")
    return lines


def memory_state(result: dict[str, Any]) -> str:
    """'cold', 'warm' or 'server': the proposer memory every figure of the run is for (older results: cold)."""
    memory = result.get("proposer_memory") or {}
    return memory.get("state", "cold" if result["mode"] == "in-process" else "server")


def memory_note(result: dict[str, Any]) -> str:
    """One paragraph under the table: what the proposers remembered when each reported request started."""
    memory = result.get("proposer_memory") or {}
    state = memory_state(result)
    before = memory.get("requests_before")
    span = f"{before[0]} to {before[1]}" if before else "some"
    if state == "cold":
        return (
            "Proposer memory: **cold**, emptied at the start of every repeat, as on a server just started: a request "
            f"drafts only from the requests before it in its repeat ({span}). A server that has been running "
            "remembers more: `spekula bench --warm` measures that (docs/BENCH.md)."
        )
    if state == "warm":
        if result["mode"] == "endpoint":
            how = "each server answering with what it learnt from every request before it"
            also = " (and whatever it learnt before this run)"
        else:
            how, also = "each configuration drafting from its own memory of every request before it", ""
        return (
            f"Proposer memory: **warm**, one sequence as a server meets it: {memory.get('prefix_requests')} requests "
            f"first, not reported, then these, {how} ({span}){also}. The reported prompts are new to the server "
            "except the 'resent' row: earlier prompts sent again, a line in front."
        )
    return (
        "Server memory: whatever each server had learnt before this run, plus this run's earlier requests; the bench "
        "cannot empty it (restart a server for a cold one; `--warm` for a warm one)."
    )


def _loop_notes(result: dict[str, Any]) -> list[str]:
    """Below the table, where a contender ran another program's loop (spekula.bench.reference) or the
    baseline is not spekula's plain decoding: what its columns compare."""
    others = [c["name"] for c in result["configs"] if c.get("loop", "spekula") != "spekula"]
    lines = []
    if result["mode"] == "in-process" and result["baseline"] != "plain":
        lines.append(
            f"Speedups are over {result['baseline']}. Identity: plain rows against {result['baseline']}; "
            "speculative rows against spekula's plain decoding on their own runtime (the lossless guarantee)."
        )
    if others:
        lines.append(
            f"{', '.join(others)}: another program's own decoding loop on the same GGUF and prompt tokens "
            "(docs/BENCH.md). Its prompt pass also yields its first token, so it has no decode-only rate: compare "
            "decode speed by TPOT, which counts the same one-token passes on both sides."
        )
    return [part for line in lines for part in ("", line)]  # a paragraph each


def _failures(result: dict[str, Any]) -> list[str]:
    """Below the table: failed requests per configuration, and what was left out because of them."""
    s = result["summary"]
    names = [c["name"] for c in result["configs"]]
    if not any(s[n]["overall"]["errors"] or s[n]["overall"].get("excluded") for n in names):
        return []
    wall = ""
    if result["mode"] == "endpoint":
        wall = " (tok/s over wall time is n/a where any was left out: the wall time includes them)"
    lines = [
        "",
        "Failed requests are errors, left out of every column; so are the other configurations' runs of the "
        f"same prompt, so every row is computed over the same prompts{wall}.",
    ]
    for name in names:
        o = s[name]["overall"]
        first = next((r["error"] for r in result["requests"] if r["config"] == name and r.get("error")), None)
        example = f"; first: {first}" if first else ""
        counts = f"{o['errors']} error(s), {o.get('excluded', 0)} excluded, {o['requests']} counted"
        lines.append(f"- {name}: {counts}{example}")
    return lines


def last_line(result: dict[str, Any], paths: dict[str, str]) -> str:
    """The one JSON object scripts read from the last line of stdout."""
    configs = {}
    for c in result["configs"]:
        o = result["summary"][c["name"]]["overall"]
        configs[c["name"]] = {
            "tokens_per_s": o["throughput_tokens_per_s"],
            "speedup_median": o["speedup"]["median"],
            "decode_speedup_median": o["decode_speedup"]["median"],
            "alpha": o["alpha"],
            "tau": o["tau"],
            "identical": o["identical_to_plain"],
            "compared": o["compared_to_plain"],
            "errors": o["errors"],
            "excluded": o.get("excluded", 0),
        }
    return json.dumps(
        {
            "kind": result["kind"],
            "mode": result["mode"],
            "baseline": result["baseline"],
            "proposer_memory": memory_state(result),
            "configs": configs,
            **paths,
        }
    )


# -- plots ----------------------------------------------------------------------------------------


def plots(result: dict[str, Any]) -> dict[str, bytes]:
    """PNG bytes per plot name; plots without data (e.g. acceptance for endpoints) are left out."""
    with needs_extra("bench", "the report's plots"):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

    baseline = result["baseline"]
    spec = [c for c in result["configs"] if c["name"] != baseline]
    s = result["summary"]
    out: dict[str, bytes] = {}
    if not spec:
        return out
    cats = result["workload"]["categories"]
    drawn = {
        "speedup_per_category": _speedup_per_category(plt, s, spec, cats),
        "acceptance_by_position": _acceptance_by_position(plt, s, spec),
        "tau_distribution": _tau_distribution(plt, s, spec),
        "speedup_vs_k": _speedup_vs_k(plt, s, spec),
    }
    out.update((name, png) for name, png in drawn.items() if png is not None)
    return out


def _speedup_per_category(plt: Any, s: dict[str, Any], spec: list[dict[str, Any]], cats: list[str]) -> bytes | None:
    """Bars: each configuration's median speedup per category, p10-p90 whiskers (None: no speedups)."""
    if not any(s[c["name"]]["overall"]["speedup"]["n"] for c in spec):
        return None
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(cats) + 2), 4))
    width = 0.8 / len(spec)
    for j, c in enumerate(spec):
        med, lo, hi = [], [], []
        for cat in cats:
            sp = s[c["name"]]["categories"].get(cat, {}).get("speedup", {})
            m = sp.get("median")
            med.append(m or 0.0)
            lo.append((m - sp["p10"]) if m else 0.0)
            hi.append((sp["p90"] - m) if m else 0.0)
        xs = [i + (j - (len(spec) - 1) / 2) * width for i in range(len(cats))]
        ax.bar(xs, med, width, yerr=[lo, hi], capsize=3, label=c["name"])
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(cats)), cats, rotation=20, ha="right")
    ax.set_ylabel("speedup (x)")
    ax.legend(fontsize=8)
    return _png(fig, PLOT_TITLES["speedup_per_category"])


def _acceptance_by_position(plt: Any, s: dict[str, Any], spec: list[dict[str, Any]]) -> bytes | None:
    """Lines: each configuration's acceptance rate at each draft position (None: nothing drafted)."""
    acc = {c["name"]: s[c["name"]]["overall"]["acceptance_by_position"] for c in spec}
    if not any(acc.values()):
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in acc.items():
        if values:
            ax.plot(range(1, len(values) + 1), values, marker="o", label=name)
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / drafted at that position")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    return _png(fig, PLOT_TITLES["acceptance_by_position"])


def _tau_distribution(plt: Any, s: dict[str, Any], spec: list[dict[str, Any]]) -> bytes | None:
    """Boxes: each configuration's τ per request, every request a dot (None: no τ)."""
    taus = {c["name"]: s[c["name"]]["overall"]["tau_per_request"] for c in spec}
    if not any(taus.values()):
        return None
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(taus) + 2), 4))
    names = [n for n, v in taus.items() if v]
    ax.boxplot([taus[n] for n in names], showmeans=True)
    for i, n in enumerate(names, 1):
        ax.scatter([i] * len(taus[n]), taus[n], s=8, alpha=0.5, color="grey")
    ax.set_xticks(range(1, len(names) + 1), names, rotation=15, ha="right")
    ax.set_ylabel("tau per request")
    return _png(fig, PLOT_TITLES["tau_distribution"])


def _speedup_vs_k(plt: Any, s: dict[str, Any], spec: list[dict[str, Any]]) -> bytes | None:
    """One line per proposer: median speedup against a fixed k, p10-p90 whiskers (None: no fixed k measured)."""
    by_proposer: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for c in spec:
        if isinstance(c.get("k"), int) and s[c["name"]]["overall"]["speedup"]["n"]:  # k = auto has no place on the axis
            by_proposer.setdefault(c.get("draft", c["name"]), []).append((c["k"], s[c["name"]]["overall"]["speedup"]))
    if not by_proposer:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for proposer, points in by_proposer.items():
        points.sort(key=lambda p: p[0])
        ks = [k for k, _ in points]
        med = [sp["median"] for _, sp in points]
        ax.errorbar(
            ks,
            med,
            yerr=[
                [m - sp["p10"] for m, (_, sp) in zip(med, points, strict=True)],
                [sp["p90"] - m for m, (_, sp) in zip(med, points, strict=True)],
            ],
            marker="o",
            capsize=3,
            label=proposer,
        )
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xlabel("k (tokens drafted per step)")
    ax.set_ylabel("speedup (x)")
    ax.legend(fontsize=8)
    return _png(fig, PLOT_TITLES["speedup_vs_k"])


def _png(fig: Any, title: str) -> bytes:
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def write_plots(pngs: dict[str, bytes], folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, data in pngs.items():
        path = folder / f"{name}.png"
        path.write_bytes(data)
        paths[name] = path
    return paths


# -- HTML -----------------------------------------------------------------------------------------


def html_report(result: dict[str, Any], pngs: dict[str, bytes]) -> str:
    """One file, no external resources: tables, plots as data: URIs, the rendered output, the manifest."""
    body = [_md_tables_to_html(markdown(result))]
    for name, data in pngs.items():
        b64 = base64.b64encode(data).decode("ascii")
        body.append(
            f'<figure><img alt="{html.escape(PLOT_TITLES.get(name, name))}" '
            f'src="data:image/png;base64,{b64}">'
            f"<figcaption>{html.escape(PLOT_TITLES.get(name, name))}</figcaption></figure>"
        )
    render = result.get("render")
    if render and render.get("tokens"):
        body.append(render_html(render))
    body.append(requests_html(result))
    errors = [r for r in result["requests"] if r.get("error")]
    if errors:
        body.append(
            "<h3>Failed requests</h3><ul>"
            + "".join(
                f"<li>{html.escape(r['config'])} / {html.escape(r['prompt_id'])}: {html.escape(r['error'])}</li>"
                for r in errors[:50]
            )
            + "</ul>"
        )
    body.append(
        "<details><summary>Manifest (models, packages, machine, configuration, seeds, commit)</summary><pre>"
        + html.escape(json.dumps(result["manifest"], indent=2))
        + "</pre></details>"
    )
    title = f"spekula bench: {html.escape(str(result['target']))}"
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }}
th:first-child, td:first-child {{ text-align: left; }}
figure {{ margin: 1.5em 0; }} img {{ max-width: 100%; }}
.tokens {{ white-space: pre-wrap; font-family: ui-monospace, monospace; line-height: 1.6;
  border: 1px solid #ddd; padding: 1em; }}
.tok {{ border-radius: 2px; }}
{"".join(f".{k} {{ background: {v}; }} " for k, v in KIND_COLOURS.items())}
.legend span {{ padding: 0.1em 0.5em; margin-right: 0.5em; }}
</style></head><body>
{"".join(body)}
</body></html>
"""


def requests_html(result: dict[str, Any]) -> str:
    """Every request, one row each, in the order they ran."""
    head = [
        "#",
        "prompt",
        "category",
        "configuration",
        "tokens",
        "tok/s",
        "speedup",
        "decode speedup",
        "α",
        "τ",
        "TTFT (s)",
        "TPOT (ms)",
        "identical",
        "finish",
    ]
    rows = []
    for r in sorted(result["requests"], key=lambda r: (r["repeat"], r["order"])):
        st = r["stats"]
        ident = "" if r["identical"] is None else ("yes" if r["identical"] else "NO")
        cells = [
            r["order"],
            r["prompt_id"],
            r["category"],
            r["config"],
            st["output_tokens"],
            _f(r["tokens_per_s"]),
            _f(r["speedup"]),
            _f(r["decode_speedup"]),
            _f(st.get("alpha")),
            _f(st.get("tau")),
            _f(r["ttft_s"]),
            _f(_ms(r["tpot_s"])),
            ident,
            r["error"] or st.get("finish_reason") or "",
        ]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return (
        f"<details><summary>Every request ({len(rows)})</summary><table><tr>"
        + "".join(f"<th>{h}</th>" for h in head)
        + "</tr>"
        + "".join(rows)
        + "</table></details>"
    )


def render_html(render: dict[str, Any]) -> str:
    tokens = render["tokens"]
    counts = {k: sum(1 for t in tokens if t["kind"] == k) for k in KIND_COLOURS}
    legend = "".join(
        f'<span class="{k}">{html.escape(KIND_WORDS[k])}: {counts[k]}</span>' for k in KIND_COLOURS if counts[k]
    )
    spans = []
    for t in tokens:
        tip = f"{KIND_WORDS[t['kind']]}; token {t['token']}; p={t['p']:.3f}" + (
            f", q={t['q']:.3f}" if t.get("q") is not None else ""
        )
        spans.append(f'<span class="tok {t["kind"]}" title="{html.escape(tip)}">{html.escape(t["text"])}</span>')
    return (
        f"<h3>One output, token by token: {html.escape(render['config'])} on {html.escape(render['prompt_id'])}</h3>"
        f"<p>{html.escape(render.get('why', ''))}</p>"
        + (
            f'<details><summary>prompt</summary><pre class="tokens">{html.escape(render["prompt"])}</pre></details>'
            if render.get("prompt")
            else ""
        )
        + f'<p class="legend">{legend}</p><div class="tokens">{"".join(spans)}</div>'
    )


def _md_tables_to_html(md: str) -> str:
    """The Markdown summary as HTML (headings, paragraphs and pipe tables are all it uses)."""
    out: list[str] = []
    table: list[list[str]] = []

    def flush() -> None:
        if table:
            head, rows = table[0], table[2:]
            out.append(
                "<table><tr>"
                + "".join(f"<th>{html.escape(c)}</th>" for c in head)
                + "</tr>"
                + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
                + "</table>"
            )
            table.clear()

    for line in md.splitlines():
        if line.startswith("|"):
            table.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        flush()
        if line.startswith("#"):
            depth = len(line) - len(line.lstrip("#"))
            out.append(f"<h{depth}>{html.escape(line[depth:].strip())}</h{depth}>")
        elif line.strip() and not line.startswith("!["):
            out.append(f"<p>{html.escape(line)}</p>")
    flush()
    return "\n".join(out)


def _f(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}"


def _ms(x: float | None) -> float | None:
    return None if x is None else 1000 * x


def _mib(x: int | None) -> str:
    return "n/a" if x is None else f"{x / 2**20:.0f}"


def _speedup(sp: dict[str, Any]) -> str:
    if not sp.get("n"):
        return "n/a"
    return f"{_f(sp['median'])}x [{_f(sp['p10'])}, {_f(sp['p90'])}]"


def _decode(summary: dict[str, Any]) -> str:
    """', decode 1.234x' where the prefill was timed apart (in-process runs), else nothing."""
    sp = summary["decode_speedup"]
    return f", decode {_f(sp['median'])}x" if sp["n"] else ""


def _steps(o: dict[str, Any]) -> str:
    """'0: 115, 1: 13': target passes by the k chosen for them ('n/a' for endpoints, which do not say)."""
    return ", ".join(f"{k}: {n}" for k, n in o["steps_by_k"].items()) or "n/a"


def _wasted(o: dict[str, Any]) -> str:
    if not o["drafted"]:
        return "0"
    return f"{o['wasted_drafted']} ({100 * o['wasted_fraction']:.0f}%)"


def _identical(o: dict[str, Any]) -> str:
    if o["compared_to_plain"] is None:
        return "n/a"
    return f"{o['identical_to_plain']}/{o['compared_to_plain']}"
