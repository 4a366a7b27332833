"""The report as one HTML page (tables, verdicts, plots inlined) beside its ``report.json``."""

from __future__ import annotations

import base64
import html
import json
import time
from pathlib import Path
from typing import Any

from dlas_predict.analysis import frames as A
from dlas_predict.analysis.report import Report, build_report, median


# ---- HTML -----------------------------------------------------------------------------------
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1200px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em}h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;margin:1em 0;font-size:.85em}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f3f3f3}.holds{color:#116611;font-weight:bold}
.does-not-hold{color:#aa1111;font-weight:bold}.no-data{color:#777;font-weight:bold}
figure{margin:1.5em 0}figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:.9em;color:#555}.note{font-size:.9em;color:#555}
.warn{color:#8a4b00;font-weight:bold}
.scroll{overflow-x:auto}td:first-child{white-space:nowrap}
"""


def _table(rows: list[dict[str, Any]], table_id: str) -> str:
    if not rows:
        return '<p class="note">No data in this corpus.</p>'
    cols: list[str] = []
    for r in rows:
        cols.extend(c for c in r if c not in cols)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c, '')))}</td>"
                                    for c in cols) + "</tr>" for r in rows)
    return (f'<div class="scroll"><table id="{table_id}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "" if v != v else f"{v:.3g}"
    return str(v)


def render_html(report: Report) -> str:
    dev = report.device
    peaks = ", ".join(f"{k} {v:g}" for k, v in dev.peak_gflops.items()) or "unknown"
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
             f"<title>DLAS report: {html.escape(dev.name)}</title><style>{_CSS}</style>"
             "</head><body>",
             f"<h1>DLAS report: {html.escape(dev.name)}"
             + (" (measured on another machine)" if report.this_machine is False else "")
             + "</h1>",
             f"<p id='whose' class='{'warn' if report.this_machine is False else 'note'}'>"
             f"{html.escape(report.whose)}.</p>",
             f"<p>{html.escape(dev.description)}. Roofs ({html.escape(dev.source)}): peak "
             f"GFLOP/s {html.escape(peaks)}; bandwidth {dev.mem_bandwidth_gbs or 'unknown'} "
             f"GB/s. Corpus: <code>{html.escape(str(report.store))}</code>; "
             f"{report.counts['kernel_measurements']} kernel measurements "
             f"({html.escape(json.dumps(report.counts['sources']))}), "
             f"{report.counts['network_configurations']} network configurations of "
             f"{report.counts['networks']} networks, "
             f"{report.counts['whole_network_latencies']} of them timed as whole networks. "
             f"Generated {when} by <code>dlas-predict report</code>.</p>",
             "<p class='note'>Latencies are medians of measured runs. In the tables a value "
             "marked † is the sum of the network's measured conv kernels (no whole-network "
             "build was timed for it); unmarked values are whole networks built and timed "
             "end to end. Cells read <i>algorithm latency-ms</i>.</p>"]
    parts += ["<h2 id='observations'>The study's 13 observations on this corpus</h2>",
              "<p class='note'>Each observation is stated as a claim that this corpus can "
              "test, with the rule that decides the verdict. The wording is ours; the "
              "numbering follows the study where this project's notes cite it (V, XI).</p>",
              "<table id='observations-table'><thead><tr><th>#</th><th>observation</th>"
              "<th>verdict</th><th>numbers behind it</th><th>rule</th></tr></thead><tbody>"]
    for o in report.observations:
        cls = o.verdict.replace(" ", "-")
        parts.append(f"<tr id='obs-{o.number}'><td>{o.number})</td><td>{html.escape(o.claim)}"
                     f"</td><td class='{cls}'>{o.verdict}</td><td>{html.escape(o.evidence)}"
                     f"</td><td class='note'>{html.escape(o.rule)}</td></tr>")
    parts.append("</tbody></table>")
    if report.families:
        parts += ["<h2 id='families'>The observations family by family</h2>",
                  "<p class='note'>Those of the observations that a family's own networks "
                  "can test (their whole networks and their layers' kernels), each decided "
                  "by the same rule on that family alone: "
                  + html.escape(", ".join(
                      f"{f} ({report.counts.get('networks_by_family', {}).get(f, '?')} "
                      "networks)" for f in report.families))
                  + ".</p>",
                  "<table id='families-table'><thead><tr><th>#</th><th>family</th>"
                  "<th>verdict</th><th>numbers behind it</th></tr></thead><tbody>"]
        for number in [o.number for o in next(iter(report.families.values()))]:
            for family, obs in report.families.items():
                o = next(x for x in obs if x.number == number)
                cls = o.verdict.replace(" ", "-")
                parts.append(f"<tr><td>{o.number})</td><td>{html.escape(family)}</td>"
                             f"<td class='{cls}'>{o.verdict}</td>"
                             f"<td>{html.escape(o.evidence)}</td></tr>")
        parts.append("</tbody></table>")
    parts += ["<h2 id='table3'>Table 3: fastest algorithm per compression</h2>",
              "<p class='note'>Per network and tuning; each cell is the fastest algorithm "
              "for that configuration and its latency (ms).</p>",
              _table(report.table3, "table3-data"),
              "<h2 id='table4'>Table 4: fastest compression per algorithm</h2>",
              _table(report.table4, "table4-data"),
              "<h2 id='table6'>Table 6: fastest configuration overall</h2>",
              "<p class='note'>Including the per-layer plan (each layer on its own fastest "
              "kernel) where one was measured; speedup over the fastest dense "
              "configuration.</p>",
              _table(report.table6, "table6-data"),
              "<h2 id='ideal'>Share of the ideal speedup</h2>",
              "<p class='note'>Ideal speedup: the network's dense conv MACs over the MACs its "
              "pruned layers keep. Achieved: the fastest dense latency over the fastest "
              "pruned latency. Share = achieved / ideal.</p>",
              _table(_ideal_rows(report.ideal), "ideal-data")]
    parts += ["<h2 id='backends'>Fastest backend per network and compression</h2>",
              "<p class='note'>Our fastest whole-network build (any algorithm or the per-layer "
              "plan, untuned) against onnxruntime's CPU provider running the same compressed "
              "model (a channel-pruned one with its zeroed filters removed; float16 converted; "
              "int8 as static QDQ), median latencies (ms) measured on this device.</p>",
              _table(report.backends, "backends-data") if report.backends else
              "<p class='note'>This corpus holds no onnxruntime run of its networks "
              "(<code>dlas-predict collect --whole-network --backends onnxruntime</code> "
              "times them).</p>"]
    parts.append("<h2 id='plots'>Plots</h2>")
    for title, caption, path in report.plots:
        data = base64.b64encode(Path(path).read_bytes()).decode()
        parts.append(f"<figure><img alt='{html.escape(title)}' src='data:image/png;base64,"
                     f"{data}'><figcaption><b>{html.escape(title)}.</b> "
                     f"{html.escape(caption)} (also <code>{html.escape(Path(path).name)}"
                     "</code>)</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _ideal_rows(ideal: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for r in ideal:
        rows.append({"network": A.short_name(r["network"]), "tuning": r["tuning"],
                     "config": r["config"],
                     "fastest algorithm": r["algorithm"],
                     "achieved": f"{r['achieved']:.2f}x", "ideal": f"{r['ideal']:.2f}x",
                     "share": f"{r['share']:.1%}",
                     "latency": "whole network" if r["source"] == "whole network"
                     else "conv kernel sum †"})
    by_comp: dict[str, list[float]] = {}
    for r in ideal:
        by_comp.setdefault(r["compression"], []).append(r["share"])
    for comp, shares in sorted(by_comp.items()):
        rows.append({"network": "median", "config": comp,
                     "share": f"{median(shares):.1%}"})
    return rows


def write_report(device: str, store: Path | None, out_dir: Path) -> tuple[Report, Path]:
    out_dir = Path(out_dir)
    report = build_report(device, store, out_dir)
    page = out_dir / "index.html"
    page.write_text(render_html(report))
    (out_dir / "report.json").write_text(json.dumps(report.to_dict(), indent=1, default=str))
    return report, page
