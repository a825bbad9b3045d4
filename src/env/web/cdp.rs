//! A headless Chromium driven over the Chrome DevTools Protocol through
//! `--remote-debugging-pipe`: the browser reads commands from its fd 3 and writes replies and
//! events to its fd 4, each a JSON message ended by a NUL byte. No socket, no port, no crate: two
//! pipes and `serde_json`.
//!
//! One [`Browser`] serves many episodes at once (the rollout's threads): each call carries its
//! id, a reader thread hands each reply to the caller waiting for that id, and every call has a
//! time limit. A browser that exits (crash, `kill -9`) or stops answering fails the calls waiting
//! on it with an error that says so, and is killed; [`Browser::alive`] tells the environment to
//! start a new one for the next episode.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::task::err;
use crate::error::{Error, Result};

/// The replies waited for, by call id; `None` once the browser is gone.
type Pending = Arc<Mutex<Option<HashMap<u64, mpsc::Sender<Value>>>>>;

/// A running headless Chromium.
pub struct Browser {
    child: Mutex<Child>,
    to_browser: Mutex<std::fs::File>,
    pending: Pending,
    next_id: AtomicU64,
    alive: Arc<AtomicBool>,
    /// Why the browser is gone, once it is (what the reader saw).
    gone: Arc<Mutex<Option<String>>>,
    timeout: Duration,
    _profile: tempfile::TempDir,
}

