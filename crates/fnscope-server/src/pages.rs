//! The HTML pages, from maud templates. Every table reads without JavaScript; the one small
//! script only sorts tables when a column heading is clicked.

use crate::app::{FunctionPage, Hot};
use crate::store::RunRow;
use fnscope_analysis::{format_duration, percent};
use maud::{html, Markup, PreEscaped, DOCTYPE};
use serde_json::Value;

const STYLE: &str = "body{font-family:sans-serif;margin:1.5em;color:#222}\
table{border-collapse:collapse;margin:.5em 0 1.5em}\
th,td{border:1px solid #ccc;padding:.2em .5em;text-align:right}\
th{background:#eee;cursor:pointer}td.l,th.l{text-align:left}\
nav a{margin-right:1em}form{margin:1em 0}input{margin-right:.5em}\
.bar{fill:#c0504d}.lbl{font-size:12px}.note{color:#666}";

/// Sorts a table by the clicked column: numbers numerically, the rest as text.
const SORT_JS: &str = "document.querySelectorAll('th').forEach(function(th){th.onclick=function(){\
var t=th.closest('table'),i=Array.prototype.indexOf.call(th.parentNode.children,th),\
b=t.tBodies[0],r=Array.prototype.slice.call(b.rows),d=th.dataset.d=th.dataset.d==='1'?'0':'1';\
r.sort(function(x,y){var p=x.cells[i].dataset.v||x.cells[i].textContent,q=y.cells[i].dataset.v||y.cells[i].textContent,\
m=parseFloat(p),n=parseFloat(q),c=isNaN(m)||isNaN(n)?p.localeCompare(q):m-n;return d==='1'?-c:c;});\
r.forEach(function(x){b.appendChild(x);});};});";

fn layout(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) " – fnscope" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                nav { a href="/" { "Runs" } a href="/hot" { "Hot functions" } a href="/compare" { "Compare" } a href="/coverage" { "Coverage" } }
                h1 { (title) }
                (body)
                script { (PreEscaped(SORT_JS)) }
            }
        }
    }
}

/// The page of a failed request.
pub fn error(message: &str) -> Markup {
    layout("Error", html! { p { (message) } })
}

fn value<'a>(q: &'a [(String, String)], name: &str) -> &'a str {
    q.iter()
        .find(|(k, _)| k == name)
        .map_or("", |(_, v)| v.as_str())
}

/// The run-selection form, keeping the current values.
fn selection_form(action: &str, q: &[(String, String)], extra: Markup) -> Markup {
    let tags: Vec<&str> = q
        .iter()
        .filter(|(k, _)| k == "tag")
        .map(|(_, v)| v.as_str())
        .collect();
    html! {
        form method="get" action=(action) {
            label { "program " input name="program" size="12" value=(value(q, "program")); }
            label { "build " input name="build" size="14" placeholder="build-id HEX" value=(value(q, "build")); }
            label { "host " input name="host" size="10" value=(value(q, "host")); }
            label { "tag " input name="tag" size="14" placeholder="KEY=VALUE" value=(tags.first().copied().unwrap_or("")); }
            label { "since " input name="since" size="10" placeholder="YYYY-MM-DD" value=(value(q, "since")); }
            label { "until " input name="until" size="10" placeholder="YYYY-MM-DD" value=(value(q, "until")); }
            label { "runs " input name="runs" size="10" placeholder="1,2,3" value=(value(q, "runs")); }
            (extra)
            input type="submit" value="Show";
        }
    }
}

