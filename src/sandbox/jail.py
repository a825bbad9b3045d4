# rla-pipe's sandbox supervisor (src/sandbox/mod.rs). `unshare` starts it as the first process
# (init) of fresh PID, network, mount, IPC and UTS namespaces (and a user namespace where
# rla-pipe is not root). It:
#
# 1. builds a root of its own on a size-limited tmpfs: the system's /usr, /lib*, /bin, /sbin
#    read-only, /etc/ld.so.cache, /dev/{null,zero,urandom,random}, an empty /tmp (a tmpfs of its
#    own) holding the program; no /proc, /sys, /home, /root, /etc, no network at all;
# 2. pivot_roots into it and unmounts the old root (nothing of the machine is left to reach,
#    chroot or no chroot), and remounts the new root read-only;
# 3. forks the program into a session of its own, which (in this order) sets its resource limits,
#    empties its capability bounding set, locks the securebits that would give uid 0 its
#    capabilities back, drops to an unprivileged uid of its own (as root; in a user namespace it
#    keeps the namespace's uid 0 with no capability at all), sets no_new_privs, installs a seccomp
#    filter (chroot, mount, unshare, setns, ptrace, keyctl, bpf, perf_event_open, io_uring, the
#    module, clock and reboot calls, clone into new namespaces: refused with EPERM; clone3 ENOSYS
#    so that the C library falls back to clone, whose flags the filter can read) and execs Python;
# 4. waits, reaping orphans, until the program's first process ends or its wall clock runs out;
#    then kills every process of the namespace and exits, and the kernel kills whatever is left
#    (a PID namespace ends with its init). As init it cannot be killed from inside: the kernel
#    drops SIGKILL and SIGSTOP sent to a namespace's init by its own processes, and it keeps no
#    signal handler the program could use.
#
# It reports in WORK_DIR/status (opened before the pivot, closed in the program, out of its
# reach): one line, `exit CODE SECONDS`, `signal NUMBER SECONDS`,
# `timeout SECONDS` or `setup MESSAGE` (the sandbox itself failed). The program cannot write
# there.
#
# Arguments: WORK_DIR (holds main.py, an empty root/ and the status file) UID ("" = keep the
# namespace's uid 0) MEMORY_BYTES PROCESSES FILE_BYTES CPU_SECONDS TMPFS_MIB PYTHON LIMIT_SECONDS
import ctypes
import os
import resource
import signal
import struct
import sys
import time

W, UID, MEM, NPROC, FSIZE, CPU, TMPFS, PY, LIMIT = sys.argv[1:10]
R = W + "/root"
STATUS = os.open(W + "/status", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    pass


def report(line):
    os.write(STATUS, (line.replace("\n", " ") + "\n").encode())


def check(result, what):
    if result != 0:
        e = ctypes.get_errno()
        raise SetupError("%s: %s" % (what, os.strerror(e)))


MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME = 16384, 1 << 18, 1 << 21
MNT_DETACH = 2


def mount(source, target, fstype, flags, data=None):
    b = lambda s: None if s is None else s.encode()
    check(libc.mount(b(source), b(target), b(fstype), ctypes.c_ulong(flags), b(data)),
          "mount %s on %s" % (source or fstype, target))


def read_only(path):
    """Remount a bind mount read-only, keeping the flags a user namespace may not clear."""
    f = os.statvfs(path).f_flag
    keep = 0
    for st, ms in ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
                   (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME),
                   (os.ST_RELATIME, MS_RELATIME)):
        if f & st:
            keep |= ms
    mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | keep)


