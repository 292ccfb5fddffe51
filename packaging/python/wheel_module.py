"""Puts the native module into the wheel maturin built for the binary.

maturin packs the `packfs` binary (bindings "bin"); the compile that made it also made the
library as a cdylib (Cargo.toml: crate-type rlib and cdylib), which is the Python module
`packfs._native`. This adds that file to the wheel as `packfs/_native.abi3.so`, retags the wheel
for CPython's stable ABI from 3.9 (`cp39-abi3`, what the module needs) and rewrites its RECORD:
one build of the engine for both.

    python3 packaging/python/wheel_module.py WHEEL LIBRARY   (prints the new wheel's path)
"""

import base64
import hashlib
import os
import sys
import zipfile

MODULE = "packfs/_native.abi3.so"
TAG = ("cp39", "abi3")


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def add_module(wheel: str, library: str) -> str:
    """The wheel at `wheel`, rewritten with `library` in it under a name with the new tag;
    the old file is removed. Returns the new path."""
    directory, name = os.path.split(wheel)
    parts = name[: -len(".whl")].split("-")
    if len(parts) != 5:
        raise SystemExit(f"{name}: not a wheel name this knows (name-version-py-abi-platform)")
    parts[2:4] = TAG
    renamed = os.path.join(directory, "-".join(parts) + ".whl")
    with open(library, "rb") as f:
        module = f.read()
    if b"PyInit__native" not in module:
        raise SystemExit(f"{library}: not packfs's module (no PyInit__native)")
    with zipfile.ZipFile(wheel) as old:
        entries = [(info, old.read(info)) for info in old.infolist()]
    dist_info = next(i.filename.split("/")[0] for i, _ in entries
                     if i.filename.endswith(".dist-info/WHEEL"))
    record_name = f"{dist_info}/RECORD"
    out, records = [], []
    for info, data in entries:
        if info.filename == record_name or info.filename == MODULE:
            continue
        if info.filename == f"{dist_info}/WHEEL":
            lines = []
            for line in data.decode().splitlines():
                if line.startswith("Tag: "):
                    platform = line.split("-", 2)[2]
                    line = f"Tag: {TAG[0]}-{TAG[1]}-{platform}"
                    if line in lines:
                        continue
                elif line.startswith("Root-Is-Purelib:"):
                    line = "Root-Is-Purelib: false"
                lines.append(line)
            data = ("\n".join(lines) + "\n").encode()
        out.append((info, data))
    module_info = zipfile.ZipInfo(MODULE, date_time=out[0][0].date_time)
    module_info.external_attr = 0o100755 << 16
    module_info.compress_type = zipfile.ZIP_DEFLATED
    out.append((module_info, module))
    for info, data in out:
        records.append(f"{info.filename},{_digest(data)},{len(data)}")
    records.append(f"{record_name},,")
    record_info = zipfile.ZipInfo(record_name, date_time=out[0][0].date_time)
    record_info.external_attr = 0o100644 << 16
    tmp = renamed + ".part"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as new:
        for info, data in out:
            new.writestr(info, data)
        new.writestr(record_info, "\n".join(records) + "\n")
    os.replace(tmp, renamed)
    if renamed != wheel:
        os.remove(wheel)
    return renamed


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    print(add_module(sys.argv[1], sys.argv[2]))
