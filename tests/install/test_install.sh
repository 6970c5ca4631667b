#!/bin/sh
# Packaging, as a project that uses dsim sees it (examples/consumer):
#   (a) `meson install` of this build into a temporary folder (--destdir):
#       the files are there, pkg-config describes them, and the consumer
#       builds against them with dependency('dsim') / ('dsim-harness') found
#       by pkg-config only (--wrap-mode=nofallback), and its test passes;
#   (b) the consumer builds with dsim as a subproject (subprojects/dsim, a
#       link to this source tree, found through subprojects/dsim.wrap's
#       [provide]) and its test passes;
#   (c2) examples/hierarchical_strategy builds by hand against the install
#       (cc and pkg-config) and the installed dsim lists it and runs it.
#
#   test_install.sh SRC BUILD MESON PREFIX LIBDIR SANITIZE COVERAGE CC...
# Exits 77 (skip) when meson or pkg-config is not there to do it.
set -u
src=$1 build=$2 meson=$3 prefix=$4 libdir=$5 sanitize=$6 coverage=$7
shift 7
CC="$*"
export CC
[ -n "$meson" ] && [ -x "$meson" ] || { echo "meson not found: skipped"; exit 77; }
command -v pkg-config >/dev/null 2>&1 || { echo "pkg-config not found: skipped"; exit 77; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsim-install.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "FAIL: $*"
    exit 1
}
# A sanitized libdsim needs a sanitized program to link it.
opts="-Db_sanitize=$sanitize"
[ "$sanitize" = none ] || opts="$opts -Db_lundef=false"
# A libdsim built for coverage refers to gcov's runtime: so must its users.
[ "$coverage" = true ] && opts="$opts -Db_coverage=true"

# ---- (a) installed ----
start=$(date +%s)
"$meson" install -C "$build" --no-rebuild --destdir "$tmp/dest" --quiet >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log"; fail "meson install"; }
case $libdir in /*) lib=$tmp/dest$libdir ;; *) lib=$tmp/dest$prefix/$libdir ;; esac
inc=$tmp/dest$prefix/include
for f in "$tmp/dest$prefix/bin/dsim" "$lib/libdsim.so" "$lib/libdsim.a" "$lib/libdsim-harness.a" \
         "$lib/pkgconfig/dsim.pc" "$lib/pkgconfig/dsim-harness.pc" "$inc/dsim/err.h" \
         "$inc/dsim/spi/strategy.h" "$inc/dsim/spi/README.md" "$inc/dsim-harness/harness/harness.h" \
         "$inc/dsim-harness/store.h"; do
    [ -e "$f" ] || fail "not installed: $f"
done
[ -d "$lib/dsim/strategies" ] || fail "the plugin directory $lib/dsim/strategies is not there"
# the soname carries the ABI number; the .so links to it
soname=$(objdump -p "$lib/libdsim.so" 2>/dev/null | awk '$1 == "SONAME" {print $2}')
[ -z "$soname" ] || [ -e "$lib/$soname" ] || fail "soname $soname is not installed"
case $soname in '' | libdsim.so.[0-9]*) ;; *) fail "soname is $soname" ;; esac

PKG_CONFIG_SYSROOT_DIR=$tmp/dest
PKG_CONFIG_PATH=$lib/pkgconfig
export PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_PATH
abi=$(sed -n 's/^#define DSIM_STRATEGY_ABI_VERSION \([0-9]*\)u.*/\1/p' "$inc/dsim/spi/strategy.h")
[ "$(pkg-config --variable=strategy_abi dsim)" = "$abi" ] ||
    fail "dsim.pc strategy_abi is '$(pkg-config --variable=strategy_abi dsim)', the header's $abi"
pkg-config --variable=plugindir dsim | grep -q '/dsim/strategies$' || fail "dsim.pc plugindir"
pkg-config --cflags dsim-harness | grep -q "dsim-harness" || fail "dsim-harness.pc cflags"

