//! `env.name = "web"`: web tasks in a real headless Chromium (installed with apt when missing,
//! as the report's browser check does).

use rla_pipe::determinism::Rng;
use rla_pipe::env::Environment;
use rla_pipe::env::web::task::FAMILIES;
use rla_pipe::env::web::{Web, WebConfig};
use serde_json::{Value, json};

use super::{Fixture, small_slow_env};
use crate::report::chromium;

const WEB: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/pipelines/web.toml");

fn web() -> Web {
    web_with(true)
}

fn web_with(named_actions: bool) -> Web {
    Web::new(WebConfig {
        chromium: chromium().display().to_string(),
        named_actions,
        ..WebConfig::default()
    })
}

/// `env.web.scroll_and_keys`: `scroll(down)` where a page runs past the window, then
/// `scroll(up)`; `press("Enter")` once a form's field has the focus, which submits the form as
/// `submit` does (the same end, the same verdict); none of them without the key.
#[test]
fn scroll_and_enter_where_the_page_allows_them() {
    let more = Web::new(WebConfig {
        chromium: chromium().display().to_string(),
        scroll_and_keys: true,
        // Short enough that the larger pages run past it.
        window_height: 300,
        ..WebConfig::default()
    });
    let plain = web();
    let big = |family: &str, seed: u64| {
        json!({"family": family, "seed": seed, "elements": 12, "fields": 5, "pages": 2,
               "distractors": 4})
    };
    let has = |ep: &dyn rla_pipe::env::Episode, a: &str| {
        ep.observation().admissible.iter().any(|x| x == a)
    };
    // Scrolling: the first page found that runs past the window scrolls down, then up.
    let mut scrolled = false;
    'pages: for family in FAMILIES {
        for seed in 0..3 {
            let mut ep = more.reset(&big(family, seed)).unwrap();
            assert!(!has(
                &*plain.reset(&big(family, seed)).unwrap(),
                "scroll(down)"
            ));
            if has(&*ep, "scroll(down)") {
                assert!(!has(&*ep, "scroll(up)"), "{family} {seed}: at the top");
                let before = ep.observation().text.clone();
                let s = ep.step("scroll(down)").unwrap();
                assert!(!s.done && s.oracle_progress == Some(-1));
                assert!(has(&*ep, "scroll(up)"), "{family} {seed}: scrolled");
                assert_eq!(ep.observation().text, before, "the tree lists every node");
                scrolled = true;
                break 'pages;
            }
        }
    }
    assert!(scrolled, "no page runs past a 300 px window");
    // Enter in a field: the same end as submit.
    for seed in 0..4 {
        let s = spec("fill_form", seed);
        let mut outcomes = Vec::new();
        for finish in ["press(\"Enter\")", "submit"] {
            let mut ep = more.reset(&s).unwrap();
            assert!(!has(&*ep, "press(\"Enter\")"), "nothing has the focus yet");
            let typed = ep
                .observation()
                .admissible
                .iter()
                .find(|a| a.contains(" type("))
                .unwrap()
                .clone();
            ep.step(&typed).unwrap();
            assert!(has(&*ep, "press(\"Enter\")"), "a field has the focus");
            let end = ep.step(finish).unwrap();
            assert!(end.done, "{finish} ends the episode");
            outcomes.push((end.won, end.oracle_progress));
        }
        assert_eq!(outcomes[0], outcomes[1], "seed {seed}");
        let mut ep = plain.reset(&s).unwrap();
        let typed = ep.observation().admissible[0].clone();
        let _ = ep.step(&typed);
        assert!(!has(&*ep, "press(\"Enter\")"));
    }
}

fn spec(family: &str, seed: u64) -> Value {
    json!({"family": family, "seed": seed, "elements": 4, "fields": 2, "pages": 2,
           "distractors": 1})
}

