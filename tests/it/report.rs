//! `rla-pipe report` on small committed runs: every section, and the numbers it prints checked
//! against independent queries.

use crate::{Fixture, GRIDNAV};

/// The `<tr>` of a report table whose first two cells are `run` and `iter`.
fn row<'a>(html: &'a str, section: &str, run: &str, iter: &str) -> Vec<&'a str> {
    let start = html
        .find(&format!("<section id=\"{section}\">"))
        .unwrap_or_else(|| panic!("no section {section}"));
    let body = &html[start..start + html[start..].find("</section>").unwrap()];
    let prefix = format!("<tr><td>{run}</td><td>{iter}</td>");
    let line = body
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no row {run} {iter} in {section}"));
    line.trim_start_matches("<tr><td>")
        .trim_end_matches("</td></tr>")
        .split("</td><td>")
        .collect()
}

fn num(f: &Fixture, q: &str) -> f64 {
    f.sql(q).ok().scalar().parse().unwrap()
}

/// A headless Chromium, installed with apt when missing (Debian's `chromium`, as the test
/// command installs TextWorld with pip). Installs are serialized across tests.
pub(crate) fn chromium() -> std::path::PathBuf {
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let find = || {
        ["chromium", "chromium-browser", "google-chrome"]
            .iter()
            .find_map(|name| {
                std::env::var_os("PATH").and_then(|paths| {
                    std::env::split_paths(&paths)
                        .map(|d| d.join(name))
                        .find(|p| p.is_file())
                })
            })
    };
    if let Some(p) = find() {
        return p;
    }
    let apt = |args: &[&str]| {
        std::process::Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    let install = ["install", "-y", "-q", "--no-install-recommends", "chromium"];
    // Stale package lists: refresh them once and try again.
    let ok = apt(&install) || (apt(&["update", "-q"]) && apt(&install));
    find().unwrap_or_else(|| {
        panic!("this test needs a headless Chromium: apt-get install chromium (apt-get ok: {ok})")
    })
}

/// The report's layout in a real browser window `width` px wide: the page's own width against
/// the window's, and each chart's rendered width, measured by a script added to a copy of the
/// page (`--dump-dom` prints the DOM after it ran).
fn layout_in_chromium(html: &str, dir: &std::path::Path, width: u32) -> serde_json::Value {
    let probe = "<script>window.addEventListener('load',()=>{const f=[...document.querySelectorAll('figure svg')];\
const o={inner:window.innerWidth,scroll:document.documentElement.scrollWidth,\
charts:f.map(s=>s.getBoundingClientRect().width),\
tips:document.querySelectorAll('svg title').length};\
const p=document.createElement('pre');p.id='layout';p.textContent=JSON.stringify(o);document.body.appendChild(p);});</script>";
    let page = dir.join(format!("layout-{width}.html"));
    std::fs::write(&page, html.replace("</body>", &format!("{probe}</body>"))).unwrap();
    // At most two minutes: a hung browser fails the test instead of stalling the suite.
    let out = std::process::Command::new("timeout")
        .arg("120")
        .arg(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            &format!("--window-size={width},1000"),
            "--virtual-time-budget=5000",
            "--dump-dom",
        ])
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run chromium");
    let dom = String::from_utf8_lossy(&out.stdout);
    let start = dom.find("<pre id=\"layout\">").unwrap_or_else(|| {
        panic!(
            "no layout from chromium at {width} px: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    }) + "<pre id=\"layout\">".len();
    let end = start + dom[start..].find("</pre>").unwrap();
    serde_json::from_str(&dom[start..end].replace("&amp;", "&")).unwrap()
}

#[test]
fn report_has_every_section_and_the_right_numbers() {
    let f = Fixture::new();
    let small = [
        "env.initial_tasks=16",
        "update.policy_steps=4",
        "update.rm_steps=4",
    ];
    f.run_pipeline(GRIDNAV, "full", 3, &small).ok();
    let static_sets: Vec<&str> = small.into_iter().chain(["adapt.enabled=false"]).collect();
    f.run_pipeline(GRIDNAV, "static", 3, &static_sets).ok();
    let out = f.dir.path().join("report.html");
    let svgs = f.dir.path().join("svg");
    let out_s = out.display().to_string();
    let svgs_s = svgs.display().to_string();
    f.rla(&[
        "report",
        "full",
        "static",
        "--out",
        &out_s,
        "--svg-dir",
        &svgs_s,
    ])
    .ok();
    let html = std::fs::read_to_string(&out).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
    // In a real browser: at 700 px nothing runs off the side and every chart fits the window;
    // at 1400 px the charts grow with it (up to the page's 1,100 px); every point has a tooltip.
    let (narrow, wide) = (
        layout_in_chromium(&html, f.dir.path(), 700),
        layout_in_chromium(&html, f.dir.path(), 1400),
    );
    for (layout, px) in [(&narrow, 700.0), (&wide, 1400.0)] {
        let inner = layout["inner"].as_f64().unwrap();
        assert_eq!(inner, px, "{layout}");
        assert!(
            layout["scroll"].as_f64().unwrap() <= inner,
            "overflows at {px} px: {layout}"
        );
        let charts: Vec<f64> = layout["charts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w.as_f64().unwrap())
            .collect();
        assert_eq!(charts.len(), 16, "{layout}");
        assert!(
            charts
                .iter()
                .all(|w| *w > 0.8 * px.min(1100.0) && *w <= inner),
            "{layout}"
        );
        assert!(layout["tips"].as_u64().unwrap() > 0, "{layout}");
    }
    assert!(
        wide["charts"][0].as_f64().unwrap() > narrow["charts"][0].as_f64().unwrap() + 300.0,
        "{narrow} vs {wide}"
    );
    for id in [
        "runs",
        "success",
        "generalisation",
        "rm-accuracy",
        "training",
        "adaptation",
        "stage-times",
        "update-metrics",
    ] {
        assert!(html.contains(&format!("<section id=\"{id}\">")), "{id}");
    }
    // Self-contained: 16 inline charts, nothing fetched, no script.
    assert_eq!(html.matches("<svg").count(), 16);
    assert!(!html.contains("src=\"http") && !html.contains("href=\"http"));
    assert!(!html.contains("<script"));
    assert_eq!(std::fs::read_dir(&svgs).unwrap().count(), 16);
    // Both runs are overlaid in the charts' legends, each in its own colour throughout: the
    // first run's blue, the second's vermillion, no third colour in the success chart.
    assert!(html.contains("full · train") && html.contains("static · held-out"));
    let success_svg = std::fs::read_to_string(svgs.join("success.svg")).unwrap();
    assert!(
        success_svg.contains("stroke=\"#0072B2\"") && success_svg.contains("stroke=\"#D55E00\"")
    );
    assert!(
        !success_svg.contains("stroke=\"#009E73\""),
        "a colour per metric"
    );
    // Tooltips with the exact values; responsive charts.
    assert!(success_svg.contains("<title>full · held-out: iteration 0: "));
    assert!(html.contains("figure svg{width:100%;height:auto"));
    // The runs' header and summary: one row each.
    assert!(html.contains("<table class=\"runs\">"));
    assert_eq!(html.matches("<tr><td class=\"run\">").count(), 2);
    assert!(
        html.contains("<code>adapt.enabled</code>"),
        "the setting that differs"
    );

    let fmt = |x: f64| format!("{x:.3}");
    for run in ["full", "static"] {
        for iter in 0..3 {
            let held = num(
                &f,
                &format!(
                    "SELECT sum(successes) * 1.0 / sum(rollouts) FROM evaluations \
                     WHERE run_id = '{run}' AND iter = {iter} AND split = 'held_out'"
                ),
            );
            let ood = num(
                &f,
                &format!(
                    "SELECT sum(successes) * 1.0 / sum(rollouts) FROM evaluations \
                     WHERE run_id = '{run}' AND iter = {iter} AND split = 'ood'"
                ),
            );
            let train = num(
                &f,
                &format!(
                    "SELECT avg(a.acc) FROM task_accuracy a JOIN tasks t ON t.run_id = a.run_id \
                     AND t.iter = a.iter AND t.task_id = a.task_id \
                     WHERE a.run_id = '{run}' AND a.iter = {iter} AND t.status = 'active'"
                ),
            );
            let i = iter.to_string();
            // Shown to 3 decimals: within half a unit of the last digit of the query's value (a
            // mean that falls on ...5 rounds either way with the order of its sum, which
            // DataFusion does not fix).
            let shown = row(&html, "success", run, &i);
            for (cell, value) in shown[2..5].iter().zip([train, held, ood]) {
                let x: f64 = cell.parse().unwrap_or(f64::NAN);
                assert!(
                    (x - value).abs() <= 5e-4 + 1e-9,
                    "{run} {iter}: shown {cell}, the query {} ({shown:?})",
                    fmt(value)
                );
            }
            // Loops: the share of A-B-A steps in the rollouts and the held-out episodes,
            // counted with self-joins.
            let repeats = |table: &str, episode: &str, split: &str| {
                let on = |x: &str, back: u32| {
                    format!(
                        "{x}.run_id = a.run_id AND {x}.iter = a.iter AND {} AND {x}.step_idx + {back} = a.step_idx",
                        episode
                            .split(',')
                            .map(|c| format!("{x}.{c} = a.{c}"))
                            .collect::<Vec<_>>()
                            .join(" AND ")
                    )
                };
                let repeated = num(
                    &f,
                    &format!(
                        "SELECT count(*) * 1.0 FROM {table} a JOIN {table} b ON {} JOIN {table} c ON {} \
                         WHERE a.run_id = '{run}' AND a.iter = {iter} {split} \
                         AND a.action = c.action AND a.action <> b.action",
                        on("b", 1),
                        on("c", 2)
                    ),
                );
                let all = num(
                    &f,
                    &format!(
                        "SELECT count(*) * 1.0 FROM {table} a WHERE a.run_id = '{run}' AND a.iter = {iter} {split}"
                    ),
                );
                fmt(repeated / all)
            };
            let training = row(&html, "training", run, &i);
            assert_eq!(
                training[11..13],
                [
                    repeats("steps", "traj_id", ""),
                    repeats(
                        "eval_steps",
                        "split,task_id,rollout_idx",
                        "AND a.split = 'held_out'"
                    )
                ],
                "{run} {iter}: {training:?}"
            );
            let process = num(
                &f,
                &format!(
                    "SELECT sum(rm_process_acc * judged_steps) / sum(judged_steps) FROM task_accuracy \
                     WHERE run_id = '{run}' AND iter = {iter} AND judged_steps > 0"
                ),
            );
            assert_eq!(row(&html, "rm-accuracy", run, &i)[2], fmt(process));
            let loss = num(
                &f,
                &format!(
                    "SELECT avg(loss) FROM update_metrics WHERE run_id = '{run}' AND iter = {iter} AND model = 'policy'"
                ),
            );
            let r = row(&html, "update-metrics", run, &i);
            assert_eq!((r[2], r[3].to_string()), ("policy", fmt(loss)));
        }
    }
    // Adaptation: the counts per iteration and the linear fit of the cumulative curve, checked
    // against a least-squares fit computed here.
    let mut cumulative = Vec::new();
    let mut total = 0.0;
    for iter in 0..3 {
        let i = iter.to_string();
        let r = row(&html, "adaptation", "full", &i);
        let accepted = f
            .sql(&format!(
                "SELECT count(*) FROM adaptations WHERE run_id = 'full' AND iter = {iter} AND decision = 'accepted'"
            ))
            .ok()
            .scalar();
        assert_eq!(r[2], accepted);
        total += accepted.parse::<f64>().unwrap();
        assert_eq!(r[5], format!("{total}"));
        cumulative.push(total);
        assert_eq!(
            row(&html, "adaptation", "static", &i)[2..],
            ["0", "0", "0", "0"]
        );
    }
    let n = cumulative.len() as f64;
    let mx = (0..3).map(|x| x as f64).sum::<f64>() / n;
    let my = cumulative.iter().sum::<f64>() / n;
    let sxy: f64 = cumulative
        .iter()
        .enumerate()
        .map(|(x, y)| (x as f64 - mx) * (y - my))
        .sum();
    let sxx: f64 = (0..3).map(|x| (x as f64 - mx).powi(2)).sum();
    let slope = sxy / sxx;
    let fit_start = html.find("<h3>Cumulative accepted tasks").unwrap();
    let fit_row = html[fit_start..]
        .lines()
        .find(|l| l.starts_with("<tr><td>full</td>"))
        .unwrap();
    assert!(
        fit_row.starts_with(&format!("<tr><td>full</td><td>{}</td>", fmt(slope))),
        "{fit_row} (slope {slope})"
    );
    // Stage times: per stage, the total of its manifests' seconds over the run's iterations.
    let secs = num(
        &f,
        "SELECT sum(seconds) FROM stage_runs WHERE run_id = 'full' AND stage = 'update'",
    );
    let times_start = html.find("<section id=\"stage-times\">").unwrap();
    assert!(
        html[times_start..].contains(&format!(
            "<tr><td>full</td><td>update</td><td>3</td><td>{}</td>",
            fmt(secs)
        )),
        "update seconds {secs}"
    );
    // ... and its largest peak resident memory (GiB), recorded by every manifest of this build
    // (and no device memory: a CPU run).
    let peak = num(
        &f,
        "SELECT max(peak_rss_bytes) / 1073741824.0 FROM stage_runs \
         WHERE run_id = 'full' AND stage = 'update' AND status <> 'shared'",
    );
    assert!(peak > 0.0, "update peak RSS {peak}");
    let update_row = html[times_start..]
        .split("<tr>")
        .find(|r| r.starts_with("<td>full</td><td>update</td>"))
        .unwrap();
    assert!(
        update_row.contains(&format!("<td>{}</td><td>–</td></tr>", fmt(peak))),
        "{update_row} vs {peak}"
    );
    // The training signal: the mean step reward per iteration.
    let reward = num(
        &f,
        "SELECT avg(reward) FROM step_rewards WHERE run_id = 'full' AND iter = 1",
    );
    assert_eq!(row(&html, "training", "full", "1")[2], fmt(reward));
    // ... the share of tasks the update trains on, the RM's verdict rate, and the policy's
    // reply-format error rate (a score-mode policy's action is always an admissible one).
    let tasks = num(
        &f,
        "SELECT count(DISTINCT CASE WHEN included THEN task_id END) * 1.0 / count(DISTINCT task_id) \
         FROM policy_advantages WHERE run_id = 'full' AND iter = 1",
    );
    let verdicts = num(
        &f,
        "SELECT avg(CASE WHEN score <> 0 THEN 1.0 ELSE 0.0 END) FROM rm_samples \
         WHERE run_id = 'full' AND iter = 1",
    );
    // ... and the policy's entropy over the admissible actions: the mean -log pi(a|s) of the
    // actions it sampled.
    let entropy = num(
        &f,
        "SELECT avg(-action_logprob) FROM steps WHERE run_id = 'full' AND iter = 1",
    );
    assert!(entropy > 0.0);
    // ... and the share of the update's samples whose sign the RM's verdicts decide (an
    // outcome-pure group, or against their trajectory's outcome), with a grouped join.
    let decided = num(
        &f,
        "SELECT avg(CASE WHEN (g.n > 1 AND (g.won = 0 OR g.won = g.n)) \
                      OR ((p.advantage > 0) <> (t.outcome > 0)) THEN 1.0 ELSE 0.0 END) \
         FROM policy_advantages p \
         JOIN trajectories t ON p.run_id = t.run_id AND p.iter = t.iter AND p.traj_id = t.traj_id \
         JOIN (SELECT p2.task_id, p2.step_idx, count(*) AS n, \
                      sum(CASE WHEN t2.outcome > 0 THEN 1 ELSE 0 END) AS won \
               FROM policy_advantages p2 JOIN trajectories t2 \
                 ON p2.run_id = t2.run_id AND p2.iter = t2.iter AND p2.traj_id = t2.traj_id \
               WHERE p2.run_id = 'full' AND p2.iter = 1 GROUP BY p2.task_id, p2.step_idx) g \
           ON g.task_id = p.task_id AND g.step_idx = p.step_idx \
         WHERE p.run_id = 'full' AND p.iter = 1 AND p.included AND p.advantage <> 0",
    );
    let training = row(&html, "training", "full", "1");
    assert_eq!(
        training[5..10],
        [
            fmt(tasks),
            fmt(verdicts),
            fmt(decided),
            fmt(0.0),
            fmt(entropy)
        ]
    );
    // The learning rate of each model's update, at each iteration it trained.
    let lr = std::fs::read_to_string(svgs.join("update_lr.svg")).unwrap();
    assert!(
        lr.contains("full · policy") && lr.contains("full · rm"),
        "{lr}"
    );
    assert!(
        std::fs::read_to_string(svgs.join("signal.svg"))
            .unwrap()
            .contains("RM verdict rate")
    );
    assert!(
        std::fs::read_to_string(svgs.join("signal.svg"))
            .unwrap()
            .contains("signs the RM decides")
    );

    // A branch: its header names the parent, branch point and override; its shared iterations
    // are drawn once (the parent's) and not counted as its time.
    f.rla(&[
        "replay",
        "--run",
        "full",
        "--from",
        "2",
        "--set",
        "reward.lambda=0",
        "--into",
        "full-l0",
        "--iterations",
        "3",
    ])
    .ok();
    let branch_out = f.dir.path().join("branch.html").display().to_string();
    f.rla(&["report", "full", "full-l0", "--out", &branch_out])
        .ok();
    let html = std::fs::read_to_string(&branch_out).unwrap();
    assert!(
        html.contains("of <b>full</b> from iteration 2, <code>--set reward.lambda=0</code>"),
        "the branch header"
    );
    assert!(
        html.contains("<code>reward.lambda</code>"),
        "the setting that differs"
    );
    let success_rows = |run: &str| {
        let start = html.find("<section id=\"success\">").unwrap();
        let body = &html[start..start + html[start..].find("</section>").unwrap()];
        body.lines()
            .filter(|l| l.starts_with(&format!("<tr><td>{run}</td>")))
            .count()
    };
    assert_eq!((success_rows("full"), success_rows("full-l0")), (3, 1));
    let times_start = html.find("<section id=\"stage-times\">").unwrap();
    assert!(
        html[times_start..].contains("<tr><td>full-l0</td><td>update</td><td>1</td>"),
        "the branch's own update, once"
    );

    // Any run: a synthetic run has no evaluations, updates or adaptations; its report still has
    // every section, with empty charts where there is nothing to draw.
    f.run_small(&["--iterations", "2"]).ok();
    let small = f.dir.path().join("small.html").display().to_string();
    f.rla(&["report", "small", "--out", &small]).ok();
    let html = std::fs::read_to_string(&small).unwrap();
    assert_eq!(html.matches("<svg").count(), 16);
    let train = num(
        &f,
        "SELECT avg(acc) FROM task_accuracy WHERE run_id = 'small' AND iter = 1",
    );
    assert_eq!(
        row(&html, "success", "small", "1")[2..],
        [fmt(train), "–".into(), "–".into(), "–".into(), "–".into()]
    );

    // Unknown runs are named; no run is a usage error.
    f.rla(&["report", "full", "nope", "--out", &out_s])
        .fails(1, &["nope"]);
    f.rla(&["report", "--out", &out_s]).fails(2, &["RUN"]);
}

/// `report --watch`: started before the run exists, it waits for it, re-writes the report (a
/// page that reloads itself) while the run goes, and ends by itself once the run has committed
/// its last iteration, leaving a page that no longer reloads.
#[test]
fn a_watched_report_follows_a_run_to_its_end() {
    let f = Fixture::new();
    let out = f.dir.path().join("live.html");
    let watch = std::process::Command::new(crate::rla_pipe_bin())
        .current_dir(f.dir.path())
        .env_remove("RUST_LOG")
        .args(["report", "small", "--store", &f.store_arg(), "--out"])
        .arg(&out)
        .args(["--watch", "--interval", "1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Its progress lines, as they come.
    let (tx, rx) = std::sync::mpsc::channel();
    let mut watch = watch;
    let err = watch.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut all = String::new();
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(line.clone());
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let first = rx.recv_timeout(std::time::Duration::from_secs(30)).unwrap();
    assert!(first.contains("small: not started"), "{first}");
    f.run_small(&["--iterations", "2"]).ok();
    // It ends by itself within a few intervals of the run's end.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while watch.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "report --watch did not end"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let status = watch.wait().unwrap();
    let stderr = reader.join().unwrap();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("small: complete (2 iterations)"),
        "{stderr}"
    );
    let html = std::fs::read_to_string(&out).unwrap();
    assert!(html.contains("<section id=\"success\">"), "a report");
    assert!(
        !html.contains("http-equiv=\"refresh\""),
        "the last page does not reload"
    );
    // Without --watch, --interval is a usage error.
    f.rla(&["report", "small", "--interval", "5"])
        .fails(2, &["--watch"]);
}
