//! `rla-pipe report`: one self-contained HTML file (inline SVG charts drawn with plotters) for
//! one or more runs of a store. Every number comes from the SQL files next to this module, run
//! over the committed tables; several runs overlay their curves. A run keeps one colour in
//! every chart (a fixed colour-blind-safe palette), a metric its dash style; legends sit below
//! the plot, and every point carries its exact value as a tooltip (SVG `<title>`: no script).
//! A branch whose parent is in the report is drawn from its branch point on (the shared
//! iterations once, as the parent's), and its shared stages are not counted as its time.
//!
//! Sections: the runs (config digest, commit, start, parent, branch point and overrides, the
//! settings that differ) and a summary per run, success (train, held-out, OOD), reward-model
//! accuracy, the training signal (mean reward, advantage spread, episode length), adaptation
//! (accepted / rejected / pending, cumulative accepted with its linear fit), stage wall times,
//! update metrics (loss, KL, clip fraction, gradient norm). Each chart is followed by the table
//! it was drawn from.

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
const TRAINING: &str = include_str!("training.sql");
/// Who sets the policy's signs (`pipelines/sql/policy_signal.sql`), bound into [`TRAINING`].
const POLICY_SIGNAL: &str = include_str!("../../pipelines/sql/policy_signal.sql");
/// Training games against held-out games (`pipelines/sql/generalisation.sql`), filtered to the
/// report's runs.
const GENERALISATION: &str = include_str!("../../pipelines/sql/generalisation.sql");
const STAGE_TOTALS: &str = include_str!("stage_totals.sql");
const SUMMARY: &str = include_str!("summary.sql");

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
            // Rounded half away from zero, as SQL's round(x, 3); never "-0.000".
            Cell::Num(Some(v)) => {
                let r = (v * 1000.0).round() / 1000.0;
                format!("{:.3}", if r == 0.0 { 0.0 } else { r })
            }
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

    /// Drop the rows `skip(run, iter)` names (the shared iterations a branch's parent draws).
    fn without(mut self, skip: &impl Fn(&str, i64) -> bool) -> Table {
        let (run, iter) = (self.col("run_id"), self.col("iter"));
        self.rows.retain(|r| {
            let i = r[iter].num().map_or(i64::MIN, |x| x as i64);
            !skip(r[run].text(), i)
        });
        self
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
    /// Index of the run: its colour.
    run: usize,
    /// The metric: 0 solid, 1 dashed, 2 dotted, 3 dash-dot-like (long dashes).
    style: usize,
    points: Vec<(f64, f64)>,
}

/// The colour of the `i`-th run of a report: Okabe and Ito's palette, told apart with every
/// common colour-vision deficiency (its yellow, the hardest to see on white, last).
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

/// A metric's dash pattern (dash, gap) in pixels; (0, 0) is solid.
fn dashes(style: usize) -> (u32, u32) {
    match style {
        0 => (0, 0),
        1 => (8, 5),
        2 => (2, 4),
        _ => (14, 4),
    }
}

/// The font size to ask plotters for text `px` pixels high: its SVG backend takes whole sizes and
/// writes `font-size` as the size / 1.24 (13 → 16 → 12.9 px, 14 → 17 → 13.7, 18 → 22 → 17.7).
fn font_px(px: f64) -> f64 {
    (px * 1.24).round()
}

/// Chart size: the plot (its SVG scales to the page's width), then the legend below it.
const WIDTH: u32 = 760;
const PLOT_HEIGHT: u32 = 340;
const LEGEND_COLUMNS: usize = 2;
const LEGEND_ROW: u32 = 22;

/// How a chart's y axis starts.
#[derive(Clone, Copy)]
enum Axis {
    /// At 0 (rates, counts, times), at least up to `top`.
    Zero { top: f64 },
    /// Where the data starts (quantities that may be negative: loss, reward).
    Data,
}