/// Each family, two pages each (the first with actions that name their element, the second
/// with bare ids): the planner wins every one, each of its steps judged progress by the
/// oracle; the uniform policy (seeded) loses most of eight.
#[test]
fn every_family_is_won_by_the_planner_and_mostly_lost_at_random() {
    let (env, bare) = (web(), web_with(false));
    let tok = rla_pipe::model::tokenizer::Tokenizer::words(&env.vocabulary());
    let unk = tok.special(rla_pipe::model::tokenizer::UNK);
    for family in FAMILIES {
        for seed in 0..2 {
            let s = spec(family, seed);
            let mut ep = if seed == 0 { &env } else { &bare }.reset(&s).unwrap();
            let clicks: Vec<&String> = ep
                .observation()
                .admissible
                .iter()
                .filter(|a| a.contains("click("))
                .collect();
            assert!(!clicks.is_empty(), "{family}");
            for a in clicks {
                let named = a.starts_with('"') && a.contains("\" click(");
                assert_eq!(named, seed == 0, "{family} {seed}: {a}");
            }
            let mut steps = 0;
            loop {
                // Every word of what the small transformer reads and scores is in its
                // vocabulary: the tree's and the actions' punctuation too.
                let obs = ep.observation();
                for text in std::iter::once(&obs.text).chain(&obs.admissible) {
                    let ids = tok.encode(text);
                    assert!(
                        !ids.contains(&unk),
                        "{family} {seed}: an unknown word in {text}"
                    );
                }
                let a = ep
                    .oracle_action()
                    .unwrap_or_else(|| panic!("{family} {seed}: no plan at step {steps}"));
                assert!(
                    ep.observation().admissible.contains(&a),
                    "{family} {seed}: the planner's {a} is not admissible:\n{}",
                    ep.observation().text
                );
                let r = ep.step(&a).unwrap();
                steps += 1;
                assert_eq!(r.oracle_progress, Some(1), "{family} {seed}: {a}");
                if r.done {
                    assert!(r.won, "{family} {seed}: the plan ended without a win");
                    break;
                }
            }
            assert!(steps <= ep.max_steps(), "{family} {seed}: {steps} steps");
        }
        let mut rng = Rng::new(7);
        let (mut won, episodes) = (0, 8);
        for seed in 0..episodes {
            let mut ep = env.reset(&spec(family, 100 + seed)).unwrap();
            for _ in 0..ep.max_steps() {
                let adm = &ep.observation().admissible;
                let a = adm[(rng.next_u64() % adm.len() as u64) as usize].clone();
                let r = ep.step(&a).unwrap();
                if r.done {
                    won += u32::from(r.won);
                    break;
                }
            }
        }
        assert!(
            won * 2 < episodes as u32,
            "{family}: the uniform policy won {won} of {episodes}"
        );
    }
}

/// A browser killed mid-episode fails that episode's next step with an error that says so;
/// the next episode gets a new browser.
#[test]
fn a_killed_browser_is_a_clear_error_and_is_replaced() {
    let env = web();
    let s = spec("fill_form", 1);
    let mut ep = env.reset(&s).unwrap();
    let pid = env.browser_pid().expect("a browser runs");
    // SAFETY: kill(2) on the browser this test started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let a = ep.oracle_action().unwrap();
    let e = ep.step(&a).unwrap_err().to_string();
    assert!(e.contains("chromium is gone"), "{e}");
    drop(ep);
    let mut ep = env.reset(&s).unwrap();
    assert_ne!(env.browser_pid(), Some(pid));
    let a = ep.oracle_action().unwrap();
    assert_eq!(ep.step(&a).unwrap().oracle_progress, Some(1));
}

