//! Issue 47: hostile programs in the coding setting's sandbox, through `rla-pipe sandbox` (the
//! sandbox `execute` and `evaluate` run every program in), as root and as an unprivileged user
//! (user namespaces; as root the binary is started as `nobody`). Each asserts how the run is
//! recorded and that the host is untouched: marker files the program tries to write (in a
//! world-writable directory of the host, `/tmp` and `/dev/shm`), a secret it tries to read, a
//! listener on the loopback it tries to reach, and no process of the run's uid left after it.

use std::io::ErrorKind;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// Who starts rla-pipe.
#[derive(Debug, Clone, Copy, PartialEq)]
enum As {
    /// root: each run drops to a uid of its own (61000 + slot).
    Root,
    /// An unprivileged user (`nobody` when the tests run as root; else the invoking user): the
    /// run gets a user namespace, uid 0 inside with no capability.
    User,
}

const NOBODY: u32 = 65534;

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The legs a test runs: both as root, the unprivileged one otherwise.
fn legs() -> Vec<As> {
    if root() {
        vec![As::Root, As::User]
    } else {
        vec![As::User]
    }
}

/// Runs of the unprivileged leg, one at a time (the leftover check counts `nobody`'s processes).
static USER_LEG: Mutex<()> = Mutex::new(());

/// The binary, where `nobody` can run it (the build directory may be private to root).
fn binary(leg: As) -> PathBuf {
    static COPY: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let built = PathBuf::from(crate::rla_pipe_bin());
    if leg == As::Root || !root() {
        return built;
    }
    COPY.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let to = dir.path().join("rla-pipe");
        std::fs::copy(&built, &to).unwrap();
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
        (dir, to)
    })
    .1
    .clone()
}

/// What the host offers a program to attack: a world-writable directory with a secret, and a
/// listener on the loopback.
struct Host {
    dir: tempfile::TempDir,
    listener: TcpListener,
    /// Marker paths a program must not be able to create (checked absent at the end).
    markers: Vec<PathBuf>,
}

impl Host {
    fn new() -> Host {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let secret = dir.path().join("secret.txt");
        std::fs::write(&secret, "the host's secret").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let tag = dir
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .to_string();
        let markers = vec![
            dir.path().join("marker"),
            PathBuf::from(format!("/tmp/rla-pipe-marker-{tag}")),
            PathBuf::from(format!("/dev/shm/rla-pipe-marker-{tag}")),
        ];
        Host {
            dir,
            listener,
            markers,
        }
    }

    fn secret(&self) -> String {
        self.dir.path().join("secret.txt").display().to_string()
    }

    fn port(&self) -> u16 {
        self.listener.local_addr().unwrap().port()
    }

    /// Python: try to write every marker and read the secret, printing what happened.
    fn attack_files(&self) -> String {
        let markers: Vec<String> = self
            .markers
            .iter()
            .map(|m| format!("{:?}", m.display().to_string()))
            .collect();
        format!(
            "for _p in [{markers}]:\n    try:\n        open(_p, 'w').write('x')\n        print('wrote', _p)\n    except OSError as _e:\n        print('no write', _e.errno)\n\
             try:\n    print('read', open({secret:?}).read())\nexcept OSError as _e:\n    print('no read', _e.errno)\n",
            markers = markers.join(", "),
            secret = self.secret(),
        )
    }

    /// The program's report of [`Self::attack_files`] shows nothing of the host read or written
    /// (its own `/tmp` is its sandbox's: writing there is allowed).
    fn assert_attack_failed(&self, what: &str, stdout: &str) {
        assert!(!stdout.contains("the host's secret"), "{what}: {stdout}");
        for m in [&self.markers[0], &self.markers[2]] {
            assert!(
                !stdout.contains(&format!("wrote {}", m.display())),
                "{what}: {stdout}"
            );
        }
    }