/// A chart: title, y axis label and lines, rendered as an SVG string whose points carry their
/// values as tooltips.
fn chart(title: &str, y_label: &str, lines: &[Line], axis: Axis) -> Result<String> {
    let draw_err =
        |e: String| Error::Data(format!("report: drawing the chart {title:?} failed: {e}"));
    let legend_rows = lines.len().div_ceil(LEGEND_COLUMNS) as u32;
    let height = PLOT_HEIGHT + legend_rows * LEGEND_ROW + if lines.is_empty() { 0 } else { 10 };
    let mut svg = String::new();
    let mut tips = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(e.to_string()))?;
        let (plot, legend) = root.split_vertically(PLOT_HEIGHT);
        let xs = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
        let ys = lines.iter().flat_map(|l| l.points.iter().map(|p| p.1));
        let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
        let (mut y0, mut y1) = ys.fold((f64::MAX, f64::MIN), |(a, b), y| (a.min(y), b.max(y)));
        if let Axis::Zero { top } = axis {
            (y0, y1) = (y0.min(0.0), y1.max(top));
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
        let mut c = ChartBuilder::on(&plot)
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
        for l in lines {
            let style = ShapeStyle {
                color: colour(l.run).to_rgba(),
                filled: true,
                stroke_width: 2,
            };
            match dashes(l.style) {
                (0, _) => {
                    c.draw_series(LineSeries::new(l.points.clone(), style))
                        .map_err(|e| draw_err(e.to_string()))?;
                }
                (dash, gap) => {
                    c.draw_series(DashedLineSeries::new(l.points.clone(), dash, gap, style))
                        .map_err(|e| draw_err(e.to_string()))?;
                }
            }
            c.draw_series(l.points.iter().map(|p| Circle::new(*p, 3, style.filled())))
                .map_err(|e| draw_err(e.to_string()))?;
            // The exact value under the pointer: an invisible disc over each point, titled.
            for p in &l.points {
                let (px, py) = c.backend_coord(p);
                let _ = write!(
                    tips,
                    "<circle class=\"tip\" cx=\"{px}\" cy=\"{py}\" r=\"7\" fill=\"#000\" fill-opacity=\"0\"><title>{}: iteration {}: {}</title></circle>\n",
                    escape(&l.label),
                    p.0,
                    Cell::Num(Some(p.1)).display()
                );
            }
        }
        // The legend, below the plot: a swatch in the run's colour and the metric's dashes.
        let col_width = (WIDTH as i32 - 80) / LEGEND_COLUMNS as i32;
        for (k, l) in lines.iter().enumerate() {
            let x = 70 + (k % LEGEND_COLUMNS) as i32 * col_width;
            let y = 6 + (k / LEGEND_COLUMNS) as i32 * LEGEND_ROW as i32;
            let style = ShapeStyle {
                color: colour(l.run).to_rgba(),
                filled: true,
                stroke_width: 2,
            };
            let swatch = vec![(x, y + 8), (x + 28, y + 8)];
            match dashes(l.style) {
                (0, _) => legend.draw(&PathElement::new(swatch, style)),
                (dash, gap) => legend.draw(&plotters::element::DashedPathElement::new(
                    swatch, dash, gap, style,
                )),
            }
            .map_err(|e| draw_err(e.to_string()))?;
            legend
                .draw(&Text::new(
                    l.label.clone(),
                    (x + 36, y),
                    ("sans-serif", font_px(14.0)).into_font().color(&BLACK),
                ))
                .map_err(|e| draw_err(e.to_string()))?;
        }
        root.present().map_err(|e| draw_err(e.to_string()))?;
    }
    // The tooltips above everything else, so the pointer finds them.
    if let Some(end) = svg.rfind("</svg>") {
        svg.insert_str(end, &tips);
    }
    Ok(svg)
}

/// The report of some runs: the HTML page and each chart as a standalone SVG (name, svg).
pub struct Report {
    pub html: String,
    pub charts: Vec<(String, String)>,
}

/// Lines of `columns` per run of a table (a dash style per column, the run's colour).
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
    // Legend and drawing order: by run, then metric.
    out.sort_by_key(|l| (l.run, l.style));
    out
}

