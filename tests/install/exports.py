#!/usr/bin/env python3
"""libdsim.so exports exactly the public interface:
    exports.py LIBDSIM_SO INCLUDE_DIR

The public interface is what the headers under INCLUDE_DIR/dsim (the API)
and INCLUDE_DIR/dsim/spi (for backends and strategies) declare with
DSIM_API (dsim/api.h). Fails, naming each symbol and where it comes from:
  - a symbol the library exports that no public header declares (an
    internal function that lost its `static` or its hidden visibility);
  - a public declaration without DSIM_API (programs could not link it);
  - a DSIM_API declaration the library does not export (no definition).
Needs nm (binutils)."""
import glob
import os
import re
import subprocess
import sys


# What compilers add for their instrumentation (AddressSanitizer's ODR
# indicators of exported variables, coverage counters), not the library's.
INSTRUMENTATION = ('__odr_asan', '__asan', '__ubsan', '__sanitizer', '__sancov', '__gcov',
                   '__llvm', '__tsan', '__msan')
# GCC's libgcov, linked into a -Db_coverage=true build of the library, also
# exports a helper of its own without a prefix.
INSTRUMENTATION_NAMES = {'mangle_path'}


def exported(lib):
    out = subprocess.run(['nm', '-D', '--defined-only', lib], capture_output=True, text=True,
                         check=True).stdout
    return {p[2] for p in (l.split() for l in out.splitlines())
            if len(p) == 3 and not p[2].startswith(INSTRUMENTATION)
            and p[2] not in INSTRUMENTATION_NAMES}


def strip(text):
    """The header without comments, string literals and preprocessor lines."""
    text = re.sub(r'/\*.*?\*/', ' ', text, flags=re.S)
    text = re.sub(r'//[^\n]*', ' ', text)
    text = re.sub(r'"(\\.|[^"\\])*"', '""', text)
    text = re.sub(r'\\\n', ' ', text)
    return '\n'.join(l for l in text.split('\n') if not l.lstrip().startswith('#'))


def declarations(path):
    """(name, has DSIM_API) for each top-level function or variable
    declaration; bodies of structs, enums and inline functions are skipped."""
    text = strip(open(path).read())
    text = re.sub(r'extern\s*""\s*\{', ' ', text)  # extern "C" {
    out, chunk, depth = [], '', 0
    for ch in text:
        if ch == '{':
            depth += 1
        elif ch == '}':
            depth -= 1
            if depth < 0:  # the closing brace of extern "C"
                depth = 0
            elif depth == 0 and '(' in chunk:
                chunk = ''  # an inline function's body ends its definition
            continue
        if depth:
            continue
        if ch != ';':
            chunk += ch
            continue
        decl = ' '.join(chunk.split())
        chunk = ''
        if not decl or re.match(r'(typedef|static)\b', decl) or re.match(r'(struct|enum|union)(\s+\w+)?$', decl):
            continue
        decl_noattr = re.sub(r'__attribute__\s*\(\(.*?\)\)', ' ', decl)
        m = re.search(r'(\w+)\s*\(', decl_noattr)
        if m and not re.match(r'\s*\(\s*\*', decl_noattr[m.end() - 1:]):
            name = m.group(1)
        else:
            m = re.search(r'(\w+)\s*(\[[^\]]*\])?\s*$', decl_noattr)
            if not m:
                continue
            name = m.group(1)
        out.append((name, 'DSIM_API' in decl.split('(')[0]))
    return out


def main():
    lib, inc = sys.argv[1], sys.argv[2]
    headers = sorted(glob.glob(os.path.join(inc, 'dsim', '*.h')) +
                     glob.glob(os.path.join(inc, 'dsim', 'spi', '*.h')))
    if not headers:
        print('exports: no headers under %s/dsim' % inc)
        return 1
    declared, bad = {}, []
    for h in headers:
        for name, api in declarations(h):
            rel = os.path.relpath(h, inc)
            if not api:
                bad.append('%s declares %s without DSIM_API: programs cannot link it' % (rel, name))
            declared[name] = rel
    syms = exported(lib)
    for s in sorted(syms - set(declared)):
        bad.append('libdsim exports %s, which no public header declares: make it static, or '
                   'declare it in a header under src/include/dsim with DSIM_API' % s)
    for s in sorted(set(declared) - syms):
        bad.append('%s declares %s with DSIM_API but libdsim does not export it' % (declared[s], s))
    for b in bad:
        print('exports: ' + b)
    print('exports: libdsim exports %d symbols; the public headers declare %d; %d problem(s)'
          % (len(syms), len(declared), len(bad)))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