    /// The host is untouched: no marker, nothing connected to the listener.
    fn assert_untouched(&self, what: &str) {
        for m in &self.markers {
            assert!(!m.exists(), "{what}: {} was written", m.display());
        }
        match self.listener.accept() {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            other => panic!("{what}: the loopback listener was reached: {other:?}"),
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        for m in &self.markers {
            let _ = std::fs::remove_file(m);
        }
    }
}

/// Processes whose real uid is `uid`.
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

/// A finished `rla-pipe sandbox` run.
#[derive(Debug)]
struct Run {
    status: String,
    stdout: String,
    stderr: String,
    /// Wall-clock seconds of the whole command.
    wall: f64,
}

/// Run `program` in the sandbox as `leg`, with a `timeout` in seconds, on worker `slot`
/// (a uid of its own as root: no other test uses slots 40 and up). Returns once the command
/// has exited, after checking that no process of the run's uid is left.
fn run(host: &Host, leg: As, slot: usize, program: &str, timeout: f64) -> Run {
    let _one = (leg == As::User).then(|| USER_LEG.lock().unwrap_or_else(|e| e.into_inner()));
    let file = host.dir.path().join(format!("program-{slot}.py"));
    std::fs::write(&file, program).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let mut cmd = if leg == As::User && root() {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid",
            &NOBODY.to_string(),
            "--regid",
            &NOBODY.to_string(),
            "--clear-groups",
        ])
        .arg(binary(leg));
        c
    } else {
        Command::new(binary(leg))
    };
    cmd.arg("sandbox")
        .arg(&file)
        .args(["--timeout", &timeout.to_string(), "--format", "json"])
        .args(["--slot", &slot.to_string()])
        .env_remove("RUST_LOG")
        .current_dir(host.dir.path());
    let t = Instant::now();
    let out = cmd.output().unwrap();
    let wall = t.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{leg:?}: rla-pipe sandbox failed: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let uid = match leg {
        As::Root => Some(61000 + slot as u32),
        As::User if root() => Some(NOBODY),
        As::User => None,
    };
    if let Some(uid) = uid {
        assert_eq!(
            processes_of(uid),
            0,
            "{leg:?}: no process of uid {uid} outlives the run"
        );
    }
    Run {
        status: v["status"].as_str().unwrap().to_string(),
        stdout: v["stdout"].as_str().unwrap().to_string(),
        stderr: v["stderr"].as_str().unwrap().to_string(),
        wall,
    }
}

/// Case 1: the classic chroot escape (chroot into a subdirectory, `..` many times, chroot
/// into `.`) is refused, as are the ways to a new root or namespace; nothing of the host is
/// read or written.
#[test]
fn sandbox_refuses_the_chroot_escape() {
    let host = Host::new();
    let program = format!(
        "import os, ctypes\n\
         os.makedirs('/tmp/jail', exist_ok=True)\n\
         try:\n    os.chroot('/tmp/jail')\n    for _ in range(64):\n        os.chdir('..')\n    os.chroot('.')\n    print('escaped')\n\
         except OSError as e:\n    print('chroot refused', e.errno)\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         def call(name, *args):\n    r = getattr(libc, name)(*args)\n    print(name, r, ctypes.get_errno())\n\
         call('unshare', 0x10000000)\n\
         call('unshare', 0x00020000)\n\
         call('mount', b'proc', b'/tmp/jail', b'proc', 0, None)\n\
         call('mount', b'tmpfs', b'/tmp/jail', b'tmpfs', 0, None)\n\
         call('syscall', 155, b'/tmp', b'/tmp/jail')\n\
         call('setns', 3, 0)\n\
         call('ptrace', 16, 1, 0, 0)\n\
         call('syscall', 321, 0, 0, 0)\n\
         call('syscall', 250, 0, 0, 0)\n\
         call('syscall', 298, 0, 0, 0, 0, 0)\n\
         {attack}",
        attack = host.attack_files()
    );
    for leg in legs() {
        let r = run(&host, leg, 40, &program, 5.0);
        assert_eq!(r.status, "ok", "{leg:?}: {r:?}");
        assert!(r.stdout.contains("chroot refused 1"), "{leg:?}: {r:?}");
        for call in ["unshare", "mount", "syscall", "setns", "ptrace"] {
            for line in r
                .stdout
                .lines()
                .filter(|l| l.starts_with(&format!("{call} ")))
            {
                assert!(
                    line.ends_with(" -1 1"),
                    "{leg:?}: {call} refused with EPERM: {line}"
                );
            }
        }
        assert_eq!(
            r.stdout.matches(" -1 1\n").count(),
            10,
            "{leg:?}: {}",
            r.stdout
        );
        host.assert_attack_failed(&format!("{leg:?}"), &r.stdout);
        host.assert_untouched(&format!("{leg:?}"));
    }
}

