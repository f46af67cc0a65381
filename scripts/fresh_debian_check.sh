#!/usr/bin/env bash
# fresh_debian_check.sh — the README's commands, as written, in a Debian 12 root that debootstrap
# has just made: what a fresh machine needs first (make), `make demo` (the README's first
# command), the Python package's install, and the first job with its trainer.py; then checks
# what they printed. The commands are taken from README.md itself — the first line of its first
# fenced block, and the fenced blocks marked `<!-- fresh-check: NAME -->` (prereq, install,
# first-job, trainer.py) — so the README and this check cannot drift. The checkout goes in as
# `git archive HEAD`: committed files only.
#
# Needs root (debootstrap, chroot, mounts) and the Debian mirror apt uses (or --mirror); without
# either it prints "skipped: <reason>" and exits 0. Installs debootstrap on this machine when it
# is missing (apt-get). Everything it mounts (proc, sys, a /dev of its own) is mounted inside a
# private mount and PID namespace (unshare): a trap unmounts it all in reverse order, and
# whatever is left goes with the namespace even if this script is killed, as does every process
# the README's commands left running. Nothing of this machine is mounted writable into the root
# but the device nodes null, zero, full, random, urandom and tty. The root (about 1.7 GB) is
# removed at the end, without crossing into any mount, unless --keep; the logs are kept when a
# step failed.
#
# Usage: scripts/fresh_debian_check.sh [--keep] [--mirror URL] [--dir DIR]
#   --keep        keep the root and the logs (their path is printed)
#   --mirror URL  the Debian mirror (default: the one apt here uses for bookworm main)
#   --dir DIR     where to make the root (default: $TMPDIR or /var/tmp); needs ~2 GB
# Exit status: 0 passed or skipped, 1 a step failed or printed something else than expected,
# 2 bad usage or the root could not be made.
set -u

usage() { sed -n '2,/^set -u/p' "$0" | sed -e '/^set -u/d' -e 's/^# \{0,1\}//'; }

# ---------------------------------------------------------------- inside the namespace

# The README block named $1 (the fenced block right after `<!-- fresh-check: $1 -->`), or,
# for "first-command", the first line of the README's first fenced block.
readme_block() {
    if [ "$1" = first-command ]; then
        awk '/^```/ { if (inside) exit; inside = 1; next } inside { print; exit }' "$readme"
        return
    fi
    awk -v name="$1" '
        $0 == "<!-- fresh-check: " name " -->" { want = 1; next }
        want == 1 && /^```/ { want = 2; next }
        want == 2 && /^```/ { exit }
        want == 2 { print }
        want == 1 { exit }' "$readme"
}

# Runs `bash -e /root/fresh/$1.sh` in the root, from the checkout, with a clean environment
# and a time limit of $2 seconds (a hang ends there); the output goes to $logs/$1.log.
step() {
    local name=$1 limit=$2 t0 rc
    t0=$(date +%s)
    chroot "$root" /usr/bin/env -i HOME=/root USER=root LOGNAME=root SHELL=/bin/bash TERM=dumb \
        LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        timeout -k 10 "$limit" bash -c "cd /root/weightbridge && exec bash -e /root/fresh/$name.sh" \
        </dev/null >"$logs/$name.log" 2>&1
    rc=$?
    secs[$name]=$(($(date +%s) - t0))
    rcs[$name]=$rc
    return $rc
}

# Runs a command line in the root (not a README command: a probe of what they left).
in_root() {
    chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin bash -c "$1" </dev/null 2>&1
}

mounts=()
mnt() { # mount ARGS... TARGET, remembered for the unmount
    mount "$@" || return 1
    mounts+=("${!#}")
}
unmount_all() {
    local i
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
        umount "${mounts[i]}" 2>/dev/null || umount -l "${mounts[i]}" ||
            echo "fresh-check: cannot unmount ${mounts[i]} (it goes with the namespace)" >&2
    done
    mounts=()
}