/// The runs section: one row per run (start, code version, config digest, branch) and the
/// settings whose values differ between the runs shown.
fn runs_section(states: &[crate::store::catalog::RunState]) -> String {
    let mut s = String::from(
        "<table class=\"runs\"><thead><tr><th>run</th><th>started</th><th>rla-pipe</th><th>config</th><th>iterations</th><th>branch</th></tr></thead><tbody>\n",
    );
    for (k, st) in states.iter().enumerate() {
        let r = &st.run;
        let branch = match &r.branch {
            Some(b) => format!(
                "of <b>{}</b> from iteration {}{}",
                escape(&b.parent),
                b.from_iter,
                if b.overrides.is_empty() {
                    String::new()
                } else {
                    format!(
                        ", <code>--set {}</code>",
                        escape(&b.overrides.join(" --set "))
                    )
                }
            ),
            None => "–".into(),
        };
        let c = colour(k);
        let _ = write!(
            s,
            "<tr><td class=\"run\"><span class=\"swatch\" style=\"background:#{:02X}{:02X}{:02X}\"></span>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>\n",
            c.0,
            c.1,
            c.2,
            escape(&r.run_id),
            escape(&r.created_at),
            escape(&r.code_version),
            escape(&r.config_hash.chars().take(12).collect::<String>()),
            st.iters.values().filter(|i| i.complete.is_some()).count(),
            branch
        );
    }
    s.push_str("</tbody></table>\n");
    if states.len() > 1 {
        let flat: Vec<_> = states
            .iter()
            .map(|st| {
                let mut m = std::collections::BTreeMap::new();
                crate::config::flatten("", &st.run.config, &mut m);
                m
            })
            .collect();
        let keys: std::collections::BTreeSet<&String> =
            flat.iter().flat_map(|m| m.keys()).collect();
        let differ: Vec<&String> = keys
            .into_iter()
            .filter(|k| {
                let first = flat[0].get(*k);
                flat.iter().any(|m| m.get(*k) != first)
            })
            .filter(|k| k.as_str() != "run.name")
            .collect();
        if differ.is_empty() {
            s.push_str("<p>Their configs are the same (but for the run name).</p>\n");
        } else {
            s.push_str("<p>Settings that differ between these runs:</p>\n<table class=\"differ\"><thead><tr><th>key</th>");
            for st in states {
                let _ = write!(s, "<th>{}</th>", escape(&st.run.run_id));
            }
            s.push_str("</tr></thead><tbody>\n");
            for k in differ {
                let _ = write!(s, "<tr><td><code>{}</code></td>", escape(k));
                for m in &flat {
                    let _ = write!(
                        s,
                        "<td>{}</td>",
                        escape(m.get(k).map(String::as_str).unwrap_or("–"))
                    );
                }
                s.push_str("</tr>\n");
            }
            s.push_str("</tbody></table>\n");
        }
    }
    s
}

