#!/usr/bin/env bash
# Builds the packages and checks that each one installs and runs (CI runs `ci`).
#   bash packaging/build.sh assets   release binary, man pages, completions (target/packaging)
#   bash packaging/build.sh deb      + target/debian/packfs_VERSION_ARCH.deb (cargo-deb)
#   bash packaging/build.sh wheel    + target/wheels/packfs-VERSION-*.whl (your maturin)
#   bash packaging/build.sh wheel portable   the same, for glibc 2.17 and later (maturin + zig)
#   bash packaging/build.sh ci       all of the above, then install and try each one
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/packaging

assets() {
    cargo build --release --locked
    rm -rf "$out" && mkdir -p "$out/completions"
    target/release/packfs man "$out/man"
    target/release/packfs completions bash > "$out/completions/packfs.bash"
    target/release/packfs completions zsh > "$out/completions/_packfs"
    target/release/packfs completions fish > "$out/completions/packfs.fish"
    echo "binary: $(du -h target/release/packfs | cut -f1)"
}

deb() {
    command -v cargo-deb >/dev/null || cargo install cargo-deb --locked --quiet
    cargo deb --no-build --no-strip -o target/debian/
    ls -l target/debian/*.deb
}

# The wheel, with the maturin the user has (`pip install maturin`), else one in a small build
# venv; for this machine's glibc. `wheel portable` (CI) links with zig against glibc 2.17
# symbols (manylinux2014), so the wheel installs on RHEL/Rocky 8 and other clusters whose glibc
# is older than the build machine's (a plain build here needs 2.34); maturin and zig then come
# from PyPI into target/pkg-venv (binary wheels, about 465 MB, nothing to compile).
wheel() {
    local venv=target/pkg-venv
    rm -rf target/wheels
    if [ "${1:-}" = portable ]; then
        [ -x "$venv/bin/maturin" ] && "$venv/bin/python" -c "import ziglang" 2>/dev/null || {
            echo "making $venv with maturin and zig (about 465 MB from PyPI)"
            python3 -m venv "$venv"
            "$venv/bin/pip" install -q "maturin>=1.5,<2" ziglang
        }
        # maturin finds zig through the python on PATH.
        PATH="$PWD/$venv/bin:$PATH" maturin build --release --locked --zig \
            --target x86_64-unknown-linux-gnu --compatibility manylinux2014 --out target/wheels
        add_module target/x86_64-unknown-linux-gnu/release/deps/libpackfs.so
    else
        local maturin
        maturin=$(command -v maturin || true)
        if [ -z "$maturin" ]; then
            [ -x "$venv/bin/maturin" ] || {
                echo "no maturin on PATH: installing it into $venv (or: pip install 'maturin>=1.5,<2')"
                python3 -m venv "$venv"
                "$venv/bin/pip" install -q "maturin>=1.5,<2"
            }
            maturin=$venv/bin/maturin
        fi
        echo "building with $maturin ($("$maturin" --version))"
        "$maturin" build --release --locked --out target/wheels
        add_module target/release/deps/libpackfs.so
    fi
    ls -l target/wheels/
}

# The native module (the library's cdylib from the compile that made the binary) into the wheel
# maturin wrote, tagged cp39-abi3.
add_module() {
    python3 packaging/python/wheel_module.py target/wheels/packfs-*.whl "$1"
}

# Install each package as a user would, and try it.
check() {
    echo "== wheel into a fresh venv"
    local venv=target/wheel-venv
    rm -rf "$venv" && python3 -m venv "$venv"
    "$venv/bin/pip" install -q target/wheels/packfs-*.whl
    "$venv/bin/packfs" --version
    # The man pages ride in the wheel too, where man finds them with the venv on PATH.
    [ "$(PATH="$PWD/$venv/bin:$PATH" man -w packfs-mount)" = "$PWD/$venv/share/man/man1/packfs-mount.1" ]
    # The Python package rides in the same wheel and finds the binary installed beside it.
    "$venv/bin/python" -c 'import packfs, sys; b = packfs.binary(); print("import packfs: runs", b); sys.exit(not b.startswith(sys.prefix))'
    # The native module rides in it too: the engine in the process, no mount (packfs.Engine).
    "$venv/bin/python" - <<'PY'
import os, subprocess, sys, tempfile
import packfs, packfs._native
from importlib.metadata import entry_points
assert packfs._native.__version__ == packfs.__version__, packfs._native.__version__
assert any(e.name == "packfs" for e in entry_points(group="fsspec.specs")), "no fsspec entry point"
with tempfile.TemporaryDirectory() as d:
    os.makedirs(f"{d}/src/train")
    with open(f"{d}/src/train/x.txt", "wb") as f:
        f.write(b"in-process\n")
    subprocess.run(["tar", "-C", f"{d}/src", "-cf", f"{d}/d.tar", "train"], check=True)
    with packfs.Engine(f"{d}/d.tar") as engine:
        assert engine.read("train/x.txt") == b"in-process\n"
print("import packfs._native: reads in-process,", packfs._native.__file__)
PY
    # packfs.__version__ is the binary's version.
    [ "$("$venv/bin/python" -c 'import packfs; print(packfs.__version__)')" = "$("$venv/bin/packfs" --version | cut -d' ' -f2)" ]
    local newest
    newest=$(objdump -T "$venv/bin/packfs" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
    echo "the wheel's binary needs glibc symbols up to $newest"
    [ "$(printf '%s\n' "$newest" GLIBC_2.17 | sort -V | tail -1)" = GLIBC_2.17 ]
    # And its module, linked by the same zig (and to no libpython).
    local module
    module=$(echo "$venv"/lib/python3*/site-packages/packfs/_native.abi3.so)
    newest=$(objdump -T "$module" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
    echo "the wheel's module needs glibc symbols up to $newest"
    [ "$(printf '%s\n' "$newest" GLIBC_2.17 | sort -V | tail -1)" = GLIBC_2.17 ]
    ! ldd "$module" | grep -q libpython
    (cd /tmp && "$OLDPWD/$venv/bin/packfs" demo --files 300)

    echo "== .deb with dpkg"
    dpkg -i target/debian/packfs_*.deb
    /usr/bin/packfs --version
    [ "$(readlink -f /usr/sbin/mount.fuse.packfs)" = /usr/bin/packfs ]
    # The distribution's Python imports the package the .deb put in dist-packages, and it finds
    # the .deb's binary.
    if [ -x /usr/bin/python3 ]; then
        (cd / && env -u PACKFS_BIN PATH=/usr/bin:/bin /usr/bin/python3 -c \
            'import packfs; assert packfs.__file__.startswith("/usr/lib/python3/dist-packages/"), packfs.__file__; assert packfs.binary() == "/usr/bin/packfs", packfs.binary(); print("import packfs (.deb):", packfs.__file__)')
    fi
    MANWIDTH=100 man -P cat packfs-mount | grep -q -- --idle-timeout
    bash -c 'source /usr/share/bash-completion/completions/packfs
             COMP_WORDS=(packfs um); COMP_CWORD=1; _packfs packfs um packfs
             [ "${COMPREPLY[*]}" = umount ]'
    if command -v systemd-analyze >/dev/null; then
        # Only our unit's own findings fail the check (the host's other units are not ours).
        local said
        said=$(systemd-analyze verify /usr/lib/systemd/system/packfs@.service 2>&1 || true)
        if printf '%s\n' "$said" | grep 'packfs@'; then
            echo "systemd-analyze verify found problems in packfs@.service" >&2
            exit 1
        fi
        echo "systemd-analyze verify: packfs@.service clean"
    fi
    dpkg -r packfs >/dev/null
    [ ! -e /usr/bin/packfs ]

    echo "== RPM spec"
    if command -v rpmspec >/dev/null; then
        rpmspec -P packaging/rpm/packfs.spec >/dev/null && echo "packfs.spec parses"
    else
        echo "SKIPPED: rpmspec is not installed (package rpm)"
    fi
    echo "== Spack recipe"
    python3 -m py_compile packaging/spack/packages/packfs/package.py && echo "package.py compiles"
}

case "${1:-ci}" in
    assets) assets ;;
    deb) assets; deb ;;
    wheel) wheel "${2:-}" ;;
    ci) assets; deb; wheel portable; check ;;
    *) echo "usage: $0 assets|deb|wheel|ci" >&2; exit 2 ;;
esac