inside() {
    trap unmount_all EXIT
    trap 'exit 130' INT TERM
    declare -gA secs rcs
    local t0 n
    t0=$(date +%s)
    echo "fresh-check: debootstrap bookworm from $mirror into $root (log: debootstrap.log)"
    if ! debootstrap bookworm "$root" "$mirror" >"$logs/debootstrap.log" 2>&1; then
        echo "fresh-check: debootstrap failed:"
        tail -n 15 "$logs/debootstrap.log"
        exit 2
    fi
    secs[debootstrap]=$(($(date +%s) - t0))
    # a /dev of its own: a tmpfs with this machine's harmless nodes, ptys of a new devpts
    # instance, its own /dev/shm; proc, and sys read-only
    mnt -t proc proc "$root/proc" &&
        mnt -t sysfs -o ro,nosuid,nodev,noexec sysfs "$root/sys" &&
        mnt -t tmpfs -o mode=755,nosuid dev "$root/dev" || exit 2
    for n in null zero full random urandom tty; do
        touch "$root/dev/$n" && mnt --bind "/dev/$n" "$root/dev/$n" || exit 2
    done
    mkdir -p "$root/dev/pts" "$root/dev/shm"
    mnt -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$root/dev/pts" &&
        mnt -t tmpfs -o mode=1777,nosuid,nodev shm "$root/dev/shm" || exit 2
    ln -s pts/ptmx "$root/dev/ptmx"
    ln -s /proc/self/fd "$root/dev/fd"
    ln -s /proc/self/fd/0 "$root/dev/stdin"
    ln -s /proc/self/fd/1 "$root/dev/stdout"
    ln -s /proc/self/fd/2 "$root/dev/stderr"
    cp -L /etc/resolv.conf "$root/etc/resolv.conf"
    grep -qw localhost "$root/etc/hosts" 2>/dev/null || echo "127.0.0.1 localhost" >>"$root/etc/hosts"

    mkdir -p "$root/root/weightbridge" "$root/root/fresh"
    tar -x -C "$root/root/weightbridge" -f "$archive" || exit 2
    readme=$root/root/weightbridge/README.md
    for n in prereq install first-job trainer.py first-command; do
        if [ -z "$(readme_block "$n")" ]; then
            echo "fresh-check: README.md has no block for $n (<!-- fresh-check: $n --> before a fenced block)"
            exit 1
        fi
    done
    readme_block prereq >"$root/root/fresh/prereq.sh"
    readme_block first-command >"$root/root/fresh/demo.sh"
    readme_block install >"$root/root/fresh/install.sh"
    readme_block first-job >"$root/root/fresh/first-job.sh"
    readme_block trainer.py >"$root/root/weightbridge/trainer.py"

    local fails=0 bytes vbytes want lib old
    report() { # NAME OK|FAIL WHAT
        printf '  %-10s %-4s %5s s  %s\n' "$1" "$2" "${secs[$1]:-}" "$3"
        [ "$2" = ok ] || fails=$((fails + 1))
    }
    show_tail() { sed 's/^/      | /' <(tail -n "${2:-15}" "$logs/$1.log"); }
    echo "fresh-check: Debian $(cat "$root/etc/debian_version") root made in ${secs[debootstrap]} s;" \
        "running the README's commands (logs: $logs)"

    if step prereq 900; then
        report prereq ok "$(paste -sd ' ' "$root/root/fresh/prereq.sh")"
    else
        report prereq FAIL "exited ${rcs[prereq]}"
        show_tail prereq
    fi
    if [ $fails -eq 0 ] && step demo 3600 &&
        [ "$(grep -cE '^verify version [123]: 2 rollouts, [0-9]+ bytes, every byte equals the reference$' \
            "$logs/demo.log")" = 3 ]; then
        report demo ok "$(cat "$root/root/fresh/demo.sh")"
        grep -E '^verify version [123]: ' "$logs/demo.log" | sed 's/^/      | /'
    elif [ $fails -eq 0 ]; then
        report demo FAIL "exited ${rcs[demo]:-?}, or not 3 'verify version N: ... every byte equals the reference' lines"
        show_tail demo 25
    fi
    # Debian 12's answer to the install the README gave before (informative: not a README command)
    old=$(in_root 'cd /root/weightbridge && python3 -m pip install --no-index --no-build-isolation ./python' |
        grep -m1 -o 'externally-managed-environment')
    if [ $fails -eq 0 ] && step install 900; then
        lib=$(in_root 'cd / && /root/wb/bin/python -c "import weightbridge as wb; print(wb.library_path)"')
        if grep -qxE '/root/wb/lib/python3\.[0-9]+/site-packages/weightbridge/libweightbridge\.so' <<<"$lib"; then
            report install ok "make python; venv; pip install build/python -> the package loads $lib"
            [ -n "$old" ] && echo "      | (the README's former 'python3 -m pip install ... ./python': error: $old)"
        else
            report install FAIL "the installed package, run from /, loaded: $lib"
        fi
    elif [ $fails -eq 0 ]; then
        report install FAIL "exited ${rcs[install]}"
        show_tail install
    fi
    if [ $fails -eq 0 ] && step first-job 600; then
        bytes=$(sed -nE 's/^version [123]: ([0-9]+) bytes written in [0-9.]+ ms$/\1/p' "$logs/first-job.log" | sort -u)
        n=$(grep -cE '^version [123]: [0-9]+ bytes written in [0-9.]+ ms$' "$logs/first-job.log")
        vbytes=$(sed -nE 's/^verify version 3: 1 rollouts, ([0-9]+) bytes, every byte equals the reference$/\1/p' \
            "$logs/first-job.log")
        if [ "$n" = 3 ] && [ -n "$bytes" ] && [ "$bytes" = "$vbytes" ]; then
            report first-job ok "trainer.py pushed 3 versions of $bytes bytes; wb-ctl verify: every byte equal"
            grep -E '^(version [123]:|verify version)' "$logs/first-job.log" | sed 's/^/      | /'
        else
            report first-job FAIL "expected 3 'version N: B bytes written' lines and 'verify version 3: 1 rollouts, B bytes, every byte equals the reference'"
            show_tail first-job
        fi
    elif [ $fails -eq 0 ]; then
        report first-job FAIL "exited ${rcs[first-job]}"
        show_tail first-job
    fi
    echo "fresh-check: $( [ $fails -eq 0 ] && echo PASS || echo FAIL) in $(($(date +%s) - t0)) s" \
        "(debootstrap ${secs[debootstrap]} s)"
    [ $fails -eq 0 ]
}