/// A query parameter's value, percent-encoded: tags and build keys may hold spaces, `&`, `#`.
fn url(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A figure per run: whole numbers plainly, fractions with two decimals.
fn per_run(v: &Value) -> String {
    match v.as_f64() {
        Some(x) if x.fract() != 0.0 => format!("{x:.2}"),
        Some(x) => format!("{x:.0}"),
        None => String::new(),
    }
}

fn ns(v: &Value) -> String {
    v.as_u64().map(format_duration).unwrap_or_default()
}

fn time_of(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = fnscope_analysis::civil_from_days(secs.div_euclid(86_400));
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The runs page: every selected upload.
pub fn runs(runs: &[RunRow], q: &[(String, String)]) -> Markup {
    layout(
        "Runs",
        html! {
            (selection_form("/", q, html! {}))
            p { (runs.len()) " uploads, " (runs.iter().map(|r| r.runs).sum::<i64>()) " runs. "
                a href="/hot" { "Hot functions of all runs" } }
            table id="runs" {
                thead { tr {
                    th { "Id" } th class="l" { "Started (UTC)" } th class="l" { "Host" } th class="l" { "User" }
                    th class="l" { "Program" } th class="l" { "Build" } th class="l" { "Command" } th class="l" { "Mode" }
                    th class="l" { "Tags" } th { "Runs" } th { "Calls" } th { "Hooked" } th { "Skipped" } th class="l" { "Token" }
                } }
                tbody {
                    @for r in runs {
                        tr {
                            td { a href={ "/hot?runs=" (r.id) } { (r.id) } }
                            td class="l" { (time_of(r.start_unix_ns)) }
                            td class="l" { (r.host) } td class="l" { (r.user) }
                            td class="l" { a href={ "/hot?program=" (url(&r.program)) } { (r.program) } }
                            td class="l" { a href={ "/hot?build=" (url(&r.build)) } { (r.build) } } td class="l" { code { (r.command) } } td class="l" { (r.mode) }
                            td class="l" { @for (k, v) in &r.tags { a href={ "/hot?tag=" (url(&format!("{k}={v}"))) } { (k) "=" (v) } " " } }
                            td { (r.runs) } td { (r.calls) } td { (r.hooked) } td { (r.skipped) } td class="l" { (r.token) }
                        }
                    }
                }
            }
        },
    )
}

/// Horizontal bars of the first functions' `field`, drawn on the server.
fn bar_chart(functions: &[Value], field: &str, label: &str) -> Markup {
    let shown: Vec<&Value> = functions.iter().take(20).collect();
    let max = shown
        .iter()
        .filter_map(|f| f[field].as_f64())
        .fold(0.0, f64::max);
    let (row, label_w, bar_w) = (18.0, 260.0, 420.0);
    let height = row * shown.len() as f64 + 4.0;
    html! {
        svg width=(label_w + bar_w + 120.0) height=(height) role="img" aria-label={ "bar chart of " (label) } {
            @for (i, f) in shown.iter().enumerate() {
                @let v = f[field].as_f64().unwrap_or(0.0);
                @let y = row * i as f64 + 2.0;
                @let w = if max > 0.0 { bar_w * v / max } else { 0.0 };
                text class="lbl" x=(label_w - 4.0) y=(y + 13.0) text-anchor="end" { (f["name"].as_str().unwrap_or("").chars().take(40).collect::<String>()) }
                rect class="bar" x=(label_w) y=(y) width=(format!("{w:.1}")) height=(row - 4.0) {}
                text class="lbl" x=(label_w + w + 4.0) y=(y + 13.0) { (per_run(&f[field])) }
            }
        }
    }
}

/// The hot-functions page: per module, the top functions with sum, average, fewest and
/// most per run, and a bar chart.
pub fn hot(h: &Hot, q: &[(String, String)]) -> Markup {
    let extra = html! {
        label { "top " input name="top" size="4" value=(value(q, "top")); }
        label { "sort " input name="sort" size="6" placeholder="calls/total/self" value=(value(q, "sort")); }
    };
    let chart_field = match h.key {
        fnscope_analysis::SortKey::Calls => "calls",
        fnscope_analysis::SortKey::Total => "total_ns",
        fnscope_analysis::SortKey::SelfTime => "self_ns",
        fnscope_analysis::SortKey::Avg => "avg_ns",
    };
    layout(
        "Hot functions",
        html! {
            (selection_form("/hot", q, extra))
            p id="summary" { (h.runs.len()) " uploads, " span id="runs" { (h.run_count) } " runs combined: Sum is the calls of all of them, Avg/run, Min/run and Max/run are per run"
                @if h.timed { "; times cover the runs recorded in time mode" } "." }
            @if h.modules.is_empty() { p { "No function was called in the selected runs." } }
            @for m in &h.modules {
                h2 { (m.path.rsplit('/').next().unwrap_or(&m.path)) }
                p class="note" { (m.path) @if let Some(b) = &m.build_id { " · build-id " (b) } }
                (bar_chart(&m.functions, chart_field, chart_field))
                table class="hot" {
                    thead { tr {
                        th { "#" } th class="l" { "Function" } th { "Sum" } th { "Avg/run" } th { "Min/run" } th { "Max/run" }
                        @if h.timed { th { "Total time" } th { "Self time" } th { "Avg" } th { "Min" } th { "Max" } }
                    } }
                    tbody {
                        @for (i, f) in m.functions.iter().enumerate() {
                            tr {
                                td { (i + 1) }
                                td class="l" { a href={ "/functions/" (f["module_id"]) "/" (f["idx"]) } { (f["name"].as_str().unwrap_or("")) } }
                                td class="sum" { (f["calls"]) }
                                td class="avg" data-v=(f["calls_avg"]) { (per_run(&f["calls_avg"])) }
                                td class="min" { (f["calls_min"]) }
                                td class="max" { (f["calls_max"]) }
                                @if h.timed {
                                    td data-v=(f["total_ns"]) { (ns(&f["total_ns"])) } td data-v=(f["self_ns"]) { (ns(&f["self_ns"])) }
                                    td data-v=(f["avg_ns"]) { (ns(&f["avg_ns"])) } td data-v=(f["min_ns"]) { (ns(&f["min_ns"])) }
                                    td data-v=(f["max_ns"]) { (ns(&f["max_ns"])) }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// Points of a line chart of `values` (in upload order), drawn on the server.
fn line_chart(values: &[(String, f64)], what: &str) -> Markup {
    let (w, h, pad) = (640.0, 160.0, 30.0);
    let max = values.iter().map(|v| v.1).fold(0.0, f64::max);
    let n = values.len().max(2) as f64 - 1.0;
    let xy = |i: usize, v: f64| {
        let y = if max > 0.0 {
            h - pad - (h - 2.0 * pad) * v / max
        } else {
            h - pad
        };
        (pad + (w - 2.0 * pad) * i as f64 / n, y)
    };
    let points: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let (x, y) = xy(i, v.1);
            format!("{x:.1},{y:.1}")
        })
        .collect();
    html! {
        svg width=(w) height=(h) role="img" aria-label={ (what) " per run over time" } {
            line x1=(pad) y1=(h - pad) x2=(w - pad) y2=(h - pad) stroke="#999" {}
            polyline points=(points.join(" ")) fill="none" stroke="#c0504d" stroke-width="2" {}
            @for (i, v) in values.iter().enumerate() {
                @let (x, y) = xy(i, v.1);
                circle cx=(format!("{x:.1}")) cy=(format!("{y:.1}")) r="3" fill="#c0504d" { title { (v.0) ": " (v.1) } }
            }
            text class="lbl" x="2" y="12" { "max " (max) " " (what) }
        }
    }
}

/// A function's page: its calls and times per run over time, and its other builds.
pub fn function(p: &FunctionPage) -> Markup {
    let f = &p.function;
    let timed = p.runs.iter().any(|r| r.total_ns > 0);
    let calls: Vec<(String, f64)> = p
        .runs
        .iter()
        .map(|r| {
            (
                time_of(r.start_unix_ns),
                r.calls as f64 / r.runs.max(1) as f64,
            )
        })
        .collect();
    layout(
        &p.name,
        html! {
            p { "Module " code { (f.module_path) } " (" (f.module_key) "), address " (format!("{:#x}", f.address)) ", "
                (f.size) " bytes, " @if f.hooked { "hooked" } @else { "not hooked: " (f.reason) } "." }
            h2 { "Calls per run over time" }
            (line_chart(&calls, "calls"))
            table {
                thead { tr { th { "Upload" } th class="l" { "Started (UTC)" } th class="l" { "Host" } th { "Runs" } th { "Calls" }
                    @if timed { th { "Total time" } th { "Self time" } } } }
                tbody {
                    @for r in &p.runs {
                        tr { td { a href={ "/hot?runs=" (r.upload) } { (r.upload) } } td class="l" { (time_of(r.start_unix_ns)) }
                            td class="l" { (r.host) } td { (r.runs) } td { (r.calls) }
                            @if timed { td data-v=(r.total_ns) { (format_duration(r.total_ns)) } td data-v=(r.self_ns) { (format_duration(r.self_ns)) } } }
                    }
                }
            }
            h2 { "Builds" }
            ul {
                @for b in &p.builds {
                    li { a href={ "/functions/" (b.module) "/" (b.idx) } { (b.module_key) } " at " (format!("{:#x}", b.address)) }
                }
            }
            h2 { "Callers and callees" }
            p class="note" { "Not known: uploads carry per-function totals, not call edges. Use `fnscope callgraph` on a time-mode trace." }
        },
    )
}

/// The compare page: per function, calls and times per run on side A and side B.
pub fn compare(d: Option<&fnscope_analysis::Diff>, q: &[(String, String)]) -> Markup {
    let extra = html! {
        label { "A " input name="a" size="14" placeholder="1,2 or tester=alice" value=(value(q, "a")); }
        label { "B " input name="b" size="14" placeholder="3 or tester=bob" value=(value(q, "b")); }
    };
    let f2 = |v: f64| {
        if v.fract() == 0.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.2}")
        }
    };
    let t = |v: Option<f64>| {
        v.map(|x| format_duration(x.max(0.0) as u64))
            .unwrap_or_default()
    };
    layout(
        "Compare",
        html! {
            (selection_form("/compare", q, extra))
            @if let Some(d) = d {
                p { "A: " (d.runs_a) " runs, B: " (d.runs_b) " runs; figures are per run." }
                table {
                    thead { tr { th class="l" { "Function" } th class="l" { "Module" } th { "Calls A" } th { "Calls B" } th { "Δ calls" }
                        @if d.timed { th { "Total A" } th { "Total B" } th { "Self A" } th { "Self B" } } } }
                    tbody {
                        @for f in &d.functions {
                            tr { td class="l" { (f.name) } td class="l" { (f.module) } td { (f2(f.calls_a)) } td { (f2(f.calls_b)) }
                                td { (f2(f.calls_delta())) }
                                @if d.timed { td { (t(f.total_ns_a)) } td { (t(f.total_ns_b)) } td { (t(f.self_ns_a)) } td { (t(f.self_ns_b)) } } }
                        }
                    }
                }
            } @else {
                p { "Give side A and side B: run ids (3,4) or a tag (tester=alice)." }
            }
        },
    )
}

/// The coverage page: the union of the functions executed by the selected runs, per module
/// and source file.
pub fn coverage(c: &fnscope_analysis::Coverage, q: &[(String, String)]) -> Markup {
    layout(
        "Coverage",
        html! {
            (selection_form("/coverage", q, html! {}))
            p { (c.runs) " runs combined." }
            @for m in &c.modules {
                h2 { (m.module) " " (percent(m.executed, m.hookable)) }
                p class="note" { (m.executed) " of " (m.hookable) " hookable functions ran; " (m.unhookable) " could not be hooked; " (m.sources.describe()) }
                table {
                    thead { tr { th class="l" { "Source file" } th { "Executed" } th { "Hookable" } th { "Coverage" } th { "Unhookable" } } }
                    tbody {
                        @for f in &m.files {
                            tr { td class="l" { (f.file.as_deref().unwrap_or("(unknown)")) } td { (f.executed) } td { (f.hookable) }
                                td { (percent(f.executed, f.hookable)) } td { (f.unhookable) } }
                        }
                    }
                }
            }
        },
    )
}
