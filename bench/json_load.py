#!/usr/bin/env python3
"""How fast Python loads `packfs ls --json` output: N rows shaped like the export's file lines
(ImageNet-like paths, 128 images), parsed line by line and as one array (how packfs.Catalog
parses it). Prints seconds for each.

    python3 bench/json_load.py [ROWS]        (default 1281167, ImageNet's train split)
"""

import json
import sys
import time

rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1_281_167
line = ('{"kind":"file","path":"train/n01440764/n01440764_%06d.JPEG","mode":420,'
        '"mtime":1700000000,"size":110342,"image":%d,"offset":%d}')
data = "\n".join(line % (i, i % 128, i * 111_000) for i in range(rows)).encode()
print(f"{rows} rows, {len(data) / 1e6:.0f} MB")
t = time.perf_counter()
per_line = [json.loads(l) for l in data.splitlines()]
print(f"json.loads per line:   {time.perf_counter() - t:.2f} s")
del per_line
t = time.perf_counter()
whole = json.loads(b"[" + data.replace(b"\n", b",") + b"]")
print(f"json.loads as one array: {time.perf_counter() - t:.2f} s")