# ---------------------------------------------------------------- on this machine

if [ "${1:-}" = --inside ]; then
    root=$2 logs=$3 archive=$4 mirror=$5
    inside
    exit
fi

keep=0 mirror="" dir=${TMPDIR:-/var/tmp}
while [ $# -gt 0 ]; do
    case $1 in
    --keep) keep=1 ;;
    --mirror) mirror=${2:?--mirror needs a URL}; shift ;;
    --dir) dir=${2:?--dir needs a directory}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "fresh_debian_check.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
    esac
    shift
done
if [ "$(id -u)" -ne 0 ]; then
    echo "skipped: not root (debootstrap, chroot and the mounts of the fresh root need it)"
    exit 0
fi
for c in unshare chroot mount git tar; do
    command -v "$c" >/dev/null || { echo "skipped: no $c here"; exit 0; }
done
if [ -z "$mirror" ]; then
    # the mirror apt here uses for Debian 12's main component
    mirror=$(apt-get indextargets --format '$(SITE)' 'Identifier: Packages' 'Codename: bookworm' \
        'Component: main' 2>/dev/null | head -n 1)
    mirror=${mirror:-http://deb.debian.org/debian}
fi
probe=$(mktemp)
if ! /usr/lib/apt/apt-helper download-file "$mirror/dists/bookworm/Release" "$probe" >/dev/null 2>&1 ||
    ! grep -q '^Codename: bookworm' "$probe"; then
    rm -f "$probe"
    echo "skipped: no Debian mirror: $mirror/dists/bookworm/Release cannot be fetched"
    exit 0
fi
rm -f "$probe"
if ! command -v debootstrap >/dev/null; then
    echo "fresh-check: installing debootstrap here"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap \
        >/dev/null 2>&1; then
        apt-get update -q >/dev/null 2>&1
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >/dev/null ||
            { echo "fresh-check: cannot install debootstrap"; exit 2; }
    fi
fi
src=$(cd "$(dirname "$0")/.." && pwd)
commit=$(git -C "$src" rev-parse --short HEAD) || exit 2
mkdir -p "$dir" && work=$(mktemp -d "$dir/wb-fresh.XXXXXX") || exit 2
root=$work/root logs=$work/logs
mkdir -p "$root" "$logs"

# Removes the root once nothing is mounted under it (the namespace's mounts never show here;
# this guards against a mount made some other way), never crossing into a mount.
finish() {
    if grep -qF " $root" /proc/self/mountinfo; then
        echo "fresh-check: something is mounted under $root; left in place:" >&2
        grep -F " $root" /proc/self/mountinfo >&2
        return
    fi
    if [ $keep -eq 1 ]; then
        echo "fresh-check: kept $work (root/, logs/)"
        return
    fi
    rm -rf --one-file-system "$root" "$work/checkout.tar"
    if [ "${rc:-1}" -eq 0 ]; then
        rm -rf --one-file-system "$work"
    else
        echo "fresh-check: logs kept in $logs"
    fi
}
trap finish EXIT
git -C "$src" archive --format=tar -o "$work/checkout.tar" HEAD || exit 2
echo "fresh-check: checkout $commit (committed files only), $(nproc) cores"
unshare --mount --pid --fork --mount-proc --propagation private \
    "$src/scripts/fresh_debian_check.sh" --inside "$root" "$logs" "$work/checkout.tar" "$mirror"
rc=$?
exit $rc
