# Spack recipe for packfs: `spack repo add packaging/spack && spack install packfs`.
# Builds with cargo (Spack's CargoPackage), then installs the man pages and shell completions
# the binary generates from its own argument definitions, and (+python) `import packfs`.

import os

from spack.package import *


class Packfs(CargoPackage):
    """Serve millions of dataset sample files from a few large archive shards (tar, tar.gz,
    zip, squashfs) through FUSE: training code reads ordinary paths while the parallel file
    system sees a handful of large files."""

    homepage = "https://github.com/packfs/packfs"
    git = "https://github.com/packfs/packfs.git"

    license("MIT OR Apache-2.0")

    version("main", branch="main")
    version("0.2.0", tag="v0.2.0")

    depends_on("rust@1.88:", type="build")
    # `import packfs` (over the binary, and its native module for packfs.Engine; packfs.torch
    # needs py-torch, not required).
    variant("python", default=True, description="Install the packfs Python package")
    extends("python", when="+python")
    # Mounting as an ordinary user needs the system's setuid fusermount3 (package fuse3 of the
    # distribution): Spack cannot install a setuid helper, so it is not a dependency here.

    @run_after("install")
    def install_man_pages_and_completions(self):
        packfs = Executable(join_path(self.prefix.bin, "packfs"))
        packfs("man", self.prefix.share.man.man1)
        completions = {
            "bash": join_path(self.prefix.share, "bash-completion", "completions", "packfs"),
            "zsh": join_path(self.prefix.share, "zsh", "site-functions", "_packfs"),
            "fish": join_path(self.prefix.share, "fish", "vendor_completions.d", "packfs.fish"),
        }
        for shell, path in completions.items():
            mkdirp(os.path.dirname(path))
            with open(path, "w") as out:
                packfs("completions", shell, output=out)

    @run_after("install")
    def install_python_package(self):
        if self.spec.satisfies("+python"):
            # purelib: the site-packages path relative to a prefix (python's package property).
            purelib = self.spec["python"].package.purelib
            install_tree("python/packfs", join_path(self.prefix, purelib, "packfs"))
            # Its native module (packfs.Engine): the library's cdylib from the same build
            # (`cargo install --path .` builds in the source's target directory).
            native = join_path(self.stage.source_path, "target", "release", "libpackfs.so")
            install(native, join_path(self.prefix, purelib, "packfs", "_native.abi3.so"))

    @run_after("install")
    @on_package_attributes(run_tests=True)
    def check_version(self):
        Executable(join_path(self.prefix.bin, "packfs"))("--version")
