//! `rla-pipe report`: one self-contained HTML file (inline SVG charts drawn with plotters) for
//! one or more runs of a store. Every number comes from the SQL files next to this module, run
//! over the committed tables; several runs overlay their curves. Every line of a chart has its
//! own colour (a fixed colour-blind-safe palette) and a dash style by what it measures.
//!
//! Sections: success (train, held-out, OOD), reward-model accuracy (process, outcome),
//! adaptation (accepted / rejected / pending, cumulative accepted with its linear fit), stage
//! wall times, update metrics (loss, KL, clip fraction). Each chart is followed by the table it
//! was drawn from.

use std::fmt::Write as _;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float64Type};
use datafusion::prelude::SessionContext;
use plotters::prelude::*;

use crate::error::{Error, Result};
use crate::stage::sql::{render, str_lit};
use crate::store::Store;

const SUCCESS: &str = include_str!("success.sql");
const RM_ACCURACY: &str = include_str!("rm_accuracy.sql");
const ADAPTATION: &str = include_str!("adaptation.sql");
const GROWTH_FIT: &str = include_str!("growth_fit.sql");
const STAGE_TIMES: &str = include_str!("stage_times.sql");
const UPDATE_METRICS: &str = include_str!("update_metrics.sql");
const UNIT_TESTS: &str = include_str!("unit_tests.sql");

/// A query result with its cells as text or numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Text(String),
    Int(Option<i64>),
    Num(Option<f64>),
}

impl Cell {
    fn text(&self) -> &str {
        match self {
            Cell::Text(s) => s,
            _ => "",
        }
    }
    fn num(&self) -> Option<f64> {
        match self {
            Cell::Int(v) => v.map(|x| x as f64),
            Cell::Num(v) => *v,
            Cell::Text(_) => None,
        }
    }
    /// As printed in the report: floats with 3 decimals, `–` for NULL.
    pub fn display(&self) -> String {
        match self {
            Cell::Text(s) => s.clone(),
            Cell::Int(Some(v)) => v.to_string(),
            Cell::Num(Some(v)) => format!("{v:.3}"),
            Cell::Int(None) | Cell::Num(None) => "–".into(),
        }
    }
}

impl Table {
    fn col(&self, name: &str) -> usize {
        self.columns
            .iter()
            .position(|c| c == name)
            .unwrap_or_else(|| panic!("report query lacks column {name}"))
    }

    /// Points (iter, column) per run: one series per run, in run order.
    fn series(&self, column: &str) -> Vec<(String, Vec<(f64, f64)>)> {
        self.series_where(column, |_| true)
    }

    fn series_where(
        &self,
        column: &str,
        keep: impl Fn(&[Cell]) -> bool,
    ) -> Vec<(String, Vec<(f64, f64)>)> {
        let (run, iter, y) = (self.col("run_id"), self.col("iter"), self.col(column));
        let mut out: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
        for r in self.rows.iter().filter(|r| keep(r)) {
            let (Some(x), Some(v)) = (r[iter].num(), r[y].num()) else {
                continue;
            };
            let name = r[run].text();
            match out.iter_mut().find(|(n, _)| n == name) {
                Some((_, pts)) => pts.push((x, v)),
                None => out.push((name.to_string(), vec![(x, v)])),
            }
        }
        out
    }

