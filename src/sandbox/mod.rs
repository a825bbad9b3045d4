//! Running untrusted programs (the coding setting's policy programs against tests): each run in
//! its own process tree, never in rla-pipe's process, with no network.
//!
//! Isolation `namespaces` (the default): `unshare` gives every run fresh network, PID, mount, IPC
//! and UTS namespaces (a user namespace too where rla-pipe is not root), whose first process
//! (init) is the supervisor `jail.py`, run by the system's Python. It builds a root of its own on
//! a size-limited tmpfs (the system's `/usr`, `/lib*`, `/bin`, `/sbin` read-only,
//! `/etc/ld.so.cache`, `/dev/{null,zero,urandom,random}`, an empty `/tmp` holding the program),
//! `pivot_root`s into it and unmounts the old root, then forks the program into a session of its
//! own with resource limits (address space `memory_mib`, processes `max_processes`, file size,
//! CPU seconds, open files, no core dumps), an empty environment, no capability left (bounding
//! set emptied, securebits locked, `no_new_privs`), an unprivileged uid of its own per worker
//! slot (as root), and a seccomp filter refusing the calls a jailbreak needs (chroot, mount,
//! unshare, setns, ptrace, keyctl, bpf, perf_event_open, io_uring, clone into new namespaces, …).
//! The supervisor keeps the wall-clock limit: when the program's first process ends or its time
//! is up, it kills every process of the namespace and exits, and the kernel kills whatever is
//! left with it. As init it cannot be killed from inside. It reports how the program ended in the
//! run's status file, out of the program's reach. Stdout is read up to `max_output_bytes`; past
//! it the pipe is closed (the program dies of SIGPIPE, or at its limit). The threat model, and
//! what this does not promise, is in the book's coding chapter.
//!
//! Isolation `none` runs programs as plain child processes with the same limits where they apply
//! (no network or filesystem isolation): only for trusted programs, and only when the config
//! says so. A sandbox checks at start that the isolation it promises is in force (no network, no
//! view of the machine's files, no chroot) and refuses to run otherwise.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Checks, Error, Result};

/// The jail (run by `sh` inside the namespaces).
const JAIL: &str = include_str!("jail.py");
/// How long past twice its limit a jailed run may go before rla-pipe kills its supervisor.
const BACKSTOP: Duration = Duration::from_secs(20);
/// The first uid of the unprivileged users runs get (one per worker slot), as root.
const FIRST_UID: u32 = 61000;
/// Bytes of a run's stderr kept (its end).
const STDERR_TAIL: usize = 4096;

/// How programs are isolated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// Linux namespaces and a private root (see the module docs).
    Namespaces,
    /// None: plain child processes (trusted programs only).
    None,
}

/// The sandbox's settings (`[env.coding.sandbox]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxConfig {
    /// `namespaces` (default) or `none` (no isolation: trusted programs only).
    pub isolation: Isolation,
    /// The interpreter, looked up inside the sandbox (`/usr/bin`, `/bin`): the system's Python.
    pub python: String,
    /// Address-space limit of a run, MiB.
    pub memory_mib: u64,
    /// Processes a run may have at once (a fork bomb stops there).
    pub max_processes: u32,
    /// Stdout bytes kept; a run writing more is killed (`output_limit`).
    pub max_output_bytes: u64,
    /// The largest file a run may write, MiB (inside its tmpfs).
    pub max_file_mib: u64,
    /// Size of a run's private tmpfs (its root and `/tmp`), MiB.
    pub tmpfs_mib: u64,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            isolation: Isolation::Namespaces,
            python: "python3".into(),
            memory_mib: 512,
            max_processes: 16,
            max_output_bytes: 1 << 20,
            max_file_mib: 16,
            tmpfs_mib: 64,
        }
    }
}