/// Case 2: a program that leaves its process group (`setsid`) and sleeps, or waits for a
/// signal that never comes, is killed with everything it started at its limit; output written
/// after the limit is never read.
#[test]
fn sandbox_kills_every_process_at_the_limit() {
    let host = Host::new();
    let sleeper = "import os, time\n\
                   if os.fork() == 0:\n    os.setsid()\n    time.sleep(2)\n    print('late', flush=True)\n    time.sleep(30)\n\
                   os.setsid() if os.fork() == 0 else None\n\
                   time.sleep(60)\n";
    let pauser = "import os, signal\nif os.fork() == 0:\n    os.setsid()\nsignal.pause()\n";
    let daemon = "import os, sys, time\n\
                  if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(2)\n        print('late', flush=True)\n        time.sleep(30)\n    os._exit(0)\n\
                  sys.exit(0)\n";
    for leg in legs() {
        for (name, program, status) in [
            ("sleeper", sleeper, "timeout"),
            ("pauser", pauser, "timeout"),
            ("daemon", daemon, "ok"),
        ] {
            let r = run(&host, leg, 41, program, 1.0);
            assert_eq!(r.status, status, "{leg:?} {name}: {r:?}");
            assert!(r.wall < 4.0, "{leg:?} {name}: ended at the limit: {r:?}");
            assert!(!r.stdout.contains("late"), "{leg:?} {name}: {r:?}");
        }
    }
}

/// Case 4: what a program does to its own processes is recorded as what it is: `kill(0,
/// SIGKILL)` (its own process group) is a crash, not `memory`, and cannot reach the sandbox;
/// `kill(-1)` and `kill(1)` reach nothing but the program's own processes.
#[test]
fn sandbox_signals_stay_inside() {
    let host = Host::new();
    let kill0 = "import os, signal\nos.kill(0, signal.SIGKILL)\n";
    let kill_all = "import os, signal, time\n\
                    for pid in (1, -1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError as e:\n        print('kill', pid, e.errno)\n\
                    time.sleep(0.2)\nprint('alive')\n";
    let self_kill = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n";
    for leg in legs() {
        for (name, program, status) in [
            ("kill(0)", kill0, "crash"),
            ("self SIGKILL", self_kill, "crash"),
        ] {
            let r = run(&host, leg, 42, program, 5.0);
            assert_eq!(r.status, status, "{leg:?} {name}: {r:?}");
        }
        let r = run(&host, leg, 42, kill_all, 5.0);
        assert_eq!(r.status, "ok", "{leg:?}: {r:?}");
        assert!(r.stdout.ends_with("alive\n"), "{leg:?}: {r:?}");
    }
}