    fn html(&self) -> String {
        let mut s = String::from("<table><thead><tr>");
        for c in &self.columns {
            let _ = write!(s, "<th>{}</th>", escape(c));
        }
        s.push_str("</tr></thead><tbody>\n");
        for r in &self.rows {
            s.push_str("<tr>");
            for c in r {
                let _ = write!(s, "<td>{}</td>", escape(&c.display()));
            }
            s.push_str("</tr>\n");
        }
        s.push_str("</tbody></table>\n");
        s
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

async fn table(ctx: &SessionContext, sql: &str) -> Result<Table> {
    let (schema, batches) = crate::sql::query(ctx, sql).await?;
    let columns = schema.fields().iter().map(|f| f.name().clone()).collect();
    let mut rows = Vec::new();
    for b in &batches {
        rows.extend(batch_rows(b)?);
    }
    Ok(Table { columns, rows })
}

fn batch_rows(b: &RecordBatch) -> Result<Vec<Vec<Cell>>> {
    let mut cols: Vec<Vec<Cell>> = Vec::new();
    for c in b.columns() {
        let cells = match c.data_type() {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
                let c = arrow::compute::cast(c, &DataType::Utf8)?;
                let c = c.as_string::<i32>();
                (0..c.len())
                    .map(|i| {
                        Cell::Text(if c.is_null(i) {
                            String::new()
                        } else {
                            c.value(i).into()
                        })
                    })
                    .collect()
            }
            DataType::Float16
            | DataType::Float32
            | DataType::Float64
            | DataType::Decimal128(..) => {
                let c = arrow::compute::cast(c, &DataType::Float64)?;
                let c = c.as_primitive::<Float64Type>();
                (0..c.len())
                    .map(|i| Cell::Num((!c.is_null(i)).then(|| c.value(i))))
                    .collect()
            }
            _ => {
                let c = arrow::compute::cast(c, &DataType::Int64)?;
                let c = c.as_primitive::<arrow::datatypes::Int64Type>();
                (0..c.len())
                    .map(|i| Cell::Int((!c.is_null(i)).then(|| c.value(i))))
                    .collect()
            }
        };
        cols.push(cells);
    }
    Ok((0..b.num_rows())
        .map(|i| cols.iter().map(|c| c[i].clone()).collect())
        .collect())
}

/// One line of a chart.
struct Line {
    label: String,
    /// Index of the run.
    run: usize,
    /// 0 solid, 1 dashed, 2 dotted-ish (short dashes).
    style: usize,
    points: Vec<(f64, f64)>,
}

/// Line colours, the `i`-th line of a chart taking the `i`-th: Okabe and Ito's palette, told
/// apart with every common colour-vision deficiency (its yellow, the hardest to see on white,
/// last).
fn colour(i: usize) -> RGBColor {
    const OKABE_ITO: [(u8, u8, u8); 8] = [
        (0x00, 0x72, 0xB2), // blue
        (0xD5, 0x5E, 0x00), // vermillion
        (0x00, 0x9E, 0x73), // bluish green
        (0xCC, 0x79, 0xA7), // reddish purple
        (0xE6, 0x9F, 0x00), // orange
        (0x56, 0xB4, 0xE9), // sky blue
        (0x00, 0x00, 0x00), // black
        (0xF0, 0xE4, 0x42), // yellow
    ];
    let (r, g, b) = OKABE_ITO[i % OKABE_ITO.len()];
    RGBColor(r, g, b)
}

/// The font size to ask plotters for text `px` pixels high: its SVG backend takes whole sizes and
/// writes `font-size` as the size / 1.24 (13 → 16 → 12.9 px, 14 → 17 → 13.7, 18 → 22 → 17.7).
fn font_px(px: f64) -> f64 {
    (px * 1.24).round()
}

/// A chart: title, y axis label and lines, rendered as an SVG string.
fn chart(
    title: &str,
    y_label: &str,
    lines: &[Line],
    y_range: Option<(f64, f64)>,
) -> Result<String> {
    let draw_err =
        |e: String| Error::Data(format!("report: drawing the chart {title:?} failed: {e}"));
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (760, 360)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(e.to_string()))?;
        let xs = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
        let ys = lines.iter().flat_map(|l| l.points.iter().map(|p| p.1));
        let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
        let (mut y0, mut y1) = ys.fold((f64::MAX, f64::MIN), |(a, b), y| (a.min(y), b.max(y)));
        if let Some((a, b)) = y_range {
            (y0, y1) = (a.min(y0), b.max(y1));
        }
        let (x0, x1) = if x0 > x1 {
            (0.0, 1.0)
        } else {
            (x0, x1.max(x0 + 1.0))
        };
        let (y0, y1) = if y0 > y1 {
            (0.0, 1.0)
        } else if y1 - y0 < 1e-9 {
            (y0 - 0.5, y1 + 0.5)
        } else {
            (y0, y1 + (y1 - y0) * 0.05)
        };
        let mut c = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", font_px(18.0)))
            .margin(12)
            .x_label_area_size(46)
            .y_label_area_size(66)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(|e| draw_err(e.to_string()))?;
        // Counts (every value of the solid lines whole, a range of a few units) get whole-number
        // labels.
        let integral = y1 - y0 >= 3.0
            && lines
                .iter()
                .filter(|l| l.style == 0)
                .all(|l| l.points.iter().all(|p| p.1.fract() == 0.0));
        let whole = |y: &f64| format!("{y:.0}");
        let mut mesh = c.configure_mesh();
        mesh.x_desc("iteration")
            .y_desc(y_label)
            .label_style(("sans-serif", font_px(13.0)))
            .axis_desc_style(("sans-serif", font_px(14.0)))
            .x_labels(((x1 - x0) as usize + 1).min(12))
            .x_label_formatter(&whole)
            .light_line_style(WHITE.mix(0.0));
        if integral {
            mesh.y_label_formatter(&whole);
        }
        mesh.draw().map_err(|e| draw_err(e.to_string()))?;
        for (i, l) in lines.iter().enumerate() {
            let color = colour(i).to_rgba();
            let style = ShapeStyle {
                color,
                filled: true,
                stroke_width: 2,
            };
            // The legend swatch repeats the line's dash pattern.
            let (dash, gap) = match l.style {
                0 => (0, 0),
                1 => (8, 5),
                _ => (2, 4),
            };
            if dash == 0 {
                c.draw_series(LineSeries::new(l.points.clone(), style))
                    .map_err(|e| draw_err(e.to_string()))?
                    .label(l.label.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
            } else {
                c.draw_series(DashedLineSeries::new(l.points.clone(), dash, gap, style))
                    .map_err(|e| draw_err(e.to_string()))?
                    .label(l.label.clone())
                    .legend(move |(x, y)| {
                        plotters::element::DashedPathElement::new(
                            vec![(x, y), (x + 18, y)],
                            dash,
                            gap,
                            style,
                        )
                    });
            }
            c.draw_series(l.points.iter().map(|p| Circle::new(*p, 3, style.filled())))
                .map_err(|e| draw_err(e.to_string()))?;
        }
        if !lines.is_empty() {
            c.configure_series_labels()
                .label_font(("sans-serif", font_px(14.0)))
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.3))
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(|e| draw_err(e.to_string()))?;
        }
        root.present().map_err(|e| draw_err(e.to_string()))?;
    }
    Ok(svg)
}