impl SandboxConfig {
    /// The section's checks (keys under `prefix`).
    pub fn validate(&self, prefix: &str, c: &mut Checks) {
        let key = |k: &str| format!("{prefix}.{k}");
        c.check(
            self.memory_mib >= 32,
            &key("memory_mib"),
            "must be at least 32",
        );
        c.check(
            self.max_processes >= 1,
            &key("max_processes"),
            "must be at least 1",
        );
        c.check(
            self.max_output_bytes >= 1,
            &key("max_output_bytes"),
            "must be at least 1",
        );
        c.check(self.tmpfs_mib >= 8, &key("tmpfs_mib"), "must be at least 8");
        c.check(
            !self.python.is_empty() && !self.python.contains(char::is_whitespace),
            &key("python"),
            "must name an interpreter (no spaces)",
        );
    }
}

/// How a run ended. Whether its output is right is the caller's business.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Exited with status 0.
    Ok,
    /// Ran past its wall-clock (or CPU) limit and was killed.
    Timeout,
    /// Exited otherwise (an exception, a signal, a non-zero status).
    Crash,
    /// Ran out of its memory limit.
    Memory,
    /// Wrote more than `max_output_bytes` to stdout and was killed.
    OutputLimit,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Timeout => "timeout",
            Status::Crash => "crash",
            Status::Memory => "memory",
            Status::OutputLimit => "output_limit",
        }
    }
}

/// A finished run.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub status: Status,
    /// Stdout (at most `max_output_bytes`, lossily UTF-8).
    pub stdout: String,
    /// The end of stderr.
    pub stderr: String,
    /// Wall-clock seconds of the program (isolation `namespaces`: from its supervisor's fork to
    /// its end, the jail's own setup excluded).
    pub seconds: f64,
}

/// Runs programs under a [`SandboxConfig`], its isolation checked at creation.
#[derive(Debug, Clone)]
pub struct Sandbox {
    cfg: SandboxConfig,
    root: bool,
}

impl Sandbox {
    /// A sandbox whose isolation is in force: with `namespaces`, a probe program must find no
    /// network and none of this machine's files, or this is an error saying what failed and
    /// which key turns isolation off.
    pub fn new(cfg: SandboxConfig) -> Result<Sandbox> {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let sandbox = Sandbox { cfg, root };
        if sandbox.cfg.isolation == Isolation::Namespaces {
            sandbox.probe()?;
        }
        Ok(sandbox)
    }

    /// What isolation is in force, in words (for logs and the stage's record).
    pub fn describe(&self) -> String {
        match self.cfg.isolation {
            Isolation::None => "none (plain child processes, resource limits only)".into(),
            Isolation::Namespaces => format!(
                "namespaces (network, pid, mount, ipc, uts{}; pivot_root into a private root on \
                 tmpfs; no capabilities, no_new_privs, seccomp; {})",
                if self.root { "" } else { ", user" },
                if self.root {
                    "an unprivileged uid per slot"
                } else {
                    "uid 0 of the user namespace"
                }
            ),
        }
    }

    fn probe(&self) -> Result<()> {
        let marker = tempfile::Builder::new()
            .prefix("rla-pipe-sandbox-probe-")
            .tempfile()
            .map_err(|e| Error::Environment(format!("sandbox: a probe file: {e}")))?;
        let program = format!(
            "import os, socket\n\
             try:\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\n    net = 'reachable'\n\
             except OSError as e:\n    net = 'unreachable' if e.errno == 101 else 'error %s' % e.errno\n\
             try:\n    os.chroot('/tmp')\n    root = 'chroot'\n\
             except OSError:\n    root = 'jailed'\n\
             print(net, os.path.exists({:?}), root)\n",
            marker.path().display().to_string()
        );
        let out = self.run(0, &program, "", Duration::from_secs(20))?;
        let fix = "set env.coding.sandbox.isolation = \"none\" only for trusted programs";
        if out.status != Status::Ok {
            return Err(Error::Environment(format!(
                "sandbox: isolation `namespaces` is not available on this machine (the probe program ended {}: {}); {fix}",
                out.status.as_str(),
                out.stderr.trim()
            )));
        }
        if out.stdout.trim() != "unreachable False jailed" {
            return Err(Error::Environment(format!(
                "sandbox: the isolation is not in force (a probe program reported network/file/chroot {:?}); {fix}",
                out.stdout.trim()
            )));
        }
        Ok(())
    }