cp -R "$src/examples/consumer" "$tmp/a-src" || exit 99
rm -rf "$tmp/a-src/subprojects/dsim"
# shellcheck disable=SC2086
"$meson" setup "$tmp/a-build" "$tmp/a-src" --wrap-mode=nofallback $opts >"$tmp/a.log" 2>&1 ||
    { cat "$tmp/a.log"; fail "(a) the consumer does not configure against the install"; }
grep -q "Run-time dependency dsim found: YES" "$tmp/a.log" || { cat "$tmp/a.log"; fail "(a) dsim not from pkg-config"; }
"$meson" compile -C "$tmp/a-build" >>"$tmp/a.log" 2>&1 ||
    { cat "$tmp/a.log"; fail "(a) the consumer does not build against the install"; }
LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$meson" test -C "$tmp/a-build" \
    --print-errorlogs >>"$tmp/a.log" 2>&1 || { cat "$tmp/a.log"; fail "(a) the consumer's test"; }
echo "ok (a) installed: consumer built with pkg-config and passed ($(($(date +%s) - start)) s)"

# ---- (c) the installed dsim, as a user runs it ----
# no LD_LIBRARY_PATH (its run path finds the libdsim beside it, wherever the
# prefix is: here under --destdir), a plugin built against the installed
# dsim.pc and found in the prefix's plugin directory, never in the build tree
start=$(date +%s)
dsim=$tmp/dest$prefix/bin/dsim
mkdir -p "$tmp/user" || exit 99
cd "$tmp/user" || exit 99
env -u LD_LIBRARY_PATH "$dsim" --version | grep -q '^dsim ' ||
    fail "(c) the installed dsim does not start without LD_LIBRARY_PATH: $(env -u LD_LIBRARY_PATH "$dsim" --version 2>&1)"
env -u LD_LIBRARY_PATH -u DSIM_PLUGIN_PATH "$dsim" run "$src/scenarios/quickstart.yaml" --db q.db \
    >run.log 2>&1 || { cat run.log; fail "(c) the installed dsim does not run the quickstart"; }
grep -q "quickstart: passed" run.log || { cat run.log; fail "(c) the quickstart did not pass"; }
plugdir=$lib/dsim/strategies
san=""
[ "$sanitize" = none ] || san="-fsanitize=$sanitize"
[ "$coverage" = true ] && san="$san --coverage"
# shellcheck disable=SC2046,SC2086
$CC -shared -fPIC -fvisibility=hidden $san $(pkg-config --cflags dsim) \
    "$src/examples/custom_strategy/custom_strategy.c" -o "$plugdir/libcustom_strategy.so" \
    $(pkg-config --libs dsim) 2>cc.log || { cat cc.log; fail "(c) the example plugin does not build against dsim.pc"; }
cp "$src/scenarios/custom_strategy.yaml" . || exit 99
env -u LD_LIBRARY_PATH -u DSIM_PLUGIN_PATH "$dsim" run custom_strategy.yaml --db q.db >plug.log 2>&1 ||
    { cat plug.log; fail "(c) the installed dsim does not run the plugin from the prefix"; }
grep -qE "scenarios: ([0-9]+) passed, 0 did not" plug.log || { cat plug.log; fail "(c) the plugin's run did not pass"; }
# a plugin that is only in the build tree is not found, and the build tree is
# not among the places searched
sed 's/libcustom_strategy.so/libbroken_save_strategy.so/' custom_strategy.yaml > only_in_build.yaml
env -u LD_LIBRARY_PATH -u DSIM_PLUGIN_PATH "$dsim" validate only_in_build.yaml >nf.log 2>&1 &&
    { cat nf.log; fail "(c) the installed dsim found a plugin of the build tree"; }
grep -q "not found" nf.log || { cat nf.log; fail "(c) no 'not found' for a plugin only in the build tree"; }
grep -qF "$build" nf.log && { cat nf.log; fail "(c) the installed dsim searched the build tree"; }
grep -qF "$plugdir" nf.log || { cat nf.log; fail "(c) the prefix's plugin directory was not searched"; }
cd "$tmp" || exit 99
echo "ok (c) the installed dsim runs without LD_LIBRARY_PATH, a plugin built with pkg-config is found in the prefix ($(($(date +%s) - start)) s)"