/// The report of some runs: the HTML page and each chart as a standalone SVG (name, svg).
pub struct Report {
    pub html: String,
    pub charts: Vec<(String, String)>,
}

/// Lines of `columns` per run of a table (a dash style per column).
fn lines_of(t: &Table, runs: &[String], columns: &[(&str, &str)]) -> Vec<Line> {
    let mut out = Vec::new();
    for (k, (col, label)) in columns.iter().enumerate() {
        for (name, points) in t.series(col) {
            let run = runs.iter().position(|r| *r == name).unwrap_or(0);
            out.push(Line {
                label: if columns.len() > 1 {
                    format!("{name} · {label}")
                } else {
                    name.clone()
                },
                run,
                style: k,
                points,
            });
        }
    }
    out
}

/// Build the report of `runs` (each must exist in the store).
pub async fn build(store: &Store, runs: &[String]) -> Result<Report> {
    if runs.is_empty() {
        return Err(Error::config("report: name at least one run"));
    }
    let ctx = crate::sql::session_of_runs(store, runs).await?;
    let list = runs
        .iter()
        .map(|r| str_lit(r))
        .collect::<Vec<_>>()
        .join(", ");
    let q = |sql: &str| render(sql, &[("runs", list.clone())]);

    let success = table(&ctx, &q(SUCCESS)?).await?;
    let rm = table(&ctx, &q(RM_ACCURACY)?).await?;
    let adapt_sql = q(ADAPTATION)?;
    let adaptation = table(&ctx, &adapt_sql).await?;
    let fit_sql = render(GROWTH_FIT, &[("adaptation", adapt_sql.clone())])?;
    let fit = table(&ctx, &fit_sql).await?;
    let times = table(&ctx, &q(STAGE_TIMES)?).await?;
    let update = table(&ctx, &q(UPDATE_METRICS)?).await?;
    let unit_tests = table(&ctx, &q(UNIT_TESTS)?).await?;

    let mut charts = Vec::new();
    charts.push((
        "success".to_string(),
        chart(
            "Success per iteration",
            "success rate",
            &lines_of(
                &success,
                runs,
                &[("train", "train"), ("held_out", "held-out"), ("ood", "OOD")],
            ),
            Some((0.0, 1.0)),
        )?,
    ));
    charts.push((
        "rm_accuracy".to_string(),
        chart(
            "Reward model agreement with the environment",
            "accuracy",
            &lines_of(
                &rm,
                runs,
                &[
                    ("process", "process"),
                    ("outcome", "outcome"),
                    ("balanced_outcome", "balanced outcome"),
                ],
            ),
            Some((0.0, 1.0)),
        )?,
    ));
    charts.push((
        "adaptation".to_string(),
        chart(
            "Adaptation decisions per iteration",
            "candidates",
            &lines_of(
                &adaptation,
                runs,
                &[
                    ("accepted", "accepted"),
                    ("rejected", "rejected"),
                    ("pending", "written"),
                ],
            ),
            Some((0.0, 1.0)),
        )?,
    ));
    // The cumulative curve with its fitted line (from growth_fit.sql) per run.
    let mut growth = lines_of(&adaptation, runs, &[("cumulative", "cumulative")]);
    for row in &fit.rows {
        let name = row[fit.col("run_id")].text().to_string();
        let (Some(slope), Some(icpt)) =
            (row[fit.col("slope")].num(), row[fit.col("intercept")].num())
        else {
            continue;
        };
        let run = runs.iter().position(|r| *r == name).unwrap_or(0);
        let xs: Vec<f64> = growth
            .iter()
            .filter(|l| l.run == run)
            .flat_map(|l| l.points.iter().map(|p| p.0))
            .collect();
        let (a, b) = xs
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
        if a <= b {
            growth.push(Line {
                label: format!("{name} · fit (slope {slope:.2}/iter)"),
                run,
                style: 1,
                points: vec![(a, icpt + slope * a), (b, icpt + slope * b)],
            });
        }
    }
    charts.push((
        "accepted_growth".to_string(),
        chart(
            "Cumulative accepted tasks",
            "accepted tasks",
            &growth,
            Some((0.0, 1.0)),
        )?,
    ));
    // Stage times: the iteration total (solid) and the (at most 4) stages that take ≥ 5% of the
    // time (dashed; for several runs, dashes alternating by stage).
    let mut totals: std::collections::BTreeMap<String, f64> = Default::default();
    let mut per_iter: std::collections::BTreeMap<(String, i64), f64> = Default::default();
    for r in &times.rows {
        let secs = r[times.col("seconds")].num().unwrap_or(0.0);
        *totals
            .entry(r[times.col("stage")].text().to_string())
            .or_default() += secs;
        let key = (
            r[times.col("run_id")].text().to_string(),
            r[times.col("iter")].num().unwrap_or(0.0) as i64,
        );
        *per_iter.entry(key).or_default() += secs;
    }
    let all: f64 = totals.values().sum();
    let mut big: Vec<(String, f64)> = totals
        .into_iter()
        .filter(|(_, t)| *t >= 0.05 * all)
        .collect();
    big.sort_by(|a, b| b.1.total_cmp(&a.1));
    big.truncate(4);
    let mut time_lines = Vec::new();
    for (k, run) in runs.iter().enumerate() {
        let points: Vec<(f64, f64)> = per_iter
            .iter()
            .filter(|((r, _), _)| r == run)
            .map(|((_, i), s)| (*i as f64, *s))
            .collect();
        time_lines.push(Line {
            label: format!("{run} · iteration"),
            run: k,
            style: 0,
            points,
        });
    }
    for (k, (stage, _)) in big.iter().enumerate() {
        for (name, points) in times.series_where("seconds", |r| r[2].text() == stage) {
            let run = runs.iter().position(|r| *r == name).unwrap_or(0);
            time_lines.push(Line {
                label: format!("{name} · {stage}"),
                run,
                style: if runs.len() > 1 { 1 + k % 2 } else { 1 },
                points,
            });
        }
    }
    charts.push((
        "stage_times".to_string(),
        chart(
            "Stage wall time per iteration",
            "seconds",
            &time_lines,
            None,
        )?,
    ));
    for (metric, label) in [
        ("loss", "loss"),
        ("kl", "KL (k3)"),
        ("clip_frac", "clip fraction"),
    ] {
        let mut lines = Vec::new();
        for (k, model) in ["policy", "rm"].iter().enumerate() {
            for (name, points) in update.series_where(metric, |r| r[2].text() == *model) {
                let run = runs.iter().position(|r| *r == name).unwrap_or(0);
                lines.push(Line {
                    label: format!("{name} · {model}"),
                    run,
                    style: k,
                    points,
                });
            }
        }
        charts.push((
            format!("update_{metric}"),
            chart(
                &format!("Update: {label} per iteration"),
                label,
                &lines,
                None,
            )?,
        ));
    }

    let chart_of = |name: &str| -> &str {
        charts
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s.as_str())
            .unwrap_or("")
    };
    let mut html = String::new();
    let title = format!("rla-pipe report: {}", runs.join(", "));
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\n<style>{}</style></head><body>\n<h1>{}</h1>\n<p>Store <code>{}</code> · generated by rla-pipe {} · every number below comes from the SQL files in <code>src/report/</code> over the committed tables.</p>\n",
        escape(&title),
        CSS,
        escape(&title),
        escape(store.url()),
        env!("CARGO_PKG_VERSION"),
    );
    let mut section = |id: &str, heading: &str, body: String| {
        let _ = write!(
            html,
            "<section id=\"{id}\"><h2>{}</h2>\n{body}</section>\n",
            escape(heading)
        );
    };
    section(
        "success",
        "Success",
        format!(
            "<p>Train: mean accuracy of the active tasks' sampled rollouts (solid). Held-out: success of the evaluation rollouts (eval.rollouts sampled at eval.temperature; one greedy rollout with eval.mode = \"greedy\") on tasks of the training distribution never trained on (dashed). OOD: the same on tasks one difficulty level harder (dotted).</p>\n<figure>{}</figure>\n{}",
            chart_of("success"),
            success.html()
        ),
    );
    section(
        "rm-accuracy",
        "Reward model accuracy",
        format!(
            "<p>Process: the majority verdict of a step against the environment's step oracle. Outcome: the sign of a trajectory's summed verdicts against its outcome. Outcome accuracy moves with the success rate when the RM leans to one verdict (an RM that always says bad scores the failure share, column always_bad_outcome); balanced outcome is the mean of its hit rates on successes and on failures, 0.5 at chance whatever the success rate.</p>\n<figure>{}</figure>\n{}",
            chart_of("rm_accuracy"),
            rm.html()
        ),
    );
    if !unit_tests.rows.is_empty() {
        section(
            "unit-tests",
            "Reward model's unit tests (coding)",
            format!(
                "<p>readable: written tests a test could be read from. syn_ut_acc: tests that every program passing the ground truth also passes (tasks with such a program). perfect_ut_rate: tests that those programs pass and every other program fails (tasks with both kinds).</p>\n{}",
                unit_tests.html()
            ),
        );
    }
    section(
        "adaptation",
        "Environment adaptation",
        format!(
            "<p>Candidates accepted and rejected (judged this iteration) and written (pending, judged next iteration).</p>\n<figure>{}</figure>\n{}<h3>Cumulative accepted tasks and linear fit</h3>\n<figure>{}</figure>\n{}",
            chart_of("adaptation"),
            adaptation.html(),
            chart_of("accepted_growth"),
            fit.html()
        ),
    );
    section(
        "stage-times",
        "Stage wall times",
        format!(
            "<p>Each iteration's total (solid) and the stages that take at least 5% of the time; every stage in the table.</p>\n<figure>{}</figure>\n{}",
            chart_of("stage_times"),
            times.html()
        ),
    );
    section(
        "update-metrics",
        "Update metrics",
        format!(
            "<p>Means over each iteration's optimizer steps; policy solid, reward model dashed.</p>\n<figure>{}</figure>\n<figure>{}</figure>\n<figure>{}</figure>\n{}",
            chart_of("update_loss"),
            chart_of("update_kl"),
            chart_of("update_clip_frac"),
            update.html()
        ),
    );
    html.push_str("</body></html>\n");
    Ok(Report { html, charts })
}

