#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Files that hold secrets are used only if they are private to the user the program runs as
# (docs/security.md "Key files an operator manages", "The backup file"):
# - key files (memserver --auth-key/--admin-key, plugin auth-key=/volume-key=, rdmaswapctl
#   admin-key=): a FIFO is refused at once (before: start-up hung forever in open), and so are
#   a key its group may read or write, another user's key (as root: owned by nobody, mode
#   0600) and a symbolic link; each refusal names the file and what is wrong with it.
# - backup=FILE: an existing empty file owned by nobody, or mode 0644, is refused and left
#   untouched (before: adopted, and swap pages written into it); a symbolic link is not
#   followed (nothing is created where it points); a new file is mode 0600 whatever the umask.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdkit --version
requires_build memserver plugin ctl

start_memserver 16M 1M
good=(server="$MEMSERVER_ADDR" size=16M)
root=0
[[ $(id -u) == 0 ]] && root=1

n=0
# refused WHO REGEX CMD...: CMD must exit non-zero (not by timeout or a signal) within 20 s and
# say REGEX (grep -E) on stdout or stderr. @SOCK@ in CMD becomes a socket of its own.
refused() {
    local who=$1 regex=$2 rc=0 start=$SECONDS
    shift 2
    n=$((n + 1))
    local out="$tmpdir/refused-$n.out"
    set -- "${@//@SOCK@/$tmpdir/refused-$n.sock}"
    timeout 20 "$@" </dev/null >"$out" 2>&1 || rc=$?
    log "case $n ($who): exit $rc after $((SECONDS - start)) s: $(tr '\n' ' ' <"$out")"
    [[ $rc -ne 124 ]] || fail "$who: still running after 20 s (it accepted the file, or blocked on it): $*"
    [[ $rc -ne 0 ]] || fail "$who: accepted: $*"
    [[ $rc -lt 128 ]] || fail "$who: died of a signal (exit $rc): $(cat "$out")"
    grep -Eq -- "$regex" "$out" || fail "$who: no message matching /$regex/: $(cat "$out")"
}
memserver=("$MEMSERVER" --listen 127.0.0.1 --port 0 --capacity 4M --slab-size 1M --transport tcp)
plugin=(nbdkit -f -U @SOCK@ "$PLUGIN" "${good[@]}")

# ---- key files ----
mkfifo -m 600 "$tmpdir/fifo.key"
refused "memserver --auth-key FIFO" "auth key file $tmpdir/fifo.key: not a regular file \(a FIFO\)" \
    "${memserver[@]}" --auth-key "$tmpdir/fifo.key"
refused "memserver --admin-key FIFO" "fifo.key: not a regular file \(a FIFO\)" \
    "${memserver[@]}" --auth-key "$AUTH_KEY" --admin-key "$tmpdir/fifo.key"
refused "plugin auth-key=FIFO" "auth-key=.*fifo.key: not a regular file \(a FIFO\)" \
    "${plugin[@]}" auth-key="$tmpdir/fifo.key"
refused "plugin volume-key=FIFO" "volume key file $tmpdir/fifo.key: not a regular file \(a FIFO\)" \
    "${plugin[@]}" auth-key="$AUTH_KEY" volume-key="$tmpdir/fifo.key"
refused "rdmaswapctl admin-key=FIFO" "admin-key=.*fifo.key: not a regular file \(a FIFO\)" \
    "$RDMASWAPCTL" giveback "server=$MEMSERVER_ADDR" size=1M admin-key="$tmpdir/fifo.key"

for mode in 640 620; do
    cp "$AUTH_KEY" "$tmpdir/group-$mode.key"
    chmod "$mode" "$tmpdir/group-$mode.key"
    refused "memserver, key mode $mode" "group-$mode.key: is accessible by other users \(mode 0$mode.*chmod 600" \
        "${memserver[@]}" --auth-key "$tmpdir/group-$mode.key"
    refused "plugin, key mode $mode" "group-$mode.key: is accessible by other users \(mode 0$mode" \
        "${plugin[@]}" auth-key="$tmpdir/group-$mode.key"
done

ln -s "$AUTH_KEY" "$tmpdir/link.key"
refused "memserver, a symbolic link to the key" "link.key: is a symbolic link, which is not followed" \
    "${memserver[@]}" --auth-key "$tmpdir/link.key"

if ((root)); then
    cp "$AUTH_KEY" "$tmpdir/nobody.key"
    chmod 600 "$tmpdir/nobody.key"
    chown 65534:65534 "$tmpdir/nobody.key"
    refused "memserver, nobody's key" "nobody.key: owned by .*uid 65534.*mode 0600: not owned by .*uid 0" \
        "${memserver[@]}" --auth-key "$tmpdir/nobody.key"
    refused "plugin, nobody's key" "nobody.key: owned by .*uid 65534" \
        "${plugin[@]}" auth-key="$tmpdir/nobody.key"
else
    log "not root: another user's key not checked"
fi
# (This user's own 0600 key, root's as root, works: start_memserver above used one.)

# ---- backup=FILE ----
bk=$tmpdir/bk
: >"$bk"
if ((root)); then
    chown 65534:65534 "$bk"
    chmod 644 "$bk"
    refused "backup=, nobody's empty 0644 file" "backup=$bk: owned by .*uid 65534.*mode 0644.*plaintext" \
        "${plugin[@]}" auth-key="$AUTH_KEY" volume=bk backup="$bk"
    [[ $(stat -c %s "$bk") == 0 ]] || fail "nobody's backup file was written to ($(stat -c %s "$bk") bytes)"
    chmod 600 "$bk"
    refused "backup=, nobody's empty 0600 file" "backup=$bk: owned by .*uid 65534.*mode 0600" \
        "${plugin[@]}" auth-key="$AUTH_KEY" volume=bk backup="$bk"
    chown "$(id -u):$(id -g)" "$bk"
fi
chmod 644 "$bk"
refused "backup=, an empty 0644 file" "backup=$bk: owned by .*mode 0644: open to its group or others" \
    "${plugin[@]}" auth-key="$AUTH_KEY" volume=bk backup="$bk"
[[ $(stat -c %s "$bk") == 0 ]] || fail "the 0644 backup file was written to"

ln -s "$tmpdir/elsewhere" "$tmpdir/bk-link"
refused "backup=, a dangling symbolic link" "bk-link: is a symbolic link, which is not followed" \
    "${plugin[@]}" auth-key="$AUTH_KEY" volume=bk backup="$tmpdir/bk-link"
[[ ! -e $tmpdir/elsewhere ]] || fail "a file was created where the backup= symbolic link points"

# Control: a new file is made, mode 0600 even under umask 000, and used.
old_umask=$(umask)
umask 000
start_nbdkit newbk -- "${good[@]}" volume=bk backup="$tmpdir/bk-new"
umask "$old_umask"
timeout 20 nbdinfo --size "$NBDKIT_URI" | grep -qx 16777216 || fail "nbdkit with a new backup file does not serve"
[[ $(stat -c %a "$tmpdir/bk-new") == 600 ]] || fail "new backup file has mode $(stat -c %a "$tmpdir/bk-new"), not 600"
log "passed: $n refusals, each at once and with the file's name; a new backup file is mode 0600"
exit 0