# ---- (c2) the hierarchical example plugin out of tree ----
# examples/hierarchical_strategy built by hand against the install, as its
# comment says (cc + pkg-config), under a name of its own in a folder of
# its own; the installed dsim lists it (--plugin-dir) and runs its scenario
# with it (found next to the scenario).
start=$(date +%s)
mkdir "$tmp/hier" || exit 99
# shellcheck disable=SC2046,SC2086
$CC -std=c11 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden $san $(pkg-config --cflags dsim) \
    "$src/examples/hierarchical_strategy/hierarchical_strategy.c" -o "$tmp/hier/libhier_oot.so" \
    $(pkg-config --libs dsim) >"$tmp/hier.log" 2>&1 ||
    { cat "$tmp/hier.log"; fail "(c2) the hierarchical example does not build against the install"; }
env -u LD_LIBRARY_PATH -u DSIM_PLUGIN_PATH "$dsim" list strategies --plugin-dir "$tmp/hier" \
    >"$tmp/hier-list.log" 2>&1 || { cat "$tmp/hier-list.log"; fail "(c2) dsim list strategies"; }
grep -q "^hierarchical_leaders .*all-reduced among the hosts' leaders" "$tmp/hier-list.log" &&
    grep -q "(plugin $tmp/hier/libhier_oot.so)" "$tmp/hier-list.log" ||
    { cat "$tmp/hier-list.log"; fail "(c2) the installed dsim does not list the plugin"; }
sed -e 's/plugin: libhierarchical_strategy.so/plugin: libhier_oot.so/' \
    "$src/scenarios/hierarchical_strategy.yaml" >"$tmp/hier/hier.yaml" || exit 99
grep -q "plugin: libhier_oot.so" "$tmp/hier/hier.yaml" || fail "(c2) the scenario was not rewritten"
(cd "$tmp/hier" && env -u LD_LIBRARY_PATH -u DSIM_PLUGIN_PATH "$dsim" run hier.yaml --db "$tmp/hier/h.db") \
    >"$tmp/hier-run.log" 2>&1 || { cat "$tmp/hier-run.log"; fail "(c2) the installed dsim's run of it"; }
grep -q "hierarchical_strategy: passed (4 of 4" "$tmp/hier-run.log" ||
    { cat "$tmp/hier-run.log"; fail "(c2) the run with the out-of-tree plugin did not pass"; }
echo "ok (c2) the hierarchical example built out of tree, listed and run by the installed dsim ($(($(date +%s) - start)) s)"

# ---- (b) subproject ----
start=$(date +%s)
unset PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_PATH
cp -R "$src/examples/consumer" "$tmp/b-src" || exit 99
ln -sfn "$src" "$tmp/b-src/subprojects/dsim" || exit 99
# shellcheck disable=SC2086
"$meson" setup "$tmp/b-build" "$tmp/b-src" --force-fallback-for=dsim,dsim-harness $opts \
    >"$tmp/b.log" 2>&1 || { cat "$tmp/b.log"; fail "(b) the consumer does not configure with the subproject"; }
grep -q "Dependency dsim found: YES .*(overridden)" "$tmp/b.log" || { cat "$tmp/b.log"; fail "(b) no subproject dsim"; }
"$meson" compile -C "$tmp/b-build" >>"$tmp/b.log" 2>&1 ||
    { cat "$tmp/b.log"; fail "(b) the consumer does not build with the subproject"; }
"$meson" test -C "$tmp/b-build" --print-errorlogs >>"$tmp/b.log" 2>&1 ||
    { cat "$tmp/b.log"; fail "(b) the consumer's test with the subproject"; }
# dsim's own tests stay out of the consumer's `meson test`
"$meson" test -C "$tmp/b-build" --list 2>/dev/null | grep -q "^dsim:" && fail "(b) dsim's tests leak"
echo "ok (b) subproject: consumer built with dependency('dsim') from the wrap and passed ($(($(date +%s) - start)) s)"