const CSS: &str = "body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;color:#222}\
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}\
figure{margin:1em 0}table{border-collapse:collapse;font-size:.85em;margin:.5em 0 1.5em}\
td,th{border:1px solid #ddd;padding:2px 8px;text-align:right}th{background:#f4f4f4}\
code{background:#f4f4f4;padding:0 3px}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_display_and_charts_render() {
        assert_eq!(Cell::Num(Some(0.15625)).display(), "0.156");
        assert_eq!(Cell::Num(None).display(), "–");
        assert_eq!(Cell::Int(Some(3)).display(), "3");
        let svg = chart(
            "t <x>",
            "y",
            &[Line {
                label: "run".into(),
                run: 0,
                style: 1,
                points: vec![(0.0, 0.1), (1.0, 0.4)],
            }],
            Some((0.0, 1.0)),
        )
        .unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("</svg>"), "{svg}");
        assert!(svg.contains("iteration") && svg.contains("run"));
        // No data at all still renders an (empty) chart.
        assert!(chart("empty", "y", &[], None).unwrap().contains("</svg>"));
    }

    #[test]
    fn every_line_has_its_own_colour_and_text_is_legible() {
        let line = |label: &str, style: usize, y: f64| Line {
            label: label.into(),
            run: 0,
            style,
            points: vec![(0.0, y), (1.0, y + 0.2), (2.0, y + 0.3)],
        };
        let lines = [
            line("train", 0, 0.1),
            line("held-out", 1, 0.2),
            line("OOD", 2, 0.3),
        ];
        let svg = chart(
            "Success per iteration",
            "success rate",
            &lines,
            Some((0.0, 1.0)),
        )
        .unwrap();
        // One run, three series: three Okabe–Ito colours (line, markers and legend swatch each),
        // the dash styles kept beside them.
        for c in ["#0072B2", "#D55E00", "#009E73"] {
            assert!(svg.contains(&format!("stroke=\"{c}\"")), "{c} missing");
        }
        assert!(!svg.contains("#CC79A7"), "a fourth colour for three lines");
        // Tick labels 12.9 px, axis descriptions and the legend 13.7 px, the title 17.7 px.
        let size = |px: &str| svg.matches(&format!("font-size=\"{px}")).count();
        assert!(size("12.9") >= 3, "tick labels");
        assert_eq!(size("13.7"), 5, "axis descriptions (2) and legend (3)");
        assert_eq!(size("17.7"), 1, "title");
        assert!(
            !svg.contains("font-size=\"9."),
            "text at plotters' small default"
        );
        // Same input, same bytes.
        let again = chart(
            "Success per iteration",
            "success rate",
            &lines,
            Some((0.0, 1.0)),
        );
        assert_eq!(svg, again.unwrap());
    }
}