def build_root():
    # Nothing mounted here reaches the machine's namespace.
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", R, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    # A bind of the root onto itself, made read-only once everything is in place (a tmpfs cannot
    # be remounted read-only inside a user namespace; a bind mount can).
    mount(R, R, None, MS_BIND)
    for d in ("usr", "lib", "lib32", "lib64", "libx32", "bin", "sbin"):
        host = "/" + d
        if os.path.islink(host):
            os.symlink(os.readlink(host), R + host)
        elif os.path.isdir(host):
            os.mkdir(R + host)
            mount(host, R + host, None, MS_BIND | MS_REC)
            read_only(R + host)
    for d in ("etc", "dev", "tmp", ".old"):
        os.mkdir(R + "/" + d)
    mount("tmpfs", R + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=%sm,mode=1777" % TMPFS)
    if os.path.exists("/etc/ld.so.cache"):
        open(R + "/etc/ld.so.cache", "w").close()
        mount("/etc/ld.so.cache", R + "/etc/ld.so.cache", None, MS_BIND)
    for f in ("null", "zero", "urandom", "random"):
        open(R + "/dev/" + f, "w").close()
        mount("/dev/" + f, R + "/dev/" + f, None, MS_BIND)
    with open(W + "/main.py", "rb") as src:
        program = src.read()
    fd = os.open(R + "/tmp/main.py", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, program)
    os.close(fd)
    os.chmod(R + "/tmp/main.py", 0o644)
    # Into the new root; the old one is unmounted, so no path (and no chroot trick) leads back.
    check(libc.syscall(SYS["pivot_root"], R.encode(), (R + "/.old").encode()), "pivot_root")
    os.chdir("/")
    check(libc.umount2(b"/.old", MNT_DETACH), "unmount the old root")
    os.rmdir("/.old")
    read_only("/")


# Seccomp: the calls a program never needs and a jailbreak does, by architecture.
CALLS = ["chroot", "mount", "umount2", "pivot_root", "unshare", "setns", "ptrace",
         "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "keyctl", "add_key",
         "request_key", "bpf", "perf_event_open", "userfaultfd", "kexec_load", "kexec_file_load",
         "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct",
         "open_by_handle_at", "name_to_handle_at", "syslog", "settimeofday", "clock_settime",
         "clock_adjtime", "adjtimex", "sethostname", "setdomainname", "quotactl",
         "lookup_dcookie", "vhangup", "fanotify_init", "nfsservctl", "io_uring_setup",
         "io_uring_enter", "io_uring_register", "open_tree", "move_mount", "fsopen", "fsconfig",
         "fsmount", "fspick", "mount_setattr", "open_tree_attr", "iopl", "ioperm", "uselib"]
ARCHES = {
    # machine: (AUDIT_ARCH_*, {name: number}; from asm/unistd_64.h and asm-generic/unistd.h)
    "x86_64": (0xC000003E, dict(
        chroot=161, mount=165, umount2=166, pivot_root=155, unshare=272, setns=308, ptrace=101,
        process_vm_readv=310, process_vm_writev=311, kcmp=312, pidfd_getfd=438, keyctl=250,
        add_key=248, request_key=249, bpf=321, perf_event_open=298, userfaultfd=323,
        kexec_load=246, kexec_file_load=320, init_module=175, finit_module=313,
        delete_module=176, reboot=169, swapon=167, swapoff=168, acct=163, open_by_handle_at=304,
        name_to_handle_at=303, syslog=103, settimeofday=164, clock_settime=227,
        clock_adjtime=305, adjtimex=159, sethostname=170, setdomainname=171, quotactl=179,
        lookup_dcookie=212, vhangup=153, fanotify_init=300, nfsservctl=180,
        io_uring_setup=425, io_uring_enter=426, io_uring_register=427, open_tree=428,
        move_mount=429, fsopen=430, fsconfig=431, fsmount=432, fspick=433, mount_setattr=442,
        open_tree_attr=467, iopl=172, ioperm=173, uselib=134, clone=56, clone3=435)),
    "aarch64": (0xC00000B7, dict(
        chroot=51, mount=40, umount2=39, pivot_root=41, unshare=97, setns=268, ptrace=117,
        process_vm_readv=270, process_vm_writev=271, kcmp=272, pidfd_getfd=438, keyctl=219,
        add_key=217, request_key=218, bpf=280, perf_event_open=241, userfaultfd=282,
        kexec_load=104, kexec_file_load=294, init_module=105, finit_module=273,
        delete_module=106, reboot=142, swapon=224, swapoff=225, acct=89, open_by_handle_at=265,
        name_to_handle_at=264, syslog=116, settimeofday=170, clock_settime=112,
        clock_adjtime=266, adjtimex=171, sethostname=161, setdomainname=162, quotactl=60,
        lookup_dcookie=18, vhangup=58, nfsservctl=42, fanotify_init=262,
        io_uring_setup=425, io_uring_enter=426, io_uring_register=427, open_tree=428,
        move_mount=429, fsopen=430, fsconfig=431, fsmount=432, fspick=433, mount_setattr=442,
        open_tree_attr=467, clone=220, clone3=435)),
}
MACHINE = os.uname().machine
if MACHINE not in ARCHES:
    report("setup no seccomp filter for the %s architecture (x86_64 and aarch64 have one)" % MACHINE)
    sys.exit(125)
AUDIT_ARCH, SYS = ARCHES[MACHINE]
# Namespace flags of clone(2): CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET,
# NEWTIME.
CLONE_NEW = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x00000080
EPERM, ENOSYS = 1, 38


def seccomp_filter():
    ld_abs, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, kill = 0x7FFF0000, 0x80000000
    errno = lambda e: 0x00050000 | e
    prog = [(ld_abs, 0, 0, 4), (jeq, 1, 0, AUDIT_ARCH), (ret, 0, 0, kill), (ld_abs, 0, 0, 0)]
    if MACHINE == "x86_64":
        # The x32 ABI's numbers (the same calls under bit 30) are refused as a whole.
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, errno(EPERM))]
    for name in CALLS:
        if name in SYS:
            prog += [(jeq, 0, 1, SYS[name]), (ret, 0, 0, errno(EPERM))]
    prog += [(jeq, 0, 1, SYS["clone3"]), (ret, 0, 0, errno(ENOSYS))]
    # clone: its flags are the low word of the first argument (seccomp_data.args[0], offset 16).
    prog += [(jeq, 0, 3, SYS["clone"]), (ld_abs, 0, 0, 16), (jset, 0, 1, CLONE_NEW),
             (ret, 0, 0, errno(EPERM))]
    prog += [(ret, 0, 0, allow)]
    return b"".join(struct.pack("=HBBI", *i) for i in prog), len(prog)


PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS = 24, 28, 38
PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 22, 2, 47, 4
# SECBIT_NOROOT, SECBIT_NO_CAP_AMBIENT_RAISE, each locked, and SECBIT_KEEP_CAPS locked off.
SECUREBITS = (1 << 0) | (1 << 1) | (1 << 6) | (1 << 7) | (1 << 5)


def prctl(option, arg, what):
    z = ctypes.c_ulong(0)
    check(libc.prctl(option, ctypes.c_ulong(arg), z, z, z), what)


def jail_and_exec(python, filt, n):
    """In the program's process: limits, no capabilities, its uid, the filter, Python."""
    os.setsid()
    for s in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for limit, value in ((resource.RLIMIT_AS, MEM), (resource.RLIMIT_NPROC, NPROC),
                         (resource.RLIMIT_FSIZE, FSIZE), (resource.RLIMIT_CPU, CPU),
                         (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NOFILE, 64)):
        resource.setrlimit(limit, (int(value), int(value)))
    os.chdir("/tmp")
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), ctypes.c_ulong(0),
                      ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0 and ctypes.get_errno() != 22:
            check(-1, "drop capability %d from the bounding set" % cap)
    prctl(PR_SET_SECUREBITS, SECUREBITS, "lock the securebits")
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, "clear the ambient capabilities")
    if UID:
        u = int(UID)
        os.setgroups([])
        os.setresgid(u, u, u)
        os.setresuid(u, u, u)
    # No capability left in any set (as uid 0 of a user namespace too).
    header = struct.pack("=Ii", 0x20080522, 0)
    check(libc.capset(header, bytes(24)), "clear the capabilities")
    prctl(PR_SET_NO_NEW_PRIVS, 1, "no_new_privs")
    buf = ctypes.create_string_buffer(filt)
    fprog = struct.pack("=HxxxxxxQ", n, ctypes.addressof(buf))
    prctl_seccomp = libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER),
                               ctypes.c_char_p(fprog), ctypes.c_ulong(0), ctypes.c_ulong(0))
    check(prctl_seccomp, "install the seccomp filter")
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
    os.execve(python, [python, "-E", "-s", "main.py"], env)


def interpreter():
    """PYTHON as rla-pipe found it (src/sandbox/mod.rs `interpreter`), which must be inside the jail."""
    if "/" in PY and os.access(PY, os.X_OK):
        return PY
    raise SetupError("no interpreter %r in /usr/bin, /bin or /usr/local/bin" % PY)


def kill_all():
    """Every other process of the namespace (init's kill(-1) spares only init)."""
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main():
    # As init, a signal with no handler never reaches this process from inside the namespace.
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(s, signal.SIG_DFL)
    try:
        build_root()
        python = interpreter()
        filt, n = seccomp_filter()
        # Failures between fork and exec come back on this pipe (closed by a successful exec).
        errors_r, errors_w = os.pipe2(os.O_CLOEXEC)
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
    except (OSError, SetupError) as e:
        report("setup %s" % e)
        return 125
    started = time.monotonic()
    deadline = started + float(LIMIT)
    pid = os.fork()
    if pid == 0:
        try:
            # Nothing of the supervisor's stays open in the program but the error pipe
            # (closed when Python starts).
            os.closerange(3, errors_w)
            os.closerange(errors_w + 1, 4096)
            jail_and_exec(python, filt, n)
        except BaseException as e:
            try:
                os.write(errors_w, str(e).encode()[:1000] or b"failed")
            finally:
                os._exit(125)
    os.close(errors_w)
    failure = b""
    while True:
        chunk = os.read(errors_r, 1000)
        if not chunk:
            break
        failure += chunk
    os.close(errors_r)
    if failure:
        kill_all()
        report("setup starting the program: %s" % failure.decode(errors="replace"))
        return 125
    while True:
        # Reap everything that ended (orphans are this process's children too).
        while True:
            try:
                done, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                done, status = 0, 0
            if done == 0:
                break
            if done == pid:
                seconds = time.monotonic() - started
                kill_all()
                if os.WIFSIGNALED(status):
                    report("signal %d %.6f" % (os.WTERMSIG(status), seconds))
                else:
                    report("exit %d %.6f" % (os.WEXITSTATUS(status), seconds))
                return 0
        left = deadline - time.monotonic()
        if left <= 0:
            kill_all()
            report("timeout %.6f" % (time.monotonic() - started))
            return 0
        signal.sigtimedwait([signal.SIGCHLD], min(left, 0.05))


sys.exit(main())