    /// Run `program` (Python source) with `stdin`, for at most `limit` of wall-clock time.
    /// `slot` (0, 1, … per concurrent run) picks the run's uid. An error means the sandbox
    /// itself failed (it could not start or set up), never the program.
    pub fn run(&self, slot: usize, program: &str, stdin: &str, limit: Duration) -> Result<Outcome> {
        let work = tempfile::Builder::new()
            .prefix("rla-pipe-run-")
            .tempdir()
            .map_err(|e| Error::Environment(format!("sandbox: a temporary directory: {e}")))?;
        let io = |e: std::io::Error| {
            Error::Environment(format!("sandbox: {}: {e}", work.path().display()))
        };
        std::fs::write(work.path().join("main.py"), program).map_err(io)?;
        std::fs::create_dir(work.path().join("root")).map_err(io)?;
        let cpu = limit.as_secs().max(1) + 1;
        let mut cmd = match self.cfg.isolation {
            Isolation::Namespaces => {
                let mut c = Command::new("unshare");
                c.args([
                    "--net",
                    "--pid",
                    "--fork",
                    "--kill-child",
                    "--mount",
                    "--ipc",
                    "--uts",
                ]);
                if !self.root {
                    c.args(["--user", "--map-root-user"]);
                }
                let uid = if self.root {
                    (FIRST_UID + slot as u32).to_string()
                } else {
                    String::new()
                };
                // The supervisor and the program run the same Python, found once.
                let python = interpreter(&self.cfg.python);
                c.arg(&python)
                    .args(["-I", "-S", "-c", JAIL])
                    .arg(work.path())
                    .arg(uid)
                    .arg((self.cfg.memory_mib << 20).to_string())
                    .arg(self.cfg.max_processes.to_string())
                    .arg((self.cfg.max_file_mib << 20).to_string())
                    .arg(cpu.to_string())
                    .arg(self.cfg.tmpfs_mib.to_string())
                    .arg(&python)
                    .arg(format!("{:.3}", limit.as_secs_f64()));
                c
            }
            Isolation::None => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--as={}", self.cfg.memory_mib << 20))
                    .arg(format!("--fsize={}", self.cfg.max_file_mib << 20))
                    .arg(format!("--cpu={cpu}"))
                    .args(["--core=0", "--nofile=64", "--"])
                    .arg(&self.cfg.python)
                    .args(["-E", "-s", "main.py"])
                    .current_dir(work.path())
                    .env_clear()
                    .env("PATH", "/usr/bin:/bin")
                    .env("HOME", work.path())
                    .env("TMPDIR", work.path());
                c
            }
        };
        use std::os::unix::process::CommandExt;
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let started = Instant::now();
        let mut child = cmd.spawn().map_err(|e| {
            Error::Environment(format!(
                "sandbox: cannot start {:?}: {e}",
                cmd.get_program()
            ))
        })?;
        let pgid = child.id() as i32;
        let kill = move || {
            // SAFETY: signals the run's own process group (created for it above).
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        };
        let mut input = child.stdin.take().expect("piped");
        let stdin = stdin.to_string();
        let feeder = std::thread::spawn(move || {
            // A program that does not read its input closes the pipe: not an error.
            let _ = input.write_all(stdin.as_bytes());
        });
        let max = self.cfg.max_output_bytes as usize;
        let mut out = child.stdout.take().expect("piped");
        let (over_tx, over_rx) = std::sync::mpsc::channel::<()>();
        let reader = std::thread::spawn(move || {
            let mut kept = Vec::new();
            let mut buf = [0u8; 1 << 16];
            let mut over = false;
            loop {
                match out.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if kept.len() + n > max {
                            kept.extend_from_slice(&buf[..max - kept.len()]);
                            over = true;
                            let _ = over_tx.send(());
                            break;
                        }
                        kept.extend_from_slice(&buf[..n]);
                    }
                }
            }
            (kept, over)
        });
        let mut err = child.stderr.take().expect("piped");
        let err_reader = std::thread::spawn(move || {
            let mut tail: Vec<u8> = Vec::new();
            let mut buf = [0u8; 1 << 14];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > 2 * STDERR_TAIL {
                    tail.drain(..tail.len() - STDERR_TAIL);
                }
            }
            tail
        });
        let jailed = self.cfg.isolation == Isolation::Namespaces;
        // The supervisor keeps the program's limit; this one only catches a supervisor that
        // never reports (isolation `none` has no supervisor: its limit is this one).
        let backstop = if jailed { limit * 2 + BACKSTOP } else { limit };
        let mut killed = false;
        let exit = loop {
            if let Some(s) = child
                .try_wait()
                .map_err(|e| Error::Environment(format!("sandbox: waiting for a run: {e}")))?
            {
                break s;
            }
            // Past the output limit the reader has closed the pipe: a jailed program dies of
            // SIGPIPE at its next write (or, ignoring it, at its limit) and its supervisor
            // reports as ever; killing the supervisor instead would leave it a zombie for the
            // machine's init to reap. Without a supervisor, the group is killed.
            if over_rx.try_recv().is_ok() && !jailed {
                kill();
            } else if started.elapsed() >= backstop {
                killed = true;
                kill();
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        let mut seconds = started.elapsed().as_secs_f64();
        // Whatever is left of the group (with isolation `none`; a jailed run's processes died
        // with the namespace's init, and its group's id may already be another's).
        if !jailed {
            kill();
        }
        let _ = feeder.join();
        let (stdout, over) = reader.join().expect("stdout reader");
        let tail = err_reader.join().expect("stderr reader");
        let start = tail.len().saturating_sub(STDERR_TAIL);
        let stderr = String::from_utf8_lossy(&tail[start..]).to_string();
        use std::os::unix::process::ExitStatusExt;
        let end = if jailed {
            let report = std::fs::read_to_string(work.path().join("status")).unwrap_or_default();
            match parse_report(&report) {
                Some(Report::Setup(why)) => {
                    return Err(Error::Environment(format!(
                        "sandbox: setting up a run failed: {why}"
                    )));
                }
                Some(Report::End(end, program_seconds)) => {
                    seconds = program_seconds;
                    end
                }
                None if killed => End::Timeout,
                None if over => End::Signal(libc::SIGKILL),
                None => {
                    return Err(Error::Environment(format!(
                        "sandbox: the supervisor ended ({exit}) without a report: {}",
                        stderr.trim()
                    )));
                }
            }
        } else if killed {
            End::Timeout
        } else if let Some(signal) = exit.signal() {
            End::Signal(signal)
        } else {
            End::Exit(exit.code().unwrap_or(-1))
        };
        let status = if over {
            Status::OutputLimit
        } else {
            match end {
                End::Timeout | End::Signal(libc::SIGXCPU) => Status::Timeout,
                End::Exit(0) => Status::Ok,
                // A signal the program sent itself or its processes (SIGKILL too) is a crash.
                _ if stderr.contains("MemoryError") => Status::Memory,
                _ => Status::Crash,
            }
        };
        Ok(Outcome {
            status,
            stdout: String::from_utf8_lossy(&stdout).to_string(),
            stderr,
            seconds,
        })
    }
}