/// The first of these on `PATH`, or `configured` when set: Debian's `chromium`, then others.
pub fn find_chromium(configured: &str) -> Result<PathBuf> {
    if !configured.is_empty() {
        let p = PathBuf::from(configured);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(err(format!(
                "env.web.chromium = {configured:?}: no such file (install Debian's chromium: \
                 apt-get install chromium)"
            )))
        };
    }
    let paths = std::env::var_os("PATH").unwrap_or_default();
    ["chromium", "chromium-browser", "google-chrome", "chrome"]
        .iter()
        .find_map(|name| {
            std::env::split_paths(&paths)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
        .ok_or_else(|| {
            err(
                "no chromium on PATH: the web environment drives a headless Chromium \
                 (apt-get install chromium, or set env.web.chromium)",
            )
        })
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(err(format!("pipe: {}", std::io::Error::last_os_error())));
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

impl Browser {
    /// Start `chromium` headless with its own empty profile, no network (every host name
    /// resolves to nothing) and the DevTools pipe; each call then waits at most `timeout`.
    pub fn launch(chromium: &Path, timeout: Duration, window_height: u32) -> Result<Browser> {
        remove_stale_profiles(&std::env::temp_dir());
        let profile = tempfile::Builder::new()
            .prefix(&format!("{PROFILE_PREFIX}{}-", std::process::id()))
            .tempdir()
            .map_err(|e| err(format!("a profile directory: {e}")))?;
        let (cmd_read, cmd_write) = pipe()?;
        let (out_read, out_write) = pipe()?;
        let (r3, w4) = (cmd_read.as_raw_fd(), out_write.as_raw_fd());
        let mut command = Command::new(chromium);
        command
            .args([
                "--headless",
                "--remote-debugging-pipe",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                "--mute-audio",
                "--host-resolver-rules=MAP * ~NOTFOUND",
            ])
            .arg(format!("--window-size=1024,{window_height}"))
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            // Chromium's own temporary files (its singleton socket's directory) go inside the
            // profile, so they go with it.
            .env("TMPDIR", profile.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: between fork and exec only async-signal-safe calls (dup2) are made.
        unsafe {
            command.pre_exec(move || {
                // Copies above 10 first (the pipe's own descriptors may be 3 or 4), then
                // dup2 onto 3 and 4, which leaves those without O_CLOEXEC.
                let a = libc::fcntl(r3, libc::F_DUPFD_CLOEXEC, 10);
                let b = libc::fcntl(w4, libc::F_DUPFD_CLOEXEC, 10);
                if a < 0 || b < 0 || libc::dup2(a, 3) < 0 || libc::dup2(b, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .map_err(|e| err(format!("{}: {e}", chromium.display())))?;
        drop((cmd_read, out_write));
        let pending: Pending = Arc::new(Mutex::new(Some(HashMap::new())));
        let alive = Arc::new(AtomicBool::new(true));
        let gone = Arc::new(Mutex::new(None));
        let reader = BufReader::new(std::fs::File::from(out_read));
        {
            let (pending, alive, gone) = (pending.clone(), alive.clone(), gone.clone());
            std::thread::Builder::new()
                .name("chromium-reader".into())
                .spawn(move || read_replies(reader, &pending, &alive, &gone))
                .map_err(|e| err(format!("reader thread: {e}")))?;
        }
        let browser = Browser {
            child: Mutex::new(child),
            to_browser: Mutex::new(std::fs::File::from(cmd_write)),
            pending,
            next_id: AtomicU64::new(1),
            alive,
            gone,
            timeout,
            _profile: profile,
        };
        // The first call proves the pipe works (a browser that cannot start fails here).
        browser
            .call(None, "Browser.getVersion", json!({}))
            .map_err(|e| err(format!("{} did not start: {e}", chromium.display())))?;
        Ok(browser)
    }

    /// Whether the browser still answers (false once it exited or timed out).
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// One CDP command (on a page's session when `session` is set); its `result`.
    pub fn call(&self, session: Option<&str>, method: &str, params: Value) -> Result<Value> {
        if !self.alive() {
            return Err(self.dead_error(method));
        }
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = mpsc::channel();
        match self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            Some(map) => map.insert(id, tx),
            None => return Err(self.dead_error(method)),
        };
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = serde_json::to_vec(&msg).map_err(|e| err(e.to_string()))?;
        bytes.push(0);
        let wrote = self
            .to_browser
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .write_all(&bytes);
        if wrote.is_err() {
            self.kill("the pipe to it broke");
            return Err(self.dead_error(method));
        }
        match rx.recv_timeout(self.timeout) {
            Ok(reply) => {
                if let Some(e) = reply.get("error") {
                    Err(err(format!(
                        "{method}: {}",
                        e.get("message").and_then(Value::as_str).unwrap_or("error")
                    )))
                } else {
                    Ok(reply.get("result").cloned().unwrap_or(Value::Null))
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.kill(&format!(
                    "no answer to {method} within {:.1} s (hung; killed)",
                    self.timeout.as_secs_f64()
                ));
                Err(self.dead_error(method))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(self.dead_error(method)),
        }
    }

    fn dead_error(&self, method: &str) -> Error {
        let why = self
            .gone
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| "it exited".into());
        err(format!(
            "chromium is gone ({why}) during {method}; a new one starts for the next episode"
        ))
    }

    /// Kill the browser, failing every call that waits on it.
    pub fn kill(&self, why: &str) {
        {
            let mut g = self.gone.lock().unwrap_or_else(|e| e.into_inner());
            if g.is_none() {
                *g = Some(why.to_string());
            }
        }
        self.alive.store(false, Ordering::SeqCst);
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let _ = child.kill();
        let _ = child.wait();
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
    }

    /// The browser's process id (tests kill it).
    pub fn pid(&self) -> u32 {
        self.child.lock().unwrap_or_else(|e| e.into_inner()).id()
    }
}

impl Drop for Browser {
    /// Closed as a user closes it (`Browser.close`), so that it exits cleanly before its
    /// profile directory is removed; killed when it has not exited within two seconds.
    fn drop(&mut self) {
        if self.alive() {
            let bytes = br#"{"id":0,"method":"Browser.close","params":{}}"#;
            let mut pipe = self.to_browser.lock().unwrap_or_else(|e| e.into_inner());
            if pipe
                .write_all(bytes)
                .and_then(|()| pipe.write_all(&[0]))
                .is_ok()
            {
                let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
                let until = std::time::Instant::now() + Duration::from_secs(2);
                while matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        self.kill("closed");
    }
}

/// The profile directories' names: this prefix, the process id of the rla-pipe that made it,
/// `-`, random letters.
const PROFILE_PREFIX: &str = "rla-pipe-chromium-";

/// Remove the profile directories in `dir` whose rla-pipe process is gone: one killed with
/// `kill -9` (or a crash) could not remove its own. Its browser is gone too: Chromium exits
/// when its DevTools pipe closes. Best effort: a directory that cannot be removed stays.
fn remove_stale_profiles(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PROFILE_PREFIX))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<i32>().ok())
            .filter(|pid| *pid > 0)
        else {
            continue;
        };
        // SAFETY: signal 0 only asks whether the process exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The reader thread: replies to their callers; at EOF the browser is gone.
fn read_replies(
    mut reader: BufReader<std::fs::File>,
    pending: &Pending,
    alive: &AtomicBool,
    gone: &Mutex<Option<String>>,
) {
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(0, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if buf.last() == Some(&0) {
            buf.pop();
        }
        let Ok(msg) = serde_json::from_slice::<Value>(&buf) else {
            continue;
        };
        // Events (no id) are not needed: the environment reads the page's state itself.
        let Some(id) = msg.get("id").and_then(Value::as_u64) else {
            continue;
        };
        let tx = pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .and_then(|m| m.remove(&id));
        if let Some(tx) = tx {
            let _ = tx.send(msg);
        }
    }
    {
        let mut g = gone.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            *g = Some("it exited".into());
        }
    }
    alive.store(false, Ordering::SeqCst);
    pending.lock().unwrap_or_else(|e| e.into_inner()).take();
}

/// A page of its own: a fresh browser context (no cookies, storage or history shared with any
/// other episode) with one tab, attached with a flat session. Closed (context disposed) on drop.
pub struct Page {
    browser: Arc<Browser>,
    context: String,
    session: String,
}

impl Page {
    pub fn open(browser: Arc<Browser>) -> Result<Page> {
        let ctx = browser.call(None, "Target.createBrowserContext", json!({}))?;
        let context = str_field(&ctx, "browserContextId")?;
        let target = browser.call(
            None,
            "Target.createTarget",
            json!({ "url": "about:blank", "browserContextId": context }),
        )?;
        let target = str_field(&target, "targetId")?;
        let att = browser.call(
            None,
            "Target.attachToTarget",
            json!({ "targetId": target, "flatten": true }),
        )?;
        let session = str_field(&att, "sessionId")?;
        Ok(Page {
            browser,
            context,
            session,
        })
    }

    pub fn call(&self, method: &str, params: Value) -> Result<Value> {
        self.browser.call(Some(&self.session), method, params)
    }

    /// The process id of the browser the page lives in.
    pub fn browser_pid(&self) -> u32 {
        self.browser.pid()
    }

    /// Load `html` as the page's document and wait until it has loaded.
    pub fn load(&self, html: &str) -> Result<()> {
        let url = format!(
            "data:text/html;charset=utf-8;base64,{}",
            base64_encode(html.as_bytes())
        );
        self.call("Page.navigate", json!({ "url": url }))?;
        let started = std::time::Instant::now();
        loop {
            let ready = self.eval("document.readyState === 'complete' && !!window.__rla")?;
            if ready == Value::Bool(true) {
                return Ok(());
            }
            if started.elapsed() > self.browser.timeout {
                return Err(err(format!(
                    "the task's page did not finish loading within {:.1} s",
                    self.browser.timeout.as_secs_f64()
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A key pressed and released on the focused element, as a keyboard does (`Enter` types a
    /// carriage return, which submits a form from its field).
    pub fn press(&self, key: &str) -> Result<()> {
        let (code, text) = match key {
            "Enter" => (13, "\r"),
            "Tab" => (9, ""),
            _ => return Err(err(format!("press({key:?}): no such key here"))),
        };
        let mut down = json!({ "type": "keyDown", "key": key, "code": key,
                               "windowsVirtualKeyCode": code });
        if !text.is_empty() {
            down["text"] = json!(text);
        }
        self.call("Input.dispatchKeyEvent", down)?;
        self.call(
            "Input.dispatchKeyEvent",
            json!({ "type": "keyUp", "key": key, "code": key, "windowsVirtualKeyCode": code }),
        )?;
        Ok(())
    }

    /// A JavaScript expression's value (JSON).
    pub fn eval(&self, expr: &str) -> Result<Value> {
        let r = self.call(
            "Runtime.evaluate",
            json!({ "expression": expr, "returnByValue": true }),
        )?;
        if let Some(ex) = r.get("exceptionDetails") {
            return Err(err(format!("script {expr:?} threw: {ex}")));
        }
        Ok(r["result"].get("value").cloned().unwrap_or(Value::Null))
    }

    /// Call `function` (a JS function source) with `this` bound to a DOM node.
    pub fn call_on(&self, backend_node: i64, function: &str, args: Vec<Value>) -> Result<Value> {
        let obj = self.call("DOM.resolveNode", json!({ "backendNodeId": backend_node }))?;
        let object_id = obj["object"]["objectId"]
            .as_str()
            .ok_or_else(|| err(format!("node {backend_node} has no object")))?
            .to_string();
        let args: Vec<Value> = args.into_iter().map(|v| json!({ "value": v })).collect();
        let r = self.call(
            "Runtime.callFunctionOn",
            json!({ "objectId": object_id, "functionDeclaration": function,
                    "arguments": args, "returnByValue": true }),
        )?;
        if let Some(ex) = r.get("exceptionDetails") {
            return Err(err(format!("script on node {backend_node} threw: {ex}")));
        }
        Ok(r["result"].get("value").cloned().unwrap_or(Value::Null))
    }

    /// A real mouse click at the centre of a node (scrolled into view first).
    pub fn click(&self, backend_node: i64) -> Result<()> {
        self.call(
            "DOM.scrollIntoViewIfNeeded",
            json!({ "backendNodeId": backend_node }),
        )?;
        let b = self.call("DOM.getBoxModel", json!({ "backendNodeId": backend_node }))?;
        let q = b["model"]["content"]
            .as_array()
            .ok_or_else(|| err(format!("node {backend_node} has no box")))?;
        let n = |i: usize| q.get(i).and_then(Value::as_f64).unwrap_or(0.0);
        let (x, y) = (
            (n(0) + n(2) + n(4) + n(6)) / 4.0,
            (n(1) + n(3) + n(5) + n(7)) / 4.0,
        );
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({ "type": kind, "x": x, "y": y, "button": "left", "clickCount": 1 }),
            )?;
        }
        Ok(())
    }

    /// A PNG of the window as it shows the page now (`Page.captureScreenshot`: the viewport,
    /// 1024 × the window's height), under the same time limit as every command.
    pub fn screenshot(&self) -> Result<Vec<u8>> {
        let r = self.call("Page.captureScreenshot", json!({ "format": "png" }))?;
        let data = r
            .get("data")
            .and_then(Value::as_str)
            .ok_or_else(|| err("Page.captureScreenshot: a reply without data"))?;
        let png = base64_decode(data)
            .ok_or_else(|| err("Page.captureScreenshot: its data is not base64"))?;
        if !png.starts_with(PNG_SIGNATURE) {
            return Err(err("Page.captureScreenshot: its data is not a PNG"));
        }
        Ok(png)
    }

    /// The page's accessibility tree (`Accessibility.getFullAXTree`'s nodes).
    pub fn ax_tree(&self) -> Result<Vec<Value>> {
        let r = self.call("Accessibility.getFullAXTree", json!({}))?;
        Ok(r["nodes"].as_array().cloned().unwrap_or_default())
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        if self.browser.alive() {
            let _ = self.browser.call(
                None,
                "Target.disposeBrowserContext",
                json!({ "browserContextId": self.context }),
            );
        }
    }
}

fn str_field(v: &Value, k: &str) -> Result<String> {
    v.get(k)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| err(format!("CDP reply without {k}: {v}")))
}

/// The 8 bytes every PNG file starts with.
const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

/// Standard base64 decoded (a screenshot's data); `None` where `text` is not base64 (padding
/// optional).
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        Some(u32::from(v))
    };
    let body = text.trim_end_matches('=');
    if text.len() - body.len() > 2 || body.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() / 4 * 3 + 2);
    for chunk in body.as_bytes().chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= value(*c)? << (18 - 6 * i);
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..chunk.len() - 1]);
    }
    Some(out)
}

/// Standard base64 (the data URL of a page).
fn base64_encode(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= c.len() {
                out.push(A[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{PROFILE_PREFIX, base64_decode, base64_encode, remove_stale_profiles};

    /// Only the profiles of processes that are gone are removed; a name of any other shape is
    /// left alone.
    #[test]
    fn stale_profiles_are_those_of_processes_that_are_gone() {
        let dir = tempfile::tempdir().unwrap();
        let mut exited = std::process::Command::new("true").spawn().unwrap();
        exited.wait().unwrap();
        let dead = format!("{PROFILE_PREFIX}{}-aB3xYz", exited.id());
        let mine = format!("{PROFILE_PREFIX}{}-aB3xYz", std::process::id());
        let others = [
            mine.as_str(),
            "rla-pipe-chromium-aB3xYz",
            "rla-pipe-chromium-12",
        ];
        for name in others.into_iter().chain([dead.as_str()]) {
            std::fs::create_dir_all(dir.path().join(name).join("Default")).unwrap();
        }
        remove_stale_profiles(dir.path());
        assert!(!dir.path().join(&dead).exists());
        for name in others {
            assert!(dir.path().join(name).exists(), "{name}");
        }
    }

    #[test]
    fn base64_matches_the_rfc_vectors() {
        for (plain, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64_encode(plain.as_bytes()), enc);
            assert_eq!(base64_decode(enc).as_deref(), Some(plain.as_bytes()));
        }
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(base64_decode(&base64_encode(&bytes)), Some(bytes));
        for bad in ["Zg=a", "Z", "Zm9v!", "Zg===", "Zm9vY==="] {
            assert_eq!(base64_decode(bad), None, "{bad}");
        }
    }
}