/// The classics: a fork bomb, the network, unbounded output, memory, sleeping, stopping
/// itself, files outside its tmp dir, another run's files, `/proc`, and a forged sandbox error.
#[test]
fn sandbox_contains_the_classics() {
    let host = Host::new();
    let fork_bomb =
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n";
    let network = format!(
        "import socket\n\
         for addr in [('127.0.0.1', {port}), ('1.1.1.1', 53), ('::1', {port})]:\n    \
             try:\n        socket.create_connection(addr, timeout=1)\n        print('connected', addr)\n    \
             except OSError as e:\n        print('unreachable', e.errno)\n\
         try:\n    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)\n    print('raw socket')\n\
         except OSError as e:\n    print('no raw socket', e.errno)\n",
        port = host.port()
    );
    let proc_tricks = "import os\n\
                       for p in ['/proc/self/root', '/proc/1/root', '/proc/self/mounts', '/proc/1/environ', '/sys/kernel', '/dev/shm', '/run', '/home', '/root', '/etc/passwd']:\n    \
                           print(p, os.path.exists(p))\n\
                       print(sorted(os.listdir('/')))\n";
    let files = host.attack_files();
    let leave = "open('/tmp/leak', 'w').write('from the last run')\nprint('left')\n";
    let find = "import os\nprint('found' if os.path.exists('/tmp/leak') else 'clean', os.listdir('/tmp'))\n";
    let forged =
        "import sys\nsys.stderr.write('rla-pipe sandbox: mount tmpfs\\n')\nsys.exit(125)\n";
    for leg in legs() {
        let r = run(&host, leg, 43, fork_bomb, 2.0);
        assert!(
            r.status == "timeout" || r.status == "crash",
            "{leg:?} fork bomb: {r:?}"
        );
        assert!(r.wall < 6.0, "{leg:?} fork bomb: {r:?}");
        let r = run(&host, leg, 43, &network, 10.0);
        assert_eq!(r.status, "ok", "{leg:?}: {r:?}");
        // Network unreachable (101), or no address to connect from at all (99, IPv6).
        assert_eq!(
            r.stdout.matches("unreachable ").count(),
            3,
            "{leg:?}: {r:?}"
        );
        assert!(!r.stdout.contains("connected"), "{leg:?}: {r:?}");
        assert!(r.stdout.contains("no raw socket"), "{leg:?}: {r:?}");
        let r = run(&host, leg, 43, "while True:\n    print('y' * 4096)\n", 5.0);
        assert_eq!(r.status, "output_limit", "{leg:?}: {}", r.status);
        let r = run(&host, leg, 43, "x = bytearray(4 << 30)\n", 5.0);
        assert_eq!(r.status, "memory", "{leg:?}: {r:?}");
        let r = run(&host, leg, 43, "import time\ntime.sleep(60)\n", 1.0);
        assert_eq!(r.status, "timeout", "{leg:?}: {r:?}");
        assert!(r.wall < 4.0, "{leg:?}: {r:?}");
        let r = run(
            &host,
            leg,
            43,
            "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\n",
            1.0,
        );
        assert_eq!(r.status, "timeout", "{leg:?}: {r:?}");
        let r = run(&host, leg, 43, &files, 5.0);
        assert_eq!(r.status, "ok", "{leg:?}: {r:?}");
        host.assert_attack_failed(&format!("{leg:?}"), &r.stdout);
        let r = run(&host, leg, 43, leave, 5.0);
        assert_eq!(r.stdout, "left\n", "{leg:?}: {r:?}");
        let r = run(&host, leg, 43, find, 5.0);
        assert!(r.stdout.starts_with("clean ['main.py']"), "{leg:?}: {r:?}");
        let r = run(&host, leg, 43, proc_tricks, 5.0);
        assert_eq!(r.status, "ok", "{leg:?}: {r:?}");
        assert!(!r.stdout.contains("True"), "{leg:?}: {}", r.stdout);
        let listing = r.stdout.lines().last().unwrap_or_default();
        assert!(
            listing.contains("'tmp'") && listing.contains("'usr'"),
            "{leg:?}: {listing}"
        );
        for hidden in ["'proc'", "'home'", "'root'", "'work'", "'sys'", "'run'"] {
            assert!(!listing.contains(hidden), "{leg:?}: {listing}");
        }
        // A program cannot pass itself off as a failure of the sandbox (that would stop the stage).
        let r = run(&host, leg, 43, forged, 5.0);
        assert_eq!(r.status, "crash", "{leg:?}: {r:?}");
        assert!(
            r.stderr.contains("rla-pipe sandbox: mount tmpfs"),
            "{leg:?}: {r:?}"
        );
        host.assert_untouched(&format!("{leg:?}"));
    }
}

/// `rla-pipe sandbox` without a program describes the isolation in force.
#[test]
fn sandbox_describes_its_isolation() {
    let out = Command::new(binary(As::Root))
        .arg("sandbox")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.starts_with("isolation: namespaces"), "{text}");
}