/// The interpreter's path, looked up where the jail's root has it (`/usr/bin`, `/bin`,
/// `/usr/local/bin`), not wherever `PATH` finds it first (a version manager's shim costs a shell
/// per run, and is not in the jail). A name found nowhere is passed on as it is, and the jail
/// reports it missing.
fn interpreter(name: &str) -> std::path::PathBuf {
    if name.contains('/') {
        return name.into();
    }
    ["/usr/bin", "/bin", "/usr/local/bin"]
        .iter()
        .map(|d| std::path::Path::new(d).join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| name.into())
}

/// How a run's program ended, as its supervisor saw it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum End {
    Exit(i32),
    Signal(i32),
    Timeout,
}

/// The supervisor's report (`jail.py`): one line in the run's status file.
#[derive(Debug, Clone, PartialEq)]
enum Report {
    End(End, f64),
    Setup(String),
}

fn parse_report(text: &str) -> Option<Report> {
    let line = text.lines().next()?;
    if let Some(why) = line.strip_prefix("setup ") {
        return Some(Report::Setup(why.to_string()));
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    let number = |i: usize| words.get(i).and_then(|w| w.parse::<i32>().ok());
    let seconds = |i: usize| words.get(i).and_then(|w| w.parse::<f64>().ok());
    match words.first()? {
        &"exit" => Some(Report::End(End::Exit(number(1)?), seconds(2)?)),
        &"signal" => Some(Report::End(End::Signal(number(1)?), seconds(2)?)),
        &"timeout" => Some(Report::End(End::Timeout, seconds(1)?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox() -> Sandbox {
        Sandbox::new(SandboxConfig {
            max_output_bytes: 10_000,
            max_processes: 8,
            memory_mib: 256,
            ..Default::default()
        })
        .expect("isolation `namespaces` works on this machine (root or user namespaces)")
    }

    /// Processes (of any user) whose uid is `uid`, from /proc.
    fn processes_of(uid: u32) -> usize {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("status")).ok())
            .filter(|s| {
                s.lines()
                    .find(|l| l.starts_with("Uid:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|u| u.parse::<u32>().ok())
                    == Some(uid)
            })
            .count()
    }

    /// The supervisor's report: one line; anything else is no report (the stage then fails,
    /// naming the supervisor).
    #[test]
    fn supervisor_reports_parse() {
        assert_eq!(
            parse_report("exit 3 0.250000\n"),
            Some(Report::End(End::Exit(3), 0.25))
        );
        assert_eq!(
            parse_report("signal 9 1.5\n"),
            Some(Report::End(End::Signal(9), 1.5))
        );
        assert_eq!(
            parse_report("timeout 2.000001\n"),
            Some(Report::End(End::Timeout, 2.000001))
        );
        assert_eq!(
            parse_report("setup pivot_root: Operation not permitted\n"),
            Some(Report::Setup("pivot_root: Operation not permitted".into()))
        );
        for bad in ["", "exit", "exit x 1", "exit 0", "crash 1 1", "\nexit 0 1"] {
            assert_eq!(parse_report(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_program_reads_stdin_and_writes_stdout() {
        let s = sandbox();
        let o = s
            .run(
                0,
                "a, b = map(int, input().split())\nprint(a + b)\n",
                "5 7\n",
                Duration::from_secs(10),
            )
            .unwrap();
        assert_eq!((o.status, o.stdout.as_str()), (Status::Ok, "12\n"), "{o:?}");
        let o = s
            .run(0, "raise ValueError('no')\n", "", Duration::from_secs(10))
            .unwrap();
        assert_eq!(o.status, Status::Crash);
        assert!(o.stderr.contains("ValueError: no"), "{o:?}");
        // An unread large input is not an error.
        let o = s
            .run(
                0,
                "print('x')\n",
                &"1 ".repeat(500_000),
                Duration::from_secs(10),
            )
            .unwrap();
        assert_eq!(o.status, Status::Ok);
        assert!(s.describe().starts_with("namespaces"));
    }

    /// Hostile programs: each contained, recorded, and the machine still answers at once.
    #[test]
    fn hostile_programs_are_contained() {
        let s = sandbox();
        // A slot (uid) of its own: no other test runs programs under it.
        const SLOT: usize = 63;
        let limit = Duration::from_secs(2);
        // Sleeping past the limit.
        let o = s
            .run(SLOT, "import time\ntime.sleep(60)\n", "", limit)
            .unwrap();
        assert_eq!(o.status, Status::Timeout, "{o:?}");
        assert!(o.seconds < 4.0, "killed at the limit: {}", o.seconds);
        // Infinite output.
        let o = s
            .run(SLOT, "while True:\n    print('y' * 1000)\n", "", limit)
            .unwrap();
        assert_eq!(o.status, Status::OutputLimit, "{o:?}");
        assert_eq!(o.stdout.len(), 10_000);
        // Memory.
        let o = s.run(SLOT, "x = bytearray(1 << 30)\n", "", limit).unwrap();
        assert_eq!(o.status, Status::Memory, "{o:?}");
        // A fork bomb: stopped at the process limit, killed at the time limit, nothing left.
        let o = s
            .run(SLOT, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", "", limit)
            .unwrap();
        assert!(matches!(o.status, Status::Timeout | Status::Crash), "{o:?}");
        assert!(o.seconds < 4.0, "{}", o.seconds);
        if s.root {
            // Killed processes are reaped by the kernel shortly after the namespace's init.
            let t = Instant::now();
            while processes_of(FIRST_UID + SLOT as u32) > 0 && t.elapsed() < Duration::from_secs(5)
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            assert_eq!(
                processes_of(FIRST_UID + SLOT as u32),
                0,
                "the bomb's processes are gone"
            );
        }
        let t = Instant::now();
        let o = s.run(SLOT, "print('still here')\n", "", limit).unwrap();
        assert_eq!(o.stdout, "still here\n");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }

    /// Files: nothing of the machine is visible; writes stay in the run's tmpfs.
    #[test]
    fn files_outside_the_sandbox_are_out_of_reach() {
        let s = sandbox();
        let host = tempfile::tempdir().unwrap();
        let secret = host.path().join("secret.txt");
        std::fs::write(&secret, "the secret").unwrap();
        let outside = host.path().join("written.txt");
        let program = format!(
            "import os\n\
             for p in [{secret:?}, '/etc/passwd', '/root/.bashrc', '/proc/self/environ', {manifest:?}]:\n    \
                 try:\n        print(p, open(p).read()[:20])\n    except OSError as e:\n        print(p, 'no', e.errno)\n\
             for p in [{outside:?}, '/usr/evil', '/written']:\n    \
                 try:\n        open(p, 'w').write('x')\n        print(p, 'wrote')\n    except OSError as e:\n        print(p, 'no', e.errno)\n\
             open('/tmp/mine', 'w').write('ok')\n\
             print('tmp', open('/tmp/mine').read(), sorted(os.listdir('/')))\n",
            secret = secret.display().to_string(),
            manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"),
            outside = outside.display().to_string(),
        );
        let o = s.run(0, &program, "", Duration::from_secs(10)).unwrap();
        assert_eq!(o.status, Status::Ok, "{o:?}");
        assert!(
            !o.stdout.contains("the secret") && !o.stdout.contains("[package]"),
            "{}",
            o.stdout
        );
        assert!(!o.stdout.contains("wrote"), "{}", o.stdout);
        assert!(o.stdout.contains("tmp ok"), "{}", o.stdout);
        assert!(
            !o.stdout.contains("'root'") && !o.stdout.contains("'home'"),
            "{}",
            o.stdout
        );
        assert!(!outside.exists());
        assert!(
            !std::path::Path::new("/usr/evil").exists()
                && !std::path::Path::new("/written").exists()
        );
    }

    #[test]
    fn there_is_no_network() {
        let s = sandbox();
        let o = s
            .run(
                0,
                "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 22), timeout=1)\n    print('connected')\nexcept OSError as e:\n    print(e.errno)\n",
                "",
                Duration::from_secs(10),
            )
            .unwrap();
        assert_eq!(o.stdout.trim(), "101", "Network is unreachable: {o:?}");
    }
}