/// A small web run (uniform policy, a small warm start from the planner) whose browser crashes
/// mid-run: a clean error; the same command resumes it and is itself killed (as `kill -9`)
/// with its browsers running; the same command again finishes it. No browser outlives its
/// rla-pipe, and no profile directory outlives the run. Its iteration replays bit for bit,
/// and every committed observation equals a fresh read of the same page state (the task's
/// page opened again and the committed actions taken up to it).
#[test]
fn a_web_run_commits_observations_a_fresh_browser_reads_again() {
    chromium();
    let f = Fixture::new();
    let mut sets = small_slow_env(4);
    sets.extend(
        [
            "pretrain.tasks=3",
            "pretrain.policy_episodes=3",
            "pretrain.policy_epochs=1",
            "pretrain.rm_steps=16",
            "pretrain.rm_epochs=1",
        ]
        .map(String::from),
    );
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    // First the browser crashes (SIGKILL) at the run's 30th web step, past the warm start's
    // episodes: a clear error, exit 1.
    let args = f.pipeline_args(WEB, "web", 1, &sets);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // Browsers' profiles in a temporary directory of the test's own.
    let tmp = f.dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let tmp_s = tmp.display().to_string();
    let r = f.rla_env(
        &[("RLA_PIPE_WEB_CRASH_AFTER", "30"), ("TMPDIR", &tmp_s)],
        &args,
    );
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("chromium is gone"), "{}", r.stderr);
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    // Resumed, then aborted (as by `kill -9`) before its 5th web step, its browser running:
    // its profile stays behind, its browser exits with it.
    let r = f.rla_env(
        &[("RLA_PIPE_WEB_ABORT_AFTER", "5"), ("TMPDIR", &tmp_s)],
        &args,
    );
    assert!(r.stderr.contains("ABORT_AFTER=5: aborting"), "{}", r.stderr);
    let profiles = || -> Vec<String> {
        std::fs::read_dir(&tmp)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("rla-pipe-chromium-"))
            .collect()
    };
    assert!(
        !profiles().is_empty(),
        "the killed run's browser had a profile"
    );
    let started = std::time::Instant::now();
    while browsers_under(&tmp_s) > 0 {
        assert!(
            started.elapsed().as_secs() < 20,
            "a browser outlived its killed rla-pipe"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let r = f.rla_env(&[("TMPDIR", &tmp_s)], &args).ok();
    assert_eq!(
        profiles(),
        Vec::<String>::new(),
        "no profile outlives its run"
    );
    assert!(
        r.stderr.contains("committed earlier, skipped"),
        "{}",
        r.stderr
    );
    let r = f.rla(&[
        "replay",
        "--store",
        &f.store_arg(),
        "--run",
        "web",
        "--iter",
        "0",
        "--verify",
    ]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let rows = json_rows(
        &f,
        "SELECT t.spec, s.traj_id, s.step_idx, s.observation, s.action \
         FROM steps s JOIN tasks t ON s.task_id = t.task_id AND s.iter = t.iter \
         ORDER BY s.traj_id, s.step_idx",
    );
    assert!(rows.len() >= 8, "{} steps", rows.len());
    let env = web();
    let mut checked = 0;
    let mut i = 0;
    while i < rows.len() {
        let traj = rows[i]["traj_id"].clone();
        let spec: Value = serde_json::from_str(rows[i]["spec"].as_str().unwrap()).unwrap();
        let mut ep = env.reset(&spec).unwrap();
        while i < rows.len() && rows[i]["traj_id"] == traj {
            assert_eq!(
                ep.observation().text,
                rows[i]["observation"].as_str().unwrap(),
                "trajectory {traj} step {}",
                rows[i]["step_idx"]
            );
            checked += 1;
            let done = ep.step(rows[i]["action"].as_str().unwrap()).unwrap().done;
            i += 1;
            if done {
                break;
            }
        }
    }
    assert!(checked >= 8);
    // Each task's page is committed as its asset, named by its blake3: the exact HTML played.
    let specs: Vec<Value> = json_rows(&f, "SELECT DISTINCT spec FROM tasks")
        .iter()
        .map(|r| serde_json::from_str(r["spec"].as_str().unwrap()).unwrap())
        .collect();
    assert!(specs.len() >= 4);
    let files = f.files();
    for spec in &specs {
        let id = env.asset_id(spec).unwrap();
        let file = files
            .iter()
            .find(|p| p.contains(&format!("/asset-{id}.")))
            .unwrap_or_else(|| panic!("no committed page for {spec}"));
        let page = std::fs::read(f.store().join(file)).unwrap();
        assert_eq!(page, env.asset(spec).unwrap(), "{file}");
        assert_eq!(blake3::hash(&page).to_hex().as_str(), id);
    }
}

/// How many running processes name `dir` on their command line (a browser's profile in it).
fn browsers_under(dir: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .filter(|c| String::from_utf8_lossy(c).contains(dir))
        .count()
}

/// The rows of a query over the fixture's store, as JSON objects.
fn json_rows(f: &Fixture, query: &str) -> Vec<Value> {
    let out = f.rla(&["sql", "--format", "json", query]).ok().stdout;
    match serde_json::from_str::<Value>(&out) {
        Ok(Value::Array(a)) => a,
        _ => out
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect(),
    }
}

/// The OpenAI-compatible adapter on web tasks: the environment model is shown the spec's JSON
/// Schema; a rewrite outside it (a knob past its bound) is refused with the reason and asked
/// again; the valid rewrite becomes a candidate, judged in the next iteration.
#[test]
fn web_rewrites_by_an_environment_model_are_checked_against_the_spec_schema() {
    chromium();
    let f = Fixture::new();
    let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
    let log = bodies.clone();
    let url = crate::chat_server(move |_, body| {
        log.lock().unwrap().push(body.clone());
        let messages = body["messages"].as_array().unwrap();
        let system = messages[0]["content"].as_str().unwrap();
        if system.contains("failed rollout") {
            return "\\boxed{It clicked the wrong button.}".to_string();
        }
        let user = messages[1]["content"].as_str().unwrap();
        let mut spec: Value = serde_json::from_str(user.lines().nth(1).unwrap()).unwrap();
        if messages.len() == 2 {
            spec["elements"] = 99.into();
        } else {
            let e = spec["elements"].as_u64().unwrap();
            spec["elements"] = if user.contains("Direction: easier") {
                e.saturating_sub(1).max(2)
            } else {
                e + 1
            }
            .into();
            spec["seed"] = (spec["seed"].as_u64().unwrap() + 1).into();
        }
        spec.to_string()
    });
    let endpoint = format!("adapt.openai.endpoint=\"{url}\"");
    let mut sets = small_slow_env(4);
    sets.extend([
        "pretrain.enabled=false".into(),
        "adapt.adapter=\"openai\"".into(),
        "adapt.openai.api_key_env=\"\"".into(),
        endpoint,
    ]);
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let args = f.pipeline_args(WEB, "llm", 2, &sets);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    f.rla(&args).ok();
    let bodies = bodies.lock().unwrap();
    let rewrites: Vec<&Value> = bodies
        .iter()
        .filter(|b| {
            b["messages"][0]["content"]
                .as_str()
                .unwrap()
                .contains("You rewrite")
        })
        .collect();
    assert!(!rewrites.is_empty(), "no rewrite was asked for");
    for b in &rewrites {
        let system = b["messages"][0]["content"].as_str().unwrap();
        assert!(
            system.contains("JSON Schema") && system.contains("\"additionalProperties\":false"),
            "{system}"
        );
    }
    let retry = rewrites
        .iter()
        .find(|b| b["messages"].as_array().unwrap().len() == 4)
        .expect("the out-of-bounds rewrite is answered and retried");
    let why = retry["messages"][3]["content"].as_str().unwrap();
    assert!(why.contains("elements = 99 is outside 2..=12"), "{why}");
    let q = "SELECT count(*) FROM adaptations WHERE iter = 0 AND decision = 'pending' AND adapter = 'openai'";
    let pending = f.sql(q).ok().scalar();
    assert_ne!(pending, "0");
    let q =
        "SELECT count(*) FROM adaptations WHERE iter = 1 AND decision IN ('accepted', 'rejected')";
    assert_eq!(f.sql(q).ok().scalar(), pending);
}

/// `env.web.screenshots = true` (a warm start and iteration 0's rollout, 400-pixel window):
/// `rollout` commits a PNG of each step's page (`screenshot-<traj_id>-<step_idx>`) and of the
/// page after its last step (`step_idx` = its step count) for every trajectory of `steps`,
/// and the warm start the same for every episode of `demonstrations`
/// (`screenshot-demo-<purpose>-<episode>-<step_idx>`), each the window's viewport (1024
/// wide); the steps are those of the same run without the key, which commits no screenshot;
/// `replay --verify` of the iteration passes and counts them.
#[test]
fn screenshots_are_one_png_per_committed_step_and_replay_checks_their_names() {
    chromium();
    let f = Fixture::new();
    let mut sets = small_slow_env(2);
    sets.extend(
        [
            "env.web.window_height=400",
            "pretrain.tasks=1",
            "pretrain.policy_episodes=1",
            "pretrain.policy_epochs=1",
            "pretrain.rm_steps=3",
            "pretrain.rm_epochs=1",
        ]
        .map(String::from),
    );
    let run = |id: &str, extra: Option<&str>| {
        let mut sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        sets.extend(extra);
        let mut args = f.pipeline_args(WEB, id, 1, &sets);
        args.extend(["--until".to_string(), "rollout".to_string()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        f.rla(&args).ok();
    };
    run("shots", Some("env.web.screenshots=true"));
    run("plain", None);
    // The screenshots each run committed: name → bytes.
    let files = f.files();
    let screenshots = |run: &str| -> std::collections::BTreeMap<String, Vec<u8>> {
        let dir = format!("{run}/artifacts/iter=000000/");
        files
            .iter()
            .filter_map(|p| p.strip_prefix(&dir))
            .filter(|n| n.starts_with("screenshot-"))
            .map(|n| {
                let name = n.strip_suffix(".png").expect("a screenshot is a .png");
                let (name, _digest) = name.rsplit_once('.').unwrap();
                let bytes = std::fs::read(f.store().join(&dir).join(n)).unwrap();
                (name.to_string(), bytes)
            })
            .collect()
    };
    assert!(
        files
            .iter()
            .any(|p| p.starts_with("plain/artifacts/iter=000000/"))
    );
    assert!(screenshots("plain").is_empty());
    let shots = screenshots("shots");
    // What `steps` and `demonstrations` say there must be: each step, then the last page.
    let expected = |q: &str, key: &dyn Fn(&Value) -> String| {
        let rows = json_rows(&f, q);
        assert!(!rows.is_empty(), "{q}");
        let mut want = std::collections::BTreeSet::new();
        for r in rows {
            for k in 0..=r["n"].as_u64().unwrap() {
                want.insert(format!("screenshot-{}-{k}", key(&r)));
            }
        }
        want
    };
    let rollout = expected(
        "SELECT traj_id, count(*) AS n FROM steps WHERE run_id = 'shots' GROUP BY traj_id",
        &|r| r["traj_id"].as_str().unwrap().to_string(),
    );
    let demos = expected(
        "SELECT purpose, episode, count(*) AS n FROM demonstrations WHERE run_id = 'shots' \
         GROUP BY purpose, episode",
        &|r| format!("demo-{}-{}", r["purpose"].as_str().unwrap(), r["episode"]),
    );
    let names: std::collections::BTreeSet<String> = shots.keys().cloned().collect();
    assert_eq!(names, &rollout | &demos);
    // Each is what the window shows: 1024 wide, as high as the viewport of a 400-pixel window
    // (Chromium's headless window keeps part of its height for a frame it does not draw).
    let viewport = Web::new(WebConfig {
        chromium: chromium().display().to_string(),
        window_height: 400,
        ..WebConfig::default()
    })
    .start(&spec("click_button", 0))
    .unwrap()
    .viewport()
    .unwrap();
    assert_eq!(viewport.0, 1024);
    assert!((200..=400).contains(&viewport.1), "{viewport:?}");
    for (name, png) in &shots {
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{name}: a PNG signature");
        assert_eq!(&png[12..16], b"IHDR", "{name}: the IHDR chunk first");
        let be = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().unwrap());
        assert_eq!((be(16), be(20)), viewport, "{name}: width × height");
    }
    // Taking them changes no step.
    let steps = |run: &str| {
        json_rows(
            &f,
            &format!(
                "SELECT traj_id, step_idx, observation, action, next_observation \
                 FROM steps WHERE run_id = '{run}' ORDER BY traj_id, step_idx"
            ),
        )
    };
    assert_eq!(steps("shots"), steps("plain"));
    let r = f.rla(&[
        "replay",
        "--store",
        &f.store_arg(),
        "--run",
        "shots",
        "--iter",
        "0",
        "--verify",
    ]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    for line in [
        format!("screenshots:{}", rollout.len()),
        format!("screenshots:{}", demos.len()),
    ] {
        assert!(r.stdout.contains(&line), "{line}: {}", r.stdout);
    }
}

/// `Episode::screenshot`: a PNG with `env.web.screenshots`, through the same client as every
/// command (a killed browser is the same clean error); without the key `None`, and no command
/// is sent (a dead browser is not even noticed).
#[test]
fn a_screenshot_is_a_png_or_nothing_without_the_key() {
    let with = |screenshots: bool| {
        Web::new(WebConfig {
            chromium: chromium().display().to_string(),
            screenshots,
            ..WebConfig::default()
        })
    };
    let s = spec("pick_row", 0);
    let (on, off) = (with(true), with(false));
    let mut shot = on.reset(&s).unwrap();
    let png = shot.screenshot().unwrap().expect("a screenshot");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let mut plain = off.reset(&s).unwrap();
    assert_eq!(plain.screenshot().unwrap(), None);
    for env in [&on, &off] {
        let pid = env.browser_pid().expect("a browser runs");
        // SAFETY: kill(2) on the browser this test started.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    let e = shot.screenshot().unwrap_err().to_string();
    assert!(
        e.contains("chromium is gone") && e.contains("captureScreenshot"),
        "{e}"
    );
    assert_eq!(plain.screenshot().unwrap(), None);
}
