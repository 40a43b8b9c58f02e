#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The man pages format without a single groff warning, the plugin's page has nbdkit's section
# order, and the pages document exactly what the programs offer: every plugin parameter in the
# plugin's config help, every memserver option in its --help, every key rdmaswapctl prints,
# every rdmaswap-nbd option in its --help.
set -euo pipefail
source "$(dirname "$0")/../integration/functions.sh"
requires groff --version
requires nbdkit --version
requires_build memserver plugin ctl
mandir=$RDMASWAP_BUILD/docs/man
pages=(nbdkit-rdmaswap-plugin.1 rdmaswap-memserver.8 rdmaswapctl.8 rdmaswap-nbd.8)
NBDTOOL=$RDMASWAP_BUILD/tools/rdmaswap-nbd
[[ -x $NBDTOOL ]] || fail "not built: $NBDTOOL"

# render PAGE: the page as plain ASCII text, 80 columns.
render() { groff -man -Tascii -rLL=80n -P-cbou "$mandir/$1"; }
# words TEXT: the lines of TEXT on one line.
words() { tr '\n' ' ' <<<"$1" | sed 's/ *$//'; }
# section PAGE NAME: the text of one section of the rendered page.
section() { render "$1" | awk -v s="$2" '/^[A-Z]/ { on = ($0 == s); next } on'; }

for p in "${pages[@]}"; do
    [[ -f $mandir/$p ]] || fail "not built: $mandir/$p"
    out=$(groff -man -Tutf8 -ww -z "$mandir/$p" 2>&1) || fail "groff failed on $p: $out"
    [[ -z $out ]] || fail "groff warnings for $p:"$'\n'"$out"
    if man --version >/dev/null 2>&1; then
        out=$(MANWIDTH=80 man --warnings -l "$mandir/$p" 2>&1 >/dev/null) || fail "man -l $p failed"
        [[ -z $out ]] || fail "man -l $p warned:"$'\n'"$out"
    fi
    if grep -n '@[a-z_]*@' "$mandir/$p"; then
        fail "$p: unsubstituted placeholder"
    fi
done

sections=$(render nbdkit-rdmaswap-plugin.1 | grep -E '^[A-Z][A-Z ]+$' | paste -sd' ' -)
[[ $sections == "NAME SYNOPSIS DESCRIPTION EXAMPLES PARAMETERS NOTES FILES SEE ALSO" ]] ||
    fail "nbdkit-rdmaswap-plugin.1 sections are not in nbdkit's order: $sections"

# Every key of the plugin's config help is documented under PARAMETERS, and nothing more.
help=$(timeout 20 nbdkit "$PLUGIN" --help) || fail "nbdkit PLUGIN --help failed"
keys=$(sed -n 's/^\([a-z_-]*\)=.*/\1/p' <<<"$help" | sort -u)
[[ -n $keys ]] || fail "no parameters found in nbdkit PLUGIN --help:"$'\n'"$help"
documented=$(section nbdkit-rdmaswap-plugin.1 PARAMETERS |
    sed -n 's/^       \([a-z_-]*\)=.*/\1/p' | sort -u)
[[ $keys == "$documented" ]] ||
    fail "plugin parameters: config help has [$(words "$keys")], the page documents [$(words "$documented")]"

# Every memserver option is documented under OPTIONS.
opts=$(timeout 10 "$MEMSERVER" --help | grep -o -- '--[a-z][a-z-]*' | sort -u)
documented=$(section rdmaswap-memserver.8 OPTIONS | grep -o -- '^       --[a-z][a-z-]*' |
    sed 's/^ *//' | sort -u)
[[ $opts == "$documented" ]] ||
    fail "memserver options: --help has [$(words "$opts")], the page documents [$(words "$documented")]"

# Every rdmaswap-nbd option is documented under OPTIONS, and the page has the sections it needs.
opts=$(timeout 10 "$NBDTOOL" --help | grep -o -- '--[a-z][a-z-]*' | sort -u)
documented=$(section rdmaswap-nbd.8 OPTIONS | grep -o -- '^       --[a-z][a-z-]*' |
    sed 's/^ *//' | sort -u)
[[ -n $opts && $opts == "$documented" ]] ||
    fail "rdmaswap-nbd options: --help has [$(words "$opts")], the page documents [$(words "$documented")]"
sections=$(render rdmaswap-nbd.8 | grep -E '^[A-Z][A-Z ]+$' | paste -sd' ' -)
[[ $sections == "NAME SYNOPSIS DESCRIPTION OPTIONS EXIT STATUS EXAMPLES NOTES SEE ALSO" ]] ||
    fail "rdmaswap-nbd.8 sections: $sections"

# Every key rdmaswapctl status prints is documented under OUTPUT.
start_memserver 4M 1M
keys=$(ctl_status "$MEMSERVER_PORT" | sed -n 's/^\([a-z_]*\)=.*/\1/p' | sort -u)
documented=$(section rdmaswapctl.8 OUTPUT | sed -n 's/^       \([a-z_-]*\)=.*/\1/p' | sort -u)
missing=$(comm -23 <(echo "$keys") <(echo "$documented"))
[[ -z $missing ]] || fail "rdmaswapctl prints keys its page does not document: $(words "$missing")"
log "man pages OK: ${pages[*]}"
