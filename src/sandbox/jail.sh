# rla-pipe's sandbox (src/sandbox/mod.rs): run inside fresh network, PID, mount, IPC and UTS
# namespaces (`unshare`); builds a root of its own on a size-limited tmpfs — /usr, /lib*, /bin,
# /sbin read-only, /etc/ld.so.cache, four character devices, an empty /tmp holding the program —
# chroots into it, drops to an unprivileged uid where it runs as root, and runs the program under
# resource limits with an empty environment. Only /tmp (a tmpfs of its own) is writable; the
# root is read-only. Nothing else of the machine is visible: no /home, /root, /work, /proc,
# /etc, no network at all (not even loopback).
#
# Arguments: WORK_DIR (holds main.py and an empty root/) UID ("" = keep the namespace's root)
# MEMORY_BYTES PROCESSES FILE_BYTES CPU_SECONDS TMPFS_MIB PYTHON
# Exit status 125 with a line on stderr: the sandbox itself could not be set up.
W=$1; U=$2; M=$3; P=$4; F=$5; T=$6; S=$7; PY=$8
R=$W/root
fail() { echo "rla-pipe sandbox: $*" >&2; exit 125; }
mount -t tmpfs -o "size=1m,mode=755,nosuid,nodev" tmpfs "$R" || fail "mount tmpfs"
# A bind of the root onto itself, made read-only once everything is in place (a tmpfs cannot be
# remounted read-only inside a user namespace; a bind mount can).
mount --bind "$R" "$R" || fail "bind the root"
for d in usr lib lib32 lib64 libx32 bin sbin; do
  if [ -L "/$d" ]; then
    ln -s "$(readlink "/$d")" "$R/$d" || fail "link /$d"
  elif [ -d "/$d" ]; then
    mkdir "$R/$d" || fail "mkdir /$d"
    mount --bind "/$d" "$R/$d" || fail "bind /$d"
    mount -o remount,bind,ro,nosuid,nodev "$R/$d" || fail "read-only /$d"
  fi
done
mkdir -p "$R/etc" "$R/dev" "$R/tmp" || fail "mkdir"
mount -t tmpfs -o "size=${S}m,mode=1777,nosuid,nodev" tmpfs "$R/tmp" || fail "mount /tmp"
if [ -e /etc/ld.so.cache ]; then
  touch "$R/etc/ld.so.cache" && mount --bind /etc/ld.so.cache "$R/etc/ld.so.cache" || fail "bind ld.so.cache"
fi
for f in null zero urandom random; do
  touch "$R/dev/$f" && mount --bind "/dev/$f" "$R/dev/$f" || fail "bind /dev/$f"
done
cp "$W/main.py" "$R/tmp/main.py" && chmod 644 "$R/tmp/main.py" || fail "copy the program"
# The root itself is read-only: only /tmp (its own tmpfs) can be written.
mount -o remount,bind,ro,nosuid,nodev "$R" || fail "read-only root"
set -- /usr/bin/prlimit --as="$M" --nproc="$P" --fsize="$F" --cpu="$T" --core=0 --nofile=64 -- \
  /usr/bin/env -i -C /tmp PATH=/usr/bin:/bin HOME=/tmp TMPDIR=/tmp LANG=C.UTF-8 \
  "$PY" -E -s main.py
if [ -n "$U" ]; then
  exec chroot "$R" /usr/bin/setpriv --reuid="$U" --regid="$U" --clear-groups --no-new-privs "$@"
fi
exec chroot "$R" "$@"