/// Build the report of `runs` (each must exist in the store).
pub async fn build(store: &Store, runs: &[String]) -> Result<Report> {
    if runs.is_empty() {
        return Err(Error::config("report: name at least one run"));
    }
    let ctx = crate::sql::session_of_runs(store, runs).await?;
    let mut states = Vec::new();
    for r in runs {
        states.push(crate::store::catalog::load_run(store, r).await?);
    }
    // A branch's iterations before its branch point are its parent's: drawn once (as the
    // parent's) where the parent is in the report, and never counted as the branch's time.
    let branch_of = |run: &str| {
        states
            .iter()
            .find(|s| s.run.run_id == run)
            .and_then(|s| s.run.branch.clone())
    };
    let shown_elsewhere = |run: &str, iter: i64| {
        branch_of(run).is_some_and(|b| runs.contains(&b.parent) && iter < i64::from(b.from_iter))
    };
    let own = states
        .iter()
        .filter_map(|s| {
            s.run.branch.as_ref().map(|b| {
                format!(
                    "NOT (run_id = {} AND iter < {})",
                    str_lit(&s.run.run_id),
                    b.from_iter
                )
            })
        })
        .collect::<Vec<_>>();
    // A branch's stages shared with its parent from the branch point on (same inputs and
    // settings) were spent by the parent too.
    let own = own
        .into_iter()
        .chain(["status <> 'shared'".to_string()])
        .collect::<Vec<_>>()
        .join(" AND ");
    let list = runs
        .iter()
        .map(|r| str_lit(r))
        .collect::<Vec<_>>()
        .join(", ");
    let q = |sql: &str| render(sql, &[("runs", list.clone())]);

    let success_sql = q(SUCCESS)?;
    let rm_sql = q(RM_ACCURACY)?;
    let adapt_sql = q(ADAPTATION)?;
    let summary_sql = render(
        SUMMARY,
        &[
            ("success", success_sql.clone()),
            ("rm", rm_sql.clone()),
            ("adaptation", adapt_sql.clone()),
            ("runs", list.clone()),
            ("own", own.clone()),
        ],
    )?;
    let mut summary = table(&ctx, &summary_sql).await?;
    // In the order the runs were named.
    let run_col = summary.col("run_id");
    summary
        .rows
        .sort_by_key(|r| runs.iter().position(|n| n == r[run_col].text()));
    let success = table(&ctx, &success_sql).await?.without(&shown_elsewhere);
    let rm = table(&ctx, &rm_sql).await?.without(&shown_elsewhere);
    let training_sql = render(
        TRAINING,
        &[
            ("runs", list.clone()),
            ("policy_signal", POLICY_SIGNAL.to_string()),
        ],
    )?;
    let training = table(&ctx, &training_sql).await?.without(&shown_elsewhere);
    let adaptation = table(&ctx, &adapt_sql).await?.without(&shown_elsewhere);
    let fit_sql = render(GROWTH_FIT, &[("adaptation", adapt_sql.clone())])?;
    let fit = table(&ctx, &fit_sql).await?;
    let own_stage =
        |run: &str, iter: i64| branch_of(run).is_some_and(|b| iter < i64::from(b.from_iter));
    let times = table(&ctx, &q(STAGE_TIMES)?).await?.without(&own_stage);
    let totals = table(
        &ctx,
        &render(
            STAGE_TOTALS,
            &[("runs", list.clone()), ("own", own.clone())],
        )?,
    )
    .await?;
    let update = table(&ctx, &q(UPDATE_METRICS)?)
        .await?
        .without(&shown_elsewhere);
    let unit_tests = table(&ctx, &q(UNIT_TESTS)?).await?;
    let generalisation = table(
        &ctx,
        &render(
            "SELECT * FROM (${generalisation}) g WHERE run_id IN (${runs}) ORDER BY run_id, iter",
            &[
                ("generalisation", GENERALISATION.to_string()),
                ("runs", list.clone()),
            ],
        )?,
    )
    .await?
    .without(&shown_elsewhere);

    let mut charts = Vec::new();
    let rate = Axis::Zero { top: 1.0 };
    charts.push((
        "success".to_string(),
        chart(
            "Success per iteration",
            "success rate",
            &lines_of(
                &success,
                runs,
                &[
                    ("train", "train"),
                    ("held_out", "held-out"),
                    ("ood", "OOD"),
                    ("held_out_greedy", "held-out greedy"),
                ],
            ),
            rate,
        )?,
    ));
    // Whether what the policy learns on its training games carries over to games it never saw
    // (pipelines/sql/generalisation.sql).
    charts.push((
        "generalisation".to_string(),
        chart(
            "Training games against held-out games",
            "success rate",
            &lines_of(
                &generalisation,
                runs,
                &[
                    ("seed_tasks", "seed tasks (training)"),
                    ("held_out_before", "held-out"),
                    ("adapted_tasks", "adapted tasks (training)"),
                ],
            ),
            rate,
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
            rate,
        )?,
    ));
    charts.push((
        "reward".to_string(),
        chart(
            "Training signal: step reward and advantage spread",
            "reward",
            &lines_of(
                &training,
                runs,
                &[
                    ("mean_reward", "mean step reward"),
                    ("advantage_std", "advantage std"),
                ],
            ),
            Axis::Data,
        )?,
    ));
    // Where the learning signal dies: tasks the accuracy filter keeps, verdicts the reward
    // model gives, replies the policy gets wrong (pipelines/sql/learning_signal.sql has more).
    charts.push((
        "signal".to_string(),
        chart(
            "Learning signal per iteration",
            "share",
            &lines_of(
                &training,
                runs,
                &[
                    ("trained_task_share", "tasks trained on"),
                    ("rm_verdict_rate", "RM verdict rate"),
                    ("rm_decided", "signs the RM decides"),
                    ("reply_error_rate", "reply errors"),
                ],
            ),
            rate,
        )?,
    ));
    // How much the policy still explores: the mean −log π(a|s) of the actions it sampled, an
    // unbiased estimate of its entropy over the admissible actions (score mode; a uniform
    // policy's is ln #admissible).
    charts.push((
        "entropy".to_string(),
        chart(
            "Policy entropy over the admissible actions",
            "nats",
            &lines_of(&training, runs, &[("policy_entropy", "entropy")]),
            Axis::Zero { top: 0.0 },
        )?,
    ));
    charts.push((
        "episode_length".to_string(),
        chart(
            "Episode length",
            "steps",
            &lines_of(&training, runs, &[("episode_length", "steps")]),
            Axis::Zero { top: 1.0 },
        )?,
    ));
    // A policy that learned to go back and forth (A, B, A): in its rollouts, and in the
    // held-out evaluation sampled and greedy (pipelines/sql/step_loops.sql, eval_loops.sql).
    charts.push((
        "loops".to_string(),
        chart(
            "Loops: steps repeating the action two steps back",
            "share of steps",
            &lines_of(
                &training,
                runs,
                &[
                    ("repeat_share", "rollouts"),
                    ("eval_repeat_share", "held-out"),
                    ("greedy_repeat_share", "held-out greedy"),
                ],
            ),
            rate,
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
                    ("pending", "pending"),
                ],
            ),
            Axis::Zero { top: 1.0 },
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
    growth.sort_by_key(|l| (l.run, l.style));
    charts.push((
        "accepted_growth".to_string(),
        chart(
            "Cumulative accepted tasks",
            "accepted tasks",
            &growth,
            Axis::Zero { top: 1.0 },
        )?,
    ));
    // Stage times: each run's iteration total (solid) and its (at most 3) largest stages
    // (dashed, dotted, long dashes), in the run's colour.
    let mut time_lines = Vec::new();
    for (k, run) in runs.iter().enumerate() {
        let mut per_iter: std::collections::BTreeMap<i64, f64> = Default::default();
        for r in times
            .rows
            .iter()
            .filter(|r| r[times.col("run_id")].text() == run)
        {
            *per_iter
                .entry(r[times.col("iter")].num().unwrap_or(0.0) as i64)
                .or_default() += r[times.col("seconds")].num().unwrap_or(0.0);
        }
        time_lines.push(Line {
            label: format!("{run} · iteration"),
            run: k,
            style: 0,
            points: per_iter.into_iter().map(|(i, s)| (i as f64, s)).collect(),
        });
        let big: Vec<String> = totals
            .rows
            .iter()
            .filter(|r| r[totals.col("run_id")].text() == run)
            .filter(|r| r[totals.col("share")].num().unwrap_or(0.0) >= 0.05)
            .take(3)
            .map(|r| r[totals.col("stage")].text().to_string())
            .collect();
        for (m, stage) in big.iter().enumerate() {
            for (name, points) in times.series_where("seconds", |r| {
                r[times.col("stage")].text() == stage && r[times.col("run_id")].text() == run
            }) {
                time_lines.push(Line {
                    label: format!("{name} · {stage}"),
                    run: k,
                    style: 1 + m,
                    points,
                });
            }
        }
    }
    charts.push((
        "stage_times".to_string(),
        chart(
            "Stage wall time per iteration",
            "seconds",
            &time_lines,
            Axis::Zero { top: 1.0 },
        )?,
    ));
    for (metric, label, axis) in [
        ("loss", "loss", Axis::Data),
        ("kl", "KL", Axis::Zero { top: 0.0 }),
        ("clip_frac", "clip fraction", Axis::Zero { top: 0.0 }),
        ("grad_norm", "gradient norm", Axis::Zero { top: 0.0 }),
    ] {
        let mut lines = Vec::new();
        for (k, model) in ["policy", "rm"].iter().enumerate() {
            for (name, points) in
                update.series_where(metric, |r| r[update.col("model")].text() == *model)
            {
                let run = runs.iter().position(|r| *r == name).unwrap_or(0);
                lines.push(Line {
                    label: format!("{name} · {model}"),
                    run,
                    style: k,
                    points,
                });
            }
        }
        lines.sort_by_key(|l| (l.run, l.style));
        charts.push((
            format!("update_{metric}"),
            chart(
                &format!("Update: {label} per iteration"),
                label,
                &lines,
                axis,
            )?,
        ));
    }

    // The learning rate each model's optimizer steps ran at (the run's config, constant over a
    // run: the curve tells runs with different rates apart), at the iterations it trained.
    let mut lr_lines = Vec::new();
    for (k, model) in ["policy", "rm"].iter().enumerate() {
        let key = format!("/update/{model}_lr");
        for (name, points) in
            update.series_where("loss", |r| r[update.col("model")].text() == *model)
        {
            let Some(run) = runs.iter().position(|r| *r == name) else {
                continue;
            };
            let Some(lr) = states[run]
                .run
                .config
                .pointer(&key)
                .and_then(|v| v.as_f64())
            else {
                continue;
            };
            lr_lines.push(Line {
                label: format!("{name} · {model}"),
                run,
                style: k,
                points: points.into_iter().map(|(x, _)| (x, lr)).collect(),
            });
        }
    }
    lr_lines.sort_by_key(|l| (l.run, l.style));
    charts.push((
        "update_lr".to_string(),
        chart(
            "Update: learning rate per iteration",
            "learning rate",
            &lr_lines,
            Axis::Zero { top: 0.0 },
        )?,
    ));

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
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{}</title>\n<style>{}</style></head><body>\n<h1>{}</h1>\n<p>Store <code>{}</code> · generated by rla-pipe {} · every number below comes from the SQL files in <code>src/report/</code> over the committed tables · a run keeps its colour in every chart, a metric its dash style; hover a point for its value.</p>\n",
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
        "runs",
        if runs.len() == 1 {
            "The run"
        } else {
            "The runs"
        },
        format!(
            "{}<h3>Summary</h3>\n<p>Last and best held-out and OOD success, the reward model's process accuracy in the last iteration, tasks accepted by adaptation, and the wall time of the run's own stages (a branch's shared iterations are its parent's).</p>\n{}",
            runs_section(&states),
            summary.html()
        ),
    );
    section(
        "success",
        "Success",
        format!(
            "<p>Train: mean accuracy of the active tasks' sampled rollouts (solid). Held-out: success of the evaluation rollouts (eval.rollouts sampled at eval.temperature; one greedy rollout with eval.mode = \"greedy\") on tasks of the training distribution never trained on (dashed). OOD: the same on tasks one difficulty level harder (dotted). With eval.mode = \"both\", held-out greedy: one greedy rollout per held-out task beside the sampled ones (long dashes; the table has OOD greedy too).</p>\n<figure>{}</figure>\n{}",
            chart_of("success"),
            success.html()
        ),
    );
    section(
        "generalisation",
        "Training games against held-out games",
        format!(
            "<p>Success of the training rollouts on the pool's seed tasks (solid: drawn from the held-out set's distribution, but the same few games every iteration) beside the held-out success of the policy that rolled them out (dashed: the evaluation of the iteration before), and on the tasks adaptation brought in (dotted). Seed tasks that climb while held-out stays flat are a policy learning its training games, not their family (pipelines/sql/generalisation.sql; gap = seed tasks − held-out).</p>\n<figure>{}</figure>\n{}",
            chart_of("generalisation"),
            generalisation.html()
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
    section(
        "training",
        "Training signal",
        format!(
            "<p>Mean step reward: R = outcome + λ · mean verdict over every sampled step (solid). Advantage std: the spread of the policy advantages the update trains on (dashed; 0 when every group tied: nothing to learn); trained_share and trained_task_share: the shares of rows and of tasks it trains on (the accuracy filter's band; 0 when every task is always or never won); rm_verdict_rate: the share of the reward model's samples with a parsable verdict; signs the RM decides: the share of the update's samples whose advantage's sign the reward model's verdicts set rather than the outcome (every trajectory of their task reaching that step had the same outcome, or the advantage goes against their own trajectory's outcome: process rewards at work, or with a reward model that does not judge steps, noise the update trains on; 0 without one); reply_error_rate: the share of sampled steps whose reply named no admissible action (generate mode; 0 in score mode). When a run does not learn, the second chart shows where its signal dies. Policy entropy: the mean −log π(a|s) of the sampled actions at the rollout temperature, an unbiased estimate of the entropy of the policy's distribution over the admissible actions (score mode; ln #admissible for a uniform policy; not drawn for generate mode, whose replies are token sequences). Episode length: mean steps of the sampled rollouts. Loops: the share of steps that repeat the action of two steps before but not the previous one (A, B, A: going back and forth) in the sampled rollouts (solid) and in the held-out evaluation episodes, sampled (dashed) and greedy (dotted); a share that grows while success falls is a policy paid for a loop (pipelines/sql/step_loops.sql says whether the reward model pays for it).</p>\n<figure>{}</figure>\n<figure>{}</figure>\n<figure>{}</figure>\n<figure>{}</figure>\n<figure>{}</figure>\n{}",
            chart_of("reward"),
            chart_of("signal"),
            chart_of("entropy"),
            chart_of("episode_length"),
            chart_of("loops"),
            training.html()
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
            "<p>Candidates accepted and rejected (judged this iteration) and pending (written this iteration, judged the next).</p>\n<figure>{}</figure>\n{}<h3>Cumulative accepted tasks and linear fit</h3>\n<figure>{}</figure>\n{}",
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
            "<p>Each iteration's total (solid) and the run's largest stages (at least 5% of its time); per stage, over the run's own iterations: how often it ran, its total and mean seconds, and its share of the run's time.</p>\n<figure>{}</figure>\n{}",
            chart_of("stage_times"),
            totals.html()
        ),
    );
    section(
        "update-metrics",
        "Update metrics",
        format!(
            "<p>Means over each iteration's optimizer steps; policy solid, reward model dashed. KL is the k3 estimator (r − 1 − log r of the probability ratio r) against the pre-update snapshot, the term β·KL of the loss; the gradient norm is taken before clipping; the learning rate is the run's (update.policy_lr, update.rm_lr) at each iteration the model trained.</p>\n<figure>{}</figure>\n<figure>{}</figure>\n<figure>{}</figure>\n<figure>{}</figure>\n<figure>{}</figure>\n{}",
            chart_of("update_loss"),
            chart_of("update_kl"),
            chart_of("update_clip_frac"),
            chart_of("update_grad_norm"),
            chart_of("update_lr"),
            update.html()
        ),
    );
    html.push_str("</body></html>\n");
    Ok(Report { html, charts })
}

const CSS: &str = "body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}\
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}\
figure{margin:1em 0}figure svg{width:100%;height:auto;max-width:1100px;display:block}\
table{border-collapse:collapse;font-size:.85em;margin:.5em 0 1.5em;display:block;overflow-x:auto}\
td,th{border:1px solid #ddd;padding:2px 8px;text-align:right}th{background:#f4f4f4}\
table.runs td,table.differ td{text-align:left}\
.swatch{display:inline-block;width:.9em;height:.9em;margin-right:.4em;vertical-align:-.1em;border-radius:2px}\
code{background:#f4f4f4;padding:0 3px}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_display_and_charts_render() {
        assert_eq!(Cell::Num(Some(0.15625)).display(), "0.156");
        assert_eq!(Cell::Num(Some(0.8125)).display(), "0.813", "as SQL's round");
        assert_eq!(Cell::Num(Some(-0.0001)).display(), "0.000", "never -0.000");
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
            Axis::Zero { top: 1.0 },
        )
        .unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("</svg>"), "{svg}");
        assert!(svg.contains("iteration") && svg.contains("run"));
        // No data at all still renders an (empty) chart.
        assert!(
            chart("empty", "y", &[], Axis::Data)
                .unwrap()
                .contains("</svg>")
        );
    }

    /// The y pixel of every `<text>` whose content is `label`.
    fn text_y(svg: &str, label: &str) -> Vec<f64> {
        svg.match_indices(&format!(">\n{label}\n</text>"))
            .filter_map(|(end, _)| {
                let start = svg[..end].rfind("<text")?;
                let tag = &svg[start..end];
                let y = tag.split(" y=\"").nth(1)?.split('"').next()?;
                y.parse().ok()
            })
            .collect()
    }

    #[test]
    fn a_run_keeps_its_colour_legends_sit_below_and_points_carry_values() {
        let line = |label: &str, run: usize, style: usize, y: f64| Line {
            label: label.into(),
            run,
            style,
            points: vec![(0.0, y), (1.0, y + 0.2), (2.0, y + 0.3)],
        };
        let lines = [
            line("a · train", 0, 0, 0.1),
            line("a · held-out", 0, 1, 0.2),
            line("b · train", 1, 0, 0.3),
            line("b · held-out", 1, 1, 0.4),
        ];
        let svg = chart(
            "Success per iteration",
            "success rate",
            &lines,
            Axis::Zero { top: 1.0 },
        )
        .unwrap();
        // Two runs: two Okabe–Ito colours, whatever the number of metrics.
        for c in ["#0072B2", "#D55E00"] {
            assert!(svg.contains(&format!("stroke=\"{c}\"")), "{c} missing");
        }
        assert!(!svg.contains("#009E73"), "a third colour for two runs");
        // Dashed metrics stay dashed, in the plot and in the legend.
        assert!(svg.contains("stroke-dasharray") || svg.matches("<polyline").count() > 4);
        // The legend is below the plot area, none of it inside.
        for label in ["a · train", "a · held-out", "b · train", "b · held-out"] {
            let ys = text_y(&svg, label);
            assert_eq!(ys.len(), 1, "{label}: one legend entry");
            assert!(
                ys[0] >= f64::from(PLOT_HEIGHT),
                "{label} at y {} inside the plot",
                ys[0]
            );
        }
        // Every point's exact value is its tooltip.
        assert_eq!(svg.matches("class=\"tip\"").count(), 12);
        assert!(
            svg.contains("<title>b · held-out: iteration 2: 0.700</title>"),
            "{svg}"
        );
        // Tick labels 12.9 px, axis descriptions and the legend 13.7 px, the title 17.7 px.
        let size = |px: &str| svg.matches(&format!("font-size=\"{px}")).count();
        assert!(size("12.9") >= 3, "tick labels");
        assert_eq!(size("13.7"), 6, "axis descriptions (2) and legend (4)");
        assert_eq!(size("17.7"), 1, "title");
        assert!(
            !svg.contains("font-size=\"9."),
            "text at plotters' small default"
        );
        // Rates start at 0.
        assert!(
            !text_y(&svg, "0.0").is_empty()
                || svg.contains(">0</text>")
                || svg.contains(">0.0</text>")
        );
        // Same input, same bytes.
        let again = chart(
            "Success per iteration",
            "success rate",
            &lines,
            Axis::Zero { top: 1.0 },
        );
        assert_eq!(svg, again.unwrap());
    }
}
